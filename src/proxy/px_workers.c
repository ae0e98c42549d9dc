/* px_workers.c - worker processes on shared listeners (px_workers.h).
 *
 * Worker 0 owns, per other worker, its process handle, the parent's end
 * of its control socket and a respawn timer; each is closed once, by
 * px_workers_stop (or, for the process and socket of a worker that
 * exited, by its exit callback), and the set is freed when the last close
 * callback has run. A worker owns only its end of the control socket.
 *
 * Questions to the workers (queries) wait in a list, oldest first. Each
 * worker answers its requests in order, so an answer belongs to the
 * oldest query that asked that worker and has no answer from it yet. A
 * query is answered (to the admin client) when every worker asked has
 * answered, exited, or PX_WORKERS_ASK_MS has passed; it leaves the list
 * only when no worker owes it an answer any more.
 */
#include "px_workers.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "px_log.h"
#include "px_metrics.h"
#include "px_server.h"

#define CTL_FD 3
#define ANSWER_MAX PX_ADMIN_MAX_RESPONSE
#define OWED_MAX 4 /* a worker that owes more is not asked (stuck) */

extern char **environ;

typedef struct query {
  struct query *next;
  px_admin_response *resp; /* NULL once answered or cancelled */
  int kind;
  uint64_t deadline_ms;
  bool asked[PX_MAX_WORKERS], got[PX_MAX_WORKERS];
  char *doc[PX_MAX_WORKERS]; /* an answer (NULL: none) */
  size_t len[PX_MAX_WORKERS];
} query;

typedef struct worker {
  struct px_workers *set;
  unsigned index;
  uv_process_t proc;
  uv_pipe_t ctl;
  uv_timer_t respawn;
  bool running;     /* the process has not exited */
  bool proc_handle; /* proc is open (until its close callback) */
  bool ctl_handle;  /* ctl is open (until its close callback) */
  int pid;
  unsigned owed; /* answers not read yet */
  char *in;      /* the answer being read */
  size_t in_len, in_cap;
  size_t want; /* its length, once the header is read (+ header) */
  char *last;  /* its last /metrics answer (NULL: none yet) */
  size_t last_len;
} worker;

typedef struct px_workers {
  px_server *srv;
  unsigned n; /* cfg->workers at start */
  worker *w;  /* [n]; [0] unused */
  query *queries;
  uv_timer_t ask_timer, kill_timer;
  unsigned handles; /* open handles of the set: freed at 0 */
  bool stopping;
  /* the counters of workers that exited, summed at their last answers,
   * so that merged counters never go back (NULL: none) */
  char *retired;
  size_t retired_len;
  void (*event)(px_server *srv, px_workers_event ev);
  uint64_t restarts;
  char exe[4096];
  char **argv;
  char **env; /* environ plus REBOUND_WORKER=k (the last slot) */
  char env_worker[32], env_workers[32];
  /* a worker's end of its control socket */
  uv_pipe_t ctl;
  bool ctl_open;
  char req[64];
} px_workers;

/* ---- handles ------------------------------------------------------------- */

static void query_free(const px_workers *set, query *q) {
  for (unsigned k = 0; k < set->n; k++)
    free(q->doc[k]);
  free(q);
}

static void set_free(px_workers *set) {
  while (set->queries) {
    query *q = set->queries;
    set->queries = q->next;
    query_free(set, q);
  }
  for (unsigned k = 0; set->w && k < set->n; k++) {
    free(set->w[k].in);
    free(set->w[k].last);
  }
  free(set->w);
  free(set->retired);
  free(set->env);
  free(set);
}

static void handle_gone(px_workers *set) {
  if (--set->handles == 0 && set->stopping)
    set_free(set);
}

static void on_set_handle_closed(uv_handle_t *h) {
  handle_gone(h->data);
}

static void set_handle_close(px_workers *set, uv_handle_t *h) {
  h->data = set;
  uv_close(h, on_set_handle_closed);
}

