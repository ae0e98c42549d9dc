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

#include "px_metrics.h"
#include "px_session_int.h"

#define PX_HIGH_WATER (512 * 1024)
#define PX_LOW_WATER (128 * 1024)
/* Reads smaller than this are not worth a syscall: move to a new chunk. */
#define PX_MIN_READ 2048
/* Frame size accepted before connection.tune-ok fixes frame-max. */
#define PX_PRETUNE_FRAME_MAX 131072
/* Frames from the broker are accepted up to this (see frame_limit()). */
#define PX_UPSTREAM_FRAME_MAX (4u * 1024 * 1024)
/* How long to wait for close-ok (or a flush, or a lingering peer's EOF)
 * before closing anyway. */
#define PX_CLOSE_WAIT_MS 2000
/* After close-ok, how long the client has to hang up (the broker's own
 * wait). */
#define PX_FINISH_WAIT_MS 30000

static void upstream_try_next(px_session *s);

typedef struct px_write {
  uv_write_t req;
  px_side *side;
  size_t bytes;
  unsigned n;
  px_chunk *chunks[PX_OUT_MAX];
  uv_buf_t bufs[PX_OUT_MAX];
} px_write;

const char *px_state_name(int state) {
  static const char *const names[] = {"connecting", "handshake", "open",
                                      "closing",    "finishing", "closed"};
  return state >= 0 && state < 6 ? names[state] : "?";
}

static px_side *other_side(px_session *s, px_side *side) {
  return side == &s->client ? &s->upstream : &s->client;
}

void px__set_state(px_session *s, px_state state) {
  px_debug("session_state", PX_U("id", s->id), PX_S("peer", s->peer),
           PX_S("from", px_state_name(s->state)),
           PX_S("to", px_state_name(state)));
  s->state = state;
}

/* ---- lifecycle ---------------------------------------------------------- */

/* Free a copy of credentials, wiped first. */
static void free_secret(uint8_t *p, size_t len) {
  if (p)
    explicit_bzero(p, len);
  free(p);
}

static void session_free(px_session *s) {
  free_secret(s->login_auth, s->login.mechanism.len + s->login.response.len +
                                 s->login.locale.len);
  free(s->login_vhost);
  px__chans_free(s);
  px__retry_free(s);
  if (s->conn_held)
    px_chunk_unref(s->conn_hold.chunk);
  for (px_side *side = &s->client; side;
       side = side == &s->client ? &s->upstream : NULL) {
    for (unsigned i = 0; i < side->nout; i++)
      px_chunk_unref(side->out[i].chunk);
    if (side->in)
      px_chunk_unref(side->in);
  }
  px_server_session_gone(s->srv, s);
  free(s);
}

static void on_handle_closed(uv_handle_t *h) {
  px_session *s = h->data;

  if (h == (uv_handle_t *)&s->upstream.tcp && s->state != PX_S_CLOSED) {
    /* a failed connect attempt: try the next upstream */
    s->open_handles--;
    upstream_try_next(s);
    return;
  }
  if (--s->open_handles == 0 && !s->gai_pending)
    session_free(s);
}

static void side_close(px_side *side) {
  if (side->open && !uv_is_closing((uv_handle_t *)&side->tcp))
    uv_close((uv_handle_t *)&side->tcp, on_handle_closed);
  side->open = false;
  side->connected = false;
}

/* The first reason that applies is the one logged and counted. */
static void note_reason(px_session *s, px_close_reason reason) {
  if (!s->close_reason)
    s->close_reason = reason;
}

