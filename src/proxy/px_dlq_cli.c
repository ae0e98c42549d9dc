/* px_dlq_cli.c - `rebound dlq` (px_dlq_cli.h): parse the command line,
 * run one px_dlq operation on a loop of its own, print what it says. */
#define _DEFAULT_SOURCE /* explicit_bzero */
#include "px_dlq_cli.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

#include "px_admin.h"
#include "px_dlq.h"
#include "px_dlq_json.h"
#include "px_log.h"
#include "px_tls.h"

#define EXIT_USAGE 2
#define SHOW_DEFAULT_LIMIT 10
#define PROGRESS_EVERY 1000
#define PROGRESS_MS 1000
#define TEXT_PREVIEW 200
#define ADMIN_TIMEOUT_S 2

static const char usage[] =
    "Usage: rebound dlq COMMAND [ARGS] [OPTIONS]\n"
    "\n"
    "Dead-letter queues, talking AMQP to the broker:\n"
    "  ls [QUEUE...]          the dead-letter queues of the policies (those\n"
    "                         naming a queue without a wildcard) and those\n"
    "                         given, with their message counts\n"
    "  show QUEUE             print messages without removing them\n"
    "  redrive QUEUE          move messages back to their source queue, the\n"
    "                         retry count reset\n"
    "  purge QUEUE            remove messages\n"
    "\n"
    "Options:\n"
    "  --url URL              amqp[s]://USER[:PASSWORD]@HOST[:PORT]/VHOST\n"
    "                         (env REBOUND_URL; a password here is visible\n"
    "                         in ps: prefer the two below)\n"
    "  --password-file FILE   the password, on the first line of FILE (env\n"
    "                         REBOUND_PASSWORD_FILE; or REBOUND_PASSWORD)\n"
    "  --limit N              at most N messages (show: 10 by default)\n"
    "  --json                 ls, show: JSON output\n"
    "  --to QUEUE             redrive: to this queue instead of the source\n"
    "  --dry-run              redrive: print what would move, move nothing\n"
    "  --quiet                no progress lines\n"
    "  --admin HOST:PORT      ls: also the queues a running rebound parked\n"
    "                         messages into (default: the config's admin)\n"
    "  and rebound's own options: --config (the policies), --header-prefix,\n"
    "  --upstream-ca, --upstream-cert, --upstream-key, --upstream-verify,\n"
    "  --connect-timeout, --log-level ...\n"
    "\n"
    "Exit status: 0 done; 1 failed part-way (what moved is printed); 2 usage\n"
    "or configuration error; 3 broker unreachable; 4 refused by the broker\n"
    "(login, vhost, permissions); 5 no such queue.\n";

