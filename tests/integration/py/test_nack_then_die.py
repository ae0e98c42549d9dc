"""A consumer nacks (requeue) and dies at once, with a reset, while
rebound is still writing deliveries to it: nothing is lost, nothing is
duplicated, and the copies rebound had to make are finished.

rebound must read what the client sent before its reset (the nacks),
make each copy (publish, confirm) and ack its original before the
upstream connection goes; the broker requeues the rest. The guarantee is
at-least-once with duplicates only on a crash of rebound between confirm
and ack (README, "What is guaranteed"): rebound does not crash here, so a
message seen twice afterwards is a bug. A nack rebound never read (the
reset came first) is a plain redelivery of the original, which is fine;
rebound's byte count of the session (bytes_from_client) says which case
each round was.

Each round has its own queue of messages of a few KiB and a raw
consumer with a large prefetch and a small receive buffer: it reads only
its first deliveries, so rebound has plenty waiting to be written to it
when it resets. Then a healthy pika consumer through rebound drains every
queue. Real broker, real rebound, real sockets."""
import socket
import struct
import time

import amqp_raw as a
import fakebroker as fb
import rbtest
from retryhelp import direct, queues, tier
from test_hardening_upstream import consume

assert direct  # a fixture

ROUNDS = 20
PER_ROUND = 400     # messages per round's queue
BODY = 4096
NACKS = 3           # deliveries each dying consumer nacks before its reset
PREFETCH = 1000     # more than a queue holds: the broker sends everything
RCVBUF = 4096
TIERS = "1s"
COUNT = "rebound-retry-count"
CLOSE_REASONS = ("client write failed", "client disconnected")


class CountingClient(a.RawClient):
    """A raw client that counts the bytes it sent."""

    sent = 0

    def send(self, data):
        super().send(data)
        self.sent += len(data)


def basic_qos(ch, count):
    return a.method(ch, (60, 10), struct.pack(">IH", 0, count) + b"\x00")


def body_of(i):
    return b"%08d" % i + b"." * (BODY - 8)


def recv_delivery(c):
    """(delivery tag, message number) of the next basic.deliver."""
    f = c.recv_method()
    assert f.method == (60, 60), f
    p = f.payload[4:]
    tag = struct.unpack(">Q", p[1 + p[0]:9 + p[0]])[0]
    h = c.recv_frame()
    assert h.type == a.FRAME_HEADER, h
    size = struct.unpack(">Q", h.payload[4:12])[0]
    body = b""
    while len(body) < size:
        body += c.recv_frame().payload
    return tag, int(body[:8])


def send_queue_bytes(rb, client_port):
    """Bytes in rebound's kernel send queue towards the client at
    `client_port` (/proc/PID/net/tcp tx_queue); None when not found."""
    for name in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (rb.pid, name)) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, remote = fields[1], fields[2]
            if int(local.split(":")[1], 16) == rb.port and \
                    int(remote.split(":")[1], 16) == client_port:
                return int(fields[4].split(":")[0], 16)
    return None


def nack_and_reset(rb, q, name):
    """A consumer with a large prefetch reads its first NACKS deliveries,
    nacks them (requeue) and resets the connection at once. Returns
    (nacked [(tag, number)], bytes sent before the nacks, bytes sent in
    all, its local port)."""
    c = CountingClient(rb.port, rcvbuf=RCVBUF)
    c.handshake(name=name)
    c.open_channel(1)
    c.send(basic_qos(1, PREFETCH))
    c.recv_method((60, 11))
    consume(c, 1, q, "dying")
    got = [recv_delivery(c) for _ in range(NACKS)]
    # rebound is writing to us: its send queue towards us is not empty
    rbtest.wait_until(lambda: (send_queue_bytes(rb, c.local_port) or 0)
                      >= RCVBUF, 10, "rebound's send queue to the client "
                      "to fill up", interval=0.01)
    before = c.sent
    c.send(b"".join(fb.basic_nack(1, tag) for tag, _ in got))
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                      struct.pack("ii", 1, 0))
    c.sock.close()
    return got, before, c.sent, c.local_port


