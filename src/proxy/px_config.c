#include "px_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <uv.h>

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

/* Call fn on each comma-separated, non-empty item of v (at most 4 KiB). */
static int each_item(const char *v, int (*fn)(const char *item, void *arg),
                     void *arg) {
  char buf[4096];
  int n = 0;
  if (strlen(v) >= sizeof buf)
    return -1;
  strcpy(buf, v);
  for (char *save, *tok = strtok_r(buf, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ')
      tok++;
    if (!*tok || fn(tok, arg) != 0)
      return -1;
    n++;
  }
  return n > 0 ? 0 : -1;
}

static int add_tier(const char *item, void *arg) {
  retry_rule *r = arg;
  if (r->ntiers == RETRY_MAX_TIERS)
    return -1;
  return retry_delay_parse(item, strlen(item), &r->tiers_ms[r->ntiers++]);
}

static int add_glob(const char *item, void *arg) {
  retry_rule *r = arg;
  if (r->nglobs == RETRY_MAX_GLOBS || strlen(item) > RETRY_NAME_MAX)
    return -1;
  strcpy(r->globs[r->nglobs++], item);
  return 0;
}

int px_parse_tiers(const char *v, retry_rule *r) {
  r->ntiers = 0;
  return each_item(v, add_tier, r);
}

/* One "key=value" of --retry-backoff; ranges are checked when the rule
 * is compiled. */
static int backoff_item(const char *item, void *arg) {
  retry_backoff *b = arg;
  const char *eq = strchr(item, '=');
  char *end = NULL;
  if (!eq || !eq[1])
    return -1;
  size_t klen = (size_t)(eq - item);
  const char *v = eq + 1;
  if (klen == 7 && strncmp(item, "initial", 7) == 0)
    return retry_delay_parse(v, strlen(v), &b->initial_ms);
  if (klen == 3 && strncmp(item, "max", 3) == 0)
    return retry_delay_parse(v, strlen(v), &b->max_ms);
  if (klen == 10 && strncmp(item, "multiplier", 10) == 0)
    b->multiplier = strtod(v, &end);
  else if (klen == 6 && strncmp(item, "jitter", 6) == 0)
    b->jitter = strtod(v, &end);
  else if (klen == 7 && strncmp(item, "buckets", 7) == 0)
    b->buckets = (unsigned)strtoul(v, &end, 10);
  return end && end != v && !*end ? 0 : -1;
}

int px_parse_backoff(const char *v, retry_backoff *b) {
  if (strcmp(v, "off") == 0) {
    memset(b, 0, sizeof *b);
    return 0;
  }
  retry_backoff_default(b);
  return each_item(v, backoff_item, b);
}

int px_parse_globs(const char *v, retry_rule *r) {
  r->nglobs = 0;
  return each_item(v, add_glob, r);
}

/* A number of bytes with a unit, any case: none or B; K, KiB; M, MiB; G,
 * GiB; T, TiB (1024-based); KB, MB, GB, TB (1000-based). */
int px_parse_size(const char *v, uint64_t *out) {
  static const struct {
    const char *unit;
    uint64_t mult;
  } units[] = {{"", 1},
               {"B", 1},
               {"K", 1ull << 10},
               {"KiB", 1ull << 10},
               {"M", 1ull << 20},
               {"MiB", 1ull << 20},
               {"G", 1ull << 30},
               {"GiB", 1ull << 30},
               {"T", 1ull << 40},
               {"TiB", 1ull << 40},
               {"KB", 1000},
               {"MB", 1000000},
               {"GB", 1000000000},
               {"TB", 1000000000000ull}};
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (end == v || errno || *v == '-')
    return -1;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (strcasecmp(end, units[i].unit) == 0) {
      if (n > UINT64_MAX / units[i].mult)
        return -1;
      *out = n * units[i].mult;
      return 0;
    }
  return -1;
}

/* "HOST:PORT", or a URL: amqp://HOST[:PORT] (5672), amqps://HOST[:PORT]
 * (5671, TLS); a trailing "/" is allowed, a vhost or credentials not
 * (the client chooses those). */
int px_upstream_parse(const char *s, px_addr *out) {
  bool tls = strncmp(s, "amqps://", 8) == 0;
  if (!tls && strncmp(s, "amqp://", 7) != 0) {
    out->tls = false;
    return px_addr_parse(s, out);
  }
  char buf[300];
  const char *h = s + (tls ? 8 : 7);
  size_t n = strlen(h);
  if (n && h[n - 1] == '/')
    n--;
  if (n == 0 || n >= sizeof buf - 8 || memchr(h, '@', n) || memchr(h, '/', n))
    return -1;
  memcpy(buf, h, n);
  buf[n] = '\0';
  const char *close = buf[0] == '[' ? strchr(buf, ']') : NULL;
  const char *colon = strrchr(close ? close : buf, ':');
  if (!colon || (!close && memchr(buf, ':', (size_t)(colon - buf))))
    snprintf(buf + n, sizeof buf - n, ":%u", tls ? 5671u : 5672u);
  out->tls = tls;
  return px_addr_parse(buf, out);
}

static int add_upstream(const char *item, void *arg) {
  px_config *c = arg;
  if (c->n_upstreams == PX_MAX_UPSTREAMS)
    return -1;
  return px_upstream_parse(item, &c->upstream[c->n_upstreams++]);
}

/* Each option type's parser: 0 or -1. */
static int parse_PATH(px_config *c, char *field, size_t cap, const char *v) {
  (void)c;
  if (strlen(v) >= cap)
    return -1;
  strcpy(field, v);
  return 0;
}

static int parse_log_format(const char *v, px_log_format *out) {
  if (strcmp(v, "text") == 0 || strcmp(v, "json") == 0) {
    *out = v[0] == 'j' ? PX_LOG_JSON : PX_LOG_TEXT;
    return 0;
  }
  return -1;
}

/* An address to listen on: HOST:PORT, [IPv6]:PORT, or :PORT for every
 * IPv4 interface. */
static int parse_bind_addr(const char *v, px_addr *out) {
  char any[16];
  if (v[0] == ':' && strlen(v) < sizeof any - 7) {
    snprintf(any, sizeof any, "0.0.0.0%s", v);
    v = any;
  }
  return px_addr_parse(v, out);
}

static int parse_LISTEN(px_config *c, const char *v) {
  c->listen_on = strcmp(v, "off") != 0;
  return c->listen_on ? parse_bind_addr(v, &c->listen) : 0;
}

static int parse_TLS_LISTEN(px_config *c, const char *v) {
  c->tls.listen_on = strcmp(v, "off") != 0;
  return c->tls.listen_on ? parse_bind_addr(v, &c->tls.listen) : 0;
}

static int parse_ONOFF(bool *field, const char *v) {
  if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0)
    return -1;
  *field = v[1] == 'n';
  return 0;
}

