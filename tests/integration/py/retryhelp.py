"""Helpers for rebound's retry acceptance tests (test_retry_*.py): real
pika consumers through rebound, a direct connection to the broker to look at
(and clean up) what rebound declared, and the broker's queue counters.

Timing: every wait here has a deadline; nothing sleeps to assert.
"""
import time
from collections import namedtuple
from datetime import datetime, timedelta, timezone

import pika
import pika.compat
import pika.exceptions
import pytest

import rbtest

# Tier accuracy tolerance used by every timing assertion of these tests:
# a redelivery must arrive no earlier than (delay - EARLY) and no later than
# (delay + LATE) after the failure that sent it to the tier. The broker
# expires a tier's head on a timer; LATE covers its timer, the TTL hop back
# to the source queue, rebound under ASan and a loaded CI machine.
EARLY = 0.05
LATE = 0.6
# Where rebound's own part of a gap is measured apart (its log's
# retry_published latency: from the client's nack to the copy's confirm,
# held to LATE), the rest of the gap is the broker's: a tier's TTL expiry
# and the dead-letter hop back, which a loaded broker has been seen to run
# 0.9 s late.
BROKER_LATE = 2.0

PREFIX = "rebound-"

Delivery = namedtuple("Delivery", "t body props method count")


def is_long(v):
    """True when pika decoded the value from field type 'l' (int64)."""
    return type(v) is pika.compat.long


def tier(queue, delay):
    return "%s.retry.%s" % (queue, delay)


def dlq(queue):
    return queue + ".dlq"


def count_of(props, prefix=PREFIX):
    h = props.headers or {}
    return h.get(prefix + "retry-count")


# ---- the broker, directly --------------------------------------------------


class Direct:
    """A pika connection straight to the broker (not through rebound), for
    declaring, inspecting and deleting queues. Every queue of a name given
    to own() -- and every queue starting with that name and a dot (tiers,
    dead-letter queue) -- is deleted at teardown."""

    def __init__(self, broker, ctl):
        self.broker = broker
        self.ctl = ctl
        self.owned = []
        self.conn = pika.BlockingConnection(pika.URLParameters(
            broker.url + "?connection_attempts=3&socket_timeout=10"))
        self.ch = self.conn.channel()

    def own(self, *names):
        self.owned.extend(names)
        return names[0] if len(names) == 1 else names

    def channel(self):
        return self.conn.channel()

    def publish(self, queue, body, props=None, exchange=""):
        ch = self.conn.channel()
        ch.confirm_delivery()
        ch.basic_publish(exchange, queue, body, props or pika.BasicProperties(),
                         mandatory=True)
        ch.close()

    def get_all(self, queue, timeout=10, expect=None):
        """basic.get (auto-ack) every message of `queue`: [(method, props,
        body)]. With `expect`, waits up to `timeout` until that many came."""
        out = []
        deadline = time.monotonic() + timeout
        ch = self.conn.channel()
        try:
            while True:
                m, p, b = ch.basic_get(queue, auto_ack=True)
                if m is not None:
                    out.append((m, p, b))
                    continue
                if expect is None or len(out) >= expect or \
                        time.monotonic() >= deadline:
                    return out
                self.conn.sleep(0.05)
        finally:
            if ch.is_open:
                ch.close()

    def declare_ok(self, queue, durable=True, arguments=None):
        """True when redeclaring `queue` with exactly these properties is
        accepted by the broker (queue arguments are immutable: anything
        else is 406 PRECONDITION_FAILED)."""
        return declare_or(self.conn, 406, queue, durable=durable,
                          arguments=arguments) is not None

    def exists(self, queue):
        ch = self.conn.channel()
        try:
            ch.queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as e:
            if e.reply_code == 404:
                return False
            raise
        ch.close()
        return True

    def cleanup(self):
        names = set(self.owned)
        try:
            for q in self.ctl.queue_names():
                if any(q.startswith(n + ".") for n in self.owned):
                    names.add(q)
        except AssertionError:
            pass
        try:
            ch = self.conn.channel()
            for q in sorted(names):
                ch.queue_delete(q)
            self.conn.close()
        except Exception:  # teardown after a broken test: best effort
            pass


