/* px_close.c - the close-reason table's accessors (px_close.h). */
#include "px_close.h"

static const struct {
  px_close_side side;
  int reply;
  const char *text;
} reasons[PX_CR_COUNT] = {[PX_CR_NONE] = {PX_SIDE_REBOUND, 0, ""},
#define PX__CR_ROW(id, side_, reply_, text_)                                   \
  [PX_CR_##id] = {PX_SIDE_##side_, reply_, text_},
                          PX_CLOSE_REASONS(PX__CR_ROW)
#undef PX__CR_ROW
};

static px_close_reason valid(px_close_reason r) {
  return (unsigned)r < PX_CR_COUNT ? r : PX_CR_NONE;
}

const char *px_close_text(px_close_reason r) {
  return reasons[valid(r)].text;
}

px_close_side px_close_side_of(px_close_reason r) {
  return reasons[valid(r)].side;
}

int px_close_reply(px_close_reason r) {
  return reasons[valid(r)].reply;
}
