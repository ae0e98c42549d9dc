/* fake_broker - a tiny AMQP 0-9-1 "broker" that floods deliveries.
 *
 * Just enough of the server side for a client (or rebound in front of it)
 * to connect and consume: connection.start (PLAIN), tune (channel-max 2047,
 * frame-max 131072, heartbeat 0), open-ok; channel.open-ok, confirm
 * select-ok (publishes on a confirm channel are acked one by one),
 * basic.qos-ok, queue.declare-ok (the queue's name, 0 messages, 0
 * consumers), exchange.declare-ok, queue.bind-ok, basic.consume-ok,
 * cancel-ok, close-ok (no -ok when the method says no-wait).
 * After basic.consume it writes basic.deliver + content header
 * (delivery-mode 1) + one body frame of --body-size bytes (default 256; no
 * body frame for 0) to that consumer as fast as the socket takes them, with
 * increasing delivery tags, until the consumer goes away, or until it has
 * written --messages N deliveries to it (then the connection stays open and
 * quiet until the client closes it). Nothing is ever stored.
 *
 * Acknowledgements: a consumer without no-ack gets the prefetch count of
 * the last basic.qos on its channel (0: no limit) and never more than that
 * many deliveries outstanding; basic.ack (one tag, or multiple: every tag
 * up to it) frees room and the flood goes on (deliveries are still written
 * in blocks, as many as there is room for). No-ack consumers ignore
 * basic.qos, as RabbitMQ does.
 *
 * Publishes: every complete basic.publish (method, content header, all the
 * body bytes) is counted, and acknowledged on a confirm channel once it is
 * complete (basic.ack, the channel's next sequence number, multiple 0):
 * every message gets its own confirm, as many as a read completed written
 * together after it. Complete publishes on a confirm channel are counted
 * apart: with rebound in front of a consumer that nacks with requeue
 * (bench/pump_client --nack), they are rebound's retry copies, and the
 * basic.ack it then sends on the consumer's channel are the originals'
 * (they free prefetch room: a nacked delivery stays outstanding until its
 * ack). basic.nack and basic.reject from the client are counted, and
 * otherwise ignored (they free no room).
 *
 * One thread, poll(2), non-blocking sockets. Links nothing of rebound.
 *
 *   fake_broker [--listen 127.0.0.1:PORT] [--body-size N] [--messages N]
 *               [--block BYTES] [--timeout S] [--tls-cert F --tls-key F]
 *               [--trace]
 * (--body is the same as --body-size.) Prints "LISTENING <port>" once bound
 * (port 0 picks one). Exits after --timeout seconds (default 900) or on
 * SIGTERM/SIGINT, saying on stderr what it wrote, how many connections it
 * accepted and how many of them got as far as the protocol header (over
 * TLS: finished the handshake), then on a second line the acks and the
 * publishes it received, and on a third the publishes confirmed, the
 * nacks and rejects received and the queue.declare, exchange.declare and
 * queue.bind answered.
 *
 * --trace: every method received is logged on stderr (connection number,
 * channel, class.method; the delivery tag and bits of an ack, nack or
 * reject), to see what a client (rebound) says.
 *
 * --tls-cert/--tls-key: every connection speaks TLS (OpenSSL, non-blocking;
 * TLS 1.2 at least, no session tickets and no session cache, as RabbitMQ
 * 3.10 does: every handshake is a full one). The deliveries are encrypted
 * as they are written, 64 KiB blocks in records of up to 16 KiB.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include "bench_amqp.h"
#include "bench_tls.h"

#define MAX_FRAME (131072 + 8)

enum { P_HEADER, P_START_OK, P_TUNE_OK, P_OPEN, P_OPEN_DONE };

/* Delivery tags not yet acknowledged: tags base .. base + len - 1, each
 * with a flag (done[off + i] for tag base + i: acknowledged already, out
 * of order); `outstanding` counts those not acknowledged. */
