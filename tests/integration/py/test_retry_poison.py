"""A message that always fails is delivered exactly
max_attempts times, with the tier delays between deliveries, then sits in
the dead-letter queue with its body, properties and headers intact, and
the source and tier queues drain to 0 (README, "Retries"). Real pika consumer, real broker, real rebound.

Tier accuracy tolerance: each gap between a failure (the consumer's
nack/reject) and the next delivery must lie in
[delay - 50 ms, delay + 600 ms] (retryhelp.EARLY / LATE).
"""
import pika
import pytest

import rbtest
from retryhelp import (PoisonConsumer, direct, dlq, expected_gaps, queues,
                       run_poison, tier, wait_counts)

assert direct  # a fixture


def expect_topology(direct, ctl, q, delays_named):
    """The tier queues and the DLQ exist with exactly the arguments the README
    gives ("Retries"; a redeclare with other arguments would be
    refused with 406). With the default queue type on RabbitMQ 3.10 they
    are quorum queues, the tiers dead-lettering at-least-once."""
    for name, ms in delays_named.items():
        args = {"x-queue-type": "quorum", "x-message-ttl": ms,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": q,
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish"}
        assert ctl.queue_type(name) == "quorum", name
        assert direct.declare_ok(name, durable=True, arguments=args), name
        assert not direct.declare_ok(name, durable=True, arguments=dict(
            args, **{"x-message-ttl": ms + 1})), name
        assert not direct.declare_ok(name, durable=True, arguments=dict(
            args, **{"x-dead-letter-strategy": "at-most-once"})), name
    assert ctl.queue_type(dlq(q)) == "quorum"
    assert direct.declare_ok(dlq(q), durable=True,
                             arguments={"x-queue-type": "quorum"})
    assert not direct.declare_ok(dlq(q), durable=True,
                                 arguments={"x-message-ttl": 1000})


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_poison_default_policy_exactly_max_attempts(rebound_factory, broker,
                                                    ctl, direct, qtype):
    """rebound with no retry flags at all: the defaults (every queue,
    tiers 1s,2s,4s, max_attempts 4). Deliveries: 4, gaps ~1 s, 2 s, 4 s,
    then Q.dlq; classic and quorum source queues."""
    rb = rebound_factory()
    args = {"x-queue-type": "quorum"} if qtype == "quorum" else {}
    # reject on the quorum run, nack on the classic one: both mean requeue
    q, gaps = run_poison(rb, broker, ctl, direct, args, ["1s", "2s", "4s"], 4,
                         how="reject" if qtype == "quorum" else "nack")
    print("%s default tiers: gaps %s" % (qtype, [round(g, 3) for g in gaps]))
    published = rb.log_lines("retry_published")
    dead = rb.log_lines("dead_lettered")
    assert [p["target"] for p in published] == \
        [tier(q, "1s"), tier(q, "2s"), tier(q, "4s")], published
    assert [p["target"] for p in dead] == [dlq(q)], dead
    expect_topology(direct, ctl, q, {tier(q, "1s"): 1000, tier(q, "2s"): 2000,
                                tier(q, "4s"): 4000})


def test_max_attempts_6_with_3_tiers_repeats_the_last(rebound_factory, broker,
                                                      ctl, direct):
    """max_attempts 6, tiers 300ms,600ms,1200ms: exactly 6 deliveries, the
    gaps t1, t2, t3, t3, t3 -- the copy goes through the same TTL tier
    three times and the broker must not treat that as a dead-letter cycle
    -- then the DLQ with count 6."""
    rb = rebound_factory("--retry-tiers", "300ms,600ms,1200ms",
                         "--max-attempts", "6")
    tiers = ["300ms", "600ms", "1200ms"]
    assert expected_gaps(tiers, 6) == [0.3, 0.6, 1.2, 1.2, 1.2]
    q, gaps = run_poison(rb, broker, ctl, direct, {}, tiers, 6)
    print("max_attempts 6: gaps %s" % [round(g, 3) for g in gaps])
    published = rb.log_lines("retry_published")
    assert [p["target"] for p in published] == \
        [tier(q, t) for t in ["300ms", "600ms", "1200ms", "1200ms", "1200ms"]]
    assert [p["target"] for p in rb.log_lines("dead_lettered")] == [dlq(q)]


def test_max_attempts_1_goes_straight_to_the_dlq(rebound_factory, broker, ctl,
                                                 direct):
    """max_attempts 1: the first failure dead-letters (no tier queue is
    ever declared)."""
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "1")
    q, _ = run_poison(rb, broker, ctl, direct, {}, ["300ms"], 1)
    assert [p["target"] for p in rb.log_lines("dead_lettered")] == [dlq(q)]
    assert not rb.log_lines("retry_published")
    assert not [n for n in queues(ctl) if n.startswith(q + ".retry.")]


