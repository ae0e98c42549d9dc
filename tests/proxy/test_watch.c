/* px_watch (px_watch.h): what a tier's oldest copy is (on time, overdue,
 * to be moved back), and its age read from rebound's last-failed-at
 * header, at each boundary. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "amqp.h"
#include "px_watch.h"

#define S 1000u /* a second, in ms */

static void judge_bounds(void **state) {
  (void)state;
  /* 1s tier, 15s grace, 1m heal-after: overdue past 16s, moved from 61s */
  assert_int_equal(px_watch_judge(S, 15 * S, 60 * S, 0), PX_WATCH_ON_TIME);
  assert_int_equal(px_watch_judge(S, 15 * S, 60 * S, 16 * S), PX_WATCH_ON_TIME);
  assert_int_equal(px_watch_judge(S, 15 * S, 60 * S, 16 * S + 1),
                   PX_WATCH_OVERDUE);
  assert_int_equal(px_watch_judge(S, 15 * S, 60 * S, 61 * S - 1),
                   PX_WATCH_OVERDUE);
  assert_int_equal(px_watch_judge(S, 15 * S, 60 * S, 61 * S), PX_WATCH_HEAL);
}

static void heal_waits_at_least_the_delay(void **state) {
  (void)state;
  /* an hour's tier is moved back only once overdue by another hour */
  uint32_t h = 3600 * S;
  assert_int_equal(px_watch_judge(h, 15 * S, 60 * S, h + 61 * S),
                   PX_WATCH_OVERDUE);
  assert_int_equal(px_watch_judge(h, 15 * S, 60 * S, 2 * (uint64_t)h - 1),
                   PX_WATCH_OVERDUE);
  assert_int_equal(px_watch_judge(h, 15 * S, 60 * S, 2 * (uint64_t)h),
                   PX_WATCH_HEAL);
}

static void heal_off_only_reports(void **state) {
  (void)state;
  assert_int_equal(px_watch_judge(S, 15 * S, 0, 1000000 * (uint64_t)S),
                   PX_WATCH_OVERDUE);
  assert_int_equal(px_watch_judge(S, 15 * S, 0, 2 * S), PX_WATCH_ON_TIME);
}

/* A headers table holding `name` = `v`. */
static amqp_bytes table_with(uint8_t *buf, size_t cap, const char *name,
                             amqp_field v) {
  amqp_writer w = amqp_writer_make(buf, cap);
  amqp_field other = amqp_field_string(amqp_cstr("x"));
  amqp_table_write_entry(&w, amqp_cstr("app-header"), &other);
  amqp_table_write_entry(&w, amqp_cstr(name), &v);
  assert_false(w.failed);
  return (amqp_bytes){buf, w.len};
}

static void age_from_header(void **state) {
  (void)state;
  uint8_t buf[256];
  uint64_t age = 12345;
  const char *h = "rebound-last-failed-at";
  amqp_bytes t = table_with(buf, sizeof buf, h, amqp_field_timestamp(1000));
  assert_int_equal(px_watch_copy_age(t, h, 1600, &age), 0);
  assert_int_equal(age, 600 * S);
  /* a clock behind the copy's: age 0, never a wrapped huge age */
  assert_int_equal(px_watch_copy_age(t, h, 999, &age), 0);
  assert_int_equal(age, 0);
  /* a whole number of seconds, as other writers may set it */
  t = table_with(buf, sizeof buf, h, amqp_field_long(1500));
  assert_int_equal(px_watch_copy_age(t, h, 1600, &age), 0);
  assert_int_equal(age, 100 * S);
}

static void age_unknown(void **state) {
  (void)state;
  uint8_t buf[256];
  uint64_t age = 7;
  const char *h = "rebound-last-failed-at";
  /* absent, under another prefix, negative, a string */
  amqp_bytes t = table_with(buf, sizeof buf, "other-last-failed-at",
                            amqp_field_timestamp(1000));
  assert_int_equal(px_watch_copy_age(t, h, 1600, &age), -1);
  t = table_with(buf, sizeof buf, h, amqp_field_long(-5));
  assert_int_equal(px_watch_copy_age(t, h, 1600, &age), -1);
  t = table_with(buf, sizeof buf, h, amqp_field_string(amqp_cstr("1000")));
  assert_int_equal(px_watch_copy_age(t, h, 1600, &age), -1);
  assert_int_equal(px_watch_copy_age((amqp_bytes){NULL, 0}, h, 1600, &age), -1);
  assert_int_equal(age, 7);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(judge_bounds),
      cmocka_unit_test(heal_waits_at_least_the_delay),
      cmocka_unit_test(heal_off_only_reports),
      cmocka_unit_test(age_from_header),
      cmocka_unit_test(age_unknown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
