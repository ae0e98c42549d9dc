/* libFuzzer target: the YAML config file, loaded as rebound loads it
 * (px_config_load with --config FILE: defaults, then the file). The input
 * is the file's content, in a memfd. Oracles: a file that loads leaves a
 * config within its bounds, and the retry policy built from it works; a
 * file that does not load says "FILE:LINE: reason"; loading is
 * deterministic. */
#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "px_config.h"
#include "retry_plan.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define DELAY_MAX_MS (24u * 3600 * 1000)

static int fd = -1;
static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  fd = memfd_create("rebound-config", 0);
  if (fd < 0)
    abort();
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  return 0;
}

static void check(bool ok) {
  if (!ok)
    abort();
}

static bool terminated(const char *s, size_t cap) {
  return memchr(s, '\0', cap) != NULL;
}

static void check_addr(const px_addr *a) {
  check(terminated(a->host, sizeof a->host) && a->host[0] && a->port > 0);
}

static void check_rule(const retry_rule *r) {
  check(r->nglobs >= 1 && r->nglobs <= RETRY_MAX_GLOBS);
  for (unsigned g = 0; g < r->nglobs; g++)
    check(terminated(r->globs[g], sizeof r->globs[g]) && r->globs[g][0]);
  check(r->ntiers >= 1 && r->ntiers <= RETRY_MAX_TIERS);
  for (unsigned t = 0; t < r->ntiers; t++)
    check(r->tiers_ms[t] >= 1 && r->tiers_ms[t] <= DELAY_MAX_MS);
  check(r->max_attempts >= 1 && r->max_attempts <= 1000000);
  if (r->backoff.initial_ms) { /* levels of buckets within the jitter */
    const retry_backoff *b = &r->backoff;
    check(r->nbuckets == b->buckets && b->buckets >= 1 &&
          b->buckets <= RETRY_MAX_BUCKETS && r->ntiers % b->buckets == 0);
    check(retry_levels(r) <= (r->max_attempts > 1 ? r->max_attempts - 1 : 1));
    for (unsigned t = 0; t < r->ntiers; t++)
      check(r->tiers_ms[t] + 1 >= b->initial_ms * (1 - b->jitter) &&
            r->tiers_ms[t] <= b->max_ms * (1 + b->jitter) + 1);
  }
  check(terminated(r->dead_letter, sizeof r->dead_letter) && r->dead_letter[0]);
}

/* The policy decides for any queue and count, within the name limit. */
static void check_policy(const px_config *c, const uint8_t *data, size_t size) {
  const char *queue = size ? (const char *)data : "orders";
  size_t len = size ? (size < RETRY_NAME_MAX ? size : RETRY_NAME_MAX) : 6;
  const retry_rule *r = retry_match(&c->retry, queue, len);
  check(!r || (r >= c->rules && r < c->rules + c->retry.nrules));
  for (int64_t count = -1; count < 3; count++) {
    retry_plan plan;
    retry_decide(r, queue, len, count, (uint32_t)count, &plan);
    check(plan.action == RETRY_PASS || plan.target_len <= RETRY_NAME_MAX);
  }
  char name[RETRY_NAME_MAX + 1];
  check(retry_header_name(&c->retry, "retry-count", name, sizeof name) <=
        RETRY_NAME_MAX);
}

static void check_loaded(const px_config *c, const uint8_t *data, size_t size) {
  check(strcmp(c->config_path, path) == 0);
  check(c->listen_on || c->tls.listen_on);
  if (c->listen_on)
    check_addr(&c->listen);
  if (c->tls.listen_on) {
    check_addr(&c->tls.listen);
    check(c->tls.cert[0] && c->tls.key[0]);
  }
  check(c->n_upstreams >= 1 && c->n_upstreams <= PX_MAX_UPSTREAMS);
  for (unsigned i = 0; i < c->n_upstreams; i++)
    check_addr(&c->upstream[i]);
  if (c->admin_on)
    check_addr(&c->admin);
  check(c->log_level >= PX_LOG_DEBUG && c->log_level <= PX_LOG_ERROR);
  check(c->log_format == PX_LOG_TEXT || c->log_format == PX_LOG_JSON);
  const uint32_t timeouts[] = {c->handshake_timeout_ms, c->connect_timeout_ms};
  for (int i = 0; i < 2; i++)
    check(timeouts[i] >= 1 && timeouts[i] <= DELAY_MAX_MS);
  /* these take 0: no wait */
  const uint32_t waits[] = {c->drain_timeout_ms, c->retry_finish_timeout_ms,
                            c->drain_client_wait_ms};
  for (int i = 0; i < 3; i++)
    check(waits[i] <= DELAY_MAX_MS);
  check(terminated(c->retry.header_prefix, sizeof c->retry.header_prefix));
  check(c->retry.rules == c->rules && c->retry.nrules <= PX_MAX_RULES);
  for (unsigned i = 0; i < c->retry.nrules; i++)
    check_rule(&c->rules[i]);
  check_policy(c, data, size);
}

/* "FILE:LINE: reason", LINE within the file (or just past its end); or
 * settings that only make sense together, named by their flags ("--listen
 * and --tls-listen are both off: ..."), one line. */
static void check_error(const char *err, const uint8_t *data, size_t size) {
  size_t plen = strlen(path), lines = 1;
  check(terminated(err, 512));
  if (strncmp(err, "--", 2) == 0) {
    check(err[2] && !strchr(err, '\n'));
    return;
  }
  check(strncmp(err, path, plen) == 0 && err[plen] == ':');
  char *end;
  unsigned long line = strtoul(err + plen + 1, &end, 10);
  for (size_t i = 0; i < size; i++) /* at most: \r\n counts once for YAML */
    lines += memchr("\n\r\x85\xa8\xa9", data[i], 5) != NULL; /* NEL LS PS */
  check(end != err + plen + 1 && *end == ':' && end[1] == ' ' && end[2]);
  check(line >= 1 && line <= lines + 1);
}

static px_config_result load(px_config *c, char *err) {
  char *argv[] = {"rebound", "--config", path, NULL};
  memset(err, 0, 512);
  return px_config_load(c, 3, argv, NULL, err, 512);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static px_config cfg, again;
  char err[512], err2[512];
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
    abort();
  px_config_result r = load(&cfg, err);
  check(r == PX_CONFIG_OK || r == PX_CONFIG_ERROR);
  if (r == PX_CONFIG_OK) {
    check(err[0] == '\0');
    check_loaded(&cfg, data, size);
  } else {
    check_error(err, data, size);
  }
  /* the same file gives the same config, or the same error */
  check(load(&again, err2) == r);
  if (r == PX_CONFIG_OK) {
    again.retry.rules = cfg.retry.rules;
    check(memcmp(&cfg, &again, sizeof cfg) == 0);
  } else {
    check(strcmp(err, err2) == 0);
  }
  return 0;
}
