"""The retry policy's edges and the delivery cache bound: what is *not*
turned into a retry must behave exactly as without rebound, and a topology
rebound cannot declare is a clear log line, never a broken client
(README, "Retries"). Real pika clients, real broker,
real rebound.

Tier accuracy tolerance: [delay - 50 ms, delay + 600 ms] (retryhelp).
"""
import os
import time

import pika

import rbtest
from retryhelp import (EARLY, PoisonConsumer, check_gaps, direct, dlq, pump,
                       related,
                       tier, wait_counts)

assert direct  # a fixture


def test_queue_outside_policy_is_a_plain_requeue_loop(rebound_factory, broker,
                                                      ctl, direct):
    """--retry-queues 'rbt-rin-*': on one connection and one channel, a
    message of a queue outside the policy is nacked/rejected 20 times and
    comes back at once every time (redelivered=True, no header added,
    nothing declared), exactly as direct; meanwhile a message of a queue
    inside the policy, nacked once, waits its 2 s in the tier and comes
    back with count 1."""
    rb = rebound_factory("--retry-queues", "rbt-rin-*", "--retry-tiers", "2s",
                         "--max-attempts", "3")
    qin = direct.own(rbtest.uniq("rin"))
    qout = direct.own(rbtest.uniq("rout"))
    conn = rb.pika(broker)
    ch = conn.channel()
    for q in (qin, qout):
        ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    out_seen, in_seen = [], []
    in_failed = []

    def on_out(chan, method, props, body):
        out_seen.append((time.monotonic(), method.redelivered,
                         dict(props.headers or {})))
        if len(out_seen) < 20:
            if len(out_seen) % 2:
                chan.basic_nack(method.delivery_tag, requeue=True)
            else:
                chan.basic_reject(method.delivery_tag, requeue=True)
        else:
            chan.basic_ack(method.delivery_tag)

    def on_in(chan, method, props, body):
        in_seen.append((time.monotonic(), method.redelivered,
                        (props.headers or {}).get("rebound-retry-count")))
        if len(in_seen) == 1:
            chan.basic_nack(method.delivery_tag, requeue=True)
            in_failed.append(time.monotonic())
        else:
            chan.basic_ack(method.delivery_tag)

    ch.basic_qos(prefetch_count=5)
    ch.basic_consume(qin, on_in)
    ch.basic_consume(qout, on_out)
    ch.basic_publish("", qin, b"inside", pika.BasicProperties(headers={"k": 1}))
    pump(conn, lambda: in_failed, 5, "the inside message's first delivery")
    ch.basic_publish("", qout, b"outside", pika.BasicProperties(headers={"k": 2}))
    pump(conn, lambda: len(out_seen) == 20 and len(in_seen) == 2, 10,
         lambda: "20 outside and 2 inside deliveries (%d, %d)" % (
             len(out_seen), len(in_seen)))

    # outside: the broker's own requeue loop, untouched
    assert [r for _, r, _ in out_seen] == [False] + [True] * 19
    assert all(h == {"k": 2} for _, _, h in out_seen), out_seen[1][2]
    gaps = [b[0] - a[0] for a, b in zip(out_seen, out_seen[1:])]
    assert max(gaps) < 0.5, gaps  # immediate, not a tier's delay
    # ...all of it while the inside message waited in its tier
    assert out_seen[-1][0] < in_seen[1][0]
    # inside: retried
    assert in_seen[0][1:] == (False, None) and in_seen[1][1:] == (False, 1)
    check_gaps([in_seen[1][0] - in_failed[0]], [2.0])
    wait_counts(ctl, {qin: (0, 0), qout: (0, 0), tier(qin, "2s"): (0, 0)})
    assert related(ctl, qout) == set(), "declared for the outside queue"
    assert related(ctl, qin) == {tier(qin, "2s")}
    conn.close()


