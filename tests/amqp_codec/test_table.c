/* Field tables and arrays: every type, nesting, limits, set/replace. */
#include "test_common.h"

#include <math.h>

/* Builds a table with one entry of every field type RabbitMQ knows. */
static size_t build_every_type(uint8_t *buf, size_t cap) {
  amqp_writer w = amqp_writer_make(buf, cap);
  amqp_field f;
  uint8_t arr[64], inner[64];

  /* an array: [int32 7, string "x"] */
  amqp_writer aw = amqp_writer_make(arr, sizeof arr);
  f.type = 'I';
  f.v.i = 7;
  amqp_field_write(&aw, &f);
  f = amqp_field_string(BYTES("x"));
  amqp_field_write(&aw, &f);
  /* a nested table: {k: void} */
  amqp_writer iw = amqp_writer_make(inner, sizeof inner);
  f.type = 'V';
  amqp_table_write_entry(&iw, BYTES("k"), &f);

  f.type = 't', f.v.u = 1, amqp_table_write_entry(&w, BYTES("bool"), &f);
  f.type = 'b', f.v.i = -5, amqp_table_write_entry(&w, BYTES("i8"), &f);
  f.type = 'B', f.v.u = 250, amqp_table_write_entry(&w, BYTES("u8"), &f);
  f.type = 's', f.v.i = -300, amqp_table_write_entry(&w, BYTES("i16"), &f);
  f.type = 'u', f.v.u = 65000, amqp_table_write_entry(&w, BYTES("u16"), &f);
  f.type = 'I', f.v.i = -70000, amqp_table_write_entry(&w, BYTES("i32"), &f);
  f.type = 'i', f.v.u = 4000000000u,
  amqp_table_write_entry(&w, BYTES("u32"), &f);
  f.type = 'l', f.v.i = INT64_MIN, amqp_table_write_entry(&w, BYTES("i64"), &f);
  f.type = 'f', f.v.f = 1.5f, amqp_table_write_entry(&w, BYTES("f32"), &f);
  f.type = 'd', f.v.d = -2.25, amqp_table_write_entry(&w, BYTES("f64"), &f);
  f.type = 'D', f.v.dec.scale = 2, f.v.dec.value = 12345,
  amqp_table_write_entry(&w, BYTES("dec"), &f);
  f = amqp_field_string(BYTES("hello"));
  amqp_table_write_entry(&w, BYTES("str"), &f);
  f.type = 'x', f.v.bytes = BYTES("\x00\x01\xff");
  amqp_table_write_entry(&w, BYTES("bin"), &f);
  f.type = 'A', f.v.bytes = (amqp_bytes){arr, aw.len};
  amqp_table_write_entry(&w, BYTES("arr"), &f);
  f = amqp_field_timestamp(1700000000);
  amqp_table_write_entry(&w, BYTES("ts"), &f);
  f.type = 'F', f.v.bytes = (amqp_bytes){inner, iw.len};
  amqp_table_write_entry(&w, BYTES("tbl"), &f);
  f.type = 'V', amqp_table_write_entry(&w, BYTES("void"), &f);
  assert_false(w.failed || aw.failed || iw.failed);
  return w.len;
}

