/* retry_policy.h - pure pieces of rebound's retry policy.
 *
 * No I/O, no clock, no allocation: parsing of tier delays and matching of
 * queue names against the policy's globs.
 */
#ifndef RETRY_POLICY_H
#define RETRY_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Parse a duration into milliseconds: a number of seconds ("10", "1.5",
 * "0"), or numbers each with a unit ms, s, m or h ("250ms", "1.5s",
 * "1m30s", "2h"), rounded to the millisecond. `len` bytes of `s` are read;
 * no NUL is needed. Returns 0 and sets `*ms`, or -1 for anything else (a
 * sign, a space, another unit, a value over 24 hours). */
int retry_duration_parse(const char *s, size_t len, uint32_t *ms);

/* A delay: a duration (above) of at least 1 ms. */
int retry_delay_parse(const char *s, size_t len, uint32_t *ms);

/* Write the canonical name of a delay, as used in tier queue names
 * ("500ms", "1s", "90s", "2m", "1h": the largest unit that divides it).
 * Returns the length written (without the NUL), or -1 if `cap` is too
 * small. */
int retry_delay_format(uint32_t ms, char *out, size_t cap);

/* Does `name` (len bytes) match the glob `pattern` (NUL-terminated)? `*`
 * matches any run of bytes, `?` one byte, everything else itself. Linear
 * in the lengths (no backtracking blow-up). */
bool retry_glob_match(const char *pattern, const char *name, size_t len);

#endif