void px_session_close(px_session *s, px_close_reason reason) {
  if (s->state == PX_S_CLOSED)
    return;
  note_reason(s, reason ? reason : PX_CR_CLOSE_TIMEOUT);
  uint64_t ms = uv_now(s->srv->loop) - s->started_ms;
  px_info("session_close", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("user", s->user), PX_S("vhost", s->vhost),
          PX_S("state", px_state_name(s->state)), PX_U("duration_ms", ms),
          PX_U("bytes_from_client", s->client.bytes_in),
          PX_U("bytes_to_client", s->client.bytes_out),
          PX_S("reason", px_close_text(s->close_reason)));
  px_metrics_inc(s->srv, PX_M_CLOSES, px_close_text(s->close_reason), NULL);
  px__set_state(s, PX_S_CLOSED);
  uv_timer_stop(&s->timer);
  uv_close((uv_handle_t *)&s->timer, on_handle_closed);
  uv_timer_stop(&s->retry_timer);
  uv_close((uv_handle_t *)&s->retry_timer, on_handle_closed);
  uv_timer_stop(&s->defer_timer);
  uv_close((uv_handle_t *)&s->defer_timer, on_handle_closed);
  side_close(&s->client);
  side_close(&s->upstream);
  px_pub_close(s->pub);
  s->pub = NULL;
  s->pub_ready = false;
  if (s->gai_pending)
    uv_cancel((uv_req_t *)&s->gai);
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

static void on_close_wait_timeout(uv_timer_t *t) {
  px_session *s = t->data;
  px_session_close(s, PX_CR_CLOSE_TIMEOUT);
}

static void on_retries_timeout(uv_timer_t *t) {
  px_session *s = t->data;
  /* replaces the reason client_gone_finish() gave: this one says more */
  s->close_reason = s->client_write_failed
                        ? PX_CR_CLIENT_WRITE_FAILED_RETRIES_TIMEOUT
                        : PX_CR_CLIENT_DISCONNECTED_RETRIES_TIMEOUT;
  px_session_close(s, s->close_reason);
}

static void side_pressure(px_side *side);

/* Nothing more is written to the client (it is gone). Reading the broker
 * resumes if the client's backlog had paused it: the confirms of copies
 * in flight must get through. */
static void client_stop_writing(px_session *s) {
  s->client.connected = false;
  for (unsigned i = 0; i < s->client.nout; i++)
    px_chunk_unref(s->client.out[i].chunk);
  s->client.nout = 0;
  side_pressure(&s->client);
}

/* The client is gone (EOF, a reset, a failed write) while copies are in
 * flight: finish them (publish, confirm, ack) before the upstream closes,
 * for at most retry_finish_timeout. false when there is nothing to finish
 * (or no broker to finish it with). */
static bool client_gone_finish(px_session *s, bool write_failed) {
  if (!px__retry_busy(s) || !s->upstream.connected || s->client_gone)
    return s->client_gone;
  s->client_gone = true;
  s->client_write_failed = write_failed;
  if (s->client.reading)
    uv_read_stop((uv_stream_t *)&s->client.tcp);
  s->client.reading = s->client.paused = false;
  client_stop_writing(s);
  px_info("client_gone_retries_pending", PX_U("id", s->id),
          PX_S("peer", s->peer), PX_U("pending", s->ops.n),
          PX_S("how", write_failed ? "write failed" : "disconnected"),
          PX_U("timeout_ms", s->srv->cfg->retry_finish_timeout_ms));
  s->close_reason =
      write_failed ? PX_CR_CLIENT_WRITE_FAILED : PX_CR_CLIENT_DISCONNECTED;
  uv_timer_stop(&s->timer);
  uv_timer_start(&s->timer, on_retries_timeout,
                 s->srv->cfg->retry_finish_timeout_ms, 0);
  return true;
}

static void arm_close_timer(px_session *s) {
  uv_timer_stop(&s->timer);
  uv_timer_start(&s->timer, on_close_wait_timeout, PX_CLOSE_WAIT_MS, 0);
}

/* ---- writing ------------------------------------------------------------ */

static void side_resume(px_side *side);
static void side_shutdown(px_side *side);
static void side_start_reading(px_side *side);

/* Before the client's reset or EOF shows on the read side, a write to it
 * failed. What it sent before it went is still readable (a nack whose copy
 * must be made): stop writing, keep reading until the read reports the end
 * (side_eof then finishes the copies in flight), for at most
 * PX_CLOSE_WAIT_MS. */
static void on_client_dead_timeout(uv_timer_t *t) {
  px_session *s = t->data;
  if (!client_gone_finish(s, true))
    px_session_close(s, PX_CR_CLIENT_WRITE_FAILED);
}

static void client_write_failed(px_session *s, int err) {
  s->client_write_failed = true;
  client_stop_writing(s);
  px_info("client_write_failed", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("error", uv_strerror(err)), PX_U("pending", s->ops.n));
  note_reason(s, PX_CR_CLIENT_WRITE_FAILED);
  uv_timer_stop(&s->timer);
  uv_timer_start(&s->timer, on_client_dead_timeout, PX_CLOSE_WAIT_MS, 0);
  s->client.paused = false;
  side_start_reading(&s->client);
}

/* A write to `side` failed (at once or later): log and close. A client
 * that hangs up once its close handshake is done ends normally. */
static void side_write_failed(px_side *side, int err) {
  px_session *s = side->s;
  if (side == &s->client && (s->state == PX_S_FINISHING || side->lingering)) {
    px_session_close(s, PX_CR_CLIENT_CLOSED);
    return;
  }
  if (side == &s->client) { /* once: later failures of writes in flight
                               say nothing new */
    if (!s->client_write_failed && !s->client_gone)
      client_write_failed(s, err);
    return;
  }
  px_warn("write_failed", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("side", side->name), PX_S("error", uv_strerror(err)));
  px_session_close(s, PX_CR_UPSTREAM_WRITE_FAILED);
}

/* Bytes waiting to reach `side`: in flight, and for the upstream side the
 * client frames held on channels (they are sent once released). */
static size_t side_pending(const px_side *side) {
  const px_session *s = side->s;
  if (side == &s->client && (s->client_gone || s->client_write_failed))
    return 0; /* nothing more reaches it: the broker is read again */
  return side->inflight + (side == &s->upstream ? s->held_bytes : 0);
}

/* Stop reading the other side while `side` has too much pending; read it
 * again once that drained. */
static void side_pressure(px_side *side) {
  px_session *s = side->s;
  px_side *other = other_side(s, side);
  size_t pending = side_pending(side);
  if (pending > PX_HIGH_WATER && other->reading) {
    uv_read_stop((uv_stream_t *)&other->tcp);
    other->reading = false;
    other->paused = true;
  } else if (other->paused && pending < PX_LOW_WATER) {
    side_resume(other);
  }
}

static void on_write(uv_write_t *req, int status) {
  px_write *w = (px_write *)req;
  px_side *side = w->side;
  px_session *s = side->s;

  for (unsigned i = 0; i < w->n; i++)
    px_chunk_unref(w->chunks[i]);
  side->inflight -= w->bytes;
  free(w);
  if (s->state == PX_S_CLOSED)
    return;
  if (status < 0) {
    side_write_failed(side, status);
    return;
  }
  if (side->lingering && side->inflight == 0 && side->nout == 0) {
    side_shutdown(side);
    return;
  }
  side_pressure(side);
}

/* Write what the socket takes now without a request (the common case: no
 * write pending); drop the slices done, trim a partly written one. Returns
 * 0, or a negative libuv error. */
static int side_try_write(px_side *side) {
  uv_buf_t bufs[PX_OUT_MAX];
  for (unsigned i = 0; i < side->nout; i++)
    bufs[i] = uv_buf_init((char *)side->out[i].ptr, side->out[i].len);
  int n = uv_try_write((uv_stream_t *)&side->tcp, bufs, side->nout);
  if (n == UV_EAGAIN || n == UV_ENOSYS)
    return 0;
  if (n < 0)
    return n;
  side->bytes_out += (uint64_t)n;
  unsigned done = 0;
  size_t left = (size_t)n;
  while (done < side->nout && left >= side->out[done].len) {
    left -= side->out[done].len;
    px_chunk_unref(side->out[done++].chunk);
  }
  if (done < side->nout) {
    side->out[done].ptr += left;
    side->out[done].len -= (uint32_t)left;
  }
  side->nout -= done;
  if (done && side->nout)
    memmove(side->out, side->out + done, side->nout * sizeof *side->out);
  return 0;
}

static void side_flush(px_side *side) {
  px_session *s = side->s;
  if (side->nout == 0 || !side->connected)
    return;
  if (side->inflight == 0) {
    int rc = side_try_write(side);
    if (rc < 0) {
      side_write_failed(side, rc);
      return;
    }
    if (side->nout == 0)
      return;
  }
  px_write *w = malloc(sizeof *w);
  if (!w) {
    px_session_close(s, PX_CR_OUT_OF_MEMORY);
    return;
  }
  w->side = side;
  w->n = side->nout;
  w->bytes = 0;
  for (unsigned i = 0; i < w->n; i++) {
    w->bufs[i] = uv_buf_init((char *)side->out[i].ptr, side->out[i].len);
    w->chunks[i] = side->out[i].chunk;
    w->bytes += side->out[i].len;
  }
  side->nout = 0;
  int rc =
      uv_write(&w->req, (uv_stream_t *)&side->tcp, w->bufs, w->n, on_write);
  if (rc < 0) {
    for (unsigned i = 0; i < w->n; i++)
      px_chunk_unref(w->chunks[i]);
    free(w);
    side_write_failed(side, rc);
    return;
  }
  side->inflight += w->bytes;
  side->bytes_out += w->bytes;
  side_pressure(side);
}

/* Queue bytes of `c` for `side`, taking a reference; contiguous bytes of the
 * same chunk extend the last slice. */
static void side_queue(px_side *side, px_chunk *c, uint8_t *p, uint32_t len) {
  if (!side->open || len == 0 ||
      (side == &side->s->client &&
       (side->s->client_gone || side->s->client_write_failed)))
    return; /* a client gone while copies finish gets nothing more */
  if (side->nout > 0) {
    px_slice *last = &side->out[side->nout - 1];
    if (last->chunk == c && last->ptr + last->len == p) {
      last->len += len;
      return;
    }
  }
  if (side->nout == PX_OUT_MAX)
    side_flush(side);
  if (side->nout == PX_OUT_MAX) { /* not connected yet: cannot happen */
    px_session_close(side->s, PX_CR_OUTPUT_FULL);
    return;
  }
  px_chunk_ref(c);
  side->out[side->nout++] = (px_slice){c, p, len};
}

static void run_flush(px_session *s) {
  if (s->run.to && s->run.end > s->run.start)
    side_queue(s->run.to, s->run.chunk, s->run.chunk->data + s->run.start,
               s->run.end - s->run.start);
  s->run.start = s->run.end;
}

/* Frames for rebound's channel on the separate retry connection. */
static void pub_emit(px_session *s, const uint8_t *data, size_t len) {
  if (!s->pub || px_pub_write(s->pub, data, len) != 0)
    px_session_close(s, PX_CR_RETRY_CONNECTION_WRITE_FAILED);
}

void px__emit(px_session *s, px_side *side, const uint8_t *data, size_t len) {
  if (!side) {
    pub_emit(s, data, len);
    return;
  }
  if (s->run.to == side)
    run_flush(s);
  px_chunk *c = px_chunk_new(len);
  if (!c) {
    px_session_close(s, PX_CR_OUT_OF_MEMORY);
    return;
  }
  memcpy(c->data, data, len);
  c->len = (uint32_t)len;
  side_queue(side, c, c->data, (uint32_t)len);
  px_chunk_unref(c);
}

void px__emit_frame(px_session *s, px_side *side, uint8_t type, uint16_t ch,
                    const uint8_t *payload, size_t len) {
  if (side && s->run.to == side)
    run_flush(s);
  px_chunk *c = px_chunk_new(len + AMQP_FRAME_OVERHEAD);
  if (!c) {
    px_session_close(s, PX_CR_OUT_OF_MEMORY);
    return;
  }
  long n =
      amqp_frame_write(c->data, c->cap, type, ch, (amqp_bytes){payload, len});
  if (n > 0 && !side)
    pub_emit(s, c->data, (size_t)n);
  else if (n > 0) {
    c->len = (uint32_t)n;
    side_queue(side, c, c->data, (uint32_t)n);
  }
  px_chunk_unref(c);
}

void px__session_flush(px_session *s) {
  if (s->state != PX_S_CLOSED)
    side_flush(&s->upstream);
  if (s->state != PX_S_CLOSED)
    side_flush(&s->client);
  if (s->state != PX_S_CLOSED)
    side_pressure(&s->upstream);
}

void px__emit_method(px_session *s, px_side *side, uint16_t ch,
                     const amqp_method *m) {
  uint8_t buf[1024];
  long n = amqp_method_frame_write(buf, sizeof buf, ch, m);
  if (n < 0) {
    px_error("encode_failed", PX_U("id", s->id),
             PX_S("method", m->desc ? m->desc->name : "?"),
             PX_S("error", amqp_status_str((int)n)));
    return;
  }
  px__emit(s, side, buf, (size_t)n);
}

/* Let a channel's held client frames go, in order. Each goes through the
 * frame handler now (it may start a retry, which holds the rest again);
 * a held channel.open (rebound yielded its number) just gets its number. */
void px__release_held(px_session *s, px_chan *c) {
  uint32_t i = 0;
  c->held = false;
  c->in_release = true;
  for (; i < c->nhold && !c->held && s->state != PX_S_CLOSED; i++) {
    px_slice *h = &c->hold[i];
    amqp_frame f;
    px_chan *again = NULL;
    int act = PX_FORWARD;
    if (amqp_frame_parse(h->ptr, h->len, 0, &f) != (long)h->len) {
      act = PX_DROP; /* cannot be: it parsed when it came in */
    } else if (i == 0 && c->open_held) {
      c->open_held = false;
      px__set_channel(h->ptr, c->up_ch);
    } else {
      act = px__client_frame(s, &f, h->ptr, &again);
    }
    if (act == PX_HOLD)
      break; /* still in the list, with those after it */
    if (act == PX_FORWARD)
      side_queue(&s->upstream, h->chunk, h->ptr, h->len);
    c->held_bytes -= h->len;
    s->held_bytes -= h->len;
    px_chunk_unref(h->chunk);
  }
  if (i < c->nhold)
    memmove(c->hold, c->hold + i, (c->nhold - i) * sizeof *c->hold);
  c->nhold -= i;
  c->in_release = false;
  if (c->release_late)
    px__chan_release(s, c);
  side_flush(&s->upstream);
  if (s->state != PX_S_CLOSED)
    side_pressure(&s->upstream);
}

void px__drop_held(px_session *s, px_chan *c) {
  s->held_bytes -= c->held_bytes;
  px_chan_drop_held(c);
  if (s->state != PX_S_CLOSED)
    side_pressure(&s->upstream);
}

void px__finishing(px_session *s, px_close_reason reason) {
  note_reason(s, reason);
  px__set_state(s, PX_S_FINISHING);
  uv_timer_stop(&s->timer);
  uv_timer_start(&s->timer, on_close_wait_timeout, PX_FINISH_WAIT_MS, 0);
}

/* A failed shutdown ends the session like a failed write (unless a
 * reason was already given). */
static px_close_reason write_failed_reason(const px_side *side) {
  return side == &side->s->client ? PX_CR_CLIENT_WRITE_FAILED
                                  : PX_CR_UPSTREAM_WRITE_FAILED;
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  px_side *side = req->data;
  if (side->s->state != PX_S_CLOSED && status < 0)
    px_session_close(side->s, write_failed_reason(side));
}

/* Shut down the write side of a lingering side once its output is out.
 * The broker, once rebound has sent it connection.close, only after its
 * close-ok: a broker that sees the socket end first drops the connection
 * as "unexpectedly closed", and acks it had read but not yet handled may
 * be lost (the delivery requeued, a duplicate of a confirmed copy). */
static void side_shutdown(px_side *side) {
  px_session *s = side->s;
  if (side == &s->upstream && s->up_close_sent && !s->up_close_answered)
    return;
  if (side->shut || !side->connected)
    return;
  side->shut = true;
  side->shutdown_req.data = side;
  if (uv_shutdown(&side->shutdown_req, (uv_stream_t *)&side->tcp, on_shutdown) <
      0)
    px_session_close(side->s, write_failed_reason(side));
}

/* End the session through `side`: stop reading the other side, flush
 * what `side` is owed, shut down its write side, then drop its input until
 * it hangs up (or PX_CLOSE_WAIT_MS). Closing a socket whose peer's data
 * sits unread makes the kernel reset it and drop what was just written (a
 * client's close-ok, the ack of an original whose copy is confirmed):
 * draining first lets the peer read everything. */
static void side_linger(px_side *side) {
  px_session *s = side->s;
  px_side *other = other_side(s, side);
  if (other->reading)
    uv_read_stop((uv_stream_t *)&other->tcp);
  other->reading = other->paused = false;
  side->lingering = true;
  side->paused = false;
  arm_close_timer(s);
  side_flush(side);
  if (s->state == PX_S_CLOSED)
    return;
  if (side->inflight == 0 && side->nout == 0)
    side_shutdown(side);
  side_start_reading(side);
}

void px__release_conn_hold(px_session *s) {
  if (!s->conn_held)
    return;
  s->conn_held = false;
  px__set_state(s, PX_S_CLOSING);
  side_queue(&s->upstream, s->conn_hold.chunk, s->conn_hold.ptr,
             s->conn_hold.len);
  px_chunk_unref(s->conn_hold.chunk);
  side_flush(&s->upstream);
}

void px__close_after_flush(px_session *s, px_side *side,
                           px_close_reason reason) {
  note_reason(s, reason);
  if (side->connected)
    side_linger(side);
  else
    px_session_close(s, reason);
}

void px__emit_close(px_session *s, px_side *side, uint16_t code,
                    const char *text, uint16_t class_id, uint16_t method_id) {
  amqp_method m;
  if (side == &s->upstream)
    s->up_close_sent = true;
  amqp_method_init(&m, AMQP_CONNECTION_CLOSE);
  m.args[AMQP_F_CONNECTION_CLOSE_REPLY_CODE].u = code;
  m.args[AMQP_F_CONNECTION_CLOSE_REPLY_TEXT].b = amqp_cstr(text);
  m.args[AMQP_F_CONNECTION_CLOSE_CLASS_ID].u = class_id;
  m.args[AMQP_F_CONNECTION_CLOSE_METHOD_ID].u = method_id;
  px__emit_method(s, side, 0, &m);
}

void px__tell_client(px_session *s, px_close_reason reason) {
  char text[128];
  int code = px_close_reply(reason);
  snprintf(text, sizeof text, "%s - %s", amqp_reply_name(code),
           px_close_text(reason));
  px__close_client(s, (uint16_t)code, text, 0, 0);
}

void px__close_client(px_session *s, uint16_t code, const char *text,
                      uint16_t class_id, uint16_t method_id) {
  if (s->proxy_closing)
    return;
  s->proxy_closing = true;
  px__emit_close(s, &s->client, code, text, class_id, method_id);
  side_flush(&s->client);
  px__set_state(s, PX_S_CLOSING);
  arm_close_timer(s);
}

/* ---- reading ------------------------------------------------------------ */

/* Move the unparsed bytes into a chunk of at least `need` bytes. */
static px_chunk *side_relocate(px_side *side, size_t need) {
  px_chunk *old = side->in;
  size_t keep = old ? old->len - old->off : 0;
  px_chunk *c = px_chunk_new(need > keep ? need : keep + PX_MIN_READ);
  if (!c)
    return NULL;
  if (keep)
    memcpy(c->data, old->data + old->off, keep);
  c->len = (uint32_t)keep;
  if (old)
    px_chunk_unref(old);
  side->in = c;
  return c;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  px_session *s = h->data;
  px_side *side =
      h == (uv_handle_t *)&s->client.tcp ? &s->client : &s->upstream;
  px_chunk *c = side->in;
  (void)suggested;
  if (!c || c->cap - c->len < PX_MIN_READ)
    c = side_relocate(side, PX_CHUNK_SIZE);
  if (!c) {
    *buf = uv_buf_init(NULL, 0); /* read_cb gets UV_ENOBUFS */
    return;
  }
  *buf = uv_buf_init((char *)c->data + c->len, c->cap - c->len);
}

/* Answer a bad protocol header as the spec says: with ours, then close. */
static int check_client_header(px_session *s, px_chunk *c) {
  long rc = amqp_protocol_header_parse(c->data + c->off, c->len - c->off);
  if (rc == AMQP_PARTIAL)
    return 0;
  if (rc < 0) {
    char what[64];
    amqp_protocol_header_describe(c->data + c->off, c->len - c->off, what,
                                  sizeof what);
    px_warn("bad_protocol_header", PX_U("id", s->id), PX_S("peer", s->peer),
            PX_S("sent", what));
    s->srv->stats.protocol_errors++;
    c->off = c->len; /* answered once; nothing more is read from it */
    s->proxy_closing = true;
    px__set_state(s, PX_S_CLOSING);
    px__emit(s, &s->client, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE);
    px__close_after_flush(s, &s->client, PX_CR_BAD_PROTOCOL_HEADER);
    return -1;
  }
  if (!s->upstream.connected) { /* forwarded once the upstream is up */
    uv_read_stop((uv_stream_t *)&s->client.tcp);
    s->client.reading = false;
    return 0;
  }
  side_queue(&s->upstream, c, c->data + c->off, AMQP_PROTOCOL_HEADER_SIZE);
  c->off += AMQP_PROTOCOL_HEADER_SIZE;
  px__set_state(s, PX_S_HANDSHAKE);
  return 1;
}

/* The largest frame read from `side`. A client is held to the frame-max it
 * negotiated. The broker is not: RabbitMQ itself sends content headers over
 * frame-max once dead-lettering has added x-death, and clients accept them,
 * so rebound passes them too, up to the 4 MiB it ever accepts. */
static uint32_t frame_limit(const px_session *s, const px_side *side) {
  if (!s->frame_max)
    return PX_PRETUNE_FRAME_MAX;
  return side == &s->upstream && s->frame_max < PX_UPSTREAM_FRAME_MAX
             ? PX_UPSTREAM_FRAME_MAX
             : s->frame_max;
}

/* A frame that does not parse: the stream is out of step. */
static void input_error(px_session *s, px_side *from, long status) {
  const char *text = amqp_status_str((int)status);
  if (from == &s->upstream) {
    px__upstream_error(s, text);
    return;
  }
  int code = amqp_status_reply_code((int)status);
  px__client_error(s, (uint16_t)(code ? code : AMQP_REPLY_FRAME_ERROR), text,
                   0);
}

/* Parse and dispatch every whole frame in `from`'s chunk. */
/* A lingering upstream that was sent connection.close: look for its
 * answer; once it came, the write side may be shut down. */
static void await_close_ok(px_session *s, px_chunk *c) {
  while (!s->up_close_answered) {
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
      s->up_close_answered = true;
      if (s->upstream.inflight == 0 && s->upstream.nout == 0)
        side_shutdown(&s->upstream);
    }
  }
}

