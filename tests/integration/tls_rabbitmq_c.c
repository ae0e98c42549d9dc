/* rabbitmq-c (librabbitmq, Debian's) as a client of rebound, over its TLS
 * socket (amqp_ssl_socket, the peer's certificate and host name verified)
 * or plain TCP. Driven by tests/integration/py/test_tls_clients.py, which
 * starts rebound and checks, while this client's connection is still
 * open, which sides really went over TLS.
 *
 *   tls_rabbitmq_c HOST PORT CAFILE|- COMMAND QUEUE [N]
 *
 *   pubsub Q N    confirm.select, N messages of binary bodies (0 bytes to
 *                 over two frames), every one confirmed by basic.ack, then
 *                 consumed with acks and compared byte for byte
 *   big Q N       the same with one message of N bytes
 *   channels Q N  channels 1..N on one connection, each in confirm mode
 *                 publishing one message and basic.getting one
 *   poison Q      one message nacked (and rejected, alternately) with
 *                 requeue=true at every delivery until it is in Q.dlq,
 *                 then a quiet second; the dead-lettered copy is fetched
 *                 and compared
 *
 * Results are printed as key=value lines; then "hold", and the connection
 * stays open until a line (or EOF) comes on stdin. Any failure: a message
 * on stderr and exit status 1.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

#define FRAME_MAX 131072

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "tls_rabbitmq_c: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

static void check_rpc(amqp_rpc_reply_t r, const char *what) {
  if (r.reply_type == AMQP_RESPONSE_NORMAL)
    return;
  if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
    die("%s: %s", what, amqp_error_string2(r.library_error));
  die("%s: server exception, method %08x", what, r.reply.id);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Body i of a test: deterministic bytes (every value, 0x00 and the frame
 * end 0xCE among them) of a length from the pattern below. */
static size_t body_len(int i) {
  static const size_t lens[] = {
      0, 1, 13, 255, 4096, FRAME_MAX - 8, FRAME_MAX + 1, 300000};
  return lens[i % 8];
}

static void fill_body(unsigned char *b, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t k = 0; k < n; k++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b[k] = (unsigned char)(x >> 11);
  }
}

static amqp_bytes_t make_body(size_t n, uint32_t seed) {
  amqp_bytes_t b = amqp_bytes_malloc(n ? n : 1);
  if (!b.bytes)
    die("out of memory for %zu bytes", n);
  b.len = n;
  fill_body(b.bytes, n, seed);
  return b;
}

static amqp_connection_state_t open_conn(const char *host, int port,
                                         const char *cafile) {
  amqp_connection_state_t c = amqp_new_connection();
  amqp_socket_t *sock;
  if (strcmp(cafile, "-") != 0) {
    sock = amqp_ssl_socket_new(c);
    if (!sock)
      die("amqp_ssl_socket_new failed");
    if (amqp_ssl_socket_set_cacert(sock, cafile) != AMQP_STATUS_OK)
      die("cannot load CA file %s", cafile);
    amqp_ssl_socket_set_verify_peer(sock, 1);
    amqp_ssl_socket_set_verify_hostname(sock, 1);
  } else {
    sock = amqp_tcp_socket_new(c);
  }
  struct timeval tv = {10, 0};
  int rc = amqp_socket_open_noblock(sock, host, port, &tv);
  if (rc != AMQP_STATUS_OK)
    die("connect %s:%d: %s", host, port, amqp_error_string2(rc));
  check_rpc(amqp_login(c, "/", 0, FRAME_MAX, 0, AMQP_SASL_METHOD_PLAIN, "guest",
                       "guest"),
            "login");
  printf("channel_max=%d\nframe_max=%d\n", amqp_get_channel_max(c),
         amqp_get_frame_max(c));
  return c;
}

static void open_channel(amqp_connection_state_t c, amqp_channel_t ch) {
  if (!amqp_channel_open(c, ch))
    die("channel.open %u not sent", ch);
  check_rpc(amqp_get_rpc_reply(c), "channel.open");
}

static void declare(amqp_connection_state_t c, amqp_channel_t ch,
                    amqp_bytes_t q) {
  amqp_queue_declare(c, ch, q, 0, 0, 0, 0, amqp_empty_table);
  check_rpc(amqp_get_rpc_reply(c), "queue.declare");
}

static void delete_queue(amqp_connection_state_t c, amqp_channel_t ch,
                         amqp_bytes_t q) {
  amqp_queue_delete(c, ch, q, 0, 0);
  check_rpc(amqp_get_rpc_reply(c), "queue.delete");
}

static void confirm_select(amqp_connection_state_t c, amqp_channel_t ch) {
  amqp_confirm_select(c, ch);
  check_rpc(amqp_get_rpc_reply(c), "confirm.select");
}

