/* px_tls.c - TLS under px_conn (px_tls.h). */
#define _DEFAULT_SOURCE /* timegm */
#include "px_tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ciphertext read from a socket goes into the SSL object at once, so one
 * buffer serves every connection of the (single-threaded) process. */
static uint8_t read_buf[64 * 1024];

struct px_tls_ctx {
  SSL_CTX *ssl;
  unsigned refs;
  bool server;
  bool no_verify;
  long long not_after;
  px_tls_observer observe;
  void *observe_arg;
};

/* A write waiting for the handshake. */
typedef struct tls_waiting {
  px_conn_write *w;
  struct tls_waiting *next;
} tls_waiting;

struct px_tls {
  px_conn *conn;
  px_tls_ctx *ctx;
  SSL *ssl;
  BIO *rbio, *wbio; /* owned by ssl */
  uv_timer_t later; /* delivers plaintext kept while paused */
  unsigned handles; /* open handles: the socket's, then the timer's */
  bool server;
  bool handshook;
  bool want_read;   /* the owner reads */
  bool socket_read; /* the socket is being read */
  int end;          /* the socket's end of input (0: none yet) */
  bool failed;      /* a TLS error ended it */
  uint8_t first[8]; /* the peer's first bytes */
  uint8_t nfirst;
  tls_waiting *wait; /* writes before the handshake, in order */
  tls_waiting **wait_tail;
  char error[160];
};

/* A ciphertext write: `w` completes with it (NULL: handshake or alert
 * records of rebound's own). */
typedef struct tls_wreq {
  uv_write_t req;
  px_conn_write *w;
  px_conn *conn;
  size_t len;
  uint8_t data[];
} tls_wreq;

/* ---- errors ---------------------------------------------------------------
 */

/* OpenSSL's reason for the latest failure: the verify result when the
 * peer's certificate was refused, else the first queued error. */
static void note_error(struct px_tls *t, const char *what) {
  if (t->error[0])
    return;
  long v = SSL_get_verify_result(t->ssl);
  unsigned long e = ERR_peek_error();
  if (v != X509_V_OK)
    snprintf(t->error, sizeof t->error, "%s", X509_verify_cert_error_string(v));
  else if (e)
    snprintf(t->error, sizeof t->error, "%s",
             ERR_reason_error_string(e) ? ERR_reason_error_string(e) : what);
  else
    snprintf(t->error, sizeof t->error, "%s", what);
  ERR_clear_error();
}

const char *px_tls_error(const px_conn *c) {
  return c->tls ? c->tls->error : "";
}

bool px_tls_established(const px_conn *c) {
  return c->tls && c->tls->handshook;
}

size_t px_tls_first_bytes(const px_conn *c, uint8_t *out, size_t cap) {
  size_t n = c->tls ? c->tls->nfirst : 0;
  if (n > cap)
    n = cap;
  if (n)
    memcpy(out, c->tls->first, n);
  return n;
}

/* ---- contexts -------------------------------------------------------------
 */

static void ctx_error(char *err, size_t cap, const char *what,
                      const char *file) {
  unsigned long e = ERR_peek_last_error();
  const char *why = e ? ERR_reason_error_string(e) : NULL;
  snprintf(err, cap, "%s%s%s: %s", what, file ? " " : "", file ? file : "",
           why ? why : "unknown error");
  ERR_clear_error();
}

static long long cert_not_after(SSL_CTX *ssl) {
  X509 *x = SSL_CTX_get0_certificate(ssl);
  struct tm tm;
  if (!x || ASN1_TIME_to_tm(X509_get0_notAfter(x), &tm) != 1)
    return 0;
  return (long long)timegm(&tm);
}