typedef struct cli {
  px_dlq_request req;
  px_config *cfg;
  uv_loop_t loop;
  px_clock clock; /* on loop: the connection's dialer's */
  bool json, quiet, have_limit;
  const char *cmd;
  const char *url, *password_file, *admin;
  int exit_code;
  uint64_t last_progress, last_progress_ms;
  px_admin_response out; /* JSON being built */
  unsigned items;        /* JSON array entries written */
  const char *names[PX_DLQ_MAX_QUEUES];
  uv_signal_t *sigs; /* SIGINT, SIGTERM while the operation runs */
} cli;

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int fail(const char *fmt, ...) {
  va_list ap;
  fputs("rebound dlq: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return EXIT_USAGE;
}

/* ---- the URL ---- */

int px_amqp_url_parse(const char *s, px_amqp_url *u, char *err, size_t cap) {
  memset(u, 0, sizeof *u);
  size_t scheme = strncmp(s, "amqp://", 7) == 0    ? 7
                  : strncmp(s, "amqps://", 8) == 0 ? 8
                                                   : 0;
  if (!scheme) {
    snprintf(err, cap,
             "--url: expected amqp://USER@HOST[:PORT]/VHOST or "
             "amqps://..., not a URL starting otherwise");
    return -1;
  }
  /* the user part ends at the authority's last '@' (an '@' in the
   * password may go unencoded) */
  const char *rest = s + scheme, *at = NULL;
  for (const char *p = rest; *p && *p != '/'; p++)
    if (*p == '@')
      at = p;
  if (!at) {
    snprintf(err, cap, "--url: no user: expected USER@ after %.*s", (int)scheme,
             s);
    return -1;
  }
  const char *colon = memchr(rest, ':', (size_t)(at - rest));
  size_t ulen = (size_t)((colon ? colon : at) - rest);
  u->has_password = colon != NULL;
  if (px_admin_decode(rest, ulen, u->user, sizeof u->user) != 0 ||
      !u->user[0] ||
      (colon && px_admin_decode(colon + 1, (size_t)(at - colon - 1),
                                u->password, sizeof u->password) != 0)) {
    snprintf(err, cap,
             "--url: the user or password is empty, too long or "
             "badly percent-encoded");
    return -1;
  }
  const char *host = at + 1, *path = strchr(host, '/');
  char hostport[300];
  snprintf(hostport, sizeof hostport, "%.*s%.*s", (int)scheme, s,
           (int)(path ? (size_t)(path - host) : strlen(host)), host);
  if (px_upstream_parse(hostport, &u->addr) != 0) {
    snprintf(err, cap,
             "--url: bad host or port in '%s' (expected HOST, "
             "HOST:PORT or [IPv6]:PORT)",
             hostport);
    return -1;
  }
  if (!path || !path[1]) {
    snprintf(u->vhost, sizeof u->vhost, "/");
  } else if (px_admin_decode(path + 1, strlen(path + 1), u->vhost,
                             sizeof u->vhost) != 0) {
    snprintf(err, cap, "--url: bad vhost '%s' (percent-encode it: / is %%2F)",
             path + 1);
    return -1;
  }
  return 0;
}

/* ---- the password ---- */

static int read_password_file(const char *path, char *out, size_t cap) {
  FILE *f = fopen(path, "r");
  if (!f)
    return fail("--password-file %s: %s", path, strerror(errno));
  setvbuf(f, NULL, _IONBF, 0); /* no stdio copy of it left behind */
  bool ok = fgets(out, (int)cap, f) != NULL;
  fclose(f);
  if (!ok)
    return fail("--password-file %s: empty", path);
  out[strcspn(out, "\r\n")] = '\0';
  return 0;
}

/* The password: a file, the environment, or the URL (in that order). */
static int password(cli *c, const px_amqp_url *u,
                    const char *(*env)(const char *)) {
  const char *file =
      c->password_file ? c->password_file : env("REBOUND_PASSWORD_FILE");
  const char *pw = env("REBOUND_PASSWORD");
  if (file && file[0])
    return read_password_file(file, c->req.password, sizeof c->req.password);
  if (pw) {
    snprintf(c->req.password, sizeof c->req.password, "%s", pw);
    return 0;
  }
  if (!u->has_password)
    return fail("no password for user '%s': give --password-file FILE, "
                "REBOUND_PASSWORD, or one in the URL",
                u->user);
  snprintf(c->req.password, sizeof c->req.password, "%s", u->password);
  return 0;
}

/* ---- arguments ---- */

static int parse_limit(cli *c, const char *v) {
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno || *end || !*v || v[0] == '-' || n == 0)
    return fail("--limit: expected a whole number of messages >= 1, not '%s'",
                v);
  c->req.limit = n;
  c->have_limit = true;
  return 0;
}

/* One of the command's own options at argv[*i] (value in the next
 * argument or after '='): 1 if taken, 0 if not one, 2 on error. */
