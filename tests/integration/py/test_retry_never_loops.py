"""Never a hot loop: a requeue rebound cannot turn into a counted retry
still reaches the broker only once the delay of the tier its next attempt
would use has passed, so a consumer that fails a message forever sees it
about once per tier delay -- not thousands of times -- and rebound says so
(retry_requeue_delayed at warn, rebound_retry_requeues_delayed_total by
reason, requeues_delayed in /v1/status). Where rebound can do better than
a delayed requeue it does: a tier name that would pass 255 bytes is
shortened, a tier deleted under a connection is declared again and the
copy republished, so those messages get their exact max_attempts.

Every case runs a real pika consumer through rebound that nacks each
delivery with requeue=true, against the real broker."""
import http.client
import json
import re
import threading
import time

import pika

import rbtest
from retryhelp import (EARLY, Delivery, PoisonConsumer, check_gaps, count_of,
                       direct, dlq, pump, tier, wait_counts)

assert direct  # a fixture

# How long the looping cases let the consumer fail its message. Requeues
# passed straight through to the broker deliver one message 25,000-30,000
# times in this span here (ASan build, loaded machine).
RUN_S = 12.0
COUNT = "rebound-retry-count"


# ---- the admin endpoint ----------------------------------------------------


def admin_rebound(factory, *args):
    port = rbtest.free_port()
    rb = factory("--admin", "127.0.0.1:%d" % port, *args)
    rb.admin_port = port
    rbtest.wait_until(lambda: _get(port, "/healthz", quiet=True) is not None,
                      10, "the admin endpoint")
    return rb


def _get(port, path, quiet=False):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read().decode()
        c.close()
    except OSError:
        if quiet:
            return None
        raise
    assert r.status == 200, (path, r.status, body)
    return body


def status(rb):
    return json.loads(_get(rb.admin_port, "/v1/status"))


def metric(rb, name, **labels):
    """The value of one sample of /metrics (0 when it is not there)."""
    want = name + ("{%s}" % ",".join('%s="%s"' % kv for kv in labels.items())
                   if labels else "")
    for line in _get(rb.admin_port, "/metrics").splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def delayed_by_reason(rb):
    """{reason: count} of rebound_retry_requeues_delayed_total, the
    reasons at 0 left out."""
    out = {}
    pat = re.compile(r'^rebound_retry_requeues_delayed_total\{reason="'
                     r'((?:[^"\\]|\\.)*)"\} (\S+)$')
    for line in _get(rb.admin_port, "/metrics").splitlines():
        m = pat.match(line)
        if m and float(m.group(2)):
            out[m.group(1).replace('\\"', '"').replace("\\\\", "\\")] = \
                float(m.group(2))
    return out


def wait_delayed(rb, reasons, n):
    """rebound_retry_requeues_delayed_total comes to `n`, all under
    `reasons`; returns {reason: count}."""
    by = {}

    def done():
        by.clear()
        by.update(delayed_by_reason(rb))
        return sum(by.values()) >= n

    rbtest.wait_until(done, 5, lambda: "%d delayed requeues (metric: %r)" % (
        n, by), interval=0.1)
    assert set(by) <= set(reasons) and sum(by.values()) == n, (by, n)
    return by


# ---- a consumer that fails for RUN_S ---------------------------------------


class Watch:
    """Samples /v1/status and /metrics from a thread while the consumers
    fail their messages: the most requeues held back at once, per session
    and in total, and the gauge."""

    def __init__(self, rb):
        self.rb = rb
        self.session_max = 0
        self.total_max = 0
        self.gauge_max = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.2):
            doc = status(self.rb)
            self.total_max = max(self.total_max,
                                 doc.get("requeues_delayed", 0))
            for s in doc["sessions"]:
                self.session_max = max(self.session_max,
                                       s.get("requeues_delayed", 0))
            self.gauge_max = max(self.gauge_max,
                                 metric(self.rb, "rebound_requeues_delayed"))
            self.samples += 1

    def stop(self):
        self._stop.set()
        self._thread.join(10)

    def check(self, held):
        """At most `held` requeues were held back at once (all in one
        session), and that many were seen."""
        assert self.samples > 10, vars(self)
        assert self.session_max == held and self.total_max == held, \
            vars(self)
        assert self.gauge_max == held, vars(self)


