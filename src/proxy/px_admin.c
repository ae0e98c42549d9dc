/* px_admin.c - the admin HTTP/1.1 server (see px_admin.h).
 *
 * A connection moves through one state machine, every transition here:
 *
 *   READING ──request routed, keep-alive──▶ ANSWERING
 *   READING ──request routed, answer deferred──▶ WAITING
 *   WAITING ──px_admin_resume──▶ ANSWERING or FLUSHING (as READING would)
 *   ANSWERING ──its last byte written──▶ READING (input kept aside first)
 *   READING ──request routed, last one / bad request / EOF──▶ FLUSHING
 *   FLUSHING ──its last byte written──▶ uv_shutdown ──▶ LINGER (or CLOSED
 *                                                        after EOF)
 *   LINGER ──EOF, read error or linger timer──▶ CLOSED
 *   READING, idle, when a newcomer finds the cap reached ──▶ CLOSED
 *   any ──timeout, write error, px_admin_stop──▶ CLOSED (uv_close)
 *
 * One response is in flight per connection, and one write for it. The
 * parser pauses after every request (on_message_complete returns
 * HPE_PAUSED) and the request is routed at once; in ANSWERING the socket is
 * not read and the input after the request waits in `stash` until the
 * answer is written, then it is parsed first. A streamed body moves one
 * slice at a time. A write's completion (on_write) only queues the
 * connection as ready; the next step (the next slice, or the end of the
 * response and the next request) is taken by on_admin_idle in a later loop
 * iteration, for at most STEPS_PER_ITERATION connections per iteration,
 * oldest first. So between two polls for I/O the server takes at most that
 * many such steps, and a connection routes at most one request or produces
 * one slice. In FLUSHING and LINGER the socket is read and the input
 * dropped, so the close sends no reset.
 * A producer's state is released as soon as the response ends or the
 * connection closes; the memory of a connection is freed only when both
 * its handles have closed.
 */
#define _DEFAULT_SOURCE /* explicit_bzero */
#include "px_admin.h"

#include <llhttp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "px_log.h"
#include "px_resolve.h"

#define DEFAULT_MAX_CONNS 64
#define DEFAULT_TIMEOUT_MS 10000
#define LINGER_MS 2000        /* discard input after a final response */
#define REQUEST_LINE_BYTES 16 /* method, spaces, version, CRLF (counted) */
#define HEADER_DELIM_BYTES 4  /* ": " and CRLF around each header */
#define MAX_CONTENT_TYPE 200
#define STEPS_PER_ITERATION 4 /* slices or requests after a write, in all */

typedef enum conn_state {
  CONN_READING,   /* parsing a request, or idle between two */
  CONN_WAITING,   /* the router answers later (px_admin_defer) */
  CONN_ANSWERING, /* a response in flight; the next request waits */
  CONN_FLUSHING,  /* the last response in flight; shutdown once written */
  CONN_LINGER,    /* write side shut down; input discarded until EOF/timer */
  CONN_CLOSED,    /* uv_close called on both handles */
} conn_state;

static const char *const state_names[] = {"reading",  "waiting", "answering",
                                          "flushing", "linger",  "closed"};

/* How a response's body is delimited on the wire. */
typedef enum body_framing {
  BODY_LENGTH,  /* complete body, Content-Length */
  BODY_CHUNKED, /* streamed to HTTP/1.1: Transfer-Encoding: chunked */
  BODY_CLOSE,   /* streamed to HTTP/1.0: ends when the connection does */
} body_framing;

/* Request headers the router sees (px_admin_request): Authorization,
 * Origin, Host, Sec-Fetch-Site, in that order. A value that does not fit
 * is passed on as "". */
#define KEPT_HEADERS 4
static const char *const kept_names[KEPT_HEADERS] = {"authorization", "origin",
                                                     "host", "sec-fetch-site"};
static const size_t kept_caps[KEPT_HEADERS] = {PX_ADMIN_MAX_AUTH, 255, 255, 31};

typedef struct kept_header {
  size_t len;
  bool overflow;
  char value[PX_ADMIN_MAX_AUTH + 1];
} kept_header;

typedef struct px_admin_conn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_shutdown_t shutdown;
  uv_write_t wreq; /* the one write in flight */
  px_admin *admin;
  struct px_admin_conn *prev, *next;
  conn_state state;
  int handles; /* of tcp and timer, not yet closed */
  bool ready;  /* its write completed: queued for on_admin_idle */
  struct px_admin_conn *ready_prev, *ready_next;
  bool reading;
  bool got_eof;
  bool in_request; /* a request has begun and is not complete */
  bool keep_alive; /* of the request being parsed */
  bool http11;     /* the request being parsed is HTTP/1.1 or later */
  bool head_only;  /* the request is a HEAD (kept while WAITING) */
  int kept;        /* the header being parsed is kept[kept] (-1: none) */
  size_t field_len;
  char field[24]; /* a header field's name, first bytes */
  kept_header kept_headers[KEPT_HEADERS];
  int error_status; /* set by a parser callback before it fails */
  size_t head_bytes, body_bytes;
  uint64_t idle_since; /* loop time it last became idle */
  char *stash;         /* input after the request being answered */
  size_t stash_len;
  /* the response in flight */
  px_admin_response resp;
  body_framing framing;
  bool send_body; /* false for HEAD */
  bool more;      /* the producer has slices to come */
  char head[1024];
  char chunk[24]; /* a chunk-size line */
  llhttp_t parser;
  char peer[64];
  size_t url_len;
  char url[PX_ADMIN_MAX_HEAD + 1];
} px_admin_conn;

