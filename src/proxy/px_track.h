/* px_track.h - what a channel's deliveries are, for the retry path.
 *
 * Per channel: consumer tag -> queue (client-chosen and server-generated
 * tags), basic.get requests in flight, and every delivery the client must
 * still settle (ack mode only), in delivery-tag order. A delivery from a
 * queue with a retry policy also keeps its content header and body, within
 * the per-connection and process-wide cache bounds, so that a nack can be
 * turned into a republished copy.
 *
 * Bounds: at most PX_TRACK_MAX unsettled deliveries, PX_TRACK_MAX requests
 * in flight and PX_TRACK_MAX_CONSUMERS consumers per channel (past them the
 * channel is marked `lost`: its requeues pass through, never wrongly
 * retried); nothing is tracked on a channel that is closing or that the
 * broker closed.
 */
#ifndef PX_TRACK_H
#define PX_TRACK_H

#include <stdbool.h>
#include <stdint.h>

#include "amqp.h"
#include "px_ring.h"
#include "retry_plan.h"

typedef struct px_consumer {
  char *tag; /* NUL-terminated copy */
  uint8_t tag_len;
  bool no_ack;
  char *queue; /* NULL: not known (px_track.last_queue); its requeues pass
                  through, delayed and counted */
  uint32_t decl_wait; /* queue NULL: the declare-ok that names it, 0: none */
  const retry_rule *rule; /* the queue's policy, matched once; NULL: none */
  uint32_t gen;           /* ... under this config generation; `rule` is
                             used only while gen is the server's cfg_gen */
  int qid;      /* metrics label slot of `queue`; -1 until the broker has shown
                   the consumer exists (consume-ok or a first delivery) */
  uint32_t cid; /* the channel's number for it, 1, 2, ... (px_track.cids) */
} px_consumer;

/* basic.consume / basic.get waiting for their answer, in order. */
typedef struct px_request {
  bool is_get;
  bool no_ack;
  char *queue; /* NULL: not known, or named by declare-ok `decl_wait` */
  uint32_t decl_wait;
  char *tag; /* consume: the client's tag ("" for server-generated) */
} px_request;

typedef enum px_dl_state {
  PX_DL_UNCACHED, /* tracked for settlement only */
  PX_DL_CAPTURE,  /* header/body being copied */
  PX_DL_CACHED,   /* can be retried */
  PX_DL_RETRYING, /* a copy is being published */
  PX_DL_DEFERRED, /* its requeue waits for the tier delay */
  PX_DL_GONE,     /* settled: a hole in the queue, skipped */
} px_dl_state;

/* px_delivery.flags */
enum {
  PX_DLF_TIMEOUT_FAILED = 1, /* its timeout's copy failed: the client keeps
                                it */
  PX_DLF_REDELIVERED = 2,    /* the broker said it was delivered before */
  PX_DLF_LOST = 4,           /* counted for a lost consumer: its copies say
                                consumer-lost, through parking and retries */
  PX_DLF_TIMING_OUT = 8,     /* its copy is for a processing timeout: a
                                failure leaves it with the client, success
                                swallows the client's settle */
  PX_DLF_NO_QUEUE = 16,      /* its queue is not known: its requeue passes
                                through, delayed and counted */
  PX_DLF_BAD_COUNT = 32      /* its count header was found unreadable (and
                                counted, logged) */
};

/* 64 bytes: a kept delivery costs this, its ring slot, and one
 * allocation of its names and content. */
typedef struct px_delivery {
  uint64_t tag;
  const retry_rule *rule;
  uint64_t delivered_us;
  /* A kept delivery's one allocation: queue NUL exchange NUL routing-key
   * NUL (names_len bytes), then, once its header came, the content:
   * header payload, then body (px_dl_content()). */
  char *names;
  uint32_t cid;        /* its consumer's px_consumer.cid; 0: a basic.get */
  uint32_t gen;        /* config generation of `rule` */
  int qid;             /* metrics label slot of its queue */
  uint32_t header_len; /* 0 until the content header came */
  uint32_t body_len, body_have; /* header_len + body_len counts against the
                                   cache bounds (at most UINT32_MAX) */
  uint16_t names_len;
  uint8_t state; /* px_dl_state */
  uint8_t flags; /* PX_DLF_* */
} px_delivery;

/* Unsettled deliveries of a channel, oldest first (px_ring.h). Tags grow,
 * so the ring is sorted by tag and found by binary search; settling the
 * oldest pops it, settling one in the middle leaves a PX_DL_GONE hole that
 * is popped when it reaches an end, and holes are squeezed out once they
 * are half the ring. Every operation is O(log n) or amortised O(1). */
typedef struct px_dlq {
  px_ring r; /* px_delivery */
  uint32_t ngone;
} px_dlq;

