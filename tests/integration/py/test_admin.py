"""The admin endpoint through the real rebound: /healthz, /readyz, /metrics
in Prometheus text format, status codes, and metric values that match known
traffic exactly."""
import http.client
import re
import signal
import time

import pika

import rbtest

# a sample line: name{label="value",...} number
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*",?)*\})? '
                    r'(-?[0-9.eE+-]+|\+Inf|NaN)$')


def get(port, path, method="GET"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request(method, path)
    r = c.getresponse()
    body = r.read().decode()
    c.close()
    return r.status, dict(r.getheaders()), body


def metrics(port):
    status, headers, body = get(port, "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    values, types = {}, {}
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        if line.startswith("# HELP ") or not line:
            continue
        m = SAMPLE.match(line)
        assert m, "not Prometheus text format: %r" % line
        key, value = line.rsplit(" ", 1)
        values[key] = float(value)
    # every sample belongs to a declared family
    for key in values:
        base = key.split("{")[0]
        fam = re.sub(r"_(bucket|sum|count)$", "", base)
        assert base in types or fam in types, "undeclared metric %s" % key
    return values


def admin_rebound(factory, *args, **kw):
    port = rbtest.free_port()
    rb = factory("--admin", "127.0.0.1:%d" % port, *args, **kw)
    rb.admin_port = port
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            if get(port, "/healthz")[0] == 200:
                return rb
        except OSError:
            time.sleep(0.05)
    raise AssertionError("admin endpoint did not answer")


def test_endpoints_and_status_codes(rebound_factory):
    rb = admin_rebound(rebound_factory)
    assert get(rb.admin_port, "/healthz")[:1] == (200,)
    assert get(rb.admin_port, "/healthz")[2] == "ok\n"
    rbtest.wait_until(lambda: get(rb.admin_port, "/readyz")[0] == 200, 10,
                      "ready once the upstream is probed")
    status, headers, _ = get(rb.admin_port, "/metrics", method="POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert get(rb.admin_port, "/nope")[0] == 404
    assert get(rb.admin_port, "/metrics?x=1")[0] == 200
    status, headers, body = get(rb.admin_port, "/healthz", method="HEAD")
    assert status == 200 and body == "" and headers["Content-Length"] == "3"
    v = metrics(rb.admin_port)
    assert v["rebound_ready"] == 1
    assert v["rebound_client_connections"] == 0


def test_readyz_reports_unreachable_upstream(rebound_factory):
    rb = admin_rebound(rebound_factory, upstream="127.0.0.1:1")
    rbtest.wait_until(lambda: get(rb.admin_port, "/readyz")[0] == 503, 10,
                      "not ready without an upstream")
    status, _, body = get(rb.admin_port, "/readyz")
    assert "127.0.0.1:1" in body and "connection refused" in body
    assert metrics(rb.admin_port)["rebound_ready"] == 0


ZERO_POLICY = """retry:
  policies:
    - queues: ["%s"]
      tiers: [%s]
      processing_timeout: %s
"""


def queue_series(v, family, q):
    return {k: n for k, n in v.items()
            if k.startswith('%s{queue="%s"' % (family, q))}


def test_a_queues_retry_series_exist_at_zero_once_seen(rebound_factory,
                                                       broker, tmp_path):
    """Once the broker shows a queue with a policy (its consume-ok), its
    retry counters exist at 0 before any failure: one series per tier and
    per dead-letter reason the policy can give. A queue without a policy
    gets none. A reload that adds a tier and a processing timeout adds
    their series."""
    q, other = rbtest.uniq("admin-zero"), rbtest.uniq("admin-nopolicy")
    cfg = tmp_path / "rebound.yaml"
    cfg.write_text(ZERO_POLICY % (q, "100ms, 2s", "off"))
    rb = admin_rebound(rebound_factory, "--config", str(cfg))
    conn = rb.pika(broker)
    ch = conn.channel()
    for name in (q, other):
        ch.queue_declare(name, auto_delete=True)
        ch.basic_consume(name, lambda *_: None)
    retries = "rebound_retries_published_total"
    dead = "rebound_dead_lettered_total"

    def r(tier):
        return '%s{queue="%s",tier="%s"}' % (retries, q, tier)

    def d(reason):
        return '%s{queue="%s",reason="%s"}' % (dead, q, reason)

    v = metrics(rb.admin_port)
    assert queue_series(v, retries, q) == {r("100ms"): 0, r("2s"): 0}
    assert queue_series(v, dead, q) == {
        d("max-attempts"): 0, d("consumer-lost"): 0, d("frame-max"): 0,
        d("tier-refused"): 0}
    assert not queue_series(v, retries, other)
    assert not queue_series(v, dead, other)
    cfg.write_text(ZERO_POLICY % (q, "100ms, 2s, 5s", "1m"))
    rb.signal(signal.SIGHUP)
    rb.wait_log("config_reloaded", generation="1")
    v = metrics(rb.admin_port)
    assert queue_series(v, retries, q) == {r("100ms"): 0, r("2s"): 0,
                                           r("5s"): 0}
    assert v[d("processing-timeout")] == 0
    assert not queue_series(v, retries, other)
    conn.close()


def test_metrics_after_one_poison_message(rebound_factory, broker):
    """max_attempts 4: exactly 3 retries (one per tier) and 1 dead-letter."""
    rb = admin_rebound(rebound_factory, "--retry-tiers", "100ms,200ms,300ms",
                       "--retry-queues", "rbt-admin-poison*")
    q = rbtest.uniq("admin-poison")
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.basic_publish("", q, b"poison")
    seen = []
    ch.basic_consume(q, lambda c, m, p, b: (seen.append(1), c.basic_nack(m.delivery_tag, requeue=True)))
    deadline = time.time() + 15
    while len(seen) < 4 and time.time() < deadline:
        conn.process_data_events(0.1)
    assert len(seen) == 4
    rbtest.wait_until(lambda: metrics(rb.admin_port).get(
        'rebound_dead_lettered_total{queue="%s",reason="max-attempts"}' % q) == 1,
        10, "dead-letter counted")
    v = metrics(rb.admin_port)
    retries = {k: n for k, n in v.items()
               if k.startswith('rebound_retries_published_total{queue="%s"' % q)}
    assert retries == {
        'rebound_retries_published_total{queue="%s",tier="100ms"}' % q: 1,
        'rebound_retries_published_total{queue="%s",tier="200ms"}' % q: 1,
        'rebound_retries_published_total{queue="%s",tier="300ms"}' % q: 1,
    }
    assert v["rebound_retry_latency_seconds_count"] == 4
    assert v['rebound_retry_latency_seconds_bucket{le="+Inf"}'] == 4
    assert v["rebound_retries_pending"] == 0
    assert v["rebound_client_connections"] == 1
    assert v["rebound_client_connections_opened_total"] == 1
    assert v["rebound_frames_from_clients_total"] > 0
    ch.queue_delete(q)
    for t in ("100ms", "200ms", "300ms"):
        ch.queue_delete("%s.retry.%s" % (q, t))
    ch.queue_delete(q + ".dlq")
    conn.close()
    rbtest.wait_until(lambda: metrics(rb.admin_port)["rebound_client_connections"] == 0,
                      10, "connection gone")
    v = metrics(rb.admin_port)
    assert v['rebound_client_connection_closes_total{reason="client closed the connection"}'] == 1


def test_readyz_503_while_draining(rebound_factory, broker):
    rb = admin_rebound(rebound_factory, "--drain-timeout", "3s")
    rbtest.wait_until(lambda: get(rb.admin_port, "/readyz")[0] == 200, 10, "ready")
    conn = rb.pika(broker)  # stays connected: the drain takes a while
    rb.proc.send_signal(signal.SIGTERM)
    rbtest.wait_until(lambda: get(rb.admin_port, "/readyz")[0] == 503, 5,
                      "not ready while draining")
    status, _, body = get(rb.admin_port, "/readyz")
    assert "draining" in body
    assert get(rb.admin_port, "/healthz")[0] == 200
    try:
        conn.close()
    except Exception:
        pass


def test_json_log_lines_parse(broker, tmp_path):
    """--log-format json: every line is one JSON object; a connection's open
    and close lines carry peer, user, vhost, duration, bytes and reason,
    never the password."""
    import json
    import os
    import subprocess
    port = rbtest.free_port()
    log = tmp_path / "rebound.json.log"
    proc = subprocess.Popen([os.environ["REBOUND_BIN"], "--log-format", "json",
                             "--admin", "off", "--listen", "127.0.0.1:%d" % port,
                             "--upstream", broker.addr],
                            stderr=open(log, "w"),
                            preexec_fn=rbtest.die_with_test)
    try:
        rbtest.wait_until(lambda: b'"msg":"listening"' in log.read_bytes(), 10,
                          "listening line")
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            host="127.0.0.1", port=port,
            credentials=pika.PlainCredentials("guest", "guest")))
        conn.channel().queue_declare(rbtest.uniq("json"), exclusive=True)
        conn.close()
        rbtest.wait_until(lambda: b'"msg":"session_close"' in log.read_bytes(), 10,
                          "session_close line")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    lines = [json.loads(l) for l in log.read_text().splitlines()]
    assert all({"ts", "level", "msg"} <= set(l) for l in lines)
    opened = [l for l in lines if l["msg"] == "session_open"][0]
    closed = [l for l in lines if l["msg"] == "session_close"][0]
    assert opened["user"] == "guest" and opened["vhost"] == "/"
    for key in ("peer", "user", "vhost", "duration_ms", "bytes_from_client",
                "bytes_to_client", "reason"):
        assert key in closed, key
    assert closed["reason"] == "client closed the connection"
    assert "guest\\u0000guest" not in log.read_text()
    assert lines[-1]["msg"] == "exit"


def test_dashboard_uses_only_exported_metrics(rebound_factory):
    """deploy/grafana/rebound.json queries only metrics rebound exports."""
    import json
    import os
    rb = admin_rebound(rebound_factory)
    _, _, body = get(rb.admin_port, "/metrics")
    declared = set(re.findall(r"^# TYPE (\S+) ", body, re.M))
    dash = json.load(open(os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                       "deploy", "grafana", "rebound.json")))
    used = set()
    for p in dash["panels"]:
        for t in p["targets"]:
            used |= set(re.findall(r"\b((?:rebound|process)_[a-z_]+)",
                                   t["expr"]))
    assert used, "the dashboard queries nothing"
    missing = {u for u in used if re.sub(r"_bucket$", "", u) not in declared}
    assert not missing, "dashboard uses unknown metrics: %s" % sorted(missing)
    # every query follows the dashboard's instance and pod variables
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"instance", "pod"} <= names
    for p in dash["panels"]:
        for t in p["targets"]:
            for name in re.findall(r"\b((?:rebound|process)_[a-z_]+)\b",
                                   t["expr"]):
                assert name + '{instance=~"$instance",pod=~"$pod"}' in \
                    t["expr"], "%s in %r ignores $instance/$pod" % (
                        name, t["expr"])


