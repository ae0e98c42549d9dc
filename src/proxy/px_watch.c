/* px_watch.c - rebound watches the queues it hands copies to
 * (px_watch.h).
 *
 * Each vhost goes through one round at a time:
 *   IDLE ──due──▶ COUNTING (px_dlq COUNT) ──done──▶ PEEKING (a heal run
 *   per tier holding copies, one after the other) ──none left──▶ the
 *   round's findings are logged ──▶ IDLE until the next --tier-watch.
 */
#define _DEFAULT_SOURCE /* explicit_bzero */
#include "px_watch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "px_counters.h"
#include "px_dlq.h"
#include "px_log.h"
#include "px_server.h"
#include "px_session.h"
#include "retry_plan.h"
#include "retry_policy.h"

typedef enum vhost_state { V_IDLE, V_COUNTING, V_PEEKING } vhost_state;

typedef struct watch_q {
  unsigned vh; /* index in px_watch.vhosts */
  char name[RETRY_NAME_MAX + 1], source[RETRY_NAME_MAX + 1];
  char tier[16];     /* "1s"; "" for a dead-letter queue */
  uint32_t delay_ms; /* 0: a dead-letter queue */
  uint64_t last_copy_ms;
  int64_t depth;
  int64_t oldest_ms; /* the oldest copy's age at the last look, -1 */
  uint64_t healed;
  bool overdue, missing, source_missing;
  bool said_overdue, said_missing; /* logged, until it ends */
  px_log_limit overdue_log, missing_log;
  bool peeked;           /* looked into during this round */
  uint64_t next_look_ms; /* when its oldest copy may be overdue (0: now) */
} watch_q;

typedef struct watch_vhost {
  char name[256];
  char user[256], password[256];
  bool creds;
  bool login_refused; /* the broker refused it: the next client's is taken */
  unsigned last_q;    /* the queue the latest copy went to (an index) */
  vhost_state state;
  px_dlq *op;
  uint64_t next_ms;
  unsigned count_from; /* the next round's first queue, past 64 names */
  unsigned peeks;      /* heal runs started this round */
  unsigned peek_from;  /* where the next round's peeks start */
  watch_q *peek;       /* the tier of the run in progress */
  bool peek_first;     /* its first message is yet to come */
  bool peek_kept;      /* it gave one back: the tier's oldest from now */
  int64_t kept_ms;     /* ... that one's age (-1: not a copy of rebound's) */
  px_watch_verdict kept_verdict;
  struct px_watch *w;
  px_log_limit fail_log;
} watch_vhost;

typedef struct px_watch {
  px_server *srv;
  watch_q q[PX_WATCH_MAX];
  unsigned nq;
  watch_vhost vhosts[PX_WATCH_VHOSTS];
  unsigned nvhosts;
  px_log_limit full_log, login_log;
  char h_last[RETRY_NAME_MAX + 1];
} px_watch;

/* ---- pure ---- */

/* The ages at which a copy of a tier of `delay_ms` is overdue (past
 * `*overdue_after`) and is to be moved (from `*heal_at`; 0: never). */
static void thresholds(uint32_t delay_ms, uint32_t grace_ms,
                       uint32_t heal_after_ms, uint64_t *overdue_after,
                       uint64_t *heal_at) {
  uint64_t heal = heal_after_ms > delay_ms ? heal_after_ms : delay_ms;
  *overdue_after = (uint64_t)delay_ms + grace_ms;
  *heal_at = heal_after_ms ? (uint64_t)delay_ms + heal : 0;
}

px_watch_verdict px_watch_judge(uint32_t delay_ms, uint32_t grace_ms,
                                uint32_t heal_after_ms, uint64_t age_ms) {
  uint64_t overdue_after, heal_at;
  thresholds(delay_ms, grace_ms, heal_after_ms, &overdue_after, &heal_at);
  if (heal_at && age_ms >= heal_at)
    return PX_WATCH_HEAL;
  return age_ms > overdue_after ? PX_WATCH_OVERDUE : PX_WATCH_ON_TIME;
}

