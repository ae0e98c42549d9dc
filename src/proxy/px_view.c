/* px_view.c - what is in effect, per queue and per policy (px_view.h). */
#include "px_view.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "px_log.h"
#include "px_queues.h"
#include "px_server.h"
#include "px_session.h"
#include "px_watch.h"
#include "retry_policy.h"

#define SUMMARY_MAX 100 /* flagged queues listed in /v1/status */

/* What keeps a queue's policy from acting (NO_ACK, FALLBACK; logged by
 * px_view_check), and what rebound's watch of its tiers found (OVERDUE,
 * SOURCE_MISSING; logged by px_watch). */
enum {
  FLAG_NO_ACK = 1,
  FLAG_FALLBACK = 2,
  FLAG_OVERDUE = 4,
  FLAG_SOURCE_MISSING = 8,
  FLAG_LAST = FLAG_SOURCE_MISSING,
  FLAGS_CHECKED = FLAG_NO_ACK | FLAG_FALLBACK
};

static void json_delay(px_admin_response *r, uint32_t ms) {
  char d[16];
  if (retry_delay_format(ms, d, sizeof d) < 0)
    snprintf(d, sizeof d, "%ums", (unsigned)ms);
  px_admin_json_string(r, d);
}

static void json_backoff(px_admin_response *r, const retry_backoff *b) {
  px_admin_printf(r, ",\"backoff\":{\"initial\":");
  json_delay(r, b->initial_ms);
  px_admin_printf(r, ",\"max\":");
  json_delay(r, b->max_ms);
  px_admin_printf(r, ",\"multiplier\":%g,\"jitter\":%g,\"buckets\":%u}",
                  b->multiplier, b->jitter, b->buckets);
}

void px_view_policy(px_admin_response *r, const retry_rule *rule) {
  px_admin_printf(r, "{\"queues\":[");
  for (unsigned g = 0; g < rule->nglobs; g++) {
    px_admin_printf(r, "%s", g ? "," : "");
    px_admin_json_string(r, rule->globs[g]);
  }
  px_admin_printf(r, "],\"tiers\":[");
  for (unsigned t = 0; t < rule->ntiers; t++) {
    px_admin_printf(r, "%s", t ? "," : "");
    json_delay(r, rule->tiers_ms[t]);
  }
  px_admin_printf(r, "]");
  if (rule->backoff.initial_ms)
    json_backoff(r, &rule->backoff);
  px_admin_printf(
      r, ",\"max_attempts\":%u,\"dead_letter\":", (unsigned)rule->max_attempts);
  px_admin_json_string(r, rule->dead_letter);
  px_admin_printf(r, ",\"queue_type\":\"%s\",\"processing_timeout\":",
                  retry_queue_type_str(rule->queue_type));
  if (rule->processing_timeout_ms)
    json_delay(r, rule->processing_timeout_ms);
  else
    px_admin_printf(r, "null");
  px_admin_printf(r, "}");
}

/* The index of the queue's policy under the running config (-1: none),
 * matched once per config generation. */
static int policy_of(px_server *srv, px_queue_stat *q) {
  if (q->policy_gen != srv->cfg_gen + 1) {
    const retry_rule *r =
        retry_match(&srv->cfg->retry, q->name, strlen(q->name));
    q->policy = r ? (int32_t)(r - srv->cfg->retry.rules) : -1;
    q->policy_gen = srv->cfg_gen + 1;
  }
  return q->policy;
}

typedef struct watch_flags {
  const char *source;
  unsigned f;
} watch_flags;

static void watch_flag(void *ctx, const px_watch_info *w) {
  watch_flags *wf = ctx;
  if (w->dead_letter || strcmp(w->source, wf->source) != 0)
    return;
  if (w->overdue)
    wf->f |= FLAG_OVERDUE;
  if (w->source_missing && w->depth != 0)
    wf->f |= FLAG_SOURCE_MISSING;
}

/* What keeps a queue's policy from acting or its copies from coming back
 * (FLAG_*), 0 if nothing. */
static unsigned flags_of(px_server *srv, px_queue_stat *q) {
  const uint64_t *n = q->n;
  if (policy_of(srv, q) < 0)
    return 0;
  watch_flags wf = {q->name, 0};
  px_watch_each(srv, watch_flag, &wf);
  unsigned f = wf.f;
  if (n[PX_QC_DELIVERED_NO_ACK] && !n[PX_QC_DELIVERED])
    f |= FLAG_NO_ACK;
  if (n[PX_QC_REQUEUED] && !n[PX_QC_RETRIED] && !n[PX_QC_DEAD_LETTERED])
    f |= FLAG_FALLBACK;
  return f;
}