static void process_input(px_session *s, px_side *from) {
  px_chunk *c = from->in;
  px_side *to = other_side(s, from);

  if (from == &s->upstream && from->lingering && s->up_close_sent &&
      !s->up_close_answered) {
    await_close_ok(s, c); /* a partial frame stays for the next read */
    if (!s->up_close_answered)
      return;
  }
  if (from->lingering || (from == &s->client && s->state == PX_S_FINISHING)) {
    c->off = c->len; /* after close-ok: read and dropped, as the broker */
    return;
  }
  if (from == &s->client && s->state == PX_S_CONNECTING &&
      check_client_header(s, c) <= 0)
    return;
  uint64_t frames = 0;
  s->run.to = to;
  s->run.chunk = c;
  s->run.start = s->run.end = c->off;
  while (s->state != PX_S_CLOSED) {
    amqp_frame f;
    long n = amqp_frame_parse(c->data + c->off, c->len - c->off,
                              frame_limit(s, from), &f);
    if (n == AMQP_PARTIAL)
      break;
    if (n < 0) {
      /* The stream is out of step: drop what is buffered. A peer told
       * to close answers in a later read, parsed afresh; while closing,
       * further garbage is dropped without another log line. */
      run_flush(s);
      c->off = c->len;
      if (!s->proxy_closing)
        input_error(s, from, n);
      break;
    }
    uint8_t *raw = c->data + c->off;
    px_chan *hold = NULL;
    frames++;
    int act = from == &s->upstream ? px__upstream_frame(s, &f, raw)
              : s->conn_held       ? PX_DROP /* after its connection.close */
                                   : px__client_frame(s, &f, raw, &hold);
    c->off += (uint32_t)n;
    if (act == PX_FORWARD) {
      s->run.end = c->off;
      continue;
    }
    run_flush(s);
    s->run.start = s->run.end = c->off;
    if (act == PX_HOLD_CONN) {
      px_chunk_ref(c);
      s->conn_hold = (px_slice){c, raw, (uint32_t)n};
      s->conn_held = true;
    }
    if (act == PX_HOLD) {
      px_chunk_ref(c);
      if (px_chan_hold(hold, (px_slice){c, raw, (uint32_t)n}) != 0)
        px_session_close(s, PX_CR_OUT_OF_MEMORY);
      else
        s->held_bytes += (uint32_t)n;
    }
    if (act == PX_STOP)
      break;
  }
  run_flush(s);
  s->run.to = NULL;
  *(from == &s->client ? &s->srv->stats.frames_c2u
                       : &s->srv->stats.frames_u2c) += frames;
  if (s->state == PX_S_CLOSED)
    return;
  side_flush(to);
  side_flush(from);
  if (s->state != PX_S_CLOSED)
    side_pressure(&s->upstream);
}

