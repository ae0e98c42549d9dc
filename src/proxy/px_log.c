#include "px_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static px_log_level min_level = PX_LOG_INFO;
static const char *const names[] = {"debug", "info", "warn", "error"};

void px_log_set_level(px_log_level level) {
  min_level = level;
}

int px_log_level_parse(const char *s, px_log_level *out) {
  for (int i = 0; i < 4; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = (px_log_level)i;
      return 0;
    }
  return -1;
}

char *px_log_quote(char *out, size_t cap, const char *s, size_t len) {
  size_t o = 0;
  if (cap < 3) {
    if (cap)
      out[0] = '\0';
    return out;
  }
  out[o++] = '"';
  for (size_t i = 0; s && i < len && s[i]; i++) {
    unsigned char ch = (unsigned char)s[i];
    char esc[5];
    int n;
    if (ch == '"' || ch == '\\')
      n = snprintf(esc, sizeof esc, "\\%c", ch);
    else if (ch < 0x20 || ch == 0x7f)
      n = snprintf(esc, sizeof esc, "\\x%02x", ch);
    else
      n = snprintf(esc, sizeof esc, "%c", ch);
    if (o + (size_t)n + 2 > cap)
      break;
    memcpy(out + o, esc, (size_t)n);
    o += (size_t)n;
  }
  out[o++] = '"';
  out[o] = '\0';
  return out;
}

void px_log(px_log_level level, const char *msg, const char *fmt, ...) {
  char line[1024];
  struct timeval tv;
  struct tm tm;
  size_t n;
  va_list ap;

  if (level < min_level)
    return;
  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  n = strftime(line, sizeof line, "ts=%Y-%m-%dT%H:%M:%S", &tm);
  n += (size_t)snprintf(line + n, sizeof line - n, ".%03dZ level=%s msg=%s",
                        (int)(tv.tv_usec / 1000), names[level], msg);
  if (fmt && *fmt && n < sizeof line - 1) {
    line[n++] = ' ';
    va_start(ap, fmt);
    int k = vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    n = k < 0 ? n : n + (size_t)k;
  }
  if (n > sizeof line - 2)
    n = sizeof line - 2;
  line[n++] = '\n';
  fwrite(line, 1, n, stderr);
}
