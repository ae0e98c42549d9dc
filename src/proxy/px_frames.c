/* px_frames.c - what each frame means to a session.
 *
 * Most frames are forwarded as they are. The handlers here only look at
 * the few that change a session's state: the handshake (what was
 * negotiated, who logged in), channel open/close (the channel tables and
 * the moving of a channel that collides with rebound's own), content
 * framing (method, header, bodies in order per channel), and everything on
 * rebound's own channel, which the client never sees.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "px_frames.h"
#include "px_life.h"
#include "px_log.h"
#include "px_own.h"
#include "px_retry.h"
#include "px_server.h"
#include "px_track.h"

/* Upper bound on frame-max when a peer negotiates 0 ("no limit"). */
#define PX_FRAME_MAX_CAP (4u * 1024 * 1024)

/* Is upstream channel `n` unused, by the client and by rebound? */
static bool up_free(const px_session *s, uint32_t n) {
  return !(n == px_own_ch(s) && px_own_on_main(s)) &&
         !px_tab_get(&s->by_up, (uint16_t)n);
}

/* A free upstream number, searching down from channel-max; numbers the
 * client has not opened first. 0 when there is none. */
static uint16_t find_free_up(const px_session *s) {
  for (int pass = 0; pass < 2; pass++)
    for (uint32_t n = s->channel_max; n >= 1; n--)
      if (up_free(s, n) &&
          (pass == 1 || !px_tab_get(&s->by_client, (uint16_t)n)))
        return (uint16_t)n;
  return 0;
}

int px_frames_client_error(px_session *s, uint16_t code, const char *detail,
                           uint32_t id) {
  char text[160];
  const char *name = amqp_reply_name(code);
  snprintf(text, sizeof text, "%s - %s", name ? name : "INTERNAL_ERROR",
           detail);
  s->srv->stats.protocol_errors++;
  px_warn("protocol_error", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("side", "client"), PX_U("code", code), PX_S("error", text));
  px_life_close_client(s, code, text, AMQP_METHOD_CLASS(id),
                       AMQP_METHOD_INDEX(id));
  return PX_STOP;
}

/* ---- channels ----------------------------------------------------------- */

void px_frames_chan_release(px_session *s, px_chan *c) {
  px_track_free(s, c);
  px_tab_set(&s->by_client, c->client_ch, NULL);
  if (c->up_ch && px_tab_get(&s->by_up, c->up_ch) == c)
    px_tab_set(&s->by_up, c->up_ch, NULL);
  px_life_drop_held(s, c);
  free(c);
  s->nchans--;
  if (px_own_yielded(s) && px_life_is_open(s))
    px_own_open(s);
}

void px_frames_cancel_consumers(px_session *s) {
  uint32_t at = 0;
  amqp_method m;
  for (px_chan *c; (c = px_tab_next(&s->by_client, &at));) {
    /* not in the middle of the client's content: the broker waits for
     * its body frames there, and a method would be a 505 */
    bool between = c->state == PX_CH_OPEN && c->c2u == PX_CONTENT_NONE;
    for (uint32_t i = 0; between && i < c->track.nconsumers; i++) {
      const px_consumer *k = &c->track.consumers[i];
      if (amqp_method_init(&m, AMQP_BASIC_CANCEL) != AMQP_OK)
        return;
      m.args[AMQP_F_BASIC_CANCEL_CONSUMER_TAG].b =
          (amqp_bytes){(const uint8_t *)k->tag, k->tag_len};
      m.args[AMQP_F_BASIC_CANCEL_NO_WAIT].u = 1;
      if (px_out_method(&s->out, &s->upstream, c->up_ch, &m) != PX_OUT_OK)
        return;
    }
  }
}

void px_frames_chans_free(px_session *s) {
  uint32_t at = 0;
  for (px_chan *c; (c = px_tab_next(&s->by_client, &at));) {
    px_track_free(s, c);
    px_chan_drop_held(c);
    free(c);
  }
  px_tab_free(&s->by_client);
  px_tab_free(&s->by_up);
}

