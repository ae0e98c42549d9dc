/* px_track.c - consumers, basic.get requests and unsettled deliveries of a
 * channel, and the copies of deliveries kept for retry (px_track.h). */
#include <stdlib.h>
#include <string.h>

#include "px_counters.h"
#include "px_log.h"
#include "px_server.h"
#include "px_session.h"
#include "px_track.h"

/* Per channel at most: unsettled deliveries and requests in flight (past
 * them the channel is `lost`: multiple-nacks pass), and consumers. */
#define PX_TRACK_MAX 65536
#define PX_TRACK_MAX_CONSUMERS 4096

static char *dup_bytes(amqp_bytes b) {
  char *p = malloc(b.len + 1);
  if (p) {
    if (b.len)
      memcpy(p, b.ptr, b.len);
    p[b.len] = '\0';
  }
  return p;
}

/* ---- cache accounting --------------------------------------------------- */

/* Reserve `n` bytes of both cache bounds; compared as remaining space, so
 * no sum can overflow. */
static bool cache_reserve(px_session *s, uint64_t n) {
  const px_config *cfg = s->srv->cfg;
  if (s->cache_bytes > cfg->cache_per_connection ||
      n > cfg->cache_per_connection - s->cache_bytes ||
      s->srv->stats.cache_bytes > s->srv->cache_total ||
      n > s->srv->cache_total - s->srv->stats.cache_bytes)
    return false;
  s->cache_bytes += n;
  s->srv->stats.cache_bytes += n;
  s->srv->stats.cache_entries++;
  return true;
}

static void cache_unreserve(px_session *s, uint64_t n) {
  s->cache_bytes -= n;
  s->srv->stats.cache_bytes -= n;
  s->srv->stats.cache_entries--;
}

void px_track_release(px_session *s, px_delivery *d) {
  uint64_t tag = d->tag;
  if (d->header_len)
    cache_unreserve(s, (uint64_t)d->header_len + d->body_len);
  free(d->names);
  memset(d, 0, sizeof *d);
  d->tag = tag; /* the ring stays sorted by tag */
}

/* A delivery whose content cannot be kept (`header`: its content header):
 * counted by queue and logged with its message id, at most one line per
 * PX_LOG_LIMIT_MS (with how many were not logged). Its names stay, for
 * the delayed requeue's log line. */
static void uncache(px_session *s, px_delivery *d, const char *why,
                    amqp_bytes header) {
  static px_log_limit limit;
  uint64_t unlogged;
  amqp_content_header h;
  amqp_bytes id = {NULL, 0};
  s->srv->stats.uncached_deliveries++;
  px_metrics_inc(s->srv, PX_M_NOT_KEPT, d->names, why);
  if (px_log_limit_pass(&limit, px_clock_us(&s->srv->clock) / 1000,
                        &unlogged)) {
    if (amqp_content_header_decode(header, &h) == AMQP_OK &&
        (h.props.flags & AMQP_P_MESSAGE_ID))
      id = h.props.message_id;
    px_warn("delivery_not_cached", PX_U("id", s->id), PX_S("peer", s->peer),
            PX_S("queue", d->names), PX_B("message_id", id.ptr, id.len),
            PX_U("delivery_tag", d->tag), PX_S("reason", why),
            PX_U("cache_bytes", s->cache_bytes), PX_U("unlogged", unlogged),
            PX_S("note", "not kept for a retry: its requeue goes to the "
                         "broker after the tier delay, uncounted"));
  }
  char *names = realloc(d->names, d->names_len); /* the content's room */
  if (names)
    d->names = names;
  d->state = PX_DL_UNCACHED;
}

/* ---- the ring of unsettled deliveries ------------------------------------ */

