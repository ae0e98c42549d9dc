/* px_dlq.c - operations on dead-letter queues (px_dlq.h).
 *
 * States, every transition here:
 *   CONNECTING ──ready──▶ OPENING ──open-ok──▶ SELECTING (REDRIVE: confirms)
 *     ──select-ok──▶ RUNNING; without confirms OPENING ──open-ok──▶ RUNNING
 *   RUNNING ──the last get answered, every copy settled──▶ CLOSING
 *     (channel.close sent: the broker requeues what was not acked)
 *   CLOSING ──close-ok──▶ done
 *   any ──connection lost, channel closed by the broker, idle timeout──▶
 *     done (failed); the connection closes, the broker requeues
 * RUNNING starts with queue.declare passive (the count at the start, and a
 * clear 404), then the operation's own requests; COUNT stays there, the
 * channel opened again after each queue the broker refused.
 */
#define _DEFAULT_SOURCE /* explicit_bzero */
#include "px_dlq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "px_log.h"
#include "px_pub.h"

#define CH 1
#define FRAME_MAX 131072
/* Acks sent between two basic.gets, at most (see pump). */
#define ACKS_PER_GET 8

typedef enum dlq_state {
  ST_CONNECTING,
  ST_OPENING,
  ST_SELECTING,
  ST_RUNNING,
  ST_CLOSING,
  ST_DONE,
} dlq_state;

/* A copy waiting for its confirm. */
typedef struct dlq_flight {
  uint64_t tag; /* the message's delivery tag in the dead-letter queue */
  uint64_t bytes;
  bool confirmed;
  bool acked;    /* confirmed with basic.ack (not nack) */
  bool returned; /* the broker returned it: its message stays */
  char target[RETRY_NAME_MAX + 1];
} dlq_flight;

/* The message being read: a get-ok or a return, its header, its body. */
typedef struct dlq_content {
  bool active, is_return;
  bool held; /* a fence's message, taken after the last get: it stays */
  uint64_t tag;
  bool redelivered;
  char exchange[256], routing_key[256];
  char reply[256]; /* a return's reply text */
  uint8_t *header; /* the content header's payload */
  size_t header_len;
  amqp_content_header h;
  uint8_t *body;
  uint64_t body_len, body_got;
} dlq_content;

struct px_dlq {
  uv_loop_t *loop;
  px_clock *clock; /* its connection's dialer's */
  px_pub *pub;
  uv_timer_t timer;
  dlq_state state;
  bool cancelled;
  bool confirms;
  const px_dlq_events *ev;
  void *ctx;
  px_dlq_request req;
  char h_count[RETRY_NAME_MAX + 1], h_source[RETRY_NAME_MAX + 1],
      h_reason[RETRY_NAME_MAX + 1], h_redriven[RETRY_NAME_MAX + 1],
      h_healed[RETRY_NAME_MAX + 1];
  unsigned counted;     /* COUNT: queues answered */
  bool get_pending;     /* a basic.get is unanswered */
  bool fence;           /* ... and sent as a fence (see pump) */
  unsigned unfenced;    /* acks sent since the last basic.get */
  bool gets_done;       /* no more gets: empty, the limit, or a stop */
  bool stopped;         /* REDRIVE: a copy was returned */
  bool interrupted;     /* px_dlq_stop() */
  uint64_t gets;        /* get-oks */
  uint64_t seq;         /* copies published (the confirm sequence) */
  uint64_t seq_settled; /* copies before this one are all settled */
  uint64_t flight_bytes;
  dlq_flight flight[PX_DLQ_WINDOW];
  dlq_content msg;
  uint8_t *out; /* a frame being written (FRAME_MAX) */
  uint32_t frame_max;
  char blocked[256]; /* the broker's reason while it blocks publishing */
  px_dlq_result res;
  char error[1024];
};

/* ---- status table ---- */

static const struct {
  int exit_code, http;
  const char *text;
} statuses[] = {
#define PX__DLQ_STATUS_ROW(name, code, http, text) {code, http, text},
    PX_DLQ_STATUSES(PX__DLQ_STATUS_ROW)
#undef PX__DLQ_STATUS_ROW
};

int px_dlq_exit_code(px_dlq_status s) {
  return statuses[s].exit_code;
}

int px_dlq_http_status(px_dlq_status s) {
  return statuses[s].http;
}

const char *px_dlq_status_text(px_dlq_status s) {
  return statuses[s].text;
}

/* ---- the end ---- */

static void content_reset(dlq_content *m) {
  free(m->header);
  free(m->body);
  memset(m, 0, sizeof *m);
}

