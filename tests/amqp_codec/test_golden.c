/* Golden sessions recorded from real clients against a real RabbitMQ
 * (tests/amqp_codec/golden/, see MANIFEST.md there): every frame parses,
 * decodes and re-encodes to the same bytes; every split of the stream at
 * every byte offset yields the same frames; the recorded values decode to
 * what the sessions sent. */
#include "golden.h"
#include "test_common.h"

#include <stdio.h>

static const char *const sessions[] = {"pika", "kombu", "bunny", "tools"};
static const char *const sides[] = {"client", "server"};
#define NSESSIONS (sizeof sessions / sizeof sessions[0])

static void check_reencode(const char *name, const amqp_frame *f, size_t i) {
  uint8_t *buf = malloc(f->payload.len + 64);
  amqp_writer w = amqp_writer_make(buf, f->payload.len + 64);
  if (f->type == AMQP_FRAME_METHOD) {
    amqp_method m;
    int rc = amqp_method_decode(f->payload, &m);
    if (rc != AMQP_OK)
      fail_msg("%s frame %zu: %s", name, i, amqp_status_str(rc));
    assert_int_equal(amqp_method_encode(&m, &w), AMQP_OK);
  } else if (f->type == AMQP_FRAME_HEADER) {
    amqp_content_header h;
    int rc = amqp_content_header_decode(f->payload, &h);
    if (rc != AMQP_OK)
      fail_msg("%s frame %zu: %s", name, i, amqp_status_str(rc));
    assert_int_equal(amqp_content_header_encode(&h, &w), AMQP_OK);
  } else {
    free(buf);
    return;
  }
  if (w.len != f->payload.len || memcmp(buf, f->payload.ptr, w.len) != 0)
    fail_msg("%s frame %zu re-encodes differently", name, i);
  free(buf);
}

/* Every method and content header decodes and re-encodes byte for byte;
 * content methods are followed on their channel by a header and bodies
 * adding up to its body size. */
static void test_decode_reencode(void **state) {
  (void)state;
  size_t methods = 0, headers = 0;
  for (size_t s = 0; s < NSESSIONS; s++) {
    for (size_t d = 0; d < 2; d++) {
      golden_stream g;
      char name[64];
      snprintf(name, sizeof name, "%s.%s", sessions[s], sides[d]);
      golden_load(&g, sessions[s], sides[d]);
      assert_int_equal(g.start, d == 0 ? AMQP_PROTOCOL_HEADER_SIZE : 0);
      for (size_t i = 0; i < g.nframes; i++) {
        const amqp_frame *f = &g.frames[i];
        check_reencode(name, f, i);
        methods += f->type == AMQP_FRAME_METHOD;
        headers += f->type == AMQP_FRAME_HEADER;
        if (f->type != AMQP_FRAME_METHOD ||
            !(amqp_method_lookup(amqp_method_peek_id(f->payload))->flags &
              AMQP_CONTENT))
          continue;
        /* find this channel's header, then its bodies */
        size_t j = i + 1;
        while (j < g.nframes && g.frames[j].channel != f->channel)
          j++;
        assert_true(j < g.nframes);
        assert_int_equal(g.frames[j].type, AMQP_FRAME_HEADER);
        uint64_t want = amqp_content_header_peek_size(g.frames[j].payload);
        uint64_t got = 0;
        for (j++; got < want && j < g.nframes; j++)
          if (g.frames[j].channel == f->channel) {
            assert_int_equal(g.frames[j].type, AMQP_FRAME_BODY);
            got += g.frames[j].payload.len;
          }
        assert_int_equal(got, want);
      }
      golden_free(&g);
    }
  }
  assert_true(methods > 100);
  assert_true(headers > 10);
}

/* The stream cut in two at every byte offset, fed as a forwarder would:
 * parse what is there, keep the rest, then the second part. Same frames. */