static int parse_ADMIN(px_config *c, const char *v) {
  c->admin_on = strcmp(v, "off") != 0;
  return c->admin_on ? parse_bind_addr(v, &c->admin) : 0;
}

static int parse_ADDRS(px_config *c, const char *v) {
  c->n_upstreams = 0;
  return each_item(v, add_upstream, c);
}

static int parse_DURATION(uint32_t *field, const char *v) {
  return retry_delay_parse(v, strlen(v), field);
}

/* A duration that may be 0 (no wait at all). */
static int parse_DURATION0(uint32_t *field, const char *v) {
  return retry_duration_parse(v, strlen(v), field);
}

/* A duration, or off (0). */
static int parse_DURATION_OFF(uint32_t *field, const char *v) {
  if (strcmp(v, "off") == 0) {
    *field = 0;
    return 0;
  }
  return retry_delay_parse(v, strlen(v), field);
}

static int parse_PREFIX(px_config *c, const char *v) {
  if (strlen(v) >= sizeof c->retry.header_prefix)
    return -1;
  strcpy(c->retry.header_prefix, v);
  return 0;
}

static int parse_TIMEOUT_OFF(px_config *c, const char *v) {
  c->override.processing_timeout = true;
  c->override.rule.processing_timeout_ms = 0;
  if (strcmp(v, "off") == 0)
    return 0;
  return retry_delay_parse(v, strlen(v),
                           &c->override.rule.processing_timeout_ms);
}

