/* bench_tls.h - OpenSSL for the benchmark tools (fake_broker, pump_client,
 * idle_conns, tls_handshakes): contexts, a blocking client handshake, and
 * what was negotiated. Header-only; like bench_amqp.h it shares no code
 * with rebound.
 *
 * Client contexts verify the server against a CA file and the name given
 * as SNI (as rebound and HAProxy do upstream) and keep no sessions: every
 * handshake is a full one. Server contexts present a certificate chain
 * and, like RabbitMQ 3.10 on Erlang/OTP 25, issue no session tickets and
 * keep no session cache, so a client can never resume.
 */
#ifndef BENCH_TLS_H
#define BENCH_TLS_H

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>

#include "bench_amqp.h"

/* OpenSSL's queued errors, after `what`, on stderr. */
static inline void bt_errors(const char *tool, const char *what) {
  unsigned long e;
  char buf[256];
  fprintf(stderr, "%s: %s", tool, what);
  while ((e = ERR_get_error()) != 0) {
    ERR_error_string_n(e, buf, sizeof buf);
    fprintf(stderr, ": %s", buf);
  }
  fprintf(stderr, "\n");
}

/* A client context: TLS 1.2 at least, the server verified against
 * `ca_file`, no session cache (every handshake full). NULL on failure. */
static inline SSL_CTX *bt_client_ctx(const char *tool, const char *ca_file) {
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) {
    bt_errors(tool, "SSL_CTX_new");
    return NULL;
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  if (SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1) {
    bt_errors(tool, ca_file);
    SSL_CTX_free(ctx);
    return NULL;
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  return ctx;
}

/* A server context presenting `cert` (chain, PEM) with `key`: no tickets,
 * no session cache. Partial writes, so SSL_write on a non-blocking socket
 * behaves like write(2). NULL on failure. */
static inline SSL_CTX *bt_server_ctx(const char *tool, const char *cert,
                                     const char *key) {
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx) {
    bt_errors(tool, "SSL_CTX_new");
    return NULL;
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
                            SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    bt_errors(tool, cert);
    SSL_CTX_free(ctx);
    return NULL;
  }
  return ctx;
}

/* An SSL object for a client connection on `fd`: `name` is sent as SNI
 * and must be in the server's certificate. NULL on failure. */
static inline SSL *bt_client_ssl(SSL_CTX *ctx, int fd, const char *name) {
  SSL *ssl = SSL_new(ctx);
  if (!ssl)
    return NULL;
  if (SSL_set_fd(ssl, fd) != 1 || SSL_set_tlsext_host_name(ssl, name) != 1 ||
      SSL_set1_host(ssl, name) != 1) {
    SSL_free(ssl);
    return NULL;
  }
  SSL_set_connect_state(ssl);
  return ssl;
}

/* The client handshake on a blocking socket (its SO_RCVTIMEO bounds it).
 * The SSL object, or NULL with the reason on stderr. */
static inline SSL *bt_connect(const char *tool, SSL_CTX *ctx, int fd,
                              const char *name) {
  SSL *ssl = bt_client_ssl(ctx, fd, name);
  if (!ssl) {
    bt_errors(tool, "SSL_new");
    return NULL;
  }
  if (SSL_connect(ssl) != 1) {
    long v = SSL_get_verify_result(ssl);
    if (v != X509_V_OK)
      fprintf(stderr, "%s: certificate: %s\n", tool,
              X509_verify_cert_error_string(v));
    bt_errors(tool, "TLS handshake");
    SSL_free(ssl);
    return NULL;
  }
  return ssl;
}

/* "TLSv1.3/TLS_AES_256_GCM_SHA384" (a static buffer). */
static inline const char *bt_describe(SSL *ssl) {
  static char buf[96];
  snprintf(buf, sizeof buf, "%s/%s", SSL_get_version(ssl),
           SSL_CIPHER_get_name(SSL_get_current_cipher(ssl)));
  return buf;
}

#endif
