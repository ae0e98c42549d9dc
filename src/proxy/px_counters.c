/* px_counters.c - labelled counters and histograms (px_counters.h). */
#include "px_counters.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "px_server.h"
#include "retry_policy.h"

/* Upper bounds of the histogram buckets, microseconds. */
const uint64_t px_hist_bucket_us[PX_HIST_BUCKETS] = {
    100,   250,   500,    1000,   2500,    5000,   10000,
    25000, 50000, 100000, 250000, 1000000, 5000000};

const px_counter_family px_counter_families[] = {
#define PX__FAMILY(id, name, help, l1, l2, q) {name, help, l1, l2, q},
    PX_LABELLED(PX__FAMILY)
#undef PX__FAMILY
};

const char *const px_why_text[PX_WHY_COUNT] = {
#define PX__WHY_TEXT(id, text) text,
    PX_COPY_FAILURES(PX__WHY_TEXT) PX_NO_COPY(PX__WHY_TEXT)
#undef PX__WHY_TEXT
};

static int queue_slot(px_server *srv, const char *q) {
  return px_queues_slot(&srv->metrics.queues, q, srv->cfg_gen + 1);
}

/* Queues past the first PX_METRICS_MAX_QUEUES share the label "other". */
static const char *slot_label(px_server *srv, int slot) {
  px_queues *qs = &srv->metrics.queues;
  return slot >= 0 && slot < PX_METRICS_MAX_QUEUES && (uint32_t)slot < qs->n
             ? qs->q[slot].name
             : "other";
}

static void add(px_server *srv, int id, const char *v1, const char *v2,
                uint64_t n) {
  px_metrics_store *m = &srv->metrics;
  if (px_counter_families[id].queue_label)
    v1 = slot_label(srv, queue_slot(srv, v1));
  if (!px_counter_families[id].l2)
    v2 = "";
  for (uint32_t i = 0; i < m->n; i++) {
    px_counter *c = &m->counters[i];
    if (c->id == id && strcmp(c->v1, v1) == 0 && strcmp(c->v2, v2) == 0) {
      c->n += n;
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
  c->n = n;
}

void px_metrics_inc(px_server *srv, int id, const char *v1, const char *v2) {
  add(srv, id, v1, v2, 1);
}

void px_metrics_declare(px_server *srv, int id, const char *v1,
                        const char *v2) {
  add(srv, id, v1, v2, 0);
}

/* The series a labelled queue's retries can land in, at 0. */
static void declare_queue(px_server *srv, const char *queue) {
  const retry_rule *rule = retry_match(&srv->cfg->retry, queue, strlen(queue));
  char tier[32];
  if (!rule)
    return;
  for (unsigned i = 0; i < rule->ntiers; i++)
    if (retry_delay_format(rule->tiers_ms[i], tier, sizeof tier) >= 0)
      px_metrics_declare(srv, PX_M_RETRIES, queue, tier);
  px_metrics_declare(srv, PX_M_DEAD_LETTERED, queue, PX_DEAD_MAX_ATTEMPTS);
  px_metrics_declare(srv, PX_M_DEAD_LETTERED, queue, PX_DEAD_CONSUMER_LOST);
  px_metrics_declare(srv, PX_M_DEAD_LETTERED, queue, PX_DEAD_FRAME_MAX);
  px_metrics_declare(srv, PX_M_DEAD_LETTERED, queue, PX_DEAD_TIER_REFUSED);
  if (rule->processing_timeout_ms)
    px_metrics_declare(srv, PX_M_DEAD_LETTERED, queue, PX_DEAD_TIMEOUT);
  px_metrics_declare(srv, PX_M_NOT_KEPT, queue, PX_NOT_KEPT_BOUND);
}

int px_metrics_queue(px_server *srv, const char *queue) {
  uint32_t before = srv->metrics.queues.n;
  int slot = queue_slot(srv, queue);
  if ((uint32_t)slot == before && slot < PX_METRICS_MAX_QUEUES)
    declare_queue(srv, queue);
  return slot;
}

void px_metrics_declare_queues(px_server *srv) {
  const px_queues *qs = &srv->metrics.queues;
  for (uint32_t i = 0; i < qs->n && i < PX_METRICS_MAX_QUEUES; i++)
    declare_queue(srv, qs->q[i].name);
}

const char *px_metrics_queue_label(px_server *srv, int slot) {
  return slot_label(srv, slot);
}

void px_queue_count(px_server *srv, int qid, int what) {
  px_queues_count(&srv->metrics.queues, qid, what, srv->cfg_gen + 1);
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
    if (qid > PX_METRICS_MAX_QUEUES)
      qid = PX_METRICS_MAX_QUEUES; /* "other" */
    if (qid < 0 ||
        (!m->processing &&
         !(m->processing = calloc(PX_METRICS_MAX_QUEUES + 1, sizeof(px_hist)))))
      return;
    hist_add(&m->processing[qid], us);
  }
}

void px_metrics_free(px_server *srv) {
  free(srv->metrics.processing);
  free(srv->metrics.counters);
  px_queues_free(&srv->metrics.queues);
  memset(&srv->metrics, 0, sizeof srv->metrics);
}
