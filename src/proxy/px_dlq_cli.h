/* px_dlq_cli.h - `rebound dlq`: dead-letter queues from the command line
 * (README, "Dead letters"). */
#ifndef PX_DLQ_CLI_H
#define PX_DLQ_CLI_H

#include <stdbool.h>

#include "px_config.h"

/* A broker URL: amqp[s]://[USER[:PASSWORD]@]HOST[:PORT][/VHOST], user,
 * password and vhost percent-decoded, an absent or empty vhost "/". */
typedef struct px_amqp_url {
  px_addr addr; /* port 5672, or 5671 for amqps (addr.tls) */
  char user[256], password[256], vhost[256];
  bool has_password;
} px_amqp_url;

/* Parse `s`. 0, or -1 with the reason in `err` (naming the part that is
 * wrong, never the password). */
int px_amqp_url_parse(const char *s, px_amqp_url *out, char *err, size_t cap);

/* `rebound dlq ARGS...` (argv[0] is "dlq"): the exit code. */
int px_dlq_cli_main(int argc, char **argv, const char *(*env)(const char *));

#endif
