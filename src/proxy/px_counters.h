/* px_counters.h - the counters rebound's code increments where things
 * happen: labelled counters (PX_LABELLED) and latency histograms. A leaf:
 * it knows the server's metrics store and nothing else; px_metrics.h
 * renders them with the scalars of px_stats.
 *
 * Label values that come from queue names are capped at
 * PX_METRICS_MAX_QUEUES distinct queues; the rest count under "other".
 * A queue's retry series exist at 0 from when the broker first shows it:
 * one per tier of its policy and per dead-letter reason it can give.
 */
#ifndef PX_COUNTERS_H
#define PX_COUNTERS_H

#include <stdint.h>

struct px_server;

#define PX_METRICS_MAX_QUEUES 100

/* X(id, name, help, first label, second label or NULL, queue label?) */
#define PX_LABELLED(X)                                                         \
  X(RETRIES, "rebound_retries_published_total",                                \
    "Copies confirmed into a delay tier queue", "queue", "tier", 1)            \
  X(DEAD_LETTERED, "rebound_dead_lettered_total",                              \
    "Copies confirmed into a dead-letter queue", "queue", "reason", 1)         \
  X(FALLBACKS, "rebound_retry_fallbacks_total",                                \
    "Requeues forwarded to the broker after a copy failed", "reason", NULL, 0) \
  X(NOT_KEPT, "rebound_deliveries_not_kept_total",                             \
    "Deliveries of a queue with a policy whose content was not kept for a "    \
    "retry: their requeues go to the broker after the tier delay, uncounted",  \
    "queue", "reason", 1)                                                      \
  X(PASSTHROUGH, "rebound_retry_passthrough_total",                            \
    "Requeues of kept deliveries forwarded unchanged", "reason", NULL, 0)      \
  X(HEALED, "rebound_tier_copies_healed_total",                                \
    "Copies a tier kept past their delay that rebound moved back to their "    \
    "source queue",                                                            \
    "queue", "tier", 1)                                                        \
  X(DELAYED, "rebound_retry_requeues_delayed_total",                           \
    "Requeues rebound could not retry, sent after the tier delay", "reason",   \
    NULL, 0)                                                                   \
  X(CLOSES, "rebound_client_connection_closes_total",                          \
    "Client connections closed, by reason", "reason", NULL, 0)                 \
  X(CONNECT_FAILURES, "rebound_upstream_connect_failures_total",               \
    "Failed connection attempts to an upstream", "address", NULL, 0)           \
  X(TLS_HANDSHAKES, "rebound_tls_handshakes_total",                            \
    "TLS handshakes completed, by side (client: the TLS listener, upstream: "  \
    "amqps upstreams)",                                                        \
    "side", NULL, 0)                                                           \
  X(TLS_FAILURES, "rebound_tls_handshake_failures_total",                      \
    "TLS handshakes that failed, by side and OpenSSL's reason", "side",        \
    "reason", 0)

/* The proxy's own reasons to pass a requeue through unchanged (the
 * policy's are retry_plan.h's): label values of PX_M_PASSTHROUGH. */
#define PX_PASS_REFUSED "tier or dead-letter queue refused"
#define PX_PASS_NO_FIT "no copy fits frame-max"
#define PX_PASS_UNTRACKED "channel not open or untracked"
#define PX_PASS_NO_QUEUE "queue not known (empty name, no named declare)"

/* Why a copy failed once it was published: label values of PX_M_FALLBACKS
 * and of PX_M_DELAYED (the client's requeue, held for its delay).
 * X(id, text) */
#define PX_COPY_FAILURES(X)                                                    \
  X(NACKED, "nacked by the broker")                                            \
  X(CHANNEL_LOST, "rebound's channel was closed")                              \
  X(DISCARDED, "rebound's channel was closed before the copy")                 \
  X(CONFIRM_TIMEOUT, "confirm timeout")                                        \
  X(RETURNED, "returned by the broker (unroutable)")

/* Why no copy was started (besides the pass-through reasons, the policy's
 * and PX_PASS_*): label values of PX_M_DELAYED. X(id, text) */
