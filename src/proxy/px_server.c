#include "px_server.h"

#include <string.h>

#include "px_buf.h"
#include "px_log.h"
#include "px_session.h"

static void on_connection(uv_stream_t *listener, int status) {
  px_server *srv = listener->data;
  if (status < 0) {
    px_warn("accept_failed", "error=\"%s\"", uv_strerror(status));
    return;
  }
  int rc = px_session_accept(srv, listener);
  if (rc < 0)
    px_warn("accept_failed", "error=\"%s\"", uv_strerror(rc));
}

static void stop_loop_if_done(px_server *srv) {
  if (srv->draining && !srv->sessions)
    uv_stop(srv->loop);
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
  px_warn("drain_timeout", "sessions_left=%u timeout_ms=%u", n,
          (unsigned)srv->cfg->drain_timeout_ms);
  while (srv->sessions)
    px_session_close(srv->sessions, "drain timeout");
  uv_stop(srv->loop);
}

static void on_signal(uv_signal_t *sig, int signum) {
  px_server *srv = sig->data;
  if (srv->draining) {
    px_info("signal", "signal=%d action=ignored reason=\"already draining\"",
            signum);
    return;
  }
  srv->draining = true;
  px_info("shutdown", "signal=%d sessions=%llu drain_timeout_ms=%u", signum,
          (unsigned long long)srv->stats.sessions_current,
          (unsigned)srv->cfg->drain_timeout_ms);
  uv_close((uv_handle_t *)&srv->listener, NULL);
  for (px_session *s = srv->sessions, *next; s; s = next) {
    next = s->next; /* draining may unlink s */
    px_session_drain(s);
  }
  uv_timer_start(&srv->drain_timer, on_drain_timeout,
                 srv->cfg->drain_timeout_ms, 0);
  stop_loop_if_done(srv);
}

static int bind_listener(px_server *srv) {
  const px_addr *a = &srv->cfg->listen;
  struct sockaddr_storage ss;
  char addr[300];
  int rc;

  px_addr_format(a, addr, sizeof addr);
  if (uv_ip4_addr(a->host, a->port, (struct sockaddr_in *)&ss) != 0 &&
      uv_ip6_addr(a->host, a->port, (struct sockaddr_in6 *)&ss) != 0) {
    px_error("listen_failed", "address=%s error=\"not a numeric IP address\"",
             addr);
    return UV_EINVAL;
  }
  rc = uv_tcp_init(srv->loop, &srv->listener);
  if (rc == 0) {
    srv->listener.data = srv;
    rc = uv_tcp_bind(&srv->listener, (struct sockaddr *)&ss, 0);
  }
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&srv->listener, 1024, on_connection);
  if (rc < 0) {
    px_error("listen_failed", "address=%s error=\"%s\"", addr, uv_strerror(rc));
    return rc;
  }
  px_info("listening", "address=%s", addr);
  return 0;
}

int px_server_start(px_server *srv, uv_loop_t *loop, const px_config *cfg) {
  memset(srv, 0, sizeof *srv);
  srv->loop = loop;
  srv->cfg = cfg;
  int rc = bind_listener(srv);
  if (rc < 0)
    return rc;
  uv_timer_init(loop, &srv->drain_timer);
  srv->drain_timer.data = srv;
  uv_signal_init(loop, &srv->sigterm);
  uv_signal_init(loop, &srv->sigint);
  srv->sigterm.data = srv->sigint.data = srv;
  uv_signal_start(&srv->sigterm, on_signal, SIGTERM);
  uv_signal_start(&srv->sigint, on_signal, SIGINT);
  return 0;
}
