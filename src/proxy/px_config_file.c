/* px_config_file.c - the YAML config file (libyaml).
 *
 *   listen: 127.0.0.1:5673
 *   upstreams: ["127.0.0.1:5672"]
 *   retry:
 *     header_prefix: "rebound-"
 *     policies:
 *       - queues: ["print.render*"]
 *         tiers: [1s, 2s, 4s]
 *         max_attempts: 4
 *         dead_letter: "{queue}.dlq"
 *       - queues: ["mail.*"]
 *         backoff: {initial: 1s, multiplier: 2, max: 10m, jitter: 0.2}
 *
 * Top-level keys are the options' file keys (px_config.h). Anything
 * unknown or malformed is refused with "FILE:LINE: reason".
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "px_config.h"
#include "retry_policy.h"

typedef struct loader {
  yaml_document_t doc;
  const char *path;
  char *err;
  size_t errlen;
  const px_config_keys *keys; /* the options (px_config.c) */
} loader;

static int fail(loader *l, const yaml_node_t *n, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(l->err, l->errlen, "%s:%lu: %s", l->path,
           n ? (unsigned long)n->start_mark.line + 1 : 1ul, msg);
  return -1;
}

static const char *scalar(const yaml_node_t *n) {
  return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value
                                          : NULL;
}

/* A scalar, or a sequence of scalars joined with commas, into out. */
static int joined(loader *l, yaml_node_t *n, char *out, size_t cap) {
  const char *s = scalar(n);
  if (s) {
    if (strlen(s) >= cap)
      return fail(l, n, "value too long");
    strcpy(out, s);
    return 0;
  }
  if (n->type != YAML_SEQUENCE_NODE)
    return fail(l, n, "expected a value or a list of values");
  size_t o = 0;
  out[0] = '\0';
  for (yaml_node_item_t *it = n->data.sequence.items.start;
       it < n->data.sequence.items.top; it++) {
    yaml_node_t *item = yaml_document_get_node(&l->doc, *it);
    const char *v = scalar(item);
    if (!v || !*v)
      return fail(l, item, "expected a non-empty value in the list");
    int k = snprintf(out + o, cap - o, "%s%s", o ? "," : "", v);
    if (k < 0 || (size_t)k >= cap - o)
      return fail(l, item, "list too long");
    o += (size_t)k;
  }
  if (o == 0)
    return fail(l, n, "empty list");
  return 0;
}

/* A number of the backoff mapping (its range is checked when the rule is
 * compiled): 0, or -1 (failed, naming `key` and the `form` expected). */
static int backoff_number(loader *l, yaml_node_t *v, const char *s, double *out,
                          const char *key, const char *form) {
  char *end;
  *out = strtod(s, &end);
  if (*s && !*end)
    return 0;
  return fail(l, v, "backoff: %s '%s': expected %s", key, s, form);
}

/* One key of a policy's backoff mapping into `b`: 0, or -1 (failed). */
static int backoff_key(loader *l, const char *key, yaml_node_t *v,
                       retry_backoff *b) {
  const char *s = scalar(v);
  char *end = NULL;
  if (s && (strcmp(key, "initial") == 0 || strcmp(key, "max") == 0)) {
    uint32_t *ms = key[0] == 'i' ? &b->initial_ms : &b->max_ms;
    if (retry_delay_parse(s, strlen(s), ms) == 0)
      return 0;
    return fail(l, v,
                "backoff: %s '%s': expected a delay like 500ms, 1s, "
                "1m30s (more than 0, at most 24h)",
                key, s);
  }
  if (s && strcmp(key, "multiplier") == 0)
    return backoff_number(l, v, s, &b->multiplier, "multiplier",
                          "a number 1..100");
  if (s && strcmp(key, "jitter") == 0)
    return backoff_number(l, v, s, &b->jitter, "jitter", "a fraction 0..0.5");
  if (s && strcmp(key, "buckets") == 0) {
    long n = strtol(s, &end, 10);
    b->buckets = *s && !*end && n >= 0 && n <= 1000 ? (unsigned)n : 1000;
    return 0; /* its range is checked with the rest */
  }
  return fail(l, v,
              "backoff: unknown key '%s' or not a value (initial, "
              "multiplier, max, jitter, buckets)",
              key);
}

