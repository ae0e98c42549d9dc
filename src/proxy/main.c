/* rebound - a transparent AMQP 0-9-1 proxy that turns requeues into
 * delayed, counted retries. */
#include <errno.h>
#include <fcntl.h>
#include <llhttp.h>
#include <openssl/opensslv.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <uv.h>
#include <yaml.h>

#include "px_buf.h"
#include "px_config.h"
#include "px_dlq_cli.h"
#include "px_log.h"
#include "px_metrics.h"
#include "px_pub.h"
#include "px_server.h"
#include "px_view.h"

static void print_version(void) {
  printf("rebound %s (libuv %s, %s, llhttp %d.%d.%d, libyaml %s)\n",
         REBOUND_VERSION, uv_version_string(), OPENSSL_VERSION_TEXT,
         LLHTTP_VERSION_MAJOR, LLHTTP_VERSION_MINOR, LLHTTP_VERSION_PATCH,
         yaml_get_version_string());
}

static const char *env_get(const char *name) {
  return getenv(name);
}

/* Each handle's owner closes it; one still open at exit is a bug, named
 * here and closed so the loop can end. */
static void close_walk(uv_handle_t *h, void *arg) {
  (void)arg;
  if (uv_is_closing(h))
    return;
  px_warn("exit_handle_unclosed",
          PX_S("type", uv_handle_type_name(uv_handle_get_type(h))));
  uv_close(h, NULL);
}

/* Every client takes two or three file descriptors (its socket, its
 * upstream's, its retry connection's): use all the hard limit allows. */
static void raise_fd_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
    return;
  uint64_t soft = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
    px_warn("fd_limit_raise_failed", PX_U("soft", soft),
            PX_U("hard", rl.rlim_max), PX_S("error", strerror(errno)));
  else
    px_info("fd_limit_raised", PX_U("from", soft), PX_U("to", rl.rlim_max));
}

/* Before anything else: a write to a closed socket is an error, not a
 * signal; and in a worker (px_workers.h), a reload worker 0 passes on
 * before this process has its handlers must neither end it nor be lost
 * (the file may have changed after this process read it): SIGHUP is
 * blocked, and px_server_start() unblocks it once its handler is in
 * place, which then runs for one that came meanwhile. */
static void early_signals(void) {
  signal(SIGPIPE, SIG_IGN);
  /* a logrotate's SIGUSR1 before the loop's handler is in place */
  signal(SIGUSR1, SIG_IGN);
  signal(SIGUSR2, SIG_IGN);
  if (getenv("REBOUND_WORKER")) {
    sigset_t hup;
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    sigprocmask(SIG_BLOCK, &hup, NULL);
  }
}

/* Descriptors 0-2 open (on /dev/null where they were closed), so that no
 * socket or log file of ours becomes one of them by chance. */
static void standard_fds(void) {
  for (int fd = 0; fd <= 2; fd++)
    if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
      return;
}

/* Take every `flag` out of argv; true if there was one. */
static bool take_flag(int *argc, char **argv, const char *flag) {
  int out = 1;
  bool found = false;
  for (int a = 1; a < *argc; a++) {
    if (strcmp(argv[a], flag) == 0)
      found = true;
    else
      argv[out++] = argv[a];
  }
  argv[out] = NULL;
  *argc = out;
  return found;
}

/* `n` addresses as "a,b,c" (or "off" when `on` is false). */
static const char *addrs_text(const px_addr *a, unsigned n, bool on, char *out,
                              size_t cap) {
  size_t len = 0;
  out[0] = '\0';
  if (!on)
    return "off";
  for (unsigned i = 0; i < n && len < cap; i++) {
    char one[300];
    len += (size_t)snprintf(out + len, cap - len, "%s%s%s", i ? "," : "",
                            a[i].tls ? "amqps://" : "",
                            px_addr_format(&a[i], one, sizeof one));
  }
  return out;
}

/* One line at start: what this process serves, where it sends clients,
 * which policies apply, and where the settings came from. */
static void log_config(const px_config *cfg) {
  char listen[320], tls[320], admin[320], ups[PX_MAX_UPSTREAMS * 310];
  char queues[2048];
  size_t len = 0;
  queues[0] = '\0';
  for (unsigned i = 0; i < cfg->retry.nrules && len < sizeof queues; i++)
    for (unsigned g = 0; g < cfg->retry.rules[i].nglobs && len < sizeof queues;
         g++)
      len += (size_t)snprintf(queues + len, sizeof queues - len, "%s%s",
                              !g ? (i ? "|" : "") : ",",
                              cfg->retry.rules[i].globs[g]);
  px_info(
      "config", PX_S("file", cfg->config_path[0] ? cfg->config_path : "none"),
      PX_S("listen",
           addrs_text(&cfg->listen, 1, cfg->listen_on, listen, sizeof listen)),
      PX_S("tls_listen", addrs_text(&cfg->tls.listen, 1, cfg->tls.listen_on,
                                    tls, sizeof tls)),
      PX_S("admin",
           addrs_text(&cfg->admin, 1, cfg->admin_on, admin, sizeof admin)),
      PX_S("upstreams",
           addrs_text(cfg->upstream, cfg->n_upstreams, true, ups, sizeof ups)),
      PX_U("workers", cfg->workers), PX_U("policies", cfg->retry.nrules),
      PX_S("policy_queues", queues));
  if (cfg->override.replaced > 1)
    px_warn("retry_flags_replace_policies",
            PX_U("file_policies", cfg->override.replaced),
            PX_S("kept", "the first, with the flags' fields changed"),
            PX_S("file", cfg->config_path));
}

