/* px_dial.c - reaching an upstream (px_dial.h). */
#include "px_dial.h"

#include <stdio.h>
#include <string.h>

#include "px_log.h"
#include "px_tls.h"

static void attempt(px_dial *d);

/* The upstreams in the order to try: those not failed lately first, in
 * their configured order, then the others, in theirs. */
static void order(px_dial *d) {
  uint64_t now = px_clock_ms(d->clock);
  d->n = 0;
  for (int recent = 0; recent < 2; recent++)
    for (unsigned i = 0; i < d->cfg->n_upstreams; i++) {
      uint64_t f = d->memory->failed_ms[i];
      bool failed = f && now - f < PX_DIAL_MEMORY_MS;
      if (failed == (recent == 1))
        d->order[d->n++] = i;
    }
}

static const px_addr *current(const px_dial *d) {
  return &d->cfg->upstream[d->order[d->pos]];
}

static void addr_text(const struct sockaddr_storage *sa, char *out,
                      size_t cap) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (sa->ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
    uv_ip6_name(a, ip, sizeof ip);
    snprintf(out, cap, "[%s]:%u", ip, (unsigned)ntohs(a->sin6_port));
    return;
  }
  const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
  uv_ip4_name(a, ip, sizeof ip);
  snprintf(out, cap, "%s:%u", ip, (unsigned)ntohs(a->sin_port));
}

/* An attempt failed: logged, counted, noted for the final error. */
static void note(px_dial *d, const char *err) {
  char where[64];
  size_t n = strlen(d->errors);
  addr_text(&d->sa, where, sizeof where);
  px_warn("upstream_attempt_failed", PX_U("id", d->id),
          PX_S("upstream", d->addr), PX_S("address", where),
          PX_S("error", err));
  if (strcmp(where, d->addr) == 0) /* a numeric upstream */
    snprintf(d->errors + n, sizeof d->errors - n, "%s%s: %s", n ? "; " : "",
             d->addr, err);
  else
    snprintf(d->errors + n, sizeof d->errors - n, "%s%s (%s): %s",
             n ? "; " : "", d->addr, where, err);
  if (d->ev->attempt_failed)
    d->ev->attempt_failed(d->ctx, d->addr);
}

/* On to the next address of this upstream, or the next upstream (this
 * one is remembered as failed). */
static void advance(px_dial *d) {
  if (d->next_ai)
    return;
  if (d->ai) {
    uv_freeaddrinfo(d->ai);
    d->ai = NULL;
  }
  d->memory->failed_ms[d->order[d->pos]] = px_clock_ms(d->clock);
  d->pos++;
}

static void end_attempt(px_dial *d, const char *err) {
  px_timer_stop(d->clock, &d->timer);
  note(d, err);
  advance(d);
  if (d->conn->open) {
    d->closing_attempt = true; /* the next follows the closed event */
    px_conn_close(d->conn);
  } else {
    attempt(d);
  }
}

static void on_timeout(px_timer *t) {
  px_dial *d = t->data;
  char err[96];
  snprintf(err, sizeof err, "no connection.start within %ums",
           (unsigned)d->timeout_ms);
  end_attempt(d, err);
}

/* Connect to d->sa, TLS under it for an amqps upstream. */
static void connect_sa(px_dial *d) {
  const px_addr *a = current(d);
  int rc = 0;
  d->conn->io = d->io;
  d->tls_now = a->tls;
  if (a->tls)
    rc = d->tls ? px_tls_client(d->conn, d->tls, a->host) : UV_EINVAL;
  if (rc == 0) {
    rc = px_conn_connect(d->conn, d->loop, (struct sockaddr *)&d->sa);
    if (d->conn->open)
      d->ev->opened(d->ctx);
  }
  if (rc < 0) {
    end_attempt(d, uv_strerror(rc));
    return;
  }
  px_timer_start(d->clock, &d->timer, d->timeout_ms);
}

static void take_next_ai(px_dial *d) {
  struct addrinfo *ai = d->next_ai;
  memset(&d->sa, 0, sizeof d->sa);
  memcpy(&d->sa, ai->ai_addr, ai->ai_addrlen);
  d->next_ai = ai->ai_next;
}