/* Index of the first entry whose tag is >= `tag` (n when none). */
static uint32_t dl_lower_bound(const px_track *t, uint64_t tag) {
  uint32_t lo = 0, hi = t->dl.r.n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (px_dl_at(t, mid)->tag < tag)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

px_delivery *px_track_find(px_chan *c, uint64_t tag) {
  const px_track *t = &c->track;
  if (!t->dl.r.n)
    return NULL;
  /* tags mostly follow one another: try the index they would have */
  uint64_t first = px_dl_at(t, 0)->tag;
  if (tag >= first && tag - first < t->dl.r.n) {
    px_delivery *d = px_dl_at(t, (uint32_t)(tag - first));
    if (d->tag == tag)
      return d->state != PX_DL_GONE ? d : NULL;
  }
  uint32_t i = dl_lower_bound(t, tag);
  if (i == t->dl.r.n)
    return NULL;
  px_delivery *d = px_dl_at(t, i);
  return d->tag == tag && d->state != PX_DL_GONE ? d : NULL;
}

uint32_t px_track_upto(const px_chan *c, uint64_t tag) {
  return tag == 0 ? c->track.dl.r.n : dl_lower_bound(&c->track, tag + 1);
}

uint32_t px_track_index(const px_chan *c, uint64_t tag) {
  return dl_lower_bound(&c->track, tag);
}

/* Squeeze the holes out, keeping the order. */
static void dl_compact(px_track *t) {
  uint32_t j = 0;
  for (uint32_t i = 0; i < t->dl.r.n; i++) {
    px_delivery *d = px_dl_at(t, i);
    if (d->state != PX_DL_GONE) {
      if (i != j)
        *px_dl_at(t, j) = *d;
      j++;
    }
  }
  t->dl.r.n = j;
  t->dl.ngone = 0;
}

void px_track_tidy(px_chan *c) {
  px_track *t = &c->track;
  while (t->dl.r.n && px_dl_at(t, 0)->state == PX_DL_GONE) {
    px_ring_drop(&t->dl.r, 1);
    t->dl.ngone--;
  }
  while (t->dl.r.n && px_dl_at(t, t->dl.r.n - 1)->state == PX_DL_GONE) {
    t->dl.r.n--;
    t->dl.ngone--;
  }
  if (t->dl.ngone > 16 && t->dl.ngone > t->dl.r.n / 2)
    dl_compact(t);
}

void px_track_forget(px_session *s, px_chan *c, px_delivery *d) {
  if (c->track.capture == d->tag)
    c->track.capture = 0;
  px_track_release(s, d);
  d->state = PX_DL_GONE;
  c->track.dl.ngone++;
}

void px_track_observe(px_session *s, const px_delivery *d) {
  if (d->state != PX_DL_RETRYING && d->state != PX_DL_DEFERRED)
    /* else observed when it was nacked */
    px_metrics_observe(s->srv, PX_H_PROCESSING, d->qid,
                       px_clock_us(&s->srv->clock) - d->delivered_us);
}

void px_track_settle(px_session *s, px_chan *c, uint64_t tag, bool multiple) {
  px_track *t = &c->track;
  if (!multiple) {
    px_delivery *d = px_track_find(c, tag);
    if (d) {
      px_track_observe(s, d);
      px_track_forget(s, c, d);
      px_track_tidy(c);
    }
    return;
  }
  uint32_t n = px_track_upto(c, tag);
  for (uint32_t i = 0; i < n; i++) {
    px_delivery *d = px_dl_at(t, i);
    if (d->state != PX_DL_GONE) {
      px_track_observe(s, d);
      px_track_forget(s, c, d);
    }
  }
  px_track_tidy(c);
}

void px_track_clear(px_session *s, px_chan *c) {
  px_track *t = &c->track;
  for (uint32_t i = 0; i < t->dl.r.n; i++)
    if (px_dl_at(t, i)->state != PX_DL_GONE)
      px_track_release(s, px_dl_at(t, i));
  px_ring_free(&t->dl.r);
  t->dl.ngone = 0;
  t->capture = 0;
  t->lost = false;
  t->nexpired = 0;
}

/* Room for one more entry at the tail; false when the ring is at its
 * bound (or out of memory). */
static bool dl_make_room(px_track *t) {
  if (t->dl.r.n == t->dl.r.cap && t->dl.ngone)
    dl_compact(t);
  return px_ring_reserve(&t->dl.r, sizeof(px_delivery), PX_TRACK_MAX) == 0;
}

/* Copy the names a copy's headers need: queue NUL exchange NUL key NUL
 * (each at most 255 bytes: shortstrs and a queue name). */
static char *dl_names(px_track *t, px_delivery *d, const char *queue,
                      amqp_bytes exchange, amqp_bytes routing_key) {
  size_t ql = strlen(queue);
  d->names_len = (uint16_t)(ql + exchange.len + routing_key.len + 3);
  char *p = malloc(d->names_len + (size_t)t->content_hint);
  if (!p)
    return NULL;
  memcpy(p, queue, ql + 1);
  if (exchange.len)
    memcpy(p + ql + 1, exchange.ptr, exchange.len);
  p[ql + 1 + exchange.len] = '\0';
  char *k = p + ql + exchange.len + 2;
  if (routing_key.len)
    memcpy(k, routing_key.ptr, routing_key.len);
  k[routing_key.len] = '\0';
  return p;
}

/* Track a delivery; with a rule, also start keeping its content (`queue`,
 * `exchange` and `routing_key` are then needed for the copy's headers). */
static px_delivery *new_delivery(px_session *s, px_chan *c, uint64_t tag,
                                 uint32_t gen, int qid, const retry_rule *rule,
                                 const char *queue, amqp_bytes exchange,
                                 amqp_bytes routing_key) {
  px_track *t = &c->track;
  if ((t->dl.r.n && px_dl_at(t, t->dl.r.n - 1)->tag >= tag) ||
      !dl_make_room(t)) {
    t->lost = true; /* tags must grow, and the ring has a bound */
    return NULL;
  }
  px_delivery *d = px_ring_push(&t->dl.r, sizeof(px_delivery));
  memset(d, 0, sizeof *d);
  d->tag = tag;
  d->state = PX_DL_UNCACHED;
  d->gen = gen;
  d->qid = qid;
  d->delivered_us = px_clock_us(&s->srv->clock);
  if (!rule || !(d->names = dl_names(t, d, queue, exchange, routing_key)))
    return d;
  d->rule = rule;
  d->state = PX_DL_CAPTURE;
  t->capture = tag;
  return d;
}

/* Header and body frames of the delivery being captured (the newest). */
/* A delivery's names are allocated with room for a content the size of
 * the channel's last one, up to this; a room more than PX_CONTENT_SLACK
 * too large is given back. */
#define PX_CONTENT_HINT_MAX (16 * 1024)
#define PX_CONTENT_SLACK 64

static void capture_body(px_delivery *d, amqp_bytes b) {
  uint64_t n = b.len;
  if (n > d->body_len - d->body_have)
    n = d->body_len - d->body_have;
  memcpy(d->names + d->names_len + d->header_len + d->body_have, b.ptr, n);
  d->body_have += n;
}

void px_track_content(px_session *s, px_chan *c, const amqp_frame *f) {
  px_track *t = &c->track;
  if (!t->capture || !t->dl.r.n)
    return;
  px_delivery *d = px_dl_at(t, t->dl.r.n - 1);
  if (d->tag != t->capture || d->state != PX_DL_CAPTURE) {
    t->capture = 0;
    return;
  }
  if (f->type == AMQP_FRAME_HEADER && !d->header_len) {
    uint64_t body = amqp_content_header_peek_size(f->payload);
    bool too_large = body > UINT32_MAX - f->payload.len;
    uint64_t need = too_large ? 0 : f->payload.len + body;
    if (too_large || !cache_reserve(s, need)) {
      uncache(s, d, too_large ? PX_NOT_KEPT_LARGE : PX_NOT_KEPT_BOUND,
              f->payload);
      t->capture = 0;
      return;
    }
    /* the room allocated with the names, unless it is short or more than
     * PX_CONTENT_SLACK too much (kept memory stays near the content's) */
    char *all =
        need <= t->content_hint && t->content_hint - need <= PX_CONTENT_SLACK
            ? d->names
            : realloc(d->names, d->names_len + need);
    t->content_hint = need < PX_CONTENT_HINT_MAX ? (uint32_t)need : 0;
    if (!all) {
      cache_unreserve(s, need);
      uncache(s, d, PX_NOT_KEPT_MEMORY, f->payload);
      t->capture = 0;
      return;
    }
    d->names = all;
    memcpy(all + d->names_len, f->payload.ptr, f->payload.len);
    d->header_len = (uint32_t)f->payload.len;
    d->body_len = (uint32_t)body;
  } else if (f->type == AMQP_FRAME_BODY && d->header_len) {
    if (f->payload.ptr) {
      capture_body(d, f->payload);
    } else { /* read in two pieces */
      capture_body(d, s->split[0]);
      capture_body(d, s->split[1]);
    }
  }
  if (d->header_len && d->body_have == d->body_len) {
    d->state = PX_DL_CACHED;
    t->capture = 0;
  }
}

/* ---- consumers and requests ---------------------------------------------- */

static px_consumer *find_consumer(px_chan *c, amqp_bytes tag) {
  for (uint32_t i = 0; i < c->track.nconsumers; i++) {
    px_consumer *k = &c->track.consumers[i];
    if (k->tag_len == tag.len && memcmp(k->tag, tag.ptr, tag.len) == 0)
      return k;
  }
  return NULL;
}

/* A consumer, or a basic.get, whose queue cannot be known (it names "" on
 * a channel whose last declare was a server-named queue declared no-wait,
 * or none): its requeues pass through, delayed and counted. Logged at
 * most once a second. */
/* The policy of a queue rebound cannot name. Only a server-named queue
 * (amq.gen-...) can be one: its requeues are treated as those of a known
 * server-named queue, delayed and counted where a policy covers it. */
static const retry_rule *unknown_rule(px_session *s) {
  return retry_match(&s->srv->cfg->retry, "amq.gen-", 8);
}

static void unknown_queue(px_session *s, px_chan *c, const char *tag,
                          uint32_t decl_wait, bool no_ack) {
  static px_log_limit limit;
  uint64_t unlogged;
  if (decl_wait || no_ack || !unknown_rule(s) || /* named later, nothing to
                                                    retry, or logged lately */
      !px_log_limit_pass(&limit, px_clock_us(&s->srv->clock) / 1000, &unlogged))
    return;
  px_warn("queue_identity_unknown", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_U("channel", c->client_ch), PX_S("consumer_tag", tag),
          PX_U("unlogged", unlogged),
          PX_S("note", "the queue named \"\" is not known to rebound (no "
                       "declare, or a server-named one declared no-wait): "
                       "its requeues pass through, delayed and counted"));
}

/* A consumer's queue is known: its policy and, once the broker has shown
 * the consumer exists, its metrics label. true when it has a policy. */
static bool consumer_named(px_session *s, px_consumer *k, bool confirmed) {
  k->rule = k->no_ack
                ? NULL
                : retry_match(&s->srv->cfg->retry, k->queue, strlen(k->queue));
  k->gen = s->srv->cfg_gen;
  k->qid = confirmed ? px_metrics_queue(s->srv, k->queue) : -1;
  return k->rule != NULL;
}

/* A consumer the broker has confirmed (consume-ok) or that no-wait says
 * exists (`confirmed` false: its metrics label waits for a delivery).
 * `queue` NULL: not known yet (named by declare-ok `decl_wait`) or not
 * known at all (decl_wait 0). */
static bool add_consumer(px_session *s, px_chan *c, amqp_bytes tag,
                         const char *queue, uint32_t decl_wait, bool no_ack,
                         bool confirmed) {
  px_track *t = &c->track;
  px_consumer *k =
      t->nconsumers < PX_TRACK_MAX_CONSUMERS
          ? realloc(t->consumers, (t->nconsumers + 1) * sizeof *t->consumers)
          : NULL;
  if (!k) {
    t->lost = true;
    return false;
  }
  t->consumers = k;
  k = &t->consumers[t->nconsumers];
  memset(k, 0, sizeof *k);
  k->tag = dup_bytes(tag);
  k->queue = queue ? strdup(queue) : NULL;
  if (!k->tag || (queue && !k->queue)) {
    free(k->tag);
    free(k->queue);
    t->lost = true;
    return false;
  }
  k->tag_len = (uint8_t)tag.len;
  k->no_ack = no_ack;
  k->decl_wait = queue ? 0 : decl_wait;
  k->qid = -1;
  k->gen = s->srv->cfg_gen;
  k->cid = ++t->cids;
  t->nconsumers++;
  if (!queue) {
    unknown_queue(s, c, k->tag, decl_wait, no_ack);
    return false;
  }
  return consumer_named(s, k, confirmed); /* rebound's channel: ready by
                                             its first failure */
}

static void remove_consumer(px_chan *c, amqp_bytes tag) {
  px_consumer *k = find_consumer(c, tag);
  if (!k)
    return;
  free(k->tag);
  free(k->queue);
  *k = c->track.consumers[--c->track.nconsumers];
}

static px_request *req_at(const px_ring *q, uint32_t i) {
  return px_ring_at(q, sizeof(px_request), i);
}

/* The queue a consume or get naming `queue` takes: "" is the channel's
 * most recently declared queue, as the broker resolves it. NULL with
 * *decl_wait > 0: that declare-ok will name it; NULL with 0: not known
 * (or out of memory: the same, a pass-through). */
static char *resolve_queue(const px_track *t, amqp_bytes queue,
                           uint32_t *decl_wait) {
  *decl_wait = 0;
  if (queue.len)
    return dup_bytes(queue);
  if (t->decl_wait) {
    *decl_wait = t->decl_wait;
    return NULL;
  }
  return t->last_queue ? strdup(t->last_queue) : NULL;
}

static void push_request(px_chan *c, bool is_get, bool no_ack, amqp_bytes queue,
                         amqp_bytes tag) {
  px_track *t = &c->track;
  if (px_ring_reserve(&t->requests, sizeof(px_request), PX_TRACK_MAX) != 0) {
    t->lost = true;
    return;
  }
  px_request *r = px_ring_push(&t->requests, sizeof(px_request));
  r->is_get = is_get;
  r->no_ack = no_ack;
  r->queue = resolve_queue(t, queue, &r->decl_wait);
  r->tag = dup_bytes(tag);
}

/* queue.declare from the client: the channel's most recently declared
 * queue, from now on for the broker. An explicit name is known now; a
 * server-named queue's name comes with its declare-ok, or never (no-wait). */
static void declared(px_chan *c, amqp_bytes queue, bool no_wait) {
  px_track *t = &c->track;
  free(t->last_queue);
  t->last_queue = queue.len ? dup_bytes(queue) : NULL;
  t->decl_wait = 0;
  if (no_wait)
    return;
  t->decl_sent++;
  if (!queue.len)
    t->decl_wait = t->decl_sent;
}

/* queue.declare-ok: the name of the queue the n-th declare made, for what
 * waits for it. true when a consumer of a queue with a policy appeared. */
static bool declare_ok(px_session *s, px_chan *c, amqp_bytes queue) {
  px_track *t = &c->track;
  uint32_t n = ++t->decl_oks;
  bool want = false;
  if (t->decl_wait == n) {
    t->last_queue = dup_bytes(queue);
    t->decl_wait = 0;
  }
  for (uint32_t i = 0; i < t->requests.n; i++) {
    px_request *r = px_ring_at(&t->requests, sizeof(px_request), i);
    if (!r->queue && r->decl_wait == n) {
      r->queue = dup_bytes(queue);
      r->decl_wait = 0;
    }
  }
  for (uint32_t i = 0; i < t->nconsumers; i++) {
    px_consumer *k = &t->consumers[i];
    if (!k->queue && k->decl_wait == n) {
      k->decl_wait = 0;
      if ((k->queue = dup_bytes(queue)))
        want = consumer_named(s, k, false) || want;
    }
  }
  return want;
}

/* The oldest request, removed; the caller frees its strings. */
static bool pop_request(px_chan *c, px_request *out) {
  px_ring *q = &c->track.requests;
  if (q->n == 0)
    return false;
  *out = *req_at(q, 0);
  px_ring_drop(q, 1);
  return true;
}

static void request_free(px_request *r) {
  free(r->queue);
  free(r->tag);
}

bool px_track_client_method(px_session *s, px_chan *c, const amqp_method *m) {
  const amqp_arg *a = m->args;
  bool want = false;
  switch (m->id) {
  case AMQP_BASIC_CONSUME:
    if (a[AMQP_F_BASIC_CONSUME_NO_WAIT].u) {
      uint32_t wait;
      char *q =
          resolve_queue(&c->track, a[AMQP_F_BASIC_CONSUME_QUEUE].b, &wait);
      want = add_consumer(s, c, a[AMQP_F_BASIC_CONSUME_CONSUMER_TAG].b, q, wait,
                          a[AMQP_F_BASIC_CONSUME_NO_ACK].u, false);
      free(q);
    } else {
      push_request(c, false, a[AMQP_F_BASIC_CONSUME_NO_ACK].u,
                   a[AMQP_F_BASIC_CONSUME_QUEUE].b,
                   a[AMQP_F_BASIC_CONSUME_CONSUMER_TAG].b);
    }
    break;
  case AMQP_BASIC_GET:
    push_request(c, true, a[AMQP_F_BASIC_GET_NO_ACK].u,
                 a[AMQP_F_BASIC_GET_QUEUE].b, (amqp_bytes){NULL, 0});
    break;
  case AMQP_BASIC_ACK:
    px_track_settle(s, c, a[AMQP_F_BASIC_ACK_DELIVERY_TAG].u,
                    a[AMQP_F_BASIC_ACK_MULTIPLE].u);
    break;
  case AMQP_BASIC_REJECT:
    px_track_settle(s, c, a[AMQP_F_BASIC_REJECT_DELIVERY_TAG].u, false);
    break;
  case AMQP_BASIC_NACK:
    px_track_settle(s, c, a[AMQP_F_BASIC_NACK_DELIVERY_TAG].u,
                    a[AMQP_F_BASIC_NACK_MULTIPLE].u);
    break;
  case AMQP_BASIC_RECOVER:
  case AMQP_BASIC_RECOVER_ASYNC:
    /* every unsettled delivery comes again with a new tag */
    px_track_clear(s, c);
    break;
  case AMQP_QUEUE_DECLARE:
    declared(c, a[AMQP_F_QUEUE_DECLARE_QUEUE].b,
             a[AMQP_F_QUEUE_DECLARE_NO_WAIT].u);
    break;
  }
  return want;
}

/* A basic.get-ok with acks: tracked like a delivery (no consumer). */
static void got_ok(px_session *s, px_chan *c, const amqp_arg *a,
                   const char *queue) {
  px_delivery *d = new_delivery(
      s, c, a[AMQP_F_BASIC_GET_OK_DELIVERY_TAG].u, s->srv->cfg_gen,
      px_metrics_queue(s->srv, queue),
      retry_match(&s->srv->cfg->retry, queue, strlen(queue)), queue,
      a[AMQP_F_BASIC_GET_OK_EXCHANGE].b, a[AMQP_F_BASIC_GET_OK_ROUTING_KEY].b);
  if (d && a[AMQP_F_BASIC_GET_OK_REDELIVERED].u)
    d->flags |= PX_DLF_REDELIVERED;
}

/* A basic.get-ok with acks from a queue rebound cannot name: tracked for
 * settlement, its requeue delayed and counted. */
static void got_unknown(px_session *s, px_chan *c, uint64_t tag) {
  unknown_queue(s, c, "", 0, false);
  px_delivery *d = new_delivery(s, c, tag, s->srv->cfg_gen, -1, NULL, NULL,
                                (amqp_bytes){0}, (amqp_bytes){0});
  if (d && (d->rule = unknown_rule(s)))
    d->flags |= PX_DLF_NO_QUEUE;
}

/* Deliveries and answers from the broker. `queue` of a delivery comes from
 * its consumer or its basic.get. */
bool px_track_upstream_method(px_session *s, px_chan *c, const amqp_method *m) {
  const amqp_arg *a = m->args;
  px_request r;
  bool want = false;
  switch (m->id) {
  case AMQP_BASIC_CONSUME_OK:
    if (pop_request(c, &r)) {
      if (!r.is_get)
        want = add_consumer(s, c, a[AMQP_F_BASIC_CONSUME_OK_CONSUMER_TAG].b,
                            r.queue, 0, r.no_ack, true);
      request_free(&r);
    }
    break;
  case AMQP_QUEUE_DECLARE_OK:
    want = declare_ok(s, c, a[AMQP_F_QUEUE_DECLARE_OK_QUEUE].b);
    break;
  case AMQP_BASIC_CANCEL_OK:
    remove_consumer(c, a[AMQP_F_BASIC_CANCEL_OK_CONSUMER_TAG].b);
    break;
  case AMQP_BASIC_CANCEL: /* the broker cancels (queue deleted) */
    remove_consumer(c, a[AMQP_F_BASIC_CANCEL_CONSUMER_TAG].b);
    break;
  case AMQP_BASIC_GET_OK:
    c->track.capture = 0;
    if (!pop_request(c, &r)) {
      c->track.lost = true;
      break;
    }
    want = !r.no_ack && r.queue;
    if (r.queue)
      px_queue_count(s->srv, px_metrics_queue(s->srv, r.queue),
                     r.no_ack ? PX_QC_DELIVERED_NO_ACK : PX_QC_DELIVERED);
    if (want)
      got_ok(s, c, a, r.queue);
    else if (!r.no_ack)
      got_unknown(s, c, a[AMQP_F_BASIC_GET_OK_DELIVERY_TAG].u);
    request_free(&r);
    break;
  case AMQP_BASIC_GET_EMPTY:
    if (pop_request(c, &r))
      request_free(&r);
    break;
  }
  return want;
}

/* A delivery to a consumer whose queue is not known: tracked for
 * settlement, never copied. */
static void deliver_unknown(px_session *s, px_chan *c, const px_consumer *k,
                            uint64_t tag) {
  px_delivery *d = k->no_ack
                       ? NULL
                       : new_delivery(s, c, tag, s->srv->cfg_gen, -1, NULL,
                                      NULL, (amqp_bytes){0}, (amqp_bytes){0});
  if (d) {
    d->cid = k->cid;
    if ((d->rule = unknown_rule(s)))
      d->flags |= PX_DLF_NO_QUEUE;
  }
}

/* basic.deliver, on every delivery: the consumer tag and delivery tag are
 * read straight from the payload; the full decode (exchange, routing key)
 * only for a delivery that will be kept for retry. */
bool px_track_deliver(px_session *s, px_chan *c, amqp_bytes payload) {
  amqp_reader r = amqp_reader_make(payload.ptr + 4, payload.len - 4);
  amqp_bytes ctag = amqp_get_shortstr(&r);
  uint64_t tag = amqp_get_u64(&r);
  amqp_method m;
  c->track.capture = 0;
  px_consumer *k = r.failed ? NULL : find_consumer(c, ctag);
  if (!k) {
    c->track.lost = true;
    return false;
  }
  if (!k->queue) {
    deliver_unknown(s, c, k, tag);
    return false;
  }
  if (k->qid < 0) /* a no-wait consumer: the broker delivers, so it exists */
    k->qid = px_metrics_queue(s->srv, k->queue);
  px_queues_count(&s->srv->metrics.queues, k->qid,
                  k->no_ack ? PX_QC_DELIVERED_NO_ACK : PX_QC_DELIVERED,
                  s->srv->cfg_gen + 1);
  if (k->no_ack)
    return false;
  if (k->gen != s->srv->cfg_gen) { /* reloaded: the new policy decides */
    k->rule = retry_match(&s->srv->cfg->retry, k->queue, strlen(k->queue));
    k->gen = s->srv->cfg_gen;
  }
  px_delivery *d;
  if (!k->rule) {
    d = new_delivery(s, c, tag, s->srv->cfg_gen, k->qid, NULL, NULL,
                     (amqp_bytes){0}, (amqp_bytes){0});
    if (d)
      d->cid = k->cid;
    return false;
  }
  /* the rest read in place: redelivered, exchange, routing key; any other
   * shape goes through the full decode, which judges it */
  uint8_t bits = amqp_get_u8(&r);
  amqp_bytes ex = amqp_get_shortstr(&r), rk = amqp_get_shortstr(&r);
  if (r.failed || r.left || bits > 1) {
    if (amqp_method_decode_flags(payload, &m, AMQP_DECODE_OPAQUE_TABLES) !=
        AMQP_OK) {
      c->track.lost = true;
      return false;
    }
    bits = (uint8_t)m.args[AMQP_F_BASIC_DELIVER_REDELIVERED].u;
    ex = m.args[AMQP_F_BASIC_DELIVER_EXCHANGE].b;
    rk = m.args[AMQP_F_BASIC_DELIVER_ROUTING_KEY].b;
  }
  d = new_delivery(s, c, tag, s->srv->cfg_gen, k->qid, k->rule, k->queue, ex,
                   rk);
  if (d) {
    d->cid = k->cid;
    if (bits)
      d->flags |= PX_DLF_REDELIVERED;
  }
  return true; /* kept for retry: rebound's channel is wanted */
}

const char *px_track_consumer_tag(const px_chan *c, const px_delivery *d) {
  if (!d->cid)
    return "";
  for (uint32_t i = 0; i < c->track.nconsumers; i++)
    if (c->track.consumers[i].cid == d->cid)
      return c->track.consumers[i].tag;
  return NULL;
}

int px_track_expired_add(px_chan *c, uint64_t tag) {
  px_track *t = &c->track;
  if (t->nexpired == t->cap_expired) {
    uint32_t cap = t->cap_expired ? t->cap_expired * 2 : 8;
    uint64_t *e =
        cap <= PX_TRACK_MAX ? realloc(t->expired, cap * sizeof *e) : NULL;
    if (!e)
      return -1;
    t->expired = e;
    t->cap_expired = cap;
  }
  uint32_t i = t->nexpired++;
  for (; i > 0 && t->expired[i - 1] > tag; i--)
    t->expired[i] = t->expired[i - 1];
  t->expired[i] = tag;
  return 0;
}

bool px_track_expired_has(const px_chan *c, uint64_t tag) {
  for (uint32_t i = 0; i < c->track.nexpired; i++)
    if (c->track.expired[i] == tag)
      return true;
  return false;
}

uint32_t px_track_expired_drop(px_chan *c, uint64_t tag, bool upto) {
  px_track *t = &c->track;
  uint32_t kept = 0, n = t->nexpired;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t e = t->expired[i];
    bool drop = upto ? (tag == 0 || e <= tag) : e == tag;
    if (!drop)
      t->expired[kept++] = e;
  }
  t->nexpired = kept;
  return n - kept;
}

