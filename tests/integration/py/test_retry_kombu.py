"""kombu (py-amqp transport) consumers get the retry
behaviour too, unmodified: message.requeue() and message.reject(
requeue=True) become counted, delayed retries, exactly max_attempts
deliveries, then the dead-letter queue. Plus the everyday kombu pattern of
requeueing and then releasing the connection.

Tier accuracy tolerance: [delay - 50 ms, delay + 600 ms] (retryhelp).
"""
import socket
import time

import kombu
import pika

import rbtest
from retryhelp import check_gaps, direct, dlq, tier, wait_counts

assert direct  # a fixture

TIERS = ["300ms", "600ms"]


def pika_props_json():
    return pika.BasicProperties(content_type="application/json",
                                delivery_mode=2)


def drain(conn, until, timeout, what):
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %ds waiting for %s" % (
                timeout, what() if callable(what) else what))
        try:
            conn.drain_events(timeout=0.05)
        except (TimeoutError, socket.timeout):
            pass


def test_kombu_consumer_requeue_and_reject(rebound_factory, broker, ctl,
                                           direct):
    """Two messages, max_attempts 4, tiers 300ms,600ms: one always
    message.requeue()d, one always message.reject(requeue=True)ed. Each is
    delivered exactly 4 times (gaps 0.3, 0.6, 0.6 s), with kombu's JSON
    body and headers intact, then sits in Q.dlq with count 4."""
    rb = rebound_factory("--retry-tiers", ",".join(TIERS), "--max-attempts", "4")
    qname = direct.own(rbtest.uniq("kombu-retry"))
    conn = kombu.Connection(rb.url(broker), connect_timeout=10,
                            transport_options={"confirm_publish": True})
    conn.connect()
    try:
        queue = kombu.Queue(qname, exchange=kombu.Exchange("", type="direct"),
                            routing_key=qname, durable=True)
        producer = conn.Producer()
        for how in ("requeue", "reject"):
            producer.publish({"how": how, "text": "caf\u00e9"},
                             routing_key=qname, serializer="json",
                             declare=[queue], headers={"app": how},
                             retry=False)
        seen = {"requeue": [], "reject": []}
        failed = {"requeue": [], "reject": []}

        def on_message(body, message):
            how = body["how"]
            assert message.headers["app"] == how
            assert message.content_type == "application/json"
            seen[how].append((time.monotonic(),
                              message.headers.get("rebound-retry-count")))
            if how == "requeue":
                message.requeue()
            else:
                message.reject(requeue=True)
            failed[how].append(time.monotonic())

        with conn.Consumer(queue, callbacks=[on_message], prefetch_count=5):
            drain(conn, lambda: all(len(v) >= 4 for v in seen.values()), 15,
                  lambda: "4 deliveries each: %r" % {
                      k: len(v) for k, v in seen.items()})
            wait_counts(ctl, {dlq(qname): (2, 0), qname: (0, 0)}, timeout=10)
            end = time.monotonic() + 1.0  # and no fifth delivery
            while time.monotonic() < end:
                try:
                    conn.drain_events(timeout=0.05)
                except (TimeoutError, socket.timeout):
                    pass
        for how in seen:
            assert [c for _, c in seen[how]] == [None, 1, 2, 3], (how, seen[how])
            gaps = [seen[how][k + 1][0] - failed[how][k] for k in range(3)]
            print("kombu %s gaps %s" % (how, [round(g, 3) for g in gaps]))
            check_gaps(gaps, [0.3, 0.6, 0.6])

        got = direct.get_all(dlq(qname), expect=2)
        assert sorted(p.headers["app"] for _, p, _ in got) == ["reject", "requeue"]
        for _, p, b in got:
            assert b == ('{"how": "%s", "text": "caf\\u00e9"}'
                         % p.headers["app"]).encode()
            assert p.content_type == "application/json"
            assert p.headers["rebound-retry-count"] == 4
            assert p.headers["rebound-dead-letter-reason"] == "max-attempts"
            assert p.headers["rebound-source-queue"] == qname
        wait_counts(ctl, {qname: (0, 0), tier(qname, "300ms"): (0, 0),
                          tier(qname, "600ms"): (0, 0)})
    finally:
        conn.release()


def test_kombu_simple_queue_basic_get_requeue(rebound_factory, broker, ctl,
                                              direct):
    """kombu's SimpleQueue (basic.get) path: message.requeue() on a fetched
    message is retried through the tier too, and after max_attempts (2)
    the message is in the DLQ."""
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "2")
    qname = direct.own(rbtest.uniq("kombu-get"))
    conn = kombu.Connection(rb.url(broker), connect_timeout=10)
    conn.connect()
    try:
        sq = conn.SimpleQueue(qname, queue_opts={"durable": True})
        sq.put({"n": 1}, serializer="json")
        counts = []
        for _ in range(2):
            msg = sq.get(block=True, timeout=10)
            counts.append(msg.headers.get("rebound-retry-count"))
            msg.requeue()
        assert counts == [None, 1]
        wait_counts(ctl, {dlq(qname): (1, 0), qname: (0, 0)}, timeout=10)
        with_timeout = False
        try:
            sq.get(block=True, timeout=0.8)
        except sq.Empty:
            with_timeout = True
        assert with_timeout, "a third delivery with max_attempts 2"
        sq.close()
    finally:
        conn.release()


def test_kombu_requeue_then_release_connection_keeps_one_copy(
        rebound_factory, broker, ctl, direct):
    """A kombu worker requeues a message and then releases its connection
    (shutdown). py-amqp closes the connection with a bare connection.close
    -- it sends no channel.close for the consumer's channel, as the Java
    client, Go's amqp091 and Node's amqplib do too -- while rebound's retry
    (publish to the tier, confirm, ack) is still pending. Expected
    (README, "What is guaranteed": duplicates only on a crash
    between confirm and ack): exactly one copy of the message afterwards,
    back in the queue with count 1 -- not the copy *and* the original
    requeued by the broker."""
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "4")
    qname = direct.own(rbtest.uniq("kombu-release"))
    direct.ch.queue_declare(qname, durable=True)
    direct.publish(qname, b'{"job": 1}', pika_props_json())
    conn = kombu.Connection(rb.url(broker), connect_timeout=10)
    conn.connect()
    # a consumer on a channel of its own (not kombu's default channel, which
    # release() would close first)
    channel = conn.channel()
    seen = []

    def on_message(body, message):
        seen.append(body)
        message.requeue()

    consumer = kombu.Consumer(channel, [kombu.Queue(qname, durable=True)],
                              callbacks=[on_message], prefetch_count=1)
    consumer.consume()
    drain(conn, lambda: seen, 10, "the delivery")
    assert seen == [{"job": 1}]
    conn.release()  # py-amqp: connection.close, no channel.close before

    # after the tier's 300 ms, everything is back in the source queue
    wait_counts(ctl, {tier(qname, "300ms"): (0, 0)}, timeout=10)
    got = direct.get_all(qname, expect=2, timeout=2.0)
    summary = [(b, (p.headers or {}).get("rebound-retry-count"),
                m.redelivered) for m, p, b in got]
    assert summary == [(b'{"job": 1}', 1, False)], (
        "expected exactly one copy (count 1); got %r; rebound log:\n%s"
        % (summary, "\n".join(l for l in rb.log().splitlines()
                              if "retry" in l or "session" in l)))
