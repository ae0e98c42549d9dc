/* The unsettled deliveries of a channel (px_track.h): a ring sorted by
 * delivery tag, settled at the head in O(1), in the middle by leaving a
 * hole, squeezed once holes are half of it. Driven through a session
 * (session_harness.h): the broker delivers, the client acks and nacks, and
 * after each step the test compares what rebound tracks with the set of
 * tags that should still be unsettled. A nack of a tracked delivery
 * produces rebound's copy, which shows its content was kept whole. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "px_chan.h"
#include "px_counters.h"
#include "px_queues.h"
#include "px_server.h"
#include "px_track.h"
#include "session_test.h"

#define MAXTAG 120

/* A session with channel 1 consuming q (acks), and tags 1..n delivered. */
static harness *consuming(void **state, uint64_t n) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  assert_int_equal(h_open(h, 10, 131072), 10);
  h_channel(h, 1, 1);
  h_consume(h, 1, 1, "q", "c1");
  for (uint64_t t = 1; t <= n; t++)
    h_deliver(h, 1, "c1", t, NULL, "hello", 5);
  h_settle(h);
  return h;
}

static void deliver(harness *h, uint64_t from, uint64_t to) {
  for (uint64_t t = from; t <= to; t++)
    h_deliver(h, 1, "c1", t, NULL, "hello", 5);
  h_settle(h);
}

static void ack(harness *h, uint64_t tag, bool multiple) {
  h_ack(h, H_CLIENT, 1, tag, multiple);
  h_settle(h);
}

/* What rebound tracks is exactly the tags with want[tag] set, in tag
 * order, and no settled entry is left at either end. */
static void check(harness *h, const bool *want) {
  px_chan *c = px_tab_get(&h->s->by_client, 1);
  assert_non_null(c);
  const px_track *t = &c->track;
  uint32_t live = 0;
  uint64_t last = 0;
  for (uint32_t i = 0; i < t->dl.r.n; i++) {
    const px_delivery *d = px_dl_at(t, i);
    assert_true(d->tag > last); /* sorted, each tag once */
    last = d->tag;
    if (d->state != PX_DL_GONE) {
      assert_true(d->tag <= MAXTAG && want[d->tag]);
      live++;
    }
  }
  uint32_t wanted = 0;
  for (uint64_t tag = 1; tag <= MAXTAG; tag++) {
    wanted += want[tag];
    assert_int_equal(px_track_find(c, tag) != NULL, want[tag]);
  }
  assert_int_equal(live, wanted);
  if (t->dl.r.n) {
    assert_int_not_equal(px_dl_at(t, 0)->state, PX_DL_GONE);
    assert_int_not_equal(px_dl_at(t, t->dl.r.n - 1)->state, PX_DL_GONE);
  }
}

/* The client nacks `tag` (requeue): rebound publishes the copy of its
 * kept content. */
static void nack_copies(harness *h, uint64_t tag) {
  char line[128];
  h_nack(h, H_CLIENT, 1, tag, false, true);
  snprintf(line, sizeof line, "ch%u body len=5", h->own_ch);
  h_skip_until(h, H_BROKER, line);
}

/* Single acks out of order leave holes; a multiple ack settles the rest
 * below its tag; the retry path still finds what is left. */
static void test_out_of_order_and_multiple(void **state) {
  harness *h = consuming(state, 40);
  bool want[MAXTAG + 1] = {false};
  for (uint64_t t = 1; t <= 40; t++)
    want[t] = true;
  check(h, want);

  static const uint64_t singles[] = {3, 7, 20, 1, 40};
  for (size_t i = 0; i < sizeof singles / sizeof *singles; i++) {
    ack(h, singles[i], false);
    want[singles[i]] = false;
    check(h, want);
  }
  ack(h, 10, true);
  for (uint64_t t = 1; t <= 10; t++)
    want[t] = false;
  check(h, want);

  nack_copies(h, 15); /* a hole and a settled head before it */
  want[15] = false;   /* rebound acks the original once the copy is in */
  h_ack(h, H_BROKER, h->own_ch, 1, false);
  h_settle(h);
  check(h, want);

  ack(h, 40, true); /* past the last: everything */
  for (uint64_t t = 1; t <= 40; t++)
    want[t] = false;
  check(h, want);
}