static int client_channel_open(px_session *s, uint16_t ch, uint8_t *raw,
                               px_chan **hold_chan) {
  if (!px_tab_ready(&s->by_client) || ch > s->channel_max ||
      px_tab_get(&s->by_client, ch))
    return PX_FORWARD; /* the broker answers that */
  px_chan *c = calloc(1, sizeof *c);
  if (!c)
    return px_frames_client_error(s, AMQP_REPLY_INTERNAL_ERROR, "out of memory",
                                  AMQP_CHANNEL_OPEN);
  c->client_ch = ch;
  c->state = PX_CH_OPENING;
  c->gen = ++s->chan_gen;
  uint16_t up = up_free(s, ch) ? ch : find_free_up(s);
  if (up) {
    c->up_ch = up;
    if (px_tab_set(&s->by_client, ch, c) != 0 ||
        px_tab_set(&s->by_up, up, c) != 0) {
      px_tab_set(&s->by_client, ch, NULL);
      free(c);
      return px_frames_client_error(s, AMQP_REPLY_INTERNAL_ERROR,
                                    "out of memory", AMQP_CHANNEL_OPEN);
    }
    s->nchans++;
    if (up != ch) {
      s->srv->stats.channel_remaps++;
      px_chan_renumber(raw, up);
      px_debug("channel_mapped", PX_U("id", s->id), PX_U("client_channel", ch),
               PX_U("upstream_channel", up));
    }
    return PX_FORWARD;
  }
  if (!px_own_may_yield(s)) {
    free(c); /* no number left at all: the broker decides */
    return PX_FORWARD;
  }
  /* Every number is taken: rebound gives its own up, the client's
   * channel waits (held) until the broker confirms the close. */
  if (px_tab_set(&s->by_client, ch, c) != 0) {
    free(c);
    return px_frames_client_error(s, AMQP_REPLY_INTERNAL_ERROR, "out of memory",
                                  AMQP_CHANNEL_OPEN);
  }
  c->held = true;
  c->open_held = true;
  s->nchans++;
  px_own_yield_to(s, ch, px_retry_in_flight(s) == 0);
  *hold_chan = c;
  return PX_HOLD;
}

static void record_user(px_session *s, const amqp_method *m) {
  amqp_bytes mech = m->args[AMQP_F_CONNECTION_START_OK_MECHANISM].b;
  amqp_bytes resp = m->args[AMQP_F_CONNECTION_START_OK_RESPONSE].b;
  amqp_bytes user, password; /* only the user is kept */

  if (amqp_bytes_eq(mech, amqp_cstr("PLAIN")) ||
      amqp_bytes_eq(mech, amqp_cstr("AMQPLAIN"))) {
    px_pub_login_split(mech, resp, &user, &password);
  } else {
    snprintf(s->user, sizeof s->user, "(%.*s)",
             (int)(mech.len > 60 ? 60 : mech.len), (const char *)mech.ptr);
    return;
  }
  snprintf(s->user, sizeof s->user, "%.*s",
           (int)(user.len > 100 ? 100 : user.len),
           user.ptr ? (const char *)user.ptr : "");
}

/* Keep what the client logged in with, for the separate retry connection
 * (px_pub.h): its mechanism, response and locale. Only with
 * retry_connection separate; wiped when the session is freed. */
static void keep_login(px_session *s, const amqp_method *m) {
  amqp_bytes f[3] = {m->args[AMQP_F_CONNECTION_START_OK_MECHANISM].b,
                     m->args[AMQP_F_CONNECTION_START_OK_RESPONSE].b,
                     m->args[AMQP_F_CONNECTION_START_OK_LOCALE].b};
  amqp_bytes *dst[3] = {&s->login.mechanism, &s->login.response,
                        &s->login.locale};
  if (s->srv->cfg->retry_shared || s->login_auth)
    return;
  size_t total = f[0].len + f[1].len + f[2].len;
  if (!(s->login_auth = malloc(total ? total : 1)))
    return;
  uint8_t *o = s->login_auth;
  for (int i = 0; i < 3; i++) {
    if (f[i].len)
      memcpy(o, f[i].ptr, f[i].len);
    *dst[i] = (amqp_bytes){o, f[i].len};
    o += f[i].len;
  }
}

static int client_tune_ok(px_session *s, const amqp_method *m) {
  if (px_tab_ready(&s->by_client) || s->up_end != PX_UP_HANDSHAKE)
    return px_frames_client_error(s, AMQP_REPLY_CHANNEL_ERROR,
                                  "unexpected connection.tune-ok, the "
                                  "connection is already tuned",
                                  m->id);
  uint32_t ch = (uint32_t)m->args[AMQP_F_CONNECTION_TUNE_OK_CHANNEL_MAX].u;
  uint32_t fm = (uint32_t)m->args[AMQP_F_CONNECTION_TUNE_OK_FRAME_MAX].u;
  if (!ch)
    ch = s->offer_channel_max ? s->offer_channel_max : 65535;
  if (!fm)
    fm = s->offer_frame_max ? s->offer_frame_max : PX_FRAME_MAX_CAP;
  s->channel_max = (uint16_t)ch;
  s->frame_max = fm < PX_FRAME_MAX_CAP ? fm : PX_FRAME_MAX_CAP;
  if (s->frame_max < AMQP_FRAME_MIN_SIZE)
    s->frame_max = AMQP_FRAME_MIN_SIZE;
  s->heartbeat = (uint16_t)m->args[AMQP_F_CONNECTION_TUNE_OK_HEARTBEAT].u;
  if (px_tab_init(&s->by_client, s->channel_max) ||
      px_tab_init(&s->by_up, s->channel_max))
    return px_frames_client_error(s, AMQP_REPLY_INTERNAL_ERROR, "out of memory",
                                  m->id);
  return PX_FORWARD;
}

