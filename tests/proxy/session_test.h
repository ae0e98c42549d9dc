/* session_test.h - what the cmocka tests over session_harness.h share:
 * failures reported through cmocka, a harness per test freed in the
 * teardown, the policy most tests use, and expect_line() with a format.
 * Include after <cmocka.h>. */
#ifndef SESSION_TEST_H
#define SESSION_TEST_H

#include <stdio.h>

#include "session_harness.h"

/* The policy of most tests: queue q, one tier of 1 s, 3 attempts. */
#define POLICY                                                                 \
  "--retry-queues", "q", "--retry-tiers", "1s", "--max-attempts", "3",         \
      "--retry-confirm-timeout", "200ms"

static inline void cmocka_fail(const char *msg) {
  fail_msg("%s", msg);
}

static inline harness *start(void **state, const char *const *args) {
  harness *h = h_new(args);
  assert_non_null(h);
  *state = h;
  return h;
}

static inline int teardown(void **state) {
  h_free(*state);
  *state = NULL;
  return 0;
}

#define expect_line(h, side, ...)                                              \
  do {                                                                         \
    char line_[512];                                                           \
    snprintf(line_, sizeof line_, __VA_ARGS__);                                \
    h_expect(h, side, line_);                                                  \
  } while (0)

#endif