static void conn_close(px_admin_conn *c);
static void conn_feed(px_admin_conn *c, const char *data, size_t len);

/* ---- response helpers ---- */

static int resp_fail(px_admin_response *r) {
  r->failed = true;
  return -1;
}

/* Make room for `extra` more bytes plus a NUL. */
static int resp_reserve(px_admin_response *r, size_t extra) {
  if (r->failed || extra > PX_ADMIN_MAX_RESPONSE - r->len)
    return resp_fail(r);
  if (r->cap - r->len > extra)
    return 0;
  size_t cap = r->cap ? r->cap : 256;
  while (cap - r->len <= extra)
    cap *= 2;
  if (cap > PX_ADMIN_MAX_RESPONSE + 1)
    cap = PX_ADMIN_MAX_RESPONSE + 1;
  char *p = realloc(r->body, cap);
  if (!p)
    return resp_fail(r);
  r->body = p;
  r->cap = cap;
  return 0;
}

int px_admin_append(px_admin_response *r, const void *data, size_t len) {
  if (resp_reserve(r, len) < 0)
    return -1;
  if (len)
    memcpy(r->body + r->len, data, len);
  r->len += len;
  r->body[r->len] = '\0';
  return 0;
}

int px_admin_printf(px_admin_response *r, const char *fmt, ...) {
  va_list ap;
  size_t room = r->cap - r->len;
  if (r->failed)
    return -1;
  va_start(ap, fmt);
  int n = vsnprintf(room ? r->body + r->len : NULL, room, fmt, ap);
  va_end(ap);
  if (n < 0)
    return resp_fail(r);
  if ((size_t)n >= room) { /* did not fit: grow and format again */
    if (resp_reserve(r, (size_t)n) < 0)
      return -1;
    va_start(ap, fmt);
    vsnprintf(r->body + r->len, r->cap - r->len, fmt, ap);
    va_end(ap);
  }
  r->len += (size_t)n;
  return 0;
}

static bool is_token(const char *s) {
  if (!*s)
    return false;
  for (; *s; s++)
    if (!strchr("!#$%&'*+-.^_`|~", *s) && !(*s >= '0' && *s <= '9') &&
        !(*s >= 'a' && *s <= 'z') && !(*s >= 'A' && *s <= 'Z'))
      return false;
  return true;
}

/* The length of the UTF-8 sequence at `p` (of `n` bytes left), or 0 if it
 * is not a valid one (overlong, a surrogate, past U+10FFFF, cut short). */
static size_t utf8_len(const unsigned char *p, size_t n) {
  size_t len = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 ? 2 : 0;
  if (p[0] > 0xf4 || len == 0 || len > n)
    return 0;
  for (size_t i = 1; i < len; i++)
    if ((p[i] & 0xc0) != 0x80)
      return 0;
  if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) ||
      (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))
    return 0;
  return len;
}

int px_admin_json_bytes(px_admin_response *resp, const void *data, size_t len) {
  const unsigned char *p = data, *end = p + len;
  px_admin_append(resp, "\"", 1);
  while (p < end) {
    size_t k = *p < 0x80 ? 1 : utf8_len(p, (size_t)(end - p));
    if (k == 0) {
      px_admin_append(resp, "\\ufffd", 6);
      k = 1;
    } else if (*p == '"' || *p == '\\') {
      px_admin_printf(resp, "\\%c", *p);
    } else if (*p < 0x20 || *p == 0x7f) {
      px_admin_printf(resp, "\\u%04x", *p);
    } else if (k == 2 && p[0] == 0xc2 && p[1] < 0xa0) { /* C1 controls */
      px_admin_printf(resp, "\\u%04x", p[1]);
    } else {
      px_admin_append(resp, p, k);
    }
    p += k;
  }
  return px_admin_append(resp, "\"", 1);
}

int px_admin_json_string(px_admin_response *resp, const char *s) {
  return px_admin_json_bytes(resp, s, strlen(s));
}

int px_admin_header(px_admin_response *r, const char *name, const char *value) {
  size_t room = sizeof r->headers - r->headers_len;
  if (r->failed || !is_token(name) || strpbrk(value, "\r\n"))
    return resp_fail(r);
  int n =
      snprintf(r->headers + r->headers_len, room, "%s: %s\r\n", name, value);
  if (n < 0 || (size_t)n >= room)
    return resp_fail(r);
  r->headers_len += (size_t)n;
  return 0;
}

