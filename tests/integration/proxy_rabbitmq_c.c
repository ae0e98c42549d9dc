/* Integration: rabbitmq-c (librabbitmq, Debian's) through rebound.
 *
 * Run by with_rebound.sh, which starts rebound and sets
 * REBOUND_PROXY_HOST / REBOUND_PROXY_PORT. Publish with confirms and every
 * property, basic.get, consume with ack and nack(requeue), tx, qos, the
 * channel number rebound holds, and a client that opens every channel of
 * channel-max 16.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>

static const char *host;
static int port;

static void check_rpc(amqp_rpc_reply_t r, const char *what) {
  if (r.reply_type != AMQP_RESPONSE_NORMAL)
    fail_msg("%s: reply type %d, library error %d, method %08x", what,
             (int)r.reply_type, r.library_error,
             r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION ? r.reply.id : 0);
}

static amqp_connection_state_t open_conn(int channel_max) {
  amqp_connection_state_t c = amqp_new_connection();
  amqp_socket_t *sock = amqp_tcp_socket_new(c);
  assert_non_null(sock);
  assert_int_equal(amqp_socket_open(sock, host, port), AMQP_STATUS_OK);
  check_rpc(amqp_login(c, "/", channel_max, 131072, 0, AMQP_SASL_METHOD_PLAIN,
                       "guest", "guest"),
            "login");
  return c;
}

static void close_conn(amqp_connection_state_t c) {
  check_rpc(amqp_connection_close(c, AMQP_REPLY_SUCCESS), "connection.close");
  assert_int_equal(amqp_destroy_connection(c), AMQP_STATUS_OK);
}

static void open_channel(amqp_connection_state_t c, amqp_channel_t ch) {
  assert_non_null(amqp_channel_open(c, ch));
  check_rpc(amqp_get_rpc_reply(c), "channel.open");
}

static amqp_bytes_t declare_temp(amqp_connection_state_t c, amqp_channel_t ch) {
  amqp_queue_declare_ok_t *ok =
      amqp_queue_declare(c, ch, amqp_empty_bytes, 0, 0, 1, 1, amqp_empty_table);
  check_rpc(amqp_get_rpc_reply(c), "queue.declare");
  return amqp_bytes_malloc_dup(ok->queue);
}

static void publish(amqp_connection_state_t c, amqp_channel_t ch,
                    amqp_bytes_t q, const char *body,
                    amqp_basic_properties_t *props) {
  assert_int_equal(amqp_basic_publish(c, ch, amqp_empty_bytes, q, 1, 0, props,
                                      amqp_cstring_bytes(body)),
                   AMQP_STATUS_OK);
}

/* basic.get one message and return its body (malloc'd, NUL-terminated). */
static char *get_one(amqp_connection_state_t c, amqp_channel_t ch,
                     amqp_bytes_t q, amqp_basic_properties_t *props_out) {
  amqp_rpc_reply_t r = amqp_basic_get(c, ch, q, 1);
  check_rpc(r, "basic.get");
  if (r.reply.id != AMQP_BASIC_GET_OK_METHOD)
    fail_msg("basic.get on channel %u: queue empty", ch);
  amqp_message_t msg;
  check_rpc(amqp_read_message(c, ch, &msg, 0), "read_message");
  char *body = calloc(1, msg.body.len + 1);
  memcpy(body, msg.body.bytes, msg.body.len);
  if (props_out)
    *props_out = msg.properties; /* shallow: only flags/ints are read */
  amqp_destroy_message(&msg);
  return body;
}

static void test_confirms_properties_get(void **state) {
  (void)state;
  amqp_connection_state_t c = open_conn(0);
  open_channel(c, 1);
  amqp_bytes_t q = declare_temp(c, 1);
  amqp_confirm_select(c, 1);
  check_rpc(amqp_get_rpc_reply(c), "confirm.select");

  amqp_table_entry_t entries[2];
  entries[0].key = amqp_cstring_bytes("x-int");
  entries[0].value.kind = AMQP_FIELD_KIND_I64;
  entries[0].value.value.i64 = -42;
  entries[1].key = amqp_cstring_bytes("x-str");
  entries[1].value.kind = AMQP_FIELD_KIND_UTF8;
  entries[1].value.value.bytes = amqp_cstring_bytes("kept");
  amqp_basic_properties_t p;
  memset(&p, 0, sizeof p);
  p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
             AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_PRIORITY_FLAG |
             AMQP_BASIC_MESSAGE_ID_FLAG;
  p.content_type = amqp_cstring_bytes("text/plain");
  p.delivery_mode = 2;
  p.priority = 3;
  p.message_id = amqp_cstring_bytes("m-1");
  p.headers.num_entries = 2;
  p.headers.entries = entries;

  const int n = 50;
  char body[32];
  for (int i = 0; i < n; i++) {
    snprintf(body, sizeof body, "msg %d", i);
    publish(c, 1, q, body, &p);
  }
  /* wait for confirms covering all n */
  uint64_t confirmed = 0;
  while (confirmed < (uint64_t)n) {
    amqp_frame_t f;
    assert_int_equal(amqp_simple_wait_frame(c, &f), AMQP_STATUS_OK);
    assert_int_equal(f.frame_type, AMQP_FRAME_METHOD);
    assert_int_equal(f.payload.method.id, AMQP_BASIC_ACK_METHOD);
    amqp_basic_ack_t *ack = f.payload.method.decoded;
    assert_true(ack->delivery_tag > confirmed || ack->multiple);
    confirmed = ack->delivery_tag;
  }
  for (int i = 0; i < n; i++) {
    amqp_basic_properties_t got;
    char *b = get_one(c, 1, q, &got);
    snprintf(body, sizeof body, "msg %d", i);
    assert_string_equal(b, body);
    assert_int_equal(got.delivery_mode, 2);
    assert_int_equal(got.priority, 3);
    free(b);
  }
  amqp_bytes_free(q);
  close_conn(c);
}

