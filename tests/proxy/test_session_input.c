/* The session's input path: frames that span two read chunks. A read
 * fills a chunk of PX_CHUNK_SIZE bytes; a body frame cut by its end is
 * taken in two pieces (px_conn_keep_split()) instead of being moved to
 * another chunk. Each test sends more than one chunk's worth at once, so
 * the fake transport's reads end inside frames, and checks that every
 * frame arrives byte for byte, that nothing was moved (px_conn.moved), and
 * what the retry path and the held frames make of such frames. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "session_test.h"

#define BODY (16 * 1024)
#define MESSAGES 9 /* about 2.3 chunks of deliveries */

/* A body of `len` bytes that differs from message to message and from
 * byte to byte. */
static uint8_t *pattern(uint64_t tag, size_t len) {
  uint8_t *p = malloc(len);
  assert_non_null(p);
  for (size_t i = 0; i < len; i++)
    p[i] = (uint8_t)(tag * 31 + i * 7 + (i >> 8));
  return p;
}

/* basic.deliver of `tag` to c1 on channel 1, its header and its body
 * frame (kept in `body` for the byte check), appended to `all`. */
static void add_delivery(hbuf *all, hbuf *body, uint64_t tag, size_t len) {
  uint8_t *p = pattern(tag, len);
  hb_deliver(all, 1, "c1", tag, false);
  hb_header(all, 1, len, NULL);
  hb_body(body, 1, p, len);
  hb_raw(all, body->p, body->len);
  free(p);
}

/* The client receives delivery `tag` whose body frame is `body`. */
static void expect_delivery(harness *h, uint64_t tag, const hbuf *body,
                            size_t len) {
  expect_line(h, H_CLIENT, "ch1 basic.deliver tag=%llu",
              (unsigned long long)tag);
  expect_line(h, H_CLIENT, "ch1 header size=%zu", len);
  h_expect_bytes(h, H_CLIENT, body->p, body->len);
}

static void consuming(harness *h, const char *queue) {
  assert_int_equal(h_open(h, 10, 131072), 10);
  h_channel(h, 1, 1);
  h_consume(h, 1, 1, queue, "c1");
}

/* Deliveries of a queue without a policy, and one body frame larger than
 * a chunk: each arrives whole and unchanged; no input byte is moved. */
static void test_split_deliveries_forwarded(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  hbuf *all = h_buf(h), *body[MESSAGES + 1];
  size_t len[MESSAGES + 1];
  consuming(h, "other");
  uint64_t before = h->srv.stats.frames_u2c;

  for (uint64_t t = 1; t <= MESSAGES + 1; t++) {
    body[t - 1] = h_buf(h);
    len[t - 1] = t == MESSAGES + 1 ? 100000 : BODY; /* > PX_CHUNK_SIZE */
    add_delivery(all, body[t - 1], t, len[t - 1]);
  }
  h_sendb(h, H_BROKER, all);
  for (uint64_t t = 1; t <= MESSAGES + 1; t++)
    expect_delivery(h, t, body[t - 1], len[t - 1]);
  h_expect_none(h, H_CLIENT);
  assert_int_equal(h->s->upstream.moved, 0);
  assert_int_equal(h->srv.stats.frames_u2c - before, 3 * (MESSAGES + 1));
}

/* Deliveries kept for retry: a body read in two pieces is kept whole, so
 * the copy of every nacked delivery carries the body the client got. */
static void test_split_deliveries_kept(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  hbuf *all = h_buf(h), *body[MESSAGES];
  consuming(h, "q");

  for (uint64_t t = 1; t <= MESSAGES; t++) {
    body[t - 1] = h_buf(h);
    add_delivery(all, body[t - 1], t, BODY);
  }
  h_sendb(h, H_BROKER, all);
  for (uint64_t t = 1; t <= MESSAGES; t++)
    expect_delivery(h, t, body[t - 1], BODY);
  assert_int_equal(h->s->upstream.moved, 0);

  h_nack(h, H_CLIENT, 1, MESSAGES, true, true);
  expect_line(h, H_BROKER, "ch%u queue.declare queue=q.retry.1s", h->own_ch);
  for (uint64_t t = 1; t <= MESSAGES; t++) {
    hbuf *copy = h_buf(h);
    uint8_t *p = pattern(t, BODY);
    hb_body(copy, h->own_ch, p, BODY);
    free(p);
    expect_line(h, H_BROKER,
                "ch%u basic.publish exchange= rk=q.retry.1s mandatory=1",
                h->own_ch);
    expect_line(h, H_BROKER, "ch%u header size=%d", h->own_ch, BODY);
    h_expect_bytes(h, H_BROKER, copy->p, copy->len);
  }
  h_expect_none(h, H_BROKER);
}

