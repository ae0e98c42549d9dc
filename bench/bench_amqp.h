/* bench_amqp.h - the little AMQP 0-9-1 the raw-socket benchmark tools need
 * (fake_broker, pump_client, idle_conns): writing method frames, finding
 * frame boundaries, and a blocking client handshake. Header-only, written
 * from the spec; it shares no code with rebound on purpose, so the tools
 * measure rebound from the outside.
 *
 * Frame: type (1), channel (2), payload size (4), payload, 0xCE.
 *
 * A client connection (ba_reader) is plain TCP, or TLS when its `ssl` is
 * set (an OpenSSL SSL object on the blocking socket, see bench_tls.h):
 * ba_recv() and ba_send() go through it.
 */
#ifndef BENCH_AMQP_H
#define BENCH_AMQP_H

#include <errno.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BA_FRAME_METHOD 1
#define BA_FRAME_HEADER 2
#define BA_FRAME_BODY 3
#define BA_FRAME_HEARTBEAT 8
#define BA_FRAME_END 0xCE
#define BA_MID(c, m) ((uint32_t)(c) << 16 | (uint32_t)(m))

static const uint8_t ba_protocol_header[8] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};

/* ---- growable output buffer ------------------------------------------- */

typedef struct ba_buf {
  uint8_t *p;
  size_t len, cap, off; /* off: bytes already written out */
} ba_buf;

static inline void ba_reserve(ba_buf *b, size_t more) {
  if (b->len + more <= b->cap)
    return;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + more)
    cap *= 2;
  uint8_t *p = realloc(b->p, cap);
  if (!p) {
    fprintf(stderr, "bench_amqp: out of memory\n");
    exit(1);
  }
  b->p = p;
  b->cap = cap;
}

static inline void ba_put(ba_buf *b, const void *d, size_t n) {
  ba_reserve(b, n);
  memcpy(b->p + b->len, d, n);
  b->len += n;
}
static inline void ba_u8(ba_buf *b, uint8_t v) {
  ba_put(b, &v, 1);
}
static inline void ba_u16(ba_buf *b, uint16_t v) {
  uint8_t x[2] = {(uint8_t)(v >> 8), (uint8_t)v};
  ba_put(b, x, 2);
}
static inline void ba_u32(ba_buf *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8),
                  (uint8_t)v};
  ba_put(b, x, 4);
}
static inline void ba_u64(ba_buf *b, uint64_t v) {
  ba_u32(b, (uint32_t)(v >> 32));
  ba_u32(b, (uint32_t)v);
}
static inline void ba_shortstr(ba_buf *b, const char *s) {
  size_t n = strlen(s);
  ba_u8(b, (uint8_t)n);
  ba_put(b, s, n);
}
static inline void ba_longstr(ba_buf *b, const void *s, uint32_t n) {
  ba_u32(b, n);
  ba_put(b, s, n);
}

static inline void ba_set_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}
static inline void ba_set_u64(uint8_t *p, uint64_t v) {
  ba_set_u32(p, (uint32_t)(v >> 32));
  ba_set_u32(p + 4, (uint32_t)v);
}
static inline uint16_t ba_get_u16(const uint8_t *p) {
  return (uint16_t)(p[0] << 8 | p[1]);
}
static inline uint32_t ba_get_u32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         p[3];
}
static inline uint64_t ba_get_u64(const uint8_t *p) {
  return (uint64_t)ba_get_u32(p) << 32 | ba_get_u32(p + 4);
}

/* Start a frame; returns the offset to pass to ba_frame_end. */
static inline size_t ba_frame_begin(ba_buf *b, uint8_t type, uint16_t ch) {
  size_t at = b->len;
  ba_u8(b, type);
  ba_u16(b, ch);
  ba_u32(b, 0);
  return at;
}
static inline void ba_frame_end(ba_buf *b, size_t at) {
  ba_set_u32(b->p + at + 3, (uint32_t)(b->len - at - 7));
  ba_u8(b, BA_FRAME_END);
}
static inline size_t ba_method_begin(ba_buf *b, uint16_t ch, uint32_t id) {
  size_t at = ba_frame_begin(b, BA_FRAME_METHOD, ch);
  ba_u32(b, id);
  return at;
}
/* A method frame without arguments. */
static inline void ba_method0(ba_buf *b, uint16_t ch, uint32_t id) {
  ba_frame_end(b, ba_method_begin(b, ch, id));
}

