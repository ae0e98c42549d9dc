/* px_session.h - one client connection and its upstream connection.
 *
 * A session forwards frames between the two sockets at frame boundaries,
 * without copying: frames parsed from a read chunk are written on as slices
 * of that chunk. It follows the handshake (recording what was negotiated),
 * opens rebound's own channel once the connection is open, keeps per-channel
 * state, moves a client channel that collides with its own, and closes
 * cleanly on errors from either side.
 *
 * Its lifecycle is one state machine, PX_CLOSE_PHASES below; px_life.h
 * holds its transitions.
 */
#ifndef PX_SESSION_H
#define PX_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "amqp.h"
#include "px_buf.h"
#include "px_chan.h"
#include "px_clock.h"
#include "px_close.h"
#include "px_conn.h"
#include "px_dial.h"
#include "px_out.h"
#include "px_pub.h"
#include "px_ring.h"

struct px_server;

/* A session's one lifecycle, from accept to closed: X(id, name, how long
 * it may last in ms: 0 for no limit, PX_PHASE_RUNS_ON to keep the limit
 * of the phase before). px_life_phase() is the one transition, logged as
 * session_close_phase; each limit replaces the last one.
 *
 *   connecting -> handshake               the client's protocol header
 *                                          passed on
 *   handshake -> open                     connection.open-ok
 *   handshake|open -> closing             a connection.close passed on
 *                                          (either way): close-ok awaited
 *                                          (within the handshake's limit
 *                                          if it came in the handshake)
 *   connecting|handshake -> refusing      no upstream answered: the
 *                                          client got rebound's own
 *                                          connection.start; its
 *                                          connection.open is answered
 *                                          with connection.close 320 (within
 *                                          the handshake's limit)
 *   any -> telling-client                 rebound sent the client
 *                                          connection.close (error,
 *                                          shutdown, broker lost)
 *   telling-client -> client-answered     shutting down: the client's
 *                                          close-ok came; the broker's
 *                                          side ends once no copy is
 *                                          pending (within the
 *                                          retry-finish timeout)
 *   any -> finishing                      a close-ok passed
 *   any -> client-dead                    a write to the client failed:
 *                                          read what it sent until its EOF
 *   any -> client-gone                    it left with copies in flight:
 *                                          they are finished first
 *   any -> linger                         ending through one side: its
 *                                          output flushed, write side shut
 *                                          down, its EOF awaited
 *   any -> closed
 *
 * Who began the ending is kept beside it (px_close_by), and how far the
 * broker's side is (px_up_end). */
#define PX_CLOSE_PHASES(X)                                                     \
  X(CONNECTING, "connecting", s->srv->cfg->handshake_timeout_ms)               \
  X(HANDSHAKE, "handshake", PX_PHASE_RUNS_ON)                                  \
  X(OPEN, "open", 0)                                                           \
  X(CLOSING, "closing", PX_PHASE_RUNS_ON)                                      \
  X(REFUSING, "refusing", PX_PHASE_RUNS_ON)                                    \
  X(TELLING_CLIENT, "telling-client", PX_CLOSE_WAIT_MS)                        \
  X(CLIENT_ANSWERED, "client-answered", cfg->retry_finish_timeout_ms)          \
  X(FINISHING, "finishing", PX_FINISH_WAIT_MS)                                 \
  X(CLIENT_DEAD, "client-dead", PX_CLOSE_WAIT_MS)                              \
  X(CLIENT_GONE, "client-gone", cfg->retry_finish_timeout_ms)                  \
  X(LINGER, "linger", PX_CLOSE_WAIT_MS)                                        \
  X(CLOSED, "closed", 0)

/* A phase's limit: the one of the phase before runs on. */
#define PX_PHASE_RUNS_ON UINT64_MAX

typedef enum px_close_phase {
#define PX__PHASE_ENUM(id, name, wait) PX_PHASE_##id,
  PX_CLOSE_PHASES(PX__PHASE_ENUM)
#undef PX__PHASE_ENUM
} px_close_phase;

const char *px_close_phase_name(int phase);

/* How long to wait for close-ok (or a flush, or a lingering peer's EOF)
 * before closing anyway. */
#define PX_CLOSE_WAIT_MS 2000
/* After close-ok, how long the client has to hang up (the broker's own
 * wait). */
#define PX_FINISH_WAIT_MS 30000

/* Who began ending the connection: the first one, except that rebound's
 * own connection.close to the client replaces a peer's (from then on
 * only the client's close-ok matters). */
#define PX_CLOSE_BY(X)                                                         \
  X(NONE, "none")                                                              \
  X(CLIENT, "client")                                                          \
  X(BROKER, "broker")                                                          \
  X(REBOUND, "rebound")   /* an error, a bad header, the broker lost */        \
  X(SHUTDOWN, "shutdown") /* rebound is shutting down */

