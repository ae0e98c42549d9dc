/* px_config.h - rebound's settings: one table of options, each with a
 * flag, an environment variable and a default. Precedence: flag > env >
 * default.
 */
#ifndef PX_CONFIG_H
#define PX_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "px_log.h"

#define PX_MAX_UPSTREAMS 8

typedef struct px_addr {
  char host[256]; /* IPv4, IPv6 (no brackets) or a name */
  uint16_t port;
} px_addr;

typedef struct px_config {
  px_addr listen;
  px_addr upstream[PX_MAX_UPSTREAMS];
  unsigned n_upstreams;
  px_log_level log_level;
  uint32_t drain_timeout_ms;
  uint32_t handshake_timeout_ms;
} px_config;

/* X(field, flag, env, type, default, help) */
#define PX_OPTIONS(X)                                                          \
  X(listen, "listen", "REBOUND_LISTEN", ADDR, "127.0.0.1:5673",                \
    "HOST:PORT to accept AMQP clients on ([::1]:5673 for IPv6)")               \
  X(upstream, "upstream", "REBOUND_UPSTREAM", ADDRS, "127.0.0.1:5672",         \
    "RabbitMQ HOST:PORT[,HOST:PORT...], tried in order")                       \
  X(log_level, "log-level", "REBOUND_LOG_LEVEL", LOG_LEVEL, "info",            \
    "debug, info, warn or error")                                              \
  X(drain_timeout_ms, "drain-timeout", "REBOUND_DRAIN_TIMEOUT", DURATION,      \
    "10s", "on SIGTERM/SIGINT, how long clients get to go")                    \
  X(handshake_timeout_ms, "handshake-timeout", "REBOUND_HANDSHAKE_TIMEOUT",    \
    DURATION, "10s", "a connection not open by then is closed")

typedef enum px_config_result {
  PX_CONFIG_OK,
  PX_CONFIG_HELP,    /* --help given: usage printed */
  PX_CONFIG_VERSION, /* --version given */
  PX_CONFIG_ERROR,   /* message in `err` */
} px_config_result;

/* Fill `cfg` from defaults, then `env` (a getenv-like function, may be
 * NULL), then argv. On PX_CONFIG_ERROR `err` holds a one-line reason. */
px_config_result px_config_load(px_config *cfg, int argc, char **argv,
                                const char *(*env)(const char *), char *err,
                                size_t errlen);

/* Parse "HOST:PORT" or "[V6]:PORT". Returns 0 or -1. */
int px_addr_parse(const char *s, px_addr *out);

/* "host:port" or "[v6]:port" into `out`; returns `out`. */
char *px_addr_format(const px_addr *a, char *out, size_t cap);

/* Write the usage text, generated from PX_OPTIONS. */
void px_config_usage(void *file);

#endif