typedef struct ack_window {
  uint8_t *done;
  size_t off, len, cap;
  uint64_t base, outstanding;
} ack_window;

typedef struct conn {
  int fd;
  SSL *ssl;             /* NULL: plain TCP */
  bool ssl_wants_write; /* OpenSSL must write before it can go on */
  int phase;
  bool close_when_flushed;
  uint8_t *in;
  size_t in_len;
  ba_buf out;
  /* flooding */
  bool flooding;
  uint16_t flood_ch;
  uint64_t next_tag;
  ba_buf block;     /* whole messages; block.off = bytes written */
  size_t *tag_offs; /* where each delivery tag sits in the block */
  size_t ntags;
  size_t msg_bytes;   /* one message (all three frames) in the block */
  size_t block_msgs;  /* messages in the block as it is now */
  uint64_t msgs_left; /* with --messages: deliveries still to write */
  /* acknowledgements (consumer without no-ack) */
  bool manual_ack;       /* the consumer acknowledges (not no-ack) */
  uint32_t prefetch;     /* deliveries outstanding at most; 0: no limit */
  uint16_t qos_ch;       /* the last basic.qos: its channel, */
  uint32_t qos_prefetch; /* and its prefetch count */
  ack_window unacked;    /* the deliveries written, not yet acknowledged */
  /* publishes: the content of the basic.publish being received */
  bool pub_open;          /* basic.publish seen, content not complete */
  uint16_t pub_ch;        /* its channel */
  bool pub_header;        /* its content header seen */
  uint64_t pub_body_left; /* body bytes still to come */
  /* publisher confirms, a few channels */
  uint16_t confirm_ch[8];
  uint64_t confirm_seq[8];
} conn;

static int body_size = 256;
static size_t block_target = 64 * 1024;
static uint64_t max_messages; /* per consumer; 0: no limit */
static volatile sig_atomic_t stop;
static uint64_t frames_flooded, messages_flooded, conns_accepted, conns_amqp;
static uint64_t acks_received, deliveries_acked, acks_unknown;
static uint64_t messages_published, frames_published;
static uint64_t messages_confirmed, nacks_received, rejects_received;
static uint64_t queue_declares, exchange_declares, queue_binds;
static bool trace;
static SSL_CTX *tls_ctx; /* --tls-cert: every connection speaks TLS */

static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

static void conn_free(conn *c) {
  SSL_free(c->ssl);
  close(c->fd);
  free(c->in);
  free(c->out.p);
  free(c->block.p);
  free(c->tag_offs);
  free(c->unacked.done);
  free(c);
}

/* ---- acknowledgements ---------------------------------------------------- */

/* Tags first .. first + n - 1 are being delivered. */
static void window_add(ack_window *w, uint64_t first, size_t n) {
  if (w->len == 0) {
    w->base = first;
    w->off = 0;
  }
  if (w->off + w->len + n > w->cap) {
    if (w->len > 0) /* compact, then grow */
      memmove(w->done, w->done + w->off, w->len);
    w->off = 0;
    while (w->len + n > w->cap) {
      w->cap = w->cap ? w->cap * 2 : 1024;
      w->done = realloc(w->done, w->cap);
      if (!w->done)
        exit(1);
    }
  }
  memset(w->done + w->off + w->len, 0, n);
  w->len += n;
  w->outstanding += n;
}

/* basic.ack: `tag`, or with `multiple` every tag up to it (0: all). */
static void window_ack(ack_window *w, uint64_t tag, bool multiple) {
  acks_received++;
  if (multiple && tag == 0)
    tag = w->base + w->len - 1;
  if (w->len == 0 || tag < w->base || tag >= w->base + w->len) {
    acks_unknown++;
    return;
  }
  size_t i = (size_t)(tag - w->base);
  for (size_t k = multiple ? 0 : i; k <= i; k++) {
    uint8_t *d = &w->done[w->off + k];
    if (*d) {
      if (!multiple)
        acks_unknown++; /* acknowledged twice */
      continue;
    }
    *d = 1;
    w->outstanding--;
    deliveries_acked++;
  }
  while (w->len > 0 && w->done[w->off]) { /* drop the acknowledged prefix */
    w->off++;
    w->len--;
    w->base++;
  }
}

