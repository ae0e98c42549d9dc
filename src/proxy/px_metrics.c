#include "px_metrics.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <uv.h>

#include "px_admin.h"
#include "px_close.h"
#include "px_server.h"
#include "px_session.h"
#include "px_tls.h"
#include "px_view.h"
#include "px_watch.h"
#include "retry_plan.h"
#include "retry_policy.h"

/* X(px_stats field, name, type, help) */
#define PX_SCALARS(X)                                                          \
  X(sessions_current, "rebound_client_connections", "gauge",                   \
    "Client connections open")                                                 \
  X(sessions_total, "rebound_client_connections_opened_total", "counter",      \
    "Client connections accepted")                                             \
  X(upstream_connections_total, "rebound_upstream_connections_opened_total",   \
    "counter", "Upstream connections established")                             \
  X(frames_c2u, "rebound_frames_from_clients_total", "counter",                \
    "AMQP frames read from clients")                                           \
  X(frames_u2c, "rebound_frames_from_upstream_total", "counter",               \
    "AMQP frames read from the broker")                                        \
  X(bytes_c2u, "rebound_bytes_from_clients_total", "counter",                  \
    "Bytes read from clients")                                                 \
  X(bytes_u2c, "rebound_bytes_from_upstream_total", "counter",                 \
    "Bytes read from the broker")                                              \
  X(protocol_errors, "rebound_protocol_errors_total", "counter",               \
    "Connections closed over a protocol error")                                \
  X(channel_remaps, "rebound_channel_remaps_total", "counter",                 \
    "Client channels carried on another upstream number")                      \
  X(own_channel_yields, "rebound_own_channel_yields_total", "counter",         \
    "Times rebound gave its channel number to a client")                       \
  X(own_channel_errors, "rebound_own_channel_errors_total", "counter",         \
    "Times the broker closed rebound's channel")                               \
  X(cache_bytes, "rebound_cache_bytes", "gauge",                               \
    "Bytes of deliveries kept for retry")                                      \
  X(cache_entries, "rebound_cache_entries", "gauge",                           \
    "Deliveries kept for retry")                                               \
  X(uncached_deliveries, "rebound_uncached_deliveries_total", "counter",       \
    "Deliveries of intercepted queues not kept (cache bound)")                 \
  X(uncached_nacks, "rebound_uncached_nacks_total", "counter",                 \
    "Requeues of deliveries not kept (cache bound), passed through")           \
  X(topology_errors, "rebound_topology_errors_total", "counter",               \
    "Tier or dead-letter declares the broker refused")                         \
  X(connections_refused, "rebound_client_connections_refused_total",           \
    "counter", "Client connections refused over --max-connections")            \
  X(accept_errors, "rebound_accept_errors_total", "counter",                   \
    "Failed accepts of client connections (e.g. out of file descriptors)")     \
  X(upstream_blocked_total, "rebound_upstream_blocks_total", "counter",        \
    "Times the broker blocked the connection rebound publishes copies on")     \
  X(retry_connections_total, "rebound_retry_connections_opened_total",         \
    "counter", "Separate connections opened for retry copies")                 \
  X(retry_connection_failures, "rebound_retry_connection_failures_total",      \
    "counter", "Separate retry connections that could not log in")             \
  X(processing_timeouts, "rebound_processing_timeouts_total", "counter",       \
    "Deliveries unsettled past their policy's processing_timeout, copied "     \
    "and acked by rebound")                                                    \
  X(late_settles_swallowed, "rebound_late_settles_swallowed_total", "counter", \
    "Client acks, nacks and rejects of timed-out deliveries, not passed on")   \
  X(tx_rolled_back, "rebound_retries_rolled_back_total", "counter",            \
    "Originals rebound acked for a retry inside a client's transaction that "  \
    "its tx.rollback took back (copy and original both remain)")               \
  X(counts_unreadable, "rebound_retry_counts_unreadable_total", "counter",     \
    "Failures whose retry count header was not a non-negative integer, "       \
    "counted as a first attempt")                                              \
  X(settles_split, "rebound_settles_split_total", "counter",                   \
    "Client multiple acks and nacks sent upstream around deliveries whose "    \
    "retry was waiting")                                                       \
  X(consumer_lost, "rebound_consumer_lost_total", "counter",                   \
    "Deliveries counted as a failed attempt because their consumer went "      \
    "without settling them")                                                   \
  X(tiers_unwatched, "rebound_tiers_unwatched_total", "counter",               \
    "Copies into a tier or dead-letter queue rebound could not watch (no "     \
    "room, or no login it can use)")                                           \
  X(tier_watch_failures, "rebound_tier_watch_failures_total", "counter",       \
    "Looks at the tiers and dead-letter queues that failed")