static void publish(amqp_connection_state_t c, amqp_channel_t ch,
                    amqp_bytes_t q, amqp_bytes_t body) {
  int rc = amqp_basic_publish(c, ch, amqp_empty_bytes, q, 1, 0, NULL, body);
  if (rc != AMQP_STATUS_OK)
    die("basic.publish on %u: %s", ch, amqp_error_string2(rc));
}

/* Wait until the broker's basic.acks cover delivery tags 1..want[ch] on
 * every channel 1..nch, each tag once (in any order, singly or as
 * multiple); a basic.nack, a basic.return or a tag never published fails. */
static void wait_confirms(amqp_connection_state_t c, int nch,
                          const uint64_t *want) {
  unsigned char **acked = calloc((size_t)nch + 1, sizeof *acked);
  uint64_t *left = calloc((size_t)nch + 1, sizeof *left);
  int done = 0;
  for (int ch = 1; ch <= nch; ch++) {
    acked[ch] = calloc(want[ch] + 1, 1);
    left[ch] = want[ch];
    done += want[ch] == 0;
  }
  while (done < nch) {
    amqp_frame_t f;
    struct timeval tv = {20, 0};
    int rc = amqp_simple_wait_frame_noblock(c, &f, &tv);
    if (rc != AMQP_STATUS_OK)
      die("waiting for confirms (%d channels left): %s", nch - done,
          amqp_error_string2(rc));
    if (f.frame_type != AMQP_FRAME_METHOD)
      die("frame type %d while waiting for confirms", f.frame_type);
    if (f.payload.method.id != AMQP_BASIC_ACK_METHOD)
      die("method %08x on channel %u instead of basic.ack", f.payload.method.id,
          f.channel);
    amqp_basic_ack_t *ack = f.payload.method.decoded;
    int ch = f.channel;
    uint64_t tag = ack->delivery_tag;
    if (ch < 1 || ch > nch || tag < 1 || tag > want[ch] ||
        (!ack->multiple && acked[ch][tag]))
      die("channel %d: basic.ack %llu (multiple %d), %llu published", ch,
          (unsigned long long)tag, ack->multiple,
          (unsigned long long)(ch >= 1 && ch <= nch ? want[ch] : 0));
    uint64_t before = left[ch];
    for (uint64_t t = ack->multiple ? 1 : tag; t <= tag; t++) {
      if (!acked[ch][t]) {
        acked[ch][t] = 1;
        left[ch]--;
      }
    }
    done += before && !left[ch];
  }
  for (int ch = 0; ch <= nch; ch++)
    free(acked[ch]);
  free(acked);
  free(left);
}

static void expect_body(amqp_bytes_t got, size_t n, uint32_t seed,
                        const char *what) {
  if (got.len != n)
    die("%s: %zu bytes, sent %zu", what, got.len, n);
  amqp_bytes_t want = make_body(n, seed);
  if (n && memcmp(got.bytes, want.bytes, n) != 0) {
    size_t k = 0;
    while (((unsigned char *)got.bytes)[k] == ((unsigned char *)want.bytes)[k])
      k++;
    die("%s: bytes differ from offset %zu of %zu", what, k, n);
  }
  amqp_bytes_free(want);
}

/* Publish n messages with confirms on channel 1, then consume them with
 * acks, in order, byte for byte. */
static void pub_confirm_consume(amqp_connection_state_t c, amqp_bytes_t q,
                                int n, size_t fixed_len) {
  open_channel(c, 1);
  declare(c, 1, q);
  confirm_select(c, 1);
  for (int i = 0; i < n; i++) {
    size_t len = fixed_len ? fixed_len : body_len(i);
    amqp_bytes_t b = make_body(len, (uint32_t)i);
    publish(c, 1, q, b);
    amqp_bytes_free(b);
  }
  uint64_t want[2] = {0, (uint64_t)n};
  wait_confirms(c, 1, want);
  printf("confirmed=%d\n", n);
  fflush(stdout);

  amqp_basic_qos(c, 1, 0, 20, 0);
  check_rpc(amqp_get_rpc_reply(c), "basic.qos");
  amqp_basic_consume(c, 1, q, amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
  check_rpc(amqp_get_rpc_reply(c), "basic.consume");
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    amqp_envelope_t env;
    struct timeval tv = {20, 0};
    check_rpc(amqp_consume_message(c, &env, &tv, 0), "consume");
    char what[64];
    snprintf(what, sizeof what, "delivery %d", i);
    size_t len = fixed_len ? fixed_len : body_len(i);
    expect_body(env.message.body, len, (uint32_t)i, what);
    total += env.message.body.len;
    if (amqp_basic_ack(c, 1, env.delivery_tag, 0) != 0)
      die("basic.ack %d", i);
    amqp_destroy_envelope(&env);
  }
  printf("delivered=%d\nbytes=%zu\n", n, total);
}