/* Settings both kinds share; false with `err` filled on failure. */
static bool ctx_common(SSL_CTX *ssl, const px_tls_opts *o, char *err,
                       size_t cap) {
  SSL_CTX_set_min_proto_version(ssl, TLS1_2_VERSION);
  SSL_CTX_set_options(ssl, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_mode(ssl, SSL_MODE_RELEASE_BUFFERS);
  if (o->ciphers && SSL_CTX_set_cipher_list(ssl, o->ciphers) != 1) {
    ctx_error(err, cap, "tls ciphers", o->ciphers);
    return false;
  }
  if (o->ciphersuites && SSL_CTX_set_ciphersuites(ssl, o->ciphersuites) != 1) {
    ctx_error(err, cap, "tls ciphersuites", o->ciphersuites);
    return false;
  }
  if (o->cert_file &&
      SSL_CTX_use_certificate_chain_file(ssl, o->cert_file) != 1) {
    ctx_error(err, cap, "certificate", o->cert_file);
    return false;
  }
  if (o->key_file &&
      SSL_CTX_use_PrivateKey_file(ssl, o->key_file, SSL_FILETYPE_PEM) != 1) {
    ctx_error(err, cap, "key", o->key_file);
    return false;
  }
  if (o->cert_file && o->key_file && SSL_CTX_check_private_key(ssl) != 1) {
    ctx_error(err, cap, "key does not match certificate", o->key_file);
    return false;
  }
  return true;
}

static px_tls_ctx *ctx_new(SSL_CTX *ssl, bool server) {
  px_tls_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    SSL_CTX_free(ssl);
    return NULL;
  }
  ctx->ssl = ssl;
  ctx->refs = 1;
  ctx->server = server;
  ctx->not_after = cert_not_after(ssl);
  return ctx;
}

px_tls_ctx *px_tls_server_ctx(const px_tls_opts *o, char *err, size_t cap) {
  if (!o->cert_file || !o->key_file) {
    snprintf(err, cap, "a TLS listener needs a certificate and a key");
    return NULL;
  }
  SSL_CTX *ssl = SSL_CTX_new(TLS_server_method());
  if (!ssl) {
    ctx_error(err, cap, "tls context", NULL);
    return NULL;
  }
  SSL_CTX_set_options(ssl, SSL_OP_CIPHER_SERVER_PREFERENCE);
  bool ok = ctx_common(ssl, o, err, cap);
  if (ok && o->ca_file) {
    STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(o->ca_file);
    ok = names && SSL_CTX_load_verify_locations(ssl, o->ca_file, NULL) == 1;
    if (ok) {
      SSL_CTX_set_client_CA_list(ssl, names);
      SSL_CTX_set_verify(ssl, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                         NULL);
    } else {
      sk_X509_NAME_pop_free(names, X509_NAME_free);
      ctx_error(err, cap, "client CA", o->ca_file);
    }
  }
  if (!ok) {
    SSL_CTX_free(ssl);
    return NULL;
  }
  return ctx_new(ssl, true);
}

px_tls_ctx *px_tls_client_ctx(const px_tls_opts *o, char *err, size_t cap) {
  SSL_CTX *ssl = SSL_CTX_new(TLS_client_method());
  if (!ssl) {
    ctx_error(err, cap, "tls context", NULL);
    return NULL;
  }
  bool ok = ctx_common(ssl, o, err, cap);
  if (ok && !o->no_verify) {
    ok = o->ca_file ? SSL_CTX_load_verify_locations(ssl, o->ca_file, NULL) == 1
                    : SSL_CTX_set_default_verify_paths(ssl) == 1;
    if (!ok)
      ctx_error(err, cap, "CA", o->ca_file ? o->ca_file : "(system store)");
  }
  if (!ok) {
    SSL_CTX_free(ssl);
    return NULL;
  }
  SSL_CTX_set_verify(ssl, o->no_verify ? SSL_VERIFY_NONE : SSL_VERIFY_PEER,
                     NULL);
  px_tls_ctx *ctx = ctx_new(ssl, false);
  if (ctx)
    ctx->no_verify = o->no_verify;
  return ctx;
}

void px_tls_ctx_ref(px_tls_ctx *ctx) {
  ctx->refs++;
}

void px_tls_ctx_unref(px_tls_ctx *ctx) {
  if (ctx && --ctx->refs == 0) {
    SSL_CTX_free(ctx->ssl);
    free(ctx);
  }
}

long long px_tls_ctx_not_after(const px_tls_ctx *ctx) {
  return ctx->not_after;
}

void px_tls_ctx_observe(px_tls_ctx *ctx, px_tls_observer fn, void *arg) {
  ctx->observe = fn;
  ctx->observe_arg = arg;
}

static void observed(struct px_tls *t, const char *failure) {
  if (t->ctx->observe)
    t->ctx->observe(t->ctx->observe_arg, t->server, failure);
}

/* ---- ciphertext out -------------------------------------------------------
 */