#define PX_NO_COPY(X)                                                          \
  X(NOT_KEPT, "delivery not kept")                                             \
  X(BAD_HEADER, "content header does not decode")                              \
  X(NOT_BUILT, "copy could not be built")                                      \
  X(BLOCKED, "broker blocks publishing")                                       \
  X(OWN_NOT_READY, "rebound's channel not ready")

/* The copy failures come first: PX_WHY_NACKED .. PX_WHY_FAILURES - 1. */
enum px_why {
#define PX__WHY_ENUM(id, text) PX_WHY_##id,
  PX_COPY_FAILURES(PX__WHY_ENUM) PX_NO_COPY(PX__WHY_ENUM)
#undef PX__WHY_ENUM
      PX_WHY_COUNT
};
enum {
#define PX__WHY_ONE(id, text) +1
  PX_WHY_FAILURES = 0 PX_COPY_FAILURES(PX__WHY_ONE)
#undef PX__WHY_ONE
};

/* The texts of enum px_why. The retry code compares these pointers. */
extern const char *const px_why_text[PX_WHY_COUNT];

/* Why a copy went to the dead-letter queue: label values of
 * PX_M_DEAD_LETTERED. */
#define PX_DEAD_MAX_ATTEMPTS "max-attempts"
/* Why a delivery's content was not kept: label values of PX_M_NOT_KEPT. */
#define PX_NOT_KEPT_BOUND "cache bound reached"
#define PX_NOT_KEPT_LARGE "message too large"
#define PX_NOT_KEPT_MEMORY "out of memory"
#define PX_DEAD_CONSUMER_LOST "consumer-lost"
#define PX_DEAD_TIMEOUT "processing-timeout"
#define PX_DEAD_FRAME_MAX "frame-max"       /* too large for its tier */
#define PX_DEAD_TIER_REFUSED "tier-refused" /* its tier cannot be declared */

enum px_labelled_id {
#define PX__LABELLED_ENUM(id, name, help, l1, l2, q) PX_M_##id,
  PX_LABELLED(PX__LABELLED_ENUM)
#undef PX__LABELLED_ENUM
      PX_M_COUNT
};

/* Add one to a labelled counter. `v2` is ignored for one-label families.
 * Values are copied (at most 255 bytes each). */
void px_metrics_inc(struct px_server *srv, int id, const char *v1,
                    const char *v2);

/* Make the series exist at 0 if it does not yet, so that a known label
 * value shows before its first event. */
void px_metrics_declare(struct px_server *srv, int id, const char *v1,
                        const char *v2);

enum px_hist_id { PX_H_RETRY, PX_H_CONFIRM, PX_H_PROCESSING };

/* The slot of a queue (px_queues.h): its entry in /v1/queues and, for the
 * first PX_METRICS_MAX_QUEUES, its metrics label (the rest are "other").
 * Stable for the process's life. A slot is taken for good, so call this
 * only for a queue the broker has shown to exist (a consume-ok, a
 * delivery, a get-ok), never for a name a client merely sent. A new slot
 * with a policy gets its retry series at 0. */
int px_metrics_queue(struct px_server *srv, const char *queue);

/* Every labelled queue's retry series at 0 for the policy now in force
 * (after a reload). */
void px_metrics_declare_queues(struct px_server *srv);

/* Count one event of px_queues.h's PX_QUEUE_COUNTS for a queue slot (a
 * negative slot: not registered, nothing counted). */
void px_queue_count(struct px_server *srv, int qid, int what);

/* Record one observation, in microseconds. `qid` (from px_metrics_queue)
 * only for PX_H_PROCESSING: slots past the labelled ones count as "other";
 * -1 (not registered) is dropped. */
void px_metrics_observe(struct px_server *srv, int hist, int qid, uint64_t us);

/* The families of PX_LABELLED, by id, for rendering. */
typedef struct px_counter_family {
  const char *name, *help, *l1, *l2;
  int queue_label;
} px_counter_family;
extern const px_counter_family px_counter_families[];

/* Upper bounds of the histogram buckets, microseconds (PX_HIST_BUCKETS). */
extern const uint64_t px_hist_bucket_us[];

/* The label value of a queue slot (px_metrics_queue()). */
const char *px_metrics_queue_label(struct px_server *srv, int slot);

/* Free the labelled counters (at exit). */
void px_metrics_free(struct px_server *srv);

#endif
