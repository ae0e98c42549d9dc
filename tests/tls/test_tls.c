/* test_tls.c - the TLS transport (px_tls) over real loopback sockets: a
 * server and a client px_conn in one loop, certificates made by
 * make_certs.sh (the directory is argv[1]).
 *
 * The server end echoes what it reads unless a test says otherwise; each
 * test checks what each end received, its connect and end-of-input
 * status, and the reason px_tls_error() gives.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "px_tls.h"

static const char *certs;

typedef struct end {
  px_conn conn;
  uint8_t *got;
  size_t got_len, got_cap;
  int connected; /* 1 ok, < 0 the error, 0 not yet */
  int eof;       /* the end of input (0: none yet) */
  int write_failed;
  bool closed;
  bool echo;            /* write back what is read */
  size_t pause_at;      /* stop reading once this much came (0: never) */
  unsigned data_events; /* data events seen */
} end;

typedef struct world {
  uv_loop_t loop;
  uv_tcp_t listener;
  struct sockaddr_in addr;
  px_tls_ctx *server_ctx;
  end server, client;
  bool accepted;
  bool listening;
} world;

static world *W;

static char *path(const char *name) {
  static char buf[8][512];
  static unsigned i;
  char *p = buf[i++ % 8];
  snprintf(p, 512, "%s/%s", certs, name);
  return p;
}

/* ---- the ends' events ------------------------------------------------------
 */

static void on_data(void *ctx, px_conn *c, size_t n) {
  end *e = ctx;
  px_chunk *in = px_conn_input(c);
  size_t len = in->len - in->off;
  (void)n;
  if (e->got_len + len > e->got_cap) {
    e->got_cap = (e->got_len + len) * 2;
    e->got = realloc(e->got, e->got_cap);
    assert_non_null(e->got);
  }
  memcpy(e->got + e->got_len, in->data + in->off, len);
  e->got_len += len;
  e->data_events++;
  if (e->echo) {
    assert_int_equal(px_conn_queue_copy(c, in->data + in->off, len), 0);
    assert_int_equal(px_conn_flush(c), 0);
  }
  in->off = in->len;
  assert_int_equal(px_conn_keep(c, 0), 0);
  if (e->pause_at && e->got_len >= e->pause_at)
    px_conn_pause(c);
}

static void on_eof(void *ctx, px_conn *c, int err) {
  end *e = ctx;
  (void)c;
  e->eof = err;
}

static void on_write_failed(void *ctx, px_conn *c, int err) {
  end *e = ctx;
  (void)c;
  e->write_failed = err;
}

static void on_written(void *ctx, px_conn *c) {
  (void)ctx;
  (void)c;
}

static void on_connected(void *ctx, px_conn *c, int status) {
  end *e = ctx;
  (void)c;
  e->connected = status == 0 ? 1 : status;
}

static void on_closed(void *ctx, px_conn *c) {
  end *e = ctx;
  (void)c;
  e->closed = true;
}

static const px_conn_events events = {on_data,    on_eof,       on_write_failed,
                                      on_written, on_connected, on_closed};

/* ---- the loop --------------------------------------------------------------
 */

static void on_deadline(uv_timer_t *t) {
  *(bool *)t->data = true;
}

/* Run the loop until `done` says so, for at most `ms`. */
static bool run_until(bool (*done)(world *), unsigned ms) {
  bool late = false;
  uv_timer_t t;
  uv_timer_init(&W->loop, &t);
  t.data = &late;
  uv_timer_start(&t, on_deadline, ms, 0);
  while (!done(W) && !late)
    uv_run(&W->loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&W->loop, UV_RUN_NOWAIT);
  return !late;
}

static void on_connection(uv_stream_t *l, int status) {
  world *w = l->data;
  assert_int_equal(status, 0);
  px_conn_init(&w->server.conn, "server", &events, &w->server);
  assert_int_equal(px_conn_accept(&w->server.conn, &w->loop, l), 0);
  if (w->server_ctx)
    assert_int_equal(px_tls_accept(&w->server.conn, w->server_ctx), 0);
  w->accepted = true;
  px_conn_read(&w->server.conn);
}

