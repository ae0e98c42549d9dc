/* Features of the proxy core that only the real-broker suite used to
 * guard, each checked here frame by frame over fake transports on the
 * session's hand-set clock (session_harness.h): backpressure between the
 * two sides, the frame-max each side is held to, a copy the broker
 * returns unroutable, the broker's x-death history left out of a copy it
 * would push past frame-max, a tier that exists with the other queue
 * type, and a requeue inside a transaction. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "session_test.h"

/* An open connection (frame-max `frame_max`; rebound's channel is 10),
 * channel 1 consuming from q, and `n` deliveries of "hello" with `props`
 * (may be NULL), which the client has received. */
static void consuming(harness *h, uint32_t frame_max, const amqp_props *props,
                      unsigned n) {
  h_open(h, 10, frame_max);
  h_channel(h, 1, 1);
  h_consume(h, 1, 1, "q", "c1");
  for (unsigned t = 1; t <= n; t++)
    h_deliver(h, 1, "c1", t, props, "hello", 5);
  h_settle(h);
  h_skip(h, H_CLIENT);
}

/* Headers holding an x-death of `filler` bytes, then `extra` = "kept"
 * (when not NULL), written into `table`. */
static amqp_props xdeath_headers(uint8_t *table, size_t cap, size_t filler,
                                 const char *extra) {
  static uint8_t d[8192];
  memset(d, 'd', sizeof d);
  assert_true(filler <= sizeof d);
  amqp_writer w = amqp_writer_make(table, cap);
  amqp_field f = amqp_field_string((amqp_bytes){d, filler});
  amqp_table_write_entry(&w, amqp_cstr("x-death"), &f);
  if (extra) {
    f = amqp_field_string(amqp_cstr("kept"));
    amqp_table_write_entry(&w, amqp_cstr(extra), &f);
  }
  assert_false(w.failed);
  amqp_props props = {0};
  props.flags = AMQP_P_HEADERS;
  props.headers = (amqp_bytes){table, w.len};
  return props;
}

/* The next frame `side` received must read `line`: its bytes, and its
 * payload (the frame without its header and end octet). */
static amqp_bytes next_frame(harness *h, h_side side, const char *line,
                             size_t *frame_len) {
  const uint8_t *raw;
  size_t len;
  char got[512];
  h_settle(h);
  assert_true(h_next(h, side, got, sizeof got, &raw, &len));
  assert_string_equal(got, line);
  *frame_len = len;
  return (amqp_bytes){raw + 7, len - AMQP_FRAME_OVERHEAD};
}

/* The copy of "hello" again to q.retry.1s on rebound's channel, and its
 * confirm (publish sequence `seq`): only then the original is acked,
 * counted as one retry. */