int px_watch_copy_age(amqp_bytes headers, const char *name, uint64_t now_s,
                      uint64_t *age_ms) {
  amqp_field f;
  int64_t at;
  if (amqp_table_get(headers, amqp_cstr(name), &f) != AMQP_OK ||
      !amqp_field_as_int(&f, &at) || at < 0)
    return -1;
  *age_ms = (uint64_t)at >= now_s ? 0 : (now_s - (uint64_t)at) * 1000;
  return 0;
}

/* ---- the table ---- */

/* A line that repeats: at most one per PX_LOG_LIMIT_MS (how many were not
 * written does not matter here: the metrics count them). */
static bool limit_pass(px_log_limit *l, uint64_t now_ms) {
  uint64_t unlogged;
  return px_log_limit_pass(l, now_ms, &unlogged);
}

static px_watch *watch_of(px_server *srv) {
  if (!srv->watch) {
    srv->watch = calloc(1, sizeof *srv->watch);
    if (srv->watch)
      srv->watch->srv = srv;
  }
  return srv->watch;
}

/* Copy `b` as a C string; -1 (nothing copied) when it does not fit. */
static int copy_whole(char *out, size_t cap, amqp_bytes b) {
  if (b.len >= cap)
    return -1;
  memcpy(out, b.ptr, b.len);
  out[b.len] = '\0';
  return 0;
}

int px_watch_login_creds(amqp_bytes mechanism, amqp_bytes r, char *user,
                         char *password, size_t cap) {
  amqp_bytes u, p;
  return px_pub_login_split(mechanism, r, &u, &p) != 0 ||
                 copy_whole(user, cap, u) || copy_whole(password, cap, p)
             ? -1
             : 0;
}

static bool vhost_in_use(const px_watch *w, unsigned vh) {
  for (unsigned i = 0; i < w->nq; i++)
    if (w->q[i].vh == vh)
      return true;
  return false;
}

static watch_vhost *vhost_for(px_watch *w, const px_session *s) {
  char name[256];
  amqp_bytes b = s->login.vhost;
  for (unsigned i = 0; i < w->nvhosts; i++)
    if (strlen(w->vhosts[i].name) == b.len &&
        memcmp(w->vhosts[i].name, b.ptr, b.len) == 0)
      return &w->vhosts[i];
  snprintf(name, sizeof name, "%.*s", (int)b.len, (const char *)b.ptr);
  watch_vhost *v = NULL;
  for (unsigned i = 0; i < w->nvhosts && !v; i++)
    if (!w->vhosts[i].creds && w->vhosts[i].state == V_IDLE &&
        !vhost_in_use(w, i))
      v = &w->vhosts[i]; /* a vhost forgotten: its place is free */
  if (!v && w->nvhosts == PX_WATCH_VHOSTS)
    return NULL;
  if (!v)
    v = &w->vhosts[w->nvhosts++];
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s", name);
  v->w = w;
  return v;
}

/* The vhost's login: the latest session's, when it can be used. */
static void take_login(px_watch *w, watch_vhost *v, const px_session *s) {
  char user[256], password[256];
  if (v->creds && !v->login_refused)
    return; /* the one it has works */
  if (!s->login_auth ||
      px_watch_login_creds(s->login.mechanism, s->login.response, user,
                           password, sizeof user) != 0) {
    if (!v->creds && limit_pass(&w->login_log, uv_now(w->srv->loop)))
      px_warn("tier_watch_no_login", PX_S("vhost", v->name),
              PX_S("user", s->user),
              PX_S("reason", s->login_auth
                                 ? "the client logged in with neither PLAIN "
                                   "nor AMQPLAIN, or with a user name or "
                                   "password over 255 bytes"
                                 : "the client's login is not kept "
                                   "(retry_connection: shared)"),
              PX_S("action", "the vhost's tiers are not watched until a "
                             "client with a password uses them"));
    return;
  }
  memcpy(v->user, user, sizeof user);
  memcpy(v->password, password, sizeof password);
  v->creds = true;
  v->login_refused = false;
  explicit_bzero(password, sizeof password);
}

