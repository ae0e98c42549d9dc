"""TLS on both sides of rebound, against the test broker's TLS listener
(scripts/broker.sh: certificates of tests/tls/make_certs.sh, the server's
for localhost and 127.0.0.1): pika through rebound in the four
combinations plain/TLS x plain/TLS, the retry path over TLS, and the bad
cases (unknown CA, client certificate required, plain AMQP on the TLS
port, TLS on the plain port, a handshake that never comes, a reload of the
certificate)."""
import os
import shutil
import signal
import socket
import ssl
import time

import pika
import pytest

import amqp_raw
import rbtest


@pytest.fixture(scope="module")
def tls_broker(broker):
    env = broker.env()
    if "REBOUND_TEST_BROKER_TLS_PORT" not in env:
        pytest.fail("the test broker has no TLS listener (start it with "
                    "scripts/broker.sh)")
    return int(env["REBOUND_TEST_BROKER_TLS_PORT"]), env["REBOUND_TEST_CERTS"]


@pytest.fixture
def certs(tls_broker, tmp_path):
    """A copy of the certificates (a test may replace files in it)."""
    d = tmp_path / "certs"
    shutil.copytree(tls_broker[1], d)
    return str(d)


def tls_rebound(rebound_factory, certs, tls_port, upstream_tls, *args):
    port = rbtest.free_port("127.0.0.1")
    upstream = ("amqps://localhost:%d" % tls_port if upstream_tls
                else None)
    rb = rebound_factory(
        "--tls-listen", "127.0.0.1:%d" % port,
        "--tls-cert", os.path.join(certs, "server.pem"),
        "--tls-key", os.path.join(certs, "server.key"),
        "--upstream-ca", os.path.join(certs, "ca.pem"), *args,
        upstream=upstream)
    rb.tls_port = port
    return rb


def client_params(rb, certs, tls, cert=None):
    p = dict(host="localhost", port=rb.tls_port if tls else rb.port,
             credentials=pika.PlainCredentials("guest", "guest"),
             connection_attempts=1, socket_timeout=10)
    if tls:
        ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))
        if cert:
            ctx.load_cert_chain(os.path.join(certs, cert + ".pem"),
                                os.path.join(certs, cert + ".key"))
        p["ssl_options"] = pika.SSLOptions(ctx, "localhost")
    return pika.ConnectionParameters(**p)


@pytest.mark.parametrize("client_tls,upstream_tls",
                         [(False, False), (False, True), (True, False),
                          (True, True)],
                         ids=["plain-plain", "plain-tls", "tls-plain",
                              "tls-tls"])
def test_publish_consume_through_tls(rebound_factory, certs, tls_broker,
                                     client_tls, upstream_tls, qname):
    """Confirmed publishes (a 16 MiB message among them) and acked
    deliveries, byte for byte, in each combination."""
    rb = tls_rebound(rebound_factory, certs, tls_broker[0], upstream_tls,
                     "--retry-queues", "none-here")
    conn = pika.BlockingConnection(client_params(rb, certs, client_tls))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(qname, auto_delete=True)
    big = os.urandom(16 << 20)
    bodies = [big] + [b"m%d" % i for i in range(200)]
    for b in bodies:
        ch.basic_publish("", qname, b)
    got = []
    for m, _, b in ch.consume(qname, inactivity_timeout=10):
        assert m is not None, "deliveries stopped after %d" % len(got)
        got.append(b)
        ch.basic_ack(m.delivery_tag)
        if len(got) == len(bodies):
            break
    assert got == bodies
    conn.close()
    rbtest.wait_until(
        lambda: rb.log_lines("session_close",
                             reason="client closed the connection"),
        10, "the session's close")


def test_200_channels_over_tls(rebound_factory, certs, tls_broker, qname):
    rb = tls_rebound(rebound_factory, certs, tls_broker[0], True,
                     "--retry-queues", "none-here")
    conn = pika.BlockingConnection(client_params(rb, certs, True))
    chans = [conn.channel() for _ in range(200)]
    chans[0].queue_declare(qname, auto_delete=True)
    for i, ch in enumerate(chans):
        ch.basic_publish("", qname, b"c%d" % i)
    seen = set()
    for ch in chans:
        m, _, b = ch.basic_get(qname, auto_ack=True)
        assert m is not None
        seen.add(b)
    assert seen == {b"c%d" % i for i in range(200)}
    conn.close()


