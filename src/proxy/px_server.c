/* px_server.c - the listener and admission of clients, the readiness
 * probe, signals, reload and shutdown.
 *
 * Every handle here is closed exactly once, by one owner: the listener by
 * the SIGTERM handler or a reload that replaces it (else px_server_stop),
 * the probe's connection and dialer by the probe (px_probe.h), a round
 * under way ended by px_server_stop, the timers by px_server_stop, the
 * signal handlers by px_server_close. A refused client's socket is closed
 * where it is accepted.
 */
#define _DEFAULT_SOURCE /* SO_REUSEPORT */
#include "px_server.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "px_buf.h"
#include "px_dlq_http.h"
#include "px_log.h"
#include "px_metrics.h"
#include "px_resolve.h"
#include "px_routes.h"
#include "px_session.h"
#include "px_tls.h"
#include "px_view.h"
#include "px_watch.h"
#include "px_workers.h"

#define PX_PROBE_INTERVAL_MS 2000
/* File descriptors a client connection takes: its socket and its
 * upstream's, and with retry_connection separate the retry connection's. */
static unsigned fds_per_connection(const px_config *cfg) {
  return cfg->retry_shared ? 2 : 3;
}
/* Free descriptors wanted to take a client: its upstream socket, the
 * readiness probe's and one for libuv to accept the next client with. Out
 * of descriptors, libuv accepts and closes clients without telling
 * rebound; keeping these free, rebound refuses (and counts) them itself. */
#define PX_ACCEPT_HEADROOM 3
/* Descriptors "auto" leaves out of the connection cap besides those open
 * at start: the admin endpoint's connections (px_admin's cap) and a few
 * for the probe, name lookups and refusing a client. */
#define PX_ADMIN_FDS 64
#define PX_FD_SLACK 16

/* ---- admission ----------------------------------------------------------- */

static void accept_error(px_server *srv, int err) {
  uint64_t unlogged;
  srv->stats.accept_errors++;
  if (px_log_limit_pass(&srv->accept_log, uv_now(srv->loop), &unlogged))
    px_warn("accept_failed", PX_S("error", uv_strerror(err)),
            PX_U("accept_errors", srv->stats.accept_errors),
            PX_U("unlogged", unlogged));
}

static void on_refused_closed(uv_handle_t *h) {
  px_server *srv = h->data;
  if (h == (uv_handle_t *)&srv->refuse_tcp)
    srv->refuse_tcp_busy = false;
  else
    free(h);
}

/* Take the client libuv has accepted, if no session took it, and close its
 * socket at once. (Until the accepted socket is taken, libuv accepts no
 * other client.) */
static void close_pending(px_server *srv, uv_stream_t *listener) {
  uv_tcp_t *t = malloc(sizeof *t);
  if (!t && !srv->refuse_tcp_busy) {
    t = &srv->refuse_tcp;
    srv->refuse_tcp_busy = true;
  }
  if (!t)
    return;
  uv_tcp_init(srv->loop, t); /* no socket yet: cannot fail */
  t->data = srv;
  (void)uv_accept(listener, (uv_stream_t *)t);
  uv_close((uv_handle_t *)t, on_refused_closed);
}

static void refuse_over_cap(px_server *srv, uv_stream_t *listener) {
  uint64_t unlogged;
  close_pending(srv, listener);
  srv->stats.connections_refused++;
  if (px_log_limit_pass(&srv->refused_log, uv_now(srv->loop), &unlogged))
    px_warn("client_connections_refused",
            PX_U("max_connections", srv->max_connections),
            PX_U("connections", srv->stats.sessions_current),
            PX_U("refused_total", srv->stats.connections_refused),
            PX_U("unlogged", unlogged));
}

/* 0 when PX_ACCEPT_HEADROOM more file descriptors can be opened now, else
 * UV_EMFILE or UV_ENFILE. */
static int check_fd_headroom(px_server *srv) {
  int fds[PX_ACCEPT_HEADROOM], got = 0, rc = 0;
  if (srv->spare_fd < 0)
    return 0; /* cannot tell */
  while (got < PX_ACCEPT_HEADROOM &&
         (fds[got] = fcntl(srv->spare_fd, F_DUPFD_CLOEXEC, 0)) >= 0)
    got++;
  if (got < PX_ACCEPT_HEADROOM && (errno == EMFILE || errno == ENFILE))
    rc = uv_translate_sys_error(errno);
  for (int i = 0; i < got; i++)
    close(fds[i]);
  return rc;
}

