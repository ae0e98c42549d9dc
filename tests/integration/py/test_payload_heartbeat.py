"""Big content (many body frames) and heartbeats through rebound."""
import hashlib
import os
import threading
import time

import pika
import pytest

import amqp_raw
import rbtest
from conftest import PASS_THROUGH

EXPIRES = {"x-expires": 120000}
MIB = 1024 * 1024


@pytest.mark.parametrize("channel_number", [None, 2047],
                         ids=["channel-1", "mapped-channel-2047"])
def test_16mib_message_intact(rebound_factory, broker, qname,
                              channel_number):
    """With rebound's channel on the client's connection (shared), 2047 is
    its number: the client's 2047 travels remapped."""
    rebound = rebound_factory(*PASS_THROUGH, "--retry-connection", "shared")
    body = os.urandom(16 * MIB)
    digest = hashlib.sha256(body).hexdigest()
    conn = rebound.pika(broker)
    frame_max = conn._impl.params.frame_max
    assert len(body) > frame_max * 100
    ch = conn.channel(channel_number)
    ch.queue_declare(qname, arguments=EXPIRES)
    ch.confirm_delivery()
    ch.basic_publish("", qname, body,
                     pika.BasicProperties(headers={"sha256": digest}),
                     mandatory=True)
    # a small one right behind it on the same channel keeps its place
    ch.basic_publish("", qname, b"after")

    m, props, got = ch.basic_get(qname)
    assert m is not None
    assert len(got) == len(body)
    assert hashlib.sha256(got).hexdigest() == digest
    assert props.headers == {"sha256": digest}
    ch.basic_ack(m.delivery_tag)

    # and consumed (basic.deliver) rather than fetched, twice
    ch.basic_publish("", qname, body, mandatory=True)
    seen = []
    for m, p, b in ch.consume(qname, inactivity_timeout=30):
        assert m is not None, "delivery stalled"
        seen.append(b)
        ch.basic_ack(m.delivery_tag)
        if len(seen) == 2:
            break
    ch.cancel()
    assert seen[0] == b"after"
    assert hashlib.sha256(seen[1]).hexdigest() == digest
    if channel_number:
        assert rebound.log_lines("channel_mapped", client_channel=channel_number)
    ch.queue_delete(qname)
    conn.close()
    rebound.wait_conn_sockets(0)
    # every byte of both publishes went through (frame overhead on top)
    close = rebound.wait_log("session_close")
    assert int(close["bytes_from_client"]) > 2 * len(body)
    assert int(close["bytes_to_client"]) > 2 * len(body)


def serviced(conn, fn):
    """fn() (a rabbitmqctl call: seconds on a loaded machine) in a thread,
    while this one keeps pika's I/O going: a blocking connection sends its
    heartbeats only when called, and with a 1 s heartbeat the broker drops
    a client silent for 2 s."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    while t.is_alive():
        conn.sleep(0.1)
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_heartbeat_1s_client_idle_5s_stays_connected(rebound, broker, ctl, qname):
    conn = rebound.pika(broker, heartbeat=1)
    assert conn._impl.params.heartbeat == 1
    assert rebound.wait_log("session_open")["heartbeat"] == "1"
    ch = conn.channel()
    ch.queue_declare(qname, arguments=EXPIRES)
    (port,) = rbtest.upstream_ports(rebound)
    # the broker lists a connection a moment after it is open (its
    # tracking is asynchronous: under load, not yet at the first look)
    before = rbtest.wait_until(
        lambda: serviced(conn, ctl.connections).get(port), 10,
        "the broker to list the connection", interval=0.1)
    hb = conn._impl._heartbeat_checker
    received_before = hb._heartbeat_frames_received

    conn.sleep(5.0)  # idle: only heartbeats move, pika answers them

    after = serviced(conn, ctl.connections)
    assert port in after, "the broker dropped the connection"
    assert conn.is_open
    # broker -> client heartbeats went through rebound to pika...
    assert hb._heartbeat_frames_received - received_before >= 4
    # ...and client -> broker heartbeats (8 bytes each) reached the broker
    assert after[port]["recv_oct"] - before["recv_oct"] >= 4 * 8
    ch.basic_publish("", qname, b"still-here")
    assert ch.basic_get(qname, auto_ack=True)[2] == b"still-here"
    ch.queue_delete(qname)
    conn.close()
    rebound.wait_conn_sockets(0)


def test_silent_client_with_1s_heartbeat_is_dropped_by_the_broker(rebound, broker):
    """The control for the test above: heartbeat=1 really is in force end to
    end. A client that negotiates it and then sends nothing loses its
    connection; rebound tells it cleanly and lets go of both sockets."""
    c = amqp_raw.RawClient(rebound.port)
    try:
        c.handshake(broker.user, broker.password, broker.vhost, heartbeat=1)
        t0 = time.monotonic()
        heartbeats = 0
        close = None
        while time.monotonic() - t0 < 15:
            try:
                f = c.recv_frame(timeout=15)
            except EOFError:
                break
            if f.type == amqp_raw.FRAME_HEARTBEAT:
                heartbeats += 1
            elif f.method == amqp_raw.CONNECTION_CLOSE:
                close = f.close_args()
                c.send(amqp_raw.connection_close_ok())
        assert heartbeats >= 1, "no heartbeat reached the client"
        assert time.monotonic() - t0 < 15, "not dropped within 15 s"
        if close is not None:
            assert close[0] == 320, close
    finally:
        c.close()
    rebound.wait_conn_sockets(0)


def test_client_that_never_reads_cannot_grow_rebounds_memory(rebound, broker, ctl,
                                                             qname):
    """Backpressure: a no-ack consumer that stops reading. rebound stops
    reading the broker instead of buffering what the client will not take."""
    n, size = 64, MIB
    conn = rebound.pika(broker)
    ch = conn.channel()
    ch.queue_declare(qname, arguments=EXPIRES)
    ch.confirm_delivery()
    body = os.urandom(size)
    for _ in range(n):
        ch.basic_publish("", qname, body)
    rss0 = rebound.rss_kib()
    read0 = rebound.io_read_bytes()

    c = amqp_raw.RawClient(rebound.port, rcvbuf=64 * 1024)
    try:
        c.handshake(broker.user, broker.password, broker.vhost)
        c.open_channel(1)
        c.send(amqp_raw.basic_consume(1, qname, "never-reads", no_ack=True))
        # wait until rebound stops reading: its read byte count stays put
        # for a second (or everything went through it)
        last, stable_since = None, time.monotonic()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = rebound.io_read_bytes() - read0
            if got != last:
                last, stable_since = got, time.monotonic()
            elif time.monotonic() - stable_since >= 1.0:
                break
            time.sleep(0.05)
        grown = rebound.rss_kib() - rss0
        assert last < n * size // 2, "rebound read %d MiB for a client that " \
            "reads nothing" % (last // MIB)
        assert grown < 32 * 1024, "rebound's RSS grew by %d MiB" % (grown // 1024)
        print("rebound read %.1f MiB, RSS +%d KiB" % (last / MIB, grown))
    finally:
        c.close()
    rebound.wait_conn_sockets(2)  # only the publisher's connection is left
    ch.queue_delete(qname)
    conn.close()
    rebound.wait_conn_sockets(0)