static void on_worker_handle_closed(uv_handle_t *h) {
  worker *w = h->data;
  if (h == (uv_handle_t *)&w->ctl)
    w->ctl_handle = false;
  else if (h == (uv_handle_t *)&w->proc)
    w->proc_handle = false;
  handle_gone(w->set);
}

static void worker_close(worker *w, uv_handle_t *h) {
  if (!uv_is_closing(h)) {
    h->data = w;
    uv_close(h, on_worker_handle_closed);
  }
}

/* ---- queries (worker 0) -------------------------------------------------- */

static void answer_query(px_workers *set, query *q);

static bool query_owed(const px_workers *set, const query *q) {
  for (unsigned k = 1; k < set->n; k++)
    if (q->asked[k] && !q->got[k])
      return true;
  return false;
}

static void on_ask_timer(uv_timer_t *t);

/* Answer each query that has all its answers or is due; drop those that
 * are answered and owed nothing; arm the timer for the next due one. */
static void queries_advance(px_workers *set) {
  uint64_t now = uv_now(set->srv->loop), next = UINT64_MAX;
  for (query **p = &set->queries; *p;) {
    query *q = *p;
    if (q->resp && (!query_owed(set, q) || now >= q->deadline_ms))
      answer_query(set, q);
    if (q->resp && q->deadline_ms < next)
      next = q->deadline_ms;
    if (q->resp || query_owed(set, q)) {
      p = &q->next;
      continue;
    }
    *p = q->next;
    query_free(set, q);
  }
  if (set->stopping)
    return;
  if (next == UINT64_MAX)
    uv_timer_stop(&set->ask_timer);
  else
    uv_timer_start(&set->ask_timer, on_ask_timer, next - now, 0);
}

static void on_ask_timer(uv_timer_t *t) {
  queries_advance(t->data);
}

/* A worker's latest /metrics answer, kept for when it does not answer in
 * time (its counters must not seem to go back). */
static void keep_last(worker *w, const char *doc, size_t len) {
  char *copy = malloc(len + 1);
  if (!copy)
    return;
  memcpy(copy, doc, len + 1);
  free(w->last);
  w->last = copy;
  w->last_len = len;
}

/* A worker exited: the counters of its last answer join the retired sum. */
static void retire(px_workers *set, worker *w) {
  const char *texts[2] = {set->retired ? set->retired : "", w->last};
  size_t lens[2] = {set->retired_len, w->last_len};
  static const bool counters_only[2] = {true, true};
  px_admin_response r;
  if (!w->last)
    return;
  memset(&r, 0, sizeof r);
  if (px_metrics_merge(texts, lens, counters_only, 2, &r) == 0 && !r.failed) {
    free(set->retired);
    set->retired = r.body;
    set->retired_len = r.len;
  } else {
    free(r.body);
  }
  free(w->last);
  w->last = NULL;
}

/* A worker's answer (`doc` malloc'ed, or NULL when it could not render):
 * to the oldest query that waits for it. */
static void query_answered(px_workers *set, worker *w, char *doc, size_t len) {
  for (query *q = set->queries; q; q = q->next)
    if (q->asked[w->index] && !q->got[w->index]) {
      q->got[w->index] = true;
      q->doc[w->index] = doc;
      q->len[w->index] = len;
      if (q->kind == 'M' && doc)
        keep_last(w, doc, len);
      w->owed--;
      queries_advance(set);
      return;
    }
  free(doc); /* nothing asked: cannot happen */
}

/* A worker exited: it owes nothing any more. */
static void queries_forget(px_workers *set, worker *w) {
  for (query *q = set->queries; q; q = q->next)
    if (q->asked[w->index] && !q->got[w->index])
      q->got[w->index] = true; /* without a document */
  w->owed = 0;
  queries_advance(set);
}

static void on_query_cancel(void *state) {
  query *q = state;
  q->resp = NULL; /* freed by queries_advance once owed nothing */
}

/* ---- the control socket, worker 0's end ---------------------------------- */

