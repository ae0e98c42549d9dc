"""Stuck deliveries (README, "Stuck deliveries"): a delivery nobody
settles is visible (per-queue gauges, the oldest in /v1/status and
/v1/queues), and with a policy's processing_timeout it becomes a failed
attempt: its copy goes through the tier to another consumer with count 1,
rebound acks the original, and the first consumer's late ack (or nack) is
swallowed, counted, without closing its channel."""
import json
import signal
import time

import rbtest
from retryhelp import count_of, direct, dlq, pump, wait_counts
from test_admin import admin_rebound, get, metrics

assert direct  # a fixture


def timeout_rebound(factory, q, *extra):
    return admin_rebound(factory, "--retry-queues", q, "--retry-tiers",
                         "200ms", "--max-attempts", "4", *extra)


class Holder:
    """A consumer that keeps what it gets, unsettled."""

    def __init__(self, rb, broker, q, prefetch=1):
        self.conn = rb.pika(broker)
        self.ch = self.conn.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        self.ch.queue_declare(q, durable=True)
        self.got = []
        self.tag = self.ch.basic_consume(
            q, lambda c, m, p, b: self.got.append((m, p, b)))

    def wait(self, n, timeout=10):
        pump(self.conn, lambda: len(self.got) >= n, timeout,
             lambda: "%d deliveries (got %d)" % (n, len(self.got)))


def test_timed_out_delivery_goes_elsewhere_late_ack_swallowed(
        rebound_factory, broker, ctl, direct):
    q = direct.own(rbtest.uniq("stuck"))
    direct.own(dlq(q))
    rb = timeout_rebound(rebound_factory, q, "--processing-timeout", "1s")
    a = Holder(rb, broker, q)
    a.ch.queue_declare(q, durable=True)
    a.ch.basic_publish("", q, b"slow")
    a.wait(1)
    t0 = time.monotonic()
    # it works on the message and takes no more: once rebound acks the
    # original, the broker could otherwise hand it the copy again
    a.ch.basic_cancel(a.tag)
    b = Holder(rb, broker, q)
    b.wait(1, timeout=10)
    took = time.monotonic() - t0
    m, props, body = b.got[0]
    assert body == b"slow" and count_of(props) == 1, props.headers
    assert 1.0 <= took < 1.0 + 2.5, took  # the timeout, the tier, a tick
    b.ch.basic_ack(m.delivery_tag)
    line = rb.wait_log("processing_timeout")
    assert line["queue"] == q and line["target"] == q + ".retry.200ms"
    # the first consumer finishes late (3 s in all): its ack is swallowed
    a.conn.sleep(max(0, 3 - (time.monotonic() - t0)))
    a.ch.basic_ack(a.got[0][0].delivery_tag)
    a.ch.queue_declare(q, passive=True)  # the channel is still open
    rb.wait_log("late_settle_swallowed")
    m_ = metrics(rb.admin_port)
    assert m_["rebound_processing_timeouts_total"] == 1
    assert m_["rebound_late_settles_swallowed_total"] == 1
    wait_counts(ctl, {q: (0, 0)})
    assert not direct.exists(dlq(q))
    status, _, body = get(rb.admin_port, "/v1/queues")
    entry = [e for e in json.loads(body)["queues"] if e["name"] == q][0]
    assert entry["timed_out"] == 1 and entry["retried"] == 1, entry
    assert entry["policy"]["processing_timeout"] == "1s"
    a.conn.close()
    b.conn.close()


def test_processing_timeout_during_the_drain_client_wait(
        rebound_factory, broker, ctl, direct):
    """After SIGTERM, while --drain-client-wait lets the clients work on, a
    delivery held past its processing_timeout still times out: its copy
    goes through the tier back to the queue with count 1, and rebound acks
    the original."""
    q = direct.own(rbtest.uniq("stuckw"))
    direct.own(dlq(q))
    rb = timeout_rebound(rebound_factory, q, "--processing-timeout", "1s",
                         "--drain-client-wait", "60s")
    a = Holder(rb, broker, q)
    a.ch.basic_publish("", q, b"slow")
    a.wait(1)
    a.ch.basic_cancel(a.tag)  # so the copy stays in the queue
    rb.signal(signal.SIGTERM)
    rb.wait_log("shutdown", client_wait_ms=60000)
    line = rb.wait_log("processing_timeout")
    assert line["queue"] == q and line["target"] == q + ".retry.200ms"
    wait_counts(ctl, {q: (1, 0)})  # the original acked, the copy back
    (m, props, body), = direct.get_all(q)
    assert body == b"slow" and count_of(props) == 1, props.headers
    assert not rb.log_lines("drain_client_wait_over")
    a.conn.close()
    assert rb.wait_exit(timeout=20) == 0