static const char *flag_text(unsigned flag) {
  switch (flag) {
  case FLAG_NO_ACK:
    return "no-ack: every delivery went to a no-ack consumer or get, so "
           "nothing can be retried";
  case FLAG_FALLBACK:
    return "fallback: every requeue went to the broker as the client's, none "
           "was retried";
  case FLAG_OVERDUE:
    return "tier overdue: a tier holds a copy older than its delay plus "
           "--tier-grace (see tiers)";
  default:
    return "source missing: the queue does not exist while copies wait in "
           "its tiers; the broker drops them when they expire";
  }
}

static void json_flags(px_admin_response *r, unsigned f) {
  px_admin_printf(r, ",\"flags\":[");
  for (unsigned bit = 1, k = 0; bit <= FLAG_LAST; bit <<= 1)
    if (f & bit) {
      px_admin_printf(r, "%s", k++ ? "," : "");
      px_admin_json_string(r, flag_text(bit));
    }
  px_admin_printf(r, "]");
}

static void json_unsettled(px_admin_response *r, const px_view_unsettled *u,
                           uint64_t now_us);

typedef struct tiers_json {
  px_admin_response *r;
  const char *source;
  unsigned n;
} tiers_json;

static void tier_json(void *ctx, const px_watch_info *w) {
  tiers_json *t = ctx;
  if (strcmp(w->source, t->source) != 0)
    return;
  px_admin_response *r = t->r;
  px_admin_printf(r, "%s{\"queue\":", t->n++ ? "," : "");
  px_admin_json_string(r, w->queue);
  px_admin_printf(r, ",\"tier\":");
  if (w->dead_letter)
    px_admin_printf(r, "null,\"dead_letter\":true");
  else
    px_admin_json_string(r, w->tier);
  if (w->depth >= 0)
    px_admin_printf(r, ",\"depth\":%lld", (long long)w->depth);
  else
    px_admin_printf(r, ",\"depth\":null");
  if (!w->dead_letter) {
    if (w->oldest_age_s >= 0)
      px_admin_printf(r, ",\"oldest_age_seconds\":%.0f", w->oldest_age_s);
    px_admin_printf(r, ",\"overdue\":%s,\"healed\":%llu",
                    w->overdue ? "true" : "false",
                    (unsigned long long)w->healed);
  }
  px_admin_printf(r, ",\"exists\":%s}", w->missing ? "false" : "true");
}

/* The tiers and dead-letter queue of `source` rebound watches
 * (px_watch.h): "tiers":[...], at their last look. */
static void json_tiers(px_server *srv, px_admin_response *r,
                       const char *source) {
  tiers_json t = {r, source, 0};
  px_admin_printf(r, ",\"tiers\":[");
  px_watch_each(srv, tier_json, &t);
  px_admin_printf(r, "]");
}

static void json_queue(px_server *srv, px_admin_response *r, px_queue_stat *q,
                       const px_view_unsettled *u) {
  int p = policy_of(srv, q);
  px_admin_printf(r, "{\"name\":");
  px_admin_json_string(r, q->name);
  if (p < 0) {
    px_admin_printf(r, ",\"policy\":\"none: passes through\"");
  } else {
    px_admin_printf(r, ",\"policy_index\":%d,\"policy\":", p);
    px_view_policy(r, &srv->cfg->retry.rules[p]);
  }
  for (int i = 0; i < PX_QC_COUNT; i++)
    px_admin_printf(r, ",\"%s\":%llu", px_queue_count_names[i],
                    (unsigned long long)q->n[i]);
  px_admin_printf(r, ",\"seen_since_reload\":%s",
                  q->seen_gen == srv->cfg_gen + 1 ? "true" : "false");
  if (u)
    json_unsettled(r, u, px_clock_us(&srv->clock));
  json_tiers(srv, r, q->name);
  json_flags(r, flags_of(srv, q));
  px_admin_printf(r, "}");
}

/* Queues seen since the running config began, per policy. */
static void count_matches(px_server *srv, uint32_t *matched) {
  px_queues *qs = &srv->metrics.queues;
  memset(matched, 0, PX_MAX_RULES * sizeof *matched);
  for (uint32_t i = 0; i < qs->n; i++) {
    int p = policy_of(srv, &qs->q[i]);
    if (p >= 0 && qs->q[i].seen_gen == srv->cfg_gen + 1)
      matched[p]++;
  }
}

static void json_policies(px_server *srv, px_admin_response *r) {
  uint32_t matched[PX_MAX_RULES];
  count_matches(srv, matched);
  px_admin_printf(r, "\"policies\":[");
  for (unsigned i = 0; i < srv->cfg->retry.nrules; i++) {
    px_admin_printf(r, "%s{\"index\":%u,\"policy\":", i ? "," : "", i);
    px_view_policy(r, &srv->cfg->retry.rules[i]);
    px_admin_printf(r, ",\"queues_matched\":%u,\"flags\":[", matched[i]);
    if (!matched[i])
      px_admin_printf(r, "\"unmatched: no queue seen since %s matched it\"",
                      srv->cfg_gen ? "the last reload" : "start");
    px_admin_printf(r, "]}");
  }
  px_admin_printf(r, "]");
}

