"""pika through rebound: the everyday paths must behave exactly as they do
against the broker directly."""
import socket
import time

import pika
import pytest
from pika.exceptions import (AuthenticationError, ProbableAuthenticationError,
                             UnroutableError)

import amqp_raw
import rbtest

# Leftovers of a failed run go away on their own.
EXPIRES = {"x-expires": 120000}


def message_count(conn, queue):
    ch = conn.channel()
    try:
        return ch.queue_declare(queue, passive=True).method.message_count
    finally:
        ch.close()


def settled(ctl, queue, ready, timeout=10):
    """Wait until the broker has no unacknowledged message left on `queue`
    (acks, requeues and channel closes are asynchronous in the broker),
    then check the ready count."""
    state = rbtest.wait_until(
        lambda: (lambda s: s if s and s[1] == 0 else None)(ctl.queue(queue)),
        timeout, lambda: "no unacked messages on %s: %r" % (queue, ctl.queue(queue)))
    assert state[0] == ready, "ready=%d, expected %d" % (state[0], ready)


def headers_for(i):
    return {
        "i": i,
        "text": "h\u00e9llo-%d" % i,
        "neg": -i,
        "big": 2 ** 40 + i,
        "flag": bool(i % 2),
        "nested": {"a": [1, "two", True], "k": "v-%d" % i},
        "raw": b"\xce\x00\xce",
    }


def body_for(i):
    # frame-end octets and zeros inside bodies must not confuse a proxy
    return b"msg-%04d-" % i + b"\xce" * (i % 7) + bytes(range(i % 256))


def test_handshake_is_not_rewritten(rebound, broker):
    """connection.start and connection.tune reach the client byte for byte
    as the broker sends them (the client sees exactly what the broker
    offers)."""
    def capture(port):
        c = amqp_raw.RawClient(port)
        try:
            c.send(amqp_raw.PROTOCOL_HEADER)
            start = c.recv_method(amqp_raw.CONNECTION_START)
            c.send(amqp_raw.start_ok(broker.user, broker.password))
            tune = c.recv_method(amqp_raw.CONNECTION_TUNE)
            return start.payload, tune.payload
        finally:
            c.close()

    direct = capture(broker.port)
    via = capture(rebound.port)
    assert via[0] == direct[0], "connection.start differs through rebound"
    assert via[1] == direct[1], "connection.tune differs through rebound"

    # and pika negotiates the same values through rebound as directly
    d = pika.BlockingConnection(pika.ConnectionParameters(
        host=broker.host, port=broker.port, virtual_host=broker.vhost,
        credentials=pika.PlainCredentials(broker.user, broker.password)))
    r = rebound.pika(broker)
    try:
        dp, rp = d._impl.params, r._impl.params
        assert (rp.channel_max, rp.frame_max, rp.heartbeat) == \
            (dp.channel_max, dp.frame_max, dp.heartbeat)
        line = rebound.wait_log("session_open", user=broker.user)
        assert int(line["channel_max"]) == rp.channel_max
        assert int(line["frame_max"]) == rp.frame_max
        assert int(line["heartbeat"]) == rp.heartbeat
        assert line["vhost"] == broker.vhost
    finally:
        d.close()
        r.close()