@pytest.fixture
def direct(broker, ctl):
    d = Direct(broker, ctl)
    yield d
    d.cleanup()


def queues(ctl):
    """{name: (ready, unacked, consumers)} of every queue, in one
    rabbitmqctl call."""
    out = {}
    for r in ctl._rows("list_queues", "name", "messages_ready",
                       "messages_unacknowledged", "consumers"):
        try:
            out[r[0]] = (int(r[1]), int(r[2]), int(r[3]))
        except ValueError:  # a name that broke the row: not ours
            continue
    return out


def wait_counts(ctl, expected, timeout=20):
    """Wait until each queue in `expected` ({name: (ready, unacked)})
    exists with those counts; returns the last snapshot."""
    last = {}

    def ok():
        last.clear()
        last.update(queues(ctl))
        return all(n in last and last[n][:2] == tuple(v)
                   for n, v in expected.items())

    rbtest.wait_until(ok, timeout, lambda: "queue counts %r; broker has %r" % (
        expected, {n: last.get(n) for n in expected}), interval=0.2)
    return last


def related(ctl, queue):
    """Names of the broker's queues that start with `queue` + '.'."""
    return {q for q in ctl.queue_names() if q.startswith(queue + ".")}


# ---- consuming through rebound ---------------------------------------------


def pump(conn, until, timeout, what):
    """Run pika's I/O loop until `until()` is true; fail after `timeout`
    seconds with `what` (str or callable)."""
    deadline = time.monotonic() + timeout
    while not until():
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("timed out after %.1fs waiting for %s" % (
                timeout, what() if callable(what) else what))
        conn.process_data_events(time_limit=min(0.05, left))


class PoisonConsumer:
    """A pika consumer that fails every delivery of `queue` (nack or
    reject with requeue=true), recording when each delivery arrived and
    when its failure was sent."""

    def __init__(self, conn, ch, queue, how="nack", prefix=PREFIX):
        self.conn = conn
        self.ch = ch
        self.queue = queue
        self.how = how
        self.prefix = prefix
        self.deliveries = []  # Delivery
        self.failed_at = []   # monotonic time right after the nack/reject
        ch.basic_qos(prefetch_count=10)
        self.tag = ch.basic_consume(queue, self._on_message)

    def _on_message(self, ch, method, props, body):
        self.deliveries.append(Delivery(time.monotonic(), body, props, method,
                                        count_of(props, self.prefix)))
        if self.how == "reject":
            ch.basic_reject(method.delivery_tag, requeue=True)
        else:
            ch.basic_nack(method.delivery_tag, requeue=True)
        self.failed_at.append(time.monotonic())

    def wait(self, n, timeout):
        pump(self.conn, lambda: len(self.deliveries) >= n, timeout,
             lambda: "%d deliveries of %s (got %d)" % (
                 n, self.queue, len(self.deliveries)))

    def quiet_for(self, seconds):
        """Keep consuming for `seconds`; returns the deliveries that came
        meanwhile (there should be none)."""
        before = len(self.deliveries)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.conn.process_data_events(time_limit=0.05)
        return self.deliveries[before:]

    def gaps(self):
        """Seconds from each failure to the next delivery."""
        return [self.deliveries[i + 1].t - self.failed_at[i]
                for i in range(len(self.deliveries) - 1)]

    def cancel(self):
        self.ch.basic_cancel(self.tag)


def check_gaps(gaps, delays, early=EARLY, late=LATE):
    assert len(gaps) == len(delays), (gaps, delays)
    bad = [(i, round(g, 3), d) for i, (g, d) in enumerate(zip(gaps, delays))
           if not (d - early <= g <= d + late)]
    assert not bad, ("gaps between failure and next delivery %r, expected "
                     "%r each within [-%.0f ms, +%.0f ms]; out of bounds: %r"
                     % ([round(g, 3) for g in gaps], delays, early * 1000,
                        late * 1000, bad))