static int own_option(cli *c, int argc, char **argv, int *i) {
  static const char *const with_value[] = {"url", "password-file", "limit",
                                           "to", "admin"};
  const char *a = argv[*i] + 2, *eq = strchr(a, '=');
  size_t n = eq ? (size_t)(eq - a) : strlen(a);
  if (n == 4 && strncmp(a, "json", 4) == 0 && !eq)
    return c->json = true, 1;
  if (n == 5 && strncmp(a, "quiet", 5) == 0 && !eq)
    return c->quiet = true, 1;
  if (n == 7 && strncmp(a, "dry-run", 7) == 0 && !eq)
    return c->req.dry_run = true, 1;
  for (size_t k = 0; k < 5; k++) {
    if (n != strlen(with_value[k]) || strncmp(a, with_value[k], n) != 0)
      continue;
    const char *v = eq ? eq + 1 : *i + 1 < argc ? argv[++*i] : NULL;
    if (!v)
      return fail("--%s needs a value", with_value[k]), 2;
    if (k == 0)
      c->url = v;
    else if (k == 1)
      c->password_file = v;
    else if (k == 2)
      return parse_limit(c, v) ? 2 : 1;
    else if (k == 3 && strlen(v) > RETRY_NAME_MAX)
      return fail("--to: a queue name is at most 255 bytes"), 2;
    else if (k == 3)
      snprintf(c->req.to, sizeof c->req.to, "%s", v);
    else
      c->admin = v;
    return 1;
  }
  return 0;
}

static int add_name(cli *c, const char *name) {
  if (px_dlq_add_queue(&c->req, name) != 0)
    return fail("'%.40s...': at most %d queues, each name at most 255 bytes",
                name, PX_DLQ_MAX_QUEUES);
  return 0;
}

/* Split argv: the command, its queue arguments, its own options; the rest
 * go to the config loader (`rest`, argv[0] first). */
static int parse_args(cli *c, int argc, char **argv, char **rest, int *nrest) {
  *nrest = 0;
  rest[(*nrest)++] = "rebound";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
      return -1;
    if (strncmp(a, "--", 2) == 0) {
      int r = own_option(c, argc, argv, &i);
      if (r == 2)
        return EXIT_USAGE;
      if (r == 0) {
        rest[(*nrest)++] = argv[i];
        if (!strchr(a, '=') && i + 1 < argc && strncmp(argv[i + 1], "--", 2))
          rest[(*nrest)++] = argv[++i];
      }
    } else if (!c->cmd) {
      c->cmd = a;
    } else if (add_name(c, a) != 0) {
      return EXIT_USAGE;
    }
  }
  return 0;
}

static int check_command(cli *c) {
  static const char *const cmds[] = {"ls", "show", "redrive", "purge"};
  static const px_dlq_kind kinds[] = {PX_DLQ_COUNT, PX_DLQ_SHOW, PX_DLQ_REDRIVE,
                                      PX_DLQ_PURGE};
  for (size_t i = 0; c->cmd && i < 4; i++) {
    if (strcmp(c->cmd, cmds[i]) != 0)
      continue;
    c->req.kind = kinds[i];
    if (i > 0 && c->req.nqueues != 1)
      return fail("%s: expected one QUEUE, got %u", c->cmd, c->req.nqueues);
    if (i > 0)
      snprintf(c->req.queue, sizeof c->req.queue, "%s", c->req.queues[0]);
    if ((c->req.to[0] || c->req.dry_run) && i != 2)
      return fail("%s: --to and --dry-run are redrive's", c->cmd);
    if (c->req.to[0] && strcmp(c->req.to, c->req.queue) == 0)
      return fail("redrive: --to %s is the queue redriven", c->req.to);
    if (i == 1 && !c->have_limit)
      c->req.limit = SHOW_DEFAULT_LIMIT;
    return 0;
  }
  return fail("%s%s: expected ls, show, redrive or purge (see --help)",
              c->cmd ? "unknown command " : "no command", c->cmd ? c->cmd : "");
}

/* GET /v1/dlq/names from a running rebound's admin endpoint at `addr`:
 * the body, or NULL (why in `err`). Blocking, ADMIN_TIMEOUT_S at most per
 * step: the command has nothing else to do meanwhile. */
