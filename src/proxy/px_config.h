/* px_config.h - rebound's settings: one table of options, each with a
 * flag, an environment variable, a config-file key and a default.
 * Precedence: flag > env > file > default.
 */
#ifndef PX_CONFIG_H
#define PX_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "px_log.h"
#include "retry_plan.h"

#define PX_MAX_UPSTREAMS 8
#define PX_MAX_RULES 16
#define PX_MAX_CONNECTIONS_LIMIT 10000000 /* highest --max-connections */
#define PX_MAX_WORKERS 64                 /* highest --workers */

typedef struct px_addr {
  char host[256]; /* IPv4, IPv6 (no brackets) or a name */
  uint16_t port;
  bool tls; /* an upstream written amqps:// */
} px_addr;

/* The TLS settings (PEM files; "" when not given). */
typedef struct px_tls_config {
  bool listen_on;           /* --tls-listen is not off */
  px_addr listen;           /* --tls-listen */
  char cert[1024];          /* --tls-cert */
  char key[1024];           /* --tls-key */
  char client_ca[1024];     /* --tls-client-ca: require client certs */
  char ciphers[512];        /* --tls-ciphers (TLS 1.2) */
  char ciphersuites[512];   /* --tls-ciphersuites (TLS 1.3) */
  char upstream_ca[1024];   /* --upstream-ca ("": the system store) */
  char upstream_cert[1024]; /* --upstream-cert */
  char upstream_key[1024];  /* --upstream-key */
  bool upstream_verify;     /* --upstream-verify on|off */
} px_tls_config;

/* Where an option's value came from. */
typedef enum px_origin {
  PX_FROM_DEFAULT,
  PX_FROM_FILE,
  PX_FROM_ENV,
  PX_FROM_FLAG,
} px_origin;

#define PX_CONFIG_MAX_OPTIONS 48 /* at least as many as PX_OPTIONS has */
#define PX_CONFIG_SHOWN 160      /* bytes of a value kept for px_config_print */

typedef struct px_config {
  bool listen_on; /* --listen is not off */
  px_addr listen;
  px_tls_config tls;
  px_addr upstream[PX_MAX_UPSTREAMS];
  unsigned n_upstreams;
  px_log_level log_level;
  px_log_format log_format;
  uint32_t drain_timeout_ms;
  uint32_t drain_client_wait_ms; /* 0: clients are told at once */
  uint32_t handshake_timeout_ms;
  uint32_t connect_timeout_ms;
  uint32_t retry_finish_timeout_ms;
  uint32_t retry_confirm_timeout_ms;
  uint32_t policy_check_after_ms;
  uint32_t stuck_after_ms;
  uint32_t tier_watch_ms;      /* between two looks at the tiers (0: off) */
  uint32_t tier_grace_ms;      /* a copy older than its delay + this: overdue */
  uint32_t tier_heal_after_ms; /* ... + this (at least its delay): moved back
                                  to its source (0: never) */
  uint32_t max_connections;    /* 0: auto, what the fd limit allows */
  uint32_t workers;            /* processes on the listeners (px_workers.h) */
  /* which of them this process is: 0 the first (admin endpoint, probe,
   * the others' parent), 1.. the ones it started (REBOUND_WORKER) */
  uint32_t worker;
  uint64_t cache_per_connection;
  uint64_t cache_total;
  char config_path[1024]; /* the file read ("" for none) */
  char log_file[1024];    /* --log-file ("": standard error) */
  /* each option's value as last given, and where it came from ("" and
   * PX_FROM_DEFAULT for an option without a default nobody set) */
  char shown[PX_CONFIG_MAX_OPTIONS][PX_CONFIG_SHOWN];
  uint8_t origin[PX_CONFIG_MAX_OPTIONS];
  bool admin_on;
  px_addr admin;
  bool retry_shared;         /* copies on the client's upstream connection */
  bool ready_needs_upstream; /* /readyz fails while no upstream answers */

  /* the retry policy: header prefix and rules, first match wins */
  retry_policy retry;
  retry_rule rules[PX_MAX_RULES];
  /* retry settings given by flag or env replace the file's rules with one
   * rule: the file's first (or the default) with these fields changed */
  struct {
    bool tiers, queues, max_attempts, queue_type, backoff, processing_timeout;
    retry_rule rule;
    unsigned replaced; /* the file's rules they replaced (logged over 1) */
  } override;
} px_config;

/* X(field, flag, env, file key, type, default, help). The file key of the
 * retry settings is under "retry:" (see px_config_file.c). */