static void test_every_type_decodes(void **state) {
  (void)state;
  uint8_t buf[512];
  amqp_bytes t = {buf, build_every_type(buf, sizeof buf)};
  amqp_table_iter it;
  amqp_bytes k;
  amqp_field v;

  assert_int_equal(amqp_table_validate(t, AMQP_TABLE_MAX_DEPTH), AMQP_OK);
  amqp_table_iter_init(&it, t);
#define NEXT(key, letter)                                                      \
  assert_int_equal(amqp_table_next(&it, &k, &v), 1);                           \
  assert_true(amqp_bytes_eq(k, BYTES(key)));                                   \
  assert_int_equal(v.type, letter)
  NEXT("bool", 't');
  assert_int_equal(v.v.u, 1);
  NEXT("i8", 'b');
  assert_int_equal(v.v.i, -5);
  NEXT("u8", 'B');
  assert_int_equal(v.v.u, 250);
  NEXT("i16", 's');
  assert_int_equal(v.v.i, -300);
  NEXT("u16", 'u');
  assert_int_equal(v.v.u, 65000);
  NEXT("i32", 'I');
  assert_int_equal(v.v.i, -70000);
  NEXT("u32", 'i');
  assert_int_equal(v.v.u, 4000000000u);
  NEXT("i64", 'l');
  assert_true(v.v.i == INT64_MIN);
  NEXT("f32", 'f');
  assert_true(v.v.f == 1.5f);
  NEXT("f64", 'd');
  assert_true(v.v.d == -2.25);
  NEXT("dec", 'D');
  assert_int_equal(v.v.dec.scale, 2);
  assert_int_equal(v.v.dec.value, 12345);
  NEXT("str", 'S');
  assert_true(amqp_bytes_eq(v.v.bytes, BYTES("hello")));
  NEXT("bin", 'x');
  assert_true(amqp_bytes_eq(v.v.bytes, BYTES("\x00\x01\xff")));
  NEXT("arr", 'A');
  {
    amqp_table_iter ai;
    amqp_field e;
    amqp_table_iter_init(&ai, v.v.bytes);
    assert_int_equal(amqp_array_next(&ai, &e), 1);
    assert_int_equal(e.type, 'I');
    assert_int_equal(e.v.i, 7);
    assert_int_equal(amqp_array_next(&ai, &e), 1);
    assert_true(amqp_bytes_eq(e.v.bytes, BYTES("x")));
    assert_int_equal(amqp_array_next(&ai, &e), 0);
  }
  NEXT("ts", 'T');
  assert_int_equal(v.v.u, 1700000000);
  NEXT("tbl", 'F');
  assert_int_equal(amqp_table_get(v.v.bytes, BYTES("k"), &v), AMQP_OK);
  assert_int_equal(v.type, 'V');
  NEXT("void", 'V');
  assert_int_equal(amqp_table_next(&it, &k, &v), 0);
#undef NEXT
}

/* Decoding every entry and writing it again gives the same bytes. */
static void test_reencode_identical(void **state) {
  (void)state;
  uint8_t buf[512], out[512];
  amqp_bytes t = {buf, build_every_type(buf, sizeof buf)};
  amqp_writer w = amqp_writer_make(out, sizeof out);
  amqp_table_iter it;
  amqp_bytes k;
  amqp_field v;
  amqp_table_iter_init(&it, t);
  while (amqp_table_next(&it, &k, &v) == 1)
    amqp_table_write_entry(&w, k, &v);
  assert_false(w.failed);
  assert_int_equal(w.len, t.len);
  assert_memory_equal(out, buf, t.len);
}

static void test_float_bits_survive(void **state) {
  (void)state;
  uint8_t buf[32];
  amqp_writer w = amqp_writer_make(buf, sizeof buf);
  amqp_field f = {.type = 'd'}, g;
  f.v.d = NAN;
  amqp_table_write_entry(&w, BYTES("n"), &f);
  assert_int_equal(amqp_table_get((amqp_bytes){buf, w.len}, BYTES("n"), &g),
                   AMQP_OK);
  assert_true(isnan(g.v.d));
}

/* Every truncation of a valid table is an error, never an over-read. */
static void test_every_truncation(void **state) {
  (void)state;
  uint8_t buf[512];
  size_t n = build_every_type(buf, sizeof buf);
  size_t boundaries = 0;
  for (size_t k = 0; k < n; k++) {
    uint8_t *c = exact_copy(buf, k);
    int rc = amqp_table_validate((amqp_bytes){c, k}, AMQP_TABLE_MAX_DEPTH);
    /* a prefix that ends exactly between entries is a valid shorter table */
    if (rc == AMQP_OK)
      boundaries++;
    else
      assert_int_equal(rc, AMQP_TRUNCATED);
    free(c);
  }
  assert_int_equal(boundaries, 17); /* the empty table + 16 full entries */
}