@pytest.mark.parametrize("mode", ["separate", "shared"])
def test_poison_retry_over_tls(rebound_factory, certs, tls_broker, qname,
                               mode):
    """A message nacked with requeue on every delivery, TLS on both sides:
    exactly max_attempts deliveries, then the dead-letter queue (its copies
    go over TLS too, on the retry connection or the client's)."""
    rb = tls_rebound(rebound_factory, certs, tls_broker[0], True,
                     "--retry-queues", qname, "--retry-tiers", "200ms",
                     "--max-attempts", "3", "--retry-connection", mode)
    conn = pika.BlockingConnection(client_params(rb, certs, True))
    ch = conn.channel()
    ch.queue_declare(qname)
    ch.basic_publish("", qname, b"poison")
    ch.basic_qos(prefetch_count=1)
    n = 0
    for m, _, _ in ch.consume(qname, inactivity_timeout=3):
        if m is None:
            break
        n += 1
        ch.basic_nack(m.delivery_tag, requeue=True)
    ch.cancel()
    assert n == 3
    dlq = ch.queue_declare(qname + ".dlq", passive=True).method.message_count
    assert dlq == 1
    ch.queue_delete(qname)
    ch.queue_delete(qname + ".dlq")
    conn.close()


def test_upstream_unknown_ca_tries_the_next(rebound_factory, certs,
                                           tls_broker, broker, qname):
    """An amqps upstream whose certificate does not verify is logged with
    the reason, and the next upstream takes the client."""
    port = rbtest.free_port("127.0.0.1")
    rb = rebound_factory(
        "--tls-listen", "127.0.0.1:%d" % port,
        "--tls-cert", os.path.join(certs, "server.pem"),
        "--tls-key", os.path.join(certs, "server.key"),
        "--upstream-ca", os.path.join(certs, "other-ca.pem"),
        upstream="amqps://localhost:%d,%s" % (tls_broker[0], broker.addr))
    rb.tls_port = port
    conn = pika.BlockingConnection(client_params(rb, certs, True))
    conn.channel().queue_declare(qname, auto_delete=True)
    conn.close()
    lines = rb.log_lines("upstream_attempt_failed")
    assert lines and "certificate" in lines[0]["error"], rb.log()[-3000:]
    assert lines[0]["upstream"] == "localhost:%d" % tls_broker[0]


def test_client_certificate_required(rebound_factory, certs, tls_broker):
    rb = tls_rebound(rebound_factory, certs, tls_broker[0], True,
                     "--tls-client-ca", os.path.join(certs, "ca.pem"))
    conn = pika.BlockingConnection(client_params(rb, certs, True,
                                                 cert="client"))
    ch = conn.channel()
    with pytest.raises(pika.exceptions.AMQPError):
        pika.BlockingConnection(client_params(rb, certs, True))
    # the session beside the refused one carries on
    ch.queue_declare("", exclusive=True)
    conn.close()
    rbtest.wait_until(lambda: rb.log_lines("client_tls_failed"), 5, "a client_tls_failed line")
    assert "certificate" in rb.log_lines("client_tls_failed")[0]["error"]
    assert rb.log_lines("session_close", reason="client TLS failed")


def test_plain_amqp_on_the_tls_port(rebound_factory, certs, tls_broker):
    rb = tls_rebound(rebound_factory, certs, tls_broker[0], True)
    s = socket.create_connection(("127.0.0.1", rb.tls_port), timeout=5)
    s.sendall(b"AMQP\x00\x00\x09\x01")
    assert s.recv(100) == b""
    s.close()
    rbtest.wait_until(lambda: rb.log_lines("client_plain_on_tls_listener"), 5, "a client_plain_on_tls_listener line")
    assert rb.log_lines("client_plain_on_tls_listener",
                        sent="AMQP 0.0.9.1")


def test_tls_on_the_plain_port(rebound_factory, certs, tls_broker):
    rb = tls_rebound(rebound_factory, certs, tls_broker[0], True)
    ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))
    raw = socket.create_connection(("127.0.0.1", rb.port), timeout=5)
    with pytest.raises((ssl.SSLError, OSError)):
        ctx.wrap_socket(raw, server_hostname="localhost")
    rbtest.wait_until(lambda: rb.log_lines("bad_protocol_header"), 5,
                      "a bad_protocol_header line")
    assert rb.log_lines("bad_protocol_header",
                        error="client speaks TLS on the plain listener")


