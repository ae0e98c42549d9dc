"""Two more client libraries through rebound with TLS on the client side,
the upstream side (the test broker's TLS listener), both or neither:
kombu (py-amqp underneath) and rabbitmq-c (librabbitmq's amqp_ssl_socket,
through tests/integration/tls_rabbitmq_c.c). Each combination carries
confirmed publishes consumed byte for byte, a 16 MiB message among them;
200 channels on one connection go plain and TLS on both sides, and a
poison message, TLS on both sides, is retried exactly max_attempts times
into its dead-letter queue.

That TLS was really used where meant, and only there, is checked while the
client's connection is open: which of rebound's listeners holds the
client, rebound's handshake counters by side, where rebound's connections
to the broker go and what the broker itself says of them (the ssl column
of rabbitmqctl list_connections), and for kombu the client's own socket.
"""
import os
import socket
import ssl
import subprocess
import time

import amqp.exceptions
import kombu
import pika.exceptions
import pytest

import rbtest
from retryhelp import direct, dlq
from test_admin import admin_rebound, metrics
from test_retry_kombu import drain
from test_tls import certs, tls_broker, tls_rebound

assert certs and tls_broker and direct  # fixtures

COMBOS = [(False, False), (False, True), (True, False), (True, True)]
COMBO_IDS = ["plain-plain", "plain-tls", "tls-plain", "tls-tls"]
BIG = 16 << 20
PASS_THROUGH = ("--retry-queues", "retry-policy-matches-nothing-here")
POISON = ("--retry-tiers", "200ms", "--max-attempts", "3")


def admin_tls_rebound(rebound_factory, certs, tls_port, upstream_tls, *args):
    """tls_rebound (both listeners) with the admin endpoint, for the
    handshake counters."""
    def factory(*a, **kw):
        return admin_rebound(rebound_factory, *a, **kw)
    return tls_rebound(factory, certs, tls_port, upstream_tls, *args)


# ---- where TLS was used -----------------------------------------------------


def upstream_links(rb, broker, ctl, tls_port):
    """[(broker port, ssl, ssl protocol)] of rebound's logged-in connections
    to the broker, as the broker lists them."""
    mine = {(s[1][1], s[2][1]) for s in rb.conn_sockets()
            if s[0] == rbtest.TCP_ESTABLISHED
            and s[2][1] in (broker.port, tls_port)}
    out = []
    for peer_port, port, user, tls, proto in ctl._rows(
            "list_connections", "peer_port", "port", "user", "ssl",
            "ssl_protocol"):
        if not (peer_port.isdigit() and port.isdigit()):
            continue
        if (int(peer_port), int(port)) in mine and user == broker.user:
            out.append((int(port), tls == "true", proto))
    return sorted(out)


def handshakes(rb):
    """rebound's completed TLS handshakes: (client side, upstream side)."""
    m = metrics(rb.admin_port)
    return (m.get('rebound_tls_handshakes_total{side="client"}', 0),
            m.get('rebound_tls_handshakes_total{side="upstream"}', 0))


def check_sides(rb, broker, ctl, tls_port, client_tls, upstream_tls,
                upstreams=1, sessions=1):
    """With the client's connection open: it is on rebound's TLS listener
    (or its plain one), rebound's `upstreams` connections to the broker go
    to its TLS port (or its plain one) and the broker says they are TLS (or
    not), and rebound's handshake counters agree (`sessions` TLS clients so
    far; the readiness probe's upstream handshakes count too)."""
    on_tls = [s for s in rb.conn_sockets()
              if s[0] == rbtest.TCP_ESTABLISHED and s[1][1] == rb.tls_port]
    on_plain = [s for s in rb.conn_sockets()
                if s[0] == rbtest.TCP_ESTABLISHED and s[1][1] == rb.port]
    assert (len(on_tls), len(on_plain)) == ((1, 0) if client_tls else (0, 1))

    links = rbtest.wait_until(
        lambda: (lambda l: l if len(l) == upstreams else None)(
            upstream_links(rb, broker, ctl, tls_port)), 10,
        lambda: "%d connections of rebound at the broker: %r" % (
            upstreams, upstream_links(rb, broker, ctl, tls_port)))
    want_port = tls_port if upstream_tls else broker.port
    for port, tls, proto in links:
        assert (port, tls) == (want_port, upstream_tls), links
        if upstream_tls:
            assert proto in ("tlsv1.2", "tlsv1.3"), links

    client_hs, upstream_hs = handshakes(rb)
    assert client_hs == (sessions if client_tls else 0)
    if upstream_tls:
        assert upstream_hs >= upstreams
    else:
        assert upstream_hs == 0
    opened = rb.log_lines("session_open")
    assert opened and opened[-1]["upstream"] == (
        "localhost:%d" % tls_port if upstream_tls else broker.addr)