static int parse_ATTEMPTS(px_config *c, const char *v) {
  char *end;
  long n = strtol(v, &end, 10);
  if (end == v || *end || n < 1 || n > 1000000)
    return -1;
  c->override.rule.max_attempts = (uint32_t)n;
  c->override.max_attempts = true;
  return 0;
}

static int parse_QUEUE_TYPE(px_config *c, const char *v) {
  c->override.queue_type = true;
  return retry_queue_type_parse(v, strlen(v), &c->override.rule.queue_type);
}

static int parse_CONN_MODE(bool *shared, const char *v) {
  if (strcmp(v, "separate") != 0 && strcmp(v, "shared") != 0)
    return -1;
  *shared = v[1] == 'h';
  return 0;
}

/* A whole number from 1 to `max`, or "auto" (then `auto_value`). */
static int parse_count(uint32_t *field, const char *v, long max,
                       uint32_t auto_value) {
  char *end;
  if (strcmp(v, "auto") == 0) {
    *field = auto_value;
    return 0;
  }
  errno = 0;
  long n = strtol(v, &end, 10);
  if (end == v || *end || errno || n < 1 || n > max)
    return -1;
  *field = (uint32_t)n;
  return 0;
}

/* "auto" (0: px_server sizes it from the file descriptor limit) or a
 * count. */
static int parse_LIMIT(uint32_t *field, const char *v) {
  return parse_count(field, v, PX_MAX_CONNECTIONS_LIMIT, 0);
}

/* "auto" (one per CPU libuv sees, at most PX_MAX_WORKERS) or a count. */
static int parse_WORKERS(uint32_t *field, const char *v) {
  unsigned cpus = uv_available_parallelism();
  return parse_count(field, v, PX_MAX_WORKERS,
                     cpus < 1                ? 1
                     : cpus > PX_MAX_WORKERS ? PX_MAX_WORKERS
                                             : cpus);
}

#define PARSE_PATH(c, field, v) parse_PATH(c, (c)->field, sizeof(c)->field, v)
#define PARSE_ADDR(c, field, v) parse_ADDR(c, &(c)->field, v)
#define PARSE_ADDRS(c, field, v) parse_ADDRS(c, v)
#define PARSE_ADMIN(c, field, v) parse_ADMIN(c, v)
#define PARSE_LISTEN(c, field, v) parse_LISTEN(c, v)
#define PARSE_TLS_LISTEN(c, field, v) parse_TLS_LISTEN(c, v)
#define PARSE_ONOFF(c, field, v) parse_ONOFF(&(c)->field, v)
#define PARSE_CIPHERS(c, field, v) PARSE_PATH(c, field, v)
#define PARSE_LOG_LEVEL(c, field, v) px_log_level_parse(v, &(c)->field)
#define PARSE_LOG_FORMAT(c, field, v) parse_log_format(v, &(c)->field)
#define PARSE_DURATION(c, field, v) parse_DURATION(&(c)->field, v)
#define PARSE_DURATION0(c, field, v) parse_DURATION0(&(c)->field, v)
#define PARSE_DURATION_OFF(c, field, v) parse_DURATION_OFF(&(c)->field, v)
#define PARSE_SIZE(c, field, v) px_parse_size(v, &(c)->field)
#define PARSE_PREFIX(c, field, v) parse_PREFIX(c, v)
#define PARSE_GLOBS(c, field, v)                                               \
  ((c)->override.queues = true, px_parse_globs(v, &(c)->override.rule))
#define PARSE_TIERS(c, field, v)                                               \
  ((c)->override.tiers = true, px_parse_tiers(v, &(c)->override.rule))
#define PARSE_BACKOFF(c, field, v)                                             \
  ((c)->override.backoff = true,                                               \
   px_parse_backoff(v, &(c)->override.rule.backoff))
#define PARSE_ATTEMPTS(c, field, v) parse_ATTEMPTS(c, v)
#define PARSE_TIMEOUT_OFF(c, field, v) parse_TIMEOUT_OFF(c, v)
#define PARSE_LIMIT(c, field, v) parse_LIMIT(&(c)->field, v)
#define PARSE_WORKERS(c, field, v) parse_WORKERS(&(c)->field, v)
#define PARSE_QUEUE_TYPE(c, field, v) parse_QUEUE_TYPE(c, v)
#define PARSE_CONN_MODE(c, field, v) parse_CONN_MODE(&(c)->field, v)

