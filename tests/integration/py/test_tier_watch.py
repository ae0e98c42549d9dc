"""rebound watches the tiers and dead-letter queues it hands copies to
(README, "Tiers that stop giving copies back"): a tier whose oldest copy is
older than its delay plus --tier-grace is overdue (a warn line, a gauge, a
flag in /v1/queues); one overdue by far more is moved back to its source
queue by rebound; a source queue deleted while copies wait in its tiers is
reported. Real pika clients through rebound against the real broker.

A tier that keeps copies past their delay cannot be made on one node on
demand (the cluster test in test_cluster.py makes a real one): here the
stuck copy is one the test puts into the tier with a last-failed-at ten
minutes ago, which is what such a copy looks like to rebound."""
import datetime
import json
import os
import re
import shutil
import subprocess

import pika
import yaml

import rbtest
from retryhelp import count_of, direct, dlq, pump, tier
from test_admin import admin_rebound, get, metrics

assert direct  # a fixture

PREFIX = "rebound-"
RULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                     "..", "deploy", "prometheus", "rules.yml")


def promtool(*args):
    """promtool (Debian's prometheus package, which scripts/setup.sh
    installs) on the shipped rules; its output if it succeeds."""
    assert shutil.which("promtool"), "promtool missing: run scripts/setup.sh"
    p = subprocess.run(["promtool", *args], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def watch_rebound(factory, q, *extra):
    return admin_rebound(factory, "--retry-queues", q, "--retry-tiers", "30s",
                         "--max-attempts", "3", "--tier-watch", "200ms",
                         "--tier-grace", "1s", *extra)


def series(name, q, t="30s"):
    return '%s{queue="%s",tier="%s"}' % (name, q, t)


def wait_metric(rb, key, want, timeout=20):
    return rbtest.wait_until(
        lambda: metrics(rb.admin_port).get(key) == want, timeout,
        lambda: "%s == %r (now %r)" % (key, want,
                                       metrics(rb.admin_port).get(key)))


def queue_view(rb, q):
    status, _, body = get(rb.admin_port, "/v1/queues")
    assert status == 200
    for entry in json.loads(body)["queues"]:
        if entry["name"] == q:
            return entry
    raise AssertionError("%s not in /v1/queues: %s" % (q, body))


def fail_once(rb, broker, q, body, conn=None, **declare):
    """Publish `body` to q (declared with `declare`, else durable) and nack
    its delivery once through rebound, on `conn` or a new connection: its
    copy waits in the 30s tier."""
    conn = conn or rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, **(declare or {"durable": True}))
    ch.basic_publish("", q, body, pika.BasicProperties(delivery_mode=2))
    got = []

    def on_message(chan, method, props, b):
        got.append(b)
        chan.basic_nack(method.delivery_tag, requeue=True)

    tag = ch.basic_consume(q, on_message)
    pump(conn, lambda: got, 10, lambda: "a delivery of %s" % q)
    ch.basic_cancel(tag)
    return conn, ch


def wait_depth(direct, name, n, timeout=10):
    def depth():
        ch = direct.conn.channel()
        try:
            return ch.queue_declare(name, passive=True).method.message_count
        finally:
            ch.close()
    rbtest.wait_until(lambda: depth() == n, timeout,
                      lambda: "%s holding %d (now %d)" % (name, n, depth()))


def empty_tier(rb, direct, q):
    """Purge q's tier, once rebound has looked at it, until rebound sees it
    empty (a look holds the oldest copy for a moment, out of a purge's
    reach: that purge is repeated)."""
    name = tier(q, "30s")
    age = series("rebound_tier_oldest_age_seconds", q)
    rbtest.wait_until(lambda: age in metrics(rb.admin_port), 10,
                      "a look into %s" % name)

    def empty():
        direct.conn.channel().queue_purge(name)
        direct.conn.sleep(0.3)
        return metrics(rb.admin_port).get(
            series("rebound_tier_depth", q)) == 0.0
    rbtest.wait_until(empty, 20, "%s seen empty" % name)
    wait_depth(direct, name, 0)


