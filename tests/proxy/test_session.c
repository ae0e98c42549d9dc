/* The proxy core frame by frame: one session over fake transports
 * (session_harness.h), both peers played by the test, no broker and no
 * sockets. Each test checks what each side receives, in order, and the
 * counters the behaviour moves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "px_own.h"
#include "session_test.h"

/* The broker delivers `tag` (a body of `len` bytes) to consumer c1 on
 * channel 1; the client must receive it as it is. */
static void deliver(harness *h, uint64_t tag, const void *body, size_t len) {
  h_deliver(h, 1, "c1", tag, NULL, body, len);
  expect_line(h, H_CLIENT, "ch1 basic.deliver tag=%llu",
              (unsigned long long)tag);
  expect_line(h, H_CLIENT, "ch1 header size=%zu", len);
  if (len)
    expect_line(h, H_CLIENT, "ch1 body len=%zu", len);
}

/* An open connection (channel-max 10: rebound's channel is 10), channel 1
 * consuming from q as c1, and `n` deliveries of "hello". */
static void consuming(harness *h, unsigned n) {
  assert_int_equal(h_open(h, 10, 131072), 10);
  h_channel(h, 1, 1);
  h_consume(h, 1, 1, "q", "c1");
  for (unsigned t = 1; t <= n; t++)
    deliver(h, t, "hello", 5);
}

/* rebound's copy of a delivery of `len` bytes, to q.retry.1s on its own
 * channel; `declare`: the tier queue is declared first. */
static void expect_copy(harness *h, bool declare, size_t len) {
  if (declare)
    expect_line(h, H_BROKER, "ch%u queue.declare queue=q.retry.1s", h->own_ch);
  expect_line(h, H_BROKER,
              "ch%u basic.publish exchange= rk=q.retry.1s mandatory=1",
              h->own_ch);
  expect_line(h, H_BROKER, "ch%u header size=%zu", h->own_ch, len);
  if (len)
    expect_line(h, H_BROKER, "ch%u body len=%zu", h->own_ch, len);
}

/* The broker confirms rebound's publishes up to `seq`. */
static void confirm(harness *h, uint64_t seq, bool multiple) {
  h_ack(h, H_BROKER, h->own_ch, seq, multiple);
}

static px_session_snap snap(harness *h) {
  px_session_snap s;
  assert_non_null(h->s);
  px_session_snapshot(h->s, &s);
  return s;
}

static uint64_t total_closes(harness *h) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < h->srv.metrics.n; i++)
    if (h->srv.metrics.counters[i].id == PX_M_CLOSES)
      n += h->srv.metrics.counters[i].n;
  return n;
}

/* ---- 1. a client channel on rebound's number is carried on another ---- */

static void test_remap(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  amqp_method m;

  assert_int_equal(h_open(h, 10, 131072), 10);
  assert_int_equal(h->srv.stats.channel_remaps, 0);

  /* the client opens 10, rebound's number: it travels on 9 */
  h_channel(h, 10, 9);
  assert_int_equal(h->srv.stats.channel_remaps, 1);

  /* a frame on 10 goes up on 9, the answer comes back on 10 */
  amqp_method_init(&m, AMQP_BASIC_QOS);
  m.args[AMQP_F_BASIC_QOS_PREFETCH_COUNT].u = 5;
  h_method(h, H_CLIENT, 10, &m);
  h_expect(h, H_BROKER, "ch9 basic.qos");
  h_simple(h, H_BROKER, 9, AMQP_BASIC_QOS_OK);
  h_expect(h, H_CLIENT, "ch10 basic.qos-ok");

  /* the client's close and the broker's close-ok map back */
  h_close(h, H_CLIENT, 10, 200, "bye");
  h_expect(h, H_BROKER, "ch9 channel.close code=200 text=bye");
  h_close_ok(h, H_BROKER, 9);
  h_expect(h, H_CLIENT, "ch10 channel.close-ok");

  /* 9 is free again: the client's own 9 goes up as 9 */
  h_channel(h, 9, 9);
  assert_int_equal(h->srv.stats.channel_remaps, 1);

  /* 10 again: 9 is taken now, so 8; the broker's close maps back too */
  h_channel(h, 10, 8);
  assert_int_equal(h->srv.stats.channel_remaps, 2);
  h_close(h, H_BROKER, 8, 406, "PRECONDITION_FAILED - test");
  h_expect(h, H_CLIENT,
           "ch10 channel.close code=406 text=\"PRECONDITION_FAILED - test\"");
  h_close_ok(h, H_CLIENT, 10);
  h_expect(h, H_BROKER, "ch8 channel.close-ok");

  h_expect_none(h, H_CLIENT);
  h_expect_none(h, H_BROKER);
}

/* ---- 2. a client that opens every channel gets rebound's number ------- */

static void test_yield(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);

  assert_int_equal(h_open(h, 2, 131072), 2);
  h_channel(h, 1, 1);

  /* no number is left for 2: its open waits, rebound closes its own */
  h_simple(h, H_CLIENT, 2, AMQP_CHANNEL_OPEN);
  h_expect(h, H_BROKER, "ch2 channel.close code=200 *");
  h_expect_none(h, H_BROKER);
  h_expect_none(h, H_CLIENT);
  assert_int_equal(h->srv.stats.own_channel_yields, 0);

  /* the broker's close-ok frees it: the client's open goes out on 2 */
  h_close_ok(h, H_BROKER, 2);
  h_expect(h, H_BROKER, "ch2 channel.open");
  assert_int_equal(h->srv.stats.own_channel_yields, 1);
  h_simple(h, H_BROKER, 2, AMQP_CHANNEL_OPEN_OK);
  h_expect(h, H_CLIENT, "ch2 channel.open-ok");
  assert_int_equal(h->srv.stats.channel_remaps, 0);

  /* channel 2 is the client's now, both ways */
  h_simple(h, H_CLIENT, 2, AMQP_BASIC_QOS);
  h_expect(h, H_BROKER, "ch2 basic.qos");
  h_simple(h, H_BROKER, 2, AMQP_BASIC_QOS_OK);
  h_expect(h, H_CLIENT, "ch2 basic.qos-ok");
  h_expect_none(h, H_CLIENT);
  h_expect_none(h, H_BROKER);
}

/* ---- 3. rebound's channel lost with a copy in flight ------------------ */

static const char NOT_FOUND[] = "NOT_FOUND - home node of queue 'q.retry.1s' "
                                "in vhost '/' is down or inaccessible";

/* The copy was discarded with the channel: rebound answers the close,
 * reopens at once (the first close), and the copy goes again once its
 * channel is back (README, "Retries": "a copy that was not enqueued ... is
 * first tried again once rebound's channel is back"). */
static void test_own_channel_reopen(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 1);

  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5);
  h_expect_none(h, H_BROKER);

  h_close(h, H_BROKER, 10, 404, NOT_FOUND);
  h_expect(h, H_BROKER, "ch10 channel.close-ok");
  h_expect(h, H_BROKER, "ch10 channel.open");
  h_expect_none(h, H_BROKER);
  assert_int_equal(h->srv.stats.own_channel_errors, 1);
  assert_int_equal(h_metric(h, PX_M_FALLBACKS,
                            "rebound's channel was closed before the copy",
                            NULL),
                   1);

  h_simple(h, H_BROKER, 10, AMQP_CHANNEL_OPEN_OK);
  h_expect(h, H_BROKER, "ch10 confirm.select");
  h_simple(h, H_BROKER, 10, AMQP_CONFIRM_SELECT_OK);
  /* the queue is declared again on the new channel, the copy republished
   * with publish sequence 1 of that channel */
  expect_copy(h, true, 5);
  h_expect_none(h, H_BROKER);
  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  assert_int_equal(h_metric(h, PX_M_RETRIES, "q", "1s"), 1);
  assert_int_equal(h_metric(h, PX_M_DELAYED,
                            "rebound's channel was closed "
                            "before the copy",
                            NULL),
                   0);
  assert_int_equal(snap(h).retries_pending, 0);
  assert_int_equal(snap(h).requeues_delayed, 0);
  h_expect_none(h, H_CLIENT);
  h_expect_none(h, H_BROKER);
}

/* The channel does not come back within the tier delay: the requeue goes
 * to the broker then ("their requeue after the tier delay, whichever comes
 * first"), never at once. */