static void on_timer_closed(uv_handle_t *h) {
  px_dlq *d = h->data;
  content_reset(&d->msg);
  free(d->out);
  free(d);
}

/* Close the connection and the timer; freed in the timer's close
 * callback. */
static void release(px_dlq *d) {
  d->state = ST_DONE;
  px_pub_close(d->pub);
  d->pub = NULL;
  uv_close((uv_handle_t *)&d->timer, on_timer_closed);
}

/* A redrive's messages left in the queue: those taken and not acked, and
 * after a failure those it was to take and did not. */
static uint64_t not_moved(const px_dlq *d, px_dlq_status st) {
  uint64_t planned =
      d->req.limit && d->req.limit < d->res.total ? d->req.limit : d->res.total;
  uint64_t left = d->gets - d->res.moved;
  if (st != PX_DLQ_OK && planned > d->gets)
    left += planned - d->gets;
  return left;
}

static void finish(px_dlq *d, px_dlq_status st, uint16_t code,
                   const char *why) {
  if (d->state == ST_DONE)
    return;
  d->res.status = st;
  d->res.code = code;
  if (why != d->error)
    snprintf(d->error, sizeof d->error, "%s", why ? why : "");
  d->res.error = d->error;
  if (d->req.kind == PX_DLQ_REDRIVE && !d->req.dry_run) {
    d->res.not_moved = not_moved(d, st);
    d->res.unsettled = d->seq - d->seq_settled;
  }
  if (!d->cancelled && d->ev->done)
    d->ev->done(d->ctx, &d->res);
  release(d);
}

/* A refusal's reply code says which status it is. */
static px_dlq_status status_of(uint16_t code) {
  switch (code) {
  case 403: /* ACCESS_REFUSED: login, queue permissions */
  case 530: /* NOT_ALLOWED: the vhost */
    return PX_DLQ_REFUSED;
  case 404:
    return PX_DLQ_NOT_FOUND;
  default:
    return PX_DLQ_FAILED;
  }
}

void px_dlq_cancel(px_dlq *d) {
  if (!d || d->cancelled)
    return;
  if (d->state != ST_DONE && d->req.kind != PX_DLQ_COUNT &&
      d->req.kind != PX_DLQ_SHOW)
    px_warn("dlq_cancelled", PX_S("queue", d->req.queue),
            PX_U("moved", d->res.moved), PX_U("purged", d->res.purged),
            PX_U("unconfirmed", d->seq - d->seq_settled),
            PX_S("note", "copies the broker routed but had not confirmed "
                         "may now be in both queues"));
  d->cancelled = true;
  if (d->state != ST_DONE)
    release(d);
}

/* ---- writing ---- */

static int send_method(px_dlq *d, const amqp_method *m) {
  uint8_t buf[1024];
  long n = amqp_method_frame_write(buf, sizeof buf, CH, m);
  return n < 0 ? -1 : px_pub_write(d->pub, buf, (size_t)n);
}

static void send_or_fail(px_dlq *d, const amqp_method *m) {
  if (send_method(d, m) != 0)
    finish(d, PX_DLQ_FAILED, 0, "out of memory or the connection closed");
}

static void send_simple(px_dlq *d, uint32_t id) {
  amqp_method m;
  amqp_method_init(&m, id);
  send_or_fail(d, &m);
}

static void send_queue_method(px_dlq *d, uint32_t id, const char *queue) {
  amqp_method m;
  amqp_method_init(&m, id);
  if (id == AMQP_QUEUE_DECLARE) {
    m.args[AMQP_F_QUEUE_DECLARE_QUEUE].b = amqp_cstr(queue);
    m.args[AMQP_F_QUEUE_DECLARE_PASSIVE].u = 1;
  } else if (id == AMQP_QUEUE_PURGE) {
    m.args[AMQP_F_QUEUE_PURGE_QUEUE].b = amqp_cstr(queue);
  } else { /* basic.get */
    m.args[AMQP_F_BASIC_GET_QUEUE].b = amqp_cstr(queue);
    m.args[AMQP_F_BASIC_GET_NO_ACK].u = d->req.kind == PX_DLQ_PURGE;
  }
  send_or_fail(d, &m);
}

static void settle(px_dlq *d, uint64_t tag) {
  amqp_method m;
  amqp_method_init(&m, AMQP_BASIC_ACK);
  m.args[AMQP_F_BASIC_ACK_DELIVERY_TAG].u = tag;
  send_or_fail(d, &m);
  d->unfenced++;
}

