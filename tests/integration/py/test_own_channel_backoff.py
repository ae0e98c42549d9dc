"""rebound's channel, closed by the broker again and again, reopens with a
growing backoff instead of at once or never: a broker whose queue's home
node is down answers every declare of a tier with 404 "home node ... is
down". A real RabbitMQ does this only in a cluster with a node down (the
cluster test has that); here a fake broker gives the same close on every
declare, for 10 s, to a consumer that fails every delivery."""
import struct
import threading
import time

import amqp_raw as a
import fakebroker as fb
from test_hardening_upstream import consume, fake
from test_retry_never_loops import admin_rebound, metric

assert fake  # a fixture

RUN_S = 10.0


def home_node_down(opens):
    """on_declare: a tier's declare closes the channel with 404."""
    def on_declare(conn, ch, args):
        if ".retry." not in args["queue"]:
            return False
        opens.append(time.monotonic())
        text = ("NOT_FOUND - home node 'rabbit@gone' of durable queue '%s' "
                "in vhost '/' is down or inaccessible" % args["queue"])
        conn.method(ch, (20, 40), struct.pack(">H", 404) + a.shortstr(text)
                    + struct.pack(">HH", 50, 10))
        return True
    return on_declare


def redeliver_on_requeue(up, stop, tags):
    """The broker's part: each requeue rebound sends (after its delay)
    becomes the next delivery."""
    tag = 1
    while not stop.is_set():
        try:
            up.wait(lambda: up.find("basic.nack", tag=tag, requeue=True), 0.5,
                    "a requeue")
        except AssertionError:
            continue
        tag += 1
        tags.append((time.monotonic(), tag))
        up.deliver(1, "c", tag, b"poison", routing_key="q")


def test_home_node_down_backs_off(rebound_factory, fake):
    declares = []
    broker = fake(confirm=False, on_declare=home_node_down(declares),
                  on_consume=lambda conn, ch, args: conn.deliver(
                      ch, args["tag"], 1, b"poison", routing_key="q"))
    rb = admin_rebound(lambda *a_, **k: rebound_factory(
        *a_, upstream=broker.addr, **k), "--retry-tiers", "1s",
        "--max-attempts", "5")
    c = a.RawClient(rb.port)
    c.handshake(name="failing-consumer")
    c.open_channel(1)
    consume(c, 1, "q", "c")
    up = broker.wait_conn("failing-consumer")
    stop, tags = threading.Event(), []
    t = threading.Thread(target=redeliver_on_requeue, args=(up, stop, tags),
                         daemon=True)
    t.start()
    deliveries = []
    end = time.monotonic() + RUN_S
    try:
        while time.monotonic() < end:
            try:
                m = c.recv_method((60, 60), timeout=end - time.monotonic())
            except (OSError, AssertionError):
                break
            n = m.payload[4]  # consumer tag length, then the delivery tag
            tag = struct.unpack(">Q", m.payload[5 + n:13 + n])[0]
            c.recv_frame()  # header
            c.recv_frame()  # body
            deliveries.append(time.monotonic())
            c.send(fb.basic_nack(1, tag))
    finally:
        stop.set()
        t.join(5)
    copies = broker.wait_conn("rebound retries for")
    opens = copies.find("channel.open")
    print("deliveries %d, declares %d, channel opens %d in %.0f s" % (
        len(deliveries), len(declares), len(opens), RUN_S))
    # never a hot loop: one delivery per tier delay at most
    assert 3 <= len(deliveries) <= RUN_S / 1.0 + 2, deliveries
    gaps = [b - x for x, b in zip(deliveries, deliveries[1:])]
    assert all(g >= 0.9 for g in gaps), gaps
    # the channel is reopened, again and again, but backing off: at once,
    # then 0.5 s, 1 s, 2 s, 4 s ... (about 6 in 10 s), never given up
    assert 4 <= len(opens) <= 8, [e.t for e in opens]
    times = [e.t for e in opens]
    late = [y - x for x, y in zip(times[2:], times[3:])]
    assert all(g >= 0.9 for g in late), late
    assert times[-1] > time.monotonic() - RUN_S / 2 - 1, \
        "rebound stopped reopening its channel"
    closes = rb.log_lines("own_channel_closed")
    assert closes and all(x["code"] == "404" for x in closes), closes
    backoff = [int(x["reopen_ms"]) for x in closes]
    assert backoff[:4] == [0, 500, 1000, 2000], backoff
    assert metric(rb, "rebound_retry_requeues_delayed_total",
                  reason="rebound's channel not ready") + metric(
        rb, "rebound_retry_requeues_delayed_total",
        reason="rebound's channel was closed before the copy") >= 2
    assert not rb.log_lines("retry_topology_error")  # 404 is temporary
    c.close()
