/* pump_client - consume (or publish) as fast as possible and count frames.
 *
 * Connects (raw socket, PLAIN guest/guest, heartbeat 0), opens channel 1,
 * then in one of three modes:
 *
 * - no-ack (default): basic.consume with no-ack on --queue, then reads for
 *   --warmup seconds without counting and for --seconds seconds counting
 *   whole frames (by type), basic.deliver methods and bytes.
 * - --ack [--prefetch P]: basic.qos (prefetch-count P, default 100; 0: no
 *   limit) and basic.consume without no-ack, counted the same way; every
 *   delivery is acknowledged (basic.ack, its delivery tag, multiple 0) as
 *   soon as it is complete (header and all its body bytes), the acks of
 *   what one read brought written together in one write after it, as real
 *   clients do. acks=... in the result.
 * - --nack [--prefetch P]: the same, but every delivery is answered with
 *   basic.nack (its delivery tag, multiple 0, requeue 1) instead of an
 *   ack, batched per read the same way: what rebound turns into a retry
 *   (a copy to a delay tier, then the ack of the original upstream).
 *   nacks=... in the result.
 * - --publish [--body-size B] --messages N: N messages (basic.publish to
 *   exchange "" with routing key --queue, a content header, one body frame
 *   of B bytes, default 256; no body frame for 0), written in blocks of
 *   about 64 KiB as fast as the socket takes them, no confirms; then closes
 *   cleanly as below. The frames and bytes counted are the ones written.
 *
 * Meant for bench/fake_broker (which floods deliveries and counts
 * publishes), directly or through a proxy.
 *
 *   pump_client [--host H] [--port P] [--seconds T] [--warmup W]
 *               [--messages N] [--queue Q] [--label TEXT] [--cpu-pid PID]
 *               [--tls CA_FILE] [--sni NAME] [--ack [--prefetch P]]
 *               [--nack [--prefetch P]] [--publish [--body-size B]]
 * Prints one "RESULT" line (key=value; mode=pump, pump-ack, publish or
 * pump-nack).
 * With --cpu-pid it also reports the CPU time (utime+stime from
 * /proc/PID/stat) that process spent during the counted window, per
 * million frames, and as a share of one core. Every loop is bounded by
 * time.
 *
 * --messages N: count everything from basic.consume-ok on (no warm-up)
 * until the N-th delivery is complete (its header and all its body bytes),
 * then close the connection cleanly (connection.close, wait for close-ok,
 * at most 10 s) and exit; --seconds (default 600 then) only bounds the wait,
 * and status=short when fewer than N arrived (or, publishing, were written)
 * in time. Frames after the N-th delivery are not counted (extra=... says
 * how many came before close-ok). Meant for counts that must be the same
 * from run to run (callgrind).
 *
 * --tls CA_FILE: speak TLS (OpenSSL, a full handshake) and verify the
 * server's certificate against CA_FILE and --sni NAME (default localhost),
 * which is also sent as SNI; tls=VERSION/CIPHER in the result.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include "bench_amqp.h"
#include "bench_tls.h"

static void fail(const char *what) {
  fprintf(stderr, "pump_client: %s\n", what);
  printf("RESULT mode=pump status=error error=\"%s\"\n", what);
  exit(1);
}

/* connection.close (200), then read until close-ok (10 s at most: the
 * socket's SO_RCVTIMEO), skipping what still comes. `pending` holds bytes
 * already read. Returns the frames skipped, or -1 when no close-ok came. */
static long close_cleanly(ba_reader *r, const uint8_t *pending, size_t len) {
  ba_buf b = {0};
  size_t at = ba_method_begin(&b, 0, BA_MID(10, 50));
  ba_u16(&b, 200);
  ba_shortstr(&b, "done");
  ba_u16(&b, 0);
  ba_u16(&b, 0);
  ba_frame_end(&b, at);
  int rc = ba_send(r, b.p, b.len);
  free(b.p);
  if (rc != 0)
    return -1;
  long skipped = 0;
  ba_frame f;
  size_t pos = 0;
  for (;;) { /* whole frames already read: close-ok cannot be among them */
    long k = ba_frame_parse(pending + pos, len - pos, sizeof r->buf - 8, &f);
    if (k <= 0)
      break;
    pos += (size_t)k;
    skipped++;
  }
  if (len - pos > sizeof r->buf)
    return -1;
  memcpy(r->buf, pending + pos, len - pos); /* a partial frame, if any */
  r->start = 0;
  r->end = len - pos;
  uint64_t deadline = ba_now_ns() + 10000000000ull;
  while (ba_now_ns() < deadline) {
    if (ba_read_frame(r, &f) != 0)
      return -1;
    if (f.channel == 0 && f.method == BA_MID(10, 51))
      return skipped;
    if (f.channel == 0 && f.method == BA_MID(10, 50))
      return -1; /* the server closed first */
    skipped++;
  }
  return -1;
}

