"""A consumer or basic.get that names the queue "" gets the channel's most
recently declared queue (the broker's shortcut; the npm client
rabbitmq-client uses it for every server-named queue). rebound resolves it
exactly as the broker does: a counted retry on the real queue where it has
a name, a delayed, counted pass-through for a server-named one -- never a
copy to a tier named after "" (".retry.1s", whose messages never come
back).

Real pika clients through rebound against the real broker."""
import json
import os
import struct
import subprocess
import time
import urllib.request

import pika
import pytest

import amqp_raw
import rbtest
from retryhelp import EARLY, count_of, direct, dlq, pump, queues, tier

assert direct  # a fixture

TIERS = ("--retry-tiers", "1s", "--max-attempts", "3")


def consume_once(conn, ch, queue, n, how="nack"):
    """Consume `queue` (maybe ""), fail the first n deliveries with a
    requeue, ack the next; returns the deliveries' count headers."""
    seen = []

    def on_message(chan, method, props, body):
        seen.append(count_of(props))
        if len(seen) <= n:
            if how == "nack":
                chan.basic_nack(method.delivery_tag, requeue=True)
            else:
                chan.basic_reject(method.delivery_tag, requeue=True)
        else:
            chan.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(queue, on_message)
    pump(conn, lambda: len(seen) > n, 20,
         lambda: "%d deliveries, got %r" % (n + 1, seen))
    ch.basic_cancel(tag)
    return seen


def blank_topology(ctl):
    """Queues rebound would have made for a queue named ""."""
    return [q for q in ctl.queue_names()
            if q.startswith(".retry.") or q == ".dlq"]