static void test_split_every_offset(void **state) {
  (void)state;
  for (size_t s = 0; s < NSESSIONS; s++) {
    for (size_t d = 0; d < 2; d++) {
      golden_stream g;
      golden_load(&g, sessions[s], sides[d]);
      for (size_t cut = g.start; cut <= g.len; cut++) {
        size_t off = g.start, idx = 0, avail = cut;
        for (int part = 0; part < 2; part++, avail = g.len) {
          for (;;) {
            amqp_frame f;
            long n = amqp_frame_parse(g.bytes + off, avail - off, 131072, &f);
            if (n == AMQP_PARTIAL)
              break;
            assert_true(n > 0);
            assert_true(idx < g.nframes);
            assert_int_equal(f.type, g.frames[idx].type);
            assert_int_equal(f.channel, g.frames[idx].channel);
            assert_ptr_equal(f.payload.ptr, g.frames[idx].payload.ptr);
            assert_int_equal(f.payload.len, g.frames[idx].payload.len);
            off += (size_t)n;
            idx++;
          }
        }
        assert_int_equal(idx, g.nframes);
        assert_int_equal(off, g.len);
      }
      golden_free(&g);
    }
  }
}

/* Every proper prefix of every frame (up to 8 KiB), alone in a buffer of
 * exactly its size: PARTIAL, and no read past its end (ASan). Every proper
 * prefix of every method and header payload: an error, never a crash. */
static void test_prefixes_exact(void **state) {
  (void)state;
  for (size_t s = 0; s < NSESSIONS; s++) {
    for (size_t d = 0; d < 2; d++) {
      golden_stream g;
      golden_load(&g, sessions[s], sides[d]);
      for (size_t i = 0; i < g.nframes; i++) {
        const amqp_frame *f = &g.frames[i];
        const uint8_t *start = f->payload.ptr - AMQP_FRAME_HEADER_SIZE;
        size_t flen = f->payload.len + AMQP_FRAME_OVERHEAD;
        if (flen > 8192)
          continue;
        for (size_t k = 0; k < flen; k++) {
          uint8_t *c = exact_copy(start, k);
          amqp_frame pf;
          assert_int_equal(amqp_frame_parse(c, k, 131072, &pf), AMQP_PARTIAL);
          free(c);
        }
        for (size_t k = 0; k < f->payload.len && f->type != AMQP_FRAME_BODY;
             k++) {
          uint8_t *c = exact_copy(f->payload.ptr, k);
          amqp_method m;
          amqp_content_header h;
          int rc = f->type == AMQP_FRAME_METHOD
                       ? amqp_method_decode((amqp_bytes){c, k}, &m)
                       : amqp_content_header_decode((amqp_bytes){c, k}, &h);
          assert_true(rc < 0);
          free(c);
        }
      }
      golden_free(&g);
    }
  }
}

static amqp_bytes arg(const amqp_method *m, unsigned i) {
  return m->args[i].b;
}

#define ASSERT_STR(bytes, lit) assert_true(amqp_bytes_eq((bytes), BYTES(lit)))

static void expect_entry(amqp_table_iter *it, const char *key, uint8_t type,
                         amqp_field *v) {
  amqp_bytes k;
  assert_int_equal(amqp_table_next(it, &k, v), 1);
  if (!amqp_bytes_eq(k, amqp_cstr(key)))
    fail_msg("expected key %s, got %.*s", key, (int)k.len, (const char *)k.ptr);
  assert_int_equal(v->type, type);
}

/* Handshake of every session: what the broker offered, what each client
 * answered (MANIFEST.md, "Common to all sessions"). */
