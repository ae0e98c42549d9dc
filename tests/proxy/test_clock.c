/* px_clock (px_clock.h): the core's clock and deadlines. A hand-set
 * clock is checked against a plain model (each timer's deadline and start
 * order) over random starts, restarts, stops and advances: every timer
 * fires once per start, at its deadline, in deadline order and, for equal
 * deadlines, in start order; a stopped or closed timer never fires. Then
 * the rules callers rely on: a callback sees its own deadline, one
 * started from a callback runs in the same advance (not in the same run),
 * and a clock on a libuv loop wakes the loop at its earliest deadline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "px_clock.h"

enum { NT = 64, NFIRED = 1 << 16 };

typedef struct fired {
  int id;
  uint64_t at_ms; /* the clock's time in the callback */
} fired;

static px_clock clk;
static px_timer timers[NT];
static fired log_[NFIRED];
static unsigned nlog;

static void on_fire(px_timer *t) {
  assert_true(nlog < NFIRED);
  log_[nlog++] = (fired){(int)(t - timers), px_clock_ms(&clk)};
}

/* The model: when each timer is due (UINT64_MAX: not started), and the
 * order it was started in. */
static uint64_t due[NT], order_[NT], starts;

static uint64_t rnd_state = 88172645463325252ull;
static uint64_t rnd(void) {
  rnd_state ^= rnd_state << 13;
  rnd_state ^= rnd_state >> 7;
  rnd_state ^= rnd_state << 17;
  return rnd_state;
}

/* Advance the clock by `ms` and check what fired against the model: those
 * due by the end, earliest first (start order among equals), each at its
 * deadline. */
static void advance_and_check(uint64_t ms) {
  uint64_t end = px_clock_ms(&clk) + ms;
  int want[NT];
  unsigned nwant = 0;
  for (int i = 0; i < NT; i++)
    if (due[i] <= end)
      want[nwant++] = i;
  for (unsigned a = 0; a < nwant; a++) /* insertion sort by (due, order) */
    for (unsigned b = a; b > 0; b--) {
      int x = want[b - 1], y = want[b];
      if (due[y] < due[x] || (due[y] == due[x] && order_[y] < order_[x])) {
        want[b - 1] = y;
        want[b] = x;
      }
    }
  nlog = 0;
  px_clock_advance(&clk, ms);
  assert_int_equal(nlog, nwant);
  for (unsigned k = 0; k < nwant; k++) {
    assert_int_equal(log_[k].id, want[k]);
    assert_int_equal(log_[k].at_ms, due[want[k]]);
    due[want[k]] = UINT64_MAX;
  }
  assert_int_equal(px_clock_ms(&clk), end);
  uint64_t next = UINT64_MAX;
  for (int i = 0; i < NT; i++)
    if (due[i] < next)
      next = due[i];
  assert_true(px_clock_next(&clk) == next);
}

/* A hand-set clock; every timer on_fire, but timer 0 `first`. */
static void fresh_clock(px_timer_fn first) {
  px_clock_init(&clk, NULL);
  for (int i = 0; i < NT; i++)
    px_timer_init(&timers[i], i ? on_fire : first, NULL);
  nlog = 0;
}

static void test_random_against_model(void **state) {
  (void)state;
  fresh_clock(on_fire);
  for (int i = 0; i < NT; i++)
    due[i] = UINT64_MAX;
  for (int step = 0; step < 20000; step++) {
    int i = (int)(rnd() % NT);
    switch (rnd() % 8) {
    case 0:
    case 1:
    case 2: { /* start or restart; small delays make many ties */
      uint64_t ms = rnd() % 4 == 0 ? 0 : rnd() % 50;
      px_timer_start(&clk, &timers[i], ms);
      due[i] = px_clock_ms(&clk) + ms;
      order_[i] = ++starts;
      break;
    }
    case 3:
      px_timer_stop(&clk, &timers[i]);
      due[i] = UINT64_MAX;
      break;
    case 4:
      px_timer_start_at(&clk, &timers[i], px_clock_ms(&clk) + rnd() % 30);
      due[i] = timers[i].due_ms;
      order_[i] = ++starts;
      break;
    default:
      advance_and_check(rnd() % 20);
      break;
    }
  }
  advance_and_check(1000);
  assert_true(px_clock_next(&clk) == UINT64_MAX);
}

