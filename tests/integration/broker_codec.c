/* Integration: rebound's codec speaks to a real RabbitMQ.
 *
 * Over a plain socket to $REBOUND_TEST_BROKER, with frames encoded and
 * decoded only by amqp_codec: the handshake (PLAIN), channel open,
 * queue.declare with arguments, a publish carrying all 14 properties and a
 * headers table built with amqp_table_set(), a body larger than frame-max
 * split across body frames, basic.get of it back, a 404 channel error, and
 * connection.close. Every field the broker returns is checked.
 * Exit 77 (skipped) when REBOUND_TEST_BROKER is not set.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "amqp.h"

#define BYTES(lit) ((amqp_bytes){(const uint8_t *)(lit), sizeof(lit) - 1})
#define BIG_BODY (300 * 1024 + 17)

typedef struct conn {
  int fd;
  uint8_t in[1 << 18];
  size_t have, consumed; /* bytes in `in`; bytes of the last frame */
  uint32_t frame_max;
  uint16_t channel_max, heartbeat;
} conn;

static char user[64] = "guest", pass[64] = "guest", host[256] = "127.0.0.1",
            port[16] = "5672";

/* amqp://user:pass@host:port/ (vhost "/" only) */
static int parse_url(const char *url) {
  return sscanf(url, "amqp://%63[^:]:%63[^@]@%255[^:]:%15[0-9]", user, pass,
                host, port) == 4
             ? 0
             : -1;
}

static void send_all(conn *c, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t k = send(c->fd, p, n, MSG_NOSIGNAL);
    assert_true(k > 0);
    p += k;
    n -= (size_t)k;
  }
}

static void send_method(conn *c, uint16_t ch, const amqp_method *m) {
  uint8_t buf[4096];
  long n = amqp_method_frame_write(buf, sizeof buf, ch, m);
  assert_true(n > 0);
  send_all(c, buf, (size_t)n);
}

/* Next frame from the broker, skipping heartbeats. Its payload is a view
 * into c->in, valid until the next call. */
static amqp_frame next_frame(conn *c) {
  for (;;) {
    amqp_frame f;
    memmove(c->in, c->in + c->consumed, c->have - c->consumed);
    c->have -= c->consumed;
    c->consumed = 0;
    long n = amqp_frame_parse(c->in, c->have, c->frame_max, &f);
    if (n > 0) {
      c->consumed = (size_t)n;
      if (f.type != AMQP_FRAME_HEARTBEAT)
        return f;
      continue;
    }
    assert_int_equal(n, AMQP_PARTIAL);
    assert_true(c->have < sizeof c->in);
    ssize_t k = recv(c->fd, c->in + c->have, sizeof c->in - c->have, 0);
    assert_true(k > 0);
    c->have += (size_t)k;
  }
}

static amqp_method expect_method(conn *c, uint16_t ch, uint32_t id) {
  amqp_frame f = next_frame(c);
  amqp_method m;
  assert_int_equal(f.type, AMQP_FRAME_METHOD);
  assert_int_equal(f.channel, ch);
  assert_int_equal(amqp_method_decode(f.payload, &m), AMQP_OK);
  if (m.id != id)
    fail_msg("expected %s, got %s", amqp_method_lookup(id)->name, m.desc->name);
  return m;
}