def test_nack_multiple_spanning_both_kinds_of_queue(rebound_factory, broker,
                                                    ctl, direct):
    """One nack(multiple=true, requeue=true) covering 3 deliveries of a
    queue outside the policy and 3 of a queue inside it, interleaved on one
    channel: the outside ones come back at once (redelivered), the inside
    ones come back through the 1 s tier with count 1."""
    rb = rebound_factory("--retry-queues", "rbt-rin-*", "--retry-tiers", "1s",
                         "--max-attempts", "3")
    qin = direct.own(rbtest.uniq("rin"))
    qout = direct.own(rbtest.uniq("rout"))
    conn = rb.pika(broker)
    ch = conn.channel()
    for q in (qin, qout):
        ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", qin, b"in-%d" % i)
        ch.basic_publish("", qout, b"out-%d" % i)
    seen = []

    def on_message(chan, method, props, body):
        seen.append((time.monotonic(), body, method.redelivered,
                     (props.headers or {}).get("rebound-retry-count"),
                     method.delivery_tag))

    ch.basic_qos(prefetch_count=10)
    ch.basic_consume(qin, on_message)
    ch.basic_consume(qout, on_message)
    pump(conn, lambda: len(seen) == 6, 10, "6 first deliveries")
    first = list(seen)
    ch.basic_nack(max(t for *_, t in first), multiple=True, requeue=True)
    nacked_at = time.monotonic()
    pump(conn, lambda: len(seen) == 12, 10,
         lambda: "6 second deliveries (have %r)" % seen[6:])
    again = seen[6:]
    for _, _, _, _, tag in again:
        ch.basic_ack(tag)
    outs = sorted((b, r, c) for t, b, r, c, _ in again if b.startswith(b"out"))
    ins = sorted((b, r, c) for t, b, r, c, _ in again if b.startswith(b"in"))
    assert outs == [(b"out-%d" % i, True, None) for i in range(3)], again
    assert ins == [(b"in-%d" % i, False, 1) for i in range(3)], again
    out_t = [t - nacked_at for t, b, *_ in again if b.startswith(b"out")]
    in_t = [t - nacked_at for t, b, *_ in again if b.startswith(b"in")]
    assert max(out_t) < 0.5, out_t
    check_gaps(in_t, [1.0] * 3)
    wait_counts(ctl, {qin: (0, 0), qout: (0, 0), tier(qin, "1s"): (0, 0)})
    assert related(ctl, qout) == set()
    conn.close()


