/* amqp_table.h - AMQP field tables and arrays, with RabbitMQ's field types.
 *
 * A table (or array) is handled as a view of its encoded payload, without
 * the 4-byte length that precedes it on the wire. Decoding walks that view;
 * decoded strings, nested tables and arrays are views into it, valid while
 * the caller keeps the underlying buffer. Nothing here allocates.
 *
 * Types (RabbitMQ's errata, not the 0-9-1 PDF): t bool, b int8, B uint8,
 * s int16, u uint16, I int32, i uint32, l int64, f float, d double,
 * D decimal, S long string, x byte array, A array, T timestamp, F table,
 * V void.
 */
#ifndef AMQP_TABLE_H
#define AMQP_TABLE_H

#include "amqp_status.h"
#include "amqp_wire.h"

/* Nesting that amqp_table_validate() accepts by default. */
#define AMQP_TABLE_MAX_DEPTH 32

typedef struct amqp_field {
  uint8_t type; /* the type letter */
  union {
    uint64_t u; /* t (the raw octet: nonzero is true), B, u, i, T */
    int64_t i;  /* b, s, I, l (sign-extended) */
    float f;
    double d;
    struct {
      uint8_t scale;
      uint32_t value;
    } dec;            /* D */
    amqp_bytes bytes; /* S, x: the bytes; A, F: the payload (no length) */
  } v;
} amqp_field;

/* Walk a whole table payload, recursing into nested tables and arrays, and
 * check every entry: known types, lengths inside the view, nesting no
 * deeper than `max_depth` (1 = no nested tables or arrays). Returns
 * AMQP_OK, AMQP_TRUNCATED, AMQP_BAD_FIELD_TYPE or AMQP_TOO_DEEP. */
int amqp_table_validate(amqp_bytes table, int max_depth);

/* The same for an array payload (values without keys). */
int amqp_array_validate(amqp_bytes array, int max_depth);

/* Iteration over one level. Initialise with the payload view, then call
 * next until it returns 0. */
typedef struct amqp_table_iter {
  amqp_reader r;
} amqp_table_iter;

static inline void amqp_table_iter_init(amqp_table_iter *it, amqp_bytes t) {
  it->r = amqp_reader_make(t.ptr, t.len);
}

/* Next entry of a table: 1 with `*key` and `*val` set, 0 at the end, or
 * AMQP_TRUNCATED / AMQP_BAD_FIELD_TYPE (nested values are not checked:
 * validate first when the input is untrusted). */
int amqp_table_next(amqp_table_iter *it, amqp_bytes *key, amqp_field *val);

/* Next value of an array: as amqp_table_next() without a key. */
int amqp_array_next(amqp_table_iter *it, amqp_field *val);

/* The first entry named `key`: AMQP_OK with `*val` set, AMQP_NOT_FOUND, or
 * a decode error. */
int amqp_table_get(amqp_bytes table, amqp_bytes key, amqp_field *val);

/* Integer value of any integer-typed field (b B s u I i l T), for reading a
 * counter whatever type a client library chose. Returns false for other
 * types, leaving `*out` unchanged. */
bool amqp_field_as_int(const amqp_field *f, int64_t *out);

/* Write one value: its type octet, then the value (strings, arrays and
 * tables with their 4-byte length). An unknown type fails the writer. */
void amqp_field_write(amqp_writer *w, const amqp_field *f);

/* Write one table entry: the key as shortstr, then the value. */
void amqp_table_write_entry(amqp_writer *w, amqp_bytes key,
                            const amqp_field *f);

/* Start a table or array on the wire: writes a length placeholder and
 * returns its position; write entries; then amqp_table_finish() patches the
 * length. */
size_t amqp_table_begin(amqp_writer *w);
void amqp_table_finish(amqp_writer *w, size_t start);

/* Write the payload of `src` with `key` set to `val`: the first entry of
 * that name is replaced where it stands (later ones are dropped), or the
 * entry is appended. Other entries are copied byte for byte. Writes the
 * payload only, no length. Returns AMQP_OK, a decode error of `src`, or
 * AMQP_NO_SPACE. */
int amqp_table_set(amqp_writer *w, amqp_bytes src, amqp_bytes key,
                   const amqp_field *val);

/* Convenience constructors for values written by code. */
static inline amqp_field amqp_field_long(int64_t v) {
  amqp_field f;
  f.type = 'l';
  f.v.i = v;
  return f;
}

static inline amqp_field amqp_field_string(amqp_bytes s) {
  amqp_field f;
  f.type = 'S';
  f.v.bytes = s;
  return f;
}

static inline amqp_field amqp_field_timestamp(uint64_t seconds) {
  amqp_field f;
  f.type = 'T';
  f.v.u = seconds;
  return f;
}

#endif