static void on_connection(uv_stream_t *listener, int status) {
  px_server *srv = listener->data;
  if (status < 0) {
    accept_error(srv, status);
    return;
  }
  if (srv->stats.sessions_current >= srv->max_connections) {
    refuse_over_cap(srv, listener);
    return;
  }
  int rc = check_fd_headroom(srv);
  if (rc < 0) {
    close_pending(srv, listener);
    accept_error(srv, rc);
    return;
  }
  rc = px_session_accept(
      srv, listener,
      (uv_tcp_t *)listener == srv->tls_listener ? srv->tls_server : NULL);
  if (rc < 0) {
    close_pending(srv, listener);
    accept_error(srv, rc);
  }
}

/* The connection cap under `cfg`: its max_connections, or under "auto"
 * what the file descriptor limit leaves for clients. Logged when it
 * differs from `prev`, with a warning when a configured number cannot fit
 * in the descriptors (then clients past the limit are refused as accept
 * errors). */
static uint32_t connection_limit(const px_server *srv, const px_config *cfg,
                                 uint32_t prev) {
  struct rlimit rl;
  uint64_t fds =
      getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
          ? (uint64_t)rl.rlim_cur
          : UINT64_MAX;
  unsigned per = fds_per_connection(cfg);
  uint64_t fit =
      fds > srv->fd_reserve + per ? (fds - srv->fd_reserve) / per : 1;
  if (fit > PX_MAX_CONNECTIONS_LIMIT)
    fit = PX_MAX_CONNECTIONS_LIMIT;
  uint32_t n = cfg->max_connections
                   ? (uint32_t)px_workers_share(srv, cfg->max_connections)
                   : (uint32_t)fit;
  if (n == prev)
    return n;
  px_info("connection_limit", PX_U("max_connections", n),
          PX_BOOL("auto", cfg->max_connections == 0), PX_U("fd_limit", fds));
  if (n > fit)
    px_warn("max_connections_over_fd_limit", PX_U("max_connections", n),
            PX_U("fd_limit", fds), PX_U("fits", fit));
  return n;
}

/* ---- shutdown ------------------------------------------------------------ */

static void end_client_wait(px_server *srv, const char *why);

static void stop_loop_if_done(px_server *srv) {
  if (srv->client_wait && !srv->sessions && !px_workers_running(srv)) {
    end_client_wait(srv, "no clients left"); /* comes back here */
    return;
  }
  if (srv->draining && !srv->sessions && !srv->dlq_list &&
      !px_workers_running(srv)) {
    px_server_stop(srv);
    uv_stop(srv->loop);
  }
}

static void session_gone(px_server *srv) {
  stop_loop_if_done(srv);
}

static void dlq_op_done(px_server *srv) {
  stop_loop_if_done(srv);
}

/* Worker 0 gone (drain, as on SIGTERM), or a worker exited while
 * draining (the drain may be over). */
static void worker_event(px_server *srv, px_workers_event ev) {
  if (ev == PX_WORKERS_PARENT_GONE)
    px_server_drain(srv, SIGTERM);
  else
    stop_loop_if_done(srv);
}

int px_server_start_workers(px_server *srv, char **argv) {
  return px_workers_start(srv, argv, worker_event);
}

/* The drain timeout: sessions are closed; admin dead-letter operations
 * stop taking messages and get PX_DLQ_STOP_MS to settle the copies in
 * flight (then this runs again and cuts them off); workers still running
 * are killed PX_WORKERS_KILL_MS later. The last of them ends the loop. */
