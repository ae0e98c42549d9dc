#include "px_resolve.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

int px_addr_resolve(const char *host, uint16_t port,
                    struct sockaddr_storage *ss, char *why, size_t cap) {
  memset(ss, 0, sizeof *ss);
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0 ||
      uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0)
    return 0;
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE},
                  *res = NULL;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0 || !res) {
    snprintf(why, cap, "cannot resolve host name '%s': %s", host,
             rc ? gai_strerror(rc) : "no address");
    return -1;
  }
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  if (ss->ss_family == AF_INET6)
    ((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
  else
    ((struct sockaddr_in *)ss)->sin_port = htons(port);
  freeaddrinfo(res);
  return 0;
}