static void expect_copy_confirmed(harness *h, uint64_t seq) {
  h_expect(h, H_BROKER,
           "ch10 basic.publish exchange= rk=q.retry.1s "
           "mandatory=1");
  h_expect(h, H_BROKER, "ch10 header size=5");
  h_expect(h, H_BROKER, "ch10 body len=5");
  h_expect_none(h, H_BROKER); /* the original is not acked yet */
  h_ack(h, H_BROKER, 10, seq, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  h_expect_none(h, H_BROKER);
  h_expect_none(h, H_CLIENT);
  assert_int_equal(h_metric(h, PX_M_RETRIES, "q", "1s"), 1);
}

/* ---- backpressure ------------------------------------------------------ */

/* A client that reads nothing: once more than the high-water mark waits
 * for it, rebound stops reading the broker (the broker's frames stay in
 * its socket, not in rebound's memory); once the client reads again,
 * everything arrives, in order. */
static void test_slow_client_pauses_the_broker(void **state) {
  static const char *const args[] = {NULL};
  harness *h = start(state, args);
  enum { BODY = 64 * 1024, N = 64 }; /* 4 MiB, far past the mark */
  static uint8_t body[BODY];
  h_open(h, 10, 131072);
  h_channel(h, 1, 1);
  h_consume(h, 1, 1, "q", "c1");
  h_peer(h, H_CLIENT)->stall = true;
  for (unsigned t = 1; t <= N; t++)
    h_deliver(h, 1, "c1", t, NULL, body, BODY);
  h_settle(h);
  fake_conn *broker = h_peer(h, H_BROKER);
  assert_false(h->s->upstream.reading);
  assert_true(broker->in_bytes > (N / 2) * (size_t)BODY); /* not read */
  assert_true(px_conn_pending(&h->s->client) < 2 * 1024 * 1024);

  h_peer(h, H_CLIENT)->stall = false;
  h_settle(h);
  assert_int_equal(broker->in_bytes, 0);
  for (unsigned t = 1; t <= N; t++) {
    expect_line(h, H_CLIENT, "ch1 basic.deliver tag=%u", t);
    expect_line(h, H_CLIENT, "ch1 header size=%d", BODY);
    expect_line(h, H_CLIENT, "ch1 body len=%d", BODY);
  }
}

/* ---- frame-max ---------------------------------------------------------- */

/* A client is held to the frame-max it negotiated: a larger frame is a
 * frame error (501) and does not reach the broker. */
static void test_client_held_to_its_frame_max(void **state) {
  static const char *const args[] = {NULL};
  harness *h = start(state, args);
  enum { FRAME_MAX = 4096 };
  uint8_t body[FRAME_MAX];
  memset(body, 'x', sizeof body);
  h_open(h, 10, FRAME_MAX);
  h_channel(h, 1, 1);
  hbuf *b = h_buf(h);
  amqp_method m;
  amqp_method_init(&m, AMQP_BASIC_PUBLISH);
  m.args[AMQP_F_BASIC_PUBLISH_ROUTING_KEY].b = amqp_cstr("q");
  hb_method(b, 1, &m);
  hb_header(b, 1, sizeof body, NULL);
  hb_body(b, 1, body, sizeof body); /* 4,104 bytes on the wire */
  h_sendb(h, H_CLIENT, b);
  h_expect(h, H_CLIENT, "ch0 connection.close code=501*");
  h_expect(h, H_BROKER, "ch1 basic.publish*");
  h_expect(h, H_BROKER, "ch1 header size=4096");
  h_expect_none(h, H_BROKER); /* not the body */
}

/* The broker is not held to it: RabbitMQ sends content headers larger
 * than frame-max once dead-lettering has added x-death, and clients take
 * them, so rebound passes them on as they are. */
static void test_broker_header_over_frame_max_passes(void **state) {
  static const char *const args[] = {NULL};
  harness *h = start(state, args);
  enum { FRAME_MAX = 4096 };
  uint8_t table[8192];
  amqp_props props = xdeath_headers(table, sizeof table, 6000, NULL);

  h_open(h, 10, FRAME_MAX);
  h_channel(h, 1, 1);
  h_consume(h, 1, 1, "q", "c1");
  h_deliver(h, 1, "c1", 1, &props, "hello", 5);
  h_expect(h, H_CLIENT, "ch1 basic.deliver tag=1");
  size_t len;
  next_frame(h, H_CLIENT, "ch1 header size=5", &len);
  assert_true(len > FRAME_MAX);
  h_expect(h, H_CLIENT, "ch1 body len=5");
  h_expect_none(h, H_CLIENT);
  assert_non_null(h->s);
}

/* ---- a copy returned unroutable ------------------------------------------ */

/* The broker returns the copy (its tier was deleted) and then confirms
 * it: a confirm of a returned copy is no retry. rebound declares the tier
 * again and publishes the copy once more; only that copy's confirm acks
 * the original. */
static void test_returned_copy_declared_again(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 131072, NULL, 1);
  assert_int_equal(h->own_ch, 10);
  h_nack(h, H_CLIENT, 1, 1, false, true);
  h_expect(h, H_BROKER, "ch10 queue.declare queue=q.retry.1s");
  h_expect(h, H_BROKER,
           "ch10 basic.publish exchange= rk=q.retry.1s "
           "mandatory=1");
  h_skip(h, H_BROKER);

  hbuf *b = h_buf(h);
  amqp_method m;
  amqp_method_init(&m, AMQP_BASIC_RETURN);
  m.args[AMQP_F_BASIC_RETURN_REPLY_CODE].u = 312;
  m.args[AMQP_F_BASIC_RETURN_REPLY_TEXT].b = amqp_cstr("NO_ROUTE");
  m.args[AMQP_F_BASIC_RETURN_ROUTING_KEY].b = amqp_cstr("q.retry.1s");
  hb_method(b, 10, &m);
  hb_header(b, 10, 5, NULL);
  hb_body(b, 10, "hello", 5);
  h_sendb(h, H_BROKER, b);
  h_ack(h, H_BROKER, 10, 1, false);

  h_expect(h, H_BROKER, "ch10 queue.declare queue=q.retry.1s");
  expect_copy_confirmed(h, 2);
}