static void test_own_channel_not_back(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 1);

  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5);
  h_close(h, H_BROKER, 10, 404, NOT_FOUND);
  h_expect(h, H_BROKER, "ch10 channel.close-ok");
  h_expect(h, H_BROKER, "ch10 channel.open");
  /* no open-ok: the requeue waits for the tier delay (1 s), not sent now */
  h_expect_none(h, H_BROKER);
  assert_int_equal(snap(h).requeues_delayed, 1);
  h_expect_within(h, H_BROKER, 5000,
                  "ch1 basic.nack tag=1 multiple=0 requeue=1");
  assert_int_equal(h_metric(h, PX_M_DELAYED,
                            "rebound's channel was closed "
                            "before the copy",
                            NULL),
                   1);
  assert_int_equal(snap(h).requeues_delayed, 0);
  h_expect_none(h, H_CLIENT);
  h_expect_none(h, H_BROKER);
}

/* ---- 4. confirms out of order ------------------------------------------ */

static void test_confirm_order(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 3);

  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5); /* seq 1 */
  h_nack(h, H_CLIENT, 1, 2, false, true);
  expect_copy(h, false, 5); /* seq 2 */
  h_nack(h, H_CLIENT, 1, 3, false, true);
  expect_copy(h, false, 5); /* seq 3 */
  h_expect_none(h, H_BROKER);
  assert_int_equal(snap(h).retries_pending, 3);

  confirm(h, 2, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=2 multiple=0");
  h_expect_none(h, H_BROKER);
  confirm(h, 3, true);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  h_expect(h, H_BROKER, "ch1 basic.ack tag=3 multiple=0");
  h_expect_none(h, H_BROKER);

  assert_int_equal(h_metric(h, PX_M_RETRIES, "q", "1s"), 3);
  assert_int_equal(snap(h).retries_pending, 0);
  assert_int_equal(snap(h).requeues_delayed, 0);
  assert_int_equal(h->srv.stats.cache_entries, 0);
  /* past the confirm timeout: no copy is left to fall back */
  h_wait_ms(h, 400);
  h_expect_none(h, H_BROKER);
  h_expect_none(h, H_CLIENT);
  assert_int_equal(h_metric(h, PX_M_FALLBACKS, "confirm timeout", NULL), 0);
}

/* ---- 5. nack multiple over kept and uncached deliveries ---------------- */

static const char BIG[200] = "a delivery over the cache bound";

static void test_nack_multiple_mixed(void **state) {
  /* 100 bytes kept per connection: a delivery of 5 bytes keeps 19 (its
   * 14-byte header too), one of 200 is not kept */
  static const char *const args[] = {POLICY, "--cache-per-connection", "100",
                                     NULL};
  harness *h = start(state, args);
  consuming(h, 2);
  deliver(h, 3, BIG, sizeof BIG);
  deliver(h, 4, "hello", 5);
  assert_int_equal(h->srv.stats.uncached_deliveries, 1);
  assert_int_equal(h->srv.stats.cache_entries, 3);

  h_nack(h, H_CLIENT, 1, 4, true, true);
  /* a copy for each kept one; the client's nack multiple is not sent */
  expect_copy(h, true, 5);  /* tag 1, seq 1 */
  expect_copy(h, false, 5); /* tag 2, seq 2 */
  expect_copy(h, false, 5); /* tag 4, seq 3 */
  h_expect_none(h, H_BROKER);
  assert_int_equal(h->srv.stats.uncached_nacks, 1);

  confirm(h, 3, true);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  h_expect(h, H_BROKER, "ch1 basic.ack tag=2 multiple=0");
  h_expect(h, H_BROKER, "ch1 basic.ack tag=4 multiple=0");
  h_expect_none(h, H_BROKER);

  /* the uncached one's requeue: only after the tier delay (README, "Never
   * a hot loop"), on its own */
  assert_int_equal(snap(h).requeues_delayed, 1);
  h_expect_within(h, H_BROKER, 5000,
                  "ch1 basic.nack tag=3 multiple=0 requeue=1");
  assert_int_equal(h_metric(h, PX_M_DELAYED, "delivery not kept", NULL), 1);
  assert_int_equal(h_metric(h, PX_M_RETRIES, "q", "1s"), 3);
  h_expect_none(h, H_BROKER);
  h_expect_none(h, H_CLIENT);
}

/* A nack of an uncached delivery alone goes to the broker unchanged, but
 * only after the tier delay: never an immediate, uncounted requeue. */
static void test_nack_uncached_alone(void **state) {
  static const char *const args[] = {POLICY, "--cache-per-connection", "100",
                                     NULL};
  harness *h = start(state, args);
  consuming(h, 0);
  deliver(h, 1, BIG, sizeof BIG);
  assert_int_equal(h->srv.stats.uncached_deliveries, 1);
  h_nack(h, H_CLIENT, 1, 1, false, true);
  h_expect_none(h, H_BROKER);
  assert_int_equal(snap(h).requeues_delayed, 1);
  h_expect_within(h, H_BROKER, 5000,
                  "ch1 basic.nack tag=1 multiple=0 requeue=1");
  h_expect_none(h, H_BROKER);
  assert_int_equal(h->srv.stats.uncached_nacks, 1);
  assert_int_equal(h_metric(h, PX_M_DELAYED, "delivery not kept", NULL), 1);
}

/* ---- 6. a channel's frames wait behind its copy, in order -------------- */

static void test_held_frames_in_order(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  amqp_method m;
  hbuf *pub = h_buf(h), *hdr = h_buf(h), *body = h_buf(h), *ack = h_buf(h),
       *nack = h_buf(h), *all = h_buf(h);
  consuming(h, 3);

  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5);

  amqp_method_init(&m, AMQP_BASIC_PUBLISH);
  m.args[AMQP_F_BASIC_PUBLISH_ROUTING_KEY].b = amqp_cstr("elsewhere");
  hb_method(pub, 1, &m);
  hb_header(hdr, 1, 3, NULL);
  hb_body(body, 1, "abc", 3);
  amqp_method_init(&m, AMQP_BASIC_ACK);
  m.args[AMQP_F_BASIC_ACK_DELIVERY_TAG].u = 2;
  hb_method(ack, 1, &m);
  amqp_method_init(&m, AMQP_BASIC_NACK);
  m.args[AMQP_F_BASIC_NACK_DELIVERY_TAG].u = 3;
  hb_method(nack, 1, &m); /* requeue=0: passes unchanged */
  hb_raw(all, pub->p, pub->len);
  hb_raw(all, hdr->p, hdr->len);
  hb_raw(all, body->p, body->len);
  hb_raw(all, ack->p, ack->len);
  hb_raw(all, nack->p, nack->len);
  h_sendb(h, H_CLIENT, all);
  h_expect_none(h, H_BROKER); /* nothing of channel 1 before the confirm */

  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  h_expect_bytes(h, H_BROKER, pub->p, pub->len);
  h_expect_bytes(h, H_BROKER, hdr->p, hdr->len);
  h_expect_bytes(h, H_BROKER, body->p, body->len);
  h_expect_bytes(h, H_BROKER, ack->p, ack->len);
  h_expect_bytes(h, H_BROKER, nack->p, nack->len);
  h_expect_none(h, H_BROKER);
  h_expect_none(h, H_CLIENT);
}

/* A consume naming "" takes the channel's last declared queue: a
 * server-named one pipelined before it is named by its declare-ok, so the
 * delivery's copy goes to that queue's tier, never to ".retry.1s". */
static void test_consume_of_the_last_declared_queue(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  amqp_method m;
  assert_int_equal(h_open(h, 10, 131072), 10);
  h_channel(h, 1, 1);
  hbuf *b = h_buf(h);
  amqp_method_init(&m, AMQP_QUEUE_DECLARE);
  hb_method(b, 1, &m); /* queue "": server-named */
  amqp_method_init(&m, AMQP_BASIC_CONSUME);
  m.args[AMQP_F_BASIC_CONSUME_CONSUMER_TAG].b = amqp_cstr("c1");
  hb_method(b, 1, &m); /* queue "": the last declared */
  h_sendb(h, H_CLIENT, b);
  h_skip_until(h, H_BROKER, "ch1 basic.consume *");
  amqp_method_init(&m, AMQP_QUEUE_DECLARE_OK);
  m.args[AMQP_F_QUEUE_DECLARE_OK_QUEUE].b = amqp_cstr("q");
  hb_method(b, 1, &m);
  amqp_method_init(&m, AMQP_BASIC_CONSUME_OK);
  m.args[AMQP_F_BASIC_CONSUME_OK_CONSUMER_TAG].b = amqp_cstr("c1");
  hb_method(b, 1, &m);
  h_sendb(h, H_BROKER, b);
  h_skip_until(h, H_CLIENT, "ch1 basic.consume-ok ctag=c1*");
  deliver(h, 1, "hello", 5);
  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5);
  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  h_expect_none(h, H_BROKER);
}