static char *admin_names(const char *addr, char *err, size_t cap) {
  px_addr a;
  struct sockaddr_storage ss;
  struct timeval tv = {ADMIN_TIMEOUT_S, 0};
  if (px_addr_parse(addr, &a) != 0 ||
      (uv_ip4_addr(a.host, a.port, (struct sockaddr_in *)&ss) != 0 &&
       uv_ip6_addr(a.host, a.port, (struct sockaddr_in6 *)&ss) != 0)) {
    snprintf(err, cap, "--admin: expected a numeric HOST:PORT, not '%s'", addr);
    return NULL;
  }
  int fd = socket(ss.ss_family, SOCK_STREAM, 0);
  char req[] = "GET /v1/dlq/names HTTP/1.0\r\n\r\n", *buf = malloc(65536);
  size_t len = 0;
  ssize_t n = -1;
  if (fd >= 0 && buf &&
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0 &&
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0 &&
      connect(fd, (struct sockaddr *)&ss,
              ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                       : sizeof(struct sockaddr_in)) == 0 &&
      write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1))
    while (len < 65535 && (n = read(fd, buf + len, 65535 - len)) > 0)
      len += (size_t)n;
  if (fd >= 0)
    close(fd);
  char *body =
      buf && n == 0 ? strstr((buf[len] = '\0', buf), "\r\n\r\n") : NULL;
  if (!body || strncmp(buf, "HTTP/1.1 200 ", 13) != 0) {
    snprintf(err, cap, "%s: %s", addr,
             !buf || n != 0 ? strerror(errno) : "not rebound's admin endpoint");
    free(buf);
    return NULL;
  }
  memmove(buf, body + 4, strlen(body + 4) + 1);
  return buf;
}

/* ls: the queues a running rebound parked messages into (its admin
 * endpoint: --admin, or the config's; a missing one is noted only when
 * asked for by --admin). */
static int running_queues(cli *c) {
  char addr[300], err[400];
  if (!c->admin && !c->cfg->admin_on)
    return 0;
  if (!c->admin)
    px_addr_format(&c->cfg->admin, addr, sizeof addr);
  char *known = admin_names(c->admin ? c->admin : addr, err, sizeof err);
  if (!known) {
    if (c->admin)
      fprintf(stderr,
              "rebound dlq: note: no list from rebound (%s): only "
              "the policies' queues and those given\n",
              err);
    return 0;
  }
  int rc = 0;
  for (char *p = known, *nl; *p && rc == 0; p = nl + 1) {
    if (!(nl = strchr(p, '\n')))
      break;
    *nl = '\0';
    if (*p && add_name(c, p) != 0)
      rc = EXIT_USAGE;
  }
  free(known);
  return rc;
}

/* ls: the dead-letter queues of every policy queue written without a
 * wildcard, after those given. */
static int policy_queues(cli *c) {
  px_dlq_add_policy_queues(&c->req, &c->cfg->retry);
  if (running_queues(c) != 0)
    return EXIT_USAGE;
  if (c->req.nqueues == 0)
    return fail("ls: no dead-letter queue to list: the policies name none "
                "without a wildcard; give QUEUE names");
  return 0;
}

/* ---- output ---- */

static void flush_out(cli *c) {
  if (c->out.len)
    fwrite(c->out.body, 1, c->out.len, stdout);
  c->out.len = 0;
}

/* Text from the broker or a message, printed: control characters and
 * bytes that are not UTF-8 escaped (as JSON escapes them), so no
 * message can drive the terminal. */
static void put_text(FILE *f, const void *data, size_t len) {
  px_admin_response r = {.status = 200};
  px_admin_json_bytes(&r, data, len);
  if (r.len >= 2)
    fwrite(r.body + 1, 1, r.len - 2, f); /* without the quotes */
  free(r.body);
}

static void put_cstr(const char *s) {
  put_text(stdout, s, strlen(s));
}

static void on_count(void *ctx, const px_dlq_count *q) {
  cli *c = ctx;
  if (c->json) {
    px_admin_printf(&c->out, "%s", c->items++ ? ",\n  " : "");
    px_dlq_json_count(&c->out, q);
    return;
  }
  if (c->items++ == 0)
    printf("%-40s %10s %10s\n", "QUEUE", "MESSAGES", "CONSUMERS");
  put_cstr(q->name);
  printf("%*s", strlen(q->name) < 40 ? (int)(40 - strlen(q->name)) : 0, "");
  if (q->exists) {
    printf(" %10" PRIu32 " %10" PRIu32 "\n", q->messages, q->consumers);
    return;
  }
  printf(" %10s %10s  ", "-", "-");
  put_cstr(q->error ? q->error : "absent");
  putchar('\n');
}