/* ---- the broker's x-death history -----------------------------------------
 */

/* A copy cannot carry a delivery's x-death history into a frame the
 * client could not take: a delivery whose x-death alone is past the
 * client's frame-max is dead-lettered (a tier copy would grow on), with
 * that history left out and rebound's source and reason kept, in one
 * header frame within frame-max. */
static void test_oversize_history_left_out_of_the_dead_letter(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  enum { FRAME_MAX = 4096 };
  uint8_t table[8192];
  amqp_props props = xdeath_headers(table, sizeof table, 5000, "app");

  consuming(h, FRAME_MAX, &props, 1);
  h_nack(h, H_CLIENT, 1, 1, false, true);
  h_expect(h, H_BROKER, "ch10 queue.declare queue=q.dlq");
  h_expect(h, H_BROKER, "ch10 basic.publish exchange= rk=q.dlq mandatory=1");
  size_t len;
  amqp_bytes header = next_frame(h, H_BROKER, "ch10 header size=5", &len);
  assert_true(len <= FRAME_MAX);
  amqp_content_header ch;
  assert_int_equal(amqp_content_header_decode(header, &ch), AMQP_OK);
  amqp_field v;
  assert_int_not_equal(
      amqp_table_get(ch.props.headers, amqp_cstr("x-death"), &v), AMQP_OK);
  assert_int_equal(amqp_table_get(ch.props.headers, amqp_cstr("app"), &v),
                   AMQP_OK);
  assert_int_equal(
      amqp_table_get(ch.props.headers, amqp_cstr("rebound-source-queue"), &v),
      AMQP_OK);
  h_expect(h, H_BROKER, "ch10 body len=5");
  h_ack(h, H_BROKER, 10, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  h_expect_none(h, H_BROKER);
}

/* ---- a tier of the other queue type ----------------------------------------
 */

/* Whether the queue.declare `payload` asks for a quorum queue. */
static bool declares_quorum(amqp_bytes payload) {
  amqp_method m;
  amqp_field v;
  assert_int_equal(amqp_method_decode(payload, &m), AMQP_OK);
  assert_int_equal(m.id, AMQP_QUEUE_DECLARE);
  return amqp_table_get(m.args[AMQP_F_QUEUE_DECLARE_ARGUMENTS].b,
                        amqp_cstr("x-queue-type"), &v) == AMQP_OK;
}

/* The tier exists with the other queue type (an operator's, or an older
 * rebound's): the broker refuses the declare (406) and closes rebound's
 * channel, discarding the copy. rebound reopens it at once, declares the
 * tier with the other type's arguments and publishes the copy again; its
 * confirm acks the original. */
static void test_tier_of_the_other_type_is_adapted_to(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 131072, NULL, 1);
  h_nack(h, H_CLIENT, 1, 1, false, true);
  size_t len;
  bool quorum = declares_quorum(
      next_frame(h, H_BROKER, "ch10 queue.declare queue=q.retry.1s", &len));
  h_skip(h, H_BROKER); /* the copy */

  h_close(h, H_BROKER, 10, 406,
          "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue "
          "'q.retry.1s' in vhost '/'");
  h_expect(h, H_BROKER, "ch10 channel.close-ok");
  h_expect(h, H_BROKER, "ch10 channel.open");
  h_simple(h, H_BROKER, 10, AMQP_CHANNEL_OPEN_OK);
  h_expect(h, H_BROKER, "ch10 confirm.select");
  h_simple(h, H_BROKER, 10, AMQP_CONFIRM_SELECT_OK);
  assert_true(declares_quorum(next_frame(h, H_BROKER,
                                         "ch10 queue.declare queue=q.retry.1s",
                                         &len)) != quorum);
  expect_copy_confirmed(h, 1);
}

