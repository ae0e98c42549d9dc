/* px_log.c - typed key/value log lines, escaped at one place (px_log.h). */
#include "px_log.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_BYTES 8192
/* Room kept at the end of a line for the closing bytes and the marker of
 * dropped fields. */
#define LINE_RESERVE 32

static px_log_level min_level = PX_LOG_INFO;
static px_log_format format = PX_LOG_TEXT;
static const char *const names[] = {"debug", "info", "warn", "error"};
static int worker = -1;
#define WORKER_FIELDS_MAX 32 /* a call's fields, with "worker" in front */

void px_log_set_worker(int w) {
  worker = w;
}

void px_log_set_format(px_log_format f) {
  format = f;
}

int px_log_open_file(const char *path) {
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0)
    return errno;
  int rc = dup2(fd, STDERR_FILENO) < 0 ? errno : 0;
  close(fd);
  return rc;
}

void px_log_set_level(px_log_level level) {
  min_level = level;
}

int px_log_level_parse(const char *s, px_log_level *out) {
  for (int i = 0; i < 4; i++)
    if (strcasecmp(s, names[i]) == 0 ||
        (i == PX_LOG_WARN && strcasecmp(s, "warning") == 0)) {
      *out = (px_log_level)i;
      return 0;
    }
  return -1;
}

/* ---- an output buffer that never overflows ------------------------------ */

typedef struct out {
  char *p;
  size_t len, cap;
  bool full;
} out;

static void put(out *o, const char *s, size_t n) {
  if (o->full || n > o->cap - o->len) {
    o->full = true;
    return;
  }
  memcpy(o->p + o->len, s, n);
  o->len += n;
}

static void puts_(out *o, const char *s) {
  put(o, s, strlen(s));
}

/* ---- strings ----------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at p (n bytes left), 0 if invalid. */
static size_t utf8_len(const unsigned char *p, size_t n) {
  unsigned c = p[0];
  size_t len = c < 0x80                 ? 1
               : c >= 0xc2 && c <= 0xdf ? 2
               : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xf0 && c <= 0xf4 ? 4
                                        : 0;
  if (len == 0 || len > n)
    return 0;
  for (size_t i = 1; i < len; i++)
    if ((p[i] & 0xc0) != 0x80)
      return 0;
  if ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] > 0x9f) ||
      (c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] > 0x8f))
    return 0; /* overlong, surrogate, or past U+10FFFF */
  return len;
}

static bool bare_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || strchr("._:/@+-", c);
}

static bool text_bare(const unsigned char *s, size_t n) {
  if (n == 0)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!s[i] || !bare_char(s[i]))
      return false;
  return true;
}

/* One byte sequence of a string value, escaped for `fmt` into `esc`;
 * `*used` gets the input bytes it covers. Returns the bytes written. */
static size_t escape_one(px_log_format fmt, const unsigned char *s, size_t n,
                         char *esc, size_t *used) {
  unsigned char c = s[0];
  size_t u = utf8_len(s, n);
  *used = u ? u : 1;
  if (c == '"' || c == '\\')
    return (size_t)sprintf(esc, "\\%c", c);
  if (c == '\n' || c == '\r' || c == '\t')
    return (size_t)sprintf(esc, "\\%c",
                           c == '\n'   ? 'n'
                           : c == '\r' ? 'r'
                                       : 't');
  if (u == 0)
    return fmt == PX_LOG_JSON ? (size_t)sprintf(esc, "\\ufffd")
                              : (size_t)sprintf(esc, "\\x%02x", c);
  if (c < 0x20 || (c == 0x7f && fmt == PX_LOG_TEXT))
    return fmt == PX_LOG_JSON ? (size_t)sprintf(esc, "\\u%04x", c)
                              : (size_t)sprintf(esc, "\\x%02x", c);
  memcpy(esc, s, u);
  return u;
}

static void put_string(out *o, px_log_format fmt, const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)(str ? str : "");
  bool cut = n > PX_LOG_VALUE_MAX;
  if (cut)
    n = PX_LOG_VALUE_MAX;
  if (fmt == PX_LOG_TEXT && !cut && text_bare(s, n)) {
    put(o, (const char *)s, n);
    return;
  }
  put(o, "\"", 1);
  for (size_t i = 0; i < n;) {
    char esc[8];
    size_t used;
    put(o, esc, escape_one(fmt, s + i, n - i, esc, &used));
    i += used;
  }
  if (cut)
    put(o, "...", 3);
  put(o, "\"", 1);
}