static void test_consume_ack_nack_qos_tx(void **state) {
  (void)state;
  amqp_connection_state_t c = open_conn(0);
  open_channel(c, 1);
  amqp_bytes_t q = declare_temp(c, 1);
  for (int i = 0; i < 3; i++)
    publish(c, 1, q, "work", NULL);
  amqp_basic_qos(c, 1, 0, 2, 0);
  check_rpc(amqp_get_rpc_reply(c), "basic.qos");
  amqp_basic_consume(c, 1, q, amqp_cstring_bytes("rc-tag"), 0, 0, 0,
                     amqp_empty_table);
  check_rpc(amqp_get_rpc_reply(c), "basic.consume");

  /* nack(requeue) the first delivery: it comes back redelivered */
  amqp_envelope_t env;
  struct timeval tv = {5, 0};
  check_rpc(amqp_consume_message(c, &env, &tv, 0), "consume 1");
  assert_int_equal(env.redelivered, 0);
  assert_int_equal(env.consumer_tag.len, 6);
  uint64_t first = env.delivery_tag;
  amqp_destroy_envelope(&env);
  assert_int_equal(amqp_basic_nack(c, 1, first, 0, 1), 0);
  int acked = 0, redelivered = 0;
  while (acked < 3) {
    check_rpc(amqp_consume_message(c, &env, &tv, 0), "consume");
    redelivered += env.redelivered;
    assert_int_equal(amqp_basic_ack(c, 1, env.delivery_tag, 0), 0);
    amqp_destroy_envelope(&env);
    acked++;
  }
  assert_int_equal(redelivered, 1);

  /* tx on another channel: a rolled-back publish never arrives */
  open_channel(c, 2);
  amqp_tx_select(c, 2);
  check_rpc(amqp_get_rpc_reply(c), "tx.select");
  amqp_bytes_t q2 = declare_temp(c, 2);
  publish(c, 2, q2, "rolled back", NULL);
  amqp_tx_rollback(c, 2);
  check_rpc(amqp_get_rpc_reply(c), "tx.rollback");
  publish(c, 2, q2, "committed", NULL);
  amqp_tx_commit(c, 2);
  check_rpc(amqp_get_rpc_reply(c), "tx.commit");
  char *b = get_one(c, 2, q2, NULL);
  assert_string_equal(b, "committed");
  free(b);
  amqp_rpc_reply_t r = amqp_basic_get(c, 2, q2, 1);
  check_rpc(r, "basic.get");
  assert_int_equal(r.reply.id, AMQP_BASIC_GET_EMPTY_METHOD);
  amqp_bytes_free(q);
  amqp_bytes_free(q2);
  close_conn(c);
}

/* The client takes the channel number rebound holds (channel-max, 2047
 * here); rebound moves its traffic, the client notices nothing. */
static void test_channel_rebound_holds(void **state) {
  (void)state;
  amqp_connection_state_t c = open_conn(0);
  int max = amqp_get_channel_max(c);
  assert_int_equal(max, 2047);
  open_channel(c, (amqp_channel_t)max);
  amqp_bytes_t q = declare_temp(c, (amqp_channel_t)max);
  publish(c, (amqp_channel_t)max, q, "on the top channel", NULL);
  char *b = get_one(c, (amqp_channel_t)max, q, NULL);
  assert_string_equal(b, "on the top channel");
  free(b);
  check_rpc(amqp_channel_close(c, (amqp_channel_t)max, AMQP_REPLY_SUCCESS),
            "channel.close");
  amqp_bytes_free(q);
  close_conn(c);
}

/* channel-max 16 and all 16 channels opened and used: rebound gives up
 * its own channel, every client channel works. */
static void test_every_channel_of_16(void **state) {
  (void)state;
  amqp_connection_state_t c = open_conn(16);
  assert_int_equal(amqp_get_channel_max(c), 16);
  amqp_bytes_t q[17];
  for (int ch = 1; ch <= 16; ch++) {
    open_channel(c, (amqp_channel_t)ch);
    q[ch] = declare_temp(c, (amqp_channel_t)ch);
  }
  for (int ch = 1; ch <= 16; ch++) {
    char body[32];
    snprintf(body, sizeof body, "channel %d", ch);
    publish(c, (amqp_channel_t)ch, q[ch], body, NULL);
  }
  for (int ch = 16; ch >= 1; ch--) {
    char body[32];
    snprintf(body, sizeof body, "channel %d", ch);
    char *b = get_one(c, (amqp_channel_t)ch, q[ch], NULL);
    assert_string_equal(b, body);
    free(b);
    amqp_bytes_free(q[ch]);
  }
  close_conn(c);
}

int main(void) {
  host = getenv("REBOUND_PROXY_HOST");
  const char *p = getenv("REBOUND_PROXY_PORT");
  if (!host || !p) {
    fprintf(stderr, "run through with_rebound.sh\n");
    return 77;
  }
  port = atoi(p);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_confirms_properties_get),
      cmocka_unit_test(test_consume_ack_nack_qos_tx),
      cmocka_unit_test(test_channel_rebound_holds),
      cmocka_unit_test(test_every_channel_of_16),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
