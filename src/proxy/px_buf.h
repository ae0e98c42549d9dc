/* px_buf.h - reference-counted byte chunks that carry frames from one
 * socket to the other without copying.
 *
 * A read fills a chunk; the frames parsed from it are queued for writing as
 * slices that point into it, each holding a reference; the chunk goes back
 * to a bounded free list when the last reference is dropped. An idle
 * connection holds no chunk.
 */
#ifndef PX_BUF_H
#define PX_BUF_H

#include <stddef.h>
#include <stdint.h>

/* Standard chunk payload: enough for many small frames per read. Frames
 * larger than this get a chunk of their own size. */
#define PX_CHUNK_SIZE (64 * 1024)

typedef struct px_chunk {
  uint32_t refs;
  uint32_t cap; /* bytes in data[] */
  uint32_t len; /* bytes filled */
  uint32_t off; /* bytes already parsed */
  struct px_chunk *next_free;
  uint8_t data[];
} px_chunk;

/* A chunk with room for at least `min_cap` bytes and one reference (the
 * caller's), or NULL when out of memory. */
px_chunk *px_chunk_new(size_t min_cap);

static inline void px_chunk_ref(px_chunk *c) {
  c->refs++;
}

/* Drop a reference; at zero the chunk is recycled or freed. */
void px_chunk_unref(px_chunk *c);

/* Bytes currently allocated to chunks (in use and free-listed). */
size_t px_chunk_bytes(void);

/* Free every recycled chunk (at exit, for leak checkers). */
void px_chunk_pool_drain(void);

/* A run of bytes in a chunk, queued for writing or held back. */
typedef struct px_slice {
  px_chunk *chunk; /* holds one reference */
  uint8_t *ptr;
  uint32_t len;
} px_slice;

#endif