/* After parsing: release a spent chunk, or make room for a big frame
 * (whose size the parser has already checked against frame-max). */
static void settle_chunk(px_side *side) {
  px_chunk *c = side->in;
  if (!c || side->s->state == PX_S_CONNECTING) /* protocol header pending */
    return;
  if (c->off == c->len) {
    px_chunk_unref(c);
    side->in = NULL;
    return;
  }
  if (c->len - c->off >= AMQP_FRAME_HEADER_SIZE) {
    amqp_reader r = amqp_reader_make(c->data + c->off + 3, 4);
    size_t size = (size_t)amqp_get_u32(&r) + AMQP_FRAME_OVERHEAD;
    if (size > frame_limit(side->s, side))
      return; /* cannot be: the parser refuses it (frame-max bounds it) */
    if (size > c->cap - c->off && !side_relocate(side, size))
      px_session_close(side->s, PX_CR_OUT_OF_MEMORY);
  }
}

static void side_eof(px_session *s, px_side *side, ssize_t err) {
  bool clean = err == UV_EOF;
  uv_read_stop((uv_stream_t *)&side->tcp);
  side->reading = false;
  if (side->lingering || (side == &s->client && s->state == PX_S_FINISHING)) {
    px_session_close(s, PX_CR_CLIENT_CLOSED);
    return;
  }
  if (side == &s->upstream && s->state == PX_S_FINISHING) {
    px__close_after_flush(s, &s->client, PX_CR_BROKER_CLOSED);
    return;
  }
  /* open, or closing (the client's close held, or rebound draining) */
  if (side == &s->client && client_gone_finish(s, s->client_write_failed))
    return;
  if (side == &s->client) {
    if (!clean)
      px_info("client_error", PX_U("id", s->id), PX_S("peer", s->peer),
              PX_S("error", uv_strerror((int)err)));
    px__close_after_flush(s, &s->upstream,
                          s->state == PX_S_CLOSING ? PX_CR_CLIENT_CLOSED
                                                   : PX_CR_CLIENT_DISCONNECTED);
    return;
  }
  if (s->state == PX_S_CLOSING || s->state == PX_S_CONNECTING ||
      s->state == PX_S_HANDSHAKE || s->proxy_closing) {
    px__close_after_flush(s, &s->client,
                          s->state == PX_S_CLOSING ? PX_CR_BROKER_CLOSED
                                                   : PX_CR_BROKER_DISCONNECTED);
    return;
  }
  px_warn("upstream_lost", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("error",
               clean ? "connection closed by broker" : uv_strerror((int)err)));
  s->close_reason = PX_CR_BROKER_LOST;
  px__tell_client(s, PX_CR_BROKER_LOST);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  px_session *s = st->data;
  px_side *side =
      st == (uv_stream_t *)&s->client.tcp ? &s->client : &s->upstream;
  (void)buf;
  if (s->state == PX_S_CLOSED)
    return;
  if (nread < 0) {
    if (side->in && side->in->off == side->in->len) {
      px_chunk_unref(side->in); /* allocated for this read: give it back */
      side->in = NULL;
    }
    if (nread == UV_ENOBUFS)
      px_session_close(s, PX_CR_OUT_OF_MEMORY);
    else
      side_eof(s, side, nread);
    return;
  }
  if (nread == 0) {
    settle_chunk(side);
    return;
  }
  side->in->len += (uint32_t)nread;
  side->bytes_in += (uint64_t)nread;
  if (side == &s->client)
    s->srv->stats.bytes_c2u += (uint64_t)nread;
  else
    s->srv->stats.bytes_u2c += (uint64_t)nread;
  process_input(s, side);
  if (s->state != PX_S_CLOSED)
    settle_chunk(side);
}

