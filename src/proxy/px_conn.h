/* px_conn.h - one socket endpoint: the transport under a session.
 *
 * A connection reads into a refcounted chunk (px_buf.h) and queues
 * slices of chunks for writing; a flush hands every queued slice to the
 * socket in one write. It knows nothing of AMQP: the owner parses what
 * px_conn_input() holds, advances the chunk's `off` past what it used,
 * and says with px_conn_keep() how many contiguous bytes the next unit
 * needs, so a unit larger than the chunk's room moves to a larger chunk.
 *
 * The owner registers events (px_conn_events); none fires after
 * px_conn_close(). Events fire from the loop (a read, a completed write,
 * a connect), never from inside a px_conn_* call, with one exception
 * written at px_conn_flush().
 *
 * Backpressure is the owner's policy: px_conn_pending() says how much
 * is in flight, px_conn_pause()/px_conn_resume() stop and restart
 * reading.
 *
 * Ending: px_conn_linger() flushes, shuts the write side down once
 * everything queued is written (px_conn_hold_shutdown() delays that),
 * and keeps reading, so the peer reads everything before its socket
 * closes instead of a reset.
 *
 * The byte transport sits behind px_conn_io: plain TCP here (libuv), and
 * the same interface serves a TLS layer or a recording fake in tests.
 */
#ifndef PX_CONN_H
#define PX_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "px_buf.h"

/* Slices queued for one write. */
#define PX_CONN_OUT_MAX 64

typedef struct px_conn px_conn;

typedef struct px_conn_events {
  /* `n` bytes arrived: px_conn_input() holds them from its `off`. */
  void (*data)(void *ctx, px_conn *c, size_t n);
  /* Reading ended: UV_EOF, a libuv error, or UV_ENOBUFS (no memory for
   * a read). Reading is stopped. */
  void (*eof)(void *ctx, px_conn *c, int err);
  /* A write failed (libuv error). */
  void (*write_failed)(void *ctx, px_conn *c, int err);
  /* A write completed: less is pending (the owner's pressure check). */
  void (*written)(void *ctx, px_conn *c);
  /* px_conn_connect() finished: 0, or a libuv error. */
  void (*connected)(void *ctx, px_conn *c, int status);
  /* The handle is closed: nothing of the connection is in use. */
  void (*closed)(void *ctx, px_conn *c);
} px_conn_events;

typedef struct px_conn_write {
  uv_write_t req;
  px_conn *conn;
  size_t bytes;
  unsigned n;
  px_chunk *chunks[PX_CONN_OUT_MAX];
  uv_buf_t bufs[PX_CONN_OUT_MAX];
} px_conn_write;

/* The transport: how bytes get in and out. Each returns 0 or a negative
 * libuv error unless said otherwise. Reads arrive through
 * px_conn_alloc() and px_conn_read_done(), completed writes through
 * px_conn_write_done(), and the close through px_conn_closed(). */
typedef struct px_conn_io {
  /* Connect to `sa`; the connected event follows (px_conn_connected()). */
  int (*connect)(px_conn *c, uv_loop_t *loop, const struct sockaddr *sa);
  int (*read_start)(px_conn *c);
  void (*read_stop)(px_conn *c);
  /* Write what goes now without blocking: bytes written, or an error. */
  int (*try_write)(px_conn *c, const uv_buf_t *bufs, unsigned n);
  int (*write)(px_conn *c, px_conn_write *w);
  int (*shutdown)(px_conn *c);
  void (*close)(px_conn *c);
  /* Free what the transport holds of a connection that never opened
   * (NULL: nothing). */
  void (*release)(px_conn *c);
} px_conn_io;

struct px_conn {
  const px_conn_io *io;
  const px_conn_events *ev;
  void *ctx;
  const char *name;   /* "client", "upstream": for logs */
  uv_tcp_t tcp;       /* the TCP handle of the plain and TLS transports */
  struct px_tls *tls; /* the TLS transport's state (px_tls.c) */
  union {             /* a connect is over before a shutdown can start */
    uv_connect_t connect_req;
    uv_shutdown_t shutdown_req;
  };
  px_chunk *in;   /* read chunk, NULL when idle */
  px_chunk *head; /* the first piece of a unit split across two chunks */
  px_slice *out;  /* PX_CONN_OUT_MAX slices while any is queued, else NULL */
  unsigned nout;
  size_t inflight; /* bytes handed to the transport, not yet written */
  uint64_t bytes_in, bytes_out;
  uint64_t moved;     /* input bytes copied to another chunk (px_conn_keep()) */
  bool open;          /* handle initialised and not closed */
  bool connected;     /* may be written to */
  bool reading;       /* the transport is reading */
  bool paused;        /* reading stopped by backpressure */
  bool lingering;     /* px_conn_linger() */
  bool hold_shutdown; /* lingering, but the write side stays open */
  bool shut;          /* shutdown issued */
  bool discard;       /* px_conn_stop_writing(): output is dropped */
};

/* Set up a connection that is not open yet. */
void px_conn_init(px_conn *c, const char *name, const px_conn_events *ev,
                  void *ctx);

