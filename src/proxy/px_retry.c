/* px_retry.c - a requeue becomes a delayed, counted retry.
 *
 * basic.nack/basic.reject with requeue=1 on a delivery kept by px_track.c:
 * ask retry_decide() for the plan, declare the tier (or dead-letter) queue
 * on rebound's own channel if this connection has not yet, publish the copy
 * there (mandatory, persistent as the original, every property kept, the
 * count and origin headers set), and only when the broker confirms it ack
 * the original. Until then the channel's later client frames are held, so
 * nothing overtakes that ack. A return, a broker nack, no confirm within
 * retry_confirm_timeout or the loss of rebound's channel forwards the
 * client's original requeue instead: the broker requeues, nothing is lost.
 *
 * A copy must fit the connection's frame-max: one whose content header
 * (with rebound's headers) would not is dead-lettered with reason
 * "frame-max" and as few added headers as fit, never sent over-size (the
 * broker would close the client's whole connection).
 *
 * A requeue rebound cannot turn into a counted retry (a name it cannot
 * build, a refused dead-letter queue, rebound's channel not ready, a copy
 * that failed, a delivery not kept) never goes back
 * to the broker at once: that is the loop rebound exists to stop. The delivery
 * is held (PX_DL_DEFERRED, the channel's later frames held behind it so nothing
 * overtakes) and its requeue is sent when the tier delay has passed, counted by
 * reason and logged at warn, at most once per PX_LOG_LIMIT_MS.
 *
 * Copies in flight are a ring in publish order (seq grows by one), so a
 * confirm finds its copy in O(log n) and the usual in-order confirm pops
 * the head in O(1); the oldest one's deadline arms the session's retry
 * timer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "px_counters.h"
#include "px_life.h"
#include "px_log.h"
#include "px_own.h"
#include "px_retry.h"
#include "px_server.h"
#include "px_track.h"
#include "px_watch.h"
#include "retry_policy.h"

typedef struct px_retry_op {
  uint64_t seq; /* publish sequence on rebound's channel */
  uint64_t tag; /* the original delivery */
  uint64_t started_us;
  uint16_t client_ch;
  uint32_t gen;   /* the channel's generation (px_chan.gen) */
  bool is_reject; /* fall back with the same method */
  bool returned;
  bool again; /* republished after a return: not republished twice */
  bool dead_letter;
  uint32_t attempt;   /* the attempt that failed (1-based) */
  const char *reason; /* dead-letter reason (static), for metrics */
  char target[RETRY_NAME_MAX + 1];
  char queue[RETRY_NAME_MAX + 1]; /* the source, for metrics */
  char tier[16];                  /* "1s", for metrics */
  uint32_t delay_ms;              /* the tier's (0: dead-lettered) */
  uint64_t refused_ms;            /* when the broker first nacked a copy of this
                                     delivery (the loop's clock; 0: never) */
} px_retry_op;

/* A requeue held back until `due_ms` (the loop's clock). */
typedef struct px_defer {
  uint64_t due_ms;
  uint64_t tag;
  uint16_t client_ch;
  uint32_t gen; /* the channel's generation (px_chan.gen) */
  bool is_reject;
  bool retry;      /* the counted retry is tried again once rebound's channel
                      is ready, if that comes before due_ms */
  bool logged;     /* retry_requeue_delayed was written (or skipped by
                      the rate limit) when it was held back */
  bool again;      /* parked: a republish (px_retry_op.again) */
  const char *why; /* static: the metric's label when it is sent */
  uint64_t refused_ms; /* as px_retry_op.refused_ms */
} px_defer;

/* px_counters.h's reasons, as the pointers that are compared. A copy
 * NACKED or DISCARDED was not enqueued (the broker nacked it, or rebound's
 * channel closed before it was confirmed), so trying again once the
 * channel is back duplicates nothing the broker confirmed. CHANNEL_LOST:
 * the broker closed rebound's channel; copies published before the frame
 * it refused may be enqueued (their requeue may duplicate one, as any
 * lost confirm), those after it were DISCARDED. */
#define WHY(id) px_why_text[PX_WHY_##id]

static bool retry_later(const char *why) {
  return why == WHY(NACKED) || why == WHY(DISCARDED);
}

/* Deferred requeues per connection at most (each is an unsettled delivery
 * of a channel, bounded there first). */
#define PX_DEFERS_MAX (1u << 24)
/* px_defer.due_ms of a retry waiting for the broker to unblock. */
#define PX_DUE_UNBLOCKED UINT64_MAX

static uint64_t now_us(px_session *s) {
  return px_clock_us(&s->srv->clock);
}

static uint64_t now_ms(px_session *s) {
  return px_clock_ms(&s->srv->clock);
}

static bool in_list(char **list, uint32_t n, const char *name) {
  for (uint32_t i = 0; i < n; i++)
    if (strcmp(list[i], name) == 0)
      return true;
  return false;
}

static void list_add(char ***list, uint32_t *n, const char *name) {
  char **l = realloc(*list, (*n + 1) * sizeof *l);
  if (!l)
    return;
  *list = l;
  if ((l[*n] = strdup(name)))
    (*n)++;
}

static void list_remove(char ***list, uint32_t *n, const char *name) {
  for (uint32_t i = 0; i < *n; i++)
    if (strcmp((*list)[i], name) == 0) {
      free((*list)[i]);
      (*list)[i] = (*list)[--*n];
      return;
    }
}

/* Tier and dead-letter queues known to exist with the other type than
 * their policy's (px_server.alt_types), or to be used as they are
 * (px_server.as_is): at most this many names each. */
#define PX_ALT_TYPES_MAX 4096

/* Add `name` to a list of at most PX_ALT_TYPES_MAX names; false when it
 * is full or out of memory. */
static bool list_add_bounded(char ***list, uint32_t *n, const char *name) {
  if (*n >= PX_ALT_TYPES_MAX)
    return false;
  list_add(list, n, name);
  return in_list(*list, *n, name);
}

static void list_free(char ***list, uint32_t *n) {
  for (uint32_t i = 0; i < *n; i++)
    free((*list)[i]);
  free(*list);
  *list = NULL;
  *n = 0;
}

/* Copies in flight at most per connection (each holds a delivery of a
 * channel, so the channels' bounds come first). */
#define PX_OPS_MAX (1u << 24)

static px_retry_op *op_at(const px_session *s, uint32_t i) {
  return px_ring_at(&s->retry.ops, sizeof(px_retry_op), i);
}

static uint64_t op_seq(const void *op) {
  return ((const px_retry_op *)op)->seq;
}

void px_retry_free(px_session *s) {
  px_ring_free(&s->retry.parked);
  list_free(&s->retry.alt_declared, &s->retry.nalt_declared);
  px_ring_free(&s->retry.ops);
  px_ring_free(&s->retry.defers);
  list_free(&s->retry.declared, &s->retry.ndeclared);
  list_free(&s->retry.broken, &s->retry.nbroken);
}

/* ---- sending ---------------------------------------------------------------
 */

/* Settle an original on the client's channel upstream. false when the
 * output failed (the session closes over it). */
static bool emit_settle(px_session *s, px_chan *c, uint32_t id, uint64_t tag,
                        bool requeue) {
  return px_out_settle(&s->out, &s->upstream, c->up_ch, id, tag, requeue) ==
         PX_OUT_OK;
}

static const retry_rule *delivery_rule(px_session *s, const px_delivery *d);

/* The key of a queue in px_server.alt_types: its vhost and name. */
static void alt_key(const px_session *s, const char *name, char *out,
                    size_t cap) {
  snprintf(out, cap, "%zu:%s/%s", strlen(s->vhost), s->vhost, name);
}

static bool alt_type(const px_session *s, const char *name) {
  char key[RETRY_NAME_MAX + sizeof s->vhost + 24];
  alt_key(s, name, key, sizeof key);
  return in_list(s->srv->alt_types, s->srv->nalt_types, key);
}

/* Is `name` used as it is (px_server.as_is)? */
static bool as_is(const px_session *s, const char *name) {
  char key[RETRY_NAME_MAX + sizeof s->vhost + 24];
  alt_key(s, name, key, sizeof key);
  return in_list(s->srv->as_is, s->srv->nas_is, key);
}

/* Are `target`'s arguments those of a quorum queue? The policy's type,
 * unless the queue turned out to exist with the other. */
static bool declare_quorum(const px_session *s, const retry_rule *rule,
                           const char *target) {
  bool q = rule && retry_use_quorum(rule->queue_type, s->broker_quorum_dlx);
  return q != alt_type(s, target);
}

static void put_string(amqp_writer *w, const char *key, const char *value) {
  amqp_field f = amqp_field_string(amqp_cstr(value));
  amqp_table_write_entry(w, amqp_cstr(key), &f);
}

/* Declare a tier queue (TTL, dead-lettered back to `queue` through the
 * default exchange) or the dead-letter queue, once per connection. A
 * quorum tier dead-letters at-least-once (which needs reject-publish):
 * what it expires reaches the source even across a broker restart. */
static px_out_status ensure_queue(px_session *s, const retry_rule *rule,
                                  const retry_plan *plan, const char *queue) {
  uint8_t args[512];
  amqp_writer w = amqp_writer_make(args, sizeof args);
  amqp_method m;

  if (in_list(s->retry.declared, s->retry.ndeclared, plan->target))
    return PX_OUT_OK;
  if (as_is(s, plan->target)) { /* exists: as good as declared */
    list_add(&s->retry.declared, &s->retry.ndeclared, plan->target);
    return PX_OUT_OK;
  }
  bool quorum = declare_quorum(s, rule, plan->target);
  if (alt_type(s, plan->target)) /* what a 406 to it then means */
    list_add(&s->retry.alt_declared, &s->retry.nalt_declared, plan->target);
  if (quorum)
    put_string(&w, "x-queue-type", "quorum");
  if (plan->action == RETRY_REPUBLISH) {
    amqp_field ttl = {.type = 'I'};
    ttl.v.i = plan->delay_ms;
    amqp_table_write_entry(&w, amqp_cstr("x-message-ttl"), &ttl);
    put_string(&w, "x-dead-letter-exchange", "");
    put_string(&w, "x-dead-letter-routing-key", queue);
    if (quorum) {
      put_string(&w, "x-dead-letter-strategy", "at-least-once");
      put_string(&w, "x-overflow", "reject-publish");
    }
  }
  amqp_method_init(&m, AMQP_QUEUE_DECLARE);
  m.args[AMQP_F_QUEUE_DECLARE_QUEUE].b =
      (amqp_bytes){(const uint8_t *)plan->target, plan->target_len};
  m.args[AMQP_F_QUEUE_DECLARE_DURABLE].u = 1;
  m.args[AMQP_F_QUEUE_DECLARE_ARGUMENTS].b = (amqp_bytes){args, w.len};
  px_out_status st = px_out_method(&s->out, px_own_sink(s), px_own_ch(s), &m);
  if (st == PX_OUT_OK)
    list_add(&s->retry.declared, &s->retry.ndeclared, plan->target);
  return st;
}