def fail_for(conn, seconds, watch):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn.process_data_events(time_limit=0.05)
    watch.stop()


def assert_bounded(cons, delay, seconds=RUN_S, first=None):
    """Deliveries of `cons` (one message) over `seconds`: at most one per
    `delay` (plus the first delivery and one for the edges), and every
    failure waited at least `delay` before the next delivery (`first`:
    the delay after the first failure, when that one was a real retry).
    At least a third of the possible ones came: the requeue is not
    swallowed either."""
    n = len(cons.deliveries)
    most = int(seconds / delay) + 2
    assert n <= most, (
        "%d deliveries of one message in %.0f s with a %.1f s delay (at "
        "most %d): a hot loop" % (n, seconds, delay, most))
    least = int(seconds / delay / 3)
    assert n >= least, "only %d deliveries in %.0f s: the requeue is stuck" % (
        n, seconds)
    gaps = cons.gaps()
    want = [first if (first is not None and i == 0) else delay
            for i in range(len(gaps))]
    short = [(i, round(g, 3)) for i, (g, d) in enumerate(zip(gaps, want))
             if g < d - EARLY]
    assert not short, "redelivered before the tier delay: %r of %r" % (
        short, [round(g, 3) for g in gaps])
    return n


def assert_delayed_logged(rb, queue, reasons, delay_ms, seconds=RUN_S):
    """The warn line names the queue, a reason of `reasons` and the delay,
    and is rate-limited (one line per 10 s at most)."""
    lines = rb.log_lines("retry_requeue_delayed")
    assert lines, "no retry_requeue_delayed line; log tail:\n%s" % (
        rb.log()[-3000:])
    assert all(ln["level"] == "warn" for ln in lines), lines
    mine = [ln for ln in lines if ln["queue"] == queue]
    assert mine, lines
    assert mine[0]["reason"] in reasons, mine[0]
    assert mine[0]["delay_ms"] == str(delay_ms), mine[0]
    assert mine[0]["peer"] and mine[0]["id"] and mine[0]["note"], mine[0]
    assert len(lines) <= int(seconds / 10) + 1, lines
    if len(lines) > 1:
        assert int(lines[1]["unlogged"]) > 0, lines


def requeue_loop_result(ctl, direct, queues):
    """After the consumer left: every message still exists, back in its
    source queue (nothing lost), nothing in a dead-letter queue."""
    wait_counts(ctl, {q: (n, 0) for q, n in queues.items()}, timeout=20)
    for q in queues:
        assert not direct.exists(dlq(q)) or \
            direct.ch.queue_declare(dlq(q), passive=True) \
            .method.message_count == 0


# ---- requeues rebound cannot retry -----------------------------------------


def queue_with_one(direct, prefix, body):
    """A durable queue of the test's, holding one persistent message."""
    q = direct.own(rbtest.uniq(prefix))
    direct.ch.queue_declare(q, durable=True)
    direct.publish(q, body, pika.BasicProperties(delivery_mode=2))
    return q