def test_confirmed_publish_and_consume_1000(rebound, broker, qname):
    conn = rebound.pika(broker)
    ch = conn.channel()
    ch.queue_declare(qname, arguments=EXPIRES)
    ch.confirm_delivery()
    n = 1000
    for i in range(n):
        props = pika.BasicProperties(
            content_type="application/x-test", content_encoding="binary",
            headers=headers_for(i), delivery_mode=2 if i % 2 else 1,
            priority=i % 10, correlation_id="corr-%d" % i, reply_to="rt",
            expiration="600000", message_id="mid-%d" % i, timestamp=1700000000 + i,
            type="t", app_id="rebound-tests")
        # confirm mode: returns only once the broker acked it, raises on nack
        ch.basic_publish("", qname, body_for(i), props, mandatory=True)
    assert message_count(conn, qname) == n

    ch.basic_qos(prefetch_count=100)
    got = []
    for method, props, body in ch.consume(qname, inactivity_timeout=10):
        assert method is not None, "delivery stalled after %d messages" % len(got)
        got.append((props, body))
        if len(got) % 50 == 0:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if len(got) == n:
            break
    ch.cancel()
    for i, (props, body) in enumerate(got):
        assert body == body_for(i), "body %d differs" % i
        assert props.headers == headers_for(i), "headers of %d differ" % i
        assert props.message_id == "mid-%d" % i
        assert props.correlation_id == "corr-%d" % i
        assert props.delivery_mode == (2 if i % 2 else 1)
        assert props.priority == i % 10
        assert props.timestamp == 1700000000 + i
        assert props.content_type == "application/x-test"
        assert props.app_id == "rebound-tests"
    assert message_count(conn, qname) == 0

    # mandatory + unroutable: basic.return (with its content) reaches pika
    with pytest.raises(UnroutableError) as ei:
        ch.basic_publish("", rbtest.uniq("nowhere"), b"returned-body",
                         pika.BasicProperties(headers={"r": 1}), mandatory=True)
    (ret,) = ei.value.messages
    assert ret.method.reply_code == 312
    assert ret.body == b"returned-body"
    assert ret.properties.headers == {"r": 1}
    ch.queue_delete(qname)
    conn.close()


def test_tx_commit_and_rollback(rebound, broker, ctl, qname):
    conn = rebound.pika(broker)
    ch = conn.channel()
    ch.queue_declare(qname, arguments=EXPIRES)
    ch.tx_select()
    for i in range(3):
        ch.basic_publish("", qname, b"rolled-back-%d" % i)
    ch.tx_rollback()
    assert message_count(conn, qname) == 0

    ch.basic_publish("", qname, b"c-0")
    ch.basic_publish("", qname, b"c-1")
    assert message_count(conn, qname) == 0, "visible before commit"
    ch.tx_commit()
    settled(ctl, qname, 2)

    # an ack inside a rolled-back transaction is discarded...
    m, _, body = ch.basic_get(qname)
    assert body == b"c-0"
    ch.basic_ack(m.delivery_tag)
    ch.tx_rollback()
    # ...so closing the channel requeues c-0 and both are there again
    ch.close()
    settled(ctl, qname, 2)

    ch = conn.channel()
    ch.tx_select()
    m, _, body = ch.basic_get(qname)
    assert body == b"c-0"
    ch.basic_ack(m.delivery_tag)
    ch.tx_commit()
    ch.close()
    settled(ctl, qname, 1)
    conn.channel().queue_delete(qname)
    conn.close()


def test_basic_get(rebound, broker, qname):
    conn = rebound.pika(broker)
    ch = conn.channel()
    ch.queue_declare(qname, arguments=EXPIRES)
    assert ch.basic_get(qname) == (None, None, None)
    for i in range(3):
        ch.basic_publish("", qname, b"get-%d" % i,
                         pika.BasicProperties(headers={"n": i}, message_id=str(i)))
    m, props, body = ch.basic_get(qname)
    assert (body, m.message_count, m.redelivered) == (b"get-0", 2, False)
    assert props.headers == {"n": 0} and props.message_id == "0"
    ch.basic_reject(m.delivery_tag, requeue=True)
    m, props, body = ch.basic_get(qname)
    assert (body, m.redelivered) == (b"get-0", True)
    ch.basic_ack(m.delivery_tag)
    m, _, body = ch.basic_get(qname, auto_ack=True)
    assert (body, m.message_count) == (b"get-1", 1)
    m, _, body = ch.basic_get(qname, auto_ack=True)
    assert (body, m.message_count) == (b"get-2", 0)
    assert ch.basic_get(qname) == (None, None, None)
    ch.queue_delete(qname)
    conn.close()