static void handshake(conn *c) {
  send_all(c, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE);
  amqp_method m = expect_method(c, 0, AMQP_CONNECTION_START);
  assert_int_equal(m.args[AMQP_F_CONNECTION_START_VERSION_MAJOR].u, 0);
  assert_int_equal(m.args[AMQP_F_CONNECTION_START_VERSION_MINOR].u, 9);
  amqp_field v;
  assert_int_equal(
      amqp_table_get(m.args[AMQP_F_CONNECTION_START_SERVER_PROPERTIES].b,
                     BYTES("product"), &v),
      AMQP_OK);
  assert_true(amqp_bytes_eq(v.v.bytes, BYTES("RabbitMQ")));
  amqp_bytes mechs = m.args[AMQP_F_CONNECTION_START_MECHANISMS].b;
  assert_non_null(memmem(mechs.ptr, mechs.len, "PLAIN", 5));

  uint8_t props[128], resp[160];
  amqp_writer pw = amqp_writer_make(props, sizeof props);
  amqp_field prod = amqp_field_string(BYTES("rebound-codec-test"));
  amqp_table_write_entry(&pw, BYTES("product"), &prod);
  int rn = snprintf((char *)resp, sizeof resp, "%c%s%c%s", 0, user, 0, pass);
  amqp_method_init(&m, AMQP_CONNECTION_START_OK);
  m.args[AMQP_F_CONNECTION_START_OK_CLIENT_PROPERTIES].b =
      (amqp_bytes){props, pw.len};
  m.args[AMQP_F_CONNECTION_START_OK_MECHANISM].b = BYTES("PLAIN");
  m.args[AMQP_F_CONNECTION_START_OK_RESPONSE].b =
      (amqp_bytes){resp, (size_t)rn};
  m.args[AMQP_F_CONNECTION_START_OK_LOCALE].b = BYTES("en_US");
  send_method(c, 0, &m);

  m = expect_method(c, 0, AMQP_CONNECTION_TUNE);
  c->channel_max = (uint16_t)m.args[AMQP_F_CONNECTION_TUNE_CHANNEL_MAX].u;
  c->frame_max = (uint32_t)m.args[AMQP_F_CONNECTION_TUNE_FRAME_MAX].u;
  c->heartbeat = (uint16_t)m.args[AMQP_F_CONNECTION_TUNE_HEARTBEAT].u;
  /* RabbitMQ 3.10's defaults (channel-max 2047, frame-max 128 KiB) */
  assert_int_equal(c->channel_max, 2047);
  assert_int_equal(c->frame_max, 131072);
  assert_int_equal(c->heartbeat, 60);
  amqp_method_init(&m, AMQP_CONNECTION_TUNE_OK);
  m.args[AMQP_F_CONNECTION_TUNE_OK_CHANNEL_MAX].u = c->channel_max;
  m.args[AMQP_F_CONNECTION_TUNE_OK_FRAME_MAX].u = c->frame_max;
  m.args[AMQP_F_CONNECTION_TUNE_OK_HEARTBEAT].u = 0;
  send_method(c, 0, &m);
  amqp_method_init(&m, AMQP_CONNECTION_OPEN);
  m.args[AMQP_F_CONNECTION_OPEN_VIRTUAL_HOST].b = BYTES("/");
  send_method(c, 0, &m);
  expect_method(c, 0, AMQP_CONNECTION_OPEN_OK);
}

static conn *connect_broker(void) {
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
  conn *c = calloc(1, sizeof *c);
  assert_non_null(c);
  assert_int_equal(getaddrinfo(host, port, &hints, &ai), 0);
  c->fd = socket(ai->ai_family, SOCK_STREAM, 0);
  assert_int_equal(connect(c->fd, ai->ai_addr, ai->ai_addrlen), 0);
  freeaddrinfo(ai);
  c->frame_max = AMQP_FRAME_MIN_SIZE;
  handshake(c);
  return c;
}

static void close_conn(conn *c) {
  amqp_method m;
  amqp_method_init(&m, AMQP_CONNECTION_CLOSE);
  m.args[AMQP_F_CONNECTION_CLOSE_REPLY_CODE].u = 200;
  m.args[AMQP_F_CONNECTION_CLOSE_REPLY_TEXT].b = BYTES("bye");
  send_method(c, 0, &m);
  expect_method(c, 0, AMQP_CONNECTION_CLOSE_OK);
  close(c->fd);
  free(c);
}

static void open_channel(conn *c, uint16_t ch) {
  amqp_method m;
  amqp_method_init(&m, AMQP_CHANNEL_OPEN);
  send_method(c, ch, &m);
  expect_method(c, ch, AMQP_CHANNEL_OPEN_OK);
}

static void test_handshake_and_close(void **state) {
  (void)state;
  close_conn(connect_broker());
}

static amqp_content_header full_props(const uint8_t *headers, size_t hlen) {
  amqp_content_header h;
  memset(&h, 0, sizeof h);
  h.class_id = 60;
  h.body_size = BIG_BODY;
  h.props.flags = 0xfffc;
  h.props.content_type = BYTES("application/octet-stream");
  h.props.content_encoding = BYTES("identity");
  h.props.headers = (amqp_bytes){headers, hlen};
  h.props.delivery_mode = 2;
  h.props.priority = 5;
  h.props.correlation_id = BYTES("corr-42");
  h.props.reply_to = BYTES("replies");
  h.props.expiration = BYTES("600000");
  h.props.message_id = BYTES("msg-42");
  h.props.timestamp = 1764460800;
  h.props.type = BYTES("test.big");
  h.props.user_id = amqp_cstr(user); /* the broker checks it is ours */
  h.props.app_id = BYTES("rebound");
  h.props.cluster_id = BYTES("c-1");
  return h;
}

