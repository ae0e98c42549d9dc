#include <stddef.h>

#include "amqp_status.h"

const char *amqp_status_str(int status) {
  switch (status) {
#define AMQP__STATUS_STR(name, value, reply, text)                             \
  case AMQP_##name:                                                            \
    return text;
    AMQP_STATUS_MAP(AMQP__STATUS_STR)
#undef AMQP__STATUS_STR
  }
  return "unknown status";
}

int amqp_status_reply_code(int status) {
  switch (status) {
#define AMQP__STATUS_REPLY(name, value, reply, text)                           \
  case AMQP_##name:                                                            \
    return reply;
    AMQP_STATUS_MAP(AMQP__STATUS_REPLY)
#undef AMQP__STATUS_REPLY
  }
  return 0;
}

const char *amqp_reply_name(int code) {
  switch (code) {
#define AMQP__REPLY_NAME(id, value, name)                                      \
  case AMQP_REPLY_##id:                                                        \
    return name;
    AMQP_REPLY_CODES(AMQP__REPLY_NAME)
#undef AMQP__REPLY_NAME
  }
  return NULL;
}
