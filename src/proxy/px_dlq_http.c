/* px_dlq_http.c - the admin endpoint's dead-letter routes (px_dlq_http.h).
 */
#define _DEFAULT_SOURCE /* explicit_bzero */
#include "px_dlq_http.h"

#include <inttypes.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "px_admin.h"
#include "px_dlq.h"
#include "px_dlq_json.h"
#include "px_log.h"
#include "px_server.h"

#define MESSAGES_DEFAULT 10
#define MESSAGES_MAX 1000

/* One request's operation, from the route until it is answered or the
 * client is gone. */
typedef struct px_dlq_http_op {
  struct px_dlq_http_op *prev, *next; /* srv->dlq_list */
  px_server *srv;
  px_admin_response *resp;
  px_dlq *op;
  px_dlq_kind kind;
  retry_policy policy; /* the header prefix, for rendering (no rules) */
  unsigned items;
  char user[256];
  char queue[256];
  bool stopping; /* px_dlq_http_stop_all */
} http_op;

/* {"error": text} as the whole answer; `counts` (or NULL) adds what a
 * redrive or purge did before it failed. */
static void json_error_with(px_admin_response *r, int status, const char *text,
                            const px_dlq_result *counts) {
  r->status = status;
  r->content_type = "application/json";
  r->len = 0;
  px_admin_printf(r, "{\"error\":");
  px_admin_json_string(r, text);
  if (counts)
    px_admin_printf(r,
                    ",\"moved\":%" PRIu64 ",\"not_moved\":%" PRIu64
                    ",\"purged\":%" PRIu64,
                    counts->moved, counts->not_moved, counts->purged);
  px_admin_printf(r, "}\n");
}

static void json_error(px_admin_response *r, int status, const char *text) {
  json_error_with(r, status, text, NULL);
}

/* "Basic base64(user:password)" into the request. false if absent or
 * malformed. */
static bool basic_auth(const char *h, px_dlq_request *q) {
  unsigned char raw[PX_ADMIN_MAX_AUTH];
  if (strncasecmp(h, "Basic ", 6) != 0)
    return false;
  h += 6;
  size_t n = strlen(h);
  if (n == 0 || n % 4 || n / 4 * 3 > sizeof raw)
    return false;
  int len = EVP_DecodeBlock(raw, (const unsigned char *)h, (int)n);
  if (len < 0)
    return false;
  len -= (h[n - 1] == '=') + (h[n - 2] == '=');
  char *colon = memchr(raw, ':', (size_t)len);
  size_t ulen = colon ? (size_t)(colon - (char *)raw) : 0;
  size_t plen = colon ? (size_t)len - ulen - 1 : 0;
  bool ok = colon && ulen && ulen < sizeof q->user &&
            plen < sizeof q->password && !memchr(raw, 0, (size_t)len);
  if (ok) {
    memcpy(q->user, raw, ulen);
    q->user[ulen] = '\0';
    memcpy(q->password, colon + 1, plen);
    q->password[plen] = '\0';
  }
  explicit_bzero(raw, sizeof raw);
  return ok;
}

/* Did another web site make a browser send this? (Sec-Fetch-Site says
 * so, or an Origin that is not this endpoint's Host.) A browser may hold
 * Basic credentials for the endpoint and attach them to a form another
 * site posts; curl and scripts send neither header. */
static bool cross_site(const px_admin_request *req) {
  const char *site = req->sec_fetch_site, *o = req->origin;
  if (site[0] && strcmp(site, "same-origin") != 0 && strcmp(site, "none") != 0)
    return true;
  if (!o[0])
    return false;
  if (strncmp(o, "http://", 7) == 0)
    o += 7;
  else if (strncmp(o, "https://", 8) == 0)
    o += 8;
  else
    return true; /* "null", or another scheme */
  return strcasecmp(o, req->host) != 0;
}

/* The request's credentials and parameters; false with the answer
 * written when they are missing or wrong. */
