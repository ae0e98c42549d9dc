/* session_harness.h - rebound's proxy core driven frame by frame: one
 * session (px_session_new) over two fake transports (fake_conn.h), a
 * px_server set up by hand on a loop of the test's own, no broker and no
 * sockets.
 *
 * The test plays both peers: h_send(h, H_CLIENT, ...) is what the client
 * sends, h_expect(h, H_BROKER, "...") checks the next frame the broker
 * received. Each side's wire log is decoded into one line per frame:
 *
 *   protocol-header
 *   ch0 connection.tune channel-max=10 frame-max=131072 heartbeat=0
 *   ch1 basic.ack tag=3 multiple=0
 *   ch9 channel.close code=200 text="..."
 *   ch1 header size=5
 *   ch1 body len=5
 *
 * and lines are consumed as they are checked, in order. A pattern ending
 * in '*' matches any line starting with what comes before it.
 *
 * The session's timers run on a clock the harness sets by hand
 * (px_clock.h): time passes only in h_wait_*(), from one deadline to the
 * next, so a timeout of minutes is tested at once.
 *
 * Failures go to a handler (h_on_fail): a cmocka test fails the test; the
 * default prints and aborts (the fuzz target's invariant checks).
 */
#ifndef SESSION_HARNESS_H
#define SESSION_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "amqp.h"
#include "fake_conn.h"
#include "px_config.h"
#include "px_metrics.h"
#include "px_server.h"
#include "px_session.h"

typedef enum h_side {
  H_CLIENT, /* the client peer: what it sends, what it received */
  H_BROKER, /* the broker peer */
  H_PUB,    /* the broker at the other end of the retry connection
               (--retry-connection separate, px_pub.h) */
} h_side;

/* A growable byte buffer of frames. */
typedef struct hbuf {
  uint8_t *p;
  size_t len, cap;
} hbuf;

typedef struct harness {
  uv_loop_t loop;
  px_config cfg;
  px_server srv;
  px_session *s;     /* NULL once the session has been freed */
  fake_conn peer[3]; /* H_CLIENT, H_BROKER, H_PUB */
  size_t rd[3];      /* bytes of each side's log already read */
  uint16_t own_ch;   /* rebound's channel after h_open() or h_pub_open()
                        (0: none) */
  uint16_t channel_max;
  uint32_t frame_max;
  hbuf *bufs[32]; /* h_buf(): freed with the harness */
  unsigned nbufs;
} harness;

/* ---- failures ------------------------------------------------------------ */

typedef void (*h_fail_fn)(const char *msg);
void h_on_fail(h_fail_fn fn);
void h_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- set up, step, tear down ------------------------------------------- */

/* Extra settings, e.g. {"--retry-queues", "q", NULL}, after these defaults:
 * --upstream 127.0.0.1:5672 --retry-connection shared --admin off. The
 * log level comes from REBOUND_TEST_LOG (debug, info, warn, error; unset:
 * nothing is logged). NULL when the config does not parse. */
harness *h_new(const char *const *args);
/* Close the session if it is still there, step until it is freed, close
 * the loop, free everything. */
void h_free(harness *h);

/* Run the loop once without blocking, then deliver what the fakes have
 * due (connects, writes, shutdowns, closes, input). true when anything
 * happened. */
bool h_step(harness *h);
/* Step until nothing is due (bounded). */
void h_settle(harness *h);
/* The session's clock is set by hand (px_clock.h): time passes
 * only in these three, which move it from deadline to deadline (each
 * timer fires at its own time, the peers settling after each), so no
 * test waits on the wall clock or depends on the machine's speed. */
/* Let `ms` pass. */
void h_wait_ms(harness *h, unsigned ms);
/* Let time pass until `side` has an unread frame (true) or `ms` have
 * passed (false). */
bool h_wait_frame(harness *h, h_side side, unsigned ms);
/* Let time pass until the session is freed (true) or `ms` have passed. */
bool h_wait_gone(harness *h, unsigned ms);

/* ---- what the peers send ------------------------------------------------ */

void h_send(harness *h, h_side from, const void *p, size_t len);
void h_sendb(harness *h, h_side from, hbuf *b); /* and empties b */
/* The peer hangs up (UV_EOF) or resets (UV_ECONNRESET) after what it sent. */
void h_eof(harness *h, h_side from, int err);
fake_conn *h_peer(harness *h, h_side side);

/* ---- building frames ---------------------------------------------------- */

void hb_free(hbuf *b);
/* An empty buffer that h_free() frees (a failed test leaks nothing). */
hbuf *h_buf(harness *h);
void hb_raw(hbuf *b, const void *p, size_t len);
void hb_method(hbuf *b, uint16_t ch, const amqp_method *m);
/* A content header of class basic; `props` may be NULL (none). */
void hb_header(hbuf *b, uint16_t ch, uint64_t body_size,
               const amqp_props *props);
void hb_body(hbuf *b, uint16_t ch, const void *p, size_t len);
void hb_heartbeat(hbuf *b, uint16_t ch);
/* basic.deliver of `tag` to consumer `ctag` (exchange "", key "q"). */
void hb_deliver(hbuf *b, uint16_t ch, const char *ctag, uint64_t tag,
                bool redelivered);

