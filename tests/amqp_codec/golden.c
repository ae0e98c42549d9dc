#include "golden.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "hexfile.h"

void golden_load(golden_stream *s, const char *session, const char *side) {
  const char *dir = getenv("REBOUND_GOLDEN_DIR");
  char path[1024];
  memset(s, 0, sizeof *s);
  assert_non_null(dir);
  snprintf(path, sizeof path, "%s/%s.%s.hex", dir, session, side);
  s->bytes = hexfile_read(path, &s->len);
  if (!s->bytes)
    fail_msg("cannot read golden fixture %s", path);
  if (amqp_protocol_header_parse(s->bytes, s->len) == AMQP_PROTOCOL_HEADER_SIZE)
    s->start = AMQP_PROTOCOL_HEADER_SIZE;
  size_t cap = 64;
  s->frames = malloc(cap * sizeof *s->frames);
  for (size_t off = s->start; off < s->len;) {
    amqp_frame f;
    long n = amqp_frame_parse(s->bytes + off, s->len - off, 131072, &f);
    if (n <= 0)
      fail_msg("%s: frame at offset %zu: %s", path, off,
               amqp_status_str((int)n));
    if (s->nframes == cap)
      s->frames = realloc(s->frames, (cap *= 2) * sizeof *s->frames);
    s->frames[s->nframes++] = f;
    off += (size_t)n;
  }
}

void golden_free(golden_stream *s) {
  free(s->frames);
  free(s->bytes);
  memset(s, 0, sizeof *s);
}

size_t golden_find(const golden_stream *s, uint32_t id, unsigned n,
                   amqp_method *m) {
  for (size_t i = 0; i < s->nframes; i++) {
    const amqp_frame *f = &s->frames[i];
    if (f->type != AMQP_FRAME_METHOD || amqp_method_peek_id(f->payload) != id)
      continue;
    if (n-- > 0)
      continue;
    assert_int_equal(amqp_method_decode(f->payload, m), AMQP_OK);
    return i;
  }
  fail_msg("no %s in the recording", amqp_method_lookup(id)->name);
  return 0;
}
