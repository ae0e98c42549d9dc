/* px_status.c - the /v1/status document (px_metrics.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "px_admin.h"
#include "px_metrics.h"
#include "px_server.h"
#include "px_session.h"
#include "px_view.h"
#include "retry_policy.h"

/* ---- /v1/status ------------------------------------------------------------
 */

static void json_string(px_admin_response *r, const char *s) {
  px_admin_json_string(r, s);
}

static void json_addr(px_admin_response *r, const px_addr *a) {
  char buf[300];
  json_string(r, px_addr_format(a, buf, sizeof buf));
}

static void status_config(px_server *srv, px_admin_response *r) {
  const px_config *c = srv->cfg;
  px_admin_printf(r, "\"config\":{\"listen\":");
  json_addr(r, &c->listen);
  px_admin_printf(r, ",\"upstreams\":[");
  for (unsigned i = 0; i < c->n_upstreams; i++) {
    if (i)
      px_admin_append(r, ",", 1);
    json_addr(r, &c->upstream[i]);
  }
  px_admin_printf(r, "],\"admin\":");
  if (c->admin_on)
    json_addr(r, &c->admin);
  else
    json_string(r, "off");
  px_admin_printf(r,
                  ",\"drain_timeout_ms\":%u,\"handshake_timeout_ms\":%u,"
                  "\"cache_per_connection\":%llu,\"cache_total\":%llu,"
                  "\"retry\":{\"header_prefix\":",
                  (unsigned)c->drain_timeout_ms,
                  (unsigned)c->handshake_timeout_ms,
                  (unsigned long long)c->cache_per_connection,
                  (unsigned long long)c->cache_total);
  json_string(r, c->retry.header_prefix);
  px_admin_printf(r, ",\"policies\":[");
  for (unsigned i = 0; i < c->retry.nrules; i++) {
    px_admin_printf(r, "%s", i ? "," : "");
    px_view_policy(r, &c->retry.rules[i]);
  }
  px_admin_printf(r, "]}}");
}

/* The sessions are written a slice at a time, and sessions open and close
 * between slices. The cursor is the id of the last session written:
 * px_session_accept prepends each new session with the next id, so ids
 * decrease along srv->sessions and the walk resumes at the first id below
 * the cursor (skipping newer sessions costs a pointer step each). Sessions
 * opened after the document began are not listed; those that close before
 * their turn are not either. No pointer into a session is kept. */
typedef struct status_stream {
  px_server *srv;
  uint64_t before;  /* list sessions with an id below this */
  uint64_t listed;  /* sessions written so far */
  unsigned pending; /* their retries_pending */
  unsigned delayed; /* their requeues_delayed */
  unsigned blocked; /* their blocked */
  uint64_t now;     /* loop time when the document began */
} status_stream;

static void status_session(status_stream *st, const px_session_snap *s,
                           px_admin_response *r) {
  px_admin_printf(r, "%s{\"id\":%llu,\"peer\":", st->listed ? "," : "",
                  (unsigned long long)s->id);
  json_string(r, s->peer);
  px_admin_printf(r, ",\"user\":");
  json_string(r, s->user);
  px_admin_printf(r, ",\"vhost\":");
  json_string(r, s->vhost);
  px_admin_printf(
      r,
      ",\"state\":\"%s\",\"channels\":%u,\"bytes_from_client\":"
      "%llu,\"bytes_to_client\":%llu,\"age_seconds\":%.3f,"
      "\"retries_pending\":%u,\"requeues_delayed\":%u,"
      "\"cache_bytes\":%llu,\"retry_connection\":\"%s\","
      "\"blocked\":%s}",
      s->state, (unsigned)s->channels, (unsigned long long)s->bytes_from_client,
      (unsigned long long)s->bytes_to_client,
      (double)(st->now - s->started_ms) / 1000.0, (unsigned)s->retries_pending,
      (unsigned)s->requeues_delayed, (unsigned long long)s->cache_bytes,
      s->retry_connection, s->blocked ? "true" : "false");
  st->blocked += s->blocked;
  st->listed++;
  st->pending += s->retries_pending;
  st->delayed += s->requeues_delayed;
  st->before = s->id;
}

/* One slice: sessions until about PX_ADMIN_SLICE bytes, then, once they
 * are all written, the rest of the document. */
static bool status_produce(void *arg, px_admin_response *r) {
  status_stream *st = arg;
  px_server *srv = st->srv;
  const px_session *s = srv->sessions;
  px_session_snap snap;
  while (s && px_session_id(s) >= st->before)
    s = px_session_next(s);
  for (; s && r->len < PX_ADMIN_SLICE; s = px_session_next(s)) {
    px_session_snapshot(s, &snap);
    status_session(st, &snap, r);
  }
  if (s)
    return true;
  px_admin_printf(r,
                  "],\"retries_pending\":%u,\"requeues_delayed\":%u,"
                  "\"blocked\":%u,\"cache_bytes\":%llu,",
                  st->pending, st->delayed, st->blocked,
                  (unsigned long long)srv->stats.cache_bytes);
  status_config(srv, r);
  px_admin_printf(r, ",");
  px_view_summary(srv, r);
  px_admin_printf(r, "}\n");
  return false;
}

/* /v1/status, streamed: the head of the document now, the sessions and the
 * rest in slices (status_produce). */
bool px_status_ready(const px_server *srv) {
  return !srv->draining &&
         (srv->upstream_ok || !srv->cfg->ready_needs_upstream);
}

void px_status_render(px_server *srv, px_admin_response *r) {
  uint64_t now = uv_now(srv->loop);
  status_stream *st = malloc(sizeof *st);
  if (st)
    *st = (status_stream){.srv = srv, .before = srv->next_id + 1, .now = now};
  px_admin_stream(r, status_produce, free, st);
  r->content_type = "application/json";
  px_admin_printf(r,
                  "{\"version\":\"%s\",\"uptime_seconds\":%.3f,"
                  "\"ready\":%s,\"draining\":%s,\"listeners\":[",
                  REBOUND_VERSION, (double)(now - srv->started_ms) / 1000.0,
                  px_status_ready(srv) ? "true" : "false",
                  srv->draining ? "true" : "false");
  json_addr(r, &srv->cfg->listen);
  px_admin_printf(r, "],\"sessions\":[");
}
