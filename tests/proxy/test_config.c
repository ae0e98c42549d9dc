/* px_config: defaults, YAML file, env and flags in that order of
 * precedence; bad files refused with file:line and a reason. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "px_config.h"

static const char *fake_env[16][2];

static const char *env_lookup(const char *name) {
  for (int i = 0; i < 16 && fake_env[i][0]; i++)
    if (strcmp(fake_env[i][0], name) == 0)
      return fake_env[i][1];
  return NULL;
}

static char path[64];

static const char *write_file(const char *text) {
  snprintf(path, sizeof path, "/tmp/rebound-test-config-%d.yaml",
           (int)getpid());
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
  return path;
}

static px_config_result load(px_config *c, char **argv, char *err) {
  int argc = 0;
  while (argv[argc])
    argc++;
  return px_config_load(c, argc, argv, env_lookup, err, 256);
}

static void test_defaults(void **state) {
  (void)state;
  static px_config c;
  char err[256];
  char *argv[] = {"rebound", NULL};
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(load(&c, argv, err), PX_CONFIG_OK);
  assert_string_equal(c.listen.host, "127.0.0.1");
  assert_int_equal(c.listen.port, 5673);
  assert_int_equal(c.n_upstreams, 1);
  assert_int_equal(c.upstream[0].port, 5672);
  assert_int_equal(c.retry.nrules, 1);
  assert_string_equal(c.rules[0].globs[0], "*");
  assert_int_equal(c.rules[0].ntiers, 3);
  assert_int_equal(c.rules[0].tiers_ms[2], 4000);
  assert_int_equal(c.rules[0].max_attempts, 4);
  assert_string_equal(c.retry.header_prefix, "rebound-");
  assert_int_equal(c.cache_per_connection, 8u << 20);
  assert_int_equal(c.cache_total, 256u << 20);
  assert_int_equal(c.retry_confirm_timeout_ms, 30000);
  assert_int_equal(c.max_connections, 0); /* auto */
}

static const char good_yaml[] =
    "listen: 127.0.0.1:6000\n"
    "upstreams: [\"10.0.0.1:5672\", \"10.0.0.2:5672\"]\n"
    "cache_per_connection: 1MiB\n"
    "retry:\n"
    "  header_prefix: \"x-rb-\"\n"
    "  policies:\n"
    "    - queues: [\"print.render*\"]\n"
    "      tiers: [1s, 2s, 4s]\n"
    "      max_attempts: 4\n"
    "      dead_letter: \"{queue}.dlq\"\n"
    "    - queues: [orders]\n"
    "      tiers: [500ms]\n"
    "      max_attempts: 2\n"
    "      dead_letter: \"parking.{queue}\"\n";

static void test_file_then_env_then_flags(void **state) {
  (void)state;
  static px_config c;
  char err[256];
  const char *p = write_file(good_yaml);
  char *argv[] = {"rebound",  "--config",       (char *)p,
                  "--listen", "127.0.0.1:7000", NULL};
  memset(fake_env, 0, sizeof fake_env);
  fake_env[0][0] = "REBOUND_LISTEN";
  fake_env[0][1] = "127.0.0.1:6500";
  fake_env[1][0] = "REBOUND_UPSTREAM";
  fake_env[1][1] = "127.0.0.1:5999";
  assert_int_equal(load(&c, argv, err), PX_CONFIG_OK);
  assert_int_equal(c.listen.port, 7000); /* flag beats env */
  assert_int_equal(c.n_upstreams, 1);    /* env beats file */
  assert_int_equal(c.upstream[0].port, 5999);
  assert_int_equal(c.cache_per_connection, 1u << 20); /* file beats default */
  assert_string_equal(c.retry.header_prefix, "x-rb-");
  assert_int_equal(c.retry.nrules, 2);
  assert_string_equal(c.rules[1].globs[0], "orders");
  assert_int_equal(c.rules[1].tiers_ms[0], 500);
  assert_int_equal(c.rules[1].ntiers, 1);
  assert_string_equal(c.rules[1].dead_letter, "parking.{queue}");

  /* without the env, the file's upstreams hold */
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(load(&c, argv, err), PX_CONFIG_OK);
  assert_int_equal(c.n_upstreams, 2);
  assert_string_equal(c.upstream[1].host, "10.0.0.2");
  unlink(p);
}

