/* px_life.c - a session's lifecycle below its event handlers
 * (px_life.h). */
#include <stdio.h>

#include "px_life.h"
#include "px_log.h"
#include "px_server.h"

const char *px_close_by_name(int by) {
  switch (by) {
#define PX__BY_NAME(id, name)                                                  \
  case PX_BY_##id:                                                             \
    return name;
    PX_CLOSE_BY(PX__BY_NAME)
#undef PX__BY_NAME
  }
  return "?";
}

const char *px_close_phase_name(int phase) {
  switch (phase) {
#define PX__PHASE_NAME(id, name, wait)                                         \
  case PX_PHASE_##id:                                                          \
    return name;
    PX_CLOSE_PHASES(PX__PHASE_NAME)
#undef PX__PHASE_NAME
  }
  return "?";
}

/* How long a phase may last (0: no limit of its own, PX_PHASE_RUNS_ON:
 * the last one's runs on). */
static uint64_t phase_wait_ms(const px_session *s, px_close_phase phase) {
  const px_config *cfg = s->srv->cfg;
  switch (phase) {
#define PX__PHASE_WAIT(id, name, wait)                                         \
  case PX_PHASE_##id:                                                          \
    return (uint64_t)(wait);
    PX_CLOSE_PHASES(PX__PHASE_WAIT)
#undef PX__PHASE_WAIT
  }
  (void)cfg;
  return 0;
}

/* The one place a session changes phase: logged, and the session's timer
 * set to the new phase's limit (each phase replaces the last one's). */
void px_life_phase(px_session *s, px_close_phase to) {
  if (s->phase == PX_PHASE_CLOSED)
    return; /* closed is final */
  px_debug("session_close_phase", PX_U("id", s->id), PX_S("peer", s->peer),
           PX_S("from", px_close_phase_name(s->phase)),
           PX_S("to", px_close_phase_name(to)),
           PX_S("by", px_close_by_name(s->closer)));
  s->phase = (uint8_t)to;
  uint64_t ms = phase_wait_ms(s, to);
  if (ms == PX_PHASE_RUNS_ON)
    return;
  px_timer_stop(&s->srv->clock, &s->timer);
  if (ms && to != PX_PHASE_CLOSED)
    px_timer_start(&s->srv->clock, &s->timer, ms);
}

void px_life_closing(px_session *s, px_close_by by) {
  if (s->closer == PX_BY_NONE)
    s->closer = (uint8_t)by;
  if (s->phase == PX_PHASE_HANDSHAKE || s->phase == PX_PHASE_OPEN)
    px_life_phase(s, PX_PHASE_CLOSING);
}

/* The first reason that applies is the one logged and counted. */
void px_life_note(px_session *s, px_close_reason reason) {
  if (!s->close_reason)
    s->close_reason = reason;
}

void px_life_release_held(px_session *s, px_chan *c) {
  if (c->release_queued)
    return;
  if (px_ring_reserve(&s->relq, sizeof(px_release), UINT16_MAX + 1u) != 0) {
    px_life_close(s, PX_CR_OUT_OF_MEMORY);
    return;
  }
  *(px_release *)px_ring_push(&s->relq, sizeof(px_release)) =
      (px_release){c->client_ch, c->gen};
  c->release_queued = true;
}

void px_life_drop_held(px_session *s, px_chan *c) {
  s->held_bytes -= c->held_bytes;
  px_chan_drop_held(c); /* reading resumes by the session's pressure check */
}

void px_life_finishing(px_session *s, px_close_reason reason) {
  px_life_note(s, reason);
  px_life_phase(s, PX_PHASE_FINISHING);
}

/* End the session through `side`: stop reading the other side, flush
 * what `side` is owed, shut down its write side, then drop its input until
 * it hangs up (or PX_CLOSE_WAIT_MS). Closing a socket whose peer's data
 * sits unread makes the kernel reset it and drop what was just written (a
 * client's close-ok, the ack of an original whose copy is confirmed):
 * draining first lets the peer read everything. */
