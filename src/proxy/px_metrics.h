/* px_metrics.h - rebound's metrics rendered for Prometheus (text
 * exposition format 0.0.4), and /v1/status.
 *
 * Three kinds: scalars read from px_stats (PX_SCALARS), the labelled
 * counters and histograms of px_counters.h, and gauges summed over the
 * sessions' snapshots (px_session.h).
 */
#ifndef PX_METRICS_H
#define PX_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "px_counters.h"

struct px_server;
struct px_admin_response;

/* Write every metric in Prometheus text format into `resp`. */
void px_metrics_render(struct px_server *srv, struct px_admin_response *resp);

/* Make the labelled counters' series for the label values known from the
 * config and the code (close reasons, pass-through reasons, upstream
 * addresses, TLS sides) exist at 0. Called at start and after a reload. */
void px_metrics_declare_known(struct px_server *srv);

/* Merge `n` expositions of this renderer (the first is worker 0's) into
 * one, appended to `resp`: each family once, in the order first seen;
 * each series once, its values summed, except rebound_ready,
 * rebound_uptime_seconds, rebound_build_info, process_start_time_seconds
 * and rebound_tls_certificate_expiry_seconds (the first text's),
 * rebound_unsettled_oldest_seconds, the watched queues' gauges
 * (px_watch.h) and process_open_fds (the largest) and
 * process_max_fds (the smallest). Of a text with
 * counters_only[i] (counters_only may be NULL: none), only the series of
 * counter and histogram families count. Returns 0, or -1 when out of memory. */
int px_metrics_merge(const char *const *texts, const size_t *lens,
                     const bool *counters_only, unsigned n,
                     struct px_admin_response *resp);

/* /v1/status: listeners, sessions (peer, user, vhost, channels, bytes,
 * age), pending retries, cache bytes, the effective config (it holds no
 * secrets: credentials never reach rebound's config). JSON. */
void px_status_render(struct px_server *srv, struct px_admin_response *resp);
/* /readyz's answer: not draining, and an upstream answered the probe (or
 * a session) unless --ready-needs-upstream is off. */
bool px_status_ready(const struct px_server *srv);

#endif
