/* px_admin.h - the admin HTTP/1.1 server: a small, bounded listener on the
 * proxy's loop that hands every request to one router function.
 *
 * Requests are parsed with llhttp. The router sees the method and the path
 * (no query string) and fills a px_admin_response; this module writes the
 * status line, Content-Type, the framing (Content-Length, or
 * Transfer-Encoding: chunked for a streamed body) and Connection headers
 * and the body. Keep-alive and pipelining follow HTTP/1.1 (responses in
 * request order); HTTP/1.0 closes unless the request asked for keep-alive.
 *
 * A body is either complete when the router returns, or streamed: the
 * router sets a producer (px_admin_stream) that the module calls again each
 * time the previous slice has been written, until it says it is done. To an
 * HTTP/1.1 client a streamed body goes out chunked; to HTTP/1.0 it is
 * delimited by closing the connection; a HEAD request gets the headers only
 * and the producer is never called.
 *
 * The limits, as a contract: nothing an admin client does can block the
 * loop for long or grow memory without bound.
 *   - One response in flight per connection: the next pipelined request is
 *     parsed (and the socket read) only once the previous answer has been
 *     completely written. The unparsed input kept aside meanwhile is at most
 *     one read (16 KiB).
 *   - Work between two polls for I/O (one loop iteration): a connection
 *     whose socket was read routes at most one request; after writes
 *     complete, at most 4 further steps in all (a slice of a streamed body,
 *     or the next pipelined request), in the order the writes completed.
 *     The producer is called only for such a step. A router that renders
 *     something big streams it.
 *   - Pending output per connection: one response, i.e. one complete body
 *     (at most PX_ADMIN_MAX_RESPONSE bytes) or one slice (about
 *     PX_ADMIN_SLICE bytes, as the producer promises), plus its headers.
 *   - request line + headers over PX_ADMIN_MAX_HEAD bytes -> 431, close;
 *   - a request body is read and dropped up to PX_ADMIN_MAX_BODY bytes,
 *     larger -> 413, close; the router never sees a body;
 *   - malformed HTTP -> 400, close;
 *   - at most `max_conns` connections (closing ones included, but for
 *     those closed to make room, which go within the loop iteration). When
 *     a new connection arrives at the cap, the one idle the longest (open
 *     between requests: nothing of a request read, no response in flight;
 *     a connection that never sent anything counts) is closed to make room,
 *     with an info line and `conns_evicted`; only if none is idle, the new
 *     one is accepted and closed at once, with one warn line per burst of
 *     refusals. So a probe gets an answer however many keep-alive clients
 *     sit on the endpoint;
 *   - a connection must complete a request, and a response in flight must
 *     make progress (one write completed), within `timeout_ms`, or it is
 *     closed; a client that stops reading is closed by it.
 * After an error response (or `Connection: close`, or a close-delimited
 * body) the write side is shut down and input is discarded for a short
 * linger before the socket closes, so the client reads the response
 * instead of a reset.
 */
#ifndef PX_ADMIN_H
#define PX_ADMIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define PX_ADMIN_MAX_HEAD 8192                    /* request line + headers */
#define PX_ADMIN_MAX_BODY 8192                    /* ignored request body */
#define PX_ADMIN_MAX_RESPONSE (16u * 1024 * 1024) /* one body or slice */
#define PX_ADMIN_MAX_EXTRA_HEADERS 512            /* px_admin_header bytes */
#define PX_ADMIN_SLICE (64u * 1024) /* what a producer appends per call */
#define PX_ADMIN_MAX_AUTH 1024      /* an Authorization value kept */

struct px_admin_response;

/* Produce the next slice of a streamed body: append it to `resp` with the
 * helpers below (the body is empty at each call; the buffer is reused).
 * Append about PX_ADMIN_SLICE bytes, never much more: the module calls
 * again only once this slice is written, which is what keeps one loop
 * iteration short. Return true while more is to come (having appended at
 * least one byte), false with the last slice (possibly empty). A helper
 * failure (`failed`) ends the response: the connection is closed without
 * the chunked terminator, so the client sees a truncated body. Called on
 * the loop; must not block and must not call px_admin_stop. Between calls
 * the objects the producer reads may change or be freed: keep a cursor
 * that survives that in `state`, never a pointer into them. */
