#!/usr/bin/env python3
"""Tiny recording TCP relay (stdlib only).

    capture_relay.py --listen PORT --upstream HOST:PORT --out PREFIX

Listens on 127.0.0.1:PORT, accepts exactly ONE connection, connects it to the
upstream, relays bytes both ways until both sides have closed, then writes

    PREFIX.client.hex   every byte the client sent, in order
    PREFIX.server.hex   every byte the upstream (broker) sent, in order

as lowercase hex, 64 hex characters (32 bytes) per line, nothing else, and exits.
Once listening it prints "LISTENING <port>" on stdout (PORT 0 picks a free port),
so a caller can wait for that line before connecting.
"""
import argparse
import socket
import sys
import threading


def pump(src, dst, sink):
    """Copy src -> dst, appending everything to sink, until EOF/error on src."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            sink.extend(data)
            dst.sendall(data)
    except OSError:
        pass
    # Propagate the half-close so the other side sees EOF too.
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def write_hex(path, data):
    hx = bytes(data).hex()
    with open(path, "w") as f:
        for i in range(0, len(hx), 64):
            f.write(hx[i:i + 64] + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", type=int, required=True, help="port on 127.0.0.1 (0 = any)")
    ap.add_argument("--upstream", required=True, help="HOST:PORT of the broker")
    ap.add_argument("--out", required=True, help="output prefix")
    ap.add_argument("--accept-timeout", type=float, default=120.0,
                    help="give up if no client connects within this many seconds")
    args = ap.parse_args()
    up_host, _, up_port = args.upstream.rpartition(":")

    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", args.listen))
    lsock.listen(1)
    lsock.settimeout(args.accept_timeout)
    print("LISTENING %d" % lsock.getsockname()[1], flush=True)
    try:
        client, _ = lsock.accept()
    except socket.timeout:
        sys.exit("capture_relay: no client connected")
    lsock.close()  # exactly one connection
    client.settimeout(None)
    upstream = socket.create_connection((up_host, int(up_port)))
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    from_client, from_server = bytearray(), bytearray()
    threads = [
        threading.Thread(target=pump, args=(client, upstream, from_client)),
        threading.Thread(target=pump, args=(upstream, client, from_server)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    upstream.close()

    write_hex(args.out + ".client.hex", from_client)
    write_hex(args.out + ".server.hex", from_server)
    print("captured client=%d server=%d bytes" % (len(from_client), len(from_server)),
          file=sys.stderr)


if __name__ == "__main__":
    main()