/* A TLS server with `o` (NULL: plain TCP) on a loopback port. */
static void serve(const px_tls_opts *o) {
  char err[256] = "";
  if (o) {
    W->server_ctx = px_tls_server_ctx(o, err, sizeof err);
    assert_non_null(W->server_ctx);
  }
  W->server.echo = true;
  uv_tcp_init(&W->loop, &W->listener);
  W->listening = true;
  W->listener.data = W;
  uv_ip4_addr("127.0.0.1", 0, &W->addr);
  assert_int_equal(uv_tcp_bind(&W->listener, (struct sockaddr *)&W->addr, 0),
                   0);
  int len = sizeof W->addr;
  uv_tcp_getsockname(&W->listener, (struct sockaddr *)&W->addr, &len);
  assert_int_equal(uv_listen((uv_stream_t *)&W->listener, 16, on_connection),
                   0);
}

static px_tls_opts server_opts(void) {
  return (px_tls_opts){.cert_file = path("server.pem"),
                       .key_file = path("server.key")};
}

/* Connect the client end over TLS with `o` to `host` (NULL: plain). */
static void dial(const px_tls_opts *o, const char *host) {
  px_conn_init(&W->client.conn, "client", &events, &W->client);
  if (o) {
    char err[256] = "";
    px_tls_ctx *ctx = px_tls_client_ctx(o, err, sizeof err);
    assert_non_null(ctx);
    assert_int_equal(px_tls_client(&W->client.conn, ctx, host), 0);
    px_tls_ctx_unref(ctx); /* the connection holds it */
  }
  assert_int_equal(
      px_conn_connect(&W->client.conn, &W->loop, (struct sockaddr *)&W->addr),
      0);
}

static bool client_connected(world *w) {
  return w->client.connected != 0;
}

static void dial_ok(const char *host) {
  px_tls_opts o = {.ca_file = path("ca.pem")};
  dial(&o, host);
  assert_true(run_until(client_connected, 5000));
  assert_int_equal(W->client.connected, 1);
  assert_true(px_tls_established(&W->client.conn));
  px_conn_read(&W->client.conn);
}

static void send_bytes(end *e, const uint8_t *p, size_t n) {
  while (n) {
    size_t k = n > 60000 ? 60000 : n;
    assert_int_equal(px_conn_queue_copy(&e->conn, p, k), 0);
    p += k;
    n -= k;
  }
  assert_int_equal(px_conn_flush(&e->conn), 0);
}

static size_t want_len;
static bool client_has_all(world *w) {
  return w->client.got_len >= want_len || w->client.eof;
}
static bool server_has_all(world *w) {
  return w->server.got_len >= want_len || w->server.eof;
}
static bool server_ended(world *w) {
  return w->server.eof != 0;
}
static bool client_ended(world *w) {
  return w->client.eof != 0 || w->client.connected < 0;
}

/* ---- fixtures --------------------------------------------------------------
 */

static int setup(void **state) {
  W = calloc(1, sizeof *W);
  uv_loop_init(&W->loop);
  *state = W;
  return 0;
}

static bool all_closed(world *w) {
  return (!w->accepted || w->server.closed) &&
         (!w->client.conn.open || w->client.closed);
}

static int teardown(void **state) {
  world *w = *state;
  if (w->accepted)
    px_conn_close(&w->server.conn);
  bool client_open = w->client.conn.open;
  px_conn_close(&w->client.conn);
  if (!client_open)
    w->client.closed = true;
  if (w->listening)
    uv_close((uv_handle_t *)&w->listener, NULL);
  run_until(all_closed, 5000);
  uv_run(&w->loop, UV_RUN_DEFAULT);
  px_conn_free(&w->server.conn);
  px_conn_free(&w->client.conn);
  px_tls_ctx_unref(w->server_ctx);
  assert_int_equal(uv_loop_close(&w->loop), 0);
  free(w->server.got);
  free(w->client.got);
  free(w);
  return 0;
}

/* ---- tests -----------------------------------------------------------------
 */

static uint8_t *pattern(size_t n) {
  uint8_t *p = malloc(n);
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(i * 7 + i / 251);
  return p;
}

/* 4 MiB each way through TLS on both ends, byte for byte; the slices
 * written count as pending until their ciphertext is written. */