static void on_drain_timeout(uv_timer_t *t) {
  px_server *srv = t->data;
  if (srv->drain_expired) { /* the operations' time is up too */
    px_warn("dlq_stop_timeout",
            PX_U("operations_left", px_dlq_http_running(srv)),
            PX_U("timeout_ms", PX_DLQ_STOP_MS));
    px_dlq_http_stop_all(srv, true);
    return;
  }
  uint64_t n = srv->stats.sessions_current;
  px_warn("drain_timeout", PX_U("sessions_left", n),
          PX_U("dlq_operations_left", px_dlq_http_running(srv)),
          PX_U("timeout_ms", srv->cfg->drain_timeout_ms));
  srv->drain_expired = true;
  while (srv->sessions)
    px_session_close(srv->sessions, PX_CR_DRAIN_TIMEOUT);
  if (px_workers_running(srv)) /* each has its own drain timeout */
    px_workers_deadline(srv);
  if (srv->dlq_list) {
    uv_timer_start(&srv->drain_timer, on_drain_timeout, PX_DLQ_STOP_MS, 0);
    px_dlq_http_stop_all(srv, false);
    if (!srv->dlq_list && !srv->stopped) /* all ended at once */
      uv_timer_stop(&srv->drain_timer);
    return;
  }
  stop_loop_if_done(srv);
}

/* ---- readiness: is an upstream reachable? ------------------------------- */

/* A probe round's answer (px_probe.h). */
static void probe_result(void *ctx, bool ok, const char *why) {
  px_server *srv = ctx;
  if (ok) {
    srv->upstream_ok = true;
    srv->probe_warned = false;
    srv->upstream_err[0] = '\0';
    return;
  }
  if (!srv->probe_warned)
    px_warn("readiness_probe_failed", PX_S("error", why));
  srv->probe_warned = true;
  srv->upstream_ok = false;
  snprintf(srv->upstream_err, sizeof srv->upstream_err, "%s", why);
}

/* A round on every tick, from start-up, as a client would connect. */
static void on_probe_timer(uv_timer_t *t) {
  px_server *srv = t->data;
  if (srv->draining || srv->stopped)
    return;
  px_probe_run(&srv->probe, srv->loop, &srv->clock, srv->cfg, &srv->dial_memory,
               srv->tls_upstream, probe_result, srv);
}

/* Stuck deliveries and processing timeouts, also while --drain-client-wait
 * lets the clients work on; not once they are told to go. */
/* Retries at info, as a summary: at most one line per PX_LOG_LIMIT_MS,
 * with the copies confirmed into tiers and dead-letter queues since the
 * last one (each copy has its own line at debug; each dead letter at
 * info). */
static void log_retry_summary(px_server *srv) {
  uint64_t now = uv_now(srv->loop);
  uint64_t r = srv->stats.retried_total, d = srv->stats.dead_lettered_total;
  if (now - srv->summary.at_ms < PX_LOG_LIMIT_MS ||
      (r == srv->summary.retried && d == srv->summary.dead_lettered))
    return;
  px_info("retry_summary", PX_U("retried", r - srv->summary.retried),
          PX_U("dead_lettered", d - srv->summary.dead_lettered),
          PX_U("since_ms", now - srv->summary.at_ms), PX_U("retried_total", r),
          PX_U("dead_lettered_total", d));
  srv->summary.at_ms = now;
  srv->summary.retried = r;
  srv->summary.dead_lettered = d;
}

static void on_janitor(uv_timer_t *t) {
  px_server *srv = t->data;
  log_retry_summary(srv); /* the drain's last copies too */
  if ((srv->draining && !srv->client_wait) || srv->stopped)
    return;
  px_view_check(srv);
  px_watch_tick(srv, uv_now(srv->loop));
  for (px_session *s = srv->sessions, *next; s; s = next) {
    next = px_session_next(s);
    px_session_tick(s, srv->shortest_timeout_ms);
  }
}

static void on_listener_closed(uv_handle_t *h) {
  free(h);
}

static void close_listener(uv_tcp_t **l) {
  if (*l) {
    uv_close((uv_handle_t *)*l, on_listener_closed);
    *l = NULL;
  }
}

void px_server_stop(px_server *srv) {
  if (srv->stopped)
    return;
  srv->stopped = true;
  close_listener(&srv->listener);
  close_listener(&srv->tls_listener);
  uv_close((uv_handle_t *)&srv->drain_timer, NULL);
  uv_close((uv_handle_t *)&srv->probe_timer, NULL);
  uv_close((uv_handle_t *)&srv->janitor_timer, NULL);
  px_probe_stop(&srv->probe);
  px_watch_free(srv);
  px_workers_stop(srv); /* answers the admin requests waiting for workers */
  if (srv->admin_on) {
    srv->admin_on = false;
    px_admin_stop(&srv->admin, NULL, NULL);
  }
}

