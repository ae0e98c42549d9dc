/* px_session.c - a session's sockets, buffers and lifecycle.
 *
 * Reading: a side reads into its chunk (px_buf.h); process_input() parses
 * whole frames and asks px_frames.c what each one means. Consecutive frames
 * to forward form a "run" that is queued as one slice of the chunk, so a
 * read of many small frames becomes one iovec entry and no copy. A partial
 * frame stays in the chunk (or moves to a larger one) until the rest comes.
 *
 * Writing: queued slices go out in one uv_write per flush; the chunk
 * references they hold are dropped when the write completes.
 *
 * Backpressure: when a side has more than PX_HIGH_WATER bytes pending (in
 * flight, plus for the upstream side the client frames held on channels
 * behind a retry), the other side stops reading until it drops below
 * PX_LOW_WATER. Memory per connection is therefore bounded by about two
 * high-water marks plus one read chunk per direction.
 *
 * Ending: after a close-ok has passed (either way) the session is
 * "finishing": like the broker, rebound keeps the client's socket open,
 * drops what the client still sends and passes what the broker sends,
 * until the client hangs up, the broker does (then the client's side is
 * flushed, shut down and drained), or PX_FINISH_WAIT_MS passes. A side
 * that rebound ends itself after writing to it lingers: write side shut
 * down after the flush, input dropped until EOF or PX_CLOSE_WAIT_MS, so the
 * peer reads everything instead of a reset.
 */
#define _DEFAULT_SOURCE /* explicit_bzero */
#include <stdlib.h>
#include <string.h>

#include "px_conn.h"
#include "px_counters.h"
#include "px_frames.h"
#include "px_life.h"
#include "px_log.h"
#include "px_own.h"
#include "px_retry.h"
#include "px_server.h"
#include "px_tls.h"

#define PX_HIGH_WATER (512 * 1024)
#define PX_LOW_WATER (128 * 1024)
/* Frame size accepted before connection.tune-ok fixes frame-max. */
#define PX_PRETUNE_FRAME_MAX 131072
/* Frames from the broker are accepted up to this (see frame_limit()). */
#define PX_UPSTREAM_FRAME_MAX (4u * 1024 * 1024)

static px_conn *other_side(px_session *s, px_conn *side) {
  return side == &s->client ? &s->upstream : &s->client;
}

/* ---- lifecycle ---------------------------------------------------------- */

/* Free a copy of credentials, wiped first. */
static void free_secret(uint8_t *p, size_t len) {
  if (p)
    explicit_bzero(p, len);
  free(p);
}

/* A session whose client connection never opened. */
static void session_discard(px_session *s) {
  free(s->dial);
  free(s);
}

static void session_free(px_session *s) {
  free_secret(s->login_auth, s->login.mechanism.len + s->login.response.len +
                                 s->login.locale.len);
  free(s->login_vhost);
  free(s->dial); /* never started: the session did not open */
  free(s->up.addr);
  free(s->up.host);
  px_frames_chans_free(s);
  px_retry_free(s);
  px_ring_free(&s->relq);
  if (px_life_conn_held(s))
    px_chunk_unref(s->conn_hold.chunk);
  px_conn_free(&s->client);
  px_conn_free(&s->upstream);
  if (s->srv->session_gone)
    s->srv->session_gone(s->srv);
  free(s);
}

/* The session's timers are closed a step after the session, as its
 * connections are, so that it is never freed inside px_session_close()
 * (its callers go on using it). */
static void on_timers_closed(px_timer *t) {
  px_session *s = t->data;
  px_timer_close(&s->srv->clock, &s->timer);
  if (--s->open_handles == 0)
    session_free(s);
}

static void on_conn_closed(void *ctx, px_conn *c) {
  px_session *s = ctx;
  if (c == &s->upstream && !px_life_closed(s)) {
    /* a failed connect attempt: the dialer tries the next */
    s->open_handles--;
    if (s->dial)
      px_dial_closed(s->dial);
    return;
  }
  if (--s->open_handles == 0)
    session_free(s);
}

void px_session_close(px_session *s, px_close_reason reason) {
  if (px_life_closed(s))
    return;
  px_life_note(s, reason ? reason : PX_CR_CLOSE_TIMEOUT);
  px_clock *clock = &s->srv->clock;
  uint64_t ms = px_clock_ms(clock) - s->started_ms;
  px_info("session_close", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("user", s->user), PX_S("vhost", s->vhost),
          PX_S("state", px_close_phase_name(s->phase)), PX_U("duration_ms", ms),
          PX_U("bytes_from_client", s->client.bytes_in),
          PX_U("bytes_to_client", s->client.bytes_out),
          PX_S("reason", px_close_text(s->close_reason)));
  px_metrics_inc(s->srv, PX_M_CLOSES, px_close_text(s->close_reason), NULL);
  px_life_phase(s, PX_PHASE_CLOSED);
  px_retry_session_closed(s);
  px_timer_finally(clock, &s->timer, on_timers_closed);
  px_conn_close(&s->client);
  px_conn_close(&s->upstream);
  px_pub_close(s->out.pub);
  s->out.pub = NULL;
  px_own_session_closed(s);
  if (s->dial)
    px_dial_close(s->dial);
  /* unlink now: a closing session no longer counts or drains */
  s->srv->stats.sessions_current--;
  if (s->prev)
    s->prev->next = s->next;
  else
    s->srv->sessions = s->next;
  if (s->next)
    s->next->prev = s->prev;
  s->prev = s->next = NULL;
}

static void on_retries_timeout(px_session *s) {
  /* replaces the reason client_gone_finish() gave: this one says more */
  s->close_reason = s->close_reason == PX_CR_CLIENT_WRITE_FAILED
                        ? PX_CR_CLIENT_WRITE_FAILED_RETRIES_TIMEOUT
                        : PX_CR_CLIENT_DISCONNECTED_RETRIES_TIMEOUT;
  px_session_close(s, s->close_reason);
}

static void side_pressure(px_conn *side);
static void check_out(px_session *s);
static void side_flush(px_conn *side);

/* Nothing more is written to the client (it is gone). Reading the broker
 * resumes if the client's backlog had paused it: the confirms of copies
 * in flight must get through. */
static void client_stop_writing(px_session *s) {
  px_conn_stop_writing(&s->client);
  side_pressure(&s->client);
}

