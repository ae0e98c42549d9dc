"""Copies the broker refuses: a basic.nack of a copy (a quorum tier
without a leader while a cluster node is away refuses publishes for a
while) makes rebound publish the copy again after the tier delay, still
the same counted attempt, for up to --retry-confirm-timeout since the
first refusal. Only a broker that refuses longer gets the client's
requeue (after the delay): an uncounted redelivery. A fake broker
(fakebroker.py) refuses the copies."""
import time

import amqp_raw as a
import fakebroker as fb
from test_hardening_upstream import consume, fake
from test_retry_never_loops import admin_rebound, metric

assert fake  # a fixture


def refuse_copies_for(seconds, copies):
    """confirm: nack publishes to a tier for `seconds` from the first."""
    first = []

    def answer(conn, ch, m):
        if ".retry." not in m.routing_key:
            return True
        now = time.monotonic()
        first[:1] = first[:1] or [now]
        copies.append(now)
        return "nack" if now - first[0] < seconds else True
    return answer


def start(rebound_factory, fake, answer, *args):
    broker = fake(confirm=answer, on_consume=lambda conn, ch, args: conn.deliver(
        ch, args["tag"], 1, b"payload", routing_key="q"))
    rb = admin_rebound(lambda *a_, **k: rebound_factory(
        *a_, upstream=broker.addr, **k), "--retry-tiers", "1s",
        "--max-attempts", "5", "--retry-connection", "shared", *args)
    c = a.RawClient(rb.port)
    c.handshake(name="refused")
    c.open_channel(1)
    consume(c, 1, "q", "c")
    c.recv_method((60, 60))
    c.recv_frame()  # header
    c.recv_frame()  # body
    c.send(fb.basic_nack(1, 1))
    return broker, rb, c, broker.wait_conn("refused")


def test_refused_copy_is_published_again(rebound_factory, fake):
    copies = []
    broker, rb, c, up = start(rebound_factory, fake,
                              refuse_copies_for(2.5, copies))
    # refused at once, then about every second until 2.5 s: then acked
    up.wait_event("basic.ack", timeout=15, tag=1)
    print("copies published %d, at %r" % (
        len(copies), [round(t - copies[0], 2) for t in copies]))
    assert 3 <= len(copies) <= 5, copies
    gaps = [y - x for x, y in zip(copies, copies[1:])]
    assert all(g >= 0.9 for g in gaps), gaps  # never a hot loop
    # no requeue reached the broker: the delivery was never redelivered
    assert not up.find("basic.nack", tag=1), up.find("basic.nack")
    assert metric(rb, "rebound_retry_requeues_delayed_total",
                  reason="nacked by the broker") == 0
    c.close()


def test_copy_refused_too_long_is_requeued(rebound_factory, fake):
    copies = []
    broker, rb, c, up = start(rebound_factory, fake,
                              refuse_copies_for(3600, copies),
                              "--retry-confirm-timeout", "3s")
    ev = up.wait_event("basic.nack", timeout=15, tag=1, requeue=True)
    since = ev.t - copies[0]
    print("copies published %d; requeued %.2f s after the first refusal" % (
        len(copies), since))
    # the copy is tried for 3 s (one per tier delay), then the requeue
    assert 3 <= len(copies) <= 5, copies
    assert 3.0 <= since <= 6.0, since
    assert not up.find("basic.ack", tag=1)
    assert metric(rb, "rebound_retry_requeues_delayed_total",
                  reason="nacked by the broker") == 1
    c.close()
