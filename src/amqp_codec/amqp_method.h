/* amqp_method.h - every AMQP 0-9-1 method, as RabbitMQ speaks it.
 *
 * One descriptor table (amqp_methods.def, generated from RabbitMQ's spec)
 * drives one decoder and one encoder. A decoded method holds its arguments
 * in `args`, indexed by the generated AMQP_F_<METHOD>_<FIELD> constants:
 * bits and integers in `.u`, short/long strings and tables in `.b` as views
 * into the frame payload (tables without their length prefix).
 */
#ifndef AMQP_METHOD_H
#define AMQP_METHOD_H

#include "amqp_status.h"
#include "amqp_wire.h"

#define AMQP_SYNC 1    /* expects a response method */
#define AMQP_CONTENT 2 /* followed by a content header and body frames */

/* The most arguments any method has (exchange.declare). */
#define AMQP_MAX_FIELDS 9

#define AMQP_METHOD_ID(class_id, method_id)                                    \
  ((uint32_t)(class_id) << 16 | (uint32_t)(method_id))
#define AMQP_METHOD_CLASS(id) ((uint16_t)((id) >> 16))
#define AMQP_METHOD_INDEX(id) ((uint16_t)((id)&0xffff))

typedef enum amqp_arg_type {
  AMQP_T_BIT,
  AMQP_T_OCTET,
  AMQP_T_SHORT,
  AMQP_T_LONG,
  AMQP_T_LONGLONG,
  AMQP_T_TIMESTAMP,
  AMQP_T_SHORTSTR,
  AMQP_T_LONGSTR,
  AMQP_T_TABLE,
} amqp_arg_type;

typedef struct amqp_field_desc {
  const char *name; /* as in the spec: "delivery-tag" */
  uint8_t type;     /* amqp_arg_type */
} amqp_field_desc;

typedef struct amqp_method_desc {
  uint32_t id;      /* AMQP_METHOD_ID(class, method) */
  const char *name; /* "basic.deliver" */
  uint8_t flags;    /* AMQP_SYNC | AMQP_CONTENT */
  uint8_t nfields;
  const amqp_field_desc *fields;
} amqp_method_desc;

/* Method ids, e.g. AMQP_BASIC_DELIVER, for switch statements. */
enum amqp_method_id {
#define AMQP_FIELD(m, f, name, type)
#define AMQP_METHOD(m, cid, mid, name, flags, ...)                             \
  AMQP_##m = AMQP_METHOD_ID(cid, mid),
#include "amqp_methods.def"
#undef AMQP_METHOD
#undef AMQP_FIELD
};

/* Argument indexes, e.g. AMQP_F_BASIC_DELIVER_DELIVERY_TAG. */
#define AMQP_FIELD(m, f, name, type) AMQP_F_##m##_##f,
#define AMQP_METHOD(m, cid, mid, name, flags, ...)                             \
  enum { __VA_ARGS__ AMQP_F_##m##__COUNT };
#include "amqp_methods.def"
#undef AMQP_METHOD
#undef AMQP_FIELD

/* The whole table, in spec order. */
extern const amqp_method_desc amqp_method_table[];
extern const size_t amqp_method_count;

/* The descriptor of a method id, or NULL for an unknown one. O(1). */
const amqp_method_desc *amqp_method_lookup(uint32_t id);

typedef union amqp_arg {
  uint64_t u;   /* bit (0/1), octet, short, long, longlong, timestamp */
  amqp_bytes b; /* shortstr, longstr, table payload */
} amqp_arg;

typedef struct amqp_method {
  uint32_t id;
  const amqp_method_desc *desc;
  amqp_arg args[AMQP_MAX_FIELDS];
} amqp_method;

/* Start a method to encode: sets id and descriptor, zeroes arguments.
 * Returns AMQP_OK or AMQP_UNKNOWN_METHOD. */
int amqp_method_init(amqp_method *m, uint32_t id);

/* Decode a method frame's payload. Strings and tables in `m` are views
 * into `payload`. Tables are validated (AMQP_TABLE_MAX_DEPTH).
 * Returns AMQP_OK, AMQP_UNKNOWN_METHOD, AMQP_TRUNCATED, AMQP_TRAILING_BYTES,
 * or a table error (AMQP_BAD_FIELD_TYPE, AMQP_TOO_DEEP). */
int amqp_method_decode(amqp_bytes payload, amqp_method *m);

/* Table arguments are length-checked views whose contents are not
 * validated: for a forwarder that passes them on unread and must not be
 * stricter than the peer that interprets them. Whoever reads such a table
 * later gets the table readers' errors (amqp_table.h). */
#define AMQP_DECODE_OPAQUE_TABLES 1u

/* amqp_method_decode() with AMQP_DECODE_* flags. */
int amqp_method_decode_flags(amqp_bytes payload, amqp_method *m,
                             unsigned flags);

/* Only the class and method ids of a method payload (at least 4 bytes, as
 * amqp_frame_parse() guarantees for method frames): the cheap check a
 * forwarder makes before deciding whether to decode at all. */
static inline uint32_t amqp_method_peek_id(amqp_bytes payload) {
  amqp_reader r = amqp_reader_make(payload.ptr, payload.len);
  return amqp_get_u32(&r);
}

/* Append the method payload (ids and arguments) to `w`. Returns AMQP_OK,
 * AMQP_UNKNOWN_METHOD (no descriptor), AMQP_TOO_LONG (a shortstr over 255
 * bytes) or AMQP_NO_SPACE. */
int amqp_method_encode(const amqp_method *m, amqp_writer *w);

/* A whole method frame on `channel` into `buf`. Returns the bytes written
 * or a negative status as amqp_method_encode(). */
long amqp_method_frame_write(uint8_t *buf, size_t cap, uint16_t channel,
                             const amqp_method *m);

#endif
