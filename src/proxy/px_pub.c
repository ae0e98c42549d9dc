/* px_pub.c - the upstream connection a session publishes its copies on
 * (px_pub.h).
 *
 * States: connecting -> handshake (start, tune, open sent in turn) ->
 * open -> closed. The socket is a px_conn (px_conn.h): frames are parsed
 * from its read chunk, and what px_pub_write() is given is copied into
 * its output and flushed at once.
 */
#define _DEFAULT_SOURCE /* explicit_bzero */
#include "px_pub.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "px_tls.h"

/* The largest frame the broker may send here: rebound's own channel only
 * gets confirms, returns (with the returned copy) and closes. */
#define PUB_FRAME_LIMIT (4u * 1024 * 1024 + 4096)
#define PUB_LOGIN_MAX 65536 /* bytes of mechanism, response, locale, vhost */

/* How long a closing connection waits for the broker's close-ok. */
#define PUB_CLOSE_WAIT_MS 2000

typedef enum pub_state {
  PUB_CONNECTING,
  PUB_HANDSHAKE,
  PUB_OPEN,
  PUB_CLOSING, /* connection.close sent, close-ok awaited */
  PUB_CLOSED,
} pub_state;

struct px_pub {
  px_conn conn;
  px_dial dial; /* px_pub_dial() only */
  uv_timer_t close_timer;
  unsigned handles; /* open: the connection, the timer, a dialer */
  bool dialing;     /* made by px_pub_dial() */
  bool starting;    /* inside px_pub_dial(): no event from here */
  bool dial_failed; /* every upstream failed: reported from the timer */
  pub_state state;
  bool lost;       /* the lost event was sent */
  int write_error; /* a write failed at once: reported from the loop */
  const px_pub_events *ev;
  void *ctx;
  uint32_t frame_max;
  char name[96];
  uint8_t *login;      /* mechanism, response, locale, vhost back to back */
  px_chunk *secret;    /* the start-ok as written: wiped once answered */
  px_pub *prev, *next; /* in `closing` while PUB_CLOSING */
  amqp_bytes mechanism, response, locale, vhost;
};

/* Credentials leave no copy behind in freed memory. */
static void wipe(void *p, size_t n) {
  if (p)
    explicit_bzero(p, n);
}

static void forget_login(px_pub *p) {
  wipe(p->login,
       p->mechanism.len + p->response.len + p->locale.len + p->vhost.len);
  free(p->login);
  p->login = NULL;
  p->mechanism = p->response = p->locale = p->vhost = (amqp_bytes){NULL, 0};
}

/* The start-ok's bytes: wiped, and their chunk given back. */
static void forget_secret(px_pub *p) {
  if (!p->secret)
    return;
  wipe(p->secret->data, p->secret->len);
  px_chunk_unref(p->secret);
  p->secret = NULL;
}

static void handle_closed(px_pub *p) {
  if (--p->handles)
    return;
  px_conn_free(&p->conn);
  forget_secret(p);
  forget_login(p);
  free(p);
}

static void on_timer_closed(uv_handle_t *h) {
  handle_closed(h->data);
}

/* Connections saying goodbye (the process is single-threaded). */
static px_pub *closing;

static void close_now(px_pub *p) {
  if (p->state == PUB_CLOSED)
    return;
  if (p->state == PUB_CLOSING) {
    if (p->prev)
      p->prev->next = p->next;
    else
      closing = p->next;
    if (p->next)
      p->next->prev = p->prev;
  }
  p->state = PUB_CLOSED;
  forget_secret(p);
  if (p->dialing)
    px_dial_close(&p->dial); /* its released event counts as a handle */
  px_conn_close(&p->conn);   /* the closed event frees it with the timer */
  uv_close((uv_handle_t *)&p->close_timer, on_timer_closed);
}

static void fail(px_pub *p, const char *why, uint16_t code, amqp_bytes text);

/* The connection broke: one saying goodbye is done, any other tells its
 * owner. */
static void broken(px_pub *p, const char *why, amqp_bytes text) {
  if (p->state == PUB_CLOSING)
    close_now(p);
  else if (p->state != PUB_CLOSED)
    fail(p, why, 0, text);
}

/* The timer: the login's deadline, then the wait for close-ok (or a
 * write that failed at once, reported here). */
static void on_timer(uv_timer_t *t) {
  px_pub *p = t->data;
  if (p->dial_failed)
    fail(p, "no upstream reachable", 0, amqp_cstr(p->dial.errors));
  else if (p->write_error)
    broken(p, "write failed", amqp_cstr(uv_strerror(p->write_error)));
  else if (p->state == PUB_CLOSING)
    close_now(p);
  else if (p->state == PUB_CONNECTING || p->state == PUB_HANDSHAKE)
    fail(p, "login timed out", 0, amqp_cstr(""));
}

