/* px_frames.h - what each frame means to a session: the handshake (what
 * was negotiated, who logged in), channel open/close (the channel tables,
 * and the moving of a channel that collides with rebound's own), content
 * framing, and the decisions of the retry path (px_retry.h) and of
 * rebound's channel (px_own.h). Called by the session for each frame it
 * parses; ends a session only through px_life.h.
 */
#ifndef PX_FRAMES_H
#define PX_FRAMES_H

#include <stdint.h>

#include "amqp.h"
#include "px_session.h"

/* One frame from the client or the broker: a px_action. `raw` is the
 * whole frame in the read chunk; handlers may rewrite its channel field.
 * On PX_HOLD, *hold_chan is the channel whose held frames it joins.
 * A body frame may come in two pieces (a frame that spans two read
 * chunks): then `raw` holds its header and the first piece, f->payload
 * has ptr NULL and the whole length, and the bytes are s->split[0] then
 * s->split[1]. */
int px_frames_client(px_session *s, const amqp_frame *f, uint8_t *raw,
                     px_chan **hold_chan);
int px_frames_upstream(px_session *s, const amqp_frame *f, uint8_t *raw);

/* Release every channel's state (the session is freed). */
void px_frames_chans_free(px_session *s);
/* Forget one channel (closed). */
void px_frames_chan_release(px_session *s, px_chan *c);

/* A protocol error by the client: logged (protocol_error), connection
 * .close with `code` and the text "NAME - detail" (the code's name),
 * naming the offending method `id` (0: none). Returns PX_STOP. */
int px_frames_client_error(px_session *s, uint16_t code, const char *detail,
                           uint32_t id);
/* A protocol error by the broker (`what` for the log): the client gets
 * connection.close 541. Returns PX_STOP. */
int px_frames_upstream_error(px_session *s, const char *what);

/* No copy is pending any more: what waited for that goes on (a yield of
 * rebound's channel, the client's held connection.close, a shutdown's
 * close of the upstream, the end of a session whose client left). */
void px_frames_retry_idle(px_session *s);
/* Does anything wait for that? */
bool px_frames_awaits_idle(const px_session *s);

#endif