static bool parse_request(const px_admin_request *req, px_dlq_request *q,
                          px_admin_response *r) {
  char limit[32];
  if (cross_site(req)) {
    json_error(r, 403,
               "cross-site request refused: the dead-letter routes answer "
               "their own page and clients that are not browsers");
    return false;
  }
  if (!basic_auth(req->authorization, q)) {
    px_admin_header(r, "WWW-Authenticate", "Basic realm=\"rebound\"");
    json_error(r, 401,
               "credentials needed: HTTP Basic with a broker user and "
               "password (the broker's permissions apply)");
    return false;
  }
  int v = px_admin_param(req->query, "vhost", q->vhost, sizeof q->vhost);
  if (v == 0)
    strcpy(q->vhost, "/");
  int t = px_admin_param(req->query, "to", q->to, sizeof q->to);
  int l = px_admin_param(req->query, "limit", limit, sizeof limit);
  char *end = limit;
  if (l == 1)
    q->limit = strtoull(limit, &end, 10);
  if (v < 0 || t < 0 || l < 0 ||
      (l == 1 && (*end || !limit[0] || limit[0] == '-' || !q->limit))) {
    explicit_bzero(q->password, sizeof q->password);
    json_error(r, 400,
               "bad parameter: vhost and to are percent-encoded names, "
               "limit a whole number >= 1");
    return false;
  }
  return true;
}

/* ---- events ---- */

static void on_count(void *ctx, const px_dlq_count *c) {
  http_op *h = ctx;
  px_admin_printf(h->resp, "%s", h->items++ ? "," : "");
  px_dlq_json_count(h->resp, c);
}

static void on_message(void *ctx, const px_dlq_message *m) {
  http_op *h = ctx;
  px_admin_printf(h->resp, "%s", h->items++ ? "," : "");
  px_dlq_json_message(h->resp, m, &h->policy);
}

/* The end of a successful answer, after what the events appended. */
static void close_json(http_op *h, const px_dlq_result *res) {
  px_admin_response *r = h->resp;
  switch (h->kind) {
  case PX_DLQ_COUNT:
    px_admin_printf(r, "]}\n");
    return;
  case PX_DLQ_SHOW:
    px_admin_printf(r, "],\"total\":%" PRIu64 "}\n", res->total);
    return;
  case PX_DLQ_REDRIVE:
  case PX_DLQ_PURGE:
    r->len = 0;
    px_admin_printf(r, "{\"queue\":");
    px_admin_json_string(r, h->queue);
    if (h->kind == PX_DLQ_PURGE)
      px_admin_printf(r, ",\"purged\":%" PRIu64 "}\n", res->purged);
    else
      px_admin_printf(r,
                      ",\"moved\":%" PRIu64 ",\"not_moved\":%" PRIu64
                      ",\"total\":%" PRIu64 "}\n",
                      res->moved, res->not_moved, res->total);
    return;
  }
}

/* Who changed what, at info: the operator's trail. */
static void log_change(http_op *h, const px_dlq_result *res) {
  if (h->kind == PX_DLQ_REDRIVE)
    px_info("dlq_redrive", PX_S("queue", h->queue), PX_S("user", h->user),
            PX_U("moved", res->moved), PX_U("not_moved", res->not_moved),
            PX_S("status", res->status == PX_DLQ_OK ? "done" : res->error));
  else if (h->kind == PX_DLQ_PURGE)
    px_info("dlq_purge", PX_S("queue", h->queue), PX_S("user", h->user),
            PX_U("purged", res->purged),
            PX_S("status", res->status == PX_DLQ_OK ? "done" : res->error));
}

/* The operation is over (done, or cancelled with its connection). */
static void op_end(http_op *h) {
  px_server *srv = h->srv;
  if (h->prev)
    h->prev->next = h->next;
  else
    srv->dlq_list = h->next;
  if (h->next)
    h->next->prev = h->prev;
  free(h);
  srv->dlq_op_done(srv);
}