/* Settles at the head while deliveries keep coming: the ring wraps, then
 * grows while wrapped; tags stay in order and findable. */
static void test_wrap_then_grow(void **state) {
  harness *h = consuming(state, 6);
  bool want[MAXTAG + 1] = {false};
  ack(h, 4, true);
  for (uint64_t t = 5; t <= 6; t++)
    want[t] = true;
  check(h, want);
  for (uint64_t t = 7; t <= 60; t += 3) { /* wraps, then doubles */
    deliver(h, t, t + 2);
    for (uint64_t k = t; k <= t + 2; k++)
      want[k] = true;
    ack(h, t - 2, false); /* the oldest but one: a hole near the head */
    want[t - 2] = false;
    check(h, want);
  }
  nack_copies(h, 60);
  h_ack(h, H_BROKER, h->own_ch, 1, false);
  h_settle(h);
  want[60] = false;
  check(h, want);
}

/* Holes in the middle, more than half of the ring: squeezed out, the
 * tags that remain intact and in order. */
static void test_holes_squeezed(void **state) {
  harness *h = consuming(state, 100);
  bool want[MAXTAG + 1] = {false};
  for (uint64_t t = 1; t <= 100; t++)
    want[t] = true;
  for (uint64_t t = 2; t < 100; t++) { /* four in five; the ends stay */
    if (t % 5 == 0)
      continue;
    ack(h, t, false);
    want[t] = false;
    check(h, want);
  }
  px_chan *c = px_tab_get(&h->s->by_client, 1);
  assert_true(c->track.dl.ngone <= 16 ||
              c->track.dl.ngone <= c->track.dl.r.n / 2);
  assert_true(c->track.dl.r.n < 100); /* squeezed at least once */
  nack_copies(h, 50);
  h_ack(h, H_BROKER, h->own_ch, 1, false);
  h_settle(h);
  want[50] = false;
  check(h, want);
}

/* A nack while the next delivery's content is still arriving: that
 * delivery is still kept whole, and its own nack becomes a copy too (it
 * used to pass through as a plain requeue). */
static void test_nack_while_next_arrives(void **state) {
  harness *h = consuming(state, 1);
  hbuf *head = h_buf(h), *body = h_buf(h);
  hb_deliver(head, 1, "c1", 2, false);
  hb_header(head, 1, 5, NULL);
  hb_body(body, 1, "world", 5);
  h_sendb(h, H_BROKER, head); /* tag 2: its body is still to come */
  h_settle(h);

  nack_copies(h, 1);
  h_sendb(h, H_BROKER, body);
  h_settle(h);
  h_ack(h, H_BROKER, h->own_ch, 1, false); /* the first copy confirmed */
  h_settle(h);
  h_skip(h, H_BROKER);

  nack_copies(h, 2); /* a copy, not the client's nack passed on */
  bool want[MAXTAG + 1] = {false};
  want[2] = true; /* until its copy is confirmed */
  check(h, want);
  h_ack(h, H_BROKER, h->own_ch, 2, false);
  h_settle(h);
  want[2] = false;
  check(h, want);
}

/* ---- the short path of no-ack deliveries (px_frames_upstream_short) ------ */

/* The client consumes q on channel 1 with no-ack, tag `ctag`. */
static void consume_noack(harness *h, const char *ctag) {
  char line[256];
  amqp_method m;
  assert_int_equal(amqp_method_init(&m, AMQP_BASIC_CONSUME), AMQP_OK);
  m.args[AMQP_F_BASIC_CONSUME_QUEUE].b = amqp_cstr("q");
  m.args[AMQP_F_BASIC_CONSUME_CONSUMER_TAG].b = amqp_cstr(ctag);
  m.args[AMQP_F_BASIC_CONSUME_NO_ACK].u = 1;
  h_method(h, H_CLIENT, 1, &m);
  snprintf(line, sizeof line, "ch1 basic.consume queue=q ctag=%s no-ack=1",
           ctag);
  h_expect(h, H_BROKER, line);
  assert_int_equal(amqp_method_init(&m, AMQP_BASIC_CONSUME_OK), AMQP_OK);
  m.args[AMQP_F_BASIC_CONSUME_OK_CONSUMER_TAG].b = amqp_cstr(ctag);
  h_method(h, H_BROKER, 1, &m);
  snprintf(line, sizeof line, "ch1 basic.consume-ok ctag=%s", ctag);
  h_expect(h, H_CLIENT, line);
}

