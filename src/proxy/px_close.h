/* px_close.h - why a session ends: one table of close reasons.
 *
 * A session records the first reason that applies (a few events replace
 * it with a more telling one; px_session.c says where). The reason's text
 * is logged as session_close's `reason` and is the label of
 * rebound_client_connection_closes_total, so the set of label values is
 * this table.
 *
 * Columns: the side whose event ended the session (the client, the
 * broker, or rebound itself); the reply code rebound sends the client in
 * connection.close for it (0: the client is not told, it closed itself,
 * is gone, or gets a code chosen where the error is found); the text.
 * Where rebound closes the broker's side itself it always sends
 * REPLY_SUCCESS.
 */
#ifndef PX_CLOSE_H
#define PX_CLOSE_H

#include "amqp_status.h"

typedef enum px_close_side {
  PX_SIDE_CLIENT,
  PX_SIDE_BROKER,
  PX_SIDE_REBOUND,
} px_close_side;

/* X(ID, side, reply code to the client, text) */
#define PX_CLOSE_REASONS(X)                                                    \
  X(CLIENT_CLOSED_CONNECTION, CLIENT, 0, "client closed the connection")       \
  X(BROKER_CLOSED_CONNECTION, BROKER, 0, "broker closed the connection")       \
  X(CLIENT_CLOSED, CLIENT, 0, "client closed")                                 \
  X(CLIENT_DISCONNECTED, CLIENT, 0, "client disconnected")                     \
  X(CLIENT_WRITE_FAILED, CLIENT, 0, "client write failed")                     \
  X(CLIENT_DISCONNECTED_RETRIES_TIMEOUT, CLIENT, 0,                            \
    "client disconnected (retries pending timed out)")                         \
  X(CLIENT_WRITE_FAILED_RETRIES_TIMEOUT, CLIENT, 0,                            \
    "client write failed (retries pending timed out)")                         \
  X(BAD_PROTOCOL_HEADER, CLIENT, 0, "bad protocol header")                     \
  X(CLIENT_TLS_FAILED, CLIENT, 0, "client TLS failed")                         \
  X(BROKER_CLOSED, BROKER, 0, "broker closed")                                 \
  X(BROKER_DISCONNECTED, BROKER, 0, "broker disconnected")                     \
  X(BROKER_LOST, BROKER, AMQP_REPLY_CONNECTION_FORCED,                         \
    "broker connection lost")                                                  \
  X(UPSTREAM_WRITE_FAILED, BROKER, 0, "upstream write failed")                 \
  X(NO_UPSTREAM, BROKER, AMQP_REPLY_CONNECTION_FORCED,                         \
    "no upstream reachable")                                                   \
  X(PROTOCOL_ERROR, REBOUND, 0, "closed by rebound")                           \
  X(OUT_OF_MEMORY, REBOUND, 0, "out of memory")                                \
  X(ENCODE_FAILED, REBOUND, 0, "encode failed")                                \
  X(OUTPUT_FULL, REBOUND, 0, "output queue full before connect")               \
  X(RETRY_CONNECTION_WRITE_FAILED, REBOUND, 0,                                 \
    "retry connection write failed")                                           \
  X(CLOSE_TIMEOUT, REBOUND, 0, "close timeout")                                \
  X(HANDSHAKE_TIMEOUT, REBOUND, 0, "handshake timeout")                        \
  X(SHUTTING_DOWN, REBOUND, AMQP_REPLY_CONNECTION_FORCED,                      \
    "rebound shutting down")                                                   \
  X(DRAIN_TIMEOUT, REBOUND, 0, "drain timeout")

typedef enum px_close_reason {
  PX_CR_NONE, /* not closing */
#define PX__CR_ENUM(id, side, reply, text) PX_CR_##id,
  PX_CLOSE_REASONS(PX__CR_ENUM)
#undef PX__CR_ENUM
      PX_CR_COUNT
} px_close_reason;

/* The text of a reason (the metric label); "" for PX_CR_NONE. Static. */
const char *px_close_text(px_close_reason r);
/* Whose event it is. */
px_close_side px_close_side_of(px_close_reason r);
/* The reply code the client is sent for it (0: none of its own). */
int px_close_reply(px_close_reason r);

#endif
