/* admin_harness.c - px_admin with a fixed router, for test_admin_http.py.
 *
 *   admin_harness [--host H] [--port N] [--max-conns N] [--timeout-ms N]
 *                 [--debug]
 *
 * Prints "port=N" on stdout once listening; exits 0 after SIGTERM/SIGINT
 * once every admin handle is closed, 1 if it cannot listen.
 *
 * Routes (GET, and HEAD as GET):
 *   /ok -> "ok\n"; /big -> BIG_SIZE bytes, one letter per 4 KiB block
 *   ('a', 'b', ...);
 *   /method-check -> 200 for GET, 405 with Allow otherwise;
 *   /conns -> the open admin connection count;
 *   /count -> "routed=N": requests routed before, /count and /stats not
 *   counted;
 *   /stats -> "evicted=N refused=N streams=N slices=N max_per_iteration=N
 *   max_slices_per_iteration=N": evicted and refused connections, producer
 *   states alive, slices produced, the most requests routed and the most
 *   slices produced between two polls for I/O, i.e. in one loop iteration
 *   (/count and /stats not counted);
 *   /stream -> streamed: "begin\n", STREAM_SLICES slices of PX_ADMIN_SLICE
 *   bytes (slice i all 'a' + i % 26), then an empty last slice;
 *   /stream-small -> streamed: "<" then slices "1\n", "2\n", "3\n" (last);
 *   /stream-fail -> streamed: "begin\n", one slice "x\n", then a failing
 *   one;
 *   /echo -> "query=Q authorization=A origin=O host=H fetch=F": the
 *   request's query string and kept headers as the router saw them;
 *   /deferred -> answered "deferred N\n" (N: deferred answers pending)
 *   50 ms later, from a timer (px_admin_defer);
 *   /deferred-never -> deferred and never answered: only the connection
 *   going away (cancel) ends it; /stats counts them in waiting=N;
 *   anything else -> 404.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "px_admin.h"
#include "px_log.h"

#define BIG_SIZE (2u * 1024 * 1024)
#define STREAM_SLICES 320 /* 20 MiB: more than one body may be */

typedef struct harness {
  uv_loop_t *loop;
  px_admin admin;
  uv_signal_t sigterm, sigint;
  int stopped;
  uint64_t routed;       /* requests routed, /count and /stats excluded */
  unsigned streams;      /* producer states not yet released */
  uint64_t slices;       /* produced by every stream */
  uv_check_t check;      /* runs after each poll for I/O */
  uint64_t routed_now;   /* requests routed since the last poll */
  uint64_t max_per_iter; /* the most routed between two polls */
  uint64_t slices_now;   /* slices produced since the last poll */
  uint64_t max_slices;   /* the most produced between two polls */
  unsigned waiting;      /* deferred answers not yet sent or cancelled */
} harness;

/* A deferred answer: a timer resumes it (or nothing, for /deferred-never);
 * cancel or the answer frees it. */
typedef struct deferred {
  harness *h;
  uv_timer_t timer;
  px_admin_response *resp;
  bool timer_on;
} deferred;

static void on_deferred_closed(uv_handle_t *t) {
  free(t->data);
}

static void deferred_end(deferred *d) {
  d->h->waiting--;
  if (d->timer_on)
    uv_close((uv_handle_t *)&d->timer, on_deferred_closed);
  else
    free(d);
}

static void deferred_cancel(void *state) {
  deferred_end(state);
}

static void on_deferred_timer(uv_timer_t *t) {
  deferred *d = t->data;
  px_admin_printf(d->resp, "deferred %u\n", d->h->waiting);
  px_admin_resume(d->resp);
  deferred_end(d);
}

static void route_deferred(harness *h, px_admin_response *r, bool answer) {
  deferred *d = calloc(1, sizeof *d);
  if (!d) {
    r->status = 500;
    return;
  }
  d->h = h;
  d->resp = r;
  h->waiting++;
  px_admin_defer(r, deferred_cancel, d);
  if (!answer)
    return;
  d->timer_on = true;
  uv_timer_init(h->loop, &d->timer);
  d->timer.data = d;
  uv_timer_start(&d->timer, on_deferred_timer, 50, 0);
}

enum stream_kind { STREAM_BIG, STREAM_SMALL, STREAM_FAIL };

typedef struct stream {
  harness *h;
  enum stream_kind kind;
  unsigned next; /* slices produced */
} stream;

static void stream_release(void *arg) {
  stream *st = arg;
  st->h->streams--;
  free(st);
}

static bool stream_produce(void *arg, px_admin_response *r) {
  stream *st = arg;
  unsigned i = st->next++;
  st->h->slices++;
  if (++st->h->slices_now > st->h->max_slices)
    st->h->max_slices = st->h->slices_now;
  if (st->kind == STREAM_SMALL) {
    px_admin_printf(r, "%u\n", i + 1);
    return i + 1 < 3;
  }
  if (st->kind == STREAM_FAIL) {
    if (i == 0)
      return px_admin_append(r, "x\n", 2) == 0;
    px_admin_append(r, "never sent", PX_ADMIN_MAX_RESPONSE + 1); /* fails */
    return true;
  }
  if (i == STREAM_SLICES)
    return false; /* an empty last slice */
  char block[4096];
  memset(block, 'a' + (int)(i % 26), sizeof block);
  for (unsigned k = 0; k < PX_ADMIN_SLICE / sizeof block; k++)
    px_admin_append(r, block, sizeof block);
  return true;
}