static const struct {
  int status;
  const char *reason;
} reasons[] = {
    {200, "OK"},
    {204, "No Content"},
    {400, "Bad Request"},
    {401, "Unauthorized"},
    {403, "Forbidden"},
    {404, "Not Found"},
    {405, "Method Not Allowed"},
    {413, "Content Too Large"},
    {431, "Request Header Fields Too Large"},
    {500, "Internal Server Error"},
    {502, "Bad Gateway"},
    {503, "Service Unavailable"},
};

static const char *status_reason(int status) {
  for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++)
    if (reasons[i].status == status)
      return reasons[i].reason;
  return "Status";
}

void px_admin_stream(px_admin_response *r, px_admin_produce_fn produce,
                     void (*release)(void *state), void *state) {
  if (!state || !produce || r->produce) {
    if (state && release)
      release(state);
    resp_fail(r);
    return;
  }
  r->produce = produce;
  r->release = release;
  r->state = state;
}

/* Give the producer's state back (and a deferred answer's, cancelled);
 * the body stays. */
static void resp_release(px_admin_response *r) {
  if (r->deferred) {
    void (*cancel)(void *) = r->cancel;
    r->deferred = false;
    r->cancel = NULL;
    if (cancel)
      cancel(r->cancel_state);
  }
  void (*release)(void *) = r->release;
  void *state = r->state;
  r->produce = NULL;
  r->release = NULL;
  r->state = NULL;
  if (release)
    release(state);
}

static void resp_clear(px_admin_response *r) {
  resp_release(r);
  free(r->body);
  *r = (px_admin_response){.status = 200};
}

static bool resp_valid(const px_admin_response *r) {
  return !r->failed && r->status >= 200 && r->status <= 599 &&
         (!r->content_type || (strlen(r->content_type) <= MAX_CONTENT_TYPE &&
                               !strpbrk(r->content_type, "\r\n")));
}

/* ---- timers and writes ---- */

static void on_conn_timer(uv_timer_t *t) {
  px_admin_conn *c = t->data;
  if (c->state != CONN_LINGER) {
    c->admin->stats.timeouts++;
    px_debug("admin_timeout", PX_S("peer", c->peer),
             PX_S("state", state_names[c->state]),
             PX_U("timeout_ms", c->admin->limits.timeout_ms));
  }
  conn_close(c);
}

static void conn_arm(px_admin_conn *c, uint64_t ms) {
  if (c->state != CONN_CLOSED)
    uv_timer_start(&c->timer, on_conn_timer, ms, 0);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  px_admin_conn *c = req->handle->data;
  if (c->state == CONN_CLOSED)
    return;
  if (status < 0 || c->got_eof) {
    conn_close(c);
    return;
  }
  c->state = CONN_LINGER;
  uint64_t ms = c->admin->limits.timeout_ms;
  conn_arm(c, ms < LINGER_MS ? ms : LINGER_MS);
}

static void conn_shutdown(px_admin_conn *c) {
  int rc = uv_shutdown(&c->shutdown, (uv_stream_t *)&c->tcp, on_shutdown);
  if (rc < 0)
    conn_close(c);
}

static void conn_write_failed(px_admin_conn *c, int err) {
  px_debug("admin_write_failed", PX_S("peer", c->peer),
           PX_S("state", state_names[c->state]),
           PX_S("error", uv_strerror(err)));
  conn_close(c);
}

static void on_write(uv_write_t *req, int status);
static void on_admin_idle(uv_idle_t *idle);
static void conn_answered(px_admin_conn *c);

/* Queue what is in the response body (framed), after `head_len` bytes of
 * headers in c->head; `last`: the body ends with it. */
static void conn_write(px_admin_conn *c, size_t head_len, bool last) {
  px_admin_response *r = &c->resp;
  static char crlf[] = "\r\n", crlf_end[] = "\r\n0\r\n\r\n";
  uv_buf_t bufs[4];
  unsigned n = 0;
  if (head_len)
    bufs[n++] = uv_buf_init(c->head, (unsigned)head_len);
  if (c->send_body && c->framing == BODY_CHUNKED) {
    if (r->len) {
      int k = snprintf(c->chunk, sizeof c->chunk, "%zx\r\n", r->len);
      bufs[n++] = uv_buf_init(c->chunk, (unsigned)k);
      bufs[n++] = uv_buf_init(r->body, (unsigned)r->len);
      bufs[n++] = last ? uv_buf_init(crlf_end, sizeof crlf_end - 1)
                       : uv_buf_init(crlf, sizeof crlf - 1);
    } else if (last) {
      bufs[n++] = uv_buf_init(crlf_end + 2, sizeof crlf_end - 3);
    }
  } else if (c->send_body && r->len) {
    bufs[n++] = uv_buf_init(r->body, (unsigned)r->len);
  }
  if (n == 0) { /* an empty last slice, close-delimited: nothing to send */
    conn_answered(c);
    return;
  }
  int rc = uv_write(&c->wreq, (uv_stream_t *)&c->tcp, bufs, n, on_write);
  if (rc < 0)
    conn_write_failed(c, rc);
}