static void test_handshake_values(void **state) {
  (void)state;
  static const unsigned heartbeat[] = {5, 0, 60, 0};
  for (size_t s = 0; s < NSESSIONS; s++) {
    golden_stream srv, cli;
    amqp_method m;
    amqp_field v;
    golden_load(&srv, sessions[s], "server");
    golden_load(&cli, sessions[s], "client");
    assert_int_equal(golden_find(&srv, AMQP_CONNECTION_START, 0, &m), 0);
    assert_int_equal(srv.frames[0].payload.len, 499);
    assert_int_equal(m.args[AMQP_F_CONNECTION_START_VERSION_MAJOR].u, 0);
    assert_int_equal(m.args[AMQP_F_CONNECTION_START_VERSION_MINOR].u, 9);
    ASSERT_STR(arg(&m, AMQP_F_CONNECTION_START_MECHANISMS), "AMQPLAIN PLAIN");
    ASSERT_STR(arg(&m, AMQP_F_CONNECTION_START_LOCALES), "en_US");
    amqp_bytes props = arg(&m, AMQP_F_CONNECTION_START_SERVER_PROPERTIES);
    assert_int_equal(amqp_table_get(props, BYTES("product"), &v), AMQP_OK);
    ASSERT_STR(v.v.bytes, "RabbitMQ");
    assert_int_equal(amqp_table_get(props, BYTES("version"), &v), AMQP_OK);
    ASSERT_STR(v.v.bytes, "3.10.8");
    assert_int_equal(amqp_table_get(props, BYTES("cluster_name"), &v), AMQP_OK);
    ASSERT_STR(v.v.bytes, "rebound-test");
    assert_int_equal(amqp_table_get(props, BYTES("capabilities"), &v), AMQP_OK);
    assert_int_equal(v.type, 'F');
    amqp_bytes caps = v.v.bytes;
    assert_int_equal(amqp_table_get(caps, BYTES("basic.nack"), &v), AMQP_OK);
    assert_int_equal(v.type, 't');
    assert_int_equal(v.v.u, 1);

    golden_find(&srv, AMQP_CONNECTION_TUNE, 0, &m);
    assert_int_equal(m.args[AMQP_F_CONNECTION_TUNE_CHANNEL_MAX].u, 2047);
    assert_int_equal(m.args[AMQP_F_CONNECTION_TUNE_FRAME_MAX].u, 131072);
    assert_int_equal(m.args[AMQP_F_CONNECTION_TUNE_HEARTBEAT].u, 60);

    golden_find(&cli, AMQP_CONNECTION_START_OK, 0, &m);
    ASSERT_STR(arg(&m, AMQP_F_CONNECTION_START_OK_MECHANISM), "PLAIN");
    ASSERT_STR(arg(&m, AMQP_F_CONNECTION_START_OK_RESPONSE), "\0guest\0guest");
    if (strcmp(sessions[s], "bunny") == 0)
      ASSERT_STR(arg(&m, AMQP_F_CONNECTION_START_OK_LOCALE), "en_GB");
    else
      ASSERT_STR(arg(&m, AMQP_F_CONNECTION_START_OK_LOCALE), "en_US");
    golden_find(&cli, AMQP_CONNECTION_TUNE_OK, 0, &m);
    assert_int_equal(m.args[AMQP_F_CONNECTION_TUNE_OK_CHANNEL_MAX].u, 2047);
    assert_int_equal(m.args[AMQP_F_CONNECTION_TUNE_OK_FRAME_MAX].u, 131072);
    assert_int_equal(m.args[AMQP_F_CONNECTION_TUNE_OK_HEARTBEAT].u,
                     heartbeat[s]);
    golden_find(&cli, AMQP_CONNECTION_OPEN, 0, &m);
    ASSERT_STR(arg(&m, AMQP_F_CONNECTION_OPEN_VIRTUAL_HOST), "/");
    golden_free(&srv);
    golden_free(&cli);
  }
}