static void close_channel(px_dlq *d) {
  amqp_method m;
  amqp_method_init(&m, AMQP_CHANNEL_CLOSE);
  m.args[AMQP_F_CHANNEL_CLOSE_REPLY_CODE].u = AMQP_REPLY_SUCCESS;
  m.args[AMQP_F_CHANNEL_CLOSE_REPLY_TEXT].b = amqp_cstr("rebound dlq: done");
  d->state = ST_CLOSING;
  send_or_fail(d, &m);
}

/* The copy's headers: the message's, without the retry count, the
 * dead-letter reason and an earlier redriven-at, with redriven-at now.
 * A healed tier copy keeps them all (but the broker's delivery count), with
 * tier-healed-at now. */
static int redrive_headers(px_dlq *d, amqp_bytes src, amqp_writer *w) {
  const char *drop_redrive[] = {d->h_count, d->h_reason, d->h_redriven,
                                "x-delivery-count"};
  const char *drop_heal[] = {d->h_healed, "x-delivery-count"};
  const char **drop = d->req.heal ? drop_heal : drop_redrive;
  size_t ndrop = d->req.heal ? sizeof drop_heal / sizeof drop_heal[0]
                             : sizeof drop_redrive / sizeof drop_redrive[0];
  amqp_table_iter it;
  amqp_bytes key;
  amqp_field v;
  int rc;
  amqp_table_iter_init(&it, src);
  while ((rc = amqp_table_next(&it, &key, &v)) > 0) {
    bool keep = true;
    for (size_t i = 0; i < ndrop; i++)
      keep = keep && !(key.len == strlen(drop[i]) &&
                       memcmp(key.ptr, drop[i], key.len) == 0);
    if (keep)
      amqp_table_write_entry(w, key, &v);
  }
  amqp_field now = amqp_field_timestamp((uint64_t)time(NULL));
  amqp_table_write_entry(
      w, amqp_cstr(d->req.heal ? d->h_healed : d->h_redriven), &now);
  return rc == 0 && !w->failed ? 0 : -1;
}

static int write_frame(px_dlq *d, uint8_t type, amqp_bytes payload) {
  long n = amqp_frame_write(d->out, FRAME_MAX + 8, type, CH, payload);
  return n < 0 ? -1 : px_pub_write(d->pub, d->out, (size_t)n);
}

/* basic.publish of the current message to `target`, its header rewritten,
 * its body in frames of the negotiated size. */
static int publish_copy(px_dlq *d, const char *target) {
  dlq_content *c = &d->msg;
  size_t cap = c->h.props.headers.len + RETRY_NAME_MAX + 64;
  uint8_t *tbl = malloc(cap), *hdr = malloc(c->header_len + cap + 64);
  amqp_writer tw = amqp_writer_make(tbl, cap);
  int rc = tbl && hdr ? redrive_headers(d, c->h.props.headers, &tw) : -1;
  amqp_content_header h = c->h;
  h.props.flags |= AMQP_P_HEADERS;
  h.props.headers = (amqp_bytes){tbl, tw.len};
  amqp_writer hw = amqp_writer_make(hdr, c->header_len + cap + 64);
  if (rc == 0 && amqp_content_header_encode(&h, &hw) != AMQP_OK)
    rc = -1;
  amqp_method m;
  amqp_method_init(&m, AMQP_BASIC_PUBLISH);
  m.args[AMQP_F_BASIC_PUBLISH_ROUTING_KEY].b = amqp_cstr(target);
  m.args[AMQP_F_BASIC_PUBLISH_MANDATORY].u = 1;
  if (rc == 0)
    rc = send_method(d, &m);
  if (rc == 0)
    rc = write_frame(d, AMQP_FRAME_HEADER, (amqp_bytes){hdr, hw.len});
  size_t step = d->frame_max - AMQP_FRAME_OVERHEAD;
  for (uint64_t off = 0; rc == 0 && off < c->body_len; off += step) {
    uint64_t k = c->body_len - off < step ? c->body_len - off : step;
    rc =
        write_frame(d, AMQP_FRAME_BODY, (amqp_bytes){c->body + off, (size_t)k});
  }
  free(tbl);
  free(hdr);
  return rc;
}

/* ---- the operations ---- */

static void count_next(px_dlq *d) {
  if (d->counted >= d->req.nqueues) {
    finish(d, PX_DLQ_OK, 0, NULL);
    return;
  }
  send_queue_method(d, AMQP_QUEUE_DECLARE, d->req.queues[d->counted]);
}

