/* pump_client - consume as fast as possible and count what arrives.
 *
 * Connects (raw socket, PLAIN guest/guest, heartbeat 0), opens channel 1,
 * basic.consume with no-ack on --queue, then reads for --warmup seconds
 * without counting and for --seconds seconds counting whole frames (by
 * type), basic.deliver methods and bytes. Meant for bench/fake_broker
 * (which floods deliveries), directly or through a proxy.
 *
 *   pump_client [--host H] [--port P] [--seconds T] [--warmup W]
 *               [--messages N] [--queue Q] [--label TEXT] [--cpu-pid PID]
 *               [--tls CA_FILE] [--sni NAME]
 * Prints one "RESULT" line (key=value). With --cpu-pid it also reports the
 * CPU time (utime+stime from /proc/PID/stat) that process spent during the
 * counted window, per million frames, and as a share of one core. Every
 * loop is bounded by time.
 *
 * --messages N: count everything from basic.consume-ok on (no warm-up)
 * until the N-th delivery is complete (its header and all its body bytes),
 * then close the connection cleanly (connection.close, wait for close-ok,
 * at most 10 s) and exit; --seconds (default 600 then) only bounds the wait,
 * and status=short when fewer than N arrived in time. Frames after the N-th
 * delivery are not counted (extra=... says how many came before close-ok).
 * Meant for counts that must be the same from run to run (callgrind).
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

int main(int argc, char **argv) {
  const char *host = "127.0.0.1", *queue = "pump", *label = "-";
  const char *tls_ca = NULL, *sni = "localhost";
  int port = 5672;
  long cpu_pid = 0;
  double seconds = 5, warmup = 1;
  uint64_t messages = 0;
  bool seconds_given = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *a = argv[i], *v = argv[i + 1];
    if (!strcmp(a, "--host"))
      host = v;
    else if (!strcmp(a, "--port"))
      port = atoi(v);
    else if (!strcmp(a, "--seconds")) {
      seconds = atof(v);
      seconds_given = true;
    } else if (!strcmp(a, "--messages")) {
      char *e;
      messages = strtoull(v, &e, 10);
      if (*e || !messages || v[0] == '-')
        fail("--messages N (N >= 1)");
    } else if (!strcmp(a, "--warmup"))
      warmup = atof(v);
    else if (!strcmp(a, "--queue"))
      queue = v;
    else if (!strcmp(a, "--label"))
      label = v;
    else if (!strcmp(a, "--cpu-pid"))
      cpu_pid = atol(v);
    else if (!strcmp(a, "--tls"))
      tls_ca = v;
    else if (!strcmp(a, "--sni"))
      sni = v;
    else {
      fprintf(stderr, "usage: pump_client [--host H] [--port P] [--seconds T] "
                      "[--warmup W] [--messages N] [--queue Q] [--label TEXT] "
                      "[--cpu-pid PID] [--tls CA_FILE] [--sni NAME]\n");
      return 2;
    }
  }
  if (messages) {
    warmup = 0;
    if (!seconds_given)
      seconds = 600;
  }
  if ((argc - 1) % 2 || seconds <= 0 || warmup < 0 || seconds > 3600)
    fail("bad arguments");

  static ba_reader r;
  r.fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  struct timeval tv = {10, 0};
  int one = 1;
  setsockopt(r.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(r.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  setsockopt(r.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1 ||
      connect(r.fd, (struct sockaddr *)&sa, sizeof sa) != 0)
    fail("connect");
  if (tls_ca) {
    SSL_CTX *ctx = bt_client_ctx("pump_client", tls_ca);
    if (!ctx || !(r.ssl = bt_connect("pump_client", ctx, r.fd, sni)))
      fail("TLS handshake");
  }
  if (ba_client_handshake(&r, "guest", "guest", "/", 0) != 0)
    fail("handshake");

  ba_buf b = {0};
  ba_frame f;
  if (ba_channel_open(&r, 1) != 0 || ba_expect(&r, 1, BA_MID(20, 11), &f) != 0)
    fail("channel.open");
  size_t at = ba_method_begin(&b, 1, BA_MID(60, 20));
  ba_u16(&b, 0);
  ba_shortstr(&b, queue);
  ba_shortstr(&b, "");
  ba_u8(&b, 2); /* no-ack */
  ba_u32(&b, 0);
  ba_frame_end(&b, at);
  if (ba_send(&r, b.p, b.len) != 0 || ba_expect(&r, 1, BA_MID(60, 21), &f) != 0)
    fail("basic.consume");
  free(b.p);

  /* frames already buffered by the reader belong to the warm-up (with
   * --messages: they count) */
  static uint8_t buf[256 * 1024];
  size_t len = r.end - r.start;
  memcpy(buf, r.buf + r.start, len);

  uint64_t counts[9] = {0}, delivers = 0, bytes = 0;
  uint64_t t_start = ba_now_ns();
  uint64_t t_count = t_start + (uint64_t)(warmup * 1e9);
  uint64_t t_end = t_count + (uint64_t)(seconds * 1e9);
  bool counting = warmup == 0;
  int status_ok = 1;
  double cpu0 = counting && cpu_pid ? ba_proc_cpu_secs(cpu_pid) : 0;
  uint64_t body_left = 0; /* --messages: body bytes of the last delivery */
  bool got_all = false, parse_first = messages && len > 0;

  while (!got_all) {
    uint64_t now = ba_now_ns();
    if (!counting && now >= t_count) {
      counting = true;
      if (cpu_pid)
        cpu0 = ba_proc_cpu_secs(cpu_pid);
      t_count = now;
      t_end = now + (uint64_t)(seconds * 1e9);
    }
    if (counting && now >= t_end)
      break;
    /* with --messages, frames still in buf (from the handshake reader)
     * count before anything is read */
    if (!parse_first) {
      struct pollfd p = {.fd = r.fd, .events = POLLIN};
      /* over TLS, decrypted bytes may wait in the SSL object */
      if (len < sizeof buf && !(r.ssl && SSL_pending(r.ssl)) &&
          poll(&p, 1, 200) <= 0)
        continue; /* re-check the clock */
      ssize_t n = ba_recv(&r, buf + len, sizeof buf - len);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        status_ok = 0;
        fprintf(stderr, "pump_client: connection lost\n");
        break;
      }
      len += (size_t)n;
    }
    parse_first = false;
    size_t pos = 0;
    while (!got_all) {
      long k = ba_frame_parse(buf + pos, len - pos, sizeof buf - 8, &f);
      if (k < 0)
        fail("bad frame");
      if (k == 0)
        break;
      if (counting) {
        counts[f.type < 9 ? f.type : 0]++;
        bytes += (uint64_t)k;
        if (f.method == BA_MID(60, 60))
          delivers++;
        if (messages) {
          if (f.type == BA_FRAME_HEADER && f.size >= 12)
            body_left = ba_get_u64(f.payload + 4);
          else if (f.type == BA_FRAME_BODY)
            body_left -= f.size < body_left ? f.size : body_left;
          got_all = delivers == messages && body_left == 0 &&
                    f.type != BA_FRAME_METHOD;
        }
      }
      pos += (size_t)k;
    }
    memmove(buf, buf + pos, len - pos);
    len -= pos;
    if (messages && !got_all && len == sizeof buf)
      fail("frame larger than the read buffer");
  }
  uint64_t t_stop = ba_now_ns();
  double cpu = cpu_pid ? ba_proc_cpu_secs(cpu_pid) - cpu0 : 0;
  long extra = 0; /* --messages: frames between the last one and close-ok */
  if (messages && status_ok)
    extra = close_cleanly(&r, buf, len);
  if (messages && (!got_all || extra < 0))
    status_ok = 0;
  double secs = counting ? (double)(t_stop - t_count) / 1e9 : 0;
  uint64_t frames = counts[1] + counts[2] + counts[3] + counts[8];
  printf("RESULT mode=pump label=%s status=%s secs=%.3f frames=%llu "
         "msgs=%llu bytes=%llu frames_per_s=%.0f msgs_per_s=%.0f "
         "MB_per_s=%.1f",
         label,
         status_ok  ? "ok"
         : messages ? (got_all ? "close_failed" : "short")
                    : "lost",
         secs, (unsigned long long)frames, (unsigned long long)delivers,
         (unsigned long long)bytes, secs > 0 ? (double)frames / secs : 0,
         secs > 0 ? (double)delivers / secs : 0,
         secs > 0 ? (double)bytes / secs / 1e6 : 0);
  if (messages)
    printf(" extra=%ld", extra);
  if (r.ssl)
    printf(" tls=%s", bt_describe(r.ssl));
  if (cpu_pid)
    printf(" cpu_pid=%ld cpu_secs=%.2f cpu_s_per_mframes=%.4f core_util=%.2f",
           cpu_pid, cpu, frames ? cpu / ((double)frames / 1e6) : 0,
           secs > 0 ? cpu / secs : 0);
  printf("\n");
  fflush(stdout);
  close(r.fd);
  return status_ok ? 0 : 1;
}
