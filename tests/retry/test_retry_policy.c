/* retry_policy: delay parsing/formatting and queue globs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "retry_policy.h"

/* Durations; a delay is one of at least 1 ms. */
static void test_duration_and_delay_parse(void **state) {
  (void)state;
  static const struct {
    const char *in;
    int rc;
    uint32_t ms;
  } cases[] = {
      {"1s", 0, 1000},
      {"250ms", 0, 250},
      {"2m", 0, 120000},
      {"1h", 0, 3600000},
      {"24h", 0, 86400000},
      {"90s", 0, 90000},
      {"0", 0, 0},
      {"0s", 0, 0},
      {"10", 0, 10000},
      {"1.5", 0, 1500},
      {"1.5s", 0, 1500},
      {"1m30s", 0, 90000},
      {"1h30m", 0, 5400000},
      {"2m0.5s", 0, 120500},
      {"1.5ms", 0, 2},
      {"0.25s", 0, 250},
      {"0.0001s", 0, 0},
      {"23h60m", 0, 86400000},
      {"1.123456789s", 0, 1123},
      {"25h", -1, 0},
      {"24h1ms", -1, 0},
      {"86401", -1, 0},
      {"1m30", -1, 0},
      {"30s1", -1, 0},
      {".5s", -1, 0},
      {"1.s", -1, 0},
      {"1..5s", -1, 0},
      {"1mo", -1, 0},
      {"1d", -1, 0},
      {"1S", -1, 0},
      {"+1s", -1, 0},
      {"-1s", -1, 0},
      {"1sec", -1, 0},
      {"s", -1, 0},
      {"1 s", -1, 0},
      {"1s ", -1, 0},
      {"", -1, 0},
      {"99999999999999s", -1, 0},
      {"99999999999999999999", -1, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint32_t ms = 7, delay = 7;
    size_t len = strlen(cases[i].in);
    int rc = retry_duration_parse(cases[i].in, len, &ms);
    int drc = retry_delay_parse(cases[i].in, len, &delay);
    int want_drc = cases[i].rc == 0 && cases[i].ms > 0 ? 0 : -1;
    if (rc != cases[i].rc || (rc == 0 && ms != cases[i].ms) ||
        drc != want_drc || (drc == 0 && delay != cases[i].ms))
      fail_msg("'%s': rc %d ms %u, delay rc %d", cases[i].in, rc, ms, drc);
  }
  /* only `len` bytes are read */
  uint32_t ms;
  assert_int_equal(retry_delay_parse("4s,8s", 2, &ms), 0);
  assert_int_equal(ms, 4000);
}

static void test_delay_format(void **state) {
  (void)state;
  static const struct {
    uint32_t ms;
    const char *out;
  } cases[] = {{1000, "1s"},   {500, "500ms"},  {1500, "1500ms"}, {60000, "1m"},
               {90000, "90s"}, {3600000, "1h"}, {7200000, "2h"}};
  char buf[16];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    assert_int_equal(retry_delay_format(cases[i].ms, buf, sizeof buf),
                     (int)strlen(cases[i].out));
    assert_string_equal(buf, cases[i].out);
  }
  assert_int_equal(retry_delay_format(1500, buf, 6), -1);
}

static void test_glob(void **state) {
  (void)state;
  static const struct {
    const char *pat, *name;
    bool match;
  } cases[] = {
      {"*", "anything", true},
      {"*", "", true},
      {"print.render*", "print.render", true},
      {"print.render*", "print.render.eu", true},
      {"print.render*", "print.rende", false},
      {"orders", "orders", true},
      {"orders", "orders2", false},
      {"a?c", "abc", true},
      {"a?c", "ac", false},
      {"*.dlq", "orders.dlq", true},
      {"*.dlq", "orders.dlq.x", false},
      {"a*b*c", "aXXbYYc", true},
      {"a*b*c", "aXXbYY", false},
      {"", "", true},
      {"", "x", false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (retry_glob_match(cases[i].pat, cases[i].name, strlen(cases[i].name)) !=
        cases[i].match)
      fail_msg("'%s' vs '%s'", cases[i].pat, cases[i].name);
  /* pathological pattern stays fast (linear) */
  char name[4096];
  memset(name, 'a', sizeof name);
  assert_false(retry_glob_match("*a*a*a*a*a*a*a*a*b", name, sizeof name));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_duration_and_delay_parse),
      cmocka_unit_test(test_delay_format),
      cmocka_unit_test(test_glob),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