/* A label value in the exposition format: backslash, quote, newline
 * escaped. */
static void put_label(px_admin_response *r, const char *name, const char *v) {
  px_admin_printf(r, "%s=\"", name);
  for (const char *p = v; *p; p++) {
    if (*p == '\\' || *p == '"')
      px_admin_printf(r, "\\%c", *p);
    else if (*p == '\n')
      px_admin_append(r, "\\n", 2);
    else
      px_admin_append(r, p, 1);
  }
  px_admin_append(r, "\"", 1);
}

static void head(px_admin_response *r, const char *name, const char *type,
                 const char *help) {
  px_admin_printf(r, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void render_labelled(px_server *srv, px_admin_response *r) {
  px_metrics_store *m = &srv->metrics;
  for (int id = 0; id < PX_M_COUNT; id++) {
    head(r, px_counter_families[id].name, "counter",
         px_counter_families[id].help);
    for (uint32_t i = 0; i < m->n; i++) {
      px_counter *c = &m->counters[i];
      if (c->id != id)
        continue;
      px_admin_printf(r, "%s{", px_counter_families[id].name);
      put_label(r, px_counter_families[id].l1, c->v1);
      if (px_counter_families[id].l2) {
        px_admin_append(r, ",", 1);
        put_label(r, px_counter_families[id].l2, c->v2);
      }
      px_admin_printf(r, "} %llu\n", (unsigned long long)c->n);
    }
  }
}

static void render_hist(px_admin_response *r, const char *name,
                        const px_hist *h, const char *label,
                        const char *value) {
  for (int i = 0; i <= PX_HIST_BUCKETS; i++) {
    px_admin_printf(r, "%s_bucket{", name);
    if (label) {
      put_label(r, label, value);
      px_admin_append(r, ",", 1);
    }
    if (i < PX_HIST_BUCKETS)
      px_admin_printf(r, "le=\"%g\"} %llu\n",
                      (double)px_hist_bucket_us[i] / 1e6,
                      (unsigned long long)h->buckets[i]);
    else
      px_admin_printf(r, "le=\"+Inf\"} %llu\n", (unsigned long long)h->count);
  }
  const char *suffix[2] = {"_sum", "_count"};
  for (int k = 0; k < 2; k++) {
    px_admin_printf(r, "%s%s", name, suffix[k]);
    if (label) {
      px_admin_append(r, "{", 1);
      put_label(r, label, value);
      px_admin_append(r, "}", 1);
    }
    if (k == 0)
      px_admin_printf(r, " %.6f\n", (double)h->sum_us / 1e6);
    else
      px_admin_printf(r, " %llu\n", (unsigned long long)h->count);
  }
}

static void render_histograms(px_server *srv, px_admin_response *r) {
  px_metrics_store *m = &srv->metrics;
  head(r, "rebound_retry_latency_seconds", "histogram",
       "From a client's nack to rebound's ack of the original (copy "
       "published and confirmed)");
  render_hist(r, "rebound_retry_latency_seconds", &m->retry, NULL, NULL);
  head(r, "rebound_publish_confirm_seconds", "histogram",
       "From a client's publish to the broker's confirm (confirm mode)");
  render_hist(r, "rebound_publish_confirm_seconds", &m->confirm, NULL, NULL);
  head(r, "rebound_consumer_processing_seconds", "histogram",
       "From a delivery to the client's ack, nack or reject, by queue");
  for (uint32_t q = 0; m->processing && q <= PX_METRICS_MAX_QUEUES; q++)
    if (m->processing[q].count)
      render_hist(r, "rebound_consumer_processing_seconds", &m->processing[q],
                  "queue", px_metrics_queue_label(srv, (int)q));
}

/* The process's virtual and resident size in bytes, from /proc/self/statm. */
static void memory_bytes(double *virt, double *rss) {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
      pages = resident = 0;
    fclose(f);
  }
  *virt = (double)pages * (double)sysconf(_SC_PAGESIZE);
  *rss = (double)resident * (double)sysconf(_SC_PAGESIZE);
}

static long open_fds(void) {
  long n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d)
    return -1;
  for (struct dirent *e; (e = readdir(d));)
    n += e->d_name[0] != '.';
  closedir(d);
  return n - 1; /* the directory's own fd */
}

