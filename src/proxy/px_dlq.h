/* px_dlq.h - operations on dead-letter queues, over a connection of
 * rebound's own to the broker (px_pub_dial(): the configured upstreams,
 * logged in with the caller's user and password as PLAIN, so the broker's
 * permissions decide what may be done).
 *
 * One operation per connection, on channel 1:
 *   COUNT    queue.declare passive for each queue: exists, messages,
 *            consumers (a queue that does not exist, may not be read
 *            (403) or is another connection's exclusive one (405) closes
 *            the channel; it is opened again for the next). With no queue, only
 * the login and the vhost are checked. SHOW     browse up to `limit` messages
 * without removing them: basic.get without ack, then channel.close, on which
 * the broker requeues them; done follows the broker's close-ok, so the messages
 * are back when the caller hears of it. A classic queue puts them back at their
 * places; they come back marked redelivered, and a quorum queue counts a
 * delivery in their x-delivery-count. While browsed, other consumers do not get
 *            them.
 *   REDRIVE  each message (basic.get, up to `limit`) is published to its
 *            source queue (the `source-queue` header, or `to`) through the
 *            default exchange, mandatory, with the retry count and the
 *            dead-letter reason removed and `redriven-at` set, every other
 *            property and header kept; once the broker confirms the copy,
 *            the message is acked in the dead-letter queue. Never lost: a
 *            message whose copy was not confirmed stays (it is requeued
 *            when the channel closes). At worst duplicated: a run cut short
 *            (px_dlq_cancel, a lost connection, a crash) leaves in both
 *            queues the copies the broker routed but rebound had not seen
 *            confirmed; px_dlq_stop() settles them first. A copy the
 *            broker returns (no such queue) stops the run: its message
 *            stays, the others are settled as usual. A message whose
 *            source is the dead-letter queue itself stays. At most
 *            PX_DLQ_WINDOW copies (and PX_DLQ_WINDOW_BYTES of them) are
 *            unconfirmed at once. Acks go out at most a few between two
 *            gets, and a run's last acks are followed by one more get
 *            before the channel closes (px_dlq.c, pump: a quorum queue
 *            may otherwise drop acks sent just before a close); a message
 *            that get takes stays, and comes back marked redelivered.
 *            `dry_run`: browsed as SHOW, each message reported, nothing
 *            moved.
 *   PURGE    without a limit queue.purge (the count is the broker's);
 *            with one, basic.get with no-ack up to `limit` (each get-ok is
 *            one message removed).
 * SHOW, REDRIVE and PURGE with a limit take at most the messages the
 * queue held at the start (queue.declare passive): messages that arrive
 * meanwhile (a redriven one failing again) wait for the next run, so a
 * run always ends. An operation waits at most PX_DLQ_IDLE_MS for any
 * frame from the broker, then fails.
 *
 * Events reach the owner from the loop, never from inside px_dlq_start();
 * `done` is the last, and the operation frees itself after it.
 */
#ifndef PX_DLQ_H
#define PX_DLQ_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "amqp.h"
#include "px_config.h"
#include "px_dial.h"

#define PX_DLQ_WINDOW 256
#define PX_DLQ_WINDOW_BYTES (8u * 1024 * 1024)
#define PX_DLQ_IDLE_MS 30000
#define PX_DLQ_MAX_BODY (256u * 1024 * 1024)
#define PX_DLQ_MAX_QUEUES 64 /* COUNT */

typedef enum px_dlq_kind {
  PX_DLQ_COUNT,
  PX_DLQ_SHOW,
  PX_DLQ_REDRIVE,
  PX_DLQ_PURGE,
} px_dlq_kind;

/* X(name, CLI exit code, HTTP status, text) */
#define PX_DLQ_STATUSES(X)                                                     \
  X(OK, 0, 200, "done")                                                        \
  X(FAILED, 1, 502, "failed part-way")                                         \
  X(UNREACHABLE, 3, 502, "no broker reachable")                                \
  X(REFUSED, 4, 403, "refused by the broker")                                  \
  X(NOT_FOUND, 5, 404, "no such queue") /* also a redrive's target */

typedef enum px_dlq_status {
#define PX__DLQ_STATUS_ENUM(name, code, http, text) PX_DLQ_##name,
  PX_DLQ_STATUSES(PX__DLQ_STATUS_ENUM)
#undef PX__DLQ_STATUS_ENUM
} px_dlq_status;