/* The client is gone (EOF, a reset, a failed write) while copies are in
 * flight: finish them (publish, confirm, ack) before the upstream closes,
 * for at most retry_finish_timeout. false when there is nothing to finish
 * (or no broker to finish it with). */
static bool client_gone_finish(px_session *s, bool write_failed) {
  bool gone = s->phase == PX_PHASE_CLIENT_GONE;
  /* a client whose connection.close is held (copies in flight) closed:
   * a restart, never a lost consumer */
  if (!gone && s->upstream.connected && px_life_is_open(s) &&
      !px_life_conn_held(s))
    px_retry_consumer_lost(s);
  if (!px_retry_pending(s) || !s->upstream.connected || gone)
    return gone;
  px_conn_stop_reading(&s->client);
  client_stop_writing(s);
  px_info("client_gone_retries_pending", PX_U("id", s->id),
          PX_S("peer", s->peer), PX_U("pending", px_retry_pending(s)),
          PX_S("how", write_failed ? "write failed" : "disconnected"),
          PX_U("timeout_ms", s->srv->cfg->retry_finish_timeout_ms));
  s->close_reason =
      write_failed ? PX_CR_CLIENT_WRITE_FAILED : PX_CR_CLIENT_DISCONNECTED;
  px_life_phase(s, PX_PHASE_CLIENT_GONE);
  px_frames_cancel_consumers(s);
  check_out(s);
  if (!px_life_closed(s))
    side_flush(&s->upstream);
  return true;
}

/* ---- writing ------------------------------------------------------------ */

static void side_resume(px_session *s, px_conn *side);

/* Before the client's reset or EOF shows on the read side, a write to it
 * failed. What it sent before it went is still readable (a nack whose copy
 * must be made): stop writing, keep reading until the read reports the end
 * (side_eof then finishes the copies in flight), for at most
 * PX_CLOSE_WAIT_MS. */
static void on_client_dead_timeout(px_session *s) {
  if (!client_gone_finish(s, true))
    px_life_end_upstream(s, PX_CR_CLIENT_WRITE_FAILED);
}

static void client_write_failed(px_session *s, int err) {
  client_stop_writing(s);
  px_info("client_write_failed", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("error", uv_strerror(err)),
          PX_U("pending", px_retry_in_flight(s)));
  px_life_note(s, PX_CR_CLIENT_WRITE_FAILED);
  px_life_phase(s, PX_PHASE_CLIENT_DEAD);
  px_conn_resume(&s->client);
}

/* A write to `side` failed (at once or later): log and close. A client
 * that hangs up once its close handshake is done ends normally. */
static void side_write_failed(px_session *s, px_conn *side, int err) {
  if (err == UV_ENOMEM) { /* no memory for the write request */
    px_session_close(s, PX_CR_OUT_OF_MEMORY);
    return;
  }
  if (side == &s->client &&
      (s->phase == PX_PHASE_FINISHING || side->lingering)) {
    px_session_close(s, PX_CR_CLIENT_CLOSED);
    return;
  }
  if (side == &s->client) { /* once: later failures of writes in flight
                               say nothing new */
    if (!s->client.discard)
      client_write_failed(s, err);
    return;
  }
  px_warn("write_failed", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("side", side->name), PX_S("error", uv_strerror(err)));
  px_session_close(s, PX_CR_UPSTREAM_WRITE_FAILED);
}

/* Bytes waiting to reach `side`: in flight, and for the upstream side the
 * client frames held on channels (they are sent once released). */
static size_t side_pending(const px_session *s, const px_conn *side) {
  if (side == &s->client && s->client.discard)
    return 0; /* nothing more reaches it: the broker is read again */
  return px_conn_pending(side) + (side == &s->upstream ? s->held_bytes : 0);
}

/* Stop reading the other side while `side` has too much pending; read it
 * again once that drained. */
static void side_pressure(px_conn *side) {
  px_session *s = side->ctx;
  px_conn *other = other_side(s, side);
  size_t pending = side_pending(s, side);
  if (pending > PX_HIGH_WATER && other->reading)
    px_conn_pause(other);
  else if (other->paused && pending < PX_LOW_WATER)
    side_resume(s, other);
}

static void on_conn_written(void *ctx, px_conn *side) {
  px_session *s = ctx;
  if (px_life_closed(s) || (side->lingering && px_conn_drained(side)))
    return;
  side_pressure(side);
}

static void on_conn_write_failed(void *ctx, px_conn *side, int err) {
  px_session *s = ctx;
  if (!px_life_closed(s))
    side_write_failed(s, side, err);
}

static void side_flush(px_conn *side) {
  px_session *s = side->ctx;
  bool had = side->nout > 0 && side->connected;
  int rc = px_conn_flush(side);
  if (rc < 0)
    side_write_failed(s, side, rc);
  else if (had && side->inflight)
    side_pressure(side);
}

/* Queue bytes of `c` for `side`, taking a reference; contiguous bytes of the
 * same chunk extend the last slice. */
/* The session's reason for an output failure (px_out.h). */
static px_close_reason out_reason(px_out_status st) {
  switch (st) {
  case PX_OUT_ENCODE:
    return PX_CR_ENCODE_FAILED;
  case PX_OUT_FULL:
    return PX_CR_OUTPUT_FULL;
  case PX_OUT_RETRY:
    return PX_CR_RETRY_CONNECTION_WRITE_FAILED;
  default:
    return PX_CR_OUT_OF_MEMORY;
  }
}

/* The one place output failures end up: a write error a queue call met
 * goes where the transport's would, any other failure closes. */
static void check_out(px_session *s) {
  px_out *o = &s->out;
  if (s->close_req && !px_life_closed(s))
    px_session_close(s, s->close_req);
  if (o->write_error && !px_life_closed(s)) {
    int err = o->write_error;
    o->write_error = 0;
    side_write_failed(s, o->write_failed_on, err);
  }
  if (o->failed && !px_life_closed(s))
    px_session_close(s, out_reason(o->failed));
}

/* Queue bytes of `c` for `side`, by reference (held frames). */
static void side_queue(px_conn *side, px_chunk *c, uint8_t *p, uint32_t len) {
  px_session *s = side->ctx;
  if (px_out_slice(&s->out, side, c, p, len) != PX_OUT_OK)
    check_out(s);
}

static void after_event(px_session *s);
static void upstream_started(px_session *s);

