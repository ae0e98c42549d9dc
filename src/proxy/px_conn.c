/* px_conn.c - one socket endpoint (px_conn.h), and its plain TCP
 * transport. */
#include <stdlib.h>
#include <string.h>

#include "px_conn.h"

/* Reads smaller than this are not worth a syscall: move to a new chunk. */
#define PX_MIN_READ 2048

/* ---- the plain TCP transport ------------------------------------------ */

static void tcp_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  px_conn_alloc(h->data, buf);
}

static void tcp_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  (void)buf;
  px_conn_read_done(st->data, nread);
}

static int tcp_read_start(px_conn *c) {
  return uv_read_start((uv_stream_t *)&c->tcp, tcp_on_alloc, tcp_on_read);
}

static void tcp_read_stop(px_conn *c) {
  uv_read_stop((uv_stream_t *)&c->tcp);
}

static int tcp_try_write(px_conn *c, const uv_buf_t *bufs, unsigned n) {
  int rc = uv_try_write((uv_stream_t *)&c->tcp, bufs, n);
  return rc == UV_EAGAIN || rc == UV_ENOSYS ? 0 : rc;
}

static void tcp_on_write(uv_write_t *req, int status) {
  px_conn_write_done((px_conn_write *)req, status);
}

static int tcp_write(px_conn *c, px_conn_write *w) {
  return uv_write(&w->req, (uv_stream_t *)&c->tcp, w->bufs, w->n, tcp_on_write);
}

static void tcp_on_shutdown(uv_shutdown_t *req, int status) {
  px_conn_shutdown_done(req->data, status);
}

static int tcp_shutdown(px_conn *c) {
  c->shutdown_req.data = c;
  return uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, tcp_on_shutdown);
}

static void tcp_on_close(uv_handle_t *h) {
  px_conn_closed(h->data);
}

static void tcp_close(px_conn *c) {
  if (!uv_is_closing((uv_handle_t *)&c->tcp))
    uv_close((uv_handle_t *)&c->tcp, tcp_on_close);
}

static int tcp_connect(px_conn *c, uv_loop_t *loop, const struct sockaddr *sa);

static const px_conn_io tcp_io = {
    .connect = tcp_connect,
    .read_start = tcp_read_start,
    .read_stop = tcp_read_stop,
    .try_write = tcp_try_write,
    .write = tcp_write,
    .shutdown = tcp_shutdown,
    .close = tcp_close,
};

void px_conn_init(px_conn *c, const char *name, const px_conn_events *ev,
                  void *ctx) {
  memset(c, 0, sizeof *c);
  c->io = &tcp_io;
  c->ev = ev;
  c->ctx = ctx;
  c->name = name;
}

int px_conn_accept(px_conn *c, uv_loop_t *loop, uv_stream_t *listener) {
  int rc = uv_tcp_init(loop, &c->tcp);
  if (rc < 0)
    return rc;
  c->tcp.data = c;
  c->open = true;
  rc = uv_accept(listener, (uv_stream_t *)&c->tcp);
  if (rc < 0)
    return rc; /* open: the owner closes it */
  c->connected = true;
  uv_tcp_nodelay(&c->tcp, 1);
  return 0;
}

void px_conn_connected(px_conn *c, int status) {
  if (!c->open)
    return;
  if (status == 0)
    c->connected = true;
  c->ev->connected(c->ctx, c, status);
}

static void tcp_on_connect(uv_connect_t *req, int status) {
  px_conn *c = req->data;
  if (status == 0 && c->open)
    uv_tcp_nodelay(&c->tcp, 1);
  px_conn_connected(c, status);
}

int px_conn_tcp_open(px_conn *c, uv_loop_t *loop) {
  int rc = uv_tcp_init(loop, &c->tcp);
  if (rc < 0)
    return rc;
  c->tcp.data = c;
  c->open = true;
  return 0;
}

static int tcp_connect(px_conn *c, uv_loop_t *loop, const struct sockaddr *sa) {
  int rc = px_conn_tcp_open(c, loop);
  if (rc < 0)
    return rc;
  c->connect_req.data = c;
  return uv_tcp_connect(&c->connect_req, &c->tcp, sa, tcp_on_connect);
}

