"""Bad input from clients, and no broker to talk to. The offending
connection is closed cleanly with a log line naming the peer; rebound and
every other session carry on."""
import socket
import struct
import subprocess
import time

import pytest

import amqp_raw as a
import rbtest

EXPIRES = {"x-expires": 120000}


class Bystander:
    """A pika connection open through the same rebound while bad input
    arrives; it must keep working."""

    def __init__(self, rb, broker):
        self.rb = rb
        self.conn = rb.pika(broker)
        self.ch = self.conn.channel()
        self.q = self.ch.queue_declare("", exclusive=True).method.queue
        self.n = 0
        self.check()

    def check(self):
        self.n += 1
        body = b"bystander-%d" % self.n
        self.ch.basic_publish("", self.q, body)
        assert self.ch.basic_get(self.q, auto_ack=True)[2] == body
        assert len(self.rb.conn_sockets()) >= 2

    def close(self):
        self.conn.close()


@pytest.fixture
def bystander(rebound, broker):
    b = Bystander(rebound, broker)
    yield b
    b.close()


def peer_lines(rb, msg, port):
    return rb.log_lines(msg, peer="127.0.0.1:%d" % port)


# ---- wrong protocol header ------------------------------------------------

BAD_HEADERS = {
    "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "amqp-0-9-2": b"AMQP\x00\x00\x09\x02",
    "amqp-0-8": b"AMQP\x01\x01\x08\x00",
    "amqp-1-0": b"AMQP\x00\x01\x00\x00",
    "tls-hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    "short-garbage": b"\x00\x00\x00\x00\x00\x00\x00\x00",
}


@pytest.mark.parametrize("header", list(BAD_HEADERS.values()),
                         ids=list(BAD_HEADERS))
def test_wrong_protocol_header(rebound, bystander, header):
    """Answered with exactly the 0-9-1 header, then closed. Tried a few
    times: when the upstream connect completes in the same loop turn as the
    client's bytes arrive, a proxy can get this wrong only sometimes."""
    for attempt in range(30):
        c = a.RawClient(rebound.port)
        try:
            c.send(header)
            answer = c.read_until_eof(timeout=5)
        finally:
            c.close()
        lines = rebound.log_lines("bad_protocol_header",
                                  peer="127.0.0.1:%d" % c.local_port)
        assert answer == a.PROTOCOL_HEADER, "attempt %d got %r" % (attempt, answer)
        assert len(lines) == 1, "attempt %d: %d bad_protocol_header lines" % (
            attempt, len(lines))
        assert lines[0].get("sent")
    rbtest.wait_until(lambda: len(rebound.conn_sockets()) == 2, 10,
                      lambda: "only the bystander's sockets: %r" % rebound.conn_sockets())
    bystander.check()


# ---- malformed frames after a good handshake --------------------------------

def _oversized():
    return struct.pack(">BHI", a.FRAME_METHOD, 0, 0x7FFFFFF0) + b"\x00" * 64


# name -> (needs channel 1 open, bytes to send, expected reply code)
MALFORMED = {
    "bad-frame-end": (False, a.frame(a.FRAME_HEARTBEAT, 0, b"", end=0x00), 501),
    "unknown-frame-type": (False, a.frame(9, 0, b""), 501),
    "oversized-frame": (False, _oversized(), 501),
    "heartbeat-on-channel-1": (False, a.frame(a.FRAME_HEARTBEAT, 1, b""), 505),
    "body-on-channel-0": (False, a.frame(a.FRAME_BODY, 0, b"abc"), 505),
    "header-on-channel-0": (False, a.content_header(0, 3), 505),
    "body-without-header": (True, a.basic_publish(1, "", "q") + a.frame(a.FRAME_BODY, 1, b"abc"), 505),
    "method-inside-content": (True, a.basic_publish(1, "", "q") + a.content_header(1, 10)
                              + a.basic_publish(1, "", "q"), 505),
    "connection-method-on-channel-1": (True, a.method(1, a.CONNECTION_OPEN, a.shortstr("/") + b"\x00\x00"), 503),
}
FRAME_LEVEL = {"bad-frame-end", "unknown-frame-type", "oversized-frame",
               "heartbeat-on-channel-1"}


