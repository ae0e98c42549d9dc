/* px_routes.h - the admin endpoint's routes, one table (README, "Admin
 * endpoint"): the health and metrics routes, the status documents, the
 * dead-letter routes (px_dlq_http.h) and the page at "/". */
#ifndef PX_ROUTES_H
#define PX_ROUTES_H

#include "px_admin.h"

/* The router px_admin calls (`ctx`: the px_server). */
void px_routes_route(void *ctx, const px_admin_request *req,
                     px_admin_response *r);

#endif
