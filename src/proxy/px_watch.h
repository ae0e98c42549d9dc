/* px_watch.h - rebound watches the queues it hands copies to.
 *
 * A copy confirmed into a tier is rebound's to account for until the
 * broker gives it back, and the broker does not always: a quorum tier
 * whose leader moved may stop expiring its messages, and a source queue
 * deleted while copies wait in its tiers makes the broker drop them when
 * they expire. So every --tier-watch, for each vhost, the process looks
 * at every tier and dead-letter queue it put a copy into, and at each
 * tier's source queue, over a connection of its own (px_dlq.h), logged in
 * as a client whose copies went there (the first whose login could be
 * kept; once the broker refuses it, no round until another client's is
 * taken at its next copy) (PLAIN or AMQPLAIN; a
 * client that logged in otherwise, or whose login is not kept under
 * `retry_connection: shared`, leaves its vhost unwatched, counted and
 * logged):
 *
 *   1. COUNT    the depth of each tier and dead-letter queue, and whether
 *               each source queue exists;
 *   2. a REDRIVE (heal) run on each tier that holds copies, at most
 *      PX_WATCH_PEEKS a round, in turn: the oldest copy's age is read from
 *      its last-failed-at header. Older than its delay + --tier-grace: the
 *      tier is overdue. Older than its delay + the larger of the delay and
 *      --tier-heal-after: rebound moves it, and the next ones as old, back
 *      to the source queue itself (published mandatory, confirmed, then
 *      acked in the tier; the copy's headers kept, tier-healed-at set),
 *      at most PX_WATCH_HEAL_MAX a run. A copy too young is given back
 *      (it keeps its place and its expiry; a quorum tier counts a
 *      delivery). A source queue that does not exist gets nothing moved.
 *
 * What it finds is a gauge per tier (depth, the oldest copy's age,
 * overdue), per dead-letter queue (depth) and per source (missing), a
 * warn line when a tier becomes overdue or a source goes missing (again
 * at most every PX_LOG_LIMIT_MS while it lasts), an info line when it
 * ends, a counter of healed copies, and flags in /v1/queues. A queue is
 * forgotten once empty, unflagged and without a copy for
 * PX_WATCH_FORGET_MS. At most PX_WATCH_MAX queues per process; the ones
 * over it are counted and logged, not watched.
 *
 * Under --workers each process watches the queues of its own sessions.
 */
#ifndef PX_WATCH_H
#define PX_WATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "amqp.h"

struct px_server;
struct px_session;

#define PX_WATCH_MAX 512
#define PX_WATCH_VHOSTS 16
#define PX_WATCH_PEEKS 8       /* tiers looked into per round and vhost */
#define PX_WATCH_HEAL_MAX 1000 /* copies moved per tier and round */
#define PX_WATCH_FORGET_MS (10 * 60 * 1000)
/* A tier whose oldest copy is overdue and not moved (healing off or not
 * yet due, its source missing, not a copy of rebound's) is looked into at
 * most this often: each look is a delivery, which a quorum tier counts. */
#define PX_WATCH_SLOW_MS (60 * 1000)

typedef enum px_watch_verdict {
  PX_WATCH_ON_TIME, /* not older than its delay + grace */
  PX_WATCH_OVERDUE,
  PX_WATCH_HEAL, /* overdue by so much that rebound moves it */
} px_watch_verdict;

/* What a copy of `age_ms` in a tier of `delay_ms` is. heal_after_ms 0:
 * never healed. Pure. */
px_watch_verdict px_watch_judge(uint32_t delay_ms, uint32_t grace_ms,
                                uint32_t heal_after_ms, uint64_t age_ms);

/* A copy's age in ms at `now_s` (seconds since the epoch) from the
 * last-failed-at header `name` in `headers` (a timestamp or a whole
 * number of seconds; one in the future is age 0). -1 when it has none.
 * Pure. */
int px_watch_copy_age(amqp_bytes headers, const char *name, uint64_t now_s,
                      uint64_t *age_ms);

/* The user and password of a client's login, as its connection.start-ok
 * gave them (`response` is the client's: any bytes): PLAIN
 * ("authzid\0user\0password") or AMQPLAIN (LOGIN and PASSWORD, long
 * strings, in a table), each NUL-terminated into `cap` bytes. 0, or -1 for
 * another mechanism, a malformed response, or a field of `cap` bytes or
 * more (nothing usable is then in `user` and `password`). Pure. */
int px_watch_login_creds(amqp_bytes mechanism, amqp_bytes response, char *user,
                         char *password, size_t cap);

/* A copy from session `s` was confirmed into `queue`: a tier of `source`
 * with `delay_ms`, or its dead-letter queue (delay_ms 0). */
void px_watch_copied(struct px_server *srv, const struct px_session *s,
                     const char *queue, const char *source, uint32_t delay_ms);

/* From the janitor: start the rounds that are due. */
void px_watch_tick(struct px_server *srv, uint64_t now_ms);

/* Stop: runs in progress are cancelled (a heal's unconfirmed copies are
 * logged by px_dlq_cancel), everything is freed, credentials wiped. */
void px_watch_free(struct px_server *srv);

/* One watched queue, for the metrics and /v1/queues. */
typedef struct px_watch_info {
  const char *queue, *source, *tier; /* tier: "1s"; "" for a DLQ */
  bool dead_letter;
  int64_t depth;       /* -1: not looked at yet */
  double oldest_age_s; /* the oldest copy's age at the last look, or -1 */
  bool overdue, missing, source_missing;
  uint64_t healed;
} px_watch_info;

/* Call `fn` for each watched queue. */
void px_watch_each(struct px_server *srv,
                   void (*fn)(void *ctx, const px_watch_info *q), void *ctx);

#endif
