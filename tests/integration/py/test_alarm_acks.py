"""A broker memory or disk alarm does not stop a consumer's acks through
rebound.

RabbitMQ blocks a connection (stops reading it) at its first publish once
a resource alarm is raised. rebound's retry copies are publishes: carried
on the client's own upstream connection, one nack during an alarm would
block that whole connection, and with it every ack the consumer sends
after it, for as long as the alarm lasts. rebound publishes its copies on
a separate upstream connection per client connection (--retry-connection
separate, the default), so only that publisher connection is blocked:
the consumer's acks keep reaching the broker, the blocked state is shown
(upstream_blocked / upstream_unblocked in the log, the
rebound_upstream_blocked gauge and rebound_upstream_blocks_total,
"blocked" in /v1/status), and the copies held up by the alarm are neither
timed out nor lost: they finish once it clears.

Uses a private RabbitMQ node: an alarm blocks every publisher of the
node. Real pika consumers, one through rebound and one straight to the
broker as the control."""
import functools
import time

import pika
import pytest

import rbtest
from retryhelp import pump, queues, tier, wait_counts
from test_hardening_alarm import private_broker
from test_retry_never_loops import _get, admin_rebound, metric, status

assert private_broker  # a fixture

N = 200            # messages per queue
NACK_EVERY = 10    # the consumer through rebound fails every 10th message once
PREFETCH = 50      # room for all N / NACK_EVERY copies the alarm holds up
ALARM_S = 15.0
TIERS = "1s"
COUNT = "rebound-retry-count"


def alarms(pb):
    return pb.ctl("eval", "rabbit_alarm:get_alarms().")


# How each alarm is raised and cleared: rabbitmqctl's command and values.
ALARMS = {"memory": ("set_vm_memory_high_watermark", "0.000001", "0.4"),
          "disk": ("set_disk_free_limit", "1000000000000", "50000000")}


def set_alarm(pb, kind, alarmed):
    cmd, raise_, clear = ALARMS[kind]
    pb.ctl(cmd, raise_ if alarmed else clear)
    rbtest.wait_until(lambda: (kind in alarms(pb)) == alarmed, 30,
                      "the broker's %s alarm to be %s"
                      % (kind, "raised" if alarmed else "cleared"),
                      interval=0.3)


def depth(snap, name):
    ready, unacked, _ = snap[name]
    return ready + unacked


class Sampler:
    """The blocked state as rebound shows it, sampled now and then."""

    def __init__(self, rb):
        self.rb = rb
        self.gauge = []
        self.status = []
        self.gauge_present = False
        self.unanswered = 0

    def sample(self):
        if self.unanswered:
            return  # each try waits 5 s: once is enough
        try:
            self._sample()
        except OSError:
            self.unanswered += 1

    def _sample(self):
        text = _get(self.rb.admin_port, "/metrics")
        self.gauge_present |= any(l.startswith("rebound_upstream_blocked ")
                                  for l in text.splitlines())
        self.gauge.append(metric(self.rb, "rebound_upstream_blocked"))
        self.status.append(status(self.rb).get("blocked"))


# Both alarms; a consumer that acks each delivery alone and one that acks
# with multiple=1 (which covers the deliveries it nacked: rebound must send
# it around the retries that wait for the alarm, not hold it).
@pytest.mark.parametrize("kind,ack", [("memory", "single"),
                                      ("memory", "multiple"),
                                      ("disk", "multiple")])
