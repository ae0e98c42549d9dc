/* px_server.h - the listener, the set of sessions, shutdown.
 *
 * One per process, on one libuv loop. It accepts clients, creates a session
 * for each (px_session.h), and on SIGTERM/SIGINT stops accepting, asks
 * every session to close (connection.close 320) and exits once they are
 * gone or the drain timeout passes. SIGHUP reloads the config; SIGUSR1 and
 * SIGUSR2 are logged and ignored.
 *
 * A client over the connection cap, or one that arrives when too few file
 * descriptors are left for it and its upstream socket, is accepted and
 * closed at once (no AMQP), counted (connections_refused, accept_errors)
 * and logged at most once per PX_LOG_LIMIT_MS per cause.
 */
#ifndef PX_SERVER_H
#define PX_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "px_admin.h"
#include "px_clock.h"
#include "px_config.h"
#include "px_dial.h"
#include "px_log.h"
#include "px_probe.h"
#include "px_queues.h"

struct px_session;
struct px_workers;

typedef struct px_stats {
  uint64_t sessions_total;
  uint64_t sessions_current;
  uint64_t upstream_connections_total;
  uint64_t protocol_errors;
  uint64_t channel_remaps;
  uint64_t own_channel_yields;
  uint64_t own_channel_errors;
  uint64_t cache_bytes;
  uint64_t cache_entries;
  uint64_t uncached_deliveries;
  uint64_t uncached_nacks;         /* requeues of those: passed through */
  uint64_t topology_errors;        /* declares the broker refused */
  uint64_t frames_c2u, frames_u2c; /* frames read from clients / broker */
  uint64_t bytes_c2u, bytes_u2c;
  uint64_t connections_refused;       /* over --max-connections */
  uint64_t accept_errors;             /* accept() failed (fd limit, ...) */
  uint64_t upstream_blocked_total;    /* connection.blocked for rebound's
                                         channel's connection */
  uint64_t retry_connections_total;   /* separate retry connections opened */
  uint64_t retry_connection_failures; /* ... that could not log in */
  uint64_t processing_timeouts;       /* deliveries rebound acked for it */
  uint64_t late_settles_swallowed;    /* client settles of those */
  uint64_t settles_split; /* multiple settles sent around waiting retries */
  uint64_t retried_total; /* copies confirmed into a tier */
  uint64_t dead_lettered_total; /* ... into a dead-letter queue */
  uint64_t tx_rolled_back;      /* rebound's acks a tx.rollback undid */
  uint64_t counts_unreadable;   /* count headers not an integer >= 0 */
  uint64_t consumer_lost;       /* deliveries counted for it */
  uint64_t tiers_unwatched;     /* queues px_watch had no room or login for */
  uint64_t tier_watch_failures; /* its looks that failed (px_watch.h) */
} px_stats;

#define PX_HIST_BUCKETS 13
#define PX_JANITOR_MS 250 /* periodic checks and processing timeouts */

typedef struct px_hist {
  uint64_t buckets[PX_HIST_BUCKETS]; /* cumulative, see px_metrics.c */
  uint64_t sum_us, count;
} px_hist;

typedef struct px_counter {
  int id;
  char v1[256];
  char v2[64];
  uint64_t n;
} px_counter;

/* Labelled counters and the retry histogram (px_metrics.c). */
typedef struct px_metrics_store {
  px_counter *counters;
  uint32_t n, cap;
  px_queues queues;    /* every queue seen; the first 100 are labels */
  px_hist retry;       /* nack -> ack of the original */
  px_hist confirm;     /* client publish -> broker confirm */
  px_hist *processing; /* deliver -> settle, per queue label (+ other) */
} px_metrics_store;