def stuck_copy(direct, q, body):
    """A copy in q's tier that failed ten minutes ago."""
    then = datetime.datetime.now(datetime.timezone.utc).replace(
        microsecond=0) - datetime.timedelta(minutes=10)
    headers = {PREFIX + "retry-count": 1, PREFIX + "source-queue": q,
               PREFIX + "first-failed-at": then, PREFIX + "last-failed-at": then}
    ch = direct.conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", tier(q, "30s"), body,
                     pika.BasicProperties(delivery_mode=2, headers=headers,
                                          message_id="stuck-1"))
    ch.close()


def test_overdue_tier_reported_until_it_empties(rebound_factory, broker,
                                                direct):
    q = direct.own(rbtest.uniq("watch"))
    direct.own(dlq(q))
    rb = watch_rebound(rebound_factory, q, "--tier-heal-after", "off")
    fail_once(rb, broker, q, b"fresh")
    wait_depth(direct, tier(q, "30s"), 1)
    wait_metric(rb, series("rebound_tier_depth", q), 1.0)
    assert metrics(rb.admin_port)[series("rebound_tier_overdue", q)] == 0.0
    assert "tier overdue" not in " ".join(queue_view(rb, q)["flags"])

    empty_tier(rb, direct, q)
    stuck_copy(direct, q, b"stuck")
    wait_metric(rb, series("rebound_tier_overdue", q), 1.0)
    m = metrics(rb.admin_port)
    assert m[series("rebound_tier_oldest_age_seconds", q)] >= 590, m
    line = rb.wait_log("tier_overdue", queue=q)
    assert line["tier"] == tier(q, "30s") and line["level"] == "warn", line
    view = queue_view(rb, q)
    assert any(f.startswith("tier overdue") for f in view["flags"]), view
    t = [x for x in view["tiers"] if x["tier"] == "30s"][0]
    assert t["overdue"] is True and t["depth"] == 1 and t["healed"] == 0, t
    # looked at, given back: it stays, in its place
    wait_depth(direct, tier(q, "30s"), 1)

    empty_tier(rb, direct, q)
    wait_metric(rb, series("rebound_tier_overdue", q), 0.0)
    rb.wait_log("tier_overdue_ended", queue=q)
    assert not queue_view(rb, q)["flags"]


def test_copy_overdue_by_far_goes_back_to_its_source(rebound_factory, broker,
                                                     direct):
    q = direct.own(rbtest.uniq("heal"))
    direct.own(dlq(q))
    rb = watch_rebound(rebound_factory, q, "--tier-heal-after", "1s")
    conn, ch = fail_once(rb, broker, q, b"fresh")
    wait_depth(direct, tier(q, "30s"), 1)
    # a copy on time is looked at and left where it is, round after round
    age = series("rebound_tier_oldest_age_seconds", q)
    rbtest.wait_until(lambda: age in metrics(rb.admin_port), 10,
                      "the fresh copy looked at")
    assert metrics(rb.admin_port)[age] < 30
    conn.sleep(1.0)
    assert not rb.log_lines("tier_healed")
    wait_depth(direct, tier(q, "30s"), 1)

    empty_tier(rb, direct, q)
    stuck_copy(direct, q, b"stuck")
    line = rb.wait_log("tier_healed", queue=q)
    assert line["moved"] == "1" and line["tier"] == tier(q, "30s"), line
    assert int(line["oldest_age_s"]) >= 590, line
    wait_metric(rb, series("rebound_tier_copies_healed_total", q), 1.0)
    got = []

    def on_message(chan, method, props, body):
        got.append((body, props))
        chan.basic_ack(method.delivery_tag)

    ch.basic_consume(q, on_message)
    pump(conn, lambda: got, 10, lambda: "the healed copy back in %s" % q)
    body, props = got[0]
    assert body == b"stuck" and props.message_id == "stuck-1"
    assert count_of(props) == 1, props.headers  # its attempt, as it was
    assert PREFIX + "tier-healed-at" in props.headers, props.headers
    wait_depth(direct, tier(q, "30s"), 0)
    view = queue_view(rb, q)
    t = [x for x in view["tiers"] if x["tier"] == "30s"][0]
    assert t["healed"] == 1 and t["overdue"] is False, t
    conn.sleep(1.0)  # more rounds: nothing else moves
    assert [b for b, _ in got] == [b"stuck"]
    assert len(rb.log_lines("tier_healed")) == 1
    conn.close()