void px_watch_copied(px_server *srv, const px_session *s, const char *queue,
                     const char *source, uint32_t delay_ms) {
  if (!srv->cfg->tier_watch_ms)
    return;
  px_watch *w = watch_of(srv);
  watch_vhost *v = w ? vhost_for(w, s) : NULL;
  if (!v) {
    srv->stats.tiers_unwatched++;
    return;
  }
  take_login(w, v, s);
  if (!v->creds)
    srv->stats.tiers_unwatched++; /* kept: a later client may log in */
  unsigned vh = (unsigned)(v - w->vhosts);
  for (unsigned k = 0; k < w->nq; k++) { /* the latest one first */
    unsigned i = (v->last_q + k) % w->nq;
    if (w->q[i].vh == vh && strcmp(w->q[i].name, queue) == 0) {
      w->q[i].last_copy_ms = uv_now(srv->loop);
      v->last_q = i;
      return;
    }
  }
  if (w->nq == PX_WATCH_MAX) {
    if (v->creds) /* else counted above */
      srv->stats.tiers_unwatched++;
    if (limit_pass(&w->full_log, uv_now(srv->loop)))
      px_warn("tier_watch_full", PX_S("queue", queue),
              PX_U("watched", PX_WATCH_MAX),
              PX_S("action", "not watched (counted in "
                             "rebound_tiers_unwatched_total)"));
    return;
  }
  watch_q *q = &w->q[w->nq++];
  memset(q, 0, sizeof *q);
  q->vh = vh;
  snprintf(q->name, sizeof q->name, "%s", queue);
  snprintf(q->source, sizeof q->source, "%s", source);
  q->delay_ms = delay_ms;
  if (delay_ms && retry_delay_format(delay_ms, q->tier, sizeof q->tier) < 0)
    q->tier[0] = '\0';
  q->depth = q->oldest_ms = -1;
  q->last_copy_ms = uv_now(srv->loop);
  if (v->state == V_IDLE && !v->next_ms)
    v->next_ms = q->last_copy_ms + srv->cfg->tier_watch_ms;
}

/* ---- a round ---- */

static void start_peeks(watch_vhost *v);
static void end_round(watch_vhost *v);
static void op_failed(watch_vhost *v, const px_dlq_result *r, const char *what);

/* The broker says the tier (or DLQ) does not exist: what it held is gone,
 * said once. */
static void tier_gone(watch_vhost *v, watch_q *q) {
  if (!q->missing && q->depth > 0)
    px_warn("tier_deleted", PX_S("queue", q->source), PX_S("tier", q->name),
            PX_I("depth_before", q->depth), PX_S("vhost", v->name),
            PX_S("note", "the copies it held are gone; rebound declares it "
                         "again at its next copy"));
  q->missing = true;
  q->depth = 0;
}

static void count_event(void *ctx, const px_dlq_count *c) {
  watch_vhost *v = ctx;
  px_watch *w = v->w;
  unsigned vh = (unsigned)(v - w->vhosts);
  for (unsigned i = 0; i < w->nq; i++) {
    watch_q *q = &w->q[i];
    if (q->vh != vh)
      continue;
    if (c->error && c->code == 405 && q->delay_ms &&
        strcmp(q->source, c->name) == 0) {
      q->source_missing = false; /* exclusive to its client's connection */
      continue;
    }
    if (c->error && (strcmp(q->name, c->name) == 0 ||
                     (q->delay_ms && strcmp(q->source, c->name) == 0))) {
      px_dlq_result r = {
          .status = PX_DLQ_REFUSED, .logged_in = true, .error = c->error};
      op_failed(v, &r, "count"); /* may not read it, or exclusive */
      break;
    }
    if (strcmp(q->name, c->name) == 0 && !c->error) {
      if (!c->exists)
        tier_gone(v, q);
      q->missing = !c->exists;
      q->depth = c->exists ? c->messages : 0;
      if (q->depth == 0) { /* the next copy is looked at at once */
        q->oldest_ms = -1;
        q->overdue = false;
        q->next_look_ms = 0;
      }
    }
    if (q->delay_ms && strcmp(q->source, c->name) == 0 && !c->error)
      q->source_missing = !c->exists;
  }
}

