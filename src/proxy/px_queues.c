/* px_queues.c - the registry of queues seen (px_queues.h). */
#include "px_queues.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const px_queue_count_names[PX_QC_COUNT] = {
#define PX__QC_NAME(id, name, help) name,
    PX_QUEUE_COUNTS(PX__QC_NAME)
#undef PX__QC_NAME
};

static uint32_t name_hash(const char *s) {
  uint32_t h = 2166136261u;
  while (*s)
    h = (h ^ (unsigned char)*s++) * 16777619u;
  return h;
}

/* Where `name` is in the index, or the empty place it would go. */
static uint32_t probe(const px_queues *qs, const char *name) {
  uint32_t mask = qs->index_cap - 1, i = name_hash(name) & mask;
  while (qs->index[i] >= 0 && strcmp(qs->q[qs->index[i]].name, name) != 0)
    i = (i + 1) & mask;
  return i;
}

/* Room for one more slot: the entries, and an index at most half full. */
static int grow(px_queues *qs) {
  if (qs->n == qs->cap) {
    uint32_t cap = qs->cap ? qs->cap * 2 : 16;
    px_queue_stat *q = realloc(qs->q, cap * sizeof *q);
    if (!q)
      return -1;
    qs->q = q;
    qs->cap = cap;
  }
  if ((qs->n + 1) * 2 <= qs->index_cap)
    return 0;
  uint32_t icap = qs->index_cap ? qs->index_cap * 2 : 32;
  int32_t *index = malloc(icap * sizeof *index);
  if (!index)
    return -1;
  free(qs->index);
  qs->index = index;
  qs->index_cap = icap;
  memset(index, 0xff, icap * sizeof *index);
  for (uint32_t s = 0; s < qs->n; s++)
    index[probe(qs, qs->q[s].name)] = (int32_t)s;
  return 0;
}

int px_queues_slot(px_queues *qs, const char *name, uint32_t gen) {
  if (qs->index_cap) {
    uint32_t i = probe(qs, name);
    if (qs->index[i] >= 0) {
      qs->q[qs->index[i]].seen_gen = gen;
      return qs->index[i];
    }
  }
  if (qs->n == PX_QUEUES_MAX || grow(qs) != 0) {
    snprintf(qs->other.name, sizeof qs->other.name, "other");
    qs->other.seen_gen = gen;
    return PX_QUEUES_MAX;
  }
  px_queue_stat *st = &qs->q[qs->n];
  memset(st, 0, sizeof *st);
  snprintf(st->name, sizeof st->name, "%s", name);
  st->seen_gen = gen;
  qs->index[probe(qs, st->name)] = (int32_t)qs->n;
  return (int)qs->n++;
}

void px_queues_free(px_queues *qs) {
  free(qs->q);
  free(qs->index);
  memset(qs, 0, sizeof *qs);
}
