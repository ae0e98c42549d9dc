/* px_view.h - what is in effect, queue by queue and policy by policy, so
 * that "is the retry limit applied to this queue?" has an answer from
 * rebound's side: GET /v1/queues, the "in_effect" section of /v1/status,
 * and the periodic check that logs a policy that matches no queue and a
 * queue whose policy cannot act.
 *
 * A queue is "seen" when the broker shows it (a consume-ok, a delivery, a
 * get-ok); its policy is the first that matches it under the running
 * config. Flags, per queue with a policy:
 *   no-ack    every delivery went to no-ack consumers or gets: nothing can
 *             be retried;
 *   fallback  every requeue went to the broker as the client's: none was
 *             retried;
 * and per policy: unmatched, no queue seen since start (or the last
 * reload) matched it. Each is logged once (per reload, for policies) after
 * --policy-check-after.
 */
#ifndef PX_VIEW_H
#define PX_VIEW_H

#include <stdbool.h>
#include <stdint.h>

#include "px_admin.h"
#include "retry_plan.h"

struct px_server;

/* What a scan of the unsettled deliveries found for one queue slot. */
typedef struct px_view_unsettled {
  uint64_t oldest_us; /* delivered_us of the oldest; 0: none */
  uint32_t n;
  uint32_t stuck; /* unsettled longer than --stuck-after */
} px_view_unsettled;

/* One of the oldest unsettled deliveries, copied out of its session. */
typedef struct px_view_stuck {
  uint64_t session_id, tag, delivered_us;
  int qid;
  uint16_t channel;
  bool cancelled; /* its consumer is gone */
  char peer[64];
  char consumer_tag[256];
} px_view_stuck;

#define PX_VIEW_OLDEST 20 /* listed in /v1/status */

/* Scan every session's unsettled deliveries: per queue slot into
 * per[0 .. nper-1] (slots past the last fold into it; `per` may be NULL),
 * and the `ntop` oldest into top[] (may be NULL), oldest first. Returns
 * how many went into top[]. */
unsigned px_view_scan(struct px_server *srv, px_view_unsettled *per,
                      uint32_t nper, px_view_stuck *top, unsigned ntop);

/* A policy as JSON: {"queues":[...],"tiers":[...],"backoff":{...}?,
 * "max_attempts":N,"dead_letter":"...","queue_type":"..."}. */
void px_view_policy(px_admin_response *r, const retry_rule *rule);

/* GET /v1/queues: every queue seen, with its policy, counts and flags,
 * then every policy with the number of queues it matched; streamed. */
void px_view_queues_render(struct px_server *srv, px_admin_response *r);

/* The "in_effect" object of /v1/status: queues seen, the flagged ones (at
 * most 100) and the policies with their matches. */
void px_view_summary(struct px_server *srv, px_admin_response *r);

/* Log what has been flagged long enough (the server's janitor tick). */
void px_view_check(struct px_server *srv);

#endif