def test_preexisting_tier_with_other_ttl(rebound_factory, broker, ctl, direct):
    """Q.retry.1s exists already, declared directly on the broker with
    x-message-ttl 5000. A nack through rebound: rebound's declare is
    refused (406, under both queue types); rebound logs
    retry_topology_error naming the queue, and the failure ends in the
    dead-letter queue at once with the reason tier-refused (never a loop
    of uncounted requeues); the client's connection and channel keep
    working; another queue's retry on the same connection still works;
    nothing is lost, the operator's queue is untouched."""
    rb = rebound_factory("--retry-tiers", "1s,2s", "--max-attempts", "3")
    q = direct.own(rbtest.uniq("pre"))
    q2 = direct.own(rbtest.uniq("pre2"))
    pre = tier(q, "1s")
    preargs = {"x-message-ttl": 5000, "x-dead-letter-exchange": "",
               "x-dead-letter-routing-key": q}
    direct.ch.queue_declare(q, durable=True)
    direct.ch.queue_declare(q2, durable=True)
    direct.ch.queue_declare(pre, durable=True, arguments=preargs)

    conn = rb.pika(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    seen = []

    def on_message(chan, method, props, body):
        seen.append((time.monotonic(), method.routing_key, body,
                     method.redelivered,
                     (props.headers or {}).get("rebound-retry-count")))
        if len(seen) == 1:
            chan.basic_nack(method.delivery_tag, requeue=True)
        elif body == b"second-queue" and len(
                [s for s in seen if s[2] == b"second-queue"]) == 1:
            chan.basic_nack(method.delivery_tag, requeue=True)
        else:
            chan.basic_ack(method.delivery_tag)

    ch.basic_qos(prefetch_count=5)
    ch.basic_consume(q, on_message)
    ch.basic_consume(q2, on_message)
    ch.basic_publish("", q, b"m", pika.BasicProperties(message_id="m"))
    pump(conn, lambda: len(seen) >= 1, 5, "the first delivery")
    err = rb.wait_log("retry_topology_error", timeout=5)
    assert err["queue"] == pre, err
    assert err["code"] == "406", err
    refused = rb.wait_log("retry_tier_refused", timeout=5)
    assert refused["tier"] == pre and refused["target"] == dlq(q), refused
    dead = rb.wait_log("dead_lettered", timeout=5)
    assert (dead["queue"], dead["reason"], dead["target"], dead["attempts"],
            dead["message_id"], dead["level"]) == \
        (q, "tier-refused", dlq(q), "1", "m", "info"), dead
    got = direct.get_all(dlq(q), expect=1)
    assert [(b, p.headers["rebound-dead-letter-reason"]) for _, p, b in got] \
        == [(b"m", "tier-refused")], got

    # the client never noticed: same channel, same connection
    assert ch.is_open and conn.is_open
    ch.basic_publish("", q2, b"second-queue", mandatory=True)
    pump(conn, lambda: len([s for s in seen if s[2] == b"second-queue"]) == 2,
         5, lambda: "second-queue retried through its tier (seen %r)" % seen)
    assert [s[2] for s in seen if s[2] == b"m"] == [b"m"], seen
    q2_seen = [s for s in seen if s[2] == b"second-queue"]
    assert [s[4] for s in q2_seen] == [None, 1], q2_seen  # a real retry
    check_gaps([q2_seen[1][0] - q2_seen[0][0]], [1.0])

    wait_counts(ctl, {q: (0, 0), q2: (0, 0), pre: (0, 0),
                      tier(q2, "1s"): (0, 0)})
    # the operator's queue keeps its arguments
    assert direct.declare_ok(pre, durable=True, arguments=preargs)
    rb_errors = rb.log_lines("retry_topology_error")
    assert len(rb_errors) == 1, rb_errors
    conn.close()


def test_over_the_cache_bound_the_nack_passes_through(rebound_factory,
                                                      broker, ctl, direct):
    """--cache-per-connection 64KiB: a 100 KB delivery is not kept, so its
    nack goes to the broker unchanged, after the tier delay (never at
    once: that would be a hot loop), logged with its message id
    (delivery_not_cached, at most one line per 10 s), while small
    deliveries on the same connection are still retried."""
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "3",
                         "--cache-per-connection", "64KiB")
    q = direct.own(rbtest.uniq("cache"))
    big = b"B" * 100000
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    seen = []

    def on_message(chan, method, props, body):
        seen.append((time.monotonic(), len(body), method.redelivered,
                     (props.headers or {}).get("rebound-retry-count"),
                     props.message_id))
        mine = [s for s in seen if s[4] == props.message_id]
        if len(mine) == 1:
            chan.basic_nack(method.delivery_tag, requeue=True)
        else:
            chan.basic_ack(method.delivery_tag)

    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(q, on_message)
    for mid, body in (("big-1", big), ("small", b"s"), ("big-2", big)):
        ch.basic_publish("", q, body, pika.BasicProperties(message_id=mid))
    pump(conn, lambda: len(seen) == 6, 10,
         lambda: "two deliveries of each message (seen %r)" % seen)
    by = {}
    for s in seen:
        by.setdefault(s[4], []).append(s)
    for mid in ("big-1", "big-2"):
        assert [(n, r, c) for _, n, r, c, _ in by[mid]] == \
            [(100000, False, None), (100000, True, None)], by[mid]
        gap = by[mid][1][0] - by[mid][0][0]
        assert gap >= 0.3 - EARLY, (mid, gap)
    assert [(n, r, c) for _, n, r, c, _ in by["small"]] == \
        [(1, False, None), (1, False, 1)], by["small"]
    lines = rb.log_lines("delivery_not_cached")
    assert [(ln["message_id"], ln["queue"]) for ln in lines] == \
        [("big-1", q)], lines
    wait_counts(ctl, {q: (0, 0), tier(q, "300ms"): (0, 0)})
    assert not direct.exists(dlq(q))
    conn.close()


def test_tier_deleted_under_a_connection_is_declared_again(
        rebound_factory, broker, ctl, direct):
    """The tier queue is deleted (by an operator) after rebound's
    connection declared it: the next copy is unroutable (mandatory ->
    basic.return), so rebound declares the tier again and republishes the
    copy (retry_republished): the retry still counts, a poison message is
    delivered exactly max_attempts times. Nothing is lost."""
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "4")
    q = direct.own(rbtest.uniq("gone"))
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    seen = []

    def on_message(chan, method, props, body):
        seen.append((time.monotonic(), method.redelivered,
                     (props.headers or {}).get("rebound-retry-count")))
        if len(seen) == 2:
            direct.ch.queue_delete(tier(q, "300ms"))
        chan.basic_nack(method.delivery_tag, requeue=True)

    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(q, on_message)
    ch.basic_publish("", q, b"m")
    pump(conn, lambda: len(seen) == 4, 10,
         lambda: "4 deliveries (seen %r)" % seen)
    wait_counts(ctl, {q: (0, 0), dlq(q): (1, 0)})
    assert [s[1:] for s in seen] == [(False, None), (False, 1), (False, 2),
                                     (False, 3)], seen
    check_gaps([b[0] - a[0] for a, b in zip(seen, seen[1:])], [0.3] * 3)
    again = rb.wait_log("retry_republished")
    assert again["target"] == tier(q, "300ms"), again
    assert not rb.log_lines("retry_fallback")
    assert ch.is_open
    conn.close()


