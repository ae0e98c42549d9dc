/* px_metrics_merge.c - one exposition out of several workers'
 * (px_metrics.h).
 *
 * The texts come from px_metrics_render, so each line is a "# HELP" or
 * "# TYPE" line of the family that follows, or a sample "NAME{LABELS}
 * VALUE" / "NAME VALUE". A sample belongs to the family of the header
 * before it; the series key is everything before the last space.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "px_admin.h"
#include "px_metrics.h"

enum rule { SUM, FIRST, MAX, MIN };

typedef struct series {
  const char *key;
  size_t klen;
  unsigned next; /* the next series of its family (0: none; 1-based) */
  enum rule rule;
  bool integral; /* every value so far a whole number: `u` exact */
  uint64_t u;
  double d;
} series;

typedef struct family {
  const char *name, *head; /* head: its header lines, in the first text */
  size_t nlen, hlen;
  unsigned first, last; /* series, 1-based */
} family;

typedef struct merge {
  family *fam;
  unsigned nfam, capfam;
  series *ser;
  unsigned nser, capser;
  unsigned *slot; /* hash of series keys to 1-based indices */
  unsigned nslot; /* a power of two, at least twice nser */
} merge;

static const struct {
  const char *name;
  enum rule rule;
} rules[] = {
    {"rebound_ready", FIRST},
    {"rebound_uptime_seconds", FIRST},
    {"rebound_build_info", FIRST},
    {"process_start_time_seconds", FIRST},
    {"rebound_tls_certificate_expiry_seconds", FIRST},
    {"rebound_unsettled_oldest_seconds", MAX},
    /* workers that watch the same queue see the same thing */
    {"rebound_tier_depth", MAX},
    {"rebound_tier_oldest_age_seconds", MAX},
    {"rebound_tier_overdue", MAX},
    {"rebound_dead_letter_depth", MAX},
    {"rebound_source_queue_missing", MAX},
    {"rebound_tier_queue_info", MAX},
    /* a descriptor limit is per process: the fullest one counts */
    {"process_open_fds", MAX},
    {"process_max_fds", MIN},
};

static enum rule rule_of(const char *key, size_t klen) {
  const char *brace = memchr(key, '{', klen);
  size_t len = brace ? (size_t)(brace - key) : klen;
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
    if (strlen(rules[i].name) == len && memcmp(rules[i].name, key, len) == 0)
      return rules[i].rule;
  return SUM;
}

static uint32_t hash(const char *s, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 16777619u;
  return h;
}

static unsigned *find_slot(merge *m, const char *key, size_t klen) {
  unsigned mask = m->nslot - 1;
  for (uint32_t i = hash(key, klen) & mask;; i = (i + 1) & mask) {
    unsigned *slot = &m->slot[i];
    const series *s = *slot ? &m->ser[*slot - 1] : NULL;
    if (!s || (s->klen == klen && memcmp(s->key, key, klen) == 0))
      return slot;
  }
}

static int grow_slots(merge *m) {
  unsigned n = m->nslot ? m->nslot * 2 : 256;
  unsigned *old = m->slot, nold = m->nslot;
  if (!(m->slot = calloc(n, sizeof *m->slot))) {
    m->slot = old;
    return -1;
  }
  m->nslot = n;
  for (unsigned i = 0; i < nold; i++)
    if (old[i]) {
      const series *s = &m->ser[old[i] - 1];
      *find_slot(m, s->key, s->klen) = old[i];
    }
  free(old);
  return 0;
}

static int grow(void **p, unsigned *cap, size_t size) {
  unsigned n = *cap ? *cap * 2 : 64;
  void *q = realloc(*p, n * size);
  if (!q)
    return -1;
  *p = q;
  *cap = n;
  return 0;
}

/* The family named by a header line ("# HELP NAME ..."), added if new:
 * its index, or -1 (out of memory). */
static int family_of(merge *m, const char *line, size_t len, bool *added) {
  const char *name = line + 7, *end = memchr(name, ' ', len - 7);
  size_t nlen = end ? (size_t)(end - name) : len - 7;
  *added = false;
  for (unsigned i = 0; i < m->nfam; i++)
    if (m->fam[i].nlen == nlen && memcmp(m->fam[i].name, name, nlen) == 0)
      return (int)i;
  if (m->nfam == m->capfam &&
      grow((void **)&m->fam, &m->capfam, sizeof *m->fam) != 0)
    return -1;
  m->fam[m->nfam] = (family){name, line, nlen, 0, 0, 0};
  *added = true;
  return (int)m->nfam++;
}

