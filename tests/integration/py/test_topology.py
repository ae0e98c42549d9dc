"""declare/bind/delete through rebound, including the broker's errors: a
channel error (404, 406, 403) reaches the client with the right code on the
right channel, and the connection lives on; a connection error (503)
reaches the client as the broker's connection.close."""
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

import rbtest

EXPIRES = {"x-expires": 120000}


def still_works(conn, queue):
    """A new channel on the same connection can publish and get."""
    ch = conn.channel()
    body = rbtest.uniq("alive").encode()
    ch.basic_publish("", queue, body)
    m, _, got = ch.basic_get(queue, auto_ack=True)
    assert got == body
    ch.close()


def expect_channel_error(ch, code, fn, *args, **kw):
    with pytest.raises(ChannelClosedByBroker) as ei:
        fn(*args, **kw)
    assert ei.value.reply_code == code, ei.value
    assert not ch.is_open
    return ei.value


@pytest.fixture
def exchanges(broker):
    """Names to delete at teardown (directly on the broker) if a failed test
    left them behind."""
    names = []
    yield names
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host=broker.host, port=broker.port, virtual_host=broker.vhost,
        credentials=pika.PlainCredentials(broker.user, broker.password)))
    for x in names:
        ch = conn.channel()
        try:
            ch.exchange_delete(x)
        except Exception:
            pass
    conn.close()


def test_declare_bind_delete(rebound, broker, exchanges):
    conn = rebound.pika(broker)
    ch = conn.channel()
    # confirmed publishes: the broker answers a passive declare's
    # message_count ahead of deliveries still on their way to the queue
    ch.confirm_delivery()
    x = rbtest.uniq("x")
    x2 = rbtest.uniq("x2")
    exchanges += [x, x2]
    q = rbtest.uniq("q")
    ch.exchange_declare(x, "topic", auto_delete=False)
    ch.exchange_declare(x, "topic", passive=True)
    ok = ch.queue_declare(q, arguments=EXPIRES)
    assert ok.method.queue == q and ok.method.message_count == 0
    ch.queue_bind(q, x, routing_key="a.*")
    ch.basic_publish(x, "a.b", b"routed")
    ch.basic_publish(x, "z.b", b"not-routed")
    assert ch.queue_declare(q, passive=True).method.message_count == 1
    m, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"routed" and m.exchange == x and m.routing_key == "a.b"
    ch.queue_unbind(q, x, routing_key="a.*")
    ch.basic_publish(x, "a.b", b"after-unbind")
    assert ch.queue_declare(q, passive=True).method.message_count == 0

    # exchange-to-exchange binding
    ch.exchange_declare(x2, "fanout", auto_delete=False)
    ch.exchange_bind(destination=x2, source=x, routing_key="#")
    ch.queue_bind(q, x2)
    ch.basic_publish(x, "anything", b"via-e2e")
    assert ch.basic_get(q, auto_ack=True)[2] == b"via-e2e"
    ch.exchange_unbind(destination=x2, source=x, routing_key="#")

    ch.basic_publish("", q, b"one")
    ch.basic_publish("", q, b"two")
    assert ch.queue_purge(q).method.message_count == 2
    ch.basic_publish("", q, b"three")
    assert ch.queue_delete(q).method.message_count == 1
    ch.exchange_delete(x2)
    ch.exchange_delete(x)
    expect_channel_error(ch, 404, ch.exchange_declare, x, "topic", passive=True)
    conn.close()
    rebound.wait_conn_sockets(0)


def test_channel_errors_reach_the_client_and_the_connection_lives(rebound, broker,
                                                                ctl):
    conn = rebound.pika(broker)
    q = rbtest.uniq("q")
    setup = conn.channel()
    setup.queue_declare(q, arguments=EXPIRES)

    # 404: passive declare of a queue that does not exist
    ch = conn.channel()
    e = expect_channel_error(ch, 404, ch.queue_declare, rbtest.uniq("missing"),
                             passive=True)
    assert "NOT_FOUND" in e.reply_text
    assert conn.is_open
    still_works(conn, q)

    # 406: redeclare with different arguments
    ch = conn.channel()
    e = expect_channel_error(ch, 406, ch.queue_declare, q,
                             arguments={"x-expires": 120000, "x-message-ttl": 1000})
    assert "PRECONDITION_FAILED" in e.reply_text
    assert conn.is_open
    still_works(conn, q)

    # 404: bind to an exchange that does not exist
    ch = conn.channel()
    expect_channel_error(ch, 404, ch.queue_bind, q, rbtest.uniq("no-x"))
    still_works(conn, q)

    # 406: delete if-empty of a queue with messages
    ch = conn.channel()
    ch.basic_publish("", q, b"keep")
    expect_channel_error(ch, 406, ch.queue_delete, q, if_empty=True)
    assert setup.queue_purge(q).method.message_count == 1
    still_works(conn, q)

    # 403: a name in the reserved amq. space
    ch = conn.channel()
    expect_channel_error(ch, 403, ch.queue_declare, "amq.rebound-" + rbtest.uniq())
    still_works(conn, q)

    # 404 on a consume of a missing queue, on the same channel number again
    # and again (the number is reused by pika after each close)
    for _ in range(3):
        ch = conn.channel()
        expect_channel_error(ch, 404, ch.basic_consume, rbtest.uniq("gone"),
                             lambda *a: None)
    still_works(conn, q)

    # the channel that had the error is gone on the broker too: the
    # connection carries setup only (rebound's own channel, when it has
    # one, is on a connection of its own)
    (port,) = rbtest.upstream_ports(rebound)
    assert ctl.connections()[port]["channels"] == 1
    setup.queue_delete(q)
    conn.close()
    rebound.wait_conn_sockets(0)
    assert not rebound.log_lines("protocol_error")
    assert not rebound.log_lines("upstream_protocol_error")


def test_connection_error_from_the_broker_reaches_the_client(rebound, broker):
    """An unknown exchange type is a connection error (503): the broker's
    connection.close (code and text) reaches pika, and rebound lets go of
    both sockets."""
    conn = rebound.pika(broker)
    ch = conn.channel()
    with pytest.raises(ConnectionClosedByBroker) as ei:
        ch.exchange_declare(rbtest.uniq("x"), exchange_type="no-such-type")
    assert ei.value.reply_code == 503
    assert "COMMAND_INVALID" in ei.value.reply_text
    assert not conn.is_open
    rebound.wait_conn_sockets(0)
    line = rebound.wait_log("broker_close", code=503)
    assert "COMMAND_INVALID" in line["text"]
    # a new connection through the same rebound is fine
    conn = rebound.pika(broker)
    q = conn.channel().queue_declare("", exclusive=True).method.queue
    still_works(conn, q)
    conn.close()
    rebound.wait_conn_sockets(0)