/* An ack multiple=1 that covers a delivery whose copy waits for its
 * confirm goes upstream at once, around it: one multiple ack below it,
 * single acks above it; the waiting one is acked by rebound once its copy
 * is confirmed, never by the client's settle. */
static void test_ack_multiple_split_around_a_retry(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 5);
  h_nack(h, H_CLIENT, 1, 3, false, true);
  expect_copy(h, true, 5);
  h_ack(h, H_CLIENT, 1, 5, true);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=2 multiple=1");
  h_expect(h, H_BROKER, "ch1 basic.ack tag=4 multiple=0");
  h_expect(h, H_BROKER, "ch1 basic.ack tag=5 multiple=0");
  h_expect_none(h, H_BROKER);
  assert_int_equal(h->srv.stats.settles_split, 1);
  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=3 multiple=0");
  h_expect_none(h, H_BROKER);
  h_expect_none(h, H_CLIENT);
}

/* ---- 7. the client's connection.close waits for copies in flight ------- */

static void connection_close(hbuf *b) {
  amqp_method m;
  amqp_method_init(&m, AMQP_CONNECTION_CLOSE);
  m.args[AMQP_F_CONNECTION_CLOSE_REPLY_CODE].u = 200;
  m.args[AMQP_F_CONNECTION_CLOSE_REPLY_TEXT].b = amqp_cstr("Goodbye");
  hb_method(b, 0, &m);
}

static void test_close_waits_for_confirm(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  hbuf *close = h_buf(h);
  consuming(h, 1);

  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5);
  connection_close(close);
  h_send(h, H_CLIENT, close->p, close->len);
  h_expect_none(h, H_BROKER);

  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  h_expect_bytes(h, H_BROKER, close->p, close->len);
  h_expect_none(h, H_BROKER);
  h_close_ok(h, H_BROKER, 0);
  h_expect(h, H_CLIENT, "ch0 connection.close-ok");
  h_expect_none(h, H_CLIENT);
  h_eof(h, H_CLIENT, UV_EOF);
  assert_true(h_wait_gone(h, 5000));
  assert_int_equal(h_closes(h, "client closed the connection"), 1);
  assert_int_equal(h_metric(h, PX_M_RETRIES, "q", "1s"), 1);
}

/* No confirm within --retry-confirm-timeout (200 ms): the copy falls back
 * (README, "Never lost"), the frames held behind it go on: the close. */
static void test_close_waits_confirm_timeout(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 1);

  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5);
  hbuf *close = h_buf(h);
  connection_close(close);
  h_send(h, H_CLIENT, close->p, close->len);
  h_expect_none(h, H_BROKER);

  assert_true(h_wait_frame(h, H_BROKER, 5000));
  assert_int_equal(h_metric(h, PX_M_FALLBACKS, "confirm timeout", NULL), 1);
  h_skip_until(h, H_BROKER, "ch0 connection.close code=200 text=Goodbye");
  h_close_ok(h, H_BROKER, 0);
  h_expect(h, H_CLIENT, "ch0 connection.close-ok");
  h_expect_none(h, H_CLIENT);
}

/* ... and the fallback requeue reaches the broker before the client's
 * connection.close: after it the broker acts on nothing but close-ok
 * (README, "Closing"), so a requeue sent later is never acted on. */
static void test_close_after_fallback_requeue(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 1);

  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5);
  hbuf *close = h_buf(h);
  connection_close(close);
  h_send(h, H_CLIENT, close->p, close->len);

  h_expect_within(h, H_BROKER, 5000,
                  "ch1 basic.nack tag=1 multiple=0 requeue=1");
  h_expect_within(h, H_BROKER, 5000, "ch0 connection.close code=200 *");
  h_expect_none(h, H_BROKER);
}

/* ---- 8. every way a session ends, each counted under its reason -------- */

/* The session must be gone, counted once, under `reason`. */
static void gone_as(harness *h, const char *reason) {
  assert_true(h_wait_gone(h, 5000));
  assert_int_equal(total_closes(h), 1);
  assert_int_equal(h_closes(h, reason), 1);
}

/* The client hangs up: rebound ends the open broker connection with
 * connection.close and hangs up only once it is answered (px_up_end:
 * RabbitMQ drops what it has not acted on of a connection that just hangs
 * up), then waits for the broker's EOF. */
static void client_leaves_answered(harness *h) {
  h_expect(h, H_BROKER,
           "ch0 connection.close code=200 text=\"client disconnected\"");
  assert_false(h_peer(h, H_BROKER)->shut);
  h_close_ok(h, H_BROKER, 0);
  h_settle(h);
  assert_true(h_peer(h, H_BROKER)->shut);
  assert_non_null(h->s);
  h_eof(h, H_BROKER, UV_EOF);
  gone_as(h, "client disconnected");
  h_expect_none(h, H_BROKER);
  h_expect_none(h, H_CLIENT);
}

static void client_leaves(harness *h, int err) {
  h_eof(h, H_CLIENT, err);
  client_leaves_answered(h);
}

static void test_close_client_eof(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  client_leaves(h, UV_EOF);
}

static void test_close_client_reset(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  client_leaves(h, UV_ECONNRESET);
}

/* The copy was confirmed and its original acked; then the client hangs up
 * with nothing in flight. The ack is followed by connection.close, and
 * the broker's side is shut down only after the close-ok: a bare hang-up
 * right after the ack loses it, and the original comes again beside its
 * copy. */
static void test_close_client_eof_after_ack(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 1);
  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5);
  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  client_leaves(h, UV_EOF);
  assert_int_equal(h_metric(h, PX_M_RETRIES, "q", "1s"), 1);
}

/* The client hangs up while a copy is in flight: the copy is finished
 * (confirmed, its original acked) before the broker's side is closed. */
static void test_close_client_eof_copy_in_flight(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 1);
  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5);
  h_eof(h, H_CLIENT, UV_EOF);
  h_expect(h, H_BROKER, "ch1 basic.cancel ctag=c1 no-wait=1");
  h_expect_none(h, H_BROKER);
  assert_false(h_peer(h, H_BROKER)->shut);
  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  client_leaves_answered(h);
  assert_int_equal(h_metric(h, PX_M_RETRIES, "q", "1s"), 1);
}

/* The client's own connection.close passed on, then it hangs up before
 * the broker's close-ok: the broker's side is not shut down until that
 * close-ok came, and no second connection.close is sent. */
static void test_close_client_hangs_up_after_close(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_close(h, H_CLIENT, 0, 200, "Goodbye");
  h_eof(h, H_CLIENT, UV_EOF);
  h_expect(h, H_BROKER, "ch0 connection.close code=200 text=Goodbye");
  h_expect_none(h, H_BROKER);
  assert_false(h_peer(h, H_BROKER)->shut);
  h_close_ok(h, H_BROKER, 0);
  h_settle(h);
  assert_true(h_peer(h, H_BROKER)->shut);
  h_eof(h, H_BROKER, UV_EOF);
  gone_as(h, "client closed");
  h_expect_none(h, H_CLIENT);
}

static void test_close_by_client(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_close(h, H_CLIENT, 0, 200, "Goodbye");
  h_expect(h, H_BROKER, "ch0 connection.close code=200 text=Goodbye");
  h_close_ok(h, H_BROKER, 0);
  h_expect(h, H_CLIENT, "ch0 connection.close-ok");
  h_eof(h, H_CLIENT, UV_EOF);
  gone_as(h, "client closed the connection");
}

static void test_close_by_broker(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_close(h, H_BROKER, 0, 320,
          "CONNECTION_FORCED - broker forced connection "
          "closure with reason 'shutdown'");
  h_expect(h, H_CLIENT, "ch0 connection.close code=320 *");
  h_close_ok(h, H_CLIENT, 0);
  h_expect(h, H_BROKER, "ch0 connection.close-ok");
  h_eof(h, H_BROKER, UV_EOF);
  h_settle(h);
  assert_true(h_peer(h, H_CLIENT)->shut);
  h_eof(h, H_CLIENT, UV_EOF);
  gone_as(h, "broker closed the connection");
}

/* The broker hangs up instead of answering the client's connection.close:
 * the client's side is flushed, shut down, and its EOF ends it. */
static void test_close_broker_hangs_up_on_close(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_close(h, H_CLIENT, 0, 200, "Goodbye");
  h_expect(h, H_BROKER, "ch0 connection.close code=200 text=Goodbye");
  h_eof(h, H_BROKER, UV_EOF);
  h_settle(h);
  assert_true(h_peer(h, H_CLIENT)->shut);
  h_expect_none(h, H_CLIENT);
  h_eof(h, H_CLIENT, UV_EOF);
  gone_as(h, "broker closed");
}