/* Which of rebound's headers a copy gets. */
enum {
  H_COUNT = 1 << 0,
  H_SOURCE = 1 << 1,
  H_EXCHANGE = 1 << 2,
  H_ROUTING_KEY = 1 << 3,
  H_FIRST = 1 << 4,
  H_LAST = 1 << 5,
  H_REASON = 1 << 6,
  H_STRIP = 1 << 7, /* the broker's x-death history left out */
};
#define COPY_TIER                                                              \
  (H_COUNT | H_SOURCE | H_EXCHANGE | H_ROUTING_KEY | H_FIRST | H_LAST)
#define COPY_DEAD_LETTER (COPY_TIER | H_REASON)
#define COPY_MINIMAL (H_SOURCE | H_REASON) /* frame-max: what still fits */
#define COPY_BARE 0                        /* the original header as it is */
#define COPY_STRIPPED (H_STRIP | H_SOURCE | H_REASON)

/* publish_copy(): the copy's content header would exceed frame-max. */
#define COPY_TOO_LARGE 1

_Static_assert(H_REASON == 1 << 6, "header_suffix[] follows the H_* bits");

/* The suffixes of rebound's headers, in the order of their H_* bits. */
static const char *const header_suffix[] = {
    "retry-count",          "source-queue",    "original-exchange",
    "original-routing-key", "first-failed-at", "last-failed-at",
    "dead-letter-reason",
};

/* The name of the header of H_* bit `i`, built once per configuration;
 * NULL when the prefix makes it too long. */
static const char *header_name(px_server *srv, unsigned i) {
  char(*names)[RETRY_NAME_MAX + 1] = srv->header_names;
  if (srv->names_gen != srv->cfg_gen + 1) {
    for (unsigned k = 0; k < sizeof header_suffix / sizeof *header_suffix; k++)
      if (retry_header_name(&srv->cfg->retry, header_suffix[k], names[k],
                            sizeof names[k]) < 0)
        names[k][0] = '\0';
    srv->names_gen = srv->cfg_gen + 1;
  }
  return names[i][0] ? names[i] : NULL;
}

/* The copy's headers: every original header kept, rebound's in `mask` set.
 * Two halves of `out` take turns as amqp_table_set()'s destination. */
static int copy_headers(px_session *s, const px_delivery *d,
                        const retry_plan *plan, unsigned mask,
                        const char *reason, amqp_bytes src, uint8_t *out,
                        size_t cap, size_t *len) {
  uint8_t *half[2] = {out, out + cap / 2};
  amqp_bytes cur = src;
  amqp_field existing;
  uint64_t now = (uint64_t)px_clock_wall_s(&s->srv->clock);
  struct {
    amqp_field value;
    bool keep; /* set only when absent: the first failure's values */
  } set[] = {
      /* in the order of the H_* bits */
      {amqp_field_long(plan->new_count), false},
      {amqp_field_string(amqp_cstr(px_dl_queue(d))), false},
      {amqp_field_string(amqp_cstr(px_dl_exchange(d))), true},
      {amqp_field_string(amqp_cstr(px_dl_routing_key(d))), true},
      {amqp_field_timestamp(now), true},
      {amqp_field_timestamp(now), false},
      {amqp_field_string(amqp_cstr(reason)), false},
  };
  for (unsigned i = 0; i < sizeof set / sizeof set[0]; i++) {
    if (!(mask & 1u << i))
      continue;
    const char *name = header_name(s->srv, i);
    if (!name)
      return -1;
    if (set[i].keep &&
        amqp_table_get(cur, amqp_cstr(name), &existing) == AMQP_OK)
      continue;
    uint8_t *dst = cur.ptr == half[0] ? half[1] : half[0];
    amqp_writer w = amqp_writer_make(dst, cap / 2);
    if (amqp_table_set(&w, cur, amqp_cstr(name), &set[i].value) != AMQP_OK)
      return -1;
    cur = (amqp_bytes){dst, w.len};
  }
  if (cur.ptr != out && cur.len)
    memmove(out, cur.ptr, cur.len);
  *len = cur.len;
  return 0;
}

/* Room a tier copy leaves for what the broker adds when the tier
 * dead-letters it back: an x-death entry naming the tier twice, and the
 * x-first-death-* headers the first time. */
static size_t xdeath_room(const retry_plan *plan) {
  return plan->action == RETRY_REPUBLISH ? 256 + 3 * plan->target_len : 0;
}

/* The broker's dead-lettering history headers. */
static bool is_death_header(amqp_bytes key) {
  static const char *const prefixes[] = {"x-death", "x-first-death-",
                                         "x-last-death-"};
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
    size_t n = strlen(prefixes[i]);
    if (key.len >= n && memcmp(key.ptr, prefixes[i], n) == 0)
      return true;
  }
  return false;
}

/* `src` without the broker's dead-lettering history, into `out`. */
static int strip_death_headers(amqp_bytes src, uint8_t *out, size_t cap,
                               size_t *len) {
  amqp_writer w = amqp_writer_make(out, cap);
  amqp_table_iter it;
  amqp_bytes key;
  amqp_field v;
  int rc;
  amqp_table_iter_init(&it, src);
  while ((rc = amqp_table_next(&it, &key, &v)) > 0)
    if (!is_death_header(key))
      amqp_table_write_entry(&w, key, &v);
  *len = w.len;
  return rc == 0 && !w.failed ? 0 : -1;
}

/* Encode the copy's content header into `frame` (cap bytes): `h` with
 * rebound's headers of `mask` (H_STRIP: without the broker's x-death
 * history). Returns its length, -1 on failure, or -COPY_TOO_LARGE when its
 * frame, with the x-death room of a tier copy, would exceed frame-max (the
 * client would then get a frame larger than it negotiated). */
static long encode_copy_header(px_session *s, const px_delivery *d,
                               amqp_content_header h, const retry_plan *plan,
                               unsigned mask, const char *reason,
                               uint8_t *frame, size_t cap) {
  size_t tcap = 2 * (h.props.headers.len + 2048), tlen = 0;
  amqp_bytes src = (h.props.flags & AMQP_P_HEADERS) ? h.props.headers
                                                    : (amqp_bytes){NULL, 0};
  uint8_t *tbl = NULL, *stripped = NULL;
  long rc = -1;
  if (mask & H_STRIP) {
    size_t n;
    if (!(stripped = malloc(src.len + 1)) ||
        strip_death_headers(src, stripped, src.len + 1, &n) != 0)
      goto out;
    src = (amqp_bytes){stripped, n};
  }
  if (mask) {
    if (!(tbl = malloc(tcap)) ||
        copy_headers(s, d, plan, mask, reason, src, tbl, tcap, &tlen) != 0)
      goto out;
    h.props.headers = (amqp_bytes){tbl, tlen};
    h.props.flags |= AMQP_P_HEADERS;
  }
  amqp_writer w = amqp_writer_make(frame, cap);
  if (amqp_content_header_encode(&h, &w) != AMQP_OK)
    goto out;
  size_t room = xdeath_room(plan);
  rc = w.len + AMQP_FRAME_OVERHEAD > s->frame_max ||
               room > s->frame_max - AMQP_FRAME_OVERHEAD - w.len
           ? -COPY_TOO_LARGE
           : (long)w.len;
out:
  free(tbl);
  free(stripped);
  return rc;
}

/* Publish the copy of `d` (decoded content header `h`) to plan->target
 * with rebound's headers of `mask`. Nothing is sent unless it fits. 0, -1
 * (cannot be built), or COPY_TOO_LARGE. */
static int publish_copy(px_session *s, px_delivery *d,
                        const amqp_content_header *h, const retry_plan *plan,
                        unsigned mask, const char *reason) {
  size_t cap = d->header_len + 2 * (h->props.headers.len + 2048) + 64;
  uint8_t *frame = malloc(cap);
  long n =
      frame ? encode_copy_header(s, d, *h, plan, mask, reason, frame, cap) : -1;
  if (n < 0) {
    free(frame);
    return n == -COPY_TOO_LARGE ? COPY_TOO_LARGE : -1;
  }
  px_conn *sink = px_own_sink(s);
  amqp_method m;
  amqp_method_init(&m, AMQP_BASIC_PUBLISH);
  m.args[AMQP_F_BASIC_PUBLISH_ROUTING_KEY].b =
      (amqp_bytes){(const uint8_t *)plan->target, plan->target_len};
  m.args[AMQP_F_BASIC_PUBLISH_MANDATORY].u = 1;
  px_out_status st = ensure_queue(s, delivery_rule(s, d), plan, px_dl_queue(d));
  if (st == PX_OUT_OK)
    st = px_out_method(&s->out, sink, px_own_ch(s), &m);
  if (st == PX_OUT_OK)
    st = px_out_frame(&s->out, sink, AMQP_FRAME_HEADER, px_own_ch(s), frame,
                      (size_t)n);
  free(frame);
  const uint8_t *body = px_dl_content(d) + d->header_len;
  size_t chunk = s->frame_max - AMQP_FRAME_OVERHEAD;
  for (uint64_t off = 0; st == PX_OUT_OK && off < d->body_len; off += chunk) {
    size_t k = d->body_len - off < chunk ? (size_t)(d->body_len - off) : chunk;
    st = px_out_frame(&s->out, sink, AMQP_FRAME_BODY, px_own_ch(s), body + off,
                      k);
  }
  return st == PX_OUT_OK ? 0 : -1; /* a failure closes the session */
}