int px_conn_connect(px_conn *c, uv_loop_t *loop, const struct sockaddr *sa) {
  /* on an error an open handle is the owner's to close */
  return c->io->connect(c, loop, sa);
}

void px_conn_adopt(px_conn *c, const px_conn_io *io) {
  c->io = io;
  c->open = c->connected = true;
}

void px_conn_keepalive(px_conn *c, unsigned secs) {
  if (c->open && (c->io == &tcp_io || c->tls))
    uv_tcp_keepalive(&c->tcp, 1, secs);
}

void px_conn_peer(px_conn *c, char *out, size_t cap) {
  struct sockaddr_storage ss;
  int len = sizeof ss;
  char ip[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (c->open && (c->io == &tcp_io || c->tls) &&
      uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
      uv_ip6_name(a, ip, sizeof ip);
      snprintf(out, cap, "[%s]:%u", ip, (unsigned)ntohs(a->sin6_port));
      return;
    }
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    uv_ip4_name(a, ip, sizeof ip);
    port = ntohs(a->sin_port);
  }
  snprintf(out, cap, "%s:%u", ip, (unsigned)port);
}

/* ---- reading ------------------------------------------------------------ */

void px_conn_read(px_conn *c) {
  if (c->reading || c->paused || !c->open)
    return;
  if (c->io->read_start(c) == 0)
    c->reading = true;
}

void px_conn_stop_reading(px_conn *c) {
  if (c->reading)
    c->io->read_stop(c);
  c->reading = false;
  c->paused = false;
}

void px_conn_pause(px_conn *c) {
  if (!c->reading)
    return;
  c->io->read_stop(c);
  c->reading = false;
  c->paused = true;
}

void px_conn_resume(px_conn *c) {
  c->paused = false;
  px_conn_read(c);
}

/* Move the unparsed bytes into a chunk of at least `need` bytes. */
static px_chunk *relocate(px_conn *c, size_t need) {
  px_chunk *old = c->in;
  size_t keep = old ? old->len - old->off : 0;
  px_chunk *n = px_chunk_new(need > keep ? need : keep + PX_MIN_READ);
  if (!n)
    return NULL;
  if (keep)
    memcpy(n->data, old->data + old->off, keep);
  c->moved += keep;
  n->len = (uint32_t)keep;
  if (old)
    px_chunk_unref(old);
  c->in = n;
  return n;
}

int px_conn_keep(px_conn *c, size_t need) {
  px_chunk *in = c->in;
  if (!in || c->head) /* the input chunk was made for the head's rest */
    return 0;
  if (in->off == in->len) {
    px_chunk_unref(in);
    c->in = NULL;
    return 0;
  }
  if (need > in->cap - in->off && !relocate(c, need))
    return UV_ENOMEM;
  return 0;
}

int px_conn_keep_split(px_conn *c, size_t need) {
  px_chunk *in = c->in;
  if (need <= in->cap - in->off && in->cap - in->len >= PX_MIN_READ)
    return 0; /* the rest fits behind it */
  px_chunk *rest = px_chunk_new(need - (in->len - in->off) + PX_MIN_READ);
  if (!rest)
    return UV_ENOMEM;
  c->head = in;
  c->in = rest;
  return 0;
}

void px_conn_head_done(px_conn *c) {
  if (c->head)
    px_chunk_unref(c->head);
  c->head = NULL;
}

void px_conn_alloc(px_conn *c, uv_buf_t *buf) {
  px_chunk *in = c->in;
  if (!in || in->cap - in->len < PX_MIN_READ)
    in = relocate(c, PX_CHUNK_SIZE);
  if (!in) {
    *buf = uv_buf_init(NULL, 0); /* the read reports UV_ENOBUFS */
    return;
  }
  *buf = uv_buf_init((char *)in->data + in->len, in->cap - in->len);
}