def test_multiple_ack_over_timed_out_deliveries(rebound_factory, broker, ctl,
                                                direct):
    """An ack multiple whose tag rebound acked is sent for the newest
    delivery below it; one that covers only timed-out deliveries is
    swallowed. The channel stays open and nothing comes back twice."""
    q = direct.own(rbtest.uniq("stuckm"))
    direct.own(dlq(q))
    rb = timeout_rebound(rebound_factory, q, "--processing-timeout", "1s")
    a = Holder(rb, broker, q, prefetch=10)
    a.ch.queue_declare(q, durable=True)
    a.ch.basic_publish("", q, b"m1")
    a.wait(1)
    rb.wait_log("processing_timeout")  # m1's copy is in the tier
    a.ch.basic_publish("", q, b"m2")
    # m2, then m1's copy (after its 200 ms tier), to the same consumer
    a.wait(3)
    by_body = {}
    for m, p, body in a.got:
        by_body.setdefault(body, []).append(m.delivery_tag)
    assert sorted(by_body) == [b"m1", b"m2"] and len(by_body[b"m1"]) == 2
    first_m1 = by_body[b"m1"][0]
    # ack multiple up to the first m1 only: it covers only a timed-out tag
    a.ch.basic_ack(first_m1, multiple=True)
    rbtest.wait_until(lambda: metrics(rb.admin_port)[
        "rebound_late_settles_swallowed_total"] == 1, 5, "the swallow")
    # the copy of m1 may time out too by now; ack all with the newest tag
    newest = max(m.delivery_tag for m, _, _ in a.got)
    a.ch.basic_ack(newest, multiple=True)
    a.ch.queue_declare(q, passive=True)
    wait_counts(ctl, {q: (0, 0)})
    assert not a.conn.is_closed
    a.conn.close()


def test_without_the_option_only_the_gauges_change(rebound_factory, broker,
                                                   ctl, direct):
    """No processing_timeout: a delivery held 2 s is left alone (no copy),
    and is visible: per-queue gauges, /v1/queues, and the oldest unsettled
    deliveries in /v1/status with their consumer tag and peer."""
    q = direct.own(rbtest.uniq("held"))
    rb = timeout_rebound(rebound_factory, q, "--stuck-after", "1s")
    a = Holder(rb, broker, q)
    a.ch.queue_declare(q, durable=True)
    a.ch.basic_publish("", q, b"held")
    a.wait(1)
    a.conn.sleep(2)
    m = metrics(rb.admin_port)
    label = '{queue="%s"}' % q
    assert m["rebound_unsettled_deliveries" + label] == 1
    assert m["rebound_unsettled_stuck" + label] == 1
    assert 1.9 <= m["rebound_unsettled_oldest_seconds" + label] < 30
    _, _, body = get(rb.admin_port, "/v1/status")
    eff = json.loads(body)["in_effect"]
    assert eff["stuck_after_seconds"] == 1
    old = [o for o in eff["oldest_unsettled"] if o["queue"] == q]
    assert len(old) == 1, eff["oldest_unsettled"]
    assert old[0]["consumer_tag"] == a.tag and old[0]["age_seconds"] >= 1.9
    assert old[0]["peer"].startswith("127.0.0.1:")
    assert old[0]["delivery_tag"] == a.got[0][0].delivery_tag
    _, _, body = get(rb.admin_port, "/v1/queues")
    entry = [e for e in json.loads(body)["queues"] if e["name"] == q][0]
    assert (entry["unsettled"], entry["stuck"]) == (1, 1), entry
    a.ch.basic_ack(a.got[0][0].delivery_tag)
    a.conn.sleep(0.3)
    assert not rb.log_lines("processing_timeout")
    assert not rb.log_lines("retry_published")
    m = metrics(rb.admin_port)
    assert "rebound_unsettled_deliveries" + label not in m
    wait_counts(ctl, {q: (0, 0)})
    a.conn.close()
