/* px_dlq_http.h - the admin endpoint's dead-letter routes (README, "Dead
 * letters"): each request runs one px_dlq operation on the proxy's loop
 * and is answered when it is done (px_admin_defer), so a long redrive
 * never blocks the loop.
 *
 * Credentials: HTTP Basic on the request, passed to the broker as PLAIN;
 * the broker's permissions decide. No Authorization -> 401; the broker
 * refuses -> 403 with its text; no such queue -> 404; no broker -> 502.
 * Query parameters: vhost (default "/"), limit, to (redrive). Answers are
 * JSON (px_dlq_json.h); errors {"error": "..."}.
 */
#ifndef PX_DLQ_HTTP_H
#define PX_DLQ_HTTP_H

#include <stdbool.h>

#include "px_admin.h"

struct px_server;

/* The page served at "/" (src/proxy/admin_page.html, embedded). */
extern const unsigned char px_admin_page[];
extern const size_t px_admin_page_len;

/* GET /v1/dlq: the dead-letter queues rebound knows (those of policies
 * naming a queue without a wildcard, and those it parked messages into
 * since it started) with their counts. */
void px_dlq_http_list(struct px_server *srv, const px_admin_request *req,
                      const char *queue, px_admin_response *r);
/* GET /v1/dlq/names: the same names, one per line, without asking the
 * broker (no credentials: names only, as /v1/queues shows). */
void px_dlq_http_names(struct px_server *srv, const px_admin_request *req,
                       const char *queue, px_admin_response *r);
/* GET /v1/dlq/{queue}/messages?limit=N (default 10, at most 1000) */
void px_dlq_http_messages(struct px_server *srv, const px_admin_request *req,
                          const char *queue, px_admin_response *r);
/* POST /v1/dlq/{queue}/redrive?limit=N&to=QUEUE */
void px_dlq_http_redrive(struct px_server *srv, const px_admin_request *req,
                         const char *queue, px_admin_response *r);
/* POST /v1/dlq/{queue}/purge?limit=N */
void px_dlq_http_purge(struct px_server *srv, const px_admin_request *req,
                       const char *queue, px_admin_response *r);

/* How many operations are running. */
unsigned px_dlq_http_running(const struct px_server *srv);

/* The drain timeout has passed. Each operation still running stops
 * taking messages, settles the copies in flight (px_dlq_stop) and answers
 * 503 with what it did; with `now`, it is cut off at once instead
 * (px_dlq_cancel) and answers 503 saying so. */
void px_dlq_http_stop_all(struct px_server *srv, bool now);

/* How long the operations get to settle after the drain timeout. */
#define PX_DLQ_STOP_MS 2000

#endif
