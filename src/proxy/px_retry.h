/* px_retry.h - the retry path: a client's nack/reject with requeue=1 of a
 * delivery kept for retry becomes a copy published to its tier (or
 * dead-letter) queue on rebound's channel, confirmed, and only then the
 * original acked; what cannot be retried is requeued after the tier delay,
 * never at once. README, "Retries", is the contract.
 */
#ifndef PX_RETRY_H
#define PX_RETRY_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "amqp.h"
#include "px_own.h"
#include "px_session.h"

/* A client's nack/reject with requeue=1: PX_FORWARD (nothing to retry),
 * PX_HOLD (it waits for rebound's channel) or PX_DROP (replaced). Inside
 * a transaction the same: rebound's ack of the original goes on the
 * client's channel, so it takes effect at the client's tx.commit (which
 * waits behind it); a tx.rollback takes it back (px_retry_tx_end()). */
int px_retry_requeue(px_session *s, px_chan *c, const amqp_method *m);
/* tx.commit or tx.rollback from the client on a transactional channel:
 * a rollback that takes back rebound's acks of retried originals leaves
 * both the copy and the original (logged at warn, counted). */
void px_retry_tx_end(px_session *s, px_chan *c, bool rollback);

/* Copy every delivery held past its policy's processing_timeout (the
 * retry path; the original is acked once the copy is confirmed).
 * `shortest_ms`: the shortest timeout of any policy (0: none). */
void px_retry_timeouts(px_session *s, uint32_t shortest_ms);
/* A client's ack, nack or reject on a channel with timed-out deliveries
 * (px_track.nexpired): PX_FORWARD (it names none of them: go on as
 * usual), else what became of it: swallowed (PX_DROP, counted), or, for a
 * multiple settle whose tag is one of them, sent for the newest delivery
 * below that tag instead (PX_DROP, or the requeue path's answer). */
int px_retry_late_settle(px_session *s, px_chan *c, amqp_method *m);
/* A client's basic.ack, or basic.nack without requeue, with multiple=1 on
 * a channel where copies wait for their confirm or requeues for their
 * delay: the broker must not settle those deliveries (the client settled
 * them already, with its requeue, and rebound acks or requeues them
 * itself), so the settle goes upstream split: one multiple settle up to
 * the first waiting delivery, single ones for the others after it. Every
 * delivery of the channel must be tracked (not px_track.lost). PX_DROP
 * (the client's frame is replaced; an output failure is kept in s->out). */
int px_retry_split_settle(px_session *s, px_chan *c, amqp_method *m);

/* The client went without closing (hang-up, reset, a failed write) while
 * the broker's side is open: on each channel, the delivery its consumer was
 * working on, if the broker had delivered it before, becomes a failed
 * attempt (reason consumer-lost); its copy is finished, like any in
 * flight, before the upstream connection is closed. */
void px_retry_consumer_lost(px_session *s);

/* An event of rebound's channel (px_own_frame()): a confirm of copies up
 * to a seq, a returned copy, the channel ready again, or closed by the
 * broker (its copies in flight fall back; it reopens at once when the
 * close only showed a queue's type, else after a backoff, on the defer
 * timer). PX_DROP, or PX_STOP when the session is to close. */
int px_retry_own_event(px_session *s, const px_own_event *ev);
/* The separate retry connection was lost (or never logged in): copies in
 * flight fall back, and rebound's channel reopens (px_own.h). */
void px_retry_pub_lost(px_session *s, const char *why, amqp_bytes text);
/* The broker blocks (or unblocks) the connection rebound's channel is on:
 * no copy is published meanwhile, copies in flight wait without a
 * deadline. `which` names the connection for the log. */
void px_retry_blocked(px_session *s, bool blocked, amqp_bytes reason,
                      const char *which);

/* Retries to finish before the connection may end (0: none): copies in
 * flight or parked and, while rebound's channel is being opened, what
 * waits for it to start theirs (a client channel holding its requeue
 * counts once; a consumer lost meanwhile, once). */
uint32_t px_retry_pending(const px_session *s);
/* No copy is in flight: the parked ones go. false when there was
 * nothing to send. */
bool px_retry_unpark(px_session *s);
void px_retry_free(px_session *s);

/* Its two timers call `deadline` (copies not confirmed in time: then
 * px_retry_deadline()) and `defer` (held-back requeues due: then
 * px_retry_defer_due()), the session's, which end the event after. */
void px_retry_init(px_session *s, px_timer_fn deadline, px_timer_fn defer);
/* The session closes: its timers stop for good. */
void px_retry_session_closed(px_session *s);
/* The confirm deadline came: copies not confirmed in time fall back. */
void px_retry_deadline(px_session *s);
/* The defer timer came: requeues whose delay has passed go to the
 * broker. */
void px_retry_defer_due(px_session *s);

/* Copies waiting for their confirm; requeues held back for a delay; the
 * broker blocking the connection of rebound's channel. */
static inline uint32_t px_retry_in_flight(const px_session *s) {
  return s->retry.ops.n;
}
static inline uint32_t px_retry_delayed(const px_session *s) {
  return s->retry.defers.n;
}
static inline bool px_retry_blocked_now(const px_session *s) {
  return s->retry.blocked;
}

#endif
