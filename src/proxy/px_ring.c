/* px_ring.c - a growable ring of fixed-size entries (px_ring.h). */
#include "px_ring.h"

#include <stdlib.h>
#include <string.h>

int px_ring_reserve(px_ring *r, size_t size, uint32_t max) {
  if (r->n < r->cap)
    return 0;
  uint32_t cap = r->cap ? r->cap * 2 : 8;
  char *buf = cap <= max && cap > r->cap ? malloc((size_t)cap * size) : NULL;
  if (!buf)
    return -1;
  for (uint32_t i = 0; i < r->n; i++) /* unwrap, oldest first */
    memcpy(buf + (size_t)i * size, px_ring_at(r, size, i), size);
  free(r->buf);
  r->buf = buf;
  r->cap = cap;
  r->head = 0;
  return 0;
}

uint32_t px_ring_lower_bound(const px_ring *r, size_t size, uint64_t key,
                             uint64_t (*key_of)(const void *entry)) {
  uint32_t lo = 0, hi = r->n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (key_of(px_ring_at(r, size, mid)) < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

void px_ring_free(px_ring *r) {
  free(r->buf);
  memset(r, 0, sizeof *r);
}
