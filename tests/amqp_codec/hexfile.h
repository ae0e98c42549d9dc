/* hexfile.h - test helper: read a hex fixture file into bytes. */
#ifndef TEST_HEXFILE_H
#define TEST_HEXFILE_H

#include <stddef.h>
#include <stdint.h>

/* Read `path` (hex digits; whitespace and lines starting with '#' ignored)
 * into a malloc'd buffer. Returns NULL on error; `*len` gets the size. */
uint8_t *hexfile_read(const char *path, size_t *len);

/* Decode a hex string (whitespace ignored) into a malloc'd buffer. */
uint8_t *hex_decode(const char *hex, size_t *len);

/* A malloc'd copy of exactly `len` bytes, so that ASan flags any read past
 * the end. */
uint8_t *exact_copy(const uint8_t *p, size_t len);

#endif
