/* px_own.h - rebound's own channel: where copies are published.
 *
 * States (X: id, name in logs). Every change goes through one function in
 * px_own.c and is logged (own_channel_state, debug); own_channel_* lines
 * name the state.
 *
 *   none -> opening -> selecting -> ready          channel.open, confirm.select
 *   ready -> closing -> yielded                    its number goes to a client
 *   any -> none                                    the broker closed it, or the
 *                                                  retry connection was lost:
 *                                                  reopened after the backoff
 *   yielded -> opening                             a client channel closed
 *
 * On the separate retry connection (own.on_pub) "opening" also covers the
 * connection's login.
 */
#ifndef PX_OWN_H
#define PX_OWN_H

#include <stdbool.h>

#include "amqp.h"
#include "px_session.h"

/* rebound's channel reopens at once after its first close, then after
 * PX_OWN_BACKOFF_MS doubled per further close (up to PX_OWN_BACKOFF_MAX_MS)
 * until a copy is confirmed again. */
#define PX_OWN_BACKOFF_MS 500
#define PX_OWN_BACKOFF_MAX_MS 30000

/* A retry connection that was logged in and is lost is dialled again on
 * that backoff; after this many failed logins in a row rebound's channel
 * goes on the client's connection for good (a changed password, a full
 * connection limit). */
#define PX_PUB_MISSES_MAX 4

#define PX_OWN_STATES(X)                                                       \
  X(NONE, "none")                                                              \
  X(OPENING, "opening")                                                        \
  X(SELECTING, "selecting")                                                    \
  X(READY, "ready")                                                            \
  X(CLOSING, "closing")                                                        \
  X(YIELDED, "yielded")

typedef enum px_own_state {
#define PX__OWN_ENUM(id, name) PX_OWN_##id,
  PX_OWN_STATES(PX__OWN_ENUM)
#undef PX__OWN_ENUM
} px_own_state;

const char *px_own_state_name(int state);

/* Its reopen timer calls `reopen_due` (the session's: px_own_reopen(),
 * then the end of the event). */
void px_own_init(px_session *s, px_timer_fn reopen_due);
/* The session closes: no reopen, the retry connection no longer up. */
void px_own_session_closed(px_session *s);
/* Reopen it now if its reopen is due (held-back requeues that came due
 * in the same moment go first: what they release then waits for it). */
void px_own_reopen_if_due(px_session *s);
/* Reopen it after `ms` (px_own_reopen() from the timer). */
void px_own_reopen_after(px_session *s, uint32_t ms);
/* The publish sequence of the next copy on it; undo the last one (a copy
 * that was not sent). */
uint64_t px_own_next_seq(px_session *s);
void px_own_unseq(px_session *s);
/* A copy was confirmed: the reopen backoff starts over. */
void px_own_confirmed(px_session *s);
/* Client channel `ch` (its generation `gen`) holds a requeue until the
 * channel is reopened: false when no more can wait. */
bool px_own_add_waiter(px_session *s, uint16_t ch, uint32_t gen);
unsigned px_own_nwaiters(const px_session *s);
/* May rebound give its channel's number up to a client that has taken
 * every other (it lives on the client's connection, none waits yet)? */
bool px_own_may_yield(const px_session *s);
/* Give it up to client channel `ch`: now if it is ready and `idle` (no
 * copy in flight), else once it is. */
void px_own_yield_to(px_session *s, uint16_t ch, bool idle);

/* Its number, its state, and what the others may know of it. */
static inline uint16_t px_own_ch(const px_session *s) {
  return s->own.ch;
}
static inline bool px_own_is_ready(const px_session *s) {
  return s->own.state == PX_OWN_READY;
}
static inline bool px_own_opening(const px_session *s) {
  return s->own.state == PX_OWN_OPENING || s->own.state == PX_OWN_SELECTING;
}
static inline bool px_own_yielded(const px_session *s) {
  return s->own.state == PX_OWN_YIELDED;
}
static inline bool px_own_yield_pending(const px_session *s) {
  return s->own.yield_requested;
}
/* The separate retry connection could not be used: on the client's. */
static inline bool px_own_pub_failed(const px_session *s) {
  return s->own.pub_failed;
}
/* The separate retry connection is logged in; rebound's channel is (being)
 * opened there. */
