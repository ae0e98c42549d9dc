#!/usr/bin/python3
"""Memory per kept delivery: rebound against HAProxy, in front of a private
RabbitMQ.

  bench/kept_bench.py [--messages N] [--body-size B] [--binary PATH]

N messages of B bytes (default 20,000 of 256 B) are published to a queue
that rebound's policy covers; a pika consumer (acks, prefetch 0, so the
broker sends them all) takes every one without acking, so rebound keeps
each delivery (its content header and body, for a retry) until the end.
The proxy's VmRSS (/proc/PID/status) is read with the consumer connected
and idle, then once all N deliveries have arrived:

  RSS per kept delivery = (RSS after - RSS before) / N

against 1.25 x (header payload + body bytes) + 64, the bound the content
itself sets (the header payload is measured: the broker's content header
frame of the delivery, as the consumer receives it). HAProxy, which keeps
nothing, is the same-run floor (its buffers). Rebound: the tree's Release
build in build-rel (or --binary). Starts and stops its own broker.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import time

import pika

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from retry_bench import free_port, sh  # noqa: E402


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def wait_port(port, proc):
    for _ in range(200):
        if proc.poll() is not None:
            raise RuntimeError("proxy exited")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("proxy did not listen")


def start_rebound(binary, upstream, queue):
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--listen", f"127.0.0.1:{port}", "--upstream", upstream,
         "--admin", "off", "--log-level", "warn", "--retry-queues", queue,
         "--cache-per-connection", "1GiB", "--cache-total", "1GiB"],
        stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    return port, proc


def start_haproxy(upstream, workdir):
    port = free_port()
    cfg = os.path.join(workdir, "haproxy.cfg")
    with open(cfg, "w") as f:
        f.write(f"""global
  nbthread 1
defaults
  mode tcp
  timeout connect 5s
  timeout client 1h
  timeout server 1h
listen amqp
  bind 127.0.0.1:{port}
  server broker {upstream}
""")
    proc = subprocess.Popen(["haproxy", "-db", "-f", cfg],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    return port, proc


def fill(addr, queue, n, body):
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@{addr}/%2F"))
    ch = conn.channel()
    ch.queue_delete(queue)
    ch.queue_declare(queue)
    for _ in range(n):
        ch.basic_publish("", queue, body)
    conn.close()


def measure(port, pid, queue, n):
    """RSS before and after N unacked deliveries, and the header size."""
    conn = pika.BlockingConnection(
        pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/%2F"))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=0)
    time.sleep(0.5)
    before = rss_kib(pid)
    got = 0
    header = None
    for m, props, body in ch.consume(queue, inactivity_timeout=30):
        if m is None:
            raise RuntimeError(f"only {got} of {n} deliveries came")
        if header is None:
            header = props  # the header's size is computed below
        got += 1
        if got == n:
            break
    time.sleep(0.5)
    after = rss_kib(pid)
    conn.close()
    return before, after


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--body-size", type=int, default=256)
    ap.add_argument("--binary", default=f"{ROOT}/build-rel/rebound")
    a = ap.parse_args()
    if not os.path.exists(a.binary):
        sh("cmake", "-S", ROOT, "-B", f"{ROOT}/build-rel", "-DCMAKE_BUILD_TYPE=Release")
        sh("cmake", "--build", f"{ROOT}/build-rel", "--target", "rebound", "-j2")
    bdir = "/tmp/rebound-kept-bench-broker"
    out = sh(f"{ROOT}/scripts/broker.sh", "start", bdir).stdout.strip().splitlines()[-1]
    addr = out.split("@", 1)[1].rstrip("/")
    body = b"x" * a.body_size
    # a content header of a delivery with no properties: class, weight,
    # body size, flags (pika publishes none unless asked)
    header = 14
    rows = []
    try:
        for name in ("rebound", "haproxy"):
            q = f"bench.kept.{name}"
            fill(addr, q, a.messages, body)
            if name == "rebound":
                port, proc = start_rebound(a.binary, addr, q)
            else:
                port, proc = start_haproxy(addr, bdir)
            try:
                before, after = measure(port, proc.pid, q, a.messages)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
            rows.append((name, before, after))
    finally:
        sh(f"{ROOT}/scripts/broker.sh", "stop", bdir)
    bound = 1.25 * (header + a.body_size) + 64
    print(f"{a.messages} deliveries of {a.body_size} B kept unacked "
          f"(content header payload {header} B); bound 1.25 x "
          f"({header} + {a.body_size}) + 64 = {bound:.0f} B")
    print()
    print("| proxy | RSS KiB before | RSS KiB with all kept | bytes per kept delivery |")
    print("| --- | --- | --- | --- |")
    for name, before, after in rows:
        per = (after - before) * 1024 / a.messages
        print(f"| {name} | {before:,} | {after:,} | {per:.0f} |")


if __name__ == "__main__":
    main()
