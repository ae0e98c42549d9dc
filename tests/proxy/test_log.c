/* px_log_format_line: hostile values cannot forge a field or a line.
 *
 * Exact lines for representative values in both formats, then a generated
 * batch of lines read back by a strict logfmt parser and a strict JSON
 * parser written here: every line must have exactly the fields given, in
 * order, and every value must come back (text: the very bytes; JSON: the
 * bytes with each byte of invalid UTF-8 read as U+FFFD).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "px_log.h"

#define TS "2026-01-02T03:04:05.678Z"
#define TEXT_HEAD "ts=" TS " level=warn msg=ev"
#define JSON_HEAD "{\"ts\":\"" TS "\",\"level\":\"warn\",\"msg\":\"ev\""

static char line[16384];

static const char *fmt_line(px_log_format f, const px_kv *kv, size_t n) {
  size_t len =
      px_log_format_line(line, sizeof line, f, TS, PX_LOG_WARN, "ev", kv, n);
  assert_true(len < sizeof line);
  line[len] = '\0';
  return line;
}

/* The line for one field `kv`, in format `f`. */
static const char *one(px_log_format f, px_kv kv) {
  return fmt_line(f, &kv, 1);
}

static void expect_text(px_kv kv, const char *value) {
  char want[4096];
  snprintf(want, sizeof want, TEXT_HEAD " %s=%s\n", kv.key, value);
  assert_string_equal(one(PX_LOG_TEXT, kv), want);
}

static void expect_json(px_kv kv, const char *value) {
  char want[4096];
  snprintf(want, sizeof want, JSON_HEAD ",\"%s\":%s}\n", kv.key, value);
  assert_string_equal(one(PX_LOG_JSON, kv), want);
}

/* ---- exact lines ----------------------------------------------------------
 */