static int load_backoff(loader *l, yaml_node_t *n, retry_rule *r) {
  if (n->type != YAML_MAPPING_NODE)
    return fail(l, n,
                "backoff: expected a mapping (initial, multiplier, "
                "max, jitter, buckets)");
  retry_backoff_default(&r->backoff);
  for (yaml_node_pair_t *p = n->data.mapping.pairs.start;
       p < n->data.mapping.pairs.top; p++) {
    const char *key = scalar(yaml_document_get_node(&l->doc, p->key));
    if (backoff_key(l, key ? key : "?",
                    yaml_document_get_node(&l->doc, p->value), &r->backoff))
      return -1;
  }
  return 0;
}

/* The scalar keys of a policy: 1 (not one of them), 0, or -1 (failed). */
static int policy_scalar(loader *l, const char *key, yaml_node_t *v,
                         retry_rule *r) {
  const char *s = scalar(v);
  char *end;
  if (strcmp(key, "max_attempts") == 0) {
    long m = s ? strtol(s, &end, 10) : 0;
    if (!s || *end || m < 1 || m > 1000000)
      return fail(l, v, "max_attempts: expected a whole number >= 1");
    r->max_attempts = (uint32_t)m;
  } else if (strcmp(key, "dead_letter") == 0) {
    if (!s || !*s || strlen(s) > RETRY_NAME_MAX)
      return fail(l, v, "dead_letter: expected a queue name pattern");
    strcpy(r->dead_letter, s);
  } else if (strcmp(key, "processing_timeout") == 0) {
    r->processing_timeout_ms = 0;
    if (!s || (strcmp(s, "off") != 0 &&
               retry_delay_parse(s, strlen(s), &r->processing_timeout_ms)))
      return fail(l, v,
                  "processing_timeout: expected off or a delay like 30s, "
                  "5m (at most 24h)");
  } else if (strcmp(key, "queue_type") == 0) {
    if (!s || retry_queue_type_parse(s, strlen(s), &r->queue_type) != 0)
      return fail(l, v, "queue_type: expected auto, quorum or classic");
  } else {
    return 1;
  }
  return 0;
}

/* The keys given (queues, tiers), for the checks of the whole policy. */
typedef struct policy_seen {
  bool queues, tiers;
} policy_seen;

static int policy_key(loader *l, yaml_node_t *k, yaml_node_t *v, retry_rule *r,
                      policy_seen *seen) {
  char buf[4096];
  const char *key = scalar(k);
  if (!key)
    return fail(l, k, "expected a key");
  if (strcmp(key, "queues") == 0) {
    seen->queues = true;
    if (joined(l, v, buf, sizeof buf) || l->keys->parse_globs(buf, r))
      return fail(l, v, "queues: expected a list of up to %d globs",
                  RETRY_MAX_GLOBS);
  } else if (strcmp(key, "tiers") == 0) {
    seen->tiers = true;
    if (joined(l, v, buf, sizeof buf) || l->keys->parse_tiers(buf, r))
      return fail(l, v,
                  "tiers: expected up to %d delays like 500ms, 1s, 2m, 1h "
                  "(each at most 24h)",
                  RETRY_MAX_TIERS);
  } else if (strcmp(key, "backoff") == 0) {
    return load_backoff(l, v, r);
  } else {
    int rc = policy_scalar(l, key, v, r);
    if (rc <= 0)
      return rc;
    return fail(l, k,
                "unknown policy key '%s' (queues, tiers, backoff, "
                "max_attempts, dead_letter, queue_type, processing_timeout)",
                key);
  }
  return 0;
}

static int load_policy(loader *l, yaml_node_t *n, retry_rule *r) {
  char why[256];
  policy_seen seen = {false, false};
  if (n->type != YAML_MAPPING_NODE)
    return fail(l, n, "a policy is a mapping (queues, tiers, ...)");
  retry_rule_default(r);
  for (yaml_node_pair_t *p = n->data.mapping.pairs.start;
       p < n->data.mapping.pairs.top; p++)
    if (policy_key(l, yaml_document_get_node(&l->doc, p->key),
                   yaml_document_get_node(&l->doc, p->value), r, &seen))
      return -1;
  if (!seen.queues)
    return fail(l, n, "a policy needs 'queues'");
  if (seen.tiers && r->backoff.initial_ms)
    return fail(l, n, "a policy has either 'tiers' or 'backoff', not both");
  if (retry_rule_compile(r, why, sizeof why) != 0)
    return fail(l, n, "%s", why);
  return 0;
}

