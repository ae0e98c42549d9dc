"""State a client can make rebound keep: queue labels of consumers the
broker never accepted, records on a channel the broker already closed,
and a second connection.tune-ok. Each must stay bounded and correct."""
import http.client
import re
import struct
import time

import pytest

import amqp_raw as a
import fakebroker as fb
import rbtest

# ASan's quarantine would count freed memory as resident: keep it small.
SMALL_QUARANTINE = {"ASAN_OPTIONS": "quarantine_size_mb=4:detect_leaks=1"}

CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
NOT_FOUND = 404


def get_metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    r = c.getresponse()
    body = r.read().decode("utf-8", "replace")
    c.close()
    assert r.status == 200, r.status
    return body


def admin_rebound(factory, *args, **kw):
    port = rbtest.free_port()
    rb = factory("--admin", "127.0.0.1:%d" % port, *args, **kw)
    rb.admin_port = port
    rbtest.wait_until(lambda: _answers(port), 10, "the admin endpoint")
    return rb


def _answers(port):
    try:
        get_metrics(port)
        return True
    except OSError:
        return False


def expect_channel_close(c, ch, timeout=10):
    f = c.recv_method(timeout=timeout)
    assert f.channel == ch and f.method == CHANNEL_CLOSE, f
    return struct.unpack(">H", f.payload[4:6])[0]


def round_trip(c, ch, queue, timeout=10):
    """queue.declare (passive) on `ch`; returns when its answer arrived,
    i.e. once rebound has processed every byte sent before it."""
    c.send(a.method(ch, (50, 10), struct.pack(">H", 0) + a.shortstr(queue)
                    + fb.bits(True) + a.table({})))
    f = c.recv_method((50, 11), timeout=max(0.001, timeout))
    assert f.channel == ch


def publish_get(c, ch, queue, body):
    """Publish `body` to `queue` and basic.get it back (no-ack)."""
    c.send(fb.publish(ch, queue, body))
    c.send(fb.basic_get(ch, queue, no_ack=True))
    f = c.recv_method(timeout=10)
    assert f.method == (60, 71), f  # get-ok
    h = c.recv_frame()
    assert h.type == a.FRAME_HEADER
    got = c.recv_frame()
    assert got.type == a.FRAME_BODY and got.payload == body


# ---- 2. queue labels only for consumers the broker accepted ------------------

BOGUS = 100


@pytest.fixture
def queue_other(broker):
    """The queue literally named `other`, deleted at teardown."""
    yield "other"
    import pika
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    conn.channel().queue_delete("other")
    conn.close()


def test_bogus_consumers_do_not_take_metric_labels(rebound_factory, broker,
                                                   queue_other):
    """100 no-wait consumes on queues the broker does not have (each
    channel closed with 404), then a consumer on a real queue named
    `other`: its delivery and ack are counted under queue="other", and
    none of the bogus names is a label anywhere in /metrics."""
    rb = admin_rebound(rebound_factory)
    tag = rbtest.uniq("bogus")
    names = ["%s-%03d" % (tag, i) for i in range(BOGUS)]
    c = a.RawClient(rb.port)
    try:
        c.handshake()
        for i, name in enumerate(names, start=1):
            c.open_channel(i)
            c.send(fb.basic_consume(i, name, "c%d" % i, no_wait=True))
            assert expect_channel_close(c, i) == NOT_FOUND
            c.send(a.method(i, CHANNEL_CLOSE_OK))
        ch = BOGUS + 1
        c.open_channel(ch)
        c.send(fb.queue_declare(ch, "other"))
        c.recv_method((50, 11))
        c.send(fb.publish(ch, "other", b"to other"))
        c.send(fb.basic_consume(ch, "other", "other-consumer"))
        c.recv_method((60, 21))
        d = c.recv_method((60, 60))
        delivery_tag = fb.decode_method(d.payload)[1]["delivery_tag"]
        assert c.recv_frame().type == a.FRAME_HEADER
        assert c.recv_frame().payload == b"to other"
        c.send(fb.basic_ack(ch, delivery_tag))
        round_trip(c, ch, "other")  # the ack went through rebound
        assert rb.alive()
        body = get_metrics(rb.admin_port)
        count = re.search(r'^rebound_consumer_processing_seconds_count'
                          r'\{queue="other"\} (\S+)$', body, re.M)
        assert count and float(count.group(1)) >= 1, \
            [l for l in body.splitlines() if "processing" in l]
        labelled = [l for l in body.splitlines() if tag in l]
        assert not labelled, labelled[:5]
        c.send(a.connection_close())
        c.recv_method(a.CONNECTION_CLOSE_OK)
    finally:
        c.close()
    rb.wait_conn_sockets(0)


# ---- 4. nothing is recorded on a channel the broker closed ------------------

FLOOD = 200000
FLOOD_DEADLINE = 60  # seconds for the flood to get through (takes ~4 s)
GROWTH_BOUND_MIB = 40