void px_conn_read_done(px_conn *c, ssize_t nread) {
  if (!c->open)
    return;
  if (nread < 0) {
    if (c->in && c->in->off == c->in->len) {
      px_chunk_unref(c->in); /* allocated for this read: give it back */
      c->in = NULL;
    }
    px_conn_stop_reading(c);
    c->ev->eof(c->ctx, c, (int)nread);
    return;
  }
  if (nread == 0)
    return;
  c->in->len += (uint32_t)nread;
  c->bytes_in += (uint64_t)nread;
  c->ev->data(c->ctx, c, (size_t)nread);
}

/* ---- writing ------------------------------------------------------------ */

/* The slice tables of connections with something queued; an idle
 * connection holds none. Spare tables wait in a short free list. */
#define OUT_POOL_MAX 64

static px_slice *out_pool;
static unsigned out_pool_len;

static px_slice *out_take(void) {
  px_slice *t = out_pool;
  if (!t)
    return malloc(PX_CONN_OUT_MAX * sizeof *t);
  memcpy(&out_pool, &t->ptr, sizeof out_pool); /* the next spare */
  out_pool_len--;
  return t;
}

/* Give the table back once nothing is queued. */
static void out_done(px_conn *c) {
  px_slice *t = c->out;
  if (c->nout || !t)
    return;
  c->out = NULL;
  if (out_pool_len == OUT_POOL_MAX) {
    free(t);
    return;
  }
  memcpy(&t->ptr, &out_pool, sizeof out_pool);
  out_pool = t;
  out_pool_len++;
}

void px_conn_out_pool_drain(void) {
  while (out_pool) {
    px_slice *t = out_pool;
    memcpy(&out_pool, &t->ptr, sizeof out_pool);
    free(t);
  }
  out_pool_len = 0;
}

static void drop_out(px_conn *c) {
  for (unsigned i = 0; i < c->nout; i++)
    px_chunk_unref(c->out[i].chunk);
  c->nout = 0;
  out_done(c);
}

/* Shut the write side down once lingering and drained. */
static int maybe_shutdown(px_conn *c) {
  if (!c->lingering || c->hold_shutdown || c->shut || !c->connected ||
      !px_conn_drained(c))
    return 0;
  c->shut = true;
  return c->io->shutdown(c);
}

void px_conn_write_done(px_conn_write *w, int status) {
  px_conn *c = w->conn;
  for (unsigned i = 0; i < w->n; i++)
    px_chunk_unref(w->chunks[i]);
  c->inflight -= w->bytes;
  free(w);
  if (!c->open)
    return;
  if (status < 0) {
    c->ev->write_failed(c->ctx, c, status);
    return;
  }
  int rc = maybe_shutdown(c);
  if (rc < 0) {
    c->ev->write_failed(c->ctx, c, rc);
    return;
  }
  c->ev->written(c->ctx, c);
}

void px_conn_shutdown_done(px_conn *c, int status) {
  if (c->open && status < 0)
    c->ev->write_failed(c->ctx, c, status);
}

/* Write what the transport takes now without a request (the common case:
 * no write pending); drop the slices done, trim a partly written one. */
static int try_write(px_conn *c) {
  uv_buf_t bufs[PX_CONN_OUT_MAX];
  for (unsigned i = 0; i < c->nout; i++)
    bufs[i] = uv_buf_init((char *)c->out[i].ptr, c->out[i].len);
  int n = c->io->try_write(c, bufs, c->nout);
  if (n <= 0)
    return n;
  c->bytes_out += (uint64_t)n;
  unsigned done = 0;
  size_t left = (size_t)n;
  while (done < c->nout && left >= c->out[done].len) {
    left -= c->out[done].len;
    px_chunk_unref(c->out[done++].chunk);
  }
  if (done < c->nout) {
    c->out[done].ptr += left;
    c->out[done].len -= (uint32_t)left;
  }
  c->nout -= done;
  if (done && c->nout)
    memmove(c->out, c->out + done, c->nout * sizeof *c->out);
  out_done(c);
  return 0;
}

