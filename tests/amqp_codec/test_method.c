/* Methods: the descriptor table, every method round-tripped, bit packing,
 * malformed payloads. */
#include "test_common.h"

static const char *const type_names[] = {"bit",      "octet",    "short",
                                         "long",     "longlong", "timestamp",
                                         "shortstr", "longstr",  "table"};

/* Fill every argument of `m` with a value derived from `seed`, so that
 * a field decoded into the wrong slot shows. */
static void fill(amqp_method *m, unsigned seed, uint8_t *store) {
  static const uint8_t table[] = "\x03key"
                                 "S\x00\x00\x00\x03val";
  for (unsigned i = 0; i < m->desc->nfields; i++) {
    unsigned v = seed + i;
    switch (m->desc->fields[i].type) {
    case AMQP_T_BIT:
      m->args[i].u = (v * 7 + i) % 3 == 0;
      break;
    case AMQP_T_OCTET:
      m->args[i].u = v & 0xff;
      break;
    case AMQP_T_SHORT:
      m->args[i].u = (v * 251) & 0xffff;
      break;
    case AMQP_T_LONG:
      m->args[i].u = v * 16777259u;
      break;
    case AMQP_T_LONGLONG:
    case AMQP_T_TIMESTAMP:
      m->args[i].u = 0x0102030405060708ull * v;
      break;
    case AMQP_T_SHORTSTR:
    case AMQP_T_LONGSTR:
      store[i] = (uint8_t)('a' + i);
      m->args[i].b = (amqp_bytes){store, i + 1};
      break;
    case AMQP_T_TABLE:
      m->args[i].b = (amqp_bytes){table, sizeof table - 1};
      break;
    }
  }
}

static void assert_args_equal(const amqp_method *a, const amqp_method *b) {
  assert_int_equal(a->id, b->id);
  assert_ptr_equal(a->desc, b->desc);
  for (unsigned i = 0; i < a->desc->nfields; i++) {
    uint8_t t = a->desc->fields[i].type;
    if (t == AMQP_T_SHORTSTR || t == AMQP_T_LONGSTR || t == AMQP_T_TABLE) {
      assert_true(amqp_bytes_eq(a->args[i].b, b->args[i].b));
    } else {
      if (a->args[i].u != b->args[i].u)
        fail_msg("%s field %s (%s): %llu != %llu", a->desc->name,
                 a->desc->fields[i].name, type_names[t],
                 (unsigned long long)a->args[i].u,
                 (unsigned long long)b->args[i].u);
    }
  }
}

static void test_table_lookup(void **state) {
  (void)state;
  assert_int_equal(amqp_method_count, 64);
  for (size_t i = 0; i < amqp_method_count; i++) {
    const amqp_method_desc *d = &amqp_method_table[i];
    assert_ptr_equal(amqp_method_lookup(d->id), d);
    assert_true(d->nfields <= AMQP_MAX_FIELDS);
  }
  assert_null(amqp_method_lookup(AMQP_METHOD_ID(10, 12)));
  assert_null(amqp_method_lookup(AMQP_METHOD_ID(60, 13)));
  assert_null(amqp_method_lookup(AMQP_METHOD_ID(70, 10)));
  assert_null(amqp_method_lookup(AMQP_METHOD_ID(99, 10)));
  assert_null(amqp_method_lookup(AMQP_METHOD_ID(0, 0)));
  assert_null(amqp_method_lookup(AMQP_METHOD_ID(60, 130)));
  assert_null(amqp_method_lookup(0xffffffffu));
}

