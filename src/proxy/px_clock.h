/* px_clock.h - the time the proxy core reads, and its deadlines.
 *
 * The core (sessions, retries, tracking) never asks libuv or the system
 * what time it is and holds no libuv timer: it reads a px_clock and arms
 * px_timers on it. A clock runs in one of two ways:
 *
 *   - on a loop (the process): its time is the loop's, and one uv_timer
 *     wakes the loop at the earliest deadline of all the clock's timers;
 *   - by hand (the core's tests): its time is what the test sets, and
 *     px_clock_advance() moves it on, firing each timer at its deadline in
 *     order, so a timeout of minutes is tested in microseconds and no test
 *     depends on how fast the machine is.
 *
 * Timers live in their owners' structs (the clock links them: nothing is
 * allocated, nothing can fail). Callbacks run from px_clock_run() and
 * px_clock_advance() (the loop's wake-up), never from px_timer_start();
 * one may start, stop or close any timer. */
#ifndef PX_CLOCK_H
#define PX_CLOCK_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

/* Where a hand-set clock starts. */
#define PX_CLOCK_SET_START_US (3600ull * 1000000)

typedef struct px_timer px_timer;
typedef void (*px_timer_fn)(px_timer *t);

struct px_timer {
  uint64_t due_ms; /* the clock's time it fires at, once started */
  uint64_t seq;    /* start order: of two due together, the first first */
  /* its place in the clock's pairing heap: its first child, its next
   * sibling, and the node before it (parent or previous sibling) */
  px_timer *child, *sibling, *prev;
  bool started;
  px_timer_fn fn; /* NULL: closed */
  void *data;
};

typedef struct px_clock {
  uv_loop_t *loop; /* NULL: a clock set by hand */
  uint64_t set_us; /* a hand-set clock's time */
  int64_t wall_s0; /* a hand-set clock's wall time at set_us 0 */
  /* the microseconds of uv_hrtime(), read at most once per loop
   * iteration: what happens in one event shares one clock read */
  uint64_t us, us_at_ms;
  px_timer *root; /* the earliest of the started timers */
  uint64_t seq;
  uv_timer_t wake; /* on a loop: set to the root's deadline */
  uint64_t wake_due;
  bool waking; /* wake initialised (closed by px_clock_close) */
} px_clock;

/* A clock on `loop`, or set by hand when `loop` is NULL: it starts at one
 * hour (as a loop's clock, never at 0, which callers use for "never"). */
void px_clock_init(px_clock *c, uv_loop_t *loop);
/* After the loop has ended: fire the timers due now (the last steps of
 * closing, started with 0 ms), then close the wake timer, once (the loop
 * frees it as it runs on); a timer started later never fires. */
void px_clock_close(px_clock *c);

/* The time in milliseconds (the loop's cached time) and in microseconds
 * (read once per loop iteration), both monotonic, and the wall clock in
 * seconds since 1970 (a hand-set clock starts at the real one and then
 * moves with its time). */
static inline uint64_t px_clock_ms(px_clock *c) {
  return c->loop ? uv_now(c->loop) : c->set_us / 1000;
}

static inline uint64_t px_clock_us(px_clock *c) {
  if (!c->loop)
    return c->set_us;
  uint64_t ms = uv_now(c->loop);
  if (ms != c->us_at_ms || !c->us) {
    c->us_at_ms = ms;
    c->us = uv_hrtime() / 1000;
  }
  return c->us;
}

int64_t px_clock_wall_s(px_clock *c);

/* A timer that calls `fn` (t->data is `data`), not started. */
void px_timer_init(px_timer *t, px_timer_fn fn, void *data);
/* Fire `t` `ms` from now (again, if it was started). */
void px_timer_start(px_clock *c, px_timer *t, uint64_t ms);
/* Fire `t` at the clock's time `due_ms` (now, if that has passed). */
void px_timer_start_at(px_clock *c, px_timer *t, uint64_t due_ms);
void px_timer_stop(px_clock *c, px_timer *t);
/* Stop `t` for good: a closed timer no longer starts. */
void px_timer_close(px_clock *c, px_timer *t);
/* The last use of `t`: the clock calls `fn` with it once, from the loop
 * (as libuv calls a handle's close callback, never inside this call);
 * `fn` closes it. */
void px_timer_finally(px_clock *c, px_timer *t, px_timer_fn fn);

/* The earliest deadline of a started timer; UINT64_MAX when none is. */
uint64_t px_clock_next(const px_clock *c);
/* Fire the timers due now (those started before this call). */
void px_clock_run(px_clock *c);
/* A hand-set clock: move its time `ms` on, firing every timer that comes
 * due meanwhile at its deadline (the clock reads that deadline while its
 * callback runs), then stand at the end. */
void px_clock_advance(px_clock *c, uint64_t ms);

#endif