static void side_start_reading(px_side *side) {
  if (side->reading || !side->open)
    return;
  if (uv_read_start((uv_stream_t *)&side->tcp, on_alloc, on_read) == 0)
    side->reading = true;
}

static void side_resume(px_side *side) {
  side->paused = false;
  if (other_side(side->s, side)->lingering)
    return; /* the session is ending through the other side */
  side_start_reading(side);
}

/* ---- upstream connection ---------------------------------------------- */

static void note_upstream_error(px_session *s, const char *err) {
  size_t n = strlen(s->upstream_errors);
  snprintf(s->upstream_errors + n, sizeof s->upstream_errors - n, "%s%s: %s",
           n ? "; " : "", s->upstream_addr, err);
  px_metrics_inc(s->srv, PX_M_CONNECT_FAILURES, s->upstream_addr, NULL);
}

static void on_connect(uv_connect_t *req, int status) {
  px_session *s = req->data;
  s->connect_pending = false;
  if (s->state == PX_S_CLOSED)
    return;
  if (status < 0) {
    note_upstream_error(s, uv_strerror(status));
    s->upstream_idx++;
    side_close(&s->upstream); /* on_handle_closed tries the next one */
    return;
  }
  s->upstream.connected = true;
  s->srv->upstream_ok = true;
  s->srv->stats.upstream_connections_total++;
  uv_tcp_nodelay(&s->upstream.tcp, 1);
  if (s->state != PX_S_CONNECTING)
    return; /* already closing (a bad protocol header) */
  side_start_reading(&s->upstream);
  if (s->client.in && s->client.in->len > s->client.in->off) {
    process_input(s, &s->client);
    if (s->state != PX_S_CLOSED)
      settle_chunk(&s->client);
  }
  side_start_reading(&s->client);
}