/* ---- a requeue inside a transaction -----------------------------------------
 */

/* A channel in tx.select mode nacks with requeue: its retry is counted as
 * anywhere else (a copy, confirmed, then rebound's ack of the original,
 * which joins the client's transaction). The client's tx.commit waits
 * behind that ack; a tx.rollback that takes back such acks is counted and
 * said (the copies are in their tiers, the originals the client's again). */
static void test_requeue_inside_a_transaction(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  consuming(h, 131072, NULL, 2);
  h_simple(h, H_CLIENT, 1, AMQP_TX_SELECT);
  h_expect(h, H_BROKER, "ch1 tx.select");
  h_simple(h, H_BROKER, 1, AMQP_TX_SELECT_OK);
  h_expect(h, H_CLIENT, "ch1 tx.select-ok");

  h_nack(h, H_CLIENT, 1, 1, false, true);
  h_simple(h, H_CLIENT, 1, AMQP_TX_COMMIT);
  h_expect(h, H_BROKER, "ch10 queue.declare queue=q.retry.1s");
  h_skip_until(h, H_BROKER, "ch10 body len=5");
  h_expect_none(h, H_BROKER); /* the commit waits for the copy */
  h_ack(h, H_BROKER, 10, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  h_expect(h, H_BROKER, "ch1 tx.commit");
  h_simple(h, H_BROKER, 1, AMQP_TX_COMMIT_OK);
  h_expect(h, H_CLIENT, "ch1 tx.commit-ok");
  assert_int_equal(h_metric(h, PX_M_RETRIES, "q", "1s"), 1);

  h_nack(h, H_CLIENT, 1, 2, false, true);
  h_skip_until(h, H_BROKER, "ch10 body len=5");
  h_ack(h, H_BROKER, 10, 2, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=2 multiple=0");
  h_simple(h, H_CLIENT, 1, AMQP_TX_ROLLBACK);
  h_expect(h, H_BROKER, "ch1 tx.rollback");
  assert_int_equal(h->srv.stats.tx_rolled_back, 1);
  h_expect_none(h, H_BROKER);
  h_expect_none(h, H_CLIENT);
}

int main(void) {
  h_on_fail(cmocka_fail);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_slow_client_pauses_the_broker, teardown),
      cmocka_unit_test_teardown(test_client_held_to_its_frame_max, teardown),
      cmocka_unit_test_teardown(test_broker_header_over_frame_max_passes,
                                teardown),
      cmocka_unit_test_teardown(test_returned_copy_declared_again, teardown),
      cmocka_unit_test_teardown(
          test_oversize_history_left_out_of_the_dead_letter, teardown),
      cmocka_unit_test_teardown(test_tier_of_the_other_type_is_adapted_to,
                                teardown),
      cmocka_unit_test_teardown(test_requeue_inside_a_transaction, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