/* ---- copies in flight ------------------------------------------------------
 */

static void arm_deadline(px_session *s) {
  uint64_t timeout_ms = s->srv->cfg->retry_confirm_timeout_ms;
  if (s->retry.ops.n == 0 || s->retry.blocked) { /* blocked: px_retry_blocked
                                            re-arms it when that ends */
    px_timer_stop(&s->srv->clock, &s->retry.deadline);
    return;
  }
  uint64_t due_us = op_at(s, 0)->started_us + timeout_ms * 1000;
  uint64_t now = now_us(s);
  px_timer_start(&s->srv->clock, &s->retry.deadline,
                 due_us > now ? (due_us - now + 999) / 1000 : 0);
}

static int push_op(px_session *s, const px_chan *c, const px_delivery *d,
                   const retry_plan *plan, bool is_reject, const char *reason) {
  if (px_ring_reserve(&s->retry.ops, sizeof(px_retry_op), PX_OPS_MAX) != 0)
    return -1;
  px_retry_op *op = px_ring_push(&s->retry.ops, sizeof(px_retry_op));
  op->seq = px_own_next_seq(s);
  op->tag = d->tag;
  op->started_us = now_us(s);
  op->client_ch = c->client_ch;
  op->gen = c->gen;
  op->is_reject = is_reject;
  op->returned = false;
  op->again = s->retry.next_again;
  op->refused_ms = s->retry.next_refused_ms;
  op->dead_letter = plan->action == RETRY_DEAD_LETTER;
  op->attempt = plan->attempt;
  op->reason = reason;
  memcpy(op->target, plan->target, plan->target_len + 1);
  snprintf(op->queue, sizeof op->queue, "%s", px_dl_queue(d));
  op->delay_ms = plan->action == RETRY_REPUBLISH ? plan->delay_ms : 0;
  if (retry_delay_format(plan->delay_ms, op->tier, sizeof op->tier) < 0)
    op->tier[0] = '\0';
  if (s->retry.ops.n == 1)
    arm_deadline(s);
  return 0;
}

/* Forget the newest op: its copy was never sent. */
static void pop_newest_op(px_session *s) {
  s->retry.ops.n--;
  px_own_unseq(s);
  if (s->retry.ops.n == 0)
    px_timer_stop(&s->srv->clock, &s->retry.deadline);
}

/* The retry count header: -1 when absent, -2 when not a non-negative
 * integer. */
static int64_t count_header(px_session *s, const amqp_content_header *h) {
  amqp_field v;
  int64_t n;
  const char *name = header_name(s->srv, 0); /* H_COUNT */
  if (!(h->props.flags & AMQP_P_HEADERS) || !name ||
      amqp_table_get(h->props.headers, amqp_cstr(name), &v) != AMQP_OK)
    return -1;
  return amqp_field_as_int(&v, &n) && n >= 0 ? n : -2;
}

/* Start the copy of `plan`, trying header sets from the fullest to the
 * barest until one fits frame-max (`masks`, ending with COPY_BARE or a
 * negative sentinel). 0 when a copy is on its way; COPY_TOO_LARGE when
 * none fits; -1 on failure. */
static int start_copy(px_session *s, px_chan *c, px_delivery *d,
                      const amqp_content_header *h, const retry_plan *plan,
                      bool is_reject, const char *reason, const int *masks) {
  int rc = COPY_TOO_LARGE;
  for (const int *m = masks; *m >= 0 && rc == COPY_TOO_LARGE; m++) {
    if (push_op(s, c, d, plan, is_reject, reason) != 0)
      return -1;
    rc = publish_copy(s, d, h, plan, (unsigned)*m, reason);
    if (rc != 0)
      pop_newest_op(s);
  }
  return rc;
}

static bool must_park(const px_session *s, const char *target);
static int park(px_session *s, const px_chan *c, const px_delivery *d,
                bool is_reject);

/* The delivery's copy cannot fit frame-max with the headers a tier needs:
 * dead-letter it, with as many of rebound's headers as still fit, and if
 * even the original does not (the broker's x-death grew it past the
 * client's frame-max), without the broker's x-death history. */
static int dead_letter_oversize(px_session *s, px_chan *c, px_delivery *d,
                                const retry_rule *rule,
                                const amqp_content_header *h, bool is_reject) {
  static const int masks[] = {COPY_MINIMAL, COPY_BARE, COPY_STRIPPED, H_STRIP,
                              -1};
  const char *q = px_dl_queue(d);
  retry_plan plan = {.action = RETRY_DEAD_LETTER};
  int n =
      rule ? retry_dlq_name(rule, q, strlen(q), plan.target, sizeof plan.target)
           : -1;
  if (n < 0)
    return -1;
  plan.target_len = (size_t)n;
  if (must_park(s, plan.target)) /* after the copies in flight */
    return park(s, c, d, is_reject) == 0 ? 0 : -1;
  px_warn("retry_copy_too_large", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("queue", q), PX_U("frame_max", s->frame_max),
          PX_S("action", "dead-lettered"), PX_S("target", plan.target));
  return start_copy(s, c, d, h, &plan, is_reject, PX_DEAD_FRAME_MAX, masks);
}

/* The delivery's policy under the running config: a rule matched under an
 * older one is matched again (rule pointers of retired configs are never
 * used). */
static const retry_rule *delivery_rule(px_session *s, const px_delivery *d) {
  const char *q = px_dl_queue(d);
  if (d->gen == s->srv->cfg_gen)
    return d->rule;
  return q ? retry_match(&s->srv->cfg->retry, q, strlen(q)) : NULL;
}

/* A declare the broker refuses closes rebound's channel, and with it the
 * confirms of every copy published before it: those copies may be in
 * their tier while their originals are requeued. So a queue not yet
 * declared on this channel is declared only when no copy is in flight;
 * until then the copy waits ("parked"), and so does every later one (in
 * order). It costs a confirm's round trip once per queue and connection. */
static bool must_park(const px_session *s, const char *target) {
  return s->retry.parked.n > 0 ||
         (s->retry.ops.n > 0 &&
          !in_list(s->retry.declared, s->retry.ndeclared, target));
}

static int park(px_session *s, const px_chan *c, const px_delivery *d,
                bool is_reject) {
  if (px_ring_reserve(&s->retry.parked, sizeof(px_defer), PX_DEFERS_MAX) != 0)
    return -1;
  *(px_defer *)px_ring_push(&s->retry.parked, sizeof(px_defer)) = (px_defer){
      0,     d->tag, c->client_ch,        c->gen, is_reject,
      false, true,   s->retry.next_again, NULL,   s->retry.next_refused_ms};
  return 0;
}

static void requeue_or_defer(px_session *s, px_chan *c, px_delivery *d,
                             bool is_reject, bool retry, const char *why);

static const char *try_retry(px_session *s, px_chan *c, px_delivery *d,
                             bool is_reject);

/* A processing timeout's copy that could not be made: the client keeps
 * the delivery (rebound never settles what the client still holds), and
 * no further timeout is tried for it. */
static void timeout_abandoned(px_session *s, px_chan *c, px_delivery *d,
                              const char *why) {
  d->state = PX_DL_CACHED;
  d->flags = (uint8_t)((d->flags & ~PX_DLF_TIMING_OUT) | PX_DLF_TIMEOUT_FAILED);
  px_warn("processing_timeout_failed", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_U("channel", c->client_ch), PX_U("delivery_tag", d->tag),
          PX_S("reason", why), PX_S("action", "left with the client"));
}

/* A parked copy's delivery, no longer retrying (NULL when its channel
 * went), and its channel in *cp. */
static px_delivery *unpark_one(px_session *s, const px_defer *f, px_chan **cp) {
  px_chan *c = *cp = px_tab_get(&s->by_client, f->client_ch);
  px_delivery *d = c && c->gen == f->gen && c->state == PX_CH_OPEN
                       ? px_track_find(c, f->tag)
                       : NULL;
  if (!d || d->state != PX_DL_RETRYING)
    return NULL;
  d->state = PX_DL_CACHED;
  c->track.retries_pending--;
  return d;
}

/* No copy is in flight: the parked ones go now, in order (the first to a
 * new queue declares it; those after it may park again behind it). */
static void unpark(px_session *s) {
  if (s->retry.parked.n == 0 || !px_own_is_ready(s) || s->retry.blocked)
    return;
  px_ring todo = s->retry.parked;
  s->retry.parked = (px_ring){0};
  for (uint32_t i = 0; i < todo.n && !px_life_closed(s); i++) {
    px_defer *f = px_ring_at(&todo, sizeof(px_defer), i);
    px_chan *c;
    px_delivery *d = unpark_one(s, f, &c);
    if (!d)
      continue; /* the channel went: the broker requeued it */
    s->retry.next_again = f->again;
    s->retry.next_refused_ms = f->refused_ms;
    const char *why = try_retry(s, c, d, f->is_reject);
    s->retry.next_again = false;
    s->retry.next_refused_ms = 0;
    if (why && (d->flags & PX_DLF_TIMING_OUT))
      timeout_abandoned(s, c, d, why);
    else if (why)
      requeue_or_defer(s, c, d, f->is_reject, false, why);
    if (c->track.retries_pending == 0 && c->track.defers_pending == 0)
      px_life_release_held(s, c);
  }
  px_ring_free(&todo);
}

bool px_retry_unpark(px_session *s) {
  if (s->retry.ops.n || !s->retry.parked.n || !px_own_is_ready(s) ||
      s->retry.blocked)
    return false;
  unpark(s);
  return true;
}

/* rebound's channel is gone: parked copies wait for it like any requeue
 * held back for it (retried when it is back, else requeued after their
 * tier delay), so none waits for a channel that may never return. */
