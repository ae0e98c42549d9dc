/* px_log.h - rebound's log lines.
 *
 * One line per event on stderr: a timestamp, a level, a short event name
 * and typed key/value fields. The caller never formats a line: it passes
 * fields, and px_log_kv() escapes every value at one place for both
 * formats, so no value (a queue name, a reply text from the broker, a
 * peer's bytes) can forge a field or a line:
 *
 *   text: ts=... level=warn msg=retry_fallback id=3 queue="a \"b\""
 *         strings are bare when they hold only [A-Za-z0-9._:/@+-], else
 *         quoted with \" \\ \n \r \t escaped and every other control byte,
 *         DEL and byte of invalid UTF-8 written as \xHH;
 *   json: {"ts":"...","level":"warn","msg":"retry_fallback","id":3,...}
 *         numbers are JSON numbers (a non-finite double as 0, in both
 *         formats), booleans true/false, strings escaped as JSON requires,
 *         a byte of invalid UTF-8 as U+FFFD.
 *
 * A string value is cut after PX_LOG_VALUE_MAX bytes of input (marked with
 * a trailing "..." inside the value). Event names and keys are fixed
 * identifiers chosen by rebound ([a-z0-9_]). Each event name is logged
 * from exactly one place in the code, with one set of keys (a test checks
 * it), so a log reader can rely on the fields of a name. Credentials are
 * never passed here.
 */
#ifndef PX_LOG_H
#define PX_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum px_log_level {
  PX_LOG_DEBUG,
  PX_LOG_INFO,
  PX_LOG_WARN,
  PX_LOG_ERROR,
} px_log_level;

typedef enum px_log_format {
  PX_LOG_TEXT, /* logfmt */
  PX_LOG_JSON, /* one JSON object per line, the same keys */
} px_log_format;

#define PX_LOG_VALUE_MAX 512

typedef enum px_kv_type {
  PX_KV_STR,   /* NUL-terminated; NULL is logged as "" */
  PX_KV_BYTES, /* `len` bytes, NULs included */
  PX_KV_U64,
  PX_KV_I64,
  PX_KV_F64,
  PX_KV_BOOL,
} px_kv_type;

typedef struct px_kv {
  const char *key;
  px_kv_type type;
  size_t len; /* PX_KV_BYTES */
  union {
    const char *s;
    uint64_t u;
    int64_t i;
    double f;
  } v;
} px_kv;

/* Field constructors. */
#define PX_S(k, str) ((px_kv){(k), PX_KV_STR, 0, {.s = (str)}})
#define PX_B(k, p, n) ((px_kv){(k), PX_KV_BYTES, (n), {.s = (const char *)(p)}})
#define PX_U(k, n) ((px_kv){(k), PX_KV_U64, 0, {.u = (uint64_t)(n)}})
#define PX_I(k, n) ((px_kv){(k), PX_KV_I64, 0, {.i = (int64_t)(n)}})
#define PX_F(k, x) ((px_kv){(k), PX_KV_F64, 0, {.f = (double)(x)}})
#define PX_BOOL(k, b) ((px_kv){(k), PX_KV_BOOL, 0, {.u = (b) ? 1u : 0u}})

void px_log_set_format(px_log_format format);

/* Write the log to `path` (appended to, made 0640 if new) instead of
 * standard error: the file becomes descriptor 2, so whatever else writes
 * to standard error lands there too. Called again (SIGUSR1), it opens the
 * path anew, for a rotation that moved the old file away. 0, or an errno
 * value with the log where it was. Descriptors 0-2 must be open already
 * (main() opens /dev/null on any that is closed), so the new descriptor is
 * never 2 itself. */
int px_log_open_file(const char *path);

/* Set the lowest level written (default PX_LOG_INFO). */
void px_log_set_level(px_log_level level);

/* Under --workers N (N > 1): every line names the process it comes from,
 * a field "worker" (0..N-1) after "msg". Negative (the default): none. */
void px_log_set_worker(int worker);

/* Parse "debug", "info", "warn" or "error"; returns -1 for anything else. */
int px_log_level_parse(const char *s, px_log_level *out);

/* Write one line of event `msg` with `n` fields. */
void px_log_kv(px_log_level level, const char *msg, const px_kv *kv, size_t n);

/* Format one line into `out` (at most `cap` bytes, newline included, no
 * NUL) without writing it; returns its length. For tests and px_log_kv. */
size_t px_log_format_line(char *out, size_t cap, px_log_format format,
                          const char *ts, px_log_level level, const char *msg,
                          const px_kv *kv, size_t n);

/* A repeated event written at most once per PX_LOG_LIMIT_MS. */
#define PX_LOG_LIMIT_MS 10000
typedef struct px_log_limit {
  uint64_t last_ms;  /* when the last line was written */
  uint64_t unlogged; /* events since then not written */
  bool any;          /* a line has been written */
} px_log_limit;

/* Whether to write a line for a repeated event now (`now_ms` on any
 * monotonic clock): the first, then at most one per PX_LOG_LIMIT_MS.
 * `*unlogged` is how many were not written since the previous line. */
bool px_log_limit_pass(px_log_limit *l, uint64_t now_ms, uint64_t *unlogged);

/* px_info("event", PX_U("id", id), PX_S("peer", peer), ...): at least one
 * field. */
#define PX__KVS(...) ((const px_kv[]){__VA_ARGS__})
#define PX__NKV(...) (sizeof PX__KVS(__VA_ARGS__) / sizeof(px_kv))
#define px_log(level, msg, ...)                                                \
  px_log_kv(level, msg, PX__KVS(__VA_ARGS__), PX__NKV(__VA_ARGS__))
#define px_debug(msg, ...) px_log(PX_LOG_DEBUG, msg, __VA_ARGS__)
#define px_info(msg, ...) px_log(PX_LOG_INFO, msg, __VA_ARGS__)
#define px_warn(msg, ...) px_log(PX_LOG_WARN, msg, __VA_ARGS__)
#define px_error(msg, ...) px_log(PX_LOG_ERROR, msg, __VA_ARGS__)

#endif
