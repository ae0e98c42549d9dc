/* The pure parts of the dead-letter operations: broker URLs, percent
 * decoding and query parameters, and messages rendered as JSON (every
 * header type, nesting, bytes that are not UTF-8). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "amqp.h"
#include "px_admin.h"
#include "px_dlq_cli.h"
#include "px_dlq_json.h"

static void test_url_forms(void **state) {
  (void)state;
  px_amqp_url u;
  char err[256];
  assert_int_equal(
      px_amqp_url_parse("amqp://guest:g%40st@broker:5673/%2F", &u, err, 256),
      0);
  assert_string_equal(u.user, "guest");
  assert_string_equal(u.password, "g@st");
  assert_true(u.has_password);
  assert_string_equal(u.addr.host, "broker");
  assert_int_equal(u.addr.port, 5673);
  assert_false(u.addr.tls);
  assert_string_equal(u.vhost, "/");

  assert_int_equal(px_amqp_url_parse("amqps://ops@[::1]/prod", &u, err, 256),
                   0);
  assert_string_equal(u.user, "ops");
  assert_false(u.has_password);
  assert_string_equal(u.addr.host, "::1");
  assert_int_equal(u.addr.port, 5671);
  assert_true(u.addr.tls);
  assert_string_equal(u.vhost, "prod");

  /* an '@' in the password may go unencoded: the user ends at the last */
  assert_int_equal(px_amqp_url_parse("amqp://u:p@ss@h:1/v", &u, err, 256), 0);
  assert_string_equal(u.user, "u");
  assert_string_equal(u.password, "p@ss");
  assert_string_equal(u.addr.host, "h");

  assert_int_equal(px_amqp_url_parse("amqp://u@h", &u, err, 256), 0);
  assert_string_equal(u.vhost, "/");
  assert_int_equal(u.addr.port, 5672);
  assert_int_equal(px_amqp_url_parse("amqp://u@h/", &u, err, 256), 0);
  assert_string_equal(u.vhost, "/");
}

static void test_url_errors_name_the_part(void **state) {
  (void)state;
  px_amqp_url u;
  char err[256];
  assert_int_equal(px_amqp_url_parse("http://u@h", &u, err, 256), -1);
  assert_non_null(strstr(err, "amqp://"));
  assert_int_equal(px_amqp_url_parse("amqp://h:5672/", &u, err, 256), -1);
  assert_non_null(strstr(err, "no user"));
  assert_int_equal(px_amqp_url_parse("amqp://u:secret@h:99999/", &u, err, 256),
                   -1);
  assert_non_null(strstr(err, "host or port"));
  assert_null(strstr(err, "secret")); /* never the password */
  assert_int_equal(px_amqp_url_parse("amqp://u:p%zz@h/", &u, err, 256), -1);
  assert_null(strstr(err, "p%zz"));
  assert_int_equal(px_amqp_url_parse("amqp://u@h/a%00b", &u, err, 256), -1);
  assert_non_null(strstr(err, "vhost"));
}

static void test_query_params(void **state) {
  (void)state;
  char v[16];
  assert_int_equal(px_admin_param("limit=5&vhost=%2Fprod", "vhost", v, 16), 1);
  assert_string_equal(v, "/prod");
  assert_int_equal(px_admin_param("limit=5&vhost=%2Fprod", "limit", v, 16), 1);
  assert_string_equal(v, "5");
  assert_int_equal(px_admin_param("xlimit=5", "limit", v, 16), 0);
  assert_int_equal(px_admin_param("", "limit", v, 16), 0);
  assert_int_equal(px_admin_param("to=a+b", "to", v, 16), 1);
  assert_string_equal(v, "a+b"); /* a path's rules: '+' is itself */
  assert_int_equal(px_admin_param("to=%4", "to", v, 16), -1);
  assert_int_equal(px_admin_param("to=0123456789abcdef", "to", v, 16), -1);
  assert_int_equal(px_admin_decode("a%2fb", 5, v, 16), 0);
  assert_string_equal(v, "a/b");
}

/* A content header with these headers (a table payload) and properties. */
static size_t header(uint8_t *buf, size_t cap, const uint8_t *table,
                     size_t tlen, amqp_content_header *h) {
  memset(h, 0, sizeof *h);
  h->class_id = 60;
  h->body_size = 5;
  h->props.flags = AMQP_P_HEADERS | AMQP_P_MESSAGE_ID | AMQP_P_DELIVERY_MODE |
                   AMQP_P_TIMESTAMP;
  h->props.headers = (amqp_bytes){table, tlen};
  h->props.message_id = amqp_cstr("m-1");
  h->props.delivery_mode = 2;
  h->props.timestamp = 0;
  amqp_writer w = amqp_writer_make(buf, cap);
  assert_int_equal(amqp_content_header_encode(h, &w), AMQP_OK);
  return w.len;
}

static void put(amqp_writer *w, const char *k, amqp_field f) {
  amqp_table_write_entry(w, amqp_cstr(k), &f);
}

