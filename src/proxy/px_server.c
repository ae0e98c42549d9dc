#include "px_server.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "px_buf.h"
#include "px_log.h"
#include "px_metrics.h"
#include "px_session.h"

#define PX_PROBE_INTERVAL_MS 2000

static void on_connection(uv_stream_t *listener, int status) {
  px_server *srv = listener->data;
  if (status < 0) {
    px_warn("accept_failed", PX_S("error", uv_strerror(status)));
    return;
  }
  int rc = px_session_accept(srv, listener);
  if (rc < 0)
    px_warn("session_accept_failed", PX_S("error", uv_strerror(rc)));
}

static void stop_loop_if_done(px_server *srv) {
  if (srv->draining && !srv->sessions) {
    px_server_stop(srv);
    uv_stop(srv->loop);
  }
}

void px_server_session_gone(px_server *srv, struct px_session *s) {
  (void)s;
  stop_loop_if_done(srv);
}

static void on_drain_timeout(uv_timer_t *t) {
  px_server *srv = t->data;
  unsigned n = 0;
  for (px_session *s = srv->sessions; s; s = s->next)
    n++;
  px_warn("drain_timeout", PX_U("sessions_left", n),
          PX_U("timeout_ms", srv->cfg->drain_timeout_ms));
  while (srv->sessions)
    px_session_close(srv->sessions, "drain timeout");
  px_server_stop(srv);
  uv_stop(srv->loop);
}

/* ---- readiness: is an upstream reachable? ------------------------------- */

static void probe_next(px_server *srv);

static void on_probe_closed(uv_handle_t *h) {
  px_server *srv = h->data;
  srv->probe_busy = false;
}

static void on_probe_connect(uv_connect_t *req, int status) {
  px_server *srv = req->data;
  char addr[300];
  px_addr_format(&srv->cfg->upstream[srv->probe_idx], addr, sizeof addr);
  if (status == 0) {
    srv->upstream_ok = true;
    srv->upstream_err[0] = '\0';
  } else if (srv->probe_idx + 1 >= srv->cfg->n_upstreams) {
    if (srv->upstream_ok)
      px_warn("readiness_probe_failed", PX_S("upstream", addr),
              PX_S("error", uv_strerror(status)));
    srv->upstream_ok = false;
    snprintf(srv->upstream_err, sizeof srv->upstream_err,
             "no upstream reachable (last: %s: %s)", addr, uv_strerror(status));
  }
  bool again = status != 0 && srv->probe_idx + 1 < srv->cfg->n_upstreams;
  uv_close((uv_handle_t *)&srv->probe_tcp, on_probe_closed);
  if (again) {
    srv->probe_idx++;
    /* the next address once this handle is closed: next timer tick */
  } else {
    srv->probe_idx = 0;
  }
}

/* Try the upstreams in order with a plain TCP connect (numeric addresses;
 * a name counts as reachable when sessions reach it). */
static void probe_next(px_server *srv) {
  struct sockaddr_storage ss;
  const px_addr *a = &srv->cfg->upstream[srv->probe_idx];
  if (srv->probe_busy || srv->draining)
    return;
  if (uv_ip4_addr(a->host, a->port, (struct sockaddr_in *)&ss) != 0 &&
      uv_ip6_addr(a->host, a->port, (struct sockaddr_in6 *)&ss) != 0) {
    srv->probe_idx = 0;
    return;
  }
  if (uv_tcp_init(srv->loop, &srv->probe_tcp) != 0)
    return;
  srv->probe_tcp.data = srv;
  srv->probe_req.data = srv;
  srv->probe_busy = true;
  if (uv_tcp_connect(&srv->probe_req, &srv->probe_tcp, (struct sockaddr *)&ss,
                     on_probe_connect) != 0)
    uv_close((uv_handle_t *)&srv->probe_tcp, on_probe_closed);
}

static void on_probe_timer(uv_timer_t *t) {
  probe_next(t->data);
}

/* ---- admin endpoint ------------------------------------------------------ */

static void route(void *ctx, const char *method, const char *path,
                  px_admin_response *r) {
  px_server *srv = ctx;
  bool known = strcmp(path, "/healthz") == 0 || strcmp(path, "/readyz") == 0 ||
               strcmp(path, "/metrics") == 0 || strcmp(path, "/v1/status") == 0;
  if (!known) {
    r->status = 404;
    px_admin_printf(r,
                    "not found: try /healthz, /readyz, /metrics, /v1/status\n");
    return;
  }
  if (strcmp(method, "GET") != 0) {
    r->status = 405;
    px_admin_header(r, "Allow", "GET, HEAD");
    px_admin_printf(r, "method not allowed\n");
    return;
  }
  if (strcmp(path, "/healthz") == 0) {
    px_admin_printf(r, "ok\n");
  } else if (strcmp(path, "/readyz") == 0) {
    if (srv->draining) {
      r->status = 503;
      px_admin_printf(r, "not ready: draining (shutting down)\n");
    } else if (!srv->upstream_ok) {
      r->status = 503;
      px_admin_printf(r, "not ready: %s\n",
                      srv->upstream_err[0] ? srv->upstream_err
                                           : "upstream not checked yet");
    } else {
      px_admin_printf(r, "ready\n");
    }
  } else if (strcmp(path, "/v1/status") == 0) {
    px_status_render(srv, r);
  } else {
    px_metrics_render(srv, r);
  }
}

void px_server_stop(px_server *srv) {
  uv_timer_stop(&srv->probe_timer);
  if (srv->admin_on) {
    srv->admin_on = false;
    px_admin_stop(&srv->admin, NULL, NULL);
  }
}

static void on_listener_closed(uv_handle_t *h);