/* ---- signals ------------------------------------------------------------- */

static void signal_ignored(int signum, const char *reason) {
  px_info("signal_ignored", PX_I("signal", signum), PX_S("reason", reason));
}

static void on_signal(uv_signal_t *sig, int signum) {
  px_server_drain(sig->data, signum);
}

/* Every session is told to go (connection.close 320); they get the drain
 * timeout for it. */
static void tell_sessions(px_server *srv) {
  for (px_session *s = srv->sessions, *next; s; s = next) {
    next = px_session_next(s); /* draining may unlink s */
    px_session_drain(s);
  }
  uv_timer_start(&srv->drain_timer, on_drain_timeout,
                 srv->cfg->drain_timeout_ms, 0);
  stop_loop_if_done(srv);
}

/* --drain-client-wait is over: its time is up, a second signal came, or
 * every client (of every worker) has left. */
static void end_client_wait(px_server *srv, const char *why) {
  srv->client_wait = false;
  uv_timer_stop(&srv->drain_timer);
  px_info("drain_client_wait_over", PX_S("reason", why),
          PX_U("sessions_left", srv->stats.sessions_current),
          PX_U("client_wait_ms", srv->cfg->drain_client_wait_ms));
  tell_sessions(srv);
}

static void on_client_wait_over(uv_timer_t *t) {
  end_client_wait(t->data, "timeout");
}

void px_server_drain(px_server *srv, int signum) {
  if (srv->draining && srv->client_wait) { /* tell them now */
    px_workers_signal(srv, signum);
    end_client_wait(srv, "second signal");
    return;
  }
  if (srv->draining) {
    signal_ignored(signum, "already draining");
    return;
  }
  srv->draining = true;
  px_workers_signal(srv, signum);
  px_info("shutdown", PX_I("signal", signum),
          PX_U("sessions", srv->stats.sessions_current),
          PX_U("client_wait_ms", srv->cfg->drain_client_wait_ms),
          PX_U("drain_timeout_ms", srv->cfg->drain_timeout_ms));
  close_listener(&srv->listener);
  close_listener(&srv->tls_listener);
  if (srv->cfg->drain_client_wait_ms &&
      (srv->sessions || px_workers_running(srv))) {
    /* the clients' own shutdown first (the workers wait too) */
    srv->client_wait = true;
    uv_timer_start(&srv->drain_timer, on_client_wait_over,
                   srv->cfg->drain_client_wait_ms, 0);
    return;
  }
  tell_sessions(srv);
}

/* SIGUSR1 reopens --log-file (each worker its own); without one, and for
 * SIGUSR2, the signal is logged and ignored. */
static void on_sigusr(uv_signal_t *sig, int signum) {
  px_server *srv = sig->data;
  const char *path = srv->cfg->log_file;
  if (signum != SIGUSR1 || !path[0]) {
    signal_ignored(signum, signum == SIGUSR1 ? "no --log-file to reopen"
                                             : "no action for this signal");
    return;
  }
  px_workers_signal(srv, signum);
  int err = px_log_open_file(path);
  if (err)
    px_error("log_reopen_failed", PX_S("file", path),
             PX_S("error", strerror(err)),
             PX_S("action", "logging to the file open before"));
  else
    px_info("log_reopened", PX_S("file", path));
}

/* Whether `sa` can be bound by a socket without SO_REUSEPORT: with it, a
 * second rebound would otherwise share the port with the first instead of
 * failing as it does with one worker. 0 or a negative libuv error. */
static int probe_port(const struct sockaddr *sa) {
  int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0), rc = 0;
  int one = 1;
  if (fd < 0)
    return uv_translate_sys_error(errno);
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t len = sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                            : sizeof(struct sockaddr_in);
  if (bind(fd, sa, len) != 0)
    rc = uv_translate_sys_error(errno);
  close(fd);
  return rc;
}

/* Under --workers: the listener's socket made here with SO_REUSEPORT, so
 * that every worker can bind the same address (libuv has no flag for
 * it). 0 or a negative libuv error. */
