/* rebound - a transparent AMQP 0-9-1 proxy that turns requeues into
 * delayed, counted retries. */
#include <llhttp.h>
#include <openssl/opensslv.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>
#include <yaml.h>

static void print_usage(FILE *out) {
  fputs("Usage: rebound [OPTIONS]\n"
        "\n"
        "A transparent AMQP 0-9-1 proxy in front of RabbitMQ that turns\n"
        "basic.nack/basic.reject with requeue=true into a delayed, counted\n"
        "retry, and dead-letters a message after max_attempts.\n"
        "\n"
        "Options:\n"
        "  --upstream HOST:PORT  the RabbitMQ to proxy to\n"
        "  -h, --help            show this help and exit\n"
        "  -V, --version         show the version and the libraries in use\n",
        out);
}

static void print_version(void) {
  printf("rebound %s (libuv %s, %s, llhttp %d.%d.%d, libyaml %s)\n",
         REBOUND_VERSION, uv_version_string(), OPENSSL_VERSION_TEXT,
         LLHTTP_VERSION_MAJOR, LLHTTP_VERSION_MINOR, LLHTTP_VERSION_PATCH,
         yaml_get_version_string());
}

int main(int argc, char **argv) {
  const char *upstream = "127.0.0.1:5672";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--upstream") == 0 && i + 1 < argc) {
      upstream = argv[++i];
      continue;
    }
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      print_usage(stdout);
      return 0;
    }
    if (strcmp(argv[i], "-V") == 0 || strcmp(argv[i], "--version") == 0) {
      print_version();
      return 0;
    }
    fprintf(stderr, "rebound: unknown option '%s'\n", argv[i]);
    print_usage(stderr);
    return 2;
  }
  fprintf(stderr,
          "rebound: this version has the AMQP codec only; proxying to %s "
          "is not available yet (only --help and --version work)\n",
          upstream);
  return 1;
}
