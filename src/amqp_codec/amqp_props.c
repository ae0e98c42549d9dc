#include "amqp_props.h"

#include "amqp_table.h"

#define BASIC_CLASS 60
/* Flag bits basic defines (15..2); bit 0 says another flags word follows. */
#define KNOWN_FLAGS 0xfffcu
#define MORE_FLAGS 0x0001u

/* Each property's reader and writer, from the one map. */
static int get_shortstr(amqp_reader *r, amqp_bytes *out) {
  *out = amqp_get_shortstr(r);
  return AMQP_OK;
}

static int get_table(amqp_reader *r, amqp_bytes *out) {
  *out = amqp_get_longstr(r);
  return r->failed ? AMQP_TRUNCATED
                   : amqp_table_validate(*out, AMQP_TABLE_MAX_DEPTH);
}

static int get_octet(amqp_reader *r, uint8_t *out) {
  *out = amqp_get_u8(r);
  return AMQP_OK;
}

static int get_timestamp(amqp_reader *r, uint64_t *out) {
  *out = amqp_get_u64(r);
  return AMQP_OK;
}

#define get_SHORTSTR get_shortstr
#define get_TABLE get_table
#define get_OCTET get_octet
#define get_TIMESTAMP get_timestamp
#define too_long_SHORTSTR(b) ((b).len > 255)
#define too_long_TABLE(b) ((b).len > UINT32_MAX)
#define too_long_OCTET(x) false
#define too_long_TIMESTAMP(x) false
#define put_SHORTSTR amqp_put_shortstr
#define put_TABLE amqp_put_longstr
#define put_OCTET amqp_put_u8
#define put_TIMESTAMP amqp_put_u64

/* Reads the flag words: the first holds basic's 14 flags, any more words
 * (bit 0 chains them) must be empty since basic defines nothing there. */
static int read_flags(amqp_reader *r, uint16_t *flags) {
  uint16_t word = amqp_get_u16(r);
  *flags = word & KNOWN_FLAGS;
  while (!r->failed && (word & MORE_FLAGS)) {
    word = amqp_get_u16(r);
    if (word & ~MORE_FLAGS)
      return AMQP_BAD_PROPERTY_FLAGS;
  }
  if (r->failed)
    return AMQP_TRUNCATED;
  return (word & ~(KNOWN_FLAGS | MORE_FLAGS)) ? AMQP_BAD_PROPERTY_FLAGS
                                              : AMQP_OK;
}

int amqp_content_header_decode(amqp_bytes payload, amqp_content_header *h) {
  amqp_reader r = amqp_reader_make(payload.ptr, payload.len);
  int rc;

  memset(h, 0, sizeof *h);
  h->class_id = amqp_get_u16(&r);
  h->weight = amqp_get_u16(&r);
  h->body_size = amqp_get_u64(&r);
  if (r.failed)
    return AMQP_TRUNCATED;
  if (h->class_id != BASIC_CLASS)
    return AMQP_BAD_CONTENT_CLASS;
  rc = read_flags(&r, &h->props.flags);
  if (rc != AMQP_OK)
    return rc;
#define AMQP__PROP_GET(field, NAME, bit, type)                                 \
  if (h->props.flags & AMQP_P_##NAME) {                                        \
    rc = get_##type(&r, &h->props.field);                                      \
    if (rc != AMQP_OK)                                                         \
      return rc;                                                               \
  }
  AMQP_PROPS_MAP(AMQP__PROP_GET)
#undef AMQP__PROP_GET
  if (r.failed)
    return AMQP_TRUNCATED;
  return r.left ? AMQP_TRAILING_BYTES : AMQP_OK;
}

int amqp_content_header_encode(const amqp_content_header *h, amqp_writer *w) {
  const amqp_props *p = &h->props;

#define AMQP__PROP_LEN(field, NAME, bit, type)                                 \
  if ((p->flags & AMQP_P_##NAME) && too_long_##type(p->field))                 \
    return AMQP_TOO_LONG;
  AMQP_PROPS_MAP(AMQP__PROP_LEN)
#undef AMQP__PROP_LEN
  if (p->flags & ~KNOWN_FLAGS)
    return AMQP_BAD_PROPERTY_FLAGS;
  amqp_put_u16(w, h->class_id);
  amqp_put_u16(w, h->weight);
  amqp_put_u64(w, h->body_size);
  amqp_put_u16(w, p->flags);
#define AMQP__PROP_PUT(field, NAME, bit, type)                                 \
  if (p->flags & AMQP_P_##NAME)                                                \
    put_##type(w, p->field);
  AMQP_PROPS_MAP(AMQP__PROP_PUT)
#undef AMQP__PROP_PUT
  return w->failed ? AMQP_NO_SPACE : AMQP_OK;
}