typedef struct px_server {
  uv_loop_t *loop;
  px_clock clock; /* the time and the deadlines of the core (sessions) */
  /* the last retry_summary line: when, and the totals it gave */
  struct {
    uint64_t at_ms, retried, dead_lettered;
  } summary;
  const px_config *cfg;
  uv_tcp_t *listener;     /* heap: a reload may replace it; NULL once closed
                             (or --listen off) */
  uv_tcp_t *tls_listener; /* the same for --tls-listen */
  /* TLS contexts (px_tls.h): the TLS listener's, and the one for amqps
   * upstreams; a reload replaces them, open connections keep theirs */
  struct px_tls_ctx *tls_server, *tls_upstream;
  uv_signal_t sigterm, sigint, sighup, sigusr1, sigusr2;
  /* how the config was given, to read it again on SIGHUP */
  int argc;
  char **argv;
  const char *(*env)(const char *);
  /* bumped by each reload. A retry_rule pointer recorded with a
   * generation (px_track.h) is used only while that generation is
   * current, which is what lets a reload free the config it replaces. */
  uint32_t cfg_gen;
  /* rebound's header names (prefix + suffix) of the configuration in
   * use, built once per generation (px_retry.c); names_gen is cfg_gen + 1
   * once built */
  uint32_t names_gen;
  char header_names[7][RETRY_NAME_MAX + 1];
  uint64_t cfg_since_ms; /* loop time of the start, or the last reload */
  bool policy_logged[PX_MAX_RULES]; /* unmatched, logged (px_view.c) */
  uv_timer_t janitor_timer;         /* px_view_check, processing timeouts */
  uint32_t shortest_timeout_ms;     /* of any policy (0: none) */
  uv_timer_t drain_timer;
  struct px_session *sessions; /* doubly linked */
  /* a session was freed (px_server_start() sets it; NULL: nothing to do) */
  void (*session_gone)(struct px_server *srv);
  /* the transport of the retry connections (NULL: plain TCP; a test's) */
  const struct px_conn_io *pub_io;
  uint64_t next_id;
  /* admin dead-letter operations running (px_dlq_http.c): a drain waits
   * for them too */
  struct px_dlq_http_op *dlq_list;
  /* one of them ended (unlinked from dlq_list): a drain waiting for it may
   * end (px_server_start() sets it) */
  void (*dlq_op_done)(struct px_server *srv);
  bool draining;
  bool client_wait;   /* draining, in --drain-client-wait: clients not told */
  bool drain_expired; /* the drain timeout has passed: waiting for the
                         workers, and PX_DLQ_STOP_MS for the operations */
  bool stopped;       /* px_server_stop has run */
  px_stats stats;
  px_metrics_store metrics;
  uint64_t started_ms;
  double started_unix; /* wall clock at start, seconds since the epoch */
  /* admission: the cap on client connections (cfg->max_connections, or
   * the file descriptor limit's share under "auto"), a descriptor kept
   * open to test for free ones, and the rate of the warnings */
  uint32_t max_connections;
  uint32_t fd_reserve; /* descriptors not for clients (px_server.c) */
  int spare_fd;
  uv_tcp_t refuse_tcp; /* closes a refused client when malloc fails */
  bool refuse_tcp_busy;
  px_log_limit refused_log, accept_log;
  /* admin endpoint (px_admin.h) and the upstream probe behind /readyz */
  px_admin admin;
  bool admin_on;
  uv_timer_t probe_timer;
  px_probe probe;
  bool upstream_ok;  /* the last probe (or session) reached one */
  bool probe_warned; /* the probe's failure is logged (once until ok) */
  /* tier and dead-letter queues found to exist with the other queue type
   * than their policy's (declared with that type's arguments from then
   * on, by every connection); at most PX_ALT_TYPES_MAX names */
  char **alt_types;
  uint32_t nalt_types;
  /* tier and dead-letter queues ("vhost-length:vhost/name") that exist
   * with arguments rebound's declare does not match under either queue
   * type: copies go to them as they are, undeclared */
  char **as_is;
  uint32_t nas_is;
  char upstream_err[384];     /* why not, for /readyz */
  px_dial_memory dial_memory; /* upstreams that failed lately */
  /* --workers (px_workers.h): the other processes (worker 0) or the
   * control socket (the others); NULL with one worker */
  struct px_workers *workers;
  uint64_t cache_total;   /* this worker's share of cfg->cache_total */
  struct px_watch *watch; /* the tiers in use (px_watch.h); NULL: none yet */
} px_server;

/* Drain as on SIGTERM (`signum` is logged): stop accepting, close every
 * session with connection.close 320 once its retries are done, exit when
 * all are gone or the drain timeout passes. Worker 0 passes the signal on
 * to the other workers and waits for them too. */
void px_server_drain(px_server *srv, int signum);

/* Under --workers (px_workers.h), after px_server_start: worker 0 starts
 * the other processes, the others open their control socket. 0 or a
 * negative libuv error (logged). */
int px_server_start_workers(px_server *srv, char **argv);

/* --check: what px_server_start would refuse, without binding anything:
 * the certificates and keys load, the listeners' and the admin
 * endpoint's host names resolve. Each failure is logged as at start.
 * Returns 0 or -1. */
int px_server_check(const px_config *cfg);

/* Bind the listener and install signal handlers on `loop`. Returns 0 or a
 * negative libuv error (logged; running the loop then finishes closing the
 * listener that failed). `cfg` must outlive the server. */
int px_server_start(px_server *srv, uv_loop_t *loop, const px_config *cfg);

/* Remember how the config was given (argv, env) so that SIGHUP can read it
 * again; `cfg` passed to px_server_start must then be malloc'ed (the server
 * frees it when a reload replaces it, and the last one in px_server_free). */
void px_server_enable_reload(px_server *srv, int argc, char **argv,
                             const char *(*env)(const char *));

/* Stop serving: close the listener, the timers, a probe in progress and the
 * admin endpoint, each once. The signal handlers stay (a late signal is
 * logged as ignored). Safe to call again. */
void px_server_stop(px_server *srv);

/* After the loop has returned: px_server_stop, then close the signal
 * handlers with those signals blocked and then ignored, so that a late
 * signal cannot end the process while the last callbacks run. */
void px_server_close(px_server *srv);

/* Free the config. After the loop has ended. */
void px_server_free(px_server *srv);

#endif
