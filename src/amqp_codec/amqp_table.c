#include "amqp_table.h"

static int read_value(amqp_reader *r, uint8_t type, amqp_field *f) {
  f->type = type;
  switch (type) {
  case 't':
  case 'B':
    f->v.u = amqp_get_u8(r);
    break;
  case 'b':
    f->v.i = (int8_t)amqp_get_u8(r);
    break;
  case 's':
    f->v.i = (int16_t)amqp_get_u16(r);
    break;
  case 'u':
    f->v.u = amqp_get_u16(r);
    break;
  case 'I':
    f->v.i = (int32_t)amqp_get_u32(r);
    break;
  case 'i':
    f->v.u = amqp_get_u32(r);
    break;
  case 'l':
    f->v.i = (int64_t)amqp_get_u64(r);
    break;
  case 'T':
    f->v.u = amqp_get_u64(r);
    break;
  case 'f': {
    uint32_t bits = amqp_get_u32(r);
    memcpy(&f->v.f, &bits, sizeof bits);
    break;
  }
  case 'd': {
    uint64_t bits = amqp_get_u64(r);
    memcpy(&f->v.d, &bits, sizeof bits);
    break;
  }
  case 'D':
    f->v.dec.scale = amqp_get_u8(r);
    f->v.dec.value = amqp_get_u32(r);
    break;
  case 'S':
  case 'x':
  case 'A':
  case 'F':
    f->v.bytes = amqp_get_longstr(r);
    break;
  case 'V':
    break;
  default:
    return AMQP_BAD_FIELD_TYPE;
  }
  return r->failed ? AMQP_TRUNCATED : AMQP_OK;
}

/* Stop an iterator for good after an error. */
static int iter_fail(amqp_table_iter *it, int status) {
  it->r.failed = true;
  it->r.left = 0;
  return status;
}

static int iter_value(amqp_table_iter *it, amqp_field *val) {
  uint8_t type = amqp_get_u8(&it->r);
  if (it->r.failed)
    return iter_fail(it, AMQP_TRUNCATED);
  int rc = read_value(&it->r, type, val);
  return rc < 0 ? iter_fail(it, rc) : 1;
}

int amqp_table_next(amqp_table_iter *it, amqp_bytes *key, amqp_field *val) {
  if (it->r.failed)
    return AMQP_TRUNCATED;
  if (it->r.left == 0)
    return 0;
  *key = amqp_get_shortstr(&it->r);
  if (it->r.failed)
    return iter_fail(it, AMQP_TRUNCATED);
  return iter_value(it, val);
}

int amqp_array_next(amqp_table_iter *it, amqp_field *val) {
  if (it->r.failed)
    return AMQP_TRUNCATED;
  if (it->r.left == 0)
    return 0;
  return iter_value(it, val);
}

static int validate(amqp_bytes b, int depth, bool keyed) {
  amqp_table_iter it;
  amqp_bytes key;
  amqp_field v;
  int rc;

  if (depth <= 0)
    return AMQP_TOO_DEEP;
  amqp_table_iter_init(&it, b);
  while ((rc = keyed ? amqp_table_next(&it, &key, &v)
                     : amqp_array_next(&it, &v)) > 0) {
    if (v.type != 'F' && v.type != 'A')
      continue;
    rc = validate(v.v.bytes, depth - 1, v.type == 'F');
    if (rc != AMQP_OK)
      return rc;
  }
  return rc;
}

int amqp_table_validate(amqp_bytes table, int max_depth) {
  return validate(table, max_depth, true);
}

int amqp_array_validate(amqp_bytes array, int max_depth) {
  return validate(array, max_depth, false);
}

int amqp_table_get(amqp_bytes table, amqp_bytes key, amqp_field *val) {
  amqp_table_iter it;
  amqp_bytes k;
  int rc;

  amqp_table_iter_init(&it, table);
  while ((rc = amqp_table_next(&it, &k, val)) > 0)
    if (amqp_bytes_eq(k, key))
      return AMQP_OK;
  return rc == 0 ? AMQP_NOT_FOUND : rc;
}

