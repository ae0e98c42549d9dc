/* idle_conns - open many AMQP connections and keep them idle.
 *
 * Every connection does the full handshake (protocol header, start-ok with
 * PLAIN, tune-ok with heartbeat 0 by default, open, open-ok) and, with
 * --channel, opens channel 1; then it sits there. Connections advance in
 * lockstep batches of --batch (blocking sockets, 10 s receive timeout).
 *
 *   idle_conns [--host H] [--port P] [--count N] [--checkpoints A,B,...]
 *              [--batch B] [--channel] [--heartbeat S] [--hold S]
 *              [--tls CA_FILE] [--sni NAME]
 *
 * At each checkpoint (number of open connections; the last is --count) it
 * prints "OPEN <n>" and waits for a line on stdin before going on; after
 * the last one it waits for a line or EOF, then closes everything. A wait
 * never lasts longer than --hold seconds (default 120).
 *
 * --tls CA_FILE: each connection first does a full TLS handshake (OpenSSL),
 * verifying the server against CA_FILE and --sni NAME (default localhost),
 * then the AMQP handshake over TLS.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "bench_amqp.h"
#include "bench_tls.h"

static void fail(const char *what, long i) {
  fprintf(stderr, "idle_conns: %s (connection %ld): %s\n", what, i,
          strerror(errno));
  printf("FAILED %ld\n", i);
  fflush(stdout);
  exit(1);
}

static int wait_line(double hold) {
  struct pollfd p = {.fd = 0, .events = POLLIN};
  if (poll(&p, 1, (int)(hold * 1000)) <= 0)
    return -1;
  char line[64];
  return read(0, line, sizeof line) > 0 ? 0 : -1;
}

int main(int argc, char **argv) {
  const char *host = "127.0.0.1", *checkpoints = "";
  const char *tls_ca = NULL, *sni = "localhost";
  SSL_CTX *tls_ctx = NULL;
  int port = 5672, batch = 50, heartbeat = 0;
  long count = 1000;
  double hold = 120;
  bool channel = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--channel")) {
      channel = true;
      continue;
    }
    if (i + 1 >= argc)
      goto usage;
    const char *v = argv[++i];
    if (!strcmp(a, "--host"))
      host = v;
    else if (!strcmp(a, "--port"))
      port = atoi(v);
    else if (!strcmp(a, "--count"))
      count = atol(v);
    else if (!strcmp(a, "--checkpoints"))
      checkpoints = v;
    else if (!strcmp(a, "--batch"))
      batch = atoi(v);
    else if (!strcmp(a, "--heartbeat"))
      heartbeat = atoi(v);
    else if (!strcmp(a, "--hold"))
      hold = atof(v);
    else if (!strcmp(a, "--tls"))
      tls_ca = v;
    else if (!strcmp(a, "--sni"))
      sni = v;
    else
      goto usage;
  }
  if (count < 1 || count > 100000 || batch < 1)
    goto usage;
  if (tls_ca && !(tls_ctx = bt_client_ctx("idle_conns", tls_ca)))
    return 1;

  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < (rlim_t)count + 64) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  ba_reader **rs = calloc((size_t)count, sizeof *rs);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  if (!rs || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
    goto usage;

  const char *cp = checkpoints;
  long next_cp = *cp ? atol(cp) : count;
  uint64_t t0 = ba_now_ns();
  for (long base = 0; base < count;) {
    long n = batch;
    if (n > count - base)
      n = count - base;
    if (base + n > next_cp)
      n = next_cp - base;
    for (long i = base; i < base + n; i++) {
      ba_reader *r = rs[i] = malloc(sizeof *r);
      struct timeval tv = {10, 0};
      int one = 1;
      if (!r)
        fail("malloc", i);
      r->start = r->end = 0;
      r->ssl = NULL;
      r->fd = socket(AF_INET, SOCK_STREAM, 0);
      if (r->fd < 0)
        fail("socket", i);
      setsockopt(r->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      setsockopt(r->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      setsockopt(r->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (connect(r->fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        fail("connect", i);
      if (tls_ctx && !(r->ssl = bt_connect("idle_conns", tls_ctx, r->fd, sni)))
        fail("TLS handshake", i);
      if (ba_hs_header(r) != 0)
        fail("protocol header", i);
    }
    for (long i = base; i < base + n; i++)
      if (ba_hs_start_ok(rs[i], "guest", "guest") != 0)
        fail("start/start-ok", i);
    for (long i = base; i < base + n; i++)
      if (ba_hs_tune_open(rs[i], "/", (uint16_t)heartbeat) != 0)
        fail("tune/open", i);
    for (long i = base; i < base + n; i++)
      if (ba_hs_open_ok(rs[i]) != 0 || (channel && ba_channel_open(rs[i], 1)))
        fail("open-ok", i);
    if (channel) {
      ba_frame f;
      for (long i = base; i < base + n; i++)
        if (ba_expect(rs[i], 1, BA_MID(20, 11), &f) != 0)
          fail("channel.open-ok", i);
    }
    base += n;
    if (base == next_cp) {
      printf("OPEN %ld secs=%.2f\n", base, (double)(ba_now_ns() - t0) / 1e9);
      fflush(stdout);
      if (base < count && wait_line(hold) != 0)
        break;
      const char *comma = strchr(cp, ',');
      cp = comma ? comma + 1 : "";
      next_cp = *cp ? atol(cp) : count;
      if (next_cp <= base || next_cp > count)
        next_cp = count;
    }
  }
  wait_line(hold);
  for (long i = 0; i < count; i++)
    if (rs[i]) {
      SSL_free(rs[i]->ssl);
      close(rs[i]->fd);
      free(rs[i]);
    }
  free(rs);
  return 0;

usage:
  fprintf(stderr, "usage: idle_conns [--host H] [--port P] [--count N] "
                  "[--checkpoints A,B,...] [--batch B] [--channel] "
                  "[--heartbeat S] [--hold S] [--tls CA_FILE] [--sni NAME]\n");
  return 2;
}