static int share_port(px_server *srv, uv_tcp_t *l, const struct sockaddr *sa) {
  int one = 1;
  if (srv->cfg->worker == 0) { /* held by another process: refuse */
    int rc = probe_port(sa);
    if (rc != 0)
      return rc;
  }
  int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return uv_translate_sys_error(errno);
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
    int err = uv_translate_sys_error(errno);
    close(fd);
    return err;
  }
  int rc = uv_tcp_open(l, (uv_os_sock_t)fd);
  if (rc != 0)
    close(fd);
  return rc;
}

/* A new listening socket on `a`, or NULL (logged). */
static uv_tcp_t *bind_listener(px_server *srv, const px_addr *a,
                               const char *kind) {
  struct sockaddr_storage ss;
  char addr[300];
  int rc;

  px_addr_format(a, addr, sizeof addr);
  char why[300];
  if (px_addr_resolve(a->host, a->port, &ss, why, sizeof why) != 0) {
    px_error("listen_failed", PX_S("address", addr), PX_S("error", why));
    return NULL;
  }
  uv_tcp_t *l = malloc(sizeof *l);
  if (!l || (rc = uv_tcp_init(srv->loop, l)) != 0) {
    px_error("listen_init_failed", PX_S("address", addr),
             PX_S("error", l ? uv_strerror(rc) : "out of memory"));
    free(l);
    return NULL;
  }
  l->data = srv;
  rc = srv->cfg->workers > 1 ? share_port(srv, l, (struct sockaddr *)&ss) : 0;
  if (rc == 0)
    rc = uv_tcp_bind(l, (struct sockaddr *)&ss, 0);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)l, 1024, on_connection);
  if (rc < 0) {
    px_error("listen_bind_failed", PX_S("address", addr),
             PX_S("error", uv_strerror(rc)));
    uv_close((uv_handle_t *)l, on_listener_closed);
    return NULL;
  }
  px_info("listening", PX_S("address", addr), PX_S("protocol", kind));
  return l;
}

static bool same_addr(const px_addr *a, const px_addr *b) {
  return a->port == b->port && strcmp(a->host, b->host) == 0;
}

/* A listener whose address (or on/off) changed on reload: the new one
 * replaces it; one that cannot bind keeps the old (the new config is
 * told so). */
static void rebind(px_server *srv, uv_tcp_t **l, bool *on, px_addr *a,
                   bool old_on, const px_addr *old, const char *kind) {
  if (*on == old_on && (!*on || same_addr(a, old)))
    return;
  uv_tcp_t *n = *on ? bind_listener(srv, a, kind) : NULL;
  if (*on && !n) {
    *on = old_on; /* still listening where it was */
    *a = *old;
    return;
  }
  close_listener(l);
  *l = n;
}

/* The TLS contexts for `cfg` (NULL where it has no use for one). false,
 * logged, when a file does not load. */
/* A handshake of a connection of one of the server's contexts. */
static void tls_observed(void *arg, bool server, const char *failure) {
  px_server *srv = arg;
  const char *side = server ? "client" : "upstream";
  if (failure)
    px_metrics_inc(srv, PX_M_TLS_FAILURES, side, failure);
  else
    px_metrics_inc(srv, PX_M_TLS_HANDSHAKES, side, NULL);
}

static bool tls_contexts(px_server *srv, const px_config *cfg,
                         px_tls_ctx **server, px_tls_ctx **upstream) {
  char err[512];
  const px_tls_config *t = &cfg->tls;
  bool any_tls = false;
  for (unsigned i = 0; i < cfg->n_upstreams; i++)
    any_tls = any_tls || cfg->upstream[i].tls;
  *server = *upstream = NULL;
  if (t->listen_on) {
    px_tls_opts o = {t->cert,
                     t->key,
                     t->client_ca[0] ? t->client_ca : NULL,
                     false,
                     t->ciphers[0] ? t->ciphers : NULL,
                     t->ciphersuites[0] ? t->ciphersuites : NULL};
    if (!(*server = px_tls_server_ctx(&o, err, sizeof err))) {
      px_error("tls_listener_config_failed", PX_S("error", err));
      return false;
    }
    px_tls_ctx_observe(*server, tls_observed, srv);
  }
  if (any_tls) {
    px_tls_opts o = {t->upstream_cert[0] ? t->upstream_cert : NULL,
                     t->upstream_key[0] ? t->upstream_key : NULL,
                     t->upstream_ca[0] ? t->upstream_ca : NULL,
                     !t->upstream_verify,
                     t->ciphers[0] ? t->ciphers : NULL,
                     t->ciphersuites[0] ? t->ciphersuites : NULL};
    if (!(*upstream = px_tls_client_ctx(&o, err, sizeof err))) {
      px_error("tls_upstream_config_failed", PX_S("error", err));
      px_tls_ctx_unref(*server);
      *server = NULL;
      return false;
    }
    px_tls_ctx_observe(*upstream, tls_observed, srv);
    if (!t->upstream_verify)
      px_warn("upstream_verify_off",
              PX_S("note", "amqps upstreams' certificates and host names are "
                           "not verified"));
  }
  return true;
}