/* Room for another get: one slot of the window is kept for a fence. */
static bool window_full(const px_dlq *d) {
  return d->seq - d->seq_settled >= PX_DLQ_WINDOW - 1 ||
         d->flight_bytes >= PX_DLQ_WINDOW_BYTES;
}

/* How a run that took what it could ends. */
static px_dlq_status end_status(const px_dlq *d) {
  return d->stopped       ? PX_DLQ_NOT_FOUND
         : d->interrupted ? PX_DLQ_FAILED
                          : PX_DLQ_OK;
}

static bool oldest_confirmed(const px_dlq *d) {
  return d->seq_settled < d->seq &&
         d->flight[d->seq_settled % PX_DLQ_WINDOW].confirmed;
}

/* Confirmed copies, oldest first, up to the acks a get may follow: a
 * copy the broker acked has its message acked in the dead-letter queue,
 * unless the broker returned it (it went nowhere: the message stays). */
static void settle_confirmed(px_dlq *d) {
  while (oldest_confirmed(d) && d->unfenced < ACKS_PER_GET) {
    dlq_flight *f = &d->flight[d->seq_settled % PX_DLQ_WINDOW];
    if (!f->acked)
      d->res.nacked++;
    if (f->acked && !f->returned) {
      settle(d, f->tag);
      if (d->state == ST_DONE)
        return;
      d->res.moved++;
      if (d->ev->progress && !d->cancelled)
        d->ev->progress(d->ctx, d->res.moved, d->res.total);
    }
    d->flight_bytes -= f->bytes;
    d->seq_settled++;
  }
}

static void send_get(px_dlq *d, bool fence) {
  d->get_pending = true;
  d->fence = fence;
  d->unfenced = 0;
  send_queue_method(d, AMQP_BASIC_GET, d->req.queue);
}

/* Acks, then the next get, or the end once every copy is settled.
 *
 * Every basic.get is also a fence for the acks sent before it. A quorum
 * queue answers a get with a message only after applying everything the
 * channel sent it earlier, acks included; but its client in the broker's
 * channel holds back acks once a few dozen are unapplied, and drops those
 * it holds back when the channel closes: their messages come back into
 * the dead-letter queue while their copies are in the source queue too.
 * So at most ACKS_PER_GET acks go out before a get, and a run's last
 * acks are followed by one more get (a fence) before the channel closes.
 * A message a fence takes after the run's last get stays (it comes back
 * marked redelivered); during the run it is one more get, in the window's
 * kept slot. */
static void pump(px_dlq *d) {
  if (d->state != ST_RUNNING || d->get_pending || d->msg.active)
    return; /* a message still arriving takes its place in the window */
  settle_confirmed(d);
  if (d->state != ST_RUNNING)
    return;
  if ((d->req.limit && d->gets >= d->req.limit) || d->gets >= d->res.total)
    d->gets_done = true; /* what came later waits for the next run */
  if (!d->gets_done && !window_full(d)) {
    send_get(d, false);
  } else if (d->unfenced && (oldest_confirmed(d) ||
                             (d->gets_done && d->seq_settled == d->seq))) {
    send_get(d, true);
  } else if (d->gets_done && d->seq_settled == d->seq) {
    if (d->stopped || d->interrupted)
      finish(d, end_status(d), 0, d->error);
    else if (d->req.kind == PX_DLQ_PURGE)
      finish(d, PX_DLQ_OK, 0, NULL);
    else
      close_channel(d); /* browsed messages go back: done at close-ok */
  }
}

/* Where a message goes back to: --to, or its source-queue header. */
static bool redrive_target(px_dlq *d, char *out, size_t cap) {
  amqp_field f;
  if (d->req.to[0]) {
    snprintf(out, cap, "%s", d->req.to);
    return true;
  }
  if (amqp_table_get(d->msg.h.props.headers, amqp_cstr(d->h_source), &f) !=
          AMQP_OK ||
      (f.type != 'S' && f.type != 's') || f.v.bytes.len == 0 ||
      f.v.bytes.len >= cap)
    return false;
  memcpy(out, f.v.bytes.ptr, f.v.bytes.len);
  out[f.v.bytes.len] = '\0';
  return strcmp(out, d->req.queue) != 0; /* never back where it is */
}