# ---- kombu ----------------------------------------------------------------


def kombu_connect(rb, certs, tls):
    """kombu (pyamqp transport) to rebound's TLS listener, verifying the
    certificate and host name, or to its plain one; publishes confirmed."""
    sslopts = False
    if tls:
        sslopts = {"ca_certs": os.path.join(certs, "ca.pem"),
                   "cert_reqs": ssl.CERT_REQUIRED,
                   "server_hostname": "localhost"}
    conn = kombu.Connection(
        hostname="localhost", port=rb.tls_port if tls else rb.port,
        userid="guest", password="guest", virtual_host="/",
        transport="pyamqp", ssl=sslopts, connect_timeout=10,
        transport_options={"confirm_publish": True})
    conn.connect()
    sock = conn.connection.transport.sock
    assert isinstance(sock, ssl.SSLSocket) == tls
    if tls:
        assert sock.version() in ("TLSv1.2", "TLSv1.3")
        assert ("DNS", "localhost") in sock.getpeercert()["subjectAltName"]
    return conn


def binary_bodies():
    """Bodies of every byte value and of sizes across frame boundaries
    (py-amqp's frame-max is 128 KiB), and one of 16 MiB."""
    sizes = [0, 1, 255, 4096, 131064, 131072, 131073, 300000]
    out = [bytes(range(256)) * 4]
    out += [os.urandom(n) for n in sizes]
    out += [b"m%d\x00\xce" % i for i in range(50)]
    out.append(os.urandom(BIG))
    return out


@pytest.mark.parametrize("client_tls,upstream_tls", COMBOS, ids=COMBO_IDS)
def test_kombu_publish_confirm_consume(rebound_factory, certs, tls_broker,
                                       broker, ctl, client_tls, upstream_tls,
                                       qname):
    """kombu with confirm_publish: every publish acked by the broker (and
    a publish the broker refuses nacked, raised as MessageNacked), then
    consumed with acks, byte for byte, a 16 MiB body among them."""
    rb = admin_tls_rebound(rebound_factory, certs, tls_broker[0],
                           upstream_tls, *PASS_THROUGH)
    conn = kombu_connect(rb, certs, client_tls)
    try:
        queue = kombu.Queue(qname, durable=False,
                            queue_arguments={"x-expires": 120000})
        producer = conn.Producer()
        bodies = binary_bodies()
        for b in bodies:
            producer.publish(b, routing_key=qname, declare=[queue],
                             content_type="application/octet-stream",
                             content_encoding="binary", retry=False)
        assert producer.channel._confirm_selected

        # a full reject-publish queue: the broker's basic.nack reaches kombu
        full = rbtest.uniq("full")
        capped = kombu.Queue(full, durable=False, queue_arguments={
            "x-max-length": 1, "x-overflow": "reject-publish",
            "x-expires": 120000})
        producer.publish(b"fits", routing_key=full, declare=[capped],
                         retry=False)
        with pytest.raises(amqp.exceptions.MessageNacked):
            producer.publish(b"over", routing_key=full, retry=False)
        producer.publish(b"after", routing_key=qname, retry=False)

        got = []

        def on_message(message):
            # py-amqp gives an empty body as "" (a str)
            got.append(message.body or b"")
            message.ack()

        with conn.Consumer(queue, on_message=on_message, prefetch_count=20):
            drain(conn, lambda: len(got) >= len(bodies) + 1, 30,
                  lambda: "%d deliveries (have %d)" % (len(bodies) + 1,
                                                      len(got)))
            check_sides(rb, broker, ctl, tls_broker[0], client_tls,
                        upstream_tls)
        assert [len(b) for b in got] == [len(b) for b in bodies] + [5]
        assert got == bodies + [b"after"]
        ch = conn.channel()
        assert ch.queue_delete(qname) == 0
        assert ch.queue_delete(full) == 1
        ch.close()
    finally:
        conn.release()
    rb.wait_log("session_close", reason="client closed the connection")


@pytest.mark.parametrize("client_tls,upstream_tls",
                         [(False, False), (True, True)],
                         ids=["plain-plain", "tls-tls"])
