/* golden.h - test helper: a recorded AMQP session, split into frames. */
#ifndef TEST_GOLDEN_H
#define TEST_GOLDEN_H

#include "amqp.h"

typedef struct golden_stream {
  uint8_t *bytes; /* the whole direction, as recorded */
  size_t len;
  size_t start; /* after the protocol header (client side) */
  amqp_frame *frames;
  size_t nframes;
} golden_stream;

/* Load <dir>/<session>.<side>.hex (side "client" or "server") with
 * dir = $REBOUND_GOLDEN_DIR and parse all its frames (frame-max 131072).
 * Fails the current test if the file is missing or does not parse whole. */
void golden_load(golden_stream *s, const char *session, const char *side);
void golden_free(golden_stream *s);

/* The n-th method frame with this id (0 = first) on any channel, decoded;
 * fails the test when there is none. Returns the frame index. */
size_t golden_find(const golden_stream *s, uint32_t id, unsigned n,
                   amqp_method *m);

#endif