/* What a valid value of each type looks like, for error messages. */
#define EXPECT_PATH "a file path"
#define EXPECT_ADMIN                                                           \
  "HOST:PORT, [IPv6]:PORT, :PORT (every IPv4 interface) or off"
#define EXPECT_LISTEN EXPECT_ADMIN
#define EXPECT_TLS_LISTEN EXPECT_ADMIN
#define EXPECT_ONOFF "on or off"
#define EXPECT_CIPHERS "an OpenSSL cipher list like 'ECDHE+AESGCM'"
#define EXPECT_ADDR "HOST:PORT or [IPv6]:PORT"
#define EXPECT_ADDRS                                                           \
  "HOST:PORT, amqp://HOST[:PORT] or amqps://HOST[:PORT], comma-separated, "    \
  "at most 8"
#define EXPECT_LOG_FORMAT "text or json"
#define EXPECT_LOG_LEVEL "debug, info, warn or error (any case)"
#define EXPECT_DURATION                                                        \
  "a duration like 500ms, 10s, 1.5s, 1m30s or seconds like 10 (more than 0, "  \
  "at most 24h)"
#define EXPECT_DURATION0                                                       \
  "a duration like 0, 500ms, 10s, 1.5s, 1m30s or seconds like 10 (at most "    \
  "24h)"
#define EXPECT_SIZE                                                            \
  "a size like 512K, 256M, 1G (also KiB, MiB, GiB; KB, MB, GB are "            \
  "1000-based) or a number of bytes"
#define EXPECT_PREFIX "a string of at most 63 bytes"
#define EXPECT_GLOBS "queue globs like 'orders.*,print'"
#define EXPECT_TIERS                                                           \
  "delays like '1s,2s,4s' or '500ms,1m30s' (each more than 0, at most 24h)"
#define EXPECT_BACKOFF                                                         \
  "off or 'initial=1s,multiplier=2,max=10m,jitter=0.2,buckets=4' (any of "     \
  "them)"
#define EXPECT_DURATION_OFF EXPECT_TIMEOUT_OFF
#define EXPECT_TIMEOUT_OFF                                                     \
  "off or a duration like 30s, 1m30s or seconds like 30 (more than 0, at "     \
  "most 24h)"
#define EXPECT_ATTEMPTS "a whole number from 1 to 1000000"
#define EXPECT_LIMIT "auto or a whole number from 1 to 10000000"
#define EXPECT_WORKERS "auto or a whole number from 1 to 64"
#define EXPECT_QUEUE_TYPE "auto, quorum or classic"
#define EXPECT_CONN_MODE "separate or shared"