static void text_header(cli *c, amqp_bytes h, const char *label,
                        const char *suffix, bool time) {
  amqp_bytes s;
  int64_t n;
  char iso[40];
  const retry_policy *p = &c->cfg->retry;
  if (!time && px_dlq_header_str(h, p, suffix, &s)) {
    printf("  %-21s ", label);
    put_text(stdout, s.ptr, s.len);
    putchar('\n');
  } else if (px_dlq_header_int(h, p, suffix, &n) && time)
    px_dlq_iso_time((uint64_t)n, iso, sizeof iso),
        printf("  %-21s %s\n", label, iso);
  else if (px_dlq_header_int(h, p, suffix, &n))
    printf("  %-21s %" PRId64 "\n", label, n);
  else
    printf("  %-21s -\n", label);
}

/* A message in text: rebound's headers by name, then its properties and
 * headers as --json shows them, and its body cut to TEXT_PREVIEW bytes. */
static void text_message(cli *c, const px_dlq_message *m) {
  amqp_bytes h = m->header->props.headers;
  printf("message %" PRIu64 "%s\n", m->index,
         m->redelivered ? " (redelivered)" : "");
  text_header(c, h, "source-queue:", "source-queue", false);
  text_header(c, h, "retry-count:", "retry-count", false);
  text_header(c, h, "reason:", "dead-letter-reason", false);
  text_header(c, h, "first-failed-at:", "first-failed-at", true);
  text_header(c, h, "last-failed-at:", "last-failed-at", true);
  text_header(c, h, "original-exchange:", "original-exchange", false);
  text_header(c, h, "original-routing-key:", "original-routing-key", false);
  text_header(c, h, "redriven-at:", "redriven-at", true);
  px_admin_response r = {.status = 200};
  px_dlq_json_properties(&r, &m->header->props);
  px_admin_printf(&r, "\n  %-21s ", "headers:");
  px_dlq_json_headers(&r, h);
  uint64_t shown = m->body_len < TEXT_PREVIEW ? m->body_len : TEXT_PREVIEW;
  px_admin_printf(&r, "\n  %-21s (%" PRIu64 " bytes) ", "body:", m->body_len);
  px_admin_json_bytes(&r, m->body, (size_t)shown);
  printf("  %-21s %.*s%s\n", "properties:", (int)r.len, r.body ? r.body : "",
         shown < m->body_len ? " ..." : "");
  free(r.body);
}

static void on_message(void *ctx, const px_dlq_message *m) {
  cli *c = ctx;
  if (c->req.kind == PX_DLQ_REDRIVE) { /* a dry run */
    amqp_bytes src;
    const char *to = c->req.to[0] ? c->req.to : NULL;
    bool has = px_dlq_header_str(m->header->props.headers, &c->cfg->retry,
                                 "source-queue", &src);
    printf("message %" PRIu64 " would go to ", m->index);
    if (to)
      put_cstr(to);
    else if (has)
      put_text(stdout, src.ptr, src.len);
    else
      printf("(nowhere)");
    putchar('\n');
    return;
  }
  if (!c->json) {
    text_message(c, m);
    return;
  }
  px_admin_printf(&c->out, "%s", c->items++ ? ",\n  " : "");
  px_dlq_json_message(&c->out, m, &c->cfg->retry);
}

static void on_progress(void *ctx, uint64_t done, uint64_t total) {
  cli *c = ctx;
  uint64_t now = uv_now(&c->loop);
  if (c->quiet || (done - c->last_progress < PROGRESS_EVERY &&
                   now - c->last_progress_ms < PROGRESS_MS))
    return;
  c->last_progress = done;
  c->last_progress_ms = now;
  if (c->req.limit && c->req.limit < total)
    total = c->req.limit;
  fprintf(stderr, "%s %s: %s %" PRIu64 " of %" PRIu64 "\n", c->cmd,
          c->req.queue, c->req.kind == PX_DLQ_PURGE ? "purged" : "moved", done,
          total);
}