/* --retry-* replace the rules with one: the file's first, changed. */
static void test_retry_flags_override(void **state) {
  (void)state;
  static px_config c;
  char err[256];
  const char *p = write_file(good_yaml);
  char *argv[] = {"rebound",        "--config", (char *)p,
                  "--max-attempts", "6",        NULL};
  memset(fake_env, 0, sizeof fake_env);
  fake_env[0][0] = "REBOUND_RETRY_TIERS";
  fake_env[0][1] = "1s,3s";
  assert_int_equal(load(&c, argv, err), PX_CONFIG_OK);
  assert_int_equal(c.retry.nrules, 1);
  assert_string_equal(c.rules[0].globs[0], "print.render*");
  assert_int_equal(c.rules[0].max_attempts, 6);
  assert_int_equal(c.rules[0].ntiers, 2);
  assert_int_equal(c.rules[0].tiers_ms[1], 3000);
  unlink(p);

  char *argv2[] = {"rebound", "--retry-queues", "a*,b", NULL};
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(load(&c, argv2, err), PX_CONFIG_OK);
  assert_int_equal(c.rules[0].nglobs, 2);
  assert_string_equal(c.rules[0].globs[1], "b");
  assert_int_equal(c.rules[0].max_attempts, 4); /* default kept */
}

/* queue_type per policy in the file; --retry-queue-type sets every
 * policy's and keeps them all; --retry-connection separate (default) or
 * shared. */
static void test_queue_type_and_retry_connection(void **state) {
  (void)state;
  static px_config c;
  char err[256];
  const char *p = write_file("retry_connection: shared\n"
                             "retry:\n  policies:\n"
                             "    - queues: [a]\n      queue_type: classic\n"
                             "    - queues: [b]\n");
  char *argv[] = {"rebound", "--config", (char *)p, NULL};
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(load(&c, argv, err), PX_CONFIG_OK);
  assert_int_equal(c.retry.nrules, 2);
  assert_int_equal(c.rules[0].queue_type, RETRY_QT_CLASSIC);
  assert_int_equal(c.rules[1].queue_type, RETRY_QT_AUTO);
  assert_true(c.retry_shared);
  char *argv2[] = {
      "rebound", "--config",           (char *)p,  "--retry-queue-type",
      "quorum",  "--retry-connection", "separate", NULL};
  assert_int_equal(load(&c, argv2, err), PX_CONFIG_OK);
  assert_int_equal(c.retry.nrules, 2); /* both policies kept */
  assert_int_equal(c.rules[0].queue_type, RETRY_QT_QUORUM);
  assert_int_equal(c.rules[1].queue_type, RETRY_QT_QUORUM);
  assert_false(c.retry_shared);
  unlink(p);
  char *argv3[] = {"rebound", NULL};
  assert_int_equal(load(&c, argv3, err), PX_CONFIG_OK);
  assert_false(c.retry_shared); /* the default */
  assert_int_equal(c.rules[0].queue_type, RETRY_QT_AUTO);
  char *argv4[] = {"rebound", "--retry-queue-type", "stream", NULL};
  assert_int_equal(load(&c, argv4, err), PX_CONFIG_ERROR);
  assert_string_equal(err, "--retry-queue-type: invalid value 'stream' "
                           "(expected auto, quorum or classic)");
  fake_env[0][0] = "REBOUND_RETRY_CONNECTION";
  fake_env[0][1] = "both";
  assert_int_equal(load(&c, argv3, err), PX_CONFIG_ERROR);
  assert_string_equal(err, "REBOUND_RETRY_CONNECTION=both: not a valid "
                           "--retry-connection (expected separate or shared)");
  memset(fake_env, 0, sizeof fake_env);
}