typedef struct px_track {
  px_consumer *consumers;
  uint32_t nconsumers;
  uint32_t cids;    /* the last px_consumer.cid given */
  px_ring requests; /* px_request: basic.consume/get in flight, in order */
  px_dlq dl;
  uint64_t capture; /* tag of the newest delivery, whose content is
                       arriving and being kept; 0: none */
  /* The content size of the channel's last kept delivery (at most
   * PX_CONTENT_HINT_MAX): a delivery's names are allocated with that much
   * room behind them, so its content mostly needs no second allocation
   * (deliveries come one after the other: the hint is still the room when
   * the header of the delivery being captured comes) */
  uint32_t content_hint;
  /* The queue the broker takes for a basic.consume or basic.get that
   * names "": the channel's most recently declared queue. NULL: not known
   * (none declared, or a server-named one declared no-wait, whose name
   * the broker never tells); decl_wait > 0: declare-ok number decl_wait
   * (decl_oks counts them) will name it. decl_sent counts the declares
   * that get a declare-ok. */
  char *last_queue;
  uint32_t decl_sent, decl_oks, decl_wait;
  uint32_t retries_pending;
  uint32_t defers_pending; /* requeues waiting for their delay */
  bool lost; /* a delivery could not be tracked: multiple-nacks pass */
  /* deliveries rebound acked for a processing timeout, that the client
   * has yet to settle (its settle is swallowed), ascending */
  uint64_t *expired;
  uint32_t nexpired, cap_expired;
  /* publisher confirms of the client's own publishes (for metrics) */
  bool confirm;
  uint64_t *pub_us; /* ring: publish times of unconfirmed publishes */
  uint32_t pub_head, pub_n, pub_cap;
  uint64_t pub_seq; /* sequence number of the oldest in the ring */
} px_track;

/* The i-th oldest entry of the unsettled deliveries (i < dl.r.n), holes
 * included. */
static inline px_delivery *px_dl_at(const px_track *t, uint32_t i) {
  return px_ring_at(&t->dl.r, sizeof(px_delivery), i);
}

/* The kept content: header payload (header_len bytes), then body; NULL
 * before the header came. */
static inline const uint8_t *px_dl_content(const px_delivery *d) {
  return d->header_len ? (const uint8_t *)d->names + d->names_len : NULL;
}

/* Is the delivery's requeue in rebound's hands: a copy on its way, or a
 * requeue waiting for its delay? */
static inline bool px_dl_waiting(const px_delivery *d) {
  return d->state == PX_DL_RETRYING || d->state == PX_DL_DEFERRED;
}

static inline const char *px_dl_queue(const px_delivery *d) {
  return d->names;
}
static inline const char *px_dl_exchange(const px_delivery *d) {
  return d->names + strlen(d->names) + 1;
}
static inline const char *px_dl_routing_key(const px_delivery *d) {
  const char *e = px_dl_exchange(d);
  return e + strlen(e) + 1;
}

/* The tracking of one session's channels (px_track.c). */
struct px_session;
struct px_chan;

/* What the client and the broker say about deliveries. Each returns true
 * when a delivery or a consumer of a queue with a policy appeared (rebound's
 * channel is wanted). */
bool px_track_client_method(struct px_session *s, struct px_chan *c,
                            const amqp_method *m);
bool px_track_upstream_method(struct px_session *s, struct px_chan *c,
                              const amqp_method *m);
/* A header or body frame from the broker: kept when it belongs to the
 * delivery being captured (px_track.capture; callers on the hot path test
 * that first, as most content belongs to none). */
void px_track_content(struct px_session *s, struct px_chan *c,
                      const amqp_frame *f);
bool px_track_deliver(struct px_session *s, struct px_chan *c,
                      amqp_bytes payload);
void px_track_settle(struct px_session *s, struct px_chan *c, uint64_t tag,
                     bool multiple);
void px_track_clear(struct px_session *s, struct px_chan *c);
void px_track_free(struct px_session *s, struct px_chan *c);
px_delivery *px_track_find(struct px_chan *c, uint64_t tag);
/* Expired tags (px_track.expired): record one (0, or -1 when full or out
 * of memory: then it must not be acked by rebound), look one up, and
 * forget those up to `tag` (all for 0), returning how many. */
int px_track_expired_add(struct px_chan *c, uint64_t tag);
bool px_track_expired_has(const struct px_chan *c, uint64_t tag);
uint32_t px_track_expired_drop(struct px_chan *c, uint64_t tag, bool upto);
/* The newest unsettled tracked delivery with a tag below `tag` (0: none). */
uint64_t px_track_below(const struct px_chan *c, uint64_t tag);

/* The tag of the consumer a delivery went to: "" for a basic.get, NULL
 * when that consumer is gone (cancelled). */
const char *px_track_consumer_tag(const struct px_chan *c,
                                  const px_delivery *d);
/* How many of the oldest unsettled entries (holes included) have a tag
 * <= `tag` (0: all of them). */
uint32_t px_track_upto(const struct px_chan *c, uint64_t tag);
/* Index of the entry with `tag` (or of the first after it). */
uint32_t px_track_index(const struct px_chan *c, uint64_t tag);
/* Free a delivery and leave a hole for it (no reshuffle: indexes stay
 * valid until px_track_tidy()). */
void px_track_forget(struct px_session *s, struct px_chan *c, px_delivery *d);
/* Pop holes at both ends; squeeze them out when they are too many. */
void px_track_tidy(struct px_chan *c);
/* Free a delivery's copies and give its bytes back to the cache bounds
 * (its tag stays); px_track_forget() also takes it out of the ring. */
void px_track_release(struct px_session *s, px_delivery *d);
/* Deliver-to-settle time of a delivery the client settles now. */
void px_track_observe(struct px_session *s, const px_delivery *d);
/* confirm.select / basic.publish / the broker's confirms on a client
 * channel: publish-to-confirm times. */
void px_track_publish(struct px_session *s, struct px_chan *c);
void px_track_confirmed(struct px_session *s, struct px_chan *c,
                        amqp_bytes payload);

#endif
