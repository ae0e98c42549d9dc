"""Consumers that crash (README, "Consumers that crash"): a message whose
every consumer dies while holding it ends in the dead-letter queue after
2 x max_attempts deliveries, reason consumer-lost; consumers that die
holding prefetched messages they never started push nothing to the
dead-letter queue, and a healthy consumer gets everything after."""
import json
import os
import subprocess
import sys

import pytest

import rbtest
from retryhelp import direct, dlq, pump, wait_counts

assert direct  # a fixture

HERE = os.path.dirname(os.path.abspath(__file__))


def crash(rb, q, prefetch, n, out):
    """Run one crashing consumer to its end; returns its deliveries."""
    before = len(read(out))
    p = subprocess.run([sys.executable, os.path.join(HERE, "crash_consumer.py"),
                        str(rb.port), q, str(prefetch), str(n), out],
                       capture_output=True, timeout=60)
    assert p.returncode == 3, p.stderr.decode()[-2000:]
    return read(out)[before:]


def read(out):
    if not os.path.exists(out):
        return []
    with open(out) as f:
        return [json.loads(l) for l in f]


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_a_message_that_kills_every_consumer(rebound_factory, broker, ctl,
                                             direct, tmp_path, qtype):
    """max_attempts 3: each attempt is two deliveries (the first loss is
    not counted, the broker's redelivery is), so 6 deliveries, then the
    dead-letter queue with reason consumer-lost and count 3."""
    q = direct.own(rbtest.uniq("crash"))
    direct.own(dlq(q))
    rb = rebound_factory("--retry-queues", q, "--retry-tiers", "200ms",
                         "--max-attempts", "3")
    args = {"x-queue-type": "quorum"} if qtype == "quorum" else {}
    direct.ch.queue_declare(q, durable=True, arguments=args)
    direct.publish(q, b"poison")
    out = str(tmp_path / "deliveries.jsonl")
    for n in range(1, 13):  # more than enough: the bound is what is checked
        crash(rb, q, 1, 1, out)
        # rebound is done with the lost consumer (its copy confirmed)
        rbtest.wait_until(lambda: len(rb.log_lines("session_close")) >= n,
                          15, "the session of crash %d closed" % n)
        if direct.exists(dlq(q)) and direct.ch.queue_declare(
                dlq(q), passive=True).method.message_count:
            break
    got = read(out)
    assert [(g["redelivered"], g["count"]) for g in got] == [
        (False, None), (True, None), (False, 1), (True, 1), (False, 2),
        (True, 2)], got
    (m, props, body), = direct.get_all(dlq(q), expect=1)
    h = props.headers
    assert body == b"poison"
    assert h["rebound-dead-letter-reason"] == "consumer-lost"
    assert h["rebound-retry-count"] == 3
    lost = rb.log_lines("consumer_lost")
    assert len(lost) == 3 and all(l["queue"] == q for l in lost), lost
    wait_counts(ctl, {q: (0, 0)})


def test_consumers_dying_with_prefetched_messages(rebound_factory, broker,
                                                  ctl, direct, tmp_path):
    """Prefetch 50, five consumers that each take all 50 and die without
    starting any: nothing reaches the dead-letter queue, no message is
    counted more than once, and a healthy consumer then gets and acks all
    50."""
    q = direct.own(rbtest.uniq("restart"))
    direct.own(dlq(q))
    rb = rebound_factory("--retry-queues", q, "--retry-tiers", "200ms")
    direct.ch.queue_declare(q, durable=True)
    for i in range(50):
        direct.publish(q, b"m%d" % i)
    out = str(tmp_path / "deliveries.jsonl")
    for _ in range(5):
        got = crash(rb, q, 50, 50, out)
        assert len(got) == 50
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=50)
    seen = {}

    def on_message(c, m, p, b):
        seen[b] = (p.headers or {}).get("rebound-retry-count")
        c.basic_ack(m.delivery_tag)

    ch.basic_consume(q, on_message)
    pump(conn, lambda: len(seen) == 50, 20, lambda: "50 (got %d)" % len(seen))
    conn.close()
    assert sorted(seen) == sorted(b"m%d" % i for i in range(50))
    assert all(c in (None, 1) for c in seen.values()), seen
    assert not direct.exists(dlq(q))
    wait_counts(ctl, {q: (0, 0)})
    # the first loss of each never counts: at most one per later loss
    assert len(rb.log_lines("consumer_lost")) <= 4