static int write_method(px_pub *p, uint16_t ch, const amqp_method *m);

/* An open connection says goodbye (connection.close, then close-ok or
 * PUB_CLOSE_WAIT_MS), so the broker logs no "unexpectedly closed"; any
 * other is closed at once. */
void px_pub_close(px_pub *p) {
  if (!p || p->state == PUB_CLOSED || p->state == PUB_CLOSING)
    return;
  p->ev = NULL;
  amqp_method m;
  amqp_method_init(&m, AMQP_CONNECTION_CLOSE);
  m.args[AMQP_F_CONNECTION_CLOSE_REPLY_CODE].u = AMQP_REPLY_SUCCESS;
  m.args[AMQP_F_CONNECTION_CLOSE_REPLY_TEXT].b =
      amqp_cstr("rebound: the client connection ended");
  if (p->state != PUB_OPEN || p->lost || write_method(p, 0, &m) != 0) {
    close_now(p);
    return;
  }
  p->state = PUB_CLOSING;
  p->prev = NULL;
  p->next = closing;
  if (closing)
    closing->prev = p;
  closing = p;
  uv_timer_start(&p->close_timer, on_timer, PUB_CLOSE_WAIT_MS, 0);
}

void px_pub_close_all(void) {
  while (closing)
    close_now(closing);
}

/* Tell the owner once; it closes. */
static void fail(px_pub *p, const char *why, uint16_t code, amqp_bytes text) {
  if (p->lost || !p->ev)
    return;
  p->lost = true;
  p->ev->lost(p->ctx, why, code, text);
}

/* Hand what is queued to the socket. A write that fails at once is
 * reported from the loop, as one failing later is, never from inside the
 * owner's px_pub_write(). -1 only when out of memory. */
static int flush(px_pub *p) {
  int rc = px_conn_flush(&p->conn);
  if (rc == UV_ENOMEM)
    return -1;
  if (rc < 0 && !p->write_error) {
    p->write_error = rc;
    uv_timer_start(&p->close_timer, on_timer, 0, 0);
  }
  return 0;
}

int px_pub_write(px_pub *p, const uint8_t *data, size_t len) {
  if (p->state == PUB_CLOSED || p->state == PUB_CONNECTING ||
      (p->state == PUB_CLOSING && p->ev))
    return -1;
  if (px_conn_queue_copy(&p->conn, data, len) != 0)
    return -1;
  return flush(p);
}

static int write_method(px_pub *p, uint16_t ch, const amqp_method *m) {
  uint8_t buf[1024];
  long n = amqp_method_frame_write(buf, sizeof buf, ch, m);
  return n < 0 ? -1 : px_pub_write(p, buf, (size_t)n);
}

/* ---- handshake ---------------------------------------------------------
 */

static void put_bool(amqp_writer *w, const char *key) {
  amqp_field t = {.type = 't'};
  t.v.u = 1;
  amqp_table_write_entry(w, amqp_cstr(key), &t);
}

static int send_start_ok(px_pub *p) {
  uint8_t caps[256], props[512];
  amqp_writer cw = amqp_writer_make(caps, sizeof caps);
  put_bool(&cw, "connection.blocked");
  put_bool(&cw, "publisher_confirms");
  put_bool(&cw, "basic.nack");
  put_bool(&cw, "authentication_failure_close"); /* a refusal says why */
  amqp_writer pw = amqp_writer_make(props, sizeof props);
  amqp_field f = amqp_field_string(amqp_cstr("rebound"));
  amqp_table_write_entry(&pw, amqp_cstr("product"), &f);
  f = amqp_field_string(amqp_cstr(p->name));
  amqp_table_write_entry(&pw, amqp_cstr("connection_name"), &f);
  f = (amqp_field){.type = 'F'};
  f.v.bytes = (amqp_bytes){caps, cw.len};
  amqp_table_write_entry(&pw, amqp_cstr("capabilities"), &f);
  amqp_method m;
  amqp_method_init(&m, AMQP_CONNECTION_START_OK);
  m.args[AMQP_F_CONNECTION_START_OK_CLIENT_PROPERTIES].b =
      (amqp_bytes){props, pw.len};
  m.args[AMQP_F_CONNECTION_START_OK_MECHANISM].b = p->mechanism;
  m.args[AMQP_F_CONNECTION_START_OK_RESPONSE].b = p->response;
  m.args[AMQP_F_CONNECTION_START_OK_LOCALE].b = p->locale;
  /* a chunk of its own, kept until the broker answered, then wiped */
  px_chunk *c = px_chunk_new(PUB_LOGIN_MAX + 1024);
  if (!c)
    return -1;
  long n = amqp_method_frame_write(c->data, c->cap, 0, &m);
  c->len = n < 0 ? 0 : (uint32_t)n;
  p->secret = c;
  if (n < 0 || px_conn_queue(&p->conn, c, c->data, c->len) != 0)
    return -1;
  return flush(p);
}

