#include "retry_plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "retry_policy.h"

const char *retry_pass_reason_str(retry_pass_reason r) {
  switch (r) {
#define RETRY__PASS_STR(name, text)                                            \
  case RETRY_PASS_##name:                                                      \
    return text;
    RETRY_PASS_MAP(RETRY__PASS_STR)
#undef RETRY__PASS_STR
  case RETRY_PASS_COUNT:
    break;
  }
  return "?";
}

int retry_queue_type_parse(const char *s, size_t len, retry_queue_type *out) {
  static const char *const names[] = {"auto", "quorum", "classic"};
  for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strlen(names[i]) == len && memcmp(names[i], s, len) == 0) {
      *out = (retry_queue_type)i;
      return 0;
    }
  return -1;
}

const char *retry_queue_type_str(retry_queue_type t) {
  return t == RETRY_QT_QUORUM    ? "quorum"
         : t == RETRY_QT_CLASSIC ? "classic"
                                 : "auto";
}

bool retry_use_quorum(retry_queue_type t, bool broker_quorum_dlx) {
  return t == RETRY_QT_QUORUM || (t == RETRY_QT_AUTO && broker_quorum_dlx);
}

void retry_rule_default(retry_rule *r) {
  memset(r, 0, sizeof *r);
  strcpy(r->globs[0], "*");
  r->nglobs = 1;
  r->tiers_ms[0] = 1000;
  r->tiers_ms[1] = 2000;
  r->tiers_ms[2] = 4000;
  r->ntiers = 3;
  r->max_attempts = 4;
  strcpy(r->dead_letter, "{queue}.dlq");
}

void retry_backoff_default(retry_backoff *b) {
  memset(b, 0, sizeof *b); /* padding too: configs compare bytewise */
  b->initial_ms = 1000;
  b->max_ms = 600000;
  b->multiplier = 2;
  b->jitter = 0.2;
  b->buckets = 4;
}

#define RETRY_DELAY_MAX_MS (24u * 3600 * 1000) /* as retry_delay_parse */

static int bad(char *err, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return -1;
}

static int check_backoff(const retry_backoff *b, char *err, size_t cap) {
  if (b->initial_ms == 0 || b->max_ms < b->initial_ms)
    return bad(err, cap,
               "backoff: max (%ums) must be at least initial, both "
               "delays like 500ms, 1s, 2m",
               (unsigned)b->max_ms);
  if (!(b->multiplier >= 1 && b->multiplier <= 100))
    return bad(err, cap, "backoff: multiplier %g: expected a number 1..100",
               b->multiplier);
  if (!(b->jitter >= 0 && b->jitter <= 0.5))
    return bad(err, cap, "backoff: jitter %g: expected a fraction 0..0.5",
               b->jitter);
  if (b->buckets < 1 || b->buckets > RETRY_MAX_BUCKETS)
    return bad(err, cap, "backoff: buckets %u: expected a whole number 1..8",
               b->buckets);
  if ((double)b->max_ms * (1 + b->jitter) > RETRY_DELAY_MAX_MS)
    return bad(err, cap, "backoff: max %ums plus jitter exceeds 24h",
               (unsigned)b->max_ms);
  return 0;
}

/* Bucket b of B spreads `base` over [base(1-j), base(1+j)]: the centres
 * of B equal slices. */
static uint32_t bucket_delay(double base, double jitter, unsigned b,
                             unsigned buckets) {
  double f = (2.0 * b + 1) / buckets - 1;
  double ms = base * (1 + jitter * f) + 0.5;
  return ms < 1 ? 1 : (uint32_t)ms;
}

int retry_rule_compile(retry_rule *r, char *err, size_t cap) {
  const retry_backoff *b = &r->backoff;
  if (!b->initial_ms)
    return 0;
  if (check_backoff(b, err, cap) != 0)
    return -1;
  unsigned most = r->max_attempts > 1 ? r->max_attempts - 1 : 1;
  unsigned levels = 0;
  double base = b->initial_ms;
  r->ntiers = 0;
  r->nbuckets = b->buckets;
  for (;;) {
    if (base > b->max_ms)
      base = b->max_ms;
    if (r->ntiers + b->buckets > RETRY_MAX_TIERS)
      return bad(err, cap,
                 "backoff: more than %d tier queues before max is reached "
                 "(raise multiplier or initial, lower buckets or "
                 "max_attempts)",
                 RETRY_MAX_TIERS);
    for (unsigned i = 0; i < b->buckets; i++)
      r->tiers_ms[r->ntiers++] = bucket_delay(base, b->jitter, i, b->buckets);
    levels++;
    if (base >= b->max_ms || levels >= most || b->multiplier == 1)
      return 0;
    base *= b->multiplier;
  }
}

const retry_rule *retry_match(const retry_policy *p, const char *queue,
                              size_t len) {
  for (unsigned i = 0; i < p->nrules; i++)
    for (unsigned g = 0; g < p->rules[i].nglobs; g++)
      if (retry_glob_match(p->rules[i].globs[g], queue, len))
        return &p->rules[i];
  return NULL;
}

/* 64-bit FNV-1a of the whole queue name: what tells two shortened names
 * apart. */
static uint64_t name_hash(const char *s, size_t len) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < len; i++)
    h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