static void test_pika_topology(void **state) {
  (void)state;
  golden_stream cli;
  amqp_method m;
  amqp_field v;
  amqp_table_iter it;
  golden_load(&cli, "pika", "client");
  golden_find(&cli, AMQP_EXCHANGE_DECLARE, 1, &m);
  ASSERT_STR(arg(&m, AMQP_F_EXCHANGE_DECLARE_EXCHANGE), "golden.x.topic");
  ASSERT_STR(arg(&m, AMQP_F_EXCHANGE_DECLARE_TYPE), "topic");
  assert_int_equal(m.args[AMQP_F_EXCHANGE_DECLARE_DURABLE].u, 0);
  assert_int_equal(m.args[AMQP_F_EXCHANGE_DECLARE_AUTO_DELETE].u, 1);
  golden_find(&cli, AMQP_EXCHANGE_BIND, 0, &m);
  ASSERT_STR(arg(&m, AMQP_F_EXCHANGE_BIND_DESTINATION), "golden.x.topic");
  ASSERT_STR(arg(&m, AMQP_F_EXCHANGE_BIND_SOURCE), "golden.x.direct");
  ASSERT_STR(arg(&m, AMQP_F_EXCHANGE_BIND_ROUTING_KEY), "golden.rk");

  golden_find(&cli, AMQP_QUEUE_DECLARE, 1, &m);
  ASSERT_STR(arg(&m, AMQP_F_QUEUE_DECLARE_QUEUE), "golden.q.classic");
  assert_int_equal(m.args[AMQP_F_QUEUE_DECLARE_DURABLE].u, 1);
  amqp_table_iter_init(&it, arg(&m, AMQP_F_QUEUE_DECLARE_ARGUMENTS));
  expect_entry(&it, "x-message-ttl", 'I', &v);
  assert_int_equal(v.v.i, 60000);
  expect_entry(&it, "x-dead-letter-exchange", 'S', &v);
  ASSERT_STR(v.v.bytes, "golden.x.dlx");
  golden_find(&cli, AMQP_QUEUE_DECLARE, 2, &m);
  assert_int_equal(amqp_table_get(arg(&m, AMQP_F_QUEUE_DECLARE_ARGUMENTS),
                                  BYTES("x-queue-type"), &v),
                   AMQP_OK);
  ASSERT_STR(v.v.bytes, "quorum");
  golden_find(&cli, AMQP_BASIC_QOS, 0, &m);
  assert_int_equal(m.args[AMQP_F_BASIC_QOS_PREFETCH_COUNT].u, 10);
  golden_find(&cli, AMQP_CONFIRM_SELECT, 0, &m);
  assert_int_equal(m.args[AMQP_F_CONFIRM_SELECT_NOWAIT].u, 0);
  golden_find(&cli, AMQP_TX_SELECT, 0, &m);
  golden_find(&cli, AMQP_TX_COMMIT, 0, &m);
  golden_find(&cli, AMQP_TX_ROLLBACK, 0, &m);
  golden_find(&cli, AMQP_QUEUE_DELETE, 2, &m);
  ASSERT_STR(arg(&m, AMQP_F_QUEUE_DELETE_QUEUE), "golden.q.dead");
  assert_int_equal(m.args[AMQP_F_QUEUE_DELETE_IF_EMPTY].u, 1);
  assert_int_equal(m.args[AMQP_F_QUEUE_DELETE_IF_UNUSED].u, 0);
  golden_find(&cli, AMQP_EXCHANGE_DELETE, 2, &m);
  assert_int_equal(m.args[AMQP_F_EXCHANGE_DELETE_IF_UNUSED].u, 1);
  golden_find(&cli, AMQP_CONNECTION_CLOSE, 0, &m);
  assert_int_equal(m.args[AMQP_F_CONNECTION_CLOSE_REPLY_CODE].u, 200);
  ASSERT_STR(arg(&m, AMQP_F_CONNECTION_CLOSE_REPLY_TEXT), "Normal shutdown");
  golden_free(&cli);
}

/* P1: every basic property, and a headers table of every type pika writes,
 * exactly as MANIFEST.md lists them, in wire order. */
