/* libFuzzer target: one proxy session (tests/proxy/session_harness.h)
 * driven by both peers at once, over fake transports.
 *
 * Input: a flags byte, then records [op:1][len:2, big-endian][len bytes]
 * (a record cut short by the end of the input takes what is left):
 *
 *   op % 7 == 0  the client sends the bytes
 *             1  the broker sends the bytes (fed one frame per read, so a
 *                frame's effect shows on its own); ignored until the
 *                broker has received a protocol header, as a broker does
 *             2  time passes: bytes[0] % 8 ms of the loop (timers: the
 *                config's tiers, confirm and finish timeouts are a few ms),
 *                then the server's tick (processing timeouts: 3 ms)
 *             3  writes to a side fail: bytes[0] bit 0 the side (1:
 *                broker), bits 1-2: at once (try_write), in a request
 *                (write), on completion, or no more failures
 *             4  a side's writes stall or go partially: bytes[0] bit 0
 *                the side, bit 1 stall, bytes[1] * 16 bytes per try_write
 *                (0: all)
 *             5  a side hangs up: bytes[0] bit 0 the side, bit 1 a reset
 *             6  a side sends its previous record again, bytes[0] + 1
 *                times (up to REPEAT_MAX bytes per input): volume, for
 *                the backpressure against a stalled peer
 *
 * Flags: bit 0 a valid handshake first (then bits 1-2 pick channel-max
 * 2047, 2, 3 or 10, bit 3 frame-max 4096 instead of 131072, and bit 4
 * opens channel 1 consuming from queue "q" with tag "c"); bit 5 the
 * upstream refuses the connection; bit 6 --retry-connection separate:
 * rebound's copies go on a connection of their own, whose broker (H_PUB)
 * answers the handshake, rebound's channel, declares and (with bit 7)
 * every publish by itself, and ops 1, 3, 4 and 5 with bit 7 of the op
 * byte set act on it instead of the client's broker.
 *
 * After each record (abort on a violation): no crash (ASan/UBSan); each
 * wire log (the retry connection's too) is whole frames, each connection's
 * after its protocol header; a broker
 * frame on rebound's own channel number (shared mode) sends the client
 * nothing on a channel; the bytes queued in the session stay bounded, and
 * the cache within its bounds. At the end the session is drained, both
 * peers hang up, it is closed if still there, and it must be freed with
 * every buffer chunk given back and the cache accounting at zero (LSan
 * checks the rest).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "px_buf.h"
#include "session_harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What a session may hold queued (both sides in flight and queued, and
 * client frames held on channels): well above two high-water marks plus
 * the largest frames and a cache's worth of copies. */
#define QUEUED_MAX (16u << 20)
#define CHUNKS_MAX (64u << 20)
/* rebound parses broker frames up to 4 MiB (px_session.c). */
#define BROKER_FRAME_MAX ((4u << 20) + 8)
/* Real time one input may spend in op 2. */
#define WAIT_BUDGET_MS 24
/* Bytes one input may send again through op 6. */
#define REPEAT_MAX (24u << 20)

/* The session's options: short retry timings, small caches; the raw
 * inputs (no scripted handshake) get a short handshake timeout too. */
#define FUZZ_ARGS(handshake_timeout, retry_connection)                         \
  {                                                                            \
    "--retry-tiers", "2ms,5ms", "--max-attempts", "3",                         \
        "--retry-confirm-timeout", "5ms", "--retry-finish-timeout", "20ms",    \
        "--cache-per-connection", "256KiB", "--cache-total", "1MiB",           \
        "--handshake-timeout", handshake_timeout, "--retry-connection",        \
        retry_connection, "--processing-timeout", "3ms", NULL                  \
  }
/* [separate][scripted] */
static const char *const args[2][2][19] = {
    {FUZZ_ARGS("50ms", "shared"), FUZZ_ARGS("10s", "shared")},
    {FUZZ_ARGS("50ms", "separate"), FUZZ_ARGS("10s", "separate")}};

typedef struct fz {
  harness *h;
  /* the broker's stream as sent: the bytes of its unfinished frame */
  uint8_t *tail;
  size_t tail_len;
  bool track; /* frame boundaries known */
  /* one frame's feed (the hooks) */
  bool watch;
  size_t client_mark;
  /* where each log has been checked up to; false: not checkable any more
   * (a write failed halfway through a frame) */
  size_t checked[3];
  bool whole[3];
  /* --retry-connection separate: the retry connection's broker answers
   * by itself (pub_respond()); with auto_confirm every publish too */
  bool separate, auto_confirm;
  uint64_t pub_seq; /* publishes on the current retry connection */
  unsigned waited_ms;
  /* each side's previous record, for op 6 */
  const uint8_t *last[2];
  size_t last_len[2];
  size_t repeated;
} fz;