static void on_signal(uv_signal_t *sig, int signum) {
  px_server *srv = sig->data;
  if (srv->draining) {
    px_info("signal_ignored", PX_I("signal", signum),
            PX_S("reason", "already draining"));
    return;
  }
  srv->draining = true;
  px_info("shutdown", PX_I("signal", signum),
          PX_U("sessions", srv->stats.sessions_current),
          PX_U("drain_timeout_ms", srv->cfg->drain_timeout_ms));
  uv_close((uv_handle_t *)srv->listener, on_listener_closed);
  srv->listener = NULL;
  for (px_session *s = srv->sessions, *next; s; s = next) {
    next = s->next; /* draining may unlink s */
    px_session_drain(s);
  }
  uv_timer_start(&srv->drain_timer, on_drain_timeout,
                 srv->cfg->drain_timeout_ms, 0);
  stop_loop_if_done(srv);
}

static void on_listener_closed(uv_handle_t *h) {
  free(h);
}

/* A new listening socket on `a`, or NULL (logged). */
static uv_tcp_t *bind_listener(px_server *srv, const px_addr *a) {
  struct sockaddr_storage ss;
  char addr[300];
  int rc;

  px_addr_format(a, addr, sizeof addr);
  if (uv_ip4_addr(a->host, a->port, (struct sockaddr_in *)&ss) != 0 &&
      uv_ip6_addr(a->host, a->port, (struct sockaddr_in6 *)&ss) != 0) {
    px_error("listen_failed", PX_S("address", addr),
             PX_S("error", "not a numeric IP address"));
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
  rc = uv_tcp_bind(l, (struct sockaddr *)&ss, 0);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)l, 1024, on_connection);
  if (rc < 0) {
    px_error("listen_bind_failed", PX_S("address", addr),
             PX_S("error", uv_strerror(rc)));
    uv_close((uv_handle_t *)l, on_listener_closed);
    return NULL;
  }
  px_info("listening", PX_S("address", addr));
  return l;
}

static bool same_addr(const px_addr *a, const px_addr *b) {
  return a->port == b->port && strcmp(a->host, b->host) == 0;
}

/* SIGHUP: read the config again. New policy for new decisions (copies in
 * flight finish as they are), new listener and upstreams for new
 * connections; an invalid config keeps the old one. */
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
  if (!same_addr(&next->listen, &old->listen)) {
    uv_tcp_t *l = bind_listener(srv, &next->listen);
    if (l) {
      uv_close((uv_handle_t *)srv->listener, on_listener_closed);
      srv->listener = l;
    } else {
      next->listen = old->listen; /* still listening where it was */
    }
  }
  if (next->admin_on != old->admin_on ||
      (next->admin_on && !same_addr(&next->admin, &old->admin))) {
    px_warn("config_reload_admin_kept",
            PX_S("note", "a new admin address takes a restart; the old one "
                         "stays"));
    next->admin_on = old->admin_on;
    next->admin = old->admin;
  }
  px_log_set_level(next->log_level);
  px_log_set_format(next->log_format);
  /* Nothing keeps a pointer into the old config but the retry_rule of a
   * consumer or delivery, and that one is used only while the generation
   * recorded with it is cfg_gen (px_track.c and px_retry.c match the rule
   * again otherwise). Bumping cfg_gen therefore retires every rule of the
   * old config, and it can be freed now. */
  srv->cfg = next;
  srv->cfg_gen++;
  free(old);
  px_info("config_reloaded", PX_U("generation", srv->cfg_gen),
          PX_U("policies", next->retry.nrules),
          PX_U("upstreams", next->n_upstreams));
}

static void on_sighup(uv_signal_t *sig, int signum) {
  px_server *srv = sig->data;
  if (!srv->argv) {
    px_warn("reload_not_enabled", PX_I("signal", signum),
            PX_S("action", "ignored"));
    return;
  }
  if (!srv->draining)
    reload(srv);
}

void px_server_enable_reload(px_server *srv, int argc, char **argv,
                             const char *(*env)(const char *)) {
  srv->argc = argc;
  srv->argv = argv;
  srv->env = env;
}

void px_server_free(px_server *srv) {
  if (srv->argv)
    free((px_config *)srv->cfg);
  srv->cfg = NULL;
}

int px_server_start(px_server *srv, uv_loop_t *loop, const px_config *cfg) {
  memset(srv, 0, sizeof *srv);
  srv->loop = loop;
  srv->cfg = cfg;
  srv->listener = bind_listener(srv, &cfg->listen);
  if (!srv->listener)
    return UV_EINVAL;
  uv_timer_init(loop, &srv->drain_timer);
  srv->drain_timer.data = srv;
  uv_signal_init(loop, &srv->sigterm);
  uv_signal_init(loop, &srv->sigint);
  srv->sigterm.data = srv->sigint.data = srv;
  uv_signal_start(&srv->sigterm, on_signal, SIGTERM);
  uv_signal_start(&srv->sigint, on_signal, SIGINT);
  uv_signal_init(loop, &srv->sighup);
  srv->sighup.data = srv;
  uv_signal_start(&srv->sighup, on_sighup, SIGHUP);
  srv->started_ms = uv_now(loop);
  uv_timer_init(loop, &srv->probe_timer);
  srv->probe_timer.data = srv;
  uv_timer_start(&srv->probe_timer, on_probe_timer, 0, PX_PROBE_INTERVAL_MS);
  if (cfg->admin_on) {
    /* an admin endpoint that cannot bind is logged; the proxy still runs */
    srv->admin_on = px_admin_start(&srv->admin, loop, cfg->admin.host,
                                   cfg->admin.port, route, srv) == 0;
  }
  return 0;
}
