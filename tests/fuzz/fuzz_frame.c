/* libFuzzer target: the frame parser over a stream, and the decoder each
 * complete frame's payload goes to. The first input byte picks frame-max:
 * 0x80 set, none; else 4096 << (b % 11), 4 KiB up to rebound's cap of
 * 4 MiB (131072, RabbitMQ's offer, is b = 5). Oracles: a frame lies inside
 * the input and within frame-max, the same bytes parse the same without a
 * bound, and one byte less is a partial frame, never an error. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amqp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_frame(const uint8_t *p, size_t len, uint32_t frame_max,
                        long n, const amqp_frame *f) {
  amqp_frame again;
  if ((size_t)n > len || f->payload.ptr < p ||
      f->payload.len > (size_t)n - AMQP_FRAME_OVERHEAD ||
      f->payload.ptr + f->payload.len > p + (size_t)n)
    abort(); /* a frame must lie inside the input it came from */
  if (frame_max && (size_t)n > frame_max)
    abort();
  if (amqp_frame_parse(p, len, 0, &again) != n || again.type != f->type ||
      again.channel != f->channel || again.payload.ptr != f->payload.ptr ||
      again.payload.len != f->payload.len)
    abort();
  if (amqp_frame_parse(p, (size_t)n - 1, frame_max, &again) != AMQP_PARTIAL)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint32_t frame_max = data[0] & 0x80 ? 0 : 4096u << (data[0] % 11);
  data++, size--;

  size_t off = 0;
  if (amqp_protocol_header_parse(data, size) == AMQP_PROTOCOL_HEADER_SIZE)
    off = AMQP_PROTOCOL_HEADER_SIZE;
  for (;;) {
    amqp_frame f, full;
    long n = amqp_frame_parse(data + off, size - off, frame_max, &f);
    /* the inline parse and the full check agree on every input */
    if (amqp__frame_parse(data + off, size - off, frame_max, &full) != n ||
        (n > 0 && (full.type != f.type || full.channel != f.channel ||
                   full.payload.ptr != f.payload.ptr ||
                   full.payload.len != f.payload.len)))
      abort();
    if (n <= 0)
      break;
    check_frame(data + off, size - off, frame_max, n, &f);
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