static void expect_file_error(const char *yaml, const char *want) {
  static px_config c;
  char err[256];
  const char *p = write_file(yaml);
  char *argv[] = {"rebound", "--config", (char *)p, NULL};
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(load(&c, argv, err), PX_CONFIG_ERROR);
  char full[320];
  snprintf(full, sizeof full, "%s:%s", p, want);
  if (strncmp(err, full, strlen(full)) != 0)
    fail_msg("error '%s', want prefix '%s'", err, full);
  unlink(p);
}

static void test_bad_files(void **state) {
  (void)state;
  expect_file_error("listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n",
                    "2: duplicate key 'listen' (first at line 1)");
  expect_file_error("retry:\n  policies:\n    - queues: [a]\n"
                    "      tiers: [1s]\n      tiers: [2s]\n",
                    "5: duplicate key 'tiers' (first at line 4)");
  expect_file_error("listen: 1.2.3.4\n", "1: listen: invalid value");
  expect_file_error("listen: 127.0.0.1:1\nbogus: 1\n",
                    "2: unknown key 'bogus'");
  expect_file_error(
      "retry:\n  policies:\n    - queues: [a]\n      tiers: [1x]\n",
      "4: tiers:");
  expect_file_error("retry:\n  policies:\n    - queues: [a]\n"
                    "      max_attempts: 0\n",
                    "4: max_attempts:");
  expect_file_error("retry:\n  policies:\n    - tiers: [1s]\n",
                    "3: a policy needs 'queues'");
  expect_file_error(
      "retry:\n  policies:\n    - queues: [a]\n      color: red\n",
      "4: unknown policy key 'color'");
  expect_file_error(
      "retry:\n  policies:\n    - queues: [a]\n      queue_type: stream\n",
      "4: queue_type: expected auto, quorum or classic");
  expect_file_error("listen: [unclosed\n", "2: ");
  static px_config c;
  char err[256];
  char *argv[] = {"rebound", "--config", "/nonexistent/rebound.yaml", NULL};
  assert_int_equal(load(&c, argv, err), PX_CONFIG_ERROR);
  assert_non_null(strstr(err, "/nonexistent/rebound.yaml: cannot open"));
}

/* A policy's backoff in the file: compiled into levels of jitter buckets
 * (README, "Backoff"), defaults for the keys left out; --max-attempts
 * given as a flag recompiles the levels; --retry-tiers replaces the
 * backoff with its list. */
