/* px_probe.c - readiness: reaching a broker as a client does
 * (px_probe.h). */
#include "px_probe.h"

#include <stdio.h>
#include <string.h>

#include "amqp.h"

/* The round ends: the result once, then the handles close. */
static void finish(px_probe *p, bool ok, const char *why) {
  if (!p->answered) {
    p->answered = true;
    snprintf(p->why, sizeof p->why, "%s", why ? why : "");
    p->result(p->ctx, ok, p->why);
  }
  px_dial_close(&p->dial);
  if (p->conn.open)
    px_conn_close(&p->conn);
}

static void released(px_probe *p) {
  if (--p->handles == 0)
    p->busy = false;
}

/* What the broker sent after the protocol header: connection.start, or a
 * mismatch (its own protocol header, anything else). */
static void on_data(void *ctx, px_conn *c, size_t n) {
  px_probe *p = ctx;
  px_chunk *in = px_conn_input(c);
  const uint8_t *b = in->data + in->off;
  size_t len = in->len - in->off;
  amqp_frame f;
  (void)n;
  long r = amqp_frame_parse(b, len, 131072, &f);
  if (r == AMQP_PARTIAL) {
    if (px_conn_keep(c, (size_t)amqp_frame_size_at(b, len)) != 0)
      finish(p, false, "out of memory");
    return; /* more to come (the connect timeout bounds the wait) */
  }
  if (r > 0 && f.type == AMQP_FRAME_METHOD && f.channel == 0 &&
      amqp_method_peek_id(f.payload) == AMQP_CONNECTION_START) {
    px_dial_started(&p->dial);
    finish(p, true, NULL);
    return;
  }
  char what[64], why[400];
  amqp_protocol_header_describe(b, len, what, sizeof what);
  snprintf(why, sizeof why, "%s: protocol mismatch: answered %s", p->dial.addr,
           what);
  finish(p, false, why);
}

static void on_eof(void *ctx, px_conn *c, int err) {
  px_probe *p = ctx;
  char why[400];
  (void)c;
  snprintf(why, sizeof why, "%s: closed before connection.start (%s)",
           p->dial.addr, uv_strerror(err));
  finish(p, false, why);
}

static void on_write_failed(void *ctx, px_conn *c, int err) {
  on_eof(ctx, c, err);
}

static void on_written(void *ctx, px_conn *c) {
  (void)ctx;
  (void)c;
}

static void on_connected(void *ctx, px_conn *c, int status) {
  px_probe *p = ctx;
  (void)c;
  px_dial_connected(&p->dial, status);
}

static void on_closed(void *ctx, px_conn *c) {
  px_probe *p = ctx;
  (void)c;
  p->handles--; /* counted when opened */
  if (!p->dial.done && !p->dial.closed) {
    px_dial_closed(&p->dial); /* a failed attempt: the next */
    return;
  }
  px_conn_free(&p->conn);
  if (p->handles == 0)
    p->busy = false;
}

static const px_conn_events conn_events = {
    on_data, on_eof, on_write_failed, on_written, on_connected, on_closed};

static void dial_opened(void *ctx) {
  px_probe *p = ctx;
  p->handles++;
}

static void dial_connected(void *ctx) {
  px_probe *p = ctx;
  px_conn_read(&p->conn);
  if (px_conn_queue_copy(&p->conn, amqp_protocol_header,
                         AMQP_PROTOCOL_HEADER_SIZE) != 0 ||
      px_conn_flush(&p->conn) != 0)
    finish(p, false, "out of memory");
}

static void dial_failed(void *ctx) {
  px_probe *p = ctx;
  char why[sizeof p->dial.errors + 32];
  snprintf(why, sizeof why, "no upstream reachable: %s", p->dial.errors);
  finish(p, false, why);
}

static void dial_released(void *ctx) {
  released(ctx);
}

/* The probe's failed tries are logged by px_dial, not counted as the
 * clients' connect failures. */
static const px_dial_events dial_events = {dial_opened, dial_connected,
                                           dial_failed, NULL, dial_released};

void px_probe_run(px_probe *p, uv_loop_t *loop, px_clock *clock,
                  const px_config *cfg, px_dial_memory *memory,
                  struct px_tls_ctx *tls,
                  void (*result)(void *ctx, bool ok, const char *why),
                  void *ctx) {
  if (p->busy)
    return;
  p->busy = true;
  p->answered = false;
  p->result = result;
  p->ctx = ctx;
  p->handles = 1; /* the dialer */
  px_conn_init(&p->conn, "probe", &conn_events, p);
  px_dial_start(&p->dial, loop, clock, cfg, memory, tls, &p->conn,
                cfg->connect_timeout_ms, &dial_events, p, 0);
}

void px_probe_stop(px_probe *p) {
  if (!p->busy)
    return;
  p->answered = true; /* no result for a round cut short */
  finish(p, false, NULL);
}
