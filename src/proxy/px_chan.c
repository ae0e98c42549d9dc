#include "px_chan.h"

#include <stdlib.h>
#include <string.h>

const char *px_chan_state_name(int state) {
  static const char *const names[] = {"opening", "open", "closing",
                                      "server-closed"};
  return state >= 0 && state < 4 ? names[state] : "?";
}

int px_tab_init(px_tab *t, uint16_t max) {
  t->blocks = NULL;
  t->hint = NULL;
  t->nblocks = 0;
  t->max = max;
  return max ? 0 : -1;
}

void px_tab_free(px_tab *t) {
  for (uint32_t b = 0; b < t->nblocks; b++)
    free(t->blocks[b]);
  free(t->blocks);
  t->blocks = NULL;
  t->hint = NULL;
  t->nblocks = 0;
  t->max = 0;
}

px_chan *px_tab_next(const px_tab *t, uint32_t *cursor) {
  for (uint32_t i = *cursor; i < t->nblocks * PX_TAB_BLOCK; i++) {
    px_chan **block = t->blocks[i / PX_TAB_BLOCK];
    if (!block) {
      i |= PX_TAB_BLOCK - 1; /* the whole block is empty */
      continue;
    }
    if (block[i % PX_TAB_BLOCK]) {
      *cursor = i + 1;
      return block[i % PX_TAB_BLOCK];
    }
  }
  *cursor = t->nblocks * PX_TAB_BLOCK;
  return NULL;
}

/* Make the first level reach block `b`. */
static int tab_grow(px_tab *t, uint32_t b) {
  px_chan ***blocks = realloc(t->blocks, (b + 1) * sizeof *blocks);
  if (!blocks)
    return -1;
  memset(blocks + t->nblocks, 0, (b + 1 - t->nblocks) * sizeof *blocks);
  t->blocks = blocks;
  t->nblocks = b + 1;
  return 0;
}

int px_tab_set(px_tab *t, uint16_t ch, px_chan *c) {
  uint32_t b = ch / PX_TAB_BLOCK;
  if (ch == 0 || ch > t->max)
    return -1;
  t->hint = NULL;
  if (b >= t->nblocks || !t->blocks[b]) {
    if (!c)
      return 0;
    if (b >= t->nblocks && tab_grow(t, b) != 0)
      return -1;
    t->blocks[b] = calloc(PX_TAB_BLOCK, sizeof(px_chan *));
    if (!t->blocks[b])
      return -1;
  }
  t->blocks[b][ch % PX_TAB_BLOCK] = c;
  return 0;
}

int px_chan_hold(px_chan *c, px_slice s) {
  if (c->hold_head && c->hold_head * 2 >= c->nhold) { /* mostly taken */
    memmove(c->hold, c->hold + c->hold_head,
            px_chan_nheld(c) * sizeof *c->hold);
    c->nhold -= c->hold_head;
    c->hold_head = 0;
  }
  if (c->nhold == c->cap_hold) {
    uint32_t cap = c->cap_hold ? c->cap_hold * 2 : 8;
    px_slice *h = realloc(c->hold, cap * sizeof *h);
    if (!h) {
      px_chunk_unref(s.chunk);
      return -1;
    }
    c->hold = h;
    c->cap_hold = cap;
  }
  c->hold[c->nhold++] = s;
  c->held_bytes += s.len;
  return 0;
}

px_slice px_chan_pop_held(px_chan *c) {
  px_slice s = c->hold[c->hold_head++];
  c->held_bytes -= s.len;
  return s;
}

void px_chan_unpop_held(px_chan *c) {
  c->held_bytes += c->hold[--c->hold_head].len;
}

void px_chan_drop_held(px_chan *c) {
  for (uint32_t i = c->hold_head; i < c->nhold; i++)
    px_chunk_unref(c->hold[i].chunk);
  free(c->hold);
  c->hold = NULL;
  c->hold_head = c->nhold = c->cap_hold = 0;
  c->held_bytes = 0;
  c->held = false;
}