static void unpark_to_defers(px_session *s) {
  px_ring todo = s->retry.parked;
  s->retry.parked = (px_ring){0};
  for (uint32_t i = 0; i < todo.n; i++) {
    px_defer *f = px_ring_at(&todo, sizeof(px_defer), i);
    px_chan *c;
    px_delivery *d = unpark_one(s, f, &c);
    if (d && (d->flags & PX_DLF_TIMING_OUT)) {
      timeout_abandoned(s, c, d, WHY(DISCARDED));
      if (!c->track.retries_pending && !c->track.defers_pending)
        px_life_release_held(s, c);
    } else if (d) {
      requeue_or_defer(s, c, d, f->is_reject, true, WHY(DISCARDED));
    }
  }
  px_ring_free(&todo);
}

/* ---- processing timeouts --------------------------------------------------
 */

/* A channel whose deliveries rebound may act on by itself: open, not in a
 * transaction, every delivery tracked, and no client frame held (one of
 * them may settle the very delivery). */
static bool plain_channel(const px_chan *c) {
  return c->state == PX_CH_OPEN && !c->tx && !c->track.lost &&
         !px_chan_nheld(c);
}

/* Start the copy of a delivery held past its policy's processing_timeout:
 * the retry path, as if the client had nacked it, except that a failure
 * leaves it with the client. */
static void time_out(px_session *s, px_chan *c, px_delivery *d) {
  d->flags |= PX_DLF_TIMING_OUT;
  const char *why = try_retry(s, c, d, false);
  if (why) {
    timeout_abandoned(s, c, d, why);
    return;
  }
  c->held = true; /* the client's later frames wait for the copy's ack */
}

/* The channel's deliveries past their timeout, oldest first; the scan
 * stops at the first younger than `shortest` (tags, and so times, grow). */
static void channel_timeouts(px_session *s, px_chan *c, uint64_t now_us,
                             uint64_t shortest_us) {
  px_track *t = &c->track;
  for (uint32_t i = 0; i < t->dl.r.n; i++) {
    px_delivery *d = px_dl_at(t, i);
    uint64_t age = now_us - d->delivered_us;
    if (age < shortest_us)
      return;
    const retry_rule *rule =
        d->state == PX_DL_CACHED && !(d->flags & PX_DLF_TIMEOUT_FAILED)
            ? delivery_rule(s, d)
            : NULL;
    if (rule && rule->processing_timeout_ms &&
        age >= (uint64_t)rule->processing_timeout_ms * 1000)
      time_out(s, c, d);
  }
}

void px_retry_timeouts(px_session *s, uint32_t shortest_ms) {
  uint64_t now = now_us(s);
  uint32_t at = 0;
  if (!shortest_ms || !px_life_is_open(s) || px_life_conn_held(s) ||
      !px_own_is_ready(s) || s->retry.blocked)
    return;
  for (px_chan *c; (c = px_tab_next(&s->by_client, &at));)
    if (plain_channel(c)) /* held frames may hold the client's settle */
      channel_timeouts(s, c, now, (uint64_t)shortest_ms * 1000);
}

/* ---- consumers lost ------------------------------------------------------
 */

/* The delivery a lost consumer was working on: the oldest it had not
 * settled (consumers take deliveries in order), of a queue with a policy,
 * and one the broker had delivered before (so a first loss, as in a plain
 * restart, is never counted). NULL when there is none. */
static px_delivery *lost_in_hand(px_session *s, px_chan *c) {
  px_track *t = &c->track;
  /* a delivery already timed out (the one it was stuck on): which was
   * in hand is unknown */
  if (t->nexpired)
    return NULL;
  for (uint32_t i = 0; i < t->dl.r.n; i++) {
    px_delivery *d = px_dl_at(t, i);
    if (d->state == PX_DL_GONE)
      continue;
    bool counts = d->state == PX_DL_CACHED && (d->flags & PX_DLF_REDELIVERED) &&
                  delivery_rule(s, d);
    return counts ? d : NULL;
  }
  return NULL;
}

static void lost_scan(px_session *s) {
  uint32_t at = 0;
  for (px_chan *c; (c = px_tab_next(&s->by_client, &at));) {
    px_delivery *d = plain_channel(c) ? lost_in_hand(s, c) : NULL;
    if (!d)
      continue;
    d->flags |= PX_DLF_LOST;
    const char *why = try_retry(s, c, d, false);
    if (why) {
      d->flags &= (uint8_t)~PX_DLF_LOST;
    } else {
      px_queue_count(s->srv, d->qid, PX_QC_CONSUMER_LOST);
      s->srv->stats.consumer_lost++;
    }
    px_info("consumer_lost", PX_U("id", s->id), PX_S("peer", s->peer),
            PX_S("queue", px_dl_queue(d)), PX_U("channel", c->client_ch),
            PX_U("delivery_tag", d->tag),
            PX_S("action", why ? why : "counted as a failed attempt"));
  }
}

void px_retry_consumer_lost(px_session *s) {
  if (px_own_opening(s))
    s->retry.lost_waiting = true; /* own_ready() scans */
  else if (px_own_is_ready(s) && !s->retry.blocked)
    lost_scan(s);
  /* else the broker requeues them, uncounted, as it always did */
}

/* A client's settle of deliveries rebound acked for a timeout. */
static void swallowed(px_session *s, px_chan *c, uint64_t tag, uint32_t n) {
  s->srv->stats.late_settles_swallowed += n;
  if (s->retry.late_settle_logged || !n)
    return;
  s->retry.late_settle_logged = true;
  px_info("late_settle_swallowed", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_U("channel", c->client_ch), PX_U("delivery_tag", tag),
          PX_S("reason", "rebound acked it at its processing timeout; "
                         "logged once per connection"));
}

/* A multiple settle whose tag rebound acked, rewritten to the newest
 * delivery below it: sent as that, or through the requeue path. */
static int settle_below(px_session *s, px_chan *c, amqp_method *m,
                        uint64_t orig) {
  bool requeue =
      m->id == AMQP_BASIC_NACK && m->args[AMQP_F_BASIC_NACK_REQUEUE].u;
  int act = PX_FORWARD;
  if (requeue)
    act = px_retry_requeue(s, c, m);
  else
    px_track_client_method(s, c, m);
  if (act == PX_HOLD) { /* replayed later: rewritten again then */
    if (px_track_expired_add(c, orig) != 0)
      px_warn("late_settle_not_kept", PX_U("id", s->id),
              PX_U("channel", c->client_ch), PX_U("delivery_tag", orig),
              PX_S("reason", "no room: its replay goes on as sent"));
    return PX_HOLD;
  }
  if (act == PX_FORWARD) {
    px_out_status st = px_out_method(&s->out, &s->upstream, c->up_ch, m);
    (void)st; /* a failure is kept: the session closes over it */
    return PX_DROP;
  }
  return act;
}

int px_retry_late_settle(px_session *s, px_chan *c, amqp_method *m) {
  amqp_arg *a = m->args;
  bool ack = m->id == AMQP_BASIC_ACK, reject = m->id == AMQP_BASIC_REJECT;
  amqp_arg *tag = &a[ack      ? AMQP_F_BASIC_ACK_DELIVERY_TAG
                     : reject ? AMQP_F_BASIC_REJECT_DELIVERY_TAG
                              : AMQP_F_BASIC_NACK_DELIVERY_TAG];
  bool multiple =
      !reject &&
      a[ack ? AMQP_F_BASIC_ACK_MULTIPLE : AMQP_F_BASIC_NACK_MULTIPLE].u;
  if (!multiple) {
    if (!px_track_expired_drop(c, tag->u, false))
      return PX_FORWARD;
    swallowed(s, c, tag->u, 1);
    return PX_DROP;
  }
  if (tag->u == 0 || !px_track_expired_has(c, tag->u)) {
    /* covered, none is the tag: the broker ignores them in the range */
    swallowed(s, c, tag->u, px_track_expired_drop(c, tag->u, true));
    return PX_FORWARD;
  }
  uint64_t orig = tag->u, below = px_track_below(c, orig);
  swallowed(s, c, orig, px_track_expired_drop(c, orig, true));
  if (!below)
    return PX_DROP; /* it covered only timed-out deliveries */
  tag->u = below;
  return settle_below(s, c, m, orig);
}

/* Send the client's settle `m` for `tag`, multiple or not. */
static void settle_as(px_session *s, px_chan *c, amqp_method *m, uint64_t tag,
                      bool multiple) {
  bool ack = m->id == AMQP_BASIC_ACK;
  m->args[ack ? AMQP_F_BASIC_ACK_DELIVERY_TAG : AMQP_F_BASIC_NACK_DELIVERY_TAG]
      .u = tag;
  m->args[ack ? AMQP_F_BASIC_ACK_MULTIPLE : AMQP_F_BASIC_NACK_MULTIPLE].u =
      multiple;
  px_out_status st = px_out_method(&s->out, &s->upstream, c->up_ch, m);
  (void)st; /* a failure is kept: the session closes over it */
}

int px_retry_split_settle(px_session *s, px_chan *c, amqp_method *m) {
  bool ack = m->id == AMQP_BASIC_ACK;
  uint64_t tag = m->args[ack ? AMQP_F_BASIC_ACK_DELIVERY_TAG
                             : AMQP_F_BASIC_NACK_DELIVERY_TAG]
                     .u;
  uint32_t n = px_track_upto(c, tag);
  uint64_t first_run = 0; /* the newest delivery before any waiting one */
  bool past = false;      /* a waiting delivery came */
  for (uint32_t i = 0; i < n; i++) {
    px_delivery *d = px_dl_at(&c->track, i);
    if (d->state == PX_DL_GONE)
      continue;
    if (px_dl_waiting(d)) {
      if (!past && first_run)
        settle_as(s, c, m, first_run, true);
      past = true;
      continue;
    }
    if (past)
      settle_as(s, c, m, d->tag, false);
    else
      first_run = d->tag;
    px_track_observe(s, d);
    px_track_forget(s, c, d); /* indexes stay valid until the tidy */
  }
  if (!past && first_run)
    settle_as(s, c, m, first_run, true);
  px_track_tidy(c);
  s->srv->stats.settles_split++;
  return PX_DROP;
}

