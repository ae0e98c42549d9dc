/* px_out.c - a session's output, in order (px_out.h). */
#include "px_out.h"

#include <string.h>

#include "px_log.h"

static px_out_status fail(px_out *o, px_out_status st) {
  if (!o->failed)
    o->failed = st;
  return st;
}

/* A frame rebound builds did not encode: a defect, logged once here. */
static px_out_status encode_failed(px_out *o, const char *what, long status) {
  px_error("encode_failed", PX_S("frame", what),
           PX_S("error", amqp_status_str((int)status)));
  return fail(o, PX_OUT_ENCODE);
}

/* A queue call's status: a write error of the flush it made is the
 * transport's to report (kept for the session), the rest are failures. */
static px_out_status queued(px_out *o, px_conn *to, int rc) {
  if (rc == 0)
    return PX_OUT_OK;
  if (rc == UV_ENOMEM)
    return fail(o, PX_OUT_NOMEM);
  if (rc == UV_ENOBUFS)
    return fail(o, PX_OUT_FULL);
  if (!o->write_error) {
    o->write_error = rc;
    o->write_failed_on = to;
  }
  return PX_OUT_OK; /* dropped: the connection is failing */
}

void px_out_transport_error(px_out *o, px_conn *conn, int err) {
  if (!o->write_error) {
    o->write_error = err;
    o->write_failed_on = conn;
  }
}

void px_out_run_begin(px_out *o, px_conn *to, px_chunk *chunk, uint32_t off) {
  o->run.to = to;
  o->run.chunk = chunk;
  o->run.start = o->run.end = off;
}

px_out_status px_out_run_flush(px_out *o, uint32_t off) {
  px_out_status st = PX_OUT_OK;
  if (o->run.to && o->run.end > o->run.start)
    st = queued(o, o->run.to,
                px_conn_queue(o->run.to, o->run.chunk,
                              o->run.chunk->data + o->run.start,
                              o->run.end - o->run.start));
  o->run.start = o->run.end = off;
  return st;
}

px_out_status px_out_run_end(px_out *o) {
  px_out_status st = px_out_run_flush(o, o->run.end);
  o->run.to = NULL;
  o->run.chunk = NULL;
  return st;
}

/* What rebound writes to `sink` comes after the frames forwarded so far. */
static px_out_status close_run(px_out *o, px_conn *sink) {
  return sink && o->run.to == sink ? px_out_run_flush(o, o->run.end)
                                   : PX_OUT_OK;
}

px_out_status px_out_slice(px_out *o, px_conn *to, px_chunk *c,
                           const uint8_t *p, uint32_t len) {
  px_out_status st = close_run(o, to);
  if (st != PX_OUT_OK)
    return st;
  return queued(o, to, px_conn_queue(to, c, p, len));
}

static px_out_status to_pub(px_out *o, const uint8_t *data, size_t len) {
  if (!o->pub || px_pub_write(o->pub, data, len) != 0)
    return fail(o, PX_OUT_RETRY);
  return PX_OUT_OK;
}

px_out_status px_out_bytes(px_out *o, px_conn *sink, const uint8_t *data,
                           size_t len) {
  if (!sink)
    return to_pub(o, data, len);
  px_out_status st = close_run(o, sink);
  if (st != PX_OUT_OK)
    return st;
  return queued(o, sink, px_conn_queue_copy(sink, data, len));
}

px_out_status px_out_frame(px_out *o, px_conn *sink, uint8_t type, uint16_t ch,
                           const uint8_t *payload, size_t len) {
  px_out_status st = close_run(o, sink);
  if (st != PX_OUT_OK)
    return st;
  px_chunk *c = px_chunk_new(len + AMQP_FRAME_OVERHEAD);
  if (!c)
    return fail(o, PX_OUT_NOMEM);
  long n =
      amqp_frame_write(c->data, c->cap, type, ch, (amqp_bytes){payload, len});
  if (n < 0) {
    px_chunk_unref(c);
    return encode_failed(
        o, type == AMQP_FRAME_HEADER ? "content header" : "frame", n);
  }
  c->len = (uint32_t)n;
  st = sink ? queued(o, sink, px_conn_queue(sink, c, c->data, c->len))
            : to_pub(o, c->data, c->len);
  px_chunk_unref(c);
  return st;
}

