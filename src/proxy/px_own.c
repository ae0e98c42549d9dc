/* px_own.c - rebound's own channel, where copies are published
 * (px_own.h): opened on the separate retry connection (px_pub.h) or on
 * the client's upstream connection, confirm mode, reopened with a backoff
 * when the broker closes it, and given up to a client that needs its
 * number. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "px_life.h"
#include "px_log.h"
#include "px_own.h"
#include "px_server.h"

const char *px_own_state_name(int state) {
  switch (state) {
#define PX__OWN_NAME(id, name)                                                 \
  case PX_OWN_##id:                                                            \
    return name;
    PX_OWN_STATES(PX__OWN_NAME)
#undef PX__OWN_NAME
  }
  return "?";
}

/* Every change of state goes through here, and is logged. */
static void own_set(px_session *s, px_own_state to) {
  if (s->own.state == to)
    return;
  px_debug("own_channel_state", PX_U("id", s->id), PX_U("channel", s->own.ch),
           PX_S("connection", s->own.on_pub ? "retry" : "client's"),
           PX_S("from", px_own_state_name(s->own.state)),
           PX_S("to", px_own_state_name(to)));
  s->own.state = (uint8_t)to;
}

void px_own_init(px_session *s, px_timer_fn reopen_due) {
  px_timer_init(&s->own.reopen, reopen_due, s);
}

void px_own_session_closed(px_session *s) {
  px_timer_close(&s->srv->clock, &s->own.reopen);
  s->own.pub_ready = false;
}

void px_own_reopen_if_due(px_session *s) {
  px_timer *t = &s->own.reopen;
  if (t->started && t->due_ms <= px_clock_ms(&s->srv->clock)) {
    px_timer_stop(&s->srv->clock, t);
    px_own_reopen(s);
  }
}

void px_own_reopen_after(px_session *s, uint32_t ms) {
  px_timer_start(&s->srv->clock, &s->own.reopen, ms);
}

uint64_t px_own_next_seq(px_session *s) {
  return ++s->own.seq;
}

void px_own_unseq(px_session *s) {
  s->own.seq--;
}

void px_own_confirmed(px_session *s) {
  s->own.failures = 0; /* the reopen backoff starts over */
}

bool px_own_add_waiter(px_session *s, uint16_t ch, uint32_t gen) {
  if (s->own.nwaiters == sizeof s->own.waiters / sizeof s->own.waiters[0])
    return false;
  s->own.waiters[s->own.nwaiters].ch = ch;
  s->own.waiters[s->own.nwaiters++].gen = gen;
  return true;
}

unsigned px_own_nwaiters(const px_session *s) {
  return s->own.nwaiters;
}

bool px_own_may_yield(const px_session *s) {
  return px_own_on_main(s) && !s->own.yield_waiter;
}

void px_own_yield_to(px_session *s, uint16_t ch, bool idle) {
  s->own.yield_waiter = ch;
  if (s->own.state == PX_OWN_READY && idle)
    px_own_yield_now(s);
  else if (s->own.state != PX_OWN_CLOSING)
    s->own.yield_requested = true;
}

const char *px_own_upstream(const px_session *s) {
  if (s->dial)
    return s->dial->addr;
  return s->up.addr ? s->up.addr : "";
}

bool px_own_active(const px_session *s) {
  return s->own.state == PX_OWN_OPENING || s->own.state == PX_OWN_SELECTING ||
         s->own.state == PX_OWN_READY || s->own.state == PX_OWN_CLOSING;
}

/* Is rebound's channel on the client's upstream connection (a number
 * there is taken)? */
bool px_own_on_main(const px_session *s) {
  return px_own_active(s) && !s->own.on_pub;
}

/* ---- rebound's own channel ---------------------------------------------- */

static void release_own_waiters(px_session *s);

static void pub_open(px_session *s);

/* Open rebound's channel: on the separate retry connection (connecting
 * it first), or on the client's connection on a number the client has
 * not opened. */