/* The client hangs up with a copy in flight that the broker never
 * confirms: after --retry-finish-timeout the session ends, the reason
 * saying so, and nothing more reaches the broker (the broker requeues the
 * unsettled original when the connection goes). */
static void test_close_client_gone_copy_never_confirmed(void **state) {
  static const char *const args[] = {POLICY,  "--retry-confirm-timeout",
                                     "10s",   "--retry-finish-timeout",
                                     "100ms", NULL};
  harness *h = start(state, args);
  consuming(h, 1);
  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5);
  h_eof(h, H_CLIENT, UV_EOF);
  gone_as(h, "client disconnected (retries pending timed out)");
  h_expect(h, H_BROKER, "ch1 basic.cancel ctag=c1 no-wait=1");
  h_expect_none(h, H_BROKER);
}

/* ... and the same when the client's death showed as a failed write: the
 * reason names the failed write. */
static void test_close_client_write_failed_copy_never_confirmed(void **state) {
  static const char *const args[] = {POLICY,  "--retry-confirm-timeout",
                                     "10s",   "--retry-finish-timeout",
                                     "100ms", NULL};
  harness *h = start(state, args);
  consuming(h, 1);
  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5);
  h_peer(h, H_CLIENT)->try_write_error = UV_EPIPE;
  h_deliver(h, 1, "c1", 2, NULL, "again", 5); /* its write fails */
  h_settle(h);
  h_eof(h, H_CLIENT, UV_ECONNRESET);
  gone_as(h, "client write failed (retries pending timed out)");
  h_expect(h, H_BROKER, "ch1 basic.cancel ctag=c1 no-wait=1");
  h_expect_none(h, H_BROKER);
}

static void test_close_broker_lost(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_eof(h, H_BROKER, UV_ECONNRESET);
  h_expect(h, H_CLIENT,
           "ch0 connection.close code=320 "
           "text=\"CONNECTION_FORCED - broker connection lost\"");
  h_close_ok(h, H_CLIENT, 0);
  gone_as(h, "broker connection lost");
  h_expect_none(h, H_CLIENT);
}

static void test_close_broker_gone_in_handshake(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_send(h, H_CLIENT, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE);
  h_expect(h, H_BROKER, "protocol-header");
  h_eof(h, H_BROKER, UV_EOF);
  h_settle(h);
  assert_true(h_peer(h, H_CLIENT)->shut); /* the client reads the EOF */
  h_eof(h, H_CLIENT, UV_EOF);
  gone_as(h, "broker disconnected");
  h_expect_none(h, H_CLIENT);
}

static void test_close_client_write_failed(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_peer(h, H_CLIENT)->try_write_error = UV_EPIPE;
  hbuf *b = h_buf(h);
  hb_heartbeat(b, 0);
  h_sendb(h, H_BROKER, b);
  h_settle(h);
  /* what the client sent before it went is still read: its EOF ends it */
  h_eof(h, H_CLIENT, UV_ECONNRESET);
  h_settle(h);
  h_eof(h, H_BROKER, UV_EOF);
  gone_as(h, "client write failed");
}

/* A write to the client failed and no EOF comes: after the client-dead
 * wait the broker's side is ended with connection.close, and hung up on
 * only once it is answered (not cut off: what the broker has not acted on
 * would be dropped). */
static void test_close_client_dead_timeout_ends_upstream(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_peer(h, H_CLIENT)->try_write_error = UV_EPIPE;
  hbuf *b = h_buf(h);
  hb_heartbeat(b, 0);
  h_sendb(h, H_BROKER, b);
  h_expect_within(h, H_BROKER, PX_CLOSE_WAIT_MS + 1000,
                  "ch0 connection.close code=200 text=\"client write failed\"");
  assert_non_null(h->s);
  assert_false(h_peer(h, H_BROKER)->shut);
  h_close_ok(h, H_BROKER, 0);
  h_settle(h);
  assert_true(h_peer(h, H_BROKER)->shut);
  h_eof(h, H_BROKER, UV_EOF);
  gone_as(h, "client write failed");
}

static void test_close_client_write_completes_failed(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_peer(h, H_CLIENT)->try_write_max = 0; /* everything goes in a request */
  h_peer(h, H_CLIENT)->complete_error = UV_ECONNRESET;
  hbuf *b = h_buf(h);
  hb_heartbeat(b, 0);
  h_sendb(h, H_BROKER, b);
  /* no EOF from the client: rebound gives it PX_CLOSE_WAIT_MS (2 s) */
  gone_as(h, "client write failed");
}

static void test_close_upstream_write_failed(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_peer(h, H_BROKER)->try_write_error = UV_EPIPE;
  hbuf *b = h_buf(h);
  hb_heartbeat(b, 0);
  h_sendb(h, H_CLIENT, b);
  gone_as(h, "upstream write failed");
  h_expect_none(h, H_CLIENT);
}

/* The transport has no memory for a write: the session closes at once
 * (nothing can be sent to tell anyone). */
static void test_close_out_of_memory(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_peer(h, H_BROKER)->try_write_error = UV_ENOMEM;
  hbuf *b = h_buf(h);
  hb_heartbeat(b, 0);
  h_sendb(h, H_CLIENT, b);
  gone_as(h, "out of memory");
  h_expect_none(h, H_CLIENT);
}

static void test_close_bad_protocol_header(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_send(h, H_CLIENT, "AMQP\x01\x01\x00\x0a", 8); /* 1.0 */
  h_expect(h, H_CLIENT,
           "protocol-header"); /* the 0-9-1 one, as the spec says */
  h_expect_none(h, H_CLIENT);
  h_expect_none(h, H_BROKER);
  assert_true(h_peer(h, H_CLIENT)->shut);
  assert_int_equal(h->srv.stats.protocol_errors, 1);
  h_eof(h, H_CLIENT, UV_EOF);
  gone_as(h, "bad protocol header");
}

static void test_close_handshake_timeout(void **state) {
  static const char *const args[] = {POLICY, "--handshake-timeout", "200ms",
                                     NULL};
  harness *h = start(state, args);
  h_send(h, H_CLIENT, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE);
  h_expect(h, H_BROKER, "protocol-header");
  gone_as(h, "handshake timeout");
  h_expect_none(h, H_CLIENT);
  h_expect_none(h, H_BROKER);
}

/* The broker refuses the login with connection.close and the client never
 * answers: the handshake's limit still ends the session. */
static void test_close_in_handshake_keeps_its_limit(void **state) {
  static const char *const args[] = {POLICY, "--handshake-timeout", "300ms",
                                     NULL};
  harness *h = start(state, args);
  h_send(h, H_CLIENT, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE);
  h_expect(h, H_BROKER, "protocol-header");
  h_close(h, H_BROKER, 0, 403, "ACCESS_REFUSED");
  h_expect(h, H_CLIENT, "ch0 connection.close code=403 *");
  gone_as(h, "handshake timeout");
}

/* No upstream reachable: the client is answered in AMQP, not with a bare
 * EOF: rebound's own connection.start and tune, and to the client's
 * connection.open a connection.close 320 naming the reason. */
static void refused(harness *h) {
  amqp_method m;
  h_expect(h, H_CLIENT, "ch0 connection.start*");
  amqp_method_init(&m, AMQP_CONNECTION_START_OK);
  m.args[AMQP_F_CONNECTION_START_OK_MECHANISM].b = amqp_cstr("PLAIN");
  m.args[AMQP_F_CONNECTION_START_OK_RESPONSE].b = amqp_cstr("guest");
  m.args[AMQP_F_CONNECTION_START_OK_LOCALE].b = amqp_cstr("en_US");
  h_method(h, H_CLIENT, 0, &m);
  h_expect(h, H_CLIENT, "ch0 connection.tune *");
  amqp_method_init(&m, AMQP_CONNECTION_TUNE_OK);
  m.args[AMQP_F_CONNECTION_TUNE_OK_FRAME_MAX].u = 131072;
  h_method(h, H_CLIENT, 0, &m);
  amqp_method_init(&m, AMQP_CONNECTION_OPEN);
  m.args[AMQP_F_CONNECTION_OPEN_VIRTUAL_HOST].b = amqp_cstr("/");
  h_method(h, H_CLIENT, 0, &m);
  h_expect(h, H_CLIENT, "ch0 connection.open-ok*");
  h_expect(h, H_CLIENT,
           "ch0 connection.close code=320 "
           "text=\"CONNECTION_FORCED - no upstream reachable\"*");
  h_close_ok(h, H_CLIENT, 0);
  gone_as(h, "no upstream reachable");
  h_expect_none(h, H_CLIENT);
}