static void cmd_channels(amqp_connection_state_t c, amqp_bytes_t q, int n) {
  uint64_t *want = calloc((size_t)n + 1, sizeof *want);
  for (int ch = 1; ch <= n; ch++) {
    open_channel(c, (amqp_channel_t)ch);
    confirm_select(c, (amqp_channel_t)ch);
  }
  declare(c, 1, q);
  char body[32];
  for (int ch = 1; ch <= n; ch++) {
    snprintf(body, sizeof body, "c%d", ch);
    publish(c, (amqp_channel_t)ch, q, amqp_cstring_bytes(body));
    want[ch] = 1;
  }
  wait_confirms(c, n, want);
  printf("confirmed=%d\n", n);
  char *seen = calloc((size_t)n + 1, 1);
  for (int ch = 1; ch <= n; ch++) {
    amqp_rpc_reply_t r = amqp_basic_get(c, (amqp_channel_t)ch, q, 1);
    check_rpc(r, "basic.get");
    if (r.reply.id != AMQP_BASIC_GET_OK_METHOD)
      die("basic.get on channel %d: queue empty", ch);
    amqp_message_t m;
    check_rpc(amqp_read_message(c, (amqp_channel_t)ch, &m, 0), "read_message");
    int k = 0;
    if (m.body.len >= sizeof body || m.body.len < 2)
      die("channel %d: a body of %zu bytes", ch, m.body.len);
    memcpy(body, m.body.bytes, m.body.len);
    body[m.body.len] = 0;
    if (sscanf(body, "c%d", &k) != 1 || k < 1 || k > n || seen[k])
      die("channel %d: unexpected body '%s'", ch, body);
    seen[k] = 1;
    amqp_destroy_message(&m);
  }
  printf("got=%d\n", n);
  for (int ch = 2; ch <= n; ch++)
    check_rpc(amqp_channel_close(c, (amqp_channel_t)ch, AMQP_REPLY_SUCCESS),
              "channel.close");
  free(seen);
  free(want);
}

/* Messages in queue `q` (passive declare on channel ch); -1 when it does
 * not exist (yet): the broker's 404 closed the channel, which is opened
 * again. */
static int queue_count(amqp_connection_state_t c, amqp_channel_t ch,
                       amqp_bytes_t q) {
  amqp_queue_declare_ok_t *ok =
      amqp_queue_declare(c, ch, q, 1, 0, 0, 0, amqp_empty_table);
  amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
  if (r.reply_type == AMQP_RESPONSE_NORMAL)
    return (int)ok->message_count;
  if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
      r.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
      ((amqp_channel_close_t *)r.reply.decoded)->reply_code == 404) {
    amqp_channel_close_ok_t close_ok = {0};
    if (amqp_send_method(c, ch, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok) !=
        AMQP_STATUS_OK)
      die("channel.close-ok");
    amqp_maybe_release_buffers_on_channel(c, ch);
    open_channel(c, ch);
    return -1;
  }
  check_rpc(r, "queue.declare passive");
  return -1;
}

static const amqp_field_value_t *header(const amqp_basic_properties_t *p,
                                        const char *key) {
  if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
    return NULL;
  for (int i = 0; i < p->headers.num_entries; i++) {
    amqp_table_entry_t *e = &p->headers.entries[i];
    if (e->key.len == strlen(key) && !memcmp(e->key.bytes, key, e->key.len))
      return &e->value;
  }
  return NULL;
}

static long long header_int(const amqp_basic_properties_t *p, const char *key) {
  const amqp_field_value_t *v = header(p, key);
  if (!v)
    return -1;
  switch (v->kind) {
  case AMQP_FIELD_KIND_I64:
    return v->value.i64;
  case AMQP_FIELD_KIND_I32:
    return v->value.i32;
  case AMQP_FIELD_KIND_U32:
    return v->value.u32;
  default:
    die("header %s of kind %c", key, v->kind);
  }
  return -1;
}

#define POISON_LEN 4096
#define POISON_SEED 0x90150