@pytest.fixture(autouse=True)
def no_blank_queues(broker, ctl):
    """Each test starts without them (a run of an older rebound may have
    left some) and leaves none behind."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    for q in blank_topology(ctl):
        ch.queue_delete(q)
    yield
    for q in blank_topology(ctl):
        ch.queue_delete(q)
    conn.close()


def declared_with_a_message(rebound_factory, broker, direct):
    """rebound, and a pika channel through it that declared a queue (by
    name) holding one message: (rebound, queue, connection, channel)."""
    rb = rebound_factory(*TIERS)
    q = direct.own(rbtest.uniq("ident"))
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.basic_publish("", q, b"m", pika.BasicProperties(delivery_mode=2))
    return rb, q, conn, ch


def test_consume_empty_name_after_a_named_declare(rebound_factory, broker, ctl,
                                                  direct):
    rb, q, conn, ch = declared_with_a_message(rebound_factory, broker, direct)
    counts = consume_once(conn, ch, "", 2)
    conn.close()
    # attempt 1, 2 failed into the real queue's tier, attempt 3 acked
    assert counts == [None, 1, 2], counts
    targets = [p["target"] for p in rb.log_lines("retry_published")]
    assert targets == [tier(q, "1s")] * 2, targets
    assert blank_topology(ctl) == []


def test_get_empty_name_after_a_named_declare(rebound_factory, broker, ctl,
                                              direct):
    rb, q, conn, ch = declared_with_a_message(rebound_factory, broker, direct)
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 2 and time.monotonic() < deadline:
        m, props, _ = ch.basic_get("")
        if m is None:
            conn.sleep(0.05)
            continue
        got.append(count_of(props))
        if len(got) == 1:
            ch.basic_reject(m.delivery_tag, requeue=True)
        else:
            ch.basic_ack(m.delivery_tag)
    conn.close()
    assert got == [None, 1], got
    assert [p["target"] for p in rb.log_lines("retry_published")] == \
        [tier(q, "1s")]
    assert blank_topology(ctl) == []


def test_consume_empty_name_after_a_server_named_declare(rebound_factory,
                                                         broker, ctl, direct):
    """The broker names the queue amq.gen-...: its requeue passes through
    (delayed, counted under the server-named reason) and the message comes
    back; nothing is declared for it."""
    port = rbtest.free_port()
    rb = rebound_factory(*TIERS, "--admin", "127.0.0.1:%d" % port)
    conn = rb.pika(broker)
    ch = conn.channel()
    name = ch.queue_declare("", exclusive=True).method.queue
    assert name.startswith("amq.gen-"), name
    ch.basic_publish("", name, b"m")
    counts = consume_once(conn, ch, "", 2)
    conn.close()
    # a pass-through carries no count: the broker redelivered the original
    assert counts == [None, None, None], counts
    assert rb.log_lines("retry_published") == []
    passes = [p for p in rb.log_lines("retry_pass")]
    assert [p["queue"] for p in passes] == [name] * 2, passes
    assert {p["reason"] for p in passes} == {"server-named queue (amq.*)"}
    assert blank_topology(ctl) == []
    assert not any(q.startswith(name + ".") for q in ctl.queue_names())


def test_each_channel_has_its_own_last_declared_queue(rebound_factory, broker,
                                                      ctl, direct):
    """Channel 1 declares A, channel 2 then declares B: "" on channel 1 is
    still A."""
    rb = rebound_factory(*TIERS)
    a = direct.own(rbtest.uniq("ident-a"))
    b = direct.own(rbtest.uniq("ident-b"))
    conn = rb.pika(broker)
    ch1 = conn.channel()
    ch2 = conn.channel()
    ch1.queue_declare(a, durable=True)
    ch2.queue_declare(b, durable=True)
    ch1.basic_publish("", a, b"m", pika.BasicProperties(delivery_mode=2))
    counts = consume_once(conn, ch1, "", 1, how="reject")
    conn.close()
    assert counts == [None, 1], counts
    assert [p["target"] for p in rb.log_lines("retry_published")] == \
        [tier(a, "1s")]
    assert queues(ctl).get(dlq(b)) is None
    assert blank_topology(ctl) == []


# ---- raw frames: what no client library sends -------------------------------

def queue_declare(ch, queue, exclusive=False, no_wait=False):
    bits = (0x04 if exclusive else 0) | (0x10 if no_wait else 0)
    return amqp_raw.method(ch, (50, 10), struct.pack(">H", 0)
                           + amqp_raw.shortstr(queue) + bytes([bits])
                           + amqp_raw.table({}))


def queue_bind(ch, queue, exchange):
    return amqp_raw.method(ch, (50, 20), struct.pack(">H", 0)
                           + amqp_raw.shortstr(queue)
                           + amqp_raw.shortstr(exchange)
                           + amqp_raw.shortstr("") + bytes([0x01])
                           + amqp_raw.table({}))


def basic_nack(ch, tag):
    return amqp_raw.method(ch, (60, 120), struct.pack(">QB", tag, 0x02))


def next_delivery(c, timeout=10):
    """(delivery tag, time) of the next basic.deliver; its content is read
    past."""
    while True:
        f = c.recv_method(timeout=timeout)
        if f.method == (60, 60):
            p = f.payload[4:]
            tag = struct.unpack(">Q", p[1 + p[0]:9 + p[0]])[0]
            return tag, time.monotonic()


def read_past_content(c):
    c.recv_frame()  # header
    c.recv_frame()  # body (one frame: a short message)


def close_cleanly(c):
    """connection.close and its close-ok: a client that hangs up instead
    would leave its redelivered message to the consumer-lost path."""
    c.send(amqp_raw.connection_close())
    while c.recv_method(timeout=10).method != amqp_raw.CONNECTION_CLOSE_OK:
        pass
    c.close()


def raw_client(rb):
    c = amqp_raw.RawClient(int(rb.addr.rsplit(":", 1)[1]))
    c.handshake()
    c.open_channel(1)
    return c


def fanout(direct):
    x = rbtest.uniq("ident-x")
    direct.ch.exchange_declare(x, "fanout", auto_delete=True)
    return x


def test_pipelined_server_named_declare_then_consume(rebound_factory, broker,
                                                     ctl, direct):
    """declare "" and consume "" sent together, before the declare-ok: the
    consumer's queue is the name the declare-ok gives."""
    rb = rebound_factory(*TIERS)
    x = fanout(direct)
    c = raw_client(rb)
    c.send(queue_declare(1, "", exclusive=True) + queue_bind(1, "", x)
           + amqp_raw.basic_consume(1, "", tag="ctag"))
    ok = c.recv_method(timeout=10)
    assert ok.method == (50, 11), ok
    name = ok.payload[5:5 + ok.payload[4]].decode()
    assert c.recv_method(timeout=10).method == (60, 21)  # consume-ok
    direct.ch.basic_publish(x, "", b"m")
    tag, _ = next_delivery(c)
    read_past_content(c)
    c.send(basic_nack(1, tag))
    next_delivery(c)
    close_cleanly(c)
    passes = rb.log_lines("retry_pass")
    assert [p["queue"] for p in passes] == [name], passes
    assert rb.log_lines("queue_identity_unknown") == []