/* Plain TCP: accept from a listener. 0 or a libuv error; `open` says
 * whether the handle must still be closed. */
int px_conn_accept(px_conn *c, uv_loop_t *loop, uv_stream_t *listener);
/* Connect through the transport (the connected event follows). 0 or a
 * libuv error; `open` as for px_conn_accept(). */
int px_conn_connect(px_conn *c, uv_loop_t *loop, const struct sockaddr *sa);
/* For transports on TCP: initialise the handle (open from then on). */
int px_conn_tcp_open(px_conn *c, uv_loop_t *loop);
/* A connection set up by a transport of its own (a test's): open and
 * connected, its io given. */
void px_conn_adopt(px_conn *c, const px_conn_io *io);
/* TCP keepalive probes after `secs` idle (plain TCP; other transports
 * ignore it). */
void px_conn_keepalive(px_conn *c, unsigned secs);
/* "ip:port" or "[ip6]:port" of the peer ("?:0" when unknown). */
void px_conn_peer(px_conn *c, char *out, size_t cap);

/* Reading. */
void px_conn_read(px_conn *c); /* start, unless paused or closed */
void px_conn_pause(px_conn *c);
void px_conn_resume(px_conn *c); /* unpause; reading starts again */
void px_conn_stop_reading(px_conn *c);
static inline px_chunk *px_conn_input(px_conn *c) {
  return c->in;
}
/* The owner is done with the input for now; the next unit needs `need`
 * contiguous bytes from the chunk's `off` (0: not known yet). A spent
 * chunk is released; one too small for the unit is replaced by a larger
 * one holding the unparsed bytes. 0, or UV_ENOMEM. */
int px_conn_keep(px_conn *c, size_t need);
/* As px_conn_keep() for a unit of `need` bytes that the owner can take in
 * two pieces (need > the bytes present): where px_conn_keep() would move
 * the bytes present, they stay in their chunk as the head
 * (px_conn_head(), from its `off` to its `len`) and reading goes on in a
 * new input chunk with room for the rest, which starts at its offset 0.
 * Reads stay full-sized and nothing is copied. While a head is held,
 * px_conn_keep() changes nothing; the owner lets go of it with
 * px_conn_head_done() once the unit is whole. 0, or UV_ENOMEM. */
int px_conn_keep_split(px_conn *c, size_t need);
static inline px_chunk *px_conn_head(px_conn *c) {
  return c->head;
}
void px_conn_head_done(px_conn *c);

/* Writing. Queue `len` bytes of chunk `ch` at `p` (a reference is taken;
 * bytes that continue the last slice extend it). Dropped silently after
 * px_conn_stop_writing() or on a closed connection. 0, UV_ENOBUFS when
 * the slice table is full and cannot be flushed (not connected), or
 * UV_ENOMEM when there is no memory for the table (a connection holds
 * one only while something is queued). */
int px_conn_queue(px_conn *c, px_chunk *ch, const uint8_t *p, uint32_t len)
    __attribute__((warn_unused_result));
/* Queue a copy of `len` bytes: in the spare room of the chunk of the last
 * slice when nothing else holds that chunk (copies queued one after the
 * other share a chunk), else in a new one. 0, UV_ENOMEM or UV_ENOBUFS. */
int px_conn_queue_copy(px_conn *c, const uint8_t *data, size_t len)
    __attribute__((warn_unused_result));
/* Hand what is queued to the transport (nothing before it is connected).
 * 0, or a negative libuv error (UV_ENOMEM: no memory for the request):
 * the caller decides what a failure means; no event fires for it. */
int px_conn_flush(px_conn *c) __attribute__((warn_unused_result));
static inline size_t px_conn_pending(const px_conn *c) {
  return c->inflight;
}
static inline bool px_conn_drained(const px_conn *c) {
  return c->inflight == 0 && c->nout == 0;
}
/* Nothing more is written: what is queued is dropped. */
void px_conn_stop_writing(px_conn *c);

/* Ending. px_conn_linger(): see the top of this file. Returns as
 * px_conn_flush(). */
int px_conn_linger(px_conn *c) __attribute__((warn_unused_result));
/* While held, a lingering connection keeps its write side open; once
 * released, it shuts down if drained (returns as px_conn_flush()). */
void px_conn_hold_shutdown(px_conn *c);
int px_conn_release_shutdown(px_conn *c) __attribute__((warn_unused_result));
/* Free the spare slice tables (at exit, for leak checkers). */
void px_conn_out_pool_drain(void);
/* Close the handle (the closed event follows). Safe to call twice. */
void px_conn_close(px_conn *c);
/* Give back the chunks still referenced (after the closed event). */
void px_conn_free(px_conn *c);

/* For transports: space for the next read, and what came (nread < 0:
 * the end, as libuv reports it). */
void px_conn_alloc(px_conn *c, uv_buf_t *buf);
void px_conn_read_done(px_conn *c, ssize_t nread);
void px_conn_connected(px_conn *c, int status);
void px_conn_write_done(px_conn_write *w, int status);
void px_conn_shutdown_done(px_conn *c, int status);
void px_conn_closed(px_conn *c);

#endif