static int client_connection_method(px_session *s, const amqp_frame *f,
                                    uint32_t id) {
  amqp_method m;
  if (AMQP_METHOD_CLASS(id) != 10)
    return px_frames_client_error(s, AMQP_REPLY_COMMAND_INVALID,
                                  "only connection methods on channel 0", id);
  if (id != AMQP_CONNECTION_START_OK && id != AMQP_CONNECTION_TUNE_OK &&
      id != AMQP_CONNECTION_OPEN && id != AMQP_CONNECTION_CLOSE &&
      id != AMQP_CONNECTION_CLOSE_OK)
    return PX_FORWARD;
  int rc = amqp_method_decode_flags(f->payload, &m, AMQP_DECODE_OPAQUE_TABLES);
  if (rc != AMQP_OK)
    return px_frames_client_error(s, (uint16_t)amqp_status_reply_code(rc),
                                  amqp_status_str(rc), id);
  switch (id) {
  case AMQP_CONNECTION_START_OK:
    record_user(s, &m);
    keep_login(s, &m);
    break;
  case AMQP_CONNECTION_TUNE_OK:
    return client_tune_ok(s, &m);
  case AMQP_CONNECTION_OPEN: {
    amqp_bytes v = m.args[AMQP_F_CONNECTION_OPEN_VIRTUAL_HOST].b;
    free(s->login_vhost);
    s->login_vhost = v.len ? malloc(v.len) : NULL;
    if (s->login_vhost)
      memcpy(s->login_vhost, v.ptr, v.len);
    s->login.vhost = (amqp_bytes){s->login_vhost, s->login_vhost ? v.len : 0};
    snprintf(s->vhost, sizeof s->vhost, "%.*s",
             (int)(v.len > 100 ? 100 : v.len), (const char *)v.ptr);
    break;
  }
  case AMQP_CONNECTION_CLOSE:
    if (px_retry_pending(s)) { /* the acks of the copies in flight go first */
      px_info("client_close_waits", PX_U("id", s->id), PX_S("peer", s->peer),
              PX_U("pending", px_retry_pending(s)));
      return PX_HOLD_CONN;
    }
    px_life_closing(s, PX_BY_CLIENT);
    px_life_upstream_close_sent(s);
    break;
  case AMQP_CONNECTION_CLOSE_OK: /* to the broker's close: it hangs up */
    px_life_finishing(s, PX_CR_BROKER_CLOSED_CONNECTION);
    break;
  }
  return PX_FORWARD;
}

/* Content framing: a content method, then its header, then bodies adding
 * up to the header's size, with nothing else on that channel between. */
static int client_content(px_session *s, const amqp_frame *f, px_chan *c,
                          uint32_t id) {
  if (c->state == PX_CH_SERVER_CLOSED)
    return PX_FORWARD; /* the broker discards it anyway */
  if (f->type == AMQP_FRAME_METHOD) {
    if (c->c2u != PX_CONTENT_NONE)
      return px_frames_client_error(s, AMQP_REPLY_UNEXPECTED_FRAME,
                                    "method frame during content", id);
    if (id == AMQP_BASIC_PUBLISH) {
      c->c2u = PX_CONTENT_HEADER;
      px_track_publish(s, c);
    }
    return PX_FORWARD;
  }
  if (f->type == AMQP_FRAME_HEADER) {
    if (c->c2u != PX_CONTENT_HEADER)
      return px_frames_client_error(s, AMQP_REPLY_UNEXPECTED_FRAME,
                                    "content header without a content method",
                                    0);
    c->c2u_left = amqp_content_header_peek_size(f->payload);
    c->c2u = c->c2u_left ? PX_CONTENT_BODY : PX_CONTENT_NONE;
    return PX_FORWARD;
  }
  if (c->c2u != PX_CONTENT_BODY || f->payload.len > c->c2u_left)
    return px_frames_client_error(s, AMQP_REPLY_UNEXPECTED_FRAME,
                                  "content body not expected", 0);
  c->c2u_left -= f->payload.len;
  if (c->c2u_left == 0)
    c->c2u = PX_CONTENT_NONE;
  return PX_FORWARD;
}

/* While rebound is closing the client (error, shutdown), only its
 * close-ok matters. */
static int client_frame_closing(px_session *s, const amqp_frame *f) {
  if (f->type != AMQP_FRAME_METHOD || f->channel != 0)
    return PX_DROP;
  uint32_t id = amqp_method_peek_id(f->payload);
  if (id != AMQP_CONNECTION_CLOSE_OK && id != AMQP_CONNECTION_CLOSE)
    return PX_DROP;
  if (s->closer == PX_BY_SHUTDOWN && s->upstream.connected) {
    px_life_phase(s, PX_PHASE_CLIENT_ANSWERED);
    if (!px_retry_pending(s)) /* else copies in flight or to go: their acks
                              first (px_frames_retry_idle()) */
      px_life_close_upstream(s, PX_CR_SHUTTING_DOWN);
    return PX_DROP; /* the broker's close-ok ends the session */
  }
  px_life_close(s, PX_CR_PROTOCOL_ERROR);
  return PX_STOP;
}