static int send_tune_ok_open(px_pub *p, const amqp_method *tune) {
  uint32_t offer = (uint32_t)tune->args[AMQP_F_CONNECTION_TUNE_FRAME_MAX].u;
  amqp_method m;
  amqp_method_init(&m, AMQP_CONNECTION_TUNE_OK);
  m.args[AMQP_F_CONNECTION_TUNE_OK_CHANNEL_MAX].u = 1;
  if (offer && offer < p->frame_max)
    p->frame_max = offer;
  m.args[AMQP_F_CONNECTION_TUNE_OK_FRAME_MAX].u = p->frame_max;
  m.args[AMQP_F_CONNECTION_TUNE_OK_HEARTBEAT].u = 0;
  if (write_method(p, 0, &m) != 0)
    return -1;
  amqp_method_init(&m, AMQP_CONNECTION_OPEN);
  m.args[AMQP_F_CONNECTION_OPEN_VIRTUAL_HOST].b = p->vhost;
  return write_method(p, 0, &m);
}

/* A method on channel 0. */
static void connection_method(px_pub *p, const amqp_frame *f) {
  amqp_method m;
  if (amqp_method_decode_flags(f->payload, &m, AMQP_DECODE_OPAQUE_TABLES) !=
      AMQP_OK) {
    fail(p, "the broker sent a bad frame", 0, amqp_cstr(""));
    return;
  }
  int rc = 0;
  switch (m.id) {
  case AMQP_CONNECTION_START:
    if (p->dialing)
      px_dial_started(&p->dial);
    rc = send_start_ok(p);
    break;
  case AMQP_CONNECTION_SECURE:
    fail(p, "the broker asks for a challenge response", 0, amqp_cstr(""));
    return;
  case AMQP_CONNECTION_TUNE:
    forget_secret(p); /* the broker has read the start-ok */
    rc = send_tune_ok_open(p, &m);
    break;
  case AMQP_CONNECTION_OPEN_OK:
    p->state = PUB_OPEN;
    uv_timer_stop(&p->close_timer);
    forget_login(p); /* logged in: not needed any more */
    p->ev->ready(p->ctx);
    return;
  case AMQP_CONNECTION_BLOCKED:
    p->ev->blocked(p->ctx, true, m.args[AMQP_F_CONNECTION_BLOCKED_REASON].b);
    return;
  case AMQP_CONNECTION_UNBLOCKED:
    p->ev->blocked(p->ctx, false, amqp_cstr(""));
    return;
  case AMQP_CONNECTION_CLOSE:
    amqp_method_init(&m, AMQP_CONNECTION_CLOSE_OK);
    write_method(p, 0, &m);
    amqp_method_decode_flags(f->payload, &m, AMQP_DECODE_OPAQUE_TABLES);
    fail(p, "the broker closed it",
         (uint16_t)m.args[AMQP_F_CONNECTION_CLOSE_REPLY_CODE].u,
         m.args[AMQP_F_CONNECTION_CLOSE_REPLY_TEXT].b);
    return;
  default:
    return;
  }
  if (rc != 0)
    fail(p, "out of memory", 0, amqp_cstr(""));
}

/* ---- input -------------------------------------------------------------
 */

/* Closing: only the broker's close-ok (or its own close) matters. */
static void frame_closing(px_pub *p, const amqp_frame *f) {
  uint32_t id =
      f->type == AMQP_FRAME_METHOD ? amqp_method_peek_id(f->payload) : 0;
  if (f->channel == 0 &&
      (id == AMQP_CONNECTION_CLOSE_OK || id == AMQP_CONNECTION_CLOSE))
    close_now(p);
}

static void frame_open(px_pub *p, const amqp_frame *f) {
  if (f->type == AMQP_FRAME_HEARTBEAT)
    return;
  if (f->channel == 0 && f->type == AMQP_FRAME_METHOD)
    connection_method(p, f);
  else if (f->channel != 0 && p->state == PUB_OPEN)
    p->ev->frame(p->ctx, f);
}

