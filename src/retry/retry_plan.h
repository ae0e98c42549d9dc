/* retry_plan.h - rebound's retry decision, pure.
 *
 * Given the policy, the queue a delivery came from and the retry count it
 * carries, decide what a failure (nack/reject with requeue) becomes:
 * republish to a delay tier with count+1, dead-letter, or pass through
 * unchanged. Also names the queues and describes their arguments, so the
 * proxy only has to send what is decided here. No I/O, no clock.
 *
 * Semantics (README, "Retries"): attempt 1 is the first delivery.
 * A delivery carrying count c is attempt k = c + 1. Its failure, when
 * k < max_attempts, goes to tier min(k, ntiers) with count k; when
 * k >= max_attempts, to the dead-letter queue. A poison message is thus
 * delivered exactly max_attempts times.
 *
 * A rule written as a backoff (initial, multiplier, max, jitter, buckets)
 * is compiled into the same table of tiers: level L (0-based) has the
 * base delay min(max, initial * multiplier^L), and each level has
 * `buckets` tiers whose delays spread the base by +-jitter (bucket b of B:
 * base * (1 + jitter * ((2b + 1) / B - 1))). Levels stop at the first
 * that reaches max, or at max_attempts - 1, whichever comes first; tier
 * index = level * buckets + bucket, the bucket drawn by the caller. Every
 * delay stays a queue-level TTL: a tier's messages all share one.
 */
#ifndef RETRY_PLAN_H
#define RETRY_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RETRY_MAX_TIERS 64 /* tier queues per source queue */
#define RETRY_MAX_BUCKETS 8
#define RETRY_MAX_GLOBS 16
#define RETRY_NAME_MAX 255 /* AMQP shortstr, and the broker's limit */

/* The queue type of a rule's tier and dead-letter queues. AUTO: quorum
 * where the broker dead-letters out of quorum queues at-least-once
 * (RabbitMQ 3.10 and later), classic elsewhere. */
typedef enum retry_queue_type {
  RETRY_QT_AUTO,
  RETRY_QT_QUORUM,
  RETRY_QT_CLASSIC,
} retry_queue_type;

/* "auto", "quorum", "classic" (len bytes of s) into `*out`: 0, or -1. */
int retry_queue_type_parse(const char *s, size_t len, retry_queue_type *out);
const char *retry_queue_type_str(retry_queue_type t);

/* Whether a rule's queues are declared as quorum queues on a broker that
 * can (`broker_quorum_dlx`: it dead-letters out of quorum queues
 * at-least-once) or cannot. */
bool retry_use_quorum(retry_queue_type t, bool broker_quorum_dlx);

/* Exponential backoff with jitter; initial_ms 0: the rule has a fixed
 * list of tiers instead. */
typedef struct retry_backoff {
  uint32_t initial_ms;
  uint32_t max_ms;
  double multiplier; /* 1 .. 100 */
  double jitter;     /* 0 .. 0.5: each delay is base * (1 +- jitter) */
  unsigned buckets;  /* 1 .. RETRY_MAX_BUCKETS tiers per level */
} retry_backoff;

typedef struct retry_rule {
  char globs[RETRY_MAX_GLOBS][RETRY_NAME_MAX + 1];
  unsigned nglobs;
  uint32_t tiers_ms[RETRY_MAX_TIERS];
  unsigned ntiers;
  unsigned nbuckets; /* tiers per level: 0 or 1 for a fixed list */
  retry_backoff backoff;
  uint32_t max_attempts;
  char dead_letter[RETRY_NAME_MAX + 1]; /* "{queue}" is replaced */
  retry_queue_type queue_type;
  /* a delivery unsettled this long is a failed attempt (0: never) */
  uint32_t processing_timeout_ms;
} retry_rule;

typedef struct retry_policy {
  char header_prefix[64];
  retry_rule *rules; /* first match wins */
  unsigned nrules;
} retry_policy;

/* A rule with the defaults (README, "Retries"): every queue, tiers 1s/2s/4s,
 * max_attempts 4, dead letter "{queue}.dlq". */
void retry_rule_default(retry_rule *r);

/* A backoff with the defaults of the README ("Backoff"): initial 1s,
 * multiplier 2, max 10m, jitter 0.2, 4 buckets. */