static void test_backoff_policy(void **state) {
  (void)state;
  static px_config c;
  char err[256];
  const char *p = write_file("retry:\n  policies:\n"
                             "    - queues: [mail.*]\n"
                             "      max_attempts: 5\n"
                             "      backoff: {initial: 200ms, max: 800ms, "
                             "jitter: 0.25}\n");
  char *argv[] = {"rebound", "--config", (char *)p, NULL};
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(load(&c, argv, err), PX_CONFIG_OK);
  const retry_rule *r = &c.rules[0];
  assert_int_equal(r->backoff.initial_ms, 200);
  assert_int_equal(r->backoff.max_ms, 800);
  assert_true(r->backoff.multiplier == 2 && r->backoff.jitter == 0.25);
  assert_int_equal(r->nbuckets, 4);
  assert_int_equal(retry_levels(r), 3); /* 200ms 400ms 800ms */
  assert_int_equal(r->tiers_ms[0], 163);
  assert_int_equal(r->tiers_ms[11], 950);
  char *argv2[] = {"rebound",        "--config", (char *)p,
                   "--max-attempts", "2",        NULL};
  assert_int_equal(load(&c, argv2, err), PX_CONFIG_OK);
  assert_int_equal(retry_levels(&c.rules[0]), 1);
  char *argv3[] = {"rebound",       "--config", (char *)p,
                   "--retry-tiers", "3s",       NULL};
  assert_int_equal(load(&c, argv3, err), PX_CONFIG_OK);
  assert_int_equal(c.rules[0].ntiers, 1);
  assert_int_equal(c.rules[0].nbuckets, 0);
  assert_int_equal(c.rules[0].tiers_ms[0], 3000);
  /* --retry-backoff off: back to the default list */
  char *argv4[] = {"rebound",         "--config", (char *)p,
                   "--retry-backoff", "off",      NULL};
  assert_int_equal(load(&c, argv4, err), PX_CONFIG_OK);
  assert_int_equal(c.rules[0].ntiers, 3);
  assert_int_equal(c.rules[0].tiers_ms[2], 4000);
  assert_int_equal(c.rules[0].nbuckets, 0);
  unlink(p);
  /* from the environment, keys left out at their defaults */
  char *argv5[] = {"rebound", NULL};
  fake_env[0][0] = "REBOUND_RETRY_BACKOFF";
  fake_env[0][1] = "initial=500ms,jitter=0.1,buckets=2";
  assert_int_equal(load(&c, argv5, err), PX_CONFIG_OK);
  assert_int_equal(c.rules[0].nbuckets, 2);
  assert_int_equal(retry_levels(&c.rules[0]), 3); /* max_attempts 4 */
  assert_int_equal(c.rules[0].tiers_ms[0], 475);
  assert_int_equal(c.rules[0].tiers_ms[5], 2100); /* 2s * 1.05 */
  memset(fake_env, 0, sizeof fake_env);
  char *argv6[] = {"rebound", "--retry-backoff", "initial=1s,speed=2", NULL};
  assert_int_equal(load(&c, argv6, err), PX_CONFIG_ERROR);
  assert_string_equal(err, "--retry-backoff: invalid value "
                           "'initial=1s,speed=2' (expected off or "
                           "'initial=1s,multiplier=2,max=10m,jitter=0.2,"
                           "buckets=4' (any of them))");
  char *argv7[] = {"rebound", "--retry-backoff", "jitter=0.9", NULL};
  assert_int_equal(load(&c, argv7, err), PX_CONFIG_ERROR);
  assert_string_equal(err, "backoff: jitter 0.9: expected a fraction 0..0.5");
  char *argv8[] = {
      "rebound", "--retry-backoff", "max=1m", "--retry-tiers", "1s", NULL};
  assert_int_equal(load(&c, argv8, err), PX_CONFIG_ERROR);
  assert_string_equal(err, "--retry-tiers and --retry-backoff: give one");
}

