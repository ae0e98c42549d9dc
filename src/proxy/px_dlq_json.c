/* px_dlq_json.c - dead-letter queues and their messages as JSON
 * (px_dlq_json.h). */
#include "px_dlq_json.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <time.h>

#define MAX_DEPTH 8 /* nested tables and arrays rendered; deeper: null */

void px_dlq_iso_time(uint64_t seconds, char *out, size_t cap) {
  time_t t = (time_t)seconds;
  struct tm tm;
  if (!gmtime_r(&t, &tm) || strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
    snprintf(out, cap, "%" PRIu64, seconds);
}

static bool header_get(amqp_bytes headers, const retry_policy *p,
                       const char *suffix, amqp_field *f) {
  char name[RETRY_NAME_MAX + 1];
  return retry_header_name(p, suffix, name, sizeof name) >= 0 &&
         amqp_table_get(headers, amqp_cstr(name), f) == AMQP_OK;
}

bool px_dlq_header_str(amqp_bytes headers, const retry_policy *p,
                       const char *suffix, amqp_bytes *out) {
  amqp_field f;
  if (!header_get(headers, p, suffix, &f) || (f.type != 'S' && f.type != 'x'))
    return false;
  *out = f.v.bytes;
  return true;
}

bool px_dlq_header_int(amqp_bytes headers, const retry_policy *p,
                       const char *suffix, int64_t *out) {
  amqp_field f;
  if (!header_get(headers, p, suffix, &f))
    return false;
  if (f.type == 'T') {
    *out = (int64_t)f.v.u;
    return true;
  }
  return amqp_field_as_int(&f, out);
}

static void json_time(px_admin_response *r, uint64_t seconds) {
  char iso[40];
  px_dlq_iso_time(seconds, iso, sizeof iso);
  px_admin_json_string(r, iso);
}

static void json_value(px_admin_response *r, const amqp_field *f, int depth);

/* A table (object) or an array, entries in order. */
static void json_container(px_admin_response *r, const amqp_field *f,
                           int depth) {
  bool table = f->type == 'F';
  amqp_table_iter it;
  amqp_bytes key;
  amqp_field v;
  int n = 0;
  amqp_table_iter_init(&it, f->v.bytes);
  px_admin_append(r, table ? "{" : "[", 1);
  while ((table ? amqp_table_next(&it, &key, &v) : amqp_array_next(&it, &v)) >
         0) {
    if (n++)
      px_admin_append(r, ",", 1);
    if (table) {
      px_admin_json_bytes(r, key.ptr, key.len);
      px_admin_append(r, ":", 1);
    }
    json_value(r, &v, depth + 1);
  }
  px_admin_append(r, table ? "}" : "]", 1);
}

static void json_value(px_admin_response *r, const amqp_field *f, int depth) {
  switch (f->type) {
  case 't':
    px_admin_printf(r, "%s", f->v.u ? "true" : "false");
    return;
  case 'b':
  case 's':
  case 'I':
  case 'l':
    px_admin_printf(r, "%" PRId64, f->v.i);
    return;
  case 'B':
  case 'u':
  case 'i':
    px_admin_printf(r, "%" PRIu64, f->v.u);
    return;
  case 'f':
  case 'd': {
    double v = f->type == 'f' ? (double)f->v.f : f->v.d;
    if (isfinite(v)) /* JSON has no NaN or infinity: those are null */
      px_admin_printf(r, f->type == 'f' ? "%.9g" : "%.17g", v);
    else
      px_admin_printf(r, "null");
    return;
  }
  case 'D': {
    double v = f->v.dec.value;
    for (unsigned i = 0; i < f->v.dec.scale; i++)
      v /= 10;
    px_admin_printf(r, "%.17g", v);
    return;
  }
  case 'T':
    json_time(r, f->v.u);
    return;
  case 'S':
  case 'x':
    px_admin_json_bytes(r, f->v.bytes.ptr, f->v.bytes.len);
    return;
  case 'F':
  case 'A':
    if (depth < MAX_DEPTH) {
      json_container(r, f, depth);
      return;
    }
    break;
  default:
    break;
  }
  px_admin_printf(r, "null");
}

void px_dlq_json_headers(px_admin_response *r, amqp_bytes headers) {
  amqp_field f = {.type = 'F'};
  f.v.bytes = headers;
  json_container(r, &f, 0);
}

/* "name":value for one of rebound's headers, null when absent. */
static void json_rebound_field(px_admin_response *r, amqp_bytes h,
                               const retry_policy *p, const char *key,
                               const char *suffix) {
  amqp_field f;
  px_admin_printf(r, "\"%s\":", key);
  if (header_get(h, p, suffix, &f))
    json_value(r, &f, MAX_DEPTH); /* no nesting: these are scalars */
  else
    px_admin_printf(r, "null");
}

static void json_rebound(px_admin_response *r, amqp_bytes h,
                         const retry_policy *p) {
  static const char *const keys[][2] = {
      {"source_queue", "source-queue"},
      {"retry_count", "retry-count"},
      {"first_failed_at", "first-failed-at"},
      {"last_failed_at", "last-failed-at"},
      {"reason", "dead-letter-reason"},
      {"original_exchange", "original-exchange"},
      {"original_routing_key", "original-routing-key"},
      {"redriven_at", "redriven-at"},
  };
  px_admin_append(r, "{", 1);
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    if (i)
      px_admin_append(r, ",", 1);
    json_rebound_field(r, h, p, keys[i][0], keys[i][1]);
  }
  px_admin_append(r, "}", 1);
}