def wall_now():
    return datetime.now(timezone.utc).replace(tzinfo=None)


def delay_seconds(d):
    """'300ms' / '1s' / '2m' -> seconds (float)."""
    for suffix, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if d.endswith(suffix) and d[:-len(suffix)].isdigit():
            return int(d[:-len(suffix)]) * scale
    raise ValueError(d)


def tier_for_failure(tiers, k):
    """The tier (its name suffix) the failure of attempt k goes to."""
    return tiers[min(k, len(tiers)) - 1]


def expected_gaps(tiers, max_attempts):
    return [delay_seconds(tier_for_failure(tiers, k))
            for k in range(1, max_attempts)]


# ---- the poison-message run (tests 1, 7 and the config file's) -----------

APP_HEADERS = {
    "app": "orders",
    "n": 42,
    "neg": -7,
    "big": 2 ** 40 + 3,
    "flag": True,
    "text": "h\u00e9llo",
    "nested": {"a": [1, "two", False], "k": "v"},
    "raw": b"\xce\x00\xce",
}


def poison_props():
    return pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8",
        headers=dict(APP_HEADERS), delivery_mode=2, priority=7,
        correlation_id="corr-1", reply_to="replies", message_id="msg-1",
        timestamp=1700000000, type="order.created", user_id="guest",
        app_id="rebound-tests")


PROPS = ("content_type", "content_encoding", "delivery_mode", "priority",
         "correlation_id", "reply_to", "message_id", "timestamp", "type",
         "user_id", "app_id", "expiration", "cluster_id")


def assert_props_kept(got, want, prefix="rebound-"):
    for name in PROPS:
        assert getattr(got, name) == getattr(want, name), \
            "property %s: %r, published %r" % (name, getattr(got, name),
                                               getattr(want, name))
    kept = {k: v for k, v in (got.headers or {}).items()
            if not k.startswith(prefix) and not k.startswith("x-")}
    assert kept == (want.headers or {})