/* ---- options ------------------------------------------------------------ */

typedef enum { M_NOACK, M_ACK, M_PUBLISH, M_NACK } run_mode;

typedef struct opts {
  const char *host, *queue, *label, *tls_ca, *sni;
  int port;
  long cpu_pid;
  double seconds, warmup;
  uint64_t messages;
  run_mode mode;
  uint32_t prefetch; /* --ack, --nack */
  int body_size;     /* --publish */
} opts;

static void usage(void) {
  fprintf(stderr, "usage: pump_client [--host H] [--port P] [--seconds T] "
                  "[--warmup W] [--messages N] [--queue Q] [--label TEXT] "
                  "[--cpu-pid PID] [--tls CA_FILE] [--sni NAME] "
                  "[--ack [--prefetch P]] [--nack [--prefetch P]] "
                  "[--publish [--body-size B]]\n");
  exit(2);
}

static void parse_args(int argc, char **argv, opts *o) {
  *o = (opts){.host = "127.0.0.1",
              .queue = "pump",
              .label = "-",
              .sni = "localhost",
              .port = 5672,
              .seconds = 5,
              .warmup = 1,
              .mode = M_NOACK,
              .prefetch = 100,
              .body_size = 256};
  bool seconds_given = false, bad = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--ack")) {
      o->mode = M_ACK;
      continue;
    }
    if (!strcmp(a, "--nack")) {
      o->mode = M_NACK;
      continue;
    }
    if (!strcmp(a, "--publish")) {
      o->mode = M_PUBLISH;
      continue;
    }
    if (i + 1 >= argc)
      usage();
    const char *v = argv[++i];
    if (!strcmp(a, "--host"))
      o->host = v;
    else if (!strcmp(a, "--port"))
      o->port = atoi(v);
    else if (!strcmp(a, "--seconds")) {
      o->seconds = atof(v);
      seconds_given = true;
    } else if (!strcmp(a, "--messages")) {
      char *e;
      o->messages = strtoull(v, &e, 10);
      if (*e || !o->messages || v[0] == '-')
        fail("--messages N (N >= 1)");
    } else if (!strcmp(a, "--warmup"))
      o->warmup = atof(v);
    else if (!strcmp(a, "--queue"))
      o->queue = v;
    else if (!strcmp(a, "--label"))
      o->label = v;
    else if (!strcmp(a, "--cpu-pid"))
      o->cpu_pid = atol(v);
    else if (!strcmp(a, "--tls"))
      o->tls_ca = v;
    else if (!strcmp(a, "--sni"))
      o->sni = v;
    else if (!strcmp(a, "--prefetch")) {
      long p = atol(v);
      bad |= p < 0 || p > 65535; /* basic.qos prefetch-count is 16 bits */
      o->prefetch = (uint32_t)p;
    } else if (!strcmp(a, "--body-size")) {
      o->body_size = atoi(v);
      bad |= o->body_size < 0 || o->body_size > 131000;
    } else
      usage();
  }
  if (o->messages) {
    o->warmup = 0;
    if (!seconds_given)
      o->seconds = 600;
  }
  if (o->mode == M_PUBLISH && !o->messages)
    fail("--publish needs --messages N");
  if (bad || o->seconds <= 0 || o->warmup < 0 || o->seconds > 3600)
    fail("bad arguments");
}

/* ---- connection -----------------------------------------------------------
 */

