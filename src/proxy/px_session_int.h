/* px_session_int.h - helpers shared by px_session.c (sockets, buffers,
 * lifecycle) and px_frames.c (what each frame means). Not for other
 * files. */
#ifndef PX_SESSION_INT_H
#define PX_SESSION_INT_H

#include "amqp.h"
#include "px_log.h"
#include "px_server.h"
#include "px_session.h"

/* What to do with a frame just parsed. */
enum px_action {
  PX_FORWARD, /* send on, as part of the current run */
  PX_DROP,    /* consumed here */
  PX_HOLD,
  /* keep in s->hold_chan's held frames */ PX_STOP, /* the session is closing:
                                                       stop parsing */
  PX_HOLD_CONN, /* connection.close: wait for the copies in flight */
};

/* Frame handlers (px_frames.c): return a px_action. `raw` is the whole
 * frame in the read chunk; handlers may rewrite its channel field. */
int px__client_frame(px_session *s, const amqp_frame *f, uint8_t *raw,
                     px_chan **hold_chan);
int px__upstream_frame(px_session *s, const amqp_frame *f, uint8_t *raw);

/* Release every channel's state (px_frames.c). */
void px__chans_free(px_session *s);
/* Forget one channel (closed); deferred while its held frames are being
 * released. (px_frames.c) */
void px__chan_release(px_session *s, px_chan *c);

/* A protocol error by the client: logged (protocol_error), connection
 * .close with `code` and the text "NAME - detail" (the code's name),
 * naming the offending method `id` (0: none). Returns PX_STOP. */
int px__client_error(px_session *s, uint16_t code, const char *detail,
                     uint32_t id);
/* A protocol error by the broker (`what` for the log): the client gets
 * connection.close 541. Returns PX_STOP. */
int px__upstream_error(px_session *s, const char *what);

/* Send on the client's connection.close held by PX_HOLD_CONN. */
void px__release_conn_hold(px_session *s);

/* A channel's held frames may go: it joins the release queue, drained by
 * the session once the current event is handled (px_session.c). */
void px__release_held(px_session *s, px_chan *c);
/* Drop a channel's held frames (the channel is gone). */
void px__drop_held(px_session *s, px_chan *c);
/* A close-ok has passed: the session is finishing, `reason` is logged
 * when it ends. */
void px__finishing(px_session *s, px_close_reason reason);

/* Queue a connection.close for `side`. */
void px__emit_close(px_session *s, px_conn *side, uint16_t code,
                    const char *text, uint16_t class_id, uint16_t method_id);

/* Send connection.close to the client with `code` and `text` (and the
 * offending class/method), stop forwarding, and close once the client
 * answers close-ok or a short timeout passes. */
void px__close_client(px_session *s, uint16_t code, const char *text,
                      uint16_t class_id, uint16_t method_id);
/* px__close_client() with the reason's reply code and "NAME - text". */
void px__tell_client(px_session *s, px_close_reason reason);

/* End the session through `side`: write out what is queued for it, shut
 * down its write side and drain it until it hangs up (px_session.c); a side
 * not connected closes the session at once. */
void px__close_after_flush(px_session *s, px_conn *side,
                           px_close_reason reason);

void px__set_state(px_session *s, px_state state);

/* The connection is open: stop the handshake timer. */
void px__handshake_done(px_session *s);

/* px_track.c: consumers, requests, deliveries (px_track.h). */
void px__track_client_method(px_session *s, px_chan *c, const amqp_method *m);
void px__track_upstream_method(px_session *s, px_chan *c, const amqp_method *m);
void px__track_content(px_session *s, px_chan *c, const amqp_frame *f);
void px__track_deliver(px_session *s, px_chan *c, amqp_bytes payload);
void px__track_settle(px_session *s, px_chan *c, uint64_t tag, bool multiple);
void px__track_clear(px_session *s, px_chan *c);
void px__track_free(px_session *s, px_chan *c);
px_delivery *px__track_find(px_chan *c, uint64_t tag);
/* How many of the oldest unsettled entries (holes included) have a tag
 * <= `tag` (0: all of them). */
