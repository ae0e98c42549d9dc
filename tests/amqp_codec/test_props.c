/* Content headers: every property, partial flag sets, malformed input. */
#include "test_common.h"

static const uint8_t headers_table[] = "\x13rebound-retry-count"
                                       "l"
                                       "\x00\x00\x00\x00\x00\x00\x00\x02";

static amqp_content_header all_props(void) {
  amqp_content_header h;
  memset(&h, 0, sizeof h);
  h.class_id = 60;
  h.body_size = 256;
  amqp_props *p = &h.props;
  p->flags = 0xfffc;
  p->content_type = BYTES("application/json");
  p->content_encoding = BYTES("gzip");
  p->headers = (amqp_bytes){headers_table, sizeof headers_table - 1};
  p->delivery_mode = 2;
  p->priority = 9;
  p->correlation_id = BYTES("corr-1");
  p->reply_to = BYTES("amq.rabbitmq.reply-to");
  p->expiration = BYTES("60000");
  p->message_id = BYTES("msg-1");
  p->timestamp = 1764460800;
  p->type = BYTES("order.created");
  p->user_id = BYTES("guest");
  p->app_id = BYTES("rebound-test");
  p->cluster_id = BYTES("c1");
  return h;
}

static void assert_props_equal(const amqp_content_header *a,
                               const amqp_content_header *b) {
  assert_int_equal(a->class_id, b->class_id);
  assert_int_equal(a->weight, b->weight);
  assert_int_equal(a->body_size, b->body_size);
  assert_int_equal(a->props.flags, b->props.flags);
#define CMP_SHORTSTR(x, y) assert_true(amqp_bytes_eq(x, y))
#define CMP_TABLE(x, y) assert_true(amqp_bytes_eq(x, y))
#define CMP_OCTET(x, y) assert_int_equal(x, y)
#define CMP_TIMESTAMP(x, y) assert_int_equal(x, y)
#define CMP(field, NAME, bit, type) CMP_##type(a->props.field, b->props.field);
  AMQP_PROPS_MAP(CMP)
#undef CMP
}

static void test_all_properties_round_trip(void **state) {
  (void)state;
  amqp_content_header h = all_props(), d;
  uint8_t buf[512], again[512];
  amqp_writer w = amqp_writer_make(buf, sizeof buf);
  assert_int_equal(amqp_content_header_encode(&h, &w), AMQP_OK);
  assert_memory_equal(buf, "\x00\x3c\x00\x00", 4);
  assert_memory_equal(buf + 12, "\xff\xfc", 2);
  assert_int_equal(amqp_content_header_decode((amqp_bytes){buf, w.len}, &d),
                   AMQP_OK);
  assert_props_equal(&h, &d);
  assert_int_equal(amqp_content_header_peek_size((amqp_bytes){buf, w.len}),
                   256);
  amqp_writer w2 = amqp_writer_make(again, sizeof again);
  assert_int_equal(amqp_content_header_encode(&d, &w2), AMQP_OK);
  assert_int_equal(w2.len, w.len);
  assert_memory_equal(again, buf, w.len);

  amqp_field v;
  assert_int_equal(
      amqp_table_get(d.props.headers, BYTES("rebound-retry-count"), &v),
      AMQP_OK);
  assert_int_equal(v.v.i, 2);

  for (size_t k = 0; k < w.len; k++) {
    uint8_t *c = exact_copy(buf, k);
    assert_int_equal(amqp_content_header_decode((amqp_bytes){c, k}, &d),
                     AMQP_TRUNCATED);
    free(c);
  }
  buf[w.len] = 0;
  assert_int_equal(amqp_content_header_decode((amqp_bytes){buf, w.len + 1}, &d),
                   AMQP_TRAILING_BYTES);
}

/* Each single property alone, and each flag subset dropping one: the
 * decoder reads exactly the present ones, in order. */
static void test_flag_subsets(void **state) {
  (void)state;
  amqp_content_header full = all_props(), h, d;
  for (int bit = 2; bit <= 15; bit++) {
    uint16_t masks[2] = {(uint16_t)(1u << bit),
                         (uint16_t)(0xfffc & ~(1u << bit))};
    for (int i = 0; i < 2; i++) {
      uint8_t buf[512];
      h = full;
      h.props.flags = masks[i];
      amqp_writer w = amqp_writer_make(buf, sizeof buf);
      assert_int_equal(amqp_content_header_encode(&h, &w), AMQP_OK);
      assert_int_equal(amqp_content_header_decode((amqp_bytes){buf, w.len}, &d),
                       AMQP_OK);
      assert_int_equal(d.props.flags, masks[i]);
      /* absent properties read as zero */
      if (!(masks[i] & AMQP_P_DELIVERY_MODE))
        assert_int_equal(d.props.delivery_mode, 0);
      if (masks[i] & AMQP_P_APP_ID)
        assert_true(amqp_bytes_eq(d.props.app_id, BYTES("rebound-test")));
      else
        assert_int_equal(d.props.app_id.len, 0);
    }
  }
}

static void expect_decode(const char *hex, int status) {
  size_t n;
  amqp_content_header h;
  uint8_t *b = hex_decode(hex, &n);
  uint8_t *c = exact_copy(b, n);
  assert_int_equal(amqp_content_header_decode((amqp_bytes){c, n}, &h), status);
  free(c);
  free(b);
}

static void test_malformed(void **state) {
  (void)state;
  /* no properties at all: fine */
  expect_decode("003c 0000 0000000000000005 0000", AMQP_OK);
  /* class without content */
  expect_decode("0032 0000 0000000000000005 0000", AMQP_BAD_CONTENT_CLASS);
  /* bit 1 is not a basic property */
  expect_decode("003c 0000 0000000000000005 0002", AMQP_BAD_PROPERTY_FLAGS);
  /* a continuation word is allowed when empty, refused when not */
  expect_decode("003c 0000 0000000000000005 0001 0000", AMQP_OK);
  expect_decode("003c 0000 0000000000000005 0001 8000",
                AMQP_BAD_PROPERTY_FLAGS);
  expect_decode("003c 0000 0000000000000005 0001", AMQP_TRUNCATED);
  /* content-type length past the end */
  expect_decode("003c 0000 0000000000000005 8000 05 6162", AMQP_TRUNCATED);
  /* headers table with an unknown field type */
  expect_decode("003c 0000 0000000000000005 2000 00000003 016b5a",
                AMQP_BAD_FIELD_TYPE);
}

static void test_encode_limits(void **state) {
  (void)state;
  amqp_content_header h = all_props();
  uint8_t buf[512];
  char big[300];
  memset(big, 'x', sizeof big);
  h.props.message_id = (amqp_bytes){(uint8_t *)big, 256};
  amqp_writer w = amqp_writer_make(buf, sizeof buf);
  assert_int_equal(amqp_content_header_encode(&h, &w), AMQP_TOO_LONG);
  /* an over-long value of an absent property does not matter */
  h.props.flags &= (uint16_t)~AMQP_P_MESSAGE_ID;
  assert_int_equal(amqp_content_header_encode(&h, &w), AMQP_OK);
  h.props.flags |= 0x0002;
  assert_int_equal(amqp_content_header_encode(&h, &w), AMQP_BAD_PROPERTY_FLAGS);
  h = all_props();
  amqp_writer s = amqp_writer_make(buf, 20);
  assert_int_equal(amqp_content_header_encode(&h, &s), AMQP_NO_SPACE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_properties_round_trip),
      cmocka_unit_test(test_flag_subsets),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_encode_limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
