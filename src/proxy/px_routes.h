/* px_routes.h - the admin endpoint's routes, one table (README, "Admin
 * endpoint"): the health and metrics routes, the status documents, the
 * dead-letter routes (px_dlq_http.h) and the page at "/". */
#ifndef PX_ROUTES_H
#define PX_ROUTES_H

#include "px_admin.h"

/* The router px_admin calls (`ctx`: the px_server). */
void px_routes_route(void *ctx, const px_admin_request *req,
                     px_admin_response *r);

/* Percent-decode `len` bytes of `s` into `out` (cap): 0, or -1 for a bad
 * escape, a NUL, or no room. '+' stays '+'. */
int px_routes_decode(const char *s, size_t len, char *out, size_t cap);

/* The value of `name` in a query string ("a=1&b=2"), decoded into `out`:
 * 1 found, 0 absent, -1 badly encoded or too long. */
int px_routes_param(const char *query, const char *name, char *out, size_t cap);

#endif
