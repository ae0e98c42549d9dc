/* amqp_wire.h - big-endian primitive readers and writers.
 *
 * A reader walks a byte range; a read past its end returns zero and sets
 * the sticky `failed` flag, so a decoder reads every field and checks once.
 * A writer fills a caller-owned buffer the same way: a write that does not
 * fit sets `failed` and writes nothing more. Neither allocates. Byte views
 * returned by the reader point into the reader's input.
 */
#ifndef AMQP_WIRE_H
#define AMQP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* A view of bytes owned by someone else (usually a frame buffer). */
typedef struct amqp_bytes {
  const uint8_t *ptr;
  size_t len;
} amqp_bytes;

typedef struct amqp_reader {
  const uint8_t *p;
  size_t left;
  bool failed;
} amqp_reader;

typedef struct amqp_writer {
  uint8_t *buf;
  size_t cap;
  size_t len;
  bool failed;
} amqp_writer;

static inline amqp_reader amqp_reader_make(const uint8_t *p, size_t len) {
  amqp_reader r = {p, len, false};
  return r;
}

static inline amqp_writer amqp_writer_make(uint8_t *buf, size_t cap) {
  amqp_writer w = {buf, cap, 0, false};
  return w;
}

static inline bool amqp__take(amqp_reader *r, size_t n, const uint8_t **out) {
  if (r->failed || r->left < n) {
    r->failed = true;
    r->left = 0;
    return false;
  }
  *out = r->p;
  r->p += n;
  r->left -= n;
  return true;
}

/* Big-endian integers read in place: written out, the compiler makes
 * each one load and a byte swap. */
static inline uint32_t amqp__be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         (uint32_t)p[3];
}

static inline uint64_t amqp__be(const uint8_t *p, size_t bytes) {
  switch (bytes) {
  case 1:
    return p[0];
  case 2:
    return (uint16_t)(p[0] << 8 | p[1]);
  case 4:
    return amqp__be32(p);
  default:
    return (uint64_t)amqp__be32(p) << 32 | amqp__be32(p + 4);
  }
}

/* amqp_get_u8 .. amqp_get_u64: one unsigned big-endian integer, 0 on
 * failure. */
#define AMQP__GETTER(bits)                                                     \
  static inline uint##bits##_t amqp_get_u##bits(amqp_reader *r) {              \
    const uint8_t *p;                                                          \
    if (!amqp__take(r, (bits) / 8, &p))                                        \
      return 0;                                                                \
    return (uint##bits##_t)amqp__be(p, (bits) / 8);                            \
  }
AMQP__GETTER(8)
AMQP__GETTER(16)
AMQP__GETTER(32)
AMQP__GETTER(64)
#undef AMQP__GETTER

/* n raw bytes as a view; an empty view on failure. */
static inline amqp_bytes amqp_get_bytes(amqp_reader *r, size_t n) {
  amqp_bytes b = {NULL, 0};
  const uint8_t *p;
  if (amqp__take(r, n, &p)) {
    b.ptr = p;
    b.len = n;
  }
  return b;
}

/* shortstr (octet length) and longstr (uint32 length) as views. */
static inline amqp_bytes amqp_get_shortstr(amqp_reader *r) {
  return amqp_get_bytes(r, amqp_get_u8(r));
}

static inline amqp_bytes amqp_get_longstr(amqp_reader *r) {
  return amqp_get_bytes(r, amqp_get_u32(r));
}

static inline uint8_t *amqp__room(amqp_writer *w, size_t n) {
  if (w->failed || w->cap - w->len < n) {
    w->failed = true;
    return NULL;
  }
  uint8_t *p = w->buf + w->len;
  w->len += n;
  return p;
}

#define AMQP__PUTTER(bits)                                                     \
  static inline void amqp_put_u##bits(amqp_writer *w, uint##bits##_t v) {      \
    uint8_t *p = amqp__room(w, (bits) / 8);                                    \
    uint64_t x = v;                                                            \
    if (!p)                                                                    \
      return;                                                                  \
    for (size_t i = (bits) / 8; i-- > 0; x >>= 8)                              \
      p[i] = (uint8_t)x;                                                       \
  }
AMQP__PUTTER(8)
AMQP__PUTTER(16)
AMQP__PUTTER(32)
AMQP__PUTTER(64)
#undef AMQP__PUTTER

static inline void amqp_put_bytes(amqp_writer *w, const void *src, size_t n) {
  uint8_t *p = amqp__room(w, n);
  if (p && n)
    memcpy(p, src, n);
}

/* A shortstr longer than 255 bytes cannot be written: the writer fails. */
static inline void amqp_put_shortstr(amqp_writer *w, amqp_bytes s) {
  if (s.len > 255) {
    w->failed = true;
    return;
  }
  amqp_put_u8(w, (uint8_t)s.len);
  amqp_put_bytes(w, s.ptr, s.len);
}

static inline void amqp_put_longstr(amqp_writer *w, amqp_bytes s) {
  if (s.len > UINT32_MAX) {
    w->failed = true;
    return;
  }
  amqp_put_u32(w, (uint32_t)s.len);
  amqp_put_bytes(w, s.ptr, s.len);
}

/* Overwrite a uint32 already written at `pos` (a back-patched length). */
static inline void amqp_patch_u32(amqp_writer *w, size_t pos, uint32_t v) {
  if (w->failed || pos > w->len || w->len - pos < 4)
    return;
  w->buf[pos] = (uint8_t)(v >> 24);
  w->buf[pos + 1] = (uint8_t)(v >> 16);
  w->buf[pos + 2] = (uint8_t)(v >> 8);
  w->buf[pos + 3] = (uint8_t)v;
}

/* A view of a NUL-terminated string, for keys and names in code. */
static inline amqp_bytes amqp_cstr(const char *s) {
  amqp_bytes b = {(const uint8_t *)s, strlen(s)};
  return b;
}

static inline bool amqp_bytes_eq(amqp_bytes a, amqp_bytes b) {
  return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

#endif