/* Deliveries to write now: the rest of the block (its tags count as
 * outstanding already), or room for a new one (always without a prefetch
 * limit: no-ack, or prefetch 0). */
static bool can_deliver(const conn *c) {
  return c->flooding && (c->block.off < c->block.len || !c->prefetch ||
                         c->unacked.outstanding < c->prefetch);
}

/* ---- what the server says ----------------------------------------------- */

static void send_start(conn *c) {
  size_t at = ba_method_begin(&c->out, 0, BA_MID(10, 10));
  ba_u8(&c->out, 0);
  ba_u8(&c->out, 9);
  /* server-properties: {product: "fake_broker"} */
  ba_buf t = {0};
  ba_shortstr(&t, "product");
  ba_u8(&t, 'S');
  ba_longstr(&t, "fake_broker", 11);
  ba_longstr(&c->out, t.p, (uint32_t)t.len);
  free(t.p);
  ba_longstr(&c->out, "PLAIN AMQPLAIN", 14);
  ba_longstr(&c->out, "en_US", 5);
  ba_frame_end(&c->out, at);
}

static void send_tune(conn *c) {
  size_t at = ba_method_begin(&c->out, 0, BA_MID(10, 30));
  ba_u16(&c->out, 2047);
  ba_u32(&c->out, 131072);
  ba_u16(&c->out, 0);
  ba_frame_end(&c->out, at);
}

static void build_block(conn *c, const char *ctag) {
  size_t cap = 0;
  c->block.len = c->block.off = 0;
  c->ntags = 0;
  while (c->block.len < block_target) {
    if (c->ntags == cap) {
      cap = cap ? cap * 2 : 256;
      c->tag_offs = realloc(c->tag_offs, cap * sizeof *c->tag_offs);
      if (!c->tag_offs)
        exit(1);
    }
    /* basic.deliver: consumer-tag, delivery-tag, redelivered, exchange,
     * routing-key */
    size_t at = ba_method_begin(&c->block, c->flood_ch, BA_MID(60, 60));
    ba_shortstr(&c->block, ctag);
    c->tag_offs[c->ntags++] = c->block.len;
    ba_u64(&c->block, 0);
    ba_u8(&c->block, 0);
    ba_shortstr(&c->block, "");
    ba_shortstr(&c->block, "pump");
    ba_frame_end(&c->block, at);
    /* content header: class 60, weight 0, body size, delivery-mode 1 */
    at = ba_frame_begin(&c->block, BA_FRAME_HEADER, c->flood_ch);
    ba_u16(&c->block, 60);
    ba_u16(&c->block, 0);
    ba_u64(&c->block, (uint64_t)body_size);
    ba_u16(&c->block, 0x1000);
    ba_u8(&c->block, 1);
    ba_frame_end(&c->block, at);
    if (body_size > 0) {
      at = ba_frame_begin(&c->block, BA_FRAME_BODY, c->flood_ch);
      ba_reserve(&c->block, (size_t)body_size);
      memset(c->block.p + c->block.len, 'x', (size_t)body_size);
      c->block.len += (size_t)body_size;
      ba_frame_end(&c->block, at);
    }
  }
  c->msg_bytes = c->block.len / c->ntags; /* all messages are alike */
}

/* The next block of deliveries: new tags; with --messages, no more
 * messages than are left, and with a prefetch limit no more than there is
 * room for (the block is cut at a message boundary). */