static void test_close_no_upstream(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_peer(h, H_BROKER)->connect_status = UV_ECONNREFUSED;
  h_send(h, H_CLIENT, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE);
  refused(h);
  assert_int_equal(h_metric(h, PX_M_CONNECT_FAILURES, "127.0.0.1:5672", NULL),
                   1);
  assert_string_equal(h_peer(h, H_BROKER)->connect_addr, "127.0.0.1:5672");
}

/* The upstreams failed before the client's protocol header came: it is
 * refused the same way once it does. */
static void test_close_no_upstream_header_later(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_peer(h, H_BROKER)->connect_status = UV_ECONNREFUSED;
  h_settle(h);
  assert_non_null(h->s);
  h_send(h, H_CLIENT, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE);
  refused(h);
}

/* A refused client that never answers rebound's connection.start: the
 * handshake's limit ends it. */
static void test_close_no_upstream_client_silent(void **state) {
  static const char *const args[] = {POLICY, "--handshake-timeout", "300ms",
                                     NULL};
  harness *h = start(state, args);
  h_peer(h, H_BROKER)->connect_status = UV_ECONNREFUSED;
  h_send(h, H_CLIENT, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE);
  h_expect(h, H_CLIENT, "ch0 connection.start*");
  gone_as(h, "no upstream reachable");
}

/* A client protocol error: connection.close with the reply code to the
 * client; its close-ok ends the session as "closed by rebound". */
static void protocol_error(void **state, uint16_t channel_max, const void *p,
                           size_t len, const char *close_line) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, channel_max, 131072);
  h_channel(h, 1, 1);
  h_send(h, H_CLIENT, p, len);
  h_expect(h, H_CLIENT, close_line);
  h_expect_none(h, H_CLIENT);
  h_expect_none(h, H_BROKER);
  assert_int_equal(h->srv.stats.protocol_errors, 1);
  h_close_ok(h, H_CLIENT, 0);
  gone_as(h, "closed by rebound");
  /* the broker's side is closed without a connection.close of rebound's
   * (not asserted: see the README's "waits for the broker's close-ok") */
}

static void test_close_bad_frame_end(void **state) {
  static const uint8_t frame[] = {1, 0, 1, 0, 0, 0, 4, 0, 60, 0, 10, 0xAB};
  protocol_error(state, 10, frame, sizeof frame,
                 "ch0 connection.close code=501 *");
}

static void test_close_class_on_channel0(void **state) {
  hbuf b = {0};
  amqp_method m;
  amqp_method_init(&m, AMQP_BASIC_QOS);
  hb_method(&b, 0, &m);
  uint8_t frame[64];
  memcpy(frame, b.p, b.len);
  size_t n = b.len;
  hb_free(&b);
  protocol_error(state, 10, frame, n,
                 "ch0 connection.close code=503 text=\"COMMAND_INVALID - only "
                 "connection methods on channel 0\" method=60.10");
}

static void test_close_content_on_channel0(void **state) {
  hbuf b = {0};
  hb_header(&b, 0, 0, NULL);
  uint8_t frame[64];
  memcpy(frame, b.p, b.len);
  size_t n = b.len;
  hb_free(&b);
  protocol_error(state, 10, frame, n, "ch0 connection.close code=505 *");
}

static void test_close_heartbeat_on_channel(void **state) {
  static const uint8_t frame[] = {8, 0, 1, 0, 0, 0, 0, 0xCE};
  protocol_error(state, 10, frame, sizeof frame,
                 "ch0 connection.close code=505 *");
}

static void test_close_body_unexpected(void **state) {
  hbuf b = {0};
  hb_body(&b, 1, "x", 1);
  uint8_t frame[64];
  memcpy(frame, b.p, b.len);
  size_t n = b.len;
  hb_free(&b);
  protocol_error(state, 10, frame, n, "ch0 connection.close code=505 *");
}

static void test_close_frame_on_own_channel(void **state) {
  hbuf b = {0};
  amqp_method m;
  amqp_method_init(&m, AMQP_BASIC_QOS);
  hb_method(&b, 10, &m); /* 10 is rebound's: the client never opened it */
  uint8_t frame[64];
  memcpy(frame, b.p, b.len);
  size_t n = b.len;
  hb_free(&b);
  protocol_error(state, 10, frame, n,
                 "ch0 connection.close code=504 "
                 "text=\"CHANNEL_ERROR - expected 'channel.open'\" "
                 "method=60.10");
}

static void test_close_second_tune_ok(void **state) {
  hbuf b = {0};
  amqp_method m;
  amqp_method_init(&m, AMQP_CONNECTION_TUNE_OK);
  m.args[AMQP_F_CONNECTION_TUNE_OK_CHANNEL_MAX].u = 10;
  m.args[AMQP_F_CONNECTION_TUNE_OK_FRAME_MAX].u = 131072;
  hb_method(&b, 0, &m);
  uint8_t frame[64];
  memcpy(frame, b.p, b.len);
  size_t n = b.len;
  hb_free(&b);
  protocol_error(
      state, 10, frame, n,
      "ch0 connection.close code=504 text=\"CHANNEL_ERROR - unexpected "
      "connection.tune-ok, the connection is already tuned\" "
      "method=10.31");
}

static void test_close_broker_protocol_error(void **state) {
  static const char *const args[] = {POLICY, NULL};
  static const uint8_t frame[] = {1, 0, 1, 0, 0, 0, 4, 0, 60, 0, 11, 0x00};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_channel(h, 1, 1);
  h_send(h, H_BROKER, frame, sizeof frame);
  h_expect(h, H_CLIENT, "ch0 connection.close code=541 *");
  h_expect_none(h, H_CLIENT);
  h_close_ok(h, H_CLIENT, 0);
  gone_as(h, "closed by rebound");
  /* the broker's side is closed without a connection.close of rebound's
   * (not asserted: see the README's "waits for the broker's close-ok") */
}

/* The client closed normally (close-ok passed), its socket then fails a
 * write while rebound answers a malformed broker frame: the session
 * closes once, counted once, and is freed; it never comes back to life
 * (no second upstream connect). */
static void test_close_finishing_write_fails(void **state) {
  static const char *const args[] = {POLICY, NULL};
  static const uint8_t bad[] = {1, 0, 1, 0, 0, 0, 4, 0, 60, 0, 11, 0x00};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_close(h, H_CLIENT, 0, 200, "bye");
  h_expect(h, H_BROKER, "ch0 connection.close *");
  h_close_ok(h, H_BROKER, 0);
  h_expect(h, H_CLIENT, "ch0 connection.close-ok");
  h_peer(h, H_CLIENT)->try_write_error = UV_EPIPE; /* the client reset */
  h_send(h, H_BROKER, bad, sizeof bad);
  assert_true(h_wait_gone(h, 5000));
  assert_int_equal(h_peer(h, H_BROKER)->connects, 1);
  assert_int_equal(total_closes(h), 1);
  assert_int_equal(h_closes(h, "client closed the connection"), 1);
}

static void test_close_client_silent_after_error(void **state) {
  static const char *const args[] = {POLICY, NULL};
  static const uint8_t frame[] = {1, 0, 1, 0, 0, 0, 4, 0, 60, 0, 10, 0xAB};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_send(h, H_CLIENT, frame, sizeof frame);
  h_expect(h, H_CLIENT, "ch0 connection.close code=501 *");
  /* no close-ok: PX_CLOSE_WAIT_MS (2 s) later rebound closes */
  gone_as(h, "close timeout");
}

static void test_close_drain(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  px_session_drain(h->s);
  h_expect(h, H_CLIENT,
           "ch0 connection.close code=320 "
           "text=\"CONNECTION_FORCED - rebound shutting down\"");
  h_expect_none(h, H_BROKER);
  h_close_ok(h, H_CLIENT, 0);
  h_expect(h, H_BROKER,
           "ch0 connection.close code=200 text=\"rebound shutting down\"");
  h_close_ok(h, H_BROKER, 0);
  gone_as(h, "rebound shutting down");
  h_expect_none(h, H_CLIENT);
}

/* Draining while a copy waits to be published (parked behind one in
 * flight, then held by connection.blocked once that one is confirmed):
 * the broker is sent connection.close only after the parked copy went,
 * was confirmed and its original acked, not at the client's close-ok. */
