#include "px_chan.h"

#include <stdlib.h>
#include <string.h>

const char *px_chan_state_name(int state) {
  static const char *const names[] = {"opening", "open", "closing",
                                      "server-closed"};
  return state >= 0 && state < 4 ? names[state] : "?";
}

int px_tab_init(px_tab *t, uint16_t max) {
  t->nblocks = ((uint32_t)max >> 6) + 1;
  t->blocks = calloc(t->nblocks, sizeof *t->blocks);
  t->max = t->blocks ? max : 0;
  return t->blocks ? 0 : -1;
}

void px_tab_free(px_tab *t) {
  for (uint32_t b = 0; t->blocks && b < t->nblocks; b++)
    free(t->blocks[b]);
  free(t->blocks);
  t->blocks = NULL;
  t->nblocks = 0;
  t->max = 0;
}

px_chan *px_tab_next(const px_tab *t, uint32_t *cursor) {
  for (uint32_t i = *cursor; t->blocks && i < t->nblocks * 64u; i++) {
    px_chan **block = t->blocks[i >> 6];
    if (!block) {
      i |= 63; /* the whole block is empty */
      continue;
    }
    if (block[i & 63]) {
      *cursor = i + 1;
      return block[i & 63];
    }
  }
  *cursor = t->blocks ? t->nblocks * 64u : 0;
  return NULL;
}

int px_tab_set(px_tab *t, uint16_t ch, px_chan *c) {
  uint32_t b = ch >> 6;
  if (ch == 0 || ch > t->max)
    return -1;
  if (!t->blocks[b]) {
    if (!c)
      return 0;
    t->blocks[b] = calloc(64, sizeof(px_chan *));
    if (!t->blocks[b])
      return -1;
  }
  t->blocks[b][ch & 63] = c;
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
