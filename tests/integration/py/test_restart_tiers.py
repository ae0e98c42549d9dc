"""Nothing lost across a broker restart while messages wait in a retry
tier (README, "Retries": dead-lettering out of a classic queue is
at-most-once, so a classic tier dead-lettering into a quorum source queue
loses what it held across a restart; quorum tiers with
x-dead-letter-strategy at-least-once do not).

300 persistent messages in a durable source queue (classic or quorum); a
pika consumer through rebound nacks each first delivery with requeue=true,
so rebound moves all 300 into the tier `<q>.retry.20s`. With all of them
waiting there, the broker is stopped and started again (same node, same
data), and a new consumer through the same rebound must get each of the
300 exactly once more, carrying rebound-retry-count 1, and the source and
tier queues drain to 0. Two restarts: one quick enough that the tier delay
passes after the node is back ("after-start"), and one where the node
stays down until the delay has passed, so the tier expires its messages
while the node boots ("while-down": a classic tier loses all 300 into a
quorum source here, the broker logging "leader not known. Command is
dropped" for each). With the default `queue_type: auto` rebound declares
the tier as a quorum queue on RabbitMQ >= 3.10.

Uses a private broker node (test_broker_restart's private_broker), never
the shared test broker. About 2 minutes for the four cases.
"""
import glob
import os
import time

import pika
import pytest

import rbtest
from retryhelp import Direct, count_of, dlq, ready, tier, wait_counts
from test_broker_restart import broker_sh, private_broker

assert private_broker  # a fixture

N = 300
TIER = "20s"
TIER_S = 20.0
MAX_ATTEMPTS = 3
# The broker's words when a dead-lettered message finds no quorum leader
# (RabbitMQ 3.10: the at-most-once path drops it): "... leader not known.
# Command is dropped."
DROPPED = "Command is dropped"


def broker_log(pb):
    out = []
    for path in sorted(glob.glob(os.path.join(pb.dir, "log", "*.log"))):
        with open(path, "rb") as f:
            out.append(f.read().decode("utf-8", "replace"))
    return "\n".join(out)


def queue_types(pb, names):
    return {r[0]: r[1] for r in pb._rows("list_queues", "name", "type")
            if r[0] in names}


def reconnect(direct):
    direct.conn = pika.BlockingConnection(pika.URLParameters(
        direct.broker.url + "?connection_attempts=3&socket_timeout=10"))
    direct.ch = direct.conn.channel()