/* The next slice of a streamed body, once the previous one is written. */
static void conn_produce(px_admin_conn *c) {
  px_admin_response *r = &c->resp;
  r->len = 0;
  c->more = r->produce(r->state, r);
  if (r->failed || (c->more && r->len == 0)) {
    px_warn("admin_stream_failed", PX_S("peer", c->peer), PX_S("path", c->url),
            PX_S("reason", r->failed ? "slice failed" : "empty slice"));
    conn_close(c);
    return;
  }
  if (!c->more)
    resp_release(r);
  conn_write(c, 0, !c->more);
}

/* The ready queue: connections whose write completed, oldest first. */
static void ready_push(px_admin *a, px_admin_conn *c) {
  c->ready = true;
  c->ready_next = NULL;
  c->ready_prev = a->ready_tail;
  if (a->ready_tail)
    a->ready_tail->ready_next = c;
  else
    a->ready_head = c;
  a->ready_tail = c;
  uv_idle_start(&a->idle, on_admin_idle); /* no-op when active */
}

static void ready_remove(px_admin *a, px_admin_conn *c) {
  if (!c->ready)
    return;
  c->ready = false;
  if (c->ready_prev)
    c->ready_prev->ready_next = c->ready_next;
  else
    a->ready_head = c->ready_next;
  if (c->ready_next)
    c->ready_next->ready_prev = c->ready_prev;
  else
    a->ready_tail = c->ready_prev;
  c->ready_prev = c->ready_next = NULL;
}

/* A write completed: the response moves on (next slice, or the next
 * request) from on_admin_idle, in a later loop iteration. libuv runs write
 * callbacks several times between two polls; going on from here would let
 * a connection do that much work while no socket is read. */
static void on_write(uv_write_t *req, int status) {
  px_admin_conn *c = req->handle->data;
  px_admin *a = c->admin;
  if (c->state == CONN_CLOSED)
    return;
  if (status < 0) {
    conn_write_failed(c, status);
    return;
  }
  conn_arm(c, a->limits.timeout_ms); /* the client is reading */
  ready_push(a, c);
}

/* Once per loop iteration while writes have completed: the next step of
 * the first STEPS_PER_ITERATION connections in the ready queue, in the
 * order their writes completed. */
static void on_admin_idle(uv_idle_t *idle) {
  px_admin *a = idle->data;
  for (int n = 0; n < STEPS_PER_ITERATION && a->ready_head; n++) {
    px_admin_conn *c = a->ready_head;
    ready_remove(a, c);
    if (c->more)
      conn_produce(c);
    else
      conn_answered(c);
  }
  if (!a->ready_head)
    uv_idle_stop(idle);
}

/* Format the status line and headers into c->head; returns their length. */
static size_t conn_head(px_admin_conn *c, bool keep_alive) {
  const px_admin_response *r = &c->resp;
  char framing[48] = "";
  if (c->framing == BODY_LENGTH)
    snprintf(framing, sizeof framing, "Content-Length: %zu\r\n", r->len);
  else if (c->framing == BODY_CHUNKED)
    snprintf(framing, sizeof framing, "Transfer-Encoding: chunked\r\n");
  int n = snprintf(
      c->head, sizeof c->head,
      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%sConnection: %s\r\n%.*s\r\n",
      r->status, status_reason(r->status),
      r->content_type ? r->content_type : "text/plain; charset=utf-8", framing,
      keep_alive ? "keep-alive" : "close", (int)r->headers_len, r->headers);
  if (n < 0 || (size_t)n >= sizeof c->head) /* cannot happen: bounded */
    return 0;
  return (size_t)n;
}

static void conn_read_start(px_admin_conn *c);

/* Start writing c->resp, the answer to the request just parsed. A
 * keep-alive answer moves to ANSWERING, the last one to FLUSHING. */
static void conn_respond(px_admin_conn *c, bool head_only, bool keep_alive) {
  px_admin_response *r = &c->resp;
  if (!resp_valid(r)) {
    resp_clear(r);
    r->status = 500;
    px_admin_append(r, "internal error\n", 15);
  }
  c->framing = !r->produce ? BODY_LENGTH
               : c->http11 ? BODY_CHUNKED
                           : BODY_CLOSE;
  if (c->framing == BODY_CLOSE)
    keep_alive = false;
  c->send_body = !head_only;
  c->more = r->produce && !head_only;
  if (!c->more)
    resp_release(r);
  size_t head_len = conn_head(c, keep_alive);
  if (head_len == 0) {
    conn_close(c);
    return;
  }
  c->state = keep_alive ? CONN_ANSWERING : CONN_FLUSHING;
  if (c->state == CONN_FLUSHING)
    conn_read_start(c); /* keep draining input so close sends no reset */
  conn_write(c, head_len, !c->more);
}

static void conn_send_error(px_admin_conn *c, int status, const char *text) {
  resp_clear(&c->resp);
  c->resp.status = status;
  px_admin_printf(&c->resp, "%s\n", text);
  conn_respond(c, false, false);
}

