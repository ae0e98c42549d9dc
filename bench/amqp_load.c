/* amqp_load - an independent AMQP 0-9-1 load generator (librabbitmq-c).
 *
 * It knows nothing of rebound: point it at a broker, at HAProxy or at
 * rebound and compare. Two connections: a consumer (its own thread) that
 * declares a fresh auto-delete queue and consumes it with manual acks and a
 * prefetch, and a publisher (main thread) that publishes to that queue
 * through the default exchange with publisher confirms, at most `window`
 * messages unconfirmed.
 *
 *   throughput  publish `count` messages as fast as the window allows;
 *               report msg/s end to end (first publish -> last delivery).
 *   latency     publish at a fixed `rate`; every body starts with its send
 *               time (CLOCK_MONOTONIC ns, same host); the consumer computes
 *               publish -> deliver latency; report p50/p90/p99/p99.9/max in
 *               microseconds, after dropping the first `warmup` seconds.
 *
 * Every loop is bounded by its count and by --timeout. One line of output
 * starting with "RESULT" is meant for scripts (key=value).
 *
 * --tls CA_FILE: both connections speak TLS (librabbitmq-c's, on OpenSSL),
 * verifying the server's certificate against CA_FILE and its name against
 * --host (give the name the certificate carries, e.g. localhost).
 */
#define _GNU_SOURCE
#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef struct opts {
  const char *mode;
  const char *host;
  int port;
  const char *user, *pass, *vhost;
  const char *label;
  const char *tls_ca; /* NULL: plain TCP */
  long count;
  int size;
  int window;
  int prefetch;
  double rate;
  double duration;
  double warmup;
  double timeout;
  bool persistent;
} opts;

static opts o = {
    .host = "127.0.0.1",
    .port = 5672,
    .user = "guest",
    .pass = "guest",
    .vhost = "/",
    .label = "-",
    .count = -1,
    .size = 256,
    .window = 256,
    .prefetch = 500,
    .rate = 2000,
    .duration = 10,
    .warmup = 1,
    .timeout = 120,
};

static char queue[128];
static uint64_t t_deadline;

/* consumer -> main */
static atomic_long consumed;
static atomic_uint_fast64_t t_last_consumed;
static atomic_int consumer_error;
static atomic_int consumer_stop;
static uint64_t *lat_ns; /* latency mode: one slot per message sequence */
static atomic_long lat_n;
static long lat_skip; /* sequences below this are warm-up */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, const char *detail) {
  fprintf(stderr, "amqp_load: %s: %s\n", what, detail ? detail : "");
  printf("RESULT mode=%s label=%s status=error error=\"%s\"\n", o.mode, o.label,
         what);
  fflush(stdout);
  exit(1);
}

static void check_reply(amqp_rpc_reply_t r, const char *what) {
  char buf[256];
  switch (r.reply_type) {
  case AMQP_RESPONSE_NORMAL:
    return;
  case AMQP_RESPONSE_NONE:
    die(what, "missing RPC reply");
    break;
  case AMQP_RESPONSE_LIBRARY_EXCEPTION:
    die(what, amqp_error_string2(r.library_error));
    break;
  case AMQP_RESPONSE_SERVER_EXCEPTION:
    if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
      amqp_connection_close_t *m = r.reply.decoded;
      snprintf(buf, sizeof buf, "connection closed %u %.*s", m->reply_code,
               (int)m->reply_text.len, (char *)m->reply_text.bytes);
    } else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
      amqp_channel_close_t *m = r.reply.decoded;
      snprintf(buf, sizeof buf, "channel closed %u %.*s", m->reply_code,
               (int)m->reply_text.len, (char *)m->reply_text.bytes);
    } else {
      snprintf(buf, sizeof buf, "server method 0x%08x", r.reply.id);
    }
    die(what, buf);
    break;
  }
}

static amqp_connection_state_t connect_amqp(const char *who) {
  amqp_connection_state_t c = amqp_new_connection();
  amqp_socket_t *sock =
      o.tls_ca ? amqp_ssl_socket_new(c) : amqp_tcp_socket_new(c);
  struct timeval tv = {10, 0};
  if (!sock)
    die(who, "amqp_tcp_socket_new");
  if (o.tls_ca) {
    if (amqp_ssl_socket_set_cacert(sock, o.tls_ca) != AMQP_STATUS_OK)
      die(who, "TLS CA file");
    amqp_ssl_socket_set_verify_peer(sock, 1);
    amqp_ssl_socket_set_verify_hostname(sock, 1);
    if (amqp_ssl_socket_set_ssl_versions(sock, AMQP_TLSv1_2, AMQP_TLSvLATEST) !=
        AMQP_STATUS_OK)
      die(who, "TLS versions");
  }
  int rc = amqp_socket_open_noblock(sock, o.host, o.port, &tv);
  if (rc != AMQP_STATUS_OK)
    die(who, amqp_error_string2(rc));
  check_reply(amqp_login(c, o.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN,
                         o.user, o.pass),
              who);
  amqp_channel_open(c, 1);
  check_reply(amqp_get_rpc_reply(c), "channel.open");
  return c;
}

