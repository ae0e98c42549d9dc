/* fake_conn.c - an in-memory transport for px_conn (fake_conn.h). */
#include "fake_conn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool finish_close(fake_conn *f);

static fake_conn *of(px_conn *c) {
  fake_conn *f = (fake_conn *)(void *)c->io; /* io is the first member */
  if (f->active && f->conn != c && f->close_pending)
    finish_close(f); /* another connection takes over the peer (a retry
                        connection opened again): the old one's close
                        comes first */
  f->conn = c;
  f->active = true;
  return f;
}

static void log_append(fake_conn *f, const uint8_t *p, size_t n) {
  if (n == 0)
    return;
  if (f->log_len + n > f->log_cap) {
    size_t cap = f->log_cap ? f->log_cap : 4096;
    while (cap < f->log_len + n)
      cap *= 2;
    uint8_t *l = realloc(f->log, cap);
    if (!l)
      abort();
    f->log = l;
    f->log_cap = cap;
  }
  memcpy(f->log + f->log_len, p, n);
  f->log_len += n;
}

/* ---- the px_conn_io functions ------------------------------------------- */

static int fk_connect(px_conn *c, uv_loop_t *loop, const struct sockaddr *sa) {
  fake_conn *f = of(c);
  (void)loop;
  f->connects++;
  if (sa->sa_family == AF_INET) {
    char ip[INET_ADDRSTRLEN] = "?";
    const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
    uv_ip4_name(a, ip, sizeof ip);
    snprintf(f->connect_addr, sizeof f->connect_addr, "%s:%u", ip,
             (unsigned)ntohs(a->sin_port));
  } else {
    snprintf(f->connect_addr, sizeof f->connect_addr, "(family %d)",
             sa->sa_family);
  }
  c->open = true; /* the handle exists: its close must follow */
  f->close_pending = false;
  f->shutdown_pending = f->shut = false;
  f->eof = 0;
  f->ended = false; /* a new connection */
  if (f->connect_result < 0)
    return f->connect_result;
  f->connect_pending = true;
  f->connect_hanging = f->connect_hangs > 0;
  if (f->connect_hangs)
    f->connect_hangs--;
  return 0;
}

static int fk_read_start(px_conn *c) {
  of(c)->reading = true;
  return 0;
}

static void fk_read_stop(px_conn *c) {
  of(c)->reading = false;
}

static int fk_try_write(px_conn *c, const uv_buf_t *bufs, unsigned n) {
  fake_conn *f = of(c);
  size_t room = f->stall ? 0 : f->try_write_max, took = 0;
  if (f->try_write_error)
    return f->try_write_error;
  for (unsigned i = 0; i < n && took < room; i++) {
    size_t k = bufs[i].len < room - took ? bufs[i].len : room - took;
    log_append(f, (const uint8_t *)bufs[i].base, k);
    took += k;
  }
  return (int)took;
}

static int fk_write(px_conn *c, px_conn_write *w) {
  fake_conn *f = of(c);
  if (f->write_error)
    return f->write_error;
  if (f->npending == f->cap_pending) {
    size_t cap = f->cap_pending ? f->cap_pending * 2 : 16;
    px_conn_write **p = realloc(f->pending, cap * sizeof *p);
    if (!p)
      abort();
    f->pending = p;
    f->cap_pending = cap;
  }
  for (unsigned i = 0; i < w->n; i++)
    log_append(f, (const uint8_t *)w->bufs[i].base, w->bufs[i].len);
  f->pending[f->npending++] = w;
  return 0;
}

static int fk_shutdown(px_conn *c) {
  fake_conn *f = of(c);
  f->shutdown_pending = true;
  return 0;
}

static void fk_close(px_conn *c) {
  fake_conn *f = of(c);
  f->close_pending = true;
  f->reading = false;
}

void fake_init(fake_conn *f, const char *name) {
  memset(f, 0, sizeof *f);
  f->io = (px_conn_io){
      .connect = fk_connect,
      .read_start = fk_read_start,
      .read_stop = fk_read_stop,
      .try_write = fk_try_write,
      .write = fk_write,
      .shutdown = fk_shutdown,
      .close = fk_close,
  };
  f->name = name;
  f->try_write_max = SIZE_MAX;
}

static void drop_input(fake_conn *f) {
  while (f->in_head) {
    fake_piece *p = f->in_head;
    f->in_head = p->next;
    free(p);
  }
  f->in_tail = NULL;
  f->in_bytes = 0;
}