/* A method with every argument zero (or empty) */
void h_simple(harness *h, h_side from, uint16_t ch, uint32_t id);
void h_method(harness *h, h_side from, uint16_t ch, const amqp_method *m);
void h_ack(harness *h, h_side from, uint16_t ch, uint64_t tag, bool multiple);
void h_nack(harness *h, h_side from, uint16_t ch, uint64_t tag, bool multiple,
            bool requeue);
void h_reject(harness *h, h_side from, uint16_t ch, uint64_t tag, bool requeue);
/* channel.close (ch > 0) or connection.close (ch 0) */
void h_close(harness *h, h_side from, uint16_t ch, uint16_t code,
             const char *text);
void h_close_ok(harness *h, h_side from, uint16_t ch);
/* basic.deliver + content header (`props` may be NULL) + one body frame
 * (none for len 0), from the broker on upstream channel `ch`. */
void h_deliver(harness *h, uint16_t ch, const char *ctag, uint64_t tag,
               const amqp_props *props, const void *body, size_t len);

/* ---- scripted sequences ------------------------------------------------- */

/* The whole handshake from both sides (protocol header, start/start-ok,
 * tune/tune-ok, open/open-ok), each frame checked on the other side; with
 * --retry-connection shared, rebound's channel too (channel.open,
 * confirm.select, answered). Returns rebound's channel number (0: none)
 * and sets h->own_ch. The broker says it is RabbitMQ 3.10.8. */
uint16_t h_open(harness *h, uint16_t channel_max, uint32_t frame_max);
/* The same once the client's protocol header has reached the broker. */
uint16_t h_open_after_header(harness *h, uint16_t channel_max,
                             uint32_t frame_max);
/* --retry-connection separate: the retry connection's handshake, checked
 * on H_PUB (rebound logs in with the client's start-ok, channel-max 1,
 * no heartbeat), then rebound's channel there (channel.open,
 * confirm.select), answered. Sets and returns h->own_ch. */
uint16_t h_pub_open(harness *h);
/* The same frames without checking anything (for the fuzz target). */
void h_open_unchecked(harness *h, uint16_t channel_max, uint32_t frame_max);
/* The client opens channel `ch`; the broker must see channel.open on
 * `up` and answers it; the client must see open-ok on `ch`. */
void h_channel(harness *h, uint16_t ch, uint16_t up);
/* The client consumes from `queue` with consumer tag `ctag` (acks on) on
 * channel `ch` (upstream `up`), answered by the broker. */
void h_consume(harness *h, uint16_t ch, uint16_t up, const char *queue,
               const char *ctag);

/* ---- reading the wire logs ---------------------------------------------- */

/* The next unread frame of `side`'s log as a line (false: no whole frame).
 * With `raw`, its bytes (valid until the next send or step). */
bool h_next(harness *h, h_side side, char *line, size_t cap,
            const uint8_t **raw, size_t *raw_len);
/* Settle, then the next line must match `pattern`. */
#define h_expect(h, side, pattern)                                             \
  h__expect(h, side, pattern, __FILE__, __LINE__)
void h__expect(harness *h, h_side side, const char *pattern, const char *file,
               int line);
/* h_expect() after waiting up to `ms` for a frame. */
#define h_expect_within(h, side, ms, pattern)                                  \
  h__expect_within(h, side, ms, pattern, __FILE__, __LINE__)
void h__expect_within(harness *h, h_side side, unsigned ms, const char *pattern,
                      const char *file, int line);
/* Settle, then nothing may be unread. */
#define h_expect_none(h, side) h__expect_none(h, side, __FILE__, __LINE__)
void h__expect_none(harness *h, h_side side, const char *file, int line);
/* Settle, then the next frame must be these exact bytes. */
#define h_expect_bytes(h, side, p, n)                                          \
  h__expect_bytes(h, side, p, n, __FILE__, __LINE__)
void h__expect_bytes(harness *h, h_side side, const void *p, size_t n,
                     const char *file, int line);
/* Drop every unread line of `side` (returns how many). */
unsigned h_skip(harness *h, h_side side);
/* Drop lines of `side` until one matches `pattern` (consumed too); fails
 * when none does. */
#define h_skip_until(h, side, pattern)                                         \
  h__skip_until(h, side, pattern, __FILE__, __LINE__)
void h__skip_until(harness *h, h_side side, const char *pattern,
                   const char *file, int line);

/* Decode one frame (at `p`, `len` bytes available) into a line. Returns
 * the bytes it takes, 0 for a partial frame, or -1 (a line saying why). */
long h_describe(const uint8_t *p, size_t len, char *line, size_t cap);

/* ---- counters ------------------------------------------------------------ */

/* A labelled counter (px_metrics.h id; `v2` NULL for one label). */
uint64_t h_metric(harness *h, int id, const char *v1, const char *v2);
/* rebound_client_connection_closes_total{reason="..."} */
uint64_t h_closes(harness *h, const char *reason);

#endif
