"""A hostile or stuck broker behind rebound (fakebroker.py plays it): an
absurd content size from the broker is a protocol error of that session
only, and frames a client sends behind a retry the broker never confirms
neither grow rebound's memory nor wait forever."""
import struct
import threading
import time

import pytest

import amqp_raw as a
import fakebroker as fb

# ASan's quarantine would count freed memory as resident: keep it small.
SMALL_QUARANTINE = {"ASAN_OPTIONS": "quarantine_size_mb=4:detect_leaks=1"}

INTERNAL_ERROR = 541


@pytest.fixture
def fake():
    brokers = []

    def start(**kw):
        b = fb.FakeBroker(**kw)
        brokers.append(b)
        return b

    yield start
    for b in brokers:
        b.stop()


def consume(c, ch, queue, tag):
    c.send(fb.basic_consume(ch, queue, tag))
    f = c.recv_method((60, 21))
    assert f.channel == ch


# ---- 1. a content header announcing an absurd body size ----------------------

HEADER_LEN = 14  # class, weight, body size, property flags: no properties


class Bystander:
    """A raw client through the same rebound and the same fake broker,
    consuming from a queue the fake broker serves normally."""

    def __init__(self, rb, broker):
        self.c = a.RawClient(rb.port)
        self.c.handshake(name="bystander")
        self.upstream = broker.wait_conn("bystander")
        self.c.open_channel(1)
        consume(self.c, 1, "good-queue", "by")
        self.n = 0
        self.next_ch = 2

    def check(self):
        """A delivery reaches it intact and a channel.open round trip
        works."""
        self.n += 1
        body = b"bystander-%d-" % self.n + b"b" * 3000
        self.upstream.deliver(1, "by", self.n, body)
        f = self.c.recv_method((60, 60))
        assert f.channel == 1
        h = self.c.recv_frame()
        assert h.type == a.FRAME_HEADER
        assert struct.unpack(">Q", h.payload[4:12])[0] == len(body)
        got = b""
        while len(got) < len(body):
            f = self.c.recv_frame()
            assert f.type == a.FRAME_BODY, f
            got += f.payload
        assert got == body
        self.c.send(fb.basic_ack(1, self.n))
        self.upstream.wait_event("basic.ack", tag=self.n)
        self.c.open_channel(self.next_ch)
        self.next_ch += 1


@pytest.mark.parametrize("body_size", [2 ** 64 - 1, 2 ** 64 - HEADER_LEN,
                                       2 ** 63],
                         ids=["2^64-1", "2^64-header", "2^63"])
def test_absurd_body_size_from_the_broker(rebound_factory, fake, body_size):
    """basic.deliver for an intercepted ack-mode consumer, then a content
    header whose body size cannot be (>= 2^63), then a body frame of
    attacker bytes: the client gets connection.close 541, rebound logs an
    upstream protocol error for that session alone and the bystander's
    session carries on."""
    def on_consume(conn, ch, args):
        if args["queue"].startswith("evil"):
            conn.send(fb.basic_deliver(ch, args["tag"], 1, "ex", "rk")
                      + fb.content_header(ch, body_size)
                      + a.frame(a.FRAME_BODY, ch, b"\xa5" * 65536))

    broker = fake(on_consume=on_consume)
    rb = rebound_factory(upstream=broker.addr)
    by = Bystander(rb, broker)
    by.check()

    c = a.RawClient(rb.port)
    try:
        c.handshake()
        c.open_channel(1)
        c.send(fb.basic_consume(1, "evil-queue", "evil"))
        try:
            code, text, _, _ = c.expect_connection_close(timeout=10)
        except EOFError:
            raise AssertionError("rebound dropped the client without a "
                                 "connection.close (alive: %s); log tail:\n%s"
                                 % (rb.alive(), rb.log()[-3000:]))
        assert code == INTERNAL_ERROR, (code, text)
        c.send(a.connection_close_ok())
        c.wait_eof(timeout=5)
    finally:
        c.close()
    assert rb.alive()
    peer = "127.0.0.1:%d" % c.local_port
    line = rb.wait_log("upstream_protocol_error", peer=peer)
    assert line
    assert not rb.log_lines("upstream_protocol_error",
                            peer="127.0.0.1:%d" % by.c.local_port)
    by.check()
    by.check()
    by.c.send(a.connection_close())
    by.c.recv_method(a.CONNECTION_CLOSE_OK)
    by.c.close()
    rb.wait_conn_sockets(0)


# ---- 3. frames held behind a retry the broker never confirms ----------------

BODY = 64 * 1024
TOTAL = 300 * 1024 * 1024
GROWTH_BOUND_MIB = 48


def deliver_on_consume(conn, ch, args):
    conn.deliver(ch, args["tag"], 1, b"the original", routing_key=args["queue"])


def held_client(rb, queue, how):
    """A raw client that got one delivery of `queue` and failed it
    (requeue); returns (client, when the failure was sent)."""
    c = a.RawClient(rb.port)
    c.handshake(name="held-client")
    c.open_channel(1)
    consume(c, 1, queue, "held")
    assert c.recv_method((60, 60)).channel == 1
    assert c.recv_frame().type == a.FRAME_HEADER
    assert c.recv_frame().payload == b"the original"
    c.send(fb.basic_reject(1, 1) if how == "reject" else fb.basic_nack(1, 1))
    return c, time.monotonic()


def numbered(i, size):
    return struct.pack(">I", i) + b"p" * (size - 4)