def run_poison(rb, broker, ctl, direct, queue_args, tiers, max_attempts,
               how="nack", body=b'{"order": 1, "poison": true}', props=None,
               prefix="rebound-", dead_letter=None):
    """Publish one message through a named exchange to a fresh queue,
    fail every delivery through rebound, and check: exactly max_attempts
    deliveries, the gaps, every delivery's headers, the dead-letter copy,
    and that the source and tier queues drain to 0. Returns (queue,
    gaps)."""
    q = direct.own(rbtest.uniq("poison"))
    dl_name = (dead_letter or "{queue}.dlq").replace("{queue}", q)
    direct.own(dl_name)
    x = rbtest.uniq("poison-x")
    rk = "rk." + q
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.exchange_declare(x, "direct", auto_delete=True)
    ch.queue_declare(q, durable=True, arguments=queue_args)
    ch.queue_bind(q, x, rk)
    ch.confirm_delivery()
    props = props or poison_props()
    # AMQP timestamps are whole seconds, and rebound's clock may read a tick
    # behind ours at a second boundary: compare from the whole second before
    started = (wall_now() - timedelta(seconds=1)).replace(microsecond=0)
    ch.basic_publish(x, rk, body, props, mandatory=True)

    delays = expected_gaps(tiers, max_attempts)
    cons = PoisonConsumer(conn, ch, q, how=how, prefix=prefix)
    cons.wait(max_attempts, timeout=sum(delays) + 5 + len(delays) * LATE)
    # ...and not one delivery more: wait for the dead-letter copy, then
    # keep consuming a while longer
    wait_counts(ctl, {dl_name: (1, 0)}, timeout=10)
    late = cons.quiet_for(min(max(delays or [0]), 1.5) + 0.3)
    assert not late, "delivered again after the dead-letter: %r" % (late,)
    ended = wall_now() + timedelta(seconds=1)
    d = cons.deliveries
    assert len(d) == max_attempts, [x.count for x in d]

    # every delivery: the same body, properties, app headers; the count
    # says how many failures came before; the origin stays the first one
    for k, dv in enumerate(d):
        assert dv.body == body
        assert_props_kept(dv.props, props, prefix)
        h = dv.props.headers
        assert dv.method.redelivered is False  # a new copy, not a requeue
        if k == 0:
            assert not any(n.startswith(prefix) for n in h), h
            assert dv.method.exchange == x and dv.method.routing_key == rk
            continue
        assert h[prefix + "retry-count"] == k, (k, h)
        assert is_long(h[prefix + "retry-count"])
        assert h[prefix + "source-queue"] == q
        assert h[prefix + "original-exchange"] == x
        assert h[prefix + "original-routing-key"] == rk
        assert prefix + "dead-letter-reason" not in h
        # it came back through the right tier (the broker's x-death says so)
        death = h["x-death"][0]
        assert death["reason"] == "expired", death
        assert death["queue"] == tier(q, tier_for_failure(tiers, k)), death
        assert dv.method.exchange == "" and dv.method.routing_key == q

    gaps = cons.gaps()
    own = [int(x["latency_us"]) / 1e6 for x in rb.log_lines("retry_published")]
    assert len(own) == len(delays), own  # one copy per gap; then the DLQ
    assert max(own, default=0) <= LATE, ("rebound took too long from a nack "
                                         "to its copy's confirm", own)
    check_gaps(gaps, delays, late=BROKER_LATE)
    cons.cancel()

    # the parking lot: exactly one copy, everything intact plus rebound's
    got = direct.get_all(dl_name, expect=1)
    assert len(got) == 1, got
    m, p, b = got[0]
    assert b == body
    assert_props_kept(p, props, prefix)
    h = p.headers
    assert h[prefix + "retry-count"] == max_attempts
    assert is_long(h[prefix + "retry-count"])
    assert h[prefix + "source-queue"] == q
    assert h[prefix + "dead-letter-reason"] == "max-attempts"
    assert h[prefix + "original-exchange"] == x
    assert h[prefix + "original-routing-key"] == rk
    first = h[prefix + "first-failed-at"]
    last = h[prefix + "last-failed-at"]
    assert isinstance(first, datetime) and isinstance(last, datetime)
    assert started <= first <= last <= ended, (started, first, last, ended)
    # first is kept from the first failure: the retry span lies between
    span = (last - first).total_seconds()
    assert sum(delays) - 2 <= span <= sum(delays) + 2, (span, delays)
    for dv in d[1:]:
        assert dv.props.headers[prefix + "first-failed-at"] == first

    # every queue drains: source, tiers, DLQ (emptied by the get above)
    expect = {q: (0, 0), dl_name: (0, 0)}
    for k in range(1, max_attempts):
        expect[tier(q, tier_for_failure(tiers, k))] = (0, 0)
    snap = wait_counts(ctl, expect)
    mine = {n: v for n, v in snap.items() if n.startswith(q + ".")}
    assert set(mine) == set(expect) - {q}, mine  # nothing else declared
    conn.close()
    return q, gaps


def ready(source, name):
    """Messages ready in `name` now, from its leader (a passive declare's
    declare-ok: rabbitmqctl's figures for a quorum queue lag by up to 5 s);
    None when there is no such queue. `source` has a channel() method (a
    pika connection, or retryhelp.Direct)."""
    ok = declare_or(source, 404, name, passive=True)
    return ok.method.message_count if ok else None


def declare_or(source, code, queue, **kw):
    """queue.declare on a fresh channel of `source`: its declare-ok, or None
    when the broker closes the channel with reply `code` (any other
    refusal is raised)."""
    ch = source.channel()
    try:
        ok = ch.queue_declare(queue, **kw)
    except pika.exceptions.ChannelClosedByBroker as e:
        if e.reply_code == code:
            return None
        raise
    ch.close()
    return ok
