"""A tier or dead-letter queue that exists with the other queue type than
rebound's policy says (pre-declared by an operator, or left as classic by
an older rebound) is used, not fought: the broker's 406 makes rebound
declare it with the other type's arguments, the retry still counts, and
the lesson holds for every later connection."""
import pika

import rbtest
from retryhelp import direct, dlq, pump, tier, wait_counts

assert direct  # a fixture

QUORUM_TIER = {"x-queue-type": "quorum", "x-dead-letter-exchange": "",
               "x-dead-letter-strategy": "at-least-once",
               "x-overflow": "reject-publish"}


def fail_once_then_ack(rb, broker, q, n_expected):
    """A consumer through rebound that nacks every delivery with no retry
    count and acks the rest; returns the count headers seen."""
    conn = rb.pika(broker)
    ch = conn.channel()
    seen = []

    def on_message(chan, method, props, body):
        count = (props.headers or {}).get("rebound-retry-count")
        seen.append(count)
        if count is None:
            chan.basic_nack(method.delivery_tag, requeue=True)
        else:
            chan.basic_ack(method.delivery_tag)

    ch.basic_consume(q, on_message)
    pump(conn, lambda: len(seen) >= n_expected, 15,
         lambda: "%d deliveries (seen %r)" % (n_expected, seen))
    conn.close()
    return seen


def test_pre_declared_quorum_tier_under_a_classic_policy(
        rebound_factory, broker, ctl, direct):
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "3",
                         "--retry-queue-type", "classic")
    q = direct.own(rbtest.uniq("qt-quorum"))
    direct.ch.queue_declare(q, durable=True)
    direct.ch.queue_declare(tier(q, "300ms"), durable=True, arguments=dict(
        QUORUM_TIER, **{"x-message-ttl": 300,
                        "x-dead-letter-routing-key": q}))
    direct.publish(q, b"m")
    seen = fail_once_then_ack(rb, broker, q, 2)
    assert seen == [None, 1], seen  # a counted retry, through that tier
    adapted = rb.wait_log("retry_queue_type_adapted")
    assert adapted["queue"] == tier(q, "300ms"), adapted
    assert not rb.log_lines("retry_topology_error")
    assert not rb.log_lines("retry_requeue_delayed")
    assert ctl.queue_type(tier(q, "300ms")) == "quorum"
    wait_counts(ctl, {q: (0, 0), tier(q, "300ms"): (0, 0)})


def test_classic_tier_of_an_older_rebound_under_the_default(
        rebound_factory, broker, ctl, direct):
    """The default (quorum on 3.10) meets a classic tier: used, and a second
    connection does not meet the refusal again."""
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "3")
    q = direct.own(rbtest.uniq("qt-classic"))
    direct.ch.queue_declare(q, durable=True)
    direct.ch.queue_declare(tier(q, "300ms"), durable=True, arguments={
        "x-message-ttl": 300, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": q})
    direct.publish(q, b"first")
    assert fail_once_then_ack(rb, broker, q, 2) == [None, 1]
    closes = len(rb.log_lines("own_channel_closed"))
    assert closes == 1, rb.log_lines("own_channel_closed")
    direct.publish(q, b"second", pika.BasicProperties(delivery_mode=2))
    assert fail_once_then_ack(rb, broker, q, 2) == [None, 1]
    assert len(rb.log_lines("own_channel_closed")) == closes  # learnt once
    assert len(rb.log_lines("retry_queue_type_adapted")) == 1
    assert ctl.queue_type(tier(q, "300ms")) == "classic"
    assert not rb.log_lines("retry_topology_error")
    wait_counts(ctl, {q: (0, 0), tier(q, "300ms"): (0, 0)})
    assert ctl.queue(dlq(q)) is None  # nothing was dead-lettered
