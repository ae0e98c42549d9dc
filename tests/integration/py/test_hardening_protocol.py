"""rebound answers as the broker would: frames on a channel the client
never opened (rebound's own number included) get the broker's 504 and
reach no channel of rebound's; what only the broker interprets is judged
by the broker (deep consume arguments, a heartbeat on a channel); and a
retry copy that cannot fit the client's frame-max never breaks the
client's connection.

Where the expected answer is "as the broker would", each test sends the
same frames straight to the broker too and compares."""

import pika
import pytest

import amqp_raw as a
import fakebroker as fb
import rbtest
from retryhelp import direct

assert direct  # a fixture

CHANNEL_ERROR = 504


def close_answer(port, frames, channels=(), channel_max=None, timeout=10):
    """Handshake on `port`, open `channels`, send `frames`: the
    connection.close that comes back (code, text, class, method), or
    ("frames", [methods seen]) when none came."""
    c = a.RawClient(port)
    seen = []
    try:
        c.handshake(channel_max=channel_max)
        for ch in channels:
            c.open_channel(ch)
        c.send(frames)
        try:
            while True:
                f = c.recv_method(timeout=timeout)
                if f.channel == 0 and f.method == a.CONNECTION_CLOSE:
                    args = f.close_args()
                    c.send(a.connection_close_ok())
                    return args
                seen.append((f.channel, f.method))
        except (TimeoutError, EOFError):
            return ("frames", seen)
    finally:
        c.close()


# ---- 7. frames on a channel the client has not opened -------------------------

N = 50


@pytest.fixture
def fifty(direct):
    q = direct.own(rbtest.uniq("unopened"))
    ch = direct.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    for i in range(N):
        ch.basic_publish("", q, b"m%d" % i)
    ch.close()
    return q


def counts(direct, q):
    """(ready messages, consumers) of `q`, from a passive declare (the
    shared broker's rabbitmqctl listings can hold other tests' hostile
    queue names)."""
    ch = direct.channel()
    try:
        m = ch.queue_declare(q, passive=True).method
    except pika.exceptions.ChannelClosedByBroker as e:
        if e.reply_code == 404:
            return None
        raise
    ch.close()
    return m.message_count, m.consumer_count


@pytest.mark.parametrize("opened", [(), (2047,)], ids=["own-2047",
                                                      "mapped-2046"])
def test_consume_on_an_unopened_channel(rebound_factory, broker, direct,
                                        fifty, opened):
    """channel-max 2047: rebound's channel is 2047. A no-ack consume on
    2047 without channel.open -- or, once the client opened 2047 (carried
    on 2046 upstream), on the unopened 2046 -- is answered with the
    broker's 504, and not one of the 50 messages is consumed."""
    unopened = 2046 if opened else 2047
    frames = fb.basic_consume(unopened, fifty, "sneaky", no_ack=True)
    rb = rebound_factory()
    via = close_answer(rb.port, frames, opened)
    rb.wait_conn_sockets(0)  # its upstream connection is gone too
    assert counts(direct, fifty) == (N, 0), "rebound let the consume through"
    want = close_answer(broker.port, frames, opened)
    assert want[0] == CHANNEL_ERROR, want
    assert via[0] == want[0] and via[2:] == want[2:], (via, want)
    assert counts(direct, fifty) == (N, 0)
    assert rb.alive()


# ---- 10. no stricter than the broker --------------------------------------

def test_deeply_nested_consume_arguments(rebound_factory, broker, qname):
    """basic.consume whose arguments nest 40 tables: the broker accepts
    it, so through rebound it is accepted too."""
    args = fb.nested_table(40)
    rb = rebound_factory()
    for port in (broker.port, rb.port):
        c = a.RawClient(port)
        try:
            c.handshake()
            c.open_channel(1)
            c.send(fb.queue_declare(1, qname, arguments=a.table(
                {"x-expires": 60000})))
            c.recv_method((50, 11))
            c.send(fb.basic_consume(1, qname, "deep", arguments=args))
            f = c.recv_method()
            assert f.method == (60, 21), \
                "port %d answered %r %r" % (port, f, f.close_args()
                                            if f.method == a.CONNECTION_CLOSE
                                            else "")
            c.send(a.connection_close())
            c.recv_method(a.CONNECTION_CLOSE_OK)
        finally:
            c.close()
    rb.wait_conn_sockets(0)