px_out_status px_out_method(px_out *o, px_conn *sink, uint16_t ch,
                            const amqp_method *m) {
  uint8_t buf[1024];
  long n = amqp_method_frame_write(buf, sizeof buf, ch, m);
  if (n < 0)
    return encode_failed(o, m->desc ? m->desc->name : "method", n);
  return px_out_bytes(o, sink, buf, (size_t)n);
}

px_out_status px_out_connection_close(px_out *o, px_conn *sink, uint16_t code,
                                      const char *text, uint16_t class_id,
                                      uint16_t method_id) {
  amqp_method m;
  amqp_method_init(&m, AMQP_CONNECTION_CLOSE);
  m.args[AMQP_F_CONNECTION_CLOSE_REPLY_CODE].u = code;
  m.args[AMQP_F_CONNECTION_CLOSE_REPLY_TEXT].b = amqp_cstr(text);
  m.args[AMQP_F_CONNECTION_CLOSE_CLASS_ID].u = class_id;
  m.args[AMQP_F_CONNECTION_CLOSE_METHOD_ID].u = method_id;
  return px_out_method(o, sink, 0, &m);
}

px_out_status px_out_connection_start(px_out *o, px_conn *sink) {
  uint8_t props[64];
  amqp_writer w = amqp_writer_make(props, sizeof props);
  amqp_field f = amqp_field_string(amqp_cstr("rebound"));
  amqp_table_write_entry(&w, amqp_cstr("product"), &f);
  amqp_method m;
  amqp_method_init(&m, AMQP_CONNECTION_START);
  m.args[AMQP_F_CONNECTION_START_VERSION_MAJOR].u = 0;
  m.args[AMQP_F_CONNECTION_START_VERSION_MINOR].u = 9;
  m.args[AMQP_F_CONNECTION_START_SERVER_PROPERTIES].b =
      (amqp_bytes){props, w.len};
  m.args[AMQP_F_CONNECTION_START_MECHANISMS].b = amqp_cstr("PLAIN AMQPLAIN");
  m.args[AMQP_F_CONNECTION_START_LOCALES].b = amqp_cstr("en_US");
  return px_out_method(o, sink, 0, &m);
}

px_out_status px_out_channel_close(px_out *o, px_conn *sink, uint16_t ch,
                                   uint16_t code, const char *text) {
  amqp_method m;
  amqp_method_init(&m, AMQP_CHANNEL_CLOSE);
  m.args[AMQP_F_CHANNEL_CLOSE_REPLY_CODE].u = code;
  m.args[AMQP_F_CHANNEL_CLOSE_REPLY_TEXT].b = amqp_cstr(text);
  return px_out_method(o, sink, ch, &m);
}

px_out_status px_out_settle(px_out *o, px_conn *sink, uint16_t ch,
                            uint32_t method_id, uint64_t tag, bool requeue) {
  amqp_method m;
  amqp_method_init(&m, method_id);
  switch (method_id) {
  case AMQP_BASIC_ACK:
    m.args[AMQP_F_BASIC_ACK_DELIVERY_TAG].u = tag;
    break;
  case AMQP_BASIC_NACK:
    m.args[AMQP_F_BASIC_NACK_DELIVERY_TAG].u = tag;
    m.args[AMQP_F_BASIC_NACK_REQUEUE].u = requeue;
    break;
  default:
    m.args[AMQP_F_BASIC_REJECT_DELIVERY_TAG].u = tag;
    m.args[AMQP_F_BASIC_REJECT_REQUEUE].u = requeue;
    break;
  }
  return px_out_method(o, sink, ch, &m);
}