#define PX_OPTIONS(X)                                                          \
  X(config_path, "config", "REBOUND_CONFIG", NULL, PATH, "",                   \
    "YAML config file (flags and env override it)")                            \
  X(admin, "admin", "REBOUND_ADMIN", "admin", ADMIN, "127.0.0.1:9900",         \
    "HOST:PORT of the admin HTTP endpoint, or off")                            \
  X(listen, "listen", "REBOUND_LISTEN", "listen", LISTEN, "127.0.0.1:5673",    \
    "HOST:PORT to accept AMQP clients on ([::1]:5673 for IPv6), or off")       \
  X(tls.listen, "tls-listen", "REBOUND_TLS_LISTEN", "tls_listen", TLS_LISTEN,  \
    "off",                                                                     \
    "HOST:PORT to accept AMQP clients over TLS on (amqps: 5671), or off")      \
  X(tls.cert, "tls-cert", "REBOUND_TLS_CERT", "tls_cert", PATH, "",            \
    "the TLS listener's certificate chain (PEM)")                              \
  X(tls.key, "tls-key", "REBOUND_TLS_KEY", "tls_key", PATH, "",                \
    "the TLS listener's private key (PEM)")                                    \
  X(tls.client_ca, "tls-client-ca", "REBOUND_TLS_CLIENT_CA", "tls_client_ca",  \
    PATH, "", "require client certificates signed by these CAs (PEM)")         \
  X(tls.ciphers, "tls-ciphers", "REBOUND_TLS_CIPHERS", "tls_ciphers", CIPHERS, \
    "", "TLS 1.2 cipher list, both sides (default: OpenSSL's)")                \
  X(tls.ciphersuites, "tls-ciphersuites", "REBOUND_TLS_CIPHERSUITES",          \
    "tls_ciphersuites", CIPHERS, "",                                           \
    "TLS 1.3 cipher suites, both sides (default: OpenSSL's)")                  \
  X(upstream, "upstream", "REBOUND_UPSTREAM", "upstreams", ADDRS,              \
    "127.0.0.1:5672",                                                          \
    "RabbitMQ HOST:PORT, amqp://HOST[:PORT] or amqps://HOST[:PORT], "          \
    "comma-separated, tried in order")                                         \
  X(tls.upstream_ca, "upstream-ca", "REBOUND_UPSTREAM_CA", "upstream_ca",      \
    PATH, "",                                                                  \
    "CAs that sign amqps upstreams' certificates (default: the "               \
    "system store)")                                                           \
  X(tls.upstream_cert, "upstream-cert", "REBOUND_UPSTREAM_CERT",               \
    "upstream_cert", PATH, "",                                                 \
    "client certificate rebound presents to amqps upstreams (PEM)")            \
  X(tls.upstream_key, "upstream-key", "REBOUND_UPSTREAM_KEY", "upstream_key",  \
    PATH, "", "its private key (PEM)")                                         \
  X(tls.upstream_verify, "upstream-verify", "REBOUND_UPSTREAM_VERIFY",         \
    "upstream_verify", ONOFF, "on",                                            \
    "verify amqps upstreams' certificates and host names (off: warned at "     \
    "start)")                                                                  \
  X(log_format, "log-format", "REBOUND_LOG_FORMAT", "log_format", LOG_FORMAT,  \
    "text", "text (logfmt) or json")                                           \
  X(log_level, "log-level", "REBOUND_LOG_LEVEL", "log_level", LOG_LEVEL,       \
    "info", "debug, info, warn or error")                                      \
  X(log_file, "log-file", "REBOUND_LOG_FILE", "log_file", PATH, "",            \
    "append the log to this file instead of standard error; SIGUSR1 "          \
    "reopens it (after a rotation moved it)")                                  \
  X(drain_timeout_ms, "drain-timeout", "REBOUND_DRAIN_TIMEOUT",                \
    "drain_timeout", DURATION0, "10s",                                         \
    "on SIGTERM/SIGINT, how long clients get to go")                           \
  X(drain_client_wait_ms, "drain-client-wait", "REBOUND_DRAIN_CLIENT_WAIT",    \
    "drain_client_wait", DURATION0, "0",                                       \
    "on SIGTERM/SIGINT, first wait this long for clients to close their "      \
    "connections themselves (listeners closed, /readyz 503), then tell the "   \
    "rest to go; the drain timeout starts after it")                           \
  X(handshake_timeout_ms, "handshake-timeout", "REBOUND_HANDSHAKE_TIMEOUT",    \
    "handshake_timeout", DURATION, "10s",                                      \
    "a connection not open by then is closed")                                 \
  X(connect_timeout_ms, "connect-timeout", "REBOUND_CONNECT_TIMEOUT",          \
    "connect_timeout", DURATION, "2s",                                         \
    "each upstream address gets this long for the TCP connect, the TLS "       \
    "handshake and the broker's connection.start, then the next is tried")     \
  X(ready_needs_upstream, "ready-needs-upstream",                              \
    "REBOUND_READY_NEEDS_UPSTREAM", "ready_needs_upstream", ONOFF, "on",       \
    "on: /readyz fails while no upstream answers (a drop-in in front of "      \
    "RabbitMQ); off: ready anyway, the reason shown (a sidecar that should "   \
    "stay in service during a broker outage)")                                 \
  X(max_connections, "max-connections", "REBOUND_MAX_CONNECTIONS",             \
    "max_connections", LIMIT, "auto",                                          \
    "client connections at once, more are closed on accept (auto: what "       \
    "the file descriptor limit allows)")                                       \
  X(workers, "workers", "REBOUND_WORKERS", "workers", WORKERS, "1",            \
    "processes serving the listeners (one event loop each, one port through "  \
    "SO_REUSEPORT, one admin endpoint for all; auto: one per CPU); "           \
    "--max-connections and --cache-total are shared out among them")           \
  X(retry_finish_timeout_ms, "retry-finish-timeout",                           \
    "REBOUND_RETRY_FINISH_TIMEOUT", "retry_finish_timeout", DURATION0, "10s",  \
    "a client gone with retries pending: how long to finish them")             \
  X(retry_confirm_timeout_ms, "retry-confirm-timeout",                         \
    "REBOUND_RETRY_CONFIRM_TIMEOUT", "retry_confirm_timeout", DURATION, "30s", \
    "a copy the broker has not confirmed by then falls back (the original "    \
    "is requeued) and frames held behind it go on")                            \
  X(policy_check_after_ms, "policy-check-after", "REBOUND_POLICY_CHECK_AFTER", \
    "policy_check_after", DURATION, "5m",                                      \
    "after start (or a reload), log once each policy that matched no queue "   \
    "and each queue whose policy cannot act (no-ack, every requeue fell "      \
    "back)")                                                                   \
  X(stuck_after_ms, "stuck-after", "REBOUND_STUCK_AFTER", "stuck_after",       \
    DURATION, "5m",                                                            \
    "a delivery unsettled for longer counts as stuck (metrics, /v1/queues)")   \
  X(tier_watch_ms, "tier-watch", "REBOUND_TIER_WATCH", "tier_watch",           \
    DURATION_OFF, "10s",                                                       \
    "how often to look at the tiers and dead-letter queues in use (depth, "    \
    "the oldest copy's age, the source queue), or off")                        \
  X(tier_grace_ms, "tier-grace", "REBOUND_TIER_GRACE", "tier_grace", DURATION, \
    "15s",                                                                     \
    "a tier's oldest copy older than the tier's delay plus this is overdue")   \
  X(tier_heal_after_ms, "tier-heal-after", "REBOUND_TIER_HEAL_AFTER",          \
    "tier_heal_after", DURATION_OFF, "1m",                                     \
    "copies overdue by this much (and at least their delay) are moved back "   \
    "to their source queue by rebound, or off")                                \
  X(cache_per_connection, "cache-per-connection",                              \
    "REBOUND_CACHE_PER_CONNECTION", "cache_per_connection", SIZE, "8MiB",      \
    "deliveries kept for retry, per connection (over it: pass-through)")       \
  X(cache_total, "cache-total", "REBOUND_CACHE_TOTAL", "cache_total", SIZE,    \
    "256MiB", "deliveries kept for retry, whole process")                      \
  X(header_prefix, "header-prefix", "REBOUND_HEADER_PREFIX", "header_prefix",  \
    PREFIX, "rebound-", "prefix of rebound's message headers")                 \
  X(retry_queues, "retry-queues", "REBOUND_RETRY_QUEUES", NULL, GLOBS, NULL,   \
    "queues to intercept: 'glob,glob' (default: all)")                         \
  X(retry_tiers, "retry-tiers", "REBOUND_RETRY_TIERS", NULL, TIERS, NULL,      \
    "delays before attempts 2, 3, ...: '1s,2s,4s'")                            \
  X(retry_backoff, "retry-backoff", "REBOUND_RETRY_BACKOFF", NULL, BACKOFF,    \
    NULL,                                                                      \
    "exponential backoff with jitter instead of a tier list: "                 \
    "'initial=1s,multiplier=2,max=10m,jitter=0.2,buckets=4' or off")           \
  X(processing_timeout, "processing-timeout", "REBOUND_PROCESSING_TIMEOUT",    \
    NULL, TIMEOUT_OFF, NULL,                                                   \
    "every policy: a delivery unsettled this long is a failed attempt (its "   \
    "copy goes to the tier, the client's late ack or nack is swallowed); "     \
    "off by default")                                                          \
  X(max_attempts, "max-attempts", "REBOUND_MAX_ATTEMPTS", NULL, ATTEMPTS,      \
    NULL, "deliveries before dead-lettering (default 4)")                      \
  X(retry_queue_type, "retry-queue-type", "REBOUND_RETRY_QUEUE_TYPE", NULL,    \
    QUEUE_TYPE, NULL,                                                          \
    "type of tier and dead-letter queues: auto (quorum where the broker "      \
    "dead-letters them at-least-once), quorum or classic")                     \
  X(retry_shared, "retry-connection", "REBOUND_RETRY_CONNECTION",              \
    "retry_connection", CONN_MODE, "separate",                                 \
    "separate: copies go on a second upstream connection per client, logged "  \
    "in as the client, so a broker that blocks publishing (resource alarm) "   \
    "never stops the client's acks; shared: on the client's own")

