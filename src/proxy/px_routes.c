/* px_routes.c - the admin endpoint's routes (px_routes.h). */
#include "px_routes.h"

#include <string.h>

#include "px_dlq_http.h"
#include "px_metrics.h"
#include "px_server.h"
#include "px_view.h"
#include "px_workers.h"

#define SEGMENT_MAX 256 /* a decoded {} segment: an AMQP queue name and NUL */

typedef void (*route_fn)(px_server *srv, const px_admin_request *req,
                         const char *segment, px_admin_response *r);

static void route_page(px_server *srv, const px_admin_request *req,
                       const char *segment, px_admin_response *r) {
  (void)srv, (void)req, (void)segment;
  r->content_type = "text/html; charset=utf-8";
  px_admin_header(r, "Cache-Control", "no-store");
  px_admin_header(r, "Content-Security-Policy",
                  "default-src 'self'; script-src 'unsafe-inline'; "
                  "style-src 'unsafe-inline'; frame-ancestors 'none'");
  px_admin_append(r, px_admin_page, px_admin_page_len);
}

static void route_healthz(px_server *srv, const px_admin_request *req,
                          const char *segment, px_admin_response *r) {
  (void)srv, (void)req, (void)segment;
  px_admin_printf(r, "ok\n");
}

static void route_readyz(px_server *srv, const px_admin_request *req,
                         const char *segment, px_admin_response *r) {
  (void)req, (void)segment;
  const char *why =
      srv->upstream_err[0] ? srv->upstream_err : "upstream not checked yet";
  if (srv->draining) {
    r->status = 503;
    px_admin_printf(r, "not ready: draining (shutting down)\n");
  } else if (!px_status_ready(srv)) {
    r->status = 503;
    px_admin_printf(r, "not ready: %s\n", why);
  } else if (!srv->upstream_ok) {
    px_admin_printf(r, "ready (upstream: %s)\n", why);
  } else {
    px_admin_printf(r, "ready\n");
  }
}

static void route_metrics(px_server *srv, const px_admin_request *req,
                          const char *segment, px_admin_response *r) {
  (void)req, (void)segment;
  if (!px_workers_render(srv, 'M', r))
    px_metrics_render(srv, r);
}

static void route_status(px_server *srv, const px_admin_request *req,
                         const char *segment, px_admin_response *r) {
  (void)req, (void)segment;
  if (!px_workers_render(srv, 'S', r))
    px_status_render(srv, r);
}

static void route_queues(px_server *srv, const px_admin_request *req,
                         const char *segment, px_admin_response *r) {
  (void)req, (void)segment;
  px_view_queues_render(srv, r);
}

/* "{}" in a pattern stands for one path segment (percent-encoded, not
 * empty), passed to the route decoded. */
static const struct route {
  const char *pattern;
  const char *method; /* GET (and HEAD) or POST */
  route_fn fn;
} routes[] = {
    {"/", "GET", route_page},
    {"/healthz", "GET", route_healthz},
    {"/readyz", "GET", route_readyz},
    {"/metrics", "GET", route_metrics},
    {"/v1/status", "GET", route_status},
    {"/v1/queues", "GET", route_queues},
    {"/v1/dlq", "GET", px_dlq_http_list},
    {"/v1/dlq/names", "GET", px_dlq_http_names},
    {"/v1/dlq/{}/messages", "GET", px_dlq_http_messages},
    {"/v1/dlq/{}/redrive", "POST", px_dlq_http_redrive},
    {"/v1/dlq/{}/purge", "POST", px_dlq_http_purge},
};

/* Does `path` fit `pattern`? The {} segment is decoded into `seg`. */
static bool match(const char *pattern, const char *path, char *seg, bool *bad) {
  const char *hole = strstr(pattern, "{}");
  if (!hole)
    return strcmp(pattern, path) == 0;
  size_t pre = (size_t)(hole - pattern);
  if (strncmp(pattern, path, pre) != 0)
    return false;
  const char *start = path + pre, *end = strchr(start, '/');
  const char *tail = hole + 2;
  if (!end || end == start || strcmp(end, tail) != 0)
    return false;
  *bad = px_admin_decode(start, (size_t)(end - start), seg, SEGMENT_MAX) != 0;
  return true;
}

static void not_found(px_admin_response *r) {
  r->status = 404;
  px_admin_printf(r, "not found: try /, /healthz, /readyz, /metrics, "
                     "/v1/status, /v1/queues, /v1/dlq\n");
}

void px_routes_route(void *ctx, const px_admin_request *req,
                     px_admin_response *r) {
  char seg[SEGMENT_MAX] = ""; /* the routes without a {} get "" */
  const char *allow = NULL;
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
    bool bad = false;
    if (!match(routes[i].pattern, req->path, seg, &bad))
      continue;
    if (bad) {
      r->status = 400;
      px_admin_printf(r,
                      "bad path: %s (a queue name percent-encoded, at "
                      "most 255 bytes)\n",
                      req->path);
      return;
    }
    if (strcmp(req->method, routes[i].method) == 0) {
      routes[i].fn(ctx, req, seg, r);
      return;
    }
    allow = strcmp(routes[i].method, "GET") == 0 ? "GET, HEAD" : "POST";
  }
  if (!allow) {
    not_found(r);
    return;
  }
  r->status = 405;
  px_admin_header(r, "Allow", allow);
  px_admin_printf(r, "method not allowed\n");
}