/* A random value for a backoff's jitter bucket: xorshift64*, seeded from
 * the clock once (spreading retries needs no more than that). */
static uint32_t jitter_draw(void) {
  static uint64_t x;
  if (!x)
    x = uv_hrtime() | 1;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  return (uint32_t)((x * 0x2545F4914F6CDD1Dull) >> 32);
}

/* Why the delivery failed, for a dead-letter copy's reason. */
static const char *failure_reason(const px_delivery *d) {
  return d->flags & PX_DLF_LOST         ? PX_DEAD_CONSUMER_LOST
         : d->flags & PX_DLF_TIMING_OUT ? PX_DEAD_TIMEOUT
                                        : PX_DEAD_MAX_ATTEMPTS;
}

/* A failure whose count header the plan could not trust (retry_decide():
 * planned as a first attempt): counted once per delivery, logged at warn
 * at most once per PX_LOG_LIMIT_MS. */
static void count_untrusted(px_session *s, px_delivery *d, const char *q) {
  static px_log_limit limit;
  uint64_t unlogged;
  if (d->flags & PX_DLF_BAD_COUNT) /* tried again: counted already */
    return;
  d->flags |= PX_DLF_BAD_COUNT;
  s->srv->stats.counts_unreadable++;
  if (!px_log_limit_pass(&limit, now_ms(s), &unlogged))
    return;
  px_warn("retry_count_unreadable", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("queue", q), PX_S("header", header_name(s->srv, 0)),
          PX_U("unlogged", unlogged),
          PX_S("action", "counted as the first attempt; the copy carries "
                         "rebound's count"));
}

/* The tier a failure would go to cannot be declared (refused for good:
 * another queue's arguments under both types, or no permission): the
 * failure is dead-lettered now instead, with the reason tier-refused --
 * an end, never a loop of uncounted requeues. false when the dead-letter
 * queue cannot be named. */
static bool tier_refused(px_session *s, const retry_rule *rule, const char *q,
                         retry_plan *plan) {
  static px_log_limit limit;
  char dlq[RETRY_NAME_MAX + 1];
  uint64_t unlogged;
  int n = retry_dlq_name(rule, q, strlen(q), dlq, sizeof dlq);
  if (n < 0 ||
      in_list(s->retry.broken, s->retry.nbroken, dlq)) /* no end there either */
    return false;
  if (px_log_limit_pass(&limit, now_ms(s), &unlogged))
    px_warn("retry_tier_refused", PX_U("id", s->id), PX_S("peer", s->peer),
            PX_S("queue", q), PX_S("tier", plan->target),
            PX_S("action", "dead-lettered now"), PX_S("target", dlq),
            PX_U("unlogged", unlogged));
  memcpy(plan->target, dlq, (size_t)n + 1);
  plan->target_len = (size_t)n;
  plan->action = RETRY_DEAD_LETTER;
  return true;
}

/* Try to turn one delivery's failure into a copy. NULL when a copy is on
 * its way (the delivery is then RETRYING), else why not. */
static const char *try_retry(px_session *s, px_chan *c, px_delivery *d,
                             bool is_reject) {
  static const int tier_masks[] = {COPY_TIER, -1};
  static const int dead_masks[] = {COPY_DEAD_LETTER, -1};
  retry_plan plan;
  if (d->state != PX_DL_CACHED)
    return WHY(NOT_KEPT);
  const char *q = px_dl_queue(d);
  const retry_rule *rule = delivery_rule(s, d);
  amqp_content_header h; /* decoded once: for the count and the copy */
  if (amqp_content_header_decode((amqp_bytes){px_dl_content(d), d->header_len},
                                 &h) != AMQP_OK)
    return WHY(BAD_HEADER);
  retry_decide(rule, q, strlen(q), count_header(s, &h), jitter_draw(), &plan);
  if (plan.count_untrusted)
    count_untrusted(s, d, q);
  if (plan.action == RETRY_PASS) {
    px_metrics_inc(s->srv, PX_M_PASSTHROUGH, retry_pass_reason_str(plan.reason),
                   NULL);
    px_debug("retry_pass", PX_U("id", s->id), PX_S("queue", q),
             PX_S("reason", retry_pass_reason_str(plan.reason)));
    return retry_pass_reason_str(plan.reason);
  }
  const char *reason = failure_reason(d);
  if (plan.action == RETRY_REPUBLISH &&
      in_list(s->retry.broken, s->retry.nbroken, plan.target) &&
      tier_refused(s, rule, q, &plan))
    reason = PX_DEAD_TIER_REFUSED;
  if (in_list(s->retry.broken, s->retry.nbroken, plan.target)) {
    px_metrics_inc(s->srv, PX_M_PASSTHROUGH, PX_PASS_REFUSED, NULL);
    return PX_PASS_REFUSED;
  }
  if (must_park(s, plan.target)) {
    if (park(s, c, d, is_reject) != 0)
      return WHY(NOT_BUILT);
    d->state = PX_DL_RETRYING;
    c->track.retries_pending++;
    return NULL;
  }
  bool dead = plan.action == RETRY_DEAD_LETTER;
  int rc = start_copy(s, c, d, &h, &plan, is_reject, reason,
                      dead ? dead_masks : tier_masks);
  if (rc == COPY_TOO_LARGE)
    rc = dead_letter_oversize(s, c, d, rule, &h, is_reject);
  if (rc == COPY_TOO_LARGE) { /* its own headers exceed this frame-max */
    px_metrics_inc(s->srv, PX_M_PASSTHROUGH, PX_PASS_NO_FIT, NULL);
    return PX_PASS_NO_FIT;
  }
  if (rc != 0)
    return WHY(NOT_BUILT);
  d->state = PX_DL_RETRYING;
  c->track.retries_pending++;
  return NULL;
}

/* ---- requeues held back for the tier delay --------------------------------
 */

static void own_ready(px_session *s);
static void arm_defer_timer(px_session *s);

static px_defer *defer_at(const px_session *s, uint32_t i) {
  return px_ring_at(&s->retry.defers, sizeof(px_defer), i);
}

/* The delay a requeue of `d` waits: the tier its next attempt would have
 * gone to (the first tier when its count cannot be read). */
static uint32_t defer_delay(px_session *s, const px_delivery *d) {
  const retry_rule *rule = delivery_rule(s, d);
  amqp_content_header h;
  int64_t count = -1;
  if (!rule || rule->ntiers == 0)
    return 1000;
  if (d->header_len &&
      amqp_content_header_decode((amqp_bytes){px_dl_content(d), d->header_len},
                                 &h) == AMQP_OK)
    count = count_header(s, &h);
  return rule->tiers_ms[retry_tier_for(rule, count, jitter_draw())];
}

static void arm_defer_timer(px_session *s) {
  uint64_t next = UINT64_MAX;
  uint64_t now = now_ms(s);
  for (uint32_t i = 0; i < s->retry.defers.n; i++)
    if (defer_at(s, i)->due_ms < next)
      next = defer_at(s, i)->due_ms;
  if (next == UINT64_MAX)
    px_timer_stop(&s->srv->clock, &s->retry.defer);
  else
    px_timer_start_at(&s->srv->clock, &s->retry.defer, next > now ? next : now);
}

static void log_deferred(px_session *s, const px_delivery *d, uint32_t ms,
                         const char *why) {
  static px_log_limit limit;
  uint64_t unlogged;
  if (!px_log_limit_pass(&limit, now_ms(s), &unlogged))
    return;
  px_warn("retry_requeue_delayed", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("queue", px_dl_queue(d)), PX_S("reason", why),
          PX_U("delay_ms", ms), PX_U("unlogged", unlogged),
          PX_S("note", "no counted retry: the broker gets the requeue once "
                       "the tier delay has passed"));
}

/* Hold the requeue of `d` back for its tier delay. false when it cannot
 * be (out of memory): the caller requeues now. */
static bool defer_requeue(px_session *s, px_chan *c, px_delivery *d,
                          bool is_reject, bool retry, const char *why,
                          uint64_t refused_ms) {
  if (px_ring_reserve(&s->retry.defers, sizeof(px_defer), PX_DEFERS_MAX) != 0)
    return false;
  uint32_t ms = defer_delay(s, d);
  px_defer *f = px_ring_push(&s->retry.defers, sizeof(px_defer));
  /* while the broker blocks publishing, a retry waits for it to unblock
   * (then it is counted), however long that takes */
  uint64_t due = retry && s->retry.blocked ? PX_DUE_UNBLOCKED : now_ms(s) + ms;
  *f = (px_defer){due,   d->tag, c->client_ch, c->gen, is_reject,
                  retry, !retry, false,        why,    refused_ms};
  d->state = PX_DL_DEFERRED;
  c->track.defers_pending++;
  c->held = true; /* later frames of the channel wait behind it */
  if (!retry)     /* else logged if it comes to the requeue (defer_fire) */
    log_deferred(s, d, ms, why);
  arm_defer_timer(s);
  return true;
}

/* A copy the broker nacked (a quorum tier refuses copies while it has no
 * leader: a node went away) is published again after the tier delay, the
 * same attempt, still counted, while the first refusal is less than the
 * confirm timeout ago; a broker that refuses longer gets the client's
 * requeue. true when the copy waits for its next try. */
static bool refused(px_session *s, px_chan *c, px_delivery *d,
                    const px_retry_op *op, const char *why) {
  uint64_t now = now_ms(s);
  uint64_t first = op->refused_ms ? op->refused_ms : now;
  if (why != WHY(NACKED) || op->returned || px_life_conn_held(s) ||
      now - first >= s->srv->cfg->retry_confirm_timeout_ms)
    return false;
  if (!defer_requeue(s, c, d, op->is_reject, true, why, first))
    return false;
  px_warn("retry_copy_refused", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_U("channel", op->client_ch), PX_U("delivery_tag", op->tag),
          PX_S("target", op->target), PX_U("refused_for_ms", now - first),
          PX_S("action", "published again after the tier delay"));
  return true;
}