def test_source_deleted_under_its_tier_is_reported(rebound_factory, broker,
                                                   direct):
    q = direct.own(rbtest.uniq("gone"))
    direct.own(dlq(q))
    rb = watch_rebound(rebound_factory, q)
    conn, _ = fail_once(rb, broker, q, b"waiting")
    wait_depth(direct, tier(q, "30s"), 1)
    wait_metric(rb, series("rebound_tier_depth", q), 1.0)
    key = series("rebound_source_queue_missing", q)
    assert metrics(rb.admin_port)[key] == 0.0

    direct.conn.channel().queue_delete(q)
    wait_metric(rb, key, 1.0)
    line = rb.wait_log("source_queue_missing", queue=q)
    assert line["depth"] == "1" and line["level"] == "warn", line
    view = queue_view(rb, q)
    assert any(f.startswith("source missing") for f in view["flags"]), view

    direct.conn.channel().queue_declare(q, durable=True)
    wait_metric(rb, key, 0.0)
    rb.wait_log("source_queue_missing_ended", queue=q)
    conn.close()



def test_tier_deleted_with_copies_is_reported(rebound_factory, broker,
                                              direct):
    """An operator deleting a tier that held copies loses them: rebound
    cannot bring them back, but says so."""
    q = direct.own(rbtest.uniq("tdel"))
    direct.own(dlq(q))
    rb = watch_rebound(rebound_factory, q)
    conn, _ = fail_once(rb, broker, q, b"lost with its tier")
    wait_metric(rb, series("rebound_tier_depth", q), 1.0)
    direct.conn.channel().queue_delete(tier(q, "30s"))
    line = rb.wait_log("tier_deleted", queue=q)
    assert line["depth_before"] == "1" and line["level"] == "warn", line
    t = [x for x in queue_view(rb, q)["tiers"] if x["tier"] == "30s"][0]
    assert t["exists"] is False and t["depth"] == 0, t
    conn.close()


def test_exclusive_source_is_watched_quietly(rebound_factory, broker, direct):
    """An exclusive source queue is its client's connection's alone: the
    watch's look at it is refused (405), which says it exists."""
    q = direct.own(rbtest.uniq("excl"))
    direct.own(dlq(q))
    rb = watch_rebound(rebound_factory, q)
    conn, _ = fail_once(rb, broker, q, b"m", exclusive=True)
    wait_metric(rb, series("rebound_tier_depth", q), 1.0)
    conn.sleep(1.0)  # rounds
    m = metrics(rb.admin_port)
    assert m[series("rebound_source_queue_missing", q)] == 0.0, m
    assert m["rebound_tier_watch_failures_total"] == 0.0, m
    assert not rb.log_lines("tier_watch_failed")
    assert not rb.log_lines("source_queue_missing")
    conn.close()

