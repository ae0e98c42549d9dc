/* px_life.h - a session's lifecycle, below its event handlers: its phase
 * (PX_CLOSE_PHASES: one transition function, logged), who began ending it,
 * its close reason, and the ways it begins to end.
 *
 * Nothing here touches a socket directly or closes the session: each
 * function queues frames (px_out.h), changes state, or asks for the
 * close (px_life_close()); the session acts on that once the event being
 * handled is done (px_session.c). Modules above the session's sockets
 * (px_frames, px_retry, px_own) end a session only through here.
 */
#ifndef PX_LIFE_H
#define PX_LIFE_H

#include "px_session.h"

/* A channel in the release queue (px_session.relq). */
typedef struct px_release {
  uint16_t ch;
  uint32_t gen;
} px_release;

/* The one transition of the phase: logged (session_close_phase), and the
 * session's timer set to the phase's limit (the session's timeout hook
 * runs when it passes). */
void px_life_phase(px_session *s, px_close_phase to);
/* A connection.close passed on, from `by` (the client or the broker): an
 * open (or opening) session is closing. */
void px_life_closing(px_session *s, px_close_by by);

/* Closed: nothing more is done. */
static inline bool px_life_closed(const px_session *s) {
  return s->phase == PX_PHASE_CLOSED;
}
/* The connection is open and nothing began ending it (a client that a
 * write failed to is still read): rebound's channel may open. */
static inline bool px_life_is_open(const px_session *s) {
  return (s->phase == PX_PHASE_OPEN || s->phase == PX_PHASE_CLIENT_DEAD) &&
         s->closer == PX_BY_NONE && s->up_end == PX_UP_OPEN;
}
/* rebound sent the client connection.close: only its close-ok matters. */
static inline bool px_life_telling_client(const px_session *s) {
  return s->closer >= PX_BY_REBOUND;
}
/* The client's connection.close waits for the copies in flight. */
static inline bool px_life_conn_held(const px_session *s) {
  return s->conn_hold.chunk != NULL;
}
/* Note why the session ends: the first reason noted is the one logged. */
void px_life_note(px_session *s, px_close_reason reason);
/* Ask for the session to close (the session closes it once the current
 * event is handled). */
void px_life_close(px_session *s, px_close_reason reason);

/* The connection is open: the handshake timer stops. */
void px_life_handshake_done(px_session *s);
/* A close-ok has passed: the session is finishing. */
void px_life_finishing(px_session *s, px_close_reason reason);
/* A connection.close is on its way to the broker (rebound's, or the
 * client's passed on): its write side stays open until the broker
 * answers (px_up_end). */
void px_life_upstream_close_sent(px_session *s);
/* The broker answered it with close-ok (or closed itself): the write side
 * may be shut down. */
void px_life_upstream_answered(px_session *s);
/* An open broker connection that was sent no connection.close yet is
 * sent one: REPLY_SUCCESS and the reason's text. */
void px_life_close_upstream(px_session *s, px_close_reason reason);
/* rebound ends the broker's side: px_life_close_upstream(), then
 * px_life_close_after_flush() through it. */
void px_life_end_upstream(px_session *s, px_close_reason reason);
/* Queue a connection.close for `side` (for the broker's side,
 * px_life_upstream_close_sent()). */
void px_life_send_close(px_session *s, px_conn *side, uint16_t code,
                        const char *text, uint16_t class_id,
                        uint16_t method_id);
/* Send the client connection.close with `code` and `text` (naming the
 * offending class/method), stop forwarding, and close once the client
 * answers close-ok or PX_CLOSE_WAIT_MS passes. Once only. */
void px_life_close_client(px_session *s, uint16_t code, const char *text,
                          uint16_t class_id, uint16_t method_id);
/* px_life_close_client() with the reason's reply code and
 * "NAME - reason text". */
void px_life_tell_client(px_session *s, px_close_reason reason);
/* End the session through `side`: stop reading the other side, flush
 * what `side` is owed, shut its write side down, then drop its input
 * until it hangs up (or PX_CLOSE_WAIT_MS). A side not connected closes
 * the session. */
void px_life_close_after_flush(px_session *s, px_conn *side,
                               px_close_reason reason);
/* Keep the client's connection.close (`len` bytes at `raw` of `c`, a
 * reference taken) until the copies in flight are done. */
void px_life_hold_conn_close(px_session *s, px_chunk *c, uint8_t *raw,
                             uint32_t len);
/* Send on the client's connection.close that waited for copies in
 * flight. */
void px_life_release_conn_hold(px_session *s);

/* A channel's held frames may go: it joins the release queue. */
void px_life_release_held(px_session *s, px_chan *c);
/* Drop a channel's held frames (the channel is gone). */
void px_life_drop_held(px_session *s, px_chan *c);

#endif
