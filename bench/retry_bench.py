#!/usr/bin/python3
"""Retry-path benchmark: rebound in front of a private RabbitMQ.

  bench/retry_bench.py [--messages N] [--rate-messages M]
                       [--latency-messages L] [--binary PATH]

1. Latency of the retry path inside rebound (client nack in -> ack of the
   original out, i.e. publish of the copy + broker confirm), p50/p99/max,
   read from rebound's debug log lines (latency_us), for transient and for
   persistent messages: L (default 2000) retries one at a time (prefetch
   1), each message failing once into a 60 s tier. Against a floor, in
   the same run, right after, on the same broker and the same queue: the
   tier queue rebound just published its copies to (same type and
   arguments: on RabbitMQ 3.10 or later a quorum queue, whose confirm
   waits for its log to reach the disk). A client directly on the broker
   (no rebound) publishes L messages of 256 B (same delivery mode) there
   on a confirm channel, one at a time, and times each publish -> confirm
   round trip:
   - pika (BlockingConnection, confirm_delivery(), basic_publish returns
     once the broker's basic.ack is in): what a Python client sees,
     pika's own work included;
   - raw socket: the same AMQP frames pre-encoded, one sendall() and a
     read until the basic.ack, timed around the two: the broker's round
     trip with as little client work as Python allows.
   Printed: p50/p99 of each and the ratio rebound / floor (p50 to p50,
   p99 to p99). rebound's figure starts when it has read the client's
   nack and stops when the confirm has been read and the ack of the
   original queued, so it holds the broker's round trip plus rebound's
   work on both ends; it has no client on its side of the clock.
2. Retries per second: M messages nacked as fast as a pika consumer can
   (prefetch 500); time until rebound has acked all M originals (each
   copy confirmed by the broker).
3. Delay accuracy per tier: N messages fail 3 times with tiers 1s,2s,4s;
   per tier, the consumer-observed gap between its nack and the next
   delivery minus the configured delay (p50/p99, ms).

Starts and stops its own broker (scripts/broker.sh) and rebound (Release
build in build-rel, or --binary). Prints Markdown tables. Every queue a
measurement used is deleted after it, tier queues included (named as
rebound names them: a 60s tier is {queue}.retry.1m).
"""
import argparse
import os
import re
import signal
import socket
import statistics
import struct
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


REBOUND = f"{ROOT}/build-rel/rebound"