static void connect_to(px_session *s, const struct sockaddr *sa) {
  memcpy(&s->upstream_sa, sa,
         sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                   : sizeof(struct sockaddr_in));
  int rc = uv_tcp_init(s->srv->loop, &s->upstream.tcp);
  if (rc == 0) {
    s->upstream.tcp.data = s;
    s->upstream.open = true;
    s->open_handles++;
    s->connect_req.data = s;
    rc = uv_tcp_connect(&s->connect_req, &s->upstream.tcp, sa, on_connect);
    if (rc == 0) {
      s->connect_pending = true;
      return;
    }
  }
  note_upstream_error(s, uv_strerror(rc));
  s->upstream_idx++;
  if (s->upstream.open)
    side_close(&s->upstream);
  else
    upstream_try_next(s);
}

static void on_resolved(uv_getaddrinfo_t *req, int status,
                        struct addrinfo *res) {
  px_session *s = req->data;
  s->gai_pending = false;
  if (s->state == PX_S_CLOSED) {
    uv_freeaddrinfo(res);
    if (s->open_handles == 0)
      session_free(s);
    return;
  }
  if (status < 0) {
    note_upstream_error(s, uv_strerror(status));
    s->upstream_idx++;
    upstream_try_next(s);
  } else {
    connect_to(s, res->ai_addr);
  }
  uv_freeaddrinfo(res);
}

