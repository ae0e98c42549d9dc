/* Frame layer: protocol header, frame parsing, frame writing. */
#include "test_common.h"

static void test_protocol_header(void **state) {
  (void)state;
  const uint8_t ok[] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1, 0xff};
  for (size_t n = 0; n < 8; n++) {
    uint8_t *c = exact_copy(ok, n);
    assert_int_equal(amqp_protocol_header_parse(c, n), AMQP_PARTIAL);
    free(c);
  }
  assert_int_equal(amqp_protocol_header_parse(ok, 8), 8);
  assert_int_equal(amqp_protocol_header_parse(ok, 9), 8);

  const uint8_t amqp10[] = {'A', 'M', 'Q', 'P', 0, 1, 0, 0};
  assert_int_equal(amqp_protocol_header_parse(amqp10, 8),
                   AMQP_BAD_PROTOCOL_HEADER);
  /* A difference is reported as soon as it is seen. */
  assert_int_equal(amqp_protocol_header_parse((const uint8_t *)"GE", 2),
                   AMQP_BAD_PROTOCOL_HEADER);
  const uint8_t v091_0[] = {'A', 'M', 'Q', 'P', 0, 0, 9, 0};
  assert_int_equal(amqp_protocol_header_parse(v091_0, 8),
                   AMQP_BAD_PROTOCOL_HEADER);
}

static void test_protocol_header_describe(void **state) {
  (void)state;
  char out[64];
  const uint8_t amqp10[] = {'A', 'M', 'Q', 'P', 0, 1, 0, 0};
  assert_string_equal(amqp_protocol_header_describe(amqp10, 8, out, sizeof out),
                      "AMQP 0.1.0.0");
  assert_string_equal(
      amqp_protocol_header_describe((const uint8_t *)"GET / HTTP/1.1", 14, out,
                                    sizeof out),
      "\"GET / HT\"");
  const uint8_t tls[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01};
  assert_string_equal(amqp_protocol_header_describe(tls, 8, out, sizeof out),
                      "16 03 01 02 00 01 00 01");
  /* Truncated to the caller's buffer, still NUL-terminated. */
  amqp_protocol_header_describe(tls, 8, out, 6);
  assert_string_equal(out, "16 03");
}

/* A heartbeat and a basic.ack frame, as a broker sends them. */
static const char heartbeat_hex[] = "08 0000 00000000 ce";
static const char ack_hex[] =
    "01 0001 0000000d 003c 0050 0000000000000007 00 ce";

static void test_parse_valid(void **state) {
  (void)state;
  size_t n;
  amqp_frame f;
  uint8_t *hb = hex_decode(heartbeat_hex, &n);
  assert_int_equal(amqp_frame_parse(hb, n, 0, &f), 8);
  assert_int_equal(f.type, AMQP_FRAME_HEARTBEAT);
  assert_int_equal(f.channel, 0);
  assert_int_equal(f.payload.len, 0);
  free(hb);

  uint8_t *ack = hex_decode(ack_hex, &n);
  assert_int_equal(n, 21);
  assert_int_equal(amqp_frame_parse(ack, n, 131072, &f), 21);
  assert_int_equal(f.type, AMQP_FRAME_METHOD);
  assert_int_equal(f.channel, 1);
  assert_int_equal(f.payload.len, 13);
  assert_ptr_equal(f.payload.ptr, ack + 7); /* a view, not a copy */
  assert_int_equal(amqp_method_peek_id(f.payload), AMQP_BASIC_ACK);
  free(ack);
}

static void test_parse_every_prefix_is_partial(void **state) {
  (void)state;
  size_t n;
  amqp_frame f;
  uint8_t *ack = hex_decode(ack_hex, &n);
  for (size_t k = 0; k < n; k++) {
    uint8_t *c = exact_copy(ack, k);
    assert_int_equal(amqp_frame_parse(c, k, 131072, &f), AMQP_PARTIAL);
    free(c);
  }
  free(ack);
}

static void test_parse_two_frames_back_to_back(void **state) {
  (void)state;
  size_t n1, n2;
  amqp_frame f;
  uint8_t *a = hex_decode(ack_hex, &n1);
  uint8_t *h = hex_decode(heartbeat_hex, &n2);
  uint8_t buf[64];
  memcpy(buf, a, n1);
  memcpy(buf + n1, h, n2);
  long used = amqp_frame_parse(buf, n1 + n2, 0, &f);
  assert_int_equal(used, (long)n1);
  assert_int_equal(amqp_frame_parse(buf + used, n1 + n2 - (size_t)used, 0, &f),
                   (long)n2);
  assert_int_equal(f.type, AMQP_FRAME_HEARTBEAT);
  free(a);
  free(h);
}

static void expect_error(const char *hex, uint32_t frame_max, int status) {
  size_t n;
  amqp_frame f;
  uint8_t *b = hex_decode(hex, &n);
  assert_non_null(b);
  uint8_t *c = exact_copy(b, n);
  assert_int_equal(amqp_frame_parse(c, n, frame_max, &f), status);
  free(c);
  free(b);
}