def test_qos_prefetch_is_respected(rebound, broker, ctl, qname):
    conn = rebound.pika(broker)
    ch = conn.channel()
    ch.queue_declare(qname, arguments=EXPIRES)
    ch.confirm_delivery()
    for i in range(20):
        ch.basic_publish("", qname, b"p-%02d" % i)
    ch.basic_qos(prefetch_count=5)
    got = []
    ch.basic_consume(qname, lambda c, m, p, b: got.append((m, b)))

    def pump_until(n, timeout=10):
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert len(got) >= n, "only %d deliveries arrived" % len(got)

    def pump_for(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.process_data_events(time_limit=0.05)

    pump_until(5)
    pump_for(1.0)  # observation window: a 6th delivery would have come by now
    assert len(got) == 5
    assert ctl.queue(qname) == (15, 5, 1), "broker: (ready, unacked, consumers)"

    ch.basic_ack(got[0][0].delivery_tag)
    pump_until(6)
    pump_for(0.5)
    assert len(got) == 6

    while len(got) < 20:
        ch.basic_ack(got[-1][0].delivery_tag, multiple=True)
        pump_until(min(20, len(got) + 1))
    ch.basic_ack(got[-1][0].delivery_tag, multiple=True)
    assert [b for _, b in got] == [b"p-%02d" % i for i in range(20)]
    ch.basic_cancel(got[0][0].consumer_tag)
    assert message_count(conn, qname) == 0
    ch.queue_delete(qname)
    conn.close()


def test_nack_and_reject_requeue_pass_through(rebound, broker, ctl, qname):
    """A queue outside the retry policy behaves exactly as direct:
    requeue=true gives the message back at once (redelivered),
    requeue=false drops it; nothing else is declared."""
    conn = rebound.pika(broker)
    ch = conn.channel()
    ch.queue_declare(qname, arguments=EXPIRES)
    ch.basic_publish("", qname, b"poison")
    ch.basic_qos(prefetch_count=1)
    deliveries = []
    gen = ch.consume(qname, inactivity_timeout=10)

    def next_delivery():
        m, p, b = next(gen)
        assert m is not None, "no (re)delivery within 10 s"
        deliveries.append((m.redelivered, b))
        return m

    m = next_delivery()
    ch.basic_nack(m.delivery_tag, requeue=True)
    m = next_delivery()
    ch.basic_reject(m.delivery_tag, requeue=True)
    m = next_delivery()
    ch.basic_nack(m.delivery_tag, requeue=False)
    assert deliveries == [(False, b"poison"), (True, b"poison"), (True, b"poison")]
    ch.cancel()

    # multiple=1 with requeue: every message up to the tag comes back
    for i in range(3):
        ch.basic_publish("", qname, b"multi-%d" % i)
    ch.basic_qos(prefetch_count=3)
    gen = ch.consume(qname, inactivity_timeout=10)
    first = [next(gen) for _ in range(3)]
    assert [b for _, _, b in first] == [b"multi-0", b"multi-1", b"multi-2"]
    ch.basic_nack(first[-1][0].delivery_tag, multiple=True, requeue=True)
    again = [next(gen) for _ in range(3)]
    assert sorted(b for _, _, b in again) == [b"multi-0", b"multi-1", b"multi-2"]
    assert all(m.redelivered for m, _, _ in again)
    ch.basic_ack(again[-1][0].delivery_tag, multiple=True)
    ch.cancel()

    settled(ctl, qname, 0)
    leftovers = {q for q in ctl.queue_names() if q.startswith(qname + ".")}
    assert not leftovers, "rebound declared queues in this issue: %r" % leftovers
    ch.queue_delete(qname)
    conn.close()


def test_bad_credentials_are_refused_by_the_broker(rebound, broker):
    params = rebound.pika_params(broker)
    params.credentials = pika.PlainCredentials(broker.user, "wrong-password")
    with pytest.raises((ProbableAuthenticationError, AuthenticationError)):
        pika.BlockingConnection(params)
    rebound.wait_conn_sockets(0)
    # and a good login right after works
    conn = rebound.pika(broker)
    assert conn.is_open
    conn.close()
    rebound.wait_conn_sockets(0)


def test_ipv6_listener(rebound_factory, broker):
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    rb = rebound_factory(listen_host="::1")
    assert rb.log_lines("listening", address="[::1]:%d" % rb.port)
    conn = rb.pika(broker)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"over-ipv6")
    assert ch.basic_get(q, auto_ack=True)[2] == b"over-ipv6"
    line = rb.wait_log("session_open")
    assert line["peer"].startswith("[::1]:")
    assert len(rb.client_sockets()) == 1
    conn.close()
    rb.wait_conn_sockets(0)