static void test_bad_inputs(void **state) {
  (void)state;
  /* unknown type 'Z' */
  assert_int_equal(amqp_table_validate(BYTES("\x01kZ\x00"), 8),
                   AMQP_BAD_FIELD_TYPE);
  /* string length past the end */
  assert_int_equal(amqp_table_validate(BYTES("\x01kS\x00\x00\x00\x09"
                                             "abc"),
                                       8),
                   AMQP_TRUNCATED);
  assert_int_equal(amqp_table_validate(BYTES("\x01kS\xff\xff\xff\xff"), 8),
                   AMQP_TRUNCATED);
  /* key length past the end */
  assert_int_equal(amqp_table_validate(BYTES("\x05k"), 8), AMQP_TRUNCATED);
  /* nested table with a bad entry */
  assert_int_equal(
      amqp_table_validate(BYTES("\x01kF\x00\x00\x00\x03\x01zQ"), 8),
      AMQP_BAD_FIELD_TYPE);
  /* array containing an unknown type */
  assert_int_equal(amqp_array_validate(BYTES("I\x00\x00\x00\x01?"), 8),
                   AMQP_BAD_FIELD_TYPE);
  /* iteration stops for good after an error */
  amqp_table_iter it;
  amqp_bytes k;
  amqp_field v;
  amqp_table_iter_init(&it, BYTES("\x01kZ\x00"));
  assert_int_equal(amqp_table_next(&it, &k, &v), AMQP_BAD_FIELD_TYPE);
  assert_int_equal(amqp_table_next(&it, &k, &v), AMQP_TRUNCATED);
}

/* 10,000 nested tables: refused by the depth limit, no stack exhaustion. */
static void test_deep_nesting(void **state) {
  (void)state;
  const int levels = 10000;
  const size_t per = 7; /* key "k" (2) + 'F' (1) + length (4) */
  size_t n = per * (size_t)levels;
  uint8_t *buf = malloc(n);
  for (int i = 0; i < levels; i++) {
    uint8_t *p = buf + per * (size_t)i;
    uint32_t inner = (uint32_t)(n - per * (size_t)(i + 1));
    p[0] = 1, p[1] = 'k', p[2] = 'F';
    p[3] = (uint8_t)(inner >> 24), p[4] = (uint8_t)(inner >> 16);
    p[5] = (uint8_t)(inner >> 8), p[6] = (uint8_t)inner;
  }
  assert_int_equal(amqp_table_validate((amqp_bytes){buf, n}, 32),
                   AMQP_TOO_DEEP);
  /* the innermost 31 entries are 32 tables deep: within a limit of 32 */
  amqp_bytes inner = {buf + n - 31 * per, 31 * per};
  assert_int_equal(amqp_table_validate(inner, 32), AMQP_OK);
  assert_int_equal(amqp_table_validate(inner, 31), AMQP_TOO_DEEP);
  free(buf);

  /* arrays nest the same way: [[[]]] is three deep */
  uint8_t arr[] = {'A', 0, 0, 0, 5, 'A', 0, 0, 0, 0};
  assert_int_equal(amqp_array_validate((amqp_bytes){arr, sizeof arr}, 3),
                   AMQP_OK);
  assert_int_equal(amqp_array_validate((amqp_bytes){arr, sizeof arr}, 2),
                   AMQP_TOO_DEEP);
}

static void test_get_and_as_int(void **state) {
  (void)state;
  uint8_t buf[512];
  amqp_bytes t = {buf, build_every_type(buf, sizeof buf)};
  amqp_field v;
  int64_t n = 0;
  assert_int_equal(amqp_table_get(t, BYTES("u16"), &v), AMQP_OK);
  assert_true(amqp_field_as_int(&v, &n));
  assert_int_equal(n, 65000);
  assert_int_equal(amqp_table_get(t, BYTES("i8"), &v), AMQP_OK);
  assert_true(amqp_field_as_int(&v, &n));
  assert_int_equal(n, -5);
  assert_int_equal(amqp_table_get(t, BYTES("str"), &v), AMQP_OK);
  assert_false(amqp_field_as_int(&v, &n));
  assert_int_equal(n, -5);
  assert_int_equal(amqp_table_get(t, BYTES("nope"), &v), AMQP_NOT_FOUND);
  /* a prefix of a key is not the key */
  assert_int_equal(amqp_table_get(t, BYTES("i1"), &v), AMQP_NOT_FOUND);
  assert_int_equal(amqp_table_get(BYTES("\x01kZ"), BYTES("x"), &v),
                   AMQP_BAD_FIELD_TYPE);
}