static fz *current; /* for the dump of a violation */

/* Each side's log as lines (FUZZ_SESSION_DUMP=1), to read a reproducer. */
static void dump(const harness *h) {
  for (int side = 0; side < 2; side++) {
    const fake_conn *f = &h->peer[side];
    size_t off = 0;
    fprintf(stderr, "-- %s received %zu bytes:\n", f->name, f->log_len);
    while (off < f->log_len) {
      char line[512];
      long n = h_describe(f->log + off, f->log_len - off, line, sizeof line);
      if (n == 0 && f->log_len - off >= 8 &&
          memcmp(f->log + off, "AMQP", 4) == 0) {
        snprintf(line, sizeof line, "protocol-header");
        n = 8;
      }
      if (n <= 0) {
        fprintf(stderr, "   @%zu %s (%zu bytes left)\n", off,
                n ? line : "partial frame", f->log_len - off);
        break;
      }
      fprintf(stderr, "   @%zu %s\n", off, line);
      off += (size_t)n;
    }
  }
}

static void violation(const char *what) {
  fprintf(stderr, "fuzz_session: invariant violated: %s\n", what);
  if (current && getenv("FUZZ_SESSION_DUMP"))
    dump(current->h);
  abort();
}

static uint16_t be16(const uint8_t *p) {
  return (uint16_t)(p[0] << 8 | p[1]);
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         p[3];
}

/* ---- rebound's own channel: nothing of it reaches the client ----------- */

#if __has_include("px_own.h") /* rebound's channel as a module of its own */
#include "px_life.h"
#include "px_own.h"
static bool own_on_main(const px_session *s) {
  return px_own_on_main(s);
}
static uint16_t own_ch_of(const px_session *s) {
  return px_own_ch(s);
}
#else
static bool own_on_main(const px_session *s) {
  return !s->own_on_pub &&
         (s->own_state == PX_OWN_OPENING || s->own_state == PX_OWN_SELECTING ||
          s->own_state == PX_OWN_READY || s->own_state == PX_OWN_CLOSING);
}
static uint16_t own_ch_of(const px_session *s) {
  return s->own_ch;
}
#endif

/* A piece tagged channel + 1 completes exactly one broker frame. */
static void before_feed(void *ctx, fake_conn *f, const fake_piece *k) {
  fz *z = ctx;
  px_session *s = z->h->s;
  (void)f;
  z->watch = k->tag > 1 && s && !px_life_telling_client(s) && own_on_main(s) &&
             own_ch_of(s) == (uint16_t)(k->tag - 1) && z->whole[H_CLIENT];
  z->client_mark = z->h->peer[H_CLIENT].log_len;
}

static void after_feed(void *ctx, fake_conn *f, const fake_piece *k) {
  fz *z = ctx;
  const fake_conn *c = &z->h->peer[H_CLIENT];
  (void)f;
  (void)k;
  if (!z->watch)
    return;
  z->watch = false;
  for (size_t off = z->client_mark; off < c->log_len;) {
    amqp_frame fr;
    long n = amqp_frame_parse(c->log + off, c->log_len - off, 0, &fr);
    if (n <= 0)
      return; /* the wholeness check reports it */
    if (fr.channel != 0)
      violation("a frame on rebound's own channel reached the client");
    off += (size_t)n;
  }
}

/* ---- sending --------------------------------------------------------- */

static void tail_add(fz *z, const uint8_t *p, size_t n) {
  uint8_t *t = realloc(z->tail, z->tail_len + n);
  if (!t)
    abort();
  memcpy(t + z->tail_len, p, n);
  z->tail = t;
  z->tail_len += n;
}

/* The broker's bytes, one piece per frame they complete (tagged with its
 * channel + 1), the unfinished rest as one piece. */