static void on_wreq(uv_write_t *req, int status) {
  tls_wreq *r = (tls_wreq *)req;
  px_conn *c = r->conn;
  px_conn_write *w = r->w;
  free(r);
  if (w)
    px_conn_write_done(w, status);
  else if (status < 0 && c->open)
    c->ev->write_failed(c->ctx, c, status);
}

/* Write what the write BIO holds, `w` completing with it. 0 or a libuv
 * error (w is then the caller's). */
static int send_pending(struct px_tls *t, px_conn_write *w) {
  size_t n = BIO_ctrl_pending(t->wbio);
  if (n == 0) {
    if (w) /* nothing to send for it (cannot be: it carried bytes) */
      px_conn_write_done(w, 0);
    return 0;
  }
  tls_wreq *r = malloc(sizeof *r + n);
  if (!r)
    return UV_ENOMEM;
  r->w = w;
  r->conn = t->conn;
  r->len = n;
  if (BIO_read(t->wbio, r->data, (int)n) != (int)n) {
    free(r);
    return UV_EIO;
  }
  uv_buf_t b = uv_buf_init((char *)r->data, (unsigned)n);
  int rc = uv_write(&r->req, (uv_stream_t *)&t->conn->tcp, &b, 1, on_wreq);
  if (rc < 0)
    free(r);
  return rc;
}

/* Records of rebound's own (handshake, alerts, tickets): a failure shows
 * as the connection's write error, from the loop. */
static void send_own(struct px_tls *t) {
  int rc = send_pending(t, NULL);
  if (rc < 0 && !t->error[0])
    snprintf(t->error, sizeof t->error, "write: %s", uv_strerror(rc));
}

/* Encrypt every buffer of `w` and write the result. */
static int encrypt_write(struct px_tls *t, px_conn_write *w) {
  for (unsigned i = 0; i < w->n; i++) {
    if (w->bufs[i].len == 0)
      continue;
    int n = SSL_write(t->ssl, w->bufs[i].base, (int)w->bufs[i].len);
    if (n <= 0) {
      note_error(t, "encrypt failed");
      return UV_EPROTO;
    }
  }
  return send_pending(t, w);
}

/* ---- the transport --------------------------------------------------------
 */

static void tls_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  (void)suggested;
  *buf = uv_buf_init((char *)read_buf, sizeof read_buf);
}

static void pump(struct px_tls *t);

static void tls_on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  px_conn *c = st->data;
  struct px_tls *t = c->tls;
  if (nread == 0)
    return;
  if (nread < 0) {
    t->end = (int)nread;
    uv_read_stop(st);
    t->socket_read = false;
  } else {
    while (t->nfirst < sizeof t->first && t->nfirst < (size_t)nread)
      t->first[t->nfirst] = (uint8_t)buf->base[t->nfirst], t->nfirst++;
    if (BIO_write(t->rbio, buf->base, (int)nread) != (int)nread)
      t->end = UV_ENOBUFS;
  }
  pump(t);
}

/* Read the socket while the handshake runs or the owner reads. */
static void socket_reading(struct px_tls *t) {
  bool want = !t->end && !t->failed && (t->want_read || !t->handshook);
  uv_stream_t *st = (uv_stream_t *)&t->conn->tcp;
  if (want && !t->socket_read)
    t->socket_read = uv_read_start(st, tls_alloc, tls_on_read) == 0;
  else if (!want && t->socket_read) {
    uv_read_stop(st);
    t->socket_read = false;
  }
}

/* Writes that waited for the handshake go now (or fail with it). */
static void release_waiting(struct px_tls *t, int status) {
  while (t->wait) {
    tls_waiting *q = t->wait;
    t->wait = q->next;
    int rc = status < 0 ? status : encrypt_write(t, q->w);
    if (rc < 0)
      px_conn_write_done(q->w, rc);
    free(q);
  }
  t->wait_tail = &t->wait;
}

static void handshake_failed(struct px_tls *t) {
  px_conn *c = t->conn;
  t->failed = true;
  if (t->nfirst && t->first[0] != 0x16) /* not a handshake record */
    snprintf(t->error, sizeof t->error, "not a TLS handshake");
  note_error(t, t->end ? "connection closed during the handshake"
                       : "handshake failed");
  send_own(t); /* the alert */
  observed(t, t->error);
  socket_reading(t);
  release_waiting(t, UV_EPROTO);
  if (!t->server)
    px_conn_connected(c, UV_EPROTO);
  else
    px_conn_read_done(c, UV_EPROTO);
}