@pytest.mark.parametrize("size", [0, 3 * 131072 + 17])
def test_poison_empty_and_multi_frame_bodies(rebound_factory, broker, ctl,
                                             direct, size):
    """An empty body and a body larger than frame-max (131072: rebound's
    copy must be split into several body frames) survive every hop."""
    rb = rebound_factory("--retry-tiers", "200ms", "--max-attempts", "3")
    body = bytes((i * 7 + 3) % 256 for i in range(size))
    props = pika.BasicProperties(delivery_mode=1)  # transient, no headers
    q = direct.own(rbtest.uniq("body"))
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", q, body, props)
    cons = PoisonConsumer(conn, ch, q)
    cons.wait(3, timeout=10)
    wait_counts(ctl, {dlq(q): (1, 0), q: (0, 0)}, timeout=10)
    assert [d.body == body for d in cons.deliveries] == [True] * 3
    assert [d.count for d in cons.deliveries] == [None, 1, 2]
    got = direct.get_all(dlq(q), expect=1)
    assert len(got) == 1
    _, p, b = got[0]
    assert len(b) == size and b == body
    assert p.delivery_mode == 1  # transient stays transient
    assert p.headers["rebound-retry-count"] == 3
    cons.cancel()
    conn.close()


def test_info_log_shows_dead_letters_and_a_retry_summary(rebound_factory,
                                                         broker, ctl, direct):
    """At the default log level a user sees what rebound did: one
    dead_lettered line per dead letter (queue, message id, reason,
    attempts, where it went) and a retry_summary of the copies, not only
    session_open/session_close. Per-copy lines stay at debug."""
    rb = rebound_factory("--log-level", "info", "--retry-tiers", "200ms",
                         "--max-attempts", "3")
    q = direct.own(rbtest.uniq("info-log"))
    direct.ch.queue_declare(q, durable=True)
    direct.publish(q, b"poison", pika.BasicProperties(message_id="order-42",
                                                      delivery_mode=2))
    conn = rb.pika(broker)
    cons = PoisonConsumer(conn, conn.channel(), q)
    cons.wait(3, 20)
    dead = rb.wait_log("dead_lettered", timeout=10)
    assert (dead["level"], dead["queue"], dead["message_id"], dead["reason"],
            dead["attempts"], dead["target"]) == \
        ("info", q, "order-42", "max-attempts", "3", dlq(q)), dead
    summary = rb.wait_log("retry_summary", timeout=5)
    assert summary["level"] == "info" and int(summary["retried"]) >= 1, \
        summary
    cons.cancel()
    conn.close()
    rbtest.wait_until(
        lambda: sum(int(ln["retried"]) for ln in
                    rb.log_lines("retry_summary")) == 2 and
        sum(int(ln["dead_lettered"]) for ln in
            rb.log_lines("retry_summary")) == 1,
        15, lambda: "the summaries to add up to 2 retries and 1 dead letter "
        "(%r)" % rb.log_lines("retry_summary"))
    assert rb.log_lines("retry_published") == []
    assert all(ln["level"] != "debug" for ln in
               map(rbtest.logfmt_parse, rb.log().splitlines()) if ln), \
        "debug lines at --log-level info"
    wait_counts(ctl, {q: (0, 0), dlq(q): (1, 0)})