static inline bool px_own_pub_up(const px_session *s) {
  return s->own.pub_ready;
}
static inline bool px_own_uses_pub(const px_session *s) {
  return s->own.on_pub;
}

/* "host:port" of the session's upstream, tried or in use ("" before the
 * first): where the retry connection goes. */
const char *px_own_upstream(const px_session *s);
/* Opening, ready or closing: its number is taken where it lives. */
bool px_own_active(const px_session *s);
/* ... and it lives on the client's upstream connection. */
bool px_own_on_main(const px_session *s);
/* Open it: on the retry connection (connecting it first) or on a number
 * of the client's connection the client has not opened. */
void px_own_open(px_session *s);
/* Give its number up (channel.close 200); own_channel_yielded follows. */
void px_own_yield_now(px_session *s);
/* A delivery is kept for retry: make sure it is (being) opened. */
void px_own_want(px_session *s);
/* Its reopen time has come (px_own_reopen_after()). */
void px_own_reopen(px_session *s);
/* Where its frames go, for px_out.h: the client's upstream connection,
 * or NULL for the separate retry connection (px_pub.h). */
static inline px_conn *px_own_sink(px_session *s) {
  return s->own.on_pub ? NULL : &s->upstream;
}
/* What the broker said on rebound's channel, for the retry path
 * (px_retry_own_event()): rebound's channel does not act on its copies
 * itself. */
typedef enum px_own_event_kind {
  PX_OWN_EV_NONE,
  PX_OWN_EV_STOP,     /* rebound's output failed: the session closes */
  PX_OWN_EV_READY,    /* confirm.select-ok: copies may go */
  PX_OWN_EV_CONFIRM,  /* basic.ack (ok) or basic.nack of seq (multiple) */
  PX_OWN_EV_RETURNED, /* basic.return of a copy; text: its routing key */
  PX_OWN_EV_CLOSED,   /* channel.close (code, text): then px_own_closed() */
} px_own_event_kind;

typedef struct px_own_event {
  px_own_event_kind kind;
  bool ok, multiple;
  uint64_t seq;
  uint16_t code;
  amqp_bytes text; /* into the frame: valid while it is handled */
  bool yielding;   /* CLOSED: it was being given up */
  const char *was; /* CLOSED: the state it was in */
} px_own_event;

/* A frame for it from the broker (client's connection or retry
 * connection): handled as far as the channel goes, the rest returned. */
px_own_event px_own_frame(px_session *s, const amqp_frame *f);
/* After a READY was handled: a yield asked for meanwhile happens now, if
 * `idle` (no copy in flight). */
void px_own_after_ready(px_session *s, bool idle);
/* After a CLOSED was handled (`adapted`: the close only taught rebound a
 * queue's type): close-ok, then the channel is handed over, reopened at
 * once, or (the delay returned, not 0) to be reopened after a backoff,
 * when px_own_waiting() lets its waiters go. */
uint32_t px_own_closed(px_session *s, const px_own_event *ev, bool adapted);
/* Requeues that waited for rebound's channel go on (they wait for it up
 * to their delay), and the idle work runs once nothing is pending. */
void px_own_waiting(px_session *s);

/* The separate retry connection's events (px_pub.h), which the session
 * receives (s->pub_events) and passes here. */
void px_own_pub_ready(px_session *s);
/* Is this frame of the retry connection for rebound's channel? */
bool px_own_pub_frame(const px_session *s, const amqp_frame *f);
/* The retry connection was lost or failed: closed, rebound's channel
 * none. Then the retry path hears of it, then px_own_pub_lost_after(). */
typedef struct px_own_pub_loss {
  bool own;       /* rebound's channel was on it */
  bool was_ready; /* it was logged in */
  const char *was;
} px_own_pub_loss;
px_own_pub_loss px_own_pub_lost(px_session *s);
/* Logged and counted; rebound's channel goes on the client's connection
 * after too many failed logins. true when it is to be reopened on the
 * retry connection after *reopen_ms; then px_own_waiting(). */
bool px_own_pub_lost_after(px_session *s, const px_own_pub_loss *l,
                           const char *why, amqp_bytes text,
                           uint32_t *reopen_ms);

#endif