/* Drive the handshake: true once it is done. */
static bool handshake(struct px_tls *t) {
  if (t->handshook)
    return true;
  int r = SSL_do_handshake(t->ssl);
  send_own(t);
  if (r == 1) {
    t->handshook = true;
    observed(t, NULL);
    socket_reading(t);
    release_waiting(t, 0);
    if (!t->server)
      px_conn_connected(t->conn, 0);
    return t->conn->open;
  }
  int e = SSL_get_error(t->ssl, r);
  if (e == SSL_ERROR_WANT_READ && !t->end)
    return false;
  handshake_failed(t);
  return false;
}

/* Decrypt into `b` as long as records are there and it has room: one
 * data event for what a socket read brought, not one per record. The last
 * SSL_read()'s return is left in *last. */
static size_t decrypt(struct px_tls *t, uv_buf_t b, int *last) {
  size_t got = 0;
  int n = 0;
  while (got < b.len &&
         (n = SSL_read(t->ssl, b.base + got, (int)(b.len - got))) > 0)
    got += (size_t)n;
  *last = n;
  return got;
}

/* Give the owner the plaintext there is, while it reads. */
static void deliver(struct px_tls *t) {
  px_conn *c = t->conn;
  while (c->open && t->want_read) {
    uv_buf_t b;
    int n;
    px_conn_alloc(c, &b);
    if (!b.base) {
      px_conn_read_done(c, UV_ENOBUFS);
      return;
    }
    size_t got = decrypt(t, b, &n);
    if (got) {
      px_conn_read_done(c, (ssize_t)got);
      continue;
    }
    int e = SSL_get_error(t->ssl, n);
    send_own(t); /* post-handshake records (tickets, key updates) */
    if (e == SSL_ERROR_WANT_READ && !t->end)
      return;
    if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_WANT_READ && t->end)) {
      px_conn_read_done(c, t->end && t->end != UV_EOF ? t->end : UV_EOF);
      return;
    }
    t->failed = true;
    note_error(t, "decrypt failed");
    px_conn_read_done(c, UV_EPROTO);
    return;
  }
}

static void pump(struct px_tls *t) {
  if (t->failed || !t->conn->open || !handshake(t))
    return;
  deliver(t);
}

static void on_later(uv_timer_t *tm) {
  struct px_tls *t = tm->data;
  pump(t);
}

static int tls_read_start(px_conn *c) {
  struct px_tls *t = c->tls;
  t->want_read = true;
  socket_reading(t);
  if (t->handshook &&
      (SSL_pending(t->ssl) || BIO_ctrl_pending(t->rbio) || t->end))
    uv_timer_start(&t->later, on_later, 0, 0);
  return 0;
}

static void tls_read_stop(px_conn *c) {
  struct px_tls *t = c->tls;
  t->want_read = false;
  uv_timer_stop(&t->later);
  socket_reading(t);
}

/* Everything goes through tls_write(): its slices stay pending until
 * their ciphertext is written. */
static int tls_try_write(px_conn *c, const uv_buf_t *bufs, unsigned n) {
  (void)c;
  (void)bufs;
  (void)n;
  return 0;
}

static int tls_write(px_conn *c, px_conn_write *w) {
  struct px_tls *t = c->tls;
  if (t->failed)
    return UV_EPROTO;
  if (t->handshook)
    return encrypt_write(t, w);
  tls_waiting *q = malloc(sizeof *q);
  if (!q)
    return UV_ENOMEM;
  *q = (tls_waiting){w, NULL};
  *t->wait_tail = q;
  t->wait_tail = &q->next;
  return 0;
}

static void tls_on_shutdown(uv_shutdown_t *req, int status) {
  px_conn_shutdown_done(req->data, status);
}

/* close_notify, then the TCP write side. */
static int tls_shutdown(px_conn *c) {
  struct px_tls *t = c->tls;
  if (t->handshook && !t->failed) {
    SSL_shutdown(t->ssl);
    send_own(t);
  }
  c->shutdown_req.data = c;
  return uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, tls_on_shutdown);
}

static void tls_free(struct px_tls *t) {
  SSL_free(t->ssl);
  px_tls_ctx_unref(t->ctx);
  free(t);
}