static void op_failed(watch_vhost *v, const px_dlq_result *r,
                      const char *what) {
  px_server *srv = v->w->srv;
  srv->stats.tier_watch_failures++;
  if (r->status == PX_DLQ_REFUSED && !r->logged_in)
    v->login_refused = true; /* no more rounds until another login */
  if (limit_pass(&v->fail_log, uv_now(srv->loop)))
    px_warn("tier_watch_failed", PX_S("vhost", v->name), PX_S("user", v->user),
            PX_S("step", what), PX_S("status", px_dlq_status_text(r->status)),
            PX_U("code", r->code), PX_S("error", r->error),
            PX_S("action", v->login_refused
                               ? "not watched until a client with another "
                                 "login makes a copy"
                               : "tried again at the next round"));
}

static void count_done(void *ctx, const px_dlq_result *r) {
  watch_vhost *v = ctx;
  v->op = NULL;
  if (r->status != PX_DLQ_OK) {
    op_failed(v, r, "count");
    end_round(v);
    return;
  }
  v->state = V_PEEKING;
  v->peeks = 0;
  unsigned vh = (unsigned)(v - v->w->vhosts);
  for (unsigned i = 0; i < v->w->nq; i++)
    if (v->w->q[i].vh == vh)
      v->w->q[i].peeked = false;
  start_peeks(v);
}

static const px_dlq_events count_events = {.count = count_event,
                                           .done = count_done};

/* Whether to move the message: the run's first is the tier's oldest. */
static bool heal_take(void *ctx, const px_dlq_message *m) {
  watch_vhost *v = ctx;
  px_watch *w = v->w;
  watch_q *q = v->peek;
  const px_config *cfg = w->srv->cfg;
  uint64_t age;
  px_watch_verdict verdict = PX_WATCH_ON_TIME;
  bool aged = px_watch_copy_age(m->header->props.headers, w->h_last,
                                (uint64_t)time(NULL), &age) == 0;
  if (aged)
    verdict = px_watch_judge(q->delay_ms, cfg->tier_grace_ms,
                             cfg->tier_heal_after_ms, age);
  if (v->peek_first) { /* the tier's oldest, as the broker kept it */
    q->oldest_ms = aged ? (int64_t)age : -1;
    q->overdue = verdict != PX_WATCH_ON_TIME;
  }
  v->peek_first = false;
  if (aged && verdict == PX_WATCH_HEAL && !q->source_missing)
    return true;
  v->peek_kept = true; /* not a copy of rebound's, or not old enough */
  v->kept_ms = aged ? (int64_t)age : -1;
  v->kept_verdict = verdict;
  return false;
}

/* When to look into the tier again. A copy given back on time cannot be
 * overdue before its delay + grace have passed, and the copies behind it
 * are younger: no look before then (each look is a delivery of that copy,
 * which a quorum tier counts against its delivery limit). An overdue or
 * unknown one: at the next round. */
static void schedule_look(watch_vhost *v, watch_q *q) {
  const px_config *cfg = v->w->srv->cfg;
  uint64_t now = uv_now(v->w->srv->loop);
  uint64_t due, heal;
  thresholds(q->delay_ms, cfg->tier_grace_ms, cfg->tier_heal_after_ms, &due,
             &heal);
  uint64_t age = v->kept_ms >= 0 ? (uint64_t)v->kept_ms : 0;
  q->next_look_ms = 0; /* nothing given back: at the next round */
  if (!v->peek_kept)
    return;
  if (v->kept_ms >= 0 && v->kept_verdict == PX_WATCH_ON_TIME && age <= due)
    q->next_look_ms = now + due - age + 1000; /* 1s: the header's resolution */
  else if (v->kept_ms >= 0 && heal && !q->source_missing && age < heal &&
           heal - age < PX_WATCH_SLOW_MS)
    q->next_look_ms = now + heal - age + 1000; /* when it is to be moved */
  else /* overdue and kept, or not a copy of rebound's */
    q->next_look_ms = now + PX_WATCH_SLOW_MS;
}