static void on_alloc(uv_handle_t *h, size_t want, uv_buf_t *buf) {
  worker *w = h->data;
  (void)want;
  if (w->in_cap - w->in_len < 65536) {
    size_t cap = w->in_cap ? w->in_cap * 2 : 65536;
    char *in = realloc(w->in, cap);
    if (!in) {
      *buf = uv_buf_init(NULL, 0); /* read fails with UV_ENOBUFS */
      return;
    }
    w->in = in;
    w->in_cap = cap;
  }
  *buf = uv_buf_init(w->in + w->in_len, (unsigned)(w->in_cap - w->in_len));
}

/* The answers complete in w->in ("K LEN\n" and LEN bytes each): false on a
 * malformed header. */
static bool take_answers(px_workers *set, worker *w) {
  for (;;) {
    if (!w->want) {
      char *nl = memchr(w->in, '\n', w->in_len);
      if (!nl)
        return w->in_len < 32;
      char *end;
      unsigned long long len = strtoull(w->in + 2, &end, 10);
      if (w->in_len < 3 || w->in[1] != ' ' || end != nl || len > ANSWER_MAX)
        return false;
      w->want = (size_t)(nl - w->in) + 1 + (size_t)len;
    }
    if (w->in_len < w->want)
      return true;
    size_t head = (size_t)(memchr(w->in, '\n', w->in_len) - (void *)w->in) + 1;
    size_t len = w->want - head;
    char *doc = len ? malloc(len + 1) : NULL;
    if (doc) {
      memcpy(doc, w->in + head, len);
      doc[len] = '\0';
    }
    memmove(w->in, w->in + w->want, w->in_len - w->want);
    w->in_len -= w->want;
    w->want = 0;
    query_answered(set, w, doc, doc ? len : 0);
  }
}

static void on_ctl_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  worker *w = st->data;
  (void)buf;
  if (n == 0)
    return;
  if (n > 0) {
    w->in_len += (size_t)n;
    if (take_answers(w->set, w))
      return;
    px_warn("worker_answer_malformed", PX_U("index", w->index),
            PX_I("pid", w->pid));
  }
  /* the worker closed its end, or sent nonsense: it answers no more */
  uv_read_stop(st);
  queries_forget(w->set, w);
}

static void on_ask_written(uv_write_t *req, int status) {
  (void)status; /* a worker gone: its exit callback tells */
  free(req);
}

/* Send `kind` to worker `w`: false when it cannot be asked. */
static bool ask(worker *w, int kind) {
  static char kinds[] = "MS";
  uv_write_t *req;
  if (!w->running || !w->ctl_handle || w->owed >= OWED_MAX ||
      !(req = malloc(sizeof *req)))
    return false;
  uv_buf_t b = uv_buf_init(kind == 'M' ? kinds : kinds + 1, 1);
  if (uv_write(req, (uv_stream_t *)&w->ctl, &b, 1, on_ask_written) != 0) {
    free(req);
    return false;
  }
  w->owed++;
  return true;
}

/* ---- rendering ----------------------------------------------------------- */

/* This process's /metrics ('M') or /v1/status ('S') into `r` (zeroed by
 * the caller), a streamed body run to its end. */
static void render_here(px_server *srv, int kind, px_admin_response *r) {
  px_admin_response slice;
  memset(&slice, 0, sizeof slice);
  r->status = 200;
  if (kind == 'M')
    px_metrics_render(srv, r);
  else
    px_status_render(srv, r);
  for (bool more = r->produce != NULL; more && !r->failed;) {
    slice.len = 0;
    more = r->produce(r->state, &slice);
    if (slice.failed || px_admin_append(r, slice.body, slice.len) != 0)
      r->failed = true;
  }
  if (r->release)
    r->release(r->state);
  r->produce = NULL;
  r->release = NULL;
  free(slice.body);
}

