/* px_dial.h - reaching an upstream.
 *
 * A dialer tries the configured upstreams in order, those that failed in
 * the last PX_DIAL_MEMORY_MS after the others (so a dead first upstream
 * does not cost every new client a timeout), and every address an
 * upstream's name resolves to (A and AAAA, in the resolver's order).
 * Each attempt has the connect timeout to get through the TCP connect,
 * the TLS handshake of an amqps upstream, and the broker's
 * connection.start, which the owner reports (px_dial_started()); a
 * failure or a timeout moves on to the next address, then the next
 * upstream. Every failed attempt is logged with its address and reason.
 *
 * The dialer connects a px_conn of its owner's. The owner passes on that
 * connection's connected and closed events while dialing
 * (px_dial_connected(), px_dial_closed()) and hears back through
 * px_dial_events. It owns one timer and a resolver request:
 * px_dial_close() ends both and the released event follows.
 */
#ifndef PX_DIAL_H
#define PX_DIAL_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "px_clock.h"
#include "px_config.h"
#include "px_conn.h"

/* How long an upstream that failed is tried after the others. */
#define PX_DIAL_MEMORY_MS 30000

/* When each upstream last failed (0: not lately), shared by dialers. */
typedef struct px_dial_memory {
  uint64_t failed_ms[PX_MAX_UPSTREAMS];
} px_dial_memory;

typedef struct px_dial_events {
  /* The owner's connection was opened for an attempt: its closed event
   * will follow. */
  void (*opened)(void *ctx);
  /* The attempt's connection is up (TCP, and TLS for amqps): the owner
   * starts the AMQP handshake; the attempt's timer runs until
   * px_dial_started(). */
  void (*connected)(void *ctx);
  /* Every upstream failed: px_dial's `errors` says how. */
  void (*failed)(void *ctx);
  /* A connect failure was counted for `addr` (the owner's metrics);
   * optional (NULL: not counted). */
  void (*attempt_failed)(void *ctx, const char *addr);
  /* After px_dial_close(): its timer and resolver are done. */
  void (*released)(void *ctx);
} px_dial_events;

typedef struct px_dial {
  uv_loop_t *loop;
  px_clock *clock;
  const px_config *cfg;
  px_dial_memory *memory;
  struct px_tls_ctx *tls; /* for amqps upstreams */
  px_conn *conn;
  const px_conn_io *io; /* the transport (under TLS for amqps) */
  const px_dial_events *ev;
  void *ctx;
  uint64_t id;         /* the owner's, for logs */
  uint32_t timeout_ms; /* per attempt */

  unsigned order[PX_MAX_UPSTREAMS]; /* config indexes, in the order tried */
  unsigned n, pos;                  /* how many; the one being tried */
  struct addrinfo *ai, *next_ai;    /* its resolved addresses; the next */
  struct sockaddr_storage sa;       /* the address being tried / in use */
  uv_getaddrinfo_t gai;
  px_timer timer;
  bool gai_pending;
  bool closing_attempt; /* the next attempt follows the closed event */
  bool done;            /* connection.start came: dialing is over */
  bool failed;          /* every upstream failed */
  bool closed;          /* px_dial_close() */
  bool timer_closed;
  bool tls_now;     /* the upstream in use is amqps */
  char addr[300];   /* "host:port" of the upstream tried / in use */
  char host[256];   /* its host name (SNI, the certificate's name) */
  char errors[384]; /* "addr: error; ..." of the failed attempts */
} px_dial;

/* Set up a dialer for `conn` (whose io is the transport to use) and
 * start: the first attempt, or the resolver. `timeout_ms` bounds each
 * attempt. */
void px_dial_start(px_dial *d, uv_loop_t *loop, px_clock *clock,
                   const px_config *cfg, px_dial_memory *memory,
                   struct px_tls_ctx *tls, px_conn *conn, uint32_t timeout_ms,
                   const px_dial_events *ev, void *ctx, uint64_t id);
/* The connection's events, passed on while dialing (!done). */
void px_dial_connected(px_dial *d, int status);
void px_dial_closed(px_dial *d);
/* The broker sent connection.start: the attempt succeeded. */
void px_dial_started(px_dial *d);
/* Stop dialing (the owner closes its connection itself); `released`
 * follows once the timer and resolver are done. */
void px_dial_close(px_dial *d);

#endif