static void test_pika_all_properties(void **state) {
  (void)state;
  golden_stream cli;
  amqp_method m;
  amqp_content_header h;
  amqp_field v;
  amqp_table_iter it, inner;
  golden_load(&cli, "pika", "client");
  size_t i = golden_find(&cli, AMQP_BASIC_PUBLISH, 0, &m);
  ASSERT_STR(arg(&m, AMQP_F_BASIC_PUBLISH_EXCHANGE), "golden.x.direct");
  ASSERT_STR(arg(&m, AMQP_F_BASIC_PUBLISH_ROUTING_KEY), "golden.rk");
  assert_int_equal(m.args[AMQP_F_BASIC_PUBLISH_MANDATORY].u, 0);
  assert_int_equal(cli.frames[i + 1].payload.len, 504);
  assert_int_equal(amqp_content_header_decode(cli.frames[i + 1].payload, &h),
                   AMQP_OK);
  assert_int_equal(h.class_id, 60);
  assert_int_equal(h.body_size, 38);
  assert_int_equal(h.props.flags, 0xfffc);
  ASSERT_STR(h.props.content_type, "text/plain");
  ASSERT_STR(h.props.content_encoding, "utf-8");
  assert_int_equal(h.props.delivery_mode, 2);
  assert_int_equal(h.props.priority, 7);
  ASSERT_STR(h.props.correlation_id, "golden-corr-0001");
  ASSERT_STR(h.props.reply_to, "golden.reply");
  ASSERT_STR(h.props.expiration, "60000");
  ASSERT_STR(h.props.message_id, "golden-msg-0001");
  assert_int_equal(h.props.timestamp, 1700000000);
  ASSERT_STR(h.props.type, "golden.type");
  ASSERT_STR(h.props.user_id, "guest");
  ASSERT_STR(h.props.app_id, "rebound-golden");
  ASSERT_STR(h.props.cluster_id, "golden-cluster");
  ASSERT_STR(cli.frames[i + 2].payload,
             "golden body 1: all 14 basic properties");

  amqp_table_iter_init(&it, h.props.headers);
  expect_entry(&it, "h.bool.true", 't', &v);
  assert_int_equal(v.v.u, 1);
  expect_entry(&it, "h.bool.false", 't', &v);
  assert_int_equal(v.v.u, 0);
  expect_entry(&it, "h.int.small", 'I', &v);
  assert_int_equal(v.v.i, 42);
  expect_entry(&it, "h.int.negative", 'I', &v);
  assert_int_equal(v.v.i, -7);
  expect_entry(&it, "h.int.max32", 'I', &v);
  assert_int_equal(v.v.i, 2147483647);
  expect_entry(&it, "h.int64", 'l', &v);
  assert_true(v.v.i == 9007199254740993LL);
  expect_entry(&it, "h.int64.negative", 'l', &v);
  assert_true(v.v.i == -5000000000LL);
  expect_entry(&it, "h.long.marked", 'l', &v);
  assert_int_equal(v.v.i, 5);
  expect_entry(&it, "h.decimal", 'D', &v);
  assert_int_equal(v.v.dec.scale, 5);
  assert_int_equal(v.v.dec.value, 314159);
  expect_entry(&it, "h.str", 'S', &v);
  ASSERT_STR(v.v.bytes, "h\xc3\xa9llo w\xc3\xb6rld");
  expect_entry(&it, "h.str.empty", 'S', &v);
  assert_int_equal(v.v.bytes.len, 0);
  expect_entry(&it, "h.bytes", 'x', &v);
  ASSERT_STR(v.v.bytes, "\x00\x01\xfe\xff");
  expect_entry(&it, "h.timestamp", 'T', &v);
  assert_int_equal(v.v.u, 1704164645);
  expect_entry(&it, "h.array", 'A', &v);
  amqp_table_iter_init(&inner, v.v.bytes);
  static const uint8_t types[] = {'I', 'S', 't', 'V', 'A'};
  for (size_t k = 0; k < sizeof types; k++) {
    assert_int_equal(amqp_array_next(&inner, &v), 1);
    assert_int_equal(v.type, types[k]);
  }
  assert_int_equal(amqp_array_next(&inner, &v), 0);
  expect_entry(&it, "h.table", 'F', &v);
  assert_int_equal(v.v.bytes.len, 55);
  amqp_bytes tbl = v.v.bytes;
  assert_int_equal(amqp_table_get(tbl, BYTES("inner.str"), &v), AMQP_OK);
  ASSERT_STR(v.v.bytes, "x");
  assert_int_equal(amqp_table_get(tbl, BYTES("inner.table"), &v), AMQP_OK);
  assert_int_equal(amqp_table_get(v.v.bytes, BYTES("deep"), &v), AMQP_OK);
  assert_int_equal(v.type, 't');
  expect_entry(&it, "h.void", 'V', &v);
  amqp_bytes end_key;
  assert_int_equal(amqp_table_next(&it, &end_key, &v), 0);

  /* the broker hands the same header back, byte for byte, on basic.get */
  golden_stream srv;
  golden_load(&srv, "pika", "server");
  size_t j = golden_find(&srv, AMQP_BASIC_GET_OK, 0, &m);
  assert_int_equal(m.args[AMQP_F_BASIC_GET_OK_DELIVERY_TAG].u, 1);
  assert_int_equal(m.args[AMQP_F_BASIC_GET_OK_MESSAGE_COUNT].u, 2);
  assert_true(
      amqp_bytes_eq(srv.frames[j + 1].payload, cli.frames[i + 1].payload));
  golden_free(&srv);
  golden_free(&cli);
}

