"""The admin endpoint cannot stall the proxy. With 2,000 AMQP sessions
open, 400 pipelined GET /v1/status on one keep-alive admin connection read
as fast as possible, or 12 pipelined on each of 32 connections read slowly,
leave a bystander AMQP client's round trips short; every answer is a
complete JSON document listing the sessions, even when some of them close
in the middle of it.

The bystander is a separate process (this file run as a script), so the
test's own reading and JSON parsing cannot delay it: its round trips
measure rebound's loop alone.
"""
import asyncio
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time

import pytest

import amqp_raw
import rbtest

N_SESSIONS = 2000
N_REQUESTS = 400
N_CLOSED_MIDWAY = 200  # sessions closed while the answers stream...
CLOSE_AT = (2, 5, 8, 11)  # ...in waves, after these answers
# Worst bystander round trip while the admin requests are served. Measured
# on the 2-core test machine, ASan builds: rebound that answered every
# pipelined request at once, 1.9-8.3 s (one connection) and 2.5-3.3 s (slow
# readers); now at most 0.17 s at a load average of 5, and once 0.60 s
# while the suite's other tests (a three-node cluster among them) loaded
# both cores and the broker. The bound sits between the two.
WORST_RT_S = 1.0
SLOW_READERS = 32
SLOW_REQUESTS = 12  # pipelined on each slow reader's connection
SLOW_RATE = 2 * 1024 * 1024  # bytes/s each slow reader takes
REQUEST = b"GET /v1/status HTTP/1.1\r\nHost: rebound\r\n\r\n"


# ---- the bystander (run as `python3 test_admin_stall.py bystander ...`) ----

def bystander_main(host, port, user, password, vhost):
    """Publish + basic.get round trips on one pika connection until "stop"
    arrives on stdin; then print [(start, seconds), ...] as JSON."""
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host=host, port=int(port), virtual_host=vhost,
        credentials=pika.PlainCredentials(user, password),
        connection_attempts=1, socket_timeout=30))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    print("ready", flush=True)
    samples = []
    while not select.select([sys.stdin], [], [], 0)[0]:
        t0 = time.monotonic()
        ch.basic_publish("", q, b"ping")
        while ch.basic_get(q, auto_ack=True)[0] is None:
            pass
        samples.append((t0, time.monotonic() - t0))
        time.sleep(0.002)
    print(json.dumps(samples), flush=True)
    conn.close()


class Bystander:
    def __init__(self, rb, broker):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "bystander",
             rb.listen_host, str(rb.port), broker.user, broker.password,
             broker.vhost], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        line = self.proc.stdout.readline()
        assert line == b"ready\n", "bystander did not start: %r" % line

    def stop(self):
        """The samples: [(start, round trip seconds)]."""
        out, _ = self.proc.communicate(b"stop\n", timeout=60)
        assert self.proc.returncode == 0
        return json.loads(out)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ---- the admin client ----

class HttpReader:
    """Responses off one raw socket: Content-Length or chunked bodies.
    `rate` (bytes/s) paces the reads of a slow reader."""

    def __init__(self, sock, rate=None):
        self.sock = sock
        self.rate = rate
        self.buf = bytearray()

    def _fill(self):
        data = self.sock.recv(1 << 16 if self.rate else 1 << 20)
        if not data:
            raise EOFError("admin connection closed")
        self.buf += data
        if self.rate:
            time.sleep(len(data) / self.rate)

    def _take(self, n):
        while len(self.buf) < n:
            self._fill()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                return self._take(i + 2)[:-2]
            self._fill()

    def response(self):
        status = self._line()
        assert status.startswith(b"HTTP/1.1 200 "), status
        headers = {}
        while True:
            line = self._line()
            if not line:
                break
            name, value = line.decode("latin-1").split(":", 1)
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding") == "chunked":
            parts = []
            while True:
                size = int(self._line(), 16)
                if size == 0:
                    assert self._line() == b""
                    return b"".join(parts)
                parts.append(self._take(size))
                assert self._take(2) == b"\r\n"
        return self._take(int(headers["content-length"]))


def check_document(body, must_list):
    """A complete /v1/status document listing every peer in `must_list`,
    each session once, newest first."""
    assert body.endswith(b"}\n"), "truncated document: %r" % body[-80:]
    doc = json.loads(body)
    assert doc["config"]["retry"]["policies"], doc["config"]
    ids = [s["id"] for s in doc["sessions"]]
    assert ids == sorted(set(ids), reverse=True), "a session twice, or order"
    peers = {s["peer"] for s in doc["sessions"]}
    missing = must_list - peers
    assert not missing, "%d sessions missing, e.g. %s" % (
        len(missing), sorted(missing)[:3])
    return len(ids)


# ---- the crowd: rebound with 2,000 sessions ----