static void test_parse_errors(void **state) {
  (void)state;
  expect_error("08 0000 00000000 00", 0, AMQP_BAD_FRAME_END);
  expect_error("01 0001 0000000d 003c 0050 0000000000000007 00 cd", 0,
               AMQP_BAD_FRAME_END);
  expect_error("00 0000 00000000 ce", 0, AMQP_UNKNOWN_FRAME_TYPE);
  expect_error("04 0000 00000000 ce", 0, AMQP_UNKNOWN_FRAME_TYPE);
  expect_error("09 0000 00000000 ce", 0, AMQP_UNKNOWN_FRAME_TYPE);
  /* Type is judged from the first byte, before the rest arrives. */
  expect_error("41 4d 51 50 00 00 09", 0, AMQP_UNKNOWN_FRAME_TYPE);
  expect_error("08 0001 00000000 ce", 0, AMQP_BAD_HEARTBEAT);
  expect_error("01 0001 00000003 003c00 ce", 0, AMQP_SHORT_PAYLOAD);
  expect_error("02 0001 0000000d 003c0000 0000000000000000 00 ce", 0,
               AMQP_SHORT_PAYLOAD);
  /* Size over frame-max is known from the 7-byte frame header alone. */
  expect_error("03 0001 00001000", 4096, AMQP_FRAME_TOO_LARGE);
  expect_error("03 0001 ffffffff", 131072, AMQP_FRAME_TOO_LARGE);
  /* A frame-max too small even for an empty frame. */
  expect_error("08 0000 00000000 ce", 4, AMQP_FRAME_TOO_LARGE);
}

static void test_frame_max_boundary(void **state) {
  (void)state;
  const uint32_t frame_max = 4096;
  size_t size = frame_max - AMQP_FRAME_OVERHEAD;
  uint8_t *buf = calloc(1, frame_max + 1);
  amqp_frame f;
  long n = amqp_frame_write(buf, frame_max + 1, AMQP_FRAME_BODY, 3,
                            (amqp_bytes){buf + 100, 0});
  assert_int_equal(n, 8);
  /* exactly frame-max: accepted */
  amqp_writer w = amqp_writer_make(buf, frame_max + 1);
  size_t at = amqp_frame_begin(&w, AMQP_FRAME_BODY, 3);
  for (size_t i = 0; i < size; i++)
    amqp_put_u8(&w, (uint8_t)i);
  amqp_frame_finish(&w, at);
  assert_false(w.failed);
  assert_int_equal(w.len, frame_max);
  assert_int_equal(amqp_frame_parse(buf, w.len, frame_max, &f), frame_max);
  assert_int_equal(f.payload.len, size);
  /* one byte more: refused */
  assert_int_equal(amqp_frame_parse(buf, w.len, frame_max - 1, &f),
                   AMQP_FRAME_TOO_LARGE);
  free(buf);
}

static void test_write(void **state) {
  (void)state;
  uint8_t buf[32];
  size_t n;
  uint8_t *want = hex_decode(heartbeat_hex, &n);
  assert_int_equal(amqp_frame_write(buf, sizeof buf, AMQP_FRAME_HEARTBEAT, 0,
                                    (amqp_bytes){NULL, 0}),
                   8);
  assert_memory_equal(buf, want, 8);
  free(want);
  /* A buffer one byte short fails and says so. */
  assert_int_equal(
      amqp_frame_write(buf, 12, AMQP_FRAME_BODY, 1, BYTES("hello")),
      AMQP_NO_SPACE);
  assert_int_equal(
      amqp_frame_write(buf, 13, AMQP_FRAME_BODY, 1, BYTES("hello")), 13);
  amqp_frame f;
  assert_int_equal(amqp_frame_parse(buf, 13, 0, &f), 13);
  assert_int_equal(f.channel, 1);
  assert_memory_equal(f.payload.ptr, "hello", 5);
}

static void test_status_strings(void **state) {
  (void)state;
  assert_string_equal(amqp_status_str(AMQP_BAD_FRAME_END),
                      "frame-end octet is not 0xCE");
  assert_string_equal(amqp_status_str(12345), "unknown status");
  assert_int_equal(amqp_status_reply_code(AMQP_BAD_FRAME_END), 501);
  assert_int_equal(amqp_status_reply_code(AMQP_TRUNCATED), 502);
  assert_int_equal(amqp_status_reply_code(AMQP_UNKNOWN_METHOD), 503);
  /* as RabbitMQ answers a heartbeat on a channel: UNEXPECTED_FRAME */
  assert_int_equal(amqp_status_reply_code(AMQP_BAD_HEARTBEAT), 505);
  assert_int_equal(amqp_status_reply_code(AMQP_PARTIAL), 0);
}

/* The spec's reply codes and their names; a status maps to a defined one. */
static void test_reply_names(void **state) {
  (void)state;
  assert_int_equal(AMQP_REPLY_SUCCESS, 200);
  assert_int_equal(AMQP_REPLY_CONNECTION_FORCED, 320);
  assert_int_equal(AMQP_REPLY_NOT_FOUND, 404);
  assert_int_equal(AMQP_REPLY_INTERNAL_ERROR, 541);
  assert_string_equal(amqp_reply_name(200), "REPLY_SUCCESS");
  assert_string_equal(amqp_reply_name(406), "PRECONDITION_FAILED");
  assert_string_equal(amqp_reply_name(505), "UNEXPECTED_FRAME");
  assert_null(amqp_reply_name(0));
  assert_null(amqp_reply_name(299));
  for (int st = AMQP_OK; st >= AMQP_NOT_FOUND; st--) {
    int code = amqp_status_reply_code(st);
    if (code)
      assert_non_null(amqp_reply_name(code));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_protocol_header),
      cmocka_unit_test(test_protocol_header_describe),
      cmocka_unit_test(test_parse_valid),
      cmocka_unit_test(test_parse_every_prefix_is_partial),
      cmocka_unit_test(test_parse_two_frames_back_to_back),
      cmocka_unit_test(test_parse_errors),
      cmocka_unit_test(test_frame_max_boundary),
      cmocka_unit_test(test_write),
      cmocka_unit_test(test_status_strings),
      cmocka_unit_test(test_reply_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