static void session_flush(px_session *s) {
  check_out(s);
  after_event(s);
  if (!px_life_closed(s))
    side_flush(&s->upstream);
  if (!px_life_closed(s))
    side_flush(&s->client);
  if (!px_life_closed(s))
    side_pressure(&s->upstream);
}

/* Channels whose held frames are due go in the release queue; the session
 * drains it after the event that released them (after each frame parsed,
 * each timer, each event of the retry connection), so a release never
 * runs inside another channel's frame handler. */

/* One held frame, released: what the frame handler makes of it. A held
 * channel.open (rebound yielded its number) just gets its number. */
static int release_frame(px_session *s, px_chan *c, px_slice *h) {
  amqp_frame f;
  px_chan *again = NULL;
  if (amqp_frame_parse(h->ptr, h->len, 0, &f) != (long)h->len)
    return PX_DROP; /* cannot be: it parsed when it came in */
  if (c->open_held) {
    c->open_held = false;
    px_chan_renumber(h->ptr, c->up_ch);
    return PX_FORWARD;
  }
  return px_frames_client(s, &f, h->ptr, &again);
}

/* Let a channel's held client frames go, in order, until one is held
 * again (it started a retry, which holds the rest) or the channel is
 * gone (a released frame ended it: what it still held was dropped). */
static void release_one(px_session *s, px_chan *c) {
  uint16_t ch = c->client_ch;
  uint32_t gen = c->gen;
  c->held = false;
  while (c && !c->held && px_chan_nheld(c) && !px_life_closed(s) &&
         !px_out_failed(&s->out)) {
    px_slice h = px_chan_pop_held(c);
    s->held_bytes -= h.len;
    int act = release_frame(s, c, &h);
    if (act == PX_HOLD) { /* first in the list again */
      px_chan_unpop_held(c);
      s->held_bytes += h.len;
      break;
    }
    if (act == PX_FORWARD)
      side_queue(&s->upstream, h.chunk, h.ptr, h.len);
    px_chunk_unref(h.chunk);
    c = px_tab_get(&s->by_client, ch);
    if (c && c->gen != gen)
      c = NULL;
  }
}

/* Drain the release queue (releases may queue more). */
static void release_pending(px_session *s) {
  bool any = false;
  while (s->relq.n && !px_life_closed(s) && !px_out_failed(&s->out)) {
    px_release r = *(px_release *)px_ring_at(&s->relq, sizeof r, 0);
    px_ring_drop(&s->relq, 1);
    px_chan *c = px_tab_get(&s->by_client, r.ch);
    if (!c || c->gen != r.gen)
      continue; /* closed meanwhile: its held frames went with it */
    c->release_queued = false;
    release_one(s, c);
    any = true;
  }
  if (any && !px_life_closed(s)) {
    side_flush(&s->upstream);
    if (!px_life_closed(s))
      side_pressure(&s->upstream);
  }
}

/* After every event: held frames released; once no copy is in flight,
 * parked copies go; once nothing is pending any more, what waited for
 * that (px_frames_retry_idle()). */
static void after_event(px_session *s) {
  while (!px_life_closed(s) && !px_out_failed(&s->out)) {
    release_pending(s);
    if (px_life_closed(s) || !px_retry_unpark(s) || !s->relq.n)
      break;
  }
  if (s->idle_due && !px_frames_awaits_idle(s))
    s->idle_due = false; /* nothing waits for the retries */
  if (!px_life_closed(s) && s->idle_due && !px_retry_pending(s)) {
    s->idle_due = false;
    px_frames_retry_idle(s);
  }
  check_out(s);
}

/* No upstream answered and the client's protocol header is in: it gets
 * rebound's own connection.start, and its start-ok the reason. */
static void refuse(px_session *s) {
  px_life_phase(s, PX_PHASE_REFUSING);
  if (px_out_connection_start(&s->out, &s->client) != PX_OUT_OK)
    check_out(s);
  if (px_life_closed(s))
    return;
  px_conn_read(&s->client);
  side_flush(&s->client);
}

/* The refused client's frames: its start-ok gets connection.tune, its
 * connection.open open-ok and at once connection.close 320 "no upstream
 * reachable", as a broker going down closes its clients (a client closed
 * before it is open takes it for refused credentials or vhost); from then
 * on it is a client being told to close. Other frames are dropped. */
static void refusing_input(px_session *s, px_chunk *c) {
  while (c->off < c->len) {
    amqp_frame f;
    long n = amqp_frame_parse(c->data + c->off, c->len - c->off,
                              PX_PRETUNE_FRAME_MAX, &f);
    if (n == AMQP_PARTIAL)
      break;
    if (n < 0) {
      c->off = c->len;
      break;
    }
    c->off += (uint32_t)n;
    uint32_t id = f.type == AMQP_FRAME_METHOD && f.channel == 0
                      ? amqp_method_peek_id(f.payload)
                      : 0;
    if (id == AMQP_CONNECTION_START_OK) { /* tuned, as the broker would */
      amqp_method m;
      amqp_method_init(&m, AMQP_CONNECTION_TUNE);
      m.args[AMQP_F_CONNECTION_TUNE_FRAME_MAX].u = PX_PRETUNE_FRAME_MAX;
      if (px_out_method(&s->out, &s->client, 0, &m) != PX_OUT_OK)
        break;
    } else if (id == AMQP_CONNECTION_OPEN) {
      amqp_method m;
      amqp_method_init(&m, AMQP_CONNECTION_OPEN_OK);
      if (px_out_method(&s->out, &s->client, 0, &m) == PX_OUT_OK)
        px_life_tell_client(s, PX_CR_NO_UPSTREAM);
      break;
    }
  }
  check_out(s);
  if (!px_life_closed(s))
    side_flush(&s->client);
}

/* A TLS handshake record (a ClientHello): type 22, version 3.x. */
static bool speaks_tls(const uint8_t *p, size_t n) {
  return n >= 3 && p[0] == 0x16 && p[1] == 0x03 && p[2] <= 0x04;
}

/* Answer a bad protocol header as the spec says: with ours, then close
 * (a client speaking TLS is told so in the log line). */