def test_broker_nack_of_the_copy_falls_back(rebound_factory, broker, ctl,
                                            direct):
    """An operator policy makes the tier queue refuse publishes
    (max-length 0, overflow reject-publish): the broker nacks rebound's
    copy. rebound publishes it again after the tier delay (logged
    retry_copy_refused) while the first refusal is less than the confirm
    timeout (here 1.1 s) ago; then it falls back -- the delivery is
    requeued by the broker once the tier delay has passed (never at once:
    that would be a hot loop), logged retry_fallback "nacked by the
    broker" -- and nothing is lost; the client's channel is fine. Classic
    tiers: the operator policy is one RabbitMQ applies to them at once."""
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "3",
                         "--retry-queue-type", "classic",
                         "--retry-confirm-timeout", "1100ms")
    q = direct.own(rbtest.uniq("refuse"))
    policy = "rbt-refuse-" + q
    direct.ch.queue_declare(q, durable=True)
    ctl.ctl("set_policy", "--apply-to", "queues", policy,
            "^%s\\.retry\\." % q.replace("-", "\\-"),
            '{"max-length": 0, "overflow": "reject-publish"}')
    try:
        conn = rb.pika(broker)
        ch = conn.channel()
        seen = []

        def on_message(chan, method, props, body):
            seen.append((time.monotonic(), method.redelivered,
                         (props.headers or {}).get("rebound-retry-count")))
            if len(seen) < 3:
                chan.basic_nack(method.delivery_tag, requeue=True)
            else:
                chan.basic_ack(method.delivery_tag)

        ch.basic_qos(prefetch_count=1)
        ch.basic_consume(q, on_message)
        direct.publish(q, b"m")
        pump(conn, lambda: len(seen) == 3, 15,
             lambda: "3 deliveries (seen %r)" % seen)
        assert [s[1:] for s in seen] == [(False, None), (True, None),
                                         (True, None)], seen
        # refused at 0, 0.3, 0.6 and 0.9 s (each published again), at
        # 1.2 s the refusals are older than the confirm timeout: the
        # requeue, after the tier delay
        check_gaps([seen[1][0] - seen[0][0], seen[2][0] - seen[1][0]],
                   [1.5, 1.5])
        refusals = rb.log_lines("retry_copy_refused")
        assert len(refusals) >= 6, refusals
        fbs = rb.log_lines("retry_fallback")
        assert len(fbs) == 2, fbs
        assert all(f["target"] == tier(q, "300ms") and
                   f["reason"] == "nacked by the broker" for f in fbs), fbs
        assert ch.is_open and conn.is_open
        wait_counts(ctl, {q: (0, 0), tier(q, "300ms"): (0, 0)})
        conn.close()
    finally:
        ctl.ctl("clear_policy", policy)


def test_server_named_queue_waits_and_long_names_are_shortened(
        rebound_factory, broker, ctl, direct):
    """A server-named amq.gen-... queue gets no retry (no tier can be
    declared for it, nothing is): its requeues are held back for the tier
    delay, never sent at once, logged retry_requeue_delayed. A queue whose
    tier name would exceed 255 bytes gets a shortened tier and dead-letter
    name where needed (a prefix of it, '~' and a hash) and a real counted
    retry."""
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "3")
    base = rbtest.uniq("long") + "-"
    long_q = direct.own(base + "x" * (250 - len(base)))
    assert len(long_q) <= 255 and len(tier(long_q, "300ms")) > 255
    conn = rb.pika(broker)
    ch = conn.channel()
    gen_q = ch.queue_declare("", exclusive=True).method.queue
    assert gen_q.startswith("amq.gen-")
    ch.queue_declare(long_q, durable=True)
    ch.confirm_delivery()

    ch.basic_publish("", gen_q, b"m")
    cons = PoisonConsumer(conn, ch, gen_q)
    cons.wait(3, timeout=5)
    assert [(d.method.redelivered, d.count) for d in cons.deliveries[:3]] \
        == [(False, None), (True, None), (True, None)]
    check_gaps(cons.gaps()[:2], [0.3, 0.3])
    cons.cancel()
    ch.queue_purge(gen_q)
    delayed = rb.wait_log("retry_requeue_delayed")
    assert delayed["queue"] == gen_q, delayed
    assert delayed["reason"] == "server-named queue (amq.*)", delayed

    ch.basic_publish("", long_q, b"m")
    cons = PoisonConsumer(conn, ch, long_q)
    cons.wait(3, timeout=10)
    assert [d.count for d in cons.deliveries[:3]] == [None, 1, 2]
    cons.cancel()
    names = ctl.queue_names()
    ours = sorted(n for n in names if n.startswith(long_q[:100]) and
                  n != long_q)
    direct.own(*ours)
    tiers = [n for n in ours if n.endswith(".retry.300ms")]
    assert len(tiers) == 1 and len(tiers[0]) == 255 and "~" in tiers[0], ours
    assert dlq(long_q) in ours  # 254 bytes: fits as it is
    rbtest.wait_until(lambda: ctl.queue(dlq(long_q)) == (1, 0, 0), 10,
                      "the message in the dead-letter queue")
    assert not [n for n in names if n.startswith(gen_q + ".")]
    conn.close()