def test_nack_then_reset_while_rebound_writes(rebound_factory, broker, ctl,
                                              direct):
    base = rbtest.uniq("die")
    names = ["%s-%02d" % (base, r) for r in range(ROUNDS)]
    direct.own(*names)
    rb = rebound_factory("--retry-queues", base + "-*", "--retry-tiers",
                         TIERS, "--max-attempts", "3")
    pub = direct.channel()
    for r, q in enumerate(names):
        pub.queue_declare(q, durable=True)
        for i in range(PER_ROUND):
            pub.basic_publish("", q, body_of(r * PER_ROUND + i))
    rbtest.wait_until(lambda: all(
        queues(ctl).get(q, (0,))[0] == PER_ROUND for q in names), 60,
        "%d messages in each of %d queues" % (PER_ROUND, ROUNDS),
        interval=0.3)

    rounds = []
    for r, q in enumerate(names):
        first_line = len(rb.log().splitlines())
        got, before, sent, port = nack_and_reset(rb, q, "dying-%d" % r)
        t_reset = time.monotonic()
        close = rb.wait_log("session_close", timeout=30,
                            peer="127.0.0.1:%d" % port)
        took = time.monotonic() - t_reset
        read = int(close["bytes_from_client"])
        rounds.append({"round": r, "nacked": got, "before": before,
                       "sent": sent, "read": read, "close": close,
                       "took": took, "lines": (first_line,
                                               len(rb.log().splitlines()))})

    # a healthy consumer drains every queue
    seen = {}  # message number -> [(count header, redelivered)]
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=200)

    def on_message(chan, method, props, body):
        seen.setdefault(int(body[:8]), []).append(
            ((props.headers or {}).get(COUNT), method.redelivered))
        chan.basic_ack(method.delivery_tag)

    for q in names:
        ch.basic_consume(q, on_message)
    total = ROUNDS * PER_ROUND
    watched = names + [tier(q, TIERS) for q in names]
    deadline = time.monotonic() + 90
    snap = {}
    while True:
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            conn.process_data_events(time_limit=0.05)
        if len(seen) == total:
            snap = queues(ctl)
            if all(snap.get(n, (0, 0, 0))[:2] == (0, 0) for n in watched):
                break
        assert time.monotonic() < deadline, (
            "drained %d of %d messages; queues %r" % (
                len(seen), total, {n: snap.get(n) for n in watched}))
    end = time.monotonic() + 1.5  # a late duplicate would show up here
    while time.monotonic() < end:
        conn.process_data_events(time_limit=0.05)
    conn.close()

    log = rb.log().splitlines()
    outcome = {"copy": 0, "plain": 0}
    problems = []
    dumped = 0
    for rd in rounds:
        reason = rd["close"].get("reason", "")
        if reason not in CLOSE_REASONS:
            problems.append("round %d: session closed with reason %r"
                            % (rd["round"], reason))
        read_nacks = rd["read"] >= rd["sent"]
        read_none = rd["read"] <= rd["before"]
        # in rebound's own words: a copy made for every nack it read
        published = sorted(int(l["delivery_tag"]) for l in rb.log_lines(
            "retry_published", id=rd["close"]["id"]))
        if read_nacks and published != sorted(t for t, _ in rd["nacked"]):
            problems.append(
                "round %d: rebound read the nacks of tags %r but logged "
                "retry_published for %r; the session lasted %s ms and "
                "closed with %r" % (rd["round"], [t for t, _ in rd["nacked"]],
                                    published, rd["close"].get("duration_ms"),
                                    reason))
        for tag, i in rd["nacked"]:
            d = seen.get(i, [])
            if d == [(1, False)]:
                kind = "copy"
            elif d == [(None, True)]:
                kind = "plain"
            else:
                kind = None
            if kind:
                outcome[kind] += 1
            if kind is None or (kind == "plain" and read_nacks) or \
                    (kind == "copy" and read_none):
                problems.append(
                    "round %d: message %d (tag %d) nacked, then delivered "
                    "%r (count header, redelivered); rebound read %d of the "
                    "%d bytes the client sent (%d before its nacks)"
                    % (rd["round"], i, tag, d, rd["read"], rd["sent"],
                       rd["before"]))
        nacked = {i for _, i in rd["nacked"]}
        base_i = rd["round"] * PER_ROUND
        for i in range(base_i, base_i + PER_ROUND):
            d = seen.get(i, [])
            if i not in nacked and (len(d) != 1 or d[0][0] is not None):
                problems.append("round %d: message %d delivered %r"
                                % (rd["round"], i, d))
        if dumped < 3 and any(p.startswith("round %d:" % rd["round"])
                              for p in problems):
            lo, hi = rd["lines"]
            problems.append("rebound log of round %d:\n%s" % (
                rd["round"], "\n".join(log[lo:hi][:60])))
            dumped += 1
    lost = sorted(set(range(total)) - set(seen))
    dups = {i: d for i, d in seen.items() if len(d) > 1}
    took = sorted(rd["took"] for rd in rounds)
    reasons = {}
    for rd in rounds:
        reasons[rd["close"].get("reason")] = \
            reasons.get(rd["close"].get("reason"), 0) + 1
    print("nack-then-reset: %d rounds, nacked messages back as a copy %d, "
          "as a plain redelivery %d; lost %d, duplicated %d; close reasons "
          "%r; reset to session_close %.3f s median, %.3f s max"
          % (ROUNDS, outcome["copy"], outcome["plain"], len(lost), len(dups),
             reasons, took[len(took) // 2], took[-1]))
    assert not lost, "lost: %r" % lost[:20]
    assert not problems, "%d problems:\n%s" % (
        len(problems), "\n".join(problems[:40]))
    assert not dups, dups
    assert outcome["copy"] + outcome["plain"] == ROUNDS * NACKS
    assert not [l for l in log if "timed out" in l and
                "msg=session_close" in l]
    assert not rb.log_lines("retry_abandoned")
    assert not rb.log_lines("retry_fallback")