bool amqp_field_as_int(const amqp_field *f, int64_t *out) {
  switch (f->type) {
  case 'b':
  case 's':
  case 'I':
  case 'l':
    *out = f->v.i;
    return true;
  case 'B':
  case 'u':
  case 'i':
  case 'T':
    if (f->v.u > INT64_MAX)
      return false;
    *out = (int64_t)f->v.u;
    return true;
  default:
    return false;
  }
}

static bool known_type(uint8_t type) {
  return type != 0 && memchr("tbBsuIilfdDSxATFV", type, 17) != NULL;
}

void amqp_field_write(amqp_writer *w, const amqp_field *f) {
  uint32_t bits32;
  uint64_t bits64;

  amqp_put_u8(w, f->type);
  switch (f->type) {
  case 't':
  case 'B':
    amqp_put_u8(w, (uint8_t)f->v.u);
    break;
  case 'b':
    amqp_put_u8(w, (uint8_t)f->v.i);
    break;
  case 's':
    amqp_put_u16(w, (uint16_t)f->v.i);
    break;
  case 'u':
    amqp_put_u16(w, (uint16_t)f->v.u);
    break;
  case 'I':
    amqp_put_u32(w, (uint32_t)f->v.i);
    break;
  case 'i':
    amqp_put_u32(w, (uint32_t)f->v.u);
    break;
  case 'l':
    amqp_put_u64(w, (uint64_t)f->v.i);
    break;
  case 'T':
    amqp_put_u64(w, f->v.u);
    break;
  case 'f':
    memcpy(&bits32, &f->v.f, sizeof bits32);
    amqp_put_u32(w, bits32);
    break;
  case 'd':
    memcpy(&bits64, &f->v.d, sizeof bits64);
    amqp_put_u64(w, bits64);
    break;
  case 'D':
    amqp_put_u8(w, f->v.dec.scale);
    amqp_put_u32(w, f->v.dec.value);
    break;
  case 'S':
  case 'x':
  case 'A':
  case 'F':
    amqp_put_longstr(w, f->v.bytes);
    break;
  case 'V':
    break;
  default:
    w->failed = true;
  }
}

void amqp_table_write_entry(amqp_writer *w, amqp_bytes key,
                            const amqp_field *f) {
  amqp_put_shortstr(w, key);
  amqp_field_write(w, f);
}

size_t amqp_table_begin(amqp_writer *w) {
  size_t start = w->len;
  amqp_put_u32(w, 0);
  return start;
}

void amqp_table_finish(amqp_writer *w, size_t start) {
  size_t len = w->len - start - 4;
  if (len > UINT32_MAX)
    w->failed = true;
  amqp_patch_u32(w, start, (uint32_t)len);
}

int amqp_table_set(amqp_writer *w, amqp_bytes src, amqp_bytes key,
                   const amqp_field *val) {
  amqp_table_iter it;
  amqp_bytes k;
  amqp_field v;
  bool written = false;
  int rc;

  if (!known_type(val->type))
    return AMQP_BAD_FIELD_TYPE;
  if (key.len > 255)
    return AMQP_TOO_LONG;
  amqp_table_iter_init(&it, src);
  for (;;) {
    const uint8_t *entry = it.r.p;
    rc = amqp_table_next(&it, &k, &v);
    if (rc <= 0)
      break;
    if (!amqp_bytes_eq(k, key))
      amqp_put_bytes(w, entry, (size_t)(it.r.p - entry));
    else if (!written)
      amqp_table_write_entry(w, key, val);
    written = written || amqp_bytes_eq(k, key);
  }
  if (rc < 0)
    return rc;
  if (!written)
    amqp_table_write_entry(w, key, val);
  return w->failed ? AMQP_NO_SPACE : AMQP_OK;
}