static void test_echo(void **state) {
  (void)state;
  px_tls_opts so = server_opts();
  serve(&so);
  dial_ok("localhost");
  size_t n = 4u << 20;
  uint8_t *p = pattern(n);
  send_bytes(&W->client, p, n);
  assert_true(px_conn_pending(&W->client.conn) > 0);
  want_len = n;
  assert_true(run_until(client_has_all, 20000));
  assert_int_equal(W->client.got_len, n);
  assert_memory_equal(W->client.got, p, n);
  assert_int_equal(W->server.got_len, n);
  assert_true(px_tls_established(&W->server.conn));
  assert_string_equal(px_tls_error(&W->client.conn), "");
  assert_int_equal(px_conn_pending(&W->client.conn), 0);
  free(p);
}

/* The certificate names 127.0.0.1 too: a client that dials the address
 * verifies it. */
static void test_ip_address_verified(void **state) {
  (void)state;
  px_tls_opts so = server_opts();
  serve(&so);
  dial_ok("127.0.0.1");
}

static void expect_refused(const char *host, const char *ca,
                           const char *reason) {
  px_tls_opts o = {.ca_file = path(ca)};
  dial(&o, host);
  assert_true(run_until(client_connected, 5000));
  assert_int_equal(W->client.connected, UV_EPROTO);
  assert_false(px_tls_established(&W->client.conn));
  if (!strstr(px_tls_error(&W->client.conn), reason))
    fail_msg("error \"%s\", expected \"%s\"", px_tls_error(&W->client.conn),
             reason);
  /* the server learns it from the client's alert */
  assert_true(run_until(server_ended, 5000));
  assert_int_equal(W->server.eof, UV_EPROTO);
  assert_int_equal(W->server.got_len, 0);
}

static void test_unknown_ca(void **state) {
  (void)state;
  px_tls_opts so = server_opts();
  serve(&so);
  expect_refused("localhost", "other-ca.pem",
                 "unable to get local issuer certificate");
}

static void test_wrong_host_name(void **state) {
  (void)state;
  px_tls_opts so = server_opts();
  serve(&so);
  expect_refused("broker.example", "ca.pem", "hostname mismatch");
}

static void test_expired(void **state) {
  (void)state;
  px_tls_opts so = {.cert_file = path("expired.pem"),
                    .key_file = path("expired.key")};
  serve(&so);
  expect_refused("localhost", "ca.pem", "certificate has expired");
}

/* Verification off: a certificate of an unknown CA is taken. */
static void test_no_verify(void **state) {
  (void)state;
  px_tls_opts so = {.cert_file = path("rogue.pem"),
                    .key_file = path("rogue.key")};
  serve(&so);
  px_tls_opts o = {.no_verify = true};
  dial(&o, "localhost");
  assert_true(run_until(client_connected, 5000));
  assert_int_equal(W->client.connected, 1);
}

/* Client certificates required: one signed by the CA passes, none is
 * refused by the server. */
static void test_client_certificate(void **state) {
  (void)state;
  px_tls_opts so = server_opts();
  so.ca_file = path("ca.pem");
  serve(&so);
  px_tls_opts o = {.ca_file = path("ca.pem"),
                   .cert_file = path("client.pem"),
                   .key_file = path("client.key")};
  dial(&o, "localhost");
  assert_true(run_until(client_connected, 5000));
  assert_int_equal(W->client.connected, 1);
  px_conn_read(&W->client.conn);
  send_bytes(&W->client, (const uint8_t *)"hello", 5);
  want_len = 5;
  assert_true(run_until(client_has_all, 5000));
  assert_memory_equal(W->client.got, "hello", 5);
}

static void test_client_certificate_missing(void **state) {
  (void)state;
  px_tls_opts so = server_opts();
  so.ca_file = path("ca.pem");
  serve(&so);
  px_tls_opts o = {.ca_file = path("ca.pem")};
  dial(&o, "localhost");
  assert_true(run_until(server_ended, 5000));
  assert_int_equal(W->server.eof, UV_EPROTO);
  if (!strstr(px_tls_error(&W->server.conn), "certificate"))
    fail_msg("server error \"%s\"", px_tls_error(&W->server.conn));
  /* TLS 1.3: the client's handshake was done; the alert ends its input */
  px_conn_read(&W->client.conn);
  assert_true(run_until(client_ended, 5000));
  assert_int_equal(W->client.got_len, 0);
}

