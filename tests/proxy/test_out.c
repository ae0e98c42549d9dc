/* px_out: forwarded runs and generated frames in order, over a connection
 * whose transport records what is written; every failure is returned and
 * kept (px_out_failed()), a write error is left to the transport's path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "px_out.h"

static uint8_t wire[8192];
static size_t nwire;
static int write_rc; /* what the recording transport's writes return */
static unsigned writes;

static int rec_try_write(px_conn *c, const uv_buf_t *bufs, unsigned n) {
  (void)c;
  writes++;
  if (write_rc < 0)
    return write_rc;
  int total = 0;
  for (unsigned i = 0; i < n; i++) {
    memcpy(wire + nwire, bufs[i].base, bufs[i].len);
    nwire += bufs[i].len;
    total += (int)bufs[i].len;
  }
  return total;
}

static int no_write(px_conn *c, px_conn_write *w) {
  (void)c;
  (void)w;
  return UV_EIO; /* try_write takes everything */
}

static const px_conn_io rec_io = {.try_write = rec_try_write,
                                  .write = no_write};

static px_conn conn;
static px_out out;

static int setup(void **state) {
  (void)state;
  px_conn_init(&conn, "test", NULL, NULL);
  px_conn_adopt(&conn, &rec_io);
  memset(&out, 0, sizeof out);
  nwire = 0;
  write_rc = 0;
  writes = 0;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  px_conn_free(&conn);
  px_chunk_pool_drain();
  px_conn_out_pool_drain();
  return 0;
}

/* A chunk holding `n` heartbeat frames (8 bytes each). */
static px_chunk *heartbeats(unsigned n) {
  px_chunk *c = px_chunk_new(8 * n);
  for (unsigned i = 0; i < n; i++)
    c->len += (uint32_t)amqp_frame_write(
        c->data + c->len, 8, AMQP_FRAME_HEARTBEAT, 0, (amqp_bytes){NULL, 0});
  return c;
}

static void test_run_then_generated_frame(void **state) {
  (void)state;
  px_chunk *c = heartbeats(3);
  px_out_run_begin(&out, &conn, c, 0);
  px_out_run_extend(&out, 8);
  px_out_run_extend(&out, 16); /* two forwarded frames: one slice */
  assert_int_equal(px_out_frame(&out, &conn, AMQP_FRAME_HEARTBEAT, 0, NULL, 0),
                   PX_OUT_OK);
  px_out_run_extend(&out, 24);
  assert_int_equal(px_out_run_end(&out), PX_OUT_OK);
  assert_int_equal(conn.nout, 3); /* run, generated frame, run */
  assert_int_equal(conn.out[0].len, 16);
  assert_ptr_equal(conn.out[0].chunk, c);
  assert_int_equal(conn.out[1].len, 8);
  assert_ptr_equal(conn.out[2].ptr, c->data + 16);
  assert_int_equal(px_conn_flush(&conn), 0);
  assert_int_equal(nwire, 32);
  assert_int_equal(px_out_failed(&out), PX_OUT_OK);
  px_chunk_unref(c);
}

static void test_encode_failure_is_returned_and_kept(void **state) {
  (void)state;
  char text[300];
  memset(text, 'x', sizeof text - 1);
  text[sizeof text - 1] = '\0'; /* over a shortstr's 255 bytes */
  assert_int_equal(px_out_connection_close(&out, &conn, 200, text, 0, 0),
                   PX_OUT_ENCODE);
  assert_int_equal(conn.nout, 0);
  assert_int_equal(px_out_failed(&out), PX_OUT_ENCODE);
  /* the first failure stays the one reported */
  assert_int_equal(px_out_bytes(&out, NULL, (const uint8_t *)"x", 1),
                   PX_OUT_RETRY);
  assert_int_equal(px_out_failed(&out), PX_OUT_ENCODE);
}

static void test_no_retry_connection(void **state) {
  (void)state;
  amqp_method m;
  amqp_method_init(&m, AMQP_CHANNEL_OPEN);
  assert_int_equal(px_out_method(&out, NULL, 1, &m), PX_OUT_RETRY);
  assert_int_equal(px_out_failed(&out), PX_OUT_RETRY);
}

