"""Many messages failing a chosen number of times
through every requeue form (basic.reject, basic.nack, basic.nack
multiple=true with several outstanding, prefetch 20), and the absence of
head-of-line blocking between tiers (one queue per delay tier). Real pika consumer, real broker, real rebound.

Tier accuracy tolerance: [delay - 50 ms, delay + 600 ms] (retryhelp).
"""
import time

import pika

import rbtest
from retryhelp import (EARLY, LATE, check_gaps, direct, dlq, pump, tier,
                       wait_counts)

assert direct  # a fixture

MAX_ATTEMPTS = 4
METHODS = ("reject", "nack", "multi")


def test_mixed_failures_each_acked_or_dead_lettered_exactly_once(
        rebound_factory, broker, ctl, direct):
    """300 messages; message i fails f = i % 6 times (0..5) before the
    consumer acks it. f < 4: delivered exactly f+1 times then acked once;
    f >= 4: delivered exactly 4 times, then exactly once in the DLQ. The
    form of each failure rotates between reject, nack and nack
    multiple=true over several outstanding deliveries."""
    n = 300
    rb = rebound_factory("--retry-tiers", "200ms,400ms",
                         "--max-attempts", str(MAX_ATTEMPTS))
    q = direct.own(rbtest.uniq("mixed"))
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    fails = {i: i % 6 for i in range(n)}
    for i in range(n):
        ch.basic_publish("", q, b"%d:%d" % (i, fails[i]), pika.BasicProperties(
            message_id=str(i), headers={"i": i},
            delivery_mode=2 if i % 2 else 1), mandatory=True)

    delivered = {i: 0 for i in range(n)}
    acked = {}
    errors = []
    pending_multi = []   # outstanding deliveries to fail with one nack
    used = {m: 0 for m in METHODS}
    multi_sizes = []
    last_delivery = [time.monotonic()]

    def flush_multi():
        if pending_multi:
            ch.basic_nack(pending_multi[-1], multiple=True, requeue=True)
            multi_sizes.append(len(pending_multi))
            del pending_multi[:]

    def on_message(chan, method, props, body):
        last_delivery[0] = time.monotonic()
        i, f = (int(x) for x in body.split(b":"))
        delivered[i] += 1
        k = delivered[i]  # this delivery's attempt number
        count = (props.headers or {}).get("rebound-retry-count")
        if count != (None if k == 1 else k - 1):
            errors.append("message %d attempt %d carries count %r" % (i, k, count))
        if props.message_id != str(i) or props.headers.get("i") != i or \
                props.delivery_mode != (2 if i % 2 else 1):
            errors.append("message %d lost properties: %r" % (i, props))
        if i in acked or k > min(f + 1, MAX_ATTEMPTS):
            errors.append("message %d delivered %d times (f=%d)" % (i, k, f))
        if k > f:
            chan.basic_ack(method.delivery_tag)
            acked[i] = acked.get(i, 0) + 1
            return
        how = METHODS[(i + k) % 3]
        used[how] += 1
        if how == "reject":
            chan.basic_reject(method.delivery_tag, requeue=True)
        elif how == "nack":
            chan.basic_nack(method.delivery_tag, requeue=True)
        else:
            # every delivery before this one is settled or in the list, so
            # the multiple nack covers exactly the list
            pending_multi.append(method.delivery_tag)
            if len(pending_multi) >= 5:
                flush_multi()

    ch.basic_qos(prefetch_count=20)
    ctag = ch.basic_consume(q, on_message)
    want_acked = {i for i in range(n) if fails[i] < MAX_ATTEMPTS}
    want_dead = {i for i in range(n) if fails[i] >= MAX_ATTEMPTS}

    def done():
        if pending_multi and time.monotonic() - last_delivery[0] > 0.05:
            flush_multi()  # nothing more is coming for now
        # a last delivery still waiting in pending_multi is not nacked yet
        return not pending_multi and set(acked) == want_acked and all(
            delivered[i] == MAX_ATTEMPTS for i in want_dead)

    pump(conn, done, 90, lambda: "all acked/dead-lettered: %d/%d acked, "
         "dead %d/%d; errors %r" % (
             len(acked), len(want_acked),
             sum(delivered[i] == MAX_ATTEMPTS for i in want_dead),
             len(want_dead), errors[:5]))
    # the dead-letter copies are confirmed, then nothing comes any more
    wait_counts(ctl, {dlq(q): (len(want_dead), 0), q: (0, 0)}, timeout=20)
    end = time.monotonic() + 0.8
    while time.monotonic() < end:
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(ctag)

    assert not errors, errors[:20]
    assert all(v == 1 for v in acked.values())
    for i in range(n):
        assert delivered[i] == min(fails[i] + 1, MAX_ATTEMPTS), (i, delivered[i])
    # every form was used, multiple=true with several outstanding
    assert min(used.values()) > 50, used
    assert max(multi_sizes) >= 5 and len(multi_sizes) >= 10, multi_sizes

    got = direct.get_all(dlq(q), expect=len(want_dead))
    ids = [p.message_id for _, p, _ in got]
    assert sorted(ids, key=int) == [str(i) for i in sorted(want_dead)], ids
    assert len(set(ids)) == len(ids)
    for _, p, b in got:
        i = int(p.message_id)
        assert b == b"%d:%d" % (i, fails[i])
        assert p.headers["rebound-retry-count"] == MAX_ATTEMPTS
        assert p.headers["rebound-dead-letter-reason"] == "max-attempts"
        assert p.headers["rebound-source-queue"] == q
    wait_counts(ctl, {q: (0, 0), dlq(q): (0, 0), tier(q, "200ms"): (0, 0),
                      tier(q, "400ms"): (0, 0)})
    # every failure became a copy: nothing fell back, nothing was uncached
    assert not rb.log_lines("retry_fallback")
    assert not rb.log_lines("delivery_not_cached")
    total_failures = sum(min(f, MAX_ATTEMPTS) for f in fails.values())
    assert len(rb.log_lines("retry_published")) + \
        len(rb.log_lines("dead_lettered")) == total_failures
    conn.close()


