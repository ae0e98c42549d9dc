#!/usr/bin/python3
"""Golden session "pika" (python3-pika 1.2, Debian's /usr/bin/python3).

    session_pika.py BROKER_URL RELAY_PORT

Cleans leftovers directly on BROKER_URL, then runs the recorded session through the
capture relay on 127.0.0.1:RELAY_PORT. Every value here is documented in MANIFEST.md;
change both together.
"""
import datetime
import decimal
import sys
import time

import pika
from pika.compat import long as amqp_long  # int marked to encode as 'l'
from pika.exceptions import ChannelClosedByBroker, UnroutableError

X_DIRECT, X_TOPIC, X_DLX = "golden.x.direct", "golden.x.topic", "golden.x.dlx"
Q_CLASSIC, Q_QUORUM, Q_DEAD = "golden.q.classic", "golden.q.quorum", "golden.q.dead"
Q_MISSING = "golden.q.missing"
RK = "golden.rk"
CLASSIC_ARGS = {"x-message-ttl": 60000, "x-dead-letter-exchange": X_DLX}

# Header table: one entry per field type pika 1.2 can encode (no float: pika raises
# UnsupportedAMQPFieldException for it). Insertion order = wire order.
HEADERS = {
    "h.bool.true": True,                                  # t
    "h.bool.false": False,                                # t
    "h.int.small": 42,                                    # I
    "h.int.negative": -7,                                 # I
    "h.int.max32": 2147483647,                            # I
    "h.int64": 9007199254740993,                          # l (2^53 + 1)
    "h.int64.negative": -5000000000,                      # l
    "h.long.marked": amqp_long(5),                        # l
    "h.decimal": decimal.Decimal("3.14159"),              # D scale 5, 314159
    "h.str": "h\u00e9llo w\u00f6rld",                     # S (UTF-8)
    "h.str.empty": "",                                    # S
    "h.bytes": b"\x00\x01\xfe\xff",                       # x
    "h.timestamp": datetime.datetime(2024, 1, 2, 3, 4, 5),  # T 1704164645
    "h.array": [1, "two", True, None, [3]],               # A [I S t V A[I]]
    "h.table": {"inner.int": 1, "inner.str": "x", "inner.table": {"deep": True}},  # F
    "h.void": None,                                       # V
}

ALL_PROPS = pika.BasicProperties(
    content_type="text/plain",
    content_encoding="utf-8",
    headers=HEADERS,
    delivery_mode=2,
    priority=7,
    correlation_id="golden-corr-0001",
    reply_to="golden.reply",
    expiration="60000",
    message_id="golden-msg-0001",
    timestamp=1700000000,
    type="golden.type",
    user_id="guest",
    app_id="rebound-golden",
    cluster_id="golden-cluster",
)
BODY_ALL = b"golden body 1: all 14 basic properties"
BODY_LARGE = bytes(i % 251 for i in range(300000))  # > frame-max: 3 body frames
BODY_TX_COMMIT, BODY_TX_ROLLBACK = b"tx commit", b"tx rollback"
BODY_UNROUTABLE = b"unroutable"