static void tls_on_closed(uv_handle_t *h) {
  px_conn *c = h->type == UV_TIMER ? ((struct px_tls *)h->data)->conn : h->data;
  struct px_tls *t = c->tls;
  if (--t->handles)
    return;
  c->tls = NULL;
  tls_free(t);
  px_conn_closed(c);
}

static void tls_close(px_conn *c) {
  struct px_tls *t = c->tls;
  if (uv_is_closing((uv_handle_t *)&c->tcp))
    return;
  release_waiting(t, UV_ECANCELED);
  if (t->handles == 2)
    uv_close((uv_handle_t *)&t->later, tls_on_closed);
  uv_close((uv_handle_t *)&c->tcp, tls_on_closed);
}

/* A connection that never opened its socket. */
static void tls_release(px_conn *c) {
  if (c->tls && !c->open) {
    tls_free(c->tls);
    c->tls = NULL;
  }
}

static void tls_on_connect(uv_connect_t *req, int status) {
  px_conn *c = req->data;
  struct px_tls *t = c->tls;
  if (status < 0 || !c->open) {
    px_conn_connected(c, status);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  socket_reading(t);
  handshake(t); /* the hello; connected fires when it is done */
}

static void timer_open(struct px_tls *t, uv_loop_t *loop) {
  uv_timer_init(loop, &t->later);
  t->later.data = t;
  t->handles = 2;
}

static int tls_connect(px_conn *c, uv_loop_t *loop, const struct sockaddr *sa) {
  int rc = px_conn_tcp_open(c, loop);
  if (rc < 0)
    return rc;
  c->tls->handles = 1;
  timer_open(c->tls, loop);
  c->connect_req.data = c;
  return uv_tcp_connect(&c->connect_req, &c->tcp, sa, tls_on_connect);
}

static const px_conn_io tls_io = {
    .connect = tls_connect,
    .read_start = tls_read_start,
    .read_stop = tls_read_stop,
    .try_write = tls_try_write,
    .write = tls_write,
    .shutdown = tls_shutdown,
    .close = tls_close,
    .release = tls_release,
};

/* ---- setting up ------------------------------------------------------------
 */

static struct px_tls *tls_new(px_conn *c, px_tls_ctx *ctx) {
  struct px_tls *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  t->ssl = SSL_new(ctx->ssl);
  t->rbio = BIO_new(BIO_s_mem());
  t->wbio = BIO_new(BIO_s_mem());
  if (!t->ssl || !t->rbio || !t->wbio) {
    BIO_free(t->rbio);
    BIO_free(t->wbio);
    SSL_free(t->ssl);
    free(t);
    return NULL;
  }
  SSL_set_bio(t->ssl, t->rbio, t->wbio);
  t->conn = c;
  t->ctx = ctx;
  px_tls_ctx_ref(ctx);
  t->server = ctx->server;
  t->wait_tail = &t->wait;
  return t;
}

int px_tls_accept(px_conn *c, px_tls_ctx *ctx) {
  struct px_tls *t = tls_new(c, ctx);
  if (!t)
    return UV_ENOMEM;
  SSL_set_accept_state(t->ssl);
  c->tls = t;
  c->io = &tls_io;
  timer_open(t, c->tcp.loop);
  return 0;
}

static bool is_ip(const char *host) {
  struct sockaddr_in6 a6;
  struct sockaddr_in a4;
  return uv_ip4_addr(host, 0, &a4) == 0 || uv_ip6_addr(host, 0, &a6) == 0;
}

/* SNI, and the name (or address) the certificate must carry. */
static bool name_peer(struct px_tls *t, const char *host) {
  if (is_ip(host))
    return t->ctx->no_verify ||
           X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), host) == 1;
  if (SSL_set_tlsext_host_name(t->ssl, host) != 1)
    return false;
  return t->ctx->no_verify || SSL_set1_host(t->ssl, host) == 1;
}

int px_tls_client(px_conn *c, px_tls_ctx *ctx, const char *host) {
  tls_release(c); /* a previous attempt's, never opened */
  struct px_tls *t = tls_new(c, ctx);
  if (!t)
    return UV_ENOMEM;
  SSL_set_connect_state(t->ssl);
  if (!name_peer(t, host)) {
    ERR_clear_error();
    tls_free(t);
    return UV_EINVAL;
  }
  c->tls = t;
  c->io = &tls_io;
  return 0;
}
