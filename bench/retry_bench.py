#!/usr/bin/python3
"""Retry-path benchmark: rebound in front of a private RabbitMQ.

  bench/retry_bench.py [--messages N] [--rate-messages M]

1. Latency of the retry path inside rebound (client nack in -> ack of the
   original out, i.e. publish of the copy + broker confirm), p50/p99/max,
   read from rebound's debug log lines (latency_us), for transient and for
   persistent messages.
2. Retries per second: M messages nacked as fast as a pika consumer can
   (prefetch 500); time until rebound has acked all M originals (each
   copy confirmed by the broker).
3. Delay accuracy per tier: N messages fail 3 times with tiers 1s,2s,4s;
   per tier, the consumer-observed gap between its nack and the next
   delivery minus the configured delay (p50/p99, ms).

Starts and stops its own broker (scripts/broker.sh) and rebound (Release
build in build-rel). Prints a Markdown table.
"""
import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time

import pika

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class Rebound:
    def __init__(self, upstream, *args):
        self.port = free_port()
        self.log = f"/tmp/rebound-retry-bench-{self.port}.log"
        self.proc = subprocess.Popen(
            [f"{ROOT}/build-rel/rebound", "--listen", f"127.0.0.1:{self.port}",
             "--upstream", upstream, "--log-level", "debug", *args],
            stderr=open(self.log, "w"))
        for _ in range(100):
            if "msg=listening" in open(self.log).read():
                return
            time.sleep(0.05)
        raise RuntimeError("rebound did not start")

    def url(self):
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def latencies(self):
        return [int(m) for m in re.findall(r"msg=(?:retry_published|dead_lettered)"
                                          r" .*?latency_us=(\d+)", open(self.log).read())]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        os.unlink(self.log)


def reset(ch, q, tiers):
    for n in [q, q + ".dlq"] + [f"{q}.retry.{t}" for t in tiers]:
        ch.queue_delete(n)
    ch.queue_declare(q, durable=True)


def path_latency(broker_addr, persistent, n=2000):
    """Each of n messages fails once into a 60 s tier: n retries."""
    rb = Rebound(broker_addr, "--retry-tiers", "60s", "--max-attempts", "2")
    try:
        conn = pika.BlockingConnection(pika.URLParameters(rb.url()))
        ch = conn.channel()
        q = f"bench.retry.lat.{int(persistent)}"
        reset(ch, q, ["60s"])
        props = pika.BasicProperties(delivery_mode=2 if persistent else 1)
        for i in range(n):
            ch.basic_publish("", q, b"x" * 256, props)
        ch.basic_qos(prefetch_count=1)  # one retry at a time: latency, not queueing
        done = 0
        for m, _, _ in ch.consume(q, inactivity_timeout=10):
            if m is None:
                break
            ch.basic_nack(m.delivery_tag, requeue=True)
            done += 1
            if done == n:
                break
        ch.cancel()
        deadline = time.time() + 30
        while len(rb.latencies()) < n and time.time() < deadline:
            conn.process_data_events(0.1)
        lat = rb.latencies()
        reset(ch, q, ["60s"])
        conn.close()
    finally:
        rb.stop()
    return lat


def retries_per_second(broker_addr, m):
    rb = Rebound(broker_addr, "--retry-tiers", "60s", "--max-attempts", "2")
    try:
        conn = pika.BlockingConnection(pika.URLParameters(rb.url()))
        ch = conn.channel()
        q = "bench.retry.rate"
        reset(ch, q, ["60s"])
        for i in range(m):
            ch.basic_publish("", q, b"x" * 256)
        ch.basic_qos(prefetch_count=500)
        t0 = time.time()
        done = 0
        for msg, _, _ in ch.consume(q, inactivity_timeout=10):
            if msg is None:
                break
            ch.basic_nack(msg.delivery_tag, requeue=True)
            done += 1
            if done == m:
                break
        ch.cancel()
        # done when rebound has acked every original (one log line each)
        while len(rb.latencies()) < m:
            if time.time() - t0 > 120:
                raise RuntimeError("retries did not complete")
            conn.process_data_events(0.01)
        dt = time.time() - t0
        reset(ch, q, ["60s"])
        conn.close()
    finally:
        rb.stop()
    return m / dt


def delay_accuracy(broker_addr, n):
    tiers = ["1s", "2s", "4s"]
    rb = Rebound(broker_addr, "--retry-tiers", ",".join(tiers), "--max-attempts", "4")
    gaps = {t: [] for t in tiers}
    try:
        conn = pika.BlockingConnection(pika.URLParameters(rb.url()))
        ch = conn.channel()
        q = "bench.retry.delay"
        reset(ch, q, tiers)
        for i in range(n):
            ch.basic_publish("", q, str(i).encode())
        ch.basic_qos(prefetch_count=n)
        nacked = {}
        deliveries = {}

        def cb(c, m, p, body):
            now = time.time()
            k = deliveries.get(body, 0)
            if k:
                gaps[tiers[k - 1]].append((now - nacked[body]) * 1000 - 1000 * (1 << (k - 1)))
            deliveries[body] = k + 1
            nacked[body] = time.time()
            c.basic_nack(m.delivery_tag, requeue=True)

        ch.basic_consume(q, cb)
        deadline = time.time() + 40
        while sum(deliveries.values()) < 4 * n and time.time() < deadline:
            conn.process_data_events(0.05)
        reset(ch, q, tiers)
        conn.close()
    finally:
        rb.stop()
    return gaps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--rate-messages", type=int, default=20000)
    a = ap.parse_args()
    bdir = "/tmp/rebound-retry-bench-broker"
    out = sh(f"{ROOT}/scripts/broker.sh", "start", bdir).stdout.strip().splitlines()[-1]
    addr = out.split("@", 1)[1].rstrip("/")
    try:
        rows = []
        for persistent in (False, True):
            lat = path_latency(addr, persistent)
            rows.append((persistent, len(lat), pct(lat, 50), pct(lat, 99), max(lat)))
        rate = retries_per_second(addr, a.rate_messages)
        gaps = delay_accuracy(addr, a.messages)
    finally:
        sh(f"{ROOT}/scripts/broker.sh", "stop", bdir)
    print("| messages | retries | nack->ack p50 (µs) | p99 (µs) | max (µs) |")
    print("| --- | --- | --- | --- | --- |")
    for persistent, n, p50, p99, mx in rows:
        print(f"| {'persistent' if persistent else 'transient'} | {n} | {p50} | {p99} | {mx} |")
    print()
    print(f"retries per second (pika consumer, prefetch 500, {a.rate_messages} messages): {rate:.0f}")
    print()
    print("| tier | samples | measured - configured p50 (ms) | p99 (ms) |")
    print("| --- | --- | --- | --- |")
    for t, xs in gaps.items():
        if xs:
            print(f"| {t} | {len(xs)} | {pct(xs, 50):.1f} | {pct(xs, 99):.1f} |")


if __name__ == "__main__":
    sys.exit(main())