void fake_free(fake_conn *f) {
  drop_input(f);
  free(f->pending);
  free(f->log);
  f->pending = NULL;
  f->log = NULL;
  f->npending = f->log_len = f->log_cap = f->cap_pending = 0;
}

void fake_send(fake_conn *f, const void *p, size_t len) {
  fake_send_tagged(f, p, len, 0);
}

void fake_send_tagged(fake_conn *f, const void *p, size_t len, int tag) {
  if (len == 0 || f->eof || f->ended)
    return;
  fake_piece *k = malloc(sizeof *k + len);
  if (!k)
    abort();
  k->next = NULL;
  k->len = len;
  k->off = 0;
  k->tag = tag;
  memcpy(k->data, p, len);
  if (f->in_tail)
    f->in_tail->next = k;
  else
    f->in_head = k;
  f->in_tail = k;
  f->in_bytes += len;
}

void fake_send_eof(fake_conn *f, int err) {
  if (!f->eof)
    f->eof = err ? err : UV_EOF;
}

bool fake_busy(const fake_conn *f) {
  if (!f->active)
    return false;
  return f->close_pending || (f->connect_pending && !f->connect_hanging) ||
         f->shutdown_pending || (f->npending && !f->stall) ||
         (f->reading && (f->in_head || f->eof));
}

/* Complete the writes pending now (new ones wait for the next step). */
static bool complete_writes(fake_conn *f, int status) {
  size_t n = f->npending;
  if (n == 0)
    return false;
  px_conn_write **done = malloc(n * sizeof *done);
  if (!done)
    abort();
  memcpy(done, f->pending, n * sizeof *done);
  memmove(f->pending, f->pending + n, (f->npending - n) * sizeof *done);
  f->npending -= n;
  for (size_t i = 0; i < n; i++)
    px_conn_write_done(done[i], status);
  free(done);
  return true;
}

/* Feed queued input while the connection reads. */
static bool feed(fake_conn *f) {
  bool did = false;
  while (f->active && f->reading && !f->close_pending && f->in_head) {
    fake_piece *k = f->in_head;
    if (f->before_feed && k->off == 0)
      f->before_feed(f->hook_ctx, f, k);
    while (f->active && f->reading && !f->close_pending && k->off < k->len) {
      uv_buf_t buf;
      px_conn_alloc(f->conn, &buf);
      if (buf.len == 0) {
        px_conn_read_done(f->conn, UV_ENOBUFS);
        return true;
      }
      size_t n = k->len - k->off < buf.len ? k->len - k->off : buf.len;
      memcpy(buf.base, k->data + k->off, n);
      k->off += n;
      f->in_bytes -= n;
      f->fed += n;
      did = true;
      px_conn_read_done(f->conn, (ssize_t)n);
    }
    if (k->off < k->len)
      break; /* reading stopped inside the piece */
    f->in_head = k->next;
    if (!f->in_head)
      f->in_tail = NULL;
    if (f->after_feed)
      f->after_feed(f->hook_ctx, f, k);
    free(k);
  }
  if (f->active && f->reading && !f->close_pending && !f->in_head &&
      (f->eof || f->ended)) {
    int err = f->eof ? f->eof : UV_EOF;
    f->eof = 0;
    f->ended = true;
    did = true;
    px_conn_read_done(f->conn, err);
  }
  return did;
}

/* The pending close: as libuv, writes and a connect in progress are
 * cancelled, then the close callback (the connection may be freed inside
 * it, or connect again: the next upstream). */
static bool finish_close(fake_conn *f) {
  px_conn *c = f->conn;
  complete_writes(f, UV_ECANCELED);
  if (f->connect_pending) {
    f->connect_pending = false;
    px_conn_connected(c, UV_ECANCELED);
  }
  f->shutdown_pending = false;
  f->close_pending = false;
  f->active = false;
  f->reading = false;
  f->closes++;
  drop_input(f);
  px_conn_closed(c);
  return true;
}

bool fake_step(fake_conn *f) {
  if (!f->active)
    return false;
  if (f->close_pending)
    return finish_close(f);
  bool did = false;
  if (f->connect_pending && !f->connect_hanging) {
    f->connect_pending = false;
    px_conn_connected(f->conn, f->connect_status);
    did = true;
  }
  if (f->active && !f->close_pending && !f->stall)
    did |= complete_writes(f, f->complete_error);
  if (f->active && !f->close_pending && f->shutdown_pending) {
    f->shutdown_pending = false;
    f->shut = true;
    px_conn_shutdown_done(f->conn, 0);
    did = true;
  }
  if (f->active && !f->close_pending)
    did |= feed(f);
  return did;
}
