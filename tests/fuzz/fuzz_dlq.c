/* libFuzzer target: what the dead-letter operations read from outside.
 * The first byte picks the input: 0, a message from the broker (a content
 * header payload, then the body) rendered as JSON; 1, a broker URL; 2, an
 * admin query string. Oracles: the JSON is valid JSON (checked by the
 * small parser below) and valid UTF-8; a URL that parses has a user, a
 * vhost, and no NUL inside them; a parameter that decodes fits. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amqp.h"
#include "px_dlq_cli.h"
#include "px_dlq_json.h"
#include "px_routes.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct json {
  const char *p, *end;
  int depth;
} json;

static int value(json *j);

static void ws(json *j) {
  while (j->p < j->end && strchr(" \n", *j->p))
    j->p++;
}

static int string(json *j) {
  if (j->p >= j->end || *j->p++ != '"')
    return -1;
  while (j->p < j->end && *j->p != '"') {
    unsigned char c = (unsigned char)*j->p++;
    if (c < 0x20)
      return -1;
    if (c == '\\' && (j->p >= j->end || !strchr("\"\\/bfnrtu", *j->p++)))
      return -1;
  }
  return j->p < j->end ? (j->p++, 0) : -1;
}

static int members(json *j, char close, int object) {
  j->p++;
  ws(j);
  if (j->p < j->end && *j->p == close)
    return j->p++, 0;
  for (;;) {
    ws(j);
    if (object && (string(j) != 0 || (ws(j), j->p >= j->end) || *j->p++ != ':'))
      return -1;
    if (value(j) != 0)
      return -1;
    ws(j);
    if (j->p >= j->end)
      return -1;
    char c = *j->p++;
    if (c == close)
      return 0;
    if (c != ',')
      return -1;
  }
}

static int value(json *j) {
  ws(j);
  if (j->p >= j->end || ++j->depth > 64)
    return -1;
  int rc;
  char c = *j->p;
  if (c == '{' || c == '[') {
    rc = members(j, c == '{' ? '}' : ']', c == '{');
  } else if (c == '"') {
    rc = string(j);
  } else {
    const char *s = j->p;
    while (j->p < j->end && strchr("-+.eE0123456789truefalsn", *j->p))
      j->p++;
    rc = j->p > s ? 0 : -1;
  }
  j->depth--;
  return rc;
}

static void check_json(const char *s, size_t n) {
  json j = {s, s + n, 0};
  if (value(&j) != 0 || (ws(&j), j.p != j.end))
    abort();
}

static void message(const uint8_t *data, size_t size) {
  amqp_content_header h;
  if (size < 2)
    return;
  size_t hlen = data[0] * 256u + data[1];
  if (hlen > size - 2 ||
      amqp_content_header_decode((amqp_bytes){data + 2, hlen}, &h) != AMQP_OK)
    return;
  px_dlq_message m = {1,
                      true,
                      amqp_cstr("ex"),
                      amqp_cstr("q.dlq"),
                      &h,
                      data + 2 + hlen,
                      size - 2 - hlen};
  retry_policy p = {.header_prefix = "rebound-"};
  px_admin_response r = {.status = 200};
  if (px_dlq_json_message(&r, &m, &p) != 0)
    abort();
  check_json(r.body, r.len);
  free(r.body);
}

static void url(const uint8_t *data, size_t size) {
  char s[1024], err[512];
  px_amqp_url u;
  if (size >= sizeof s)
    return;
  memcpy(s, data, size);
  s[size] = '\0';
  if (px_amqp_url_parse(s, &u, err, sizeof err) == 0 &&
      (!u.user[0] || !u.vhost[0] || u.addr.port == 0))
    abort();
}

static void query(const uint8_t *data, size_t size) {
  char s[1024], v[16];
  if (size >= sizeof s)
    return;
  memcpy(s, data, size);
  s[size] = '\0';
  if (px_routes_param(s, "limit", v, sizeof v) == 1 && strlen(v) >= sizeof v)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  if (data[0] == 0)
    message(data + 1, size - 1);
  else if (data[0] == 1)
    url(data + 1, size - 1);
  else if (data[0] == 2)
    query(data + 1, size - 1);
  return 0;
}