/* Every whole frame read, in order; the chunk keeps a partial one (and
 * grows to hold it). */
static void on_data(void *ctx, px_conn *c, size_t nread) {
  px_pub *p = ctx;
  px_chunk *in = px_conn_input(c);
  (void)nread;
  while (p->state != PUB_CLOSED &&
         (p->state == PUB_CLOSING || (p->ev && !p->lost))) {
    amqp_frame f;
    long n = amqp_frame_parse(in->data + in->off, in->len - in->off,
                              PUB_FRAME_LIMIT, &f);
    if (n == AMQP_PARTIAL)
      break;
    if (n < 0) {
      in->off = in->len;
      broken(p, "the broker sent a bad frame",
             amqp_cstr(amqp_status_str((int)n)));
      return;
    }
    in->off += (uint32_t)n;
    if (p->state == PUB_CLOSING)
      frame_closing(p, &f);
    else
      frame_open(p, &f);
  }
  if (p->state == PUB_CLOSED)
    return;
  uint64_t need = amqp_frame_size_at(in->data + in->off, in->len - in->off);
  if (need > PUB_FRAME_LIMIT)
    need = 0; /* the parser refuses it on the next read */
  if (px_conn_keep(c, (size_t)need) != 0)
    fail(p, "out of memory", 0, amqp_cstr(""));
}

static void on_eof(void *ctx, px_conn *c, int err) {
  (void)c;
  broken(ctx, err == UV_EOF ? "the broker closed it" : "read failed",
         amqp_cstr(err == UV_EOF ? "" : uv_strerror(err)));
}

static void on_write_failed(void *ctx, px_conn *c, int err) {
  (void)c;
  broken(ctx, "write failed", amqp_cstr(uv_strerror(err)));
}

static void on_written(void *ctx, px_conn *c) {
  (void)ctx;
  (void)c;
}

/* The handshake begins: TCP (and TLS) is up. */
static void start_handshake(px_pub *p) {
  p->state = PUB_HANDSHAKE;
  px_conn_keepalive(&p->conn, 30);
  px_conn_read(&p->conn);
  if (px_pub_write(p, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE) != 0)
    fail(p, "out of memory", 0, amqp_cstr(""));
}

static void on_connected(void *ctx, px_conn *c, int status) {
  px_pub *p = ctx;
  (void)c;
  if (p->state == PUB_CLOSED || p->state == PUB_CLOSING)
    return;
  if (p->dialing) {
    px_dial_connected(&p->dial, status); /* its connected event follows */
    return;
  }
  if (status < 0) {
    fail(p, "connect failed", 0, amqp_cstr(uv_strerror(status)));
    return;
  }
  start_handshake(p);
}

static void on_closed(void *ctx, px_conn *c) {
  px_pub *p = ctx;
  (void)c;
  if (p->dialing && p->dial.closing_attempt && !p->dial.closed) {
    p->handles--; /* a failed attempt's: the dialer tries the next */
    px_dial_closed(&p->dial);
    return;
  }
  handle_closed(p);
}

static const px_conn_events conn_events = {
    on_data, on_eof, on_write_failed, on_written, on_connected, on_closed};

/* Copy the login fields into one allocation. */
static int keep_login(px_pub *p, const px_pub_login *l) {
  size_t total =
      l->mechanism.len + l->response.len + l->locale.len + l->vhost.len;
  if (total > PUB_LOGIN_MAX || !(p->login = malloc(total ? total : 1)))
    return -1;
  uint8_t *o = p->login;
  amqp_bytes *dst[] = {&p->mechanism, &p->response, &p->locale, &p->vhost};
  const amqp_bytes src[] = {l->mechanism, l->response, l->locale, l->vhost};
  for (int i = 0; i < 4; i++) {
    if (src[i].len)
      memcpy(o, src[i].ptr, src[i].len);
    *dst[i] = (amqp_bytes){o, src[i].len};
    o += src[i].len;
  }
  return 0;
}

/* A connection with its login kept and its events set, not yet
 * connecting (nothing to close); NULL when out of memory. */
static px_pub *pub_new(const px_pub_login *login, const char *conn_name,
                       const px_pub_events *ev, void *ctx) {
  px_pub *p = calloc(1, sizeof *p);
  if (!p || keep_login(p, login) != 0) {
    if (p)
      free(p->login);
    free(p);
    return NULL;
  }
  px_conn_init(&p->conn, conn_name, &conn_events, p);
  p->ev = ev;
  p->ctx = ctx;
  p->frame_max = login->frame_max;
  if (login->name)
    snprintf(p->name, sizeof p->name, "%s", login->name);
  else
    snprintf(p->name, sizeof p->name, "rebound retries for %s", login->peer);
  return p;
}