def test_unreadable_retry_count_counts_as_a_first_attempt(
        rebound_factory, broker, ctl, direct):
    """A message whose rebound-retry-count is not a non-negative integer
    (the string "abc"; -1), or too large to plan with (5,000,000,000),
    cannot be counted from its header. It counts as
    a first attempt and its copy carries rebound's own count, so it still
    ends: exactly max_attempts deliveries, then the dead-letter queue --
    never a loop the broker's delivery limit would end by dropping it.
    Logged (retry_count_unreadable, rate-limited) and counted."""
    rb = admin_rebound(rebound_factory, "--retry-tiers", "200ms",
                       "--max-attempts", "3")
    qa = direct.own(rbtest.uniq("count-abc"))
    qn = direct.own(rbtest.uniq("count-neg"))
    qh = direct.own(rbtest.uniq("count-huge"))
    bad = ((qa, "abc"), (qn, -1), (qh, 5000000000))
    for q, v in bad:
        direct.ch.queue_declare(q, durable=True)
        direct.publish(q, b"bad count", pika.BasicProperties(
            headers={COUNT: v}, delivery_mode=2))
    conn = rb.pika(broker)
    cons = [PoisonConsumer(conn, conn.channel(), q) for q, _ in bad]
    for c in cons:
        c.wait(3, 20)
    late = cons[0].quiet_for(1.5)
    for c, (_, v) in zip(cons, bad):
        assert [d.count for d in c.deliveries] == [v, 1, 2], c.deliveries
    assert late == [] and all(len(c.deliveries) == 3 for c in cons)
    for c in cons:
        c.cancel()
    conn.close()
    wait_counts(ctl, dict([(q, (0, 0)) for q, _ in bad] +
                          [(dlq(q), (1, 0)) for q, _ in bad]))
    for q, _ in bad:
        got = direct.get_all(dlq(q), expect=1)
        assert [(b, p.headers[COUNT], p.headers["rebound-dead-letter-reason"])
                for _, p, b in got] == [(b"bad count", 3, "max-attempts")], got
    lines = rb.log_lines("retry_count_unreadable")
    assert lines and lines[0]["level"] == "warn", lines
    assert lines[0]["queue"] in (qa, qn, qh) and lines[0]["header"] == COUNT
    assert len(lines) == 1, lines  # the others within 10 s are not logged
    assert metric(rb, "rebound_retry_counts_unreadable_total") == 3
    assert delayed_by_reason(rb) == {}


class TxFailer:
    """Fails every delivery of `queue` inside a transaction: nack, then
    tx.commit (pika's consume generator, so that the blocking commit is
    not nested in a callback). Records like PoisonConsumer."""

    gaps = PoisonConsumer.gaps

    def __init__(self, ch, queue):
        self.ch = ch
        self.queue = queue
        self.deliveries = []
        self.failed_at = []
        self.commits = 0
        ch.basic_qos(prefetch_count=10)

    def run(self, seconds, watch):
        end = time.monotonic() + seconds
        for m, p, b in self.ch.consume(self.queue, inactivity_timeout=0.05):
            if m is not None:
                self.deliveries.append(Delivery(time.monotonic(), b, p, m,
                                                count_of(p)))
                self.ch.basic_nack(m.delivery_tag, requeue=True)
                self.failed_at.append(time.monotonic())
                self.ch.tx_commit()
                self.commits += 1
            if time.monotonic() >= end:
                watch.stop()
                return


def test_nack_in_a_transaction_is_a_counted_retry(rebound_factory, broker,
                                                  ctl, direct):
    """The consumer's channel is transactional (tx.select): each nack
    takes effect at its tx.commit. rebound copies the message as for any
    nack and sends its ack of the original on the client's channel, inside
    the transaction, before the client's commit (which waits behind it):
    exactly max_attempts deliveries, then the dead-letter queue; every
    commit answered, the channel open."""
    rb = admin_rebound(rebound_factory, "--retry-tiers", "200ms",
                       "--max-attempts", "3")
    q = queue_with_one(direct, "tx", b"in tx")
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.tx_select()
    cons = TxFailer(ch, q)
    watch = Watch(rb)
    cons.run(4.0, watch)
    assert [d.count for d in cons.deliveries] == [None, 1, 2], \
        cons.deliveries
    assert cons.commits == 3
    assert ch.is_open
    ch.cancel()
    conn.close()
    wait_counts(ctl, {q: (0, 0), dlq(q): (1, 0), tier(q, "200ms"): (0, 0)})
    got = direct.get_all(dlq(q), expect=1)
    assert [(b, p.headers[COUNT]) for _, p, b in got] == [(b"in tx", 3)], got
    assert len(rb.log_lines("retry_published")) == 2
    assert delayed_by_reason(rb) == {}


