#include "retry_policy.h"

#include <stdio.h>
#include <string.h>

#define MAX_DELAY_MS (24u * 3600u * 1000u)

static const struct unit {
  const char *suffix;
  uint32_t ms;
} units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};

int retry_delay_parse(const char *s, size_t len, uint32_t *ms) {
  uint64_t n = 0;
  size_t i = 0;

  while (i < len && s[i] >= '0' && s[i] <= '9' && n <= MAX_DELAY_MS)
    n = n * 10 + (uint64_t)(s[i++] - '0');
  if (i == 0 || n == 0)
    return -1;
  for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
    size_t sl = strlen(units[u].suffix);
    if (len - i == sl && memcmp(s + i, units[u].suffix, sl) == 0) {
      if (n > MAX_DELAY_MS / units[u].ms)
        return -1;
      *ms = (uint32_t)n * units[u].ms;
      return 0;
    }
  }
  return -1;
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