/* A write error met while a full slice table is flushed is the
 * connection's failure, not an output failure of the session. */
static void test_write_error_left_to_the_transport(void **state) {
  (void)state;
  px_chunk *c = heartbeats(PX_CONN_OUT_MAX + 1);
  for (unsigned i = 0; i < PX_CONN_OUT_MAX; i++) /* slices that do not join */
    assert_int_equal(
        px_out_slice(&out, &conn, c, c->data + 8 * (2 * i % 64), 4), PX_OUT_OK);
  write_rc = UV_EPIPE;
  assert_int_equal(px_out_slice(&out, &conn, c, c->data + 8, 8), PX_OUT_OK);
  assert_int_equal(writes, 1);
  assert_int_equal(out.write_error, UV_EPIPE);
  assert_ptr_equal(out.write_failed_on, &conn);
  assert_int_equal(px_out_failed(&out), PX_OUT_OK);
  px_chunk_unref(c);
}

static void test_settle_encodes_each_method(void **state) {
  (void)state;
  assert_int_equal(px_out_settle(&out, &conn, 7, AMQP_BASIC_NACK, 42, true),
                   PX_OUT_OK);
  assert_int_equal(px_conn_flush(&conn), 0);
  amqp_frame f;
  amqp_method m;
  assert_int_equal(amqp_frame_parse(wire, nwire, 0, &f), (long)nwire);
  assert_int_equal(f.channel, 7);
  assert_int_equal(amqp_method_decode(f.payload, &m), AMQP_OK);
  assert_int_equal(m.id, AMQP_BASIC_NACK);
  assert_int_equal(m.args[AMQP_F_BASIC_NACK_DELIVERY_TAG].u, 42);
  assert_int_equal(m.args[AMQP_F_BASIC_NACK_REQUEUE].u, 1);
}

/* Frames rebound generates one after another share a chunk (the spare
 * room of the last slice's, when nothing else holds it); a forwarded run
 * whose chunk is still the reader's is never written into. */
static void test_generated_frames_share_a_chunk(void **state) {
  (void)state;
  for (uint64_t tag = 1; tag <= 3; tag++)
    assert_int_equal(px_out_settle(&out, &conn, 1, AMQP_BASIC_ACK, tag, false),
                     PX_OUT_OK);
  assert_int_equal(conn.nout, 1); /* three acks, one slice of one chunk */
  assert_int_equal(conn.out[0].len, 3 * 21);
  assert_int_equal(conn.out[0].chunk->len, 3 * 21);

  px_chunk *c = heartbeats(1); /* still held here, as a read chunk is */
  px_out_run_begin(&out, &conn, c, 0);
  px_out_run_extend(&out, 8);
  assert_int_equal(px_out_settle(&out, &conn, 1, AMQP_BASIC_ACK, 4, false),
                   PX_OUT_OK);
  assert_int_equal(conn.nout, 3); /* acks, the run, a new chunk's ack */
  assert_int_equal(c->len, 8);
  assert_ptr_equal(conn.out[1].chunk, c);
  assert_true(conn.out[2].chunk != c && conn.out[2].chunk != conn.out[0].chunk);
  assert_int_equal(px_out_run_end(&out), PX_OUT_OK);
  assert_int_equal(px_conn_flush(&conn), 0);
  assert_int_equal(nwire, 4 * 21 + 8);
  for (unsigned i = 0; i < 4; i++) { /* in order: tags 1, 2, 3, then 4 */
    size_t at = i < 3 ? i * 21 : 3 * 21 + 8;
    amqp_frame f;
    amqp_method m;
    assert_int_equal(amqp_frame_parse(wire + at, nwire - at, 0, &f), 21);
    assert_int_equal(amqp_method_decode(f.payload, &m), AMQP_OK);
    assert_int_equal(m.args[AMQP_F_BASIC_ACK_DELIVERY_TAG].u, i + 1);
  }
  px_chunk_unref(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_run_then_generated_frame, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_encode_failure_is_returned_and_kept,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_no_retry_connection, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_write_error_left_to_the_transport,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_settle_encodes_each_method, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_generated_frames_share_a_chunk,
                                      setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
