/* px_track.c - consumers, basic.get requests and unsettled deliveries of a
 * channel, and the copies of deliveries kept for retry (px_track.h). */
#include <stdlib.h>
#include <string.h>

#include "px_metrics.h"
#include "px_session_int.h"

/* Deliveries tracked per channel at most; past it multiple-nacks pass. */
#define PX_TRACK_MAX 65536

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

static bool cache_reserve(px_session *s, uint64_t n) {
  const px_config *cfg = s->srv->cfg;
  if (s->cache_bytes + n > cfg->cache_per_connection ||
      s->srv->stats.cache_bytes + n > cfg->cache_total)
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

void px__track_release(px_session *s, px_delivery *d) {
  if (d->bytes)
    cache_unreserve(s, d->bytes);
  free(d->names);
  free(d->content);
  memset(d, 0, sizeof *d);
}

static void uncache(px_session *s, px_delivery *d, const char *why) {
  s->srv->stats.uncached_deliveries++;
  if (!s->warned_uncached) {
    s->warned_uncached = true;
    px_warn("delivery_not_cached", PX_U("id", s->id), PX_S("peer", s->peer),
            PX_S("queue", d->names), PX_S("reason", why),
            PX_U("cache_bytes", s->cache_bytes),
            PX_S("note", "its nack passes through; logged once per "
                         "connection"));
  }
  free(d->names);
  free(d->content);
  d->names = NULL;
  d->content = NULL;
  d->state = PX_DL_UNCACHED;
}

/* ---- deliveries ---------------------------------------------------------- */

px_delivery *px__track_find(px_chan *c, uint64_t tag) {
  uint32_t lo = 0, hi = c->track.ndl;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (c->track.dl[mid].tag < tag)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < c->track.ndl && c->track.dl[lo].tag == tag ? &c->track.dl[lo]
                                                         : NULL;
}

/* Drop deliveries [from, to) of the array. */
void px__track_observe(px_session *s, const px_delivery *d) {
  if (d->state != PX_DL_RETRYING) /* observed when it was nacked */
    px_metrics_observe(s->srv, PX_H_PROCESSING, d->qid,
                       uv_hrtime() / 1000 - d->delivered_us);
}

/* Drop deliveries [from, to); `settled`: by the client, just now. */
static void dl_remove_range(px_session *s, px_chan *c, uint32_t from,
                            uint32_t to, bool settled) {
  px_track *t = &c->track;
  for (uint32_t i = from; i < to; i++) {
    if (settled)
      px__track_observe(s, &t->dl[i]);
    px__track_release(s, &t->dl[i]);
  }
  if (to < t->ndl)
    memmove(t->dl + from, t->dl + to, (t->ndl - to) * sizeof *t->dl);
  t->ndl -= to - from;
  if (t->capture >= (int32_t)to)
    t->capture -= (int32_t)(to - from);
  else if (t->capture >= (int32_t)from)
    t->capture = -1;
}

void px__track_settle(px_session *s, px_chan *c, uint64_t tag, bool multiple) {
  px_track *t = &c->track;
  if (multiple) {
    uint32_t n = 0;
    while (n < t->ndl && (tag == 0 || t->dl[n].tag <= tag))
      n++;
    dl_remove_range(s, c, 0, n, true);
    return;
  }
  px_delivery *d = px__track_find(c, tag);
  if (d) {
    uint32_t i = (uint32_t)(d - t->dl);
    dl_remove_range(s, c, i, i + 1, true);
  }
}

void px__track_clear(px_session *s, px_chan *c) {
  px_track *t = &c->track;
  dl_remove_range(s, c, 0, t->ndl, false);
  free(t->dl);
  t->dl = NULL;
  t->cap_dl = 0;
  t->capture = -1;
  t->lost = false;
}

/* Track a delivery; with a rule, also start keeping its content (`queue`,
 * `exchange` and `routing_key` are then needed for the copy's headers). */
static void new_delivery(px_chan *c, uint64_t tag, uint32_t gen, int qid,
                         const retry_rule *rule, const char *queue,
                         amqp_bytes exchange, amqp_bytes routing_key) {
  px_track *t = &c->track;
  if (t->ndl && t->dl[t->ndl - 1].tag >= tag) {
    t->lost = true; /* tags must grow; something was missed */
    return;
  }
  if (t->ndl == t->cap_dl) {
    uint32_t cap = t->cap_dl ? t->cap_dl * 2 : 16;
    px_delivery *dl =
        cap <= PX_TRACK_MAX ? realloc(t->dl, cap * sizeof *dl) : NULL;
    if (!dl) {
      t->lost = true;
      return;
    }
    t->dl = dl;
    t->cap_dl = cap;
  }
  px_delivery *d = &t->dl[t->ndl++];
  memset(d, 0, sizeof *d);
  d->tag = tag;
  d->state = PX_DL_UNCACHED;
  d->rule = rule;
  d->gen = gen;
  d->qid = qid;
  d->delivered_us = uv_hrtime() / 1000;
  if (!rule)
    return;
  size_t ql = strlen(queue);
  d->names = malloc(ql + exchange.len + routing_key.len + 3);
  if (!d->names) {
    d->rule = NULL;
    return;
  }
  char *p = d->names;
  memcpy(p, queue, ql + 1);
  p += ql + 1;
  if (exchange.len)
    memcpy(p, exchange.ptr, exchange.len);
  p[exchange.len] = '\0';
  p += exchange.len + 1;
  if (routing_key.len)
    memcpy(p, routing_key.ptr, routing_key.len);
  p[routing_key.len] = '\0';
  d->state = PX_DL_CAPTURE;
  t->capture = (int32_t)(t->ndl - 1);
}

/* Header and body frames of the delivery being captured. */
void px__track_content(px_session *s, px_chan *c, const amqp_frame *f) {
  px_track *t = &c->track;
  if (t->capture < 0)
    return;
  px_delivery *d = &t->dl[t->capture];
  if (f->type == AMQP_FRAME_HEADER && !d->content) {
    uint64_t body = amqp_content_header_peek_size(f->payload);
    uint64_t need = f->payload.len + body;
    if (need > UINT32_MAX || !cache_reserve(s, need)) {
      uncache(s, d,
              need > UINT32_MAX ? "message too large" : "cache bound reached");
      t->capture = -1;
      return;
    }
    d->content = malloc(need ? need : 1);
    if (!d->content) {
      cache_unreserve(s, need);
      uncache(s, d, "out of memory");
      t->capture = -1;
      return;
    }
    d->bytes = need;
    memcpy(d->content, f->payload.ptr, f->payload.len);
    d->header_len = (uint32_t)f->payload.len;
    d->body_len = body;
  } else if (f->type == AMQP_FRAME_BODY && d->content) {
    uint64_t n = f->payload.len;
    if (n > d->body_len - d->body_have)
      n = d->body_len - d->body_have;
    memcpy(d->content + d->header_len + d->body_have, f->payload.ptr, n);
    d->body_have += n;
  }
  if (d->content && d->body_have == d->body_len) {
    d->state = PX_DL_CACHED;
    t->capture = -1;
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

static void add_consumer(px_session *s, px_chan *c, amqp_bytes tag,
                         const char *queue, bool no_ack) {
  px_track *t = &c->track;
  px_consumer *k =
      realloc(t->consumers, (t->nconsumers + 1) * sizeof *t->consumers);
  if (!k) {
    t->lost = true;
    return;
  }
  t->consumers = k;
  k = &t->consumers[t->nconsumers];
  k->tag = dup_bytes(tag);
  k->queue = strdup(queue);
  if (!k->tag || !k->queue) {
    free(k->tag);
    free(k->queue);
    t->lost = true;
    return;
  }
  k->tag_len = (uint8_t)tag.len;
  k->no_ack = no_ack;
  k->rule =
      no_ack ? NULL : retry_match(&s->srv->cfg->retry, queue, strlen(queue));
  k->gen = s->srv->cfg_gen;
  k->qid = px_metrics_queue(s->srv, queue);
  t->nconsumers++;
}

static void remove_consumer(px_chan *c, amqp_bytes tag) {
  px_consumer *k = find_consumer(c, tag);
  if (!k)
    return;
  free(k->tag);
  free(k->queue);
  *k = c->track.consumers[--c->track.nconsumers];
}

static void push_request(px_chan *c, bool is_get, bool no_ack, amqp_bytes queue,
                         amqp_bytes tag) {
  px_track *t = &c->track;
  px_request *r =
      realloc(t->requests, (t->nrequests + 1) * sizeof *t->requests);
  if (!r) {
    t->lost = true;
    return;
  }
  t->requests = r;
  r = &t->requests[t->nrequests++];
  r->is_get = is_get;
  r->no_ack = no_ack;
  r->queue = dup_bytes(queue);
  r->tag = dup_bytes(tag);
}

/* The oldest request, removed; the caller frees its strings. */
static bool pop_request(px_chan *c, px_request *out) {
  px_track *t = &c->track;
  if (t->nrequests == 0)
    return false;
  *out = t->requests[0];
  if (--t->nrequests)
    memmove(t->requests, t->requests + 1, t->nrequests * sizeof *t->requests);
  return true;
}

static void request_free(px_request *r) {
  free(r->queue);
  free(r->tag);
}

void px__track_client_method(px_session *s, px_chan *c, const amqp_method *m) {
  const amqp_arg *a = m->args;
  switch (m->id) {
  case AMQP_BASIC_CONSUME:
    if (a[AMQP_F_BASIC_CONSUME_NO_WAIT].u) {
      char *q = dup_bytes(a[AMQP_F_BASIC_CONSUME_QUEUE].b);
      if (q)
        add_consumer(s, c, a[AMQP_F_BASIC_CONSUME_CONSUMER_TAG].b, q,
                     a[AMQP_F_BASIC_CONSUME_NO_ACK].u);
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
    px__track_settle(s, c, a[AMQP_F_BASIC_ACK_DELIVERY_TAG].u,
                     a[AMQP_F_BASIC_ACK_MULTIPLE].u);
    break;
  case AMQP_BASIC_REJECT:
    px__track_settle(s, c, a[AMQP_F_BASIC_REJECT_DELIVERY_TAG].u, false);
    break;
  case AMQP_BASIC_NACK:
    px__track_settle(s, c, a[AMQP_F_BASIC_NACK_DELIVERY_TAG].u,
                     a[AMQP_F_BASIC_NACK_MULTIPLE].u);
    break;
  case AMQP_BASIC_RECOVER:
  case AMQP_BASIC_RECOVER_ASYNC:
    /* every unsettled delivery comes again with a new tag */
    px__track_clear(s, c);
    break;
  }
}

/* Deliveries and answers from the broker. `queue` of a delivery comes from
 * its consumer or its basic.get. */
void px__track_upstream_method(px_session *s, px_chan *c,
                               const amqp_method *m) {
  const amqp_arg *a = m->args;
  px_request r;
  switch (m->id) {
  case AMQP_BASIC_CONSUME_OK:
    if (pop_request(c, &r)) {
      if (!r.is_get && r.queue)
        add_consumer(s, c, a[AMQP_F_BASIC_CONSUME_OK_CONSUMER_TAG].b, r.queue,
                     r.no_ack);
      request_free(&r);
    }
    break;
  case AMQP_BASIC_CANCEL_OK:
    remove_consumer(c, a[AMQP_F_BASIC_CANCEL_OK_CONSUMER_TAG].b);
    break;
  case AMQP_BASIC_CANCEL: /* the broker cancels (queue deleted) */
    remove_consumer(c, a[AMQP_F_BASIC_CANCEL_CONSUMER_TAG].b);
    break;
  case AMQP_BASIC_GET_OK:
    c->track.capture = -1;
    if (!pop_request(c, &r)) {
      c->track.lost = true;
      break;
    }
    if (!r.no_ack && r.queue)
      new_delivery(c, a[AMQP_F_BASIC_GET_OK_DELIVERY_TAG].u, s->srv->cfg_gen,
                   px_metrics_queue(s->srv, r.queue),
                   retry_match(&s->srv->cfg->retry, r.queue, strlen(r.queue)),
                   r.queue, a[AMQP_F_BASIC_GET_OK_EXCHANGE].b,
                   a[AMQP_F_BASIC_GET_OK_ROUTING_KEY].b);
    request_free(&r);
    break;
  case AMQP_BASIC_GET_EMPTY:
    if (pop_request(c, &r))
      request_free(&r);
    break;
  }
}

/* basic.deliver, on every delivery: the consumer tag and delivery tag are
 * read straight from the payload; the full decode (exchange, routing key)
 * only for a delivery that will be kept for retry. */
void px__track_deliver(px_session *s, px_chan *c, amqp_bytes payload) {
  amqp_reader r = amqp_reader_make(payload.ptr + 4, payload.len - 4);
  amqp_bytes ctag = amqp_get_shortstr(&r);
  uint64_t tag = amqp_get_u64(&r);
  amqp_method m;
  c->track.capture = -1;
  px_consumer *k = r.failed ? NULL : find_consumer(c, ctag);
  if (!k) {
    c->track.lost = true;
    return;
  }
  if (k->no_ack)
    return;
  if (k->gen != s->srv->cfg_gen) { /* reloaded: the new policy decides */
    k->rule = retry_match(&s->srv->cfg->retry, k->queue, strlen(k->queue));
    k->gen = s->srv->cfg_gen;
  }
  if (!k->rule) {
    new_delivery(c, tag, s->srv->cfg_gen, k->qid, NULL, NULL, (amqp_bytes){0},
                 (amqp_bytes){0});
    return;
  }
  if (amqp_method_decode(payload, &m) != AMQP_OK) {
    c->track.lost = true;
    return;
  }
  new_delivery(c, tag, s->srv->cfg_gen, k->qid, k->rule, k->queue,
               m.args[AMQP_F_BASIC_DELIVER_EXCHANGE].b,
               m.args[AMQP_F_BASIC_DELIVER_ROUTING_KEY].b);
}

/* Everything a channel tracks, when it goes away. */
void px__track_free(px_session *s, px_chan *c) {
  px__track_clear(s, c);
  for (uint32_t i = 0; i < c->track.nconsumers; i++) {
    free(c->track.consumers[i].tag);
    free(c->track.consumers[i].queue);
  }
  free(c->track.consumers);
  for (uint32_t i = 0; i < c->track.nrequests; i++)
    request_free(&c->track.requests[i]);
  free(c->track.requests);
  free(c->track.pub_us);
  memset(&c->track, 0, sizeof c->track);
  c->track.capture = -1;
}

/* ---- publisher confirms of the client's publishes (metrics) ------------- */

void px__track_publish(px_chan *c) {
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
  t->pub_us[(t->pub_head + t->pub_n++) % t->pub_cap] = uv_hrtime() / 1000;
}

/* The broker's basic.ack/nack on a client channel in confirm mode: every
 * publish up to the tag (RabbitMQ confirms a channel's publishes in
 * order) is confirmed now. */
void px__track_confirmed(px_session *s, px_chan *c, amqp_bytes payload) {
  px_track *t = &c->track;
  amqp_reader r = amqp_reader_make(payload.ptr + 4, payload.len - 4);
  uint64_t tag = amqp_get_u64(&r);
  uint64_t now = uv_hrtime() / 1000;
  if (!t->confirm || r.failed)
    return;
  while (t->pub_n && t->pub_seq <= tag) {
    px_metrics_observe(s->srv, PX_H_CONFIRM, 0, now - t->pub_us[t->pub_head]);
    t->pub_head = (t->pub_head + 1) % t->pub_cap;
    t->pub_n--;
    t->pub_seq++;
  }
}