# How a published copy can fail: rebound_retry_fallbacks_total's reasons.
COPY_FAILURES = ("nacked by the broker", "rebound's channel was closed",
                 "rebound's channel was closed before the copy",
                 "confirm timeout", "returned by the broker (unroutable)")


def test_metric_families_follow_the_conventions(rebound_factory):
    """No gauge shares its name with a counter's family (x and x_total),
    the process_* families have their standard names, rebound_build_info
    is there, and labelled counters show their known values at 0 before
    anything happened."""
    rb = admin_rebound(rebound_factory)
    _, _, body = get(rb.admin_port, "/metrics")
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", body, re.M))
    for name, kind in types.items():
        if kind == "counter":
            assert name.endswith("_total"), name
            assert name[:-len("_total")] not in types, \
                "gauge %s clashes with counter %s" % (name[:-6], name)
    for name, kind in [("process_cpu_seconds_total", "counter"),
                       ("process_resident_memory_bytes", "gauge"),
                       ("process_virtual_memory_bytes", "gauge"),
                       ("process_open_fds", "gauge"),
                       ("process_max_fds", "gauge"),
                       ("process_start_time_seconds", "gauge"),
                       ("rebound_build_info", "gauge")]:
        assert types.get(name) == kind, name
    assert not [n for n in types if n.startswith("rebound_process_")]
    v = metrics(rb.admin_port)
    info = [k for k in v if k.startswith("rebound_build_info{")]
    assert len(info) == 1 and 'version="' in info[0] and v[info[0]] == 1
    assert abs(v["process_start_time_seconds"] - time.time()) < 60
    assert v['rebound_client_connection_closes_total'
             '{reason="client closed the connection"}'] == 0
    assert v['rebound_client_connection_closes_total'
             '{reason="rebound shutting down"}'] == 0
    assert v['rebound_retry_passthrough_total'
             '{reason="no policy for the queue"}'] == 0
    assert v['rebound_retry_passthrough_total'
             '{reason="no copy fits frame-max"}'] == 0
    assert v['rebound_retry_passthrough_total'
             '{reason="channel not open or untracked"}'] == 0
    fallbacks = {k: n for k, n in v.items()
                 if k.startswith("rebound_retry_fallbacks_total{")}
    assert fallbacks == {'rebound_retry_fallbacks_total{reason="%s"}' % r: 0
                         for r in COPY_FAILURES}
    delayed = {k.split('"')[1]: n for k, n in v.items()
               if k.startswith("rebound_retry_requeues_delayed_total{")}
    assert set(delayed) == set(COPY_FAILURES) | {
        "delivery not kept", "content header does not decode",
        "copy could not be built",
        "broker blocks publishing", "rebound's channel not ready",
        "no policy for the queue", "server-named queue (amq.*)",
        "tier or dead-letter name over 255 bytes",
        "tier or dead-letter queue refused", "no copy fits frame-max",
        "queue not known (empty name, no named declare)"}
    assert set(delayed.values()) == {0}
    upstream = rb.upstream.replace("amqp://", "").split("@")[-1].rstrip("/")
    assert v['rebound_upstream_connect_failures_total{address="%s"}'
             % upstream] == 0