uint64_t px_track_below(const px_chan *c, uint64_t tag) {
  for (uint32_t i = px_track_index(c, tag); i > 0; i--) {
    const px_delivery *d = px_dl_at(&c->track, i - 1);
    if (d->state != PX_DL_GONE && d->tag < tag)
      return d->tag;
  }
  return 0;
}

/* Everything a channel tracks, when it goes away. */
void px_track_free(px_session *s, px_chan *c) {
  px_track_clear(s, c);
  for (uint32_t i = 0; i < c->track.nconsumers; i++) {
    free(c->track.consumers[i].tag);
    free(c->track.consumers[i].queue);
  }
  free(c->track.consumers);
  free(c->track.last_queue);
  free(c->track.expired);
  for (uint32_t i = 0; i < c->track.requests.n; i++)
    request_free(req_at(&c->track.requests, i));
  px_ring_free(&c->track.requests);
  free(c->track.pub_us);
  memset(&c->track, 0, sizeof c->track);
}

/* ---- publisher confirms of the client's publishes (metrics) ------------- */

void px_track_publish(px_session *s, px_chan *c) {
  px_track *t = &c->track;
  if (!t->confirm)
    return;
  if (t->pub_n == t->pub_cap) {
    uint32_t cap = t->pub_cap ? t->pub_cap * 2 : 64;
    uint64_t *ring = cap <= 65536 ? malloc(cap * sizeof *ring) : NULL;
    if (!ring) {
      t->confirm = false; /* stop measuring rather than guess */
      return;
    }
    for (uint32_t i = 0; i < t->pub_n; i++)
      ring[i] = t->pub_us[(t->pub_head + i) % t->pub_cap];
    free(t->pub_us);
    t->pub_us = ring;
    t->pub_cap = cap;
    t->pub_head = 0;
  }
  t->pub_us[(t->pub_head + t->pub_n++) % t->pub_cap] =
      px_clock_us(&s->srv->clock);
}

/* The broker's basic.ack/nack on a client channel in confirm mode: every
 * publish up to the tag (RabbitMQ confirms a channel's publishes in
 * order) is confirmed now. */
void px_track_confirmed(px_session *s, px_chan *c, amqp_bytes payload) {
  px_track *t = &c->track;
  amqp_reader r = amqp_reader_make(payload.ptr + 4, payload.len - 4);
  uint64_t tag = amqp_get_u64(&r);
  uint64_t now = px_clock_us(&s->srv->clock);
  if (!t->confirm || r.failed)
    return;
  while (t->pub_n && t->pub_seq <= tag) {
    px_metrics_observe(s->srv, PX_H_CONFIRM, 0, now - t->pub_us[t->pub_head]);
    t->pub_head = (t->pub_head + 1) % t->pub_cap;
    t->pub_n--;
    t->pub_seq++;
  }
}
