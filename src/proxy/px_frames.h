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
#include "px_chan.h"
#include "px_life.h"
#include "px_own.h"
#include "px_queues.h"
#include "px_server.h"
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

/* The largest body a broker may announce. RabbitMQ refuses messages over
 * 512 MiB (its max_message_size cannot be set higher); anything past 4 GiB
 * is a broken or hostile peer, and sizes near 2^64 would overflow sums. */
#define PX_UPSTREAM_BODY_MAX UINT64_C(0xffffffff)

/* The short path for the bulk of the traffic: a content header or body
 * frame of the message in progress on a channel that nothing else watches
 * (open, nothing held, no content being kept, the same number on both
 * sides, the session not ending). Its content framing is checked here,
 * inline in the read loop, and it is forwarded; false: the frame goes to
 * px_frames_upstream() or px_frames_client(), which judge it the same way
 * and handle what this does not. */
static inline bool px_frames_content(uint8_t type, amqp_bytes payload,
                                     uint8_t *state, uint64_t *left,
                                     uint64_t max) {
  uint64_t n;
  if (type == AMQP_FRAME_HEADER) {
    n = amqp_content_header_peek_size(payload);
    if (*state != PX_CONTENT_HEADER || n > max)
      return false;
  } else {
    if (type != AMQP_FRAME_BODY || *state != PX_CONTENT_BODY ||
        payload.len > *left)
      return false;
    n = *left - payload.len;
  }
  *left = n;
  *state = n ? PX_CONTENT_BODY : PX_CONTENT_NONE;
  return true;
}

/* The short path from the broker, while the session is not ending
 * (px_frames_upstream_plain()): a content frame as above, or a
 * basic.deliver on a channel whose one consumer does not ack. Such a
 * delivery needs no tracking: it is counted for its queue, the channel
 * expects its content header, and the frame is forwarded. With one
 * consumer on the channel, every delivery on it is that consumer's (the
 * broker delivers only after consume-ok, and a no-wait consumer is
 * registered when the client sends it); the tag's length is compared as a
 * guard. false: px_frames_upstream() (several consumers, acks, a moved
 * channel, the session ending, the first delivery of a no-wait consumer,
 * which names its queue). */
static inline bool px_frames_upstream_plain(const px_session *s) {
  return s->closer == PX_BY_NONE && s->phase != PX_PHASE_CLIENT_GONE;
}

/* The caller has checked px_frames_upstream_plain(s), and checks it again
 * after anything else has handled a frame or run the release queue (only
 * those can change it). */
static inline bool px_frames_upstream_short(px_session *s,
                                            const amqp_frame *f) {
  if (f->channel == px_own_ch(s))
    return false;
  px_chan *c = px_tab_find(&s->by_up, f->channel); /* channel 0: NULL */
  if (!c || c->up_ch != c->client_ch)
    return false;
  if (f->type != AMQP_FRAME_METHOD)
    return !c->track.capture &&
           px_frames_content(f->type, f->payload, &c->u2c, &c->u2c_left,
                             PX_UPSTREAM_BODY_MAX);
  const px_consumer *k = c->track.consumers;
  if (c->track.nconsumers != 1 || !k->no_ack || k->qid < 0 ||
      f->payload.len < 5 || amqp__be32(f->payload.ptr) != AMQP_BASIC_DELIVER ||
      f->payload.ptr[4] != k->tag_len)
    return false;
  c->u2c = PX_CONTENT_HEADER;
  c->track.capture = 0;
  px_queues_count(&s->srv->metrics.queues, k->qid, PX_QC_DELIVERED_NO_ACK,
                  s->srv->cfg_gen + 1);
  return true;
}

static inline bool px_frames_client_content(px_session *s,
                                            const amqp_frame *f) {
  if (f->type == AMQP_FRAME_METHOD || s->closer != PX_BY_NONE ||
      px_life_conn_held(s))
    return false;
  px_chan *c = px_tab_get(&s->by_client, f->channel);
  return c && !c->held && c->state == PX_CH_OPEN && c->up_ch == c->client_ch &&
         px_frames_content(f->type, f->payload, &c->c2u, &c->c2u_left,
                           UINT64_MAX);
}

/* The client is gone while its copies are finished: cancel its consumers
 * upstream (no-wait), so the broker stops delivering to a connection that
 * drops what it gets (and would requeue it, marked redelivered, only when
 * it closes: a copy back from its tier by then would lose its place).
 * The acks of originals still go on their channels. A channel in the
 * middle of the client's content is left as it is (a method there is a
 * 505); so are consumers whose consume-ok has not come. An output failure
 * is left in s->out. */
void px_frames_cancel_consumers(px_session *s);

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