static void on_done(void *ctx, const px_dlq_result *res) {
  http_op *h = ctx;
  px_admin_response *r = h->resp;
  log_change(h, res);
  if (res->status == PX_DLQ_OK) {
    close_json(h, res);
  } else {
    bool changes = h->kind == PX_DLQ_REDRIVE || h->kind == PX_DLQ_PURGE;
    char why[1200];
    snprintf(why, sizeof why, "%s%s",
             h->stopping ? "rebound is shutting down (its drain timeout "
                           "passed): "
                         : "",
             res->error);
    json_error_with(r, h->stopping ? 503 : px_dlq_http_status(res->status), why,
                    changes ? res : NULL);
  }
  px_admin_resume(r);
  op_end(h);
}

static void on_cancel(void *state) {
  http_op *h = state;
  px_dlq_cancel(h->op);
  op_end(h);
}

static const px_dlq_events events = {on_count, on_message, NULL, on_done};

/* ---- routes ---- */

/* Start the operation and defer the answer (or answer the failure). */
static void run(px_server *srv, http_op *h, px_dlq_request *q,
                px_admin_response *r) {
  if (srv->draining) { /* nothing would stop it in time */
    explicit_bzero(q->password, sizeof q->password);
    free(h);
    json_error(r, 503,
               "rebound is shutting down: no new dead-letter operations");
    return;
  }
  q->name = "rebound admin";
  snprintf(h->user, sizeof h->user, "%s", q->user);
  h->resp = r;
  h->kind = q->kind;
  snprintf(h->policy.header_prefix, sizeof h->policy.header_prefix, "%s",
           srv->cfg->retry.header_prefix);
  h->op = px_dlq_start(srv->loop, &srv->clock, srv->cfg, &srv->dial_memory,
                       srv->tls_upstream, q, &events, h);
  explicit_bzero(q->password, sizeof q->password);
  if (!h->op) {
    free(h);
    json_error(r, 500, "out of memory");
    return;
  }
  r->content_type = "application/json";
  h->srv = srv;
  h->next = srv->dlq_list;
  if (h->next)
    h->next->prev = h;
  srv->dlq_list = h;
  /* a drain waits for it */
  px_admin_defer(r, on_cancel, h);
}

/* Parse the request into a new op; NULL with the answer written. */
static http_op *begin(const px_admin_request *req, px_dlq_request *q,
                      px_dlq_kind kind, const char *queue,
                      px_admin_response *r) {
  memset(q, 0, sizeof *q);
  q->kind = kind;
  if (!parse_request(req, q, r))
    return NULL;
  http_op *h = calloc(1, sizeof *h);
  if (!h) {
    explicit_bzero(q->password, sizeof q->password);
    json_error(r, 500, "out of memory");
    return NULL;
  }
  snprintf(q->queue, sizeof q->queue, "%s", queue ? queue : "");
  snprintf(h->queue, sizeof h->queue, "%s", q->queue);
  return h;
}

/* `{"key":"value","array":[`: the events append the array's items. */
static void json_head(px_admin_response *r, const char *key, const char *value,
                      const char *array) {
  px_admin_printf(r, "{\"%s\":", key);
  px_admin_json_string(r, value);
  px_admin_printf(r, ",\"%s\":[", array);
}

/* A request whose parameters do not go together: 400, nothing started. */
static void refuse(http_op *h, px_dlq_request *q, px_admin_response *r,
                   const char *why) {
  explicit_bzero(q->password, sizeof q->password);
  free(h);
  json_error(r, 400, why);
}

/* The dead-letter queues of the policies' literal queue names, and of
 * the queues rebound parked messages from. */
