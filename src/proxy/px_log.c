#include "px_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static px_log_level min_level = PX_LOG_INFO;
static px_log_format format = PX_LOG_TEXT;

void px_log_set_format(px_log_format f) {
  format = f;
}
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

/* Append `s` (n bytes) as a JSON string body (no quotes). */
static size_t json_str(char *out, size_t o, size_t cap, const char *s,
                       size_t n) {
  for (size_t i = 0; i < n && o + 8 < cap; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\')
      o += (size_t)snprintf(out + o, cap - o, "\\%c", ch);
    else if (ch < 0x20)
      o += (size_t)snprintf(out + o, cap - o, "\\u%04x", ch);
    else
      out[o++] = (char)ch;
  }
  return o;
}

/* Turn the logfmt pairs of `kv` into JSON members: `key=value` or
 * `key="quoted \"value\""`; every value becomes a JSON string. */
static size_t json_pairs(char *out, size_t o, size_t cap, const char *kv) {
  const char *p = kv;
  while (*p && o + 16 < cap) {
    while (*p == ' ')
      p++;
    const char *eq = strchr(p, '=');
    if (!*p || !eq)
      break;
    out[o++] = ',';
    out[o++] = '"';
    o = json_str(out, o, cap, p, (size_t)(eq - p));
    o += (size_t)snprintf(out + o, cap - o, "\":\"");
    p = eq + 1;
    if (*p == '"') {
      char val[1024];
      size_t v = 0;
      for (p++; *p && *p != '"' && v < sizeof val - 1; p++) {
        if (*p == '\\' && p[1] == 'x' && p[2] && p[3]) {
          unsigned x;
          if (sscanf(p + 2, "%2x", &x) == 1)
            val[v++] = (char)x;
          p += 3;
        } else if (*p == '\\' && p[1]) {
          val[v++] = *++p;
        } else {
          val[v++] = *p;
        }
      }
      if (*p == '"')
        p++;
      o = json_str(out, o, cap, val, v);
    } else {
      const char *end = strchr(p, ' ');
      size_t n = end ? (size_t)(end - p) : strlen(p);
      o = json_str(out, o, cap, p, n);
      p += n;
    }
    if (o + 2 < cap)
      out[o++] = '"';
  }
  return o;
}

void px_log(px_log_level level, const char *msg, const char *fmt, ...) {
  char kv[1024], line[2048], ts[40];
  struct timeval tv;
  struct tm tm;
  size_t n = 0;
  va_list ap;

  if (level < min_level)
    return;
  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  size_t t = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(ts + t, sizeof ts - t, ".%03dZ", (int)(tv.tv_usec / 1000));
  kv[0] = '\0';
  if (fmt && *fmt) {
    va_start(ap, fmt);
    vsnprintf(kv, sizeof kv, fmt, ap);
    va_end(ap);
  }
  if (format == PX_LOG_JSON) {
    n = (size_t)snprintf(line, sizeof line,
                         "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"%s\"", ts,
                         names[level], msg);
    n = json_pairs(line, n, sizeof line - 2, kv);
    line[n++] = '}';
  } else {
    n = (size_t)snprintf(line, sizeof line, "ts=%s level=%s msg=%s%s%s", ts,
                         names[level], msg, kv[0] ? " " : "", kv);
    if (n > sizeof line - 2)
      n = sizeof line - 2;
  }
  line[n++] = '\n';
  fwrite(line, 1, n, stderr);
}
