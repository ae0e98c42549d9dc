"""The broker goes away and comes back, behind the same rebound. Uses a
private extra RabbitMQ node (scripts/broker.sh on its own directory), never
the shared test broker."""
import os
import signal
import subprocess
import time

import pika
import pytest
from pika.exceptions import AMQPConnectionError, ConnectionClosedByBroker

import amqp_raw as a

import rbtest

BROKER_SH, broker_sh = rbtest.BROKER_SH, rbtest.broker_sh


@pytest.fixture(scope="module")
def private_broker():
    yield from rbtest.private_broker("rb-restart-")


def pump_until_closed(conn, timeout):
    """Process pika's I/O until the connection closes; returns the
    exception that ended it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn.process_data_events(time_limit=0.2)
        except AMQPConnectionError as e:
            return e
    raise AssertionError("pika connection still open after %ss" % timeout)


def test_broker_restart_clean_close_and_reconnect(rebound_factory, private_broker):
    pb = private_broker
    rb = rebound_factory(upstream=pb.addr)
    conn = rb.pika(pb)
    ch = conn.channel()
    q = rbtest.uniq("restart")
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"survives", pika.BasicProperties(delivery_mode=2))

    # 1. graceful stop: the broker's own connection.close reaches pika
    stopper = subprocess.Popen([BROKER_SH, "stop", pb.dir],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        err = pump_until_closed(conn, timeout=60)
    finally:
        stopper.wait(120)
    assert isinstance(err, ConnectionClosedByBroker), repr(err)
    assert err.reply_code == 320, err
    assert "CONNECTION_FORCED" in err.reply_text
    rb.wait_conn_sockets(0, timeout=10)
    assert rb.wait_log("broker_close", code=320)

    # 2. broker down: a client is refused promptly (no hang), in AMQP:
    # rebound's own handshake, then connection.close 320 with the reason.
    # The log names the address that failed: the session's
    # upstream_unreachable, with the addresses tried. The readiness probe's
    # failure, whenever the probe runs, is an event of its own.
    t0 = time.monotonic()
    c = a.RawClient(rb.port)
    try:
        c.handshake()
        code, text = c.expect_connection_close()[:2]
    finally:
        c.close()
    assert (code, text) == (320, "CONNECTION_FORCED - no upstream reachable")
    assert time.monotonic() - t0 < 10
    rb.wait_log("upstream_unreachable")
    lines = rb.log_lines("upstream_unreachable")
    assert len(lines) == 1, lines
    assert pb.addr in lines[0]["tried"] and "id" in lines[0], lines[0]
    probe = rb.wait_log("readiness_probe_failed")
    assert pb.addr in probe["error"] and "refused" in probe["error"], probe
    assert all("tried" in l for l in rb.log_lines("upstream_unreachable"))
    rb.wait_conn_sockets(0, timeout=10)
    assert rb.alive()

    # 3. back up: the same rebound carries new connections, same broker data
    broker_sh("start", pb.dir)
    conn = rb.pika(pb)
    ch = conn.channel()
    m, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"survives"
    ch.basic_publish("", q, b"after-restart")
    assert ch.basic_get(q, auto_ack=True)[2] == b"after-restart"

    # 4. broker dies without a word (SIGKILL): rebound tells the client
    # with a connection.close of its own (320) instead of leaving it hanging
    with open(os.path.join(pb.dir, "rabbitmq.pid")) as f:
        beam = int(f.read().strip())
    os.kill(beam, signal.SIGKILL)
    err = pump_until_closed(conn, timeout=30)
    assert isinstance(err, ConnectionClosedByBroker), repr(err)
    assert err.reply_code == 320, err
    assert rb.wait_log("upstream_lost")
    rb.wait_conn_sockets(0, timeout=10)

    # 5. and once more back up
    broker_sh("start", pb.dir)
    conn = rb.pika(pb)
    ch = conn.channel()
    ch.queue_delete(q)
    conn.close()
    rb.wait_conn_sockets(0)
