/* px_out.h - a session's output: frames it forwards and frames rebound
 * writes itself, in order.
 *
 * Frames parsed from a read chunk and forwarded unchanged form a "run"
 * (px_out_run_*): consecutive frames become one slice of the chunk, so a
 * read of many small frames is one iovec entry and no copy. A frame
 * rebound writes to the same connection first closes the run, so what it
 * writes comes after every forwarded frame parsed before it.
 *
 * A sink is a connection (px_conn.h) or NULL, which stands for the
 * separate retry connection (px_pub.h) while it is set.
 *
 * Every writer returns a status the caller must check. The first failure
 * is also kept (px_out_failed()): the session closes over it once the
 * event that caused it is handled, so a caller that stops at a failure
 * leaves nothing half done. A connection's write error is not kept here:
 * the transport reports it (a client's failed write is not fatal).
 */
#ifndef PX_OUT_H
#define PX_OUT_H

#include <stddef.h>
#include <stdint.h>

#include "amqp.h"
#include "px_conn.h"
#include "px_pub.h"

typedef enum px_out_status {
  PX_OUT_OK = 0,
  PX_OUT_NOMEM = -1,  /* no memory for a chunk or a write */
  PX_OUT_ENCODE = -2, /* a frame rebound builds does not encode */
  PX_OUT_FULL = -3,   /* the slice table is full before the connect */
  PX_OUT_RETRY = -4,  /* the retry connection refused the bytes */
} px_out_status;

typedef struct px_out {
  px_pub *pub; /* the separate retry connection, or NULL */
  struct {
    px_conn *to;
    px_chunk *chunk;
    uint32_t start, end;
  } run;
  px_out_status failed; /* the first failure */
  int write_error;      /* libuv error of a write a queue call flushed */
  px_conn *write_failed_on;
} px_out;

#define PX_OUT_CHECK __attribute__((warn_unused_result))

/* The run: frames of `chunk` from `off` go to `to` as they are parsed. */
void px_out_run_begin(px_out *o, px_conn *to, px_chunk *chunk, uint32_t off);
/* The frame just parsed (ending at `end`) is forwarded. */
static inline void px_out_run_extend(px_out *o, uint32_t end) {
  o->run.end = end;
}
/* Queue the run so far; the next frame starts a new one at `off`. */
px_out_status px_out_run_flush(px_out *o, uint32_t off) PX_OUT_CHECK;
/* Queue the run and end it. */
px_out_status px_out_run_end(px_out *o) PX_OUT_CHECK;

/* Bytes of a chunk (held frames, a held connection.close), by reference. */
px_out_status px_out_slice(px_out *o, px_conn *to, px_chunk *c,
                           const uint8_t *p, uint32_t len) PX_OUT_CHECK;
/* A copy of `len` bytes. */
px_out_status px_out_bytes(px_out *o, px_conn *sink, const uint8_t *data,
                           size_t len) PX_OUT_CHECK;
/* One frame of `type` with this payload, encoded straight into a chunk. */
px_out_status px_out_frame(px_out *o, px_conn *sink, uint8_t type, uint16_t ch,
                           const uint8_t *payload, size_t len) PX_OUT_CHECK;
/* One method frame (encoded on the stack: up to 1 KiB). */
px_out_status px_out_method(px_out *o, px_conn *sink, uint16_t ch,
                            const amqp_method *m) PX_OUT_CHECK;
px_out_status px_out_connection_close(px_out *o, px_conn *sink, uint16_t code,
                                      const char *text, uint16_t class_id,
                                      uint16_t method_id) PX_OUT_CHECK;
/* rebound's own connection.start (0-9, product "rebound", PLAIN and
 * AMQPLAIN, en_US): what a client that reached no broker is answered
 * with before it is told why in connection.close. */
px_out_status px_out_connection_start(px_out *o, px_conn *sink) PX_OUT_CHECK;
px_out_status px_out_channel_close(px_out *o, px_conn *sink, uint16_t ch,
                                   uint16_t code,
                                   const char *text) PX_OUT_CHECK;
/* basic.ack (requeue ignored), basic.nack or basic.reject of `tag`. */
px_out_status px_out_settle(px_out *o, px_conn *sink, uint16_t ch,
                            uint32_t method_id, uint64_t tag,
                            bool requeue) PX_OUT_CHECK;

static inline px_out_status px_out_failed(const px_out *o) {
  return o->failed;
}
/* A write error of `conn` met outside a queue call (a shutdown), kept
 * like one for the session to handle. */
void px_out_transport_error(px_out *o, px_conn *conn, int err);

#endif