/* ---- unsettled deliveries ------------------------------------------------ */

typedef struct scan {
  px_view_unsettled *per;
  uint32_t nper;
  px_view_stuck *top;
  unsigned ntop, ntop_max;
  uint64_t stuck_before_us; /* delivered before this: stuck */
} scan;

/* Keep the ntop_max oldest, oldest first (insertion: ntop is small). */
static void keep_oldest(scan *sc, const px_unsettled *u) {
  unsigned i = sc->ntop;
  if (i == sc->ntop_max) {
    if (u->delivered_us >= sc->top[i - 1].delivered_us)
      return;
    i--;
  } else {
    sc->ntop++;
  }
  for (; i > 0 && sc->top[i - 1].delivered_us > u->delivered_us; i--)
    sc->top[i] = sc->top[i - 1];
  px_view_stuck *t = &sc->top[i];
  *t = (px_view_stuck){.session_id = u->session_id,
                       .tag = u->tag,
                       .delivered_us = u->delivered_us,
                       .qid = u->qid,
                       .channel = u->channel,
                       .cancelled = !u->consumer_tag};
  snprintf(t->peer, sizeof t->peer, "%s", u->peer);
  snprintf(t->consumer_tag, sizeof t->consumer_tag, "%s",
           u->consumer_tag ? u->consumer_tag : "");
}

static void scan_one(void *arg, const px_unsettled *u) {
  scan *sc = arg;
  if (sc->per && u->qid >= 0) {
    px_view_unsettled *p =
        &sc->per[(uint32_t)u->qid < sc->nper ? (uint32_t)u->qid : sc->nper - 1];
    if (!p->n || u->delivered_us < p->oldest_us)
      p->oldest_us = u->delivered_us;
    p->n++;
    p->stuck += u->delivered_us < sc->stuck_before_us;
  }
  if (sc->ntop_max)
    keep_oldest(sc, u);
}

unsigned px_view_scan(px_server *srv, px_view_unsettled *per, uint32_t nper,
                      px_view_stuck *top, unsigned ntop) {
  uint64_t now_us = px_clock_us(&srv->clock);
  uint64_t after_us = (uint64_t)srv->cfg->stuck_after_ms * 1000;
  scan sc = {per, nper,           top,
             0,   top ? ntop : 0, now_us > after_us ? now_us - after_us : 0};
  if (per)
    memset(per, 0, nper * sizeof *per);
  for (const px_session *s = srv->sessions; s; s = px_session_next(s))
    px_session_unsettled(s, scan_one, &sc);
  return sc.ntop;
}

static void json_unsettled(px_admin_response *r, const px_view_unsettled *u,
                           uint64_t now_us) {
  px_admin_printf(r, ",\"unsettled\":%u,\"stuck\":%u,", u->n, u->stuck);
  if (u->n)
    px_admin_printf(r, "\"oldest_unsettled_seconds\":%.3f",
                    (double)(now_us - u->oldest_us) / 1e6);
  else
    px_admin_printf(r, "\"oldest_unsettled_seconds\":null");
}

/* ---- GET /v1/queues, a slice at a time ---------------------------------- */

typedef struct queues_stream {
  px_server *srv;
  uint32_t next; /* slot to write next; n: "other", then the end */
  uint32_t nper;
  px_view_unsettled *per; /* per slot, "other" last; NULL: no memory */
} queues_stream;

static const px_view_unsettled *unsettled_of(const queues_stream *st,
                                             uint32_t slot) {
  /* the registry may have grown since the scan: a new queue has none */
  static const px_view_unsettled none;
  if (!st->per)
    return NULL;
  return slot < st->nper - 1 ? &st->per[slot] : &none;
}

static void queues_release(void *arg) {
  queues_stream *st = arg;
  free(st->per);
  free(st);
}

static bool queues_produce(void *arg, px_admin_response *r) {
  queues_stream *st = arg;
  px_queues *qs = &st->srv->metrics.queues;
  for (; st->next < qs->n && r->len < PX_ADMIN_SLICE; st->next++) {
    px_admin_printf(r, "%s", st->next ? "," : "");
    json_queue(st->srv, r, &qs->q[st->next], unsettled_of(st, st->next));
  }
  if (st->next < qs->n)
    return true;
  px_admin_printf(r, "],\"other\":");
  if (qs->other.name[0])
    json_queue(st->srv, r, &qs->other, st->per ? &st->per[st->nper - 1] : NULL);
  else
    px_admin_printf(r, "null");
  px_admin_printf(r, ",");
  json_policies(st->srv, r);
  px_admin_printf(r, "}\n");
  return false;
}

