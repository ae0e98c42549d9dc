/* px_ring (px_ring.h): the ring under the unsettled deliveries, the
 * retry operations and the held-frame release queue. Each test compares
 * the ring with a plain model (the entries that should be there, oldest
 * first) after every step: wrap-around, growth while wrapped, drops of
 * several at once, binary search across the wrap, the bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "px_ring.h"

typedef struct entry {
  uint64_t key;
  uint32_t pad[3]; /* an entry larger than its key, as px_delivery is */
} entry;

static uint64_t key_of(const void *e) {
  return ((const entry *)e)->key;
}

static entry *at(const px_ring *r, uint32_t i) {
  return px_ring_at(r, sizeof(entry), i);
}

static void push(px_ring *r, uint64_t key, uint32_t max) {
  assert_int_equal(px_ring_reserve(r, sizeof(entry), max), 0);
  entry *e = px_ring_push(r, sizeof(entry));
  e->key = key;
  e->pad[0] = e->pad[2] = (uint32_t)key ^ 0xa5a5a5a5u;
}

/* The ring holds exactly keys first..first+n-1, in order, intact. */
static void check(const px_ring *r, uint64_t first, uint32_t n) {
  assert_int_equal(r->n, n);
  for (uint32_t i = 0; i < n; i++) {
    entry *e = at(r, i);
    assert_int_equal(e->key, first + i);
    assert_int_equal(e->pad[0], (uint32_t)(first + i) ^ 0xa5a5a5a5u);
    assert_int_equal(e->pad[2], e->pad[0]);
  }
}

/* Appending at the tail and dropping at the head keeps a capacity of 8
 * while the head goes round it several times. */
static void test_wrap_around(void **state) {
  (void)state;
  px_ring r = {0};
  uint64_t first = 1, next = 1;
  for (int round = 0; round < 40; round++) {
    while (r.n < 6)
      push(&r, next++, 1024);
    check(&r, first, r.n);
    px_ring_drop(&r, 4); /* several settled at once */
    first += 4;
    check(&r, first, r.n);
  }
  assert_int_equal(r.cap, 8);
  assert_true(r.head != 0 || next > 8); /* it wrapped */
  px_ring_free(&r);
}

/* Growth while the head is in the middle unwraps the entries in order. */
static void test_growth_while_wrapped(void **state) {
  (void)state;
  px_ring r = {0};
  for (uint64_t k = 1; k <= 8; k++)
    push(&r, k, 1024);
  px_ring_drop(&r, 5);               /* head at 5, three left */
  for (uint64_t k = 9; k <= 13; k++) /* wraps: the ring is full again */
    push(&r, k, 1024);
  assert_int_equal(r.cap, 8);
  check(&r, 6, 8);
  push(&r, 14, 1024); /* grows from a wrapped ring */
  assert_int_equal(r.cap, 16);
  check(&r, 6, 9);
  for (uint64_t k = 15; k <= 100; k++)
    push(&r, k, 1024);
  check(&r, 6, 95);
  px_ring_free(&r);
}

/* The index of the first key >= k, with keys that have gaps (settled
 * tags), across the wrap. */
static void test_lower_bound_across_wrap(void **state) {
  (void)state;
  px_ring r = {0};
  for (uint64_t k = 0; k < 8; k++)
    push(&r, 10 * k, 1024);
  px_ring_drop(&r, 6); /* 60, 70 */
  for (uint64_t k = 8; k < 14; k++)
    push(&r, 10 * k, 1024); /* 80 .. 130 wrap */
  assert_int_equal(r.n, 8);
  for (uint64_t key = 0; key <= 140; key++) {
    uint32_t want = key <= 60 ? 0 : (uint32_t)((key - 60 + 9) / 10);
    if (want > r.n)
      want = r.n;
    assert_int_equal(px_ring_lower_bound(&r, sizeof(entry), key, key_of), want);
  }
  px_ring_free(&r);
}

/* At the bound, reserve fails and leaves the ring as it was. */
static void test_bound(void **state) {
  (void)state;
  px_ring r = {0};
  for (uint64_t k = 1; k <= 16; k++)
    push(&r, k, 16);
  assert_int_equal(px_ring_reserve(&r, sizeof(entry), 16), -1);
  check(&r, 1, 16);
  px_ring_drop(&r, 1);
  push(&r, 17, 16); /* room again: no growth needed */
  check(&r, 2, 16);
  assert_int_equal(r.cap, 16);
  px_ring_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wrap_around),
      cmocka_unit_test(test_growth_while_wrapped),
      cmocka_unit_test(test_lower_bound_across_wrap),
      cmocka_unit_test(test_bound),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