def test_heartbeat_on_a_channel(rebound_factory, broker):
    """A heartbeat frame on channel 1 after the handshake: the code the
    broker answers (505 UNEXPECTED_FRAME), not a frame error."""
    frames = a.frame(a.FRAME_HEARTBEAT, 1, b"")
    rb = rebound_factory()
    want = close_answer(broker.port, frames)
    via = close_answer(rb.port, frames)
    assert want[0] == 505, want
    assert via[0] == want[0], (via, want)
    assert via[2:] == want[2:], (via, want)  # no class/method named
    rb.wait_conn_sockets(0)
    assert rb.alive()


# ---- 8. a retry copy larger than frame-max ----------------------------------

FRAME_MAX = 4096
# 3950: fits 4096; with rebound's ~250 bytes of headers for a tier it does
# not, with the dead-letter reason alone it does. 3850: the tier copy
# itself fits, but not once the tier dead-letters it back and the broker
# adds x-death (the client would get a frame over its frame-max).
HEADER_FRAMES = (3950, 3850)


def header_frame_len(props):
    """Bytes of the content-header frame carrying `props`: frame header,
    class, weight, body size, the properties (flags included), frame end."""
    return 7 + 12 + sum(len(x) for x in props.encode()) + 1


def big_header_props(size):
    """Properties whose content-header frame is `size` bytes."""
    props = pika.BasicProperties(headers={"app": "orders", "pad": ""})
    pad = size - header_frame_len(props)
    props.headers["pad"] = "p" * pad
    assert header_frame_len(props) == size
    return props


def admin_get(port, path):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read().decode()
    c.close()
    return body


@pytest.mark.parametrize("size", HEADER_FRAMES)
def test_retry_copy_larger_than_frame_max(rebound_factory, broker, direct,
                                          size):
    """frame-max 4096 and a message whose content header is close to it:
    rebound's copy with its headers (and, for a tier, the x-death the broker
    adds on the way back) would not fit, so the message is dead-lettered
    with reason frame-max; the consumer's connection stays open and the
    original is acked."""
    q = direct.own(rbtest.uniq("framemax"))
    direct.own(q + ".dlq")
    direct.channel().queue_declare(q, durable=True)
    props = big_header_props(size)
    direct.publish(q, b"the body", props)
    admin = rbtest.free_port()
    rb = rebound_factory("--retry-tiers", "200ms", "--admin",
                         "127.0.0.1:%d" % admin)
    conn = rb.pika(broker, frame_max=FRAME_MAX)
    try:
        ch = conn.channel()
        seen = []

        def on_message(c, m, p, b):
            seen.append((p, b))
            c.basic_nack(m.delivery_tag, requeue=True)

        ch.basic_consume(q, on_message)

        def settled():
            # pika's I/O runs meanwhile: a broken connection raises here
            conn.process_data_events(time_limit=0.2)
            return seen and counts(direct, q + ".dlq") == (1, 0)

        rbtest.wait_until(settled, 20, lambda: "the copy in the dead-letter "
                          "queue (%d deliveries, %r)" % (
                              len(seen), counts(direct, q + ".dlq")))
        assert seen[0][0].headers["pad"] == props.headers["pad"]
        # the connection is still usable
        assert ch.queue_declare(q, passive=True).method.message_count == 0
        conn.process_data_events(time_limit=0.5)
        assert len(seen) == 1, "delivered %d times" % len(seen)
        assert conn.is_open
        conn.close()
    finally:
        if conn.is_open:
            conn.close()
    # nothing was left unacknowledged (it would be requeued by the close)
    assert counts(direct, q) == (0, 0)
    got = direct.get_all(q + ".dlq", expect=1)
    assert len(got) == 1, got
    _, p, body = got[0]
    assert body == b"the body"
    assert p.headers["app"] == "orders"
    assert p.headers["pad"] == props.headers["pad"]
    assert p.headers.get("rebound-dead-letter-reason") == "frame-max", \
        p.headers.keys()
    metrics = admin_get(admin, "/metrics")
    line = 'rebound_dead_lettered_total{queue="%s",reason="frame-max"} 1' % q
    assert line in metrics.splitlines(), \
        [l for l in metrics.splitlines() if "dead_lettered" in l]