typedef enum px_close_by {
#define PX__BY_ENUM(id, name) PX_BY_##id,
  PX_CLOSE_BY(PX__BY_ENUM)
#undef PX__BY_ENUM
} px_close_by;

const char *px_close_by_name(int by);

/* How the broker's side of the connection ends. RabbitMQ drops what it
 * has not yet acted on of a connection that hangs up, even one whose
 * connection.close is still being handled (acks among it: their
 * deliveries come again), so an open connection ends with
 * connection.close, and rebound hangs up only once it is answered. */
typedef enum px_up_end {
  PX_UP_HANDSHAKE,      /* not open: hanging up is all it takes */
  PX_UP_OPEN,           /* open: ends with connection.close */
  PX_UP_CLOSE_SENT,     /* a connection.close went (the client's or rebound's):
                           the write side stays open for its answer */
  PX_UP_CLOSE_ANSWERED, /* its close-ok (or the broker's own close) came:
                           every frame before it was acted on */
} px_up_end;

/* What to do with a frame just parsed. */
enum px_action {
  PX_FORWARD,   /* send on, as part of the current run */
  PX_DROP,      /* consumed here */
  PX_HOLD,      /* keep in the held frames of the channel given back */
  PX_STOP,      /* the session is closing: stop parsing */
  PX_HOLD_CONN, /* connection.close: wait for the copies in flight */
};

struct px_session;

typedef struct px_session {
  struct px_server *srv;
  const px_pub_events *pub_events; /* the session's, for the retry
                                      connection px_own opens */
  struct px_session *prev, *next;
  uint64_t id;
  uint8_t phase;  /* px_close_phase */
  uint8_t closer; /* px_close_by */
  px_conn client, upstream;
  px_dial *dial;    /* reaching the upstream (px_dial.h), while dialing: freed
                       once the broker has answered (an idle session holds
                       no dialer) */
  bool dial_failed; /* every upstream failed */
  struct {          /* the upstream in use, once dialing is over */
    char *addr;     /* "host:port" */
    char *host;     /* its name (SNI) */
    union {
      struct sockaddr sa;
      struct sockaddr_in in;
      struct sockaddr_in6 in6;
    } sa;
    bool tls;
  } up;
  px_timer timer; /* handshake, then close-ok wait */
  unsigned open_handles;
  uint64_t started_ms;
  char peer[64];
  char user[128];
  char vhost[128];
  uint8_t close_reason; /* px_close_reason: the first that applied */
  uint8_t close_req;    /* px_close_reason: px_life_close() asked for it */

  /* offered in connection.tune, negotiated in tune-ok */
  uint16_t offer_channel_max;
  uint32_t offer_frame_max;
  uint16_t channel_max;
  uint32_t frame_max;
  uint16_t heartbeat;

  px_tab by_client, by_up;
  uint32_t nchans;
  uint32_t chan_gen;

  /* rebound's channel: px_own.c's alone, every other module goes
   * through px_own.h (tools/struct_owners.py --check) */
  struct {
    uint16_t ch;
    uint8_t state;    /* px_own_state (px_own.h) */
    uint8_t failures; /* closes since a copy was last confirmed: the
                         reopen backoff */
    /* retry_connection separate (px_pub.h): rebound's channel on a
     * connection of its own, logged in as the client */
    bool on_pub;           /* it is (or is being) opened on pub */
    bool pub_ready;        /* pub is logged in */
    bool pub_failed;       /* logging in there failed: on the client's now */
    bool pub_was_up;       /* pub logged in at least once */
    uint8_t pub_misses;    /* logins failed in a row since pub was last up */
    uint16_t yield_waiter; /* client channel waiting for its number */
    bool yield_requested;  /* close it once it is ready */
    uint64_t seq;          /* publish sequence on it */
    px_timer reopen;       /* reopen after the backoff */
    /* client channels whose requeue waits for it to reopen */
    struct {
      uint16_t ch;
      uint32_t gen;
    } waiters[16];
    unsigned nwaiters;
  } own;
  bool broker_quorum_dlx; /* connection.start: RabbitMQ >= 3.10 */
  uint8_t *login_auth;    /* the client's start-ok mechanism, response and */
  uint8_t *login_vhost;   /* locale, and open's vhost (login's views) */
  px_pub_login login;

  /* the retry path: px_retry.c's alone, every other module goes through
   * px_retry.h (tools/struct_owners.py --check) */
  struct {
    px_ring ops;       /* px_retry_op: copies awaiting the broker's confirm,
                          in publish order */
    px_ring defers;    /* px_defer: requeues held back for the tier delay */
    px_ring parked;    /* px_defer: copies whose queue must be declared
                          first, waiting for no copy to be in flight */
    px_timer deadline; /* the oldest copy's confirm deadline */
    px_timer defer;    /* the next held-back requeue's */
    char **declared;   /* tier/DLQ queues declared on this connection */
    uint32_t ndeclared;
    char **broken; /* queues whose declare failed (pass-through) */
    uint32_t nbroken;
    char **alt_declared; /* declared here with the other type's arguments */
    uint32_t nalt_declared;
    bool next_again;          /* the copy being started is a republish */
    bool lost_waiting;        /* the client went while rebound's channel was
                                 opening: px_retry_consumer_lost() runs once it
                                 is ready */
    bool late_settle_logged;  /* late_settle_swallowed written once */
    uint64_t next_refused_ms; /* ... of a copy the broker nacked then */
    bool blocked; /* the broker blocks the connection of rebound's channel
                     (resource alarm) */
    uint64_t blocked_since_ms;
  } retry;
  uint64_t cache_bytes; /* deliveries kept for retry */
  uint64_t held_bytes;  /* client frames held on channels: they count
                           against the upstream side's watermarks */
  /* The payload of a body frame read in two chunks, while it is
   * dispatched (its amqp_frame has payload.ptr NULL and the whole length;
   * px_frames.h) */
  amqp_bytes split[2];
  px_ring relq;       /* px_release: channels whose held frames are due */
  bool idle_due;      /* copies finished, or rebound's channel closed: once
                         nothing is pending, px_frames_retry_idle() runs */
  px_slice conn_hold; /* the client's connection.close, waiting for the
                         copies in flight (chunk NULL: none) */
  uint8_t up_end;     /* px_up_end: how far the broker's side is in
                         ending */

  px_out out; /* forwarded and generated frames, in order (px_out.h) */
} px_session;