typedef bool (*px_admin_produce_fn)(void *state,
                                    struct px_admin_response *resp);

/* What the router answers. The module initialises it before each call:
 * status 200, content_type NULL ("text/plain; charset=utf-8"), empty body,
 * no producer. `body` is owned by the module (malloc'ed by the helpers
 * below); the router only writes it through the helpers. A helper that
 * fails (over PX_ADMIN_MAX_RESPONSE, out of memory, bad header) sets
 * `failed`, and the client then gets a 500 instead of a truncated answer.
 * With a producer (px_admin_stream), what the router appended is the start
 * of the body and the producer's slices follow. */
typedef struct px_admin_response {
  int status;               /* 200..599; anything else is sent as 500 */
  const char *content_type; /* static or outliving the call; no CR/LF */
  char *body;
  size_t len, cap;
  char headers[PX_ADMIN_MAX_EXTRA_HEADERS]; /* "Name: value\r\n"... */
  size_t headers_len;
  bool failed;
  px_admin_produce_fn produce; /* set by px_admin_stream */
  void (*release)(void *state);
  void *state;
  bool deferred; /* set by px_admin_defer */
  void (*cancel)(void *state);
  void *cancel_state;
} px_admin_response;

/* Answer later, without blocking the loop: the router calls this and
 * returns; the connection waits (no timeout: the owner's work must bound
 * itself), reading nothing more, until the owner fills `resp` with the
 * helpers below and calls px_admin_resume(resp), from the loop. If the
 * connection goes first (a write error, px_admin_stop), `cancel(state)` is
 * called once and `resp` must not be touched again. Not with
 * px_admin_stream on the same response. */
void px_admin_defer(px_admin_response *resp, void (*cancel)(void *state),
                    void *state);

/* Send the deferred answer now in `resp` (status, body, headers; not
 * streamed). */
void px_admin_resume(px_admin_response *resp);

/* Make the body streamed: after what the router appended, `produce(state,
 * resp)` is called for each further slice (see px_admin_produce_fn).
 * `release(state)` (may be NULL) is called exactly once when the module is
 * done with `state`: after the last slice, or at once for a HEAD request
 * or a failed response, or when the connection goes away (client gone,
 * timeout, px_admin_stop). A NULL `state` (an allocation the router could
 * not make) sets `failed`. Call at most once per response. */
void px_admin_stream(px_admin_response *resp, px_admin_produce_fn produce,
                     void (*release)(void *state), void *state);

/* Append `len` bytes to the body. Returns 0, or -1 (and sets `failed`). */
int px_admin_append(px_admin_response *resp, const void *data, size_t len);