static void redrive_one(px_dlq *d) {
  char target[RETRY_NAME_MAX + 1];
  if (!redrive_target(d, target, sizeof target)) {
    d->res.unsourced++; /* stays: requeued when the channel closes */
    px_warn("dlq_no_source_queue", PX_S("queue", d->req.queue),
            PX_U("message", d->gets),
            PX_S("note", "no source-queue header (or the dead-letter queue "
                         "itself): redrive it with a target"));
    return;
  }
  if (publish_copy(d, target) != 0) {
    finish(d, PX_DLQ_FAILED, 0, "out of memory or the connection closed");
    return;
  }
  dlq_flight *f = &d->flight[d->seq % PX_DLQ_WINDOW];
  d->seq++;
  f->tag = d->msg.tag;
  f->bytes = d->msg.body_len + d->msg.header_len;
  f->confirmed = f->acked = f->returned = false;
  snprintf(f->target, sizeof f->target, "%s", target);
  d->flight_bytes += f->bytes;
}

/* A return names its copy's queue, not the copy: it is the oldest copy in
 * flight to that queue not yet matched (the broker returns a channel's
 * unroutable publishes in order, each before its confirm). Not found
 * (cannot happen): every copy in flight stays. */
static void copy_returned(px_dlq *d, const char *target) {
  for (uint64_t s = d->seq_settled; s < d->seq; s++) {
    dlq_flight *f = &d->flight[s % PX_DLQ_WINDOW];
    if (!f->confirmed && !f->returned && strcmp(f->target, target) == 0) {
      f->returned = true;
      return;
    }
  }
  for (uint64_t s = d->seq_settled; s < d->seq; s++)
    d->flight[s % PX_DLQ_WINDOW].returned = true;
}

static px_dlq_message message_of(const px_dlq *d) {
  const dlq_content *c = &d->msg;
  return (px_dlq_message){d->gets,
                          c->redelivered,
                          amqp_cstr(c->exchange),
                          amqp_cstr(c->routing_key),
                          &c->h,
                          c->body,
                          c->body_len};
}

/* A whole message (get-ok, header, body) has arrived. */
static void message_done(px_dlq *d) {
  dlq_content *c = &d->msg;
  c->active = false;
  if (c->held) {
    /* a fence's: requeued when the channel closes */
  } else if (c->is_return) {
    d->stopped = d->gets_done = true;
    copy_returned(d, c->routing_key);
    snprintf(d->error, sizeof d->error,
             "no queue '%s' to move messages into (the broker returned a copy: "
             "%s); the messages not yet moved stay in %s",
             c->routing_key, c->reply, d->req.queue);
  } else if (d->req.kind == PX_DLQ_PURGE) {
    d->res.purged++;
    if (d->ev->progress)
      d->ev->progress(d->ctx, d->res.purged, d->res.total);
  } else if (d->req.kind == PX_DLQ_SHOW || d->req.dry_run) {
    d->res.browsed++;
    px_dlq_message m = message_of(d);
    if (d->ev->message)
      d->ev->message(d->ctx, &m);
  } else if (!d->stopped && !d->interrupted && !d->cancelled) {
    px_dlq_message m = message_of(d);
    if (d->ev->take && !d->ev->take(d->ctx, &m))
      d->gets_done = true; /* it and the rest stay */
    else
      redrive_one(d);
  } /* after a return nothing more is published: the message stays */
  free(c->header);
  free(c->body);
  c->header = c->body = NULL;
  if (d->state != ST_DONE)
    pump(d);
}

/* Confirms: copies up to `tag` (or just it); pump settles them. */
static void confirmed(px_dlq *d, uint64_t tag, bool multiple, bool ack) {
  uint64_t last = tag < d->seq ? tag : d->seq; /* no more than we sent */
  for (uint64_t s = multiple ? d->seq_settled + 1 : tag; s <= last; s++) {
    if (s <= d->seq_settled || s > d->seq)
      continue;
    dlq_flight *f = &d->flight[(s - 1) % PX_DLQ_WINDOW];
    if (!f->confirmed) {
      f->confirmed = true;
      f->acked = ack;
    }
  }
  pump(d);
}

/* ---- reading ---- */

static void copy_short(char *out, amqp_bytes b) {
  memcpy(out, b.ptr, b.len); /* a shortstr: at most 255 */
  out[b.len] = '\0';
}

static void content_begin(px_dlq *d, const amqp_method *m) {
  dlq_content *c = &d->msg;
  content_reset(c);
  c->active = true;
  if (m->id == AMQP_BASIC_RETURN) {
    c->is_return = true;
    copy_short(c->reply, m->args[AMQP_F_BASIC_RETURN_REPLY_TEXT].b);
    copy_short(c->routing_key, m->args[AMQP_F_BASIC_RETURN_ROUTING_KEY].b);
    return;
  }
  c->held = d->fence && d->gets_done;
  d->get_pending = d->fence = false;
  if (!c->held)
    d->gets++;
  c->tag = m->args[AMQP_F_BASIC_GET_OK_DELIVERY_TAG].u;
  c->redelivered = m->args[AMQP_F_BASIC_GET_OK_REDELIVERED].u;
  copy_short(c->exchange, m->args[AMQP_F_BASIC_GET_OK_EXCHANGE].b);
  copy_short(c->routing_key, m->args[AMQP_F_BASIC_GET_OK_ROUTING_KEY].b);
}

