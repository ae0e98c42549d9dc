/* px_admin.h - the admin HTTP/1.1 server: a small, bounded listener on the
 * proxy's loop that hands every request to one router function.
 *
 * Requests are parsed with llhttp. The router sees the method and the path
 * (no query string) and fills a px_admin_response; this module writes the
 * status line, Content-Type, Content-Length and Connection headers and the
 * body. Keep-alive and pipelining follow HTTP/1.1 (responses in request
 * order); HTTP/1.0 closes unless the request asked for keep-alive.
 *
 * Nothing an admin client does can block the loop or grow memory without
 * bound:
 *   - request line + headers over PX_ADMIN_MAX_HEAD bytes -> 431, close;
 *   - a request body is read and dropped up to PX_ADMIN_MAX_BODY bytes,
 *     larger -> 413, close; the router never sees a body;
 *   - malformed HTTP -> 400, close;
 *   - at most `max_conns` connections; over it a new connection is accepted
 *     and closed at once, with one warn line per burst of refusals;
 *   - a connection must complete a request (or have a response written)
 *     within `timeout_ms`, or it is closed;
 *   - once more than `max_output` bytes of responses wait to be written, the
 *     connection's next pipelined request is not parsed (nor its socket read)
 *     until the client has read enough; a client that stops reading is closed
 *     by the timeout. Pending output is thus at most `max_output` plus one
 *     response (itself at most PX_ADMIN_MAX_RESPONSE bytes).
 * After an error response (or `Connection: close`) the write side is shut
 * down and input is discarded for a short linger before the socket closes,
 * so the client reads the response instead of a reset.
 */
#ifndef PX_ADMIN_H
#define PX_ADMIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define PX_ADMIN_MAX_HEAD 8192                    /* request line + headers */
#define PX_ADMIN_MAX_BODY 8192                    /* ignored request body */
#define PX_ADMIN_MAX_RESPONSE (16u * 1024 * 1024) /* one response body */
#define PX_ADMIN_MAX_EXTRA_HEADERS 512            /* px_admin_header bytes */

/* What the router answers. The module initialises it before each call:
 * status 200, content_type NULL ("text/plain; charset=utf-8"), empty body.
 * `body` is owned by the module (malloc'ed by the helpers below); the router
 * only writes it through the helpers. A helper that fails (over
 * PX_ADMIN_MAX_RESPONSE, out of memory, bad header) sets `failed`, and the
 * client then gets a 500 instead of a truncated answer. */
typedef struct px_admin_response {
  int status;               /* 200..599; anything else is sent as 500 */
  const char *content_type; /* static or outliving the call; no CR/LF */
  char *body;
  size_t len, cap;
  char headers[PX_ADMIN_MAX_EXTRA_HEADERS]; /* "Name: value\r\n"... */
  size_t headers_len;
  bool failed;
} px_admin_response;

/* Append `len` bytes to the body. Returns 0, or -1 (and sets `failed`). */
int px_admin_append(px_admin_response *resp, const void *data, size_t len);

/* Append printf-formatted text to the body. Returns 0, or -1 (`failed`). */
int px_admin_printf(px_admin_response *resp, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Add a response header, e.g. ("Allow", "GET, HEAD"). `name` must be an
 * HTTP token and `value` free of CR, LF and NUL; the module's own headers
 * (Content-Type, Content-Length, Connection) are not to be set here.
 * Returns 0, or -1 (`failed`) if invalid or over PX_ADMIN_MAX_EXTRA_HEADERS. */
int px_admin_header(px_admin_response *resp, const char *name,
                    const char *value);

/* The router, called on the loop for each complete request, in order.
 * `method` is the request method ("GET", "POST", ...) except that a HEAD
 * request is routed as "GET" (the module then sends the GET headers without
 * the body). `path` is the request target up to '?' or '#', not decoded.
 * Both strings are valid only during the call. The router must not block
 * and must not call px_admin_stop. */
typedef void (*px_admin_route_fn)(void *ctx, const char *method,
                                  const char *path, px_admin_response *resp);

/* Limits; a zero field means its default. */
typedef struct px_admin_limits {
  unsigned max_conns;  /* simultaneous connections, default 64 */
  uint64_t timeout_ms; /* to complete a request / drain output, 10000 */
  size_t max_output;   /* pending output that pauses parsing, 1 MiB */
} px_admin_limits;

/* Counters for metrics; read-only for the caller. */
typedef struct px_admin_stats {
  uint64_t conns_total;   /* accepted and served */
  uint64_t conns_refused; /* over max_conns */
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
  bool listener_open;
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

#endif
