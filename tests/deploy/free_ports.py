#!/usr/bin/env python3
"""Print N distinct loopback TCP ports that are free now (default 1).

All N sockets are bound before any is closed, so the ports differ."""
import socket
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
socks = [socket.socket() for _ in range(n)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
for s in socks:
    s.close()