static void test_table_has_rabbitmq_extensions(void **state) {
  (void)state;
  const uint32_t ids[] = {AMQP_BASIC_NACK,
                          AMQP_EXCHANGE_BIND,
                          AMQP_EXCHANGE_UNBIND,
                          AMQP_CONFIRM_SELECT,
                          AMQP_CONNECTION_BLOCKED,
                          AMQP_CONNECTION_UNBLOCKED,
                          AMQP_CONNECTION_UPDATE_SECRET};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    assert_non_null(amqp_method_lookup(ids[i]));
  const amqp_method_desc *d = amqp_method_lookup(AMQP_BASIC_DELIVER);
  assert_string_equal(d->name, "basic.deliver");
  assert_true(d->flags & AMQP_CONTENT);
  assert_false(d->flags & AMQP_SYNC);
  assert_true(amqp_method_lookup(AMQP_BASIC_GET_OK)->flags & AMQP_CONTENT);
  assert_true(amqp_method_lookup(AMQP_QUEUE_DECLARE)->flags & AMQP_SYNC);
  assert_int_equal(AMQP_F_BASIC_DELIVER_DELIVERY_TAG, 1);
  assert_string_equal(d->fields[AMQP_F_BASIC_DELIVER_ROUTING_KEY].name,
                      "routing-key");
}

/* Every method of every class: encode, decode, equal; encode again, same
 * bytes; every truncation and one trailing byte are errors. */
static void test_every_method_round_trip(void **state) {
  (void)state;
  for (size_t mi = 0; mi < amqp_method_count; mi++) {
    for (unsigned seed = 1; seed <= 3; seed++) {
      uint8_t store[AMQP_MAX_FIELDS], buf[512], again[512];
      amqp_method m, d;
      assert_int_equal(amqp_method_init(&m, amqp_method_table[mi].id), AMQP_OK);
      fill(&m, seed, store);
      amqp_writer w = amqp_writer_make(buf, sizeof buf);
      assert_int_equal(amqp_method_encode(&m, &w), AMQP_OK);
      assert_int_equal(amqp_method_decode((amqp_bytes){buf, w.len}, &d),
                       AMQP_OK);
      assert_args_equal(&m, &d);
      amqp_writer w2 = amqp_writer_make(again, sizeof again);
      assert_int_equal(amqp_method_encode(&d, &w2), AMQP_OK);
      assert_int_equal(w2.len, w.len);
      assert_memory_equal(again, buf, w.len);

      for (size_t k = 0; k < w.len; k++) {
        uint8_t *c = exact_copy(buf, k);
        int rc = amqp_method_decode((amqp_bytes){c, k}, &d);
        if (rc != AMQP_TRUNCATED)
          fail_msg("%s cut at %zu: %s", m.desc->name, k, amqp_status_str(rc));
        free(c);
      }
      buf[w.len] = 0;
      assert_int_equal(amqp_method_decode((amqp_bytes){buf, w.len + 1}, &d),
                       AMQP_TRAILING_BYTES);
      for (size_t cap = 0; cap < w.len; cap++) {
        amqp_writer s = amqp_writer_make(again, cap);
        assert_int_equal(amqp_method_encode(&m, &s), AMQP_NO_SPACE);
      }
    }
  }
}

static void expect_bytes(const amqp_method *m, const char *hex) {
  uint8_t buf[256];
  size_t n;
  uint8_t *want = hex_decode(hex, &n);
  amqp_writer w = amqp_writer_make(buf, sizeof buf);
  assert_int_equal(amqp_method_encode(m, &w), AMQP_OK);
  assert_int_equal(w.len, n);
  assert_memory_equal(buf, want, n);
  free(want);
}