/* --check: exit 0 with the effective settings on stdout, or 2. */
static int check_config(const px_config *cfg) {
  if (px_server_check(cfg) != 0) {
    fprintf(stderr, "rebound: --check: the configuration would not start "
                    "(the lines above say why)\n");
    return 2;
  }
  printf("# rebound %s: the configuration is valid (config file: %s)\n",
         REBOUND_VERSION, cfg->config_path[0] ? cfg->config_path : "none");
  px_config_print(cfg, stdout);
  if (cfg->override.replaced > 1)
    printf("# the retry flags replaced the file's %u policies with one: its "
           "first, with their fields changed\n",
           cfg->override.replaced);
  printf("# retry policies, first match wins:\n");
  for (unsigned i = 0; i < cfg->retry.nrules; i++) {
    px_admin_response r = {.status = 200};
    px_view_policy(&r, &cfg->retry.rules[i]);
    printf("%.*s\n", (int)r.len, r.body ? r.body : "");
    free(r.body);
  }
  return 0;
}

/* The settings, and the logger set from them: -1 to run on, or the exit
 * status (--help, --version, --check, a bad setting). */
static int load_config(px_config *cfg, int *argc, char **argv) {
  char err[512];
  bool check = take_flag(argc, argv, "--check");
  switch (px_config_load(cfg, *argc, argv, env_get, err, sizeof err)) {
  case PX_CONFIG_HELP:
    px_config_usage(stdout);
    return 0;
  case PX_CONFIG_VERSION:
    print_version();
    return 0;
  case PX_CONFIG_ERROR:
    fprintf(stderr, "rebound: %s\n", err);
    return 2;
  case PX_CONFIG_OK:
    break;
  }
  px_log_set_level(cfg->log_level);
  px_log_set_format(cfg->log_format);
  if (check)
    return check_config(cfg);
  int err_no = cfg->log_file[0] ? px_log_open_file(cfg->log_file) : 0;
  if (err_no) {
    fprintf(stderr,
            "rebound: --log-file %s: %s (expected a file rebound can "
            "create or append to)\n",
            cfg->log_file, strerror(err_no));
    return 2;
  }
  if (cfg->workers > 1)
    px_log_set_worker((int)cfg->worker);
  if (cfg->worker == 0)
    log_config(cfg);
  return -1;
}

int main(int argc, char **argv) {
  px_config *cfg = malloc(sizeof *cfg); /* freed by px_server_free */
  uv_loop_t loop;
  px_server srv;

  if (!cfg)
    return 1;
  standard_fds();
  early_signals();
  if (argc > 1 && strcmp(argv[1], "dlq") == 0) {
    free(cfg);
    return px_dlq_cli_main(argc - 1, argv + 1, env_get);
  }
  int done = load_config(cfg, &argc, argv);
  if (done >= 0) {
    free(cfg);
    return done;
  }
  raise_fd_limit();
  if (uv_loop_init(&loop) != 0)
    return 1;
  bool started = px_server_start(&srv, &loop, cfg) == 0;
  px_server_enable_reload(&srv, argc, argv, env_get);
  int rc = started && px_server_start_workers(&srv, argv) == 0 ? 0 : 1;
  if (rc == 0)
    uv_run(&loop, UV_RUN_DEFAULT); /* until drained (or the drain timeout) */
  if (started)
    px_server_close(&srv); /* then let the close callbacks run; a late
                            * signal no longer interrupts that */
  px_pub_close_all();
  if (started)
    px_clock_close(&srv.clock); /* the last steps of what closed above */
  uv_walk(&loop, close_walk, NULL);
  while (uv_run(&loop, UV_RUN_DEFAULT) != 0)
    ;
  if (uv_loop_close(&loop) != 0)
    px_warn("exit_handles_open", PX_S("reason", "handles left open"));
  px_chunk_pool_drain();
  px_conn_out_pool_drain();
  px_metrics_free(&srv);
  px_server_free(&srv);
  if (rc == 0)
    px_info("exit", PX_U("sessions_total", srv.stats.sessions_total));
  return rc;
}
