/* tls_handshakes - new TLS connections, one after another, as fast as a
 * server (or a proxy in front of one) completes them.
 *
 * Keeps --parallel connections in flight (non-blocking sockets, poll(2),
 * OpenSSL). Each one: TCP connect, a full TLS handshake (no session is
 * ever resumed: the client keeps none), the server verified against
 * --tls CA_FILE and --sni NAME (sent as SNI too); then, unless --tls-only,
 * the AMQP protocol header, and the whole connection.start frame read
 * back, which through a proxy means that the proxy also reached the broker
 * (TCP, its own TLS handshake upstream, the header forwarded, the answer
 * forwarded). Then close_notify and close, and the next connection.
 *
 *   tls_handshakes --port P --tls CA_FILE [--host H] [--sni NAME]
 *                  [--parallel N] [--seconds T] [--warmup W] [--tls-only]
 *                  [--label TEXT] [--cpu-pid PID] [--other-pid PID]
 *
 * Counts the connections completed in the T seconds after W seconds of
 * warm-up (default 5 and 1), and their set-up times (connect to
 * connection.start). Prints one "RESULT" line (key=value): setups,
 * setups_per_s, p50_ms, p99_ms, errors, resumed (must be 0), tls=VERSION/
 * CIPHER of the last one. With --cpu-pid: that process's utime+stime
 * (/proc/PID/stat) over the counted window, per set-up and as a share of
 * one core. self_cpu_s: this client's own CPU over the same window (it
 * shares the machine: it may be what limits the rate); other_cpu_s: that
 * of --other-pid (e.g. the upstream). Every loop is bounded by time.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include "bench_amqp.h"
#include "bench_tls.h"

#define MAX_PAR 256

enum { S_IDLE, S_CONNECT, S_TLS, S_HEADER, S_START };

typedef struct slot {
  int fd;
  SSL *ssl;
  int state;
  short events;
  uint64_t t0;
  uint8_t in[4096];
  size_t in_len;
} slot;

static SSL_CTX *ctx;
static struct sockaddr_in sa;
static const char *sni = "localhost";
static bool tls_only;
static uint64_t done, errors, resumed, counting_from;
static uint64_t *lat;
static size_t nlat, caplat;
static char tls_desc[96] = "-";
static bool counting;

static void slot_end(slot *s, bool ok) {
  if (s->ssl) {
    if (ok)
      SSL_shutdown(s->ssl); /* close_notify, not waiting for the peer's */
    SSL_free(s->ssl);
  }
  if (s->fd >= 0)
    close(s->fd);
  s->fd = -1;
  s->ssl = NULL;
  s->state = S_IDLE;
  ERR_clear_error();
  if (!ok) {
    if (counting)
      errors++;
    return;
  }
  if (!counting)
    return;
  done++;
  if (nlat == caplat) {
    caplat = caplat ? caplat * 2 : 65536;
    lat = realloc(lat, caplat * sizeof *lat);
    if (!lat)
      exit(1);
  }
  lat[nlat++] = ba_now_ns() - s->t0;
}

static void slot_start(slot *s) {
  s->in_len = 0;
  s->t0 = ba_now_ns();
  s->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (s->fd < 0) {
    slot_end(s, false);
    return;
  }
  int one = 1;
  setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(s->fd, (struct sockaddr *)&sa, sizeof sa) != 0 &&
      errno != EINPROGRESS) {
    slot_end(s, false);
    return;
  }
  s->state = S_CONNECT;
  s->events = POLLOUT;
}

/* What OpenSSL wants next; false when the connection failed. */
static bool want(slot *s, int k) {
  switch (SSL_get_error(s->ssl, k)) {
  case SSL_ERROR_WANT_READ:
    s->events = POLLIN;
    return true;
  case SSL_ERROR_WANT_WRITE:
    s->events = POLLOUT;
    return true;
  default:
    return false;
  }
}

