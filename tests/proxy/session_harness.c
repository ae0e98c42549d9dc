/* session_harness.c - one session over fake transports (session_harness.h).
 */
#include "session_harness.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "px_buf.h"
#include "px_log.h"

/* ---- failures ------------------------------------------------------------ */

static h_fail_fn fail_fn;

void h_on_fail(h_fail_fn fn) {
  fail_fn = fn;
}

void h_fail(const char *file, int line, const char *fmt, ...) {
  char msg[8192];
  int n = snprintf(msg, sizeof msg, "%s:%d: ", file, line);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
  va_end(ap);
  if (fail_fn)
    fail_fn(msg); /* a cmocka test does not come back */
  fprintf(stderr, "%s\n", msg);
  abort();
}

#define FAIL(...) h_fail(__FILE__, __LINE__, __VA_ARGS__)

/* ---- set up, step, tear down ------------------------------------------- */

static px_log_level test_log_level(void) {
  const char *v = getenv("REBOUND_TEST_LOG");
  px_log_level l;
  if (v && px_log_level_parse(v, &l) == 0)
    return l;
  return (px_log_level)(PX_LOG_ERROR + 1); /* above every level: silent */
}

/* The session is freed once its transports have delivered their closed
 * events and its timers are closed (px_session.c); the retry connection
 * may outlive it. */
static void on_session_gone(px_server *srv) {
  harness *h = (harness *)(void *)((char *)srv - offsetof(harness, srv));
  h->s = NULL;
}

harness *h_new(const char *const *args) {
  static const char *const defaults[] = {
      "rebound", "--upstream", "127.0.0.1:5672", "--retry-connection", "shared",
      "--admin", "off"};
  enum { ND = sizeof defaults / sizeof defaults[0] };
  char *argv[64];
  int argc = 0;
  char err[512];

  for (int i = 0; i < ND; i++)
    argv[argc++] = (char *)defaults[i];
  for (int i = 0; args && args[i] && argc < 63; i++)
    argv[argc++] = (char *)args[i];
  argv[argc] = NULL;

  harness *h = calloc(1, sizeof *h);
  if (!h)
    abort();
  if (px_config_load(&h->cfg, argc, argv, NULL, err, sizeof err) !=
      PX_CONFIG_OK) {
    fprintf(stderr, "session_harness: config: %s\n", err);
    free(h);
    return NULL;
  }
  px_log_set_level(test_log_level());
  if (uv_loop_init(&h->loop) != 0)
    abort();
  h->srv.loop = &h->loop;
  h->srv.cfg = &h->cfg;
  h->srv.spare_fd = -1;
  h->srv.stopped = true; /* nothing of the server's own runs here */
  h->srv.max_connections = 1;
  h->srv.cache_total = h->cfg.cache_total; /* one worker */
  px_clock_init(&h->srv.clock, NULL);      /* set by the tests (h_wait_ms) */
  h->srv.started_ms = px_clock_ms(&h->srv.clock);
  fake_init(&h->peer[H_CLIENT], "client");
  fake_init(&h->peer[H_BROKER], "broker");
  fake_init(&h->peer[H_PUB], "retry");
  h->srv.pub_io = fake_io(&h->peer[H_PUB]);
  h->srv.session_gone = on_session_gone;
  h->s = px_session_new(&h->srv, fake_io(&h->peer[H_CLIENT]),
                        fake_io(&h->peer[H_BROKER]));
  if (!h->s)
    abort();
  return h;
}

bool h_step(harness *h) {
  uv_run(&h->loop, UV_RUN_NOWAIT);
  px_clock_run(&h->srv.clock); /* what a callback started to run at once */
  bool did = fake_step(&h->peer[H_CLIENT]);
  did |= fake_step(&h->peer[H_BROKER]);
  did |= fake_step(&h->peer[H_PUB]);
  return did;
}

void h_settle(harness *h) {
  for (int i = 0; i < 100000; i++) {
    if (!h_step(h) && !fake_busy(&h->peer[H_CLIENT]) &&
        !fake_busy(&h->peer[H_BROKER]) && !fake_busy(&h->peer[H_PUB])) {
      uv_run(&h->loop, UV_RUN_NOWAIT); /* close callbacks */
      return;
    }
  }
  FAIL("the session never settles");
}

/* The session's clock moves only here: to each deadline before `end` in
 * turn, the peers settling at each, then to `end`. stop(h) ends the wait
 * early. Returns whether it did. */
