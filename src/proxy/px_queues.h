/* px_queues.h - what rebound has seen of each queue: the queues the broker
 * has shown to exist (a consume-ok, a delivery, a get-ok), each with a slot
 * and counts of what became of its deliveries. A leaf: no libuv, no
 * session; the caller passes the time.
 *
 * Bounds: at most PX_QUEUES_MAX names (about 320 bytes each); past them
 * every queue counts in one "other" entry (slot PX_QUEUES_MAX). A slot is
 * taken for good, so register only names the broker has shown to exist.
 */
#ifndef PX_QUEUES_H
#define PX_QUEUES_H

#include <stdint.h>

#define PX_QUEUES_MAX 10000

/* X(id, json name, help) */
#define PX_QUEUE_COUNTS(X)                                                     \
  X(DELIVERED, "delivered",                                                    \
    "deliveries (and basic.get-ok) that the client must settle")               \
  X(DELIVERED_NO_ACK, "delivered_no_ack",                                      \
    "deliveries to no-ack consumers and no-ack gets (never retried)")          \
  X(RETRIED, "retried", "copies confirmed into a delay tier")                  \
  X(DEAD_LETTERED, "dead_lettered",                                            \
    "copies confirmed into the dead-letter queue")                             \
  X(TIMED_OUT, "timed_out",                                                    \
    "deliveries unsettled past the policy's processing_timeout: copied to "    \
    "the tier and acked by rebound")                                           \
  X(CONSUMER_LOST, "consumer_lost",                                            \
    "deliveries counted as failed when their consumer went without "           \
    "settling them (README, \"Consumers that crash\")")                        \
  X(REQUEUED, "requeued",                                                      \
    "requeues sent to the broker as the client's (no policy, or the retry "    \
    "could not happen)")

enum px_queue_count_id {
#define PX__QC_ENUM(id, name, help) PX_QC_##id,
  PX_QUEUE_COUNTS(PX__QC_ENUM)
#undef PX__QC_ENUM
      PX_QC_COUNT
};

extern const char *const px_queue_count_names[PX_QC_COUNT];

typedef struct px_queue_stat {
  char name[256];
  uint64_t n[PX_QC_COUNT];
  uint32_t seen_gen; /* the caller's generation (+1) at its last consume-ok,
                        delivery or count; 0: none */
  /* the owner's (px_view.c): the queue's policy index (-1: none) matched
   * under config generation policy_gen - 1 (0: not matched yet), and the
   * flags already logged */
  int32_t policy;
  uint32_t policy_gen;
  uint8_t logged;
} px_queue_stat;

typedef struct px_queues {
  px_queue_stat *q; /* slots 0 .. n-1 */
  uint32_t n, cap;
  int32_t *index; /* open addressing over slots, -1 empty */
  uint32_t index_cap;
  px_queue_stat other; /* slot PX_QUEUES_MAX */
} px_queues;

/* The slot of `name`, registered if new: 0 .. PX_QUEUES_MAX-1, or
 * PX_QUEUES_MAX ("other") when the registry is full or out of memory.
 * Marks it seen in generation `gen` (any non-zero value the caller
 * chooses: px_counters.c gives the config generation + 1). O(1)
 * expected. */
int px_queues_slot(px_queues *qs, const char *name, uint32_t gen);

/* The entry of a slot; NULL for a negative one (not registered). */
static inline px_queue_stat *px_queues_at(px_queues *qs, int slot) {
  if (slot < 0)
    return (px_queue_stat *)0;
  return (uint32_t)slot < qs->n ? &qs->q[slot] : &qs->other;
}

/* Count one event for a slot (on the path of every delivery: a few
 * instructions, no clock). */
static inline void px_queues_count(px_queues *qs, int slot, int what,
                                   uint32_t gen) {
  px_queue_stat *st = px_queues_at(qs, slot);
  if (st) {
    st->n[what]++;
    st->seen_gen = gen;
  }
}

void px_queues_free(px_queues *qs);

#endif