static void gauge(px_admin_response *r, const char *name, const char *help,
                  double v) {
  head(r, name, "gauge", help);
  px_admin_printf(r, "%s %.17g\n", name, v);
}

/* The expiry of every certificate rebound serves or presents. */
static void render_tls(px_server *srv, px_admin_response *r) {
  const struct {
    px_tls_ctx *ctx;
    const char *side;
  } certs[] = {{srv->tls_server, "client"}, {srv->tls_upstream, "upstream"}};
  bool any = false;
  for (size_t i = 0; i < sizeof certs / sizeof certs[0]; i++) {
    long long t = certs[i].ctx ? px_tls_ctx_not_after(certs[i].ctx) : 0;
    if (!t)
      continue;
    if (!any)
      head(r, "rebound_tls_certificate_expiry_seconds", "gauge",
           "When a certificate rebound serves (side client) or presents to "
           "upstreams (side upstream) expires, seconds since the epoch");
    any = true;
    px_admin_printf(r,
                    "rebound_tls_certificate_expiry_seconds{side=\"%s\"} "
                    "%lld\n",
                    certs[i].side, t);
  }
}

/* Unsettled deliveries per queue label: how many, the age of the oldest,
 * and how many are older than --stuck-after. */
static void render_unsettled(px_server *srv, px_admin_response *r) {
  px_view_unsettled per[PX_METRICS_MAX_QUEUES + 1];
  uint64_t now_us = px_clock_us(&srv->clock);
  px_view_scan(srv, per, PX_METRICS_MAX_QUEUES + 1, NULL, 0);
  static const char *const names[] = {"rebound_unsettled_deliveries",
                                      "rebound_unsettled_oldest_seconds",
                                      "rebound_unsettled_stuck"};
  static const char *const helps[] = {
      "Deliveries their consumers have not settled yet, by queue",
      "Age of the oldest delivery not settled yet, by queue",
      "Deliveries unsettled for longer than --stuck-after, by queue"};
  for (int k = 0; k < 3; k++) {
    head(r, names[k], "gauge", helps[k]);
    for (uint32_t q = 0; q <= PX_METRICS_MAX_QUEUES; q++) {
      if (!per[q].n)
        continue;
      px_admin_printf(r, "%s{", names[k]);
      put_label(r, "queue", px_metrics_queue_label(srv, (int)q));
      if (k == 1)
        px_admin_printf(r, "} %.3f\n",
                        (double)(now_us - per[q].oldest_us) / 1e6);
      else
        px_admin_printf(r, "} %u\n", k == 0 ? per[q].n : per[q].stuck);
    }
  }
}

/* The watched tiers and dead-letter queues (px_watch.h), one family at
 * a time. */
enum { W_DEPTH, W_AGE, W_OVERDUE, W_DLQ_DEPTH, W_MISSING, W_NAME, W_FAMILIES };

static const char *const watch_names[W_FAMILIES] = {
    "rebound_tier_depth",           "rebound_tier_oldest_age_seconds",
    "rebound_tier_overdue",         "rebound_dead_letter_depth",
    "rebound_source_queue_missing", "rebound_tier_queue_info"};

static const char *const watch_helps[W_FAMILIES] = {
    "Copies waiting in a delay tier at rebound's last look, by source queue "
    "and tier",
    "Age of the oldest copy in a delay tier at rebound's last look",
    "1 when a delay tier's oldest copy is older than its delay plus "
    "--tier-grace: the broker is not giving copies back",
    "Messages in a dead-letter queue rebound parked messages in",
    "1 when a source queue with copies in its tiers does not exist: the "
    "broker drops them when they expire",
    "1 for each delay tier rebound watches; name: its queue on the broker"};

typedef struct watch_render {
  px_admin_response *r;
  int family;
} watch_render;

