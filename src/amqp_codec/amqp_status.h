/* amqp_status.h - status codes of the AMQP 0-9-1 codec.
 *
 * Every fallible codec function returns one of these (negative) or a
 * non-negative result. One X-macro gives the code, the AMQP reply code a
 * proxy sends when it closes a connection over it, and the text for logs.
 */
#ifndef AMQP_STATUS_H
#define AMQP_STATUS_H

/* X(NAME, value, amqp reply code (0: not a peer's fault), text) */
#define AMQP_STATUS_MAP(X)                                                     \
  X(OK, 0, 0, "ok")                                                            \
  X(PARTIAL, -1, 0, "need more input")                                         \
  X(BAD_PROTOCOL_HEADER, -2, 0, "not an AMQP 0-9-1 protocol header")           \
  X(BAD_FRAME_END, -3, 501, "frame-end octet is not 0xCE")                     \
  X(FRAME_TOO_LARGE, -4, 501, "frame larger than the negotiated frame-max")    \
  X(UNKNOWN_FRAME_TYPE, -5, 501, "unknown frame type")                         \
  X(BAD_HEARTBEAT, -6, 505, "heartbeat frame on a channel other than 0")       \
  X(SHORT_PAYLOAD, -7, 501, "frame payload shorter than its type needs")       \
  X(TRUNCATED, -8, 502, "field runs past the end of its frame")                \
  X(TRAILING_BYTES, -9, 502, "bytes left after the last field")                \
  X(UNKNOWN_METHOD, -10, 503, "unknown class or method")                       \
  X(BAD_FIELD_TYPE, -11, 502, "unknown field-table value type")                \
  X(TOO_DEEP, -12, 502, "field tables nested too deep")                        \
  X(BAD_CONTENT_CLASS, -13, 503, "content header for a class without content") \
  X(BAD_PROPERTY_FLAGS, -14, 502, "unknown content property flag")             \
  X(NO_SPACE, -15, 0, "output buffer too small")                               \
  X(TOO_LONG, -16, 0, "value too long for its field")                          \
  X(NOT_FOUND, -17, 0, "no such key")

typedef enum amqp_status {
#define AMQP__STATUS_ENUM(name, value, reply, text) AMQP_##name = (value),
  AMQP_STATUS_MAP(AMQP__STATUS_ENUM)
#undef AMQP__STATUS_ENUM
} amqp_status;

/* Text for a status, for logs. Never NULL; "unknown status" for a value
 * that is not an amqp_status. The string is static. */
const char *amqp_status_str(int status);

/* The AMQP reply code (501 FRAME_ERROR, 502 SYNTAX_ERROR, 503
 * COMMAND_INVALID, ...) to send in connection.close when a peer's input
 * failed with this status; 0 when the status is not a peer's protocol
 * error. */
int amqp_status_reply_code(int status);

#endif
