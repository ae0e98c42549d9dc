/* libFuzzer target: field tables and arrays. Oracles: a valid table
 * re-encodes to the same bytes, entry by entry; setting a key yields a
 * valid table in which that key reads back. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amqp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* REBOUND_FUZZ_MAX_LEN (tests/fuzz/CMakeLists.txt): the largest input,
 * above frame-max; an encoding may add a few bytes to it. */
static uint8_t out[REBOUND_FUZZ_MAX_LEN + 4096];

static void reencode(amqp_bytes t) {
  amqp_table_iter it;
  amqp_bytes key;
  amqp_field v;
  amqp_writer w = amqp_writer_make(out, sizeof out);
  amqp_table_iter_init(&it, t);
  while (amqp_table_next(&it, &key, &v) == 1)
    amqp_table_write_entry(&w, key, &v);
  if (w.failed || w.len != t.len || memcmp(out, t.ptr, t.len) != 0)
    abort();
}

static void set_and_read_back(amqp_bytes t) {
  amqp_field n = amqp_field_long((int64_t)t.len), got;
  amqp_bytes key = amqp_cstr("rebound-retry-count");
  amqp_writer w = amqp_writer_make(out, sizeof out);
  if (amqp_table_set(&w, t, key, &n) != AMQP_OK)
    abort();
  amqp_bytes res = {out, w.len};
  if (amqp_table_validate(res, AMQP_TABLE_MAX_DEPTH) != AMQP_OK)
    abort();
  if (amqp_table_get(res, key, &got) != AMQP_OK || got.type != 'l' ||
      got.v.i != (int64_t)t.len)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  amqp_bytes t = {data, size};
  if (size > REBOUND_FUZZ_MAX_LEN)
    return 0;
  (void)amqp_array_validate(t, AMQP_TABLE_MAX_DEPTH);
  if (amqp_table_validate(t, AMQP_TABLE_MAX_DEPTH) != AMQP_OK)
    return 0;
  reencode(t);
  set_and_read_back(t);
  return 0;
}