static void content_header(px_dlq *d, const amqp_frame *f) {
  dlq_content *c = &d->msg;
  if (!c->active || c->header) {
    finish(d, PX_DLQ_FAILED, 0, "the broker sent an unexpected frame");
    return;
  }
  c->header = malloc(f->payload.len ? f->payload.len : 1);
  if (!c->header) {
    finish(d, PX_DLQ_FAILED, 0, "out of memory");
    return;
  }
  memcpy(c->header, f->payload.ptr, f->payload.len);
  c->header_len = f->payload.len;
  if (amqp_content_header_decode((amqp_bytes){c->header, c->header_len},
                                 &c->h) != AMQP_OK ||
      c->h.body_size > PX_DLQ_MAX_BODY) {
    finish(d, PX_DLQ_FAILED, 0, "a message rebound cannot read (header)");
    return;
  }
  c->body_len = c->h.body_size;
  c->body = malloc(c->body_len ? (size_t)c->body_len : 1);
  if (!c->body)
    finish(d, PX_DLQ_FAILED, 0, "out of memory");
  else if (c->body_len == 0)
    message_done(d);
}

static void content_body(px_dlq *d, const amqp_frame *f) {
  dlq_content *c = &d->msg;
  if (!c->active || !c->header || f->payload.len > c->body_len - c->body_got) {
    finish(d, PX_DLQ_FAILED, 0, "the broker sent an unexpected frame");
    return;
  }
  memcpy(c->body + c->body_got, f->payload.ptr, f->payload.len);
  c->body_got += f->payload.len;
  if (c->body_got == c->body_len)
    message_done(d);
}

/* RUNNING begins: the queue's count, then the operation. */
static void running(px_dlq *d) {
  d->state = ST_RUNNING;
  if (d->req.kind == PX_DLQ_COUNT)
    count_next(d);
  else
    send_queue_method(d, AMQP_QUEUE_DECLARE, d->req.queue);
}

static void declared(px_dlq *d, const amqp_method *m) {
  uint32_t n = (uint32_t)m->args[AMQP_F_QUEUE_DECLARE_OK_MESSAGE_COUNT].u;
  if (d->req.kind == PX_DLQ_COUNT) {
    px_dlq_count c = {
        d->req.queues[d->counted], true, n,
        (uint32_t)m->args[AMQP_F_QUEUE_DECLARE_OK_CONSUMER_COUNT].u, NULL};
    d->counted++;
    if (d->ev->count)
      d->ev->count(d->ctx, &c);
    count_next(d);
    return;
  }
  d->res.total = n;
  if (d->req.kind == PX_DLQ_PURGE && d->req.limit == 0)
    send_queue_method(d, AMQP_QUEUE_PURGE, d->req.queue);
  else
    pump(d);
}

/* The broker closed the channel. COUNT notes the queue and goes on on a
 * channel opened again; anything else ends. */
static void channel_closed(px_dlq *d, const amqp_method *m) {
  uint16_t code = (uint16_t)m->args[AMQP_F_CHANNEL_CLOSE_REPLY_CODE].u;
  amqp_bytes t = m->args[AMQP_F_CHANNEL_CLOSE_REPLY_TEXT].b;
  char text[300];
  snprintf(text, sizeof text, "%.*s", (int)t.len, (const char *)t.ptr);
  send_simple(d, AMQP_CHANNEL_CLOSE_OK);
  if (d->state == ST_DONE)
    return;
  if (d->req.kind == PX_DLQ_COUNT && d->state == ST_RUNNING &&
      (code == 404 || code == 403 || code == 405)) {
    px_dlq_count c = {d->req.queues[d->counted], false, 0, 0,
                      code != 404 ? text : NULL, code};
    d->counted++;
    if (d->ev->count)
      d->ev->count(d->ctx, &c);
    d->state = ST_OPENING;
    send_simple(d, AMQP_CHANNEL_OPEN);
    return;
  }
  finish(d, status_of(code), code, text);
}