static void timer_start(px_pub *p, uv_loop_t *loop, uint32_t timeout_ms) {
  uv_timer_init(loop, &p->close_timer);
  p->close_timer.data = p;
  uv_timer_start(&p->close_timer, on_timer, timeout_ms, 0);
}

px_pub *px_pub_open(uv_loop_t *loop, const struct sockaddr *addr,
                    const px_conn_io *io, const px_pub_login *login,
                    const px_pub_events *ev, void *ctx) {
  px_pub *p = pub_new(login, "retry", ev, ctx);
  if (!p)
    return NULL;
  if (io)
    p->conn.io = io;
  if (login->tls && px_tls_client(&p->conn, login->tls, login->tls_host) != 0) {
    forget_login(p);
    free(p);
    return NULL;
  }
  timer_start(p, loop, login->timeout_ms);
  p->handles = 2;
  int rc = px_conn_connect(&p->conn, loop, addr);
  if (rc != 0) {
    if (!p->conn.open)
      p->handles--; /* no handle to close */
    close_now(p);
    return NULL;
  }
  return p;
}

/* ---- dialing -----------------------------------------------------------
 */

static void dial_opened(void *ctx) {
  px_pub *p = ctx;
  p->handles++; /* the attempt's connection: its closed event follows */
}

static void dial_connected(void *ctx) {
  px_pub *p = ctx;
  if (p->state == PUB_CONNECTING)
    start_handshake(p);
}

/* Reported from the timer when it comes within px_pub_dial() (every
 * attempt failed at once): the owner has no px_pub yet. */
static void dial_failed(void *ctx) {
  px_pub *p = ctx;
  if (!p->starting) {
    fail(p, "no upstream reachable", 0, amqp_cstr(p->dial.errors));
    return;
  }
  p->dial_failed = true;
  uv_timer_start(&p->close_timer, on_timer, 0, 0);
}

static void dial_released(void *ctx) {
  handle_closed(ctx);
}

static const px_dial_events dial_events = {dial_opened, dial_connected,
                                           dial_failed, NULL, dial_released};

px_pub *px_pub_dial(uv_loop_t *loop, px_clock *clock, const px_config *cfg,
                    px_dial_memory *memory, struct px_tls_ctx *tls,
                    const px_pub_login *login, const px_pub_events *ev,
                    void *ctx) {
  px_pub *p = pub_new(login, "broker", ev, ctx);
  if (!p)
    return NULL;
  if (!login->name)
    snprintf(p->name, sizeof p->name, "rebound");
  timer_start(p, loop, login->timeout_ms);
  p->handles = 2; /* the timer, the dialer */
  p->dialing = p->starting = true;
  px_dial_start(&p->dial, loop, clock, cfg, memory, tls, &p->conn,
                cfg->connect_timeout_ms, &dial_events, p, 0);
  p->starting = false;
  return p;
}

int px_pub_login_split(amqp_bytes mechanism, amqp_bytes r, amqp_bytes *user,
                       amqp_bytes *password) {
  amqp_field u, p;
  *user = *password = (amqp_bytes){NULL, 0};
  if (amqp_bytes_eq(mechanism, amqp_cstr("PLAIN"))) {
    const uint8_t *a = memchr(r.ptr, 0, r.len);
    const uint8_t *b =
        a ? memchr(a + 1, 0, r.len - (size_t)(a + 1 - r.ptr)) : NULL;
    if (!b)
      return -1;
    *user = (amqp_bytes){(uint8_t *)a + 1, (size_t)(b - a - 1)};
    *password = (amqp_bytes){(uint8_t *)b + 1, r.len - (size_t)(b + 1 - r.ptr)};
    return memchr(password->ptr, 0, password->len) ? -1 : 0;
  }
  if (!amqp_bytes_eq(mechanism, amqp_cstr("AMQPLAIN")))
    return -1;
  if (amqp_table_get(r, amqp_cstr("LOGIN"), &u) == AMQP_OK && u.type == 'S')
    *user = u.v.bytes;
  if (amqp_table_get(r, amqp_cstr("PASSWORD"), &p) != AMQP_OK ||
      p.type != 'S' || !user->ptr)
    return -1;
  *password = p.v.bytes;
  return 0;
}

uint32_t px_pub_frame_max(const px_pub *p) {
  return p->frame_max;
}