static void test_backoff_refused(void **state) {
  (void)state;
  const char *head = "retry:\n  policies:\n    - queues: [a]\n";
  static const char *const cases[][2] = {
      {"      backoff: {jitter: 0.7}\n",
       "3: backoff: jitter 0.7: expected a fraction 0..0.5"},
      {"      backoff: {multiplier: fast}\n",
       "4: backoff: multiplier 'fast': expected a number 1..100"},
      {"      backoff: {initial: soon}\n",
       "4: backoff: initial 'soon': expected a delay like 500ms"},
      {"      backoff: {max: 0}\n",
       "4: backoff: max '0': expected a delay like 500ms"},
      {"      backoff: {buckets: 12}\n", "3: backoff: buckets 12"},
      {"      backoff: {color: red}\n", "4: backoff: unknown key 'color'"},
      {"      backoff: 1s\n", "4: backoff: expected a mapping"},
      {"      tiers: [1s]\n      backoff: {}\n",
       "3: a policy has either 'tiers' or 'backoff', not both"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char yaml[256];
    snprintf(yaml, sizeof yaml, "%s%s", head, cases[i][0]);
    expect_file_error(yaml, cases[i][1]);
  }
}

static void test_bad_flags_and_env(void **state) {
  (void)state;
  static px_config c;
  char err[256];
  char *argv[] = {"rebound", "--max-attempts", "0", NULL};
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(load(&c, argv, err), PX_CONFIG_ERROR);
  assert_string_equal(
      err, "--max-attempts: invalid value '0' (expected a whole number from 1 "
           "to 1000000)");
  char *argv2[] = {"rebound", "--nope", NULL};
  assert_int_equal(load(&c, argv2, err), PX_CONFIG_ERROR);
  char *argv3[] = {"rebound", NULL};
  fake_env[0][0] = "REBOUND_CACHE_TOTAL";
  fake_env[0][1] = "lots";
  assert_int_equal(load(&c, argv3, err), PX_CONFIG_ERROR);
  assert_string_equal(err, "REBOUND_CACHE_TOTAL=lots: not a valid "
                           "--cache-total (expected a size like 512K, 256M, 1G "
                           "(also KiB, MiB, GiB; KB, MB, GB are 1000-based) or "
                           "a number of bytes)");
  static const struct {
    const char *in;
    uint64_t n;
  } sizes[] = {{"512KiB", 512 << 10}, {"256M", 256 << 20}, {"256m", 256 << 20},
               {"256MiB", 256 << 20}, {"1G", 1ull << 30},  {"1gib", 1ull << 30},
               {"2T", 2ull << 40},    {"8k", 8 << 10},     {"5MB", 5000000},
               {"1gb", 1000000000},   {"4096", 4096},      {"7B", 7}};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    uint64_t n = 0;
    if (px_parse_size(sizes[i].in, &n) != 0 || n != sizes[i].n)
      fail_msg("'%s': %llu", sizes[i].in, (unsigned long long)n);
  }
  uint64_t n;
  static const char *bad[] = {"-1", "3 MiB", "1Gi",  "1KK",
                              "M",  "",      "1.5G", "20000000T"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    if (px_parse_size(bad[i], &n) != -1)
      fail_msg("'%s' accepted", bad[i]);
}

/* Upstreams as HOST:PORT or amqp(s) URLs; the TLS options that only make
 * sense together. */
static void test_upstream_urls_and_tls(void **state) {
  (void)state;
  static px_config c;
  char err[256];
  px_addr a;
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(px_upstream_parse("amqps://rabbit.example", &a), 0);
  assert_string_equal(a.host, "rabbit.example");
  assert_int_equal(a.port, 5671);
  assert_true(a.tls);
  assert_int_equal(px_upstream_parse("amqp://rabbit:5700/", &a), 0);
  assert_int_equal(a.port, 5700);
  assert_false(a.tls);
  assert_int_equal(px_upstream_parse("amqps://[::1]", &a), 0);
  assert_string_equal(a.host, "::1");
  assert_int_equal(a.port, 5671);
  assert_int_equal(px_upstream_parse("amqps://[::1]:6000", &a), 0);
  assert_int_equal(a.port, 6000);
  assert_int_equal(px_upstream_parse("10.0.0.1:5672", &a), 0);
  assert_false(a.tls);
  assert_int_equal(px_upstream_parse("amqps://u:p@rabbit", &a), -1);
  assert_int_equal(px_upstream_parse("amqps://rabbit/vhost", &a), -1);
  assert_int_equal(px_upstream_parse("amqps://", &a), -1);
  assert_int_equal(px_upstream_parse("http://rabbit", &a), -1);

  char *argv[] = {"rebound", "--upstream", "amqps://a,b:5672", NULL};
  assert_int_equal(load(&c, argv, err), PX_CONFIG_OK);
  assert_int_equal(c.n_upstreams, 2);
  assert_true(c.upstream[0].tls);
  assert_false(c.upstream[1].tls);
  assert_true(c.tls.upstream_verify);
  assert_true(c.listen_on);
  assert_false(c.tls.listen_on);

  char *tls_no_cert[] = {"rebound", "--tls-listen", "127.0.0.1:5671", NULL};
  assert_int_equal(load(&c, tls_no_cert, err), PX_CONFIG_ERROR);
  assert_string_equal(err, "--tls-listen needs --tls-cert and --tls-key");
  char *none[] = {"rebound", "--listen", "off", NULL};
  assert_int_equal(load(&c, none, err), PX_CONFIG_ERROR);
  assert_string_equal(
      err, "--listen and --tls-listen are both off: nothing accepts clients");
  char *cert_alone[] = {"rebound", "--tls-cert", "x.pem", NULL};
  assert_int_equal(load(&c, cert_alone, err), PX_CONFIG_ERROR);
  char *half[] = {"rebound", "--upstream-cert", "c.pem", NULL};
  assert_int_equal(load(&c, half, err), PX_CONFIG_ERROR);
  assert_string_equal(err, "--upstream-cert and --upstream-key go together");
  char *heal[] = {"rebound",           "--tier-grace", "30s",
                  "--tier-heal-after", "10s",          NULL};
  assert_int_equal(load(&c, heal, err), PX_CONFIG_ERROR);
  assert_string_equal(err, "--tier-heal-after is shorter than --tier-grace: "
                           "copies would be moved before they are overdue "
                           "(expected at least --tier-grace, or off)");
  char *heal_off[] = {"rebound",           "--tier-grace", "30s",
                      "--tier-heal-after", "off",          NULL};
  assert_int_equal(load(&c, heal_off, err), PX_CONFIG_OK);
  assert_int_equal(c.tier_heal_after_ms, 0);
  char *watch[] = {"rebound", "--tier-watch", "often", NULL};
  assert_int_equal(load(&c, watch, err), PX_CONFIG_ERROR);
  assert_non_null(strstr(err, "--tier-watch: invalid value 'often'"));
  assert_non_null(strstr(err, "off or a duration"));
  char *verify[] = {"rebound", "--upstream-verify", "maybe", NULL};
  assert_int_equal(load(&c, verify, err), PX_CONFIG_ERROR);
  assert_string_equal(err, "--upstream-verify: invalid value 'maybe' "
                           "(expected on or off)");
  char *ok[] = {"rebound",    "--listen",          "off",   "--tls-listen",
                "[::1]:5671", "--tls-cert",        "c.pem", "--tls-key",
                "k.pem",      "--upstream-verify", "off",   NULL};
  assert_int_equal(load(&c, ok, err), PX_CONFIG_OK);
  assert_false(c.listen_on);
  assert_true(c.tls.listen_on);
  assert_string_equal(c.tls.listen.host, "::1");
  assert_string_equal(c.tls.cert, "c.pem");
  assert_false(c.tls.upstream_verify);
}

/* --retry-confirm-timeout and --max-connections from each layer. */
static void test_confirm_timeout_and_max_connections(void **state) {
  (void)state;
  static px_config c;
  char err[256];
  const char *p = write_file("retry_confirm_timeout: 2m\n"
                             "max_connections: 300\n");
  char *argv[] = {"rebound", "--config", (char *)p, NULL};
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(load(&c, argv, err), PX_CONFIG_OK);
  assert_int_equal(c.retry_confirm_timeout_ms, 120000); /* file */
  assert_int_equal(c.max_connections, 300);

  fake_env[0][0] = "REBOUND_RETRY_CONFIRM_TIMEOUT";
  fake_env[0][1] = "1500ms";
  fake_env[1][0] = "REBOUND_MAX_CONNECTIONS";
  fake_env[1][1] = "auto";
  assert_int_equal(load(&c, argv, err), PX_CONFIG_OK);
  assert_int_equal(c.retry_confirm_timeout_ms, 1500); /* env beats file */
  assert_int_equal(c.max_connections, 0);

  char *argv2[] = {
      "rebound",           "--config", (char *)p, "--retry-confirm-timeout=5s",
      "--max-connections", "10000000", NULL};
  assert_int_equal(load(&c, argv2, err), PX_CONFIG_OK);
  assert_int_equal(c.retry_confirm_timeout_ms, 5000); /* flag beats env */
  assert_int_equal(c.max_connections, 10000000);
  unlink(p);
}

static void expect_flag_error(const char *flag, const char *value,
                              const char *want);

/* Durations: a number of seconds, fractions, several units, and 0 where
 * it means no wait; log levels in any case. */
static void test_durations_and_levels(void **state) {
  (void)state;
  static px_config c;
  char err[256];
  char *argv[] = {"rebound",
                  "--drain-timeout",
                  "0",
                  "--retry-finish-timeout",
                  "1m30s",
                  "--handshake-timeout",
                  "1.5s",
                  "--connect-timeout",
                  "10",
                  "--retry-tiers",
                  "500ms,1.5,1m30s",
                  "--log-level",
                  "DEBUG",
                  NULL};
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(load(&c, argv, err), PX_CONFIG_OK);
  assert_int_equal(c.drain_timeout_ms, 0);
  assert_int_equal(c.retry_finish_timeout_ms, 90000);
  assert_int_equal(c.handshake_timeout_ms, 1500);
  assert_int_equal(c.connect_timeout_ms, 10000);
  assert_int_equal(c.rules[0].ntiers, 3);
  assert_int_equal(c.rules[0].tiers_ms[1], 1500);
  assert_int_equal(c.rules[0].tiers_ms[2], 90000);
  assert_int_equal(c.log_level, PX_LOG_DEBUG);
  char *argv2[] = {"rebound", "--log-level", "Warning", NULL};
  assert_int_equal(load(&c, argv2, err), PX_CONFIG_OK);
  assert_int_equal(c.log_level, PX_LOG_WARN);
  expect_flag_error("--drain-timeout", "-1",
                    "--drain-timeout: invalid value '-1' (expected a duration "
                    "like 0, 500ms, 10s, 1.5s, 1m30s or seconds like 10 (at "
                    "most 24h))");
  expect_flag_error("--connect-timeout", "0",
                    "--connect-timeout: invalid value '0' (expected a duration "
                    "like 500ms, 10s, 1.5s, 1m30s or seconds like 10 (more "
                    "than 0, at most 24h))");
  expect_flag_error("--log-level", "verbose",
                    "--log-level: invalid value 'verbose' (expected debug, "
                    "info, warn or error (any case))");
}

/* getopt_long's spellings: -c FILE, -lADDR, --flag=value; :PORT for
 * every interface; --help and --version win over any bad setting. */
static void test_short_options_and_any_interface(void **state) {
  (void)state;
  static px_config c;
  char err[256];
  const char *p = write_file("upstreams: [127.0.0.1:5999]\n");
  char *argv[] = {"rebound", "-c",    (char *)p, "-l:6000",
                  "-a",      ":9901", "-u",      "amqps://mq.example",
                  NULL};
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(load(&c, argv, err), PX_CONFIG_OK);
  assert_string_equal(c.listen.host, "0.0.0.0");
  assert_int_equal(c.listen.port, 6000);
  assert_string_equal(c.admin.host, "0.0.0.0");
  assert_int_equal(c.admin.port, 9901);
  assert_int_equal(c.n_upstreams, 1); /* the flag beats the file */
  assert_string_equal(c.upstream[0].host, "mq.example");
  assert_int_equal(c.upstream[0].port, 5671);
  char *argv2[] = {"rebound", "-c", (char *)p, NULL};
  assert_int_equal(load(&c, argv2, err), PX_CONFIG_OK);
  assert_int_equal(c.upstream[0].port, 5999); /* the file, through -c */
  unlink(p);

  fake_env[0][0] = "REBOUND_LISTEN";
  fake_env[0][1] = "nope";
  char *help[] = {"rebound", "--config", "/nonexistent", "--help", NULL};
  assert_int_equal(load(&c, help, err), PX_CONFIG_HELP);
  char *version[] = {"rebound", "--drain-timeout", "soon", "-V", NULL};
  assert_int_equal(load(&c, version, err), PX_CONFIG_VERSION);
  char *bad[] = {"rebound", NULL};
  assert_int_equal(load(&c, bad, err), PX_CONFIG_ERROR);
  expect_flag_error("-x", "1", "unknown option '-x' (see --help)");
  expect_flag_error("-l", ":0",
                    "--listen: invalid value ':0' (expected HOST:PORT, "
                    "[IPv6]:PORT, :PORT (every IPv4 interface) or off)");
}

static void expect_flag_error(const char *flag, const char *value,
                              const char *want) {
  static px_config c;
  char err[256];
  char *argv[] = {"rebound", (char *)flag, (char *)value, NULL};
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(load(&c, argv, err), PX_CONFIG_ERROR);
  assert_string_equal(err, want);
}

static void test_confirm_timeout_and_max_connections_bad(void **state) {
  (void)state;
  const char *dur = " (expected a duration like 500ms, 10s, 1.5s, 1m30s or "
                    "seconds like 10 (more than 0, at most 24h))";
  const char *lim = " (expected auto or a whole number from 1 to 10000000)";
  char want[256];
  static const char *bad_durations[] = {"0s", "0",    "-1s", "25h", "1 s",
                                        "",   "1m30", "1.s", "10S", "1d"};
  for (size_t i = 0; i < sizeof bad_durations / sizeof *bad_durations; i++) {
    snprintf(want, sizeof want, "--retry-confirm-timeout: invalid value '%s'%s",
             bad_durations[i], dur);
    expect_flag_error("--retry-confirm-timeout", bad_durations[i], want);
  }
  static const char *bad_limits[] = {
      "0", "-5", "10000001", "12k", "1e3", "99999999999999999999", "", "AUTO"};
  for (size_t i = 0; i < sizeof bad_limits / sizeof *bad_limits; i++) {
    snprintf(want, sizeof want, "--max-connections: invalid value '%s'%s",
             bad_limits[i], lim);
    expect_flag_error("--max-connections", bad_limits[i], want);
  }

  static px_config c;
  char err[256];
  char *argv[] = {"rebound", "--max-connections", NULL};
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(load(&c, argv, err), PX_CONFIG_ERROR);
  snprintf(want, sizeof want, "--max-connections: missing value%s", lim);
  assert_string_equal(err, want);

  char *argv2[] = {"rebound", NULL};
  fake_env[0][0] = "REBOUND_MAX_CONNECTIONS";
  fake_env[0][1] = "none";
  assert_int_equal(load(&c, argv2, err), PX_CONFIG_ERROR);
  snprintf(want, sizeof want,
           "REBOUND_MAX_CONNECTIONS=none: not a valid --max-connections%s",
           lim);
  assert_string_equal(err, want);
  fake_env[0][0] = "REBOUND_RETRY_CONFIRM_TIMEOUT";
  fake_env[0][1] = "soon";
  assert_int_equal(load(&c, argv2, err), PX_CONFIG_ERROR);
  snprintf(want, sizeof want,
           "REBOUND_RETRY_CONFIRM_TIMEOUT=soon: not a valid "
           "--retry-confirm-timeout%s",
           dur);
  assert_string_equal(err, want);

  expect_file_error("max_connections: 0\n",
                    "1: max_connections: invalid value '0' (expected auto or "
                    "a whole number from 1 to 10000000)");
  expect_file_error("listen: 127.0.0.1:1\nretry_confirm_timeout: forever\n",
                    "2: retry_confirm_timeout: invalid value 'forever' "
                    "(expected a duration like 500ms");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_file_then_env_then_flags),
      cmocka_unit_test(test_retry_flags_override),
      cmocka_unit_test(test_queue_type_and_retry_connection),
      cmocka_unit_test(test_bad_files),
      cmocka_unit_test(test_backoff_policy),
      cmocka_unit_test(test_backoff_refused),
      cmocka_unit_test(test_bad_flags_and_env),
      cmocka_unit_test(test_upstream_urls_and_tls),
      cmocka_unit_test(test_confirm_timeout_and_max_connections),
      cmocka_unit_test(test_confirm_timeout_and_max_connections_bad),
      cmocka_unit_test(test_durations_and_levels),
      cmocka_unit_test(test_short_options_and_any_interface),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