/* The longest prefix of s[0..len) of at most `max` bytes that does not
 * cut a UTF-8 sequence (the broker refuses invalid UTF-8 names). */
static size_t utf8_prefix(const char *s, size_t len, size_t max) {
  size_t n = len < max ? len : max;
  while (n > 0 && n < len && ((unsigned char)s[n] & 0xc0) == 0x80)
    n--;
  return n;
}

/* Expand `tmpl` ("{queue}" stands for the queue name) into `out`. When the
 * result would pass RETRY_NAME_MAX, every "{queue}" becomes a prefix of the
 * name, '~' and 16 hex digits of its hash, the prefix as long as still
 * fits. -1 only if even that cannot fit. */
static int expand_name(const char *tmpl, const char *queue, size_t len,
                       char *out, size_t cap) {
  static const char token[] = "{queue}";
  enum { HASHED = 17 }; /* "~" and 16 hex digits */
  const size_t tlen = sizeof token - 1;
  size_t fixed = 0, uses = 0;
  for (const char *p = tmpl; *p;) {
    if (strncmp(p, token, tlen) == 0)
      uses++, p += tlen;
    else
      fixed++, p++;
  }
  if (fixed > RETRY_NAME_MAX)
    return -1;
  size_t keep = len;
  char tail[HASHED + 1] = "";
  if (uses && len > (RETRY_NAME_MAX - fixed) / uses) {
    size_t room = (RETRY_NAME_MAX - fixed) / uses;
    if (room <= HASHED)
      return -1;
    keep = utf8_prefix(queue, len, room - HASHED);
    snprintf(tail, sizeof tail, "~%016llx",
             (unsigned long long)name_hash(queue, len));
  }
  size_t o = 0, piece = keep + strlen(tail);
  for (const char *p = tmpl; *p;) {
    if (strncmp(p, token, tlen) == 0) {
      if (piece >= cap - o)
        return -1;
      memcpy(out + o, queue, keep);
      memcpy(out + o + keep, tail, piece - keep);
      o += piece;
      p += tlen;
    } else {
      if (o + 1 >= cap)
        return -1;
      out[o++] = *p++;
    }
  }
  out[o] = '\0';
  return o > RETRY_NAME_MAX ? -1 : (int)o;
}

int retry_tier_name(const retry_rule *rule, unsigned tier, const char *queue,
                    size_t len, char *out, size_t cap) {
  char delay[16], tmpl[32];
  if (tier >= rule->ntiers ||
      retry_delay_format(rule->tiers_ms[tier], delay, sizeof delay) < 0)
    return -1;
  snprintf(tmpl, sizeof tmpl, "{queue}.retry.%s", delay);
  return expand_name(tmpl, queue, len, out, cap);
}

int retry_dlq_name(const retry_rule *rule, const char *queue, size_t len,
                   char *out, size_t cap) {
  return expand_name(rule->dead_letter, queue, len, out, cap);
}

int retry_header_name(const retry_policy *p, const char *suffix, char *out,
                      size_t cap) {
  int n = snprintf(out, cap, "%s%s", p->header_prefix, suffix);
  return (n < 0 || (size_t)n >= cap || n > RETRY_NAME_MAX) ? -1 : n;
}

unsigned retry_levels(const retry_rule *r) {
  return r->nbuckets > 1 ? r->ntiers / r->nbuckets : r->ntiers;
}

unsigned retry_tier_for(const retry_rule *rule, int64_t count, uint32_t draw) {
  uint64_t k = count > 0 ? (uint64_t)count + 1 : 1;
  unsigned levels = retry_levels(rule);
  unsigned level = (unsigned)((k < levels ? k : levels) - 1);
  if (rule->nbuckets <= 1)
    return level;
  return level * rule->nbuckets + draw % rule->nbuckets;
}

static void pass(retry_plan *plan, retry_pass_reason why) {
  plan->action = RETRY_PASS;
  plan->reason = why;
}

void retry_decide(const retry_rule *rule, const char *queue, size_t len,
                  int64_t count, uint32_t draw, retry_plan *plan) {
  memset(plan, 0, sizeof *plan);
  if (!rule) {
    pass(plan, RETRY_PASS_NO_POLICY);
    return;
  }
  if (len >= 4 && memcmp(queue, "amq.", 4) == 0) {
    pass(plan, RETRY_PASS_SERVER_NAMED);
    return;
  }
  if (count < -1 || count >= UINT32_MAX - 1) {
    plan->count_untrusted = true; /* a first attempt: the copy counts on */
    count = -1;
  }
  uint32_t k = count < 0 ? 1 : (uint32_t)count + 1;
  plan->attempt = k;
  plan->new_count = k;
  int n;
  if (k >= rule->max_attempts || rule->ntiers == 0) {
    plan->action = RETRY_DEAD_LETTER;
    n = retry_dlq_name(rule, queue, len, plan->target, sizeof plan->target);
  } else {
    plan->action = RETRY_REPUBLISH;
    plan->tier = retry_tier_for(rule, count, draw);
    plan->delay_ms = rule->tiers_ms[plan->tier];
    n = retry_tier_name(rule, plan->tier, queue, len, plan->target,
                        sizeof plan->target);
  }
  if (n < 0) {
    pass(plan, RETRY_PASS_NAME_TOO_LONG);
    return;
  }
  plan->target_len = (size_t)n;
}
