/* px_tls.h - TLS under px_conn: OpenSSL in memory-BIO mode on libuv.
 *
 * A TLS connection is a px_conn whose transport (px_conn_io) runs
 * OpenSSL between the socket and the owner: ciphertext read from the
 * socket is written into the SSL object's read BIO, and the plaintext
 * SSL_read() gives goes into the connection's read chunk, so the owner
 * parses plaintext exactly as over plain TCP. A write of queued slices is
 * encrypted into the write BIO and its ciphertext written in one
 * uv_write; the slices count as pending (px_conn_pending()) until that
 * write completes, so the owner's watermarks see TLS writes as they see
 * plain ones.
 *
 * Events keep px_conn's rule: they fire from the loop, never from inside
 * a px_conn_* call. Plaintext already decrypted when the owner pauses
 * stays in the SSL object; resuming delivers it from the loop (a timer of
 * 0 ms), then reading the socket goes on.
 *
 * The handshake: a server connection (px_tls_accept()) answers the
 * client's hello once reading starts. A client connection
 * (px_tls_client()) sends its hello once TCP is connected, and its
 * connected event fires when the handshake is done (status 0) or failed
 * (UV_EPROTO, px_tls_error() says why), so the owner's connect covers
 * the handshake. A handshake failure on a server connection is its end of
 * input: the eof event with UV_EPROTO.
 *
 * Contexts (px_tls_ctx) are built from files and counted: a connection
 * holds its context, so a reload that builds a new one leaves open
 * connections with theirs.
 */
#ifndef PX_TLS_H
#define PX_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include "px_conn.h"

typedef struct px_tls_ctx px_tls_ctx;

/* What a context is built from. Files are PEM. */
typedef struct px_tls_opts {
  const char *cert_file; /* a certificate chain (server: required) */
  const char *key_file;  /* its key */
  /* server: verify client certificates against these CAs and require
   * one; client: verify the server against these (NULL: the system's
   * store) */
  const char *ca_file;
  bool no_verify;           /* client: do not verify the server */
  const char *ciphers;      /* TLS 1.2 cipher list (NULL: OpenSSL's) */
  const char *ciphersuites; /* TLS 1.3 suites (NULL: OpenSSL's) */
} px_tls_opts;

/* A context for accepting (server) or connecting (client): TLS 1.2 at
 * least, no renegotiation, no compression. NULL on failure, with the file
 * and OpenSSL's reason in `err`. */
px_tls_ctx *px_tls_server_ctx(const px_tls_opts *o, char *err, size_t cap);
px_tls_ctx *px_tls_client_ctx(const px_tls_opts *o, char *err, size_t cap);
void px_tls_ctx_ref(px_tls_ctx *ctx);
void px_tls_ctx_unref(px_tls_ctx *ctx);
/* When the certificate the context presents stops being valid (seconds
 * since the epoch; 0: it presents none). */
long long px_tls_ctx_not_after(const px_tls_ctx *ctx);
/* `fn` is told of every handshake of the context's connections: done
 * (failure NULL) or failed (OpenSSL's reason). */
typedef void (*px_tls_observer)(void *arg, bool server, const char *failure);
void px_tls_ctx_observe(px_tls_ctx *ctx, px_tls_observer fn, void *arg);

/* Put TLS under an accepted connection (after px_conn_accept()). 0 or
 * UV_ENOMEM. */
int px_tls_accept(px_conn *c, px_tls_ctx *ctx);
/* Put TLS under a connection before px_conn_connect(): `host` is sent as
 * SNI and the server's certificate must name it (an IP address must be
 * among its addresses). 0, UV_ENOMEM or UV_EINVAL. */
int px_tls_client(px_conn *c, px_tls_ctx *ctx, const char *host);

/* Why the connection's TLS failed ("certificate has expired", "wrong
 * version number", ...); "" when it did not. */
const char *px_tls_error(const px_conn *c);
/* The handshake is done. */
bool px_tls_established(const px_conn *c);
/* The first bytes the peer sent (up to 8, fewer if `cap` is smaller):
 * what a peer that is "not a TLS handshake" spoke. */
size_t px_tls_first_bytes(const px_conn *c, uint8_t *out, size_t cap);

#endif
