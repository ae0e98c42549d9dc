/* px_dlq_json.h - dead-letter queues and their messages as JSON, for the
 * admin routes and `rebound dlq --json` alike (README, "Dead letters").
 *
 * A message is an object: index, redelivered, exchange, routing_key;
 * "rebound", rebound's headers by meaning (source_queue, retry_count,
 * first_failed_at, last_failed_at, reason, original_exchange,
 * original_routing_key, redriven_at; null when absent); "properties", the
 * basic properties present; "headers", every header (timestamps as ISO
 * 8601 UTC strings, byte arrays as strings, decimals as numbers); body_size,
 * "body" (the first PX_DLQ_PREVIEW bytes as UTF-8, bytes that are not
 * valid UTF-8 as U+FFFD) and body_truncated.
 */
#ifndef PX_DLQ_JSON_H
#define PX_DLQ_JSON_H

#include "px_admin.h"
#include "px_dlq.h"
#include "retry_plan.h"

#define PX_DLQ_PREVIEW 1024

/* Append one message object. Returns 0, or -1 (`failed`). */
int px_dlq_json_message(px_admin_response *r, const px_dlq_message *m,
                        const retry_policy *p);

/* The basic properties present (headers aside) as an object; a headers
 * table as an object. */
void px_dlq_json_properties(px_admin_response *r, const amqp_props *p);
void px_dlq_json_headers(px_admin_response *r, amqp_bytes headers);

/* Append one queue object: name, exists, messages, consumers (null when
 * absent), and error when the broker refused to say. */
int px_dlq_json_count(px_admin_response *r, const px_dlq_count *c);

/* "2026-12-02T05:00:00Z" for a time in seconds (cap >= 21). */
void px_dlq_iso_time(uint64_t seconds, char *out, size_t cap);

/* A header of rebound's (prefix + suffix) from a headers table: its
 * string, or its integer; false when absent or of another type. */
bool px_dlq_header_str(amqp_bytes headers, const retry_policy *p,
                       const char *suffix, amqp_bytes *out);
bool px_dlq_header_int(amqp_bytes headers, const retry_policy *p,
                       const char *suffix, int64_t *out);

#endif
