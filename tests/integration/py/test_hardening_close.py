"""The end of a connection as the broker ends it. RabbitMQ answers every
connection.close with close-ok, ignores whatever the client still sends,
and keeps the socket open until the client closes it. Through rebound a
client that closes from several threads, or closes with publishes still
queued behind the close, must read every close-ok and never see a reset.

Each test first checks the broker itself does what it expects (same
frames, straight to the broker)."""
import select
import socket
import time

import pika

import amqp_raw as a
import fakebroker as fb
import rbtest

RUNS = 40
BASIC_DELIVER = (60, 60)


class Reset(Exception):
    pass


class Conn:
    """A raw client that tells a reset (ECONNRESET, EPIPE) apart from an
    orderly end of stream."""

    def __init__(self, port):
        self.raw = a.RawClient(port)
        self.raw.handshake()
        self.sock = self.raw.sock
        self.buf = b""

    def send(self, data):
        try:
            self.sock.sendall(data)
        except (ConnectionResetError, BrokenPipeError) as e:
            raise Reset("send: %r" % e)

    def frame(self, timeout=10):
        """The next frame; None at end of stream; Reset on a reset."""
        self.buf += self.raw.buf
        self.raw.buf = b""
        deadline = time.monotonic() + timeout
        while True:
            f, n = a.parse_frame(self.buf)
            if f is not None:
                self.buf = self.buf[n:]
                return f
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame in %.1fs" % timeout)
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise TimeoutError("no frame in %.1fs" % timeout)
            except ConnectionResetError as e:
                raise Reset("recv: %r" % e)
            if not data:
                return None
            self.buf += data

    def close_oks(self, n, timeout=10):
        """Read until n close-oks came; fails on anything but close-ok,
        heartbeats and frames still in flight before it."""
        got = 0
        while got < n:
            f = self.frame(timeout)
            if f is None:
                raise AssertionError("end of stream after %d of %d close-ok"
                                     % (got, n))
            if f.method == a.CONNECTION_CLOSE:
                raise AssertionError("connection.close %r instead of close-ok"
                                     % (f.close_args(),))
            if f.method == a.CONNECTION_CLOSE_OK:
                got += 1

    def quiet(self, seconds):
        """True when, for `seconds`, the peer neither closed nor reset
        (nor sent anything)."""
        r, _, _ = select.select([self.sock], [], [], seconds)
        return not r

    def close(self):
        self.raw.close()


def runs(port, scenario, n):
    """Run `scenario(port)` n times; returns the failures as strings."""
    failures = []
    for i in range(n):
        try:
            scenario(port)
        except (Reset, AssertionError, TimeoutError) as e:
            failures.append("run %d: %s" % (i, e))
    return failures


# ---- (a) several connection.close at once ----------------------------------

def five_closes(port):
    c = Conn(port)
    try:
        c.send(a.connection_close() * 5)
        c.close_oks(5)
    finally:
        c.close()


def test_concurrent_closers_each_get_close_ok(rebound_factory, broker):
    """5 connection.close back to back (threads closing at once): 5
    close-oks, never a reset; 40 connections."""
    assert runs(broker.port, five_closes, 1) == []
    rb = rebound_factory()
    failures = runs(rb.port, five_closes, RUNS)
    assert not failures, "%d of %d runs failed:\n%s" % (
        len(failures), RUNS, "\n".join(failures[:5]))
    rb.wait_conn_sockets(0)


# ---- (b) connection.close with publishes queued behind it ------------------

PUBLISHES = 2000


def close_then_publishes(port):
    c = Conn(port)
    try:
        c.raw.open_channel(1)
        one = fb.publish(1, "rbt-nowhere", b"x" * 4000)
        c.send(a.connection_close() + one * PUBLISHES)
        c.close_oks(1)
    finally:
        c.close()


def test_close_followed_by_publishes(rebound_factory, broker):
    """connection.close then 2,000 publishes of 4 KB in one send: the client
    reads its close-ok, no reset on send or receive; 40 connections."""
    assert runs(broker.port, close_then_publishes, 1) == []
    rb = rebound_factory()
    failures = runs(rb.port, close_then_publishes, RUNS)
    assert not failures, "%d of %d runs failed:\n%s" % (
        len(failures), RUNS, "\n".join(failures[:5]))
    rb.wait_conn_sockets(0)