static void test_close_drain_waits_for_parked(void **state) {
  static const char *const args[] = {"--retry-queues",
                                     "q*",
                                     "--retry-tiers",
                                     "1s",
                                     "--max-attempts",
                                     "3",
                                     "--retry-confirm-timeout",
                                     "5s",
                                     NULL};
  harness *h = start(state, args);
  assert_int_equal(h_open(h, 10, 131072), 10);
  h_channel(h, 1, 1);
  h_consume(h, 1, 1, "q", "c1");
  h_consume(h, 1, 1, "q2", "c2");
  deliver(h, 1, "hello", 5);
  h_deliver(h, 1, "c2", 2, NULL, "world", 5);
  h_skip_until(h, H_CLIENT, "ch1 body len=5");

  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5); /* seq 1, to q.retry.1s */
  h_nack(h, H_CLIENT, 1, 2, false, true);
  h_expect_none(h, H_BROKER); /* q2's tier is declared once seq 1 is done */
  h_simple(h, H_BROKER, 0, AMQP_CONNECTION_BLOCKED);
  h_expect(h, H_CLIENT, "ch0 connection.blocked*");
  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  h_expect_none(h, H_BROKER);

  px_session_drain(h->s);
  h_expect(h, H_CLIENT, "ch0 connection.close code=320 *");
  h_close_ok(h, H_CLIENT, 0);
  h_expect_none(h, H_BROKER);

  h_simple(h, H_BROKER, 0, AMQP_CONNECTION_UNBLOCKED);
  expect_line(h, H_BROKER, "ch%u queue.declare queue=q2.retry.1s", h->own_ch);
  h_skip(h, H_BROKER);
  h_simple(h, H_BROKER, h->own_ch, AMQP_QUEUE_DECLARE_OK);
  h_settle(h);
  h_skip(h, H_BROKER); /* the publish */
  confirm(h, 2, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=2 multiple=0");
  h_expect(h, H_BROKER,
           "ch0 connection.close code=200 text=\"rebound shutting down\"");
  h_close_ok(h, H_BROKER, 0);
  gone_as(h, "rebound shutting down");
  assert_int_equal(h_metric(h, PX_M_RETRIES, "q2", "1s"), 1);
}

/* A drain while the broker's side is being ended (the client hung up,
 * rebound's connection.close awaits its answer): the session is left to
 * finish that, not cut off before the close-ok. */
static void test_close_drain_while_broker_answers(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_open(h, 10, 131072);
  h_eof(h, H_CLIENT, UV_EOF);
  h_expect(h, H_BROKER,
           "ch0 connection.close code=200 text=\"client disconnected\"");
  px_session_drain(h->s);
  h_settle(h);
  assert_non_null(h->s);
  assert_false(h_peer(h, H_BROKER)->shut);
  h_close_ok(h, H_BROKER, 0);
  h_settle(h);
  assert_true(h_peer(h, H_BROKER)->shut);
  h_eof(h, H_BROKER, UV_EOF);
  gone_as(h, "client disconnected");
}

/* A drain while the client is gone with a copy in flight: the copy is
 * finished (its confirm, then the ack of its original) however long the
 * confirm takes within the retry-finish timeout; the 2 s wait of a client
 * being told to close does not cut it short. */
static void test_close_drain_client_gone_finishes_copy(void **state) {
  static const char *const args[] = {"--retry-queues",
                                     "q",
                                     "--retry-tiers",
                                     "1s",
                                     "--max-attempts",
                                     "3",
                                     "--retry-confirm-timeout",
                                     "5s",
                                     "--retry-finish-timeout",
                                     "10s",
                                     NULL};
  harness *h = start(state, args);
  consuming(h, 1);
  h_nack(h, H_CLIENT, 1, 1, false, true);
  expect_copy(h, true, 5);
  h_eof(h, H_CLIENT, UV_EOF);
  h_settle(h); /* the session has seen the client go */
  px_session_drain(h->s);
  h_wait_ms(h, PX_CLOSE_WAIT_MS + 500);
  assert_non_null(h->s);
  h_expect(h, H_BROKER, "ch1 basic.cancel ctag=c1 no-wait=1");
  h_expect_none(h, H_BROKER);
  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  client_leaves_answered(h);
  assert_int_equal(h_metric(h, PX_M_RETRIES, "q", "1s"), 1);
}

static void test_close_drain_in_handshake(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  h_send(h, H_CLIENT, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE);
  h_expect(h, H_BROKER, "protocol-header");
  px_session_drain(h->s);
  gone_as(h, "rebound shutting down");
  h_expect_none(h, H_CLIENT);
}

/* ---- 7a. the dialer ------------------------------------------------------ */

#define TWO_UPSTREAMS                                                          \
  POLICY, "--upstream", "127.0.0.1:1,127.0.0.1:2", "--connect-timeout", "300ms"

/* The first upstream's connect never completes (its SYNs are dropped):
 * after the connect timeout the next one is tried, transparently to the
 * client. */
static void test_dial_connect_hangs(void **state) {
  static const char *const args[] = {TWO_UPSTREAMS, NULL};
  harness *h = start(state, args);
  h_peer(h, H_BROKER)->connect_hanging = true; /* the first, under way */
  h_send(h, H_CLIENT, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE);
  h_expect_within(h, H_BROKER, 2000, "protocol-header");
  assert_int_equal(h_peer(h, H_BROKER)->connects, 2);
  assert_string_equal(h_peer(h, H_BROKER)->connect_addr, "127.0.0.1:2");
  assert_int_equal(h_metric(h, PX_M_CONNECT_FAILURES, "127.0.0.1:1", NULL), 1);
  assert_int_equal(h_open_after_header(h, 10, 131072), 10);
  h_expect_none(h, H_CLIENT);
}

/* The first upstream accepts the connection but never sends
 * connection.start: the client's protocol header, already sent there,
 * goes to the next one, and the handshake goes on through it. */
static void test_dial_no_start(void **state) {
  static const char *const args[] = {TWO_UPSTREAMS, NULL};
  harness *h = start(state, args);
  h_send(h, H_CLIENT, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE);
  h_expect(h, H_BROKER, "protocol-header");
  assert_string_equal(h_peer(h, H_BROKER)->connect_addr, "127.0.0.1:1");
  h_expect_within(h, H_BROKER, 2000, "protocol-header");
  assert_int_equal(h_peer(h, H_BROKER)->connects, 2);
  assert_string_equal(h_peer(h, H_BROKER)->connect_addr, "127.0.0.1:2");
  assert_int_equal(h_open_after_header(h, 10, 131072), 10);
  h_expect_none(h, H_CLIENT);
}

/* Every upstream fails: the session ends with "no upstream reachable"
 * after one timeout per upstream. */
static void test_dial_all_time_out(void **state) {
  static const char *const args[] = {TWO_UPSTREAMS, NULL};
  harness *h = start(state, args);
  h_peer(h, H_BROKER)->connect_hanging = true; /* the first, under way */
  h_peer(h, H_BROKER)->connect_hangs = 1;      /* and the second */
  h_send(h, H_CLIENT, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE);
  h_wait_ms(h, 800); /* two timeouts of 300 ms */
  refused(h);
  assert_int_equal(h_peer(h, H_BROKER)->connects, 2);
  h_expect_none(h, H_BROKER);
}

/* ---- 7b. the retry connection (--retry-connection separate) ------------- */

#define SEPARATE POLICY, "--retry-connection", "separate"

/* An open connection, channel 1 consuming from q, one delivery kept, and
 * the retry connection that delivery opened, logged in. */
static void consuming_separate(harness *h) {
  assert_int_equal(h_open(h, 10, 131072), 0); /* nothing of rebound's here */
  h_channel(h, 1, 1);
  h_consume(h, 1, 1, "q", "c1");
  deliver(h, 1, "hello", 5);
  assert_int_equal(h_pub_open(h), 1);
  h_expect_none(h, H_BROKER);
}

/* The copy goes on the retry connection, the ack of its original on the
 * client's; when the session ends, the retry connection says goodbye. */