typedef enum px_config_result {
  PX_CONFIG_OK,
  PX_CONFIG_HELP,    /* --help given: usage printed */
  PX_CONFIG_VERSION, /* --version given */
  PX_CONFIG_ERROR,   /* message in `err` */
} px_config_result;

/* Fill `cfg` from defaults, then the config file (--config or
 * REBOUND_CONFIG), then `env` (a getenv-like function, may be NULL), then
 * argv. On PX_CONFIG_ERROR `err` holds a one-line reason (for the file:
 * "FILE:LINE: reason"; for settings that only make sense together, from
 * whichever layer: the flags named, "--tls-listen needs ..."). */
px_config_result px_config_load(px_config *cfg, int argc, char **argv,
                                const char *(*env)(const char *), char *err,
                                size_t errlen);

/* Parse "HOST:PORT" or "[V6]:PORT". Returns 0 or -1. */
int px_addr_parse(const char *s, px_addr *out);
/* An upstream: "HOST:PORT", amqp://HOST[:PORT] (port 5672) or
 * amqps://HOST[:PORT] (5671, TLS). Returns 0 or -1. */
int px_upstream_parse(const char *s, px_addr *out);

/* "host:port" or "[v6]:port" into `out`; returns `out`. */
char *px_addr_format(const px_addr *a, char *out, size_t cap);

