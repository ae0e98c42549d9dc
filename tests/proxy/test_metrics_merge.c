/* px_metrics_merge: the workers' expositions become one, each family
 * once and each series once, summed (or worker 0's, or the largest, for
 * the series of one process's state). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "px_admin.h"
#include "px_metrics.h"

static char *merged_only(const char *const *texts, const bool *only,
                         unsigned n) {
  size_t lens[8];
  px_admin_response r;
  memset(&r, 0, sizeof r);
  for (unsigned i = 0; i < n; i++)
    lens[i] = strlen(texts[i]);
  assert_int_equal(px_metrics_merge(texts, lens, only, n, &r), 0);
  assert_false(r.failed);
  return r.body;
}

static char *merged(const char *const *texts, unsigned n) {
  return merged_only(texts, NULL, n);
}

#define FAM(name, type)                                                        \
  "# HELP " name " help of " name "\n# TYPE " name " " type "\n"

static void test_counters_and_gauges_are_summed(void **state) {
  (void)state;
  const char *t[] = {
      FAM("a_total", "counter") "a_total 3\n" FAM("g", "gauge") "g 1.5\n",
      FAM("a_total", "counter") "a_total 4\n" FAM("g", "gauge") "g 2.25\n",
      FAM("a_total", "counter") "a_total 18446744073\n" FAM("g",
                                                            "gauge") "g 0\n"};
  char *out = merged(t, 3);
  assert_string_equal(out,
                      FAM("a_total", "counter") "a_total 18446744080\n" FAM(
                          "g", "gauge") "g 3.75\n");
  free(out);
}

static void test_series_only_some_workers_have(void **state) {
  (void)state;
  const char *t[] = {
      FAM("c_total", "counter") "c_total{queue=\"a b\"} 1\n" FAM("h", "gauge"),
      FAM("c_total",
          "counter") "c_total{queue=\"x\"} 5\n"
                     "c_total{queue=\"a b\"} 2\n" FAM(
                         "h",
                         "gauge") "h{side=\"client\"} 7\n" FAM("late",
                                                               "gauge") "late "
                                                                        "1\n"};
  char *out = merged(t, 2);
  assert_string_equal(
      out,
      FAM("c_total",
          "counter") "c_total{queue=\"a b\"} 3\n"
                     "c_total{queue=\"x\"} 5\n" FAM(
                         "h",
                         "gauge") "h{side=\"client\"} 7\n" FAM("late",
                                                               "gauge") "late "
                                                                        "1\n");
  free(out);
}

static void test_one_process_state_is_not_summed(void **state) {
  (void)state;
  const char *t[] = {
      FAM("rebound_ready", "gauge") "rebound_ready 1\n" FAM(
          "rebound_uptime_seconds",
          "gauge") "rebound_uptime_seconds 10.5\n" FAM("rebound_unsettled_"
                                                       "oldest_seconds",
                                                       "gauge") "rebound_"
                                                                "unsettled_"
                                                                "oldest_"
                                                                "seconds{queue="
                                                                "\"q\"} "
                                                                "2.000\n",
      FAM("rebound_ready", "gauge") "rebound_ready 1\n" FAM(
          "rebound_uptime_seconds",
          "gauge") "rebound_uptime_seconds 3.25\n" FAM("rebound_unsettled_"
                                                       "oldest_seconds",
                                                       "gauge") "rebound_"
                                                                "unsettled_"
                                                                "oldest_"
                                                                "seconds{queue="
                                                                "\"q\"} "
                                                                "9.500\n"};
  char *out = merged(t, 2);
  assert_non_null(strstr(out, "\nrebound_ready 1\n"));
  assert_non_null(strstr(out, "\nrebound_uptime_seconds 10.5\n"));
  assert_non_null(
      strstr(out, "\nrebound_unsettled_oldest_seconds{queue=\"q\"} 9.5\n"));
  free(out);
}

/* Which build runs and when it started are worker 0's; the resources of
 * the processes add up. */
