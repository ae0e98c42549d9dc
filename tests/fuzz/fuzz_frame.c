/* libFuzzer target: the frame parser over a stream, and the decoder each
 * complete frame's payload goes to. The first input byte picks frame-max
 * (0: none, else 4096 << (b % 6)). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amqp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint32_t frame_max = data[0] & 0x80 ? 0 : 4096u << (data[0] % 6);
  data++, size--;

  size_t off = 0;
  if (amqp_protocol_header_parse(data, size) == AMQP_PROTOCOL_HEADER_SIZE)
    off = AMQP_PROTOCOL_HEADER_SIZE;
  for (;;) {
    amqp_frame f;
    long n = amqp_frame_parse(data + off, size - off, frame_max, &f);
    if (n <= 0)
      break;
    if ((size_t)n > size - off || f.payload.ptr < data + off ||
        f.payload.ptr + f.payload.len > data + off + (size_t)n)
      abort(); /* a frame must lie inside the input it came from */
    if (f.type == AMQP_FRAME_METHOD) {
      amqp_method m;
      (void)amqp_method_decode(f.payload, &m);
    } else if (f.type == AMQP_FRAME_HEADER) {
      amqp_content_header h;
      (void)amqp_content_header_decode(f.payload, &h);
    }
    off += (size_t)n;
  }
  return 0;
}