/* ---- frame boundaries --------------------------------------------------- */

typedef struct ba_frame {
  uint8_t type;
  uint16_t channel;
  uint32_t size;
  const uint8_t *payload;
  uint32_t method; /* class << 16 | method for method frames, else 0 */
} ba_frame;

/* Returns bytes the frame takes (> 0), 0 when more bytes are needed, -1 on
 * a bad frame end or a frame larger than `max`. */
static inline long ba_frame_parse(const uint8_t *p, size_t len, uint32_t max,
                                  ba_frame *f) {
  if (len < 7)
    return 0;
  uint32_t size = ba_get_u32(p + 3);
  if (size > max)
    return -1;
  if (len < (size_t)size + 8)
    return 0;
  if (p[7 + size] != BA_FRAME_END)
    return -1;
  f->type = p[0];
  f->channel = ba_get_u16(p + 1);
  f->size = size;
  f->payload = p + 7;
  f->method = f->type == BA_FRAME_METHOD && size >= 4 ? ba_get_u32(p + 7) : 0;
  return (long)size + 8;
}

/* ---- blocking client side ----------------------------------------------- */

static inline int ba_write_all(int fd, const void *d, size_t n) {
  const uint8_t *p = d;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

typedef struct ba_reader {
  int fd;
  SSL *ssl; /* NULL: plain TCP */
  uint8_t buf[140 * 1024];
  size_t start, end;
} ba_reader;

/* Read up to n bytes from the connection (plaintext over TLS): > 0, 0 at
 * the end of the stream, -1 on an error (or the receive timeout). */
static inline ssize_t ba_recv(ba_reader *r, void *d, size_t n) {
  if (!r->ssl)
    return read(r->fd, d, n);
  int k = SSL_read(r->ssl, d, n > 0x40000000 ? 0x40000000 : (int)n);
  if (k > 0)
    return k;
  int e = SSL_get_error(r->ssl, k);
  if (e == SSL_ERROR_ZERO_RETURN)
    return 0;
  if (e != SSL_ERROR_SYSCALL || !errno)
    errno = EIO;
  return -1;
}

/* Write all of d (encrypted over TLS). 0 or -1. */
static inline int ba_send(ba_reader *r, const void *d, size_t n) {
  if (!r->ssl)
    return ba_write_all(r->fd, d, n);
  const uint8_t *p = d;
  while (n) {
    int k = SSL_write(r->ssl, p, n > 0x40000000 ? 0x40000000 : (int)n);
    if (k <= 0)
      return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Next frame (blocking; the socket's SO_RCVTIMEO bounds it). The frame's
 * payload stays valid until the next call. Returns 0 or -1. */
static inline int ba_read_frame(ba_reader *r, ba_frame *f) {
  for (;;) {
    long n = ba_frame_parse(r->buf + r->start, r->end - r->start,
                            sizeof r->buf - 8, f);
    if (n < 0)
      return -1;
    if (n > 0) {
      r->start += (size_t)n;
      return 0;
    }
    if (r->start > 0) {
      memmove(r->buf, r->buf + r->start, r->end - r->start);
      r->end -= r->start;
      r->start = 0;
    }
    ssize_t got = ba_recv(r, r->buf + r->end, sizeof r->buf - r->end);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return -1;
    r->end += (size_t)got;
  }
}

/* Read frames until a method `id` on channel `ch`; anything else on the way
 * (heartbeats, other channels) is skipped, connection.close fails. */
static inline int ba_expect(ba_reader *r, uint16_t ch, uint32_t id,
                            ba_frame *f) {
  for (int i = 0; i < 1000; i++) {
    if (ba_read_frame(r, f) != 0)
      return -1;
    if (f->channel == ch && f->method == id)
      return 0;
    if (f->method == BA_MID(10, 50)) {
      const uint8_t *p = f->payload + 4;
      fprintf(stderr, "bench_amqp: connection.close %u %.*s\n", ba_get_u16(p),
              (int)p[2], (const char *)p + 3);
      return -1;
    }
  }
  return -1;
}

/* Client handshake, in steps so that many connections can advance in
 * lockstep: (1) protocol header; (2) connection.start -> start-ok, PLAIN;
 * (3) tune -> tune-ok (the server's channel-max and frame-max, heartbeat
 * as given) + open, pipelined as most clients do; (4) open-ok. Each
 * returns 0 or -1. */
static inline int ba_hs_header(ba_reader *r) {
  return ba_send(r, ba_protocol_header, 8);
}

static inline int ba_hs_start_ok(ba_reader *r, const char *user,
                                 const char *pass) {
  ba_buf b = {0};
  ba_frame f;
  if (ba_expect(r, 0, BA_MID(10, 10), &f) != 0)
    return -1;
  /* start-ok: client-properties {}, mechanism, response, locale */
  size_t at = ba_method_begin(&b, 0, BA_MID(10, 11));
  ba_u32(&b, 0);
  ba_shortstr(&b, "PLAIN");
  size_t ul = strlen(user), pl = strlen(pass);
  ba_u32(&b, (uint32_t)(ul + pl + 2));
  ba_u8(&b, 0);
  ba_put(&b, user, ul);
  ba_u8(&b, 0);
  ba_put(&b, pass, pl);
  ba_shortstr(&b, "en_US");
  ba_frame_end(&b, at);
  int rc = ba_send(r, b.p, b.len);
  free(b.p);
  return rc;
}

static inline int ba_hs_tune_open(ba_reader *r, const char *vhost,
                                  uint16_t heartbeat) {
  ba_buf b = {0};
  ba_frame f;
  if (ba_expect(r, 0, BA_MID(10, 30), &f) != 0 || f.size < 12)
    return -1;
  uint16_t chmax = ba_get_u16(f.payload + 4);
  uint32_t fmax = ba_get_u32(f.payload + 6);
  size_t at = ba_method_begin(&b, 0, BA_MID(10, 31));
  ba_u16(&b, chmax);
  ba_u32(&b, fmax);
  ba_u16(&b, heartbeat);
  ba_frame_end(&b, at);
  at = ba_method_begin(&b, 0, BA_MID(10, 40));
  ba_shortstr(&b, vhost);
  ba_shortstr(&b, "");
  ba_u8(&b, 0);
  ba_frame_end(&b, at);
  int rc = ba_send(r, b.p, b.len);
  free(b.p);
  return rc;
}

static inline int ba_hs_open_ok(ba_reader *r) {
  ba_frame f;
  return ba_expect(r, 0, BA_MID(10, 41), &f);
}

/* channel.open on `ch` (send only; expect (20,11) afterwards). */
static inline int ba_channel_open(ba_reader *r, uint16_t ch) {
  ba_buf b = {0};
  size_t at = ba_method_begin(&b, ch, BA_MID(20, 10));
  ba_shortstr(&b, ""); /* reserved */
  ba_frame_end(&b, at);
  int rc = ba_send(r, b.p, b.len);
  free(b.p);
  return rc;
}

/* The whole handshake for one connection. */
static inline int ba_client_handshake(ba_reader *r, const char *user,
                                      const char *pass, const char *vhost,
                                      uint16_t heartbeat) {
  if (ba_hs_header(r) != 0 || ba_hs_start_ok(r, user, pass) != 0 ||
      ba_hs_tune_open(r, vhost, heartbeat) != 0 || ba_hs_open_ok(r) != 0)
    return -1;
  return 0;
}

static inline uint64_t ba_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* utime + stime of a process (all its threads) in seconds, from
 * /proc/PID/stat (fields 14 and 15, clock ticks); -1 when unreadable. */
static inline double ba_proc_cpu_secs(long pid) {
  char path[64], line[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *fp = fopen(path, "r");
  if (!fp)
    return -1;
  size_t n = fread(line, 1, sizeof line - 1, fp);
  fclose(fp);
  line[n] = 0;
  char *p = strrchr(line, ')'); /* the command name may hold spaces */
  unsigned long ut, st;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                   &ut, &st) != 2)
    return -1;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

#endif