void px_view_queues_render(px_server *srv, px_admin_response *r) {
  queues_stream *st = malloc(sizeof *st);
  uint32_t nper = srv->metrics.queues.n + 1;
  if (st) {
    *st =
        (queues_stream){srv, 0, nper, malloc(nper * sizeof(px_view_unsettled))};
    if (st->per)
      px_view_scan(srv, st->per, nper, NULL, 0);
  }
  px_admin_header(r, "Content-Type", "application/json");
  px_admin_printf(r, "{\"queues\":[");
  px_admin_stream(r, queues_produce, queues_release, st);
}

/* The oldest unsettled deliveries, oldest first. */
static void json_oldest(px_server *srv, px_admin_response *r) {
  px_view_stuck top[PX_VIEW_OLDEST];
  unsigned n = px_view_scan(srv, NULL, 0, top, PX_VIEW_OLDEST);
  uint64_t now_us = px_clock_us(&srv->clock);
  px_admin_printf(r, "\"stuck_after_seconds\":%.3f,\"oldest_unsettled\":[",
                  srv->cfg->stuck_after_ms / 1000.0);
  for (unsigned i = 0; i < n; i++) {
    px_queue_stat *q = px_queues_at(&srv->metrics.queues, top[i].qid);
    px_admin_printf(r, "%s{\"queue\":", i ? "," : "");
    px_admin_json_string(r, q ? q->name : "");
    px_admin_printf(r,
                    ",\"age_seconds\":%.3f,\"channel\":%u,"
                    "\"delivery_tag\":%llu,\"consumer_tag\":",
                    (double)(now_us - top[i].delivered_us) / 1e6,
                    (unsigned)top[i].channel, (unsigned long long)top[i].tag);
    if (top[i].cancelled)
      px_admin_printf(r, "null");
    else
      px_admin_json_string(r, top[i].consumer_tag);
    px_admin_printf(r, ",\"peer\":");
    px_admin_json_string(r, top[i].peer);
    px_admin_printf(r, ",\"session\":%llu}",
                    (unsigned long long)top[i].session_id);
  }
  px_admin_printf(r, "]");
}

void px_view_summary(px_server *srv, px_admin_response *r) {
  px_queues *qs = &srv->metrics.queues;
  unsigned listed = 0;
  px_admin_printf(r, "\"in_effect\":{\"queues_seen\":%u,\"flagged\":[",
                  (unsigned)qs->n);
  for (uint32_t i = 0; i < qs->n && listed < SUMMARY_MAX; i++)
    if (flags_of(srv, &qs->q[i])) {
      px_admin_printf(r, "%s", listed++ ? "," : "");
      json_queue(srv, r, &qs->q[i], NULL);
    }
  px_admin_printf(r, "],");
  json_policies(srv, r);
  px_admin_printf(r, ",");
  json_oldest(srv, r);
  px_admin_printf(r, "}");
}

/* ---- the check ---------------------------------------------------------- */

static void check_queue(px_server *srv, px_queue_stat *q) {
  unsigned f = flags_of(srv, q) & FLAGS_CHECKED & ~q->logged;
  for (unsigned bit = 1; bit <= FLAG_FALLBACK; bit <<= 1)
    if (f & bit)
      px_warn("queue_policy_ineffective", PX_S("queue", q->name),
              PX_I("policy_index", q->policy), PX_S("why", flag_text(bit)));
  q->logged |= (uint8_t)f;
}

void px_view_check(px_server *srv) {
  uint64_t now = uv_now(srv->loop);
  px_queues *qs = &srv->metrics.queues;
  if (now - srv->cfg_since_ms < srv->cfg->policy_check_after_ms)
    return;
  for (uint32_t i = 0; i < qs->n; i++)
    check_queue(srv, &qs->q[i]);
  uint32_t matched[PX_MAX_RULES];
  count_matches(srv, matched);
  for (unsigned i = 0; i < srv->cfg->retry.nrules; i++) {
    const retry_rule *rule = &srv->cfg->retry.rules[i];
    if (matched[i] || srv->policy_logged[i])
      continue;
    srv->policy_logged[i] = true;
    px_warn("policy_unmatched", PX_U("policy_index", i),
            PX_S("first_glob", rule->globs[0]),
            PX_U("seconds", (now - srv->cfg_since_ms) / 1000),
            PX_S("why", srv->cfg_gen ? "no queue seen since the last reload "
                                       "matched it"
                                     : "no queue seen since start matched it"));
  }
}