void px_own_open(px_session *s) {
  amqp_method m;
  uint16_t n = 0;
  s->own.seq = 0; /* confirm.select numbers publishes from 1 */
  if (!s->srv->cfg->retry_shared && !s->own.pub_failed) {
    s->own.on_pub = true;
    s->own.ch = 1;
    own_set(s, PX_OWN_OPENING);
    if (!s->out.pub) {
      pub_open(s); /* channel.open once it is logged in */
      return;
    }
    if (s->own.pub_ready) {
      amqp_method_init(&m, AMQP_CHANNEL_OPEN);
      if (px_out_method(&s->out, NULL, 1, &m) != PX_OUT_OK)
        return; /* the session closes over it */
    }
    return;
  }
  s->own.on_pub = false;
  for (uint32_t k = s->channel_max; k >= 1 && !n; k--)
    if (!px_tab_get(&s->by_up, (uint16_t)k) &&
        !px_tab_get(&s->by_client, (uint16_t)k))
      n = (uint16_t)k;
  if (!n) {
    own_set(s, PX_OWN_YIELDED);
    s->own.ch = 0;
    return;
  }
  s->own.ch = n;
  own_set(s, PX_OWN_OPENING);
  amqp_method_init(&m, AMQP_CHANNEL_OPEN);
  if (px_out_method(&s->out, &s->upstream, n, &m) != PX_OUT_OK)
    return; /* the session closes over it */
}

void px_own_want(px_session *s) {
  if (s->own.state == PX_OWN_NONE && !s->own.reopen.started &&
      px_life_is_open(s))
    px_own_open(s);
}

void px_own_yield_now(px_session *s) {
  if (px_out_channel_close(&s->out, &s->upstream, s->own.ch, AMQP_REPLY_SUCCESS,
                           "rebound yields this channel") != PX_OUT_OK)
    return; /* the session closes over it */
  own_set(s, PX_OWN_CLOSING);
  s->own.yield_requested = false;
}

/* rebound's channel is gone: its number goes to the waiting client
 * channel, whose held frames are released. */
static void own_handover(px_session *s) {
  uint16_t n = s->own.ch;
  px_chan *c = px_tab_get(&s->by_client, s->own.yield_waiter);
  own_set(s, PX_OWN_YIELDED);
  s->own.ch = 0;
  s->own.yield_waiter = 0;
  s->srv->stats.own_channel_yields++;
  release_own_waiters(s); /* no channel of rebound's: requeues pass */
  px_info("own_channel_yielded", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_U("channel", n), PX_S("state", px_own_state_name(s->own.state)),
          PX_S("reason", "client opened every channel"));
  if (!c)
    return;
  c->up_ch = n;
  px_tab_set(&s->by_up, n, c);
  px_life_release_held(s, c);
}

/* Requeues that waited for rebound's channel go through the handler again
 * (retried now, or passed through if the channel could not reopen). */
static void release_own_waiters(px_session *s) {
  unsigned n = s->own.nwaiters;
  s->own.nwaiters = 0;
  for (unsigned i = 0; i < n; i++) {
    px_chan *c = px_tab_get(&s->by_client, s->own.waiters[i].ch);
    if (c && c->gen == s->own.waiters[i].gen && c->held &&
        !c->track.retries_pending && !c->track.defers_pending)
      px_life_release_held(s, c);
  }
}

/* How long until rebound's channel reopens after its latest close. */
static uint32_t own_backoff_ms(px_session *s) {
  if (s->own.failures < UINT8_MAX)
    s->own.failures++;
  if (s->own.failures <= 1)
    return 0;
  uint32_t ms = PX_OWN_BACKOFF_MS;
  for (unsigned i = 2; i < s->own.failures && ms < PX_OWN_BACKOFF_MAX_MS; i++)
    ms *= 2;
  return ms < PX_OWN_BACKOFF_MAX_MS ? ms : PX_OWN_BACKOFF_MAX_MS;
}

void px_own_reopen(px_session *s) {
  if (s->own.state == PX_OWN_NONE && px_life_is_open(s))
    px_own_open(s);
}