void px_dlq_json_properties(px_admin_response *r, const amqp_props *p) {
  int n = 0;
  px_admin_append(r, "{", 1);
#define PX__JSON_PROP(field, NAME, bit, type)                                  \
  if ((p->flags & AMQP_P_##NAME) && AMQP_P_##NAME != AMQP_P_HEADERS) {         \
    px_admin_printf(r, "%s\"%s\":", n++ ? "," : "", #field);                   \
    PX__JSON_PROP_##type(r, p->field);                                         \
  }
#define PX__JSON_PROP_SHORTSTR(r, v) px_admin_json_bytes(r, (v).ptr, (v).len)
#define PX__JSON_PROP_TABLE(r, v) px_admin_printf(r, "null")
#define PX__JSON_PROP_OCTET(r, v) px_admin_printf(r, "%u", (unsigned)(v))
#define PX__JSON_PROP_TIMESTAMP(r, v) json_time(r, (v))
  AMQP_PROPS_MAP(PX__JSON_PROP)
#undef PX__JSON_PROP
  px_admin_append(r, "}", 1);
}

int px_dlq_json_message(px_admin_response *r, const px_dlq_message *m,
                        const retry_policy *p) {
  const amqp_props *props = &m->header->props;
  px_admin_printf(r, "{\"index\":%" PRIu64 ",\"redelivered\":%s,\"exchange\":",
                  m->index, m->redelivered ? "true" : "false");
  px_admin_json_bytes(r, m->exchange.ptr, m->exchange.len);
  px_admin_printf(r, ",\"routing_key\":");
  px_admin_json_bytes(r, m->routing_key.ptr, m->routing_key.len);
  px_admin_printf(r, ",\"rebound\":");
  json_rebound(r, props->headers, p);
  px_admin_printf(r, ",\"properties\":");
  px_dlq_json_properties(r, props);
  px_admin_printf(r, ",\"headers\":");
  px_dlq_json_headers(r, props->headers);
  uint64_t shown = m->body_len < PX_DLQ_PREVIEW ? m->body_len : PX_DLQ_PREVIEW;
  px_admin_printf(r, ",\"body_size\":%" PRIu64 ",\"body\":", m->body_len);
  px_admin_json_bytes(r, m->body, (size_t)shown);
  return px_admin_printf(r, ",\"body_truncated\":%s}",
                         shown < m->body_len ? "true" : "false");
}

int px_dlq_json_count(px_admin_response *r, const px_dlq_count *c) {
  px_admin_printf(r, "{\"name\":");
  px_admin_json_string(r, c->name);
  if (c->exists)
    px_admin_printf(
        r, ",\"exists\":true,\"messages\":%" PRIu32 ",\"consumers\":%" PRIu32,
        c->messages, c->consumers);
  else
    px_admin_printf(r, ",\"exists\":%s,\"messages\":null,\"consumers\":null",
                    c->error ? "null" : "false");
  if (c->error) {
    px_admin_printf(r, ",\"error\":");
    px_admin_json_string(r, c->error);
  }
  return px_admin_append(r, "}", 1);
}