@pytest.mark.parametrize("expire", ["after-start", "while-down"])
@pytest.mark.parametrize("source_type", ["classic", "quorum"])
def test_restart_with_messages_in_tier_loses_nothing(
        rebound_factory, private_broker, source_type, expire):
    pb = private_broker
    q = rbtest.uniq("rtier-" + source_type)
    tq, dq = tier(q, TIER), dlq(q)
    rb = rebound_factory("--retry-queues", q, "--retry-tiers", TIER,
                         "--max-attempts", str(MAX_ATTEMPTS), upstream=pb.addr)
    args = {"x-queue-type": "quorum"} if source_type == "quorum" else None
    direct = Direct(pb, pb)
    direct.own(q)
    direct.ch.queue_declare(q, durable=True, arguments=args)
    ch = direct.channel()
    ch.confirm_delivery()
    for i in range(N):
        ch.basic_publish("", q, b"body-%d" % i, pika.BasicProperties(
            message_id=str(i), delivery_mode=2, headers={"i": i}),
            mandatory=True)
    ch.close()
    log_before = len(broker_log(pb))

    # 1. every message fails once: rebound copies it into the tier
    conn = rb.pika(pb)
    cch = conn.channel()
    cch.basic_qos(prefetch_count=50)
    first = {}
    early = []

    def fail_first(chan, method, props, body):
        if count_of(props) is None:
            first[props.message_id] = first.get(props.message_id, 0) + 1
            chan.basic_nack(method.delivery_tag, requeue=True)
        else:  # back from the tier before the restart: 20 s are not over
            early.append((props.message_id, count_of(props)))
            chan.basic_ack(method.delivery_tag)

    cch.basic_consume(q, fail_first)
    deadline = time.monotonic() + 120
    while len(first) < N and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert len(first) == N, "consumed %d of %d" % (len(first), N)
    t_nacked = time.monotonic()
    wait_counts(pb, {q: (0, 0)}, timeout=60)
    rbtest.wait_until(lambda: ready(direct, tq) == N, 30,
                      lambda: "%d in %s (has %r)" % (N, tq, ready(direct, tq)))
    conn.close()
    types = queue_types(pb, {q, tq})
    assert not early, early
    assert all(v == 1 for v in first.values())

    # 2. restart the broker: same directory, same node, same data
    t0 = time.monotonic()
    broker_sh("stop", pb.dir)
    t_stopped = time.monotonic()
    if expire == "while-down":
        # the tier delay passes while the node is down: the tier expires
        # its messages as soon as it is recovered, while the node boots
        while time.monotonic() < t_nacked + TIER_S + 2:
            time.sleep(0.2)
    t_starting = time.monotonic()
    broker_sh("start", pb.dir)
    t_up = time.monotonic()
    reconnect(direct)
    in_tier_after = ready(direct, tq)

    # 3. each comes back once, counted; wait past the tier delay, until
    # all came or nothing is left anywhere that could still come
    conn = rb.pika(pb)
    cch = conn.channel()
    cch.basic_qos(prefetch_count=50)
    again = {}
    bad = []

    def take(chan, method, props, body):
        mid = props.message_id
        again[mid] = again.get(mid, 0) + 1
        if count_of(props) != 1 or body != b"body-%s" % mid.encode() or \
                (props.headers or {}).get("i") != int(mid):
            bad.append((mid, count_of(props), body[:20]))
        chan.basic_ack(method.delivery_tag)

    cch.basic_consume(q, take)
    deadline = t_nacked + TIER_S + 90
    last_look = 0
    gone_since = None
    while time.monotonic() < deadline and len(again) < N:
        conn.process_data_events(time_limit=0.2)
        if time.monotonic() - last_look > 1:
            last_look = time.monotonic()
            left = sum(ready(direct, n) or 0 for n in (q, tq, dq))
            # nothing waits anywhere any more: what has not come is lost
            if left == 0 and time.monotonic() - t_nacked > TIER_S + 2:
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > 5:
                    break
            else:
                gone_since = None
    t_all = time.monotonic()
    # a little longer: any duplicate would show up now
    end = time.monotonic() + 2
    while time.monotonic() < end:
        conn.process_data_events(time_limit=0.1)

    log_new = broker_log(pb)[log_before:]
    dropped = [line for line in log_new.splitlines() if DROPPED in line]
    drops = "%d lines %r" % (len(dropped), DROPPED)
    dups = {m: c for m, c in again.items() if c > 1}
    lost = sorted(set(map(str, range(N))) - set(again), key=int)
    print("\nrestart-tiers %s source, delay passes %s: tier type %s, "
          "%r in the tier after the restart, stop %.1fs, down %.1fs, start "
          "%.1fs (up "
          "%.1fs after the last nack), all back %.1fs after the start "
          "(%.1fs after the last nack); got %d of %d, lost %d, duplicates "
          "%d, broker log: %s"
          % (source_type, expire, types.get(tq), in_tier_after,
             t_stopped - t0, t_up - t_stopped, t_up - t_starting,
             t_up - t_nacked, t_all - t_up,
             t_all - t_nacked, len(again), N, len(lost), len(dups), drops))
    assert not lost, (
        "%d of %d messages lost across the restart (tier %s is %s; the "
        "broker log has %s); first missing: %r"
        % (len(lost), N, tq, types.get(tq), drops, lost[:10]))
    assert not dups, "delivered more than once after the restart: %r" % dups
    assert not bad, "wrong count or body after the restart: %r" % bad[:10]
    wait_counts(pb, {q: (0, 0), tq: (0, 0)}, timeout=30)
    assert ready(direct, dq) in (None, 0)
    conn.close()
    direct.cleanup()
