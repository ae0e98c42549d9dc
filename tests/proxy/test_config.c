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
  expect_file_error("listen: [unclosed\n", "2: ");
  static px_config c;
  char err[256];
  char *argv[] = {"rebound", "--config", "/nonexistent/rebound.yaml", NULL};
  assert_int_equal(load(&c, argv, err), PX_CONFIG_ERROR);
  assert_non_null(strstr(err, "/nonexistent/rebound.yaml: cannot open"));
}

static void test_bad_flags_and_env(void **state) {
  (void)state;
  static px_config c;
  char err[256];
  char *argv[] = {"rebound", "--max-attempts", "0", NULL};
  memset(fake_env, 0, sizeof fake_env);
  assert_int_equal(load(&c, argv, err), PX_CONFIG_ERROR);
  assert_string_equal(err, "--max-attempts: invalid value '0'");
  char *argv2[] = {"rebound", "--nope", NULL};
  assert_int_equal(load(&c, argv2, err), PX_CONFIG_ERROR);
  char *argv3[] = {"rebound", NULL};
  fake_env[0][0] = "REBOUND_CACHE_TOTAL";
  fake_env[0][1] = "lots";
  assert_int_equal(load(&c, argv3, err), PX_CONFIG_ERROR);
  assert_string_equal(err,
                      "REBOUND_CACHE_TOTAL=lots: not a valid --cache-total");
  uint64_t n;
  assert_int_equal(px_parse_size("512KiB", &n), 0);
  assert_int_equal(n, 512 * 1024);
  assert_int_equal(px_parse_size("-1", &n), -1);
  assert_int_equal(px_parse_size("3 MiB", &n), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_file_then_env_then_flags),
      cmocka_unit_test(test_retry_flags_override),
      cmocka_unit_test(test_bad_files),
      cmocka_unit_test(test_bad_flags_and_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
