/* rebound - a transparent AMQP 0-9-1 proxy that turns requeues into
 * delayed, counted retries. */
#include <errno.h>
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
 * before this process has its handlers must not end it (it is reading the
 * config now anyway). */
static void early_signals(void) {
  signal(SIGPIPE, SIG_IGN);
  if (getenv("REBOUND_WORKER"))
    signal(SIGHUP, SIG_IGN);
}

int main(int argc, char **argv) {
  px_config *cfg = malloc(sizeof *cfg); /* freed by px_server_free */
  char err[512];
  uv_loop_t loop;
  px_server srv;

  if (!cfg)
    return 1;
  early_signals();
  if (argc > 1 && strcmp(argv[1], "dlq") == 0) {
    free(cfg);
    return px_dlq_cli_main(argc - 1, argv + 1, env_get);
  }
  switch (px_config_load(cfg, argc, argv, env_get, err, sizeof err)) {
  case PX_CONFIG_HELP:
    px_config_usage(stdout);
    free(cfg);
    return 0;
  case PX_CONFIG_VERSION:
    print_version();
    free(cfg);
    return 0;
  case PX_CONFIG_ERROR:
    fprintf(stderr, "rebound: %s\n", err);
    free(cfg);
    return 2;
  case PX_CONFIG_OK:
    break;
  }
  px_log_set_level(cfg->log_level);
  px_log_set_format(cfg->log_format);
  if (cfg->workers > 1)
    px_log_set_worker((int)cfg->worker);
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