static void add_value(series *s, const char *v, bool first) {
  char *end;
  bool whole = strspn(v, "0123456789") > 0 && !v[strspn(v, "0123456789")];
  uint64_t u = whole ? strtoull(v, &end, 10) : 0;
  double d = strtod(v, &end);
  if (first) {
    s->integral = whole;
    s->u = u;
    s->d = d;
    return;
  }
  if (s->rule == FIRST)
    return;
  if (s->rule == MAX || s->rule == MIN) {
    bool more = s->rule == MAX;
    s->integral = s->integral && whole;
    s->u = (u > s->u) == more ? u : s->u;
    s->d = (d > s->d) == more ? d : s->d;
    return;
  }
  s->integral = s->integral && whole;
  s->u += u;
  s->d += d;
}

/* A sample line of family `f`: its series, added if new. */
static int take_sample(merge *m, int f, const char *line, size_t len) {
  char val[64];
  const char *sp = line + len;
  while (sp > line && sp[-1] != ' ')
    sp--;
  if (sp == line || f < 0 || (size_t)(line + len - sp) >= sizeof val)
    return 0; /* not a sample of a family: left out */
  size_t klen = (size_t)(sp - 1 - line);
  memcpy(val, sp, (size_t)(line + len - sp));
  val[line + len - sp] = '\0';
  if ((m->nser + 1) * 2 > m->nslot && grow_slots(m) != 0)
    return -1;
  unsigned *slot = find_slot(m, line, klen);
  if (*slot) {
    add_value(&m->ser[*slot - 1], val, false);
    return 0;
  }
  if (m->nser == m->capser &&
      grow((void **)&m->ser, &m->capser, sizeof *m->ser) != 0)
    return -1;
  series *s = &m->ser[m->nser];
  *s = (series){line, klen, 0, rule_of(line, klen), false, 0, 0};
  add_value(s, val, true);
  *slot = ++m->nser;
  family *fam = &m->fam[f];
  if (fam->last)
    m->ser[fam->last - 1].next = m->nser;
  else
    fam->first = m->nser;
  fam->last = m->nser;
  return 0;
}

/* A "# TYPE NAME KIND" line: whether KIND sums across restarts. */
static bool monotonic(const char *line, size_t n) {
  const char *sp = line + n;
  while (sp > line && sp[-1] != ' ')
    sp--;
  size_t k = (size_t)(line + n - sp);
  return (k == 7 && memcmp(sp, "counter", 7) == 0) ||
         (k == 9 && memcmp(sp, "histogram", 9) == 0);
}

static int take_text(merge *m, const char *t, size_t len, bool only) {
  int f = -1;
  bool in_new_head = false, skip = false;
  for (const char *p = t, *end = t + len; p < end;) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
    bool help = n > 7 && memcmp(p, "# HELP ", 7) == 0;
    int rc = 0;
    if (help) {
      if ((f = family_of(m, p, n, &in_new_head)) < 0)
        return -1;
    } else if (n > 7 && memcmp(p, "# TYPE ", 7) == 0) {
      skip = only && !monotonic(p, n); /* and part of the head */
    } else if (n > 0 && p[0] == '#') {
      /* another comment: part of the head being read */
    } else if (n > 0 && !skip) {
      in_new_head = false;
      rc = take_sample(m, f, p, n);
    }
    if (rc != 0)
      return -1;
    if (in_new_head)
      m->fam[f].hlen = (size_t)(p + n + 1 - m->fam[f].head);
    p += n + 1;
  }
  return 0;
}

static void render(const merge *m, px_admin_response *r) {
  for (unsigned i = 0; i < m->nfam; i++) {
    const family *f = &m->fam[i];
    px_admin_append(r, f->head, f->hlen);
    for (unsigned k = f->first; k; k = m->ser[k - 1].next) {
      const series *s = &m->ser[k - 1];
      px_admin_append(r, s->key, s->klen);
      if (s->integral)
        px_admin_printf(r, " %llu\n", (unsigned long long)s->u);
      else
        px_admin_printf(r, " %.15g\n", s->d);
    }
  }
}

int px_metrics_merge(const char *const *texts, const size_t *lens,
                     const bool *counters_only, unsigned n,
                     px_admin_response *r) {
  merge m;
  int rc = 0;
  memset(&m, 0, sizeof m);
  for (unsigned i = 0; i < n && rc == 0; i++)
    rc = take_text(&m, texts[i], lens[i], counters_only && counters_only[i]);
  if (rc == 0)
    render(&m, r);
  free(m.fam);
  free(m.ser);
  free(m.slot);
  return rc;
}