def test_no_records_on_a_closed_channel(rebound_factory, broker, qname):
    """The broker closes channel 1 (404); the client does not answer
    close-ok but floods it with no-wait consumes and gets, which the
    broker drops: rebound's memory stays flat, and after close-ok the
    connection still works."""
    rb = rebound_factory(env=SMALL_QUARANTINE)
    c = a.RawClient(rb.port, timeout=60)
    try:
        c.handshake()
        c.open_channel(1)
        c.open_channel(2)
        c.send(fb.queue_declare(2, qname, auto_delete=False,
                                arguments=a.table({"x-expires": 60000})))
        c.recv_method((50, 11))
        c.send(fb.basic_consume(1, qname + "-missing", "first", no_wait=True))
        assert expect_channel_close(c, 1) == NOT_FOUND
        rss0 = rb.rss_kib()
        long_name = "q" * 200
        chunk, sent = [], 0
        deadline = time.monotonic() + FLOOD_DEADLINE
        try:
            for i in range(FLOOD):
                chunk.append(fb.basic_consume(1, long_name, "t%07d" % i,
                                              no_wait=True))
                chunk.append(fb.basic_get(1, long_name))
                if len(chunk) >= 2000 or i == FLOOD - 1:
                    data = b"".join(chunk)
                    c.sock.settimeout(max(0.001, deadline - time.monotonic()))
                    c.send(data)
                    sent += len(data)
                    chunk = []
            # every flood frame went through rebound once this is answered
            round_trip(c, 2, qname, timeout=deadline - time.monotonic())
        except (TimeoutError, OSError) as e:
            raise AssertionError(
                "rebound stalled on the flood (%r): %.0f MiB sent in %ds, RSS "
                "+%.0f MiB" % (e, sent / 2 ** 20, FLOOD_DEADLINE,
                               (rb.rss_kib() - rss0) / 1024))
        grown_mib = (rb.rss_kib() - rss0) / 1024
        print("closed-channel flood: RSS +%.1f MiB" % grown_mib)
        assert grown_mib < GROWTH_BOUND_MIB, \
            "rebound's RSS grew by %.0f MiB for frames the broker drops" \
            % grown_mib
        c.send(a.method(1, CHANNEL_CLOSE_OK))
        c.open_channel(3)
        publish_get(c, 3, qname, b"still works")
        c.send(a.connection_close())
        c.recv_method(a.CONNECTION_CLOSE_OK)
    finally:
        c.close()
    rb.wait_conn_sockets(0)


# ---- 5. a second tune-ok -----------------------------------------------------

# RabbitMQ 3.10 answers a second tune-ok with 504 CHANNEL_ERROR
# "unexpected method in connection state opening"
CHANNEL_ERROR = 504


@pytest.fixture
def fake():
    b = fb.FakeBroker()
    yield b
    b.stop()


def second_tune_ok(port, then=b""):
    """Header, start-ok, tune-ok (channel-max 10), tune-ok (2047), open and
    `then`, all at once: the connection.close that comes back, or the
    exception that ended the wait for it."""
    c = a.RawClient(port)
    try:
        c.send(a.PROTOCOL_HEADER)
        c.recv_method(a.CONNECTION_START)
        c.send(a.start_ok())
        tune = c.recv_method(a.CONNECTION_TUNE).tune_args()
        c.send(a.tune_ok(10, tune[1], 0) + a.tune_ok(2047, tune[1], 0)
               + a.connection_open() + then)
        try:
            close = c.expect_connection_close(timeout=5)
            c.send(a.connection_close_ok())
            c.wait_eof(timeout=5)
        except (TimeoutError, EOFError) as e:
            close = e
    finally:
        c.close()
    return close


def test_second_tune_ok_is_a_protocol_error(rebound_factory, broker, fake):
    """tune-ok (channel-max 10), tune-ok again (channel-max 2047), open,
    then channel.open for channels above 10, all in one go, to a broker
    that would accept it all (RabbitMQ closes the connection on the second
    tune-ok; the fake broker does not): rebound answers as RabbitMQ does,
    connection.close 504 naming tune-ok, and nothing leaks (LeakSanitizer
    at exit)."""
    want = second_tune_ok(broker.port)
    assert isinstance(want, tuple) and want[0] == CHANNEL_ERROR, want
    rb = rebound_factory(upstream=fake.addr)
    close = second_tune_ok(rb.port, b"".join(a.channel_open(ch)
                                             for ch in range(11, 400)))
    rb.wait_conn_sockets(0)
    rc = rb.stop()
    found = rb.sanitizer_report()
    assert rc == 0 and not found, "exit %r, %s:\n%s" % (
        rc, found, rb.log()[-4000:])
    assert isinstance(close, tuple), "no connection.close: %r" % close
    code, text, cls, meth = close
    assert (code, cls, meth) == (want[0], want[2], want[3]), (close, want)