static void on_resolved(uv_getaddrinfo_t *req, int status,
                        struct addrinfo *res) {
  px_dial *d = req->data;
  d->gai_pending = false;
  if (d->closed) {
    uv_freeaddrinfo(res);
    if (d->timer_closed)
      d->ev->released(d->ctx);
    return;
  }
  if (status < 0 || !res) {
    memset(&d->sa, 0, sizeof d->sa);
    note(d, uv_strerror(status < 0 ? status : UV_EAI_NONAME));
    if (res)
      uv_freeaddrinfo(res);
    advance(d);
    attempt(d);
    return;
  }
  d->ai = d->next_ai = res;
  take_next_ai(d);
  connect_sa(d);
}

/* Resolve the current upstream (a numeric address at once). 1 when an
 * address is ready in d->sa, 0 when the resolver will answer. */
static int resolve(px_dial *d) {
  const px_addr *a = current(d);
  char port[8];
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_ADDRCONFIG};
  px_addr_format(a, d->addr, sizeof d->addr);
  snprintf(d->host, sizeof d->host, "%s", a->host);
  memset(&d->sa, 0, sizeof d->sa);
  if (uv_ip4_addr(a->host, a->port, (struct sockaddr_in *)&d->sa) == 0 ||
      uv_ip6_addr(a->host, a->port, (struct sockaddr_in6 *)&d->sa) == 0)
    return 1;
  snprintf(port, sizeof port, "%u", (unsigned)a->port);
  d->gai.data = d;
  int rc = uv_getaddrinfo(d->loop, &d->gai, on_resolved, a->host, port, &hints);
  if (rc == 0) {
    d->gai_pending = true;
    return 0;
  }
  note(d, uv_strerror(rc));
  advance(d);
  return -1;
}

static void attempt(px_dial *d) {
  for (;;) {
    if (d->next_ai) {
      take_next_ai(d);
      connect_sa(d);
      return;
    }
    if (d->pos >= d->n) {
      d->failed = true;
      d->ev->failed(d->ctx);
      return;
    }
    int r = resolve(d);
    if (r == 0)
      return;
    if (r == 1) {
      connect_sa(d);
      return;
    }
  }
}

void px_dial_start(px_dial *d, uv_loop_t *loop, px_clock *clock,
                   const px_config *cfg, px_dial_memory *memory,
                   struct px_tls_ctx *tls, px_conn *conn, uint32_t timeout_ms,
                   const px_dial_events *ev, void *ctx, uint64_t id) {
  memset(d, 0, sizeof *d);
  d->timeout_ms = timeout_ms;
  d->loop = loop;
  d->clock = clock;
  d->cfg = cfg;
  d->memory = memory;
  d->tls = tls;
  d->conn = conn;
  d->io = conn->io;
  d->ev = ev;
  d->ctx = ctx;
  d->id = id;
  px_timer_init(&d->timer, on_timeout, d);
  order(d);
  attempt(d);
}

void px_dial_connected(px_dial *d, int status) {
  if (d->done || d->closed)
    return;
  if (status < 0) {
    const char *tls = px_tls_error(d->conn);
    end_attempt(d, tls[0] ? tls : uv_strerror(status));
    return;
  }
  d->ev->connected(d->ctx);
}

void px_dial_closed(px_dial *d) {
  if (d->done || d->closed || !d->closing_attempt)
    return;
  d->closing_attempt = false;
  px_conn *c = d->conn;
  const px_conn_events *cev = c->ev;
  void *cctx = c->ctx;
  const char *name = c->name;
  px_conn_free(c); /* nothing of the failed attempt goes to the next */
  px_conn_init(c, name, cev, cctx);
  c->io = d->io;
  attempt(d);
}

void px_dial_started(px_dial *d) {
  if (d->done || d->closed) /* closed: its timer is the release step */
    return;
  d->done = true;
  px_timer_stop(d->clock, &d->timer);
  d->memory->failed_ms[d->order[d->pos]] = 0;
  if (d->ai) {
    uv_freeaddrinfo(d->ai);
    d->ai = d->next_ai = NULL;
  }
}

/* The last step of px_dial_close(), from the clock (as a libuv close
 * callback would be): the owner never hears `released` inside the call. */
static void on_timer_closed(px_timer *t) {
  px_dial *d = t->data;
  px_timer_close(d->clock, &d->timer);
  d->timer_closed = true;
  if (!d->gai_pending)
    d->ev->released(d->ctx);
}

void px_dial_close(px_dial *d) {
  if (d->closed)
    return;
  d->closed = true;
  if (d->gai_pending)
    uv_cancel((uv_req_t *)&d->gai);
  if (d->ai) {
    uv_freeaddrinfo(d->ai);
    d->ai = d->next_ai = NULL;
  }
  px_timer_finally(d->clock, &d->timer, on_timer_closed);
}
