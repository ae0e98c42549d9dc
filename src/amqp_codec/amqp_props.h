/* amqp_props.h - content header frames and the 14 basic properties.
 *
 * Decoded strings and the headers table are views into the frame payload,
 * valid while the caller keeps it. The headers view is the table payload
 * without its length prefix (see amqp_table.h).
 */
#ifndef AMQP_PROPS_H
#define AMQP_PROPS_H

#include "amqp_status.h"
#include "amqp_wire.h"

/* X(field, FLAG, flag bit, type) in wire order; type is one of SHORTSTR,
 * TABLE, OCTET, TIMESTAMP. */
#define AMQP_PROPS_MAP(X)                                                      \
  X(content_type, CONTENT_TYPE, 15, SHORTSTR)                                  \
  X(content_encoding, CONTENT_ENCODING, 14, SHORTSTR)                          \
  X(headers, HEADERS, 13, TABLE)                                               \
  X(delivery_mode, DELIVERY_MODE, 12, OCTET)                                   \
  X(priority, PRIORITY, 11, OCTET)                                             \
  X(correlation_id, CORRELATION_ID, 10, SHORTSTR)                              \
  X(reply_to, REPLY_TO, 9, SHORTSTR)                                           \
  X(expiration, EXPIRATION, 8, SHORTSTR)                                       \
  X(message_id, MESSAGE_ID, 7, SHORTSTR)                                       \
  X(timestamp, TIMESTAMP, 6, TIMESTAMP)                                        \
  X(type, TYPE, 5, SHORTSTR)                                                   \
  X(user_id, USER_ID, 4, SHORTSTR)                                             \
  X(app_id, APP_ID, 3, SHORTSTR)                                               \
  X(cluster_id, CLUSTER_ID, 2, SHORTSTR)

enum {
#define AMQP__PROP_FLAG(field, NAME, bit, type) AMQP_P_##NAME = 1u << (bit),
  AMQP_PROPS_MAP(AMQP__PROP_FLAG)
#undef AMQP__PROP_FLAG
};

#define AMQP__PROP_CTYPE_SHORTSTR amqp_bytes
#define AMQP__PROP_CTYPE_TABLE amqp_bytes
#define AMQP__PROP_CTYPE_OCTET uint8_t
#define AMQP__PROP_CTYPE_TIMESTAMP uint64_t

typedef struct amqp_props {
  uint16_t flags; /* AMQP_P_* of the properties present */
#define AMQP__PROP_MEMBER(field, NAME, bit, type) AMQP__PROP_CTYPE_##type field;
  AMQP_PROPS_MAP(AMQP__PROP_MEMBER)
#undef AMQP__PROP_MEMBER
} amqp_props;

typedef struct amqp_content_header {
  uint16_t class_id; /* 60 (basic): the only class with content */
  uint16_t weight;   /* 0 */
  uint64_t body_size;
  amqp_props props;
} amqp_content_header;

/* Decode a content header frame's payload. Absent properties are zero.
 * Returns AMQP_OK, AMQP_TRUNCATED, AMQP_TRAILING_BYTES,
 * AMQP_BAD_CONTENT_CLASS (class other than basic), AMQP_BAD_PROPERTY_FLAGS
 * (a flag basic does not define), or a table error for the headers. */
int amqp_content_header_decode(amqp_bytes payload, amqp_content_header *h);

/* Append the content header payload to `w`: only the properties whose flag
 * is set are written. Returns AMQP_OK, AMQP_TOO_LONG or AMQP_NO_SPACE. */
int amqp_content_header_encode(const amqp_content_header *h, amqp_writer *w);

/* The body size alone, without decoding properties (payload of at least 12
 * bytes, as amqp_frame_parse() guarantees for header frames). */
static inline uint64_t amqp_content_header_peek_size(amqp_bytes payload) {
  amqp_reader r = amqp_reader_make(payload.ptr + 4, 8);
  return amqp_get_u64(&r);
}

#endif