/* A deferred copy the broker refused, due: published again (while
 * rebound's channel is ready; else its requeue goes). true when a copy is
 * on its way. */
static bool refused_again(px_session *s, px_chan *c, px_delivery *d,
                          const px_defer *f) {
  uint64_t now = now_ms(s);
  if (!f->retry || !f->refused_ms || !d || d->state != PX_DL_DEFERRED ||
      !px_own_is_ready(s) || s->retry.blocked || c->state != PX_CH_OPEN)
    return false;
  d->state = PX_DL_CACHED;
  s->retry.next_refused_ms = f->refused_ms;
  const char *why = try_retry(s, c, d, f->is_reject);
  s->retry.next_refused_ms = 0;
  if (why) {
    d->state = PX_DL_DEFERRED;
    return false;
  }
  px_debug("retry_copy_again", PX_U("id", s->id), PX_U("channel", c->client_ch),
           PX_U("delivery_tag", d->tag), PX_S("reason", f->why),
           PX_U("refused_for_ms", now - f->refused_ms));
  c->track.defers_pending--;
  return true;
}

/* One deferred requeue whose time has come. */
static void defer_fire(px_session *s, const px_defer *f) {
  px_chan *c = px_tab_get(&s->by_client, f->client_ch);
  if (!c || c->gen != f->gen || c->state == PX_CH_SERVER_CLOSED)
    return; /* the channel went: the broker requeued the delivery */
  px_delivery *d = px_track_find(c, f->tag);
  if (refused_again(s, c, d, f))
    return;
  if (!f->logged && d) /* it waited for a counted retry that did not come */
    log_deferred(s, d, defer_delay(s, d), f->why);
  if (!emit_settle(s, c, f->is_reject ? AMQP_BASIC_REJECT : AMQP_BASIC_NACK,
                   f->tag, true))
    return;
  px_metrics_inc(s->srv, PX_M_DELAYED, f->why, NULL);
  if (d)
    px_queue_count(s->srv, d->qid, PX_QC_REQUEUED);
  px_track_settle(s, c, f->tag, false);
  if (c->track.defers_pending && --c->track.defers_pending == 0 &&
      c->track.retries_pending == 0)
    px_life_release_held(s, c);
}

void px_retry_defer_due(px_session *s) {
  uint64_t now = now_ms(s);
  px_ring due = {0};
  /* take the due ones out first: releasing held frames may defer more */
  for (uint32_t i = 0; i < s->retry.defers.n;) {
    px_defer *f = defer_at(s, i);
    if (f->due_ms > now) {
      i++;
      continue;
    }
    if (px_ring_reserve(&due, sizeof(px_defer), PX_DEFERS_MAX) != 0)
      break; /* out of memory: the rest wait for the next tick */
    *(px_defer *)px_ring_push(&due, sizeof(px_defer)) = *f;
    *f = *defer_at(s, s->retry.defers.n - 1); /* order does not matter */
    s->retry.defers.n--;
  }
  for (uint32_t i = 0; i < due.n && !px_life_closed(s); i++)
    defer_fire(s, px_ring_at(&due, sizeof(px_defer), i));
  px_ring_free(&due);
  if (!px_life_closed(s))
    arm_defer_timer(s);
}

/* The client's requeue of deliveries [from, to) goes to the broker as
 * it is: counted per queue. */
static void count_requeued(px_session *s, px_chan *c, uint32_t from,
                           uint32_t to) {
  for (uint32_t i = from; i < to; i++) {
    const px_delivery *d = px_dl_at(&c->track, i);
    if (d->state != PX_DL_GONE)
      px_queue_count(s->srv, d->qid, PX_QC_REQUEUED);
  }
}

/* Requeue `d` now (no policy, or it cannot be held back) or after its
 * delay. */
static void requeue_or_defer(px_session *s, px_chan *c, px_delivery *d,
                             bool is_reject, bool retry, const char *why) {
  bool unknown = d->flags & PX_DLF_NO_QUEUE;
  if (unknown) { /* no copy can be made: a pass-through, delayed */
    why = PX_PASS_NO_QUEUE;
    retry = false;
    px_metrics_inc(s->srv, PX_M_PASSTHROUGH, why, NULL);
  } else if (d->state == PX_DL_UNCACHED) { /* nor for one not kept */
    why = WHY(NOT_KEPT);
    retry = false;
  }
  /* a client whose connection.close waits gets no delay: the broker
   * requeues what it leaves unsettled as soon as the close goes on */
  if ((d->rule || unknown) && !px_life_conn_held(s) &&
      defer_requeue(s, c, d, is_reject, retry, why, 0))
    return;
  if (!emit_settle(s, c, is_reject ? AMQP_BASIC_REJECT : AMQP_BASIC_NACK,
                   d->tag, true))
    return;
  px_queue_count(s->srv, d->qid, PX_QC_REQUEUED);
  px_track_forget(s, c, d);
}

/* Deliveries [from, to) of the channel's ring that a requeue covers. */
static void requeue_range(px_chan *c, uint64_t tag, bool multiple,
                          uint32_t *from, uint32_t *to) {
  *from = *to = 0;
  if (multiple) {
    *to = px_track_upto(c, tag);
    return;
  }
  px_delivery *d = px_track_find(c, tag);
  if (d) {
    *from = px_track_index(c, tag);
    *to = *from + 1;
  }
}

static int defer_range(px_session *s, px_chan *c, uint32_t from, uint32_t to,
                       bool is_reject, bool retry, const char *why);

/* Does a requeue of deliveries [from, to) need rebound: a kept delivery
 * (a copy), or one of a queue with a policy not kept, or of a queue
 * rebound cannot name (held back for the tier delay)? Counts in
 * `*uncached` those of intercepted queues not kept. */
static bool requeue_any(px_chan *c, uint32_t from, uint32_t to,
                        uint64_t *uncached) {
  bool any = false;
  for (uint32_t i = from; i < to; i++) {
    const px_delivery *d = px_dl_at(&c->track, i);
    any = any || d->state == PX_DL_CACHED ||
          (d->state == PX_DL_UNCACHED &&
           (d->rule || (d->flags & PX_DLF_NO_QUEUE)));
    *uncached +=
        d->rule && d->state == PX_DL_UNCACHED && !(d->flags & PX_DLF_NO_QUEUE);
  }
  return any;
}

/* A client's nack/reject with requeue=1. Returns PX_FORWARD (nothing to
 * retry: the frame goes on as it is), PX_HOLD (it waits for rebound's
 * channel to reopen) or PX_DROP (replaced by retries and, for deliveries
 * that cannot be retried, individual requeues). */
int px_retry_requeue(px_session *s, px_chan *c, const amqp_method *m) {
  bool is_reject = m->id == AMQP_BASIC_REJECT;
  uint64_t tag = is_reject ? m->args[AMQP_F_BASIC_REJECT_DELIVERY_TAG].u
                           : m->args[AMQP_F_BASIC_NACK_DELIVERY_TAG].u;
  bool multiple = !is_reject && m->args[AMQP_F_BASIC_NACK_MULTIPLE].u;
  px_track *t = &c->track;
  uint32_t from, to;

  requeue_range(c, tag, multiple, &from, &to);
  uint64_t uncached = 0; /* of intercepted queues, over the cache bound */
  bool any = requeue_any(c, from, to, &uncached);
  if (any && px_own_opening(s) && !(multiple && t->lost) &&
      c->state == PX_CH_OPEN && px_own_add_waiter(s, c->client_ch, c->gen)) {
    /* rebound's channel is (re)opening: this requeue, and the channel's
     * later frames, wait for it rather than lose the retry */
    c->held = true;
    return PX_HOLD;
  }
  if (any && (!px_own_is_ready(s) || s->retry.blocked) &&
      !(multiple && t->lost) && c->state == PX_CH_OPEN)
    return defer_range(s, c, from, to, is_reject, true,
                       s->retry.blocked ? WHY(BLOCKED) : WHY(OWN_NOT_READY));
  if (!any || !px_own_is_ready(s) || (multiple && t->lost) ||
      c->state != PX_CH_OPEN) {
    s->srv->stats.uncached_nacks += uncached;
    if (any)
      px_metrics_inc(s->srv, PX_M_PASSTHROUGH, PX_PASS_UNTRACKED, NULL);
    count_requeued(s, c, from, to);
    px_track_settle(s, c, tag, multiple);
    return PX_FORWARD;
  }
  s->srv->stats.uncached_nacks += uncached;
  /* One by one: a copy for what can be retried, a plain requeue for the
   * rest (settled here and now). */
  for (uint32_t i = from; i < to; i++) {
    px_delivery *d = px_dl_at(t, i);
    if (d->state == PX_DL_GONE || d->state == PX_DL_RETRYING)
      continue;
    px_track_observe(s, d); /* the client's decision is now */
    const char *why = try_retry(s, c, d, is_reject);
    if (why)
      requeue_or_defer(s, c, d, is_reject, false, why);
  }
  px_track_tidy(c);
  if (t->retries_pending || t->defers_pending)
    c->held = true; /* later frames of this channel wait for the acks */
  return PX_DROP;
}

/* Hold back the requeues of deliveries [from, to) (none can be retried
 * now). PX_DROP: the client's frame is replaced by them. */
static int defer_range(px_session *s, px_chan *c, uint32_t from, uint32_t to,
                       bool is_reject, bool retry, const char *why) {
  px_track *t = &c->track;
  for (uint32_t i = from; i < to; i++) {
    px_delivery *d = px_dl_at(t, i);
    if (d->state == PX_DL_GONE || px_dl_waiting(d))
      continue;
    px_track_observe(s, d);
    requeue_or_defer(s, c, d, is_reject, retry, why);
  }
  px_track_tidy(c);
  if (t->retries_pending || t->defers_pending)
    c->held = true;
  return PX_DROP;
}