static void test_build_info_and_start_time_are_the_first_process(void **s) {
  (void)s;
  const char *info = FAM("rebound_build_info", "gauge");
  const char *start = FAM("process_start_time_seconds", "gauge");
  const char *rss = FAM("process_resident_memory_bytes", "gauge");
  const char *fds = FAM("process_open_fds", "gauge");
  const char *max = FAM("process_max_fds", "gauge");
  char a[1024], b[1024];
  snprintf(a, sizeof a,
           "%srebound_build_info{version=\"1\"} 1\n"
           "%sprocess_start_time_seconds 1700000000.25\n"
           "%sprocess_resident_memory_bytes 100\n"
           "%sprocess_open_fds 10\n%sprocess_max_fds 1024\n",
           info, start, rss, fds, max);
  snprintf(b, sizeof b,
           "%srebound_build_info{version=\"1\"} 1\n"
           "%sprocess_start_time_seconds 1700000100.5\n"
           "%sprocess_resident_memory_bytes 50\n"
           "%sprocess_open_fds 20\n%sprocess_max_fds 512\n",
           info, start, rss, fds, max);
  const char *t[] = {a, b};
  char *out = merged(t, 2);
  assert_non_null(strstr(out, "\nrebound_build_info{version=\"1\"} 1\n"));
  assert_non_null(strstr(out, "\nprocess_start_time_seconds 1700000000.25\n"));
  assert_non_null(strstr(out, "\nprocess_resident_memory_bytes 150\n"));
  /* a descriptor limit is per process: the fullest worker shows */
  assert_non_null(strstr(out, "\nprocess_open_fds 20\n"));
  assert_non_null(strstr(out, "\nprocess_max_fds 512\n"));
  free(out);
}

static void test_histogram_buckets_sum(void **state) {
  (void)state;
  const char *t[] = {
      FAM("d_seconds", "histogram") "d_seconds_bucket{le=\"0.1\"} 1\n"
                                    "d_seconds_bucket{le=\"+Inf\"} 2\n"
                                    "d_seconds_sum 0.25\n"
                                    "d_seconds_count 2\n",
      FAM("d_seconds", "histogram") "d_seconds_bucket{le=\"0.1\"} 0\n"
                                    "d_seconds_bucket{le=\"+Inf\"} 1\n"
                                    "d_seconds_sum 1.5\n"
                                    "d_seconds_count 1\n"};
  char *out = merged(t, 2);
  assert_string_equal(
      out, FAM("d_seconds", "histogram") "d_seconds_bucket{le=\"0.1\"} 1\n"
                                         "d_seconds_bucket{le=\"+Inf\"} 3\n"
                                         "d_seconds_sum 1.75\n"
                                         "d_seconds_count 3\n");
  free(out);
}

/* The counters of exited workers (a counters-only text) still count; their
 * gauges do not. */
static void test_counters_only_text(void **state) {
  (void)state;
  const char *t[] = {
      FAM("a_total", "counter") "a_total 3\n" FAM("g", "gauge") "g 1\n",
      FAM("a_total", "counter") "a_total 10\n" FAM("g", "gauge") "g 5\n" FAM(
          "d_seconds", "histogram") "d_seconds_count 2\n"};
  const bool only[] = {false, true};
  char *out = merged_only(t, only, 2);
  assert_non_null(strstr(out, "\na_total 13\n"));
  assert_non_null(strstr(out, "\ng 1\n"));
  assert_non_null(strstr(out, "\nd_seconds_count 2\n"));
  free(out);
}

/* Many series: the table grows and every one is still found once. */
static void test_many_series(void **state) {
  (void)state;
  enum { N = 3000 };
  char *a = malloc(N * 40 + 128), *b = malloc(N * 40 + 128);
  size_t la = (size_t)sprintf(a, FAM("m", "gauge"));
  size_t lb = (size_t)sprintf(b, FAM("m", "gauge"));
  for (int i = 0; i < N; i++) {
    la += (size_t)sprintf(a + la, "m{i=\"%d\"} %d\n", i, i);
    lb += (size_t)sprintf(b + lb, "m{i=\"%d\"} 1\n", N - 1 - i);
  }
  const char *t[] = {a, b};
  char *out = merged(t, 2);
  for (int i = 0; i < N; i += 97) {
    char want[64];
    sprintf(want, "\nm{i=\"%d\"} %d\n", i, i + 1);
    assert_non_null(strstr(out, want));
  }
  size_t lines = 0;
  for (char *p = out; *p; p++)
    lines += *p == '\n';
  assert_int_equal(lines, N + 2);
  free(out);
  free(a);
  free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_counters_and_gauges_are_summed),
      cmocka_unit_test(test_series_only_some_workers_have),
      cmocka_unit_test(test_one_process_state_is_not_summed),
      cmocka_unit_test(test_build_info_and_start_time_are_the_first_process),
      cmocka_unit_test(test_histogram_buckets_sum),
      cmocka_unit_test(test_counters_only_text),
      cmocka_unit_test(test_many_series),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