def test_acks_keep_flowing_under_an_alarm(rebound_factory, private_broker,
                                          kind, ack):
    pb = private_broker
    q = rbtest.uniq("alarm-acks")
    control = rbtest.uniq("alarm-control")
    # a copy held up by the alarm must not time out either: the confirm
    # timeout is far shorter than the alarm
    rb = admin_rebound(functools.partial(rebound_factory, upstream=pb.addr),
                       "--retry-queues", q, "--retry-tiers", TIERS,
                       "--max-attempts", "3", "--retry-confirm-timeout", "5s",
                       "--retry-connection", "separate")

    setup = pika.BlockingConnection(pika.URLParameters(pb.url))
    sch = setup.channel()
    for name in (q, control):
        sch.queue_declare(name, durable=True)
    sch.confirm_delivery()
    for i in range(N):
        for name in (q, control):
            sch.basic_publish("", name, b"m-%d" % i,
                              pika.BasicProperties(message_id=str(i)))
    setup.close()

    conn = rb.pika(pb)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=PREFETCH)
    # one retry before the alarm, so rebound's publisher is in use when
    # the alarm comes: message 0 fails once through basic.get
    m, p, _ = ch.basic_get(q)
    assert m is not None and p.message_id == "0"
    ch.basic_nack(m.delivery_tag, requeue=True)
    rb.wait_log("retry_published", timeout=10)
    upstreams_before = len(rb.upstream_sockets())
    wait_counts(pb, {q: (N, 0), tier(q, TIERS): (0, 0)}, timeout=20)

    deliveries = {}   # message id -> [count header of each delivery]
    nacked = set()
    acked = set()
    direct_acked = set()

    def on_rebound(chan, method, props, body):
        i = int(props.message_id)
        count = (props.headers or {}).get(COUNT)
        deliveries.setdefault(i, []).append(count)
        if count is None and i % NACK_EVERY == NACK_EVERY - 1:
            chan.basic_nack(method.delivery_tag, requeue=True)
            nacked.add(i)
        else:
            chan.basic_ack(method.delivery_tag, multiple=ack == "multiple")
            acked.add(i)

    dconn = pika.BlockingConnection(pika.URLParameters(pb.url))
    dch = dconn.channel()
    dch.basic_qos(prefetch_count=PREFETCH)

    def on_direct(chan, method, props, body):
        chan.basic_ack(method.delivery_tag)
        direct_acked.add(int(props.message_id))

    sampler = Sampler(rb)
    sampler.sample()
    blocked_before = sampler.gauge[-1]
    alarmed = False
    try:
        set_alarm(pb, kind, True)
        alarmed = True
        t_alarm = time.monotonic()
        ch.basic_consume(q, on_rebound)
        dch.basic_consume(control, on_direct)
        next_sample = 0.0
        while time.monotonic() - t_alarm < ALARM_S:
            conn.process_data_events(time_limit=0.02)
            dconn.process_data_events(time_limit=0.02)
            if time.monotonic() >= next_sample:
                sampler.sample()
                next_sample = time.monotonic() + 0.5
        # what the broker saw acked while the alarm was on
        snap = queues(pb)
        during = {"rebound": N - depth(snap, q),
                  "direct": N - depth(snap, control),
                  "rebound_client_acks": len(acked),
                  "rebound_nacks": len(nacked),
                  "rebound_deliveries": sum(map(len, deliveries.values())),
                  "admin_unanswered": sampler.unanswered}
        blocked_lines = rb.log_lines("upstream_blocked")
        fallbacks_during = rb.log_lines("retry_fallback")
        set_alarm(pb, kind, False)
        alarmed = False
        t_clear = time.monotonic()
    finally:
        if alarmed:
            pb.ctl(ALARMS[kind][0], ALARMS[kind][2])
    print("alarm %.0fs: acks the broker saw via rebound %d, direct %d; "
          "%r; gauge %r; status blocked %r; rebound upstream sockets "
          "before the alarm %d"
          % (ALARM_S, during["rebound"], during["direct"], during,
             sorted(set(sampler.gauge)), sorted(set(map(str, sampler.status))),
             upstreams_before))

    # the promise: the consumer's acks reach the broker during the alarm,
    # about as well as a direct consumer's do (of the messages it does not
    # fail: those wait for the alarm, unacked)
    assert during["direct"] > 0, during
    fair = during["direct"] * (NACK_EVERY - 1) / NACK_EVERY
    assert during["rebound"] > 0 and during["rebound"] >= fair * 0.9, (
            "acks through rebound stopped under the %s alarm: the "
            "broker saw %d of them in %.0f s, %d of the direct consumer's "
            "(%r)" % (during["rebound"], ALARM_S, during["direct"], during))
    assert not fallbacks_during, fallbacks_during
    assert not sampler.unanswered, \
        "rebound's admin endpoint did not answer during the alarm"

    # the blocked state was visible while the alarm lasted
    assert blocked_before == 0, blocked_before
    assert blocked_lines, "no upstream_blocked line during the alarm"
    line = blocked_lines[0]
    assert line.get("level") == "warn", line
    assert line.get("id") and line.get("peer"), line
    assert kind in line.get("reason", ""), line
    assert sampler.gauge_present, "no rebound_upstream_blocked in /metrics"
    assert max(sampler.gauge) >= 1, sampler.gauge
    assert max(s or 0 for s in sampler.status) >= 1, sampler.status

    # after the alarm every failed message comes back once from its tier,
    # counted, and is acked; nothing is lost
    everything = set(range(N))
    pump(conn, lambda: acked == everything and all(
        deliveries.get(i, []).count(1) >= 1 for i in nacked), 60,
        lambda: "every message acked (missing %r) and every nacked one back "
        "with count 1 (not yet: %r)" % (
            sorted(everything - acked)[:20],
            sorted(i for i in nacked if 1 not in deliveries.get(i, []))[:20]))
    t_done = time.monotonic()
    end = time.monotonic() + 2.0  # a late second copy would show up here
    while time.monotonic() < end:
        conn.process_data_events(time_limit=0.05)
    print("after the alarm: all %d acked %.1f s after it cleared; %d nacked "
          "during it" % (N, t_done - t_clear, len(nacked)))
    assert len(nacked) == N // NACK_EVERY, sorted(nacked)
    odd = {i: d for i, d in deliveries.items()
           if d != ([None, 1] if i in nacked else [None])
           and not (i == 0 and d == [1])}
    assert not odd, (
        "%d messages were not delivered once, or once and once more from "
        "the tier with count 1; e.g. (count header of each delivery): %s"
        % (len(odd), "; ".join("%d: %r" % (i, odd[i])
                               for i in sorted(odd)[:5])))
    assert not rb.log_lines("retry_fallback")
    assert not rb.log_lines("retry_abandoned")
    wait_counts(pb, {q: (0, 0), tier(q, TIERS): (0, 0),
                     control: (0, 0)}, timeout=20)

    # and the blocked state is gone
    rb.wait_log("upstream_unblocked", timeout=10)
    unblocked = rb.log_lines("upstream_unblocked")[0]
    assert unblocked.get("level") == "info", unblocked
    assert unblocked.get("id") == line.get("id"), (unblocked, line)
    rbtest.wait_until(lambda: metric(rb, "rebound_upstream_blocked") == 0,
                      10, "rebound_upstream_blocked back to 0")
    assert status(rb).get("blocked") == 0, status(rb)
    assert metric(rb, "rebound_upstream_blocks_total") >= 1

    dconn.close()
    ch.queue_delete(q)
    ch.queue_delete(tier(q, TIERS))
    ch.queue_delete(control)
    conn.close()