def test_alert_rules_use_exported_metrics(rebound_factory):
    """deploy/prometheus/rules.yml alerts on what rebound exports: every
    metric a rule names is one of its families, and the tier watch's
    findings each have a rule."""
    rb = admin_rebound(rebound_factory)
    _, _, body = get(rb.admin_port, "/metrics")
    declared = set(re.findall(r"^# TYPE (\S+) ", body, re.M))
    rules = [r for g in yaml.safe_load(open(RULES))["groups"]
             for r in g["rules"]]
    used = set()
    for r in rules:
        names = set(re.findall(r"\b(rebound_[a-z_]+)", r["expr"]))
        assert names, r
        used |= names
    assert used <= declared, sorted(used - declared)
    assert {"rebound_tier_overdue", "rebound_source_queue_missing",
            "rebound_tier_copies_healed_total",
            "rebound_tier_watch_failures_total"} <= used
    promtool("check", "rules", RULES)


def scrape(port, path):
    """{series: value} of a Prometheus text page, series as written."""
    status, _, body = get(port, path)
    assert status == 200, (path, status, body[:200])
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def broker_queue_metrics(port):
    m = scrape(port, "/metrics/detailed?family=queue_coarse_metrics")
    return {k: v for k, v in m.items()
            if k.startswith("rabbitmq_detailed_queue_messages")}


def backlog(port, name):
    """Messages the broker holds in queue `name` that are neither ready
    nor unacked, from its own metrics."""
    m = broker_queue_metrics(port)
    key = '{vhost="/",queue="%s"}' % name
    return (m.get("rabbitmq_detailed_queue_messages" + key, 0)
            - m.get("rabbitmq_detailed_queue_messages_ready" + key, 0)
            - m.get("rabbitmq_detailed_queue_messages_unacked" + key, 0))


def backlog_alerts(tmp_path, label, scrapes):
    """Run ReboundTierDeadLetterBacklog over `scrapes` (each series held
    for 5 minutes) in promtool; the alerts it fires at 1 and at 5 minutes,
    as (minute, queue, summary)."""
    case = {"interval": "1m", "input_series": [
        {"series": k, "values": "%sx5" % repr(v)}
        for scrape_ in scrapes for k, v in scrape_.items()]}
    fired = []
    for minute in (1, 5):
        # promtool prints the alerts it got when they differ from those
        # expected: expect none and read what it says.
        t = dict(case, alert_rule_test=[{
            "eval_time": "%dm" % minute,
            "alertname": "ReboundTierDeadLetterBacklog", "exp_alerts": []}])
        path = tmp_path / ("%s-%d.yml" % (label, minute))
        path.write_text(yaml.safe_dump({"rule_files": [os.path.abspath(RULES)],
                                        "evaluation_interval": "1m",
                                        "tests": [t]}))
        p = subprocess.run(["promtool", "test", "rules", str(path)],
                           capture_output=True, text=True, timeout=60)
        out = p.stdout + p.stderr
        if p.returncode == 0:
            continue
        got = re.findall(r'queue="([^"]+)".*?summary="([^"]*)"', out, re.S)
        assert got, out
        fired += [(minute, q, s) for q, s in got]
    return fired


def test_dead_letter_backlog_alert(rebound_factory, broker, direct, tmp_path):
    """Copies a quorum tier has expired and dead-letters at-least-once, but
    cannot hand over, wait in its `messages`, not its `messages_ready`:
    no AMQP client sees them, rebound's watch included (seen on a cluster
    while the node leading the source is away; made here by deleting the
    source, so the broker can route them nowhere). The shipped rule
    ReboundTierDeadLetterBacklog reads the broker's own metrics for the
    tiers rebound reports: run by promtool on real scrapes of this broker
    and of rebound, it fires for that tier after its 2 minutes, and not
    on the scrapes taken before the fault."""
    assert shutil.which("promtool"), "promtool missing: run scripts/setup.sh"
    port = broker.env().get("REBOUND_TEST_BROKER_PROMETHEUS_PORT")
    assert port, "the test broker serves no metrics (scripts/broker.sh)"
    q = direct.own(rbtest.uniq("backlog"))
    name = direct.own(tier(q, "30s"))
    direct.own(dlq(q))
    rb = watch_rebound(rebound_factory, q)
    conn, _ = fail_once(rb, broker, q, b"m", durable=True,
                        arguments={"x-queue-type": "quorum"})
    assert broker.queue_type(name) == "quorum"
    wait_metric(rb, series("rebound_tier_depth", q), 1.0)
    before = [broker_queue_metrics(port), tier_names(rb)]

    direct.conn.channel().queue_delete(q)
    empty_tier(rb, direct, q)
    ch = direct.conn.channel()
    ch.basic_publish("", name, b"expired",
                     pika.BasicProperties(delivery_mode=2, expiration="1"))
    rbtest.wait_until(lambda: backlog(port, name) == 1, 30,
                      lambda: "%s's backlog 1 (now %r)" % (
                          name, backlog(port, name)))
    assert metrics(rb.admin_port)[series("rebound_tier_depth", q)] == 0.0
    after = [broker_queue_metrics(port), tier_names(rb)]

    assert backlog_alerts(tmp_path, "before", before) == []
    fired = backlog_alerts(tmp_path, "after", after)
    assert [(m, q_) for m, q_, _ in fired] == [(5, name)], fired
    assert "holds 1 expired copies" in fired[0][2], fired
    conn.close()