static void upstream_try_next(px_session *s) {
  const px_config *cfg = s->srv->cfg;
  struct sockaddr_storage ss;

  if (s->upstream_idx >= cfg->n_upstreams) {
    px_error("upstream_unreachable", PX_U("id", s->id), PX_S("peer", s->peer),
             PX_S("tried", s->upstream_errors));
    px_session_close(s, PX_CR_NO_UPSTREAM);
    return;
  }
  const px_addr *a = &cfg->upstream[s->upstream_idx];
  px_addr_format(a, s->upstream_addr, sizeof s->upstream_addr);
  if (uv_ip4_addr(a->host, a->port, (struct sockaddr_in *)&ss) == 0 ||
      uv_ip6_addr(a->host, a->port, (struct sockaddr_in6 *)&ss) == 0) {
    connect_to(s, (struct sockaddr *)&ss);
    return;
  }
  char port[8];
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
  snprintf(port, sizeof port, "%u", (unsigned)a->port);
  s->gai.data = s;
  int rc =
      uv_getaddrinfo(s->srv->loop, &s->gai, on_resolved, a->host, port, &hints);
  if (rc == 0) {
    s->gai_pending = true;
    return;
  }
  note_upstream_error(s, uv_strerror(rc));
  s->upstream_idx++;
  upstream_try_next(s);
}