/* SIGHUP: certificates and keys read again; new handshakes use them, open
 * connections keep theirs. A file that does not load keeps the running
 * ones. */
static void reload_tls(px_server *srv, const px_config *next) {
  px_tls_ctx *server, *upstream;
  if (!tls_contexts(srv, next, &server, &upstream)) {
    px_warn("tls_reload_kept", PX_S("kept", "the running certificates"));
    return;
  }
  px_tls_ctx_unref(srv->tls_server);
  px_tls_ctx_unref(srv->tls_upstream);
  srv->tls_server = server;
  srv->tls_upstream = upstream;
}

/* SIGHUP: read the config again. New policy for new decisions (copies in
 * flight finish as they are), new listener, upstreams and connection cap
 * for new connections; an invalid config keeps the old one. */
/* The running policies begin now: none has matched a queue yet, nothing
 * of theirs is logged. */
static void new_policies(px_server *srv) {
  px_queues *qs = &srv->metrics.queues;
  srv->cfg_since_ms = uv_now(srv->loop);
  memset(srv->policy_logged, 0, sizeof srv->policy_logged);
  srv->shortest_timeout_ms = 0;
  for (unsigned i = 0; i < srv->cfg->retry.nrules; i++) {
    uint32_t t = srv->cfg->retry.rules[i].processing_timeout_ms;
    if (t && (!srv->shortest_timeout_ms || t < srv->shortest_timeout_ms))
      srv->shortest_timeout_ms = t;
  }
  for (uint32_t i = 0; i < qs->n; i++)
    qs->q[i].logged = 0;
}

/* The settings a reload cannot change: warned about, the running ones
 * kept in `next`. */
static void keep_restart_settings(const px_config *old, px_config *next) {
  if (next->admin_on != old->admin_on ||
      (next->admin_on && !same_addr(&next->admin, &old->admin))) {
    px_warn("config_reload_admin_kept",
            PX_S("note", "a new admin address takes a restart; the old one "
                         "stays"));
    next->admin_on = old->admin_on;
    next->admin = old->admin;
  }
  if (next->workers != old->workers) {
    px_warn("config_reload_workers_kept", PX_U("workers", old->workers),
            PX_S("note", "a new number of workers takes a restart"));
    next->workers = old->workers;
  }
  if (strcmp(next->log_file, old->log_file) != 0) {
    px_warn("config_reload_log_file_kept", PX_S("log_file", old->log_file),
            PX_S("note", "a new log file takes a restart"));
    memcpy(next->log_file, old->log_file, sizeof next->log_file);
  }
}