uint32_t px__track_upto(const px_chan *c, uint64_t tag);
/* Index of the entry with `tag` (or of the first after it). */
uint32_t px__track_index(const px_chan *c, uint64_t tag);
/* Free a delivery and leave a hole for it (no reshuffle: indexes stay
 * valid until px__track_tidy()). */
void px__track_forget(px_session *s, px_chan *c, px_delivery *d);
/* Pop holes at both ends; squeeze them out when they are too many. */
void px__track_tidy(px_chan *c);
/* Free a delivery's copies and give its bytes back to the cache bounds
 * (its tag stays); px__track_forget() also takes it out of the ring. */
void px__track_release(px_session *s, px_delivery *d);
/* Deliver-to-settle time of a delivery the client settles now. */
void px__track_observe(px_session *s, const px_delivery *d);
/* confirm.select / basic.publish / the broker's confirms on a client
 * channel: publish-to-confirm times. */
void px__track_publish(px_chan *c);
void px__track_confirmed(px_session *s, px_chan *c, amqp_bytes payload);

/* px_retry.c: the retry path. */
int px__retry_requeue(px_session *s, px_chan *c, const amqp_method *m);
void px__retry_confirm(px_session *s, uint64_t seq, bool multiple, bool ok);
void px__retry_returned(px_session *s, amqp_bytes routing_key);
bool px__retry_own_lost(px_session *s, uint16_t code, amqp_bytes text);
/* rebound's channel is ready: requeues that waited for it are retried. */
void px__retry_own_ready(px_session *s);
/* Reopen rebound's channel at `due_ms` (the loop's clock) through
 * px__own_reopen() (px_frames.c), on the defer timer. */
void px__retry_reopen_at(px_session *s, uint64_t due_ms);
void px__own_reopen(px_session *s);
/* The upstream connection rebound's channel is on, for px__emit*(): NULL
 * stands for the separate retry connection (px_pub.h). */
static inline px_conn *px__own_side(px_session *s) {
  return s->own_on_pub ? NULL : &s->upstream;
}
/* Write out what is queued for both sides (after a timer or an event of
 * the retry connection). */
void px__session_flush(px_session *s);
/* The broker blocks (or unblocks) the connection rebound's channel is on:
 * no copy is published meanwhile, copies in flight wait without a
 * deadline. `which` names the connection for the log. (px_retry.c) */
void px__retry_blocked(px_session *s, bool blocked, amqp_bytes reason,
                       const char *which);
/* A delivery is kept for retry: make sure rebound's channel is (being)
 * opened. (px_frames.c) */
void px__own_want(px_session *s);
void px__retry_free(px_session *s);
/* The retry timer: copies not confirmed in time fall back. */
void px__retry_deadline(uv_timer_t *timer);
/* The defer timer: requeues whose delay has passed go to the broker. */
void px__retry_defer_due(uv_timer_t *timer);
/* basic.nack/reject with requeue=1 inside a transaction: delayed like any
 * requeue rebound cannot retry. PX_DROP when it is held back, PX_FORWARD
 * when it goes on as it is (no intercepted delivery). */
int px__retry_requeue_tx(px_session *s, px_chan *c, const amqp_method *m);
/* Retries to finish before the connection may end: copies in flight or
 * parked, or requeues waiting for rebound's channel, which is being
 * opened, to start theirs. */
bool px__retry_busy(const px_session *s);
/* No copy is in flight: the parked ones go (px_retry.c). false when there
 * was nothing to send. */
bool px__retry_unpark(px_session *s);
/* No copy is in flight any more (px_frames.c / px_session.c react: a
 * pending yield of rebound's channel, a client that already left). */
void px__retry_idle(px_session *s);

/* Rewrite a frame's 2-byte channel field in place. */
static inline void px__set_channel(uint8_t *raw, uint16_t ch) {
  raw[1] = (uint8_t)(ch >> 8);
  raw[2] = (uint8_t)ch;
}

#endif
