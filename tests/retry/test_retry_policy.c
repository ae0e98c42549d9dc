/* retry_policy: delay parsing/formatting and queue globs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "retry_policy.h"

static void test_delay_parse(void **state) {
  (void)state;
  static const struct {
    const char *in;
    int rc;
    uint32_t ms;
  } cases[] = {
      {"1s", 0, 1000},      {"250ms", 0, 250},
      {"2m", 0, 120000},    {"1h", 0, 3600000},
      {"24h", 0, 86400000}, {"90s", 0, 90000},
      {"25h", -1, 0},       {"0s", -1, 0},
      {"1", -1, 0},         {"s", -1, 0},
      {"1.5s", -1, 0},      {"-1s", -1, 0},
      {"1sec", -1, 0},      {"", -1, 0},
      {"1 s", -1, 0},       {"99999999999999s", -1, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint32_t ms = 0;
    int rc = retry_delay_parse(cases[i].in, strlen(cases[i].in), &ms);
    if (rc != cases[i].rc || (rc == 0 && ms != cases[i].ms))
      fail_msg("'%s': rc %d ms %u", cases[i].in, rc, ms);
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
      cmocka_unit_test(test_delay_parse),
      cmocka_unit_test(test_delay_format),
      cmocka_unit_test(test_glob),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