def test_no_permission_for_the_tier_is_a_logged_pass_through(
        rebound_factory, broker, ctl, direct):
    """A user who may use the source queue but not configure queues named
    '<queue>.retry.*' (403 ACCESS_REFUSED on rebound's declare): logged
    retry_topology_error, the delivery is requeued by the broker, and the
    client's connection is unaffected."""
    user = "rbt-perm-%d" % os.getpid()
    q = direct.own(rbtest.uniq("perm"))
    ctl.ctl("add_user", user, "pw")
    try:
        # configure/write/read: only names without a dot (no tiers, no DLQ)
        ctl.ctl("set_permissions", "-p", broker.vhost, user,
                "^rbt-perm-[^.]*$", "^(amq\\.default|rbt-perm-[^.]*)$",
                "^rbt-perm-[^.]*$")
        rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "3")
        params = rb.pika_params(broker)
        params.credentials = pika.PlainCredentials(user, "pw")
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.queue_declare(q, durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", q, b"m", mandatory=True)
        ch.basic_qos(prefetch_count=1)
        cons = PoisonConsumer(conn, ch, q)
        cons.wait(3, timeout=5)
        assert [(d.method.redelivered, d.count) for d in cons.deliveries[:3]] \
            == [(False, None), (True, None), (True, None)]
        cons.cancel()
        err = rb.wait_log("retry_topology_error")
        assert err["queue"] == tier(q, "300ms") and err["code"] == "403", err
        assert ch.is_open and conn.is_open
        ch.queue_purge(q)
        conn.close()
        assert not direct.exists(tier(q, "300ms"))
    finally:
        ctl.ctl("delete_user", user)


def test_client_using_every_channel_then_freeing_one(rebound_factory, broker,
                                                      ctl, direct):
    """channel-max 4 and the client opens all 4: rebound yields its own
    channel (own_channel_yielded), so requeues pass through to the broker
    (immediate redelivery, no header) -- never a refused channel.open.
    When the client closes one channel, rebound takes a number again and
    the next requeue is a real retry through the tier. (With rebound's
    channel on the client's connection: --retry-connection shared.)"""
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "4",
                         "--retry-connection", "shared")
    q = direct.own(rbtest.uniq("chmax"))
    conn = rb.pika(broker, channel_max=4)
    chs = [conn.channel() for _ in range(4)]
    assert [c.channel_number for c in chs] == [1, 2, 3, 4]
    rb.wait_log("own_channel_yielded")
    ch = chs[3]
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"m")
    seen = []
    hold = []

    def on_message(chan, method, props, body):
        seen.append((time.monotonic(), method.redelivered,
                     (props.headers or {}).get("rebound-retry-count")))
        if len(seen) <= 2:
            chan.basic_nack(method.delivery_tag, requeue=True)
        elif len(seen) == 3:
            hold.append(method.delivery_tag)  # settled below
        else:
            chan.basic_ack(method.delivery_tag)

    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(q, on_message)
    pump(conn, lambda: len(seen) == 3, 5, lambda: "3 deliveries: %r" % seen)
    assert [s[1:] for s in seen] == [(False, None), (True, None), (True, None)]
    chs[0].close()
    pump(conn, lambda: len(rb.log_lines("own_channel_ready")) == 2, 5,
         "rebound's channel to be reopened")
    ch.basic_nack(hold[0], requeue=True)
    failed = time.monotonic()
    pump(conn, lambda: len(seen) == 4, 5, lambda: "4th delivery: %r" % seen)
    assert seen[3][1:] == (False, 1), seen
    check_gaps([seen[3][0] - failed], [0.3])
    wait_counts(ctl, {q: (0, 0), tier(q, "300ms"): (0, 0)})
    conn.close()