/* ---- reading ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  px_admin_conn *c = h->data;
  (void)suggested;
  *buf = uv_buf_init(c->admin->rbuf, sizeof c->admin->rbuf);
}

static void conn_stash(px_admin_conn *c, const char *data, size_t len) {
  if (!len)
    return;
  char *p = realloc(c->stash, c->stash_len + len);
  if (!p) {
    conn_close(c);
    return;
  }
  memcpy(p + c->stash_len, data, len);
  c->stash = p;
  c->stash_len += len;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  px_admin_conn *c = s->data;
  if (nread == 0 || c->state == CONN_CLOSED)
    return;
  if (nread < 0) {
    c->reading = false;
    c->got_eof = true;
    if (nread != UV_EOF || c->state == CONN_LINGER) {
      conn_close(c);
    } else if (c->state == CONN_READING) { /* nothing in flight: done */
      c->state = CONN_FLUSHING;
      conn_shutdown(c);
    } /* else the response in flight is written, then the socket closes */
    return;
  }
  if (c->state == CONN_READING)
    conn_feed(c, buf->base, (size_t)nread);
  else if (c->state == CONN_ANSWERING) /* read before it stopped */
    conn_stash(c, buf->base, (size_t)nread);
  /* flushing or lingering: input is discarded */
}

static void conn_read_start(px_admin_conn *c) {
  if (c->reading || c->got_eof || c->state == CONN_CLOSED)
    return;
  int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
  if (rc < 0) {
    conn_close(c);
    return;
  }
  c->reading = true;
}

static void conn_read_stop(px_admin_conn *c) {
  if (c->reading)
    uv_read_stop((uv_stream_t *)&c->tcp);
  c->reading = false;
}

/* ---- the state machine ---- */

/* The response in flight is completely written. */
static void conn_answered(px_admin_conn *c) {
  resp_clear(&c->resp);
  if (c->state == CONN_FLUSHING) {
    conn_shutdown(c);
    return;
  }
  c->state = CONN_READING; /* from ANSWERING */
  c->idle_since = uv_now(c->admin->loop);
  char *data = c->stash;
  size_t len = c->stash_len;
  c->stash = NULL;
  c->stash_len = 0;
  conn_feed(c, data, len);
  free(data);
  if (c->state != CONN_READING)
    return; /* the next request is being answered */
  if (c->got_eof) {
    c->state = CONN_FLUSHING;
    conn_shutdown(c);
    return;
  }
  conn_read_start(c);
}

static void conn_parse_error(px_admin_conn *c, llhttp_errno_t err) {
  int status = c->error_status ? c->error_status : 400;
  px_admin *a = c->admin;
  a->stats.errors++;
  px_debug("admin_bad_request", PX_S("peer", c->peer), PX_I("status", status),
           PX_S("error", llhttp_errno_name(err)),
           PX_S("reason", llhttp_get_error_reason(&c->parser)));
  conn_send_error(c, status, status_reason(status));
}

/* Parse `data` in READING. At most one request is routed: the parser
 * pauses after it, and what follows it waits for its answer. */
static void conn_feed(px_admin_conn *c, const char *data, size_t len) {
  if (c->state != CONN_READING || len == 0)
    return;
  llhttp_errno_t err = llhttp_execute(&c->parser, data, len);
  if (err == HPE_OK)
    return; /* all parsed; a request may have begun */
  if (err != HPE_PAUSED) {
    conn_parse_error(c, err);
    return;
  }
  size_t used = (size_t)(llhttp_get_error_pos(&c->parser) - data);
  llhttp_resume(&c->parser);
  if (c->state == CONN_ANSWERING || c->state == CONN_WAITING) {
    conn_read_stop(c);
    conn_stash(c, data + used, len - used);
  } /* FLUSHING: the rest is dropped */
}

/* An idle connection may be closed for a newcomer at the cap. */
static bool conn_idle(const px_admin_conn *c) {
  return c->state == CONN_READING && !c->in_request;
}

/* ---- llhttp callbacks ---- */

static int parse_fail(llhttp_t *p, int status, const char *reason) {
  px_admin_conn *c = p->data;
  c->error_status = status;
  llhttp_set_error_reason(p, reason);
  return HPE_USER;
}

static int count_head(llhttp_t *p, size_t n) {
  px_admin_conn *c = p->data;
  if (n > PX_ADMIN_MAX_HEAD - c->head_bytes)
    return parse_fail(p, 431, "request head too large");
  c->head_bytes += n;
  return 0;
}

static int on_message_begin(llhttp_t *p) {
  px_admin_conn *c = p->data;
  c->in_request = true;
  c->url_len = 0;
  c->head_bytes = REQUEST_LINE_BYTES;
  c->body_bytes = 0;
  c->error_status = 0;
  c->field_len = 0;
  c->kept = -1;
  for (int i = 0; i < KEPT_HEADERS; i++)
    c->kept_headers[i].len = 0, c->kept_headers[i].overflow = false;
  return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len) {
  px_admin_conn *c = p->data;
  if (count_head(p, len) != 0 || len > sizeof c->url - 1 - c->url_len)
    return parse_fail(p, 431, "request target too long");
  memcpy(c->url + c->url_len, at, len);
  c->url_len += len;
  return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len) {
  px_admin_conn *c = p->data;
  size_t room = sizeof c->field - 1 - c->field_len;
  size_t k = len < room ? len : room;
  memcpy(c->field + c->field_len, at, k);
  c->field_len += k;
  return count_head(p, len);
}

