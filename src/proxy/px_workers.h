/* px_workers.h - --workers N: N processes, one event loop each, serving
 * the same listeners.
 *
 * The process started by the user is worker 0. It binds the listeners
 * with SO_REUSEPORT (px_server.c), then starts workers 1..N-1: the same
 * executable with the same arguments and environment plus
 * REBOUND_WORKER=k, and a control socket on descriptor 3. Each binds the
 * same addresses; the kernel spreads new connections over the processes.
 * A connection stays with the process that accepted it.
 *
 * Worker 0 alone runs the admin endpoint and the readiness probe. For
 * /metrics and /v1/status it asks the others over their control sockets
 * (a one-byte request; the answer is "<kind> <length>\n" and that many
 * bytes, in request order) and answers once all have answered or
 * PX_WORKERS_ASK_MS has passed, without the ones that did not:
 *   /metrics   one exposition: every series summed over the workers,
 *              except those of one process's state (rebound_ready, uptime,
 *              certificate expiry: worker 0's) and the oldest-age gauges
 *              (the maximum); plus rebound_workers, rebound_workers_running
 *              and rebound_worker_restarts_total;
 *   /v1/status worker 0's document with "workers": [{"worker", "pid",
 *              "status"}, ...], each "status" that worker's document.
 *
 * Signals: worker 0 passes SIGTERM, SIGINT and SIGHUP on to the others
 * (each reloads or drains itself), and exits once all of them have. A
 * worker whose control socket closes (worker 0 gone, however) drains as
 * on SIGTERM. A worker that exits while worker 0 is not draining is
 * logged and started again after PX_WORKERS_RESPAWN_MS.
 *
 * --max-connections (when not auto) and --cache-total are shared out:
 * each worker takes its share (px_workers_share).
 */
#ifndef PX_WORKERS_H
#define PX_WORKERS_H

#include <stdbool.h>
#include <stdint.h>

#include "px_admin.h"

struct px_server;

#define PX_WORKERS_ASK_MS 2000
#define PX_WORKERS_RESPAWN_MS 1000
#define PX_WORKERS_KILL_MS 2000 /* after worker 0's drain timeout */

typedef enum px_workers_event {
  PX_WORKERS_PARENT_GONE, /* a worker: worker 0 is gone; drain */
  PX_WORKERS_EXITED,      /* worker 0: a worker exited while draining */
} px_workers_event;

/* Worker 0 (cfg->workers > 1): start the others. A worker (cfg->worker >
 * 0): open the control socket. `event` is how the owner hears of the
 * events above. Returns 0 or a negative libuv error (logged). Does
 * nothing with one worker. */
int px_workers_start(struct px_server *srv, char **argv,
                     void (*event)(struct px_server *srv, px_workers_event ev));

/* Pass `signum` on to every running worker (worker 0 only). */
void px_workers_signal(struct px_server *srv, int signum);

/* Worker 0's drain timeout has passed: workers still running get
 * SIGKILL after PX_WORKERS_KILL_MS. */
void px_workers_deadline(struct px_server *srv);

/* Workers other than this one still running (worker 0; 0 elsewhere). */
unsigned px_workers_running(const struct px_server *srv);

/* Close the control sockets and timers; free what px_workers_start made
 * once their close callbacks have run. From px_server_stop. */
void px_workers_stop(struct px_server *srv);

/* Render `kind` ('M' metrics, 'S' status) for all workers into `r`:
 * true when it took the request (answered later, px_admin_defer), false
 * with one worker (render the usual way). */
bool px_workers_render(struct px_server *srv, int kind, px_admin_response *r);

/* This worker's share of `total` among cfg->workers (the remainder goes
 * to the first ones; at least 1 when total is). */
uint64_t px_workers_share(const struct px_server *srv, uint64_t total);

#endif