class Publisher(threading.Thread):
    """Sends numbered publishes on channel 1 as fast as the socket takes
    them; `sent` counts the bytes the kernel accepted."""

    def __init__(self, c, count, size):
        super().__init__(daemon=True)
        self.c = c
        self.count = count
        self.size = size
        self.sent = 0
        self.done = False
        self.error = None

    def run(self):
        try:
            for i in range(self.count):
                data = fb.publish(1, "dest", numbered(i, self.size))
                self.c.sock.sendall(data)
                self.sent += len(data)
            self.done = True
        except OSError as e:
            self.error = e


def test_held_frames_do_not_grow_memory(rebound_factory, fake):
    """The broker never confirms rebound's copy, the client keeps
    publishing ~300 MiB on the channel whose frames wait behind it:
    rebound stops reading that client instead of keeping the frames."""
    broker = fake(confirm=False, on_consume=deliver_on_consume)
    rb = rebound_factory("--retry-finish-timeout", "1s",
                         upstream=broker.addr, env=SMALL_QUARANTINE)
    c, _ = held_client(rb, "held-queue", "nack")
    up = broker.wait_conn("held-client")
    copies = broker.wait_conn("rebound retries for")  # the retry connection
    copies.wait(lambda: copies.published("held-queue.retry.1s"), 10,
                "rebound's copy of the failed delivery")
    rss0 = rb.rss_kib()
    pub = Publisher(c, TOTAL // BODY, BODY)
    pub.start()
    peak = rss0
    last, still_since = -1, time.monotonic()
    deadline = time.monotonic() + 60
    while not pub.done and pub.error is None and time.monotonic() < deadline:
        time.sleep(0.1)
        peak = max(peak, rb.rss_kib())
        if pub.sent != last:
            last, still_since = pub.sent, time.monotonic()
        elif time.monotonic() - still_since > 2.0:
            break  # rebound stopped reading the client
    grown_mib = (peak - rss0) / 1024
    sent_mib = pub.sent / (1 << 20)
    print("held: sent %.0f MiB, RSS +%.1f MiB, done=%s" % (sent_mib, grown_mib,
                                                           pub.done))
    try:
        c.sock.shutdown(2)
    except OSError:
        pass
    pub.join(10)
    c.close()
    assert grown_mib < GROWTH_BOUND_MIB, (
        "rebound's RSS grew by %.0f MiB while %.0f MiB waited behind a "
        "retry" % (grown_mib, sent_mib))
    assert not pub.done, "rebound read all %.0f MiB held behind the retry" \
        % sent_mib
    assert not up.published("dest"), "publishes overtook the pending retry"
    assert rb.alive()


@pytest.mark.parametrize("how", ["nack", "reject"])
def test_confirm_timeout_falls_back_then_releases(rebound_factory, fake, how):
    """--retry-confirm-timeout 2s and a broker that never confirms: after
    ~2 s rebound sends the client's own requeue (same method, same tag),
    logs retry_fallback reason="confirm timeout", and then the held
    publishes reach the broker in order, all of them; the connection keeps
    working."""
    broker = fake(confirm=False, on_consume=deliver_on_consume)
    rb = rebound_factory("--retry-confirm-timeout", "2s",
                         upstream=broker.addr, env=SMALL_QUARANTINE)
    c, t_fail = held_client(rb, "held-queue", how)
    up = broker.wait_conn("held-client")
    try:
        copies = broker.wait_conn("rebound retries for")
        copy = copies.wait(lambda: copies.published("held-queue.retry.1s"),
                           10, "rebound's copy of the failed delivery")[0]
        count = 400
        pub = Publisher(c, count, 16 * 1024)
        pub.run()  # 6.4 MiB: fits below any watermark, sent at once
        assert pub.done, pub.error
        method = "basic.reject" if how == "reject" else "basic.nack"
        fall = up.wait_event(method, timeout=15, tag=1, requeue=True)
        waited = fall.t - t_fail
        assert fall.ch == 1
        assert 1.8 <= waited <= 8.0, "fallback after %.2fs" % waited
        assert not up.find("basic.ack", tag=1), "the original was acked"
        line = rb.wait_log("retry_fallback", reason="confirm timeout")
        assert line
        got = up.wait(lambda: len(up.published("dest")) >= count and
                      up.published("dest"), 20,
                      lambda: "%d held publishes (got %d)" % (
                          count, len(up.published("dest"))))
        assert [struct.unpack(">I", m.head[:4])[0] for m in got] == \
            list(range(count))
        assert all(m.ch == 1 and m.size == 16 * 1024 for m in got)
        assert got[0].n > fall.n > copy.n, "held publishes before the fallback"
        c.open_channel(2)
        c.send(a.connection_close())
        c.recv_method(a.CONNECTION_CLOSE_OK)
    finally:
        c.close()
    rb.wait_conn_sockets(0)


def test_client_gone_retries_timed_out_says_so(rebound_factory, fake):
    """A client that leaves while its copy is never confirmed: rebound waits
    --retry-finish-timeout for it, then closes the session with a reason
    that says the retries timed out (not just "client disconnected"), and
    the original is never acked."""
    broker = fake(confirm=False, on_consume=deliver_on_consume)
    rb = rebound_factory("--retry-finish-timeout", "1s",
                         upstream=broker.addr)
    c, _ = held_client(rb, "held-queue", "nack")
    up = broker.wait_conn("held-client")
    copies = broker.wait_conn("rebound retries for")
    copies.wait(lambda: copies.published("held-queue.retry.1s"), 10,
                "rebound's copy of the failed delivery")
    c.close()
    line = rb.wait_log("session_close", timeout=10)
    assert line["reason"] == \
        "client disconnected (retries pending timed out)", line
    assert rb.wait_log("client_gone_retries_pending")["pending"] == "1"
    assert not up.find("basic.ack", tag=1)