/* /v1/status: this process's document with the others' in "workers". */
static void answer_status(px_workers *set, query *q, px_admin_response *r) {
  px_admin_response own;
  memset(&own, 0, sizeof own);
  render_here(set->srv, 'S', &own);
  while (own.len && own.body[own.len - 1] == '\n')
    own.len--;
  r->content_type = "application/json";
  if (own.failed || !own.len || own.body[--own.len] != '}') {
    r->failed = true;
    free(own.body);
    return;
  }
  px_admin_append(r, own.body, own.len);
  free(own.body);
  px_admin_printf(r, ",\"worker\":0,\"pid\":%d,\"workers\":[",
                  (int)uv_os_getpid());
  for (unsigned k = 1; k < set->n; k++) {
    px_admin_printf(r, "%s{\"worker\":%u,\"pid\":%d,\"running\":%s,\"status\":",
                    k > 1 ? "," : "", k, set->w[k].pid,
                    set->w[k].running ? "true" : "false");
    size_t len = q->len[k];
    while (len && q->doc[k][len - 1] == '\n')
      len--;
    if (len)
      px_admin_append(r, q->doc[k], len);
    else
      px_admin_printf(r, "null");
    px_admin_printf(r, "}");
  }
  px_admin_printf(r, "]}\n");
}

static void answer_metrics(px_workers *set, query *q, px_admin_response *r) {
  px_admin_response own;
  const char *texts[PX_MAX_WORKERS + 1];
  size_t lens[PX_MAX_WORKERS + 1];
  bool only[PX_MAX_WORKERS + 1] = {false};
  unsigned n = 0, running = 1, answered = 1;
  memset(&own, 0, sizeof own);
  render_here(set->srv, 'M', &own);
  texts[n] = own.body ? own.body : "";
  lens[n++] = own.len;
  for (unsigned k = 1; k < set->n; k++) {
    const worker *w = &set->w[k];
    running += w->running;
    answered += q->doc[k] != NULL;
    if (w->running && w->last) { /* this answer, or the one before */
      texts[n] = w->last;
      lens[n++] = w->last_len;
    }
  }
  if (set->retired) {
    only[n] = true;
    texts[n] = set->retired;
    lens[n++] = set->retired_len;
  }
  r->content_type = "text/plain; version=0.0.4; charset=utf-8";
  if (own.failed || px_metrics_merge(texts, lens, only, n, r) != 0)
    r->failed = true;
  free(own.body);
  px_admin_printf(r,
                  "# HELP rebound_workers Processes serving the listeners "
                  "(--workers)\n# TYPE rebound_workers gauge\n"
                  "rebound_workers %u\n"
                  "# HELP rebound_workers_running Worker processes running\n"
                  "# TYPE rebound_workers_running gauge\n"
                  "rebound_workers_running %u\n"
                  "# HELP rebound_workers_answered Workers that answered "
                  "this scrape (the others' figures are from their last "
                  "answer)\n"
                  "# TYPE rebound_workers_answered gauge\n"
                  "rebound_workers_answered %u\n"
                  "# HELP rebound_worker_restarts_total Workers started "
                  "again after they exited\n"
                  "# TYPE rebound_worker_restarts_total counter\n"
                  "rebound_worker_restarts_total %llu\n",
                  set->n, running, answered, (unsigned long long)set->restarts);
}

static void answer_into(px_workers *set, query *q, px_admin_response *r) {
  if (q->kind == 'M')
    answer_metrics(set, q, r);
  else
    answer_status(set, q, r);
}

static void answer_query(px_workers *set, query *q) {
  px_admin_response *r = q->resp;
  q->resp = NULL;
  answer_into(set, q, r);
  px_admin_resume(r);
}

bool px_workers_render(px_server *srv, int kind, px_admin_response *r) {
  px_workers *set = srv->workers;
  query *q;
  if (!set || set->n < 2 || srv->cfg->worker != 0 || set->stopping)
    return false;
  if (!(q = calloc(1, sizeof *q))) {
    r->failed = true;
    return true;
  }
  bool any = false;
  q->kind = kind;
  q->deadline_ms = uv_now(srv->loop) + PX_WORKERS_ASK_MS;
  for (unsigned k = 1; k < set->n; k++)
    any |= q->asked[k] = ask(&set->w[k], kind);
  if (!any) { /* none to wait for: answered now, not deferred */
    answer_into(set, q, r);
    free(q);
    return true;
  }
  q->resp = r;
  query **tail = &set->queries;
  while (*tail)
    tail = &(*tail)->next;
  *tail = q;
  px_admin_defer(r, on_query_cancel, q);
  queries_advance(set);
  return true;
}

