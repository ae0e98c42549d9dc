/* px_pub.h - the upstream connection a session publishes its copies on.
 *
 * With `retry_connection: separate` (the default) rebound does not publish
 * retry copies on the client's own upstream connection: a broker under a
 * resource alarm blocks a connection at its first publish, and with it
 * every ack the client sends there. Each session that keeps deliveries
 * for retry opens one more connection to the same broker address, logs in
 * with the mechanism and response of its client's connection.start-ok
 * (same user, same vhost, same permissions), and carries rebound's own
 * channel on it and nothing else. A broker that cannot be logged into
 * that way (a challenge in connection.secure, a refusal) makes the session
 * fall back to its own channel on the client's connection.
 *
 * The connection negotiates no heartbeat (TCP keepalive finds a dead
 * peer) and frame-max as the client's connection, so copies sized for one
 * fit the other. It announces the connection.blocked capability: the
 * broker says when it blocks it, and when that ends.
 *
 * The same connection serves rebound's own operations on the broker
 * (px_dlq.h): px_pub_dial() reaches the configured upstreams through a
 * dialer (px_dial.h) and logs in with credentials of the caller's.
 *
 * Memory: a px_pub is freed by libuv's close callback after px_pub_close();
 * the owner's events stop at that call.
 */
#ifndef PX_PUB_H
#define PX_PUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "amqp.h"
#include "px_conn.h"
#include "px_dial.h"

typedef struct px_pub px_pub;

/* What the connection tells its owner (`ctx`). None is called after
 * px_pub_close(). */
typedef struct px_pub_events {
  /* connection.open-ok: channels may be opened */
  void (*ready)(void *ctx);
  /* a frame on a channel other than 0; `f` is valid during the call */
  void (*frame)(void *ctx, const amqp_frame *f);
  /* connection.blocked (`blocked`, with the broker's reason) or
   * connection.unblocked */
  void (*blocked)(void *ctx, bool blocked, amqp_bytes reason);
  /* the connection failed or the broker closed it (`why`, static; the
   * broker's reply code, 0 if it sent none, and its reply text or the
   * error): call px_pub_close() */
  void (*lost)(void *ctx, const char *why, uint16_t code, amqp_bytes text);
} px_pub_events;

/* What the connection logs in with: the client's start-ok fields and
 * connection.open's vhost, copied. */
typedef struct px_pub_login {
  amqp_bytes mechanism, response, locale, vhost;
  uint32_t frame_max;
  uint32_t timeout_ms;    /* connect and log in by then, or it failed */
  struct px_tls_ctx *tls; /* TLS with this context (NULL: plain) */
  const char *tls_host;   /* ... for this host name (SNI, verification) */
  const char *peer;       /* the client, for the connection's name */
  const char *name;       /* the connection's name (NULL: from `peer`) */
} px_pub_login;

/* Connect to `addr` over `io` (NULL: plain TCP; px_conn.h) and log in,
 * within login->timeout_ms. The login's bytes are copied, and wiped once
 * logged in or closed; so is the start-ok frame once the broker answered
 * it. NULL when out of memory or the connection cannot be set up (nothing
 * is left for the caller to close). */
px_pub *px_pub_open(uv_loop_t *loop, const struct sockaddr *addr,
                    const px_conn_io *io, const px_pub_login *login,
                    const px_pub_events *ev, void *ctx);

/* The same, reaching the upstreams of `cfg` through a dialer (every
 * address, TLS with `tls` for an amqps upstream, `memory` shared with the
 * caller's other dialers; login->tls and tls_host are not used). Each
 * attempt gets cfg->connect_timeout_ms, the login login->timeout_ms from
 * the start. When every upstream fails, `lost` says so with the dialer's
 * errors. */
px_pub *px_pub_dial(uv_loop_t *loop, px_clock *clock, const px_config *cfg,
                    px_dial_memory *memory, struct px_tls_ctx *tls,
                    const px_pub_login *login, const px_pub_events *ev,
                    void *ctx);

/* The user and password of a connection.start-ok response, as views into
 * `response` (the client's: any bytes): PLAIN ("authzid\0user\0password",
 * no NUL in the password) or AMQPLAIN (LOGIN and PASSWORD long strings in
 * a table). `*user` is set whenever the response names one (else empty);
 * 0 when both were found, -1 for another mechanism or a malformed
 * response. Pure. */
int px_pub_login_split(amqp_bytes mechanism, amqp_bytes response,
                       amqp_bytes *user, amqp_bytes *password);

/* The frame-max negotiated (valid from `ready`). */
uint32_t px_pub_frame_max(const px_pub *p);

/* Queue bytes (whole frames) for the broker. 0, or -1 when out of memory
 * or the connection is closing. */
int px_pub_write(px_pub *p, const uint8_t *data, size_t len);

/* Stop the events, close the socket; freed once libuv is done with it.
 * NULL is ignored. */
void px_pub_close(px_pub *p);

/* At exit: connections still waiting for the broker's close-ok are closed
 * at once (their memory is freed as the loop runs on). */
void px_pub_close_all(void);

#endif
