/* px_server.h - the listener, the set of sessions, shutdown.
 *
 * One per process, on one libuv loop. It accepts clients, creates a session
 * for each (px_session.h), and on SIGTERM/SIGINT stops accepting, asks
 * every session to close (connection.close 320) and exits once they are
 * gone or the drain timeout passes.
 */
#ifndef PX_SERVER_H
#define PX_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "px_config.h"

struct px_session;

typedef struct px_stats {
  uint64_t sessions_total;
  uint64_t sessions_current;
  uint64_t upstream_connect_failures;
  uint64_t protocol_errors;
  uint64_t channel_remaps;
  uint64_t own_channel_yields;
  uint64_t own_channel_errors;
  uint64_t cache_bytes;
  uint64_t cache_entries;
  uint64_t uncached_deliveries;
  uint64_t retries_published; /* copies confirmed into a tier */
  uint64_t dead_lettered;     /* copies confirmed into a DLQ */
  uint64_t retry_fallbacks;   /* nack forwarded after a failed copy */
  uint64_t retry_passthrough; /* requeues forwarded by policy */
  uint64_t topology_errors;   /* declares the broker refused */
  uint64_t retry_latency_us_sum, retry_latency_count, retry_latency_us_max;
} px_stats;

typedef struct px_server {
  uv_loop_t *loop;
  const px_config *cfg;
  uv_tcp_t listener;
  uv_signal_t sigterm, sigint;
  uv_timer_t drain_timer;
  struct px_session *sessions; /* doubly linked */
  uint64_t next_id;
  bool draining;
  px_stats stats;
} px_server;

/* Bind the listener and install signal handlers on `loop`. Returns 0 or a
 * negative libuv error (logged). `cfg` must outlive the server. */
int px_server_start(px_server *srv, uv_loop_t *loop, const px_config *cfg);

/* Called by a session when it has fully closed and is about to be freed. */
void px_server_session_gone(px_server *srv, struct px_session *s);

#endif