static void known_queues(px_server *srv, px_dlq_request *q) {
  const retry_policy *p = &srv->cfg->retry;
  char dlq[RETRY_NAME_MAX + 1];
  px_dlq_add_policy_queues(q, p);
  const px_queues *qs = &srv->metrics.queues;
  for (uint32_t i = 0; i < qs->n; i++) {
    const px_queue_stat *s = &qs->q[i];
    const retry_rule *rule = retry_match(p, s->name, strlen(s->name));
    if (s->n[PX_QC_DEAD_LETTERED] && rule &&
        retry_dlq_name(rule, s->name, strlen(s->name), dlq, sizeof dlq) >= 0)
      px_dlq_add_queue(q, dlq);
  }
}

void px_dlq_http_names(px_server *srv, const px_admin_request *req,
                       const char *queue, px_admin_response *r) {
  px_dlq_request q = {0};
  (void)req, (void)queue;
  known_queues(srv, &q);
  for (unsigned i = 0; i < q.nqueues; i++)
    px_admin_printf(r, "%s\n", q.queues[i]);
}

/* What a route's parameters may not be, for its kind: NULL if fine. */
static const char *misfit(px_dlq_request *q) {
  if (q->kind == PX_DLQ_SHOW && q->limit > MESSAGES_MAX)
    return "limit: at most 1000 messages per request";
  if (q->kind == PX_DLQ_SHOW && !q->limit)
    q->limit = MESSAGES_DEFAULT;
  if (q->kind == PX_DLQ_REDRIVE && strcmp(q->to, q->queue) == 0)
    return "to: the queue redriven itself";
  return NULL;
}

/* One dead-letter route: the request parsed and checked, the answer's
 * head for those that list, the operation started. */
static void route(px_server *srv, const px_admin_request *req,
                  const char *queue, px_admin_response *r, px_dlq_kind kind) {
  px_dlq_request q;
  http_op *h = begin(req, &q, kind, queue, r);
  if (!h)
    return;
  const char *why = misfit(&q);
  if (why) {
    refuse(h, &q, r, why);
    return;
  }
  if (kind == PX_DLQ_COUNT) {
    known_queues(srv, &q);
    json_head(r, "vhost", q.vhost, "queues");
  } else if (kind == PX_DLQ_SHOW) {
    json_head(r, "queue", q.queue, "messages");
  }
  run(srv, h, &q, r);
}

void px_dlq_http_list(px_server *srv, const px_admin_request *req,
                      const char *queue, px_admin_response *r) {
  route(srv, req, queue, r, PX_DLQ_COUNT);
}

void px_dlq_http_messages(px_server *srv, const px_admin_request *req,
                          const char *queue, px_admin_response *r) {
  route(srv, req, queue, r, PX_DLQ_SHOW);
}

void px_dlq_http_redrive(px_server *srv, const px_admin_request *req,
                         const char *queue, px_admin_response *r) {
  route(srv, req, queue, r, PX_DLQ_REDRIVE);
}

void px_dlq_http_purge(px_server *srv, const px_admin_request *req,
                       const char *queue, px_admin_response *r) {
  route(srv, req, queue, r, PX_DLQ_PURGE);
}

/* ---- shutdown ---- */

unsigned px_dlq_http_running(const px_server *srv) {
  unsigned n = 0;
  for (const http_op *h = srv->dlq_list; h; h = h->next)
    n++;
  return n;
}

void px_dlq_http_stop_all(px_server *srv, bool now) {
  for (http_op *h = srv->dlq_list, *next; h; h = next) {
    next = h->next;
    if (!now) {
      h->stopping = true;
      px_dlq_stop(h->op); /* answers in on_done */
      continue;
    }
    px_admin_response *r = h->resp;
    px_dlq_cancel(h->op); /* logs what it had done */
    json_error(r, 503,
               "rebound is shutting down: the operation was cut off before "
               "the broker confirmed every copy in flight (those may now be "
               "in both queues; its log line dlq_cancelled has the counts)");
    px_admin_resume(r); /* an answer, no longer deferred: no cancel */
    op_end(h);
  }
}
