/* px_log.h - rebound's log lines.
 *
 * One line per event on stderr, "ts=... level=... msg=..." followed by
 * key=value pairs the caller formats. Credentials are never passed here.
 */
#ifndef PX_LOG_H
#define PX_LOG_H

#include <stddef.h>

typedef enum px_log_level {
  PX_LOG_DEBUG,
  PX_LOG_INFO,
  PX_LOG_WARN,
  PX_LOG_ERROR,
} px_log_level;

typedef enum px_log_format {
  PX_LOG_TEXT, /* logfmt: ts=... level=... msg=... key=value ... */
  PX_LOG_JSON, /* one JSON object per line, the same keys */
} px_log_format;

void px_log_set_format(px_log_format format);

/* Set the lowest level written (default PX_LOG_INFO). */
void px_log_set_level(px_log_level level);

/* Parse "debug", "info", "warn" or "error"; returns -1 for anything else. */
int px_log_level_parse(const char *s, px_log_level *out);

/* Quote a value for a log line: "..." with backslash, double quote and
 * control bytes escaped, cut to fit `cap`. `len` bytes of `s` are read
 * (SIZE_MAX: up to its NUL). Returns `out`. */
char *px_log_quote(char *out, size_t cap, const char *s, size_t len);

/* Write one line: `msg` is a short event name, `fmt` the key=value rest. */
void px_log(px_log_level level, const char *msg, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define px_debug(msg, ...) px_log(PX_LOG_DEBUG, msg, __VA_ARGS__)
#define px_info(msg, ...) px_log(PX_LOG_INFO, msg, __VA_ARGS__)
#define px_warn(msg, ...) px_log(PX_LOG_WARN, msg, __VA_ARGS__)
#define px_error(msg, ...) px_log(PX_LOG_ERROR, msg, __VA_ARGS__)

#endif