static void method(px_dlq *d, const amqp_method *m) {
  switch (m->id) {
  case AMQP_CHANNEL_OPEN_OK:
    if (d->confirms && d->state == ST_OPENING) {
      d->state = ST_SELECTING;
      send_simple(d, AMQP_CONFIRM_SELECT);
    } else {
      running(d);
    }
    return;
  case AMQP_CONFIRM_SELECT_OK:
    running(d);
    return;
  case AMQP_QUEUE_DECLARE_OK:
    declared(d, m);
    return;
  case AMQP_QUEUE_PURGE_OK:
    d->res.purged = m->args[AMQP_F_QUEUE_PURGE_OK_MESSAGE_COUNT].u;
    finish(d, PX_DLQ_OK, 0, NULL);
    return;
  case AMQP_BASIC_GET_OK:
  case AMQP_BASIC_RETURN:
    content_begin(d, m);
    return;
  case AMQP_BASIC_GET_EMPTY:
    d->get_pending = d->fence = false;
    d->gets_done = true;
    pump(d);
    return;
  case AMQP_BASIC_ACK:
    confirmed(d, m->args[AMQP_F_BASIC_ACK_DELIVERY_TAG].u,
              m->args[AMQP_F_BASIC_ACK_MULTIPLE].u, true);
    return;
  case AMQP_BASIC_NACK:
    confirmed(d, m->args[AMQP_F_BASIC_NACK_DELIVERY_TAG].u,
              m->args[AMQP_F_BASIC_NACK_MULTIPLE].u, false);
    return;
  case AMQP_CHANNEL_CLOSE:
    channel_closed(d, m);
    return;
  case AMQP_CHANNEL_CLOSE_OK:
    if (d->state == ST_CLOSING)
      finish(d, end_status(d), 0, d->error);
    return;
  default:
    return;
  }
}

static void on_idle(uv_timer_t *t) {
  px_dlq *d = t->data;
  char why[400];
  snprintf(why, sizeof why, "no answer from the broker within %ums%s%s",
           (unsigned)PX_DLQ_IDLE_MS,
           d->blocked[0] ? ": it blocks publishing: " : "", d->blocked);
  finish(d, d->state == ST_CONNECTING ? PX_DLQ_UNREACHABLE : PX_DLQ_FAILED, 0,
         why);
}

static void pub_frame(void *ctx, const amqp_frame *f) {
  px_dlq *d = ctx;
  amqp_method m;
  uv_timer_start(&d->timer, on_idle, PX_DLQ_IDLE_MS, 0);
  if (f->channel != CH)
    return;
  if (f->type == AMQP_FRAME_HEADER) {
    content_header(d, f);
  } else if (f->type == AMQP_FRAME_BODY) {
    content_body(d, f);
  } else if (f->type == AMQP_FRAME_METHOD) {
    if (amqp_method_decode_flags(f->payload, &m, AMQP_DECODE_OPAQUE_TABLES) !=
        AMQP_OK)
      finish(d, PX_DLQ_FAILED, 0, "the broker sent a bad frame");
    else
      method(d, &m);
  }
}

static void pub_ready(void *ctx) {
  px_dlq *d = ctx;
  d->frame_max = px_pub_frame_max(d->pub);
  d->state = ST_OPENING;
  d->res.logged_in = true;
  uv_timer_start(&d->timer, on_idle, PX_DLQ_IDLE_MS, 0);
  send_simple(d, AMQP_CHANNEL_OPEN);
}

static void pub_blocked(void *ctx, bool blocked, amqp_bytes reason) {
  px_dlq *d = ctx;
  snprintf(d->blocked, sizeof d->blocked, "%.*s", blocked ? (int)reason.len : 0,
           (const char *)reason.ptr);
  if (blocked && !d->blocked[0])
    snprintf(d->blocked, sizeof d->blocked, "no reason given");
}

static void pub_lost(void *ctx, const char *why, uint16_t code,
                     amqp_bytes text) {
  px_dlq *d = ctx;
  char msg[600];
  snprintf(msg, sizeof msg, "%s%s%.*s", why, text.len ? ": " : "",
           (int)text.len, (const char *)text.ptr);
  px_dlq_status st = code ? status_of(code) : PX_DLQ_FAILED;
  if (strcmp(why, "no upstream reachable") == 0 ||
      (d->state == ST_CONNECTING && !code))
    st = PX_DLQ_UNREACHABLE;
  finish(d, st, code, msg);
}

static const px_pub_events pub_events = {pub_ready, pub_frame, pub_blocked,
                                         pub_lost};