/* Decode a method the retry path needs; a malformed one closes the client
 * with the codec's reply code. */
static int decode_or_close(px_session *s, const amqp_frame *f, uint32_t id,
                           amqp_method *m) {
  int rc = amqp_method_decode_flags(f->payload, m, AMQP_DECODE_OPAQUE_TABLES);
  if (rc == AMQP_OK)
    return PX_FORWARD;
  return px_frames_client_error(s, (uint16_t)amqp_status_reply_code(rc),
                                amqp_status_str(rc), id);
}

/* Methods that tell which deliveries exist and what happens to them. */
/* The common basic.ack (delivery tag, then a multiple flag) read in place;
 * false: another shape, for the full decode to judge. */
static bool settle_in_place(px_session *s, px_chan *c, const amqp_frame *f) {
  if (f->payload.len != 4 + 8 + 1)
    return false;
  amqp_reader r = amqp_reader_make(f->payload.ptr + 4, 9);
  uint64_t tag = amqp_get_u64(&r);
  uint8_t bits = amqp_get_u8(&r);
  if (bits > 1)
    return false;
  px_track_settle(s, c, tag, bits);
  return true;
}

static int client_basic_method(px_session *s, const amqp_frame *f, px_chan *c,
                               uint32_t id) {
  amqp_method m;
  switch (id) {
  case AMQP_BASIC_NACK:
  case AMQP_BASIC_REJECT: {
    int act = decode_or_close(s, f, id, &m);
    if (act == PX_FORWARD && c->track.nexpired)
      act = px_retry_late_settle(s, c, &m);
    if (act != PX_FORWARD)
      return act;
    bool requeue = id == AMQP_BASIC_NACK
                       ? m.args[AMQP_F_BASIC_NACK_REQUEUE].u
                       : m.args[AMQP_F_BASIC_REJECT_REQUEUE].u;
    if (requeue) /* in a transaction too: rebound's ack is the client's */
      return px_retry_requeue(s, c, &m);
    if (px_track_client_method(s, c, &m))
      px_own_want(s);
    return PX_FORWARD;
  }
  case AMQP_BASIC_ACK:
    if (!c->track.nexpired && settle_in_place(s, c, f))
      return PX_FORWARD;
    if (c->track.nexpired) {
      int act = decode_or_close(s, f, id, &m);
      if (act == PX_FORWARD)
        act = px_retry_late_settle(s, c, &m);
      if (act == PX_FORWARD && px_track_client_method(s, c, &m))
        px_own_want(s);
      return act;
    }
    /* fall through */
  case AMQP_BASIC_CONSUME:
  case AMQP_BASIC_GET:
  case AMQP_BASIC_RECOVER:
  case AMQP_BASIC_RECOVER_ASYNC: {
    int act = decode_or_close(s, f, id, &m);
    if (act == PX_FORWARD)
      if (px_track_client_method(s, c, &m))
        px_own_want(s);
    return act;
  }
  }
  return PX_FORWARD;
}

/* Methods of the classes other than basic that matter: queue.declare
 * (the channel's most recently declared queue, which a consume or get
 * naming "" takes), and the end of a transaction. Kept off the path of
 * basic's methods. */
static int client_other_method(px_session *s, const amqp_frame *f, px_chan *c,
                               uint32_t id) {
  amqp_method m;
  int act = PX_FORWARD;
  if (id == AMQP_QUEUE_DECLARE) {
    act = decode_or_close(s, f, id, &m);
    if (act == PX_FORWARD)
      px_track_client_method(s, c, &m);
  } else if (id == AMQP_TX_COMMIT || id == AMQP_TX_ROLLBACK) {
    px_retry_tx_end(s, c, id == AMQP_TX_ROLLBACK);
  }
  return act;
}

/* A channel the client is closing or the broker closed: the broker only
 * looks at channel.close and close-ok there, so frames pass unexamined and
 * nothing more is tracked for it. */
static int client_frame_chan_closing(px_session *s, px_chan *c, uint8_t *raw,
                                     uint32_t id) {
  if (c->up_ch != c->client_ch)
    px_chan_renumber(raw, c->up_ch);
  if (id == AMQP_CHANNEL_CLOSE_OK)
    px_frames_chan_release(s, c);
  return PX_FORWARD;
}

/* Is upstream channel `n` carrying something else than the client's own
 * channel `n` (rebound's channel, or a client channel moved there)? */
static bool up_taken(const px_session *s, uint16_t n) {
  return (n == px_own_ch(s) && px_own_on_main(s)) || px_tab_get(&s->by_up, n);
}

/* A frame on a channel the client has not opened. Where that number
 * carries something else upstream, rebound answers as the broker would
 * (504); otherwise the broker answers it. */
static int client_unopened(px_session *s, const amqp_frame *f, uint32_t id) {
  if (!up_taken(s, f->channel))
    return PX_FORWARD;
  return px_frames_client_error(s, AMQP_REPLY_CHANNEL_ERROR,
                                "expected 'channel.open'", id);
}