def test_rollback_after_a_retry_is_reported(rebound_factory, broker, ctl,
                                            direct):
    """A tx.rollback after a nack takes back rebound's ack of the original
    with the client's nack: the copy is in its tier and the original the
    client's again. rebound says so (retry_rolled_back at warn, counted)."""
    rb = admin_rebound(rebound_factory, "--retry-tiers", "1s",
                       "--max-attempts", "3")
    q = queue_with_one(direct, "txrb", b"rolled back")
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.tx_select()
    m, _, _ = ch.basic_get(q)
    ch.basic_nack(m.delivery_tag, requeue=True)
    ch.tx_rollback()
    line = rb.wait_log("retry_rolled_back", timeout=10)
    assert line["level"] == "warn" and line["originals"] == "1", line
    assert metric(rb, "rebound_retries_rolled_back_total") == 1
    conn.close()  # the original goes back to its queue
    wait_counts(ctl, {q: (2, 0)}, timeout=20)  # and the copy joins it


def test_dead_letter_queue_with_other_arguments_is_used_as_it_is(
        rebound_factory, broker, ctl, direct):
    """An operator declared <q>.dlq directly with other arguments
    (x-max-length 5). rebound's declare is refused (406, under both queue
    types), but the queue exists: dead letters go to it as it is
    (retry_queue_used_as_is at warn). The message ends there after exactly
    max_attempts deliveries; the operator's queue keeps its arguments."""
    rb = admin_rebound(rebound_factory, "--retry-tiers", "200ms",
                       "--max-attempts", "2")
    q = direct.own(rbtest.uniq("dlq406"))
    direct.ch.queue_declare(q, durable=True)
    direct.ch.queue_declare(dlq(q), durable=True,
                            arguments={"x-max-length": 5})
    direct.publish(q, b"dead end", pika.BasicProperties(delivery_mode=2))
    conn = rb.pika(broker)
    ch = conn.channel()
    cons = PoisonConsumer(conn, ch, q)
    cons.wait(2, 20)
    assert cons.quiet_for(2.0) == []
    assert [d.count for d in cons.deliveries] == [None, 1], cons.deliveries
    assert ch.is_open
    cons.cancel()
    conn.close()
    wait_counts(ctl, {q: (0, 0), dlq(q): (1, 0), tier(q, "200ms"): (0, 0)})
    line = rb.wait_log("retry_queue_used_as_is", timeout=1)
    assert line["queue"] == dlq(q) and line["level"] == "warn", line
    got = direct.get_all(dlq(q), expect=1)
    assert [(b, p.headers["rebound-dead-letter-reason"])
            for _, p, b in got] == [(b"dead end", "max-attempts")], got
    assert direct.declare_ok(dlq(q), arguments={"x-max-length": 5})
    assert delayed_by_reason(rb) == {}