/* ---- the control socket, a worker's end ---------------------------------- */

typedef struct reply {
  uv_write_t req;
  char head[32];
  char *body;
} reply;

static void on_reply_written(uv_write_t *req, int status) {
  reply *rp = (reply *)req;
  (void)status; /* worker 0 gone: the read side tells */
  free(rp->body);
  free(rp);
}

static void reply_to(px_workers *set, int kind) {
  px_admin_response r;
  reply *rp = malloc(sizeof *rp);
  memset(&r, 0, sizeof r);
  if (!rp)
    return; /* worker 0 answers without this worker at its deadline */
  render_here(set->srv, kind, &r);
  size_t len = r.failed ? 0 : r.len;
  int h = snprintf(rp->head, sizeof rp->head, "%c %zu\n", kind, len);
  rp->body = r.body;
  uv_buf_t b[2] = {uv_buf_init(rp->head, (unsigned)h),
                   uv_buf_init(r.body, (unsigned)len)};
  if (uv_write(&rp->req, (uv_stream_t *)&set->ctl, b, len ? 2 : 1,
               on_reply_written) != 0)
    on_reply_written(&rp->req, -1);
}

static void on_req_alloc(uv_handle_t *h, size_t want, uv_buf_t *buf) {
  px_workers *set = h->data;
  (void)want;
  *buf = uv_buf_init(set->req, sizeof set->req);
}

static void on_request(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  px_workers *set = st->data;
  for (ssize_t i = 0; i < n; i++)
    if (buf->base[i] == 'M' || buf->base[i] == 'S')
      reply_to(set, buf->base[i]);
  if (n >= 0 || set->stopping)
    return;
  /* worker 0 is gone (or closed its end): drain as on SIGTERM */
  uv_read_stop(st);
  px_warn("worker_parent_gone", PX_S("error", uv_strerror((int)n)),
          PX_S("action", "draining"));
  set->event(set->srv, PX_WORKERS_PARENT_GONE);
}

/* ---- processes (worker 0) ------------------------------------------------ */

static void on_worker_exit(uv_process_t *p, int64_t status, int signum);

/* Start worker `w`: its control socket, then the process. */
static int worker_spawn(px_workers *set, worker *w) {
  uv_loop_t *loop = set->srv->loop;
  uv_stdio_container_t io[4];
  uv_process_options_t o;
  memset(&o, 0, sizeof o);
  uv_pipe_init(loop, &w->ctl, 0);
  w->ctl.data = w;
  w->ctl_handle = true;
  set->handles++;
  for (int fd = 0; fd < 3; fd++) {
    io[fd].flags = UV_INHERIT_FD;
    io[fd].data.fd = fd;
  }
  io[CTL_FD].flags = UV_CREATE_PIPE | UV_READABLE_PIPE | UV_WRITABLE_PIPE;
  io[CTL_FD].data.stream = (uv_stream_t *)&w->ctl;
  snprintf(set->env_worker, sizeof set->env_worker, "REBOUND_WORKER=%u",
           w->index);
  o.exit_cb = on_worker_exit;
  o.file = set->exe;
  o.args = set->argv;
  o.env = set->env;
  o.stdio_count = 4;
  o.stdio = io;
  int rc = uv_spawn(loop, &w->proc, &o);
  w->proc.data = w;
  w->proc_handle = true; /* closed even when the spawn failed */
  set->handles++;
  if (rc != 0) {
    px_error("worker_start_failed", PX_U("index", w->index),
             PX_S("error", uv_strerror(rc)));
    worker_close(w, (uv_handle_t *)&w->proc);
    worker_close(w, (uv_handle_t *)&w->ctl);
    return rc;
  }
  w->running = true;
  w->pid = w->proc.pid;
  w->in_len = w->want = 0;
  uv_read_start((uv_stream_t *)&w->ctl, on_alloc, on_ctl_read);
  px_info("worker_started", PX_U("index", w->index), PX_I("pid", w->pid));
  return 0;
}