def malformed_client(rb, broker, name):
    open_ch, data, code = MALFORMED[name]
    c = a.RawClient(rb.port)
    c.handshake(broker.user, broker.password, broker.vhost)
    if open_ch:
        c.open_channel(1)
    c.send(data)
    return c, code


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_frame_closes_the_connection(rebound, broker, bystander, name):
    c, code = malformed_client(rebound, broker, name)
    try:
        reply_code, text, _, _ = c.expect_connection_close(timeout=5)
        assert reply_code == code, text
        c.send(a.connection_close_ok())
        c.wait_eof(timeout=3)
    finally:
        c.close()
    line = rebound.wait_log("protocol_error", peer="127.0.0.1:%d" % c.local_port)
    assert line.get("side") == "client"
    rbtest.wait_until(lambda: len(rebound.conn_sockets()) == 2, 10,
                      lambda: "upstream of the bad client closed: %r"
                      % rebound.conn_sockets())
    bystander.check()


@pytest.mark.parametrize("name", sorted(FRAME_LEVEL))
def test_close_ok_after_frame_error_is_honoured(rebound, broker, bystander, name):
    """After rebound's connection.close, the client's close-ok ends the
    session (the spec: close-ok means it is safe to close the socket), and
    the one bad frame is logged once, not once per read."""
    c, code = malformed_client(rebound, broker, name)
    try:
        assert c.expect_connection_close(timeout=5)[0] == code
        c.send(a.connection_close_ok())
        waited = c.wait_eof(timeout=5)
    finally:
        c.close()
    errors = peer_lines(rebound, "protocol_error", c.local_port)
    close = peer_lines(rebound, "session_close", c.local_port)
    assert waited < 1.0, "socket closed %.2fs after close-ok (%r)" % (
        waited, close[0].get("reason") if close else None)
    assert len(errors) == 1, "%d protocol_error lines for one bad frame" % len(errors)
    bystander.check()