def test_kombu_200_channels(rebound_factory, certs, tls_broker, broker, ctl,
                            client_tls, upstream_tls, qname):
    """connection.channel() 200 times on one kombu connection: each
    channel publishes (confirmed) and basic.gets one message."""
    rb = admin_tls_rebound(rebound_factory, certs, tls_broker[0],
                           upstream_tls, *PASS_THROUGH)
    conn = kombu_connect(rb, certs, client_tls)
    try:
        chans = [conn.channel() for _ in range(200)]
        assert len({c.channel_id for c in chans}) == 200
        chans[0].queue_declare(qname, durable=False,
                               arguments={"x-expires": 120000})
        for i, ch in enumerate(chans):
            ch.basic_publish(amqp.Message(b"c%d" % i), exchange="",
                             routing_key=qname)
        assert all(c._confirm_selected for c in chans)
        seen = set()
        for ch in chans:
            m = ch.basic_get(qname, no_ack=True)
            assert m is not None
            seen.add(m.body)
        assert seen == {b"c%d" % i for i in range(200)}
        check_sides(rb, broker, ctl, tls_broker[0], client_tls, upstream_tls)
        chans[0].queue_delete(qname)
        for ch in chans:
            ch.close()
    finally:
        conn.release()
    rb.wait_log("session_close", reason="client closed the connection")


def dlq_count(direct, name):
    """Messages in `name` (the broker, directly); -1 when it does not exist
    yet."""
    ch = direct.channel()
    try:
        n = ch.queue_declare(name, passive=True).method.message_count
    except pika.exceptions.ChannelClosedByBroker as e:
        if e.reply_code == 404:
            return -1
        raise
    ch.close()
    return n


def test_kombu_poison_retry_over_tls(rebound_factory, certs, tls_broker,
                                     broker, ctl, direct):
    """TLS on both sides: a message kombu requeues at every delivery
    (message.requeue() and message.reject(requeue=True) alternately, both
    basic.reject; py-amqp sends no basic.nack) is delivered exactly
    max_attempts (3) times, with rebound's count header, then sits in its
    dead-letter queue with its body intact; the client's connection and
    rebound's retry connection both go to the broker over TLS."""
    qname = direct.own(rbtest.uniq("kombu-poison"))
    rb = admin_tls_rebound(rebound_factory, certs, tls_broker[0], True,
                           "--retry-queues", qname, *POISON)
    conn = kombu_connect(rb, certs, True)
    try:
        queue = kombu.Queue(qname, durable=False)
        body = os.urandom(4096) + bytes(range(256))
        conn.Producer().publish(body, routing_key=qname, declare=[queue],
                                content_type="application/octet-stream",
                                content_encoding="binary", retry=False)
        counts = []

        def on_message(message):
            assert message.body == body
            counts.append(message.headers.get("rebound-retry-count"))
            if len(counts) % 2:
                message.requeue()
            else:
                message.reject(requeue=True)

        with conn.Consumer(queue, on_message=on_message, prefetch_count=1):
            drain(conn, lambda: dlq_count(direct, dlq(qname)) == 1, 20,
                  lambda: "the message in %s after %d deliveries"
                  % (dlq(qname), len(counts)))
            # no delivery after the dead-letter queue has it
            quiet = time.monotonic() + 1.0
            while time.monotonic() < quiet:
                try:
                    conn.drain_events(timeout=0.05)
                except (TimeoutError, socket.timeout):
                    pass
            assert counts == [None, 1, 2]
            check_sides(rb, broker, ctl, tls_broker[0], True, True,
                        upstreams=2)
        m = conn.default_channel.basic_get(dlq(qname), no_ack=True)
        assert m is not None and m.body == body
        assert m.headers["rebound-retry-count"] == 3
        assert m.headers["rebound-dead-letter-reason"] == "max-attempts"
        assert m.headers["rebound-source-queue"] == qname
        assert conn.default_channel.basic_get(dlq(qname)) is None
    finally:
        conn.release()
    assert rb.log_lines("retry_connection_open",
                        upstream="localhost:%d" % tls_broker[0])


# ---- rabbitmq-c -----------------------------------------------------------


def _rabbitmq_c_bin():
    path = os.environ.get("REBOUND_RABBITMQ_C_TLS")
    if path:
        return path
    d = os.path.dirname(rbtest.BIN or "")
    for _ in range(4):  # the build tree rebound was found in
        cand = os.path.join(d, "tests", "integration", "tls_rabbitmq_c")
        if os.access(cand, os.X_OK):
            return cand
        d = os.path.dirname(d)
    return None


@pytest.fixture(scope="module")
def rabbitmq_c():
    path = _rabbitmq_c_bin()
    if not path or not os.access(path, os.X_OK):
        pytest.fail("tls_rabbitmq_c is not built (REBOUND_RABBITMQ_C_TLS, "
                    "or next to REBOUND_BIN in its build tree)")
    return path