static void print_result(cli *c, const px_dlq_result *r) {
  const char *q = c->req.queue;
  if (c->req.kind == PX_DLQ_REDRIVE && c->req.dry_run)
    printf("would move %" PRIu64 " messages from %s\n", r->browsed, q);
  else if (c->req.kind == PX_DLQ_REDRIVE)
    printf("moved %" PRIu64 " messages from %s (left there: %" PRIu64 ")\n",
           r->moved, q, r->not_moved);
  else if (c->req.kind == PX_DLQ_PURGE)
    printf("purged %" PRIu64 " messages from %s\n", r->purged, q);
  else if (c->req.kind == PX_DLQ_SHOW && !c->json)
    printf("%" PRIu64 " of %" PRIu64 " messages shown from %s (browsed with "
           "basic.get, given back by closing the channel)\n",
           r->browsed, r->total, q);
}

static void on_done(void *ctx, const px_dlq_result *r) {
  cli *c = ctx;
  for (int i = 0; c->sigs && i < 2; i++)
    c->sigs[i].data = NULL; /* the operation frees itself: signals end */
  if (c->json && c->req.kind == PX_DLQ_COUNT) {
    printf("{\"queues\": [\n  ");
    flush_out(c);
    printf("\n]}\n");
  } else if (c->json && c->req.kind == PX_DLQ_SHOW) {
    printf("{\"queue\": ");
    px_admin_response q = {.status = 200};
    px_admin_json_string(&q, c->req.queue);
    printf("%.*s, \"total\": %" PRIu64 ", \"messages\": [\n  ", (int)q.len,
           q.body, r->total);
    free(q.body);
    flush_out(c);
    printf("\n]}\n");
  }
  if (r->status == PX_DLQ_OK || r->moved || r->purged)
    print_result(c, r);
  c->exit_code = px_dlq_exit_code(r->status);
  if (r->status == PX_DLQ_OK && r->not_moved) {
    fprintf(stderr,
            "rebound dlq: redrive %s: %" PRIu64 " messages left there (%" PRIu64
            " without a source queue to go to: redrive them with --to; the "
            "others refused by the broker)\n",
            c->req.queue, r->not_moved, r->unsourced);
    c->exit_code = 1;
  }
  if (r->status != PX_DLQ_OK) {
    fprintf(stderr, "rebound dlq: %s%s%s: %s: ", c->cmd,
            c->req.kind == PX_DLQ_COUNT ? "" : " ",
            c->req.kind == PX_DLQ_COUNT ? "" : c->req.queue,
            px_dlq_status_text(r->status));
    put_text(stderr, r->error, strlen(r->error));
    fputc('\n', stderr);
  }
  fflush(stdout);
}

static const px_dlq_events events = {on_count, on_message, on_progress,
                                     on_done};

/* SIGINT or SIGTERM: stop taking messages and settle what is in flight
 * (px_dlq_stop), so an interrupted redrive duplicates nothing; a second
 * one ends the process at once. */
static void on_signal(uv_signal_t *sig, int signum) {
  px_dlq *d = sig->data;
  if (d) {
    fprintf(stderr, "rebound dlq: stopping: settling what is in flight "
                    "(again to quit at once)\n");
    px_dlq_stop(d);
    sig->data = NULL;
    return;
  }
  signal(signum, SIG_DFL);
  raise(signum);
}

static void on_signal_closed(uv_handle_t *h) {
  (void)h;
}

/* The operation on a loop of its own, with the signals watched. */
static void run_op(cli *c, px_tls_ctx *tls, px_dial_memory *memory) {
  uv_signal_t sigs[2];
  int signums[2] = {SIGINT, SIGTERM};
  px_clock_init(&c->clock, &c->loop);
  px_dlq *d = px_dlq_start(&c->loop, &c->clock, c->cfg, memory, tls, &c->req,
                           &events, c);
  if (!d) {
    fail("out of memory");
    px_clock_close(&c->clock);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    return;
  }
  for (int i = 0; i < 2; i++) {
    uv_signal_init(&c->loop, &sigs[i]);
    sigs[i].data = d;
    uv_signal_start(&sigs[i], on_signal, signums[i]);
    uv_unref((uv_handle_t *)&sigs[i]); /* the operation keeps the loop */
  }
  c->sigs = sigs;
  uv_run(&c->loop, UV_RUN_DEFAULT);
  c->sigs = NULL;
  for (int i = 0; i < 2; i++)
    uv_close((uv_handle_t *)&sigs[i], on_signal_closed);
  px_clock_close(&c->clock);
  uv_run(&c->loop, UV_RUN_DEFAULT);
}