def test_broker_frames_over_frame_max_pass(rebound_factory, broker, direct):
    """The broker itself sends a content header over the client's frame-max
    once dead-lettering added x-death (a queue of the client's own with a
    TTL and a dead-letter target, no retry policy involved): clients accept
    it, so rebound passes it on instead of closing the connection."""
    src = direct.own(rbtest.uniq("xdeath-src"))
    dst = direct.own(rbtest.uniq("xdeath-dst"))
    direct.channel().queue_declare(dst, durable=True)
    direct.channel().queue_declare(src, durable=True, arguments={
        "x-message-ttl": 1, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dst})
    props = big_header_props(3950)
    direct.publish(src, b"grown", props)
    rbtest.wait_until(lambda: counts(direct, dst) == (1, 0), 10,
                      "the message dead-lettered into %s" % dst)
    rb = rebound_factory("--retry-queues", "policy-matches-nothing-here")
    conn = rb.pika(broker, frame_max=FRAME_MAX)
    try:
        ch = conn.channel()
        m, p, body = ch.basic_get(dst, auto_ack=True)
        assert m is not None and body == b"grown"
        assert "x-death" in p.headers
        assert header_frame_len(p) > FRAME_MAX, header_frame_len(p)
        assert conn.is_open
    finally:
        if conn.is_open:
            conn.close()


def test_grown_by_x_death_dead_letters_without_it(rebound_factory, broker,
                                                  direct):
    """A message that reaches an intercepted queue with the broker's
    x-death already pushing its content header past the consumer's
    frame-max: no copy with it fits, so rebound dead-letters it without the
    broker's x-death history (body and the client's own headers intact,
    reason frame-max) rather than breaking the connection or looping."""
    src = direct.own(rbtest.uniq("xdeath-src"))
    q = direct.own(rbtest.uniq("xdeath-q"))
    direct.own(q + ".dlq")
    direct.channel().queue_declare(q, durable=True)
    direct.channel().queue_declare(src, durable=True, arguments={
        "x-message-ttl": 1, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": q})
    props = big_header_props(3950)
    direct.publish(src, b"grown", props)
    rbtest.wait_until(lambda: counts(direct, q) == (1, 0), 10,
                      "the message dead-lettered into %s" % q)
    rb = rebound_factory("--retry-tiers", "200ms")
    conn = rb.pika(broker, frame_max=FRAME_MAX)
    seen = []
    try:
        ch = conn.channel()

        def on_message(c, m, p, b):
            seen.append(p)
            c.basic_nack(m.delivery_tag, requeue=True)

        ch.basic_consume(q, on_message)

        def settled():
            conn.process_data_events(time_limit=0.2)
            return seen and counts(direct, q + ".dlq") == (1, 0)

        rbtest.wait_until(settled, 20, lambda: "the copy in the dead-letter "
                          "queue (%d deliveries, %r)" % (
                              len(seen), counts(direct, q + ".dlq")))
        conn.process_data_events(time_limit=0.5)
        assert len(seen) == 1, "delivered %d times" % len(seen)
        assert "x-death" in seen[0].headers
        assert conn.is_open
    finally:
        if conn.is_open:
            conn.close()
    assert counts(direct, q) == (0, 0)
    got = direct.get_all(q + ".dlq", expect=1)
    assert len(got) == 1, got
    _, p, body = got[0]
    assert body == b"grown"
    assert p.headers["pad"] == props.headers["pad"]
    assert p.headers["rebound-dead-letter-reason"] == "frame-max"
    assert p.headers["rebound-source-queue"] == q
    assert "x-death" not in p.headers, p.headers.keys()