int px_dlq_exit_code(px_dlq_status s);
int px_dlq_http_status(px_dlq_status s);
const char *px_dlq_status_text(px_dlq_status s);

typedef struct px_dlq_request {
  px_dlq_kind kind;
  char user[256], password[256], vhost[256];
  char queue[256]; /* SHOW, REDRIVE, PURGE */
  char to[256];    /* REDRIVE: the target for every message ("": each
                      message's source queue) */
  uint64_t limit;  /* messages; 0: all */
  bool dry_run;    /* REDRIVE */
  bool heal;       /* REDRIVE of a tier's copies back to their source
                      (`to`): every header kept as it is (the copy's
                      retry count included), `tier-healed-at` set */
  char queues[PX_DLQ_MAX_QUEUES][RETRY_NAME_MAX + 1]; /* COUNT */
  unsigned nqueues;
  const char *name; /* the connection's name at the broker */
} px_dlq_request;

/* COUNT: one queue. */
typedef struct px_dlq_count {
  const char *name;
  bool exists;
  uint32_t messages, consumers;
  const char *error; /* the broker refused to say (403, 405: its text), or
                        NULL; exists is then not known */
  uint16_t code;     /* ... its reply code (405: another connection's
                        exclusive queue, which exists) */
} px_dlq_count;

/* SHOW and a dry-run REDRIVE: one message, valid during the event. */
typedef struct px_dlq_message {
  uint64_t index; /* 1, 2, ... */
  bool redelivered;
  amqp_bytes exchange, routing_key;
  const amqp_content_header *header;
  const uint8_t *body;
  uint64_t body_len;
} px_dlq_message;

typedef struct px_dlq_result {
  px_dlq_status status;
  uint16_t code;      /* the broker's reply code, 0 if none */
  const char *error;  /* what failed (the broker's text), "" when OK */
  uint64_t total;     /* messages in the queue at the start */
  uint64_t browsed;   /* SHOW, dry run */
  uint64_t moved;     /* REDRIVE: confirmed and acked */
  uint64_t not_moved; /* REDRIVE: left in the queue: taken and not moved,
                         and after a failure those not taken */
  uint64_t unsourced; /* REDRIVE: of those, without a source to go to */
  uint64_t unsettled; /* REDRIVE: copies published whose message was not
                         acked (a run cut short): they may be in both
                         queues */
  uint64_t nacked;    /* REDRIVE: copies the broker nacked (their messages
                         stay) */
  bool logged_in;     /* the broker accepted the login (a refusal after it
                         is about a queue, not the credentials) */
  uint64_t purged;    /* PURGE */
} px_dlq_result;

typedef struct px_dlq_events {
  void (*count)(void *ctx, const px_dlq_count *c);
  void (*message)(void *ctx, const px_dlq_message *m);
  /* REDRIVE and PURGE: after each message moved or removed */
  void (*progress)(void *ctx, uint64_t done, uint64_t total);
  void (*done)(void *ctx, const px_dlq_result *r);
  /* REDRIVE (may be NULL: every message): whether to move this message;
   * false ends the run there, and it and the rest stay */
  bool (*take)(void *ctx, const px_dlq_message *m);
} px_dlq_events;

typedef struct px_dlq px_dlq;

/* Add a queue to a request's list (COUNT), once: 0 (added, or there
 * already), -1 when the list is full or the name longer than 255 bytes. */
int px_dlq_add_queue(px_dlq_request *q, const char *name);

/* Add the dead-letter queue of every queue the policy names without a
 * wildcard (those rebound knows without having seen them). */
void px_dlq_add_policy_queues(px_dlq_request *q, const retry_policy *p);

/* Start an operation (the request is copied; the passwords in it are
 * wiped). NULL when out of memory. */
px_dlq *px_dlq_start(uv_loop_t *loop, px_clock *clock, const px_config *cfg,
                     px_dial_memory *memory, struct px_tls_ctx *tls,
                     const px_dlq_request *req, const px_dlq_events *ev,
                     void *ctx);

/* Stop taking messages: copies in flight are settled (acked in the
 * dead-letter queue once confirmed), browsed messages given back, then
 * `done` says FAILED, "interrupted". A purge without a limit (one
 * queue.purge) runs on to its answer. A second call does nothing. */
void px_dlq_stop(px_dlq *d);

/* No more events: the connection closes (messages browsed or not yet
 * confirmed are requeued by the broker); freed as the loop runs. */
void px_dlq_cancel(px_dlq *d);

#endif
