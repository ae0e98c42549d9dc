"""The separate retry connection under faults a real broker gives only by
chance: it is blocked and then lost, or it returns several copies at once.
A fake broker (fakebroker.py) plays the broker."""
import socket
import struct
import time

import amqp_raw as a
import fakebroker as fb
from rbtest import wait_until
from test_hardening_upstream import fake

assert fake  # a fixture


def consumer(rb, broker, n):
    """A raw client through rebound that consumes "work" and got `n`
    deliveries; returns (client, the client's upstream connection, the
    retry connection)."""
    c = a.RawClient(rb.port)
    c.handshake(name="work-consumer")
    c.open_channel(1)
    c.send(fb.basic_consume(1, "work"))
    c.recv_method((60, 21))
    main = broker.wait_conn("work-consumer")
    pub = broker.wait_conn("rebound retries for")
    pub.wait_event("confirm.select")
    for t in range(1, n + 1):
        main.deliver(1, "amq.ctag-fake-1", t, b"m%d" % t, routing_key="work")
        c.recv_method((60, 60))
        c.recv_frame()
        c.recv_frame()
    return c, main, pub


def retry_conns(broker):
    return [x for x in broker.conns if b"rebound retries for" in x.client_props]


def test_lost_while_blocked_then_the_copy_goes_on_the_next(rebound_factory,
                                                           fake):
    """The broker blocks the retry connection (a resource alarm), a consumer
    fails a message (its copy waits), then that connection drops. rebound
    opens a new one and the copy goes there: the failure is a counted
    retry, never a plain requeue of the original."""
    broker = fake()
    rb = rebound_factory("--retry-tiers", "1s", upstream=broker.addr)
    c, main, pub = consumer(rb, broker, 1)
    pub.method(0, (10, 60), a.shortstr("low on memory"))  # connection.blocked
    rb.wait_log("upstream_blocked")
    c.send(fb.basic_nack(1, 1, requeue=True))
    time.sleep(0.5)
    assert not pub.published(), "a copy was published on a blocked connection"
    pub.sock.shutdown(socket.SHUT_RDWR)
    main.wait(lambda: main.find("basic.ack", tag=1), 10,
              "the original acked once its copy is confirmed")
    again = retry_conns(broker)
    assert len(again) == 2, again
    assert [m.routing_key for m in again[1].published()] == ["work.retry.1s"]
    assert not main.find("basic.nack", tag=1)
    assert not rb.log_lines("retry_fallback")
    c.close()


def test_two_copies_returned_are_each_republished_once(rebound_factory, fake):
    """Two copies to a tier come back as basic.return (the tier was deleted
    under the connection): each is declared again and republished once,
    and neither falls back to a plain requeue."""
    broker = fake(confirm=False)
    rb = rebound_factory("--retry-tiers", "1s", upstream=broker.addr)
    c, main, pub = consumer(rb, broker, 2)
    c.send(fb.basic_nack(1, 1) + fb.basic_nack(1, 2))
    pub.wait(lambda: len(pub.published()) >= 2, 5, "two copies")

    def give_back(seq):
        m = pub.published()[seq - 1]
        pub.send(a.method(1, (60, 50), struct.pack(">H", 312)
                          + a.shortstr("NO_ROUTE") + a.shortstr("")
                          + a.shortstr(m.routing_key))
                 + fb.content_header(1, m.size)
                 + fb.body_frames(1, m.head, 131072))
        pub.send(a.method(1, (60, 80), struct.pack(">Q", seq) + b"\x00"))

    give_back(1)
    give_back(2)
    pub.wait(lambda: len(pub.published()) >= 4, 5, "both copies again")
    again = rb.log_lines("retry_republished")
    assert sorted(int(x["delivery_tag"]) for x in again) == [1, 2], again
    assert not rb.log_lines("retry_fallback")
    time.sleep(0.3)
    assert len(pub.published()) == 4  # once each, no more
    c.close()


