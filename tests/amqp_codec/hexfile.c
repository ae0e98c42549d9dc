#include "hexfile.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int nibble(int c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  c = tolower(c);
  return (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
}

static uint8_t *decode(const char *s, size_t n, size_t *len) {
  uint8_t *out = malloc(n / 2 + 1);
  size_t o = 0;
  int hi = -1;
  for (size_t i = 0; out && i < n; i++) {
    if (s[i] == '#') {
      while (i < n && s[i] != '\n')
        i++;
      continue;
    }
    if (isspace((unsigned char)s[i]))
      continue;
    int v = nibble(s[i]);
    if (v < 0) {
      free(out);
      return NULL;
    }
    if (hi < 0) {
      hi = v;
    } else {
      out[o++] = (uint8_t)(hi << 4 | v);
      hi = -1;
    }
  }
  if (hi >= 0) {
    free(out);
    return NULL;
  }
  *len = o;
  return out;
}

uint8_t *hex_decode(const char *hex, size_t *len) {
  return decode(hex, strlen(hex), len);
}

uint8_t *hexfile_read(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  uint8_t *out = NULL;
  if (s && fread(s, 1, (size_t)n, f) == (size_t)n)
    out = decode(s, (size_t)n, len);
  free(s);
  fclose(f);
  return out;
}

uint8_t *exact_copy(const uint8_t *p, size_t len) {
  uint8_t *c = malloc(len ? len : 1);
  if (c && len)
    memcpy(c, p, len);
  return c;
}