static void route_stream(harness *h, enum stream_kind kind,
                         px_admin_response *r) {
  stream *st = malloc(sizeof *st);
  if (st) {
    *st = (stream){.h = h, .kind = kind};
    h->streams++;
  }
  px_admin_stream(r, stream_produce, stream_release, st);
  px_admin_printf(r, kind == STREAM_SMALL ? "<" : "begin\n");
}

static void route_blocks(px_admin_response *r, size_t size) {
  char block[4096];
  r->content_type = "application/octet-stream";
  for (unsigned i = 0; i < size / sizeof block; i++) {
    memset(block, 'a' + (int)(i % 26), sizeof block);
    px_admin_append(r, block, sizeof block);
  }
}

static void route(void *ctx, const px_admin_request *req,
                  px_admin_response *r) {
  harness *h = ctx;
  const char *method = req->method, *path = req->path;
  bool get = strcmp(method, "GET") == 0;

  if (get && strcmp(path, "/count") == 0) {
    px_admin_printf(r, "routed=%llu\n", (unsigned long long)h->routed);
    return;
  }
  if (get && strcmp(path, "/stats") == 0) {
    px_admin_printf(r,
                    "evicted=%llu refused=%llu streams=%u slices=%llu "
                    "max_per_iteration=%llu max_slices_per_iteration=%llu "
                    "waiting=%u\n",
                    (unsigned long long)h->admin.stats.conns_evicted,
                    (unsigned long long)h->admin.stats.conns_refused,
                    h->streams, (unsigned long long)h->slices,
                    (unsigned long long)h->max_per_iter,
                    (unsigned long long)h->max_slices, h->waiting);
    return;
  }
  h->routed++;
  if (++h->routed_now > h->max_per_iter)
    h->max_per_iter = h->routed_now;
  if (get && strcmp(path, "/ok") == 0) {
    px_admin_append(r, "ok\n", 3);
  } else if (get && strcmp(path, "/big") == 0) {
    route_blocks(r, BIG_SIZE);
  } else if (get && strcmp(path, "/stream") == 0) {
    route_stream(h, STREAM_BIG, r);
  } else if (get && strcmp(path, "/stream-small") == 0) {
    route_stream(h, STREAM_SMALL, r);
  } else if (get && strcmp(path, "/stream-fail") == 0) {
    route_stream(h, STREAM_FAIL, r);
  } else if (strcmp(path, "/method-check") == 0) {
    if (get) {
      px_admin_printf(r, "method %s\n", method);
    } else {
      r->status = 405;
      px_admin_header(r, "Allow", "GET, HEAD");
      px_admin_printf(r, "method %s not allowed\n", method);
    }
  } else if (get && strcmp(path, "/echo") == 0) {
    px_admin_printf(r, "query=%s authorization=%s origin=%s host=%s fetch=%s\n",
                    req->query, req->authorization, req->origin, req->host,
                    req->sec_fetch_site);
  } else if (get && strcmp(path, "/deferred") == 0) {
    route_deferred(h, r, true);
  } else if (get && strcmp(path, "/deferred-never") == 0) {
    route_deferred(h, r, false);
  } else if (get && strcmp(path, "/conns") == 0) {
    px_admin_printf(r, "%u\n", px_admin_connections(&h->admin));
  } else {
    r->status = 404;
    px_admin_printf(r, "not found\n");
  }
}

static void on_check(uv_check_t *check) {
  harness *h = check->data;
  h->routed_now = 0;
  h->slices_now = 0;
}

static void on_stopped(void *arg) {
  harness *h = arg;
  h->stopped = 1;
  px_info("harness_stopped", PX_U("conns", px_admin_connections(&h->admin)),
          PX_U("streams", h->streams), PX_U("waiting", h->waiting));
}

static void on_signal(uv_signal_t *sig, int signum) {
  harness *h = sig->data;
  px_info("harness_signal", PX_I("signal", signum),
          PX_U("conns", px_admin_connections(&h->admin)));
  uv_close((uv_handle_t *)&h->sigterm, NULL);
  uv_close((uv_handle_t *)&h->sigint, NULL);
  uv_close((uv_handle_t *)&h->check, NULL);
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
            "[--timeout-ms N] [--debug]\n",
            argv[0]);
    return 2;
  }

  signal(SIGPIPE, SIG_IGN); /* as rebound does: a failed write is an error */
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
  uv_check_init(h.loop, &h.check);
  h.check.data = &h;
  uv_check_start(&h.check, on_check);
  uv_unref((uv_handle_t *)&h.check);

  uv_run(h.loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(h.loop);
  if (rc != 0 || !h.stopped) {
    fprintf(stderr, "loop_close=%s stopped=%d\n", uv_strerror(rc), h.stopped);
    return 1;
  }
  return 0;
}