/* ---- running ---- */

static int setup(cli *c, int argc, char **argv,
                 const char *(*env)(const char *), px_tls_ctx **tls) {
  char *rest[256], err[512];
  int nrest, rc;
  if (argc > 250)
    return fail("too many arguments");
  if ((rc = parse_args(c, argc, argv, rest, &nrest)) != 0) {
    if (rc < 0)
      fputs(usage, stdout);
    return rc < 0 ? 0 : rc;
  }
  if (!c->cmd) {
    fputs(usage, stderr);
    return EXIT_USAGE;
  }
  if ((rc = check_command(c)) != 0)
    return rc;
  if (px_config_load(c->cfg, nrest, rest, env, err, sizeof err) != PX_CONFIG_OK)
    return fail("%s", err);
  if (c->req.kind == PX_DLQ_COUNT && (rc = policy_queues(c)) != 0)
    return rc;
  const char *url = c->url ? c->url : env("REBOUND_URL");
  px_amqp_url u;
  if (!url)
    return fail("no broker: give --url amqp://USER@HOST:PORT/VHOST or set "
                "REBOUND_URL");
  if (px_amqp_url_parse(url, &u, err, sizeof err) != 0)
    return fail("%s", err);
  if (c->url && u.has_password)
    fprintf(stderr, "rebound dlq: note: the password in --url is visible to "
                    "other users (ps); use --password-file or "
                    "REBOUND_PASSWORD\n");
  if ((rc = password(c, &u, env)) != 0)
    return rc;
  explicit_bzero(u.password, sizeof u.password);
  snprintf(c->req.user, sizeof c->req.user, "%s", u.user);
  snprintf(c->req.vhost, sizeof c->req.vhost, "%s", u.vhost);
  c->cfg->upstream[0] = u.addr;
  c->cfg->n_upstreams = 1;
  if (!u.addr.tls)
    return -1; /* ready, no TLS */
  const px_tls_config *t = &c->cfg->tls;
  px_tls_opts o = {t->upstream_cert[0] ? t->upstream_cert : NULL,
                   t->upstream_key[0] ? t->upstream_key : NULL,
                   t->upstream_ca[0] ? t->upstream_ca : NULL,
                   !t->upstream_verify,
                   NULL,
                   NULL};
  if (!(*tls = px_tls_client_ctx(&o, err, sizeof err)))
    return fail("TLS: %s", err);
  return -1;
}

static bool log_level_given(int argc, char **argv,
                            const char *(*env)(const char *)) {
  for (int i = 0; i < argc; i++)
    if (strncmp(argv[i], "--log-level", 11) == 0)
      return true;
  return env("REBOUND_LOG_LEVEL") != NULL;
}

int px_dlq_cli_main(int argc, char **argv, const char *(*env)(const char *)) {
  cli *c = calloc(1, sizeof *c);
  px_tls_ctx *tls = NULL;
  px_dial_memory memory = {{0}};
  if (!c || !(c->cfg = calloc(1, sizeof *c->cfg))) {
    free(c);
    return 1;
  }
  c->req.name = "rebound dlq";
  int rc = setup(c, argc, argv, env, &tls);
  if (rc < 0) {
    px_log_set_level(log_level_given(argc, argv, env) ? c->cfg->log_level
                                                      : PX_LOG_ERROR);
    uv_loop_init(&c->loop);
    c->last_progress_ms = uv_now(&c->loop);
    c->exit_code = 1;
    run_op(c, tls, &memory);
    uv_loop_close(&c->loop);
    rc = c->exit_code;
  }
  explicit_bzero(c->req.password, sizeof c->req.password);
  px_tls_ctx_unref(tls);
  free(c->out.body);
  free(c->cfg);
  free(c);
  return rc;
}