static void heal_done(void *ctx, const px_dlq_result *r) {
  watch_vhost *v = ctx;
  watch_q *q = v->peek;
  px_server *srv = v->w->srv;
  v->op = NULL;
  v->peek = NULL;
  px_debug("tier_watch_look", PX_S("tier", q->name), PX_I("depth", q->depth),
           PX_I("oldest_age_ms", q->oldest_ms), PX_U("moved", r->moved),
           PX_S("status", px_dlq_status_text(r->status)),
           PX_S("error", r->error));
  int64_t moved_from_ms = q->oldest_ms; /* the oldest, before the run */
  schedule_look(v, q);
  if (r->moved) {
    /* what the tier holds now: from the copy given back, if any */
    q->depth = q->depth > (int64_t)r->moved ? q->depth - (int64_t)r->moved : 0;
    q->oldest_ms = v->peek_kept ? v->kept_ms : -1;
    q->overdue = v->peek_kept ? v->kept_verdict != PX_WATCH_ON_TIME
                              : q->overdue && q->depth > 0;
    q->healed += r->moved;
    for (uint64_t k = 0; k < r->moved; k++)
      px_metrics_inc(srv, PX_M_HEALED, q->source, q->tier);
    px_warn("tier_healed", PX_S("queue", q->source), PX_S("tier", q->name),
            PX_U("moved", r->moved), PX_S("vhost", v->name),
            PX_I("oldest_age_s", moved_from_ms / 1000),
            PX_U("delay_ms", q->delay_ms),
            PX_S("note", "copies the broker did not give back in time were "
                         "moved to their source queue by rebound"));
  }
  if (r->status == PX_DLQ_NOT_FOUND && r->code == 0)
    q->source_missing = true; /* a copy came back: no such queue */
  else if (r->status == PX_DLQ_NOT_FOUND)
    tier_gone(v, q); /* deleted under the look */
  else if (r->status != PX_DLQ_OK)
    op_failed(v, r, "look into a tier");
  if (r->nacked) {
    srv->stats.tier_watch_failures++;
    if (limit_pass(&v->fail_log, uv_now(srv->loop)))
      px_warn("tier_heal_refused", PX_S("queue", q->source),
              PX_S("tier", q->name), PX_U("nacked", r->nacked),
              PX_S("note", "the broker refused the copies into the source "
                           "queue (full, or no leader): they stay in the "
                           "tier, tried again next round"));
  }
  if (r->unsettled)
    px_warn("tier_heal_cut_short", PX_S("queue", q->source),
            PX_S("tier", q->name), PX_U("moved", r->moved),
            PX_U("unsettled", r->unsettled), PX_S("error", r->error),
            PX_S("note", "copies published to the source queue whose tier "
                         "message was not acked: they may now be in both"));
  start_peeks(v);
}

static const px_dlq_events heal_events = {.take = heal_take, .done = heal_done};

static px_dlq_request *request(watch_vhost *v, px_dlq_kind kind) {
  static px_dlq_request req;
  memset(&req, 0, sizeof req);
  req.kind = kind;
  memcpy(req.user, v->user, sizeof req.user);
  memcpy(req.password, v->password, sizeof req.password);
  snprintf(req.vhost, sizeof req.vhost, "%s", v->name);
  req.name = "rebound tier watch";
  return &req;
}

static px_dlq *start(watch_vhost *v, px_dlq_request *req,
                     const px_dlq_events *ev) {
  px_server *srv = v->w->srv;
  px_dlq *op = px_dlq_start(srv->loop, &srv->clock, srv->cfg, &srv->dial_memory,
                            srv->tls_upstream, req, ev, v);
  explicit_bzero(req->password, sizeof req->password);
  return op;
}

