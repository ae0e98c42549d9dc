/* px_probe.h - readiness: reaching a broker as a client does.
 *
 * One round dials the upstreams (px_dial.h: every address, TLS for an
 * amqps upstream, within the connect timeout, lately failed upstreams
 * last), sends the AMQP 0-9-1 protocol header to the first that connects
 * and waits for its connection.start; then it hangs up (nothing was
 * opened). The result says whether a broker answered, or why none did: a
 * peer that answers anything but connection.start is a protocol
 * mismatch. The server runs a round on a timer from start-up.
 */
#ifndef PX_PROBE_H
#define PX_PROBE_H

#include <stdbool.h>

#include "px_conn.h"
#include "px_dial.h"

typedef struct px_probe {
  px_conn conn;
  px_dial dial;
  void (*result)(void *ctx, bool ok, const char *why);
  void *ctx;
  unsigned handles; /* the dialer's and the connection's, while a round
                       runs or closes */
  bool busy;        /* a round is under way (or closing) */
  bool answered;    /* this round's result was given */
  char why[512];
} px_probe;

/* Start a round unless one is under way: `result` follows, once. */
void px_probe_run(px_probe *p, uv_loop_t *loop, px_clock *clock,
                  const px_config *cfg, px_dial_memory *memory,
                  struct px_tls_ctx *tls,
                  void (*result)(void *ctx, bool ok, const char *why),
                  void *ctx);
/* End a round under way (no result); its handles close as the loop runs. */
void px_probe_stop(px_probe *p);

#endif