/* Write the usage text, generated from PX_OPTIONS. */
void px_config_usage(void *file);

/* Write every option as "flag  value  # origin", one a line (a FILE *):
 * the effective settings, as given. */
void px_config_print(const px_config *cfg, void *file);

/* Set one option from text, by its flag name ("listen", "retry-tiers").
 * Returns 0, -1 (bad value) or -2 (no such option). Used by the file
 * loader too. */
int px_config_set(px_config *cfg, const char *flag, const char *value);

/* How the file reader reaches the options (px_config.c gives it): set
 * one (as px_config_set()), parse a rule's tiers and globs, the flag of the
 * option whose file key is `key` (NULL: none), and what a value of the option
 * with `flag` looks like, for error messages ("a duration like 500ms, 10s, 2m,
 * 1h"). */
typedef struct px_config_keys {
  int (*set)(px_config *cfg, const char *flag, const char *value);
  const char *(*flag_for_key)(const char *key);
  const char *(*expected)(const char *flag);
  int (*parse_tiers)(const char *v, retry_rule *r); /* px_parse_tiers() */
  int (*parse_globs)(const char *v, retry_rule *r); /* px_parse_globs() */
} px_config_keys;

/* Read a YAML config file into `cfg` (over what it holds). Returns 0, or -1
 * with "FILE:LINE: reason" in `err`. (px_config_file.c) */
int px_config_read_file(px_config *cfg, const px_config_keys *keys,
                        const char *path, char *err, size_t errlen);

/* Parse "1s,2s,4s" / "a*,b" into a rule's tiers / globs. 0 or -1. */
int px_parse_tiers(const char *v, retry_rule *r);
int px_parse_globs(const char *v, retry_rule *r);
/* "initial=1s,multiplier=2,max=10m,jitter=0.2,buckets=4" (keys left out
 * keep the defaults) or "off" into `b`. 0 or -1; ranges are checked by
 * retry_rule_compile(). */
int px_parse_backoff(const char *v, retry_backoff *b);
/* "8MiB", "512KiB", "1GiB", "1048576" into bytes. 0 or -1. */
int px_parse_size(const char *v, uint64_t *out);

#endif