/* Advance a connection as far as it goes without blocking. */
static void slot_step(slot *s) {
  if (s->state == S_CONNECT) {
    int err = 0;
    socklen_t l = sizeof err;
    getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &l);
    if (err || !(s->ssl = bt_client_ssl(ctx, s->fd, sni))) {
      slot_end(s, false);
      return;
    }
    s->state = S_TLS;
  }
  if (s->state == S_TLS) {
    int k = SSL_connect(s->ssl);
    if (k != 1) {
      if (!want(s, k))
        slot_end(s, false);
      return;
    }
    if (SSL_session_reused(s->ssl))
      resumed++;
    snprintf(tls_desc, sizeof tls_desc, "%s", bt_describe(s->ssl));
    if (tls_only) {
      slot_end(s, true);
      return;
    }
    s->state = S_HEADER;
  }
  if (s->state == S_HEADER) {
    int k = SSL_write(s->ssl, ba_protocol_header, 8);
    if (k != 8) {
      if (k > 0 || !want(s, k))
        slot_end(s, false);
      return;
    }
    s->state = S_START;
    s->events = POLLIN;
  }
  if (s->state == S_START) {
    for (;;) {
      int k = SSL_read(s->ssl, s->in + s->in_len, sizeof s->in - s->in_len);
      if (k <= 0) {
        if (!want(s, k))
          slot_end(s, false);
        return;
      }
      s->in_len += (size_t)k;
      ba_frame f;
      long n = ba_frame_parse(s->in, s->in_len, sizeof s->in - 8, &f);
      if (n < 0 || (n > 0 && f.method != BA_MID(10, 10))) {
        slot_end(s, false);
        return;
      }
      if (n > 0) {
        slot_end(s, true);
        return;
      }
    }
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const char *host = "127.0.0.1", *ca = NULL, *label = "-";
  int port = 0, par = 8;
  double seconds = 5, warmup = 1;
  long cpu_pid = 0, other_pid = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--tls-only")) {
      tls_only = true;
      continue;
    }
    if (i + 1 >= argc)
      goto usage;
    const char *v = argv[++i];
    if (!strcmp(a, "--host"))
      host = v;
    else if (!strcmp(a, "--port"))
      port = atoi(v);
    else if (!strcmp(a, "--tls"))
      ca = v;
    else if (!strcmp(a, "--sni"))
      sni = v;
    else if (!strcmp(a, "--parallel"))
      par = atoi(v);
    else if (!strcmp(a, "--seconds"))
      seconds = atof(v);
    else if (!strcmp(a, "--warmup"))
      warmup = atof(v);
    else if (!strcmp(a, "--label"))
      label = v;
    else if (!strcmp(a, "--cpu-pid"))
      cpu_pid = atol(v);
    else if (!strcmp(a, "--other-pid"))
      other_pid = atol(v);
    else
      goto usage;
  }
  sa = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(port)};
  if (!ca || port <= 0 || par < 1 || par > MAX_PAR || seconds <= 0 ||
      seconds > 3600 || warmup < 0 ||
      inet_pton(AF_INET, host, &sa.sin_addr) != 1)
    goto usage;
  signal(SIGPIPE, SIG_IGN);
  if (!(ctx = bt_client_ctx("tls_handshakes", ca)))
    return 1;

  static slot slots[MAX_PAR];
  struct pollfd pfd[MAX_PAR];
  for (int i = 0; i < par; i++)
    slots[i] = (slot){.fd = -1};
  uint64_t t_start = ba_now_ns();
  uint64_t t_count = t_start + (uint64_t)(warmup * 1e9);
  uint64_t t_end = t_count + (uint64_t)(seconds * 1e9);
  double cpu0 = 0, self0 = 0, other0 = 0;
  counting = warmup == 0;
  if (counting && cpu_pid)
    cpu0 = ba_proc_cpu_secs(cpu_pid);
  if (counting && other_pid)
    other0 = ba_proc_cpu_secs(other_pid);
  if (counting)
    self0 = ba_proc_cpu_secs(getpid());
  counting_from = t_start;
  for (;;) {
    uint64_t now = ba_now_ns();
    if (!counting && now >= t_count) {
      counting = true;
      counting_from = now;
      if (cpu_pid)
        cpu0 = ba_proc_cpu_secs(cpu_pid);
      if (other_pid)
        other0 = ba_proc_cpu_secs(other_pid);
      self0 = ba_proc_cpu_secs(getpid());
    }
    if (now >= t_end)
      break;
    for (int i = 0; i < par; i++) {
      /* a slot that ended or failed at once starts again (bounded) */
      for (int k = 0; k < 4 && slots[i].state == S_IDLE; k++)
        slot_start(&slots[i]);
      pfd[i] =
          (struct pollfd){.fd = slots[i].state == S_IDLE ? -1 : slots[i].fd,
                          .events = slots[i].events};
    }
    int n = poll(pfd, (nfds_t)par, 100);
    if (n < 0 && errno != EINTR)
      break;
    for (int i = 0; n > 0 && i < par; i++)
      if (pfd[i].fd >= 0 && pfd[i].revents)
        slot_step(&slots[i]);
  }
  uint64_t t_stop = ba_now_ns();
  double cpu = cpu_pid ? ba_proc_cpu_secs(cpu_pid) - cpu0 : 0;
  double self_cpu = ba_proc_cpu_secs(getpid()) - self0;
  double other_cpu = other_pid ? ba_proc_cpu_secs(other_pid) - other0 : 0;
  counting = false; /* the unfinished ones are not errors */
  for (int i = 0; i < par; i++)
    if (slots[i].state != S_IDLE)
      slot_end(&slots[i], false);
  double secs = (double)(t_stop - counting_from) / 1e9;
  qsort(lat, nlat, sizeof *lat, cmp_u64);
  double p50 = nlat ? (double)lat[nlat / 2] / 1e6 : 0;
  double p99 = nlat ? (double)lat[(size_t)((double)nlat * 0.99)] / 1e6 : 0;
  printf("RESULT mode=%s label=%s status=%s parallel=%d secs=%.3f setups=%llu "
         "setups_per_s=%.1f p50_ms=%.3f p99_ms=%.3f errors=%llu resumed=%llu "
         "tls=%s self_cpu_s=%.2f",
         tls_only ? "tls" : "amqp", label, done ? "ok" : "none", par, secs,
         (unsigned long long)done, secs > 0 ? (double)done / secs : 0, p50, p99,
         (unsigned long long)errors, (unsigned long long)resumed, tls_desc,
         self_cpu);
  if (cpu_pid)
    printf(" cpu_pid=%ld cpu_secs=%.2f cpu_ms_per_setup=%.4f core_util=%.2f",
           cpu_pid, cpu, done ? cpu * 1000 / (double)done : 0,
           secs > 0 ? cpu / secs : 0);
  if (other_pid)
    printf(" other_pid=%ld other_cpu_s=%.2f", other_pid, other_cpu);
  printf("\n");
  free(lat);
  SSL_CTX_free(ctx);
  return done ? 0 : 1;

usage:
  fprintf(stderr, "usage: tls_handshakes --port P --tls CA_FILE [--host H] "
                  "[--sni NAME] [--parallel N] [--seconds T] [--warmup W] "
                  "[--tls-only] [--label TEXT] [--cpu-pid PID] "
                  "[--other-pid PID]\n");
  return 2;
}
