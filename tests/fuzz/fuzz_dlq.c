/* libFuzzer target: what the dead-letter operations read from outside.
 * The first byte picks the input: 0, a message from the broker (a content
 * header payload, then the body) rendered as JSON; 1, a broker URL; 2, an
 * admin query string; 3, a tier copy's headers table, whose age the tier
 * watch reads; 4 and 5, a client's PLAIN or AMQPLAIN login response,
 * which the tier watch logs in with. Oracles: the JSON is valid JSON
 * (checked by the small parser below) and valid UTF-8; a URL that parses
 * has a user, a vhost, and no NUL inside them; a parameter that decodes
 * fits; an age is whole seconds; a login read has both fields
 * NUL-terminated within their buffers and, for PLAIN, exactly the bytes
 * between the response's NULs. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amqp.h"
#include "px_admin.h"
#include "px_dlq_cli.h"
#include "px_dlq_json.h"
#include "px_watch.h"

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
  if (px_admin_param(s, "limit", v, sizeof v) == 1 && strlen(v) >= sizeof v)
    abort();
}

static void copy_age(const uint8_t *d, size_t n) {
  uint64_t age = 1;
  if (px_watch_copy_age((amqp_bytes){(uint8_t *)d, n}, "rebound-last-failed-at",
                        4000000000u, &age) == 0 &&
      age % 1000 != 0)
    abort();
}

static void login(const char *mech, const uint8_t *d, size_t n) {
  char user[16], password[16]; /* small: the bounds are what is tested */
  if (px_watch_login_creds(amqp_cstr(mech), (amqp_bytes){(uint8_t *)d, n}, user,
                           password, sizeof user) != 0)
    return;
  if (!memchr(user, 0, sizeof user) || !memchr(password, 0, sizeof password))
    abort();
  if (strcmp(mech, "PLAIN") == 0) {
    const uint8_t *a = memchr(d, 0, n);
    const uint8_t *b = a ? memchr(a + 1, 0, n - (size_t)(a + 1 - d)) : NULL;
    size_t ul = b ? (size_t)(b - a - 1) : (size_t)-1;
    if (!b || strlen(user) != ul || memcmp(user, a + 1, ul) != 0 ||
        strlen(password) != n - (size_t)(b + 1 - d) ||
        memcmp(password, b + 1, strlen(password)) != 0)
      abort();
  }
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
  else if (data[0] == 3)
    copy_age(data + 1, size - 1);
  else if (data[0] == 4)
    login("PLAIN", data + 1, size - 1);
  else if (data[0] == 5)
    login("AMQPLAIN", data + 1, size - 1);
  return 0;
}