static bool pass_time(harness *h, uint64_t ms,
                      bool (*stop)(harness *h, h_side side), h_side side) {
  px_clock *c = &h->srv.clock;
  uint64_t end = px_clock_ms(c) + ms;
  for (;;) {
    h_settle(h);
    if (stop && stop(h, side))
      return true;
    uint64_t next = px_clock_next(c), now = px_clock_ms(c);
    if (now >= end)
      return false;
    px_clock_advance(c, (next < end ? next : end) - now);
  }
}

void h_wait_ms(harness *h, unsigned ms) {
  pass_time(h, ms, NULL, H_CLIENT);
}

static bool unread_frame(harness *h, h_side side) {
  char line[512];
  size_t rd = h->rd[side];
  bool any = h_next(h, side, line, sizeof line, NULL, NULL);
  h->rd[side] = rd;
  return any;
}

bool h_wait_frame(harness *h, h_side side, unsigned ms) {
  return pass_time(h, ms, unread_frame, side);
}

static bool gone(harness *h, h_side side) {
  (void)side;
  return !h->s;
}

bool h_wait_gone(harness *h, unsigned ms) {
  return pass_time(h, ms, gone, H_CLIENT);
}

void h_free(harness *h) {
  if (!h)
    return;
  if (h->s) {
    px_session_close(h->s, PX_CR_CLOSE_TIMEOUT);
    if (!h_wait_gone(h, 10000))
      FAIL("the session is not freed after px_session_close");
  }
  px_pub_close_all(); /* a retry connection still saying goodbye */
  for (int i = 0; i < 4; i++) {
    uv_run(&h->loop, UV_RUN_NOWAIT);
    px_clock_run(&h->srv.clock);
    fake_step(&h->peer[H_PUB]);
  }
  if (uv_loop_close(&h->loop) != 0)
    FAIL("handles left on the loop after the session was freed");
  px_metrics_free(&h->srv);
  px_server_free(&h->srv);
  fake_free(&h->peer[H_CLIENT]);
  fake_free(&h->peer[H_BROKER]);
  fake_free(&h->peer[H_PUB]);
  for (unsigned i = 0; i < h->nbufs; i++) {
    hb_free(h->bufs[i]);
    free(h->bufs[i]);
  }
  free(h);
  px_chunk_pool_drain();
  px_conn_out_pool_drain();
}

/* ---- what the peers send ------------------------------------------------ */

fake_conn *h_peer(harness *h, h_side side) {
  return &h->peer[side];
}

void h_send(harness *h, h_side from, const void *p, size_t len) {
  fake_send(&h->peer[from], p, len);
}

void h_sendb(harness *h, h_side from, hbuf *b) {
  h_send(h, from, b->p, b->len);
  b->len = 0;
}

void h_eof(harness *h, h_side from, int err) {
  fake_send_eof(&h->peer[from], err);
}

/* ---- building frames ---------------------------------------------------- */

static uint8_t *hb_room(hbuf *b, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n)
      cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p)
      abort();
    b->p = p;
    b->cap = cap;
  }
  return b->p + b->len;
}