static int check_client_header(px_session *s, px_chunk *c) {
  long rc = amqp_protocol_header_parse(c->data + c->off, c->len - c->off);
  if (rc == AMQP_PARTIAL)
    return 0;
  if (rc < 0) {
    char what[64];
    bool tls = speaks_tls(c->data + c->off, c->len - c->off);
    amqp_protocol_header_describe(c->data + c->off, c->len - c->off, what,
                                  sizeof what);
    px_warn("bad_protocol_header", PX_U("id", s->id), PX_S("peer", s->peer),
            PX_S("sent", what),
            PX_S("error", tls ? "client speaks TLS on the plain listener"
                              : "not AMQP 0-9-1"));
    s->srv->stats.protocol_errors++;
    c->off = c->len; /* answered once; nothing more is read from it */
    s->closer = PX_BY_REBOUND;
    if (px_out_bytes(&s->out, &s->client, amqp_protocol_header,
                     AMQP_PROTOCOL_HEADER_SIZE) != PX_OUT_OK) {
      check_out(s);
      return -1;
    }
    px_life_close_after_flush(s, &s->client, PX_CR_BAD_PROTOCOL_HEADER);
    return -1;
  }
  if (s->dial_failed) { /* no broker: the client is told, in AMQP */
    c->off += AMQP_PROTOCOL_HEADER_SIZE;
    refuse(s);
    return -1;
  }
  if (!s->upstream.connected) { /* forwarded once the upstream is up */
    px_conn_stop_reading(&s->client);
    return 0;
  }
  side_queue(&s->upstream, c, c->data + c->off, AMQP_PROTOCOL_HEADER_SIZE);
  c->off += AMQP_PROTOCOL_HEADER_SIZE;
  px_life_phase(s, PX_PHASE_HANDSHAKE);
  return 1;
}

/* The largest frame read from `side`. A client is held to the frame-max it
 * negotiated. The broker is not: RabbitMQ itself sends content headers over
 * frame-max once dead-lettering has added x-death, and clients accept them,
 * so rebound passes them too, up to the 4 MiB it ever accepts. */
static uint32_t frame_limit(const px_session *s, const px_conn *side) {
  if (!s->frame_max)
    return PX_PRETUNE_FRAME_MAX;
  return side == &s->upstream && s->frame_max < PX_UPSTREAM_FRAME_MAX
             ? PX_UPSTREAM_FRAME_MAX
             : s->frame_max;
}

/* A frame that does not parse: the stream is out of step. */
static void input_error(px_session *s, px_conn *from, long status) {
  const char *text = amqp_status_str((int)status);
  if (from == &s->upstream) {
    px_frames_upstream_error(s, text);
    return;
  }
  int code = amqp_status_reply_code((int)status);
  px_frames_client_error(s, (uint16_t)(code ? code : AMQP_REPLY_FRAME_ERROR),
                         text, 0);
}

/* Parse and dispatch every whole frame in `from`'s chunk. */
/* A lingering upstream that was sent connection.close: look for its
 * answer; once it came, the write side may be shut down. */
static void await_close_ok(px_session *s, px_chunk *c) {
  while (s->up_end == PX_UP_CLOSE_SENT) {
    amqp_frame f;
    long n = amqp_frame_parse(c->data + c->off, c->len - c->off,
                              frame_limit(s, &s->upstream), &f);
    if (n <= 0) {
      if (n != AMQP_PARTIAL)
        c->off = c->len;
      return;
    }
    c->off += (uint32_t)n;
    uint32_t id =
        f.type == AMQP_FRAME_METHOD ? amqp_method_peek_id(f.payload) : 0;
    if (f.channel == 0 &&
        (id == AMQP_CONNECTION_CLOSE_OK || id == AMQP_CONNECTION_CLOSE)) {
      px_life_upstream_answered(s);
      check_out(s); /* a failed shutdown */
    }
  }
}

/* A frame the handler holds: the client's connection.close until the
 * copies in flight are done, or a frame of a held channel. 0, or -1 when
 * out of memory (the session closes). */
static int keep_frame(px_session *s, int act, px_chunk *c, uint8_t *raw,
                      uint32_t n, px_chan *hold) {
  if (act == PX_HOLD_CONN) {
    px_life_hold_conn_close(s, c, raw, n);
  } else if (act == PX_HOLD) {
    px_chunk_ref(c);
    if (px_chan_hold(hold, (px_slice){c, raw, n}) != 0) {
      px_session_close(s, PX_CR_OUT_OF_MEMORY);
      return -1;
    }
    s->held_bytes += n;
  }
  return 0;
}

/* Is everything `from` sends dropped unread? */
static bool discarding(const px_session *s, const px_conn *from) {
  return from->lingering ||
         (from == &s->client && s->phase == PX_PHASE_FINISHING);
}

/* Is what `from` sent to be parsed? Not while ending: a lingering upstream
 * is only looked at for the close-ok of rebound's connection.close, and
 * what comes after a close-ok is dropped, as the broker does. The client's
 * protocol header comes first. */
static bool input_wanted(px_session *s, px_conn *from, px_chunk *c) {
  if (from == &s->client && s->phase == PX_PHASE_REFUSING) {
    refusing_input(s, c);
    return false;
  }
  if (from == &s->upstream && from->lingering &&
      s->up_end == PX_UP_CLOSE_SENT) {
    await_close_ok(s, c); /* a partial frame stays for the next read */
    if (s->up_end == PX_UP_CLOSE_SENT || px_life_closed(s))
      return false;
  }
  if (discarding(s, from)) {
    c->off = c->len;
    return false;
  }
  return from != &s->client || s->phase != PX_PHASE_CONNECTING ||
         check_client_header(s, c) > 0;
}

/* What a frame means (a px_action): content frames that only pass take
 * the short path (px_frames.h). */
/* `*plain`: px_frames_upstream_plain(s), kept up to date here and by the
 * read loop (only a frame handled off the short path, or what its release
 * queue then runs, can change it). */
static inline int dispatch(px_session *s, px_conn *from, const amqp_frame *f,
                           uint8_t *raw, px_chan **hold, bool *plain) {
  if (from == &s->upstream) {
    if (*plain && px_frames_upstream_short(s, f))
      return PX_FORWARD;
    int act = px_frames_upstream(s, f, raw);
    *plain = px_frames_upstream_plain(s);
    if (s->dial && f->channel == 0 && f->type == AMQP_FRAME_METHOD &&
        amqp_method_peek_id(f->payload) == AMQP_CONNECTION_START)
      upstream_started(s); /* the broker answered: the dialer goes */
    return act;
  }
  if (px_frames_client_content(s, f))
    return PX_FORWARD;
  if (px_life_conn_held(s))
    return PX_DROP; /* after its connection.close */
  return px_frames_client(s, f, raw, hold);
}