static void linger(px_session *s, px_conn *side) {
  px_conn_stop_reading(side == &s->client ? &s->upstream : &s->client);
  px_life_phase(s, PX_PHASE_LINGER);
  int rc = px_conn_linger(side);
  if (rc < 0) /* the session handles it as the transport's write error */
    px_out_transport_error(&s->out, side, rc);
}

void px_life_hold_conn_close(px_session *s, px_chunk *c, uint8_t *raw,
                             uint32_t len) {
  px_chunk_ref(c);
  s->conn_hold = (px_slice){c, raw, len};
}

void px_life_release_conn_hold(px_session *s) {
  px_slice h = s->conn_hold;
  if (!h.chunk)
    return;
  s->conn_hold = (px_slice){0};
  px_life_closing(s, PX_BY_CLIENT);
  px_life_upstream_close_sent(s);
  px_out_status st = px_out_slice(&s->out, &s->upstream, h.chunk, h.ptr, h.len);
  px_chunk_unref(h.chunk);
  (void)st; /* a failure is kept: the session closes over it */
}

void px_life_close_after_flush(px_session *s, px_conn *side,
                               px_close_reason reason) {
  px_life_note(s, reason);
  if (side->connected)
    linger(s, side);
  else
    px_life_close(s, reason);
}

void px_life_upstream_close_sent(px_session *s) {
  if (s->up_end >= PX_UP_CLOSE_SENT)
    return;
  s->up_end = PX_UP_CLOSE_SENT;
  px_conn_hold_shutdown(&s->upstream);
}

void px_life_upstream_answered(px_session *s) {
  if (s->up_end == PX_UP_CLOSE_ANSWERED)
    return;
  s->up_end = PX_UP_CLOSE_ANSWERED;
  int rc = px_conn_release_shutdown(&s->upstream);
  if (rc < 0) /* the session handles it as the transport's write error */
    px_out_transport_error(&s->out, &s->upstream, rc);
}

void px_life_close_upstream(px_session *s, px_close_reason reason) {
  if (s->up_end == PX_UP_OPEN && s->upstream.connected)
    px_life_send_close(s, &s->upstream, AMQP_REPLY_SUCCESS,
                       px_close_text(reason), 0, 0);
}

void px_life_end_upstream(px_session *s, px_close_reason reason) {
  px_life_close_upstream(s, reason);
  px_life_close_after_flush(s, &s->upstream, reason);
}

void px_life_send_close(px_session *s, px_conn *side, uint16_t code,
                        const char *text, uint16_t class_id,
                        uint16_t method_id) {
  if (side == &s->upstream)
    px_life_upstream_close_sent(s);
  px_out_status st =
      px_out_connection_close(&s->out, side, code, text, class_id, method_id);
  (void)st; /* a failure is kept: the session closes over it */
}

/* rebound tells the client: once, and from then on only its close-ok
 * matters. */
static void close_client_by(px_session *s, px_close_by by, uint16_t code,
                            const char *text, uint16_t class_id,
                            uint16_t method_id) {
  if (px_life_telling_client(s) || s->phase == PX_PHASE_CLOSED)
    return;
  s->closer = (uint8_t)by;
  px_life_send_close(s, &s->client, code, text, class_id, method_id);
  px_life_phase(s, PX_PHASE_TELLING_CLIENT);
}

void px_life_tell_client(px_session *s, px_close_reason reason) {
  char text[128];
  int code = px_close_reply(reason);
  snprintf(text, sizeof text, "%s - %s", amqp_reply_name(code),
           px_close_text(reason));
  close_client_by(
      s, reason == PX_CR_SHUTTING_DOWN ? PX_BY_SHUTDOWN : PX_BY_REBOUND,
      (uint16_t)code, text, 0, 0);
}

void px_life_close_client(px_session *s, uint16_t code, const char *text,
                          uint16_t class_id, uint16_t method_id) {
  close_client_by(s, PX_BY_REBOUND, code, text, class_id, method_id);
}

void px_life_handshake_done(px_session *s) {
  s->up_end = PX_UP_OPEN;
  px_life_phase(s, PX_PHASE_OPEN);
}

void px_life_close(px_session *s, px_close_reason reason) {
  px_life_note(s, reason);
  if (!s->close_req)
    s->close_req = (uint8_t)reason;
}