def test_oversized_frame_does_not_grow_memory(rebound, broker, bystander):
    """A frame header announcing ~2 GiB followed by a stream of bytes: the
    client gets 501 and rebound's memory stays bounded."""
    rss0 = rebound.rss_kib()
    c = a.RawClient(rebound.port)
    c.handshake(broker.user, broker.password, broker.vhost)
    c.send(struct.pack(">BHI", a.FRAME_METHOD, 0, 0x7FFFFFF0))
    assert c.expect_connection_close(timeout=5)[0] == 501
    junk = b"\x00" * 65536
    end = time.monotonic() + 1.5
    sent = 0
    c.sock.settimeout(0.5)
    try:
        while time.monotonic() < end:
            sent += c.sock.send(junk)
    except OSError:
        pass  # rebound closed or stopped reading: both fine
    grown = rebound.rss_kib() - rss0
    c.close()
    errors = peer_lines(rebound, "protocol_error", c.local_port)
    rbtest.wait_until(lambda: len(rebound.conn_sockets()) == 2, 10,
                      "the bad client's sockets closed")
    assert grown < 64 * 1024, "rebound's RSS grew by %d MiB (client sent %d KiB)" % (
        grown // 1024, sent // 1024)
    assert len(errors) <= 2, "%d protocol_error lines for one bad frame" % len(errors)
    bystander.check()


# ---- handshake timeout ----------------------------------------------------------

def test_handshake_timeout(rebound_factory, broker):
    rb = rebound_factory("--handshake-timeout", "1s")
    by = Bystander(rb, broker)
    try:
        t0 = time.monotonic()  # before either connects: timers start at accept
        silent = a.RawClient(rb.port)  # sends nothing at all
        halfway = a.RawClient(rb.port)  # stops after connection.start
        halfway.send(a.PROTOCOL_HEADER)
        halfway.recv_method(a.CONNECTION_START)
        for c in (silent, halfway):
            c.wait_eof(timeout=5)
            elapsed = time.monotonic() - t0
            assert 1.0 <= elapsed <= 3.5, "closed after %.2fs" % elapsed
            line = rb.wait_log("handshake_timeout", peer="127.0.0.1:%d" % c.local_port)
            assert line
            c.close()
        # the session that finished its handshake in time is untouched
        assert time.monotonic() - t0 >= 1.0
        by.check()
        rbtest.wait_until(lambda: len(rb.conn_sockets()) == 2, 10,
                          "the timed-out sessions' sockets closed")
    finally:
        by.close()
    rb.wait_conn_sockets(0)


# ---- no upstream --------------------------------------------------------------

def test_all_upstreams_unreachable(rebound_factory, broker):
    """No upstream answers: the client is told so in AMQP, promptly
    (rebound's own handshake, then connection.close 320 with the reason,
    as a broker that goes down closes its clients), not left with a bare
    EOF; the log names every try."""
    rb = rebound_factory(upstream="127.0.0.1:1,127.0.0.1:2")
    t0 = time.monotonic()
    c = a.RawClient(rb.port)
    try:
        c.handshake()  # rebound's own: start, tune, open-ok
        code, text = c.expect_connection_close()[:2]
        c.send(a.connection_close_ok())
        c.wait_eof()
    finally:
        c.close()
    assert time.monotonic() - t0 < 5
    assert (code, text) == (320, "CONNECTION_FORCED - no upstream reachable")
    # pika: closed promptly, not a hang
    conn = rb.pika(broker)
    rbtest.wait_until(lambda: (conn.process_data_events(0.1), conn.is_closed)[1]
                      if conn.is_open else True, 5, "pika's connection closed")
    line = rb.wait_log("upstream_unreachable")
    tried = line["tried"]
    assert "127.0.0.1:1: " in tried and "127.0.0.1:2: " in tried, tried
    assert "refused" in tried
    assert rb.wait_log("session_close", reason="no upstream reachable")
    rb.wait_conn_sockets(0)
    assert rb.alive()


def test_failover_to_the_next_upstream(rebound_factory, broker):
    rb = rebound_factory(upstream="127.0.0.1:1," + broker.addr)
    conn = rb.pika(broker)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"via-second")
    assert ch.basic_get(q, auto_ack=True)[2] == b"via-second"
    assert rb.wait_log("session_open")["upstream"] == broker.addr
    conn.close()
    rb.wait_conn_sockets(0)


# ---- the log itself -------------------------------------------------------------

def test_log_lines_are_logfmt(rebound, broker):
    """Every line rebound writes parses as logfmt (values with spaces are
    quoted), including the lines about bad input and dropped peers."""
    for header in (b"AMQP\x00\x01\x00\x00", b"GET / HTTP/1.1\r\n\r\n"):
        c = a.RawClient(rebound.port)
        c.send(header)
        c.read_until_eof(timeout=5)
        c.close()
    # a client that resets its connection
    c = a.RawClient(rebound.port)
    c.handshake(broker.user, broker.password, broker.vhost)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    rebound.wait_conn_sockets(0)
    bad = []
    for line in rebound.log().splitlines():
        try:
            d = rbtest.logfmt_parse(line)
            assert "ts" in d and "level" in d and "msg" in d
        except (ValueError, AssertionError) as e:
            bad.append("%s\n    %s" % (line, e))
    assert not bad, "lines that are not logfmt:\n" + "\n".join(bad)


def test_listen_failure_exits_cleanly(rebound, tmp_path):
    """A second rebound on a port already taken: non-zero exit, a
    listen_failed line, and no sanitizer report."""
    p = subprocess.run([rbtest.BIN, "--listen", rebound.addr, "--upstream",
                        "127.0.0.1:1"], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert "msg=listen_bind_failed" in p.stderr
    found = [m for m in rbtest.SANITIZER_MARKERS if m in p.stderr]
    assert not found, "sanitizer report on the listen-failure path:\n" + p.stderr
