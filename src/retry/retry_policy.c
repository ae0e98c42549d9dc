#include "retry_policy.h"

#include <stdio.h>
#include <string.h>

#define MAX_DELAY_MS (24u * 3600u * 1000u)

static const struct unit {
  const char *suffix;
  uint32_t ms;
} units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};

#define MAX_DELAY_US ((uint64_t)MAX_DELAY_MS * 1000)

static bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

/* A number at s[*i] ("12", "1.5"), in millionths; -1 if there is none or
 * it is over the limit (the fraction's digits past the sixth are read and
 * dropped). */
static int64_t read_number(const char *s, size_t len, size_t *i) {
  uint64_t whole = 0, frac = 0, scale = 1000000;
  size_t start = *i;
  while (*i < len && is_digit(s[*i]) && whole <= MAX_DELAY_US)
    whole = whole * 10 + (uint64_t)(s[(*i)++] - '0');
  if (*i == start || whole > MAX_DELAY_US)
    return -1;
  if (*i < len && s[*i] == '.') {
    size_t dot = ++*i;
    for (; *i < len && is_digit(s[*i]); ++*i)
      if (scale > 1)
        frac += (uint64_t)(s[*i] - '0') * (scale /= 10);
    if (*i == dot)
      return -1;
  }
  return (int64_t)(whole * 1000000 + frac);
}

/* The unit at s[*i] in microseconds, or 0 for none. */
static uint64_t read_unit(const char *s, size_t len, size_t *i) {
  for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
    size_t sl = strlen(units[u].suffix);
    if (len - *i >= sl && memcmp(s + *i, units[u].suffix, sl) == 0 &&
        (*i + sl == len || !(s[*i + sl] >= 'a' && s[*i + sl] <= 'z'))) {
      *i += sl;
      return (uint64_t)units[u].ms * 1000;
    }
  }
  return 0;
}

int retry_duration_parse(const char *s, size_t len, uint32_t *ms) {
  uint64_t us = 0; /* microseconds */
  size_t i = 0;
  while (i < len) {
    int64_t n = read_number(s, len, &i);
    if (n < 0)
      return -1;
    uint64_t unit = read_unit(s, len, &i);
    if (!unit && !(i == len && us == 0))
      return -1; /* a bare number is seconds, alone */
    if (!unit)
      unit = 1000000;
    if ((uint64_t)n > (MAX_DELAY_US - us) * 1000000 / unit)
      return -1;
    us += (uint64_t)n * unit / 1000000;
  }
  if (len == 0)
    return -1;
  *ms = (uint32_t)((us + 500) / 1000);
  return *ms <= MAX_DELAY_MS ? 0 : -1;
}

int retry_delay_parse(const char *s, size_t len, uint32_t *ms) {
  uint32_t v;
  if (retry_duration_parse(s, len, &v) != 0 || v == 0)
    return -1;
  *ms = v;
  return 0;
}

int retry_delay_format(uint32_t ms, char *out, size_t cap) {
  size_t u = sizeof units / sizeof units[0];
  while (--u > 0 && ms % units[u].ms != 0)
    ;
  int n =
      snprintf(out, cap, "%u%s", (unsigned)(ms / units[u].ms), units[u].suffix);
  return (n < 0 || (size_t)n >= cap) ? -1 : n;
}

bool retry_glob_match(const char *pattern, const char *name, size_t len) {
  const char *p = pattern, *star = NULL;
  size_t i = 0, mark = 0;

  while (i < len) {
    if (*p == '*') {
      star = p++;
      mark = i;
    } else if (*p && (*p == '?' || *p == name[i])) {
      p++;
      i++;
    } else if (star) {
      p = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (*p == '*')
    p++;
  return *p == '\0';
}
