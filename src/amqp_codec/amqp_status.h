/* amqp_status.h - status codes of the AMQP 0-9-1 codec, and the
 * protocol's reply codes.
 *
 * Every fallible codec function returns one of these (negative) or a
 * non-negative result. One X-macro gives the code, the AMQP reply code a
 * proxy sends when it closes a connection over it, and the text for logs.
 */
#ifndef AMQP_STATUS_H
#define AMQP_STATUS_H

/* The reply codes of AMQP 0-9-1 (the spec's constants), with the names
 * that start a reply-text ("NOT_FOUND - no queue 'x'").
 * X(ID, code, name) */
#define AMQP_REPLY_CODES(X)                                                    \
  X(SUCCESS, 200, "REPLY_SUCCESS")                                             \
  X(CONTENT_TOO_LARGE, 311, "CONTENT_TOO_LARGE")                               \
  X(NO_ROUTE, 312, "NO_ROUTE")                                                 \
  X(NO_CONSUMERS, 313, "NO_CONSUMERS")                                         \
  X(CONNECTION_FORCED, 320, "CONNECTION_FORCED")                               \
  X(INVALID_PATH, 402, "INVALID_PATH")                                         \
  X(ACCESS_REFUSED, 403, "ACCESS_REFUSED")                                     \
  X(NOT_FOUND, 404, "NOT_FOUND")                                               \
  X(RESOURCE_LOCKED, 405, "RESOURCE_LOCKED")                                   \
  X(PRECONDITION_FAILED, 406, "PRECONDITION_FAILED")                           \
  X(FRAME_ERROR, 501, "FRAME_ERROR")                                           \
  X(SYNTAX_ERROR, 502, "SYNTAX_ERROR")                                         \
  X(COMMAND_INVALID, 503, "COMMAND_INVALID")                                   \
  X(CHANNEL_ERROR, 504, "CHANNEL_ERROR")                                       \
  X(UNEXPECTED_FRAME, 505, "UNEXPECTED_FRAME")                                 \
  X(RESOURCE_ERROR, 506, "RESOURCE_ERROR")                                     \
  X(NOT_ALLOWED, 530, "NOT_ALLOWED")                                           \
  X(NOT_IMPLEMENTED, 540, "NOT_IMPLEMENTED")                                   \
  X(INTERNAL_ERROR, 541, "INTERNAL_ERROR")

typedef enum amqp_reply {
#define AMQP__REPLY_ENUM(id, code, name) AMQP_REPLY_##id = (code),
  AMQP_REPLY_CODES(AMQP__REPLY_ENUM)
#undef AMQP__REPLY_ENUM
} amqp_reply;

/* The name of a reply code ("NOT_FOUND"); NULL for a code the spec does
 * not define. The string is static. */
const char *amqp_reply_name(int code);

/* X(NAME, value, amqp reply code (0: not a peer's fault), text) */
#define AMQP_STATUS_MAP(X)                                                     \
  X(OK, 0, 0, "ok")                                                            \
  X(PARTIAL, -1, 0, "need more input")                                         \
  X(BAD_PROTOCOL_HEADER, -2, 0, "not an AMQP 0-9-1 protocol header")           \
  X(BAD_FRAME_END, -3, AMQP_REPLY_FRAME_ERROR, "frame-end octet is not 0xCE")  \
  X(FRAME_TOO_LARGE, -4, AMQP_REPLY_FRAME_ERROR,                               \
    "frame larger than the negotiated frame-max")                              \
  X(UNKNOWN_FRAME_TYPE, -5, AMQP_REPLY_FRAME_ERROR, "unknown frame type")      \
  X(BAD_HEARTBEAT, -6, AMQP_REPLY_UNEXPECTED_FRAME,                            \
    "heartbeat frame on a channel other than 0")                               \
  X(SHORT_PAYLOAD, -7, AMQP_REPLY_FRAME_ERROR,                                 \
    "frame payload shorter than its type needs")                               \
  X(TRUNCATED, -8, AMQP_REPLY_SYNTAX_ERROR,                                    \
    "field runs past the end of its frame")                                    \
  X(TRAILING_BYTES, -9, AMQP_REPLY_SYNTAX_ERROR,                               \
    "bytes left after the last field")                                         \
  X(UNKNOWN_METHOD, -10, AMQP_REPLY_COMMAND_INVALID,                           \
    "unknown class or method")                                                 \
  X(BAD_FIELD_TYPE, -11, AMQP_REPLY_SYNTAX_ERROR,                              \
    "unknown field-table value type")                                          \
  X(TOO_DEEP, -12, AMQP_REPLY_SYNTAX_ERROR, "field tables nested too deep")    \
  X(BAD_CONTENT_CLASS, -13, AMQP_REPLY_COMMAND_INVALID,                        \
    "content header for a class without content")                              \
  X(BAD_PROPERTY_FLAGS, -14, AMQP_REPLY_SYNTAX_ERROR,                          \
    "unknown content property flag")                                           \
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