/* ---- fields ------------------------------------------------------------- */

static void put_value(out *o, px_log_format fmt, const px_kv *kv) {
  char num[40];
  switch (kv->type) {
  case PX_KV_STR:
    put_string(o, fmt, kv->v.s, kv->v.s ? strlen(kv->v.s) : 0);
    return;
  case PX_KV_BYTES:
    put_string(o, fmt, kv->v.s, kv->v.s ? kv->len : 0);
    return;
  case PX_KV_U64:
    snprintf(num, sizeof num, "%llu", (unsigned long long)kv->v.u);
    break;
  case PX_KV_I64:
    snprintf(num, sizeof num, "%lld", (long long)kv->v.i);
    break;
  case PX_KV_F64:
    /* JSON has no NaN or infinity: a non-finite number is written as 0 */
    snprintf(num, sizeof num, "%.6g", isfinite(kv->v.f) ? kv->v.f : 0.0);
    break;
  case PX_KV_BOOL:
    snprintf(num, sizeof num, "%s", kv->v.u ? "true" : "false");
    break;
  }
  puts_(o, num);
}

static void put_field(out *o, px_log_format fmt, const char *key,
                      const px_kv *kv) {
  if (fmt == PX_LOG_JSON) {
    put(o, ",\"", 2);
    puts_(o, key);
    put(o, "\":", 2);
  } else {
    put(o, " ", 1);
    puts_(o, key);
    put(o, "=", 1);
  }
  put_value(o, fmt, kv);
}

size_t px_log_format_line(char *buf, size_t cap, px_log_format fmt,
                          const char *ts, px_log_level level, const char *msg,
                          const px_kv *kv, size_t n) {
  out o = {buf, 0, cap > LINE_RESERVE ? cap - LINE_RESERVE : 0, false};
  const px_kv head[] = {PX_S("ts", ts), PX_S("level", names[level]),
                        PX_S("msg", msg)};
  bool dropped = false;
  put(&o, fmt == PX_LOG_JSON ? "{" : "", fmt == PX_LOG_JSON);
  for (size_t i = 0; i < 3 + n && !dropped; i++) {
    const px_kv *f = i < 3 ? &head[i] : &kv[i - 3];
    size_t mark = o.len;
    if (i == 0 && fmt == PX_LOG_JSON) {
      put(&o, "\"ts\":", 5);
      put_value(&o, fmt, f);
    } else if (i == 0) {
      put(&o, "ts=", 3);
      put_value(&o, fmt, f);
    } else {
      put_field(&o, fmt, f->key, f);
    }
    if (o.full) { /* the field does not fit: end the line without it */
      o.len = mark;
      o.full = false;
      dropped = true;
    }
  }
  o.cap = cap; /* the reserve is for what follows */
  if (dropped) {
    const px_kv t = PX_BOOL("truncated", true);
    put_field(&o, fmt, "truncated", &t);
  }
  if (fmt == PX_LOG_JSON)
    put(&o, "}", 1);
  put(&o, "\n", 1);
  return o.len;
}

void px_log_kv(px_log_level level, const char *msg, const px_kv *kv, size_t n) {
  char line[LINE_MAX_BYTES], ts[40];
  struct timeval tv;
  struct tm tm;

  if (level < min_level)
    return;
  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  size_t t = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(ts + t, sizeof ts - t, ".%03dZ", (int)(tv.tv_usec / 1000));
  px_kv with[WORKER_FIELDS_MAX];
  if (worker >= 0 && n < WORKER_FIELDS_MAX) {
    with[0] = PX_U("worker", worker);
    memcpy(with + 1, kv, n * sizeof *kv);
    kv = with;
    n++;
  }
  size_t len =
      px_log_format_line(line, sizeof line, format, ts, level, msg, kv, n);
  fwrite(line, 1, len, stderr);
}

bool px_log_limit_pass(px_log_limit *l, uint64_t now_ms, uint64_t *unlogged) {
  if (l->any && now_ms - l->last_ms < PX_LOG_LIMIT_MS) {
    l->unlogged++;
    return false;
  }
  *unlogged = l->unlogged;
  l->unlogged = 0;
  l->last_ms = now_ms;
  l->any = true;
  return true;
}