static void on_respawn(uv_timer_t *t) {
  worker *w = t->data;
  px_workers *set = w->set;
  if (set->stopping || set->srv->draining || w->running)
    return;
  if (w->proc_handle || w->ctl_handle) { /* still closing: soon */
    uv_timer_start(t, on_respawn, 10, 0);
    return;
  }
  set->restarts++;
  if (worker_spawn(set, w) != 0)
    uv_timer_start(t, on_respawn, PX_WORKERS_RESPAWN_MS, 0);
}

static void on_worker_exit(uv_process_t *p, int64_t status, int signum) {
  worker *w = p->data;
  px_workers *set = w->set;
  w->running = false;
  worker_close(w, (uv_handle_t *)&w->proc);
  worker_close(w, (uv_handle_t *)&w->ctl);
  queries_forget(set, w);
  retire(set, w);
  if (set->srv->draining || set->stopping) {
    px_info("worker_exited", PX_U("index", w->index), PX_I("pid", w->pid),
            PX_I("status", status), PX_I("signal", signum));
    set->event(set->srv, PX_WORKERS_EXITED);
    return;
  }
  px_error("worker_died", PX_U("index", w->index), PX_I("pid", w->pid),
           PX_I("status", status), PX_I("signal", signum),
           PX_U("restart_in_ms", PX_WORKERS_RESPAWN_MS));
  uv_timer_start(&w->respawn, on_respawn, PX_WORKERS_RESPAWN_MS, 0);
}

static void kill_running(px_workers *set, const char *reason) {
  for (unsigned k = 1; k < set->n; k++)
    if (set->w[k].running) {
      px_warn("worker_killed", PX_U("index", k), PX_I("pid", set->w[k].pid),
              PX_S("reason", reason));
      uv_process_kill(&set->w[k].proc, SIGKILL);
    }
}

static void on_kill_timer(uv_timer_t *t) {
  kill_running(t->data, "still running after the drain timeout");
}

/* The environment of the workers: this one's, REBOUND_WORKERS set to this
 * process's number (so that a file changed since, read again by a
 * respawned worker or on SIGHUP, cannot make them disagree: the variable
 * beats the file, and the flags are the same), and REBOUND_WORKER (set at
 * each spawn, in the last slot). */
static int copy_env(px_workers *set) {
  size_t n = 0, j = 0;
  while (environ[n])
    n++;
  if (!(set->env = calloc(n + 3, sizeof *set->env)))
    return UV_ENOMEM;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "REBOUND_WORKER=", 15) != 0 &&
        strncmp(environ[i], "REBOUND_WORKERS=", 16) != 0)
      set->env[j++] = environ[i];
  snprintf(set->env_workers, sizeof set->env_workers, "REBOUND_WORKERS=%u",
           set->n);
  set->env[j++] = set->env_workers;
  set->env[j] = set->env_worker;
  return 0;
}

/* ---- the set ------------------------------------------------------------- */

static void set_timer(px_workers *set, uv_timer_t *t, void *data) {
  uv_timer_init(set->srv->loop, t);
  t->data = data;
  set->handles++;
}

static int start_parent(px_workers *set, char **argv) {
  /* /proc/self/exe in the forked child is this very binary, even after
   * a package upgrade replaced the file: every worker runs one version */
  size_t size = sizeof set->exe;
  int rc = access("/proc/self/exe", X_OK) == 0
               ? (snprintf(set->exe, sizeof set->exe, "/proc/self/exe"), 0)
               : uv_exepath(set->exe, &size);
  if (rc == 0)
    rc = copy_env(set);
  if (rc == 0 && !(set->w = calloc(set->n, sizeof *set->w)))
    rc = UV_ENOMEM;
  if (rc != 0) {
    px_error("workers_start_failed", PX_S("error", uv_strerror(rc)));
    return rc;
  }
  set->argv = argv;
  set_timer(set, &set->ask_timer, set);
  set_timer(set, &set->kill_timer, set);
  for (unsigned k = 1; k < set->n; k++) {
    set->w[k].set = set;
    set->w[k].index = k;
    set_timer(set, &set->w[k].respawn, &set->w[k]);
  }
  for (unsigned k = 1; k < set->n; k++)
    if ((rc = worker_spawn(set, &set->w[k])) != 0)
      return rc;
  return 0;
}