/* Accept a client from `listener` into a new session (over TLS with
 * `tls`, NULL: plain) and start connecting upstream. Returns 0 or a
 * negative libuv error (nothing is left behind). */
int px_session_accept(struct px_server *srv, uv_stream_t *listener,
                      struct px_tls_ctx *tls);

/* A session whose client is already connected over `client_io`, and
 * whose upstream connects through `upstream_io` (a test's transports,
 * px_conn.h). Starts as px_session_accept() does after the accept. NULL
 * when out of memory. */
px_session *px_session_new(struct px_server *srv, const px_conn_io *client_io,
                           const px_conn_io *upstream_io);

/* Begin a clean shutdown of the session (SIGTERM): connection.close 320 to
 * an open client, an immediate close otherwise. */
void px_session_drain(px_session *s);

/* Close both sockets now; `reason` (px_close.h) is logged and counted
 * unless an earlier one was noted. Safe to call twice. */
void px_session_close(px_session *s, px_close_reason reason);

/* What the admin endpoint shows of a session: a copy, taken now. */
typedef struct px_session_snap {
  uint64_t id;
  uint64_t started_ms; /* the loop's clock */
  const char *state;   /* px_close_phase_name() */
  char peer[64];
  char user[128];
  char vhost[128];
  uint32_t channels;
  uint64_t bytes_from_client, bytes_to_client;
  uint32_t retries_pending;  /* copies awaiting the broker's confirm */
  uint32_t requeues_delayed; /* requeues held back for the tier delay */
  uint64_t cache_bytes;      /* deliveries kept for retry */
  /* where rebound's channel is: "separate", "opening" (the separate
   * connection is logging in) or "shared" */
  const char *retry_connection;
  bool retry_connection_open; /* the separate retry connection is up */
  bool blocked;               /* the broker blocks rebound's connection */
  bool upstream_connected;
} px_session_snap;

void px_session_snapshot(const px_session *s, px_session_snap *out);
/* One delivery the client has not settled yet (px_session_unsettled()). */
typedef struct px_unsettled {
  uint64_t session_id;
  const char *peer;
  uint16_t channel; /* the client's number */
  uint64_t tag;
  int qid;                  /* its queue's slot (px_counters.h) */
  uint64_t delivered_us;    /* uv_hrtime() / 1000 when it came */
  const char *consumer_tag; /* "" for basic.get; NULL: consumer cancelled */
} px_unsettled;

/* Call `fn` for every delivery a session's client has yet to settle (ack
 * mode; those being retried or requeued by rebound included). Strings are
 * valid during the call. */
void px_session_unsettled(const px_session *s,
                          void (*fn)(void *arg, const px_unsettled *u),
                          void *arg);

/* The server's periodic tick: deliveries past their policy's processing
 * timeout (`shortest_timeout_ms`: the shortest of any policy; 0: none, and
 * nothing is done). */
void px_session_tick(px_session *s, uint32_t shortest_timeout_ms);

/* The sessions of a server, newest first (ids decrease along it). */
px_session *px_session_next(const px_session *s);
uint64_t px_session_id(const px_session *s);

#endif
