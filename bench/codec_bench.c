/* codec_bench - rebound's AMQP codec on one core.
 *
 * Builds a realistic broker->client stream in memory (basic.deliver, a
 * content header with properties and headers, a 256-byte body, repeated),
 * then measures two passes over it:
 *   frame  - frame boundaries and method ids only (what forwarding needs)
 *   decode - plus the full method and content-header decode (what the
 *            retry path needs for a delivery it keeps)
 * and, as a reference in the same run, memcpy of the same stream (what a
 * forwarder that copies every byte once pays at least).
 * Prints frames/s and MB/s for each. Usage: codec_bench [messages] [rounds]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "amqp.h"

#define BODY 256

static size_t build_message(uint8_t *buf, size_t cap, uint64_t tag) {
  static uint8_t body[BODY];
  uint8_t headers[128];
  amqp_writer hw = amqp_writer_make(headers, sizeof headers);
  amqp_field f = amqp_field_string(amqp_cstr("bench"));
  amqp_table_write_entry(&hw, amqp_cstr("x-origin"), &f);
  f = amqp_field_long(0);
  amqp_table_write_entry(&hw, amqp_cstr("x-attempt"), &f);

  amqp_method m;
  amqp_method_init(&m, AMQP_BASIC_DELIVER);
  m.args[AMQP_F_BASIC_DELIVER_CONSUMER_TAG].b =
      amqp_cstr("amq.ctag-Vh8Tq1CDQ6JV5FQ2JXaQWg");
  m.args[AMQP_F_BASIC_DELIVER_DELIVERY_TAG].u = tag;
  m.args[AMQP_F_BASIC_DELIVER_EXCHANGE].b = amqp_cstr("orders");
  m.args[AMQP_F_BASIC_DELIVER_ROUTING_KEY].b = amqp_cstr("orders.created");

  amqp_content_header h;
  memset(&h, 0, sizeof h);
  h.class_id = 60;
  h.body_size = BODY;
  h.props.flags = AMQP_P_CONTENT_TYPE | AMQP_P_HEADERS | AMQP_P_DELIVERY_MODE |
                  AMQP_P_MESSAGE_ID | AMQP_P_TIMESTAMP;
  h.props.content_type = amqp_cstr("application/json");
  h.props.headers = (amqp_bytes){headers, hw.len};
  h.props.delivery_mode = 2;
  h.props.message_id = amqp_cstr("6f1c2d3e-0000-4000-8000-000000000000");
  h.props.timestamp = 1764460800;

  amqp_writer w = amqp_writer_make(buf, cap);
  size_t at = amqp_frame_begin(&w, AMQP_FRAME_METHOD, 1);
  amqp_method_encode(&m, &w);
  amqp_frame_finish(&w, at);
  at = amqp_frame_begin(&w, AMQP_FRAME_HEADER, 1);
  amqp_content_header_encode(&h, &w);
  amqp_frame_finish(&w, at);
  at = amqp_frame_begin(&w, AMQP_FRAME_BODY, 1);
  amqp_put_bytes(&w, body, BODY);
  amqp_frame_finish(&w, at);
  if (w.failed) {
    fprintf(stderr, "codec_bench: message does not fit\n");
    exit(1);
  }
  return w.len;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One pass over the stream; returns frames seen, or 0 on a codec error. */
static size_t pass(const uint8_t *s, size_t len, int full, uint64_t *check) {
  size_t off = 0, frames = 0;
  while (off < len) {
    amqp_frame f;
    long n = amqp_frame_parse(s + off, len - off, 131072, &f);
    if (n <= 0)
      return 0;
    off += (size_t)n;
    frames++;
    if (f.type == AMQP_FRAME_METHOD) {
      *check += amqp_method_peek_id(f.payload);
      if (full) {
        amqp_method m;
        if (amqp_method_decode(f.payload, &m) != AMQP_OK)
          return 0;
        *check += m.args[AMQP_F_BASIC_DELIVER_DELIVERY_TAG].u;
      }
    } else if (f.type == AMQP_FRAME_HEADER) {
      *check += amqp_content_header_peek_size(f.payload);
      if (full) {
        amqp_content_header h;
        if (amqp_content_header_decode(f.payload, &h) != AMQP_OK)
          return 0;
        *check += h.props.delivery_mode;
      }
    }
  }
  return frames;
}

int main(int argc, char **argv) {
  size_t messages = argc > 1 ? strtoul(argv[1], NULL, 10) : 100000;
  int rounds = argc > 2 ? atoi(argv[2]) : 20;
  size_t cap = messages * 512, len = 0;
  uint8_t *stream = malloc(cap);
  if (!stream || messages == 0 || rounds <= 0)
    return 1;
  for (size_t i = 0; i < messages; i++)
    len += build_message(stream + len, cap - len, i + 1);

  printf("stream: %zu messages (deliver + header + %d B body), %zu bytes, "
         "%.1f B/message\n",
         messages, BODY, len, (double)len / (double)messages);
  uint8_t *copy = malloc(len);
  if (!copy)
    return 1;
  memcpy(copy, stream, len); /* warm-up */
  double t0 = now();
  for (int r = 0; r < rounds; r++) {
    memcpy(copy, stream, len);
    __asm__ volatile("" : : "r"(copy) : "memory");
  }
  double memcpy_s = now() - t0;
  printf("%-6s %6.1f M frames/s  %7.1f MB/s  %5.1f ns/message  (reference)\n",
         "memcpy", (double)messages * 3 * rounds / memcpy_s / 1e6,
         (double)len * rounds / memcpy_s / 1e6,
         memcpy_s * 1e9 / ((double)messages * rounds));
  free(copy);

  const char *names[2] = {"frame", "decode"};
  for (int full = 0; full < 2; full++) {
    uint64_t check = 0;
    size_t frames = 0;
    pass(stream, len, full, &check); /* warm-up */
    double start = now();
    for (int r = 0; r < rounds; r++)
      frames += pass(stream, len, full, &check);
    double dt = now() - start;
    if (frames != (size_t)rounds * messages * 3) {
      fprintf(stderr, "codec_bench: decode failed\n");
      return 1;
    }
    printf("%-6s %6.1f M frames/s  %7.1f MB/s  %5.1f ns/message  "
           "%.2fx memcpy time (check %llu)\n",
           names[full], (double)frames / dt / 1e6,
           (double)len * rounds / dt / 1e6, dt * 1e9 / (double)frames * 3,
           dt / memcpy_s, (unsigned long long)(check & 0xffff));
  }
  free(stream);
  return 0;
}