def lose_retry_connection(rebound_factory, fake, next_login):
    """A consumer through rebound (tier 10s) whose retry connection drops;
    the fake broker then hands each new login of one to
    `next_login(conn)`, which answers it (True) or lets it go on (False).
    Returns (client, the client's upstream connection, rebound, the fake
    broker)."""
    armed = []

    def on_login(conn):
        return (bool(armed) and b"rebound retries for" in conn.client_props
                and next_login(conn))

    broker = fake(on_login=on_login)
    rb = rebound_factory("--retry-tiers", "10s", upstream=broker.addr)
    c, main, pub = consumer(rb, broker, 1)
    armed.append(True)
    pub.sock.shutdown(socket.SHUT_RDWR)
    return c, main, rb, broker


def lose_with_refusals(rebound_factory, fake, times):
    """lose_retry_connection(), the next `times` logins refused with 403 (a
    node still starting, a changed password). Returns (client, the
    client's upstream connection, the refused connections, rebound, the
    fake broker)."""
    refused = []

    def refuse(conn):
        if len(refused) >= times:
            return False
        refused.append(conn)
        conn.send(a.connection_close(403, "ACCESS_REFUSED - not now", 10, 11))
        return True

    c, main, rb, broker = lose_retry_connection(rebound_factory, fake, refuse)
    return c, main, refused, rb, broker


def test_a_refused_reconnect_backs_off_and_stays_separate(rebound_factory,
                                                         fake):
    """The retry connection drops and the broker refuses the next two
    logins of one: rebound dials again after a backoff, and the copy of a
    failure made after the first refusal, which waited meanwhile (less
    than its tier's delay, after which it would be requeued plainly), goes
    on a third retry connection, never on the client's."""
    c, main, refused, rb, broker = lose_with_refusals(rebound_factory, fake, 2)
    wait_until(lambda: refused, 10, "a refused login")
    c.send(fb.basic_nack(1, 1, requeue=True))
    main.wait(lambda: main.find("basic.ack", tag=1), 15,
              "the original acked once its copy is confirmed")
    conns = retry_conns(broker)
    assert len(refused) == 2 and len(conns) == 4, conns
    assert [m.routing_key for m in conns[3].published()] == ["work.retry.10s"]
    assert not main.published(), "a copy went on the client's connection"
    lost = rb.log_lines("retry_connection_lost")
    assert [x["action"] for x in lost] == ["reconnect after a backoff"] * 3
    assert [int(x["reconnect_ms"]) for x in lost] == [0, 500, 1000], lost
    c.close()


def test_refused_reconnects_end_on_the_clients_connection(rebound_factory,
                                                          fake):
    """Every new login of a retry connection is refused (a changed
    password): after four in a row rebound's channel goes on the client's
    connection, and a failure waiting meanwhile gets its counted retry
    there."""
    c, main, refused, rb, broker = lose_with_refusals(rebound_factory, fake, 1000)
    c.send(fb.basic_nack(1, 1, requeue=True))
    main.wait(lambda: main.find("basic.ack", tag=1), 20,
              "the original acked once its copy is confirmed")
    assert [m.routing_key for m in main.published()] == ["work.retry.10s"]
    assert len(refused) == 4, refused
    lost = rb.log_lines("retry_connection_lost")
    assert [x["action"] for x in lost] == (
        ["reconnect after a backoff"] * 4
        + ["copies go on the client's connection"]), lost
    time.sleep(1)
    assert len(retry_conns(broker)) == 5  # no dialling after giving up
    c.close()


def test_client_gone_while_the_retry_connection_logs_in_says_what_waits(
        rebound_factory, fake):
    """The retry connection drops and its next login goes unanswered; a
    consumer fails a message (the requeue waits for rebound's channel) and
    leaves. rebound logs that the client left with retries pending, and
    the count says what waits: the client's channel holding its requeue,
    not only the copies already published (none yet)."""
    stalled = []

    def stall(conn):  # no connection.tune: the login hangs
        stalled.append(conn)
        return True

    c, main, rb, broker = lose_retry_connection(rebound_factory, fake, stall)
    wait_until(lambda: stalled, 10, "the retry connection's next login")
    c.send(fb.basic_nack(1, 1, requeue=True))
    c.close()
    gone = rb.wait_log("client_gone_retries_pending", timeout=10)
    assert int(gone["pending"]) >= 1, gone
    assert not main.find("basic.ack", tag=1)
    assert not any(x.published() for x in retry_conns(broker))
