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
 * On the separate retry connection (own_on_pub) "opening" also covers the
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
/* Its reopen time has come (px_retry_reopen_at()). */
void px_own_reopen(px_session *s);
/* Where its frames go, for px_out.h: the client's upstream connection,
 * or NULL for the separate retry connection (px_pub.h). */
static inline px_conn *px_own_sink(px_session *s) {
  return s->own_on_pub ? NULL : &s->upstream;
}
/* A frame for it from the broker (client's connection or retry
 * connection). Returns PX_DROP, or PX_STOP when the output failed. */
int px_own_frame(px_session *s, const amqp_frame *f);

#endif