def cleanup(url):
    """Delete what a previous (failed) run may have left. Not recorded."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    for q in (Q_CLASSIC, Q_QUORUM, Q_DEAD):
        ch.queue_delete(q)
    for x in (X_TOPIC, X_DIRECT, X_DLX):
        ch.exchange_delete(x)
    conn.close()


def wait_for(conn, got, n, timeout=10.0):
    deadline = time.monotonic() + timeout
    while len(got) < n:
        if time.monotonic() > deadline:
            raise RuntimeError("timed out waiting for %d deliveries, have %d" % (n, len(got)))
        conn.process_data_events(time_limit=0.2)


def session(port):
    params = pika.ConnectionParameters(
        host="127.0.0.1", port=port, virtual_host="/",
        credentials=pika.PlainCredentials("guest", "guest"),
        heartbeat=5, client_properties={"connection_name": "golden-pika"})
    conn = pika.BlockingConnection(params)  # PLAIN, tune-ok heartbeat=5

    # Idle long enough for heartbeat frames in both directions (interval 5 s).
    conn.sleep(6.0)

    ch = conn.channel()  # channel 1
    ch.exchange_declare(X_DIRECT, "direct", durable=True)
    ch.exchange_declare(X_TOPIC, "topic", durable=False, auto_delete=True)
    ch.exchange_declare(X_DLX, "fanout", durable=True)
    ch.exchange_bind(destination=X_TOPIC, source=X_DIRECT, routing_key=RK)
    ch.queue_declare(Q_DEAD, durable=True)
    ch.queue_bind(Q_DEAD, X_DLX, routing_key="")
    ch.queue_declare(Q_CLASSIC, durable=True, arguments=CLASSIC_ARGS)
    ch.queue_declare(Q_QUORUM, durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_bind(Q_CLASSIC, X_DIRECT, routing_key=RK)
    ch.queue_bind(Q_QUORUM, X_TOPIC, routing_key="golden.#")
    ch.basic_qos(prefetch_count=10)
    ch.confirm_delivery()

    # Publishes, each confirmed (delivery tags 1..3 of the confirm sequence).
    # 1: all properties, via direct -> classic and direct -> topic -> quorum.
    ch.basic_publish(X_DIRECT, RK, BODY_ALL, ALL_PROPS)
    # 2: 300000-byte body straight to the classic queue.
    ch.basic_publish("", Q_CLASSIC, BODY_LARGE,
                     pika.BasicProperties(content_type="application/octet-stream",
                                          delivery_mode=2))
    # 3: mandatory + unroutable -> basic.return 312 NO_ROUTE, then basic.ack.
    try:
        ch.basic_publish(X_DIRECT, "golden.rk.nowhere", BODY_UNROUTABLE, mandatory=True)
        raise RuntimeError("expected basic.return")
    except UnroutableError:
        pass

    # Transactions on channel 2.
    tx = conn.channel()
    tx.tx_select()
    tx.basic_publish("", Q_CLASSIC, BODY_TX_COMMIT)
    tx.tx_commit()
    tx.basic_publish("", Q_CLASSIC, BODY_TX_ROLLBACK)
    tx.tx_rollback()
    tx.close()
    # classic now holds: BODY_ALL, BODY_LARGE, BODY_TX_COMMIT

    # basic.get: get-ok + ack, get-ok (large) + reject(requeue).
    m, _, body = ch.basic_get(Q_CLASSIC)
    assert body == BODY_ALL, body[:40]
    ch.basic_ack(m.delivery_tag)
    m, _, body = ch.basic_get(Q_CLASSIC)
    assert body == BODY_LARGE
    ch.basic_reject(m.delivery_tag, requeue=True)

    # Consume with a client-chosen tag.
    got = []
    ch.basic_consume(Q_CLASSIC, lambda c, m, p, b: got.append((m, b)),
                     consumer_tag="golden.ctag.classic")
    wait_for(conn, got, 2)                       # LARGE (redelivered), TX_COMMIT
    ch.basic_nack(got[1][0].delivery_tag, multiple=True, requeue=True)
    wait_for(conn, got, 4)                       # both again
    ch.basic_reject(got[3][0].delivery_tag, requeue=True)
    wait_for(conn, got, 5)
    ch.basic_recover(requeue=True)               # requeues the 2 unacked
    wait_for(conn, got, 7)
    for m, body in got[5:7]:
        if body == BODY_LARGE:
            ch.basic_ack(m.delivery_tag)
        else:                                    # -> golden.x.dlx -> golden.q.dead
            ch.basic_nack(m.delivery_tag, multiple=False, requeue=False)
    ch.basic_cancel("golden.ctag.classic")
    m, _, _ = ch.basic_get(Q_CLASSIC)            # get-empty
    assert m is None

    # Quorum queue: first delivery, nack(requeue) -> redelivery with x-delivery-count.
    qgot = []
    ch.basic_consume(Q_QUORUM, lambda c, m, p, b: qgot.append((m, p, b)),
                     consumer_tag="golden.ctag.quorum")
    wait_for(conn, qgot, 1)
    ch.basic_nack(qgot[0][0].delivery_tag, requeue=True)
    wait_for(conn, qgot, 2)
    ch.basic_ack(qgot[1][0].delivery_tag)
    ch.basic_cancel("golden.ctag.quorum")

    # Errors: 404 on a passive declare (channel 1 closed by the broker) ...
    try:
        ch.queue_declare(Q_MISSING, passive=True)
        raise RuntimeError("expected 404")
    except ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
    # ... and 406 on redeclaring with a different x-message-ttl, on a new channel.
    ch = conn.channel()
    try:
        ch.queue_declare(Q_CLASSIC, durable=True,
                         arguments={"x-message-ttl": 30000, "x-dead-letter-exchange": X_DLX})
        raise RuntimeError("expected 406")
    except ChannelClosedByBroker as e:
        assert e.reply_code == 406, e

    # Continue on yet another channel: purge, unbind, delete everything.
    ch = conn.channel()
    ch.queue_declare("", exclusive=True)         # server-named amq.gen-... queue
    ch.queue_purge(Q_DEAD)                       # purge-ok message-count=1
    ch.queue_unbind(Q_CLASSIC, X_DIRECT, routing_key=RK)
    ch.exchange_unbind(destination=X_TOPIC, source=X_DIRECT, routing_key=RK)
    ch.queue_delete(Q_CLASSIC)
    ch.queue_delete(Q_QUORUM)
    ch.queue_delete(Q_DEAD, if_empty=True)
    ch.exchange_delete(X_DIRECT)
    ch.exchange_delete(X_TOPIC)
    ch.exchange_delete(X_DLX, if_unused=True)
    ch.close()
    conn.close()


if __name__ == "__main__":
    cleanup(sys.argv[1])
    session(int(sys.argv[2]))