/* Publish a big message with every property, get it back unchanged. */
static void test_publish_get_round_trip(void **state) {
  (void)state;
  conn *c = connect_broker();
  open_channel(c, 1);

  /* queue.declare with an arguments table */
  char qname[64];
  snprintf(qname, sizeof qname, "rebound.codec-test.%d", (int)getpid());
  uint8_t args[64];
  amqp_writer aw = amqp_writer_make(args, sizeof args);
  amqp_field ttl = {.type = 'I'};
  ttl.v.i = 600000;
  amqp_table_write_entry(&aw, BYTES("x-message-ttl"), &ttl);
  amqp_method m;
  amqp_method_init(&m, AMQP_QUEUE_DECLARE);
  m.args[AMQP_F_QUEUE_DECLARE_QUEUE].b = amqp_cstr(qname);
  m.args[AMQP_F_QUEUE_DECLARE_AUTO_DELETE].u = 0;
  m.args[AMQP_F_QUEUE_DECLARE_EXCLUSIVE].u = 1;
  m.args[AMQP_F_QUEUE_DECLARE_ARGUMENTS].b = (amqp_bytes){args, aw.len};
  send_method(c, 1, &m);
  m = expect_method(c, 1, AMQP_QUEUE_DECLARE_OK);
  assert_true(
      amqp_bytes_eq(m.args[AMQP_F_QUEUE_DECLARE_OK_QUEUE].b, amqp_cstr(qname)));
  assert_int_equal(m.args[AMQP_F_QUEUE_DECLARE_OK_MESSAGE_COUNT].u, 0);

  /* headers: an app header, then the retry counter set with table_set */
  uint8_t h0[64], headers[128];
  amqp_writer w0 = amqp_writer_make(h0, sizeof h0);
  amqp_field app = amqp_field_string(BYTES("keep-me"));
  amqp_table_write_entry(&w0, BYTES("x-app"), &app);
  amqp_writer hw = amqp_writer_make(headers, sizeof headers);
  amqp_field count = amqp_field_long(3);
  assert_int_equal(amqp_table_set(&hw, (amqp_bytes){h0, w0.len},
                                  BYTES("rebound-retry-count"), &count),
                   AMQP_OK);

  amqp_method_init(&m, AMQP_BASIC_PUBLISH);
  m.args[AMQP_F_BASIC_PUBLISH_ROUTING_KEY].b = amqp_cstr(qname);
  m.args[AMQP_F_BASIC_PUBLISH_MANDATORY].u = 1;
  send_method(c, 1, &m);
  amqp_content_header h = full_props(headers, hw.len);
  uint8_t frame[1024];
  amqp_writer fw = amqp_writer_make(frame, sizeof frame);
  size_t at = amqp_frame_begin(&fw, AMQP_FRAME_HEADER, 1);
  assert_int_equal(amqp_content_header_encode(&h, &fw), AMQP_OK);
  amqp_frame_finish(&fw, at);
  send_all(c, frame, fw.len);

  /* body split to fit frame-max */
  uint8_t *body = malloc(BIG_BODY), *out = malloc(c->frame_max);
  for (size_t i = 0; i < BIG_BODY; i++)
    body[i] = (uint8_t)(i * 31 + 7);
  size_t chunk = c->frame_max - AMQP_FRAME_OVERHEAD, sent_frames = 0;
  for (size_t off = 0; off < BIG_BODY; off += chunk, sent_frames++) {
    size_t n = BIG_BODY - off < chunk ? BIG_BODY - off : chunk;
    long k = amqp_frame_write(out, c->frame_max, AMQP_FRAME_BODY, 1,
                              (amqp_bytes){body + off, n});
    assert_true(k > 0);
    send_all(c, out, (size_t)k);
  }
  assert_int_equal(sent_frames, 3);

  amqp_method_init(&m, AMQP_BASIC_GET);
  m.args[AMQP_F_BASIC_GET_QUEUE].b = amqp_cstr(qname);
  m.args[AMQP_F_BASIC_GET_NO_ACK].u = 1;
  send_method(c, 1, &m);
  m = expect_method(c, 1, AMQP_BASIC_GET_OK);
  assert_true(amqp_bytes_eq(m.args[AMQP_F_BASIC_GET_OK_ROUTING_KEY].b,
                            amqp_cstr(qname)));
  assert_int_equal(m.args[AMQP_F_BASIC_GET_OK_REDELIVERED].u, 0);
  assert_int_equal(m.args[AMQP_F_BASIC_GET_OK_MESSAGE_COUNT].u, 0);

  amqp_frame f = next_frame(c);
  assert_int_equal(f.type, AMQP_FRAME_HEADER);
  amqp_content_header got;
  assert_int_equal(amqp_content_header_decode(f.payload, &got), AMQP_OK);
  assert_int_equal(got.body_size, BIG_BODY);
  assert_int_equal(got.props.flags, 0xfffc);
  assert_true(amqp_bytes_eq(got.props.content_type, h.props.content_type));
  assert_true(amqp_bytes_eq(got.props.correlation_id, h.props.correlation_id));
  assert_true(amqp_bytes_eq(got.props.expiration, h.props.expiration));
  assert_true(amqp_bytes_eq(got.props.user_id, h.props.user_id));
  assert_true(amqp_bytes_eq(got.props.cluster_id, h.props.cluster_id));
  assert_int_equal(got.props.delivery_mode, 2);
  assert_int_equal(got.props.priority, 5);
  assert_int_equal(got.props.timestamp, 1764460800);
  amqp_field v;
  assert_int_equal(
      amqp_table_get(got.props.headers, BYTES("rebound-retry-count"), &v),
      AMQP_OK);
  int64_t n = 0;
  assert_true(amqp_field_as_int(&v, &n));
  assert_int_equal(n, 3);
  assert_int_equal(amqp_table_get(got.props.headers, BYTES("x-app"), &v),
                   AMQP_OK);
  assert_true(amqp_bytes_eq(v.v.bytes, BYTES("keep-me")));

  size_t received = 0;
  while (received < BIG_BODY) {
    f = next_frame(c);
    assert_int_equal(f.type, AMQP_FRAME_BODY);
    assert_true(f.payload.len <= BIG_BODY - received);
    assert_memory_equal(f.payload.ptr, body + received, f.payload.len);
    received += f.payload.len;
  }
  free(body);
  free(out);
  close_conn(c);
}

