/* px_clock.c - the core's clock and deadlines (px_clock.h): a pairing
 * heap of the started timers, ordered by deadline and then by start. */
#include "px_clock.h"

#include <time.h>

void px_clock_init(px_clock *c, uv_loop_t *loop) {
  *c = (px_clock){.loop = loop, .wake_due = UINT64_MAX};
  if (loop) {
    uv_timer_init(loop, &c->wake); /* cannot fail */
    c->wake.data = c;
    c->waking = true;
  } else {
    c->set_us = PX_CLOCK_SET_START_US;
    c->wall_s0 = (int64_t)time(NULL) - (int64_t)(c->set_us / 1000000);
  }
}

void px_clock_close(px_clock *c) {
  /* each round fires those due when it began: closing one thing may start
   * the last step of another */
  for (int i = 0; i < 64 && px_clock_next(c) <= px_clock_ms(c); i++)
    px_clock_run(c);
  if (c->waking && !uv_is_closing((uv_handle_t *)&c->wake))
    uv_close((uv_handle_t *)&c->wake, NULL);
}

int64_t px_clock_wall_s(px_clock *c) {
  return c->loop ? (int64_t)time(NULL)
                 : c->wall_s0 + (int64_t)(c->set_us / 1000000);
}

/* ---- the heap: a pairing heap of started timers ---------------------- */

static bool before(const px_timer *a, const px_timer *b) {
  return a->due_ms < b->due_ms || (a->due_ms == b->due_ms && a->seq < b->seq);
}

/* Two heaps (roots without siblings) made one: the later root becomes the
 * first child of the earlier. */
static px_timer *meld(px_timer *a, px_timer *b) {
  if (before(b, a)) {
    px_timer *t = a;
    a = b;
    b = t;
  }
  b->prev = a;
  b->sibling = a->child;
  if (a->child)
    a->child->prev = b;
  a->child = b;
  return a;
}

/* The heaps of a list of siblings made one: melded in pairs from the
 * first, then the pairs from the last. */
static px_timer *merge_pairs(px_timer *a) {
  px_timer *pairs = NULL; /* the pairs, the last first (via sibling) */
  while (a) {
    px_timer *b = a->sibling, *next = b ? b->sibling : NULL;
    a->sibling = a->prev = NULL;
    if (b) {
      b->sibling = b->prev = NULL;
      a = meld(a, b);
    }
    a->sibling = pairs;
    pairs = a;
    a = next;
  }
  px_timer *root = pairs;
  if (!root)
    return NULL;
  pairs = root->sibling;
  root->sibling = NULL;
  while (pairs) {
    px_timer *next = pairs->sibling;
    pairs->sibling = NULL;
    root = meld(root, pairs);
    pairs = next;
  }
  return root;
}

static void unlink_timer(px_clock *c, px_timer *t) {
  px_timer *sub = merge_pairs(t->child);
  if (t == c->root) {
    c->root = sub;
  } else {
    if (t->prev->child == t)
      t->prev->child = t->sibling;
    else
      t->prev->sibling = t->sibling;
    if (t->sibling)
      t->sibling->prev = t->prev;
    if (sub)
      c->root = meld(c->root, sub);
  }
  t->child = t->sibling = t->prev = NULL;
  t->started = false;
}

static void on_wake(uv_timer_t *w) {
  px_clock_run(w->data);
}

/* On a loop: the wake timer no later than the earliest deadline. A wake
 * set earlier is left as it is (it finds nothing due and is set again),
 * so the timers of a busy session move it only when one comes due
 * sooner; with no timer left it is stopped (the loop may end). */
static void rearm(px_clock *c) {
  uint64_t due = px_clock_next(c);
  if (!c->waking || (due >= c->wake_due && due != UINT64_MAX) ||
      due == c->wake_due || uv_is_closing((uv_handle_t *)&c->wake))
    return;
  c->wake_due = due;
  if (due == UINT64_MAX) {
    uv_timer_stop(&c->wake);
    return;
  }
  uint64_t now = uv_now(c->loop);
  uv_timer_start(&c->wake, on_wake, due > now ? due - now : 0, 0);
}

/* ---- timers ---------------------------------------------------------- */

void px_timer_init(px_timer *t, px_timer_fn fn, void *data) {
  *t = (px_timer){.fn = fn, .data = data};
}

void px_timer_start_at(px_clock *c, px_timer *t, uint64_t due_ms) {
  if (!t->fn)
    return; /* closed */
  if (t->started)
    unlink_timer(c, t);
  uint64_t now = px_clock_ms(c);
  t->due_ms = due_ms > now ? due_ms : now; /* a past deadline is now */
  t->seq = ++c->seq;
  t->started = true;
  c->root = c->root ? meld(c->root, t) : t;
  rearm(c);
}

void px_timer_start(px_clock *c, px_timer *t, uint64_t ms) {
  px_timer_start_at(c, t, px_clock_ms(c) + ms);
}

void px_timer_stop(px_clock *c, px_timer *t) {
  if (!t->started)
    return;
  unlink_timer(c, t);
  rearm(c);
}

void px_timer_close(px_clock *c, px_timer *t) {
  px_timer_stop(c, t);
  t->fn = NULL;
}

void px_timer_finally(px_clock *c, px_timer *t, px_timer_fn fn) {
  t->fn = fn;
  px_timer_start(c, t, 0);
}

uint64_t px_clock_next(const px_clock *c) {
  return c->root ? c->root->due_ms : UINT64_MAX;
}

/* Fire the timers due at `now` that were started before `seq` was. */
static void fire_due(px_clock *c, uint64_t now, uint64_t seq) {
  while (c->root && c->root->due_ms <= now && c->root->seq <= seq) {
    px_timer *t = c->root;
    unlink_timer(c, t);
    t->fn(t);
  }
}

void px_clock_run(px_clock *c) {
  c->wake_due = UINT64_MAX; /* the wake timer has fired, or is moot */
  fire_due(c, px_clock_ms(c), c->seq);
  rearm(c);
}

void px_clock_advance(px_clock *c, uint64_t ms) {
  uint64_t end = c->set_us + ms * 1000;
  while (c->root && c->root->due_ms * 1000 <= end) {
    if (c->root->due_ms * 1000 > c->set_us)
      c->set_us = c->root->due_ms * 1000;
    fire_due(c, c->root->due_ms, c->seq);
  }
  c->set_us = end;
}