/* The bytes of the input chunk that end the frame begun in the head. */
static uint32_t split_rest(px_conn *from) {
  px_chunk *h = px_conn_head(from);
  uint32_t first = h->len - h->off;
  return (uint32_t)amqp_frame_size_at(h->data + h->off, first) - first;
}

/* A frame read in two pieces: -1 while its rest is still to come, else
 * its bytes in the input chunk (0: none, or dropped unread). */
static long split_ready(px_session *s, px_conn *from) {
  if (!px_conn_head(from))
    return 0;
  px_chunk *c = from->in;
  uint32_t rest = split_rest(from);
  if (rest > c->len - c->off)
    return -1;
  if (!discarding(s, from))
    return rest;
  c->off += rest;
  px_conn_head_done(from);
  return 0;
}

/* Hold a frame read in two pieces: joined in a chunk of its own. */
static int hold_split(px_session *s, px_chan *hold, const uint8_t *raw,
                      uint32_t first, const uint8_t *tail, uint32_t rest) {
  px_chunk *k = px_chunk_new((size_t)first + rest);
  if (!k) {
    px_session_close(s, PX_CR_OUT_OF_MEMORY);
    return -1;
  }
  memcpy(k->data, raw, first);
  memcpy(k->data + first, tail, rest);
  k->len = first + rest;
  int rc = keep_frame(s, PX_HOLD, k, k->data, k->len, hold);
  px_chunk_unref(k); /* the held slice has its own reference */
  return rc;
}

/* A body frame read in two pieces (px_conn_keep_split()): its header and
 * first bytes in the head chunk, its last `rest` bytes (frame-end
 * included) at the start of the input chunk. Dispatched with its payload
 * in s->split[]; forwarded as two slices, the second starting the run of
 * the frames after it; held as a copy joined in a chunk of its own. 0, or
 * -1 when parsing stops. */
static int split_frame(px_session *s, px_conn *from, px_conn *to,
                       uint32_t rest) {
  px_chunk *h = px_conn_head(from), *c = from->in;
  uint8_t *raw = h->data + h->off;
  uint32_t first = h->len - h->off;
  c->off = rest;
  if (c->data[rest - 1] != AMQP_FRAME_END) {
    px_conn_head_done(from);
    c->off = c->len; /* out of step, as in out_of_step() */
    if (!px_life_telling_client(s))
      input_error(s, from, AMQP_BAD_FRAME_END);
    return -1;
  }
  amqp_frame f = {AMQP_FRAME_BODY,
                  (uint16_t)(raw[1] << 8 | raw[2]),
                  {NULL, first + rest - AMQP_FRAME_OVERHEAD}};
  s->split[0] = (amqp_bytes){raw + AMQP_FRAME_HEADER_SIZE,
                             first - AMQP_FRAME_HEADER_SIZE};
  s->split[1] = (amqp_bytes){c->data, rest - 1};
  px_chan *hold = NULL;
  bool plain = px_frames_upstream_plain(s);
  int act = dispatch(s, from, &f, raw, &hold, &plain);
  memset(s->split, 0, sizeof s->split);
  px_out_run_begin(&s->out, to, h, h->off);
  if (act == PX_FORWARD)
    px_out_run_extend(&s->out, h->len);
  px_out_status st = px_out_run_end(&s->out);
  px_out_run_begin(&s->out, to, c, act == PX_FORWARD ? 0 : rest);
  px_out_run_extend(&s->out, rest);
  int rc = st == PX_OUT_OK ? 0 : -1;
  if (rc == 0 && act == PX_HOLD)
    rc = hold_split(s, hold, raw, first, c->data, rest);
  px_conn_head_done(from);
  if (rc != 0 || act == PX_STOP)
    return -1;
  if (act != PX_FORWARD && (s->relq.n || s->idle_due))
    after_event(s);
  return px_out_failed(&s->out) ? -1 : 0;
}

/* A frame that does not parse: the stream is out of step, and what is
 * buffered is dropped. A peer told to close answers in a later read,
 * parsed afresh; while closing, further garbage is dropped without
 * another log line. */
static void out_of_step(px_session *s, px_conn *from, long status) {
  px_chunk *c = from->in;
  bool flushed = px_out_run_flush(&s->out, c->len) == PX_OUT_OK;
  c->off = c->len;
  if (flushed && !px_life_telling_client(s))
    input_error(s, from, status);
}

/* Start the run of forwarded frames, with the frame read in two pieces
 * when `rest` says there is one. false: parsing stops. */
static bool begin_run(px_session *s, px_conn *from, px_conn *to,
                      uint32_t rest) {
  if (rest)
    return split_frame(s, from, to, rest) == 0;
  px_out_run_begin(&s->out, to, from->in, from->in->off);
  return true;
}

/* From the broker, while the session is not ending: `f` (parsed, `n`
 * bytes) and the frames after it, as long as the short path takes them,
 * forwarded with nothing else to do per frame (the short path changes
 * neither the frame limit nor the session's phase). Returns the parse
 * result of the first frame it does not take, in `f`, with c->off at it. */
static inline long upstream_run(px_session *s, px_chunk *c, long n,
                                amqp_frame *f, uint32_t limit,
                                uint64_t *frames) {
  uint32_t off = c->off;
  while (n > 0 && px_frames_upstream_short(s, f)) {
    off += (uint32_t)n;
    (*frames)++;
    n = amqp_frame_parse(c->data + off, c->len - off, limit, f);
  }
  if (off != c->off) {
    c->off = off;
    px_out_run_extend(&s->out, off);
  }
  return n;
}

