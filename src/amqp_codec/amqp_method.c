#include "amqp_method.h"

#include "amqp_frame.h"
#include "amqp_table.h"

#define AMQP_FIELD(m, f, name, type) {name, AMQP_T_##type},
#define AMQP_METHOD(m, cid, mid, name, flags, ...)                             \
  static const amqp_field_desc fields_##m[] = {__VA_ARGS__{NULL, 0}};
#include "amqp_methods.def"
#undef AMQP_METHOD
#undef AMQP_FIELD

const amqp_method_desc amqp_method_table[] = {
#define AMQP_FIELD(m, f, name, type)
#define AMQP_METHOD(m, cid, mid, name, flags, ...)                             \
  {AMQP_##m, name, flags, AMQP_F_##m##__COUNT, fields_##m},
#include "amqp_methods.def"
#undef AMQP_METHOD
#undef AMQP_FIELD
};

const size_t amqp_method_count =
    sizeof amqp_method_table / sizeof amqp_method_table[0];

/* O(1) lookup: the seven classes map to slots 1..7 and method ids are
 * 10*k + {0,1,2} up to 120, so (class, method) maps onto a small dense slot
 * space. A test checks that every method finds itself. */
enum { SLOTS_PER_CLASS = 40, SLOT_COUNT = 8 * SLOTS_PER_CLASS };
#define CLASS_SLOT(cid)                                                        \
  ((cid) == 10   ? 1                                                           \
   : (cid) == 20 ? 2                                                           \
   : (cid) == 40 ? 3                                                           \
   : (cid) == 50 ? 4                                                           \
   : (cid) == 60 ? 5                                                           \
   : (cid) == 85 ? 6                                                           \
   : (cid) == 90 ? 7                                                           \
                 : 0)
#define SLOT(cid, mid)                                                         \
  (CLASS_SLOT(cid) * SLOTS_PER_CLASS + (mid) / 10 * 3 + (mid) % 10)

enum {
#define AMQP_FIELD(m, f, name, type)
#define AMQP_METHOD(m, cid, mid, name, flags, ...) ORD_##m,
#include "amqp_methods.def"
#undef AMQP_METHOD
#undef AMQP_FIELD
};

/* slot -> index into amqp_method_table, plus one (0: no method). */
static const uint8_t slot_index[SLOT_COUNT] = {
#define AMQP_FIELD(m, f, name, type)
#define AMQP_METHOD(m, cid, mid, name, flags, ...)                             \
  [SLOT(cid, mid)] = ORD_##m + 1,
#include "amqp_methods.def"
#undef AMQP_METHOD
#undef AMQP_FIELD
};

const amqp_method_desc *amqp_method_lookup(uint32_t id) {
  unsigned cid = AMQP_METHOD_CLASS(id), mid = AMQP_METHOD_INDEX(id);
  if (CLASS_SLOT(cid) == 0 || mid % 10 > 2 || mid > 129)
    return NULL;
  unsigned idx = slot_index[SLOT(cid, mid)];
  if (idx == 0 || amqp_method_table[idx - 1].id != id)
    return NULL;
  return &amqp_method_table[idx - 1];
}

int amqp_method_init(amqp_method *m, uint32_t id) {
  memset(m, 0, sizeof *m);
  m->desc = amqp_method_lookup(id);
  m->id = id;
  return m->desc ? AMQP_OK : AMQP_UNKNOWN_METHOD;
}

static int decode_arg(amqp_reader *r, uint8_t type, amqp_arg *a,
                      unsigned flags) {
  switch (type) {
  case AMQP_T_OCTET:
    a->u = amqp_get_u8(r);
    break;
  case AMQP_T_SHORT:
    a->u = amqp_get_u16(r);
    break;
  case AMQP_T_LONG:
    a->u = amqp_get_u32(r);
    break;
  case AMQP_T_LONGLONG:
  case AMQP_T_TIMESTAMP:
    a->u = amqp_get_u64(r);
    break;
  case AMQP_T_SHORTSTR:
    a->b = amqp_get_shortstr(r);
    break;
  case AMQP_T_LONGSTR:
    a->b = amqp_get_longstr(r);
    break;
  case AMQP_T_TABLE:
    a->b = amqp_get_longstr(r);
    if (!r->failed && !(flags & AMQP_DECODE_OPAQUE_TABLES))
      return amqp_table_validate(a->b, AMQP_TABLE_MAX_DEPTH);
    break;
  }
  return r->failed ? AMQP_TRUNCATED : AMQP_OK;
}

int amqp_method_decode(amqp_bytes payload, amqp_method *m) {
  return amqp_method_decode_flags(payload, m, 0);
}

int amqp_method_decode_flags(amqp_bytes payload, amqp_method *m,
                             unsigned flags) {
  amqp_reader r = amqp_reader_make(payload.ptr, payload.len);
  unsigned bit = 8; /* next bit in `bits`; 8: read a new octet */
  uint8_t bits = 0;

  m->id = amqp_get_u32(&r);
  if (r.failed)
    return AMQP_TRUNCATED;
  m->desc = amqp_method_lookup(m->id);
  if (!m->desc)
    return AMQP_UNKNOWN_METHOD;
  for (unsigned i = 0; i < m->desc->nfields; i++) {
    uint8_t type = m->desc->fields[i].type;
    if (type == AMQP_T_BIT) {
      if (bit == 8) {
        bits = amqp_get_u8(&r);
        bit = 0;
      }
      m->args[i].u = (bits >> bit++) & 1u;
      continue;
    }
    bit = 8;
    int rc = decode_arg(&r, type, &m->args[i], flags);
    if (rc != AMQP_OK)
      return rc;
  }
  if (r.failed)
    return AMQP_TRUNCATED;
  return r.left ? AMQP_TRAILING_BYTES : AMQP_OK;
}

static void encode_arg(amqp_writer *w, uint8_t type, const amqp_arg *a) {
  switch (type) {
  case AMQP_T_OCTET:
    amqp_put_u8(w, (uint8_t)a->u);
    break;
  case AMQP_T_SHORT:
    amqp_put_u16(w, (uint16_t)a->u);
    break;
  case AMQP_T_LONG:
    amqp_put_u32(w, (uint32_t)a->u);
    break;
  case AMQP_T_LONGLONG:
  case AMQP_T_TIMESTAMP:
    amqp_put_u64(w, a->u);
    break;
  case AMQP_T_SHORTSTR:
    amqp_put_shortstr(w, a->b);
    break;
  case AMQP_T_LONGSTR:
  case AMQP_T_TABLE:
    amqp_put_longstr(w, a->b);
    break;
  }
}

static bool shortstrs_fit(const amqp_method *m) {
  for (unsigned i = 0; i < m->desc->nfields; i++)
    if (m->desc->fields[i].type == AMQP_T_SHORTSTR && m->args[i].b.len > 255)
      return false;
  return true;
}

int amqp_method_encode(const amqp_method *m, amqp_writer *w) {
  size_t bits_at = 0;
  unsigned bit = 8;

  if (!m->desc || m->desc->id != m->id)
    return AMQP_UNKNOWN_METHOD;
  if (!shortstrs_fit(m))
    return AMQP_TOO_LONG;
  amqp_put_u32(w, m->id);
  for (unsigned i = 0; i < m->desc->nfields; i++) {
    uint8_t type = m->desc->fields[i].type;
    if (type != AMQP_T_BIT) {
      bit = 8;
      encode_arg(w, type, &m->args[i]);
      continue;
    }
    if (bit == 8) {
      bits_at = w->len;
      amqp_put_u8(w, 0);
      bit = 0;
    }
    if (!w->failed && m->args[i].u)
      w->buf[bits_at] |= (uint8_t)(1u << bit);
    bit++;
  }
  return w->failed ? AMQP_NO_SPACE : AMQP_OK;
}

long amqp_method_frame_write(uint8_t *buf, size_t cap, uint16_t channel,
                             const amqp_method *m) {
  amqp_writer w = amqp_writer_make(buf, cap);
  size_t start = amqp_frame_begin(&w, AMQP_FRAME_METHOD, channel);
  int rc = amqp_method_encode(m, &w);
  if (rc != AMQP_OK)
    return rc;
  amqp_frame_finish(&w, start);
  return w.failed ? AMQP_NO_SPACE : (long)w.len;
}

#define AMQP_FIELD(m, f, name, type)
#define AMQP_METHOD(m, cid, mid, name, flags, ...)                             \
  _Static_assert(AMQP_F_##m##__COUNT <= AMQP_MAX_FIELDS, #m " fits");
#include "amqp_methods.def"
#undef AMQP_METHOD
#undef AMQP_FIELD