/* Plain AMQP on a TLS port: the server's handshake fails, and says why. */
static void test_plain_client_on_tls_port(void **state) {
  (void)state;
  px_tls_opts so = server_opts();
  serve(&so);
  dial(NULL, NULL);
  assert_true(run_until(client_connected, 5000));
  px_conn_read(&W->client.conn);
  send_bytes(&W->client, (const uint8_t *)"AMQP\0\0\x09\x01", 8);
  assert_true(run_until(server_ended, 5000));
  assert_int_equal(W->server.eof, UV_EPROTO);
  assert_int_equal(W->server.got_len, 0);
  assert_true(px_tls_error(&W->server.conn)[0] != '\0');
}

/* The server end pauses after its first read: what was decrypted stays
 * in the SSL object, and comes from the loop once it reads again. */
static void test_pause_keeps_plaintext(void **state) {
  (void)state;
  px_tls_opts so = server_opts();
  serve(&so);
  W->server.echo = false;
  W->server.pause_at = 1;
  dial_ok("localhost");
  size_t n = 1u << 20;
  uint8_t *p = pattern(n);
  send_bytes(&W->client, p, n);
  uv_sleep(100);
  for (int i = 0; i < 50; i++)
    uv_run(&W->loop, UV_RUN_NOWAIT);
  size_t first = W->server.got_len;
  assert_true(first > 0 && first < n);
  W->server.pause_at = 0;
  px_conn_resume(&W->server.conn);
  assert_int_equal(W->server.got_len, first); /* nothing from inside */
  want_len = n;
  assert_true(run_until(server_has_all, 10000));
  assert_int_equal(W->server.got_len, n);
  assert_memory_equal(W->server.got, p, n);
  free(p);
}

/* The client's write side is shut down: close_notify, then EOF. The
 * server sees a clean end of input. */
static void test_close_notify(void **state) {
  (void)state;
  px_tls_opts so = server_opts();
  serve(&so);
  W->server.echo = false;
  dial_ok("localhost");
  send_bytes(&W->client, (const uint8_t *)"bye", 3);
  assert_int_equal(px_conn_linger(&W->client.conn), 0);
  assert_true(run_until(server_ended, 5000));
  assert_int_equal(W->server.eof, UV_EOF);
  assert_int_equal(W->server.got_len, 3);
}

/* Context errors name the file and the reason. */
static void test_context_errors(void **state) {
  (void)state;
  char err[256];
  px_tls_opts o = {.cert_file = path("missing.pem"),
                   .key_file = path("server.key")};
  assert_null(px_tls_server_ctx(&o, err, sizeof err));
  assert_non_null(strstr(err, "missing.pem"));
  o = (px_tls_opts){.cert_file = path("server.pem"),
                    .key_file = path("client.key")};
  assert_null(px_tls_server_ctx(&o, err, sizeof err));
  assert_non_null(strstr(err, "client.key"));
  assert_non_null(strstr(err, "mismatch"));
  o = (px_tls_opts){.cert_file = path("server.pem")};
  assert_null(px_tls_server_ctx(&o, err, sizeof err));
  o = (px_tls_opts){.ca_file = path("missing-ca.pem")};
  assert_null(px_tls_client_ctx(&o, err, sizeof err));
  assert_non_null(strstr(err, "missing-ca.pem"));
  o = (px_tls_opts){.cert_file = path("server.pem"),
                    .key_file = path("server.key"),
                    .ciphers = "NO-SUCH-CIPHER"};
  assert_null(px_tls_server_ctx(&o, err, sizeof err));
  assert_non_null(strstr(err, "NO-SUCH-CIPHER"));
  o = server_opts();
  px_tls_ctx *ctx = px_tls_server_ctx(&o, err, sizeof err);
  assert_non_null(ctx);
  assert_true(px_tls_ctx_not_after(ctx) > 1700000000LL);
  px_tls_ctx_unref(ctx);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_tls CERT-DIR\n");
    return 2;
  }
  certs = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_echo, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ip_address_verified, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_unknown_ca, setup, teardown),
      cmocka_unit_test_setup_teardown(test_wrong_host_name, setup, teardown),
      cmocka_unit_test_setup_teardown(test_expired, setup, teardown),
      cmocka_unit_test_setup_teardown(test_no_verify, setup, teardown),
      cmocka_unit_test_setup_teardown(test_client_certificate, setup, teardown),
      cmocka_unit_test_setup_teardown(test_client_certificate_missing, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_plain_client_on_tls_port, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_pause_keeps_plaintext, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_close_notify, setup, teardown),
      cmocka_unit_test_setup_teardown(test_context_errors, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