def test_tls_handshake_that_never_comes(rebound_factory, certs, tls_broker):
    """A client that connects to the TLS port and says nothing is closed at
    the handshake timeout; a TLS session beside it is not affected."""
    rb = tls_rebound(rebound_factory, certs, tls_broker[0], True,
                     "--handshake-timeout", "1s")
    idle = socket.create_connection(("127.0.0.1", rb.tls_port), timeout=5)
    conn = pika.BlockingConnection(client_params(rb, certs, True))
    t0 = time.monotonic()
    assert idle.recv(100) == b""
    assert time.monotonic() - t0 < 5
    idle.close()
    assert rb.log_lines("handshake_timeout")
    conn.channel().queue_declare("", exclusive=True)
    conn.close()


def test_sighup_reloads_the_certificate(rebound_factory, certs, tls_broker):
    """After SIGHUP new handshakes get the certificate now in the file; a
    file that does not load keeps the running one."""
    rb = tls_rebound(rebound_factory, certs, tls_broker[0], True)
    before = pika.BlockingConnection(client_params(rb, certs, True))

    def rogue_params():
        p = client_params(rb, certs, True)
        ctx = ssl.create_default_context(
            cafile=os.path.join(certs, "other-ca.pem"))
        p.ssl_options = pika.SSLOptions(ctx, "localhost")
        return p

    with pytest.raises((pika.exceptions.AMQPError, ssl.SSLError)):
        pika.BlockingConnection(rogue_params())
    shutil.copy(os.path.join(certs, "rogue.pem"),
                os.path.join(certs, "server.pem"))
    shutil.copy(os.path.join(certs, "rogue.key"),
                os.path.join(certs, "server.key"))
    os.kill(rb.pid, signal.SIGHUP)
    rbtest.wait_until(lambda: rb.log_lines("config_reloaded"), 10, "a config_reloaded line")
    after = pika.BlockingConnection(rogue_params())
    after.close()
    before.channel()  # the open connection keeps its TLS session
    before.close()
    with open(os.path.join(certs, "server.pem"), "w") as f:
        f.write("not a certificate\n")
    os.kill(rb.pid, signal.SIGHUP)
    rbtest.wait_until(lambda: rb.log_lines("tls_reload_kept"), 10, "a tls_reload_kept line")
    line = rb.log_lines("tls_listener_config_failed")[-1]
    assert "server.pem" in line["error"]
    again = pika.BlockingConnection(rogue_params())
    again.close()


def test_tls_metrics(rebound_factory, certs, tls_broker):
    """Handshakes and failures by side and reason, and the expiry of the
    certificate rebound serves."""
    from test_admin import admin_rebound, metrics
    port = rbtest.free_port("127.0.0.1")
    rb = admin_rebound(
        rebound_factory,
        "--tls-listen", "127.0.0.1:%d" % port,
        "--tls-cert", os.path.join(certs, "server.pem"),
        "--tls-key", os.path.join(certs, "server.key"),
        "--upstream-ca", os.path.join(certs, "ca.pem"),
        upstream="amqps://localhost:%d" % tls_broker[0])
    rb.tls_port = port
    for _ in range(2):
        conn = pika.BlockingConnection(client_params(rb, certs, True))
        conn.channel()
        conn.close()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"\x16\x03\x01\x00\x05hello")  # a broken ClientHello
    s.recv(100)  # its alert, or the end
    s.close()
    m = rbtest.wait_until(
        lambda: (lambda v: v if any(k.startswith(
            "rebound_tls_handshake_failures_total") for k in v) else None)(
            metrics(rb.admin_port)), 10, "a handshake failure counted")
    assert m['rebound_tls_handshakes_total{side="client"}'] == 2
    # the readiness probe's handshakes count too
    assert m['rebound_tls_handshakes_total{side="upstream"}'] >= 2
    fails = {k: v for k, v in m.items()
             if k.startswith('rebound_tls_handshake_failures_total{side="client"')}
    assert sum(fails.values()) == 1, m
    out = os.popen("openssl x509 -noout -enddate -in %s"
                   % os.path.join(certs, "server.pem")).read()
    import email.utils
    end = email.utils.parsedate_to_datetime(
        out.strip().split("=", 1)[1].replace(" GMT", " +0000"))
    assert m['rebound_tls_certificate_expiry_seconds{side="client"}'] == \
        int(end.timestamp())