# ---- (c) frames after connection.close are not judged -----------------------

def close_then_body(port):
    c = Conn(port)
    try:
        c.raw.open_channel(1)
        c.send(a.connection_close() + a.frame(a.FRAME_BODY, 1, b"stray"))
        c.close_oks(1)
        assert c.quiet(0.5), "the peer ended or reset after close-ok"
    finally:
        c.close()


def test_body_after_close_is_ignored(rebound_factory, broker):
    """A body frame with no content header right after connection.close:
    just close-ok, never a 505."""
    assert runs(broker.port, close_then_body, 1) == []
    rb = rebound_factory()
    failures = runs(rb.port, close_then_body, 3)
    assert not failures, "\n".join(failures)
    rb.wait_conn_sockets(0)


# ---- (d) after close-ok the client ends the connection ----------------------

def test_socket_stays_open_after_close_ok(rebound_factory, broker):
    """After close-ok the socket stays open (bytes sent 1 s later are not
    answered with a reset) until the client closes it; then both of the
    session's sockets go away promptly."""
    def stays_open(port):
        c = Conn(port)
        try:
            c.send(a.connection_close())
            c.close_oks(1)
            assert c.quiet(1.0), "closed within 1 s of close-ok"
            c.send(a.HEARTBEAT + fb.publish(1, "rbt-nowhere", b"late"))
            assert c.quiet(0.5), "reset after bytes sent past close-ok"
        finally:
            c.close()

    stays_open(broker.port)
    rb = rebound_factory()
    stays_open(rb.port)
    t0 = time.monotonic()
    rb.wait_conn_sockets(0, timeout=5)
    assert time.monotonic() - t0 < 2.0


# ---- (e) acks right before the hang-up count --------------------------------

ACKS = 1000


def queue_depth(broker, q):
    """Messages ready in `q` once its consumer is gone (the broker has
    requeued what the connection left unacked)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()

        def settled():
            ok = ch.queue_declare(q, passive=True).method
            return ok if ok.consumer_count == 0 else None
        ok = rbtest.wait_until(settled, 20, "the consumer of %s gone" % q)
        ch.queue_delete(q)
        return ok.message_count
    finally:
        conn.close()


def ack_all_then_hang_up(broker, port, q):
    """Fill `q` with ACKS messages, consume them all over a raw connection
    through `port`, then in one write ack every one and send
    connection.close, and hang up at once: nothing waits for close-ok.
    Returns how many came back (were not acked)."""
    c = a.RawClient(broker.port)
    c.handshake()
    c.open_channel(1)
    c.send(fb.queue_declare(1, q) + fb.publish(1, q, b"m") * ACKS)
    c.send(a.connection_close())
    while c.recv_frame().method != a.CONNECTION_CLOSE_OK:
        pass  # queue.declare-ok first
    c.close()

    c = a.RawClient(port)
    c.handshake()
    c.open_channel(1)
    c.send(a.basic_consume(1, q))
    tags = []
    while len(tags) < ACKS:
        f = c.recv_frame()
        if f.type == a.FRAME_METHOD and f.method == BASIC_DELIVER:
            tags.append(fb.decode_method(f.payload)[1]["delivery_tag"])
    acks = b"".join(fb.basic_ack(1, t) for t in tags)
    c.send(acks + a.connection_close())
    c.sock.shutdown(socket.SHUT_WR)
    c.close()
    return queue_depth(broker, q)


def test_acks_before_hang_up_count(rebound_factory, broker):
    """A client acks 1,000 deliveries, sends connection.close and hangs up
    in the same breath. RabbitMQ drops what it has not yet acted on of a
    connection that hangs up, acks included (straight to the broker,
    hundreds of the 1,000 come back: measured, not asserted). rebound ends
    the broker's side with connection.close and hangs up only once the
    broker answered it, so every ack counts: the same as for the acks of
    originals whose retry copy is confirmed, which rebound sends itself."""
    q = rbtest.uniq("hangup")
    direct = ack_all_then_hang_up(broker, broker.port, q + "-direct")
    rb = rebound_factory()
    for i in range(3):
        back = ack_all_then_hang_up(broker, rb.port, "%s-%d" % (q, i))
        assert back == 0, (
            "run %d: %d of %d acked deliveries came back through rebound "
            "(straight to the broker: %d)" % (i, back, ACKS, direct))
    rb.wait_conn_sockets(0)