/* After a connection.close (either way) the broker only looks at
 * connection.close and close-ok; so does rebound. */
static bool closing_ignores(const px_session *s, const amqp_frame *f,
                            uint32_t id) {
  return s->closer != PX_BY_NONE &&
         !(f->channel == 0 &&
           (id == AMQP_CONNECTION_CLOSE || id == AMQP_CONNECTION_CLOSE_OK));
}

/* An ack multiple (or a nack multiple without requeue) that covers a
 * delivery whose retry waits can go upstream split around it, when every
 * delivery of the channel is tracked and none was timed out by rebound. */
static bool may_split(const px_chan *c, const amqp_method *m) {
  bool ack = m->id == AMQP_BASIC_ACK;
  if (c->track.lost || c->track.nexpired ||
      !(ack ? m->args[AMQP_F_BASIC_ACK_MULTIPLE].u
            : m->id == AMQP_BASIC_NACK &&
                  m->args[AMQP_F_BASIC_NACK_MULTIPLE].u &&
                  !m->args[AMQP_F_BASIC_NACK_REQUEUE].u))
    return false;
  uint64_t tag = ack ? m->args[AMQP_F_BASIC_ACK_DELIVERY_TAG].u
                     : m->args[AMQP_F_BASIC_NACK_DELIVERY_TAG].u;
  const px_delivery *d = tag ? px_track_find((px_chan *)c, tag) : NULL;
  return d && !px_dl_waiting(d);
}

/* May this frame of a held channel go past the retries it waits for? A
 * settle (ack, nack, reject) that covers no delivery being retried or held
 * back, when nothing of the channel is queued yet: it cannot overtake
 * rebound's ack of an original, and the client's own order is kept. So a
 * consumer's acks keep flowing while a copy waits for its confirm. */
static bool may_overtake(px_session *s, px_chan *c, const amqp_frame *f,
                         uint32_t id, int *act) {
  amqp_method m;
  if ((id != AMQP_BASIC_ACK && id != AMQP_BASIC_NACK &&
       id != AMQP_BASIC_REJECT) ||
      px_chan_nheld(c) || c->open_held || c->release_queued || c->tx ||
      c->state != PX_CH_OPEN || amqp_method_decode(f->payload, &m) != AMQP_OK)
    return false;
  uint64_t tag = id == AMQP_BASIC_ACK ? m.args[AMQP_F_BASIC_ACK_DELIVERY_TAG].u
                 : id == AMQP_BASIC_NACK
                     ? m.args[AMQP_F_BASIC_NACK_DELIVERY_TAG].u
                     : m.args[AMQP_F_BASIC_REJECT_DELIVERY_TAG].u;
  bool multiple = id == AMQP_BASIC_ACK    ? m.args[AMQP_F_BASIC_ACK_MULTIPLE].u
                  : id == AMQP_BASIC_NACK ? m.args[AMQP_F_BASIC_NACK_MULTIPLE].u
                                          : false;
  uint32_t from = multiple ? 0 : px_track_index(c, tag);
  uint32_t to = multiple ? px_track_upto(c, tag) : from + 1;
  bool waits = false, timing_out = false;
  for (uint32_t i = from; i < to && i < c->track.dl.r.n; i++) {
    const px_delivery *d = px_dl_at(&c->track, i);
    if ((multiple || d->tag == tag) && px_dl_waiting(d)) {
      waits = true;
      /* a copy rebound makes for a processing timeout is not the client's
       * settle: its ack of that delivery must not be dropped by a split */
      timing_out = timing_out || (d->flags & PX_DLF_TIMING_OUT);
    }
  }
  if (!waits)
    return true;
  if (timing_out || !may_split(c, &m))
    return false;
  *act = px_retry_split_settle(s, c, &m); /* sent around them */
  return true;
}