class Rebound:
    def __init__(self, upstream, *args):
        self.port = free_port()
        self.log = f"/tmp/rebound-retry-bench-{self.port}.log"
        self.proc = subprocess.Popen(
            [REBOUND, "--listen", f"127.0.0.1:{self.port}",
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


def tier_name(q, tier):
    """The tier queue rebound publishes to: {queue}.retry.<delay>, the
    delay in its largest whole unit (60s -> 1m), as rebound formats it."""
    ms = {"ms": 1, "s": 1000, "m": 60000, "h": 3600000}
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", tier)
    v = int(m.group(1)) * ms[m.group(2)]
    for unit in ("h", "m", "s", "ms"):
        if v % ms[unit] == 0:
            return f"{q}.retry.{v // ms[unit]}{unit}"


def reset(ch, q, tiers):
    for n in [q, q + ".dlq"] + [tier_name(q, t) for t in tiers]:
        ch.queue_delete(n)
    ch.queue_declare(q, durable=True)


def amqp_frame(kind, channel, payload):
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


def shortstr(s):
    return bytes([len(s)]) + s.encode()


class RawConfirmClient:
    """Just enough AMQP 0-9-1 to publish on a confirm channel over a plain
    socket: PLAIN guest/guest, channel 1, confirm.select; publish() sends
    pre-encoded frames and reads until their basic.ack."""

    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(0, 10, 10)  # connection.start
        resp = b"\x00guest\x00guest"
        self.method(0, 10, 11, struct.pack(">I", 0) + shortstr("PLAIN")
                    + struct.pack(">I", len(resp)) + resp + shortstr("en_US"))
        tune = self.expect(0, 10, 30)
        chmax, fmax = struct.unpack(">HI", tune[:6])
        self.method(0, 10, 31, struct.pack(">HIH", chmax, fmax, 0))
        self.method(0, 10, 40, shortstr("/") + shortstr("") + b"\x00")
        self.expect(0, 10, 41)
        self.method(1, 20, 10, shortstr(""))
        self.expect(1, 20, 11)
        self.method(1, 85, 10, b"\x00")
        self.expect(1, 85, 11)

    def method(self, ch, cls, mid, args):
        self.sock.sendall(amqp_frame(1, ch, struct.pack(">HH", cls, mid) + args))

    def frame(self):
        while True:
            if len(self.buf) >= 7:
                kind, ch, size = struct.unpack(">BHI", self.buf[:7])
                if len(self.buf) >= size + 8:
                    payload = self.buf[7:7 + size]
                    self.buf = self.buf[size + 8:]
                    return kind, ch, payload
            data = self.sock.recv(65536)
            if not data:
                raise RuntimeError("raw client: connection lost")
            self.buf += data

    def expect(self, ch, cls, mid):
        for _ in range(100):
            kind, c, p = self.frame()
            if kind == 1 and struct.unpack(">HH", p[:4]) == (10, 50):
                raise RuntimeError(f"raw client: connection.close {p[4:]!r}")
            if kind == 1 and c == ch and struct.unpack(">HH", p[:4]) == (cls, mid):
                return p[4:]
        raise RuntimeError(f"raw client: no {cls}.{mid}")

    @staticmethod
    def publish_frames(queue, body, delivery_mode):
        pub = amqp_frame(1, 1, struct.pack(">HHH", 60, 40, 0) + shortstr("")
                         + shortstr(queue) + b"\x00")
        hdr = amqp_frame(2, 1, struct.pack(">HHQHB", 60, 0, len(body), 0x1000,
                                           delivery_mode))
        return pub + hdr + amqp_frame(3, 1, body)

    def publish_confirmed(self, frames):
        """Send one message, wait for its basic.ack (not a nack)."""
        self.sock.sendall(frames)
        while True:
            kind, ch, p = self.frame()
            if kind == 1 and ch == 1:
                cls, mid = struct.unpack(">HH", p[:4])
                if (cls, mid) == (60, 80):
                    return
                if (cls, mid) == (60, 120):
                    raise RuntimeError("raw client: publish nacked")
                if (cls, mid) == (20, 40):
                    raise RuntimeError(f"raw client: channel.close {p[4:]!r}")

    def close(self):
        self.method(0, 10, 50, struct.pack(">H", 200) + shortstr("done")
                    + struct.pack(">HH", 0, 0))
        try:
            self.expect(0, 10, 51)
        finally:
            self.sock.close()


def floor_latency(broker_addr, queue, persistent, n):
    """The broker's publish -> confirm round trip, no rebound: n messages of
    256 B, one at a time, to `queue` (which exists), through pika and
    through a raw socket; the two lists of microseconds."""
    mode = 2 if persistent else 1
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@{broker_addr}/%2F"))
    ch = conn.channel()
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=mode)
    body = b"x" * 256
    via_pika = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        ch.basic_publish("", queue, body, props)  # raises unless acked
        via_pika.append((time.perf_counter_ns() - t0) // 1000)
    conn.close()
    host, port = broker_addr.rsplit(":", 1)
    raw = RawConfirmClient(host, int(port))
    frames = raw.publish_frames(queue, body, mode)
    via_raw = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        raw.publish_confirmed(frames)
        via_raw.append((time.perf_counter_ns() - t0) // 1000)
    raw.close()
    return via_pika, via_raw


def queue_type(bdir, name):
    """The queue's type as the broker says (rabbitmqctl), or "?"."""
    try:
        out = subprocess.run([f"{bdir}/rabbitmqctl", "-q", "list_queues", "name", "type"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    for line in out.splitlines():
        f = line.split()
        if len(f) == 2 and f[0] == name:
            return f[1]
    return "?"


def path_latency(broker_addr, persistent, n, bdir):
    """Each of n messages fails once into a 60 s tier: n retries; then the
    floor on that tier queue. Returns rebound's latencies, the floor's
    (pika, raw socket) and the tier's type."""
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
        tier = tier_name(q, "60s")
        qtype = queue_type(bdir, tier)
        floor = floor_latency(broker_addr, tier, persistent, n)
        reset(ch, q, ["60s"])
        conn.close()
    finally:
        rb.stop()
    return lat, floor, qtype


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
    global REBOUND
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--rate-messages", type=int, default=20000)
    ap.add_argument("--latency-messages", type=int, default=2000)
    ap.add_argument("--binary", default=REBOUND, help="the rebound to measure")
    a = ap.parse_args()
    REBOUND = os.path.abspath(a.binary)
    bdir = "/tmp/rebound-retry-bench-broker"
    out = sh(f"{ROOT}/scripts/broker.sh", "start", bdir).stdout.strip().splitlines()[-1]
    addr = out.split("@", 1)[1].rstrip("/")
    try:
        rows, floors = [], []
        for persistent in (False, True):
            lat, (via_pika, via_raw), qtype = path_latency(addr, persistent,
                                                           a.latency_messages, bdir)
            if len(lat) < a.latency_messages:
                print(f"warning: only {len(lat)} of {a.latency_messages} retries logged",
                      file=sys.stderr)
            rows.append((persistent, len(lat), pct(lat, 50), pct(lat, 99), max(lat)))
            floors.append((persistent, qtype, lat, via_pika, via_raw))
        rate = retries_per_second(addr, a.rate_messages)
        gaps = delay_accuracy(addr, a.messages)
    finally:
        sh(f"{ROOT}/scripts/broker.sh", "stop", bdir)
    print(f"# rebound: {REBOUND}")
    print("| messages | retries | nack->ack p50 (µs) | p99 (µs) | max (µs) |")
    print("| --- | --- | --- | --- | --- |")
    for persistent, n, p50, p99, mx in rows:
        print(f"| {'persistent' if persistent else 'transient'} | {n} | {p50} | {p99} | {mx} |")
    print()
    print("Against the floor: publish -> confirm of 256 B, one at a time, straight to the broker,")
    print("same queue as rebound's copies (its tier), right after rebound's retries.")
    print()
    print("| messages | tier type | what | samples | p50 (µs) | p99 (µs) | rebound / it, p50 | p99 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for persistent, qtype, lat, via_pika, via_raw in floors:
        kind = "persistent" if persistent else "transient"
        r50, r99 = pct(lat, 50), pct(lat, 99)
        print(f"| {kind} | {qtype} | rebound nack -> ack | {len(lat)} | {r50} | {r99} | | |")
        for what, xs in (("floor: pika publish -> confirm", via_pika),
                         ("floor: raw socket publish -> confirm", via_raw)):
            f50, f99 = pct(xs, 50), pct(xs, 99)
            print(f"| {kind} | {qtype} | {what} | {len(xs)} | {f50} | {f99} | "
                  f"{r50 / f50:.2f} | {r99 / f99:.2f} |")
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