static void refill_block(conn *c) {
  size_t n = c->ntags;
  if (max_messages && c->msgs_left < n)
    n = (size_t)c->msgs_left;
  if (c->manual_ack) {
    uint64_t out = c->unacked.outstanding;
    uint64_t room = out < c->prefetch ? c->prefetch - out : 0;
    if (c->prefetch && room < n)
      n = (size_t)room;
    window_add(&c->unacked, c->next_tag + 1, n);
  }
  for (size_t i = 0; i < n; i++)
    ba_set_u64(c->block.p + c->tag_offs[i], ++c->next_tag);
  if (max_messages)
    c->msgs_left -= n;
  c->block_msgs = n;
  c->block.len = n * c->msg_bytes;
  c->block.off = 0;
}

/* ---- what the client says ----------------------------------------------- */

static const uint8_t *skip_shortstr(const uint8_t *p, const uint8_t *end) {
  if (p >= end || p + 1 + *p > end)
    return NULL;
  return p + 1 + *p;
}

static void handle_method(conn *c, const ba_frame *f) {
  const uint8_t *a = f->payload + 4, *end = f->payload + f->size;
  uint16_t ch = f->channel;
  char name[256];

  switch (f->method) {
  case BA_MID(10, 11): /* start-ok */
    if (c->phase == P_START_OK) {
      send_tune(c);
      c->phase = P_TUNE_OK;
    }
    break;
  case BA_MID(10, 31): /* tune-ok */
    if (c->phase == P_TUNE_OK)
      c->phase = P_OPEN;
    break;
  case BA_MID(10, 40): { /* open */
    size_t at = ba_method_begin(&c->out, 0, BA_MID(10, 41));
    ba_shortstr(&c->out, "");
    ba_frame_end(&c->out, at);
    c->phase = P_OPEN_DONE;
    break;
  }
  case BA_MID(10, 50): /* connection.close */
    ba_method0(&c->out, 0, BA_MID(10, 51));
    c->flooding = false;
    c->close_when_flushed = true;
    break;
  case BA_MID(10, 51):
    c->flooding = false;
    c->close_when_flushed = true;
    break;
  case BA_MID(20, 10): { /* channel.open */
    size_t at = ba_method_begin(&c->out, ch, BA_MID(20, 11));
    ba_longstr(&c->out, "", 0);
    ba_frame_end(&c->out, at);
    break;
  }
  case BA_MID(20, 40): /* channel.close */
    if (c->flooding && c->flood_ch == ch)
      c->flooding = false;
    ba_method0(&c->out, ch, BA_MID(20, 41));
    for (int i = 0; i < 8; i++)
      if (c->confirm_ch[i] == ch)
        c->confirm_ch[i] = 0;
    break;
  case BA_MID(85, 10): /* confirm.select */
    for (int i = 0; i < 8; i++)
      if (!c->confirm_ch[i]) {
        c->confirm_ch[i] = ch;
        c->confirm_seq[i] = 0;
        break;
      }
    if (f->size < 5 || !(a[0] & 1))
      ba_method0(&c->out, ch, BA_MID(85, 11));
    break;
  case BA_MID(60, 10): /* basic.qos: prefetch-size, prefetch-count, global */
    if (f->size >= 10) {
      c->qos_ch = ch;
      c->qos_prefetch = ba_get_u16(a + 4);
    }
    ba_method0(&c->out, ch, BA_MID(60, 11));
    break;
  case BA_MID(50, 10): { /* queue.declare */
    /* reserved, queue, bits (passive, durable, exclusive, auto-delete,
     * no-wait), arguments */
    const uint8_t *q = a + 2, *after = skip_shortstr(q, end);
    queue_declares++;
    snprintf(name, sizeof name, "%.*s", after ? (int)*q : 0,
             (const char *)q + 1);
    if (!name[0])
      snprintf(name, sizeof name, "amq.gen-fake");
    if (after && after < end && (*after & 16)) /* no-wait */
      break;
    size_t at = ba_method_begin(&c->out, ch, BA_MID(50, 11));
    ba_shortstr(&c->out, name);
    ba_u32(&c->out, 0);
    ba_u32(&c->out, 0);
    ba_frame_end(&c->out, at);
    break;
  }
  case BA_MID(40, 10): { /* exchange.declare: reserved, exchange, type,
                          * bits (passive, durable, auto-delete, internal,
                          * no-wait), arguments */
    const uint8_t *x = a + 2, *t = skip_shortstr(x, end);
    const uint8_t *bits = t ? skip_shortstr(t, end) : NULL;
    exchange_declares++;
    if (!bits || bits >= end || !(*bits & 16))
      ba_method0(&c->out, ch, BA_MID(40, 11));
    break;
  }
  case BA_MID(50, 20): { /* queue.bind: reserved, queue, exchange,
                          * routing-key, no-wait, arguments */
    const uint8_t *p = skip_shortstr(a + 2, end);
    p = p ? skip_shortstr(p, end) : NULL;
    p = p ? skip_shortstr(p, end) : NULL;
    queue_binds++;
    if (!p || p >= end || !(*p & 1))
      ba_method0(&c->out, ch, BA_MID(50, 21));
    break;
  }
  case BA_MID(60, 120): /* basic.nack */
    nacks_received++;
    break;
  case BA_MID(60, 90): /* basic.reject */
    rejects_received++;
    break;
  case BA_MID(60, 20): { /* basic.consume */
    const uint8_t *q = a + 2, *t = skip_shortstr(q, end);
    const uint8_t *bits = t ? skip_shortstr(t, end) : NULL;
    if (!bits || bits >= end)
      break;
    if (*t)
      snprintf(name, sizeof name, "%.*s", (int)*t, (const char *)t + 1);
    else
      snprintf(name, sizeof name, "amq.ctag-fake-%d", c->fd);
    if (!(*bits & 8)) { /* not no-wait */
      size_t at = ba_method_begin(&c->out, ch, BA_MID(60, 21));
      ba_shortstr(&c->out, name);
      ba_frame_end(&c->out, at);
    }
    if (!c->flooding) {
      c->flooding = true;
      c->flood_ch = ch;
      c->msgs_left = max_messages;
      /* no-ack (bit 1) consumers ignore basic.qos */
      c->manual_ack = !(*bits & 2);
      c->prefetch = c->manual_ack && c->qos_ch == ch ? c->qos_prefetch : 0;
      build_block(c, name);
      refill_block(c);
    }
    break;
  }
  case BA_MID(60, 30): { /* basic.cancel */
    const uint8_t *t = a, *after = skip_shortstr(t, end);
    if (c->flooding && c->flood_ch == ch)
      c->flooding = false;
    if (after && after < end && !(*after & 1)) {
      size_t at = ba_method_begin(&c->out, ch, BA_MID(60, 31));
      ba_u8(&c->out, *t);
      ba_put(&c->out, t + 1, *t);
      ba_frame_end(&c->out, at);
    }
    break;
  }
  case BA_MID(60, 80): /* basic.ack: delivery-tag, multiple */
    if (f->size >= 13 && c->manual_ack && c->flood_ch == ch)
      window_ack(&c->unacked, ba_get_u64(a), a[8] & 1);
    else
      acks_received++;
    break;
  case BA_MID(60, 40): /* basic.publish: its content follows */
    frames_published++;
    c->pub_open = true;
    c->pub_header = false;
    c->pub_ch = ch;
    break;
  default:
    break; /* nacks, close-ok, ...: nothing to say */
  }
}