static uint64_t delivered_no_ack(harness *h) {
  px_queue_stat *st =
      px_queues_at(&h->srv.metrics.queues, px_metrics_queue(&h->srv, "q"));
  return st ? st->n[PX_QC_DELIVERED_NO_ACK] : 0;
}

/* A no-ack consumer's deliveries are counted, not tracked; once an acking
 * consumer shares the channel, its deliveries are tracked and kept (a nack
 * is a retry), and the no-ack one's still are not. */
static void test_noack_then_acking_consumer(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  assert_int_equal(h_open(h, 10, 131072), 10);
  h_channel(h, 1, 1);
  consume_noack(h, "n1");
  for (uint64_t t = 1; t <= 3; t++)
    h_deliver(h, 1, "n1", t, NULL, "hello", 5);
  h_settle(h);
  px_chan *c = px_tab_get(&h->s->by_client, 1);
  assert_non_null(c);
  assert_int_equal(delivered_no_ack(h), 3);
  assert_int_equal(c->track.dl.r.n, 0);
  h_skip(h, H_CLIENT);

  h_consume(h, 1, 1, "q", "c1");
  h_deliver(h, 1, "c1", 4, NULL, "hello", 5);
  h_deliver(h, 1, "n1", 5, NULL, "hello", 5);
  h_settle(h);
  assert_int_equal(delivered_no_ack(h), 4);
  assert_non_null(px_track_find(c, 4));
  assert_null(px_track_find(c, 5));
  h_skip(h, H_CLIENT);
  nack_copies(h, 4);
}

/* The channel number of a closed channel comes back as a new channel with
 * an acking consumer: nothing remembered of the old one (the table's hint)
 * lets its deliveries pass untracked. */
static void test_reopened_channel_is_looked_up_afresh(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  assert_int_equal(h_open(h, 10, 131072), 10);
  h_channel(h, 1, 1);
  consume_noack(h, "n1");
  h_deliver(h, 1, "n1", 1, NULL, "hello", 5);
  h_settle(h);
  h_skip(h, H_CLIENT);
  h_close(h, H_CLIENT, 1, 200, "bye");
  h_expect(h, H_BROKER, "ch1 channel.close code=200 text=bye");
  h_close_ok(h, H_BROKER, 1);
  h_expect(h, H_CLIENT, "ch1 channel.close-ok");
  h_channel(h, 1, 1);
  h_consume(h, 1, 1, "q", "c1");
  h_deliver(h, 1, "c1", 1, NULL, "hello", 5);
  h_settle(h);
  px_chan *c = px_tab_get(&h->s->by_client, 1);
  assert_non_null(c);
  assert_non_null(px_track_find(c, 1));
  assert_int_equal(delivered_no_ack(h), 1);
}

/* The client goes while a copy is unconfirmed: rebound finishes the copy
 * on the upstream connection, and first cancels the client's consumer
 * there (no-wait), so the broker delivers nothing more to a connection
 * that would only drop it. */
static void test_gone_client_consumers_cancelled(void **state) {
  harness *h = consuming(state, 2);
  h_skip(h, H_CLIENT);
  nack_copies(h, 1);
  h_skip(h, H_BROKER);
  h_eof(h, H_CLIENT, UV_EOF);
  h_settle(h);
  h_expect(h, H_BROKER, "ch1 basic.cancel ctag=c1 no-wait=1");
  /* the copy still gets its confirm and the original its ack */
  h_ack(h, H_BROKER, h->own_ch, 1, false);
  h_settle(h);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
}

int main(void) {
  h_on_fail(cmocka_fail);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_out_of_order_and_multiple, teardown),
      cmocka_unit_test_teardown(test_noack_then_acking_consumer, teardown),
      cmocka_unit_test_teardown(test_gone_client_consumers_cancelled, teardown),
      cmocka_unit_test_teardown(test_reopened_channel_is_looked_up_afresh,
                                teardown),
      cmocka_unit_test_teardown(test_wrap_then_grow, teardown),
      cmocka_unit_test_teardown(test_holes_squeezed, teardown),
      cmocka_unit_test_teardown(test_nack_while_next_arrives, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