static void test_separate_copy_then_ack(void **state) {
  static const char *const args[] = {SEPARATE, NULL};
  harness *h = start(state, args);
  consuming_separate(h);

  h_nack(h, H_CLIENT, 1, 1, false, true);
  h_expect(h, H_PUB, "ch1 queue.declare queue=q.retry.1s*");
  h_expect(h, H_PUB, "ch1 basic.publish exchange= rk=q.retry.1s mandatory=1");
  h_expect(h, H_PUB, "ch1 header size=5");
  h_expect(h, H_PUB, "ch1 body len=5");
  h_expect_none(h, H_BROKER);
  h_simple(h, H_PUB, 1, AMQP_QUEUE_DECLARE_OK);
  h_ack(h, H_PUB, 1, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  h_expect_none(h, H_CLIENT);
  assert_int_equal(h_metric(h, PX_M_RETRIES, "q", "1s"), 1);
  assert_string_equal(snap(h).retry_connection, "separate");

  h_close(h, H_CLIENT, 0, 200, "Goodbye");
  h_expect(h, H_BROKER, "ch0 connection.close code=200 text=Goodbye");
  h_close_ok(h, H_BROKER, 0);
  h_expect(h, H_CLIENT, "ch0 connection.close-ok");
  h_eof(h, H_CLIENT, UV_EOF);
  h_expect_within(h, H_PUB, 5000, "ch0 connection.close code=200 *");
  h_close_ok(h, H_PUB, 0);
  gone_as(h, "client closed the connection");
  h_expect_none(h, H_PUB);
}

/* A write to the retry connection fails: the connection is lost (reported
 * from the loop, not from inside the publish), the copy in flight falls
 * back to a requeue of its original after the tier delay, and the retry
 * connection is dialled again at once, then after 0.5 s, 1 s and 2 s; its
 * writes fail each time, and after PX_PUB_MISSES_MAX failed logins in a
 * row rebound's channel goes on the client's connection. */
static void test_separate_write_fails(void **state) {
  static const char *const args[] = {SEPARATE, NULL};
  harness *h = start(state, args);
  consuming_separate(h);

  h_peer(h, H_PUB)->try_write_error = UV_EPIPE;
  h_nack(h, H_CLIENT, 1, 1, false, true);
  h_settle(h);
  h_skip(h, H_PUB);
  assert_int_equal(h_peer(h, H_PUB)->connects, 2); /* the first at once */
  /* the original, requeued after the tier delay (1 s) */
  h_expect_within(h, H_BROKER, 3000,
                  "ch1 basic.nack tag=1 multiple=0 requeue=1");
  assert_int_equal(
      h_metric(h, PX_M_FALLBACKS, "rebound's channel was closed", NULL), 1);
  h_expect_within(h, H_BROKER, 6000, "ch10 channel.open");
  assert_int_equal(h_peer(h, H_PUB)->connects, 1 + PX_PUB_MISSES_MAX);
  assert_int_equal(h->srv.stats.retry_connection_failures, PX_PUB_MISSES_MAX);
  h_simple(h, H_BROKER, 10, AMQP_CHANNEL_OPEN_OK);
  h_expect(h, H_BROKER, "ch10 confirm.select");
  h_simple(h, H_BROKER, 10, AMQP_CONFIRM_SELECT_OK);
  h_expect_none(h, H_BROKER);
  h_expect_none(h, H_CLIENT);
  assert_int_equal(h_metric(h, PX_M_RETRIES, "q", "1s"), 0);
}

/* The retry connection's transport has no memory for the copy's write:
 * the session closes (the broker requeues the original, uncounted). */
static void test_separate_write_out_of_memory(void **state) {
  static const char *const args[] = {SEPARATE, NULL};
  harness *h = start(state, args);
  consuming_separate(h);
  h_peer(h, H_PUB)->try_write_error = UV_ENOMEM;
  h_nack(h, H_CLIENT, 1, 1, false, true);
  gone_as(h, "retry connection write failed");
  h_expect_none(h, H_BROKER);
  h_expect_none(h, H_CLIENT);
  assert_int_equal(h_metric(h, PX_M_RETRIES, "q", "1s"), 0);
}

/* The retry connection is lost twice with a copy in flight and no copy
 * confirmed between: the first time it is opened again at once, the
 * second time only after the backoff. */
static void test_separate_lost_twice_backs_off(void **state) {
  static const char *const args[] = {SEPARATE, NULL};
  harness *h = start(state, args);
  consuming_separate(h);

  h_nack(h, H_CLIENT, 1, 1, false, true);
  h_skip_until(h, H_PUB, "ch1 body len=5");
  h_eof(h, H_PUB, UV_EOF); /* first loss: reopened at once */
  h_settle(h);
  assert_int_equal(h_peer(h, H_PUB)->connects, 2);
  assert_int_equal(h_pub_open(h), 1);

  deliver(h, 2, "hello", 5);
  h_nack(h, H_CLIENT, 1, 2, false, true);
  h_skip_until(h, H_PUB, "ch1 body len=5");
  h_eof(h, H_PUB, UV_EOF); /* second loss: after the backoff */
  h_settle(h);
  assert_int_equal(h_peer(h, H_PUB)->connects, 2);
  h_wait_ms(h, PX_OWN_BACKOFF_MS + 300);
  assert_int_equal(h_peer(h, H_PUB)->connects, 3);
}

/* ---- processing timeouts and lost consumers ----------------------------- */

#define TIMEOUT_POLICY POLICY, "--processing-timeout", "50ms"

/* Past its timeout, the janitor's tick copies the delivery (the retry
 * path) and, once confirmed, acks it; the client's ack of it later is
 * swallowed, counted. */
static void test_timeout_copy_then_late_ack(void **state) {
  static const char *const args[] = {TIMEOUT_POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 1);
  px_session_tick(h->s, 50);
  h_expect_none(h, H_BROKER); /* not yet */
  h_wait_ms(h, 60);
  px_session_tick(h->s, 50);
  expect_copy(h, true, 5);
  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  assert_int_equal(h->srv.stats.processing_timeouts, 1);
  h_ack(h, H_CLIENT, 1, 1, false);
  h_expect_none(h, H_BROKER);
  assert_int_equal(h->srv.stats.late_settles_swallowed, 1);
  h_ack(h, H_CLIENT, 1, 1, false); /* once swallowed, a second goes on */
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
}

/* The client's frames on the channel wait for the timeout's copy; a copy
 * that fails leaves the delivery with the client (no requeue), and it is
 * not timed out again. */
static void test_timeout_copy_fails_client_keeps_it(void **state) {
  static const char *const args[] = {TIMEOUT_POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 1);
  h_wait_ms(h, 60);
  px_session_tick(h->s, 50);
  expect_copy(h, true, 5);
  h_ack(h, H_CLIENT, 1, 1, false); /* held behind the copy */
  h_expect_none(h, H_BROKER);
  h_nack(h, H_BROKER, h->own_ch, 1, false, false); /* the broker refuses */
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0"); /* the client's */
  h_expect_none(h, H_BROKER);
  h_wait_ms(h, 60);
  px_session_tick(h->s, 50);
  h_expect_none(h, H_BROKER);
  assert_int_equal(h->srv.stats.processing_timeouts, 0);
  assert_int_equal(h->srv.stats.late_settles_swallowed, 0);
}

/* An ack multiple naming a timed-out tag goes on for the newest delivery
 * below it (here one of a queue without a policy); one that covers only
 * timed-out deliveries is swallowed. */
static void test_timeout_ack_multiple_rewritten(void **state) {
  static const char *const args[] = {TIMEOUT_POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 0);
  h_consume(h, 1, 1, "other", "c2");
  h_deliver(h, 1, "c2", 1, NULL, "plain", 5);
  h_skip_until(h, H_CLIENT, "ch1 body len=5");
  deliver(h, 2, "hello", 5);
  h_wait_ms(h, 60);
  px_session_tick(h->s, 50);
  expect_copy(h, true, 5);
  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=2 multiple=0");
  h_ack(h, H_CLIENT, 1, 2, true);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=1");
  h_expect_none(h, H_BROKER);
  assert_int_equal(h->srv.stats.late_settles_swallowed, 1);
}

/* A delivery being copied for its processing timeout is still the
 * client's to settle: an ack multiple covering it is not split around it
 * (that would drop the client's ack of it) but waits for the copy. */
static void test_timeout_copy_not_split_around(void **state) {
  static const char *const args[] = {TIMEOUT_POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 1);
  h_wait_ms(h, 60);
  deliver(h, 2, "hello", 5);
  deliver(h, 3, "hello", 5);
  px_session_tick(h->s, 50);
  expect_copy(h, true, 5); /* tag 1 only: 2 and 3 are young */
  h_expect_none(h, H_BROKER);
  h_ack(h, H_CLIENT, 1, 3, true);
  h_expect_none(h, H_BROKER);
  assert_int_equal(h->srv.stats.settles_split, 0);
  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  h_expect(h, H_BROKER, "ch1 basic.ack tag=3 multiple=1");
  h_expect_none(h, H_BROKER);
}

/* basic.deliver with redelivered set, as the broker sends a delivery a
 * lost consumer held. */
static void deliver_again(harness *h, uint64_t tag) {
  hbuf *b = h_buf(h);
  hb_deliver(b, 1, "c1", tag, true);
  hb_header(b, 1, 5, NULL);
  hb_body(b, 1, "hello", 5);
  h_sendb(h, H_BROKER, b);
  h_skip_until(h, H_CLIENT, "ch1 body len=5");
}

/* A client that hangs up holding a redelivered delivery as its oldest:
 * that one (only) becomes a counted attempt, copied and acked before the
 * broker's side is closed. */
static void test_consumer_lost_counts_the_redelivered_head(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 0);
  deliver_again(h, 1);
  deliver_again(h, 2);
  h_eof(h, H_CLIENT, UV_EOF);
  expect_copy(h, true, 5);
  h_expect(h, H_BROKER, "ch1 basic.cancel ctag=c1 no-wait=1");
  h_expect_none(h, H_BROKER);
  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  client_leaves_answered(h);
  assert_int_equal(h->srv.stats.consumer_lost, 1);
}