/* P2: 300000 bytes in three body frames, each within frame-max. */
static void test_pika_big_body(void **state) {
  (void)state;
  golden_stream cli;
  amqp_method m;
  amqp_content_header h;
  golden_load(&cli, "pika", "client");
  size_t i = golden_find(&cli, AMQP_BASIC_PUBLISH, 1, &m);
  ASSERT_STR(arg(&m, AMQP_F_BASIC_PUBLISH_ROUTING_KEY), "golden.q.classic");
  assert_int_equal(amqp_content_header_decode(cli.frames[i + 1].payload, &h),
                   AMQP_OK);
  assert_int_equal(h.body_size, 300000);
  assert_int_equal(h.props.flags, AMQP_P_CONTENT_TYPE | AMQP_P_DELIVERY_MODE);
  ASSERT_STR(h.props.content_type, "application/octet-stream");
  static const size_t sizes[] = {131064, 131064, 37872};
  size_t at = 0;
  for (size_t k = 0; k < 3; k++) {
    const amqp_frame *f = &cli.frames[i + 2 + k];
    assert_int_equal(f->type, AMQP_FRAME_BODY);
    assert_int_equal(f->payload.len, sizes[k]);
    for (size_t b = 0; b < f->payload.len; b++, at++)
      if (f->payload.ptr[b] != at % 251)
        fail_msg("body byte %zu", at);
  }
  golden_free(&cli);
}

static void test_pika_acks_and_errors(void **state) {
  (void)state;
  golden_stream cli, srv;
  amqp_method m;
  golden_load(&cli, "pika", "client");
  golden_load(&srv, "pika", "server");
  /* publisher confirms 1..3 from the broker */
  for (unsigned k = 0; k < 3; k++) {
    golden_find(&srv, AMQP_BASIC_ACK, k, &m);
    assert_int_equal(m.args[AMQP_F_BASIC_ACK_DELIVERY_TAG].u, k + 1);
    assert_int_equal(m.args[AMQP_F_BASIC_ACK_MULTIPLE].u, 0);
  }
  golden_find(&srv, AMQP_BASIC_RETURN, 0, &m);
  assert_int_equal(m.args[AMQP_F_BASIC_RETURN_REPLY_CODE].u, 312);
  ASSERT_STR(arg(&m, AMQP_F_BASIC_RETURN_REPLY_TEXT), "NO_ROUTE");
  ASSERT_STR(arg(&m, AMQP_F_BASIC_RETURN_ROUTING_KEY), "golden.rk.nowhere");

  golden_find(&cli, AMQP_BASIC_REJECT, 0, &m);
  assert_int_equal(m.args[AMQP_F_BASIC_REJECT_DELIVERY_TAG].u, 2);
  assert_int_equal(m.args[AMQP_F_BASIC_REJECT_REQUEUE].u, 1);
  golden_find(&cli, AMQP_BASIC_NACK, 0, &m);
  assert_int_equal(m.args[AMQP_F_BASIC_NACK_DELIVERY_TAG].u, 4);
  assert_int_equal(m.args[AMQP_F_BASIC_NACK_MULTIPLE].u, 1);
  assert_int_equal(m.args[AMQP_F_BASIC_NACK_REQUEUE].u, 1);
  golden_find(&cli, AMQP_BASIC_NACK, 1, &m);
  assert_int_equal(m.args[AMQP_F_BASIC_NACK_DELIVERY_TAG].u, 9);
  assert_int_equal(m.args[AMQP_F_BASIC_NACK_MULTIPLE].u, 0);
  assert_int_equal(m.args[AMQP_F_BASIC_NACK_REQUEUE].u, 0);
  golden_find(&cli, AMQP_BASIC_RECOVER, 0, &m);
  assert_int_equal(m.args[AMQP_F_BASIC_RECOVER_REQUEUE].u, 1);
  golden_find(&srv, AMQP_BASIC_RECOVER_OK, 0, &m);

  golden_find(&cli, AMQP_BASIC_CONSUME, 0, &m);
  ASSERT_STR(arg(&m, AMQP_F_BASIC_CONSUME_CONSUMER_TAG), "golden.ctag.classic");
  golden_find(&srv, AMQP_BASIC_DELIVER, 0, &m);
  ASSERT_STR(arg(&m, AMQP_F_BASIC_DELIVER_CONSUMER_TAG), "golden.ctag.classic");
  assert_int_equal(m.args[AMQP_F_BASIC_DELIVER_DELIVERY_TAG].u, 3);
  assert_int_equal(m.args[AMQP_F_BASIC_DELIVER_REDELIVERED].u, 1);
  golden_find(&srv, AMQP_BASIC_GET_EMPTY, 0, &m);

  golden_find(&srv, AMQP_CHANNEL_CLOSE, 0, &m);
  assert_int_equal(m.args[AMQP_F_CHANNEL_CLOSE_REPLY_CODE].u, 404);
  ASSERT_STR(arg(&m, AMQP_F_CHANNEL_CLOSE_REPLY_TEXT),
             "NOT_FOUND - no queue 'golden.q.missing' in vhost '/'");
  assert_int_equal(m.args[AMQP_F_CHANNEL_CLOSE_CLASS_ID].u, 50);
  assert_int_equal(m.args[AMQP_F_CHANNEL_CLOSE_METHOD_ID].u, 10);
  golden_find(&srv, AMQP_CHANNEL_CLOSE, 1, &m);
  assert_int_equal(m.args[AMQP_F_CHANNEL_CLOSE_REPLY_CODE].u, 406);
  ASSERT_STR(arg(&m, AMQP_F_CHANNEL_CLOSE_REPLY_TEXT),
             "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue "
             "'golden.q.classic' in vhost '/': received '30000' but current "
             "is '60000'");
  golden_find(&srv, AMQP_QUEUE_PURGE_OK, 0, &m);
  assert_int_equal(m.args[AMQP_F_QUEUE_PURGE_OK_MESSAGE_COUNT].u, 1);
  golden_find(&srv, AMQP_QUEUE_DECLARE_OK, 3, &m);
  assert_int_equal(arg(&m, AMQP_F_QUEUE_DECLARE_OK_QUEUE).len, 30);
  assert_memory_equal(arg(&m, AMQP_F_QUEUE_DECLARE_OK_QUEUE).ptr, "amq.gen-",
                      8);
  golden_free(&cli);
  golden_free(&srv);
}