/* A heal run on the next tier that holds copies, or the round's end. */
static void start_peeks(watch_vhost *v) {
  px_watch *w = v->w;
  unsigned vh = (unsigned)(v - w->vhosts);
  uint64_t now = uv_now(w->srv->loop);
  while (v->peeks < PX_WATCH_PEEKS) {
    watch_q *q = NULL;
    for (unsigned k = 0; k < w->nq && !q; k++) {
      watch_q *c = &w->q[(v->peek_from + k) % w->nq];
      if (c->vh == vh && c->delay_ms && !c->peeked && c->depth > 0 &&
          !c->missing && c->next_look_ms <= now)
        q = c;
    }
    if (!q)
      break;
    q->peeked = true;
    v->peeks++;
    v->peek_from = (unsigned)(q - w->q) + 1;
    px_dlq_request *req = request(v, PX_DLQ_REDRIVE);
    snprintf(req->queue, sizeof req->queue, "%s", q->name);
    snprintf(req->to, sizeof req->to, "%s", q->source);
    req->limit = PX_WATCH_HEAL_MAX;
    req->heal = true;
    v->peek = q;
    v->peek_first = true;
    v->peek_kept = false;
    if ((v->op = start(v, req, &heal_events)))
      return;
    v->peek = NULL;
    px_dlq_result r = {.status = PX_DLQ_FAILED, .error = "out of memory"};
    op_failed(v, &r, "look into a tier");
  }
  end_round(v);
}

/* Forget the queues of vhost `vh` that are over: empty (or never looked
 * at), not overdue, no copy for PX_WATCH_FORGET_MS. The table is compacted, so
 * only while no other vhost's round is under way (a heal run points into it).
 */
static void forget(px_watch *w, unsigned vh, uint64_t now) {
  for (unsigned i = 0; i < w->nvhosts; i++)
    if (i != vh && w->vhosts[i].state != V_IDLE)
      return; /* at this vhost's next round */
  unsigned k = 0;
  for (unsigned i = 0; i < w->nq; i++) {
    watch_q *q = &w->q[i];
    bool over = q->vh == vh && q->depth <= 0 && !q->overdue &&
                now - q->last_copy_ms > PX_WATCH_FORGET_MS + q->delay_ms;
    if (!over)
      w->q[k++] = *q;
  }
  w->nq = k;
}

/* Log what changed, forget what is over, and wait for the next round. */
static void end_round(watch_vhost *v) {
  px_watch *w = v->w;
  px_server *srv = w->srv;
  uint64_t now = uv_now(srv->loop);
  unsigned vh = (unsigned)(v - w->vhosts);
  v->state = V_IDLE;
  v->next_ms = now + srv->cfg->tier_watch_ms;
  for (unsigned i = 0; i < w->nq; i++) {
    watch_q *q = &w->q[i];
    if (q->vh != vh)
      continue;
    if (q->overdue && (!q->said_overdue || limit_pass(&q->overdue_log, now))) {
      q->said_overdue = true;
      px_warn("tier_overdue", PX_S("queue", q->source), PX_S("tier", q->name),
              PX_I("depth", q->depth),
              PX_I("oldest_age_s", q->oldest_ms / 1000),
              PX_U("delay_ms", q->delay_ms), PX_S("vhost", v->name),
              PX_S("note", "the broker is not giving this tier's copies back "
                           "in time"));
    } else if (!q->overdue && q->said_overdue) {
      q->said_overdue = false;
      px_info("tier_overdue_ended", PX_S("queue", q->source),
              PX_S("tier", q->name), PX_I("depth", q->depth));
    }
    bool gone = q->source_missing && q->depth != 0;
    if (gone && (!q->said_missing || limit_pass(&q->missing_log, now))) {
      q->said_missing = true;
      px_warn("source_queue_missing", PX_S("queue", q->source),
              PX_S("tier", q->name), PX_I("depth", q->depth),
              PX_S("vhost", v->name),
              PX_S("note", "copies waiting in the tier are dropped by the "
                           "broker when they expire; declare the queue again "
                           "to keep them"));
    } else if (!gone && q->said_missing) {
      q->said_missing = false;
      px_info("source_queue_missing_ended", PX_S("queue", q->source),
              PX_S("tier", q->name), PX_I("depth", q->depth));
    }
  }
  forget(w, vh, now);
  if (v->peek_from >= w->nq)
    v->peek_from = 0;
  if (!vhost_in_use(w, vh)) { /* nothing left to watch there */
    explicit_bzero(v->password, sizeof v->password);
    v->creds = false;
    v->next_ms = 0;
  }
}