int px_conn_flush(px_conn *c) {
  if (c->nout == 0 || !c->connected)
    return 0;
  if (c->inflight == 0) {
    int rc = try_write(c);
    if (rc < 0)
      return rc;
    if (c->nout == 0)
      return maybe_shutdown(c);
  }
  px_conn_write *w = malloc(sizeof *w);
  if (!w)
    return UV_ENOMEM;
  w->conn = c;
  w->n = c->nout;
  w->bytes = 0;
  for (unsigned i = 0; i < w->n; i++) {
    w->bufs[i] = uv_buf_init((char *)c->out[i].ptr, c->out[i].len);
    w->chunks[i] = c->out[i].chunk;
    w->bytes += c->out[i].len;
  }
  c->nout = 0;
  out_done(c);
  int rc = c->io->write(c, w);
  if (rc < 0) {
    for (unsigned i = 0; i < w->n; i++)
      px_chunk_unref(w->chunks[i]);
    free(w);
    return rc;
  }
  c->inflight += w->bytes;
  c->bytes_out += w->bytes;
  return 0;
}

int px_conn_queue(px_conn *c, px_chunk *ch, const uint8_t *p, uint32_t len) {
  if (!c->open || c->discard || len == 0)
    return 0;
  if (c->nout > 0) {
    px_slice *last = &c->out[c->nout - 1];
    if (last->chunk == ch && last->ptr + last->len == p) {
      last->len += len;
      return 0;
    }
  }
  if (c->nout == PX_CONN_OUT_MAX) {
    int rc = px_conn_flush(c);
    if (rc < 0)
      return rc;
  }
  if (c->nout == PX_CONN_OUT_MAX)
    return UV_ENOBUFS; /* not connected yet */
  if (!c->out && !(c->out = out_take()))
    return UV_ENOMEM;
  px_chunk_ref(ch);
  c->out[c->nout++] = (px_slice){ch, (uint8_t *)p, len};
  return 0;
}

int px_conn_queue_copy(px_conn *c, const uint8_t *data, size_t len) {
  if (!c->open || c->discard || len == 0)
    return 0;
  if (c->nout > 0) { /* the spare room of a chunk only the last slice holds */
    px_slice *last = &c->out[c->nout - 1];
    px_chunk *ch = last->chunk;
    if (ch->refs == 1 && last->ptr + last->len == ch->data + ch->len &&
        ch->cap - ch->len >= len) {
      memcpy(ch->data + ch->len, data, len);
      ch->len += (uint32_t)len;
      last->len += (uint32_t)len;
      return 0;
    }
  }
  px_chunk *ch = px_chunk_new(len);
  if (!ch)
    return UV_ENOMEM;
  memcpy(ch->data, data, len);
  ch->len = (uint32_t)len;
  int rc = px_conn_queue(c, ch, ch->data, (uint32_t)len);
  px_chunk_unref(ch);
  return rc;
}

void px_conn_stop_writing(px_conn *c) {
  c->discard = true;
  c->connected = false;
  drop_out(c);
}

/* ---- ending ------------------------------------------------------------- */

int px_conn_linger(px_conn *c) {
  c->lingering = true;
  c->paused = false;
  int rc = px_conn_flush(c);
  if (rc == 0)
    rc = maybe_shutdown(c);
  if (rc == 0)
    px_conn_read(c);
  return rc;
}

void px_conn_hold_shutdown(px_conn *c) {
  c->hold_shutdown = true;
}

int px_conn_release_shutdown(px_conn *c) {
  c->hold_shutdown = false;
  return maybe_shutdown(c);
}

void px_conn_close(px_conn *c) {
  bool was_open = c->open;
  c->open = false; /* writes the transport cancels now report nothing */
  c->connected = false;
  c->reading = false;
  if (was_open)
    c->io->close(c);
}

void px_conn_closed(px_conn *c) {
  if (c->ev && c->ev->closed)
    c->ev->closed(c->ctx, c);
}

void px_conn_free(px_conn *c) {
  if (c->io && c->io->release)
    c->io->release(c);
  drop_out(c);
  if (c->in)
    px_chunk_unref(c->in);
  c->in = NULL;
  px_conn_head_done(c);
}