/* A quorum queue's redelivery: headers re-sorted and x-delivery-count
 * added by the broker; the retry path must read counters from such
 * tables too. */
static void test_quorum_redelivery(void **state) {
  (void)state;
  golden_stream srv;
  amqp_method m;
  amqp_content_header h;
  amqp_field v;
  golden_load(&srv, "pika", "server");
  size_t i = 0;
  for (unsigned k = 0;; k++) {
    i = golden_find(&srv, AMQP_BASIC_DELIVER, k, &m);
    if (m.args[AMQP_F_BASIC_DELIVER_DELIVERY_TAG].u == 11)
      break;
  }
  ASSERT_STR(arg(&m, AMQP_F_BASIC_DELIVER_CONSUMER_TAG), "golden.ctag.quorum");
  assert_int_equal(m.args[AMQP_F_BASIC_DELIVER_REDELIVERED].u, 1);
  assert_int_equal(srv.frames[i + 1].payload.len, 530);
  assert_int_equal(amqp_content_header_decode(srv.frames[i + 1].payload, &h),
                   AMQP_OK);
  assert_int_equal(h.props.flags, 0xfffc);
  assert_int_equal(
      amqp_table_get(h.props.headers, BYTES("x-delivery-count"), &v), AMQP_OK);
  assert_int_equal(v.type, 'l');
  assert_int_equal(v.v.i, 1);
  amqp_table_iter it;
  amqp_table_iter_init(&it, h.props.headers);
  expect_entry(&it, "h.array", 'A', &v);
  expect_entry(&it, "h.bool.false", 't', &v);
  golden_free(&srv);
}