def test_not_ready_when_the_upstream_certificate_fails(rebound_factory, certs,
                                                       tls_broker):
    """The readiness probe does TLS as a client would: an upstream whose
    certificate does not verify is "not ready" with OpenSSL's reason."""
    from test_admin import admin_rebound, get
    rb = admin_rebound(rebound_factory,
                       "--upstream-ca", os.path.join(certs, "other-ca.pem"),
                       upstream="amqps://localhost:%d" % tls_broker[0])
    rbtest.wait_until(lambda: "certificate" in get(rb.admin_port,
                                                   "/readyz")[2], 10,
                      "the certificate's failure")
    status, _, body = get(rb.admin_port, "/readyz")
    assert status == 503 and "localhost:%d" % tls_broker[0] in body, body


def test_client_told_when_the_upstream_certificate_fails(rebound_factory,
                                                         certs, tls_broker):
    """An upstream that fails verification (the only one) gives the client
    a clean close with the reason, not a bare EOF."""
    rb = tls_rebound(rebound_factory, certs, tls_broker[0], True,
                     "--upstream-ca", os.path.join(certs, "other-ca.pem"))
    conn = pika.BlockingConnection(client_params(rb, certs, True))
    rbtest.wait_until(
        lambda: conn.is_closed or (conn.process_data_events(0.1), False)[1],
        5, "the connection closed by rebound")
    # rebound answered in AMQP (its handshake and connection.close 320,
    # checked frame by frame in test_bad_input), then the client hung up
    closed = rb.wait_log("session_close", reason="no upstream reachable")
    assert int(closed["bytes_to_client"]) > 0
    line = rb.log_lines("upstream_attempt_failed")[0]
    assert "certificate" in line["error"]


def tls_front(rebound_factory, certs, name):
    """A TLS endpoint in front of the test broker that serves the
    certificate `name` (a rebound whose TLS listener presents it)."""
    port = rbtest.free_port("127.0.0.1")
    front = rebound_factory(
        "--tls-listen", "127.0.0.1:%d" % port,
        "--tls-cert", os.path.join(certs, name + ".pem"),
        "--tls-key", os.path.join(certs, name + ".key"),
        "--retry-queues", "none-here")
    front.tls_port = port
    return front


@pytest.mark.parametrize("served,reason",
                         [("expired", "certificate has expired"),
                          ("elsewhere", "hostname mismatch"),
                          ("rogue", "unable to get local issuer certificate")],
                         ids=["expired", "wrong-host-name", "unknown-ca"])
def test_upstream_certificate_refused_end_to_end(rebound_factory, certs,
                                                 tls_broker, broker, served,
                                                 reason):
    """An amqps upstream that serves an expired certificate, one for
    another host name, or one of an unknown CA: the client gets a clean
    AMQP close (320), the log names the upstream and OpenSSL's reason, and
    a session through a good upstream of the same process carries on."""
    front = tls_front(rebound_factory, certs, served)
    good = tls_rebound(rebound_factory, certs, tls_broker[0], True,
                       "--retry-queues", "none-here")
    beside = pika.BlockingConnection(client_params(good, certs, True))
    rb = rebound_factory("--upstream-ca", os.path.join(certs, "ca.pem"),
                         "--retry-queues", "none-here",
                         upstream="amqps://localhost:%d" % front.tls_port)
    c = amqp_raw.RawClient(rb.port)
    try:
        c.handshake(broker.user, broker.password, broker.vhost)
        code, text = c.expect_connection_close()[:2]
        c.send(amqp_raw.connection_close_ok())
        c.wait_eof()
    finally:
        c.close()
    assert (code, text) == (320, "CONNECTION_FORCED - no upstream reachable")
    line = rb.wait_log("upstream_attempt_failed")
    assert line["upstream"] == "localhost:%d" % front.tls_port
    assert reason in line["error"], line
    assert rb.log_lines("session_close", reason="no upstream reachable")
    beside.channel().queue_declare("", exclusive=True)
    beside.close()