static int on_header_field_complete(llhttp_t *p) {
  px_admin_conn *c = p->data;
  c->field[c->field_len] = '\0';
  c->kept = -1;
  for (int i = 0; i < KEPT_HEADERS; i++)
    if (strcasecmp(c->field, kept_names[i]) == 0) {
      c->kept = i; /* the last one given counts */
      c->kept_headers[i].len = 0;
      c->kept_headers[i].overflow = false;
    }
  c->field_len = 0;
  return 0;
}

/* The Authorization value is kept (the last one given); others only
 * counted. */
static int on_header_value(llhttp_t *p, const char *at, size_t len) {
  px_admin_conn *c = p->data;
  if (c->kept >= 0) {
    kept_header *k = &c->kept_headers[c->kept];
    if (len > kept_caps[c->kept] - k->len)
      k->overflow = true;
    else
      memcpy(k->value + k->len, at, len), k->len += len;
  }
  return count_head(p, len);
}

static int on_header_value_complete(llhttp_t *p) {
  return count_head(p, HEADER_DELIM_BYTES);
}

static int on_headers_complete(llhttp_t *p) {
  px_admin_conn *c = p->data;
  c->keep_alive = llhttp_should_keep_alive(p) && !llhttp_get_upgrade(p);
  c->http11 = llhttp_get_http_major(p) > 1 ||
              (llhttp_get_http_major(p) == 1 && llhttp_get_http_minor(p) >= 1);
  if ((p->flags & F_CONTENT_LENGTH) && p->content_length > PX_ADMIN_MAX_BODY) {
    parse_fail(p, 413, "request body too large");
    return -1;
  }
  return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len) {
  px_admin_conn *c = p->data;
  (void)at;
  if (len > PX_ADMIN_MAX_BODY - c->body_bytes)
    return parse_fail(p, 413, "request body too large");
  c->body_bytes += len;
  return 0;
}

/* Log the request and its answer (or that it is deferred). */
static void log_request(px_admin_conn *c, const char *method) {
  const px_admin_response *r = &c->resp;
  if (!resp_valid(r))
    px_warn("admin_response_failed", PX_S("peer", c->peer),
            PX_S("path", c->url), PX_I("status", r->status),
            PX_BOOL("failed", r->failed));
  else
    px_debug("admin_request", PX_S("peer", c->peer),
             PX_S("method", c->head_only ? "HEAD" : method),
             PX_S("path", c->url), PX_I("status", r->status),
             PX_U("bytes", r->len), PX_BOOL("streamed", r->produce != NULL),
             PX_BOOL("deferred", r->deferred));
}

static int on_message_complete(llhttp_t *p) {
  px_admin_conn *c = p->data;
  px_admin *a = c->admin;
  bool head = llhttp_get_method(p) == HTTP_HEAD;
  const char *method = head ? "GET" : llhttp_method_name(llhttp_get_method(p));
  px_admin_response *r = &c->resp;

  c->in_request = false;
  c->head_only = head;
  c->url[c->url_len] = '\0';
  c->url[strcspn(c->url, "#")] = '\0';
  char *q = strchr(c->url, '?');
  if (q)
    *q++ = '\0';
  for (int i = 0; i < KEPT_HEADERS; i++) {
    kept_header *k = &c->kept_headers[i];
    k->value[k->overflow ? 0 : k->len] = '\0';
  }
  px_admin_request req = {method,
                          c->url,
                          q ? q : "",
                          c->kept_headers[0].value,
                          c->kept_headers[1].value,
                          c->kept_headers[2].value,
                          c->kept_headers[3].value};
  resp_clear(r);
  a->route(a->ctx, &req, r);
  a->stats.requests++;
  log_request(c, method);
  explicit_bzero(c->kept_headers[0].value, sizeof c->kept_headers[0].value);
  if (r->deferred) {
    c->state = CONN_WAITING; /* no timer: the owner's work bounds it */
    uv_timer_stop(&c->timer);
    return HPE_PAUSED;
  }
  conn_arm(c, a->limits.timeout_ms);
  conn_respond(c, head, c->keep_alive);
  return HPE_PAUSED; /* the next request waits for this answer */
}

static const llhttp_settings_t parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_field_complete = on_header_field_complete,
    .on_header_value = on_header_value,
    .on_header_value_complete = on_header_value_complete,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ---- server ---- */

static void format_addr(const struct sockaddr_storage *ss, char *out,
                        size_t cap) {
  char ip[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
    uv_ip4_name(in, ip, sizeof ip);
    port = ntohs(in->sin_port);
    snprintf(out, cap, "%s:%d", ip, port);
  } else if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
    uv_ip6_name(in6, ip, sizeof ip);
    port = ntohs(in6->sin6_port);
    snprintf(out, cap, "[%s]:%d", ip, port);
  } else {
    snprintf(out, cap, "?");
  }
}