static void test_text_exact(void **state) {
  (void)state;
  expect_text(PX_S("q", "orders.retry-1:x/y@z+w_"), "orders.retry-1:x/y@z+w_");
  expect_text(PX_S("q", ""), "\"\"");
  expect_text(PX_S("q", NULL), "\"\"");
  expect_text(PX_B("q", NULL, 5), "\"\"");
  expect_text(PX_S("q", "a\"b"), "\"a\\\"b\"");
  expect_text(PX_S("q", "a\\b"), "\"a\\\\b\"");
  expect_text(PX_S("q", "\\\""), "\"\\\\\\\"\"");
  expect_text(PX_S("q", "a=b"), "\"a=b\"");
  expect_text(PX_S("q", "a b"), "\"a b\"");
  expect_text(PX_S("q", "x\" level=error msg=forged"),
              "\"x\\\" level=error msg=forged\"");
  expect_text(PX_S("q", "a\nb\rc\td"), "\"a\\nb\\rc\\td\"");
  expect_text(PX_S("q", "\x01\x1b[31m\x1f"), "\"\\x01\\x1b[31m\\x1f\"");
  expect_text(PX_S("q", "del\x7f"), "\"del\\x7f\"");
  expect_text(PX_B("q", "a\0b", 3), "\"a\\x00b\"");
  expect_text(PX_B("q", "\0", 1), "\"\\x00\"");
  /* valid UTF-8 is kept as it is, quoted */
  expect_text(PX_S("q", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
              "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
  expect_text(PX_S("q", "\xf4\x8f\xbf\xbf\xef\xbf\xbf"),
              "\"\xf4\x8f\xbf\xbf\xef\xbf\xbf\""); /* U+10FFFF, U+FFFF */
  /* invalid UTF-8: every byte of it as \xHH */
  expect_text(PX_S("q", "\x80"), "\"\\x80\"");            /* stray */
  expect_text(PX_S("q", "a\xbf\xbf"), "\"a\\xbf\\xbf\""); /* stray */
  expect_text(PX_S("q", "\xe2\x82"), "\"\\xe2\\x82\"");   /* truncated */
  expect_text(PX_S("q", "\xe2\x82z"), "\"\\xe2\\x82z\""); /* truncated */
  expect_text(PX_S("q", "\xf0\x9f\x98"), "\"\\xf0\\x9f\\x98\"");
  expect_text(PX_S("q", "\xc3"), "\"\\xc3\"");
  expect_text(PX_S("q", "\xc0\xaf"), "\"\\xc0\\xaf\""); /* overlong '/' */
  expect_text(PX_S("q", "\xc1\xbf"), "\"\\xc1\\xbf\"");
  expect_text(PX_S("q", "\xe0\x80\xaf"), "\"\\xe0\\x80\\xaf\"");
  expect_text(PX_S("q", "\xf0\x80\x80\xaf"), "\"\\xf0\\x80\\x80\\xaf\"");
  expect_text(PX_S("q", "\xed\xa0\x80"), "\"\\xed\\xa0\\x80\""); /* D800 */
  expect_text(PX_S("q", "\xed\xbf\xbf"), "\"\\xed\\xbf\\xbf\""); /* DFFF */
  expect_text(PX_S("q", "\xf4\x90\x80\x80"),                     /* U+110000 */
              "\"\\xf4\\x90\\x80\\x80\"");
  expect_text(PX_S("q", "\xf5\x80\x80\x80"), "\"\\xf5\\x80\\x80\\x80\"");
  expect_text(PX_S("q", "\xf8\x88\x80\x80\x80"),
              "\"\\xf8\\x88\\x80\\x80\\x80\"");
  expect_text(PX_S("q", "\xfe\xff"), "\"\\xfe\\xff\"");
  /* numbers and booleans */
  expect_text(PX_U("n", UINT64_MAX), "18446744073709551615");
  expect_text(PX_U("n", 0), "0");
  expect_text(PX_I("n", INT64_MIN), "-9223372036854775808");
  expect_text(PX_I("n", -1), "-1");
  expect_text(PX_F("n", 1.5), "1.5");
  expect_text(PX_BOOL("b", 1), "true");
  expect_text(PX_BOOL("b", 0), "false");
}

static void test_json_exact(void **state) {
  (void)state;
  expect_json(PX_S("q", "orders"), "\"orders\"");
  expect_json(PX_S("q", ""), "\"\"");
  expect_json(PX_S("q", NULL), "\"\"");
  expect_json(PX_S("q", "a\"b"), "\"a\\\"b\"");
  expect_json(PX_S("q", "a\\b"), "\"a\\\\b\"");
  expect_json(PX_S("q", "a=b c"), "\"a=b c\"");
  expect_json(PX_S("q", "x\",\"level\":\"error"),
              "\"x\\\",\\\"level\\\":\\\"error\"");
  expect_json(PX_S("q", "a\nb\rc\td"), "\"a\\nb\\rc\\td\"");
  expect_json(PX_S("q", "\x01\x1b\x1f"), "\"\\u0001\\u001b\\u001f\"");
  expect_json(PX_S("q", "\b\f"), "\"\\u0008\\u000c\"");
  expect_json(PX_S("q", "del\x7f"), "\"del\x7f\""); /* DEL is valid JSON */
  expect_json(PX_B("q", "a\0b", 3), "\"a\\u0000b\"");
  expect_json(PX_S("q", "caf\xc3\xa9 \xf0\x9f\x98\x80"),
              "\"caf\xc3\xa9 \xf0\x9f\x98\x80\"");
  expect_json(PX_S("q", "\x80"), "\"\\ufffd\"");
  expect_json(PX_S("q", "\xe2\x82z"), "\"\\ufffd\\ufffdz\"");
  expect_json(PX_S("q", "\xc0\xaf"), "\"\\ufffd\\ufffd\"");
  expect_json(PX_S("q", "\xe0\x80\xaf"), "\"\\ufffd\\ufffd\\ufffd\"");
  expect_json(PX_S("q", "\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");
  expect_json(PX_S("q", "\xf4\x90\x80\x80"),
              "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
  expect_json(PX_S("q", "\xff"), "\"\\ufffd\"");
  expect_json(PX_U("n", UINT64_MAX), "18446744073709551615");
  expect_json(PX_I("n", INT64_MIN), "-9223372036854775808");
  expect_json(PX_F("n", 0.25), "0.25");
  expect_json(PX_F("n", NAN), "0");
  expect_json(PX_BOOL("b", 1), "true");
  expect_json(PX_BOOL("b", 0), "false");
}

/* A value is cut after PX_LOG_VALUE_MAX bytes of input, visibly. */
static void test_value_cut(void **state) {
  (void)state;
  static char big[PX_LOG_VALUE_MAX + 100], want[2 * PX_LOG_VALUE_MAX];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  snprintf(want, sizeof want, "\"%.*s...\"", PX_LOG_VALUE_MAX, big);
  expect_text(PX_S("q", big), want);
  expect_json(PX_S("q", big), want);
  /* exactly the limit: not cut, bare in text */
  big[PX_LOG_VALUE_MAX] = '\0';
  expect_text(PX_S("q", big), big);
  /* a cut in the middle of a sequence leaves its first bytes invalid */
  memset(big, 'a', sizeof big);
  memcpy(big + PX_LOG_VALUE_MAX - 1, "\xe2\x82\xac", 3);
  snprintf(want, sizeof want, "\"%.*s\\xe2...\"", PX_LOG_VALUE_MAX - 1, big);
  expect_text(PX_B("q", big, sizeof big), want);
  snprintf(want, sizeof want, "\"%.*s\\ufffd...\"", PX_LOG_VALUE_MAX - 1, big);
  expect_json(PX_B("q", big, sizeof big), want);
}

/* ---- a strict logfmt reader ---------------------------------------------- */

typedef struct field {
  char key[64];
  char *val; /* decoded bytes (malloc) */
  size_t len;
  bool quoted; /* text: was quoted; JSON: was a string */
} field;

typedef struct parsed {
  field f[64];
  size_t n;
} parsed;

static void parsed_free(parsed *p) {
  for (size_t i = 0; i < p->n; i++)
    free(p->f[i].val);
  p->n = 0;
}

static int hexval(int c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* Length of a well-formed UTF-8 sequence at s (n bytes), 0 if none: Unicode
 * 15, table 3-7, by ranges of the second byte. */
static size_t wellformed(const unsigned char *s, size_t n) {
  static const struct {
    unsigned char lo, hi, len, lo2, hi2;
  } rows[] = {
      {0x00, 0x7f, 1, 0, 0},       {0xc2, 0xdf, 2, 0x80, 0xbf},
      {0xe0, 0xe0, 3, 0xa0, 0xbf}, {0xe1, 0xec, 3, 0x80, 0xbf},
      {0xed, 0xed, 3, 0x80, 0x9f}, {0xee, 0xef, 3, 0x80, 0xbf},
      {0xf0, 0xf0, 4, 0x90, 0xbf}, {0xf1, 0xf3, 4, 0x80, 0xbf},
      {0xf4, 0xf4, 4, 0x80, 0x8f},
  };
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    if (s[0] < rows[r].lo || s[0] > rows[r].hi)
      continue;
    size_t len = rows[r].len;
    if (len > n)
      return 0;
    if (len > 1 && (s[1] < rows[r].lo2 || s[1] > rows[r].hi2))
      return 0;
    for (size_t i = 2; i < len; i++)
      if (s[i] < 0x80 || s[i] > 0xbf)
        return 0;
    return len;
  }
  return 0;
}

static bool key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

static bool bare_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || (c && strchr("._:/@+-", c));
}

static int parse_key(const char **pp, const char *end, char *key, char stop) {
  const char *p = *pp;
  size_t k = 0;
  while (p < end && key_char(*p) && k < 63)
    key[k++] = *p++;
  key[k] = '\0';
  if (k == 0 || p == end || *p != stop)
    return -1;
  *pp = p + 1;
  return 0;
}

/* One quoted logfmt value after its opening quote. */
static int text_quoted(const char **pp, const char *end, field *f) {
  const unsigned char *p = (const unsigned char *)*pp;
  const unsigned char *e = (const unsigned char *)end;
  char *v = malloc((size_t)(e - p) + 1);
  size_t o = 0;
  for (;;) {
    if (p == e)
      goto bad;
    if (*p == '"')
      break;
    if (*p == '\\') {
      if (e - p < 2)
        goto bad;
      unsigned char c = p[1];
      if (c == 'x') {
        int hi = e - p >= 4 ? hexval(p[2]) : -1;
        int lo = e - p >= 4 ? hexval(p[3]) : -1;
        if (hi < 0 || lo < 0)
          goto bad;
        v[o++] = (char)(hi * 16 + lo);
        p += 4;
        continue;
      }
      const char *from = "\"\\nrt", *to = "\"\\\n\r\t";
      const char *at = c ? strchr(from, c) : NULL;
      if (!at)
        goto bad;
      v[o++] = to[at - from];
      p += 2;
      continue;
    }
    size_t u = wellformed(p, (size_t)(e - p));
    if (u == 0 || *p < 0x20 || *p == 0x7f)
      goto bad; /* raw control bytes and invalid UTF-8 are escaped */
    memcpy(v + o, p, u);
    o += u;
    p += u;
  }
  f->val = v;
  f->len = o;
  f->quoted = true;
  *pp = (const char *)p + 1;
  return 0;
bad:
  free(v);
  return -1;
}

/* "key=value key=\"value\" ...\n", one space between fields, nothing else. */
static int logfmt_parse(const char *s, size_t len, parsed *out) {
  const char *p = s, *end = s + len;
  out->n = 0;
  if (len == 0 || s[len - 1] != '\n')
    return -1;
  end--; /* the newline */
  while (p < end) {
    if (out->n == 64)
      return -1;
    field *f = &out->f[out->n];
    if (out->n > 0 && *p++ != ' ')
      return -1;
    if (parse_key(&p, end, f->key, '=') != 0)
      return -1;
    if (p < end && *p == '"') {
      p++;
      if (text_quoted(&p, end, f) != 0)
        return -1;
    } else {
      const char *v = p;
      while (p < end && bare_char(*p))
        p++;
      if (p == v)
        return -1;
      f->len = (size_t)(p - v);
      f->val = malloc(f->len + 1);
      memcpy(f->val, v, f->len);
      f->val[f->len] = '\0'; /* read as a C string */
      f->quoted = false;
    }
    out->n++;
    if (p < end && *p != ' ')
      return -1;
  }
  return out->n > 0 ? 0 : -1;
}

/* ---- a strict JSON reader (one flat object per line) -------------------- */

static size_t put_utf8(char *o, uint32_t cp) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xc0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xe0 | cp >> 12);
    o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
    o[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  o[0] = (char)(0xf0 | cp >> 18);
  o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
  o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
  o[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

static int hex4(const unsigned char *p, const unsigned char *e, uint32_t *cp) {
  *cp = 0;
  if (e - p < 4)
    return -1;
  for (int i = 0; i < 4; i++) {
    int h = hexval(p[i]);
    if (h < 0)
      return -1;
    *cp = *cp * 16 + (uint32_t)h;
  }
  return 0;
}

/* A JSON string after its opening quote, into f (UTF-8). Lone surrogates
 * are refused: the value must be Unicode text. */
static int json_string(const char **pp, const char *end, field *f) {
  const unsigned char *p = (const unsigned char *)*pp;
  const unsigned char *e = (const unsigned char *)end;
  char *v = malloc((size_t)(e - p) * 2 + 4);
  size_t o = 0;
  for (;;) {
    if (p == e)
      goto bad;
    if (*p == '"')
      break;
    if (*p == '\\') {
      if (e - p < 2)
        goto bad;
      unsigned char c = p[1];
      p += 2;
      if (c == 'u') {
        uint32_t cp, lo;
        if (hex4(p, e, &cp) != 0)
          goto bad;
        p += 4;
        if (cp >= 0xdc00 && cp <= 0xdfff)
          goto bad;
        if (cp >= 0xd800 && cp <= 0xdbff) {
          if (e - p < 6 || p[0] != '\\' || p[1] != 'u' ||
              hex4(p + 2, e, &lo) != 0 || lo < 0xdc00 || lo > 0xdfff)
            goto bad;
          p += 6;
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        o += put_utf8(v + o, cp);
        continue;
      }
      const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
      const char *at = c ? strchr(from, c) : NULL;
      if (!at)
        goto bad;
      v[o++] = to[at - from];
      continue;
    }
    size_t u = wellformed(p, (size_t)(e - p));
    if (u == 0 || *p < 0x20)
      goto bad;
    memcpy(v + o, p, u);
    o += u;
    p += u;
  }
  f->val = v;
  f->len = o;
  f->quoted = true;
  *pp = (const char *)p + 1;
  return 0;
bad:
  free(v);
  return -1;
}

/* A JSON number, true, false or null, kept as its text. */
static int json_scalar(const char **pp, const char *end, field *f) {
  const char *p = *pp, *start = p;
  static const char *const words[] = {"true", "false", "null"};
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(words[i]);
    if ((size_t)(end - p) >= n && memcmp(p, words[i], n) == 0) {
      p += n;
      goto done;
    }
  }
  if (p < end && *p == '-')
    p++;
  if (p < end && *p == '0')
    p++;
  else if (p < end && *p >= '1' && *p <= '9')
    while (p < end && *p >= '0' && *p <= '9')
      p++;
  else
    return -1;
  if (p < end && *p == '.') {
    const char *d = ++p;
    while (p < end && *p >= '0' && *p <= '9')
      p++;
    if (p == d)
      return -1;
  }
  if (p < end && (*p == 'e' || *p == 'E')) {
    p++;
    if (p < end && (*p == '+' || *p == '-'))
      p++;
    const char *d = p;
    while (p < end && *p >= '0' && *p <= '9')
      p++;
    if (p == d)
      return -1;
  }
done:
  f->len = (size_t)(p - start);
  f->val = malloc(f->len + 1);
  memcpy(f->val, start, f->len);
  f->val[f->len] = '\0';
  f->quoted = false;
  *pp = p;
  return 0;
}

/* {"key":value,...}\n with no white space (rebound writes none). */
static int json_parse(const char *s, size_t len, parsed *out) {
  const char *p = s, *end = s + len;
  out->n = 0;
  if (len < 3 || s[0] != '{' || s[len - 1] != '\n' || s[len - 2] != '}')
    return -1;
  p++;
  end -= 2;
  while (p < end) {
    if (out->n == 64)
      return -1;
    field *f = &out->f[out->n];
    if (out->n > 0 && *p++ != ',')
      return -1;
    if (p == end || *p++ != '"' || parse_key(&p, end, f->key, '"') != 0)
      return -1;
    if (p == end || *p++ != ':' || p == end)
      return -1;
    int rc =
        *p == '"' ? (p++, json_string(&p, end, f)) : json_scalar(&p, end, f);
    if (rc != 0)
      return -1;
    out->n++;
    if (p < end && *p != ',')
      return -1;
  }
  return out->n > 0 ? 0 : -1;
}

/* ---- what a value must read back as ---------------------------------------
 */

/* The input bytes of a string value as the format must show them: cut after
 * PX_LOG_VALUE_MAX with "..." added; for JSON each byte of invalid UTF-8
 * becomes U+FFFD. Returns the length written to `out`. */
static size_t expected_string(px_log_format f, const char *s, size_t n,
                              char *out) {
  const unsigned char *u = (const unsigned char *)(s ? s : "");
  bool cut = n > PX_LOG_VALUE_MAX;
  size_t o = 0;
  if (cut)
    n = PX_LOG_VALUE_MAX;
  for (size_t i = 0; i < n;) {
    size_t k = f == PX_LOG_JSON ? wellformed(u + i, n - i) : 1;
    if (k == 0) {
      o += put_utf8(out + o, 0xfffd);
      i++;
    } else {
      memcpy(out + o, u + i, k);
      o += k;
      i += k;
    }
  }
  if (cut) {
    memcpy(out + o, "...", 3);
    o += 3;
  }
  return o;
}

static void check_value(px_log_format f, const px_kv *kv, const field *got) {
  static char want[4 * PX_LOG_VALUE_MAX + 8];
  char num[64];
  size_t n;
  switch (kv->type) {
  case PX_KV_STR:
  case PX_KV_BYTES:
    n = kv->type == PX_KV_STR ? (kv->v.s ? strlen(kv->v.s) : 0) : kv->len;
    n = expected_string(f, kv->v.s, kv->v.s ? n : 0, want);
    assert_true(got->quoted || f == PX_LOG_TEXT);
    assert_int_equal(got->len, n);
    assert_memory_equal(got->val, want, n);
    return;
  case PX_KV_U64:
    assert_false(got->quoted);
    assert_int_equal(strtoull(got->val, NULL, 10), kv->v.u);
    snprintf(num, sizeof num, "%llu", (unsigned long long)kv->v.u);
    break;
  case PX_KV_I64:
    assert_false(got->quoted);
    snprintf(num, sizeof num, "%lld", (long long)kv->v.i);
    break;
  case PX_KV_F64: {
    assert_false(got->quoted);
    double want_f = isnan(kv->v.f) ? 0.0 : kv->v.f;
    double g = strtod(got->val, NULL);
    assert_true(fabs(g - want_f) <= 1e-5 * fabs(want_f));
    return;
  }
  case PX_KV_BOOL:
    assert_false(got->quoted);
    snprintf(num, sizeof num, "%s", kv->v.u ? "true" : "false");
    break;
  }
  assert_int_equal(got->len, strlen(num));
  assert_memory_equal(got->val, num, got->len);
}

/* A parsed line holds ts, level, msg, then the first fields of kv in order
 * and, when some did not fit, truncated=true instead of the rest. */
static void check_line(px_log_format f, const parsed *p, const char *msg,
                       px_log_level level, const px_kv *kv, size_t n) {
  static const char *const levels[] = {"debug", "info", "warn", "error"};
  const px_kv head[3] = {PX_S("ts", TS), PX_S("level", levels[level]),
                         PX_S("msg", msg)};
  assert_true(p->n >= 3);
  size_t shown = p->n - 3;
  /* no key given here is "truncated" */
  bool truncated = shown > 0 && strcmp(p->f[p->n - 1].key, "truncated") == 0;
  if (truncated) {
    shown--;
    assert_false(p->f[p->n - 1].quoted);
    assert_memory_equal(p->f[p->n - 1].val, "true", 4);
    assert_true(shown < n);
  } else {
    assert_int_equal(shown, n);
  }
  for (size_t i = 0; i < 3 + shown; i++) {
    const px_kv *want = i < 3 ? &head[i] : &kv[i - 3];
    assert_string_equal(p->f[i].key, want->key);
    check_value(f, want, &p->f[i]);
  }
}

/* ---- a generated batch ------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 32) % n;
}

/* Hostile bytes, hostile sequences and a few harmless ones. */
static size_t gen_string(char *out, size_t cap, bool nul_ok) {
  static const char *const pieces[] = {"\"",
                                       "\\",
                                       "=",
                                       " ",
                                       "\n",
                                       "\r",
                                       "\t",
                                       "\x01",
                                       "\x1b",
                                       "\x1f",
                                       "\x7f",
                                       "\x80",
                                       "\xbf",
                                       "\xc0\xaf",
                                       "\xc1",
                                       "\xc2",
                                       "\xc3\xa9",
                                       "\xe2\x82",
                                       "\xe2\x82\xac",
                                       "\xe0\x80\xaf",
                                       "\xed\xa0\x80",
                                       "\xed\x9f\xbf",
                                       "\xef\xbf\xbf",
                                       "\xf0\x9f\x98\x80",
                                       "\xf0\x9f\x98",
                                       "\xf4\x8f\xbf\xbf",
                                       "\xf4\x90\x80\x80",
                                       "\xf5",
                                       "\xfe",
                                       "\xff",
                                       " level=error",
                                       " msg=forged",
                                       "\",\"level\":\"error",
                                       "\\x41",
                                       "\\u0041",
                                       "a",
                                       "Z",
                                       "9",
                                       ".",
                                       "-",
                                       "_",
                                       "orders",
                                       "{queue}"};
  size_t len = rnd(8) == 0    ? PX_LOG_VALUE_MAX - 8 + rnd(16)
               : rnd(16) == 0 ? 1500
                              : rnd(24);
  size_t o = 0;
  while (o < len && o + 16 < cap) {
    if (nul_ok && rnd(20) == 0) {
      out[o++] = '\0';
      continue;
    }
    if (rnd(10) == 0) {
      out[o++] = (char)(1 + rnd(255));
      continue;
    }
    const char *p = pieces[rnd(sizeof pieces / sizeof pieces[0])];
    size_t k = strlen(p);
    memcpy(out + o, p, k);
    o += k;
  }
  out[o] = '\0';
  return o;
}

static void gen_field(px_kv *kv, char *key, char *buf, size_t cap) {
  switch (rnd(8)) {
  case 0:
    *kv = PX_U(key,
               ((uint64_t)rnd(UINT32_MAX) << 32 | rnd(UINT32_MAX)) >> rnd(64));
    break;
  case 1:
    *kv = PX_I(key, (int64_t)rnd(UINT32_MAX) -
                        (int64_t)rnd(UINT32_MAX) * (rnd(2) ? 1 : 0x7fffffff));
    break;
  case 2: {
    static const double vals[] = {0.0, -0.5, 1e-9, 123456.75, -3.25e17, NAN};
    *kv = PX_F(key, vals[rnd(6)]);
    break;
  }
  case 3:
    *kv = PX_BOOL(key, rnd(2));
    break;
  case 4:
  case 5:
    gen_string(buf, cap, false);
    *kv = PX_S(key, buf);
    break;
  default:
    *kv = PX_B(key, buf, gen_string(buf, cap, true));
    break;
  }
}

static void batch(px_log_format f, int lines) {
  static char bufs[12][2048], keys[12][16], out[9000];
  static const char *const msgs[] = {"retry_published", "session_close",
                                     "broker_close", "ev"};
  px_kv kv[12];
  parsed p;
  int truncated_lines = 0;
  for (int l = 0; l < lines; l++) {
    size_t n = rnd(13);
    for (size_t i = 0; i < n; i++) {
      snprintf(keys[i], sizeof keys[i], "k%zu", i);
      gen_field(&kv[i], keys[i], bufs[i], sizeof bufs[i]);
    }
    const char *msg = msgs[rnd(4)];
    px_log_level level = (px_log_level)rnd(4);
    /* mostly the size px_log_kv uses, sometimes a short line */
    size_t cap = rnd(4) ? 8192 : 256 + rnd(2048);
    memset(out, 0xa5, sizeof out);
    size_t len = px_log_format_line(out, cap, f, TS, level, msg, kv, n);
    assert_true(len <= cap);
    for (size_t i = cap; i < sizeof out; i++)
      assert_int_equal((unsigned char)out[i], 0xa5);
    assert_ptr_equal(memchr(out, '\n', len), out + len - 1);
    int rc = f == PX_LOG_JSON ? json_parse(out, len, &p)
                              : logfmt_parse(out, len, &p);
    if (rc != 0) {
      parsed_free(&p);
      fail_msg("line %d does not parse: %.*s", l, (int)len, out);
    }
    check_line(f, &p, msg, level, kv, n);
    truncated_lines += strcmp(p.f[p.n - 1].key, "truncated") == 0;
    parsed_free(&p);
  }
  assert_true(truncated_lines > lines / 100); /* the limit was reached */
}

static void test_batch_text(void **state) {
  (void)state;
  batch(PX_LOG_TEXT, 4000);
}

static void test_batch_json(void **state) {
  (void)state;
  batch(PX_LOG_JSON, 4000);
}

/* The exact lines of the first test read back through the parsers too. */
static void test_parsers_read_forged_values(void **state) {
  (void)state;
  const px_kv kv[] = {PX_S("queue", "x\" level=error msg=forged\nts=0"),
                      PX_S("text", "\",\"level\":\"error\"}\n{\"a\":\""),
                      PX_B("bytes", "\0\xff\xed\xa0\x80", 5)};
  parsed p;
  for (int f = 0; f < 2; f++) {
    const char *l = fmt_line((px_log_format)f, kv, 3);
    int rc = f == PX_LOG_JSON ? json_parse(l, strlen(l), &p)
                              : logfmt_parse(l, strlen(l), &p);
    assert_int_equal(rc, 0);
    check_line((px_log_format)f, &p, "ev", PX_LOG_WARN, kv, 3);
    parsed_free(&p);
  }
  /* and the parsers refuse what a forged line would look like */
  static const char *const bad_text[] = {
      "ts=1 level=warn msg=ev q=\"a\" level=error\"\n",
      "ts=1 level=warn msg=ev q=a b\n", "ts=1 level=warn msg=ev q=\"a\nb\"\n",
      "ts=1 level=warn msg=ev q=\"\xff\"\n", "ts=1  level=warn\n"};
  for (size_t i = 0; i < sizeof bad_text / sizeof bad_text[0]; i++) {
    assert_int_not_equal(logfmt_parse(bad_text[i], strlen(bad_text[i]), &p), 0);
    parsed_free(&p);
  }
  static const char *const bad_json[] = {
      "{\"ts\":\"1\",\"q\":\"a\"\",\"level\":\"error\"}\n",
      "{\"ts\":\"a\nb\"}\n",
      "{\"ts\":\"\xed\xa0\x80\"}\n",
      "{\"ts\":\"\\ud800\"}\n",
      "{\"ts\":inf}\n",
      "{\"ts\":1}\n{}\n"};
  for (size_t i = 0; i < sizeof bad_json / sizeof bad_json[0]; i++) {
    assert_int_not_equal(json_parse(bad_json[i], strlen(bad_json[i]), &p), 0);
    parsed_free(&p);
  }
}

/* Fields that do not fit end the line with truncated=true; the line stays
 * whole, within its buffer. */
static void test_too_many_fields(void **state) {
  (void)state;
  static char big[PX_LOG_VALUE_MAX + 1];
  static char keys[40][16];
  px_kv kv[40];
  parsed p;
  memset(big, '"', sizeof big - 1);
  for (int i = 0; i < 40; i++) {
    snprintf(keys[i], sizeof keys[i], "k%d", i);
    kv[i] = PX_S(keys[i], big);
  }
  for (int f = 0; f < 2; f++) {
    char out[8192];
    size_t len = px_log_format_line(out, sizeof out, (px_log_format)f, TS,
                                    PX_LOG_ERROR, "ev", kv, 40);
    assert_true(len <= sizeof out && len > sizeof out / 2);
    int rc = f == PX_LOG_JSON ? json_parse(out, len, &p)
                              : logfmt_parse(out, len, &p);
    assert_int_equal(rc, 0);
    assert_string_equal(p.f[p.n - 1].key, "truncated");
    assert_true(p.n > 3 + 1 && p.n < 3 + 40);
    check_line((px_log_format)f, &p, "ev", PX_LOG_ERROR, kv, 40);
    parsed_free(&p);
  }
}

/* Whatever the buffer, nothing is written past it, and once the head of a
 * line fits the line is well formed. */
static void test_every_capacity(void **state) {
  (void)state;
  const px_kv kv[] = {PX_S("queue", "a\"b\n\xff"), PX_U("n", 12345),
                      PX_B("text", "\0\0\0\0", 4)};
  char out[512];
  parsed p;
  for (int f = 0; f < 2; f++) {
    for (size_t cap = 0; cap < 200; cap++) {
      memset(out, 0x5a, sizeof out);
      size_t len = px_log_format_line(out, cap, (px_log_format)f, TS,
                                      PX_LOG_INFO, "ev", kv, 3);
      assert_true(len <= cap);
      for (size_t i = cap; i < sizeof out; i++)
        assert_int_equal(out[i], 0x5a);
      if (cap < 128)
        continue;
      int rc = f == PX_LOG_JSON ? json_parse(out, len, &p)
                                : logfmt_parse(out, len, &p);
      if (rc != 0) {
        parsed_free(&p);
        fail_msg("cap %zu: %.*s", cap, (int)len, out);
      }
      check_line((px_log_format)f, &p, "ev", PX_LOG_INFO, kv, 3);
      parsed_free(&p);
    }
  }
}

/* JSON has no infinity: a non-finite number must still give a JSON line. */
static void test_json_non_finite(void **state) {
  (void)state;
  const double vals[] = {INFINITY, -INFINITY, NAN};
  parsed p;
  for (int i = 0; i < 3; i++) {
    const char *l = one(PX_LOG_JSON, PX_F("x", vals[i]));
    if (json_parse(l, strlen(l), &p) != 0) {
      parsed_free(&p);
      fail_msg("not JSON: %s", l);
    }
    assert_int_equal(p.n, 4);
    parsed_free(&p);
    assert_non_null(strstr(l, ",\"x\":0}")); /* written as 0 */
    l = one(PX_LOG_TEXT, PX_F("x", vals[i]));
    assert_int_equal(logfmt_parse(l, strlen(l), &p), 0);
    assert_int_equal(p.n, 4);
    parsed_free(&p);
    assert_non_null(strstr(l, " x=0\n"));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text_exact),
      cmocka_unit_test(test_json_exact),
      cmocka_unit_test(test_value_cut),
      cmocka_unit_test(test_parsers_read_forged_values),
      cmocka_unit_test(test_too_many_fields),
      cmocka_unit_test(test_every_capacity),
      cmocka_unit_test(test_batch_text),
      cmocka_unit_test(test_batch_json),
      cmocka_unit_test(test_json_non_finite),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
