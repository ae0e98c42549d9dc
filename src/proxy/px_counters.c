/* px_counters.c - labelled counters and histograms (px_counters.h). */
#include "px_counters.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "px_server.h"

/* Upper bounds of the histogram buckets, microseconds. */
const uint64_t px_hist_bucket_us[PX_HIST_BUCKETS] = {
    100,   250,   500,    1000,   2500,    5000,   10000,
    25000, 50000, 100000, 250000, 1000000, 5000000};

const px_counter_family px_counter_families[] = {
#define PX__FAMILY(id, name, help, l1, l2, q) {name, help, l1, l2, q},
    PX_LABELLED(PX__FAMILY)
#undef PX__FAMILY
};

/* The label slot of queue `q`: 0..PX_METRICS_MAX_QUEUES-1 for the first
 * distinct names, PX_METRICS_MAX_QUEUES ("other") after (or when out of
 * memory). A queue literally named "other" gets a slot like any other. */
static int queue_slot(px_metrics_store *m, const char *q) {
  for (uint32_t i = 0; i < m->nqueues; i++)
    if (strcmp(m->queues[i], q) == 0)
      return (int)i;
  if (m->nqueues == PX_METRICS_MAX_QUEUES)
    return PX_METRICS_MAX_QUEUES;
  if (m->nqueues % 16 == 0) {
    char(*qs)[256] = realloc(m->queues, (m->nqueues + 16) * sizeof *qs);
    if (!qs)
      return PX_METRICS_MAX_QUEUES;
    m->queues = qs;
  }
  snprintf(m->queues[m->nqueues], sizeof m->queues[0], "%s", q);
  return (int)m->nqueues++;
}

static const char *slot_label(const px_metrics_store *m, int slot) {
  return slot >= 0 && (uint32_t)slot < m->nqueues ? m->queues[slot] : "other";
}

void px_metrics_inc(px_server *srv, int id, const char *v1, const char *v2) {
  px_metrics_store *m = &srv->metrics;
  if (px_counter_families[id].queue_label)
    v1 = slot_label(m, queue_slot(m, v1));
  if (!px_counter_families[id].l2)
    v2 = "";
  for (uint32_t i = 0; i < m->n; i++) {
    px_counter *c = &m->counters[i];
    if (c->id == id && strcmp(c->v1, v1) == 0 && strcmp(c->v2, v2) == 0) {
      c->n++;
      return;
    }
  }
  if (m->n == m->cap) {
    uint32_t cap = m->cap ? m->cap * 2 : 32;
    px_counter *cs = realloc(m->counters, cap * sizeof *cs);
    if (!cs)
      return;
    m->counters = cs;
    m->cap = cap;
  }
  px_counter *c = &m->counters[m->n++];
  c->id = id;
  snprintf(c->v1, sizeof c->v1, "%s", v1);
  snprintf(c->v2, sizeof c->v2, "%s", v2);
  c->n = 1;
}

int px_metrics_queue(px_server *srv, const char *queue) {
  return queue_slot(&srv->metrics, queue);
}

const char *px_metrics_queue_label(const px_server *srv, int slot) {
  return slot_label(&srv->metrics, slot);
}

static void hist_add(px_hist *h, uint64_t us) {
  for (int i = 0; i < PX_HIST_BUCKETS; i++)
    if (us <= px_hist_bucket_us[i])
      h->buckets[i]++;
  h->sum_us += us;
  h->count++;
}

void px_metrics_observe(px_server *srv, int hist, int qid, uint64_t us) {
  px_metrics_store *m = &srv->metrics;
  if (hist == PX_H_RETRY) {
    hist_add(&m->retry, us);
  } else if (hist == PX_H_CONFIRM) {
    hist_add(&m->confirm, us);
  } else {
    if (qid < 0 || qid > PX_METRICS_MAX_QUEUES ||
        (!m->processing &&
         !(m->processing = calloc(PX_METRICS_MAX_QUEUES + 1, sizeof(px_hist)))))
      return;
    hist_add(&m->processing[qid], us);
  }
}

void px_metrics_free(px_server *srv) {
  free(srv->metrics.processing);
  free(srv->metrics.counters);
  free(srv->metrics.queues);
  memset(&srv->metrics, 0, sizeof srv->metrics);
}