static void admin_check_done(px_admin *a) {
  if (!a->stopping || a->listener_open || a->idle_open || a->conns ||
      a->nrefused_closing)
    return;
  void (*done)(void *) = a->done;
  a->done = NULL;
  if (done)
    done(a->done_arg);
}

static void on_conn_closed(uv_handle_t *h) {
  px_admin_conn *c = h->data;
  if (--c->handles > 0)
    return;
  px_admin *a = c->admin;
  if (c->prev)
    c->prev->next = c->next;
  else
    a->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  a->nconns--;
  free(c->stash);
  free(c->resp.body);
  free(c);
  if (a->refusing && a->nconns < a->limits.max_conns) {
    px_info("admin_conn_refused_end", PX_S("address", a->addr),
            PX_U("refused", a->burst_refused));
    a->refusing = false;
  }
  admin_check_done(a);
}

static void conn_close(px_admin_conn *c) {
  if (c->state == CONN_CLOSED)
    return;
  c->state = CONN_CLOSED;
  c->reading = false;
  ready_remove(c->admin, c);
  resp_release(&c->resp); /* the body goes with the memory, once closed */
  uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
  uv_close((uv_handle_t *)&c->timer, on_conn_closed);
}

static void on_refused_closed(uv_handle_t *h) {
  px_admin *a = h->data;
  free(h);
  a->nrefused_closing--;
  admin_check_done(a);
}

/* Over the cap: accept and close at once, one warn line per burst. */
static void admin_refuse(px_admin *a) {
  uv_tcp_t *t = malloc(sizeof *t);
  if (!t || uv_tcp_init(a->loop, t) != 0) {
    free(t);
    px_warn("admin_refuse_failed", PX_S("address", a->addr),
            PX_S("error", "out of memory"));
    return;
  }
  t->data = a;
  a->nrefused_closing++;
  (void)uv_accept((uv_stream_t *)&a->listener, (uv_stream_t *)t);
  uv_close((uv_handle_t *)t, on_refused_closed);
  a->stats.conns_refused++;
  if (!a->refusing) {
    a->refusing = true;
    a->burst_refused = 0;
    px_warn("admin_conn_refused", PX_S("address", a->addr),
            PX_U("max_conns", a->limits.max_conns));
  }
  a->burst_refused++;
}

/* At the cap: close the connection idle the longest (the oldest among
 * equals) to make room. Returns false if none is idle. */
static bool admin_evict_idle(px_admin *a) {
  px_admin_conn *victim = NULL;
  for (px_admin_conn *c = a->conns; c; c = c->next) /* newest first */
    if (conn_idle(c) && (!victim || c->idle_since <= victim->idle_since))
      victim = c;
  if (!victim)
    return false;
  a->stats.conns_evicted++;
  px_info("admin_conn_evicted", PX_S("address", a->addr),
          PX_S("peer", victim->peer),
          PX_U("idle_ms", uv_now(a->loop) - victim->idle_since),
          PX_U("max_conns", a->limits.max_conns));
  conn_close(victim);
  return true;
}

static void conn_start(px_admin *a, px_admin_conn *c) {
  struct sockaddr_storage ss;
  int len = sizeof ss;
  int rc = uv_accept((uv_stream_t *)&a->listener, (uv_stream_t *)&c->tcp);
  if (rc < 0) {
    px_warn("admin_conn_accept_failed", PX_S("address", a->addr),
            PX_S("error", uv_strerror(rc)));
    conn_close(c);
    return;
  }
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0)
    format_addr(&ss, c->peer, sizeof c->peer);
  else
    snprintf(c->peer, sizeof c->peer, "?");
  (void)uv_tcp_nodelay(&c->tcp, 1); /* best effort */
  llhttp_init(&c->parser, HTTP_REQUEST, &parser_settings);
  c->parser.data = c;
  c->idle_since = uv_now(a->loop);
  a->stats.conns_total++;
  conn_arm(c, a->limits.timeout_ms);
  conn_read_start(c);
}

static void on_connection(uv_stream_t *listener, int status) {
  px_admin *a = listener->data;
  if (status < 0) {
    px_warn("admin_accept_failed", PX_S("address", a->addr),
            PX_S("error", uv_strerror(status)));
    return;
  }
  if (a->nconns >= a->limits.max_conns && !admin_evict_idle(a)) {
    admin_refuse(a);
    return;
  }
  px_admin_conn *c = calloc(1, sizeof *c);
  if (!c || uv_tcp_init(a->loop, &c->tcp) != 0) {
    free(c);
    admin_refuse(a);
    return;
  }
  uv_timer_init(a->loop, &c->timer); /* cannot fail */
  c->tcp.data = c->timer.data = c;
  c->admin = a;
  c->handles = 2;
  c->next = a->conns;
  if (a->conns)
    a->conns->prev = c;
  a->conns = c;
  a->nconns++;
  conn_start(a, c);
}

static void on_listener_closed(uv_handle_t *h) {
  px_admin *a = h->data;
  a->listener_open = false;
  admin_check_done(a);
}

static void on_idle_closed(uv_handle_t *h) {
  px_admin *a = h->data;
  a->idle_open = false;
  admin_check_done(a);
}