/* Header names under the configured prefix. */
static int header_names(px_dlq *d, const px_config *cfg) {
  const retry_policy *p = &cfg->retry;
  return retry_header_name(p, "retry-count", d->h_count, sizeof d->h_count) <
                     0 ||
                 retry_header_name(p, "source-queue", d->h_source,
                                   sizeof d->h_source) < 0 ||
                 retry_header_name(p, "dead-letter-reason", d->h_reason,
                                   sizeof d->h_reason) < 0 ||
                 retry_header_name(p, "redriven-at", d->h_redriven,
                                   sizeof d->h_redriven) < 0 ||
                 retry_header_name(p, "tier-healed-at", d->h_healed,
                                   sizeof d->h_healed) < 0
             ? -1
             : 0;
}

/* Log in as the request's user, PLAIN ("\0user\0password"). */
static px_pub *dial(px_dlq *d, const px_config *cfg, px_dial_memory *memory,
                    struct px_tls_ctx *tls) {
  uint8_t plain[1 + 255 + 1 + 255];
  size_t u = strlen(d->req.user), p = strlen(d->req.password);
  plain[0] = 0;
  memcpy(plain + 1, d->req.user, u);
  plain[1 + u] = 0;
  memcpy(plain + 2 + u, d->req.password, p);
  px_pub_login login = {.mechanism = amqp_cstr("PLAIN"),
                        .response = {plain, 2 + u + p},
                        .locale = amqp_cstr("en_US"),
                        .vhost = amqp_cstr(d->req.vhost),
                        .frame_max = FRAME_MAX,
                        .timeout_ms = cfg->connect_timeout_ms * 2 + 10000,
                        .name = d->req.name ? d->req.name : "rebound dlq"};
  px_pub *pub =
      px_pub_dial(d->loop, d->clock, cfg, memory, tls, &login, &pub_events, d);
  explicit_bzero(plain, sizeof plain);
  explicit_bzero(d->req.password, sizeof d->req.password);
  return pub;
}

void px_dlq_stop(px_dlq *d) {
  if (!d || d->cancelled || d->interrupted || d->state == ST_DONE)
    return;
  if (d->req.kind == PX_DLQ_PURGE && !d->req.limit)
    return; /* one queue.purge: its answer says what it removed */
  d->interrupted = d->gets_done = true;
  snprintf(d->error, sizeof d->error,
           "interrupted: what was taken and not moved stays in %s",
           d->req.queue);
  if (d->state == ST_RUNNING)
    pump(d); /* the end once the copies in flight are settled */
  else if (d->state != ST_CLOSING)
    finish(d, PX_DLQ_FAILED, 0, d->error);
}

int px_dlq_add_queue(px_dlq_request *q, const char *name) {
  for (unsigned i = 0; i < q->nqueues; i++)
    if (strcmp(q->queues[i], name) == 0)
      return 0;
  if (q->nqueues >= PX_DLQ_MAX_QUEUES || strlen(name) > RETRY_NAME_MAX)
    return -1;
  strcpy(q->queues[q->nqueues++], name);
  return 0;
}

void px_dlq_add_policy_queues(px_dlq_request *q, const retry_policy *p) {
  char dlq[RETRY_NAME_MAX + 1];
  for (unsigned r = 0; r < p->nrules; r++)
    for (unsigned g = 0; g < p->rules[r].nglobs; g++) {
      const char *name = p->rules[r].globs[g];
      if (!strpbrk(name, "*?") &&
          retry_dlq_name(&p->rules[r], name, strlen(name), dlq, sizeof dlq) >=
              0)
        px_dlq_add_queue(q, dlq);
    }
}

px_dlq *px_dlq_start(uv_loop_t *loop, px_clock *clock, const px_config *cfg,
                     px_dial_memory *memory, struct px_tls_ctx *tls,
                     const px_dlq_request *req, const px_dlq_events *ev,
                     void *ctx) {
  px_dlq *d = calloc(1, sizeof *d);
  if (!d || !(d->out = malloc(FRAME_MAX + 8)) || header_names(d, cfg) != 0) {
    if (d)
      free(d->out);
    free(d);
    return NULL;
  }
  d->loop = loop;
  d->clock = clock;
  d->req = *req;
  d->ev = ev;
  d->ctx = ctx;
  d->confirms = req->kind == PX_DLQ_REDRIVE && !req->dry_run;
  d->frame_max = FRAME_MAX;
  uv_timer_init(loop, &d->timer);
  d->timer.data = d;
  d->pub = dial(d, cfg, memory, tls);
  d->req.name = NULL; /* the caller's, used only here */
  if (!d->pub) {
    uv_close((uv_handle_t *)&d->timer, on_timer_closed);
    return NULL;
  }
  return d;
}