int px_frames_client(px_session *s, const amqp_frame *f, uint8_t *raw,
                     px_chan **hold_chan) {
  if (px_life_telling_client(s))
    return client_frame_closing(s, f);
  uint32_t id =
      f->type == AMQP_FRAME_METHOD ? amqp_method_peek_id(f->payload) : 0;
  if (closing_ignores(s, f, id))
    return PX_DROP;
  if (f->type == AMQP_FRAME_HEARTBEAT)
    return PX_FORWARD;
  if (f->channel == 0) {
    if (f->type != AMQP_FRAME_METHOD)
      return px_frames_client_error(s, AMQP_REPLY_UNEXPECTED_FRAME,
                                    "content frame on channel 0", 0);
    return client_connection_method(s, f, id);
  }
  if (AMQP_METHOD_CLASS(id) == 10)
    return px_frames_client_error(s, AMQP_REPLY_COMMAND_INVALID,
                                  "connection method on a channel", id);
  px_chan *c = px_tab_get(&s->by_client, f->channel);
  int split = PX_FORWARD;
  if (c && c->held && !may_overtake(s, c, f, id, &split)) { /* waits,
                                     unexamined, until released */
    *hold_chan = c;
    return PX_HOLD;
  }
  if (split != PX_FORWARD)
    return split; /* sent around the waiting retries */
  if (id == AMQP_CHANNEL_OPEN)
    return client_channel_open(s, f->channel, raw, hold_chan);
  if (!c)
    return client_unopened(s, f, id);
  if (c->state == PX_CH_SERVER_CLOSED || c->state == PX_CH_CLOSING)
    return client_frame_chan_closing(s, c, raw, id);
  int act = client_content(s, f, c, id);
  if (act == PX_FORWARD && AMQP_METHOD_CLASS(id) == 60)
    act = client_basic_method(s, f, c, id);
  else if (act == PX_FORWARD) /* the rare classes: queue, tx */
    act = client_other_method(s, f, c, id);
  if (act == PX_HOLD)
    *hold_chan = c; /* a requeue waiting for rebound's channel */
  if (id == AMQP_TX_SELECT)
    c->tx = true;
  if (id == AMQP_CONFIRM_SELECT && !c->track.confirm) {
    c->track.confirm = true;
    c->track.pub_seq = 1;
  }
  if (act != PX_FORWARD)
    return act;
  if (id == AMQP_CHANNEL_CLOSE)
    c->state = PX_CH_CLOSING;
  if (c->up_ch != c->client_ch)
    px_chan_renumber(raw, c->up_ch);
  if (id == AMQP_CHANNEL_CLOSE_OK)
    px_frames_chan_release(s, c);
  return PX_FORWARD;
}

bool px_frames_awaits_idle(const px_session *s) {
  return px_life_conn_held(s) || s->phase == PX_PHASE_CLIENT_ANSWERED ||
         s->phase == PX_PHASE_CLIENT_GONE || px_own_yield_pending(s);
}

void px_frames_retry_idle(px_session *s) {
  if (px_life_closed(s))
    return;
  if (px_own_yield_pending(s) && px_own_is_ready(s))
    px_own_yield_now(s);
  px_life_release_conn_hold(s); /* the client's own connection.close */
  if (s->phase == PX_PHASE_CLIENT_ANSWERED) /* rebound is shutting down */
    px_life_close_upstream(s, PX_CR_SHUTTING_DOWN);
  if (s->phase == PX_PHASE_CLIENT_GONE) /* the reason noted stays */
    px_life_end_upstream(s, s->closer == PX_BY_SHUTDOWN
                                ? PX_CR_SHUTTING_DOWN
                                : PX_CR_CLIENT_DISCONNECTED);
}

/* ---- broker -> client -----------------------------------------------------
 */

static void log_open(px_session *s) {
  px_info("session_open", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("user", s->user), PX_S("vhost", s->vhost),
          PX_S("upstream", px_own_upstream(s)),
          PX_U("channel_max", s->channel_max), PX_U("frame_max", s->frame_max),
          PX_U("heartbeat", s->heartbeat));
}

/* Does the broker dead-letter out of quorum queues at-least-once? Its
 * connection.start says RabbitMQ 3.10 or later. */
static bool broker_quorum_dlx(const amqp_method *m) {
  amqp_bytes props = m->args[AMQP_F_CONNECTION_START_SERVER_PROPERTIES].b;
  amqp_field product, version;
  unsigned major = 0, minor = 0;
  char v[32];
  if (amqp_table_get(props, amqp_cstr("product"), &product) != AMQP_OK ||
      product.type != 'S' ||
      !amqp_bytes_eq(product.v.bytes, amqp_cstr("RabbitMQ")) ||
      amqp_table_get(props, amqp_cstr("version"), &version) != AMQP_OK ||
      version.type != 'S' || version.v.bytes.len >= sizeof v)
    return false;
  memcpy(v, version.v.bytes.ptr, version.v.bytes.len);
  v[version.v.bytes.len] = '\0';
  if (sscanf(v, "%u.%u", &major, &minor) != 2)
    return false;
  return major > 3 || (major == 3 && minor >= 10);
}

/* connection.blocked or unblocked: it holds rebound's copies too when
 * they go on the client's connection. */
static void upstream_blocked(px_session *s, const amqp_frame *f, uint32_t id) {
  amqp_method m;
  if ((s->srv->cfg->retry_shared || px_own_pub_failed(s)) &&
      amqp_method_decode_flags(f->payload, &m, AMQP_DECODE_OPAQUE_TABLES) ==
          AMQP_OK)
    px_retry_blocked(s, id == AMQP_CONNECTION_BLOCKED,
                     id == AMQP_CONNECTION_BLOCKED
                         ? m.args[AMQP_F_CONNECTION_BLOCKED_REASON].b
                         : amqp_cstr(""),
                     "client's upstream connection");
}