def run_rabbitmq_c(binary, rb, certs, tls, tmp_path, *args, while_open):
    """Run tls_rabbitmq_c against rebound; `while_open(results)` is called
    while its connection is still open. Returns its key=value results."""
    port = rb.tls_port if tls else rb.port
    cmd = [binary, "localhost", str(port),
           os.path.join(certs, "ca.pem") if tls else "-", *args]
    err_path = tmp_path / ("rabbitmq-c-%s.err" % args[0])
    with open(err_path, "w") as err:
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=err, text=True)
    out = {}
    held, rest = False, ""
    try:
        for line in p.stdout:
            line = line.rstrip("\n")
            if line == "hold":
                held = True
                while_open(out)
                break
            k, _, v = line.partition("=")
            out[k] = v
        if held:
            p.stdin.write("\n")
            p.stdin.close()
            rest = p.stdout.read()
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    msg = "%s exited %s: %s" % (" ".join(cmd), p.returncode,
                                err_path.read_text()[-3000:])
    assert held and p.returncode == 0, msg
    assert rest.strip() == "closed", msg
    return out


@pytest.mark.parametrize("client_tls,upstream_tls", COMBOS, ids=COMBO_IDS)
def test_rabbitmq_c_publish_confirm_consume(rabbitmq_c, rebound_factory,
                                            certs, tls_broker, broker, ctl,
                                            client_tls, upstream_tls, qname,
                                            tmp_path):
    """rabbitmq-c: 40 binary messages (0 bytes to over two frames) in
    confirm mode, every delivery tag acked by the broker, consumed with
    acks byte for byte; then on a second connection one 16 MiB message,
    confirmed, consumed and compared."""
    rb = admin_tls_rebound(rebound_factory, certs, tls_broker[0],
                           upstream_tls, *PASS_THROUGH)

    def sides(sessions):
        return lambda out: check_sides(rb, broker, ctl, tls_broker[0],
                                       client_tls, upstream_tls,
                                       sessions=sessions)

    out = run_rabbitmq_c(rabbitmq_c, rb, certs, client_tls, tmp_path,
                         "pubsub", qname, "40", while_open=sides(1))
    assert (out["confirmed"], out["delivered"]) == ("40", "40")
    assert out["frame_max"] == "131072"
    big = qname + "-big"
    out = run_rabbitmq_c(rabbitmq_c, rb, certs, client_tls, tmp_path,
                         "big", big, str(BIG), while_open=sides(2))
    assert (out["confirmed"], out["delivered"]) == ("1", "1")
    assert out["bytes"] == str(BIG)
    rbtest.wait_until(
        lambda: len(rb.log_lines("session_close",
                                 reason="client closed the connection")) == 2,
        10, "both sessions' close")


@pytest.mark.parametrize("client_tls,upstream_tls",
                         [(False, False), (True, True)],
                         ids=["plain-plain", "tls-tls"])
def test_rabbitmq_c_200_channels(rabbitmq_c, rebound_factory, certs,
                                 tls_broker, broker, ctl, client_tls,
                                 upstream_tls, qname, tmp_path):
    """rabbitmq-c opens channels 1..200 on one connection, each in confirm
    mode, publishing one message (acked) and basic.getting one."""
    rb = admin_tls_rebound(rebound_factory, certs, tls_broker[0],
                           upstream_tls, *PASS_THROUGH)
    out = run_rabbitmq_c(
        rabbitmq_c, rb, certs, client_tls, tmp_path, "channels", qname,
        "200", while_open=lambda out: check_sides(
            rb, broker, ctl, tls_broker[0], client_tls, upstream_tls))
    assert (out["confirmed"], out["got"]) == ("200", "200")


def test_rabbitmq_c_poison_retry_over_tls(rabbitmq_c, rebound_factory, certs,
                                          tls_broker, broker, ctl, direct,
                                          tmp_path):
    """TLS on both sides: a message rabbitmq-c nacks and rejects
    (alternately, requeue=true) at every delivery is delivered exactly
    max_attempts (3) times, with rebound's count header, and then fetched
    intact from its dead-letter queue; the client's connection and
    rebound's retry connection both go to the broker over TLS."""
    qname = direct.own(rbtest.uniq("rc-poison"))
    rb = admin_tls_rebound(rebound_factory, certs, tls_broker[0], True,
                           "--retry-queues", qname, *POISON)

    def while_open(out):
        check_sides(rb, broker, ctl, tls_broker[0], True, True, upstreams=2)
        # the original acked, the consumer still there
        rbtest.wait_until(lambda: ctl.queue(qname) == (0, 0, 1), 10,
                          lambda: "%s empty: %r" % (qname, ctl.queue(qname)))

    out = run_rabbitmq_c(rabbitmq_c, rb, certs, True, tmp_path, "poison",
                         qname, while_open=while_open)
    assert out["deliveries"] == "3"
    assert out["counts"] == "-1,1,2"  # -1: no header on the first delivery
    assert out["dlq_body"] == "intact"
    assert out["dlq_retry_count"] == "3"
    assert out["dlq_reason"] == "max-attempts"
    assert out["dlq_left"] == "0"
    assert rb.log_lines("retry_connection_open",
                        upstream="localhost:%d" % tls_broker[0])
