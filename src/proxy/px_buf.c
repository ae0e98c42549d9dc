#include "px_buf.h"

#include <stdlib.h>

/* Recycled standard chunks kept at most: 8 MiB. */
#define POOL_MAX 128

static px_chunk *pool;
static unsigned pool_len;
static size_t allocated;

px_chunk *px_chunk_new(size_t min_cap) {
  px_chunk *c;
  size_t cap = min_cap <= PX_CHUNK_SIZE ? PX_CHUNK_SIZE : min_cap;

  if (cap > UINT32_MAX)
    return NULL;
  if (cap == PX_CHUNK_SIZE && pool) {
    c = pool;
    pool = c->next_free;
    pool_len--;
  } else {
    c = malloc(sizeof *c + cap);
    if (!c)
      return NULL;
    allocated += sizeof *c + cap;
    c->cap = (uint32_t)cap;
  }
  c->refs = 1;
  c->len = 0;
  c->off = 0;
  c->next_free = NULL;
  return c;
}

void px_chunk_unref(px_chunk *c) {
  if (--c->refs > 0)
    return;
  if (c->cap == PX_CHUNK_SIZE && pool_len < POOL_MAX) {
    c->next_free = pool;
    pool = c;
    pool_len++;
    return;
  }
  allocated -= sizeof *c + c->cap;
  free(c);
}

size_t px_chunk_bytes(void) {
  return allocated;
}

void px_chunk_pool_drain(void) {
  while (pool) {
    px_chunk *c = pool;
    pool = c->next_free;
    allocated -= sizeof *c + c->cap;
    free(c);
  }
  pool_len = 0;
}