static void process_input(px_session *s, px_conn *from) {
  px_chunk *c = from->in;
  px_conn *to = other_side(s, from);
  long rest = split_ready(s, from);
  if (rest < 0)
    return; /* the rest of a frame read in two pieces is still to come */
  if (!input_wanted(s, from, c))
    return;
  uint64_t frames = rest ? 1 : 0;
  uint32_t tuned = s->frame_max, limit = frame_limit(s, from);
  bool go = begin_run(s, from, to, (uint32_t)rest);
  bool plain = px_frames_upstream_plain(s);
  while (go && !px_life_closed(s)) {
    amqp_frame f;
    if (s->frame_max != tuned) { /* a tune-ok passed: the limit changes */
      tuned = s->frame_max;
      limit = frame_limit(s, from);
    }
    long n = amqp_frame_parse(c->data + c->off, c->len - c->off, limit, &f);
    if (plain && n > 0 && from == &s->upstream)
      n = upstream_run(s, c, n, &f, limit, &frames);
    if (n == AMQP_PARTIAL)
      break;
    if (n < 0) {
      out_of_step(s, from, n);
      break;
    }
    uint8_t *raw = c->data + c->off;
    px_chan *hold = NULL;
    frames++;
    int act = dispatch(s, from, &f, raw, &hold, &plain);
    c->off += (uint32_t)n;
    if (act == PX_FORWARD) { /* the common case: the run grows */
      px_out_run_extend(&s->out, c->off);
      continue;
    }
    if (px_out_run_flush(&s->out, c->off) != PX_OUT_OK ||
        keep_frame(s, act, c, raw, (uint32_t)n, hold) != 0 || act == PX_STOP)
      break;
    if (s->relq.n || s->idle_due) { /* what this frame released goes now */
      after_event(s);
      plain = px_frames_upstream_plain(s); /* a released frame may close */
    }
    if (px_out_failed(&s->out))
      break;
  }
  if (px_out_run_end(&s->out) != PX_OUT_OK)
    check_out(s);
  *(from == &s->client ? &s->srv->stats.frames_c2u
                       : &s->srv->stats.frames_u2c) += frames;
  if (s->relq.n || s->idle_due) /* released by a forwarded frame */
    after_event(s);
  check_out(s);
  if (px_life_closed(s))
    return;
  side_flush(to);
  side_flush(from);
  if (!px_life_closed(s))
    side_pressure(&s->upstream);
}

/* After parsing: release a spent chunk, or make room for a big frame
 * (whose size the parser has already checked against frame-max). */
static void settle_chunk(px_session *s, px_conn *side) {
  px_chunk *c = px_conn_input(side);
  if (!c || s->phase == PX_PHASE_CONNECTING) /* protocol header pending */
    return;
  const uint8_t *p = c->data + c->off;
  size_t have = c->len - c->off;
  uint64_t need = amqp_frame_size_at(p, have);
  if (need > frame_limit(s, side))
    need = 0; /* cannot be: the parser refuses it (frame-max bounds it) */
  /* a partial body frame (its header judged) is taken in two pieces */
  bool split = need > have && p[0] == AMQP_FRAME_BODY && !px_conn_head(side);
  if ((split ? px_conn_keep_split(side, (size_t)need)
             : px_conn_keep(side, (size_t)need)) != 0)
    px_session_close(s, PX_CR_OUT_OF_MEMORY);
}

/* The client's TLS failed: say why, and name plain AMQP on the TLS
 * listener as such. */
static void client_tls_failed(px_session *s) {
  uint8_t first[8];
  char sent[64];
  size_t n = px_tls_first_bytes(&s->client, first, sizeof first);
  s->srv->stats.protocol_errors++;
  if (n >= 4 && memcmp(first, "AMQP", 4) == 0) {
    amqp_protocol_header_describe(first, n, sent, sizeof sent);
    px_warn("client_plain_on_tls_listener", PX_U("id", s->id),
            PX_S("peer", s->peer), PX_S("sent", sent),
            PX_S("hint", "connect with amqps://, or to the --listen port"));
    return;
  }
  px_warn("client_tls_failed", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("error", px_tls_error(&s->client)));
}

static void side_eof(px_session *s, px_conn *side, ssize_t err) {
  bool clean = err == UV_EOF;
  if (side->lingering ||
      (side == &s->client && s->phase == PX_PHASE_FINISHING)) {
    px_session_close(s, PX_CR_CLIENT_CLOSED);
    return;
  }
  if (side == &s->upstream && s->phase == PX_PHASE_FINISHING) {
    px_life_close_after_flush(s, &s->client, PX_CR_BROKER_CLOSED);
    return;
  }
  /* open, or closing (the client's close held, or rebound draining) */
  if (side == &s->client && client_gone_finish(s, s->client.discard))
    return;
  if (side == &s->client) {
    if (err == UV_EPROTO && px_tls_error(side)[0]) {
      client_tls_failed(s);
      px_life_note(s, PX_CR_CLIENT_TLS_FAILED);
    } else if (!clean)
      px_info("client_error", PX_U("id", s->id), PX_S("peer", s->peer),
              PX_S("error", uv_strerror((int)err)));
    px_life_end_upstream(s, s->closer != PX_BY_NONE
                                ? PX_CR_CLIENT_CLOSED
                                : PX_CR_CLIENT_DISCONNECTED);
    return;
  }
  if (s->closer != PX_BY_NONE || s->up_end == PX_UP_HANDSHAKE) {
    px_life_close_after_flush(s, &s->client,
                              s->closer != PX_BY_NONE
                                  ? PX_CR_BROKER_CLOSED
                                  : PX_CR_BROKER_DISCONNECTED);
    return;
  }
  px_warn("upstream_lost", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("error",
               clean ? "connection closed by broker" : uv_strerror((int)err)));
  s->close_reason = PX_CR_BROKER_LOST;
  px_life_tell_client(s, PX_CR_BROKER_LOST);
}

static void on_conn_eof(void *ctx, px_conn *side, int err) {
  px_session *s = ctx;
  if (px_life_closed(s))
    return;
  if (err == UV_ENOBUFS)
    px_session_close(s, PX_CR_OUT_OF_MEMORY);
  else
    side_eof(s, side, err);
  session_flush(s);
}

static void on_conn_data(void *ctx, px_conn *side, size_t n) {
  px_session *s = ctx;
  if (px_life_closed(s))
    return;
  if (side == &s->client)
    s->srv->stats.bytes_c2u += (uint64_t)n;
  else
    s->srv->stats.bytes_u2c += (uint64_t)n;
  process_input(s, side);
  if (!px_life_closed(s))
    settle_chunk(s, side);
}

static void side_resume(px_session *s, px_conn *side) {
  if (other_side(s, side)->lingering) {
    side->paused = false; /* the session is ending through the other side */
    return;
  }
  px_conn_resume(side);
}

/* ---- upstream connection ---------------------------------------------- */

static void on_conn_connected(void *ctx, px_conn *c, int status) {
  px_session *s = ctx;
  (void)c;
  if (!px_life_closed(s))
    px_dial_connected(s->dial, status);
}

static void dial_opened(void *ctx) {
  px_session *s = ctx;
  s->open_handles++; /* the upstream connection's closed event follows */
}