static void watch_series(void *ctx, const px_watch_info *q) {
  watch_render *w = ctx;
  double v;
  switch (w->family) {
  case W_DEPTH:
  case W_AGE:
  case W_OVERDUE:
    if (q->dead_letter || q->depth < 0 ||
        (w->family == W_AGE && q->oldest_age_s < 0))
      return;
    v = w->family == W_DEPTH ? (double)q->depth
        : w->family == W_AGE ? q->oldest_age_s
                             : q->overdue;
    break;
  case W_DLQ_DEPTH:
    if (!q->dead_letter || q->depth < 0)
      return;
    v = (double)q->depth;
    break;
  case W_MISSING: /* per tier; the merge keeps the largest */
    if (q->dead_letter)
      return;
    v = q->source_missing && q->depth != 0; /* as the flag and the log */
    break;
  default: /* W_NAME */
    if (q->dead_letter)
      return;
    v = 1;
    break;
  }
  px_admin_printf(w->r, "%s{", watch_names[w->family]);
  put_label(w->r, "queue", q->source);
  if (w->family != W_DLQ_DEPTH) {
    px_admin_append(w->r, ",", 1);
    put_label(w->r, "tier", q->tier);
  }
  if (w->family == W_NAME) {
    px_admin_append(w->r, ",", 1);
    put_label(w->r, "name", q->queue);
  }
  px_admin_printf(w->r, "} %.17g\n", v);
}

static void render_watch(px_server *srv, px_admin_response *r) {
  for (int k = 0; k < W_FAMILIES; k++) {
    watch_render w = {r, k};
    head(r, watch_names[k], "gauge", watch_helps[k]);
    px_watch_each(srv, watch_series, &w);
  }
}

/* The process metrics every Prometheus client library exports, under
 * their standard names, so dashboards made for them work unchanged. */