static void test_closed_timer_never_starts(void **state) {
  (void)state;
  fresh_clock(on_fire);
  px_timer_start(&clk, &timers[0], 10);
  px_timer_start(&clk, &timers[1], 20);
  px_timer_close(&clk, &timers[0]);
  px_timer_start(&clk, &timers[0], 5);
  nlog = 0;
  px_clock_advance(&clk, 100);
  assert_int_equal(nlog, 1);
  assert_int_equal(log_[0].id, 1);
}

/* A callback that starts timer 1 at 0 ms and timer 2 a little later. */
static void starts_others(px_timer *t) {
  on_fire(t);
  px_timer_start(&clk, &timers[1], 0);
  px_timer_start(&clk, &timers[2], 7);
}

static void test_started_from_a_callback(void **state) {
  (void)state;
  fresh_clock(starts_others);
  uint64_t t0 = px_clock_ms(&clk);
  px_timer_start(&clk, &timers[0], 0);
  nlog = 0;
  px_clock_run(&clk); /* only what was due when the run began */
  assert_int_equal(nlog, 1);
  px_clock_run(&clk);
  assert_int_equal(nlog, 2);
  assert_int_equal(log_[1].id, 1);
  px_clock_advance(&clk, 10); /* timer 2, at its own time */
  assert_int_equal(nlog, 3);
  assert_int_equal(log_[2].id, 2);
  assert_int_equal(log_[2].at_ms, t0 + 7);
  assert_int_equal(px_clock_ms(&clk), t0 + 10);
}

/* A callback that starts timer 3 at a deadline already past. */
static void starts_one_in_the_past(px_timer *t) {
  on_fire(t);
  px_timer_start_at(&clk, &timers[3], px_clock_ms(&clk) - 50);
}

/* A deadline already past is now: started from a callback, it neither
 * jumps ahead of the timers due before it nor holds them back. */
static void test_past_deadline_is_now(void **state) {
  (void)state;
  fresh_clock(starts_one_in_the_past);
  px_timer_start(&clk, &timers[0], 0);
  px_timer_start(&clk, &timers[1], 0);
  nlog = 0;
  px_clock_run(&clk); /* 0 and 1, due when the run began */
  assert_int_equal(nlog, 2);
  assert_int_equal(log_[1].id, 1);
  assert_true(timers[3].due_ms == px_clock_ms(&clk));
  px_clock_run(&clk);
  assert_int_equal(nlog, 3);
  assert_int_equal(log_[2].id, 3);
}

static void test_hand_set_clock_starts_late_and_moves(void **state) {
  (void)state;
  px_clock_init(&clk, NULL);
  assert_int_equal(px_clock_us(&clk), PX_CLOCK_SET_START_US);
  int64_t wall = px_clock_wall_s(&clk);
  px_clock_advance(&clk, 90 * 1000);
  assert_int_equal(px_clock_wall_s(&clk), wall + 90);
  assert_int_equal(px_clock_us(&clk), PX_CLOCK_SET_START_US + 90000000ull);
}

/* On a loop: one wake-up at the earliest deadline, moved as timers come
 * and go; the loop ends once none is started; close ends the wake timer. */
static void test_on_a_loop(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  px_clock_init(&clk, &loop);
  for (int i = 0; i < 3; i++)
    px_timer_init(&timers[i], on_fire, NULL);
  px_timer_start(&clk, &timers[0], 30);
  px_timer_start(&clk, &timers[1], 1);
  px_timer_start(&clk, &timers[2], 60000);
  px_timer_stop(&clk, &timers[2]); /* the loop must not wait for it */
  nlog = 0;
  uint64_t t0 = uv_now(&loop);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(nlog, 2);
  assert_int_equal(log_[0].id, 1);
  assert_int_equal(log_[1].id, 0);
  assert_true(log_[1].at_ms >= t0 + 30);
  px_clock_close(&clk);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_against_model),
      cmocka_unit_test(test_closed_timer_never_starts),
      cmocka_unit_test(test_started_from_a_callback),
      cmocka_unit_test(test_past_deadline_is_now),
      cmocka_unit_test(test_hand_set_clock_starts_late_and_moves),
      cmocka_unit_test(test_on_a_loop),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