def test_no_wait_server_named_declare_is_a_counted_pass_through(
        rebound_factory, broker, ctl, direct):
    """declare "" no-wait: the broker never says the name, so rebound cannot
    know the queue. The requeue still reaches the broker, after the first
    tier's delay (never at once: no hot loop), counted and logged."""
    port = rbtest.free_port()
    rb = rebound_factory(*TIERS, "--admin", "127.0.0.1:%d" % port)
    x = fanout(direct)
    c = raw_client(rb)
    c.send(queue_declare(1, "", exclusive=True, no_wait=True)
           + queue_bind(1, "", x) + amqp_raw.basic_consume(1, "", tag="ctag"))
    assert c.recv_method(timeout=10).method == (60, 21)  # consume-ok
    direct.ch.basic_publish(x, "", b"m")
    tag, _ = next_delivery(c)
    read_past_content(c)
    t_nack = time.monotonic()
    c.send(basic_nack(1, tag))
    _, t_back = next_delivery(c)
    close_cleanly(c)
    assert t_back - t_nack >= 1.0 - EARLY, t_back - t_nack
    assert rb.log_lines("retry_published") == []
    assert len(rb.log_lines("queue_identity_unknown")) == 1
    reason = "queue not known (empty name, no named declare)"
    delayed = rb.log_lines("retry_requeue_delayed")
    assert [d["reason"] for d in delayed] == [reason]
    body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                  timeout=5).read().decode()
    assert 'rebound_retry_passthrough_total{reason="%s"} 1' % reason in body
    assert 'rebound_retry_requeues_delayed_total{reason="%s"} 1' % reason \
        in body
    assert blank_topology(ctl) == []


# ---- the client that does this: npm's rabbitmq-client ----------------------

NODE_DIR = os.path.join(rbtest.REPO, "tests", "integration", "node")


def test_rabbitmq_client_server_named_consumer(rebound_factory, broker, ctl):
    """rabbitmq-client declares a server-named queue and consumes it as "".
    Its requeue comes back (a delayed pass-through: the queue is amq.gen-*),
    never copied to a tier named after ""."""
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules",
                                      "rabbitmq-client")):
        pytest.fail("tests/integration/node has no node_modules: run "
                    "scripts/setup.sh")
    rb = rebound_factory(*TIERS)
    p = subprocess.run(["node", os.path.join(NODE_DIR,
                                             "server_named_requeue.mjs"),
                        rb.url(broker)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, (p.stdout, p.stderr[-2000:])
    out = json.loads(p.stdout.strip().splitlines()[-1])
    first, second = out["deliveries"]
    assert out["queue"].startswith("amq.gen-"), out
    assert (first["redelivered"], second["redelivered"]) == (False, True), out
    assert second["t"] - first["t"] >= 1000 - 1000 * EARLY, out
    passes = rb.log_lines("retry_pass")
    assert [q["queue"] for q in passes] == [out["queue"]], passes
    assert rb.log_lines("retry_published") == []
    assert blank_topology(ctl) == []