/* COUNT every queue of the vhost and each tier's source (at most
 * PX_DLQ_MAX_QUEUES names; past that, the next round goes on from where
 * this one stopped). */
static void start_round(watch_vhost *v) {
  px_watch *w = v->w;
  unsigned vh = (unsigned)(v - w->vhosts), n = 0;
  px_dlq_request *req = request(v, PX_DLQ_COUNT);
  if (retry_header_name(&w->srv->cfg->retry, "last-failed-at", w->h_last,
                        sizeof w->h_last) < 0) /* the prefix may be reloaded */
    w->h_last[0] = '\0';
  for (unsigned k = 0; k < w->nq; k++) {
    watch_q *q = &w->q[(v->count_from + k) % w->nq];
    if (q->vh != vh)
      continue;
    if (req->nqueues + 2 > PX_DLQ_MAX_QUEUES) {
      v->count_from = (unsigned)(q - w->q);
      break;
    }
    px_dlq_add_queue(req, q->name);
    if (q->delay_ms)
      px_dlq_add_queue(req, q->source);
    n++;
  }
  if (!n) {
    explicit_bzero(req->password, sizeof req->password);
    v->next_ms = 0; /* until a copy goes there again */
    return;
  }
  v->state = V_COUNTING;
  px_debug("tier_watch_round", PX_S("vhost", v->name), PX_U("queues", n),
           PX_U("names", req->nqueues));
  if (!(v->op = start(v, req, &count_events))) {
    px_dlq_result r = {.status = PX_DLQ_FAILED, .error = "out of memory"};
    op_failed(v, &r, "count");
    end_round(v);
  }
}

void px_watch_tick(px_server *srv, uint64_t now_ms) {
  px_watch *w = srv->watch;
  if (!w || !srv->cfg->tier_watch_ms || srv->draining)
    return;
  for (unsigned i = 0; i < w->nvhosts; i++) {
    watch_vhost *v = &w->vhosts[i];
    if (v->state == V_IDLE && v->creds && !v->login_refused && v->next_ms &&
        now_ms >= v->next_ms)
      start_round(v);
    else if (v->state == V_IDLE && (!v->creds || v->login_refused))
      forget(w, i, now_ms); /* unwatched: kept a while for a login */
  }
}

void px_watch_free(px_server *srv) {
  px_watch *w = srv->watch;
  if (!w)
    return;
  for (unsigned i = 0; i < w->nvhosts; i++)
    px_dlq_cancel(w->vhosts[i].op);
  explicit_bzero(w, sizeof *w);
  free(w);
  srv->watch = NULL;
}

void px_watch_each(px_server *srv, void (*fn)(void *, const px_watch_info *),
                   void *ctx) {
  px_watch *w = srv->watch;
  for (unsigned i = 0; w && i < w->nq; i++) {
    const watch_q *q = &w->q[i];
    px_watch_info info = {
        q->name,           q->source,
        q->tier,           q->delay_ms == 0,
        q->depth,          q->oldest_ms < 0 ? -1 : q->oldest_ms / 1000.0,
        q->overdue,        q->missing,
        q->source_missing, q->healed};
    fn(ctx, &info);
  }
}