def test_no_head_of_line_blocking_between_tiers(rebound_factory, broker, ctl,
                                                direct):
    """Tiers 1s, 4s. Messages A0..A2 fail twice: their copies wait in the
    4 s tier. Then B fails once: its copy goes to the 1 s tier and comes
    back ~1 s later, long before the A's, whose own 4 s are not stretched
    either. Classic tiers: the test reads the tier's depth at once, and
    RabbitMQ reports a quorum queue's depth only every few seconds."""
    rb = rebound_factory("--retry-tiers", "1s,4s", "--max-attempts", "3",
                         "--retry-queue-type", "classic")
    q = direct.own(rbtest.uniq("hol"))
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    seen = []        # (t, name, attempt)
    failed_at = {}   # (name, attempt) -> t

    def on_message(chan, method, props, body):
        name = body.decode()
        count = (props.headers or {}).get("rebound-retry-count") or 0
        attempt = count + 1
        seen.append((time.monotonic(), name, attempt))
        if name.startswith("A") and attempt <= 2 or name == "B" and attempt == 1:
            chan.basic_nack(method.delivery_tag, requeue=True)
            failed_at[(name, attempt)] = time.monotonic()
        else:
            chan.basic_ack(method.delivery_tag)

    ch.basic_qos(prefetch_count=10)
    ch.basic_consume(q, on_message)
    for a in ("A0", "A1", "A2"):
        ch.basic_publish("", q, a.encode())
    pump(conn, lambda: all(("A%d" % j, 2) in failed_at for j in range(3)), 10,
         "the A's second failures")
    # the A's copies reach the 4 s tier (a passive declare answers at
    # once, where rabbitmqctl takes seconds on a loaded machine)
    def depth():
        dch = direct.conn.channel()
        n = dch.queue_declare(tier(q, "4s"), passive=True).method.message_count
        dch.close()
        return n
    rbtest.wait_until(lambda: depth() == 3, 3, "the A's copies in the tier")
    ch.basic_publish("", q, b"B")
    pump(conn, lambda: any(n == "B" and a == 2 for _, n, a in seen), 3.5,
         lambda: "B's second delivery (seen %r)" % seen)
    pump(conn, lambda: sum(a == 3 for _, _, a in seen) == 3, 10,
         "the A's third deliveries")

    t = {(n, a): ts for ts, n, a in seen}
    b_gap = t[("B", 2)] - failed_at[("B", 1)]
    a_gaps = [t[("A%d" % j, 3)] - failed_at[("A%d" % j, 2)] for j in range(3)]
    print("B (1s tier) gap %.3f, A (4s tier) gaps %s" % (
        b_gap, [round(g, 3) for g in a_gaps]))
    check_gaps([b_gap], [1.0])
    check_gaps(a_gaps, [4.0] * 3)
    # B's retry overtook every A due back later than B by more than the
    # gaps' tolerance (all of them, unless B was published late)
    b_due = failed_at[("B", 1)] + 1.0
    later = [j for j in range(3)
             if failed_at[("A%d" % j, 2)] + 4.0 > b_due + EARLY + LATE]
    assert later, "B was published too late to overtake any A"
    assert all(t[("B", 2)] < t[("A%d" % j, 3)] for j in later), (t, later)
    wait_counts(ctl, {q: (0, 0), tier(q, "1s"): (0, 0), tier(q, "4s"): (0, 0)})
    conn.close()