def test_v1_status_json(rebound_factory, broker):
    import json
    rb = admin_rebound(rebound_factory, "--retry-queues", "orders*,print.*",
                       "--max-attempts", "5")
    conn = rb.pika(broker)
    conn.channel()
    conn.channel()
    status, headers, body = get(rb.admin_port, "/v1/status")
    assert status == 200 and headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    assert doc["listeners"] == [rb.addr]
    assert len(doc["sessions"]) == 1
    s = doc["sessions"][0]
    assert s["user"] == "guest" and s["vhost"] == "/" and s["state"] == "open"
    assert s["channels"] == 2 and s["bytes_from_client"] > 0
    assert doc["config"]["retry"]["policies"][0]["queues"] == ["orders*", "print.*"]
    assert doc["config"]["retry"]["policies"][0]["max_attempts"] == 5
    assert doc["config"]["retry"]["policies"][0]["tiers"] == ["1s", "2s", "4s"]
    assert "guest" not in json.dumps(doc["config"])  # no credentials anywhere
    conn.close()


def test_latency_histograms_match_traffic(rebound_factory, broker):
    """5 confirmed publishes -> 5 publish-to-confirm observations; 3
    deliveries acked (1 by nack requeue=false) -> 3 processing observations
    under the queue's label."""
    rb = admin_rebound(rebound_factory, "--retry-queues", "none-here")
    q = rbtest.uniq("hist")
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, exclusive=True)
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", q, b"m%d" % i)
    ch2 = conn.channel()
    for i in range(3):
        m, _, _ = ch2.basic_get(q)
        time.sleep(0.02)
        if i < 2:
            ch2.basic_ack(m.delivery_tag)
        else:
            ch2.basic_nack(m.delivery_tag, requeue=False)
    ch2.basic_get(q, auto_ack=True)  # no-ack: never observed
    rbtest.wait_until(lambda: metrics(rb.admin_port).get(
        'rebound_consumer_processing_seconds_count{queue="%s"}' % q) == 3, 10,
        "three processing observations")
    v = metrics(rb.admin_port)
    assert v["rebound_publish_confirm_seconds_count"] == 5
    assert v['rebound_publish_confirm_seconds_bucket{le="+Inf"}'] == 5
    # each processing time was at least the 20 ms the consumer took
    assert v['rebound_consumer_processing_seconds_bucket{queue="%s",le="0.01"}' % q] == 0
    assert v['rebound_consumer_processing_seconds_sum{queue="%s"}' % q] >= 0.06
    conn.close()