static int upstream_connection_method(px_session *s, const amqp_frame *f,
                                      uint32_t id) {
  amqp_method m;
  switch (id) {
  case AMQP_CONNECTION_START: /* the session lets its dialer go */
    s->broker_quorum_dlx =
        amqp_method_decode_flags(f->payload, &m, AMQP_DECODE_OPAQUE_TABLES) ==
            AMQP_OK &&
        broker_quorum_dlx(&m);
    break;
  case AMQP_CONNECTION_TUNE:
    if (amqp_method_decode_flags(f->payload, &m, AMQP_DECODE_OPAQUE_TABLES) ==
        AMQP_OK) {
      s->offer_channel_max =
          (uint16_t)m.args[AMQP_F_CONNECTION_TUNE_CHANNEL_MAX].u;
      s->offer_frame_max = (uint32_t)m.args[AMQP_F_CONNECTION_TUNE_FRAME_MAX].u;
    }
    break;
  case AMQP_CONNECTION_OPEN_OK:
    if (s->phase != PX_PHASE_HANDSHAKE || !px_tab_ready(&s->by_client))
      break;
    px_life_handshake_done(s);
    log_open(s);
    if (s->srv->cfg->retry_shared)
      px_own_open(s); /* else at the first delivery kept for retry */
    break;
  case AMQP_CONNECTION_CLOSE:
    if (amqp_method_decode_flags(f->payload, &m, AMQP_DECODE_OPAQUE_TABLES) ==
        AMQP_OK) {
      amqp_bytes t = m.args[AMQP_F_CONNECTION_CLOSE_REPLY_TEXT].b;
      px_info("broker_close", PX_U("id", s->id), PX_S("peer", s->peer),
              PX_U("code", m.args[AMQP_F_CONNECTION_CLOSE_REPLY_CODE].u),
              PX_B("text", t.ptr, t.len));
    }
    px_life_closing(s, PX_BY_BROKER);
    px_life_upstream_answered(s); /* it acts on nothing more */
    break;
  case AMQP_CONNECTION_CLOSE_OK: /* to the client's close */
    px_life_upstream_answered(s);
    px_life_finishing(s, PX_CR_CLIENT_CLOSED_CONNECTION);
    break;
  case AMQP_CONNECTION_BLOCKED:
  case AMQP_CONNECTION_UNBLOCKED:
    upstream_blocked(s, f, id);
    break;
  }
  return PX_FORWARD;
}

int px_frames_upstream_error(px_session *s, const char *what) {
  s->srv->stats.protocol_errors++;
  px_warn("upstream_protocol_error", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("upstream", px_own_upstream(s)), PX_S("error", what));
  px_life_close_client(s, AMQP_REPLY_INTERNAL_ERROR,
                       "INTERNAL_ERROR - protocol error from the broker", 0, 0);
  return PX_STOP;
}

/* Content framing from the broker: after a content method its header,
 * then bodies adding up to the header's size. */
static int upstream_content(px_session *s, px_chan *c, const amqp_frame *f) {
  if (f->type == AMQP_FRAME_BODY) {
    c->u2c_left -= f->payload.len < c->u2c_left ? f->payload.len : c->u2c_left;
    if (c->u2c_left == 0)
      c->u2c = PX_CONTENT_NONE;
    return PX_FORWARD;
  }
  c->u2c_left = amqp_content_header_peek_size(f->payload);
  if (c->u2c_left > PX_UPSTREAM_BODY_MAX)
    return px_frames_upstream_error(s, "content header announces an impossible "
                                       "body size");
  c->u2c = c->u2c_left ? PX_CONTENT_BODY : PX_CONTENT_NONE;
  return PX_FORWARD;
}

/* A frame of rebound's channel on the client's upstream connection. */
static int own_frame(px_session *s, const amqp_frame *f) {
  px_own_event ev = px_own_frame(s, f);
  return px_retry_own_event(s, &ev);
}

static int upstream_frame_closing(px_session *s, const amqp_frame *f) {
  if (f->channel != 0 && f->channel == px_own_ch(s) && px_own_on_main(s))
    return own_frame(s, f); /* confirms of copies in flight still count */
  if (f->type != AMQP_FRAME_METHOD || f->channel != 0)
    return PX_DROP;
  uint32_t id = amqp_method_peek_id(f->payload);
  if (id == AMQP_CONNECTION_BLOCKED || id == AMQP_CONNECTION_UNBLOCKED)
    upstream_blocked(s, f, id); /* copies still to go wait for it */
  if ((id == AMQP_CONNECTION_CLOSE_OK || id == AMQP_CONNECTION_CLOSE) &&
      s->closer == PX_BY_SHUTDOWN) {
    px_life_close(s, PX_CR_SHUTTING_DOWN);
    return PX_STOP;
  }
  return PX_DROP;
}

/* The broker's methods that name consumers, confirms and channel.close:
 * tracked for retries (deliveries: upstream_deliver()). */