/* A content header or body frame: the content of a basic.publish (the
 * message counts once all its body bytes are in). */
static void handle_content(conn *c, const ba_frame *f) {
  if (!c->pub_open)
    return;
  frames_published++;
  if (f->type == BA_FRAME_HEADER && !c->pub_header && f->size >= 12) {
    c->pub_header = true;
    c->pub_body_left = ba_get_u64(f->payload + 4);
  } else if (f->type == BA_FRAME_BODY && c->pub_header) {
    c->pub_body_left -= f->size < c->pub_body_left ? f->size : c->pub_body_left;
  } else
    return;
  if (c->pub_body_left == 0) {
    c->pub_open = false;
    messages_published++;
    for (int i = 0; i < 8; i++) /* on a confirm channel: ack it */
      if (c->confirm_ch[i] && c->confirm_ch[i] == c->pub_ch) {
        size_t at = ba_method_begin(&c->out, c->pub_ch, BA_MID(60, 80));
        ba_u64(&c->out, ++c->confirm_seq[i]);
        ba_u8(&c->out, 0);
        ba_frame_end(&c->out, at);
        messages_confirmed++;
        break;
      }
  }
}

/* The socket, or TLS over it: read(2) and write(2) semantics (-1 with
 * EAGAIN when it would block). */