/* The broker closed rebound's channel (a refused declare, a queue whose
 * home node is down, ...): no new copies while those in flight fall back
 * (px_retry_own_event() tells the retry path, then px_own_closed()). */
static px_own_event own_closing(px_session *s, const amqp_method *close) {
  px_own_event ev = {.kind = PX_OWN_EV_CLOSED};
  ev.text = close->args[AMQP_F_CHANNEL_CLOSE_REPLY_TEXT].b;
  ev.code = (uint16_t)close->args[AMQP_F_CHANNEL_CLOSE_REPLY_CODE].u;
  ev.yielding = s->own.state == PX_OWN_CLOSING || s->own.yield_requested;
  ev.was = px_own_state_name(s->own.state);
  own_set(s, PX_OWN_NONE);
  return ev;
}

uint32_t px_own_closed(px_session *s, const px_own_event *ev, bool adapted) {
  amqp_method m;
  uint32_t delay = adapted ? 0 : own_backoff_ms(s);
  s->srv->stats.own_channel_errors++;
  px_warn("own_channel_closed", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_U("channel", s->own.ch), PX_S("state", ev->was),
          PX_U("code", ev->code), PX_B("text", ev->text.ptr, ev->text.len),
          PX_U("reopen_ms", delay));
  amqp_method_init(&m, AMQP_CHANNEL_CLOSE_OK);
  if (px_out_method(&s->out, px_own_sink(s), s->own.ch, &m) != PX_OUT_OK)
    return 0; /* the session closes over it */
  if (ev->yielding) {
    own_handover(s);
    return 0;
  }
  own_set(s, PX_OWN_NONE);
  if (delay == 0)
    px_own_open(s);
  return delay;
}

void px_own_waiting(px_session *s) {
  release_own_waiters(s); /* their requeues wait for it, up to a delay */
  s->idle_due = true;     /* px_frames_retry_idle() once nothing is pending */
}

px_own_event px_own_frame(px_session *s, const amqp_frame *f) {
  amqp_method m;
  px_own_event ev = {.kind = PX_OWN_EV_NONE};
  if (f->type != AMQP_FRAME_METHOD)
    return ev; /* content of a basic.return to rebound */
  int rc = amqp_method_decode(f->payload, &m);
  if (rc != AMQP_OK) {
    px_warn("own_channel_bad_frame", PX_U("id", s->id),
            PX_S("error", amqp_status_str(rc)));
    return ev;
  }
  switch (m.id) {
  case AMQP_CHANNEL_OPEN_OK:
    own_set(s, PX_OWN_SELECTING);
    amqp_method_init(&m, AMQP_CONFIRM_SELECT);
    if (px_out_method(&s->out, px_own_sink(s), s->own.ch, &m) != PX_OUT_OK)
      ev.kind = PX_OWN_EV_STOP; /* the session closes over it */
    return ev;
  case AMQP_CONFIRM_SELECT_OK:
    own_set(s, PX_OWN_READY);
    px_debug("own_channel_ready", PX_U("id", s->id), PX_U("channel", s->own.ch),
             PX_S("state", px_own_state_name(s->own.state)));
    release_own_waiters(s);
    ev.kind = PX_OWN_EV_READY;
    return ev;
  case AMQP_BASIC_ACK:
    ev.kind = PX_OWN_EV_CONFIRM;
    ev.ok = true;
    ev.seq = m.args[AMQP_F_BASIC_ACK_DELIVERY_TAG].u;
    ev.multiple = m.args[AMQP_F_BASIC_ACK_MULTIPLE].u;
    return ev;
  case AMQP_BASIC_NACK:
    ev.kind = PX_OWN_EV_CONFIRM;
    ev.seq = m.args[AMQP_F_BASIC_NACK_DELIVERY_TAG].u;
    ev.multiple = m.args[AMQP_F_BASIC_NACK_MULTIPLE].u;
    return ev;
  case AMQP_BASIC_RETURN:
    ev.kind = PX_OWN_EV_RETURNED;
    ev.text = m.args[AMQP_F_BASIC_RETURN_ROUTING_KEY].b;
    return ev;
  case AMQP_CHANNEL_CLOSE:
    return own_closing(s, &m);
  case AMQP_CHANNEL_CLOSE_OK:
    own_handover(s);
    return ev;
  default:
    return ev; /* confirms and returns for rebound's publishes */
  }
}