static void broker_send(fz *z, const uint8_t *p, size_t len) {
  fake_conn *b = &z->h->peer[H_BROKER];
  size_t i = 0;
  while (z->track && i < len) {
    uint8_t hdr[7];
    size_t have = 0;
    for (; have < 7 && have < z->tail_len; have++)
      hdr[have] = z->tail[have];
    for (size_t j = i; have < 7 && j < len; j++)
      hdr[have++] = p[j];
    if (have < 7)
      break; /* not even a frame header yet */
    uint64_t total = (uint64_t)be32(hdr + 3) + 8;
    if (hdr[0] < 1 || hdr[0] > 8 || total > BROKER_FRAME_MAX) {
      z->track = false; /* rebound refuses this stream */
      break;
    }
    size_t need = (size_t)total - z->tail_len;
    if (need > len - i)
      break;
    if (p[i + need - 1] != AMQP_FRAME_END) {
      z->track = false;
      break;
    }
    fake_send_tagged(b, p + i, need, be16(hdr + 1) + 1);
    i += need;
    free(z->tail);
    z->tail = NULL;
    z->tail_len = 0;
  }
  if (i < len) {
    fake_send(b, p + i, len - i);
    if (z->track)
      tail_add(z, p + i, len - i);
  }
}

static void send_method(harness *h, h_side from, uint16_t ch, uint32_t id) {
  amqp_method m;
  amqp_method_init(&m, id);
  if (id == AMQP_BASIC_CONSUME) {
    m.args[AMQP_F_BASIC_CONSUME_QUEUE].b = amqp_cstr("q");
    m.args[AMQP_F_BASIC_CONSUME_CONSUMER_TAG].b = amqp_cstr("c");
  } else if (id == AMQP_BASIC_CONSUME_OK) {
    m.args[AMQP_F_BASIC_CONSUME_OK_CONSUMER_TAG].b = amqp_cstr("c");
  }
  h_method(h, from, ch, &m);
  h_settle(h);
}

/* The handshake, rebound's channel answered, and optionally a consumer. */
static void scripted_open(harness *h, uint8_t flags) {
  static const uint16_t channel_max[4] = {2047, 2, 3, 10};
  h_open_unchecked(h, channel_max[flags >> 1 & 3], flags & 8 ? 4096 : 131072);
  if (h->s && own_ch_of(h->s) && own_on_main(h->s)) {
    uint16_t own = own_ch_of(h->s);
    send_method(h, H_BROKER, own, AMQP_CHANNEL_OPEN_OK);
    if (h->s)
      send_method(h, H_BROKER, own, AMQP_CONFIRM_SELECT_OK);
  }
  if ((flags & 16) && h->s) {
    uint16_t up = 1;
    send_method(h, H_CLIENT, 1, AMQP_CHANNEL_OPEN);
    /* channel 1 may travel on another number: the broker answers there */
    px_chan *c = h->s ? px_tab_get(&h->s->by_client, 1) : NULL;
    if (c)
      up = c->up_ch;
    send_method(h, H_BROKER, up, AMQP_CHANNEL_OPEN_OK);
    send_method(h, H_CLIENT, 1, AMQP_BASIC_CONSUME);
    send_method(h, H_BROKER, up, AMQP_BASIC_CONSUME_OK);
  }
}

/* ---- the retry connection's broker (flags bit 6) ------------------------ */

/* Answer what rebound sent the retry connection's broker: the handshake,
 * rebound's channel and confirm mode, declares, its goodbye, and (with
 * auto_confirm) each publish. true when anything was answered. */
static bool pub_respond(fz *z) {
  harness *h = z->h;
  char line[512];
  unsigned ch = 0;
  bool any = false;
  while (h->s && h_next(h, H_PUB, line, sizeof line, NULL, NULL)) {
    uint32_t answer = 0;
    if (strcmp(line, "protocol-header") == 0) {
      z->pub_seq = 0;
      answer = AMQP_CONNECTION_START;
    } else if (sscanf(line, "ch%u ", &ch) != 1) {
      continue; /* a frame the describer refused */
    } else if (strstr(line, " connection.start-ok")) {
      answer = AMQP_CONNECTION_TUNE;
    } else if (strstr(line, " connection.open")) {
      answer = AMQP_CONNECTION_OPEN_OK;
    } else if (strstr(line, " connection.close ")) {
      answer = AMQP_CONNECTION_CLOSE_OK;
    } else if (strstr(line, " channel.open")) {
      answer = AMQP_CHANNEL_OPEN_OK;
    } else if (strstr(line, " confirm.select")) {
      answer = AMQP_CONFIRM_SELECT_OK;
    } else if (strstr(line, " queue.declare ")) {
      answer = AMQP_QUEUE_DECLARE_OK;
    } else if (strstr(line, " basic.publish ")) {
      z->pub_seq++;
      if (z->auto_confirm)
        h_ack(h, H_PUB, (uint16_t)ch, z->pub_seq, false);
      any |= z->auto_confirm;
      continue;
    } else {
      continue;
    }
    h_simple(h, H_PUB, (uint16_t)ch, answer);
    any = true;
  }
  return any;
}