static void cmd_poison(amqp_connection_state_t c, amqp_bytes_t q) {
  char dlq_name[300];
  snprintf(dlq_name, sizeof dlq_name, "%.*s.dlq", (int)q.len, (char *)q.bytes);
  amqp_bytes_t dlq = amqp_cstring_bytes(dlq_name);
  open_channel(c, 1);
  open_channel(c, 2);
  declare(c, 1, q);
  confirm_select(c, 2);
  amqp_bytes_t body = make_body(POISON_LEN, POISON_SEED);
  publish(c, 2, q, body);
  amqp_bytes_free(body);
  uint64_t want[3] = {0, 0, 1};
  wait_confirms(c, 2, want);

  amqp_basic_qos(c, 1, 0, 1, 0);
  check_rpc(amqp_get_rpc_reply(c), "basic.qos");
  amqp_basic_consume(c, 1, q, amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
  check_rpc(amqp_get_rpc_reply(c), "basic.consume");
  int deliveries = 0;
  char counts[256] = "";
  double deadline = now() + 20, quiet_until = 0;
  for (;;) {
    if (now() > deadline)
      die("after %d deliveries, no message in %s within 20 s", deliveries,
          dlq_name);
    if (quiet_until && now() >= quiet_until)
      break;
    amqp_envelope_t env;
    struct timeval tv = {0, 100000};
    amqp_rpc_reply_t r = amqp_consume_message(c, &env, &tv, 0);
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
        r.library_error == AMQP_STATUS_TIMEOUT) {
      /* nothing came: has the message gone to the dead-letter queue? */
      if (!quiet_until && queue_count(c, 2, dlq) == 1)
        quiet_until = now() + 1.0; /* and no delivery after it */
      continue;
    }
    check_rpc(r, "consume");
    deliveries++;
    expect_body(env.message.body, POISON_LEN, POISON_SEED, "poison delivery");
    long long n = header_int(&env.message.properties, "rebound-retry-count");
    size_t used = strlen(counts);
    snprintf(counts + used, sizeof counts - used, "%s%lld",
             deliveries > 1 ? "," : "", n);
    /* nack and reject alternately, both with requeue=true */
    int rc = deliveries % 2 ? amqp_basic_nack(c, 1, env.delivery_tag, 0, 1)
                            : amqp_basic_reject(c, 1, env.delivery_tag, 1);
    if (rc != 0)
      die("nack/reject %d", deliveries);
    amqp_destroy_envelope(&env);
  }
  printf("deliveries=%d\ncounts=%s\n", deliveries, counts);

  amqp_rpc_reply_t r = amqp_basic_get(c, 2, dlq, 1);
  check_rpc(r, "basic.get dlq");
  if (r.reply.id != AMQP_BASIC_GET_OK_METHOD)
    die("%s is empty", dlq_name);
  amqp_message_t m;
  check_rpc(amqp_read_message(c, 2, &m, 0), "read_message dlq");
  expect_body(m.body, POISON_LEN, POISON_SEED, "dead-lettered copy");
  const amqp_field_value_t *reason =
      header(&m.properties, "rebound-dead-letter-reason");
  printf("dlq_body=intact\ndlq_retry_count=%lld\ndlq_reason=%.*s\n",
         header_int(&m.properties, "rebound-retry-count"),
         reason && reason->kind == AMQP_FIELD_KIND_UTF8
             ? (int)reason->value.bytes.len
             : 0,
         reason && reason->kind == AMQP_FIELD_KIND_UTF8
             ? (char *)reason->value.bytes.bytes
             : "");
  amqp_destroy_message(&m);
  printf("dlq_left=%d\n", queue_count(c, 2, dlq));
}

int main(int argc, char **argv) {
  if (argc < 6)
    die("usage: tls_rabbitmq_c HOST PORT CAFILE|- COMMAND QUEUE [N]");
  alarm(120); /* never outlive a broken test */
  const char *host = argv[1], *cafile = argv[3], *cmd = argv[4];
  int port = atoi(argv[2]);
  amqp_bytes_t q = amqp_cstring_bytes(argv[5]);
  int n = argc > 6 ? atoi(argv[6]) : 0;
  amqp_connection_state_t c = open_conn(host, port, cafile);
  if (!strcmp(cmd, "pubsub"))
    pub_confirm_consume(c, q, n, 0);
  else if (!strcmp(cmd, "big"))
    pub_confirm_consume(c, q, 1, (size_t)n);
  else if (!strcmp(cmd, "channels"))
    cmd_channels(c, q, n);
  else if (!strcmp(cmd, "poison"))
    cmd_poison(c, q);
  else
    die("unknown command %s", cmd);
  printf("hold\n");
  fflush(stdout);
  char line[16];
  if (!fgets(line, sizeof line, stdin) && ferror(stdin))
    die("reading stdin");
  delete_queue(c, 1, q);
  check_rpc(amqp_connection_close(c, AMQP_REPLY_SUCCESS), "connection.close");
  if (amqp_destroy_connection(c) != AMQP_STATUS_OK)
    die("amqp_destroy_connection");
  printf("closed\n");
  return 0;
}