class Crowd:
    def __init__(self, rb, loop, conns):
        self.rb = rb
        self.loop = loop
        self.conns = conns  # [(reader, writer, peer)]

    def peers(self):
        return {peer for _, _, peer in self.conns}

    def close_some(self, n):
        """Drop every (len / n)th session's socket, `n` in all, as crashed
        clients would: spread over the session list."""
        step = max(1, len(self.conns) // n)
        gone = self.conns[::step][:n]
        gone_ids = {id(c) for c in gone}
        self.conns = [c for c in self.conns if id(c) not in gone_ids]

        async def drop():
            for _, w, _ in gone:
                w.transport.abort()
            await asyncio.sleep(0)
        self.loop.run_until_complete(drop())


async def open_crowd(port, broker, n):
    gate = asyncio.Semaphore(100)

    async def one(i):
        async with gate:
            r, w = await amqp_raw.async_open(port, "rbt-stall-%d" % i,
                                             broker.user, broker.password,
                                             broker.vhost)
            ip, lport = w.get_extra_info("sockname")[:2]
            return r, w, "%s:%d" % (ip, lport)
    return await asyncio.wait_for(asyncio.gather(*[one(i) for i in range(n)]),
                                  timeout=180)


@pytest.fixture(scope="module")
def crowd(tmp_path_factory, broker):
    admin_port = rbtest.free_port()
    rb = rbtest.Rebound(str(tmp_path_factory.mktemp("stall")), broker.addr,
                        ("--admin", "127.0.0.1:%d" % admin_port,
                         "--retry-queues", "retry-policy-matches-nothing"))
    rb.admin_port = admin_port
    loop = asyncio.new_event_loop()
    c = None
    try:
        conns = loop.run_until_complete(
            open_crowd(rb.port, broker, N_SESSIONS))
        c = Crowd(rb, loop, list(conns))
        yield c
    finally:
        if c:
            c.close_some(len(c.conns))
        loop.close()
        rc = rb.stop(timeout=60)
        found = rb.sanitizer_report()
        assert rc == 0 and not found, "rebound exit %r, %s:\n%s" % (
            rc, found, rb.log()[-6000:])


def read_answers(port, n, rate, on_answer):
    """Send `n` pipelined /v1/status on one connection and hand each answer
    to on_answer(i, body); read at `rate` bytes/s if given."""
    sock = socket.socket()
    if rate:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sock.settimeout(60)
    sock.connect(("127.0.0.1", port))
    try:
        sock.sendall(REQUEST * n)
        reader = HttpReader(sock, rate)
        for i in range(n):
            on_answer(i, reader.response())
    finally:
        sock.close()


def with_bystander(crowd, broker, load):
    """Run load() while a bystander does round trips. Returns (round trips
    while load ran, round trips before, seconds load took)."""
    by = Bystander(crowd.rb, broker)
    try:
        time.sleep(0.5)  # a baseline of round trips before the load
        t_start = time.monotonic()
        load()
        t_end = time.monotonic()
        samples = by.stop()
    finally:
        by.kill()
    during = [rt for t0, rt in samples if t0 + rt >= t_start and t0 <= t_end]
    before = [rt for t0, rt in samples if t0 + rt < t_start]
    return during, before, t_end - t_start


def report(during, before, seconds):
    return ("worst round trip %.3fs (median %.4fs, %d samples) during %.1fs "
            "of admin requests; before them worst %.3fs" % (
                max(during), sorted(during)[len(during) // 2], len(during),
                seconds, max(before) if before else -1))


def test_pipelined_status_does_not_stall_bystander(crowd, broker):
    """400 on one connection read at full speed, while 200 sessions drop in
    waves: rebound has answers rendered ahead into the socket buffers, so a
    wave lands in the middle of a document, between two of its slices."""
    listed = []
    kept = [crowd.peers()]

    def on_answer(i, body):
        if i in CLOSE_AT:
            crowd.close_some(N_CLOSED_MIDWAY // len(CLOSE_AT))
            kept.append(crowd.peers())
        listed.append(check_document(body, kept[-1]))

    during, before, seconds = with_bystander(
        crowd, broker,
        lambda: read_answers(crowd.rb.admin_port, N_REQUESTS, None, on_answer))
    msg = report(during, before, seconds)
    print(msg, "sessions listed:", listed[:16])
    assert max(during) < WORST_RT_S, msg
    assert len(during) >= 10, msg  # the bystander kept going throughout
    assert len(listed) == N_REQUESTS
    left = len(crowd.conns) + 1  # the bystander's session too
    assert (listed[0], listed[-1]) == (N_SESSIONS + 1, left), listed[:16]
    # Some document began with the sessions of a wave and lost some of them
    # before its end (missed by chance about 1 in 8 per wave).
    sizes = [len(k) + 1 for k in kept]
    assert any(low < n < high for n in listed
               for low, high in zip(sizes[1:], sizes)), listed[:16]


def test_slow_readers_do_not_stall_bystander(crowd, broker):
    """SLOW_READERS connections, SLOW_REQUESTS pipelined each, every one
    read at SLOW_RATE bytes/s."""
    kept = crowd.peers()
    listed, errors = [], []

    def one():
        try:
            read_answers(crowd.rb.admin_port, SLOW_REQUESTS, SLOW_RATE,
                         lambda i, body: listed.append(
                             check_document(body, kept)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def load():
        threads = [threading.Thread(target=one) for _ in range(SLOW_READERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)

    during, before, seconds = with_bystander(crowd, broker, load)
    msg = report(during, before, seconds)
    print(msg)
    assert max(during) < WORST_RT_S, msg
    assert len(during) >= 10, msg
    assert not errors, errors[0]
    assert len(listed) == SLOW_READERS * SLOW_REQUESTS


if __name__ == "__main__" and sys.argv[1:2] == ["bystander"]:
    bystander_main(*sys.argv[2:])
