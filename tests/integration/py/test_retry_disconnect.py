"""A consumer that goes away with retries pending loses
nothing (rebound finishes the pending publish+confirm+ack before
closing upstream), closing the channel right after a nack waits for the
retry, and a rebound told to
stop (SIGTERM) in the middle of a burst of retries neither loses nor
duplicates a message. Real pika clients, real broker, real rebound."""
import signal
import subprocess
import sys
import textwrap
import time

import pika

import rbtest
from retryhelp import direct, dlq, pump, tier, wait_counts

assert direct  # a fixture

CHILD = textwrap.dedent("""
    import os, signal, sys, pika
    host, port, queue = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    want, nack = int(sys.argv[4]), int(sys.argv[5])
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host=host, port=port, credentials=pika.PlainCredentials(sys.argv[6], sys.argv[7])))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    tags = []
    gen = ch.consume(queue, inactivity_timeout=10)
    for m, p, b in gen:
        assert m is not None, "no delivery in 10 s"
        tags.append(m.delivery_tag)
        if len(tags) == want:
            break
    # the nacks go out at once, then the consumer dies without a word,
    # holding the rest unsettled
    for t in tags[:nack]:
        ch.basic_nack(t, requeue=True)
    print("nacked", nack, "of", len(tags), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_consumer_killed_with_retries_pending_loses_nothing(
        rebound_factory, broker, ctl, direct):
    """A consumer holds all 300 messages, nacks 200 of them (requeue) in
    one burst and is SIGKILLed right after. rebound logs that the client
    left with retries pending and finishes them (or, on a loaded machine,
    had finished them all before it saw the client go: the outcome must be
    the same; session tests cover the pending path frame by frame). A new
    consumer then gets
    every one of the 300 messages exactly once: the 200 through the tier
    (count 1), the 100 never settled requeued by the broker."""
    n, nacked = 300, 200
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "4")
    q = direct.own(rbtest.uniq("killed"))
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    for i in range(n):
        ch.basic_publish("", q, b"m-%d" % i,
                         pika.BasicProperties(message_id=str(i), delivery_mode=2))

    p = subprocess.run(
        [sys.executable, "-c", CHILD, rb.listen_host, str(rb.port), q,
         str(n), str(nacked), broker.user, broker.password],
        capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stdout, p.stderr)
    assert "nacked %d of %d" % (nacked, n) in p.stdout, p.stdout
    rb.wait_log("session_close", timeout=15)
    gone = rb.log_lines("client_gone_retries_pending")
    assert not gone or int(gone[0]["pending"]) >= 1, gone

    got = {}
    redelivered = {}

    def on_message(chan, method, props, body):
        i = int(props.message_id)
        got[i] = got.get(i, 0) + 1
        redelivered[i] = (method.redelivered,
                          (props.headers or {}).get("rebound-retry-count"))
        chan.basic_ack(method.delivery_tag)

    ch.basic_qos(prefetch_count=50)
    ch.basic_consume(q, on_message)
    pump(conn, lambda: len(got) == n, 30,
         lambda: "all %d messages again (got %d, missing %r)" % (
             n, len(got), sorted(set(range(n)) - set(got))[:20]))
    # nothing more: no duplicate arrives later
    wait_counts(ctl, {q: (0, 0), tier(q, "300ms"): (0, 0)}, timeout=20)
    end = time.monotonic() + 0.8
    while time.monotonic() < end:
        conn.process_data_events(time_limit=0.05)
    dups = {i: c for i, c in got.items() if c != 1}
    assert not dups, "delivered more than once: %r" % dups
    # rebound finished every pending retry (none was abandoned or fell
    # back): each message came back through the tier with count 1
    assert not rb.log_lines("retry_abandoned")
    assert not rb.log_lines("retry_fallback")
    # back with count 1 (and the unsettled rest requeued by the broker)
    via_tier = sorted(i for i, (r, c) in redelivered.items()
                      if (r, c) == (False, 1))
    requeued = sorted(i for i, (r, c) in redelivered.items()
                      if (r, c) == (True, None))
    not_via_tier = sorted(set(range(nacked)) - set(via_tier))
    assert not not_via_tier, (
        "nacked but not back through the tier (redelivered, count): %r; "
        "%d retries published; client_gone_retries_pending: %r" % (
            {i: redelivered[i] for i in not_via_tier[:20]},
            len(rb.log_lines("retry_published")), gone))
    assert via_tier == list(range(nacked)), via_tier[:20]
    assert requeued == list(range(nacked, n)), requeued[:20]
    assert len(rb.log_lines("retry_published")) == nacked
    assert not direct.exists(dlq(q))
    conn.close()


def test_channel_and_connection_close_right_after_nack_wait_for_the_retry(
        rebound_factory, broker, ctl, direct):
    """nack(requeue) then at once channel.close and connection.close
    (pika closes its channels first): the channel.close is held until the
    retry's ack went out, so the message exists exactly once afterwards --
    in the tier, then back in the queue with count 1."""
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "4")
    q = direct.own(rbtest.uniq("close"))
    direct.ch.queue_declare(q, durable=True)
    direct.publish(q, b"once")
    conn = rb.pika(broker)
    ch = conn.channel()
    m = None
    deadline = time.monotonic() + 10
    while m is None and time.monotonic() < deadline:
        m, _, _ = ch.basic_get(q)
    assert m is not None
    ch.basic_nack(m.delivery_tag, requeue=True)
    ch.close()
    conn.close()
    got = direct.get_all(q, expect=1, timeout=10)
    # a second copy (the original requeued as well) would show up too
    wait_counts(ctl, {q: (0, 0), tier(q, "300ms"): (0, 0)})
    assert [b for _, _, b in got] == [b"once"]
    assert got[0][1].headers["rebound-retry-count"] == 1
    rb.wait_log("retry_published")


def test_sigterm_drain_with_retries_pending_no_loss_no_duplicate(
        rebound_factory, broker, ctl, direct):
    """rebound itself is asked to stop (SIGTERM: drain) while a consumer's
    burst of 1000 nacks is being turned into retries. Whatever rebound did
    not get to is requeued by the broker; whatever it did is in the tier.
    Expected (contract item 7: "never lose"; duplicates only on a *crash*
    between confirm and ack): afterwards every message exists exactly
    once -- a copy whose publish was confirmed must have its original
    acked, or the copy and the requeued original both live on."""
    n = 1000
    rb = rebound_factory("--retry-tiers", "300ms", "--max-attempts", "4")
    q = direct.own(rbtest.uniq("term"))
    direct.ch.queue_declare(q, durable=True)
    for i in range(n):
        direct.ch.basic_publish("", q, b"%d" % i)
    rbtest.wait_until(lambda: direct.ch.queue_declare(
        q, passive=True).method.message_count == n, 20, "%d messages" % n)

    conn = rb.pika(broker)
    cch = conn.channel()
    cch.basic_qos(prefetch_count=1000)
    tags = []
    for m, _, _ in cch.consume(q, inactivity_timeout=10):
        assert m is not None, "no delivery in 10 s"
        tags.append(m.delivery_tag)
        if len(tags) == n:
            break
    for t in tags:
        cch.basic_nack(t, requeue=True)
    # as soon as rebound is busy with the burst (copies one after the
    # other, each waiting for its confirm), stop it
    rbtest.wait_until(lambda: "msg=retry_published" in rb.log(), 10,
                      "the first retry", interval=0.001)
    rb.signal(signal.SIGTERM)
    try:
        pump(conn, lambda: False, 15, "rebound to close the client")
    except pika.exceptions.AMQPConnectionError:
        pass
    assert rb.wait_exit(30) == 0, rb.log()[-3000:]
    published = len(rb.log_lines("retry_published"))
    # the drain came with copies in flight (it finishes them all, or some)
    assert 0 < published <= n, published

    wait_counts(ctl, {tier(q, "300ms"): (0, 0)}, timeout=10)
    got = direct.get_all(q, expect=n + 1, timeout=2.0)
    seen = {}
    for m, p, b in got:
        seen.setdefault(int(b), []).append(
            ((p.headers or {}).get("rebound-retry-count"), m.redelivered))
    missing = sorted(set(range(n)) - set(seen))
    dups = {i: v for i, v in seen.items() if len(v) > 1}
    assert not missing, "lost: %r" % missing
    assert not dups, (
        "duplicated (count header, redelivered) per copy: %r; %d retries "
        "were published; rebound log tail:\n%s" % (
            dups, published, "\n".join(rb.log().splitlines()[-8:])))