static void test_kombu_bunny_tools(void **state) {
  (void)state;
  golden_stream g;
  amqp_method m;
  amqp_content_header h;
  amqp_field v;

  golden_load(&g, "kombu", "client");
  size_t i = golden_find(&g, AMQP_BASIC_PUBLISH, 0, &m);
  assert_int_equal(amqp_content_header_decode(g.frames[i + 1].payload, &h),
                   AMQP_OK);
  assert_int_equal(h.props.flags, 0xfc80);
  assert_int_equal(amqp_table_get(h.props.headers, BYTES("k.float"), &v),
                   AMQP_OK);
  assert_int_equal(v.type, 'd');
  assert_true(v.v.d == 2.5);
  i = golden_find(&g, AMQP_BASIC_PUBLISH, 1, &m);
  assert_int_equal(amqp_content_header_decode(g.frames[i + 1].payload, &h),
                   AMQP_OK);
  assert_int_equal(h.props.flags, 0xf880);
  assert_true(h.props.flags & AMQP_P_HEADERS);
  assert_int_equal(h.props.headers.len, 0); /* present and empty */
  golden_find(&g, AMQP_BASIC_CONSUME, 0, &m);
  ASSERT_STR(arg(&m, AMQP_F_BASIC_CONSUME_CONSUMER_TAG), "None1");
  golden_find(&g, AMQP_CONNECTION_CLOSE, 0, &m);
  assert_int_equal(m.args[AMQP_F_CONNECTION_CLOSE_REPLY_CODE].u, 0);
  golden_free(&g);

  golden_load(&g, "bunny", "client");
  golden_find(&g, AMQP_QUEUE_DECLARE, 0, &m);
  assert_int_equal(amqp_table_get(arg(&m, AMQP_F_QUEUE_DECLARE_ARGUMENTS),
                                  BYTES("x-max-length"), &v),
                   AMQP_OK);
  assert_int_equal(v.type, 'l');
  assert_int_equal(v.v.i, 100);
  i = golden_find(&g, AMQP_BASIC_PUBLISH, 0, &m);
  assert_int_equal(amqp_content_header_decode(g.frames[i + 1].payload, &h),
                   AMQP_OK);
  assert_int_equal(h.props.flags, 0xb8c0);
  /* bunny writes 'f' little-endian; the codec reads the wire as it is */
  assert_int_equal(amqp_table_get(h.props.headers, BYTES("b.float32"), &v),
                   AMQP_OK);
  uint32_t bits;
  memcpy(&bits, &v.v.f, sizeof bits);
  assert_int_equal(bits, 0x0000c03f);
  golden_free(&g);

  golden_load(&g, "bunny", "server");
  golden_find(&g, AMQP_BASIC_CONSUME_OK, 0, &m);
  assert_int_equal(arg(&m, AMQP_F_BASIC_CONSUME_OK_CONSUMER_TAG).len, 31);
  assert_memory_equal(arg(&m, AMQP_F_BASIC_CONSUME_OK_CONSUMER_TAG).ptr,
                      "amq.ctag-", 9);
  /* publisher confirms: the broker may coalesce them (varies), the last
   * one always covers delivery-tag 2 */
  golden_find(&g, AMQP_BASIC_ACK, 0, &m);
  if (m.args[AMQP_F_BASIC_ACK_DELIVERY_TAG].u == 1) {
    assert_int_equal(m.args[AMQP_F_BASIC_ACK_MULTIPLE].u, 0);
    golden_find(&g, AMQP_BASIC_ACK, 1, &m);
  }
  assert_int_equal(m.args[AMQP_F_BASIC_ACK_DELIVERY_TAG].u, 2);
  golden_free(&g);

  golden_load(&g, "tools", "client");
  golden_find(&g, AMQP_BASIC_QOS, 0, &m);
  assert_int_equal(m.args[AMQP_F_BASIC_QOS_PREFETCH_COUNT].u, 2);
  golden_find(&g, AMQP_BASIC_QOS, 1, &m);
  assert_int_equal(m.args[AMQP_F_BASIC_QOS_PREFETCH_COUNT].u, 1);
  golden_find(&g, AMQP_CHANNEL_CLOSE, 0, &m);
  assert_int_equal(m.args[AMQP_F_CHANNEL_CLOSE_REPLY_CODE].u, 200);
  ASSERT_STR(arg(&m, AMQP_F_CHANNEL_CLOSE_REPLY_TEXT), "200");
  golden_free(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_reencode),
      cmocka_unit_test(test_split_every_offset),
      cmocka_unit_test(test_prefixes_exact),
      cmocka_unit_test(test_handshake_values),
      cmocka_unit_test(test_pika_topology),
      cmocka_unit_test(test_pika_all_properties),
      cmocka_unit_test(test_pika_big_body),
      cmocka_unit_test(test_pika_acks_and_errors),
      cmocka_unit_test(test_quorum_redelivery),
      cmocka_unit_test(test_kombu_bunny_tools),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