def test_uncached_nack_counted_and_malformed_http(rebound_factory, broker):
    """A delivery over the cache bound: its nack goes to the broker after
    the tier delay and is counted, by queue; a malformed request to the
    admin endpoint gets 400."""
    import socket
    rb = admin_rebound(rebound_factory, "--cache-per-connection", "1KiB",
                       "--retry-queues", "rbt-uncached*")
    q = rbtest.uniq("uncached")
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, exclusive=True)
    ch.basic_publish("", q, b"x" * 4096)  # bigger than the whole bound
    m, _, _ = ch.basic_get(q)
    ch.basic_nack(m.delivery_tag, requeue=True)
    t0 = time.monotonic()
    # the get waits behind the requeue, held for the tier delay (1 s)
    m, _, _ = ch.basic_get(q)
    assert m is not None and m.redelivered
    assert time.monotonic() - t0 >= 0.95
    ch.basic_ack(m.delivery_tag)
    v = metrics(rb.admin_port)
    assert v["rebound_uncached_nacks_total"] == 1
    assert v["rebound_uncached_deliveries_total"] == 2
    assert v['rebound_deliveries_not_kept_total{queue="%s",'
             'reason="cache bound reached"}' % q] == 2
    assert v['rebound_retry_requeues_delayed_total'
             '{reason="delivery not kept"}'] == 1
    conn.close()
    s = socket.create_connection(("127.0.0.1", rb.admin_port), timeout=5)
    s.sendall(b"GET / HTTP/1.1\r\nHost x\r\n\r\n")
    assert s.recv(100).startswith(b"HTTP/1.1 400")
    s.close()
