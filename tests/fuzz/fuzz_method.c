/* libFuzzer target: method decode. Oracle: whatever decodes must encode,
 * and the encoding must decode to the same arguments. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amqp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* REBOUND_FUZZ_MAX_LEN (tests/fuzz/CMakeLists.txt): the largest input,
 * above frame-max; an encoding may add a few bytes to it. */
static uint8_t out[REBOUND_FUZZ_MAX_LEN + 4096];

static void check_same(const amqp_method *a, const amqp_method *b) {
  if (a->id != b->id || a->desc != b->desc)
    abort();
  for (unsigned i = 0; i < a->desc->nfields; i++) {
    uint8_t t = a->desc->fields[i].type;
    if (t == AMQP_T_SHORTSTR || t == AMQP_T_LONGSTR || t == AMQP_T_TABLE) {
      if (!amqp_bytes_eq(a->args[i].b, b->args[i].b))
        abort();
    } else if (a->args[i].u != b->args[i].u) {
      abort();
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  amqp_method m, again;
  if (amqp_method_decode((amqp_bytes){data, size}, &m) != AMQP_OK)
    return 0;
  amqp_writer w = amqp_writer_make(out, sizeof out);
  if (size > sizeof out || amqp_method_encode(&m, &w) != AMQP_OK)
    return 0;
  if (w.len > size) /* encoding never grows: unused bits only shrink it */
    abort();
  if (amqp_method_decode((amqp_bytes){out, w.len}, &again) != AMQP_OK)
    abort();
  check_same(&m, &again);
  return 0;
}