void retry_backoff_default(retry_backoff *b);

/* Fill a backoff rule's tiers (nothing to do for a fixed list). Call after
 * max_attempts is final. 0, or -1 with the reason in err (which names the
 * value and the expected form). */
int retry_rule_compile(retry_rule *r, char *err, size_t cap);

/* Levels of a rule: distinct base delays (its tiers for a fixed list). */
unsigned retry_levels(const retry_rule *r);

/* The first rule whose globs match `queue` (len bytes), or NULL. */
const retry_rule *retry_match(const retry_policy *p, const char *queue,
                              size_t len);

typedef enum retry_action {
  RETRY_PASS,        /* forward the client's nack/reject unchanged */
  RETRY_REPUBLISH,   /* copy to plan.target (a tier), then ack */
  RETRY_DEAD_LETTER, /* copy to plan.target (the DLQ), then ack */
} retry_action;

/* Why a failure passes through. X(name, text) */
#define RETRY_PASS_MAP(X)                                                      \
  X(NONE, "-")                                                                 \
  X(NO_POLICY, "no policy for the queue")                                      \
  X(SERVER_NAMED, "server-named queue (amq.*)")                                \
  X(NAME_TOO_LONG, "tier or dead-letter name over 255 bytes")

typedef enum retry_pass_reason {
#define RETRY__PASS_ENUM(name, text) RETRY_PASS_##name,
  RETRY_PASS_MAP(RETRY__PASS_ENUM)
#undef RETRY__PASS_ENUM
      RETRY_PASS_COUNT
} retry_pass_reason;

const char *retry_pass_reason_str(retry_pass_reason r);

typedef struct retry_plan {
  retry_action action;
  retry_pass_reason reason; /* for RETRY_PASS */
  uint32_t attempt;         /* the attempt that failed (1-based) */
  uint32_t new_count;       /* count header for the copy */
  bool count_untrusted;     /* the count was not a non-negative integer
                               below 2^32 - 2: planned as a first attempt */
  unsigned tier;            /* index into tiers_ms (REPUBLISH) */
  uint32_t delay_ms;
  char target[RETRY_NAME_MAX + 1]; /* tier queue or DLQ */
  size_t target_len;
} retry_plan;

/* The tier the failure of a delivery carrying `count` goes to (-1 or any
 * invalid count: the first level), for a rule with at least one tier;
 * `draw` (any 32-bit random value) picks the bucket within the level. */
unsigned retry_tier_for(const retry_rule *rule, int64_t count, uint32_t draw);

/* Decide for one failed delivery. `rule` may be NULL (no policy).
 * `count` is the retry count header's value, or -1 when absent; any other
 * negative value is invalid. An invalid count, or one too large to count
 * on from (2^32 - 2 or more), cannot be trusted: the failure is planned as
 * a first attempt (its copy carries a count of rebound's, so the message
 * still ends) and plan->count_untrusted says so. `draw` is a random value
 * for the jitter
 * bucket (unused by fixed tiers). Always fills `*plan`. */
void retry_decide(const retry_rule *rule, const char *queue, size_t len,
                  int64_t count, uint32_t draw, retry_plan *plan);

/* "Q.retry.<delay>" for tier i of `rule` into out (cap >= 256). A name
 * that would exceed 255 bytes (the broker's limit) is shortened
 * deterministically: Q becomes its longest prefix that fits without
 * cutting a UTF-8 sequence, then '~' and 16 hex digits of a 64-bit FNV-1a
 * hash of the whole of Q, so distinct queues keep distinct tiers. Returns
 * the length, or -1 when even that cannot fit. */
int retry_tier_name(const retry_rule *rule, unsigned tier, const char *queue,
                    size_t len, char *out, size_t cap);

/* The dead-letter queue name for `queue` ("{queue}" in the rule's
 * template stands for it). Same contract and shortening. */
int retry_dlq_name(const retry_rule *rule, const char *queue, size_t len,
                   char *out, size_t cap);

/* Header names: prefix + suffix ("rebound-" + "retry-count"). Returns the
 * length or -1 if it does not fit `cap`. */
int retry_header_name(const retry_policy *p, const char *suffix, char *out,
                      size_t cap);

#endif