/* Settle, the retry connection's broker answering meanwhile. */
static void settle(fz *z) {
  h_settle(z->h);
  for (int i = 0; i < 64 && z->separate && pub_respond(z); i++)
    h_settle(z->h);
}

/* ---- invariants ------------------------------------------------------ */

static void check_log(fz *z, h_side side) {
  static const char *const partial[3] = {
      "the client's log ends inside a frame",
      "the broker's log ends inside a frame",
      "the retry connection's log ends inside a frame"};
  static const char *const malformed[3] = {
      "the client received a malformed frame",
      "the broker received a malformed frame",
      "the retry connection received a malformed frame"};
  const fake_conn *f = &z->h->peer[side];
  size_t off = z->checked[side];
  if (!z->whole[side])
    return;
  while (off < f->log_len) {
    /* a protocol header starts each connection (the retry connection's
     * log may hold several); no frame type is 'A' */
    if (f->log_len - off >= AMQP_PROTOCOL_HEADER_SIZE &&
        memcmp(f->log + off, "AMQP", 4) == 0) {
      off += AMQP_PROTOCOL_HEADER_SIZE;
      continue;
    }
    amqp_frame fr;
    long n = amqp_frame_parse(f->log + off, f->log_len - off, 0, &fr);
    if (n == AMQP_PARTIAL)
      violation(partial[side]);
    if (n < 0)
      violation(malformed[side]);
    off += (size_t)n;
  }
  z->checked[side] = off;
}

static size_t queued(const px_conn *c) {
  size_t n = px_conn_pending(c);
  for (unsigned i = 0; i < c->nout; i++)
    n += c->out[i].len;
  return n;
}

static void check(fz *z) {
  harness *h = z->h;
  check_log(z, H_CLIENT);
  check_log(z, H_BROKER);
  check_log(z, H_PUB);
  if (px_chunk_bytes() > CHUNKS_MAX)
    violation("buffer chunks past the bound");
  if (h->srv.stats.cache_bytes > h->cfg.cache_total)
    violation("cache past its total bound");
  if (!h->s)
    return;
  px_session *s = h->s;
  if (queued(&s->client) + queued(&s->upstream) + s->held_bytes > QUEUED_MAX)
    violation("queued bytes past the bound");
  if (s->cache_bytes > h->cfg.cache_per_connection)
    violation("cache past its per-connection bound");
}

/* ---- ops ---------------------------------------------------------------- */

static void op_write_error(fz *z, h_side broker, const uint8_t *p, size_t len) {
  uint8_t b = len ? p[0] : 0;
  h_side side = b & 1 ? broker : H_CLIENT;
  fake_conn *f = &z->h->peer[side];
  switch (b >> 1 & 3) {
  case 0:
    f->try_write_error = UV_EPIPE;
    break;
  case 1:
    f->write_error = UV_EPIPE;
    f->try_write_max = 0; /* through write() */
    break;
  case 2:
    f->complete_error = UV_ECONNRESET;
    f->try_write_max = 0;
    break;
  default:
    f->try_write_error = f->write_error = f->complete_error = 0;
    return;
  }
  /* a write refused after a partial try_write leaves a frame cut short */
  z->whole[side] = false;
}

static void op_stall(fz *z, h_side broker, const uint8_t *p, size_t len) {
  uint8_t b = len ? p[0] : 0;
  fake_conn *f = &z->h->peer[b & 1 ? broker : H_CLIENT];
  f->stall = b & 2;
  f->try_write_max = len > 1 && p[1] ? (size_t)p[1] * 16 : SIZE_MAX;
}

static void op_eof(fz *z, h_side broker, const uint8_t *p, size_t len) {
  uint8_t b = len ? p[0] : 0;
  h_eof(z->h, b & 1 ? broker : H_CLIENT, b & 2 ? UV_ECONNRESET : UV_EOF);
}

static void broker_send(fz *z, const uint8_t *p, size_t len);