static void reload(px_server *srv) {
  char err[512];
  px_config *next = malloc(sizeof *next);
  if (!next) {
    px_error("config_reload_no_memory", PX_S("error", "out of memory"));
    return;
  }
  if (px_config_load(next, srv->argc, srv->argv, srv->env, err, sizeof err) !=
      PX_CONFIG_OK) {
    px_error("config_reload_failed", PX_S("error", err),
             PX_S("kept", "the running config"));
    free(next);
    return;
  }
  px_config *old = (px_config *)srv->cfg;
  rebind(srv, &srv->listener, &next->listen_on, &next->listen, old->listen_on,
         &old->listen, "amqp");
  rebind(srv, &srv->tls_listener, &next->tls.listen_on, &next->tls.listen,
         old->tls.listen_on, &old->tls.listen, "amqps");
  reload_tls(srv, next);
  /* the upstream list may have changed: what failed lately is forgotten */
  memset(&srv->dial_memory, 0, sizeof srv->dial_memory);
  keep_restart_settings(old, next);
  px_log_set_level(next->log_level);
  px_log_set_format(next->log_format);
  /* Nothing keeps a pointer into the old config but the retry_rule of a
   * consumer or delivery, and that one is used only while the generation
   * recorded with it is cfg_gen (px_track.c and px_retry.c match the rule
   * again otherwise). Bumping cfg_gen therefore retires every rule of the
   * old config, and it can be freed now. */
  srv->cfg = next;
  srv->cfg_gen++;
  new_policies(srv);
  px_metrics_declare_known(srv);
  free(old);
  srv->cache_total = px_workers_share(srv, next->cache_total);
  srv->max_connections = connection_limit(srv, next, srv->max_connections);
  px_info("config_reloaded", PX_U("generation", srv->cfg_gen),
          PX_U("policies", next->retry.nrules),
          PX_U("upstreams", next->n_upstreams));
}

static void on_sighup(uv_signal_t *sig, int signum) {
  px_server *srv = sig->data;
  px_workers_signal(srv, signum); /* each reads the config itself */
  if (!srv->argv) {
    px_warn("reload_not_enabled", PX_I("signal", signum),
            PX_S("action", "ignored"));
  } else if (srv->draining) {
    signal_ignored(signum, "already draining");
  } else {
    reload(srv);
  }
}

void px_server_enable_reload(px_server *srv, int argc, char **argv,
                             const char *(*env)(const char *)) {
  srv->argc = argc;
  srv->argv = argv;
  srv->env = env;
}

static const int handled_signals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1,
                                      SIGUSR2};

void px_server_close(px_server *srv) {
  uv_signal_t *handlers[] = {&srv->sigterm, &srv->sigint, &srv->sighup,
                             &srv->sigusr1, &srv->sigusr2};
  enum { N = sizeof handled_signals / sizeof handled_signals[0] };
  sigset_t set;
  px_server_stop(srv);
  /* closing libuv's handler of a signal restores its default action,
   * which for these is to end the process */
  sigemptyset(&set);
  for (int i = 0; i < N; i++)
    sigaddset(&set, handled_signals[i]);
  sigprocmask(SIG_BLOCK, &set, NULL);
  for (int i = 0; i < N; i++) {
    uv_close((uv_handle_t *)handlers[i], NULL);
    signal(handled_signals[i], SIG_IGN);
  }
}

void px_server_free(px_server *srv) {
  px_watch_free(srv);
  px_tls_ctx_unref(srv->tls_server);
  px_tls_ctx_unref(srv->tls_upstream);
  srv->tls_server = srv->tls_upstream = NULL;
  for (uint32_t i = 0; i < srv->nalt_types; i++)
    free(srv->alt_types[i]);
  free(srv->alt_types);
  srv->alt_types = NULL;
  srv->nalt_types = 0;
  for (uint32_t i = 0; i < srv->nas_is; i++)
    free(srv->as_is[i]);
  free(srv->as_is);
  srv->as_is = NULL;
  srv->nas_is = 0;
  if (srv->argv)
    free((px_config *)srv->cfg);
  srv->cfg = NULL;
  if (srv->spare_fd >= 0)
    close(srv->spare_fd);
  srv->spare_fd = -1;
}

/* File descriptors open now (32 when /proc cannot tell). */
static unsigned open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  unsigned n = 0;
  if (!d)
    return 32;
  while (readdir(d))
    n++;
  closedir(d);
  return n > 3 ? n - 3 : n; /* ".", ".." and the directory's own */
}

static void start_signal(px_server *srv, uv_signal_t *h, uv_signal_cb cb,
                         int signum) {
  uv_signal_init(srv->loop, h);
  h->data = srv;
  uv_signal_start(h, cb, signum);
}