static int load_retry(loader *l, yaml_node_t *n, px_config *cfg) {
  if (n->type != YAML_MAPPING_NODE)
    return fail(l, n, "retry: expected a mapping");
  for (yaml_node_pair_t *p = n->data.mapping.pairs.start;
       p < n->data.mapping.pairs.top; p++) {
    yaml_node_t *k = yaml_document_get_node(&l->doc, p->key);
    yaml_node_t *v = yaml_document_get_node(&l->doc, p->value);
    const char *key = scalar(k);
    if (key && strcmp(key, "header_prefix") == 0) {
      if (!scalar(v) || l->keys->set(cfg, "header-prefix", scalar(v)))
        return fail(l, v, "header_prefix: expected a short string");
    } else if (key && strcmp(key, "policies") == 0) {
      if (v->type != YAML_SEQUENCE_NODE)
        return fail(l, v, "policies: expected a list of policies");
      unsigned n_rules = 0;
      for (yaml_node_item_t *it = v->data.sequence.items.start;
           it < v->data.sequence.items.top; it++) {
        yaml_node_t *item = yaml_document_get_node(&l->doc, *it);
        if (n_rules == PX_MAX_RULES)
          return fail(l, item, "at most %d policies", PX_MAX_RULES);
        if (load_policy(l, item, &cfg->rules[n_rules]))
          return -1;
        n_rules++;
      }
      cfg->retry.nrules = n_rules; /* none: nothing is intercepted */
    } else {
      return fail(l, k, "unknown retry key '%s' (header_prefix, policies)",
                  key ? key : "?");
    }
  }
  return 0;
}

/* A key given twice in one mapping is an error (YAML says keys are
 * unique; silently keeping the last would hide a mistake). */
static int no_duplicate_keys(loader *l) {
  for (yaml_node_t *n = l->doc.nodes.start; n < l->doc.nodes.top; n++) {
    if (n->type != YAML_MAPPING_NODE)
      continue;
    yaml_node_pair_t *pairs = n->data.mapping.pairs.start;
    size_t count = (size_t)(n->data.mapping.pairs.top - pairs);
    for (size_t i = 1; i < count; i++) {
      yaml_node_t *k = yaml_document_get_node(&l->doc, pairs[i].key);
      const char *key = scalar(k);
      for (size_t j = 0; key && j < i; j++) {
        yaml_node_t *first = yaml_document_get_node(&l->doc, pairs[j].key);
        if (scalar(first) && strcmp(scalar(first), key) == 0)
          return fail(l, k, "duplicate key '%s' (first at line %lu)", key,
                      (unsigned long)first->start_mark.line + 1);
      }
    }
  }
  return 0;
}

static int load_root(loader *l, px_config *cfg) {
  yaml_node_t *root = yaml_document_get_root_node(&l->doc);
  char buf[4096];
  if (!root)
    return 0; /* an empty file changes nothing */
  if (root->type != YAML_MAPPING_NODE)
    return fail(l, root, "expected a mapping of settings");
  for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
       p < root->data.mapping.pairs.top; p++) {
    yaml_node_t *k = yaml_document_get_node(&l->doc, p->key);
    yaml_node_t *v = yaml_document_get_node(&l->doc, p->value);
    const char *key = scalar(k);
    if (!key)
      return fail(l, k, "expected a key");
    if (strcmp(key, "retry") == 0) {
      if (load_retry(l, v, cfg))
        return -1;
      continue;
    }
    const char *flag = l->keys->flag_for_key(key);
    if (!flag)
      return fail(l, k, "unknown key '%s'", key);
    if (joined(l, v, buf, sizeof buf))
      return -1;
    if (l->keys->set(cfg, flag, buf) != 0)
      return fail(l, v, "%s: invalid value '%s' (expected %s)", key, buf,
                  l->keys->expected(flag));
  }
  return 0;
}

int px_config_read_file(px_config *cfg, const px_config_keys *keys,
                        const char *path, char *err, size_t errlen) {
  loader l = {.path = path, .err = err, .errlen = errlen, .keys = keys};
  yaml_parser_t parser;
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  yaml_parser_initialize(&parser);
  yaml_parser_set_input_file(&parser, f);
  int rc = -1;
  if (!yaml_parser_load(&parser, &l.doc)) {
    snprintf(err, errlen, "%s:%lu: %s", path,
             (unsigned long)parser.problem_mark.line + 1,
             parser.problem ? parser.problem : "invalid YAML");
  } else {
    rc = no_duplicate_keys(&l) ? -1 : load_root(&l, cfg);
    yaml_document_delete(&l.doc);
  }
  yaml_parser_delete(&parser);
  fclose(f);
  return rc;
}