/* The client's publishes on a channel held behind a copy in flight: a
 * body frame read in two pieces is held whole and released in order. */
static void test_split_publishes_held(void **state) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  hbuf *all = h_buf(h), *frames[3 * MESSAGES];
  consuming(h, "q");
  h_deliver(h, 1, "c1", 1, NULL, "hello", 5);
  h_expect(h, H_CLIENT, "ch1 basic.deliver tag=1");
  h_expect(h, H_CLIENT, "ch1 header size=5");
  h_expect(h, H_CLIENT, "ch1 body len=5");
  h_nack(h, H_CLIENT, 1, 1, false, true);
  h_skip_until(h, H_BROKER, "ch10 body len=5"); /* the copy */

  for (unsigned i = 0; i < MESSAGES; i++) {
    amqp_method m;
    uint8_t *p = pattern(i, BODY);
    amqp_method_init(&m, AMQP_BASIC_PUBLISH);
    m.args[AMQP_F_BASIC_PUBLISH_ROUTING_KEY].b = amqp_cstr("elsewhere");
    for (unsigned k = 0; k < 3; k++)
      frames[3 * i + k] = h_buf(h);
    hb_method(frames[3 * i], 1, &m);
    hb_header(frames[3 * i + 1], 1, BODY, NULL);
    hb_body(frames[3 * i + 2], 1, p, BODY);
    free(p);
    for (unsigned k = 0; k < 3; k++)
      hb_raw(all, frames[3 * i + k]->p, frames[3 * i + k]->len);
  }
  h_sendb(h, H_CLIENT, all);
  h_expect_none(h, H_BROKER); /* held until the copy is confirmed */
  h_ack(h, H_BROKER, h->own_ch, 1, false);
  h_expect(h, H_BROKER, "ch1 basic.ack tag=1 multiple=0");
  for (unsigned i = 0; i < 3 * MESSAGES; i++)
    h_expect_bytes(h, H_BROKER, frames[i]->p, frames[i]->len);
  h_expect_none(h, H_BROKER);
  assert_int_equal(h->s->client.moved, 0);
}

/* A frame-end byte that is wrong in the second piece is a frame error,
 * as in a frame read whole: 501 to a client, 541 for the broker's. */
static void bad_split_frame_end(void **state, h_side from, const char *close) {
  static const char *const args[] = {POLICY, NULL};
  harness *h = start(state, args);
  hbuf *all = h_buf(h), *body = h_buf(h);
  consuming(h, "other");
  if (from == H_BROKER) {
    add_delivery(all, body, 1, 100000);
  } else {
    amqp_method m;
    uint8_t *p = pattern(1, 100000);
    amqp_method_init(&m, AMQP_BASIC_PUBLISH);
    hb_method(all, 1, &m);
    hb_header(all, 1, 100000, NULL);
    hb_body(all, 1, p, 100000);
    free(p);
  }
  all->p[all->len - 1] = 0xAB;
  h_sendb(h, from, all);
  h_skip_until(h, H_CLIENT, close);
  assert_int_equal(h->srv.stats.protocol_errors, 1);
}

static void test_split_bad_frame_end_client(void **state) {
  bad_split_frame_end(state, H_CLIENT, "ch0 connection.close code=501 *");
}

static void test_split_bad_frame_end_broker(void **state) {
  bad_split_frame_end(state, H_BROKER, "ch0 connection.close code=541 *");
}

int main(void) {
  h_on_fail(cmocka_fail);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_split_deliveries_forwarded, teardown),
      cmocka_unit_test_teardown(test_split_deliveries_kept, teardown),
      cmocka_unit_test_teardown(test_split_publishes_held, teardown),
      cmocka_unit_test_teardown(test_split_bad_frame_end_client, teardown),
      cmocka_unit_test_teardown(test_split_bad_frame_end_broker, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
