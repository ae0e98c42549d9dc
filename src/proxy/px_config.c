#include "px_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "retry_policy.h"

int px_addr_parse(const char *s, px_addr *out) {
  const char *colon, *host = s;
  size_t hlen;
  char *end;

  if (*s == '[') {
    const char *close = strchr(s, ']');
    if (!close || close[1] != ':')
      return -1;
    host = s + 1;
    hlen = (size_t)(close - host);
    colon = close + 1;
  } else {
    colon = strrchr(s, ':');
    if (!colon || memchr(s, ':', (size_t)(colon - s)))
      return -1; /* bare IPv6 needs brackets */
    hlen = (size_t)(colon - s);
  }
  if (hlen == 0 || hlen >= sizeof out->host)
    return -1;
  long port = strtol(colon + 1, &end, 10);
  if (colon[1] == '\0' || *end != '\0' || port <= 0 || port > 65535)
    return -1;
  memcpy(out->host, host, hlen);
  out->host[hlen] = '\0';
  out->port = (uint16_t)port;
  return 0;
}

char *px_addr_format(const px_addr *a, char *out, size_t cap) {
  snprintf(out, cap, strchr(a->host, ':') ? "[%s]:%u" : "%s:%u", a->host,
           (unsigned)a->port);
  return out;
}

/* Each option type's parser: 0 or -1. */
static int parse_ADDR(px_config *c, const char *v) {
  return px_addr_parse(v, &c->listen);
}

static int parse_ADDRS(px_config *c, const char *v) {
  char buf[2048];
  unsigned n = 0;
  if (strlen(v) >= sizeof buf)
    return -1;
  strcpy(buf, v);
  for (char *save, *tok = strtok_r(buf, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    if (n == PX_MAX_UPSTREAMS || px_addr_parse(tok, &c->upstream[n]) != 0)
      return -1;
    n++;
  }
  if (n == 0)
    return -1;
  c->n_upstreams = n;
  return 0;
}

static int parse_LOG_LEVEL(px_config *c, const char *v) {
  return px_log_level_parse(v, &c->log_level);
}

static int parse_DURATION(uint32_t *field, const char *v) {
  return retry_delay_parse(v, strlen(v), field);
}

/* Dispatch by option: ADDR/ADDRS/LOG_LEVEL write their own field,
 * DURATION writes the field named in the table. */
#define PARSE_ADDR(c, field, v) parse_ADDR(c, v)
#define PARSE_ADDRS(c, field, v) parse_ADDRS(c, v)
#define PARSE_LOG_LEVEL(c, field, v) parse_LOG_LEVEL(c, v)
#define PARSE_DURATION(c, field, v) parse_DURATION(&(c)->field, v)

static const struct option_desc {
  const char *flag, *env, *def, *help, *type;
} options[] = {
#define DESC(field, flag, env, type, def, help) {flag, env, def, help, #type},
    PX_OPTIONS(DESC)
#undef DESC
};
enum { N_OPTIONS = sizeof options / sizeof options[0] };

static int set_option(px_config *c, int i, const char *v) {
  int k = 0;
#define SET(field, flag, env, type, def, help)                                 \
  if (k++ == i)                                                                \
    return PARSE_##type(c, field, v);
  PX_OPTIONS(SET)
#undef SET
  return -1;
}

static int find_flag(const char *name, size_t len) {
  for (int i = 0; i < N_OPTIONS; i++)
    if (strlen(options[i].flag) == len &&
        memcmp(options[i].flag, name, len) == 0)
      return i;
  return -1;
}

px_config_result px_config_load(px_config *cfg, int argc, char **argv,
                                const char *(*env)(const char *), char *err,
                                size_t errlen) {
  memset(cfg, 0, sizeof *cfg);
  for (int i = 0; i < N_OPTIONS; i++)
    if (set_option(cfg, i, options[i].def) != 0)
      abort(); /* a default that does not parse is a bug */
  for (int i = 0; env && i < N_OPTIONS; i++) {
    const char *v = env(options[i].env);
    if (v && *v && set_option(cfg, i, v) != 0) {
      snprintf(err, errlen, "%s=%s: not a valid %s", options[i].env, v,
               options[i].flag);
      return PX_CONFIG_ERROR;
    }
  }
  for (int a = 1; a < argc; a++) {
    const char *arg = argv[a];
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0)
      return PX_CONFIG_HELP;
    if (strcmp(arg, "-V") == 0 || strcmp(arg, "--version") == 0)
      return PX_CONFIG_VERSION;
    const char *eq = strchr(arg, '=');
    int i =
        strncmp(arg, "--", 2) == 0
            ? find_flag(arg + 2, eq ? (size_t)(eq - arg - 2) : strlen(arg + 2))
            : -1;
    if (i < 0) {
      snprintf(err, errlen, "unknown option '%s' (see --help)", arg);
      return PX_CONFIG_ERROR;
    }
    const char *v = eq ? eq + 1 : (a + 1 < argc ? argv[++a] : NULL);
    if (!v || set_option(cfg, i, v) != 0) {
      snprintf(err, errlen, "--%s: %s '%s'", options[i].flag,
               v ? "invalid value" : "missing value", v ? v : "");
      return PX_CONFIG_ERROR;
    }
  }
  return PX_CONFIG_OK;
}

void px_config_usage(void *file) {
  FILE *f = file;
  fputs("Usage: rebound [OPTIONS]\n"
        "\n"
        "A transparent AMQP 0-9-1 proxy in front of RabbitMQ that turns\n"
        "basic.nack/basic.reject with requeue=true into a delayed, counted\n"
        "retry, and dead-letters a message after max_attempts.\n"
        "\n"
        "Options (flag > environment > default):\n",
        f);
  for (int i = 0; i < N_OPTIONS; i++)
    fprintf(f, "  --%-20s %s\n  %-22s env %s, default %s\n", options[i].flag,
            options[i].help, "", options[i].env, options[i].def);
  fputs("  -h, --help               show this help and exit\n"
        "  -V, --version            show the version and the libraries in "
        "use\n",
        f);
}
