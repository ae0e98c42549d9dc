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
    retry_decide(rule, c->queue, strlen(c->queue), c->count, &p);
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
      {"orders", -2, RETRY_PASS, RETRY_PASS_BAD_COUNT, 0, ""},
  };
  run_cases(&r, cases, sizeof cases / sizeof cases[0]);
  /* the first delivery's failure waits the first tier */
  retry_plan p;
  retry_decide(&r, "orders", 6, -1, &p);
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
    retry_decide(&r, "q", 1, count, &p);
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
  retry_decide(NULL, "q", 1, -1, &p);
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
  retry_decide(&r, q, fits, -1, &p);
  assert_int_equal(p.action, RETRY_REPUBLISH);
  assert_int_equal(p.target_len, 255);
  assert_null(strchr(p.target, '~')); /* fits: not touched */
  retry_decide(&r, q, fits + 1, -1, &p);
  assert_int_equal(p.action, RETRY_REPUBLISH);
  assert_int_equal(p.target_len, 255);
  assert_string_equal(p.target + 255 - strlen(".retry.1s"), ".retry.1s");
  assert_int_equal(p.target[255 - strlen(".retry.1s") - 17], '~');
  assert_memory_equal(p.target, q, 255 - strlen(".retry.1s") - 17);
  /* the same name gives the same tier; another name of the same prefix
   * another one */
  retry_decide(&r, q, fits + 1, -1, &p2);
  assert_string_equal(p.target, p2.target);
  q[fits] = 'x';
  retry_decide(&r, q, fits + 1, -1, &p2);
  assert_int_equal(p2.target_len, 255);
  assert_string_not_equal(p.target, p2.target);
  q[fits] = 'q';
  retry_decide(&r, q, 251, 3, &p); /* "q...q.dlq" = 255 */
  assert_int_equal(p.action, RETRY_DEAD_LETTER);
  assert_null(strchr(p.target, '~'));
  retry_decide(&r, q, 252, 3, &p);
  assert_int_equal(p.action, RETRY_DEAD_LETTER);
  assert_int_equal(p.target_len, 255);
  assert_string_equal(p.target + 251, ".dlq");
  assert_int_equal(p.target[251 - 17], '~'); /* a prefix, then the hash */
  assert_memory_equal(p.target, q, 251 - 17);
  /* a cut never splits a UTF-8 sequence: 2-byte "é" across the cut */
  char u[256];
  for (size_t i = 0; i + 1 < sizeof u; i += 2)
    u[i] = (char)0xc3, u[i + 1] = (char)0xa9;
  retry_decide(&r, u, 254, -1, &p);
  assert_int_equal(p.action, RETRY_REPUBLISH);
  size_t cut = (size_t)(strchr(p.target, '~') - p.target);
  assert_int_equal(cut % 2, 0);
  assert_true(p.target_len <= 255);
  /* a template that leaves no room for even the hash cannot be shortened */
  memset(r.dead_letter, 'd', 245);
  strcpy(r.dead_letter + 245, "{queue}");
  retry_decide(&r, q, 20, 3, &p);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_rule),
      cmocka_unit_test(test_last_tier_repeats),
      cmocka_unit_test(test_edge_rules),
      cmocka_unit_test(test_queue_types),
      cmocka_unit_test(test_name_limits),
      cmocka_unit_test(test_match_first_rule_wins),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