void px_retry_tx_end(px_session *s, px_chan *c, bool rollback) {
  if (rollback && c->tx_acked) {
    s->srv->stats.tx_rolled_back += c->tx_acked;
    px_warn("retry_rolled_back", PX_U("id", s->id), PX_S("peer", s->peer),
            PX_U("channel", c->client_ch), PX_U("originals", c->tx_acked),
            PX_S("note", "tx.rollback took back rebound's acks of retried "
                         "deliveries: their copies are in their tiers and "
                         "the originals are the client's again"));
  }
  c->tx_acked = 0;
}

/* ---- the broker's answers --------------------------------------------------
 */

/* A copy returned unroutable: its tier or dead-letter queue is gone (an
 * operator deleted it). It is declared again (copy_returned forgot
 * it) and the copy republished, once. */
static bool republish(px_session *s, px_chan *c, px_delivery *d,
                      const px_retry_op *op) {
  if (!op->returned || op->again || !px_own_is_ready(s))
    return false;
  s->retry.next_again =
      true; /* the new op, or the parked copy, is a republish */
  const char *why = try_retry(s, c, d, op->is_reject);
  s->retry.next_again = false;
  if (why)
    return false;
  px_info("retry_republished", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_U("delivery_tag", op->tag), PX_S("target", op->target),
          PX_S("reason", "returned by the broker: declared again"));
  return true;
}

/* rebound acked a delivery the client still holds: counted, logged. */
static void timed_out(px_session *s, const px_retry_op *op,
                      const px_delivery *d) {
  s->srv->stats.processing_timeouts++;
  px_queue_count(s->srv, d->qid, PX_QC_TIMED_OUT);
  px_info("processing_timeout", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("queue", op->queue), PX_U("channel", op->client_ch),
          PX_U("delivery_tag", op->tag), PX_S("target", op->target),
          PX_S("action", "copy confirmed, original acked; the client's "
                         "settle of it will be swallowed"));
}

/* Every dead letter at info: which queue, which message, why, after how
 * many attempts, where it went. */
static void log_dead_lettered(px_session *s, const px_retry_op *op,
                              const px_delivery *d, uint64_t us) {
  amqp_content_header h;
  amqp_bytes id = {NULL, 0};
  if (d && d->header_len &&
      amqp_content_header_decode((amqp_bytes){px_dl_content(d), d->header_len},
                                 &h) == AMQP_OK &&
      (h.props.flags & AMQP_P_MESSAGE_ID))
    id = h.props.message_id;
  px_info("dead_lettered", PX_U("id", s->id), PX_S("queue", op->queue),
          PX_B("message_id", id.ptr, id.len), PX_S("reason", op->reason),
          PX_U("attempts", op->attempt), PX_S("target", op->target),
          PX_U("channel", op->client_ch), PX_U("delivery_tag", op->tag),
          PX_U("latency_us", us));
}

/* A copy confirmed and its original acked: counted, logged, and its queue
 * watched (px_watch.h). */
static void count_copy(px_session *s, const px_retry_op *op,
                       const px_delivery *d, uint64_t us) {
  px_metrics_observe(s->srv, PX_H_RETRY, 0, us);
  px_queue_count(s->srv, d ? d->qid : px_metrics_queue(s->srv, op->queue),
                 op->dead_letter ? PX_QC_DEAD_LETTERED : PX_QC_RETRIED);
  px_watch_copied(s->srv, s, op->target, op->queue, op->delay_ms);
  if (op->dead_letter) {
    px_metrics_inc(s->srv, PX_M_DEAD_LETTERED, op->queue, op->reason);
    s->srv->stats.dead_lettered_total++;
    log_dead_lettered(s, op, d, us);
  } else {
    px_metrics_inc(s->srv, PX_M_RETRIES, op->queue, op->tier);
    s->srv->stats.retried_total++;
    px_debug("retry_published", PX_U("id", s->id),
             PX_U("channel", op->client_ch), PX_U("delivery_tag", op->tag),
             PX_S("target", op->target), PX_U("latency_us", us));
  }
}

static void finish(px_session *s, px_retry_op *op, bool ok, const char *why) {
  px_chan *c = px_tab_get(&s->by_client, op->client_ch);
  uint64_t us = now_us(s) - op->started_us;

  if (!c || c->gen != op->gen || c->state == PX_CH_SERVER_CLOSED) {
    px_info("retry_abandoned", PX_U("id", s->id), PX_S("peer", s->peer),
            PX_U("channel", op->client_ch), PX_U("delivery_tag", op->tag),
            PX_S("reason", "channel closed; the broker requeued the delivery"));
    return;
  }
  px_delivery *d = px_track_find(c, op->tag);
  bool timeout = d && (d->flags & PX_DLF_TIMING_OUT);
  if (ok && timeout && px_track_expired_add(c, op->tag) != 0) {
    ok = false; /* its settle could not be swallowed: not acked here */
    why = "too many timed-out deliveries on the channel";
  }
  if (ok) {
    if (!emit_settle(s, c, AMQP_BASIC_ACK, op->tag, false))
      return;
    if (timeout)
      timed_out(s, op, d);
    count_copy(s, op, d, us);
    px_track_settle(s, c, op->tag, false);
    if (c->tx)
      c->tx_acked++; /* the client's commit makes it so */
  } else if (timeout) {
    timeout_abandoned(s, c, d, why);
  } else {
    if (d)
      d->state = PX_DL_CACHED;                   /* no longer being retried */
    bool again = d && refused(s, c, d, op, why); /* after the delay */
    if (!again && (!d || !republish(s, c, d, op))) {
      px_metrics_inc(s->srv, PX_M_FALLBACKS, why, NULL);
      px_warn("retry_fallback", PX_U("id", s->id), PX_S("peer", s->peer),
              PX_U("channel", op->client_ch), PX_U("delivery_tag", op->tag),
              PX_S("target", op->target), PX_S("reason", why),
              PX_S("action", "requeued after the tier delay"));
      if (d)
        requeue_or_defer(s, c, d, op->is_reject, retry_later(why), why);
    }
    px_track_tidy(c);
  }
  if (c->track.retries_pending && --c->track.retries_pending == 0 &&
      c->track.defers_pending == 0)
    px_life_release_held(s, c);
}

/* Complete ops [0, n) and drop them from the ring. */
static void finish_prefix(px_session *s, uint32_t n, bool ok, const char *why) {
  if (n == 0)
    return;
  px_retry_op one, *done = n == 1 ? &one : malloc((size_t)n * sizeof *done);
  if (!done) { /* out of memory: one at a time, each copied on the stack */
    for (uint32_t i = 0; i < n && s->retry.ops.n; i++)
      finish_prefix(s, 1, ok, why);
    return;
  }
  /* copy first: finishing may release held frames that start new ops */
  for (uint32_t i = 0; i < n; i++)
    done[i] = *op_at(s, i);
  px_ring_drop(&s->retry.ops, n);
  arm_deadline(s);
  for (uint32_t i = 0; i < n; i++)
    finish(s, &done[i], ok && !done[i].returned,
           done[i].returned ? WHY(RETURNED) : why);
  if (done != &one)
    free(done);
  s->idle_due = true; /* px_retry_unpark(), then px_frames_retry_idle() */
}

/* Index of the first op whose seq is >= `seq` (ops.n when none). */
static uint32_t op_lower_bound(const px_session *s, uint64_t seq) {
  return px_ring_lower_bound(&s->retry.ops, sizeof(px_retry_op), seq, op_seq);
}

static void copies_confirmed(px_session *s, uint64_t seq, bool multiple,
                             bool ok) {
  if (ok)
    px_own_confirmed(s);
  if (multiple) {
    finish_prefix(s, op_lower_bound(s, seq + 1), ok, WHY(NACKED));
    return;
  }
  uint32_t i = op_lower_bound(s, seq);
  if (i == s->retry.ops.n || op_at(s, i)->seq != seq)
    return; /* already fallen back (confirm timeout) */
  /* bring it to the front, keeping the others in order */
  px_retry_op op = *op_at(s, i);
  for (; i > 0; i--)
    *op_at(s, i) = *op_at(s, i - 1);
  *op_at(s, 0) = op;
  finish_prefix(s, 1, ok, WHY(NACKED));
}

void px_retry_deadline(px_session *s) {
  if (s->retry.blocked) /* the broker reads nothing: no copy is late */
    return;
  uint64_t limit = (uint64_t)s->srv->cfg->retry_confirm_timeout_ms * 1000;
  uint64_t now = now_us(s);
  uint32_t n = 0;
  while (n < s->retry.ops.n && now - op_at(s, n)->started_us >= limit)
    n++;
  if (n)
    px_warn("retry_confirm_timeout", PX_U("id", s->id), PX_S("peer", s->peer),
            PX_U("copies", n), PX_U("timeout_ms", limit / 1000));
  finish_prefix(s, n, false, WHY(CONFIRM_TIMEOUT));
  if (n == 0)
    arm_deadline(s);
}

void px_retry_blocked(px_session *s, bool blocked, amqp_bytes reason,
                      const char *which) {
  if (blocked == s->retry.blocked)
    return;
  uint64_t now = now_ms(s);
  s->retry.blocked = blocked;
  if (blocked) {
    s->retry.blocked_since_ms = now;
    s->srv->stats.upstream_blocked_total++;
    px_warn("upstream_blocked", PX_U("id", s->id), PX_S("peer", s->peer),
            PX_S("connection", which), PX_B("reason", reason.ptr, reason.len),
            PX_U("copies_waiting", s->retry.ops.n),
            PX_S("note", "retries wait until the broker unblocks it"));
    return;
  }
  px_info("upstream_unblocked", PX_U("id", s->id), PX_S("peer", s->peer),
          PX_S("connection", which),
          PX_U("blocked_ms", now - s->retry.blocked_since_ms));
  /* copies in flight get a whole confirm timeout from now */
  uint64_t us = now_us(s);
  for (uint32_t i = 0; i < s->retry.ops.n; i++)
    op_at(s, i)->started_us = us;
  arm_deadline(s);
  own_ready(s);
  /* those still not retried (rebound's channel is not ready) wait for
   * their tier delay from now, as any held-back requeue */
  for (uint32_t i = 0; i < s->retry.defers.n; i++) {
    px_defer *f = defer_at(s, i);
    px_chan *c = px_tab_get(&s->by_client, f->client_ch);
    px_delivery *d = c ? px_track_find(c, f->tag) : NULL;
    if (f->due_ms == PX_DUE_UNBLOCKED)
      f->due_ms = now + (d ? defer_delay(s, d) : 1000);
  }
  arm_defer_timer(s);
}