int px_server_check(const px_config *cfg) {
  px_server *srv = calloc(1, sizeof *srv); /* for the TLS observer only */
  px_tls_ctx *server, *upstream;
  if (!srv || !tls_contexts(srv, cfg, &server, &upstream)) {
    free(srv);
    return -1;
  }
  px_tls_ctx_unref(server);
  px_tls_ctx_unref(upstream);
  free(srv);
  const struct {
    bool on;
    const px_addr *a;
    const char *flag;
  } binds[] = {{cfg->listen_on, &cfg->listen, "listen"},
               {cfg->tls.listen_on, &cfg->tls.listen, "tls-listen"},
               {cfg->admin_on, &cfg->admin, "admin"}};
  int rc = 0;
  for (size_t i = 0; i < sizeof binds / sizeof *binds; i++) {
    struct sockaddr_storage ss;
    char why[300], addr[300];
    if (binds[i].on && px_addr_resolve(binds[i].a->host, binds[i].a->port, &ss,
                                       why, sizeof why) != 0) {
      px_error("check_address_failed", PX_S("option", binds[i].flag),
               PX_S("address", px_addr_format(binds[i].a, addr, sizeof addr)),
               PX_S("error", why));
      rc = -1;
    }
  }
  return rc;
}

static double unix_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* The admin endpoint's requests, to the routes (px_routes.h). */
static void route(void *ctx, const px_admin_request *req,
                  px_admin_response *r) {
  px_routes_route(ctx, req, r);
}

int px_server_start(px_server *srv, uv_loop_t *loop, const px_config *cfg) {
  memset(srv, 0, sizeof *srv);
  srv->loop = loop;
  srv->session_gone = session_gone;
  srv->dlq_op_done = dlq_op_done;
  srv->cfg = cfg;
  srv->spare_fd = -1;
  if (!tls_contexts(srv, cfg, &srv->tls_server, &srv->tls_upstream))
    return UV_EINVAL;
  if (cfg->listen_on &&
      !(srv->listener = bind_listener(srv, &cfg->listen, "amqp")))
    return UV_EINVAL;
  /* an admin endpoint that cannot bind stops the start too (logged;
   * --admin off runs without one) */
  if ((cfg->tls.listen_on &&
       !(srv->tls_listener = bind_listener(srv, &cfg->tls.listen, "amqps"))) ||
      (cfg->admin_on && cfg->worker == 0 &&
       px_admin_start(&srv->admin, loop, cfg->admin.host, cfg->admin.port,
                      route, srv) != 0)) {
    close_listener(&srv->listener); /* freed as the loop runs on */
    close_listener(&srv->tls_listener);
    return UV_EINVAL;
  }
  srv->admin_on = cfg->admin_on && cfg->worker == 0;
  srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  px_clock_init(&srv->clock, loop);
  uv_timer_init(loop, &srv->drain_timer);
  srv->drain_timer.data = srv;
  start_signal(srv, &srv->sigterm, on_signal, SIGTERM);
  start_signal(srv, &srv->sigint, on_signal, SIGINT);
  start_signal(srv, &srv->sighup, on_sighup, SIGHUP);
  sigset_t hup; /* a worker's (main.c): one that came meanwhile runs now */
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  sigprocmask(SIG_UNBLOCK, &hup, NULL);
  start_signal(srv, &srv->sigusr1, on_sigusr, SIGUSR1);
  start_signal(srv, &srv->sigusr2, on_sigusr, SIGUSR2);
  srv->started_ms = uv_now(loop);
  srv->started_unix = unix_now();
  uv_timer_init(loop, &srv->probe_timer);
  srv->probe_timer.data = srv;
  if (cfg->worker == 0) /* /readyz is worker 0's */
    uv_timer_start(&srv->probe_timer, on_probe_timer, 0, PX_PROBE_INTERVAL_MS);
  srv->summary.at_ms = uv_now(loop) - PX_LOG_LIMIT_MS; /* the first at once */
  uv_timer_init(loop, &srv->janitor_timer);
  srv->janitor_timer.data = srv;
  uv_timer_start(&srv->janitor_timer, on_janitor, PX_JANITOR_MS, PX_JANITOR_MS);
  new_policies(srv);
  px_metrics_declare_known(srv);
  srv->cache_total = px_workers_share(srv, cfg->cache_total);
  srv->fd_reserve =
      open_fds() + (srv->admin_on ? PX_ADMIN_FDS : 0) + PX_FD_SLACK;
  srv->max_connections = connection_limit(srv, cfg, 0);
  return 0;
}
