/* px_ring.h - a growable ring of fixed-size entries, oldest first.
 *
 * Appending at the tail and dropping from the head are O(1) (amortised
 * for growth); an entry is found by index. Entries kept in key order (a
 * delivery tag, a publish sequence number) are found by binary search. The
 * capacity is a power of two and bounded by the caller. The ring owns its
 * buffer; entries are moved by value when it grows, so pointers into it are
 * valid only until the next px_ring_reserve().
 */
#ifndef PX_RING_H
#define PX_RING_H

#include <stddef.h>
#include <stdint.h>

typedef struct px_ring {
  void *buf;
  uint32_t head, n, cap;
} px_ring;

/* The i-th oldest entry (i < n) of a ring of `size`-byte entries. */
static inline void *px_ring_at(const px_ring *r, size_t size, uint32_t i) {
  return (char *)r->buf + (size_t)((r->head + i) & (r->cap - 1)) * size;
}

/* Make room for one more entry at the tail, doubling up to `max` entries
 * (a power of two). Returns 0, or -1 at the bound or out of memory (the
 * ring is unchanged). */
int px_ring_reserve(px_ring *r, size_t size, uint32_t max);

/* Append: the new tail entry (after a successful px_ring_reserve). */
static inline void *px_ring_push(px_ring *r, size_t size) {
  return px_ring_at(r, size, r->n++);
}

/* Drop the `k` oldest entries (k <= n). */
static inline void px_ring_drop(px_ring *r, uint32_t k) {
  if (r->n) /* cap > 0 */
    r->head = (r->head + k) & (r->cap - 1);
  r->n -= k;
}

/* The index of the first entry whose key is >= `key` (n when none), for a
 * ring sorted by `key_of`. */
uint32_t px_ring_lower_bound(const px_ring *r, size_t size, uint64_t key,
                             uint64_t (*key_of)(const void *entry));

void px_ring_free(px_ring *r);

#endif