static void copy_returned(px_session *s, amqp_bytes routing_key) {
  for (uint32_t i = 0; i < s->retry.ops.n; i++) {
    px_retry_op *op = op_at(s, i);
    if (!op->returned && amqp_bytes_eq(routing_key, amqp_cstr(op->target))) {
      op->returned = true;
      break;
    }
  }
  /* the queue is gone: declare it again next time */
  char key[RETRY_NAME_MAX + sizeof s->vhost + 24], name[RETRY_NAME_MAX + 1];
  if (routing_key.len <= RETRY_NAME_MAX) {
    memcpy(name, routing_key.ptr, routing_key.len);
    name[routing_key.len] = '\0';
    alt_key(s, name, key, sizeof key);
    list_remove(&s->srv->as_is, &s->srv->nas_is, key);
  }
  for (uint32_t i = 0; i < s->retry.ndeclared; i++)
    if (amqp_bytes_eq(routing_key, amqp_cstr(s->retry.declared[i]))) {
      free(s->retry.declared[i]);
      s->retry.declared[i] = s->retry.declared[--s->retry.ndeclared];
      break;
    }
}

/* The queue a channel.close's reply text names ("... queue 'NAME' ..."),
 * into q (RETRY_NAME_MAX + 1 bytes). false when it names none. */
static bool closed_queue(amqp_bytes text, char *q) {
  const uint8_t *p = NULL;
  for (size_t i = 0; !p && text.len >= 7 && i <= text.len - 7; i++)
    if (memcmp(text.ptr + i, "queue '", 7) == 0)
      p = text.ptr + i;
  if (!p)
    return false;
  const uint8_t *name = p + 7;
  const uint8_t *end = memchr(name, '\'', text.len - (size_t)(name - text.ptr));
  if (!end || end - name > RETRY_NAME_MAX)
    return false;
  memcpy(q, name, (size_t)(end - name));
  q[end - name] = '\0';
  return true;
}

/* A declare refused with 406: the queue exists with other arguments. It
 * may be the other queue type (pre-declared by an operator, or by an
 * older rebound): declared from now on with that type's arguments, by
 * every connection to the vhost. true when the declare is to be tried
 * again (this connection learnt it, or another one did meanwhile); false
 * when both types were refused (the lesson is dropped: an operator may
 * fix the queue). */
static bool adapt_type(px_session *s, const char *q) {
  px_server *srv = s->srv;
  char key[RETRY_NAME_MAX + sizeof s->vhost + 24];
  alt_key(s, q, key, sizeof key);
  bool used_alt = in_list(s->retry.alt_declared, s->retry.nalt_declared, q);
  bool now_alt = in_list(srv->alt_types, srv->nalt_types, key);
  if (used_alt != now_alt)
    return true;
  if (now_alt) {
    list_remove(&srv->alt_types, &srv->nalt_types, key);
    return false;
  }
  if (!list_add_bounded(&srv->alt_types, &srv->nalt_types, key))
    return false;
  px_info("retry_queue_type_adapted", PX_U("id", s->id),
          PX_S("vhost", s->vhost), PX_S("queue", q),
          PX_S("note", "the queue exists with other arguments: declared "
                       "with those of the other queue type from now on"));
  return true;
}

/* A dead-letter queue refused with 406 under both queue types exists all
 * the same (an operator's, with other arguments): dead letters go to it as
 * it is from now on, by every connection to the vhost. (A tier is not used
 * that way: one without its TTL and route back would keep its copies.)
 * true when learnt (the copy is tried again). */
static bool use_as_is(px_session *s, const char *q) {
  px_server *srv = s->srv;
  char key[RETRY_NAME_MAX + sizeof s->vhost + 24];
  alt_key(s, q, key, sizeof key);
  if (in_list(srv->as_is, srv->nas_is, key))
    return true;
  if (!list_add_bounded(&srv->as_is, &srv->nas_is, key))
    return false;
  srv->stats.topology_errors++;
  px_warn("retry_queue_used_as_is", PX_U("id", s->id), PX_S("vhost", s->vhost),
          PX_S("queue", q),
          PX_S("note", "the dead-letter queue exists with arguments other "
                       "than rebound's (either queue type): dead letters go "
                       "to it as it is"));
  return true;
}

/* rebound's channel was closed by the broker: every copy in flight falls
 * back (those not enqueued are tried again once it is ready). A declare
 * refused for good (403, 405, or 406 under both queue types) names its
 * queue in the reply text; that queue is not tried again on this
 * connection. A 404 (the queue's home node is down) is temporary: the
 * reopen backs off instead. Returns true when the close only taught
 * rebound a queue's type (reopen at once). */
static bool own_lost(px_session *s, uint16_t code, amqp_bytes text) {
  char q[RETRY_NAME_MAX + 1];
  bool adapted = false;
  bool named = closed_queue(text, q);
  /* the refused declare went out just before the first copy to its
   * queue: that copy and every later one were discarded */
  uint32_t k = s->retry.ops.n;
  for (uint32_t i = 0; named && i < s->retry.ops.n && k == s->retry.ops.n; i++)
    if (strcmp(op_at(s, i)->target, q) == 0)
      k = i;
  if (named && (code == AMQP_REPLY_PRECONDITION_FAILED ||
                code == AMQP_REPLY_ACCESS_REFUSED ||
                code == AMQP_REPLY_RESOURCE_LOCKED)) {
    adapted =
        code == AMQP_REPLY_PRECONDITION_FAILED &&
        (adapt_type(s, q) ||
         (k < s->retry.ops.n && op_at(s, k)->dead_letter && use_as_is(s, q)));
    if (!adapted) {
      list_add(&s->retry.broken, &s->retry.nbroken, q);
      s->srv->stats.topology_errors++;
      px_error("retry_topology_error", PX_U("id", s->id), PX_S("peer", s->peer),
               PX_S("queue", q), PX_U("code", code),
               PX_S("note", "requeues of its source are delayed, not "
                            "counted, on this connection; fix or delete "
                            "the queue, or pre-declare it with the "
                            "arguments rebound uses"));
    }
  }
  list_free(&s->retry.declared, &s->retry.ndeclared);
  list_free(&s->retry.alt_declared, &s->retry.nalt_declared);
  finish_prefix(s, k, false, WHY(CHANNEL_LOST));
  finish_prefix(s, s->retry.ops.n, false, WHY(DISCARDED));
  unpark_to_defers(s);
  return adapted;
}

uint32_t px_retry_pending(const px_session *s) {
  uint32_t n = s->retry.ops.n + s->retry.parked.n;
  if (px_own_opening(s))
    n += px_own_nwaiters(s) + s->retry.defers.n + s->retry.lost_waiting;
  return n;
}

/* rebound's channel is ready (again): requeues held back for it get their
 * counted retry now. */
static void own_ready(px_session *s) {
  if (s->retry.ops.n == 0)
    unpark(s);
  if (s->retry.lost_waiting && px_own_is_ready(s) && !s->retry.blocked) {
    s->retry.lost_waiting = false;
    lost_scan(s);
  }
  for (uint32_t i = 0;
       i < s->retry.defers.n && px_own_is_ready(s) && !s->retry.blocked;) {
    px_defer f = *defer_at(s, i);
    px_chan *c = px_tab_get(&s->by_client, f.client_ch);
    px_delivery *d = f.retry && c && c->gen == f.gen && c->state == PX_CH_OPEN
                         ? px_track_find(c, f.tag)
                         : NULL;
    if (!d || d->state != PX_DL_DEFERRED) {
      i++;
      continue;
    }
    d->state = PX_DL_CACHED;
    if (try_retry(s, c, d, f.is_reject)) {
      d->state = PX_DL_DEFERRED; /* still not: it waits for its time */
      defer_at(s, i)->retry = false;
      i++;
      continue;
    }
    *defer_at(s, i) =
        *defer_at(s, s->retry.defers.n - 1); /* order does not matter */
    s->retry.defers.n--;
    c->track.defers_pending--;
  }
  arm_defer_timer(s);
  s->idle_due = true; /* a connection.close that waited for this goes on */
}

int px_retry_own_event(px_session *s, const px_own_event *ev) {
  switch (ev->kind) {
  case PX_OWN_EV_STOP:
    return PX_STOP;
  case PX_OWN_EV_READY:
    own_ready(s);
    px_own_after_ready(s, s->retry.ops.n == 0);
    break;
  case PX_OWN_EV_CONFIRM:
    copies_confirmed(s, ev->seq, ev->multiple, ev->ok);
    break;
  case PX_OWN_EV_RETURNED:
    copy_returned(s, ev->text);
    break;
  case PX_OWN_EV_CLOSED: {
    uint32_t delay = px_own_closed(s, ev, own_lost(s, ev->code, ev->text));
    if (delay) {
      px_own_reopen_after(s, delay);
      px_own_waiting(s);
    }
    break;
  }
  case PX_OWN_EV_NONE:
    break;
  }
  return PX_DROP;
}

void px_retry_pub_lost(px_session *s, const char *why, amqp_bytes text) {
  px_own_pub_loss l = px_own_pub_lost(s);
  uint32_t ms;
  if (l.own)
    own_lost(s, 0, text);
  px_retry_blocked(s, false, amqp_cstr(""), "retry connection");
  if (px_own_pub_lost_after(s, &l, why, text, &ms))
    px_own_reopen_after(s, ms);
  px_own_waiting(s);
}

void px_retry_init(px_session *s, px_timer_fn deadline, px_timer_fn defer) {
  px_timer_init(&s->retry.deadline, deadline, s);
  px_timer_init(&s->retry.defer, defer, s);
}

void px_retry_session_closed(px_session *s) {
  px_timer_close(&s->srv->clock, &s->retry.deadline);
  px_timer_close(&s->srv->clock, &s->retry.defer);
}