void hb_free(hbuf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

hbuf *h_buf(harness *h) {
  if (h->nbufs == sizeof h->bufs / sizeof h->bufs[0])
    FAIL("too many h_buf() buffers");
  hbuf *b = calloc(1, sizeof *b);
  if (!b)
    abort();
  h->bufs[h->nbufs++] = b;
  return b;
}

void hb_raw(hbuf *b, const void *p, size_t len) {
  memcpy(hb_room(b, len), p, len);
  b->len += len;
}

void hb_method(hbuf *b, uint16_t ch, const amqp_method *m) {
  uint8_t *p = hb_room(b, 65536);
  long n = amqp_method_frame_write(p, 65536, ch, m);
  if (n < 0)
    FAIL("cannot encode %s: %s", m->desc ? m->desc->name : "?",
         amqp_status_str((int)n));
  b->len += (size_t)n;
}

void hb_header(hbuf *b, uint16_t ch, uint64_t body_size,
               const amqp_props *props) {
  uint8_t payload[65536];
  amqp_content_header hd = {.class_id = 60, .body_size = body_size};
  if (props)
    hd.props = *props;
  amqp_writer w = amqp_writer_make(payload, sizeof payload);
  if (amqp_content_header_encode(&hd, &w) != AMQP_OK || w.failed)
    FAIL("cannot encode a content header");
  uint8_t *p = hb_room(b, w.len + AMQP_FRAME_OVERHEAD);
  long n = amqp_frame_write(p, w.len + AMQP_FRAME_OVERHEAD, AMQP_FRAME_HEADER,
                            ch, (amqp_bytes){payload, w.len});
  if (n < 0)
    FAIL("cannot write a content header frame");
  b->len += (size_t)n;
}

void hb_body(hbuf *b, uint16_t ch, const void *p, size_t len) {
  uint8_t *o = hb_room(b, len + AMQP_FRAME_OVERHEAD);
  long n = amqp_frame_write(o, len + AMQP_FRAME_OVERHEAD, AMQP_FRAME_BODY, ch,
                            (amqp_bytes){p, len});
  if (n < 0)
    FAIL("cannot write a body frame");
  b->len += (size_t)n;
}

void hb_heartbeat(hbuf *b, uint16_t ch) {
  uint8_t *o = hb_room(b, AMQP_FRAME_OVERHEAD);
  long n = amqp_frame_write(o, AMQP_FRAME_OVERHEAD, AMQP_FRAME_HEARTBEAT, ch,
                            (amqp_bytes){NULL, 0});
  if (n < 0)
    FAIL("cannot write a heartbeat frame");
  b->len += (size_t)n;
}

void h_method(harness *h, h_side from, uint16_t ch, const amqp_method *m) {
  hbuf b = {0};
  hb_method(&b, ch, m);
  h_sendb(h, from, &b);
  hb_free(&b);
}

static void init(amqp_method *m, uint32_t id) {
  if (amqp_method_init(m, id) != AMQP_OK)
    FAIL("unknown method %08x", (unsigned)id);
}

void h_simple(harness *h, h_side from, uint16_t ch, uint32_t id) {
  amqp_method m;
  init(&m, id);
  h_method(h, from, ch, &m);
}

void h_ack(harness *h, h_side from, uint16_t ch, uint64_t tag, bool multiple) {
  amqp_method m;
  init(&m, AMQP_BASIC_ACK);
  m.args[AMQP_F_BASIC_ACK_DELIVERY_TAG].u = tag;
  m.args[AMQP_F_BASIC_ACK_MULTIPLE].u = multiple;
  h_method(h, from, ch, &m);
}

void h_nack(harness *h, h_side from, uint16_t ch, uint64_t tag, bool multiple,
            bool requeue) {
  amqp_method m;
  init(&m, AMQP_BASIC_NACK);
  m.args[AMQP_F_BASIC_NACK_DELIVERY_TAG].u = tag;
  m.args[AMQP_F_BASIC_NACK_MULTIPLE].u = multiple;
  m.args[AMQP_F_BASIC_NACK_REQUEUE].u = requeue;
  h_method(h, from, ch, &m);
}

void h_reject(harness *h, h_side from, uint16_t ch, uint64_t tag,
              bool requeue) {
  amqp_method m;
  init(&m, AMQP_BASIC_REJECT);
  m.args[AMQP_F_BASIC_REJECT_DELIVERY_TAG].u = tag;
  m.args[AMQP_F_BASIC_REJECT_REQUEUE].u = requeue;
  h_method(h, from, ch, &m);
}

void h_close(harness *h, h_side from, uint16_t ch, uint16_t code,
             const char *text) {
  amqp_method m;
  if (ch == 0) {
    init(&m, AMQP_CONNECTION_CLOSE);
    m.args[AMQP_F_CONNECTION_CLOSE_REPLY_CODE].u = code;
    m.args[AMQP_F_CONNECTION_CLOSE_REPLY_TEXT].b = amqp_cstr(text);
  } else {
    init(&m, AMQP_CHANNEL_CLOSE);
    m.args[AMQP_F_CHANNEL_CLOSE_REPLY_CODE].u = code;
    m.args[AMQP_F_CHANNEL_CLOSE_REPLY_TEXT].b = amqp_cstr(text);
  }
  h_method(h, from, ch, &m);
}

void h_close_ok(harness *h, h_side from, uint16_t ch) {
  h_simple(h, from, ch,
           ch == 0 ? AMQP_CONNECTION_CLOSE_OK : AMQP_CHANNEL_CLOSE_OK);
}

void hb_deliver(hbuf *b, uint16_t ch, const char *ctag, uint64_t tag,
                bool redelivered) {
  amqp_method m;
  init(&m, AMQP_BASIC_DELIVER);
  m.args[AMQP_F_BASIC_DELIVER_CONSUMER_TAG].b = amqp_cstr(ctag);
  m.args[AMQP_F_BASIC_DELIVER_DELIVERY_TAG].u = tag;
  m.args[AMQP_F_BASIC_DELIVER_REDELIVERED].u = redelivered;
  m.args[AMQP_F_BASIC_DELIVER_EXCHANGE].b = amqp_cstr("");
  m.args[AMQP_F_BASIC_DELIVER_ROUTING_KEY].b = amqp_cstr("q");
  hb_method(b, ch, &m);
}

void h_deliver(harness *h, uint16_t ch, const char *ctag, uint64_t tag,
               const amqp_props *props, const void *body, size_t len) {
  hbuf b = {0};
  hb_deliver(&b, ch, ctag, tag, false);
  hb_header(&b, ch, len, props);
  if (len)
    hb_body(&b, ch, body, len);
  h_sendb(h, H_BROKER, &b);
  hb_free(&b);
}

/* ---- scripted sequences ------------------------------------------------- */

static void put_string(amqp_writer *w, const char *key, const char *value) {
  amqp_field f = amqp_field_string(amqp_cstr(value));
  amqp_table_write_entry(w, amqp_cstr(key), &f);
}

static void send_handshake(harness *h, h_side side, int step,
                           uint16_t channel_max, uint32_t frame_max) {
  amqp_method m;
  uint8_t props[256];
  amqp_writer w = amqp_writer_make(props, sizeof props);
  switch (step) {
  case 0:
    h_send(h, H_CLIENT, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE);
    return;
  case 1:
    put_string(&w, "product", "RabbitMQ");
    put_string(&w, "version", "3.10.8");
    init(&m, AMQP_CONNECTION_START);
    m.args[AMQP_F_CONNECTION_START_VERSION_MINOR].u = 9;
    m.args[AMQP_F_CONNECTION_START_SERVER_PROPERTIES].b =
        (amqp_bytes){props, w.len};
    m.args[AMQP_F_CONNECTION_START_MECHANISMS].b = amqp_cstr("AMQPLAIN PLAIN");
    m.args[AMQP_F_CONNECTION_START_LOCALES].b = amqp_cstr("en_US");
    break;
  case 2:
    init(&m, AMQP_CONNECTION_START_OK);
    m.args[AMQP_F_CONNECTION_START_OK_MECHANISM].b = amqp_cstr("PLAIN");
    m.args[AMQP_F_CONNECTION_START_OK_RESPONSE].b =
        (amqp_bytes){(const uint8_t *)"\0guest\0guest", 12};
    m.args[AMQP_F_CONNECTION_START_OK_LOCALE].b = amqp_cstr("en_US");
    break;
  case 3:
    init(&m, AMQP_CONNECTION_TUNE);
    m.args[AMQP_F_CONNECTION_TUNE_CHANNEL_MAX].u = channel_max;
    m.args[AMQP_F_CONNECTION_TUNE_FRAME_MAX].u = frame_max;
    break;
  case 4:
    init(&m, AMQP_CONNECTION_TUNE_OK);
    m.args[AMQP_F_CONNECTION_TUNE_OK_CHANNEL_MAX].u = channel_max;
    m.args[AMQP_F_CONNECTION_TUNE_OK_FRAME_MAX].u = frame_max;
    break;
  case 5:
    init(&m, AMQP_CONNECTION_OPEN);
    m.args[AMQP_F_CONNECTION_OPEN_VIRTUAL_HOST].b = amqp_cstr("/");
    break;
  default:
    init(&m, AMQP_CONNECTION_OPEN_OK);
    break;
  }
  h_method(h, side, 0, &m);
}

static const h_side handshake_side[7] = {H_CLIENT, H_BROKER, H_CLIENT, H_BROKER,
                                         H_CLIENT, H_CLIENT, H_BROKER};

void h_open_unchecked(harness *h, uint16_t channel_max, uint32_t frame_max) {
  h->channel_max = channel_max;
  h->frame_max = frame_max;
  for (int i = 0; i < 7; i++) {
    send_handshake(h, handshake_side[i], i, channel_max, frame_max);
    h_settle(h);
  }
}

static const char *side_name(h_side side);

/* rebound opens its channel on `side` (channel.open, confirm.select), and
 * the peer answers both: h->own_ch is its number. */
static void own_channel_opened(harness *h, h_side side) {
  char line[512];
  unsigned n = 0;
  h_settle(h);
  if (!h_next(h, side, line, sizeof line, NULL, NULL) ||
      sscanf(line, "ch%u channel.open", &n) != 1 ||
      !strstr(line, "channel.open"))
    FAIL("rebound's channel.open expected on %s, got '%s'", side_name(side),
         line);
  h->own_ch = (uint16_t)n;
  h_simple(h, side, h->own_ch, AMQP_CHANNEL_OPEN_OK);
  snprintf(line, sizeof line, "ch%u confirm.select", n);
  h_expect(h, side, line);
  h_simple(h, side, h->own_ch, AMQP_CONFIRM_SELECT_OK);
}

static uint16_t open_from(harness *h, int first, uint16_t channel_max,
                          uint32_t frame_max);

uint16_t h_open(harness *h, uint16_t channel_max, uint32_t frame_max) {
  return open_from(h, 0, channel_max, frame_max);
}

uint16_t h_open_after_header(harness *h, uint16_t channel_max,
                             uint32_t frame_max) {
  return open_from(h, 1, channel_max, frame_max);
}

static uint16_t open_from(harness *h, int first, uint16_t channel_max,
                          uint32_t frame_max) {
  static const char *const seen[7] = {"protocol-header",
                                      "ch0 connection.start",
                                      "ch0 connection.start-ok",
                                      NULL,
                                      NULL,
                                      "ch0 connection.open",
                                      "ch0 connection.open-ok"};
  char tune[128];
  h->channel_max = channel_max;
  h->frame_max = frame_max;
  for (int i = first; i < 7; i++) {
    send_handshake(h, handshake_side[i], i, channel_max, frame_max);
    snprintf(tune, sizeof tune,
             "ch0 connection.tune%s channel-max=%u frame-max=%u heartbeat=0",
             i == 4 ? "-ok" : "", (unsigned)channel_max, (unsigned)frame_max);
    h_expect(h, handshake_side[i] == H_CLIENT ? H_BROKER : H_CLIENT,
             seen[i] ? seen[i] : tune);
  }
  h->own_ch = 0;
  if (h->cfg.retry_shared)
    own_channel_opened(h, H_BROKER);
  h_expect_none(h, H_CLIENT);
  h_expect_none(h, H_BROKER);
  return h->own_ch;
}

uint16_t h_pub_open(harness *h) {
  char line[512];
  h_expect(h, H_PUB, "protocol-header");
  send_handshake(h, H_PUB, 1, 0, 0);
  h_expect(h, H_PUB, "ch0 connection.start-ok*");
  send_handshake(h, H_PUB, 3, 2047, h->frame_max);
  snprintf(line, sizeof line,
           "ch0 connection.tune-ok channel-max=1 frame-max=%u heartbeat=0",
           (unsigned)h->frame_max);
  h_expect(h, H_PUB, line);
  h_expect(h, H_PUB, "ch0 connection.open*");
  send_handshake(h, H_PUB, 6, 0, 0);
  h_settle(h);
  own_channel_opened(h, H_PUB);
  h_expect_none(h, H_PUB);
  return h->own_ch;
}

void h_channel(harness *h, uint16_t ch, uint16_t up) {
  char line[64];
  h_simple(h, H_CLIENT, ch, AMQP_CHANNEL_OPEN);
  snprintf(line, sizeof line, "ch%u channel.open", up);
  h_expect(h, H_BROKER, line);
  h_simple(h, H_BROKER, up, AMQP_CHANNEL_OPEN_OK);
  snprintf(line, sizeof line, "ch%u channel.open-ok", ch);
  h_expect(h, H_CLIENT, line);
}

void h_consume(harness *h, uint16_t ch, uint16_t up, const char *queue,
               const char *ctag) {
  char line[512];
  amqp_method m;
  init(&m, AMQP_BASIC_CONSUME);
  m.args[AMQP_F_BASIC_CONSUME_QUEUE].b = amqp_cstr(queue);
  m.args[AMQP_F_BASIC_CONSUME_CONSUMER_TAG].b = amqp_cstr(ctag);
  h_method(h, H_CLIENT, ch, &m);
  snprintf(line, sizeof line, "ch%u basic.consume queue=%s ctag=%s no-ack=0",
           up, queue, ctag);
  h_expect(h, H_BROKER, line);
  init(&m, AMQP_BASIC_CONSUME_OK);
  m.args[AMQP_F_BASIC_CONSUME_OK_CONSUMER_TAG].b = amqp_cstr(ctag);
  h_method(h, H_BROKER, up, &m);
  snprintf(line, sizeof line, "ch%u basic.consume-ok ctag=%s", ch, ctag);
  h_expect(h, H_CLIENT, line);
}

/* ---- reading the wire logs ---------------------------------------------- */

static void put_str(char **o, char *end, amqp_bytes b) {
  bool plain = b.len > 0;
  for (size_t i = 0; i < b.len; i++)
    if (b.ptr[i] <= ' ' || b.ptr[i] == '"' || b.ptr[i] >= 0x7f)
      plain = false;
  if (plain && b.len < (size_t)(end - *o)) {
    memcpy(*o, b.ptr, b.len);
    *o += b.len;
    **o = '\0';
    return;
  }
  if (b.len == 0)
    return; /* an empty value: nothing after '=' */
  if (*o < end - 1)
    *(*o)++ = '"';
  for (size_t i = 0; i < b.len && *o < end - 5; i++) {
    uint8_t c = b.ptr[i];
    if (c < ' ' || c >= 0x7f || c == '"' || c == '\\')
      *o += snprintf(*o, (size_t)(end - *o), "\\x%02x", c);
    else
      *(*o)++ = (char)c;
  }
  if (*o < end - 1)
    *(*o)++ = '"';
  **o = '\0';
}

static void put_fmt(char **o, char *end, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void put_fmt(char **o, char *end, const char *fmt, ...) {
  va_list ap;
  if (*o >= end - 1)
    return;
  va_start(ap, fmt);
  int n = vsnprintf(*o, (size_t)(end - *o), fmt, ap);
  va_end(ap);
  if (n > 0)
    *o += (size_t)n < (size_t)(end - *o) ? (size_t)n : (size_t)(end - *o - 1);
}

static void describe_method(const amqp_frame *f, char *line, size_t cap) {
  char *o = line, *end = line + cap;
  uint32_t id = amqp_method_peek_id(f->payload);
  const amqp_method_desc *d = amqp_method_lookup(id);
  amqp_method m;
  put_fmt(&o, end, "ch%u ", (unsigned)f->channel);
  if (!d) {
    put_fmt(&o, end, "method %u.%u", (unsigned)AMQP_METHOD_CLASS(id),
            (unsigned)AMQP_METHOD_INDEX(id));
    return;
  }
  put_fmt(&o, end, "%s", d->name);
  if (amqp_method_decode_flags(f->payload, &m, AMQP_DECODE_OPAQUE_TABLES) !=
      AMQP_OK) {
    put_fmt(&o, end, " (undecodable)");
    return;
  }
  const amqp_arg *a = m.args;
  switch (id) {
  case AMQP_BASIC_ACK:
    put_fmt(&o, end, " tag=%llu multiple=%u",
            (unsigned long long)a[AMQP_F_BASIC_ACK_DELIVERY_TAG].u,
            (unsigned)a[AMQP_F_BASIC_ACK_MULTIPLE].u);
    break;
  case AMQP_BASIC_NACK:
    put_fmt(&o, end, " tag=%llu multiple=%u requeue=%u",
            (unsigned long long)a[AMQP_F_BASIC_NACK_DELIVERY_TAG].u,
            (unsigned)a[AMQP_F_BASIC_NACK_MULTIPLE].u,
            (unsigned)a[AMQP_F_BASIC_NACK_REQUEUE].u);
    break;
  case AMQP_BASIC_REJECT:
    put_fmt(&o, end, " tag=%llu requeue=%u",
            (unsigned long long)a[AMQP_F_BASIC_REJECT_DELIVERY_TAG].u,
            (unsigned)a[AMQP_F_BASIC_REJECT_REQUEUE].u);
    break;
  case AMQP_BASIC_DELIVER:
    put_fmt(&o, end, " tag=%llu",
            (unsigned long long)a[AMQP_F_BASIC_DELIVER_DELIVERY_TAG].u);
    break;
  case AMQP_BASIC_GET_OK:
    put_fmt(&o, end, " tag=%llu",
            (unsigned long long)a[AMQP_F_BASIC_GET_OK_DELIVERY_TAG].u);
    break;
  case AMQP_BASIC_PUBLISH:
    put_fmt(&o, end, " exchange=");
    put_str(&o, end, a[AMQP_F_BASIC_PUBLISH_EXCHANGE].b);
    put_fmt(&o, end, " rk=");
    put_str(&o, end, a[AMQP_F_BASIC_PUBLISH_ROUTING_KEY].b);
    put_fmt(&o, end, " mandatory=%u",
            (unsigned)a[AMQP_F_BASIC_PUBLISH_MANDATORY].u);
    break;
  case AMQP_BASIC_CONSUME:
    put_fmt(&o, end, " queue=");
    put_str(&o, end, a[AMQP_F_BASIC_CONSUME_QUEUE].b);
    put_fmt(&o, end, " ctag=");
    put_str(&o, end, a[AMQP_F_BASIC_CONSUME_CONSUMER_TAG].b);
    put_fmt(&o, end, " no-ack=%u", (unsigned)a[AMQP_F_BASIC_CONSUME_NO_ACK].u);
    break;
  case AMQP_BASIC_CANCEL:
    put_fmt(&o, end, " ctag=");
    put_str(&o, end, a[AMQP_F_BASIC_CANCEL_CONSUMER_TAG].b);
    put_fmt(&o, end, " no-wait=%u", (unsigned)a[AMQP_F_BASIC_CANCEL_NO_WAIT].u);
    break;
  case AMQP_BASIC_CONSUME_OK:
    put_fmt(&o, end, " ctag=");
    put_str(&o, end, a[AMQP_F_BASIC_CONSUME_OK_CONSUMER_TAG].b);
    break;
  case AMQP_QUEUE_DECLARE:
    put_fmt(&o, end, " queue=");
    put_str(&o, end, a[AMQP_F_QUEUE_DECLARE_QUEUE].b);
    break;
  case AMQP_CHANNEL_CLOSE:
  case AMQP_CONNECTION_CLOSE: {
    bool conn = id == AMQP_CONNECTION_CLOSE;
    uint64_t cls = a[conn ? AMQP_F_CONNECTION_CLOSE_CLASS_ID
                          : AMQP_F_CHANNEL_CLOSE_CLASS_ID]
                       .u;
    uint64_t mid = a[conn ? AMQP_F_CONNECTION_CLOSE_METHOD_ID
                          : AMQP_F_CHANNEL_CLOSE_METHOD_ID]
                       .u;
    put_fmt(&o, end, " code=%u text=",
            (unsigned)a[conn ? AMQP_F_CONNECTION_CLOSE_REPLY_CODE
                             : AMQP_F_CHANNEL_CLOSE_REPLY_CODE]
                .u);
    put_str(&o, end,
            a[conn ? AMQP_F_CONNECTION_CLOSE_REPLY_TEXT
                   : AMQP_F_CHANNEL_CLOSE_REPLY_TEXT]
                .b);
    if (cls || mid)
      put_fmt(&o, end, " method=%u.%u", (unsigned)cls, (unsigned)mid);
    break;
  }
  case AMQP_CONNECTION_TUNE:
  case AMQP_CONNECTION_TUNE_OK:
    put_fmt(&o, end, " channel-max=%u frame-max=%u heartbeat=%u",
            (unsigned)a[0].u, (unsigned)a[1].u, (unsigned)a[2].u);
    break;
  }
}

long h_describe(const uint8_t *p, size_t len, char *line, size_t cap) {
  amqp_frame f;
  long n = amqp_frame_parse(p, len, 0, &f);
  if (n == AMQP_PARTIAL)
    return 0;
  if (n < 0) {
    snprintf(line, cap, "bad-frame (%s)", amqp_status_str((int)n));
    return -1;
  }
  switch (f.type) {
  case AMQP_FRAME_METHOD:
    describe_method(&f, line, cap);
    break;
  case AMQP_FRAME_HEADER:
    snprintf(line, cap, "ch%u header size=%llu", (unsigned)f.channel,
             (unsigned long long)amqp_content_header_peek_size(f.payload));
    break;
  case AMQP_FRAME_BODY:
    snprintf(line, cap, "ch%u body len=%zu", (unsigned)f.channel,
             f.payload.len);
    break;
  default:
    snprintf(line, cap, "ch%u heartbeat", (unsigned)f.channel);
    break;
  }
  return n;
}

bool h_next(harness *h, h_side side, char *line, size_t cap,
            const uint8_t **raw, size_t *raw_len) {
  fake_conn *f = &h->peer[side];
  size_t rd = h->rd[side];
  size_t left = f->log_len - rd;
  line[0] = '\0';
  if (left == 0)
    return false;
  const uint8_t *p = f->log + rd;
  /* at the start of a connection (a peer's log may hold several: the retry
   * connection opened again); no frame type is 'A' */
  if (left >= 4 && memcmp(p, "AMQP", 4) == 0) {
    if (left < AMQP_PROTOCOL_HEADER_SIZE)
      return false;
    if (memcmp(p, amqp_protocol_header, AMQP_PROTOCOL_HEADER_SIZE) == 0)
      snprintf(line, cap, "protocol-header");
    else
      snprintf(line, cap, "protocol-header %02x %02x %02x %02x", p[4], p[5],
               p[6], p[7]);
    h->rd[side] += AMQP_PROTOCOL_HEADER_SIZE;
    if (raw) {
      *raw = p;
      *raw_len = AMQP_PROTOCOL_HEADER_SIZE;
    }
    return true;
  }
  long n = h_describe(p, left, line, cap);
  if (n == 0)
    return false;
  size_t took = n < 0 ? left : (size_t)n;
  h->rd[side] += took;
  if (raw) {
    *raw = p;
    *raw_len = took;
  }
  return true;
}

static const char *side_name(h_side side) {
  return side == H_CLIENT   ? "the client"
         : side == H_BROKER ? "the broker"
                            : "the retry connection's broker";
}

static bool matches(const char *pattern, const char *line) {
  size_t n = strlen(pattern);
  if (n && pattern[n - 1] == '*')
    return strncmp(pattern, line, n - 1) == 0;
  return strcmp(pattern, line) == 0;
}

/* The unread lines of `side`, for a failure message (not consumed). */
static void rest(harness *h, h_side side, char *out, size_t cap) {
  size_t rd = h->rd[side], used = 0;
  char line[512];
  out[0] = '\0';
  for (int i = 0; i < 20 && h_next(h, side, line, sizeof line, NULL, NULL); i++)
    used += (size_t)snprintf(out + used, used < cap ? cap - used : 0,
                             "\n    %s", line);
  h->rd[side] = rd;
}

void h__expect(harness *h, h_side side, const char *pattern, const char *file,
               int line) {
  char got[512], more[4096];
  h_settle(h);
  if (!h_next(h, side, got, sizeof got, NULL, NULL))
    h_fail(file, line, "%s should have received '%s', got nothing",
           side_name(side), pattern);
  if (!matches(pattern, got)) {
    rest(h, side, more, sizeof more);
    h_fail(file, line, "%s should have received '%s', got '%s'; then:%s",
           side_name(side), pattern, got, more);
  }
}

void h__expect_within(harness *h, h_side side, unsigned ms, const char *pattern,
                      const char *file, int line) {
  h_wait_frame(h, side, ms);
  h__expect(h, side, pattern, file, line);
}

void h__expect_none(harness *h, h_side side, const char *file, int line) {
  char more[4096];
  h_settle(h);
  if (h->rd[side] == h->peer[side].log_len)
    return;
  rest(h, side, more, sizeof more);
  h_fail(file, line, "%s should have received nothing more, got:%s%s",
         side_name(side), more, more[0] ? "" : " a partial frame");
}

void h__expect_bytes(harness *h, h_side side, const void *p, size_t n,
                     const char *file, int line) {
  char got[512];
  const uint8_t *raw;
  size_t len;
  h_settle(h);
  if (!h_next(h, side, got, sizeof got, &raw, &len))
    h_fail(file, line,
           "%s should have received a frame of %zu bytes, got "
           "nothing",
           side_name(side), n);
  if (len != n || memcmp(raw, p, n) != 0) {
    char want[512];
    h_describe(p, n, want, sizeof want);
    h_fail(file, line,
           "%s should have received exactly '%s' (%zu bytes), got '%s' (%zu "
           "bytes)",
           side_name(side), want, n, got, len);
  }
}

void h__skip_until(harness *h, h_side side, const char *pattern,
                   const char *file, int line) {
  char got[512];
  h_settle(h);
  while (h_next(h, side, got, sizeof got, NULL, NULL))
    if (matches(pattern, got))
      return;
  h_fail(file, line, "%s never received '%s'", side_name(side), pattern);
}

unsigned h_skip(harness *h, h_side side) {
  char line[512];
  unsigned n = 0;
  while (h_next(h, side, line, sizeof line, NULL, NULL))
    n++;
  return n;
}

/* ---- counters ------------------------------------------------------------ */

uint64_t h_metric(harness *h, int id, const char *v1, const char *v2) {
  const px_metrics_store *m = &h->srv.metrics;
  for (uint32_t i = 0; i < m->n; i++) {
    const px_counter *c = &m->counters[i];
    if (c->id == id && strcmp(c->v1, v1) == 0 &&
        (!v2 || strcmp(c->v2, v2) == 0))
      return c->n;
  }
  return 0;
}

uint64_t h_closes(harness *h, const char *reason) {
  return h_metric(h, PX_M_CLOSES, reason, NULL);
}