def tier_names(rb):
    return {k: v for k, v in scrape(rb.admin_port, "/metrics").items()
            if k.startswith("rebound_tier_queue_info{")}


def test_no_login_to_watch_with_is_said(rebound_factory, broker, direct):
    """With retry_connection: shared rebound keeps no client login, so it
    cannot look at the tiers: said once, counted per copy, not silent."""
    q = direct.own(rbtest.uniq("nologin"))
    direct.own(dlq(q))
    rb = watch_rebound(rebound_factory, q, "--retry-connection", "shared")
    conn, _ = fail_once(rb, broker, q, b"m")
    line = rb.wait_log("tier_watch_no_login")
    assert "shared" in line["reason"], line
    wait_metric(rb, "rebound_tiers_unwatched_total", 1.0)
    conn.sleep(0.6)
    assert series("rebound_tier_depth", q) not in metrics(rb.admin_port)
    conn.close()


def test_user_who_may_no_longer_read_the_tier(rebound_factory, broker, ctl,
                                              direct):
    """The watch logs in as the client: once that user may no longer read
    the tier (permissions changed), its copies cannot be looked at. Said
    and counted, the depth still shown."""
    import os
    user = "rbt-wread-%d" % os.getpid()
    q = direct.own("rbt-wread-%d-q" % os.getpid())
    direct.own(dlq(q))
    ctl.ctl("add_user", user, "pw")
    try:
        ctl.ctl("set_permissions", "-p", broker.vhost, user, ".*", ".*", ".*")
        rb = watch_rebound(rebound_factory, q)
        params = rb.pika_params(broker)
        params.credentials = pika.PlainCredentials(user, "pw")
        conn, _ = fail_once(rb, broker, q, b"m",
                            conn=pika.BlockingConnection(params))
        wait_metric(rb, series("rebound_tier_depth", q), 1.0)
        assert not rb.log_lines("tier_watch_failed")
        # read only the source queue from now on
        ctl.ctl("set_permissions", "-p", broker.vhost, user, ".*", ".*",
                "^rbt-wread-[0-9]+-q$")
        empty_tier(rb, direct, q)  # the next copy is looked at at once
        direct.conn.channel().basic_publish(
            "", tier(q, "30s"), b"copy", pika.BasicProperties(headers={
                PREFIX + "last-failed-at": datetime.datetime.now(
                    datetime.timezone.utc).replace(microsecond=0)}))
        line = rb.wait_log("tier_watch_failed", step="look into a tier")
        assert line["status"] == "refused by the broker", line
        assert line["user"] == user, line
        assert metrics(rb.admin_port)["rebound_tier_watch_failures_total"] >= 1
        assert metrics(rb.admin_port)[series("rebound_tier_depth", q)] == 1.0
        conn.close()
    finally:
        ctl.ctl("delete_user", user)
