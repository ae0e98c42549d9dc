/* Integration: retries as a rabbitmq-c (librabbitmq) consumer sees them.
 *
 * Run by with_rebound.sh with REBOUND_ARGS="--retry-tiers 200ms,400ms
 * --max-attempts 3 --retry-queues rc-retry.*". A consumer that nacks (and
 * one that rejects) every delivery gets each message exactly 3 times, the
 * copies carry rebound's count header, and the message ends in the DLQ
 * with its body and properties.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
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
    fail_msg("%s: reply type %d, library error %d", what, (int)r.reply_type,
             r.library_error);
}

static amqp_connection_state_t open_conn(void) {
  amqp_connection_state_t c = amqp_new_connection();
  amqp_socket_t *sock = amqp_tcp_socket_new(c);
  assert_int_equal(amqp_socket_open(sock, host, port), AMQP_STATUS_OK);
  check_rpc(amqp_login(c, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest",
                       "guest"),
            "login");
  assert_non_null(amqp_channel_open(c, 1));
  check_rpc(amqp_get_rpc_reply(c), "channel.open");
  return c;
}

static void fresh_queue(amqp_connection_state_t c, const char *name) {
  const char *suffix[] = {"", ".dlq", ".retry.200ms", ".retry.400ms"};
  char q[128];
  for (int i = 0; i < 4; i++) {
    snprintf(q, sizeof q, "%s%s", name, suffix[i]);
    amqp_queue_delete(c, 1, amqp_cstring_bytes(q), 0, 0);
    check_rpc(amqp_get_rpc_reply(c), "queue.delete");
  }
  amqp_queue_declare(c, 1, amqp_cstring_bytes(name), 0, 1, 0, 0,
                     amqp_empty_table);
  check_rpc(amqp_get_rpc_reply(c), "queue.declare");
}

static int64_t header_int(amqp_table_t *t, const char *key) {
  for (int i = 0; i < t->num_entries; i++) {
    amqp_table_entry_t *e = &t->entries[i];
    if (e->key.len == strlen(key) && memcmp(e->key.bytes, key, e->key.len) == 0)
      return e->value.kind == AMQP_FIELD_KIND_I64 ? e->value.value.i64 : -2;
  }
  return -1;
}

/* Fail every delivery of `name` until none comes for 2 s; returns how
 * many deliveries there were, checking the count header of each. */
static int fail_all(amqp_connection_state_t c, const char *name, bool reject) {
  amqp_basic_consume(c, 1, amqp_cstring_bytes(name), amqp_empty_bytes, 0, 0, 0,
                     amqp_empty_table);
  check_rpc(amqp_get_rpc_reply(c), "basic.consume");
  int n = 0;
  for (;;) {
    amqp_envelope_t env;
    struct timeval tv = {2, 0};
    amqp_rpc_reply_t r = amqp_consume_message(c, &env, &tv, 0);
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
        r.library_error == AMQP_STATUS_TIMEOUT)
      break;
    check_rpc(r, "consume");
    assert_int_equal(env.message.body.len, 9);
    assert_memory_equal(env.message.body.bytes, "rc poison", 9);
    int64_t count =
        header_int(&env.message.properties.headers, "rebound-retry-count");
    assert_int_equal(count, n == 0 ? -1 : n); /* absent on the first */
    n++;
    if (reject)
      assert_int_equal(amqp_basic_reject(c, 1, env.delivery_tag, 1), 0);
    else
      assert_int_equal(amqp_basic_nack(c, 1, env.delivery_tag, 0, 1), 0);
    amqp_destroy_envelope(&env);
  }
  return n;
}

static void run(bool reject) {
  char name[64], dlq[80];
  snprintf(name, sizeof name, "rc-retry.%s.%d", reject ? "reject" : "nack",
           (int)getpid());
  snprintf(dlq, sizeof dlq, "%s.dlq", name);
  amqp_connection_state_t c = open_conn();
  fresh_queue(c, name);
  amqp_basic_properties_t p;
  memset(&p, 0, sizeof p);
  p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
             AMQP_BASIC_CORRELATION_ID_FLAG;
  p.content_type = amqp_cstring_bytes("text/plain");
  p.delivery_mode = 2;
  p.correlation_id = amqp_cstring_bytes("corr-rc");
  assert_int_equal(amqp_basic_publish(c, 1, amqp_empty_bytes,
                                      amqp_cstring_bytes(name), 0, 0, &p,
                                      amqp_cstring_bytes("rc poison")),
                   AMQP_STATUS_OK);
  assert_int_equal(fail_all(c, name, reject), 3);

  amqp_rpc_reply_t r = amqp_basic_get(c, 1, amqp_cstring_bytes(dlq), 1);
  check_rpc(r, "basic.get dlq");
  assert_int_equal(r.reply.id, AMQP_BASIC_GET_OK_METHOD);
  amqp_message_t msg;
  check_rpc(amqp_read_message(c, 1, &msg, 0), "read dlq");
  assert_int_equal(msg.body.len, 9);
  assert_int_equal(msg.properties.delivery_mode, 2);
  assert_int_equal(msg.properties.correlation_id.len, 7);
  assert_memory_equal(msg.properties.correlation_id.bytes, "corr-rc", 7);
  assert_int_equal(header_int(&msg.properties.headers, "rebound-retry-count"),
                   3);
  amqp_destroy_message(&msg);
  check_rpc(amqp_connection_close(c, AMQP_REPLY_SUCCESS), "close");
  amqp_destroy_connection(c);
}

static void test_nack_retries_then_dlq(void **state) {
  (void)state;
  run(false);
}

static void test_reject_retries_then_dlq(void **state) {
  (void)state;
  run(true);
}

int main(void) {
  host = getenv("REBOUND_PROXY_HOST");
  const char *p = getenv("REBOUND_PROXY_PORT");
  if (!host || !p)
    return 77;
  port = atoi(p);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nack_retries_then_dlq),
      cmocka_unit_test(test_reject_retries_then_dlq),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