static void op_repeat(fz *z, const uint8_t *p, size_t len) {
  uint8_t b = len ? p[0] : 0;
  h_side side = b & 1 ? H_BROKER : H_CLIENT;
  unsigned times = len > 1 ? (unsigned)p[1] + 1 : 1;
  for (unsigned i = 0; i < times && z->last_len[side] &&
                       z->repeated + z->last_len[side] <= REPEAT_MAX;
       i++) {
    z->repeated += z->last_len[side];
    if (side == H_CLIENT)
      h_send(z->h, H_CLIENT, z->last[side], z->last_len[side]);
    else
      broker_send(z, z->last[side], z->last_len[side]);
    h_step(z->h); /* what a stalled peer leaves unread piles up here */
  }
}

static void op_wait(fz *z, const uint8_t *p, size_t len) {
  unsigned ms = len ? p[0] % 8 : 0;
  if (z->waited_ms + ms > WAIT_BUDGET_MS)
    ms = WAIT_BUDGET_MS - z->waited_ms;
  z->waited_ms += ms;
  if (ms)
    h_wait_ms(z->h, ms);
  if (z->h->s)
    px_session_tick(z->h->s, 3);
}

/* ---- one input ------------------------------------------------------- */

static void end_session(fz *z) {
  harness *h = z->h;
  if (h->s) {
    px_session_drain(h->s);
    settle(z);
  }
  /* whatever was stalled or failing goes through now */
  for (int i = 0; i < 3; i++) {
    h->peer[i].stall = false;
    h->peer[i].try_write_max = SIZE_MAX;
  }
  h_eof(h, H_CLIENT, UV_EOF);
  h_eof(h, H_BROKER, UV_EOF);
  settle(z);
  check(z);
  if (h->s)
    px_session_close(h->s, PX_CR_DRAIN_TIMEOUT);
  px_pub_close_all(); /* a retry connection saying goodbye: at once */
  if (!h_wait_gone(h, 5000))
    violation("the session is not freed after px_session_close");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t flags = data[0];
  fz z = {.track = true,
          .whole = {true, true, true},
          .separate = flags & 64,
          .auto_confirm = flags & 128};
  z.h = h_new(args[flags >> 6 & 1][flags & 1]);
  if (!z.h)
    violation("the fuzz config does not parse");
  harness *h = z.h;
  current = &z;
  if (flags & 32)
    h->peer[H_BROKER].connect_status = UV_ECONNREFUSED;
  settle(&z);
  if (flags & 1)
    scripted_open(h, flags);
  h->peer[H_BROKER].before_feed = before_feed;
  h->peer[H_BROKER].after_feed = after_feed;
  h->peer[H_BROKER].hook_ctx = &z;
  check(&z);

  size_t off = 1;
  while (off < size && h->s) {
    uint8_t op = data[off++];
    size_t len = 0;
    if (off + 2 <= size)
      len = be16(data + off);
    off = off + 2 <= size ? off + 2 : size;
    if (len > size - off)
      len = size - off;
    const uint8_t *p = data + off;
    off += len;
    h_side broker = z.separate && (op & 0x80) ? H_PUB : H_BROKER;
    switch (op % 7) {
    case 0:
      h_send(h, H_CLIENT, p, len);
      z.last[H_CLIENT] = p;
      z.last_len[H_CLIENT] = len;
      break;
    case 1:
      /* a broker speaks once it has the protocol header (rebound passes
       * what a broker sends before that on to the client as it is) */
      if (broker == H_PUB) {
        if (h->peer[H_PUB].log_len >= AMQP_PROTOCOL_HEADER_SIZE)
          h_send(h, H_PUB, p, len);
      } else if (h->peer[H_BROKER].log_len >= AMQP_PROTOCOL_HEADER_SIZE) {
        broker_send(&z, p, len);
        z.last[H_BROKER] = p;
        z.last_len[H_BROKER] = len;
      }
      break;
    case 2:
      op_wait(&z, p, len);
      break;
    case 3:
      op_write_error(&z, broker, p, len);
      break;
    case 4:
      op_stall(&z, broker, p, len);
      break;
    case 5:
      op_eof(&z, broker, p, len);
      break;
    default:
      op_repeat(&z, p, len);
      break;
    }
    settle(&z);
    check(&z);
  }
  end_session(&z);
  h->peer[H_BROKER].before_feed = h->peer[H_BROKER].after_feed = NULL;
  uint64_t cache = h->srv.stats.cache_bytes + h->srv.stats.cache_entries;
  h_free(h);
  current = NULL;
  free(z.tail);
  if (cache)
    violation("cache accounting not back to zero once the session is gone");
  if (px_chunk_bytes() != 0)
    violation("buffer chunks not given back once the session is gone");
  return 0;
}
