/* admin_harness.c - px_admin with a fixed router, for test_admin_http.py.
 *
 *   admin_harness [--host H] [--port N] [--max-conns N] [--timeout-ms N]
 *                 [--max-output N] [--debug]
 *
 * Prints "port=N" on stdout once listening; exits 0 after SIGTERM/SIGINT
 * once every admin handle is closed, 1 if it cannot listen.
 *
 * Routes: GET /ok -> 200 "ok\n"; GET /big -> 200, BIG_SIZE bytes;
 * /method-check -> 200 for GET, 405 with Allow otherwise; GET /conns ->
 * the open admin connection count; anything else -> 404.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "px_admin.h"
#include "px_log.h"

#define BIG_SIZE (2u * 1024 * 1024)

typedef struct harness {
  uv_loop_t *loop;
  px_admin admin;
  uv_signal_t sigterm, sigint;
  int stopped;
} harness;

static void route(void *ctx, const char *method, const char *path,
                  px_admin_response *r) {
  harness *h = ctx;
  bool get = strcmp(method, "GET") == 0;
  char chunk[4096];

  if (get && strcmp(path, "/ok") == 0) {
    px_admin_append(r, "ok\n", 3);
  } else if (get && strcmp(path, "/big") == 0) {
    r->content_type = "application/octet-stream";
    for (unsigned i = 0; i < BIG_SIZE / sizeof chunk; i++) {
      memset(chunk, 'a' + (int)(i % 26), sizeof chunk);
      px_admin_append(r, chunk, sizeof chunk);
    }
  } else if (strcmp(path, "/method-check") == 0) {
    if (get) {
      px_admin_printf(r, "method %s\n", method);
    } else {
      r->status = 405;
      px_admin_header(r, "Allow", "GET, HEAD");
      px_admin_printf(r, "method %s not allowed\n", method);
    }
  } else if (get && strcmp(path, "/conns") == 0) {
    px_admin_printf(r, "%u\n", px_admin_connections(&h->admin));
  } else {
    r->status = 404;
    px_admin_printf(r, "not found\n");
  }
}

static void on_stopped(void *arg) {
  harness *h = arg;
  h->stopped = 1;
  px_info("harness_stopped", "conns=%u", px_admin_connections(&h->admin));
}

static void on_signal(uv_signal_t *sig, int signum) {
  harness *h = sig->data;
  px_info("harness_signal", "signal=%d conns=%u", signum,
          px_admin_connections(&h->admin));
  uv_close((uv_handle_t *)&h->sigterm, NULL);
  uv_close((uv_handle_t *)&h->sigint, NULL);
  px_admin_stop(&h->admin, on_stopped, h);
}

/* Parse argv[*i + 1] as a number into *out; -1 if missing or not one. */
static int arg_num(int argc, char **argv, int *i, unsigned long long *out) {
  char *end;
  if (*i + 1 >= argc)
    return -1;
  *out = strtoull(argv[++*i], &end, 10);
  return *end ? -1 : 0;
}

static int parse_args(int argc, char **argv, const char **host,
                      unsigned long long *port, px_admin_limits *l) {
  unsigned long long v = 0;
  for (int i = 1; i < argc; i++) {
    const char *opt = argv[i];
    if (strcmp(opt, "--debug") == 0)
      px_log_set_level(PX_LOG_DEBUG);
    else if (strcmp(opt, "--host") == 0 && i + 1 < argc)
      *host = argv[++i];
    else if (arg_num(argc, argv, &i, &v) < 0)
      return -1;
    else if (strcmp(opt, "--port") == 0 && v <= 65535)
      *port = v;
    else if (strcmp(opt, "--max-conns") == 0)
      l->max_conns = (unsigned)v;
    else if (strcmp(opt, "--timeout-ms") == 0)
      l->timeout_ms = v;
    else if (strcmp(opt, "--max-output") == 0)
      l->max_output = (size_t)v;
    else
      return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  harness h = {.loop = uv_default_loop()};
  px_admin_limits limits = {0};
  const char *host = "127.0.0.1";
  unsigned long long port = 0;

  if (parse_args(argc, argv, &host, &port, &limits) < 0) {
    fprintf(stderr,
            "usage: %s [--host H] [--port N] [--max-conns N] "
            "[--timeout-ms N] [--max-output N] [--debug]\n",
            argv[0]);
    return 2;
  }

  int rc = px_admin_start(&h.admin, h.loop, host, (uint16_t)port, route, &h);
  if (rc < 0) {
    uv_run(h.loop, UV_RUN_DEFAULT); /* let the listener's close finish */
    uv_loop_close(h.loop);
    return 1;
  }
  px_admin_set_limits(&h.admin, &limits);

  struct sockaddr_storage ss;
  int len = sizeof ss;
  uv_tcp_getsockname(&h.admin.listener, (struct sockaddr *)&ss, &len);
  printf("port=%u\n", ntohs(((struct sockaddr_in *)&ss)->sin_port));
  fflush(stdout);

  uv_signal_init(h.loop, &h.sigterm);
  uv_signal_init(h.loop, &h.sigint);
  h.sigterm.data = h.sigint.data = &h;
  uv_signal_start(&h.sigterm, on_signal, SIGTERM);
  uv_signal_start(&h.sigint, on_signal, SIGINT);

  uv_run(h.loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(h.loop);
  if (rc != 0 || !h.stopped) {
    fprintf(stderr, "loop_close=%s stopped=%d\n", uv_strerror(rc), h.stopped);
    return 1;
  }
  return 0;
}
