/* libFuzzer target: content header decode. Oracle: a decoded header
 * encodes, and that encoding decodes to the same properties. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amqp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* REBOUND_FUZZ_MAX_LEN (tests/fuzz/CMakeLists.txt): the largest input,
 * above frame-max; an encoding may add a few bytes to it. */
static uint8_t out[REBOUND_FUZZ_MAX_LEN + 4096];

#define SAME_SHORTSTR(a, b) amqp_bytes_eq(a, b)
#define SAME_TABLE(a, b) amqp_bytes_eq(a, b)
#define SAME_OCTET(a, b) ((a) == (b))
#define SAME_TIMESTAMP(a, b) ((a) == (b))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  amqp_content_header h, again;
  if (size > sizeof out ||
      amqp_content_header_decode((amqp_bytes){data, size}, &h) != AMQP_OK)
    return 0;
  amqp_writer w = amqp_writer_make(out, sizeof out);
  if (amqp_content_header_encode(&h, &w) != AMQP_OK)
    abort();
  if (amqp_content_header_decode((amqp_bytes){out, w.len}, &again) != AMQP_OK)
    abort();
  if (h.class_id != again.class_id || h.body_size != again.body_size ||
      h.props.flags != again.props.flags)
    abort();
#define SAME(field, NAME, bit, type)                                           \
  if (!SAME_##type(h.props.field, again.props.field))                          \
    abort();
  AMQP_PROPS_MAP(SAME)
#undef SAME
  return 0;
}
