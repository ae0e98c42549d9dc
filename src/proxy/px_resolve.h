/* px_resolve.h - an address to bind, from what a user wrote.
 *
 * Listeners take a numeric IP or a host name; a name is resolved once,
 * when the listener is made (start-up, reload), never on the hot path.
 */
#ifndef PX_RESOLVE_H
#define PX_RESOLVE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* `host` and `port` as a socket address to bind: a numeric IP, or a host
 * name resolved now (getaddrinfo, blocking; its first address). 0, or -1
 * with the reason in `why`. */
int px_addr_resolve(const char *host, uint16_t port,
                    struct sockaddr_storage *ss, char *why, size_t cap);

#endif