static void close_amqp(amqp_connection_state_t c) {
  amqp_channel_close(c, 1, AMQP_REPLY_SUCCESS);
  amqp_connection_close(c, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(c);
}

/* ---- consumer ----------------------------------------------------------- */

static void *consumer_main(void *arg) {
  amqp_connection_state_t c = arg;
  bool latency = strcmp(o.mode, "latency") == 0;
  long want = o.count;

  while (atomic_load(&consumed) < want && !atomic_load(&consumer_stop)) {
    amqp_envelope_t env;
    struct timeval tv = {0, 100000};
    if (now_ns() > t_deadline)
      break;
    amqp_maybe_release_buffers(c);
    amqp_rpc_reply_t r = amqp_consume_message(c, &env, &tv, 0);
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
        r.library_error == AMQP_STATUS_TIMEOUT)
      continue;
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
        r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
      /* a method other than basic.deliver: only fatal ones matter */
      amqp_frame_t f;
      if (amqp_simple_wait_frame(c, &f) != AMQP_STATUS_OK) {
        atomic_store(&consumer_error, 1);
        break;
      }
      if (f.frame_type == AMQP_FRAME_METHOD &&
          (f.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD ||
           f.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD ||
           f.payload.method.id == AMQP_BASIC_CANCEL_METHOD)) {
        fprintf(stderr, "amqp_load: consumer got method 0x%08x\n",
                f.payload.method.id);
        atomic_store(&consumer_error, 1);
        break;
      }
      continue;
    }
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      fprintf(stderr, "amqp_load: consume failed (%s)\n",
              r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION
                  ? amqp_error_string2(r.library_error)
                  : "server exception");
      atomic_store(&consumer_error, 1);
      break;
    }
    uint64_t t = now_ns();
    if (latency && env.message.body.len >= 16) {
      uint64_t sent, seq;
      memcpy(&sent, env.message.body.bytes, 8);
      memcpy(&seq, (char *)env.message.body.bytes + 8, 8);
      if ((long)seq >= lat_skip && (long)seq < o.count) {
        long i = atomic_fetch_add(&lat_n, 1);
        lat_ns[i] = t - sent;
      }
    }
    int rc = amqp_basic_ack(c, env.channel, env.delivery_tag, 0);
    amqp_destroy_envelope(&env);
    if (rc != AMQP_STATUS_OK) {
      fprintf(stderr, "amqp_load: ack failed: %s\n", amqp_error_string2(rc));
      atomic_store(&consumer_error, 1);
      break;
    }
    atomic_store(&t_last_consumed, t);
    atomic_fetch_add(&consumed, 1);
  }
  return NULL;
}

/* ---- publisher ---------------------------------------------------------- */

typedef struct pubstate {
  amqp_connection_state_t c;
  uint64_t published, confirmed, nacked;
} pubstate;

/* Read confirms: wait up to `wait_us` for the first frame, then take what
 * is already buffered without another syscall. */
static void read_confirms(pubstate *p, long wait_us) {
  for (int first = 1;; first = 0) {
    amqp_frame_t f;
    struct timeval tv = {wait_us / 1000000, wait_us % 1000000};
    if (!first && !amqp_data_in_buffer(p->c) && !amqp_frames_enqueued(p->c))
      return;
    int rc = amqp_simple_wait_frame_noblock(p->c, &f, &tv);
    if (rc == AMQP_STATUS_TIMEOUT)
      return;
    if (rc != AMQP_STATUS_OK)
      die("publisher read", amqp_error_string2(rc));
    if (f.frame_type != AMQP_FRAME_METHOD)
      continue;
    uint64_t tag;
    bool multiple, nack = false;
    switch (f.payload.method.id) {
    case AMQP_BASIC_ACK_METHOD: {
      amqp_basic_ack_t *a = f.payload.method.decoded;
      tag = a->delivery_tag;
      multiple = a->multiple;
      break;
    }
    case AMQP_BASIC_NACK_METHOD: {
      amqp_basic_nack_t *a = f.payload.method.decoded;
      tag = a->delivery_tag;
      multiple = a->multiple;
      nack = true;
      break;
    }
    case AMQP_CHANNEL_CLOSE_METHOD:
      die("publisher", "channel closed by broker");
      return;
    case AMQP_CONNECTION_CLOSE_METHOD:
      die("publisher", "connection closed by broker");
      return;
    default:
      continue;
    }
    uint64_t n = multiple ? (tag > p->confirmed ? tag - p->confirmed : 0) : 1;
    if (nack)
      p->nacked += n;
    p->confirmed += n;
    /* first frame in: drain whatever else is buffered, no blocking */
    wait_us = 0;
  }
}