static int start_child(px_workers *set) {
  uv_pipe_init(set->srv->loop, &set->ctl, 0);
  set->ctl.data = set;
  set->ctl_open = true;
  set->handles++;
  struct stat st;
  int rc = fstat(CTL_FD, &st) != 0 || !S_ISSOCK(st.st_mode)
               ? UV_ENOTSOCK
               : uv_pipe_open(&set->ctl, CTL_FD);
  if (rc == 0)
    rc = uv_read_start((uv_stream_t *)&set->ctl, on_req_alloc, on_request);
  if (rc != 0)
    px_error("worker_control_failed", PX_U("index", set->srv->cfg->worker),
             PX_S("error", uv_strerror(rc)),
             PX_S("note", "REBOUND_WORKER is for the processes rebound "
                          "starts itself"));
  return rc;
}

int px_workers_start(px_server *srv, char **argv,
                     void (*event)(px_server *srv, px_workers_event ev)) {
  const px_config *cfg = srv->cfg;
  if (cfg->workers < 2)
    return 0;
  px_workers *set = calloc(1, sizeof *set);
  if (!set)
    return UV_ENOMEM;
  set->srv = srv;
  set->event = event;
  set->n = cfg->workers;
  srv->workers = set;
  return cfg->worker ? start_child(set) : start_parent(set, argv);
}

void px_workers_signal(px_server *srv, int signum) {
  px_workers *set = srv->workers;
  for (unsigned k = 1; set && set->w && k < set->n; k++)
    if (set->w[k].running)
      uv_process_kill(&set->w[k].proc, signum);
}

void px_workers_deadline(px_server *srv) {
  px_workers *set = srv->workers;
  if (set && set->w && !set->stopping)
    uv_timer_start(&set->kill_timer, on_kill_timer, PX_WORKERS_KILL_MS, 0);
}

unsigned px_workers_running(const px_server *srv) {
  const px_workers *set = srv->workers;
  unsigned n = 0;
  for (unsigned k = 1; set && set->w && k < set->n; k++)
    n += set->w[k].running;
  return n;
}

void px_workers_stop(px_server *srv) {
  px_workers *set = srv->workers;
  if (!set || set->stopping)
    return;
  for (query *q = set->queries; q; q = q->next)
    if (q->resp)
      answer_query(set, q); /* with what has come */
  if (set->w)
    kill_running(set, "worker 0 is stopping");
  set->stopping = true;
  srv->workers = NULL;
  if (set->ctl_open)
    set_handle_close(set, (uv_handle_t *)&set->ctl);
  if (set->w) {
    set_handle_close(set, (uv_handle_t *)&set->ask_timer);
    set_handle_close(set, (uv_handle_t *)&set->kill_timer);
  }
  for (unsigned k = 1; set->w && k < set->n; k++) {
    worker *w = &set->w[k];
    w->running = false;
    set_handle_close(set, (uv_handle_t *)&w->respawn);
    if (w->proc_handle)
      worker_close(w, (uv_handle_t *)&w->proc);
    if (w->ctl_handle)
      worker_close(w, (uv_handle_t *)&w->ctl);
  }
  if (!set->handles)
    set_free(set);
}

uint64_t px_workers_share(const px_server *srv, uint64_t total) {
  const px_config *cfg = srv->cfg;
  uint64_t n = cfg->workers ? cfg->workers : 1;
  uint64_t share = total / n + (cfg->worker < total % n);
  return total && !share ? 1 : share;
}