def test_queue_name_of_255_bytes_gets_shortened_tier_and_dlq(
        rebound_factory, broker, ctl, direct):
    """A queue name of 255 bytes (the most AMQP allows), so that
    <q>.retry.200ms and <q>.dlq would pass the limit: rebound shortens
    its tier and dead-letter names deterministically (a prefix and a
    hash), so the message gets real counted retries -- exactly
    max_attempts deliveries, the tier's delays -- and then sits in the
    shortened DLQ with rebound's headers naming the real source queue. A
    second connection uses the same shortened names."""
    rb = rebound_factory("--retry-tiers", "200ms", "--max-attempts", "3")
    base = rbtest.uniq("long") + "-"
    q = direct.own(base + "x" * (255 - len(base)))
    assert len(q.encode()) == 255 and len(dlq(q).encode()) > 255

    def mine():
        return {n for n in ctl.queue_names() if n.startswith(base) and n != q}

    try:
        direct.ch.queue_declare(q, durable=True)
        direct.publish(q, b"long", pika.BasicProperties(delivery_mode=2))
        conn = rb.pika(broker)
        ch = conn.channel()
        cons = PoisonConsumer(conn, ch, q)
        cons.wait(3, timeout=8)
        counts = [d.count for d in cons.deliveries]
        assert counts == [None, 1, 2], counts
        # the dead-letter copy lands in one of rebound's queues
        found = {}

        def dead_lettered():
            found.clear()
            for n in mine():
                r = ctl.queue(n)
                if r and r[0] == 1:
                    found[n] = r
            return found

        rbtest.wait_until(dead_lettered, 10, lambda: "a queue named after "
                          "%s... holding the message (have %r)" % (
                              base, {n: ctl.queue(n) for n in mine()}))
        late = cons.quiet_for(0.8)
        cons.cancel()
        assert not late, "delivered after the dead-letter: %r" % (late,)
        check_gaps(cons.gaps(), [0.2, 0.2])
        names = mine()
        assert len(names) == 2, names  # one tier, one dead-letter queue
        assert all(len(n.encode()) <= 255 for n in names), names
        (dl_name,) = found
        got = direct.get_all(dl_name, expect=1)
        assert len(got) == 1, got
        h = got[0][1].headers
        assert h[COUNT] == 3 and h["rebound-source-queue"] == q, h
        assert h["rebound-dead-letter-reason"] == "max-attempts", h
        assert not rb.log_lines("retry_requeue_delayed")
        conn.close()

        # a second connection: one real retry through the same tier
        direct.publish(q, b"again", pika.BasicProperties(delivery_mode=2))
        conn = rb.pika(broker)
        ch = conn.channel()
        seen = []

        def on_message(chan, method, props, body):
            seen.append((props.headers or {}).get(COUNT))
            if len(seen) == 1:
                chan.basic_nack(method.delivery_tag, requeue=True)
            else:
                chan.basic_ack(method.delivery_tag)

        ch.basic_consume(q, on_message)
        pump(conn, lambda: len(seen) == 2, 5,
             lambda: "2 deliveries (%r)" % seen)
        assert seen == [None, 1], seen
        assert mine() == names, (mine(), names)
        conn.close()
        wait_counts(ctl, {q: (0, 0)})
    finally:
        for n in mine():
            direct.ch.queue_delete(n)


# ---- a tier deleted under a long-lived connection ---------------------------


def test_tier_deleted_under_the_connection_is_declared_again(
        rebound_factory, broker, ctl, direct):
    """Each time the message comes back from its tier, an operator deletes
    that tier directly, while the consumer's connection (and rebound's
    memory of having declared it) lives on. The next copy is unroutable;
    rebound declares the tier again and republishes it, so the failures
    stay counted retries: exactly max_attempts (4) deliveries at the tier
    delays, then the message sits in the DLQ."""
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "4")
    q = direct.own(rbtest.uniq("tier-gone"))
    direct.ch.queue_declare(q, durable=True)
    conn = rb.pika(broker)
    ch = conn.channel()
    deleted = []

    class Deleting(PoisonConsumer):
        def _on_message(self, chan, method, props, body):
            if method.routing_key == q and props.headers and \
                    COUNT in props.headers:
                direct.ch.queue_delete(tier(q, "300ms"))
                deleted.append(props.headers[COUNT])
            super()._on_message(chan, method, props, body)

    cons = Deleting(conn, ch, q)
    direct.publish(q, b"tier gone", pika.BasicProperties(delivery_mode=2))
    cons.wait(4, timeout=10)
    # then until nothing comes for longer than a tier delay
    deadline = time.monotonic() + 15
    while cons.quiet_for(0.8) and time.monotonic() < deadline:
        pass
    cons.cancel()
    counts = [d.count for d in cons.deliveries]
    assert counts == [None, 1, 2, 3], counts
    wait_counts(ctl, {dlq(q): (1, 0)}, timeout=10)
    assert deleted == [1, 2, 3], deleted
    check_gaps(cons.gaps(), [0.3, 0.3, 0.3])
    assert not rb.log_lines("retry_requeue_delayed")
    # the copies after deliveries 2 and 3 found their tier gone; the 4th
    # delivery's failure goes to the DLQ, not to the deleted tier
    assert len(rb.log_lines("retry_republished")) == 2
    got = direct.get_all(dlq(q), expect=1)
    assert len(got) == 1 and got[0][1].headers[COUNT] == 4, got
    conn.close()
    wait_counts(ctl, {q: (0, 0)})