/* An attempt reached a broker (TCP, TLS): the client's protocol header
 * goes to it, and the broker's connection.start is awaited. A later
 * attempt after one that failed after the header went gets it again. */
static void dial_connected(void *ctx) {
  px_session *s = ctx;
  s->srv->upstream_ok = true;
  s->srv->stats.upstream_connections_total++;
  s->login.tls = s->dial->tls_now ? s->srv->tls_upstream : NULL;
  s->login.tls_host = s->dial->host;
  if (s->phase == PX_PHASE_HANDSHAKE) {
    px_conn_read(&s->upstream);
    if (px_out_bytes(&s->out, &s->upstream, amqp_protocol_header,
                     AMQP_PROTOCOL_HEADER_SIZE) != PX_OUT_OK)
      check_out(s);
    session_flush(s);
    return;
  }
  if (s->phase != PX_PHASE_CONNECTING)
    return; /* already closing (a bad protocol header) */
  px_conn_read(&s->upstream);
  px_chunk *in = px_conn_input(&s->client);
  if (in && in->len > in->off) {
    process_input(s, &s->client);
    if (!px_life_closed(s))
      settle_chunk(s, &s->client);
  }
  px_conn_read(&s->client);
}

/* Every upstream failed. A client whose protocol header came (or comes
 * within the handshake's limit) is answered in AMQP: rebound's own
 * connection.start, then connection.close 320 with the reason, not a
 * bare EOF. */
static void dial_failed(void *ctx) {
  px_session *s = ctx;
  s->dial_failed = true;
  px_error("upstream_unreachable", PX_U("id", s->id), PX_S("peer", s->peer),
           PX_S("tried", s->dial->errors));
  px_life_note(s, PX_CR_NO_UPSTREAM);
  if (s->phase == PX_PHASE_HANDSHAKE) {
    refuse(s); /* the header went to an attempt that failed */
  } else if (s->phase == PX_PHASE_CONNECTING) {
    px_conn_read(&s->client);
    px_chunk *in = px_conn_input(&s->client);
    if (in && in->len > in->off) {
      process_input(s, &s->client);
      if (!px_life_closed(s))
        settle_chunk(s, &s->client);
    }
  } else {
    px_session_close(s, PX_CR_NO_UPSTREAM);
    return;
  }
  session_flush(s);
}

static void dial_attempt_failed(void *ctx, const char *addr) {
  px_session *s = ctx;
  px_metrics_inc(s->srv, PX_M_CONNECT_FAILURES, addr, NULL);
}

static void dial_released(void *ctx) {
  px_session *s = ctx;
  free(s->dial);
  s->dial = NULL;
  if (--s->open_handles == 0)
    session_free(s);
}

/* The broker answered: what the session keeps of the upstream is
 * copied out and the dialer let go (dial_released() frees it). */
static void upstream_started(px_session *s) {
  px_dial *d = s->dial;
  if (!d || d->closed)
    return;
  px_dial_started(d);
  s->up.addr = strdup(d->addr);
  s->up.host = strdup(d->host);
  if (!s->up.addr || !s->up.host) {
    px_session_close(s, PX_CR_OUT_OF_MEMORY);
    return;
  }
  memcpy(&s->up.sa, &d->sa,
         d->sa.ss_family == AF_INET6 ? sizeof s->up.sa.in6
                                     : sizeof s->up.sa.in);
  s->up.tls = d->tls_now;
  s->login.tls_host = s->up.host;
  px_dial_close(d);
}

static const px_dial_events dial_events = {dial_opened, dial_connected,
                                           dial_failed, dial_attempt_failed,
                                           dial_released};

/* ---- accept ------------------------------------------------------------- */

static void on_handshake_timeout(px_session *s) {
  px_warn("handshake_timeout", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("state", px_close_phase_name(s->phase)),
          PX_U("timeout_ms", s->srv->cfg->handshake_timeout_ms));
  px_session_close(s, PX_CR_HANDSHAKE_TIMEOUT);
}

/* A phase's time is up. */
static void on_phase_timeout(px_session *s) {
  switch ((px_close_phase)s->phase) {
  case PX_PHASE_CONNECTING:
  case PX_PHASE_HANDSHAKE:
    on_handshake_timeout(s);
    break;
  case PX_PHASE_CLOSING: /* only the handshake's limit runs on into it
                            (open has none) */
  case PX_PHASE_REFUSING:
    on_handshake_timeout(s);
    break;
  case PX_PHASE_CLIENT_DEAD:
    on_client_dead_timeout(s);
    break;
  case PX_PHASE_CLIENT_GONE:
    on_retries_timeout(s);
    break;
  case PX_PHASE_TELLING_CLIENT:
  case PX_PHASE_CLIENT_ANSWERED:
  case PX_PHASE_FINISHING:
  case PX_PHASE_LINGER:
    px_session_close(s, PX_CR_CLOSE_TIMEOUT);
    break;
  case PX_PHASE_OPEN:
  case PX_PHASE_CLOSED:
    break;
  }
  session_flush(s);
}

static const px_conn_events conn_events = {
    on_conn_data,    on_conn_eof,       on_conn_write_failed,
    on_conn_written, on_conn_connected, on_conn_closed};

/* The session's timers: each module's work, then the end of the event. */
static void on_phase_timer(px_timer *t) {
  on_phase_timeout(t->data);
}

static void on_retry_deadline(px_timer *t) {
  px_retry_deadline(t->data);
  session_flush(t->data);
}

static void on_own_reopen(px_timer *t) {
  px_own_reopen(t->data);
  session_flush(t->data);
}

static void on_defer_timer(px_timer *t) {
  px_retry_defer_due(t->data);
  px_own_reopen_if_due(t->data); /* as one event: the requeues first */
  session_flush(t->data);
}

/* The separate retry connection's events (px_pub.h), for rebound's
 * channel (px_own.h) and the retry path. */
static void on_pub_ready(void *ctx) {
  px_own_pub_ready(ctx);
  session_flush(ctx);
}

static void on_pub_frame(void *ctx, const amqp_frame *f) {
  px_session *s = ctx;
  if (px_own_pub_frame(s, f)) {
    px_own_event ev = px_own_frame(s, f);
    px_retry_own_event(s, &ev); /* a failure closes the session */
  }
  session_flush(s);
}

static void on_pub_blocked(void *ctx, bool blocked, amqp_bytes reason) {
  px_retry_blocked(ctx, blocked, reason, "retry connection");
  session_flush(ctx);
}