static const struct option_desc {
  const char *flag, *env, *key, *def, *help, *expect;
} options[] = {
#define DESC(field, flag, env, key, type, def, help)                           \
  {flag, env, key, def, help, EXPECT_##type},
    PX_OPTIONS(DESC)
#undef DESC
};
enum { N_OPTIONS = sizeof options / sizeof options[0] };

_Static_assert(N_OPTIONS <= PX_CONFIG_MAX_OPTIONS, "px_config.shown");

static int parse_option(px_config *c, int i, const char *v) {
  int k = 0;
#define SET(field, flag, env, key, type, def, help)                            \
  if (k++ == i)                                                                \
    return PARSE_##type(c, field, v);
  PX_OPTIONS(SET)
#undef SET
  return -1;
}

/* Parse option i's value into `c`, keeping it as given and its origin. */
static int set_option(px_config *c, int i, const char *v, px_origin from) {
  if (parse_option(c, i, v) != 0)
    return -1;
  size_t n = strlen(v);
  if (n < PX_CONFIG_SHOWN)
    memcpy(c->shown[i], v, n + 1);
  else
    snprintf(c->shown[i], PX_CONFIG_SHOWN, "%.*s...", PX_CONFIG_SHOWN - 4, v);
  c->origin[i] = (uint8_t)from;
  return 0;
}

static int find_flag(const char *name, size_t len) {
  for (int i = 0; i < N_OPTIONS; i++)
    if (strlen(options[i].flag) == len &&
        memcmp(options[i].flag, name, len) == 0)
      return i;
  return -1;
}

int px_config_set(px_config *cfg, const char *flag, const char *value) {
  int i = find_flag(flag, strlen(flag));
  if (i < 0)
    return -2;
  return set_option(cfg, i, value, PX_FROM_FILE) == 0 ? 0 : -1;
}

static const char *flag_for_key(const char *key) {
  for (int i = 0; i < N_OPTIONS; i++)
    if (options[i].key && strcmp(options[i].key, key) == 0)
      return options[i].flag;
  return NULL;
}

static const char *expected(const char *flag) {
  int i = find_flag(flag, strlen(flag));
  return i < 0 ? "" : options[i].expect;
}

/* Retry settings from flags/env: a queue type applies to every rule; the
 * others replace the rules with one. */
static void apply_override(px_config *c) {
  for (unsigned i = 0; c->override.queue_type && i < c->retry.nrules; i++)
    c->rules[i].queue_type = c->override.rule.queue_type;
  for (unsigned i = 0; c->override.processing_timeout && i < c->retry.nrules;
       i++)
    c->rules[i].processing_timeout_ms = c->override.rule.processing_timeout_ms;
  if (!c->override.tiers && !c->override.queues && !c->override.max_attempts &&
      !c->override.backoff)
    return;
  retry_rule r = c->retry.nrules ? c->rules[0] : c->override.rule;
  if (!c->retry.nrules)
    retry_rule_default(&r);
  c->override.replaced = c->retry.nrules;
  if (c->override.tiers) { /* a fixed list replaces a backoff */
    memcpy(r.tiers_ms, c->override.rule.tiers_ms, sizeof r.tiers_ms);
    r.ntiers = c->override.rule.ntiers;
    r.nbuckets = 0;
    r.backoff.initial_ms = 0;
  }
  if (c->override.backoff) {
    r.backoff = c->override.rule.backoff;
    if (!r.backoff.initial_ms && r.nbuckets > 1) { /* off: the default list */
      retry_rule d;
      retry_rule_default(&d);
      memcpy(r.tiers_ms, d.tiers_ms, sizeof r.tiers_ms);
      r.ntiers = d.ntiers;
      r.nbuckets = 0;
    }
  }
  if (c->override.queues) {
    memcpy(r.globs, c->override.rule.globs, sizeof r.globs);
    r.nglobs = c->override.rule.nglobs;
  }
  if (c->override.max_attempts)
    r.max_attempts = c->override.rule.max_attempts;
  if (c->override.queue_type)
    r.queue_type = c->override.rule.queue_type;
  if (c->override.processing_timeout)
    r.processing_timeout_ms = c->override.rule.processing_timeout_ms;
  c->rules[0] = r;
  c->retry.nrules = 1;
}

/* Short options, as getopt_long spells them: "-c FILE" or "-cFILE". */
static const struct {
  char letter;
  const char *flag;
} shorts[] = {
    {'c', "config"}, {'l', "listen"}, {'u', "upstream"}, {'a', "admin"}};

/* The option argv[*a] names ("--flag", "--flag=V", "-x", "-xV"), its
 * value in `*v` (the next argument when not inside this one, *a moved on
 * to it; NULL when there is none). -1 for no option. */
static int arg_option(int argc, char **argv, int *a, const char **v) {
  const char *arg = argv[*a], *eq = strchr(arg, '=');
  int i = -1;
  *v = NULL;
  if (strncmp(arg, "--", 2) == 0) {
    i = find_flag(arg + 2, eq ? (size_t)(eq - arg - 2) : strlen(arg + 2));
    *v = eq ? eq + 1 : NULL;
  } else if (arg[0] == '-' && arg[1]) {
    for (size_t k = 0; k < sizeof shorts / sizeof *shorts; k++)
      if (shorts[k].letter == arg[1])
        i = find_flag(shorts[k].flag, strlen(shorts[k].flag));
    *v = i >= 0 && arg[2] ? arg + 2 : NULL;
  }
  if (i >= 0 && !*v && *a + 1 < argc)
    *v = argv[++*a];
  return i;
}

/* --help or --version anywhere wins over everything else, errors too. */
static px_config_result help_or_version(int argc, char **argv) {
  for (int a = 1; a < argc; a++) {
    if (strcmp(argv[a], "-h") == 0 || strcmp(argv[a], "--help") == 0)
      return PX_CONFIG_HELP;
    if (strcmp(argv[a], "-V") == 0 || strcmp(argv[a], "--version") == 0)
      return PX_CONFIG_VERSION;
  }
  return PX_CONFIG_OK;
}

/* Where the config file is: the last --config flag, else REBOUND_CONFIG. */
static const char *find_config_path(int argc, char **argv,
                                    const char *(*env)(const char *)) {
  const char *path = env ? env("REBOUND_CONFIG") : NULL, *v;
  for (int a = 1; a < argc; a++) {
    int i = arg_option(argc, argv, &a, &v);
    if (i >= 0 && v && strcmp(options[i].flag, "config") == 0)
      path = v;
  }
  return path && *path ? path : NULL;
}

static px_config_result load_layers(px_config *cfg, int argc, char **argv,
                                    const char *(*env)(const char *), char *err,
                                    size_t errlen) {
  px_config_result asked = help_or_version(argc, argv);
  if (asked != PX_CONFIG_OK)
    return asked;
  const char *path = find_config_path(argc, argv, env);
  static const px_config_keys keys = {px_config_set, flag_for_key, expected,
                                      px_parse_tiers, px_parse_globs};
  if (path && px_config_read_file(cfg, &keys, path, err, errlen) != 0)
    return PX_CONFIG_ERROR;
  snprintf(cfg->config_path, sizeof cfg->config_path, "%s", path ? path : "");
  for (int i = 0; env && i < N_OPTIONS; i++) {
    const char *v = env(options[i].env);
    if (v && *v && set_option(cfg, i, v, PX_FROM_ENV) != 0) {
      snprintf(err, errlen, "%s=%s: not a valid --%s (expected %s)",
               options[i].env, v, options[i].flag, options[i].expect);
      return PX_CONFIG_ERROR;
    }
  }
  for (int a = 1; a < argc; a++) {
    const char *arg = argv[a], *v;
    int i = arg_option(argc, argv, &a, &v);
    if (i < 0) {
      snprintf(err, errlen, "unknown option '%s' (see --help)", arg);
      return PX_CONFIG_ERROR;
    }
    if (!v) {
      snprintf(err, errlen, "--%s: missing value (expected %s)",
               options[i].flag, options[i].expect);
      return PX_CONFIG_ERROR;
    }
    if (set_option(cfg, i, v, PX_FROM_FLAG) != 0) {
      snprintf(err, errlen, "--%s: invalid value '%s' (expected %s)",
               options[i].flag, v, options[i].expect);
      return PX_CONFIG_ERROR;
    }
  }
  return PX_CONFIG_OK;
}

/* Listeners and TLS files that only make sense together, and the tier
 * watch's two durations. */
static int check_tls(const px_config *c, char *err, size_t errlen) {
  const px_tls_config *t = &c->tls;
  const char *why = NULL;
  if (!c->listen_on && !t->listen_on)
    why = "--listen and --tls-listen are both off: nothing accepts clients";
  else if (t->listen_on && (!t->cert[0] || !t->key[0]))
    why = "--tls-listen needs --tls-cert and --tls-key";
  else if (!t->listen_on && (t->cert[0] || t->key[0] || t->client_ca[0]))
    why = "--tls-cert, --tls-key and --tls-client-ca need --tls-listen";
  else if (!t->upstream_cert[0] != !t->upstream_key[0])
    why = "--upstream-cert and --upstream-key go together";
  else if (c->tier_heal_after_ms && c->tier_heal_after_ms < c->tier_grace_ms)
    why = "--tier-heal-after is shorter than --tier-grace: copies would be "
          "moved before they are overdue (expected at least --tier-grace, "
          "or off)";
  if (why)
    snprintf(err, errlen, "%s", why);
  return why ? -1 : 0;
}

/* Which worker this process is: REBOUND_WORKER, set by worker 0 for the
 * processes it starts (px_workers.h); absent, 0. */
static int check_worker(px_config *c, const char *(*env)(const char *),
                        char *err, size_t errlen) {
  const char *v = env ? env("REBOUND_WORKER") : NULL;
  char *end;
  if (!v || !*v)
    return 0;
  errno = 0;
  unsigned long k = strtoul(v, &end, 10);
  if (*end || errno || k < 1 || k >= c->workers) {
    snprintf(err, errlen,
             "REBOUND_WORKER=%s: not a worker of --workers %u (expected 1 to "
             "%u; rebound sets it for the processes it starts)",
             v, c->workers, c->workers - 1);
    return -1;
  }
  c->worker = (uint32_t)k;
  return 0;
}

px_config_result px_config_load(px_config *cfg, int argc, char **argv,
                                const char *(*env)(const char *), char *err,
                                size_t errlen) {
  memset(cfg, 0, sizeof *cfg);
  for (int i = 0; i < N_OPTIONS; i++)
    if (options[i].def &&
        set_option(cfg, i, options[i].def, PX_FROM_DEFAULT) != 0)
      abort(); /* a default that does not parse is a bug */
  cfg->retry.rules = cfg->rules;
  retry_rule_default(&cfg->rules[0]);
  cfg->retry.nrules = 1;
  px_config_result r = load_layers(cfg, argc, argv, env, err, errlen);
  if (r == PX_CONFIG_OK && check_tls(cfg, err, errlen) != 0)
    r = PX_CONFIG_ERROR;
  if (r == PX_CONFIG_OK && check_worker(cfg, env, err, errlen) != 0)
    r = PX_CONFIG_ERROR;
  if (r == PX_CONFIG_OK && cfg->override.tiers && cfg->override.backoff &&
      cfg->override.rule.backoff.initial_ms) {
    snprintf(err, errlen, "--retry-tiers and --retry-backoff: give one");
    r = PX_CONFIG_ERROR;
  }
  if (r == PX_CONFIG_OK)
    apply_override(cfg);
  /* a backoff's levels depend on max_attempts, which a flag may change */
  for (unsigned i = 0; r == PX_CONFIG_OK && i < cfg->retry.nrules; i++)
    if (retry_rule_compile(&cfg->rules[i], err, errlen) != 0)
      r = PX_CONFIG_ERROR;
  return r;
}

void px_config_usage(void *file) {
  FILE *f = file;
  fputs("Usage: rebound [OPTIONS]\n"
        "\n"
        "A transparent AMQP 0-9-1 proxy in front of RabbitMQ that turns\n"
        "basic.nack/basic.reject with requeue=true into a delayed, counted\n"
        "retry, and dead-letters a message after max_attempts.\n"
        "\n"
        "Options (flag > environment > config file > default):\n",
        f);
  for (int i = 0; i < N_OPTIONS; i++)
    fprintf(f, "  --%-22s %s\n  %-24s env %s%s%s\n", options[i].flag,
            options[i].help, "", options[i].env,
            options[i].def && *options[i].def ? ", default " : "",
            options[i].def ? options[i].def : "");
  fputs(
      "  -c, -l, -u, -a             short for --config, --listen, --upstream, "
      "--admin\n"
      "  --check                    check the settings (files, certificates, "
      "host names)\n"
      "                             without binding; print them and exit 0, "
      "or 2\n"
      "  -h, --help                 show this help and exit\n"
      "  -V, --version              show the version and the libraries in "
      "use\n"
      "Durations: 10 (seconds), 500ms, 1.5s, 1m30s. Sizes: 4096, 512K, 256M, "
      "1G.\n"
      "\n"
      "rebound dlq ls|show|redrive|purge ...: dead-letter queues (rebound "
      "dlq --help)\n",
      f);
}

void px_config_print(const px_config *cfg, void *file) {
  static const char *const from[] = {"default", "file", "environment", "flag"};
  FILE *f = file;
  for (int i = 0; i < N_OPTIONS; i++) {
    if (!cfg->shown[i][0])
      continue; /* not given, no default (the policies say what applies) */
    fprintf(f, "--%-22s %-24s # %s", options[i].flag, cfg->shown[i],
            from[cfg->origin[i]]);
    if (cfg->origin[i] == PX_FROM_ENV)
      fprintf(f, " %s", options[i].env);
    fputc('\n', f);
  }
}