static void publish_one(pubstate *p, amqp_bytes_t body) {
  amqp_basic_properties_t props;
  props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG;
  props.delivery_mode = o.persistent ? 2 : 1;
  int rc = amqp_basic_publish(p->c, 1, amqp_empty_bytes,
                              amqp_cstring_bytes(queue), 0, 0, &props, body);
  if (rc != AMQP_STATUS_OK)
    die("publish", amqp_error_string2(rc));
  p->published++;
}

static double arg_d(const char *v) {
  char *end;
  double d = strtod(v, &end);
  if (*end || end == v) {
    fprintf(stderr, "amqp_load: bad number '%s'\n", v);
    exit(2);
  }
  return d;
}

static void usage(void) {
  fprintf(stderr,
          "usage: amqp_load throughput|latency [--host H] [--port P]\n"
          "       [--user U] [--pass P] [--vhost V] [--label TEXT]\n"
          "       [--count N] [--size BYTES] [--window N] [--prefetch N]\n"
          "       [--rate MSG_PER_S] [--duration S] [--warmup S]\n"
          "       [--timeout S] [--persistent] [--tls CA_FILE]\n"
          "throughput: --count messages (default 100000) as fast as the\n"
          "  confirm window allows. latency: --rate for --duration seconds\n"
          "  (default 2000 msg/s, 10 s), first --warmup s (1) not counted.\n");
  exit(2);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static double pct_us(const uint64_t *v, long n, double p) {
  if (n <= 0)
    return 0;
  long i = (long)(p / 100.0 * (double)n + 0.5) - 1; /* nearest rank */
  if (i < 0)
    i = 0;
  if (i >= n)
    i = n - 1;
  return (double)v[i] / 1000.0;
}

int main(int argc, char **argv) {
  if (argc < 2)
    usage();
  o.mode = argv[1];
  bool latency = strcmp(o.mode, "latency") == 0;
  if (!latency && strcmp(o.mode, "throughput") != 0)
    usage();
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--persistent")) {
      o.persistent = true;
      continue;
    }
    if (i + 1 >= argc)
      usage();
    const char *v = argv[++i];
    if (!strcmp(a, "--host"))
      o.host = v;
    else if (!strcmp(a, "--port"))
      o.port = (int)arg_d(v);
    else if (!strcmp(a, "--user"))
      o.user = v;
    else if (!strcmp(a, "--pass"))
      o.pass = v;
    else if (!strcmp(a, "--vhost"))
      o.vhost = v;
    else if (!strcmp(a, "--label"))
      o.label = v;
    else if (!strcmp(a, "--count"))
      o.count = (long)arg_d(v);
    else if (!strcmp(a, "--size"))
      o.size = (int)arg_d(v);
    else if (!strcmp(a, "--window"))
      o.window = (int)arg_d(v);
    else if (!strcmp(a, "--prefetch"))
      o.prefetch = (int)arg_d(v);
    else if (!strcmp(a, "--rate"))
      o.rate = arg_d(v);
    else if (!strcmp(a, "--duration"))
      o.duration = arg_d(v);
    else if (!strcmp(a, "--warmup"))
      o.warmup = arg_d(v);
    else if (!strcmp(a, "--timeout"))
      o.timeout = arg_d(v);
    else if (!strcmp(a, "--tls"))
      o.tls_ca = v;
    else
      usage();
  }
  if (latency)
    o.count = (long)(o.rate * (o.duration + o.warmup));
  else if (o.count < 0)
    o.count = 100000;
  if (o.count <= 0 || o.size < 16 || o.window < 1 || o.prefetch < 0 ||
      o.prefetch > 65535 || o.rate <= 0 || o.timeout <= 0)
    usage();
  lat_skip = latency ? (long)(o.rate * o.warmup) : 0;
  t_deadline = now_ns() + (uint64_t)(o.timeout * 1e9);
  snprintf(queue, sizeof queue, "amqp-load-%s-%ld-%" PRIu64, o.mode,
           (long)getpid(), now_ns() % 1000000007u);

  /* consumer first: the queue exists and is consumed before any publish */
  amqp_connection_state_t cc = connect_amqp("consumer connect");
  amqp_queue_declare(cc, 1, amqp_cstring_bytes(queue), 0, 0, 0, 1,
                     amqp_empty_table);
  check_reply(amqp_get_rpc_reply(cc), "queue.declare");
  if (o.prefetch > 0) {
    amqp_basic_qos(cc, 1, 0, (uint16_t)o.prefetch, 0);
    check_reply(amqp_get_rpc_reply(cc), "basic.qos");
  }
  amqp_basic_consume(cc, 1, amqp_cstring_bytes(queue), amqp_empty_bytes, 0, 0,
                     0, amqp_empty_table);
  check_reply(amqp_get_rpc_reply(cc), "basic.consume");

  pubstate p = {.c = connect_amqp("publisher connect")};
  amqp_confirm_select(p.c, 1);
  check_reply(amqp_get_rpc_reply(p.c), "confirm.select");

  if (latency) {
    lat_ns = calloc((size_t)o.count, sizeof *lat_ns);
    if (!lat_ns)
      die("calloc", NULL);
  }
  pthread_t th;
  if (pthread_create(&th, NULL, consumer_main, cc) != 0)
    die("pthread_create", NULL);

  char *buf = calloc(1, (size_t)o.size);
  amqp_bytes_t body = {(size_t)o.size, buf};
  uint64_t t0 = now_ns();
  bool timed_out = false;

  if (!latency) {
    while (p.published < (uint64_t)o.count) {
      if (now_ns() > t_deadline || atomic_load(&consumer_error)) {
        timed_out = true;
        break;
      }
      while (p.published < (uint64_t)o.count &&
             p.published - p.confirmed < (uint64_t)o.window)
        publish_one(&p, body);
      read_confirms(&p, 100000);
    }
  } else {
    double interval = 1e9 / o.rate;
    for (long i = 0; i < o.count; i++) {
      uint64_t target = t0 + (uint64_t)(interval * (double)i);
      uint64_t t = now_ns();
      if (t > t_deadline || atomic_load(&consumer_error)) {
        timed_out = true;
        break;
      }
      if (target > t) {
        struct timespec ts = {(time_t)(target / 1000000000u),
                              (long)(target % 1000000000u)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) ==
               EINTR)
          ;
      }
      while (p.published - p.confirmed >= (uint64_t)o.window &&
             now_ns() < t_deadline)
        read_confirms(&p, 100000);
      uint64_t seq = (uint64_t)i;
      t = now_ns();
      memcpy(buf, &t, 8);
      memcpy(buf + 8, &seq, 8);
      publish_one(&p, body);
      read_confirms(&p, 0);
    }
  }
  /* the rest of the confirms, bounded */
  while (p.confirmed < p.published && now_ns() < t_deadline)
    read_confirms(&p, 100000);
  uint64_t t_confirmed = now_ns();
  /* the consumer stops at count or at the deadline */
  while (atomic_load(&consumed) < (long)p.published && now_ns() < t_deadline &&
         !atomic_load(&consumer_error))
    usleep(1000);
  atomic_store(&consumer_stop, 1);
  pthread_join(th, NULL);

  long got = atomic_load(&consumed);
  uint64_t t_end = atomic_load(&t_last_consumed);
  const char *status = timed_out || got < o.count ? "incomplete" : "ok";
  if (atomic_load(&consumer_error))
    status = "consumer-error";
  double secs = t_end > t0 ? (double)(t_end - t0) / 1e9 : 0;

  if (!latency) {
    printf("RESULT mode=throughput label=%s status=%s msgs=%ld size=%d "
           "window=%d prefetch=%d secs=%.3f msg_per_s=%.0f "
           "confirm_secs=%.3f nacked=%" PRIu64 "\n",
           o.label, status, got, o.size, o.window, o.prefetch, secs,
           secs > 0 ? (double)got / secs : 0, (double)(t_confirmed - t0) / 1e9,
           p.nacked);
  } else {
    long n = atomic_load(&lat_n);
    qsort(lat_ns, (size_t)n, sizeof *lat_ns, cmp_u64);
    double sum = 0;
    for (long i = 0; i < n; i++)
      sum += (double)lat_ns[i];
    printf("RESULT mode=latency label=%s status=%s msgs=%ld measured=%ld "
           "rate=%.0f achieved_rate=%.0f size=%d p50_us=%.1f p90_us=%.1f "
           "p99_us=%.1f p999_us=%.1f max_us=%.1f mean_us=%.1f nacked=%" PRIu64
           "\n",
           o.label, status, got, n, o.rate, secs > 0 ? (double)got / secs : 0,
           o.size, pct_us(lat_ns, n, 50), pct_us(lat_ns, n, 90),
           pct_us(lat_ns, n, 99), pct_us(lat_ns, n, 99.9),
           n ? (double)lat_ns[n - 1] / 1000.0 : 0,
           n ? sum / (double)n / 1000.0 : 0, p.nacked);
  }
  fflush(stdout);
  close_amqp(p.c);
  close_amqp(cc);
  free(buf);
  free(lat_ns);
  return strcmp(status, "ok") == 0 ? 0 : 1;
}
