/* px_pub.c - the upstream connection a session publishes its copies on
 * (px_pub.h).
 *
 * States: connecting -> handshake (start, tune, open sent in turn) ->
 * open -> closed. Input is parsed from one growable buffer; output is one
 * uv_write per px_pub_write(), copied.
 */
#define _DEFAULT_SOURCE /* explicit_bzero */
#include "px_pub.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The largest frame the broker may send here: rebound's own channel only
 * gets confirms, returns (with the returned copy) and closes. */
#define PUB_FRAME_LIMIT (4u * 1024 * 1024 + 4096)
#define PUB_READ_MIN 16384
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
  uv_tcp_t tcp;
  uv_timer_t close_timer;
  unsigned handles; /* open: the socket, the timer */
  uv_connect_t connect_req;
  pub_state state;
  bool lost; /* the lost event was sent */
  const px_pub_events *ev;
  void *ctx;
  uint8_t *in;
  size_t in_len, in_cap;
  size_t pending;
  uint32_t frame_max;
  char name[96];
  uint8_t *login;      /* mechanism, response, locale, vhost back to back */
  px_pub *prev, *next; /* in `closing` while PUB_CLOSING */
  amqp_bytes mechanism, response, locale, vhost;
};

typedef struct pub_write {
  uv_write_t req;
  px_pub *p;
  size_t len;
  bool secret; /* the start-ok: wiped once written */
  uint8_t data[];
} pub_write;

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

static void on_closed(uv_handle_t *h) {
  px_pub *p = h->data;
  if (--p->handles)
    return;
  free(p->in);
  forget_login(p);
  free(p);
}

/* Connections saying goodbye (the process is single-threaded). */
static px_pub *closing;

static void close_now(px_pub *p) {
  if (p->state == PUB_CLOSING) {
    if (p->prev)
      p->prev->next = p->next;
    else
      closing = p->next;
    if (p->next)
      p->next->prev = p->prev;
  }
  p->state = PUB_CLOSED;
  uv_close((uv_handle_t *)&p->tcp, on_closed);
  uv_close((uv_handle_t *)&p->close_timer, on_closed);
}

static void fail(px_pub *p, const char *why, amqp_bytes text);

/* The timer: the login's deadline, then the wait for close-ok. */
static void on_timer(uv_timer_t *t) {
  px_pub *p = t->data;
  if (p->state == PUB_CLOSING)
    close_now(p);
  else if (p->state == PUB_CONNECTING || p->state == PUB_HANDSHAKE)
    fail(p, "login timed out", amqp_cstr(""));
}

static int write_method(px_pub *p, uint16_t ch, const amqp_method *m,
                        bool secret);

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
  if (p->state != PUB_OPEN || p->lost || write_method(p, 0, &m, false) != 0) {
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

size_t px_pub_pending(const px_pub *p) {
  return p->pending;
}

/* Tell the owner once; it closes. */
static void fail(px_pub *p, const char *why, amqp_bytes text) {
  if (p->lost || !p->ev)
    return;
  p->lost = true;
  p->ev->lost(p->ctx, why, text);
}

static void on_write(uv_write_t *req, int status) {
  pub_write *w = (pub_write *)req;
  px_pub *p = w->p;
  p->pending -= w->len;
  if (w->secret)
    wipe(w->data, w->len);
  free(w);
  if (status < 0 && p->state == PUB_CLOSING)
    close_now(p);
  else if (status < 0 && p->state != PUB_CLOSED)
    fail(p, "write failed", amqp_cstr(uv_strerror(status)));
}

static int pub_write_frame(px_pub *p, const uint8_t *data, size_t len,
                           bool secret);

int px_pub_write(px_pub *p, const uint8_t *data, size_t len) {
  return pub_write_frame(p, data, len, false);
}

static int pub_write_frame(px_pub *p, const uint8_t *data, size_t len,
                           bool secret) {
  if (p->state == PUB_CLOSED || p->state == PUB_CONNECTING ||
      (p->state == PUB_CLOSING && p->ev))
    return -1;
  pub_write *w = malloc(sizeof *w + len);
  if (!w)
    return -1;
  w->p = p;
  w->len = len;
  w->secret = secret;
  memcpy(w->data, data, len);
  uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)len);
  if (uv_write(&w->req, (uv_stream_t *)&p->tcp, &b, 1, on_write) != 0) {
    free(w);
    return -1;
  }
  p->pending += len;
  return 0;
}

