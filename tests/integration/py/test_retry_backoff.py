"""Exponential backoff with jitter (README, "Backoff"): a policy written
as `backoff: {initial, multiplier, max, jitter, buckets}` spreads each
attempt's delay over `buckets` tier queues around the attempt's base
delay, every tier a queue-level TTL. Real pika consumer, real broker.

Checked: the delay each copy was given (its tier, from rebound's log)
lies within base * (1 +- jitter); the measured gap from the failure to
the next delivery is at least that delay (less retryhelp.EARLY) and at
most that delay plus retryhelp.BROKER_LATE; the tier queues declared are
the README's levels x buckets names, each with its TTL, and no others.
"""
import collections

import rbtest
from retryhelp import (BROKER_LATE, EARLY, PoisonConsumer, delay_seconds,
                       direct, dlq, wait_counts)

assert direct  # a fixture

INITIAL, MULT, MAX, JITTER, BUCKETS = 0.2, 2, 0.8, 0.25, 4
MAX_ATTEMPTS = 5
BASES = [0.2, 0.4, 0.8]  # levels: initial * 2^L up to max, < max_attempts


def bucket_delays(base):
    """The README's bucket delays of a level, in ms (rounded as rebound)."""
    return [int(base * 1000 * (1 + JITTER * ((2 * b + 1) / BUCKETS - 1))
                + 0.5) for b in range(BUCKETS)]


def config(tmp_path, q):
    p = tmp_path / "backoff.yaml"
    p.write_text(
        "retry:\n  policies:\n"
        "    - queues: [%s]\n      max_attempts: %d\n"
        "      backoff: {initial: 200ms, multiplier: 2, max: 800ms, "
        "jitter: 0.25, buckets: 4}\n" % (q, MAX_ATTEMPTS))
    return str(p)


def test_backoff_delays_stay_within_the_jitter(rebound_factory, broker, ctl,
                                               direct, tmp_path):
    """Six poison messages, each failed on every delivery: exactly
    max_attempts deliveries each, every delay within its level's jitter
    bounds and observed as such, then the dead-letter queue; the tier
    queues are at most levels x buckets (12), named and TTL'd as the
    README says."""
    q = direct.own(rbtest.uniq("backoff"))
    direct.own(dlq(q))
    rb = rebound_factory("--config", config(tmp_path, q))
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    bodies = [b"p%d" % i for i in range(6)]
    for b in bodies:
        ch.basic_publish("", q, b)
    cons = PoisonConsumer(conn, ch, q)
    cons.wait(len(bodies) * MAX_ATTEMPTS, timeout=30)
    assert not cons.quiet_for(1.0)
    cons.cancel()
    conn.close()

    by_tag = {int(l["delivery_tag"]): l["target"]
              for l in rb.log_lines("retry_published")}
    per_body = collections.defaultdict(list)
    for i, d in enumerate(cons.deliveries):
        per_body[d.body].append(i)
    assert sorted(per_body) == bodies
    used = set()
    for body, idx in per_body.items():
        assert len(idx) == MAX_ATTEMPTS, (body, len(idx))
        for k, (i, nxt) in enumerate(zip(idx, idx[1:])):
            target = by_tag[cons.deliveries[i].method.delivery_tag]
            assert target.startswith(q + ".retry."), target
            ms = int(delay_seconds(target[len(q) + 7:]) * 1000 + 0.5)
            base = BASES[min(k, len(BASES) - 1)]
            assert ms in bucket_delays(base), (body, k, target)
            assert base * (1 - JITTER) <= ms / 1000 <= base * (1 + JITTER)
            gap = cons.deliveries[nxt].t - cons.failed_at[i]
            assert ms / 1000 - EARLY <= gap <= ms / 1000 + BROKER_LATE, \
                (body, k, target, round(gap, 3))
            used.add(target)
    # 24 draws over 3 levels of 4 buckets: more tiers than levels in use
    assert len(used) > len(BASES), used

    wait_counts(ctl, {q: (0, 0), dlq(q): (len(bodies), 0)})
    declared = {n for n in ctl.queue_names() if n.startswith(q + ".retry.")}
    allowed = {"%s.retry.%dms" % (q, ms) if ms % 1000 else
               "%s.retry.%ds" % (q, ms // 1000)
               for base in BASES for ms in bucket_delays(base)}
    assert len(allowed) == len(BASES) * BUCKETS
    assert declared == used and declared <= allowed, (declared, allowed)
    for name in declared:
        ms = int(delay_seconds(name[len(q) + 7:]) * 1000 + 0.5)
        assert direct.declare_ok(name, durable=True, arguments={
            "x-queue-type": "quorum", "x-message-ttl": ms,
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": q,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish"}), name
        wait_counts(ctl, {name: (0, 0)})


def test_backoff_shown_in_status(rebound_factory, tmp_path):
    """/v1/status shows the backoff as written and every tier it compiled
    to, so what is in effect can be read from rebound."""
    import json
    from test_admin import admin_rebound, get
    rb = admin_rebound(rebound_factory, "--config", config(tmp_path, "bk*"))
    status, _, body = get(rb.admin_port, "/v1/status")
    assert status == 200
    pol = json.loads(body)["config"]["retry"]["policies"][0]
    assert pol["backoff"] == {"initial": "200ms", "max": "800ms",
                              "multiplier": 2, "jitter": 0.25, "buckets": 4}
    want = [b for base in BASES for b in bucket_delays(base)]
    assert [int(delay_seconds(t) * 1000 + 0.5) for t in pol["tiers"]] == want
    assert pol["max_attempts"] == MAX_ATTEMPTS