static void render_process(px_server *srv, px_admin_response *r) {
  struct rusage ru;
  double cpu = 0, virt, rss, max_fds = -1;
  if (getrusage(RUSAGE_SELF, &ru) == 0)
    cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
          (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    max_fds = (double)rl.rlim_cur;
  memory_bytes(&virt, &rss);
  head(r, "process_cpu_seconds_total", "counter",
       "Total user and system CPU time spent in seconds");
  px_admin_printf(r, "process_cpu_seconds_total %.6f\n", cpu);
  gauge(r, "process_resident_memory_bytes", "Resident memory size in bytes",
        rss);
  gauge(r, "process_virtual_memory_bytes", "Virtual memory size in bytes",
        virt);
  gauge(r, "process_open_fds", "Number of open file descriptors",
        (double)open_fds());
  gauge(r, "process_max_fds", "Maximum number of open file descriptors",
        max_fds);
  gauge(r, "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds",
        srv->started_unix);
}

/* Always 1; its labels say what is running. */
static void render_build_info(px_admin_response *r) {
  head(r, "rebound_build_info", "gauge",
       "rebound's version and the libraries it runs with");
  px_admin_printf(r, "rebound_build_info{");
  put_label(r, "version", REBOUND_VERSION);
  px_admin_append(r, ",", 1);
  put_label(r, "libuv", uv_version_string());
  px_admin_append(r, ",", 1);
  put_label(r, "openssl", OpenSSL_version(OPENSSL_VERSION));
  px_admin_printf(r, "} 1\n");
}

static void render_admin(px_server *srv, px_admin_response *r) {
  const struct {
    const char *name, *help;
    uint64_t v;
  } admin[] = {
      {"rebound_admin_requests_total", "Requests to the admin endpoint",
       srv->admin.stats.requests},
      {"rebound_admin_connections_refused_total",
       "Admin connections refused at the cap (none idle to close)",
       srv->admin.stats.conns_refused},
      {"rebound_admin_connections_evicted_total",
       "Idle admin keep-alive connections closed to make room at the cap",
       srv->admin.stats.conns_evicted},
  };
  for (size_t i = 0; i < sizeof admin / sizeof admin[0]; i++) {
    head(r, admin[i].name, "counter", admin[i].help);
    px_admin_printf(r, "%s %llu\n", admin[i].name,
                    (unsigned long long)admin[i].v);
  }
}

/* The reasons a retry passes a requeue through (try_retry's): the
 * policy's and the proxy's own. */
static void declare_pass_reasons(px_server *srv, int id) {
  for (int r = RETRY_PASS_NONE + 1; r < RETRY_PASS_COUNT; r++)
    px_metrics_declare(srv, id, retry_pass_reason_str(r), NULL);
  px_metrics_declare(srv, id, PX_PASS_REFUSED, NULL);
  px_metrics_declare(srv, id, PX_PASS_NO_FIT, NULL);
  px_metrics_declare(srv, id, PX_PASS_NO_QUEUE, NULL);
}

/* Fallbacks by how the copy failed; held requeues by any reason no
 * retry was made. A requeue on an untracked channel is never held. */
static void declare_retry_reasons(px_server *srv) {
  declare_pass_reasons(srv, PX_M_PASSTHROUGH);
  px_metrics_declare(srv, PX_M_PASSTHROUGH, PX_PASS_UNTRACKED, NULL);
  declare_pass_reasons(srv, PX_M_DELAYED);
  for (int w = 0; w < PX_WHY_COUNT; w++) {
    if (w < PX_WHY_FAILURES)
      px_metrics_declare(srv, PX_M_FALLBACKS, px_why_text[w], NULL);
    px_metrics_declare(srv, PX_M_DELAYED, px_why_text[w], NULL);
  }
}

void px_metrics_declare_known(px_server *srv) {
  const px_config *cfg = srv->cfg;
  for (int r = PX_CR_NONE + 1; r < PX_CR_COUNT; r++)
    px_metrics_declare(srv, PX_M_CLOSES, px_close_text(r), NULL);
  declare_retry_reasons(srv);
  char addr[300];
  bool amqps = false;
  for (unsigned i = 0; i < cfg->n_upstreams; i++) {
    px_metrics_declare(srv, PX_M_CONNECT_FAILURES,
                       px_addr_format(&cfg->upstream[i], addr, sizeof addr),
                       NULL);
    amqps |= cfg->upstream[i].tls;
  }
  px_metrics_declare_queues(srv);
  if (cfg->tls.listen_on)
    px_metrics_declare(srv, PX_M_TLS_HANDSHAKES, "client", NULL);
  if (amqps)
    px_metrics_declare(srv, PX_M_TLS_HANDSHAKES, "upstream", NULL);
}

void px_metrics_render(px_server *srv, px_admin_response *r) {
  const px_stats *st = &srv->stats;
  unsigned upstream = 0, pending = 0, delayed = 0, blocked = 0, pubs = 0;
  px_session_snap snap;
  for (const px_session *s = srv->sessions; s; s = px_session_next(s)) {
    px_session_snapshot(s, &snap);
    upstream += snap.upstream_connected;
    pending += snap.retries_pending;
    delayed += snap.requeues_delayed;
    blocked += snap.blocked;
    pubs += snap.retry_connection_open;
  }
  r->content_type = "text/plain; version=0.0.4; charset=utf-8";
#define PX__SCALAR(field, name, type, help)                                    \
  head(r, name, type, help);                                                   \
  px_admin_printf(r, "%s %llu\n", name, (unsigned long long)st->field);
  PX_SCALARS(PX__SCALAR)
#undef PX__SCALAR
  gauge(r, "rebound_upstream_connections", "Upstream connections open",
        upstream);
  gauge(r, "rebound_retries_pending",
        "Copies published and awaiting the broker's confirm", pending);
  gauge(r, "rebound_requeues_delayed",
        "Requeues held back for their tier delay", delayed);
  gauge(r, "rebound_upstream_blocked",
        "Connections rebound publishes copies on that the broker blocks now "
        "(resource alarm)",
        blocked);
  gauge(r, "rebound_retry_connections",
        "Separate connections for retry copies, logged in", pubs);
  render_labelled(srv, r);
  render_histograms(srv, r);
  render_unsettled(srv, r);
  render_watch(srv, r);
  render_tls(srv, r);
  gauge(r, "rebound_ready", "1 when /readyz answers ready",
        px_status_ready(srv));
  gauge(r, "rebound_uptime_seconds", "Seconds since start",
        (double)(uv_now(srv->loop) - srv->started_ms) / 1000.0);
  render_process(srv, r);
  render_build_info(r);
  render_admin(srv, r);
}