/* TCP (and TLS), the AMQP handshake, channel 1 open. */
static void connect_and_open(ba_reader *r, const opts *o) {
  r->fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(o->port)};
  struct timeval tv = {10, 0};
  int one = 1;
  setsockopt(r->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(r->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  setsockopt(r->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (inet_pton(AF_INET, o->host, &sa.sin_addr) != 1 ||
      connect(r->fd, (struct sockaddr *)&sa, sizeof sa) != 0)
    fail("connect");
  if (o->tls_ca) {
    SSL_CTX *ctx = bt_client_ctx("pump_client", o->tls_ca);
    if (!ctx || !(r->ssl = bt_connect("pump_client", ctx, r->fd, o->sni)))
      fail("TLS handshake");
  }
  if (ba_client_handshake(r, "guest", "guest", "/", 0) != 0)
    fail("handshake");
  ba_frame f;
  if (ba_channel_open(r, 1) != 0 || ba_expect(r, 1, BA_MID(20, 11), &f) != 0)
    fail("channel.open");
}

/* What was counted. */
typedef struct result {
  uint64_t counts[9]; /* frames by type */
  uint64_t delivers;  /* basic.deliver (publishing: messages written) */
  uint64_t bytes;
  uint64_t acks; /* basic.ack (--nack: basic.nack) written */
  uint64_t t_count, t_stop;
  bool counting, ok, got_all;
  long extra; /* --messages: frames between the last one and close-ok */
  double cpu;
} result;

/* ---- consuming ------------------------------------------------------------
 */

/* basic.qos (--ack, --nack), then basic.consume on channel 1; waits for the
 * -ok of each. */
static void start_consume(ba_reader *r, const opts *o) {
  ba_buf b = {0};
  ba_frame f;
  size_t at;
  bool acks = o->mode == M_ACK || o->mode == M_NACK;
  if (acks) {
    at = ba_method_begin(&b, 1, BA_MID(60, 10));
    ba_u32(&b, 0); /* prefetch-size */
    ba_u16(&b, (uint16_t)o->prefetch);
    ba_u8(&b, 0); /* global: no, per consumer */
    ba_frame_end(&b, at);
    if (ba_send(r, b.p, b.len) != 0 || ba_expect(r, 1, BA_MID(60, 11), &f) != 0)
      fail("basic.qos");
    b.len = 0;
  }
  at = ba_method_begin(&b, 1, BA_MID(60, 20));
  ba_u16(&b, 0);
  ba_shortstr(&b, o->queue);
  ba_shortstr(&b, "");
  ba_u8(&b, acks ? 0 : 2); /* no-ack bit */
  ba_u32(&b, 0);
  ba_frame_end(&b, at);
  if (ba_send(r, b.p, b.len) != 0 || ba_expect(r, 1, BA_MID(60, 21), &f) != 0)
    fail("basic.consume");
  free(b.p);
}

/* The delivery being received. */
typedef struct delivery {
  uint16_t channel;
  uint64_t tag;       /* its delivery tag */
  uint64_t body_left; /* body bytes still to come */
  bool open;          /* basic.deliver seen, not complete yet */
} delivery;

/* Feeds one frame; true when it completes a delivery (its content header
 * with an empty body, or the frame with its last body bytes). */
static bool delivery_frame(delivery *d, const ba_frame *f) {
  if (f->method == BA_MID(60, 60)) {
    /* consumer-tag (shortstr), delivery-tag (64 bits), ... */
    const uint8_t *p = f->payload + 4;
    d->open = true;
    d->body_left = 0;
    d->channel = f->channel;
    if (f->size >= 5u + p[0] + 8u)
      d->tag = ba_get_u64(p + 1 + p[0]);
    return false;
  }
  if (!d->open)
    return false;
  if (f->type == BA_FRAME_HEADER && f->size >= 12)
    d->body_left = ba_get_u64(f->payload + 4);
  else if (f->type == BA_FRAME_BODY)
    d->body_left -= f->size < d->body_left ? f->size : d->body_left;
  else
    return false;
  if (d->body_left > 0)
    return false;
  d->open = false;
  return true;
}

/* basic.ack: one delivery tag, multiple 0. */
static void put_ack(ba_buf *b, uint16_t ch, uint64_t tag) {
  size_t at = ba_method_begin(b, ch, BA_MID(60, 80));
  ba_u64(b, tag);
  ba_u8(b, 0);
  ba_frame_end(b, at);
}

/* basic.nack: one delivery tag, multiple 0, requeue 1. */
static void put_nack(ba_buf *b, uint16_t ch, uint64_t tag) {
  size_t at = ba_method_begin(b, ch, BA_MID(60, 120));
  ba_u64(b, tag);
  ba_u8(b, 2); /* bit 0 multiple, bit 1 requeue */
  ba_frame_end(b, at);
}

/* Reads and counts until --seconds are over or (--messages) the N-th
 * delivery is complete, then closes cleanly (--messages). --ack (--nack):
 * the deliveries a read completed are acked (nacked) in one write after
 * it. */
static void run_consume(ba_reader *r, const opts *o, result *res) {
  /* frames already buffered by the reader belong to the warm-up (with
   * --messages: they count) */
  static uint8_t buf[256 * 1024];
  size_t len = r->end - r->start;
  memcpy(buf, r->buf + r->start, len);

  ba_frame f;
  ba_buf acks = {0}; /* --ack: written after each read's frames */
  uint64_t acks_pending = 0, completed = 0;
  delivery d = {0};
  uint64_t t_start = ba_now_ns();
  res->t_count = t_start + (uint64_t)(o->warmup * 1e9);
  uint64_t t_end = res->t_count + (uint64_t)(o->seconds * 1e9);
  res->counting = o->warmup == 0;
  res->ok = true;
  double cpu0 = res->counting && o->cpu_pid ? ba_proc_cpu_secs(o->cpu_pid) : 0;
  bool parse_first = o->messages && len > 0;

  while (!res->got_all) {
    uint64_t now = ba_now_ns();
    if (!res->counting && now >= res->t_count) {
      res->counting = true;
      if (o->cpu_pid)
        cpu0 = ba_proc_cpu_secs(o->cpu_pid);
      res->t_count = now;
      t_end = now + (uint64_t)(o->seconds * 1e9);
    }
    if (res->counting && now >= t_end)
      break;
    /* with --messages, frames still in buf (from the handshake reader)
     * count before anything is read */
    if (!parse_first) {
      struct pollfd p = {.fd = r->fd, .events = POLLIN};
      /* over TLS, decrypted bytes may wait in the SSL object */
      if (len < sizeof buf && !(r->ssl && SSL_pending(r->ssl)) &&
          poll(&p, 1, 200) <= 0)
        continue; /* re-check the clock */
      ssize_t n = ba_recv(r, buf + len, sizeof buf - len);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        res->ok = false;
        fprintf(stderr, "pump_client: connection lost\n");
        break;
      }
      len += (size_t)n;
    }
    parse_first = false;
    size_t pos = 0;
    while (!res->got_all) {
      long k = ba_frame_parse(buf + pos, len - pos, sizeof buf - 8, &f);
      if (k < 0)
        fail("bad frame");
      if (k == 0)
        break;
      bool complete = delivery_frame(&d, &f);
      if (complete && o->mode == M_ACK) {
        put_ack(&acks, d.channel, d.tag);
        acks_pending++;
      } else if (complete && o->mode == M_NACK) {
        put_nack(&acks, d.channel, d.tag);
        acks_pending++;
      }
      if (res->counting) {
        res->counts[f.type < 9 ? f.type : 0]++;
        res->bytes += (uint64_t)k;
        if (f.method == BA_MID(60, 60))
          res->delivers++;
        completed += complete;
        res->got_all = o->messages && completed == o->messages;
      }
      pos += (size_t)k;
    }
    if (acks.len > 0) {
      if (ba_send(r, acks.p, acks.len) != 0) {
        res->ok = false;
        fprintf(stderr, "pump_client: cannot write %s\n",
                o->mode == M_NACK ? "nacks" : "acks");
        break;
      }
      res->acks += acks_pending;
      acks.len = 0;
      acks_pending = 0;
    }
    memmove(buf, buf + pos, len - pos);
    len -= pos;
    if (o->messages && !res->got_all && len == sizeof buf)
      fail("frame larger than the read buffer");
  }
  free(acks.p);
  res->t_stop = ba_now_ns();
  res->cpu = o->cpu_pid ? ba_proc_cpu_secs(o->cpu_pid) - cpu0 : 0;
  if (o->messages && res->ok)
    res->extra = close_cleanly(r, buf, len);
  if (o->messages && (!res->got_all || res->extra < 0))
    res->ok = false;
}

/* ---- publishing -----------------------------------------------------------
 */

/* One message: basic.publish (exchange "", routing key `queue`), content
 * header (delivery-mode 1), one body frame of `body` bytes unless 0. */
static void put_publish(ba_buf *b, const char *queue, int body) {
  size_t at = ba_method_begin(b, 1, BA_MID(60, 40));
  ba_u16(b, 0);          /* reserved */
  ba_shortstr(b, "");    /* exchange */
  ba_shortstr(b, queue); /* routing key */
  ba_u8(b, 0);           /* mandatory, immediate: no */
  ba_frame_end(b, at);
  at = ba_frame_begin(b, BA_FRAME_HEADER, 1);
  ba_u16(b, 60);
  ba_u16(b, 0);
  ba_u64(b, (uint64_t)body);
  ba_u16(b, 0x1000); /* property flags: delivery-mode */
  ba_u8(b, 1);
  ba_frame_end(b, at);
  if (body > 0) {
    at = ba_frame_begin(b, BA_FRAME_BODY, 1);
    ba_reserve(b, (size_t)body);
    memset(b->p + b->len, 'x', (size_t)body);
    b->len += (size_t)body;
    ba_frame_end(b, at);
  }
}

/* --publish: --messages N messages in blocks of about 64 KiB (whole
 * messages; the last block is cut to what is left), blocking writes, then
 * connection.close and close-ok. */
static void run_publish(ba_reader *r, const opts *o, result *res) {
  ba_buf b = {0};
  put_publish(&b, o->queue, o->body_size);
  size_t msg_bytes = b.len, per_block = 64 * 1024 / msg_bytes;
  for (size_t i = 1; i < per_block; i++)
    put_publish(&b, o->queue, o->body_size);
  if (per_block == 0)
    per_block = 1;

  uint64_t left = o->messages;
  res->counting = true;
  res->ok = true;
  double cpu0 = o->cpu_pid ? ba_proc_cpu_secs(o->cpu_pid) : 0;
  res->t_count = ba_now_ns();
  uint64_t t_end = res->t_count + (uint64_t)(o->seconds * 1e9);
  while (left > 0 && ba_now_ns() < t_end) {
    size_t n = left < per_block ? (size_t)left : per_block;
    if (ba_send(r, b.p, n * msg_bytes) != 0) {
      res->ok = false;
      fprintf(stderr, "pump_client: connection lost\n");
      break;
    }
    left -= n;
    res->delivers += n;
    res->counts[BA_FRAME_METHOD] += n;
    res->counts[BA_FRAME_HEADER] += n;
    if (o->body_size > 0)
      res->counts[BA_FRAME_BODY] += n;
    res->bytes += n * msg_bytes;
  }
  free(b.p);
  res->t_stop = ba_now_ns();
  res->cpu = o->cpu_pid ? ba_proc_cpu_secs(o->cpu_pid) - cpu0 : 0;
  res->got_all = left == 0;
  static const uint8_t nothing[1];
  if (res->ok && res->got_all)
    res->extra = close_cleanly(r, nothing, 0);
  if (!res->got_all || res->extra < 0)
    res->ok = false;
}

/* ---- result ---------------------------------------------------------------
 */

static void print_result(const opts *o, ba_reader *r, const result *res) {
  static const char *names[] = {"pump", "pump-ack", "publish", "pump-nack"};
  double secs = res->counting ? (double)(res->t_stop - res->t_count) / 1e9 : 0;
  const uint64_t *c = res->counts;
  uint64_t frames = c[1] + c[2] + c[3] + c[8];
  printf("RESULT mode=%s label=%s status=%s secs=%.3f frames=%llu "
         "msgs=%llu bytes=%llu frames_per_s=%.0f msgs_per_s=%.0f "
         "MB_per_s=%.1f",
         names[o->mode], o->label,
         res->ok       ? "ok"
         : o->messages ? (res->got_all ? "close_failed" : "short")
                       : "lost",
         secs, (unsigned long long)frames, (unsigned long long)res->delivers,
         (unsigned long long)res->bytes, secs > 0 ? (double)frames / secs : 0,
         secs > 0 ? (double)res->delivers / secs : 0,
         secs > 0 ? (double)res->bytes / secs / 1e6 : 0);
  if (o->messages)
    printf(" extra=%ld", res->extra);
  if (o->mode == M_ACK || o->mode == M_NACK)
    printf(" %s=%llu prefetch=%u", o->mode == M_ACK ? "acks" : "nacks",
           (unsigned long long)res->acks, o->prefetch);
  if (r->ssl)
    printf(" tls=%s", bt_describe(r->ssl));
  if (o->cpu_pid)
    printf(" cpu_pid=%ld cpu_secs=%.2f cpu_s_per_mframes=%.4f core_util=%.2f",
           o->cpu_pid, res->cpu, frames ? res->cpu / ((double)frames / 1e6) : 0,
           secs > 0 ? res->cpu / secs : 0);
  printf("\n");
  fflush(stdout);
}

int main(int argc, char **argv) {
  opts o;
  parse_args(argc, argv, &o);
  static ba_reader r;
  result res = {0};
  connect_and_open(&r, &o);
  if (o.mode == M_PUBLISH)
    run_publish(&r, &o, &res);
  else {
    start_consume(&r, &o);
    run_consume(&r, &o, &res);
  }
  print_result(&o, &r, &res);
  close(r.fd);
  return res.ok ? 0 : 1;
}