/* Append printf-formatted text to the body. Returns 0, or -1 (`failed`). */
int px_admin_printf(px_admin_response *resp, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Append `s` as a JSON string (quoted; '"', '\\' and control bytes
 * escaped; see px_admin_json_bytes). Returns 0, or -1 (`failed`). */
int px_admin_json_string(px_admin_response *resp, const char *s);

/* The same for `len` bytes that may hold anything: a byte that is not
 * part of valid UTF-8 becomes U+FFFD; control characters (C0, DEL, C1)
 * are escaped, so the result is safe to show on a terminal. Returns 0, or
 * -1 (`failed`). */
int px_admin_json_bytes(px_admin_response *resp, const void *data, size_t len);

/* Add a response header, e.g. ("Allow", "GET, HEAD"). `name` must be an
 * HTTP token and `value` free of CR, LF and NUL; the module's own headers
 * (Content-Type, Content-Length, Transfer-Encoding, Connection) are not to
 * be set here.
 * Returns 0, or -1 (`failed`) if invalid or over PX_ADMIN_MAX_EXTRA_HEADERS. */
int px_admin_header(px_admin_response *resp, const char *name,
                    const char *value);

/* A request as the router sees it; every string is valid only during the
 * call. */
typedef struct px_admin_request {
  /* "GET", "POST", ...; a HEAD request is routed as "GET" (the module then
   * sends the GET headers without the body) */
  const char *method;
  const char *path;  /* the target up to '?' or '#', not decoded */
  const char *query; /* after '?', up to '#', not decoded; "" if none */
  /* the Authorization header's value ("" if none, or over
   * PX_ADMIN_MAX_AUTH bytes); wiped after the call */
  const char *authorization;
  /* Origin, Host and Sec-Fetch-Site ("" if none or over 255 bytes, 31
   * for Sec-Fetch-Site): what a route needs to refuse a request another
   * web site made a browser send */
  const char *origin, *host, *sec_fetch_site;
} px_admin_request;

/* The router, called on the loop for each complete request, in order. It
 * must not block and must not call px_admin_stop. */
typedef void (*px_admin_route_fn)(void *ctx, const px_admin_request *req,
                                  px_admin_response *resp);

/* Limits; a zero field means its default. */
typedef struct px_admin_limits {
  unsigned max_conns;  /* simultaneous connections, default 64 */
  uint64_t timeout_ms; /* to complete a request / make write progress, 10000 */
} px_admin_limits;

/* Counters for metrics; read-only for the caller. */
typedef struct px_admin_stats {
  uint64_t conns_total;   /* accepted and served */
  uint64_t conns_refused; /* over max_conns, none idle */
  uint64_t conns_evicted; /* idle, closed for a newcomer at max_conns */
  uint64_t requests;      /* routed */
  uint64_t errors;        /* 400, 413, 431 answers */
  uint64_t timeouts;      /* closed by the timeout */
} px_admin_stats;

struct px_admin_conn;

/* One admin server. The caller owns the memory; it must stay valid from
 * px_admin_start until px_admin_stop's `done` has been called. Fields are
 * private except `stats` (read-only). */
typedef struct px_admin {
  uv_loop_t *loop;
  uv_tcp_t listener;
  px_admin_route_fn route;
  void *ctx;
  px_admin_limits limits;
  struct px_admin_conn *conns; /* doubly linked, closing ones included */
  unsigned nconns;             /* entries in `conns` */
  unsigned nrefused_closing;   /* refused handles not yet closed */
  uv_idle_t idle;              /* runs while `ready_head` is not empty */
  struct px_admin_conn *ready_head, *ready_tail; /* writes completed */
  bool listener_open;
  bool idle_open;
  bool stopping;
  bool refusing;          /* inside a burst of refusals */
  uint64_t burst_refused; /* refusals in the current burst */
  void (*done)(void *arg);
  void *done_arg;
  char addr[64]; /* "host:port" as bound, for log lines */
  px_admin_stats stats;
  char rbuf[16384]; /* read buffer shared by all connections */
} px_admin;

/* Bind `host` (numeric IPv4 or IPv6) and `port` (0: any free port; the
 * address log line and a->addr show the bound one) on `loop` and start
 * serving with `route(ctx, ...)`. Returns 0, or a negative libuv error,
 * logged with the address. After a failure the listener handle is already
 * closing: `a` must stay valid until the loop has run its close callback,
 * and px_admin_stop may still be called to learn when that happened. */
int px_admin_start(px_admin *a, uv_loop_t *loop, const char *host,
                   uint16_t port, px_admin_route_fn route, void *ctx);

/* Replace the limits (zero fields: defaults). They apply from the next
 * accept, timer start and write on. */
void px_admin_set_limits(px_admin *a, const px_admin_limits *limits);

/* Close the listener and every admin connection at once (pending output is
 * dropped). `done(arg)` is called from a close callback once every handle of
 * the server is closed; `a` may be freed from then on. `done` may be NULL.
 * Call at most once. */
void px_admin_stop(px_admin *a, void (*done)(void *arg), void *arg);

/* Admin connections currently open (closing ones included). */
unsigned px_admin_connections(const px_admin *a);

/* Percent-decode `len` bytes of `s` into `out` (cap): 0, or -1 for a bad
 * escape, a NUL, or no room. '+' stays '+'. */
int px_admin_decode(const char *s, size_t len, char *out, size_t cap);

/* The value of `name` in a query string ("a=1&b=2"), decoded into `out`:
 * 1 found, 0 absent, -1 badly encoded or too long. */
int px_admin_param(const char *query, const char *name, char *out, size_t cap);

#endif