static void test_set_replaces_in_place(void **state) {
  (void)state;
  uint8_t src[128], out[128];
  amqp_writer w = amqp_writer_make(src, sizeof src);
  amqp_field a = amqp_field_string(BYTES("A")), one = amqp_field_long(1);
  amqp_table_write_entry(&w, BYTES("first"), &a);
  amqp_table_write_entry(&w, BYTES("count"), &one);
  amqp_table_write_entry(&w, BYTES("last"), &a);
  amqp_table_write_entry(&w, BYTES("count"), &one); /* duplicate */
  amqp_bytes t = {src, w.len};

  amqp_writer o = amqp_writer_make(out, sizeof out);
  amqp_field two = amqp_field_long(2);
  assert_int_equal(amqp_table_set(&o, t, BYTES("count"), &two), AMQP_OK);

  amqp_table_iter it;
  amqp_bytes k;
  amqp_field v;
  amqp_table_iter_init(&it, (amqp_bytes){out, o.len});
  const char *order[] = {"first", "count", "last"};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(amqp_table_next(&it, &k, &v), 1);
    assert_true(amqp_bytes_eq(k, amqp_cstr(order[i])));
  }
  assert_int_equal(amqp_table_next(&it, &k, &v), 0);
  assert_int_equal(amqp_table_get((amqp_bytes){out, o.len}, BYTES("count"), &v),
                   AMQP_OK);
  assert_int_equal(v.v.i, 2);
}

static void test_set_appends_and_fails_cleanly(void **state) {
  (void)state;
  uint8_t out[64];
  amqp_field v, n = amqp_field_long(42);

  /* into an empty table */
  amqp_writer o = amqp_writer_make(out, sizeof out);
  assert_int_equal(amqp_table_set(&o, (amqp_bytes){NULL, 0},
                                  BYTES("rebound-retry-count"), &n),
                   AMQP_OK);
  assert_int_equal(o.len, 1 + 19 + 1 + 8);
  assert_int_equal(amqp_table_get((amqp_bytes){out, o.len},
                                  BYTES("rebound-retry-count"), &v),
                   AMQP_OK);
  assert_int_equal(v.v.i, 42);

  /* no room: NO_SPACE, for every buffer size short of the need */
  for (size_t cap = 0; cap < 29; cap++) {
    amqp_writer s = amqp_writer_make(out, cap);
    assert_int_equal(amqp_table_set(&s, (amqp_bytes){NULL, 0},
                                    BYTES("rebound-retry-count"), &n),
                     AMQP_NO_SPACE);
  }
  /* a broken source table is reported, not copied */
  o = amqp_writer_make(out, sizeof out);
  assert_int_equal(amqp_table_set(&o, BYTES("\x01kZ"), BYTES("k"), &n),
                   AMQP_BAD_FIELD_TYPE);
  /* an unknown value type or an over-long key is refused */
  amqp_field bad = {.type = 'Q'};
  assert_int_equal(amqp_table_set(&o, (amqp_bytes){NULL, 0}, BYTES("k"), &bad),
                   AMQP_BAD_FIELD_TYPE);
  char longkey[300];
  memset(longkey, 'k', sizeof longkey);
  assert_int_equal(amqp_table_set(&o, (amqp_bytes){NULL, 0},
                                  (amqp_bytes){(uint8_t *)longkey, 256}, &n),
                   AMQP_TOO_LONG);
}

static void test_begin_finish(void **state) {
  (void)state;
  uint8_t buf[64];
  amqp_writer w = amqp_writer_make(buf, sizeof buf);
  size_t at = amqp_table_begin(&w);
  amqp_field f = amqp_field_long(5);
  amqp_table_write_entry(&w, BYTES("n"), &f);
  amqp_table_finish(&w, at);
  assert_false(w.failed);
  assert_int_equal(w.len, 4 + 11);
  assert_memory_equal(buf, "\x00\x00\x00\x0b\x01nl", 7);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_type_decodes),
      cmocka_unit_test(test_reencode_identical),
      cmocka_unit_test(test_float_bits_survive),
      cmocka_unit_test(test_every_truncation),
      cmocka_unit_test(test_bad_inputs),
      cmocka_unit_test(test_deep_nesting),
      cmocka_unit_test(test_get_and_as_int),
      cmocka_unit_test(test_set_replaces_in_place),
      cmocka_unit_test(test_set_appends_and_fails_cleanly),
      cmocka_unit_test(test_begin_finish),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
