/* amqp_frame.h - protocol header and frames of AMQP 0-9-1.
 *
 * Parsing never copies: a parsed frame's payload is a view into the input,
 * valid while the caller keeps that input unchanged.
 */
#ifndef AMQP_FRAME_H
#define AMQP_FRAME_H

#include "amqp_status.h"
#include "amqp_wire.h"

#define AMQP_FRAME_METHOD 1
#define AMQP_FRAME_HEADER 2
#define AMQP_FRAME_BODY 3
#define AMQP_FRAME_HEARTBEAT 8

#define AMQP_FRAME_END 0xCE
/* type (1) + channel (2) + size (4) before the payload, frame-end after. */
#define AMQP_FRAME_OVERHEAD 8
#define AMQP_FRAME_HEADER_SIZE 7
/* Smallest frame-max a peer may negotiate, and the limit before tuning. */
#define AMQP_FRAME_MIN_SIZE 4096
#define AMQP_PROTOCOL_HEADER_SIZE 8

extern const uint8_t amqp_protocol_header[AMQP_PROTOCOL_HEADER_SIZE];

typedef struct amqp_frame {
  uint8_t type;
  uint16_t channel;
  amqp_bytes payload; /* view into the parsed buffer */
} amqp_frame;

/* Check the start of a connection for "AMQP\0\0\x09\x01".
 * Returns AMQP_PROTOCOL_HEADER_SIZE when `buf` starts with it, AMQP_PARTIAL
 * while the bytes so far are a prefix of it, AMQP_BAD_PROTOCOL_HEADER as
 * soon as they differ. */
long amqp_protocol_header_parse(const uint8_t *buf, size_t len);

/* Describe what a peer sent instead of the protocol header, for a log line:
 * e.g. "AMQP 1.0.0.0", "\"GET / HT\"" or "16 03 01 02 00 01 00 01" (TLS).
 * Writes a NUL-terminated string of at most `cap` bytes; returns `out`. */
char *amqp_protocol_header_describe(const uint8_t *buf, size_t len, char *out,
                                    size_t cap);

/* Parse one frame from the start of `buf`.
 * `frame_max` bounds the whole frame (payload + 8), as negotiated in
 * connection.tune; 0 means no bound.
 * Returns the bytes the frame occupies (> 0) and fills `*f`; AMQP_PARTIAL
 * when `buf` holds only part of a frame (nothing is consumed: call again
 * with more bytes); or a negative error: AMQP_FRAME_TOO_LARGE (known from
 * the first 7 bytes), AMQP_UNKNOWN_FRAME_TYPE, AMQP_BAD_FRAME_END,
 * AMQP_BAD_HEARTBEAT, AMQP_SHORT_PAYLOAD (a method payload under 4 bytes or
 * a content header under 14). */
long amqp__frame_parse(const uint8_t *buf, size_t len, uint32_t frame_max,
                       amqp_frame *f);
/* Inline for the frames of every message (a whole method, content header
 * or body frame within frame_max); everything else, partial and refused
 * frames included, goes through the full check, with the same result. */
static inline long amqp_frame_parse(const uint8_t *buf, size_t len,
                                    uint32_t frame_max, amqp_frame *f) {
  if (len > AMQP_FRAME_HEADER_SIZE) {
    uint8_t type = buf[0];
    uint32_t size = (uint32_t)buf[3] << 24 | (uint32_t)buf[4] << 16 |
                    (uint32_t)buf[5] << 8 | (uint32_t)buf[6];
    bool known = type == AMQP_FRAME_BODY ||
                 (type == AMQP_FRAME_METHOD && size >= 4) ||
                 (type == AMQP_FRAME_HEADER && size >= 14);
    if (known && len - AMQP_FRAME_HEADER_SIZE > size &&
        /* size + overhead <= frame_max, or frame_max 0 (no limit: 0 - 1
           wraps to the largest value) */
        (uint64_t)size + AMQP_FRAME_OVERHEAD - 1 <= (uint64_t)frame_max - 1 &&
        buf[AMQP_FRAME_HEADER_SIZE + size] == AMQP_FRAME_END) {
      f->type = type;
      f->channel = (uint16_t)(buf[1] << 8 | buf[2]);
      f->payload.ptr = buf + AMQP_FRAME_HEADER_SIZE;
      f->payload.len = size;
      return (long)size + AMQP_FRAME_OVERHEAD;
    }
  }
  return amqp__frame_parse(buf, len, frame_max, f);
}

/* The whole size (header, payload, frame-end) of the frame `buf` starts
 * with, as its header announces it; 0 while fewer than its 7 header bytes
 * are there. Nothing is checked: a reader sizes its buffer with it, and
 * amqp_frame_parse() judges the frame. */
uint64_t amqp_frame_size_at(const uint8_t *buf, size_t len);

/* Frame writing: amqp_frame_begin() writes the 7-byte frame header with a
 * placeholder size and returns its position; the caller writes the payload
 * with the same writer; amqp_frame_finish() back-patches the size and
 * appends the frame-end. Failure is the writer's sticky flag. */
size_t amqp_frame_begin(amqp_writer *w, uint8_t type, uint16_t channel);
void amqp_frame_finish(amqp_writer *w, size_t start);

/* A whole frame with the given payload. Returns bytes written or
 * AMQP_NO_SPACE. */
long amqp_frame_write(uint8_t *buf, size_t cap, uint8_t type, uint16_t channel,
                      amqp_bytes payload);

#endif