static ssize_t tls_result(conn *c, int k) {
  if (k > 0)
    return k;
  switch (SSL_get_error(c->ssl, k)) {
  case SSL_ERROR_WANT_WRITE:
    c->ssl_wants_write = true;
    /* fall through */
  case SSL_ERROR_WANT_READ:
    errno = EAGAIN;
    return -1;
  case SSL_ERROR_ZERO_RETURN:
    return 0;
  default:
    ERR_clear_error();
    errno = EIO;
    return -1;
  }
}

static ssize_t io_read(conn *c, void *d, size_t n) {
  if (!c->ssl)
    return read(c->fd, d, n);
  c->ssl_wants_write = false;
  return tls_result(c, SSL_read(c->ssl, d, (int)n));
}

static ssize_t io_write(conn *c, const void *d, size_t n) {
  if (!c->ssl)
    return write(c->fd, d, n);
  c->ssl_wants_write = false;
  return tls_result(c, SSL_write(c->ssl, d, n > 1 << 30 ? 1 << 30 : (int)n));
}

/* Returns -1 when the connection must go. */
static int conn_read(conn *c) {
  /* over TLS: until OpenSSL has nothing left, or its decrypted bytes
   * would wait with the socket quiet */
  for (int rounds = 0; rounds < 64 || c->ssl; rounds++) {
    ssize_t n = io_read(c, c->in + c->in_len, MAX_FRAME - c->in_len);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
      return 0;
    if (n <= 0)
      return -1;
    c->in_len += (size_t)n;
    size_t pos = 0;
    if (c->phase == P_HEADER) {
      if (c->in_len < 8)
        continue;
      if (memcmp(c->in, "AMQP", 4) != 0) {
        ba_put(&c->out, ba_protocol_header, 8);
        c->close_when_flushed = true;
        c->in_len = 0;
        return 0;
      }
      pos = 8;
      conns_amqp++;
      send_start(c);
      c->phase = P_START_OK;
    }
    for (;;) {
      ba_frame f;
      long k = ba_frame_parse(c->in + pos, c->in_len - pos, MAX_FRAME - 8, &f);
      if (k < 0)
        return -1;
      if (k == 0)
        break;
      if (f.type == BA_FRAME_METHOD && trace) {
        bool tagged =
            (f.method == BA_MID(60, 80) || f.method == BA_MID(60, 90) ||
             f.method == BA_MID(60, 120)) &&
            f.size >= 13;
        fprintf(stderr, "fake_broker: conn %d channel %u method %u.%u", c->fd,
                f.channel, f.method >> 16, f.method & 0xffff);
        if (tagged) /* ack, reject, nack: delivery-tag, bits */
          fprintf(stderr, " tag %llu bits %u",
                  (unsigned long long)ba_get_u64(f.payload + 4), f.payload[12]);
        fputc('\n', stderr);
      }
      if (f.type == BA_FRAME_METHOD)
        handle_method(c, &f);
      else if (f.type == BA_FRAME_HEADER || f.type == BA_FRAME_BODY)
        handle_content(c, &f);
      pos += (size_t)k;
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
  }
  return 0;
}

/* Write control frames, then deliveries (whole blocks only between
 * control frames). Returns -1 when the connection must go. */
static int conn_write(conn *c) {
  for (;;) {
    ba_buf *b;
    if (c->block.off > 0 && c->block.off < c->block.len)
      b = &c->block; /* finish a started block first */
    else if (c->out.off < c->out.len)
      b = &c->out;
    else if (can_deliver(c)) {
      if (c->block.off == c->block.len)
        refill_block(c);
      b = &c->block;
    } else
      break;
    ssize_t n = io_write(c, b->p + b->off, b->len - b->off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN)
      return 0;
    if (n <= 0)
      return -1;
    b->off += (size_t)n;
    if (b == &c->out && c->out.off == c->out.len)
      c->out.off = c->out.len = 0;
    if (b == &c->block && c->block.off == c->block.len) {
      frames_flooded += c->block_msgs * (body_size > 0 ? 3 : 2);
      messages_flooded += c->block_msgs;
      if (max_messages && c->msgs_left == 0)
        c->flooding = false; /* all --messages written */
    }
  }
  return c->close_when_flushed ? -1 : 0;
}

static bool conn_wants_write(const conn *c) {
  return c->ssl_wants_write || c->out.off < c->out.len || can_deliver(c) ||
         (c->block.off > 0 && c->block.off < c->block.len);
}

int main(int argc, char **argv) {
  const char *listen_at = "127.0.0.1:0", *tls_cert = NULL, *tls_key = NULL;
  double timeout = 900;
  for (int i = 1; i < argc; i += 2) {
    if (!strcmp(argv[i], "--trace")) {
      trace = true;
      i--;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "fake_broker: %s needs a value\n", argv[i]);
      return 2;
    }
    if (!strcmp(argv[i], "--listen"))
      listen_at = argv[i + 1];
    else if (!strcmp(argv[i], "--body") || !strcmp(argv[i], "--body-size"))
      body_size = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--messages")) {
      char *e;
      max_messages = strtoull(argv[i + 1], &e, 10);
      if (*e || !max_messages || argv[i + 1][0] == '-') {
        fprintf(stderr, "fake_broker: --messages N (N >= 1)\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--block"))
      block_target = (size_t)atol(argv[i + 1]);
    else if (!strcmp(argv[i], "--timeout"))
      timeout = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--tls-cert"))
      tls_cert = argv[i + 1];
    else if (!strcmp(argv[i], "--tls-key"))
      tls_key = argv[i + 1];
    else {
      fprintf(stderr, "usage: fake_broker [--listen 127.0.0.1:PORT] "
                      "[--body-size N] [--messages N] [--block BYTES] "
                      "[--timeout S] [--tls-cert FILE --tls-key FILE] "
                      "[--trace]\n");
      return 2;
    }
  }
  if (!tls_cert != !tls_key) {
    fprintf(stderr, "fake_broker: --tls-cert and --tls-key go together\n");
    return 2;
  }
  if (tls_cert && !(tls_ctx = bt_server_ctx("fake_broker", tls_cert, tls_key)))
    return 1;
  if (body_size < 0 || body_size > 131000 || block_target < 1) {
    fprintf(stderr, "fake_broker: bad arguments\n");
    return 2;
  }
  char host[64];
  int port;
  const char *colon = strrchr(listen_at, ':');
  if (!colon || colon - listen_at >= (long)sizeof host) {
    fprintf(stderr, "fake_broker: --listen HOST:PORT\n");
    return 2;
  }
  snprintf(host, sizeof host, "%.*s", (int)(colon - listen_at), listen_at);
  port = atoi(colon + 1);

  signal(SIGPIPE, SIG_IGN);
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1 ||
      bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      listen(lfd, 1024) != 0) {
    perror("fake_broker: bind/listen");
    return 1;
  }
  socklen_t sl = sizeof sa;
  getsockname(lfd, (struct sockaddr *)&sa, &sl);
  printf("LISTENING %d\n", ntohs(sa.sin_port));
  fflush(stdout);

  size_t nconns = 0, capconns = 64;
  conn **conns = calloc(capconns, sizeof *conns);
  struct pollfd *pfds = calloc(capconns + 1, sizeof *pfds);
  uint64_t deadline = ba_now_ns() + (uint64_t)(timeout * 1e9);

  while (!stop && ba_now_ns() < deadline) {
    pfds[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
    for (size_t i = 0; i < nconns; i++)
      pfds[i + 1] = (struct pollfd){
          .fd = conns[i]->fd,
          .events = POLLIN | (conn_wants_write(conns[i]) ? POLLOUT : 0)};
    int n = poll(pfds, nconns + 1, 1000);
    if (n < 0 && errno != EINTR)
      break;
    if (n <= 0)
      continue;
    if (pfds[0].revents & POLLIN) {
      for (int k = 0; k < 256; k++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
        if (fd < 0)
          break;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (nconns == capconns) {
          capconns *= 2;
          conns = realloc(conns, capconns * sizeof *conns);
          pfds = realloc(pfds, (capconns + 1) * sizeof *pfds);
        }
        conn *c = calloc(1, sizeof *c);
        c->fd = fd;
        c->in = malloc(MAX_FRAME);
        if (tls_ctx) {
          c->ssl = SSL_new(tls_ctx);
          if (!c->ssl || SSL_set_fd(c->ssl, fd) != 1) {
            conn_free(c);
            continue;
          }
          SSL_set_accept_state(c->ssl);
        }
        conns[nconns++] = c;
        conns_accepted++;
      }
    }
    /* pfds[i+1] belong to conns[i] as they were before accepting */
    for (size_t i = 0; i < nconns; i++) {
      conn *c = conns[i];
      short re = pfds[i + 1].fd == c->fd ? pfds[i + 1].revents : 0;
      int bad = 0;
      /* a TLS read (the handshake) that had to write first goes on */
      if (re & (POLLIN | POLLHUP | POLLERR) ||
          (c->ssl_wants_write && re & POLLOUT))
        bad = conn_read(c);
      if (!bad && (re & POLLOUT || c->out.len > c->out.off))
        bad = conn_write(c);
      if (bad) {
        conn_free(c);
        conns[i] = conns[--nconns];
        pfds[i + 1] = pfds[nconns + 1];
        i--;
      }
    }
  }
  for (size_t i = 0; i < nconns; i++)
    conn_free(conns[i]);
  free(conns);
  free(pfds);
  close(lfd);
  fprintf(stderr,
          "fake_broker: exit, %llu delivery frames (%llu messages) "
          "written, %llu connections accepted, %llu sent the protocol "
          "header\n",
          (unsigned long long)frames_flooded,
          (unsigned long long)messages_flooded,
          (unsigned long long)conns_accepted, (unsigned long long)conns_amqp);
  fprintf(
      stderr,
      "fake_broker: received %llu acks (%llu deliveries acknowledged, "
      "%llu acks of unknown tags), %llu messages published "
      "(%llu publish frames)\n",
      (unsigned long long)acks_received, (unsigned long long)deliveries_acked,
      (unsigned long long)acks_unknown, (unsigned long long)messages_published,
      (unsigned long long)frames_published);
  fprintf(
      stderr,
      "fake_broker: confirmed %llu messages published on confirm "
      "channels, received %llu nacks and %llu rejects, answered %llu "
      "queue.declare, %llu exchange.declare, %llu queue.bind\n",
      (unsigned long long)messages_confirmed,
      (unsigned long long)nacks_received, (unsigned long long)rejects_received,
      (unsigned long long)queue_declares, (unsigned long long)exchange_declares,
      (unsigned long long)queue_binds);
  SSL_CTX_free(tls_ctx);
  return 0;
}