/* A channel error from the broker decodes: 404 with its text, the
 * connection lives on. */
static void test_channel_error(void **state) {
  (void)state;
  conn *c = connect_broker();
  open_channel(c, 7);
  amqp_method m;
  amqp_method_init(&m, AMQP_QUEUE_DECLARE);
  m.args[AMQP_F_QUEUE_DECLARE_QUEUE].b = BYTES("rebound.no-such-queue");
  m.args[AMQP_F_QUEUE_DECLARE_PASSIVE].u = 1;
  send_method(c, 7, &m);
  m = expect_method(c, 7, AMQP_CHANNEL_CLOSE);
  assert_int_equal(m.args[AMQP_F_CHANNEL_CLOSE_REPLY_CODE].u, 404);
  assert_int_equal(m.args[AMQP_F_CHANNEL_CLOSE_CLASS_ID].u, 50);
  assert_int_equal(m.args[AMQP_F_CHANNEL_CLOSE_METHOD_ID].u, 10);
  amqp_bytes text = m.args[AMQP_F_CHANNEL_CLOSE_REPLY_TEXT].b;
  assert_non_null(memmem(text.ptr, text.len, "NOT_FOUND", 9));
  amqp_method_init(&m, AMQP_CHANNEL_CLOSE_OK);
  send_method(c, 7, &m);
  open_channel(c, 7); /* the same number works again */
  close_conn(c);
}

int main(void) {
  const char *url = getenv("REBOUND_TEST_BROKER");
  if (!url || !*url) {
    fprintf(stderr, "REBOUND_TEST_BROKER not set: skipped\n");
    return 77;
  }
  if (parse_url(url) != 0) {
    fprintf(stderr, "cannot parse REBOUND_TEST_BROKER=%s\n", url);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_handshake_and_close),
      cmocka_unit_test(test_publish_get_round_trip),
      cmocka_unit_test(test_channel_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