void px_admin_set_limits(px_admin *a, const px_admin_limits *l) {
  px_admin_limits d = l ? *l : (px_admin_limits){0};
  a->limits.max_conns = d.max_conns ? d.max_conns : DEFAULT_MAX_CONNS;
  a->limits.timeout_ms = d.timeout_ms ? d.timeout_ms : DEFAULT_TIMEOUT_MS;
}

/* Bind and listen on `ss`; on failure the listener is already closing. */
static int admin_listen(px_admin *a, struct sockaddr_storage *ss) {
  int len = sizeof *ss;
  int rc = uv_tcp_init(a->loop, &a->listener);
  if (rc < 0)
    return rc;
  a->listener.data = a;
  a->listener_open = true;
  rc = uv_tcp_bind(&a->listener, (struct sockaddr *)ss, 0);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&a->listener, 128, on_connection);
  if (rc < 0) {
    uv_close((uv_handle_t *)&a->listener, on_listener_closed);
    return rc;
  }
  if (uv_tcp_getsockname(&a->listener, (struct sockaddr *)ss, &len) == 0)
    format_addr(ss, a->addr, sizeof a->addr); /* the port bound for 0 */
  return 0;
}

int px_admin_start(px_admin *a, uv_loop_t *loop, const char *host,
                   uint16_t port, px_admin_route_fn route, void *ctx) {
  struct sockaddr_storage ss;
  int rc;

  memset(a, 0, sizeof *a);
  a->loop = loop;
  a->route = route;
  a->ctx = ctx;
  px_admin_set_limits(a, NULL);
  if (strchr(host, ':'))
    snprintf(a->addr, sizeof a->addr, "[%s]:%u", host, (unsigned)port);
  else
    snprintf(a->addr, sizeof a->addr, "%s:%u", host, (unsigned)port);
  char why[300];
  if (px_addr_resolve(host, port, &ss, why, sizeof why) != 0) {
    px_error("admin_address_invalid", PX_S("address", a->addr),
             PX_S("error", why));
    return UV_EINVAL;
  }
  rc = admin_listen(a, &ss);
  if (rc < 0) {
    px_error("admin_listen_failed", PX_S("address", a->addr),
             PX_S("error", uv_strerror(rc)));
    return rc;
  }
  uv_idle_init(loop, &a->idle); /* cannot fail */
  a->idle.data = a;
  a->idle_open = true;
  px_info("admin_listening", PX_S("address", a->addr));
  return 0;
}

void px_admin_stop(px_admin *a, void (*done)(void *arg), void *arg) {
  a->stopping = true;
  a->done = done;
  a->done_arg = arg;
  if (a->listener_open && !uv_is_closing((uv_handle_t *)&a->listener))
    uv_close((uv_handle_t *)&a->listener, on_listener_closed);
  if (a->idle_open && !uv_is_closing((uv_handle_t *)&a->idle))
    uv_close((uv_handle_t *)&a->idle, on_idle_closed);
  for (px_admin_conn *c = a->conns; c; c = c->next)
    conn_close(c); /* unlinked in its close callback */
  admin_check_done(a);
}

unsigned px_admin_connections(const px_admin *a) {
  return a->nconns;
}

/* ---- deferred answers ---- */

void px_admin_defer(px_admin_response *r, void (*cancel)(void *state),
                    void *state) {
  r->deferred = true;
  r->cancel = cancel;
  r->cancel_state = state;
}

void px_admin_resume(px_admin_response *r) {
  px_admin_conn *c =
      (px_admin_conn *)(void *)((char *)r - offsetof(px_admin_conn, resp));
  if (c->state != CONN_WAITING)
    return;
  r->deferred = false;
  r->cancel = NULL;
  c->state = CONN_READING; /* as when the request was routed */
  conn_arm(c, c->admin->limits.timeout_ms);
  conn_respond(c, c->head_only, c->keep_alive);
}

/* ---- percent-encoded text (px_admin.h) ---- */

int px_admin_decode(const char *s, size_t len, char *out, size_t cap) {
  static const char hexdig[] = "0123456789abcdef";
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '%') {
      const char *hi =
          len - i >= 3 && s[i + 1] ? strchr(hexdig, s[i + 1] | 0x20) : NULL;
      const char *lo = hi && s[i + 2] ? strchr(hexdig, s[i + 2] | 0x20) : NULL;
      if (!hi || !lo)
        return -1;
      c = (unsigned char)((hi - hexdig) * 16 + (lo - hexdig));
      i += 2;
    }
    if (c == 0 || cap - o < 2)
      return -1;
    out[o++] = (char)c;
  }
  out[o] = '\0';
  return 0;
}

int px_admin_param(const char *query, const char *name, char *out, size_t cap) {
  size_t n = strlen(name);
  for (const char *p = query; p && *p; p = strchr(p, '&'), p = p ? p + 1 : p) {
    size_t len = strcspn(p, "&");
    if (len > n && strncmp(p, name, n) == 0 && p[n] == '=')
      return px_admin_decode(p + n + 1, len - n - 1, out, cap) == 0 ? 1 : -1;
  }
  return 0;
}