static char *render(const uint8_t *table, size_t tlen, const uint8_t *body,
                    size_t blen, const char *prefix) {
  uint8_t hb[2048];
  amqp_content_header h, d;
  size_t n = header(hb, sizeof hb, table, tlen, &h);
  assert_int_equal(amqp_content_header_decode((amqp_bytes){hb, n}, &d),
                   AMQP_OK);
  px_dlq_message m = {7,  true, amqp_cstr(""), amqp_cstr("q.dlq"),
                      &d, body, blen};
  retry_policy p = {0};
  snprintf(p.header_prefix, sizeof p.header_prefix, "%s", prefix);
  px_admin_response r = {.status = 200};
  assert_int_equal(px_dlq_json_message(&r, &m, &p), 0);
  assert_int_equal(px_admin_append(&r, "", 1), 0); /* NUL */
  return r.body;
}

static void test_message_json(void **state) {
  (void)state;
  uint8_t t[1024], inner[128], arr[128];
  amqp_writer iw = amqp_writer_make(inner, sizeof inner);
  put(&iw, "count", amqp_field_long(2));
  amqp_writer aw = amqp_writer_make(arr, sizeof arr);
  amqp_field s = amqp_field_string(amqp_cstr("x\"y"));
  amqp_field_write(&aw, &s);
  amqp_field b = {.type = 't'};
  b.v.u = 1;
  amqp_field_write(&aw, &b);
  amqp_writer w = amqp_writer_make(t, sizeof t);
  put(&w, "rb-retry-count", amqp_field_long(3));
  put(&w, "rb-source-queue", amqp_field_string(amqp_cstr("orders")));
  put(&w, "rb-dead-letter-reason",
      amqp_field_string(amqp_cstr("max-attempts")));
  put(&w, "rb-first-failed-at", amqp_field_timestamp(1764651600));
  amqp_field f = {.type = 'F'};
  f.v.bytes = (amqp_bytes){inner, iw.len};
  put(&w, "nested", f);
  amqp_field a = {.type = 'A'};
  a.v.bytes = (amqp_bytes){arr, aw.len};
  put(&w, "list", a);
  amqp_field dec = {.type = 'D'};
  dec.v.dec.scale = 2;
  dec.v.dec.value = 1234;
  put(&w, "price", dec);
  amqp_field v = {.type = 'V'};
  put(&w, "nothing", v);
  amqp_field nan = {.type = 'd'};
  nan.v.d = 0.0 / 0.0;
  put(&w, "nan", nan); /* JSON has no NaN */
  char *j = render(t, w.len, (const uint8_t *)"ab\xff\n\"", 5, "rb-");
  assert_non_null(strstr(j, "\"index\":7,\"redelivered\":true"));
  assert_non_null(strstr(
      j, "\"rebound\":{\"source_queue\":\"orders\",\"retry_count\":3,"
         "\"first_failed_at\":\"2025-12-02T05:00:00Z\",\"last_failed_at\":null,"
         "\"reason\":\"max-attempts\""));
  assert_non_null(strstr(j, "\"redriven_at\":null}"));
  assert_non_null(strstr(j, "\"properties\":{\"delivery_mode\":2,"
                            "\"message_id\":\"m-1\",\"timestamp\":"
                            "\"1970-01-01T00:00:00Z\"}"));
  assert_non_null(strstr(j, "\"nested\":{\"count\":2}"));
  assert_non_null(strstr(j, "\"list\":[\"x\\\"y\",true]"));
  assert_non_null(strstr(j, "\"price\":12.34"));
  assert_non_null(strstr(j, "\"nothing\":null"));
  assert_non_null(strstr(j, "\"nan\":null"));
  assert_non_null(strstr(j, "\"body_size\":5,\"body\":\"ab\\ufffd\\u000a\\\"\""
                            ",\"body_truncated\":false}"));
  free(j);
}

/* A long body is cut at PX_DLQ_PREVIEW bytes, never inside a character:
 * a sequence the cut splits becomes U+FFFD. */
static void test_message_preview_cut(void **state) {
  (void)state;
  uint8_t body[PX_DLQ_PREVIEW + 10];
  memset(body, 'a', sizeof body);
  memcpy(body + PX_DLQ_PREVIEW - 1, "\xc3\xa9", 2); /* é across the cut */
  char *j = render(NULL, 0, body, sizeof body, "rebound-");
  assert_non_null(strstr(j, "a\\ufffd\",\"body_truncated\":true}"));
  assert_non_null(strstr(j, "\"body_size\":1034"));
  assert_non_null(strstr(j, "\"headers\":{}"));
  assert_non_null(strstr(j, "\"source_queue\":null"));
  free(j);
}

/* Tables nested past the renderer's depth come out as null, not as a
 * stack overflow. */
static void test_message_deep_nesting(void **state) {
  (void)state;
  uint8_t a[4096], b[4096];
  uint8_t *cur = a, *next = b;
  size_t len = 0;
  for (int depth = 0; depth < 20; depth++) {
    amqp_writer w = amqp_writer_make(next, 4096);
    amqp_field f = {.type = 'F'};
    f.v.bytes = (amqp_bytes){cur, len};
    put(&w, "d", f);
    len = w.len;
    uint8_t *t = cur;
    cur = next;
    next = t;
  }
  char *j = render(cur, len, (const uint8_t *)"x", 1, "rebound-");
  assert_non_null(strstr(j, "{\"d\":null}"));
  free(j);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_url_forms),
      cmocka_unit_test(test_url_errors_name_the_part),
      cmocka_unit_test(test_query_params),
      cmocka_unit_test(test_message_json),
      cmocka_unit_test(test_message_preview_cut),
      cmocka_unit_test(test_message_deep_nesting),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