/* The same hang-up with a first delivery as the oldest: nothing counts
 * (a restart), and a client's connection.close never counts. */
static void test_consumer_lost_spares_first_deliveries(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 1);
  deliver_again(h, 2);
  h_eof(h, H_CLIENT, UV_EOF);
  client_leaves_answered(h);
  assert_int_equal(h->srv.stats.consumer_lost, 0);
}

/* The client acked its oldest delivery, but the ack waits behind a held
 * frame when it hangs up: nothing is counted (the ack may say it was
 * done), and the held frames go on once the copy in flight is acked. */
static void test_consumer_lost_not_with_held_frames(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 0);
  deliver_again(h, 1);
  deliver_again(h, 2);
  h_nack(h, H_CLIENT, 1, 2, false, true);
  expect_copy(h, true, 5);
  h_simple(h, H_CLIENT, 1, AMQP_BASIC_QOS); /* held behind the copy */
  h_ack(h, H_CLIENT, 1, 1, false);          /* held behind that */
  h_expect_none(h, H_BROKER);
  h_eof(h, H_CLIENT, UV_EOF);
  h_expect(h, H_BROKER, "ch1 basic.cancel ctag=c1 no-wait=1");
  h_expect_none(h, H_BROKER); /* no copy of delivery 1 */
  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=2 multiple=0");
  h_skip_until(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  client_leaves_answered(h);
  assert_int_equal(h->srv.stats.consumer_lost, 0);
}

/* A client that sent connection.close (held behind a copy in flight) and
 * then hangs up restarted, it did not crash: its redelivered oldest
 * delivery is not counted; the copy in flight is finished and the close
 * goes on. */
static void test_consumer_lost_not_after_connection_close(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  hbuf *close = h_buf(h);
  consuming(h, 0);
  deliver_again(h, 1);
  deliver_again(h, 2);
  h_nack(h, H_CLIENT, 1, 2, false, true);
  expect_copy(h, true, 5);
  connection_close(close);
  h_send(h, H_CLIENT, close->p, close->len);
  h_eof(h, H_CLIENT, UV_EOF);
  h_expect(h, H_BROKER, "ch1 basic.cancel ctag=c1 no-wait=1");
  h_expect_none(h, H_BROKER); /* no copy of delivery 1 */
  confirm(h, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=2 multiple=0");
  h_expect_bytes(h, H_BROKER, close->p, close->len);
  h_expect_none(h, H_BROKER);
  assert_int_equal(h->srv.stats.consumer_lost, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_remap, teardown),
      cmocka_unit_test_teardown(test_yield, teardown),
      cmocka_unit_test_teardown(test_own_channel_reopen, teardown),
      cmocka_unit_test_teardown(test_own_channel_not_back, teardown),
      cmocka_unit_test_teardown(test_confirm_order, teardown),
      cmocka_unit_test_teardown(test_nack_multiple_mixed, teardown),
      cmocka_unit_test_teardown(test_nack_uncached_alone, teardown),
      cmocka_unit_test_teardown(test_held_frames_in_order, teardown),
      cmocka_unit_test_teardown(test_ack_multiple_split_around_a_retry,
                                teardown),
      cmocka_unit_test_teardown(test_consume_of_the_last_declared_queue,
                                teardown),
      cmocka_unit_test_teardown(test_timeout_copy_not_split_around, teardown),
      cmocka_unit_test_teardown(test_close_waits_for_confirm, teardown),
      cmocka_unit_test_teardown(test_close_waits_confirm_timeout, teardown),
      cmocka_unit_test_teardown(test_close_after_fallback_requeue, teardown),
      cmocka_unit_test_teardown(test_dial_connect_hangs, teardown),
      cmocka_unit_test_teardown(test_dial_no_start, teardown),
      cmocka_unit_test_teardown(test_dial_all_time_out, teardown),
      cmocka_unit_test_teardown(test_separate_copy_then_ack, teardown),
      cmocka_unit_test_teardown(test_separate_write_fails, teardown),
      cmocka_unit_test_teardown(test_separate_write_out_of_memory, teardown),
      cmocka_unit_test_teardown(test_separate_lost_twice_backs_off, teardown),
      cmocka_unit_test_teardown(test_close_client_eof, teardown),
      cmocka_unit_test_teardown(test_close_client_reset, teardown),
      cmocka_unit_test_teardown(test_close_client_eof_after_ack, teardown),
      cmocka_unit_test_teardown(test_close_client_eof_copy_in_flight, teardown),
      cmocka_unit_test_teardown(test_timeout_copy_then_late_ack, teardown),
      cmocka_unit_test_teardown(test_timeout_copy_fails_client_keeps_it,
                                teardown),
      cmocka_unit_test_teardown(test_timeout_ack_multiple_rewritten, teardown),
      cmocka_unit_test_teardown(test_consumer_lost_counts_the_redelivered_head,
                                teardown),
      cmocka_unit_test_teardown(test_consumer_lost_spares_first_deliveries,
                                teardown),
      cmocka_unit_test_teardown(test_consumer_lost_not_with_held_frames,
                                teardown),
      cmocka_unit_test_teardown(test_consumer_lost_not_after_connection_close,
                                teardown),
      cmocka_unit_test_teardown(test_close_client_hangs_up_after_close,
                                teardown),
      cmocka_unit_test_teardown(test_close_by_client, teardown),
      cmocka_unit_test_teardown(test_close_by_broker, teardown),
      cmocka_unit_test_teardown(test_close_broker_hangs_up_on_close, teardown),
      cmocka_unit_test_teardown(test_close_client_gone_copy_never_confirmed,
                                teardown),
      cmocka_unit_test_teardown(
          test_close_client_write_failed_copy_never_confirmed, teardown),
      cmocka_unit_test_teardown(test_close_broker_lost, teardown),
      cmocka_unit_test_teardown(test_close_broker_gone_in_handshake, teardown),
      cmocka_unit_test_teardown(test_close_client_write_failed, teardown),
      cmocka_unit_test_teardown(test_close_client_dead_timeout_ends_upstream,
                                teardown),
      cmocka_unit_test_teardown(test_close_client_write_completes_failed,
                                teardown),
      cmocka_unit_test_teardown(test_close_upstream_write_failed, teardown),
      cmocka_unit_test_teardown(test_close_out_of_memory, teardown),
      cmocka_unit_test_teardown(test_close_bad_protocol_header, teardown),
      cmocka_unit_test_teardown(test_close_handshake_timeout, teardown),
      cmocka_unit_test_teardown(test_close_in_handshake_keeps_its_limit,
                                teardown),
      cmocka_unit_test_teardown(test_close_no_upstream, teardown),
      cmocka_unit_test_teardown(test_close_no_upstream_header_later, teardown),
      cmocka_unit_test_teardown(test_close_no_upstream_client_silent, teardown),
      cmocka_unit_test_teardown(test_close_bad_frame_end, teardown),
      cmocka_unit_test_teardown(test_close_class_on_channel0, teardown),
      cmocka_unit_test_teardown(test_close_content_on_channel0, teardown),
      cmocka_unit_test_teardown(test_close_heartbeat_on_channel, teardown),
      cmocka_unit_test_teardown(test_close_body_unexpected, teardown),
      cmocka_unit_test_teardown(test_close_frame_on_own_channel, teardown),
      cmocka_unit_test_teardown(test_close_second_tune_ok, teardown),
      cmocka_unit_test_teardown(test_close_broker_protocol_error, teardown),
      cmocka_unit_test_teardown(test_close_finishing_write_fails, teardown),
      cmocka_unit_test_teardown(test_close_client_silent_after_error, teardown),
      cmocka_unit_test_teardown(test_close_drain, teardown),
      cmocka_unit_test_teardown(test_close_drain_waits_for_parked, teardown),
      cmocka_unit_test_teardown(test_close_drain_while_broker_answers,
                                teardown),
      cmocka_unit_test_teardown(test_close_drain_client_gone_finishes_copy,
                                teardown),
      cmocka_unit_test_teardown(test_close_drain_in_handshake, teardown),
  };
  h_on_fail(cmocka_fail);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