/* Bits pack low bit first into shared octets; a non-bit field ends a run. */
static void test_bit_packing(void **state) {
  (void)state;
  amqp_method m;
  amqp_method_init(&m, AMQP_BASIC_NACK);
  m.args[AMQP_F_BASIC_NACK_DELIVERY_TAG].u = 9;
  m.args[AMQP_F_BASIC_NACK_MULTIPLE].u = 0;
  m.args[AMQP_F_BASIC_NACK_REQUEUE].u = 1;
  expect_bytes(&m, "003c 0078 0000000000000009 02");

  amqp_method_init(&m, AMQP_QUEUE_DECLARE);
  m.args[AMQP_F_QUEUE_DECLARE_QUEUE].b = BYTES("q");
  m.args[AMQP_F_QUEUE_DECLARE_DURABLE].u = 1;
  m.args[AMQP_F_QUEUE_DECLARE_AUTO_DELETE].u = 1;
  m.args[AMQP_F_QUEUE_DECLARE_NO_WAIT].u = 1;
  /* passive=0 durable=1 exclusive=0 auto-delete=1 no-wait=1 -> 0b11010 */
  expect_bytes(&m, "0032 000a 0000 01 71 1a 00000000");

  amqp_method_init(&m, AMQP_EXCHANGE_DECLARE);
  m.args[AMQP_F_EXCHANGE_DECLARE_EXCHANGE].b = BYTES("x");
  m.args[AMQP_F_EXCHANGE_DECLARE_TYPE].b = BYTES("topic");
  m.args[AMQP_F_EXCHANGE_DECLARE_PASSIVE].u = 1;
  m.args[AMQP_F_EXCHANGE_DECLARE_INTERNAL].u = 1;
  expect_bytes(&m, "0028 000a 0000 01 78 05 746f706963 09 00000000");

  /* basic.deliver: bit between two strings gets an octet of its own */
  amqp_method_init(&m, AMQP_BASIC_DELIVER);
  m.args[AMQP_F_BASIC_DELIVER_CONSUMER_TAG].b = BYTES("c");
  m.args[AMQP_F_BASIC_DELIVER_DELIVERY_TAG].u = 1;
  m.args[AMQP_F_BASIC_DELIVER_REDELIVERED].u = 1;
  m.args[AMQP_F_BASIC_DELIVER_EXCHANGE].b = BYTES("");
  m.args[AMQP_F_BASIC_DELIVER_ROUTING_KEY].b = BYTES("q");
  expect_bytes(&m, "003c 003c 01 63 0000000000000001 01 00 01 71");
}

static void test_decode_errors(void **state) {
  (void)state;
  amqp_method m;
  assert_int_equal(amqp_method_decode(BYTES("\x00\x3c\x00\x0d"), &m),
                   AMQP_UNKNOWN_METHOD);
  assert_int_equal(amqp_method_decode(BYTES("\x00\x3c"), &m), AMQP_TRUNCATED);
  /* queue.declare whose arguments table holds an unknown type */
  assert_int_equal(amqp_method_decode(BYTES("\x00\x32\x00\x0a\x00\x00\x01q\x00"
                                            "\x00\x00\x00\x04\x01kZ\x00"),
                                      &m),
                   AMQP_BAD_FIELD_TYPE);
  /* ...and one whose table length runs past the payload */
  assert_int_equal(amqp_method_decode(BYTES("\x00\x32\x00\x0a\x00\x00\x01q\x00"
                                            "\x00\x00\x00\x09\x01kV"),
                                      &m),
                   AMQP_TRUNCATED);
  /* a table string is a view into the payload */
  static const uint8_t ok[] = "\x00\x32\x00\x0a\x00\x00\x01q\x00"
                              "\x00\x00\x00\x03\x01kV";
  assert_int_equal(amqp_method_decode((amqp_bytes){ok, sizeof ok - 1}, &m),
                   AMQP_OK);
  assert_ptr_equal(m.args[AMQP_F_QUEUE_DECLARE_ARGUMENTS].b.ptr, ok + 13);
  assert_int_equal(m.args[AMQP_F_QUEUE_DECLARE_ARGUMENTS].b.len, 3);
}

/* basic.consume whose arguments nest 40 tables deep: RabbitMQ accepts it,
 * so a forwarder decoding it with AMQP_DECODE_OPAQUE_TABLES must too; the
 * plain decoder still refuses it. */