void px_own_after_ready(px_session *s, bool idle) {
  if (s->own.yield_requested && idle)
    px_own_yield_now(s);
}

/* ---- the separate retry connection (px_pub.h) -------------------------
 */

void px_own_pub_ready(px_session *s) {
  s->own.pub_ready = true;
  s->own.pub_was_up = true;
  s->own.pub_misses = 0;
  s->srv->stats.retry_connections_total++;
  px_debug("retry_connection_open", PX_U("id", s->id), PX_S("peer", s->peer),
           PX_S("upstream", px_own_upstream(s)),
           PX_S("state", px_own_state_name(s->own.state)));
  if (s->own.state == PX_OWN_OPENING && s->own.on_pub) {
    amqp_method m;
    amqp_method_init(&m, AMQP_CHANNEL_OPEN);
    (void)!px_out_method(&s->out, NULL, 1, &m); /* a failure: the session
                                                   closes over it */
  }
}

bool px_own_pub_frame(const px_session *s, const amqp_frame *f) {
  return s->own.on_pub && f->channel == s->own.ch && px_own_active(s);
}

px_own_pub_loss px_own_pub_lost(px_session *s) {
  px_own_pub_loss l = {s->own.on_pub && s->own.state != PX_OWN_NONE,
                       s->own.pub_ready, px_own_state_name(s->own.state)};
  px_pub_close(s->out.pub);
  s->out.pub = NULL;
  s->own.pub_ready = false;
  own_set(s, PX_OWN_NONE); /* before anything may publish again */
  return l;
}

/* Never logged in: rebound's channel goes on the client's connection.
 * Lost after it was up: it is dialled again after the backoff, the same
 * after a failed login then, up to PX_PUB_MISSES_MAX in a row. */
bool px_own_pub_lost_after(px_session *s, const px_own_pub_loss *l,
                           const char *why, amqp_bytes text,
                           uint32_t *reopen_ms) {
  if (!l->was_ready) {
    s->srv->stats.retry_connection_failures++;
    if (!s->own.pub_was_up || ++s->own.pub_misses >= PX_PUB_MISSES_MAX)
      s->own.pub_failed = true;
  }
  uint32_t delay = s->own.pub_failed ? 0 : own_backoff_ms(s);
  px_warn("retry_connection_lost", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("upstream", px_own_upstream(s)), PX_S("error", why),
          PX_S("state", l->was), PX_B("text", text.ptr, text.len),
          PX_U("failed_logins", s->own.pub_misses),
          PX_S("action", s->own.pub_failed
                             ? "copies go on the client's connection"
                             : "reconnect after a backoff"),
          PX_U("reconnect_ms", delay));
  *reopen_ms = delay;
  if (!px_life_is_open(s))
    return false;
  if (s->own.pub_failed)
    px_own_open(s);
  return !s->own.pub_failed;
}

static void pub_open(px_session *s) {
  s->login.frame_max = s->frame_max;
  s->login.timeout_ms = s->srv->cfg->handshake_timeout_ms;
  s->login.peer = s->peer;
  s->own.pub_ready = false;
  s->out.pub = s->login_auth
                   ? px_pub_open(s->srv->loop, &s->up.sa.sa, s->srv->pub_io,
                                 &s->login, s->pub_events, s)
                   : NULL;
  if (s->out.pub)
    return;
  s->own.pub_failed = true;
  s->srv->stats.retry_connection_failures++;
  px_warn("retry_connection_failed", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("upstream", px_own_upstream(s)),
          PX_S("error", s->login_auth ? "cannot be set up"
                                      : "the client's login was not kept"),
          PX_S("action", "copies go on the client's connection"));
  px_own_open(s);
}
