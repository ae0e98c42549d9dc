#include "amqp_frame.h"

#include <stdio.h>

const uint8_t amqp_protocol_header[AMQP_PROTOCOL_HEADER_SIZE] = {
    'A', 'M', 'Q', 'P', 0, 0, 9, 1};

long amqp_protocol_header_parse(const uint8_t *buf, size_t len) {
  size_t n = len < AMQP_PROTOCOL_HEADER_SIZE ? len : AMQP_PROTOCOL_HEADER_SIZE;
  if (memcmp(buf, amqp_protocol_header, n) != 0)
    return AMQP_BAD_PROTOCOL_HEADER;
  return n == AMQP_PROTOCOL_HEADER_SIZE ? AMQP_PROTOCOL_HEADER_SIZE
                                        : AMQP_PARTIAL;
}

static bool is_printable(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] < 0x20 || p[i] > 0x7e)
      return false;
  return true;
}

char *amqp_protocol_header_describe(const uint8_t *buf, size_t len, char *out,
                                    size_t cap) {
  size_t n = len < AMQP_PROTOCOL_HEADER_SIZE ? len : AMQP_PROTOCOL_HEADER_SIZE;
  size_t at = 0;
  if (cap == 0)
    return out;
  out[0] = '\0';
  if (n == AMQP_PROTOCOL_HEADER_SIZE && memcmp(buf, "AMQP", 4) == 0) {
    snprintf(out, cap, "AMQP %u.%u.%u.%u", buf[4], buf[5], buf[6], buf[7]);
  } else if (n > 0 && is_printable(buf, n)) {
    snprintf(out, cap, "\"%.*s\"", (int)n, (const char *)buf);
  } else {
    for (size_t i = 0; i < n && at + 1 < cap; i++) {
      int k = snprintf(out + at, cap - at, i ? " %02x" : "%02x", buf[i]);
      if (k < 0 || (size_t)k >= cap - at)
        break;
      at += (size_t)k;
    }
  }
  return out;
}

static size_t min_payload(uint8_t type) {
  switch (type) {
  case AMQP_FRAME_METHOD:
    return 4; /* class-id, method-id */
  case AMQP_FRAME_HEADER:
    return 14; /* class, weight, body size, property flags */
  default:
    return 0;
  }
}

/* The header's fields, read in place: the length is checked once, and the
 * compiler turns each into one load and a byte swap. */
static inline uint16_t at_be16(const uint8_t *p) {
  return (uint16_t)((uint16_t)p[0] << 8 | p[1]);
}

static inline uint32_t at_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         (uint32_t)p[3];
}

uint64_t amqp_frame_size_at(const uint8_t *buf, size_t len) {
  if (len < AMQP_FRAME_HEADER_SIZE)
    return 0;
  return (uint64_t)at_be32(buf + 3) + AMQP_FRAME_OVERHEAD;
}

long amqp__frame_parse(const uint8_t *buf, size_t len, uint32_t frame_max,
                       amqp_frame *f) {
  if (len < AMQP_FRAME_HEADER_SIZE)
    return AMQP_PARTIAL;
  uint8_t type = buf[0];
  uint16_t channel = at_be16(buf + 1);
  uint32_t size = at_be32(buf + 3);

  if (type != AMQP_FRAME_METHOD && type != AMQP_FRAME_HEADER &&
      type != AMQP_FRAME_BODY && type != AMQP_FRAME_HEARTBEAT)
    return AMQP_UNKNOWN_FRAME_TYPE;
  if (frame_max != 0 && (uint64_t)size + AMQP_FRAME_OVERHEAD > frame_max)
    return AMQP_FRAME_TOO_LARGE;
  if (type == AMQP_FRAME_HEARTBEAT && channel != 0)
    return AMQP_BAD_HEARTBEAT;
  if (size < min_payload(type))
    return AMQP_SHORT_PAYLOAD;
  if (len - AMQP_FRAME_HEADER_SIZE <= size) /* payload + frame-end */
    return AMQP_PARTIAL;
  if (buf[AMQP_FRAME_HEADER_SIZE + size] != AMQP_FRAME_END)
    return AMQP_BAD_FRAME_END;

  f->type = type;
  f->channel = channel;
  f->payload.ptr = buf + AMQP_FRAME_HEADER_SIZE;
  f->payload.len = size;
  return (long)size + AMQP_FRAME_OVERHEAD;
}

size_t amqp_frame_begin(amqp_writer *w, uint8_t type, uint16_t channel) {
  size_t start = w->len;
  amqp_put_u8(w, type);
  amqp_put_u16(w, channel);
  amqp_put_u32(w, 0);
  return start;
}

void amqp_frame_finish(amqp_writer *w, size_t start) {
  size_t payload = w->len - start - AMQP_FRAME_HEADER_SIZE;
  if (payload > UINT32_MAX)
    w->failed = true;
  amqp_patch_u32(w, start + 3, (uint32_t)payload);
  amqp_put_u8(w, AMQP_FRAME_END);
}

long amqp_frame_write(uint8_t *buf, size_t cap, uint8_t type, uint16_t channel,
                      amqp_bytes payload) {
  amqp_writer w = amqp_writer_make(buf, cap);
  size_t start = amqp_frame_begin(&w, type, channel);
  amqp_put_bytes(&w, payload.ptr, payload.len);
  amqp_frame_finish(&w, start);
  return w.failed ? AMQP_NO_SPACE : (long)w.len;
}