static void upstream_track(px_session *s, px_chan *c, const amqp_frame *f,
                           uint32_t id) {
  amqp_method m;
  switch (id) {
  case AMQP_BASIC_ACK:
  case AMQP_BASIC_NACK: /* from the broker: confirms */
    px_track_confirmed(s, c, f->payload);
    break;
  case AMQP_BASIC_GET_OK:
  case AMQP_BASIC_GET_EMPTY:
  case AMQP_BASIC_CONSUME_OK:
  case AMQP_QUEUE_DECLARE_OK:
  case AMQP_BASIC_CANCEL_OK:
  case AMQP_BASIC_CANCEL:
    if (amqp_method_decode_flags(f->payload, &m, AMQP_DECODE_OPAQUE_TABLES) !=
        AMQP_OK)
      c->track.lost = true;
    else if (px_track_upstream_method(s, c, &m))
      px_own_want(s);
    break;
  case AMQP_CHANNEL_CLOSE:
    /* the broker closed it: unsettled deliveries are requeued by the
     * broker, held client frames would be discarded by it */
    c->state = PX_CH_SERVER_CLOSED;
    px_track_clear(s, c);
    c->track.retries_pending = c->track.defers_pending = 0;
    c->held = c->open_held = false;
    px_life_drop_held(s, c);
    break;
  }
}

/* The header and body frames of a message to a client channel, the bulk
 * of what the broker sends: checked against the channel's content state,
 * kept when they belong to a kept delivery, renumbered. */
static int upstream_content_frame(px_session *s, const amqp_frame *f,
                                  uint8_t *raw) {
  px_chan *c = px_tab_get(&s->by_up, f->channel);
  if (!c)
    return PX_FORWARD;
  if (upstream_content(s, c, f) != PX_FORWARD)
    return PX_STOP;
  if (c->track.capture) /* most content belongs to no kept delivery */
    px_track_content(s, c, f);
  if (c->up_ch != c->client_ch)
    px_chan_renumber(raw, c->client_ch);
  return PX_FORWARD;
}

/* basic.deliver to a client channel, the one method of every message:
 * its content is announced, the delivery tracked. */
static int upstream_deliver(px_session *s, const amqp_frame *f, uint8_t *raw) {
  px_chan *c = px_tab_get(&s->by_up, f->channel);
  if (!c)
    return PX_FORWARD;
  c->u2c = PX_CONTENT_HEADER;
  if (px_track_deliver(s, c, f->payload))
    px_own_want(s);
  if (c->up_ch != c->client_ch)
    px_chan_renumber(raw, c->client_ch);
  return PX_FORWARD;
}

/* Every other frame from the broker: methods, heartbeats, rebound's own
 * channel, and what comes while the session ends. */
static __attribute__((noinline)) int
upstream_frame(px_session *s, const amqp_frame *f, uint8_t *raw) {
  if (px_life_telling_client(s))
    return upstream_frame_closing(s, f);
  bool gone = s->phase == PX_PHASE_CLIENT_GONE;
  if (f->type == AMQP_FRAME_HEARTBEAT)
    return gone ? PX_DROP : PX_FORWARD;
  uint32_t id =
      f->type == AMQP_FRAME_METHOD ? amqp_method_peek_id(f->payload) : 0;
  if (f->channel != 0 && f->channel == px_own_ch(s) && px_own_on_main(s))
    return own_frame(s, f);
  if (gone)
    return PX_DROP; /* only rebound's own traffic matters now */
  if (f->channel == 0)
    return f->type == AMQP_FRAME_METHOD ? upstream_connection_method(s, f, id)
                                        : PX_FORWARD;
  if (f->type != AMQP_FRAME_METHOD)
    return upstream_content_frame(s, f, raw);
  if (id == AMQP_BASIC_DELIVER)
    return upstream_deliver(s, f, raw);
  px_chan *c = px_tab_get(&s->by_up, f->channel);
  if (!c)
    return PX_FORWARD;
  if (id == AMQP_BASIC_GET_OK || id == AMQP_BASIC_RETURN)
    c->u2c = PX_CONTENT_HEADER;
  upstream_track(s, c, f, id);
  if (id == AMQP_CHANNEL_OPEN_OK)
    c->state = PX_CH_OPEN;
  if (c->up_ch != c->client_ch)
    px_chan_renumber(raw, c->client_ch);
  if (id == AMQP_CHANNEL_CLOSE_OK)
    px_frames_chan_release(s, c);
  return PX_FORWARD;
}

int px_frames_upstream(px_session *s, const amqp_frame *f, uint8_t *raw) {
  bool plain = !px_life_telling_client(s) && s->phase != PX_PHASE_CLIENT_GONE &&
               f->channel != 0 && f->channel != px_own_ch(s);
  if (plain && (f->type == AMQP_FRAME_HEADER || f->type == AMQP_FRAME_BODY))
    return upstream_content_frame(s, f, raw);
  if (plain && f->type == AMQP_FRAME_METHOD &&
      amqp_method_peek_id(f->payload) == AMQP_BASIC_DELIVER)
    return upstream_deliver(s, f, raw);
  return upstream_frame(s, f, raw);
}
