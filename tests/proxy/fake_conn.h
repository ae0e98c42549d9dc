/* fake_conn.h - an in-memory transport for px_conn (px_conn.h), for tests.
 *
 * A fake_conn stands for the peer at the other end of one px_conn: what
 * rebound writes is appended to its wire log; what the peer "sends" is
 * queued and fed to the connection while it reads. Nothing happens inside
 * a px_conn_io call except bookkeeping: connects complete, writes
 * complete, shutdowns finish, input is read and the handle closes in
 * fake_step(), as libuv would do from the loop.
 *
 * The px_conn_io vtable is the first member, so the fake is found from the
 * connection's `io` pointer: one fake per connection, no global state.
 *
 * Backpressure shows as it does on a socket: input is fed only while the
 * connection reads (px_conn read_start/read_stop); stalled writes stay
 * pending (in flight for px_conn) until the stall is lifted.
 */
#ifndef FAKE_CONN_H
#define FAKE_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "px_conn.h"

typedef struct fake_piece {
  struct fake_piece *next;
  size_t len, off;
  int tag; /* the sender's, for the feed hooks */
  uint8_t data[];
} fake_piece;

typedef struct fake_conn fake_conn;

/* Called before the first and after the last byte of one queued piece of
 * input is fed (fake_send() queues one piece per call). */
typedef void (*fake_feed_hook)(void *ctx, fake_conn *f, const fake_piece *k);

struct fake_conn {
  px_conn_io io; /* first: px_conn.io points here */
  const char *name;
  px_conn *conn; /* the connection using this transport (while active) */
  bool active;   /* bound to a connection whose closed event is not out */

  /* connecting */
  int connect_result; /* returned by connect() (0: the event follows) */
  int connect_status; /* status of the connected event */
  bool connect_pending;
  unsigned connect_hangs; /* this many connects never complete (SYNs
                             dropped) until closed */
  unsigned connects;      /* connect() calls */
  bool connect_hanging;   /* the pending connect is one of those */
  char connect_addr[64];

  /* reading */
  bool reading;
  fake_piece *in_head, *in_tail;
  size_t in_bytes; /* queued, not yet fed */
  int eof;         /* nread to report once the queue is fed (0: none) */
  bool ended;      /* the end was reported: a read restarted reports
                      UV_EOF again, as a socket does; nothing more is sent */
  uint64_t fed;    /* bytes fed so far */

  /* writing */
  int try_write_error;  /* try_write() returns this (0: none) */
  int write_error;      /* write() returns this (0: none) */
  int complete_error;   /* writes complete with this status (0: ok) */
  size_t try_write_max; /* bytes try_write() takes per call */
  bool stall;           /* writes neither taken nor completed meanwhile */
  px_conn_write **pending;
  size_t npending, cap_pending;
  uint8_t *log; /* every byte handed to the transport, in order */
  size_t log_len, log_cap;

  /* ending */
  bool shutdown_pending, shut;
  bool close_pending;
  unsigned closes; /* closed events delivered */

  fake_feed_hook before_feed, after_feed;
  void *hook_ctx;
};

void fake_init(fake_conn *f, const char *name);
/* Frees the log and queued input. Pending writes must have completed
 * (fake_step() after the close does that). */
void fake_free(fake_conn *f);

static inline const px_conn_io *fake_io(fake_conn *f) {
  return &f->io;
}

/* The peer sends bytes (one piece), or ends its side: UV_EOF, or an error
 * such as UV_ECONNRESET, reported after what is queued. Bytes sent after
 * the end are dropped. */
void fake_send(fake_conn *f, const void *p, size_t len);
void fake_send_tagged(fake_conn *f, const void *p, size_t len, int tag);
void fake_send_eof(fake_conn *f, int err);

/* Deliver what is due: a close (pending writes cancelled first), a
 * connect, completed writes, a shutdown, then queued input while the
 * connection reads. true when anything happened. */
bool fake_step(fake_conn *f);

/* Something waits for fake_step() (not counting stalled writes or input
 * while not reading). */
bool fake_busy(const fake_conn *f);

#endif
