/* retry_plan: the retry decision, table-driven. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "retry_plan.h"

typedef struct {
  const char *queue;
  int64_t count; /* -1: header absent */
  retry_action action;
  retry_pass_reason reason;
  uint32_t new_count;
  const char *target;
} decide_case;

static void run_cases(const retry_rule *rule, const decide_case *cases,
                      size_t n) {
  for (size_t i = 0; i < n; i++) {
    const decide_case *c = &cases[i];
    retry_plan p;
    retry_decide(rule, c->queue, strlen(c->queue), c->count, 0, &p);
    if (p.action != c->action || p.reason != c->reason ||
        (c->action != RETRY_PASS &&
         (p.new_count != c->new_count || strcmp(p.target, c->target) != 0 ||
          p.target_len != strlen(c->target))))
      fail_msg("case %zu (%s, count %lld): action %d reason %d count %u "
               "target '%s'",
               i, c->queue, (long long)c->count, p.action, p.reason,
               p.new_count, p.target);
  }
}

/* Which type a rule's queues get: the names parse back, AUTO follows what
 * the broker can do, the others do not. */
static void test_queue_types(void **state) {
  (void)state;
  static const struct {
    const char *name;
    retry_queue_type t;
    bool on_new, on_old; /* quorum on a broker with / without it */
  } cases[] = {
      {"auto", RETRY_QT_AUTO, true, false},
      {"quorum", RETRY_QT_QUORUM, true, true},
      {"classic", RETRY_QT_CLASSIC, false, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    retry_queue_type t = RETRY_QT_CLASSIC;
    assert_int_equal(
        retry_queue_type_parse(cases[i].name, strlen(cases[i].name), &t), 0);
    assert_int_equal(t, cases[i].t);
    assert_string_equal(retry_queue_type_str(t), cases[i].name);
    assert_int_equal(retry_use_quorum(t, true), cases[i].on_new);
    assert_int_equal(retry_use_quorum(t, false), cases[i].on_old);
  }
  retry_queue_type t = RETRY_QT_QUORUM;
  assert_int_equal(retry_queue_type_parse("quorumx", 7, &t), -1);
  assert_int_equal(retry_queue_type_parse("quorumx", 6, &t), 0);
  assert_int_equal(retry_queue_type_parse("", 0, &t), -1);
  assert_int_equal(retry_queue_type_parse("Quorum", 6, &t), -1);
  retry_rule r;
  retry_rule_default(&r);
  assert_int_equal(r.queue_type, RETRY_QT_AUTO);
}

/* The defaults (README, "Retries"): tiers 1s 2s 4s, max_attempts 4. */
static void test_default_rule(void **state) {
  (void)state;
  retry_rule r;
  retry_rule_default(&r);
  static const decide_case cases[] = {
      {"orders", -1, RETRY_REPUBLISH, RETRY_PASS_NONE, 1, "orders.retry.1s"},
      {"orders", 0, RETRY_REPUBLISH, RETRY_PASS_NONE, 1, "orders.retry.1s"},
      {"orders", 1, RETRY_REPUBLISH, RETRY_PASS_NONE, 2, "orders.retry.2s"},
      {"orders", 2, RETRY_REPUBLISH, RETRY_PASS_NONE, 3, "orders.retry.4s"},
      {"orders", 3, RETRY_DEAD_LETTER, RETRY_PASS_NONE, 4, "orders.dlq"},
      {"orders", 99, RETRY_DEAD_LETTER, RETRY_PASS_NONE, 100, "orders.dlq"},
      {"amq.gen-abc", -1, RETRY_PASS, RETRY_PASS_SERVER_NAMED, 0, ""},
      /* a count that cannot be trusted plans a first attempt */
      {"orders", -2, RETRY_REPUBLISH, RETRY_PASS_NONE, 1, "orders.retry.1s"},
      {"orders", (int64_t)UINT32_MAX - 1, RETRY_REPUBLISH, RETRY_PASS_NONE, 1,
       "orders.retry.1s"},
  };
  run_cases(&r, cases, sizeof cases / sizeof cases[0]);
  retry_plan u;
  retry_decide(&r, "orders", 6, -2, 0, &u);
  assert_true(u.count_untrusted);
  assert_int_equal(u.new_count, 1);
  retry_decide(&r, "orders", 6, (int64_t)UINT32_MAX - 2, 0, &u);
  assert_false(u.count_untrusted);
  assert_int_equal(u.action, RETRY_DEAD_LETTER);
  /* the first delivery's failure waits the first tier */
  retry_plan p;
  retry_decide(&r, "orders", 6, -1, 0, &p);
  assert_int_equal(p.attempt, 1);
  assert_int_equal(p.tier, 0);
  assert_int_equal(p.delay_ms, 1000);
}

/* max_attempts 6 with 3 tiers: the last tier repeats; still exactly 6
 * deliveries (5 failures republished, the 6th dead-lettered). */
static void test_last_tier_repeats(void **state) {
  (void)state;
  retry_rule r;
  retry_rule_default(&r);
  r.max_attempts = 6;
  static const decide_case cases[] = {
      {"q", -1, RETRY_REPUBLISH, RETRY_PASS_NONE, 1, "q.retry.1s"},
      {"q", 1, RETRY_REPUBLISH, RETRY_PASS_NONE, 2, "q.retry.2s"},
      {"q", 2, RETRY_REPUBLISH, RETRY_PASS_NONE, 3, "q.retry.4s"},
      {"q", 3, RETRY_REPUBLISH, RETRY_PASS_NONE, 4, "q.retry.4s"},
      {"q", 4, RETRY_REPUBLISH, RETRY_PASS_NONE, 5, "q.retry.4s"},
      {"q", 5, RETRY_DEAD_LETTER, RETRY_PASS_NONE, 6, "q.dlq"},
  };
  run_cases(&r, cases, sizeof cases / sizeof cases[0]);
  /* count deliveries of a poison message by following the plans */
  int64_t count = -1;
  int deliveries = 1;
  for (;;) {
    retry_plan p;
    retry_decide(&r, "q", 1, count, 0, &p);
    if (p.action != RETRY_REPUBLISH)
      break;
    count = p.new_count;
    deliveries++;
  }
  assert_int_equal(deliveries, 6);
}

static void test_edge_rules(void **state) {
  (void)state;
  retry_rule r;
  retry_rule_default(&r);
  r.max_attempts = 1; /* never retried */
  static const decide_case once[] = {
      {"q", -1, RETRY_DEAD_LETTER, RETRY_PASS_NONE, 1, "q.dlq"},
  };
  run_cases(&r, once, 1);
  retry_rule_default(&r);
  strcpy(r.dead_letter, "parking.{queue}.{queue}");
  r.tiers_ms[0] = 500;
  static const decide_case custom[] = {
      {"q", -1, RETRY_REPUBLISH, RETRY_PASS_NONE, 1, "q.retry.500ms"},
      {"q", 3, RETRY_DEAD_LETTER, RETRY_PASS_NONE, 4, "parking.q.q"},
  };
  run_cases(&r, custom, 2);
  retry_plan p;
  retry_decide(NULL, "q", 1, -1, 0, &p);
  assert_int_equal(p.action, RETRY_PASS);
  assert_int_equal(p.reason, RETRY_PASS_NO_POLICY);
  assert_string_equal(retry_pass_reason_str(p.reason),
                      "no policy for the queue");
}

/* Names over the broker's 255-byte limit are shortened, deterministically
 * and distinctly: a prefix of the queue name (never cutting UTF-8), '~' and
 * a hash of the whole name. */
static void test_name_limits(void **state) {
  (void)state;
  retry_rule r;
  retry_rule_default(&r);
  char q[256];
  memset(q, 'q', sizeof q);
  retry_plan p, p2;
  size_t fits = 255 - strlen(".retry.1s");
  retry_decide(&r, q, fits, -1, 0, &p);
  assert_int_equal(p.action, RETRY_REPUBLISH);
  assert_int_equal(p.target_len, 255);
  assert_null(strchr(p.target, '~')); /* fits: not touched */
  retry_decide(&r, q, fits + 1, -1, 0, &p);
  assert_int_equal(p.action, RETRY_REPUBLISH);
  assert_int_equal(p.target_len, 255);
  assert_string_equal(p.target + 255 - strlen(".retry.1s"), ".retry.1s");
  assert_int_equal(p.target[255 - strlen(".retry.1s") - 17], '~');
  assert_memory_equal(p.target, q, 255 - strlen(".retry.1s") - 17);
  /* the same name gives the same tier; another name of the same prefix
   * another one */
  retry_decide(&r, q, fits + 1, -1, 0, &p2);
  assert_string_equal(p.target, p2.target);
  q[fits] = 'x';
  retry_decide(&r, q, fits + 1, -1, 0, &p2);
  assert_int_equal(p2.target_len, 255);
  assert_string_not_equal(p.target, p2.target);
  q[fits] = 'q';
  retry_decide(&r, q, 251, 3, 0, &p); /* "q...q.dlq" = 255 */
  assert_int_equal(p.action, RETRY_DEAD_LETTER);
  assert_null(strchr(p.target, '~'));
  retry_decide(&r, q, 252, 3, 0, &p);
  assert_int_equal(p.action, RETRY_DEAD_LETTER);
  assert_int_equal(p.target_len, 255);
  assert_string_equal(p.target + 251, ".dlq");
  assert_int_equal(p.target[251 - 17], '~'); /* a prefix, then the hash */
  assert_memory_equal(p.target, q, 251 - 17);
  /* a cut never splits a UTF-8 sequence: 2-byte "é" across the cut */
  char u[256];
  for (size_t i = 0; i + 1 < sizeof u; i += 2)
    u[i] = (char)0xc3, u[i + 1] = (char)0xa9;
  retry_decide(&r, u, 254, -1, 0, &p);
  assert_int_equal(p.action, RETRY_REPUBLISH);
  size_t cut = (size_t)(strchr(p.target, '~') - p.target);
  assert_int_equal(cut % 2, 0);
  assert_true(p.target_len <= 255);
  /* a template that leaves no room for even the hash cannot be shortened */
  memset(r.dead_letter, 'd', 245);
  strcpy(r.dead_letter + 245, "{queue}");
  retry_decide(&r, q, 20, 3, 0, &p);
  assert_int_equal(p.action, RETRY_PASS);
  assert_int_equal(p.reason, RETRY_PASS_NAME_TOO_LONG);
}

static void test_match_first_rule_wins(void **state) {
  (void)state;
  retry_rule rules[2];
  retry_rule_default(&rules[0]);
  strcpy(rules[0].globs[0], "print.render*");
  strcpy(rules[0].globs[1], "billing");
  rules[0].nglobs = 2;
  retry_rule_default(&rules[1]);
  strcpy(rules[1].globs[0], "print.*");
  retry_policy p = {.rules = rules, .nrules = 2};
  strcpy(p.header_prefix, "rebound-");
  assert_ptr_equal(retry_match(&p, "print.render.eu", 15), &rules[0]);
  assert_ptr_equal(retry_match(&p, "billing", 7), &rules[0]);
  assert_ptr_equal(retry_match(&p, "print.label", 11), &rules[1]);
  assert_null(retry_match(&p, "orders", 6));
  char h[64];
  assert_int_equal(retry_header_name(&p, "retry-count", h, sizeof h), 19);
  assert_string_equal(h, "rebound-retry-count");
  assert_int_equal(retry_header_name(&p, "retry-count", h, 10), -1);
}

/* A backoff rule with `b` and `max_attempts`, compiled. */
static retry_rule backoff_rule(retry_backoff b, uint32_t max_attempts) {
  retry_rule r;
  char err[256];
  retry_rule_default(&r);
  r.backoff = b;
  r.max_attempts = max_attempts;
  if (retry_rule_compile(&r, err, sizeof err) != 0)
    fail_msg("compile: %s", err);
  return r;
}

/* The README's default backoff (1s x2 up to 10m, jitter 0.2, 4 buckets):
 * 11 levels (1s .. 512s, then 600s) of 4 tiers, each bucket's delay
 * within +-20% of its level's base, the buckets of a level distinct and
 * rising. */
static void test_backoff_levels(void **state) {
  (void)state;
  retry_backoff b;
  retry_backoff_default(&b);
  retry_rule r = backoff_rule(b, 100);
  assert_int_equal(r.nbuckets, 4);
  assert_int_equal(retry_levels(&r), 11);
  assert_int_equal(r.ntiers, 44);
  double base = 1000;
  for (unsigned l = 0; l<11; l++, base = base * 2> 600000 ? 600000 : base * 2) {
    for (unsigned i = 0; i < 4; i++) {
      uint32_t d = r.tiers_ms[l * 4 + i];
      if (d < base * 0.8 || d > base * 1.2)
        fail_msg("level %u bucket %u: %u ms, base %.0f", l, i, d, base);
      if (i && d <= r.tiers_ms[l * 4 + i - 1])
        fail_msg("level %u: bucket %u not above the one before", l, i);
    }
  }
  assert_int_equal(r.tiers_ms[0], 850); /* 1s: 0.85 0.95 1.05 1.15 */
  assert_int_equal(r.tiers_ms[3], 1150);
  assert_int_equal(r.tiers_ms[43], 690000); /* 600s * 1.15 */
}

/* Levels stop at max_attempts - 1 (later attempts dead-letter), and at
 * the first that reaches max; a multiplier of 1 is one level. */
static void test_backoff_level_count(void **state) {
  (void)state;
  static const struct {
    uint32_t initial, max;
    double mult;
    unsigned buckets;
    uint32_t attempts;
    unsigned levels;
  } cases[] = {
      {1000, 600000, 2, 4, 3, 2},    {1000, 600000, 2, 4, 1, 1},
      {200, 800, 2, 4, 5, 3},        {200, 1000, 2, 4, 10, 4},
      {1000, 1000, 3, 2, 10, 1},     {500, 60000, 1, 3, 10, 1},
      {1000, 3600000, 10, 1, 99, 5}, {100, 100000, 1.5, 1, 99, 19},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    retry_backoff b = {cases[i].initial, cases[i].max, cases[i].mult, 0.1,
                       cases[i].buckets};
    retry_rule r = backoff_rule(b, cases[i].attempts);
    if (retry_levels(&r) != cases[i].levels ||
        r.ntiers != cases[i].levels * cases[i].buckets)
      fail_msg("case %zu: %u levels, %u tiers", i, retry_levels(&r), r.ntiers);
  }
}

/* The draw picks the bucket of the attempt's level (200ms +-25% in four:
 * 163, 188, 213, 238); past the last level
 * the last repeats; at max_attempts the dead-letter queue. */
static void test_backoff_decide(void **state) {
  (void)state;
  retry_backoff b = {200, 800, 2, 0.25, 4};
  retry_rule r = backoff_rule(b, 5);
  static const struct {
    int64_t count;
    uint32_t draw;
    const char *target;
  } cases[] = {
      {-1, 0, "q.retry.163ms"}, {-1, 1, "q.retry.188ms"},
      {-1, 5, "q.retry.188ms"}, {-1, 3, "q.retry.238ms"},
      {1, 2, "q.retry.425ms"},  {2, 0, "q.retry.650ms"},
      {2, 3, "q.retry.950ms"},  {3, 3, "q.retry.950ms"},
      {4, 3, "q.dlq"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    retry_plan p;
    retry_decide(&r, "q", 1, cases[i].count, cases[i].draw, &p);
    if (strcmp(p.target, cases[i].target) != 0)
      fail_msg("case %zu: '%s'", i, p.target);
  }
  /* a fixed list ignores the draw */
  retry_rule f;
  retry_rule_default(&f);
  assert_int_equal(retry_tier_for(&f, 1, 7), 1);
  assert_int_equal(retry_tier_for(&r, 1, 7), 7);
}

/* Every bad value is refused, naming it and the form expected. */
static void test_backoff_refused(void **state) {
  (void)state;
  static const struct {
    retry_backoff b;
    uint32_t attempts;
    const char *says;
  } cases[] = {
      {{1000, 500, 2, 0.2, 4}, 4, "max (500ms) must be at least initial"},
      {{1000, 5000, 0.5, 0.2, 4}, 4, "multiplier 0.5: expected"},
      {{1000, 5000, 2, 0.6, 4}, 4, "jitter 0.6: expected a fraction 0..0.5"},
      {{1000, 5000, 2, -0.1, 4}, 4, "jitter -0.1"},
      {{1000, 5000, 2, 0.2, 0}, 4, "buckets 0: expected"},
      {{1000, 5000, 2, 0.2, 9}, 4, "buckets 9"},
      {{1000, 86400000, 2, 0.2, 1}, 4, "exceeds 24h"},
      {{1, 86400000, 1.01, 0, 8}, 1000, "more than 64 tier queues"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    retry_rule r;
    char err[256] = "";
    retry_rule_default(&r);
    r.backoff = cases[i].b;
    r.max_attempts = cases[i].attempts;
    if (retry_rule_compile(&r, err, sizeof err) == 0 ||
        !strstr(err, cases[i].says))
      fail_msg("case %zu: '%s'", i, err);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_rule),
      cmocka_unit_test(test_backoff_levels),
      cmocka_unit_test(test_backoff_level_count),
      cmocka_unit_test(test_backoff_decide),
      cmocka_unit_test(test_backoff_refused),
      cmocka_unit_test(test_last_tier_repeats),
      cmocka_unit_test(test_edge_rules),
      cmocka_unit_test(test_queue_types),
      cmocka_unit_test(test_name_limits),
      cmocka_unit_test(test_match_first_rule_wins),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