static void on_pub_lost(void *ctx, const char *why, uint16_t code,
                        amqp_bytes text) {
  (void)code;
  px_retry_pub_lost(ctx, why, text);
  session_flush(ctx);
}

static const px_pub_events pub_events = {on_pub_ready, on_pub_frame,
                                         on_pub_blocked, on_pub_lost};

static px_session *session_alloc(px_server *srv) {
  px_session *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->dial = calloc(1, sizeof *s->dial);
  if (!s->dial) {
    free(s);
    return NULL;
  }
  s->srv = srv;
  s->pub_events = &pub_events;
  px_timer_init(&s->timer, on_phase_timer, s);
  px_retry_init(s, on_retry_deadline, on_defer_timer);
  px_own_init(s, on_own_reopen);
  px_conn_init(&s->client, "client", &conn_events, s);
  px_conn_init(&s->upstream, "upstream", &conn_events, s);
  return s;
}

/* The client is connected: timers, the session list, reading, and the
 * first upstream attempt. */
static void session_start(px_session *s) {
  px_server *srv = s->srv;
  s->open_handles = 1;  /* the client's connection */
  s->open_handles += 2; /* the timers' (on_timers_closed) and the dialer's
                           (released by dial_released) */
  s->id = ++srv->next_id;
  s->started_ms = px_clock_ms(&srv->clock);
  px_conn_peer(&s->client, s->peer, sizeof s->peer);

  s->next = srv->sessions;
  if (srv->sessions)
    srv->sessions->prev = s;
  srv->sessions = s;
  srv->stats.sessions_total++;
  srv->stats.sessions_current++;
  px_debug("session_accept", PX_U("id", s->id), PX_S("peer", s->peer));

  px_life_phase(s, PX_PHASE_CONNECTING); /* its timer starts */
  px_conn_read(&s->client);
  px_dial_start(s->dial, srv->loop, &srv->clock, srv->cfg, &srv->dial_memory,
                srv->tls_upstream, &s->upstream, srv->cfg->connect_timeout_ms,
                &dial_events, s, s->id);
}

int px_session_accept(px_server *srv, uv_stream_t *listener, px_tls_ctx *tls) {
  px_session *s = session_alloc(srv);
  if (!s)
    return UV_ENOMEM;
  int rc = px_conn_accept(&s->client, srv->loop, listener);
  if (rc == 0 && tls)
    rc = px_tls_accept(&s->client, tls);
  if (rc < 0) {
    s->phase = PX_PHASE_CLOSED;
    if (!s->client.open) {
      session_discard(s);
      return rc;
    }
    s->open_handles = 1;
    px_conn_close(&s->client); /* freed in on_conn_closed */
    return rc;
  }
  session_start(s);
  return 0;
}

px_session *px_session_new(px_server *srv, const px_conn_io *client_io,
                           const px_conn_io *upstream_io) {
  px_session *s = session_alloc(srv);
  if (!s)
    return NULL;
  px_conn_adopt(&s->client, client_io);
  s->upstream.io = upstream_io;
  session_start(s);
  return s;
}

/* An open session is told to close; one not open yet, or finishing (both
 * close-oks passed), is closed now. One that is ending already is left to
 * its phase: it waits for an answer (a close-ok, a lingering peer's EOF)
 * or finishes the copies of a client that is gone, within the phase's
 * limit and the drain's. Closing it now could drop what the broker has
 * not yet acted on (acks of originals whose copies are confirmed). */
void px_session_drain(px_session *s) {
  switch ((px_close_phase)s->phase) {
  case PX_PHASE_OPEN:
    s->close_reason = PX_CR_SHUTTING_DOWN;
    px_life_tell_client(s, PX_CR_SHUTTING_DOWN);
    session_flush(s);
    return;
  case PX_PHASE_CONNECTING:
  case PX_PHASE_HANDSHAKE:
  case PX_PHASE_FINISHING:
    px_session_close(s, PX_CR_SHUTTING_DOWN);
    return;
  default:
    return;
  }
}

void px_session_snapshot(const px_session *s, px_session_snap *out) {
  *out = (px_session_snap){
      .id = s->id,
      .started_ms = s->started_ms,
      .state = px_close_phase_name(s->phase),
      .channels = s->nchans,
      .bytes_from_client = s->client.bytes_in,
      .bytes_to_client = s->client.bytes_out,
      .retries_pending = px_retry_in_flight(s),
      .requeues_delayed = px_retry_delayed(s),
      .cache_bytes = s->cache_bytes,
      .retry_connection = px_own_pub_up(s)     ? "separate"
                          : px_own_uses_pub(s) ? "opening"
                                               : "shared",
      .retry_connection_open = px_own_pub_up(s),
      .blocked = px_retry_blocked_now(s),
      .upstream_connected = s->upstream.connected,
  };
  memcpy(out->peer, s->peer, sizeof out->peer);
  memcpy(out->user, s->user, sizeof out->user);
  memcpy(out->vhost, s->vhost, sizeof out->vhost);
}

static void chan_unsettled(const px_session *s, const px_chan *c,
                           void (*fn)(void *, const px_unsettled *),
                           void *arg) {
  px_unsettled u = {
      .session_id = s->id, .peer = s->peer, .channel = c->client_ch};
  for (uint32_t i = 0; i < c->track.dl.r.n; i++) {
    const px_delivery *d = px_dl_at(&c->track, i);
    if (d->state == PX_DL_GONE)
      continue;
    u.tag = d->tag;
    u.qid = d->qid;
    u.delivered_us = d->delivered_us;
    u.consumer_tag = px_track_consumer_tag(c, d);
    fn(arg, &u);
  }
}

void px_session_unsettled(const px_session *s,
                          void (*fn)(void *arg, const px_unsettled *u),
                          void *arg) {
  uint32_t at = 0;
  for (px_chan *c; (c = px_tab_next(&s->by_client, &at));)
    chan_unsettled(s, c, fn, arg);
}

void px_session_tick(px_session *s, uint32_t shortest_timeout_ms) {
  if (px_life_closed(s) || !shortest_timeout_ms)
    return;
  px_retry_timeouts(s, shortest_timeout_ms);
  session_flush(s);
}

px_session *px_session_next(const px_session *s) {
  return s->next;
}

uint64_t px_session_id(const px_session *s) {
  return s->id;
}