static int write_method(px_pub *p, uint16_t ch, const amqp_method *m,
                        bool secret) {
  uint8_t buf[PUB_LOGIN_MAX + 1024];
  long n = amqp_method_frame_write(buf, sizeof buf, ch, m);
  int rc = n < 0 ? -1 : pub_write_frame(p, buf, (size_t)n, secret);
  if (secret)
    wipe(buf, sizeof buf);
  return rc;
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
  return write_method(p, 0, &m, true);
}

static int send_tune_ok_open(px_pub *p, const amqp_method *tune) {
  uint32_t offer = (uint32_t)tune->args[AMQP_F_CONNECTION_TUNE_FRAME_MAX].u;
  amqp_method m;
  amqp_method_init(&m, AMQP_CONNECTION_TUNE_OK);
  m.args[AMQP_F_CONNECTION_TUNE_OK_CHANNEL_MAX].u = 1;
  m.args[AMQP_F_CONNECTION_TUNE_OK_FRAME_MAX].u =
      offer && offer < p->frame_max ? offer : p->frame_max;
  m.args[AMQP_F_CONNECTION_TUNE_OK_HEARTBEAT].u = 0;
  if (write_method(p, 0, &m, false) != 0)
    return -1;
  amqp_method_init(&m, AMQP_CONNECTION_OPEN);
  m.args[AMQP_F_CONNECTION_OPEN_VIRTUAL_HOST].b = p->vhost;
  return write_method(p, 0, &m, false);
}

/* A method on channel 0. */
static void connection_method(px_pub *p, const amqp_frame *f) {
  amqp_method m;
  if (amqp_method_decode_flags(f->payload, &m, AMQP_DECODE_OPAQUE_TABLES) !=
      AMQP_OK) {
    fail(p, "the broker sent a bad frame", amqp_cstr(""));
    return;
  }
  int rc = 0;
  switch (m.id) {
  case AMQP_CONNECTION_START:
    rc = send_start_ok(p);
    break;
  case AMQP_CONNECTION_SECURE:
    fail(p, "the broker asks for a challenge response", amqp_cstr(""));
    return;
  case AMQP_CONNECTION_TUNE:
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
    write_method(p, 0, &m, false);
    amqp_method_decode_flags(f->payload, &m, AMQP_DECODE_OPAQUE_TABLES);
    fail(p, "the broker closed it",
         m.args[AMQP_F_CONNECTION_CLOSE_REPLY_TEXT].b);
    return;
  default:
    return;
  }
  if (rc != 0)
    fail(p, "out of memory", amqp_cstr(""));
}

/* ---- input -------------------------------------------------------------
 */

/* Closing: the broker's close-ok (or its own close) ends it. */
static void parse_closing(px_pub *p) {
  size_t off = 0;
  amqp_frame f;
  long n;
  while ((n = amqp_frame_parse(p->in + off, p->in_len - off, PUB_FRAME_LIMIT,
                               &f)) > 0) {
    off += (size_t)n;
    uint32_t id =
        f.type == AMQP_FRAME_METHOD ? amqp_method_peek_id(f.payload) : 0;
    if (f.channel == 0 &&
        (id == AMQP_CONNECTION_CLOSE_OK || id == AMQP_CONNECTION_CLOSE)) {
      close_now(p);
      return;
    }
  }
  if (n != AMQP_PARTIAL) {
    close_now(p);
    return;
  }
  memmove(p->in, p->in + off, p->in_len - off);
  p->in_len -= off;
}

