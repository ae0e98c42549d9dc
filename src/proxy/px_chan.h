/* px_chan.h - per-channel state of a session and the tables that find it.
 *
 * Channels are found by the client's number and by the upstream number
 * they travel on. Both are the same except for a channel that had to move
 * because rebound's own channel holds its number on the client's upstream
 * connection (README, "Retries": --retry-connection shared); only such
 * frames get their channel field rewritten.
 */
#ifndef PX_CHAN_H
#define PX_CHAN_H

#include <stdbool.h>
#include <stdint.h>

#include "px_buf.h"
#include "px_track.h"

typedef enum px_chan_state {
  PX_CH_OPENING,       /* client sent channel.open */
  PX_CH_OPEN,          /* broker answered open-ok */
  PX_CH_CLOSING,       /* client sent channel.close */
  PX_CH_SERVER_CLOSED, /* broker sent channel.close */
} px_chan_state;

/* What a channel's next frame in one direction must be. */
typedef enum px_content {
  PX_CONTENT_NONE,   /* a method */
  PX_CONTENT_HEADER, /* after a content method */
  PX_CONTENT_BODY,   /* after a header with a non-zero body size */
} px_content;

typedef struct px_chan {
  uint16_t client_ch;
  uint16_t up_ch;
  uint8_t state;     /* px_chan_state */
  uint8_t c2u;       /* px_content, client -> upstream */
  uint8_t u2c;       /* px_content, upstream -> client */
  bool held;         /* frames wait in `hold` (client -> upstream) */
  uint64_t c2u_left; /* body bytes still due */
  uint64_t u2c_left;
  bool open_held;      /* the first held frame is this channel's channel.open */
  bool release_queued; /* in the session's release queue */
  uint32_t gen;        /* tells a reopened channel number from the old */
  bool tx;             /* tx.select: settlements are transactional */
  uint32_t tx_acked;   /* rebound's acks of originals since its last
                          tx.commit or rollback */
  px_slice *hold;      /* client frames held back, in order: */
  uint32_t hold_head, nhold, cap_hold; /* hold[hold_head..nhold) */
  uint64_t held_bytes;
  px_track track; /* consumers and deliveries (px_track.c) */
} px_chan;

const char *px_chan_state_name(int state);

/* A two-level table from a channel number (1..max) to a px_chan: blocks
 * of PX_TAB_BLOCK entries, allocated on first use, under a first level
 * that grows to the highest block used. Empty until px_tab_init(); a
 * connection with a few low-numbered channels costs a few hundred bytes. */
#define PX_TAB_BLOCK 8

typedef struct px_tab {
  px_chan ***blocks;
  px_chan *hint;    /* the entry px_tab_find() found last (NULL: none) */
  uint32_t nblocks; /* entries of the first level */
  uint16_t max;     /* 0 until px_tab_init() */
  uint16_t hint_ch; /* ... and its number; every px_tab_set forgets it */
} px_tab;

/* Size the table for channels 1..max (max >= 1). Returns 0 or -1. */
int px_tab_init(px_tab *t, uint16_t max);
void px_tab_free(px_tab *t);
static inline bool px_tab_ready(const px_tab *t) {
  return t->max != 0;
}

static inline px_chan *px_tab_get(const px_tab *t, uint16_t ch) {
  uint32_t b = ch / PX_TAB_BLOCK; /* channel 0 and those over max: never set */
  if (b >= t->nblocks || !t->blocks[b])
    return 0;
  return t->blocks[b][ch % PX_TAB_BLOCK];
}

/* px_tab_get for the frames of the read loop, which mostly come on the
 * channel of the frame before: that entry is remembered. */
static inline px_chan *px_tab_find(px_tab *t, uint16_t ch) {
  if (t->hint && t->hint_ch == ch)
    return t->hint;
  px_chan *c = px_tab_get(t, ch);
  if (c) {
    t->hint = c;
    t->hint_ch = ch;
  }
  return c;
}

/* The channels of a table in number order: start with *cursor = 0; NULL
 * after the last. Freeing the channel just returned is allowed (the
 * table itself is not read for it again). */
px_chan *px_tab_next(const px_tab *t, uint32_t *cursor);

/* Set (or, with NULL, clear) an entry. Returns 0, or -1 when `ch` is out of
 * range or memory is short. */
int px_tab_set(px_tab *t, uint16_t ch, px_chan *c);

/* Append a slice (taking over its chunk reference) to a channel's held
 * frames. Returns 0 or -1 (no memory: the reference is dropped). */
int px_chan_hold(px_chan *c, px_slice s);

/* How many frames are held. */
static inline uint32_t px_chan_nheld(const px_chan *c) {
  return c->nhold - c->hold_head;
}
/* Take the oldest held frame (its chunk reference with it); there must be
 * one. px_chan_unpop() puts it back, first again. */
px_slice px_chan_pop_held(px_chan *c);
void px_chan_unpop_held(px_chan *c);

/* Rewrite a frame's 2-byte channel field in place. */
static inline void px_chan_renumber(uint8_t *raw, uint16_t ch) {
  raw[1] = (uint8_t)(ch >> 8);
  raw[2] = (uint8_t)ch;
}

/* Drop every held frame (on close). */
void px_chan_drop_held(px_chan *c);

#endif