/* ---- accept ------------------------------------------------------------- */

static void on_handshake_timeout(uv_timer_t *t) {
  px_session *s = t->data;
  px_warn("handshake_timeout", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("state", px_state_name(s->state)),
          PX_U("timeout_ms", s->srv->cfg->handshake_timeout_ms));
  px_session_close(s, PX_CR_HANDSHAKE_TIMEOUT);
}

static void describe_peer(uv_tcp_t *tcp, char *out, size_t cap) {
  struct sockaddr_storage ss;
  int len = sizeof ss;
  char ip[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
      uv_ip6_name(a, ip, sizeof ip);
      port = ntohs(a->sin6_port);
      snprintf(out, cap, "[%s]:%u", ip, (unsigned)port);
      return;
    }
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    uv_ip4_name(a, ip, sizeof ip);
    port = ntohs(a->sin_port);
  }
  snprintf(out, cap, "%s:%u", ip, (unsigned)port);
}

int px_session_accept(px_server *srv, uv_stream_t *listener) {
  px_session *s = calloc(1, sizeof *s);
  if (!s)
    return UV_ENOMEM;
  s->srv = srv;
  s->client.s = s->upstream.s = s;
  s->client.name = "client";
  s->upstream.name = "upstream";
  int rc = uv_tcp_init(srv->loop, &s->client.tcp);
  if (rc < 0) {
    free(s);
    return rc;
  }
  s->client.tcp.data = s;
  s->client.open = true;
  s->open_handles = 1;
  rc = uv_accept(listener, (uv_stream_t *)&s->client.tcp);
  if (rc < 0) {
    s->state = PX_S_CLOSED;
    uv_close((uv_handle_t *)&s->client.tcp, on_handle_closed);
    return rc;
  }
  s->client.connected = true;
  uv_timer_init(srv->loop, &s->timer);
  s->timer.data = s;
  uv_timer_init(srv->loop, &s->retry_timer);
  s->retry_timer.data = s;
  uv_timer_init(srv->loop, &s->defer_timer);
  s->defer_timer.data = s;
  s->open_handles += 3;
  s->id = ++srv->next_id;
  s->started_ms = uv_now(srv->loop);
  s->state = PX_S_CONNECTING;
  describe_peer(&s->client.tcp, s->peer, sizeof s->peer);
  uv_tcp_nodelay(&s->client.tcp, 1);

  s->next = srv->sessions;
  if (srv->sessions)
    srv->sessions->prev = s;
  srv->sessions = s;
  srv->stats.sessions_total++;
  srv->stats.sessions_current++;
  px_debug("session_accept", PX_U("id", s->id), PX_S("peer", s->peer));

  uv_timer_start(&s->timer, on_handshake_timeout,
                 srv->cfg->handshake_timeout_ms, 0);
  side_start_reading(&s->client);
  upstream_try_next(s);
  return 0;
}

void px_session_drain(px_session *s) {
  if (s->state != PX_S_OPEN) {
    px_session_close(s, PX_CR_SHUTTING_DOWN);
    return;
  }
  s->draining = true;
  s->close_reason = PX_CR_SHUTTING_DOWN;
  px__tell_client(s, PX_CR_SHUTTING_DOWN);
}

void px__handshake_done(px_session *s) {
  uv_timer_stop(&s->timer);
}