static void parse(px_pub *p) {
  size_t off = 0;
  if (p->state == PUB_CLOSING) {
    parse_closing(p);
    return;
  }
  while (p->ev && !p->lost) {
    amqp_frame f;
    long n =
        amqp_frame_parse(p->in + off, p->in_len - off, PUB_FRAME_LIMIT, &f);
    if (n == AMQP_PARTIAL)
      break;
    if (n < 0) {
      fail(p, "the broker sent a bad frame",
           amqp_cstr(amqp_status_str((int)n)));
      return;
    }
    off += (size_t)n;
    if (f.type == AMQP_FRAME_HEARTBEAT)
      continue;
    if (f.channel == 0 && f.type == AMQP_FRAME_METHOD)
      connection_method(p, &f);
    else if (f.channel != 0 && p->state == PUB_OPEN)
      p->ev->frame(p->ctx, &f);
  }
  if (p->state == PUB_CLOSED)
    return;
  memmove(p->in, p->in + off, p->in_len - off);
  p->in_len -= off;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  px_pub *p = h->data;
  (void)suggested;
  if (p->in_cap - p->in_len < PUB_READ_MIN &&
      p->in_cap < PUB_FRAME_LIMIT + PUB_READ_MIN) {
    size_t cap = p->in_cap ? p->in_cap * 2 : PUB_READ_MIN * 2;
    uint8_t *in = realloc(p->in, cap);
    if (in) {
      p->in = in;
      p->in_cap = cap;
    }
  }
  *buf =
      uv_buf_init((char *)p->in + p->in_len, (unsigned)(p->in_cap - p->in_len));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  px_pub *p = st->data;
  (void)buf;
  if (p->state == PUB_CLOSED || nread == 0)
    return;
  if (nread < 0 && p->state == PUB_CLOSING) {
    close_now(p);
    return;
  }
  if (nread < 0) {
    fail(p, nread == UV_EOF ? "the broker closed it" : "read failed",
         amqp_cstr(nread == UV_EOF ? "" : uv_strerror((int)nread)));
    return;
  }
  p->in_len += (size_t)nread;
  parse(p);
}

static void on_connect(uv_connect_t *req, int status) {
  px_pub *p = req->data;
  if (p->state == PUB_CLOSED || p->state == PUB_CLOSING)
    return;
  if (status < 0) {
    fail(p, "connect failed", amqp_cstr(uv_strerror(status)));
    return;
  }
  p->state = PUB_HANDSHAKE;
  uv_tcp_nodelay(&p->tcp, 1);
  uv_tcp_keepalive(&p->tcp, 1, 30);
  static const uint8_t header[] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
  if (px_pub_write(p, header, sizeof header) != 0 ||
      uv_read_start((uv_stream_t *)&p->tcp, on_alloc, on_read) != 0)
    fail(p, "out of memory", amqp_cstr(""));
}

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

px_pub *px_pub_open(uv_loop_t *loop, const struct sockaddr *addr,
                    const px_pub_login *login, const px_pub_events *ev,
                    void *ctx) {
  px_pub *p = calloc(1, sizeof *p);
  if (!p || keep_login(p, login) != 0 || uv_tcp_init(loop, &p->tcp) != 0) {
    if (p)
      free(p->login);
    free(p);
    return NULL;
  }
  uv_timer_init(loop, &p->close_timer);
  p->handles = 2;
  p->tcp.data = p->close_timer.data = p;
  p->ev = ev;
  p->ctx = ctx;
  p->frame_max = login->frame_max;
  snprintf(p->name, sizeof p->name, "rebound retries for %s", login->peer);
  p->connect_req.data = p;
  if (uv_tcp_connect(&p->connect_req, &p->tcp, addr, on_connect) != 0) {
    close_now(p);
    return NULL;
  }
  uv_timer_start(&p->close_timer, on_timer, login->timeout_ms, 0);
  return p;
}