static void test_opaque_tables(void **state) {
  (void)state;
  enum { LEVELS = 40, PER = 7 }; /* key "k" (2) + 'F' (1) + length (4) */
  uint8_t payload[64 + LEVELS * PER];
  amqp_writer w = amqp_writer_make(payload, sizeof payload);
  amqp_put_u32(&w, AMQP_BASIC_CONSUME);
  amqp_put_u16(&w, 0);
  amqp_put_u8(&w, 1), amqp_put_bytes(&w, "q", 1);
  amqp_put_u8(&w, 1), amqp_put_bytes(&w, "t", 1);
  amqp_put_u8(&w, 0); /* no-local, no-ack, exclusive, no-wait */
  amqp_put_u32(&w, LEVELS * PER);
  for (uint32_t i = 0; i < LEVELS; i++) {
    amqp_put_u8(&w, 1), amqp_put_bytes(&w, "k", 1), amqp_put_u8(&w, 'F');
    amqp_put_u32(&w, (LEVELS - 1 - i) * PER);
  }
  assert_false(w.failed);
  amqp_bytes b = {payload, w.len};
  amqp_method m;
  assert_int_equal(amqp_method_decode(b, &m), AMQP_TOO_DEEP);
  assert_int_equal(amqp_method_decode_flags(b, &m, AMQP_DECODE_OPAQUE_TABLES),
                   AMQP_OK);
  assert_true(
      amqp_bytes_eq(m.args[AMQP_F_BASIC_CONSUME_QUEUE].b, amqp_cstr("q")));
  assert_int_equal(m.args[AMQP_F_BASIC_CONSUME_ARGUMENTS].b.len, LEVELS * PER);
  /* a view of the bytes as they came, to be forwarded unread */
  assert_ptr_equal(m.args[AMQP_F_BASIC_CONSUME_ARGUMENTS].b.ptr, payload + 15);
  /* still length-checked: a table running past the payload is refused */
  payload[11] = 0x7f; /* the table length's high octet */
  assert_int_equal(amqp_method_decode_flags(b, &m, AMQP_DECODE_OPAQUE_TABLES),
                   AMQP_TRUNCATED);
}

static void test_encode_errors(void **state) {
  (void)state;
  amqp_method m;
  uint8_t buf[512];
  char big[256];
  memset(big, 'q', sizeof big);
  assert_int_equal(amqp_method_init(&m, AMQP_METHOD_ID(10, 99)),
                   AMQP_UNKNOWN_METHOD);
  amqp_writer w = amqp_writer_make(buf, sizeof buf);
  assert_int_equal(amqp_method_encode(&m, &w), AMQP_UNKNOWN_METHOD);
  amqp_method_init(&m, AMQP_QUEUE_DECLARE);
  m.args[AMQP_F_QUEUE_DECLARE_QUEUE].b = (amqp_bytes){(uint8_t *)big, 256};
  assert_int_equal(amqp_method_encode(&m, &w), AMQP_TOO_LONG);
  assert_int_equal(w.len, 0);
  m.args[AMQP_F_QUEUE_DECLARE_QUEUE].b.len = 255;
  assert_int_equal(amqp_method_encode(&m, &w), AMQP_OK);
}

static void test_method_frame_write(void **state) {
  (void)state;
  amqp_method m;
  uint8_t buf[64];
  amqp_frame f;
  amqp_method_init(&m, AMQP_BASIC_ACK);
  m.args[AMQP_F_BASIC_ACK_DELIVERY_TAG].u = 7;
  long n = amqp_method_frame_write(buf, sizeof buf, 1, &m);
  assert_int_equal(n, 21);
  size_t hn;
  uint8_t *want =
      hex_decode("01 0001 0000000d 003c 0050 0000000000000007 00 ce", &hn);
  assert_memory_equal(buf, want, hn);
  free(want);
  assert_int_equal(amqp_frame_parse(buf, (size_t)n, 0, &f), n);
  assert_int_equal(amqp_method_peek_id(f.payload), AMQP_BASIC_ACK);
  assert_int_equal(amqp_method_frame_write(buf, 20, 1, &m), AMQP_NO_SPACE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table_lookup),
      cmocka_unit_test(test_table_has_rabbitmq_extensions),
      cmocka_unit_test(test_every_method_round_trip),
      cmocka_unit_test(test_bit_packing),
      cmocka_unit_test(test_decode_errors),
      cmocka_unit_test(test_opaque_tables),
      cmocka_unit_test(test_encode_errors),
      cmocka_unit_test(test_method_frame_write),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
