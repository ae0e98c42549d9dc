"""`rebound dlq ...` (ls, show, redrive, purge) against the real broker,
on messages a real rebound parked and on messages put straight into a
dead-letter queue with the headers rebound gives a parked message.

Counts are read from the broker (a passive queue.declare); every check
is on exact counts and contents, not only on exit codes."""
import json
import re
import socket
import struct
import subprocess
import uuid
from collections import Counter
from datetime import datetime

import pika
import pytest

import rbtest
from dlqhelp import (EXIT_NOT_FOUND, EXIT_OK, EXIT_PARTIAL, EXIT_REFUSED,
                     EXIT_UNREACHABLE, EXIT_USAGE, MOVED, PREFIX, PROGRESS,
                     PURGED, WOULD_MOVE, cli, cli_env, cmd, consume_all,
                     count, declare_dlq, declare_queue, delete_user, get_all,
                     ids_in, parse_iso, park, put_parked, queue_process,
                     url, user, wait_count, window)
from retryhelp import direct, dlq

assert direct  # a fixture

TIERS = "100ms"
MAX_ATTEMPTS = 3
POISON_BODY = b'{"order": 7, "poison": true}'


def poison_props(mid="msg-dlq-1"):
    return pika.BasicProperties(
        content_type="application/json", delivery_mode=2, message_id=mid,
        correlation_id="corr-%s" % mid,
        headers={"app-tag": "keep-me", "n": 42})


@pytest.fixture
def parked(rebound_factory, broker, direct):
    """A rebound whose policy gives one fresh queue q tiers 100ms and
    max_attempts 3, and one poison message parked by it in q.dlq.
    Returns (rebound, q, (start, end) of the parking, deliveries)."""
    q = rbtest.uniq("dlqcli")
    rb = rebound_factory("--retry-queues", q, "--retry-tiers", TIERS,
                         "--max-attempts", str(MAX_ATTEMPTS))
    start, end = window()
    deliveries = park(rb, broker, direct, q, [(POISON_BODY, poison_props())],
                      MAX_ATTEMPTS)
    assert [d.count for d in deliveries] == [None, 1, 2]
    return rb, q, (start, end()), deliveries


def line_values(text):
    """{"key": [value, ...]} of every "key: value" line (stripped)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\s*([A-Za-z][\w-]*(?: \(\d+ bytes\))?):\s?(.*)$", line)
        if m:
            out.setdefault(m.group(1), []).append(m.group(2).strip())
    return out


# ---- 1. show -----------------------------------------------------------------


def test_show_prints_the_parked_message_and_leaves_it(parked, broker, ctl,
                                                      direct):
    """A poison message parked by rebound (max_attempts 3): show prints it
    with reason max-attempts, retry-count 3 (README: the parked copy counts
    every failed attempt; the deliveries carried none, 1, 2), its source
    queue and body; --json has the same; both leave it in the DLQ."""
    rb, q, (t0, t1), _ = parked
    d = dlq(q)

    run = cli(broker, "show", d)
    assert run.rc == EXIT_OK, run
    text = run.out
    blocks = re.findall(r"^\s*message (\d+)\b", text, re.M)
    assert blocks == ["1"], run
    v = line_values(text)
    assert v.get("source-queue") == [q], run
    assert v.get("retry-count") == [str(MAX_ATTEMPTS)], run
    assert v.get("reason") == ["max-attempts"], run
    for key in ("first-failed-at", "last-failed-at"):
        assert len(v.get(key, [])) == 1, run
        ts = parse_iso(v[key][0])
        assert t0 <= ts <= t1, (key, ts, t0, t1)
    # the body line: its size and preview (the exact layout last, below)
    m = re.findall(r"^\s*body\b.*?\((\d+) bytes\)\s*:?\s*(.*)$", text, re.M)
    assert len(m) == 1 and int(m[0][0]) == len(POISON_BODY), run
    preview = m[0][1]
    if preview.startswith('"'):  # the preview as a quoted (JSON) string
        preview = json.loads(preview)
    assert preview == POISON_BODY.decode(), run
    assert "msg-dlq-1" in text and "application/json" in text, run  # properties
    assert "app-tag" in text and "keep-me" in text, run  # headers
    wait_count(direct, d, 1)

    run = cli(broker, "show", d, "--json")
    assert run.rc == EXIT_OK, run
    doc = run.json()
    assert doc["queue"] == d
    assert len(doc["messages"]) == 1, doc
    m = doc["messages"][0]
    assert m["index"] == 1
    # the text show above got it without an ack; the broker requeued it
    assert m["redelivered"] is True, m
    assert m["exchange"] == "" and m["routing_key"] == d, m
    r = m["rebound"]
    assert r["source_queue"] == q
    assert r["retry_count"] == MAX_ATTEMPTS
    assert r["reason"] == "max-attempts"
    assert r["original_exchange"] == "" and r["original_routing_key"] == q
    assert r["redriven_at"] is None
    first, last = parse_iso(r["first_failed_at"]), parse_iso(r["last_failed_at"])
    assert t0 <= first <= last <= t1, (first, last, t0, t1)
    assert parse_iso(v["first-failed-at"][0]) == first
    p = m["properties"]
    assert p["message_id"] == "msg-dlq-1"
    assert p["correlation_id"] == "corr-msg-dlq-1"
    assert p["content_type"] == "application/json"
    assert p["delivery_mode"] == 2
    for absent in ("priority", "expiration", "reply_to", "user_id"):
        assert absent not in p, (absent, p)  # only the present ones
    h = m["headers"]
    assert h["app-tag"] == "keep-me" and h["n"] == 42, h
    assert h[PREFIX + "retry-count"] == MAX_ATTEMPTS
    assert h[PREFIX + "source-queue"] == q
    assert h[PREFIX + "dead-letter-reason"] == "max-attempts"
    assert parse_iso(h[PREFIX + "first-failed-at"]) == first
    assert m["body_size"] == len(POISON_BODY)
    assert m["body"] == POISON_BODY.decode()
    assert m["body_truncated"] is False

    # still there, and nothing left unacknowledged
    wait_count(direct, d, 1)
    rbtest.wait_until(lambda: ctl.queue(d) and ctl.queue(d)[1] == 0, 20,
                      "no unacked message in %s" % d, interval=0.2)
    got = get_all(direct, d, expect=1)
    assert len(got) == 1 and got[0][2] == POISON_BODY
    assert got[0][1].headers[PREFIX + "retry-count"] == MAX_ATTEMPTS

    # the body line: "body: (N bytes) preview"
    bodies = v.get("body", [])
    assert len(bodies) == 1 and bodies[0].startswith(
        "(%d bytes) " % len(POISON_BODY)), text


def test_show_limit_truncation_and_bad_utf8(broker, direct):
    """show's default limit is 10, --limit N shows N; a body over 1024
    bytes is previewed (1024 bytes, bad bytes as U+FFFD) and marked
    truncated; nothing is removed."""
    q = rbtest.uniq("dlqshow")
    d = dlq(q)
    big = b"\xff" + b"a" * 2999

    def body(i):
        return big if i == 0 else b"parked %d" % i
    put_parked(broker, direct, q, 12, body=body)
    run = cli(broker, "show", d, "--json")
    assert run.rc == EXIT_OK, run
    msgs = run.json()["messages"]
    assert [m["index"] for m in msgs] == list(range(1, 11)), run
    assert [m["properties"]["message_id"] for m in msgs] == \
        ["m-%06d" % i for i in range(10)]
    m0 = msgs[0]
    assert m0["body_size"] == 3000 and m0["body_truncated"] is True
    assert m0["body"] == "\ufffd" + "a" * 1023
    assert msgs[1]["body"] == "parked 1" and msgs[1]["body_truncated"] is False
    assert m0["rebound"]["retry_count"] == 3
    assert parse_iso(m0["rebound"]["first_failed_at"]) == \
        datetime(2024, 5, 1, 12, 0, 0)
    assert parse_iso(m0["headers"][PREFIX + "last-failed-at"]) == \
        datetime(2024, 5, 1, 12, 0, 3)
    wait_count(direct, d, 12)
    run = cli(broker, "show", d, "--json", "--limit", "3")
    assert run.rc == EXIT_OK, run
    assert len(run.json()["messages"]) == 3
    run = cli(broker, "show", d, "--json", "--limit", "50")
    assert run.rc == EXIT_OK, run
    assert len(run.json()["messages"]) == 12
    run = cli(broker, "show", d, "--limit", "2")
    assert run.rc == EXIT_OK, run
    assert re.findall(r"^\s*message (\d+)\b", run.out, re.M) == ["1", "2"], run
    wait_count(direct, d, 12)


# ---- 2. redrive of a parked message ------------------------------------------


def test_redrive_puts_it_back_with_the_count_reset(parked, broker, direct):
    """redrive: "moved 1"; the message is in q again without
    rebound-retry-count and rebound-dead-letter-reason, with
    rebound-redriven-at, body, properties and other headers as they were; a
    consumer through rebound that acks it leaves q and q.dlq at 0."""
    rb, q, _, deliveries = parked
    d = dlq(q)
    parked_copy = deliveries[-1].props.headers
    t0, t1 = window()
    run = cli(broker, "redrive", d)
    t1 = t1()
    assert run.rc == EXIT_OK, run
    assert run.one(MOVED) == 1, run
    wait_count(direct, d, 0)
    wait_count(direct, q, 1)

    conn = rb.pika(broker)
    ch = conn.channel()
    m, p, b = ch.basic_get(q)
    assert m is not None
    assert b == POISON_BODY
    want = poison_props()
    for name in ("content_type", "delivery_mode", "message_id",
                 "correlation_id"):
        assert getattr(p, name) == getattr(want, name), name
    h = p.headers
    assert h["app-tag"] == "keep-me" and h["n"] == 42, h
    assert PREFIX + "retry-count" not in h, h
    assert PREFIX + "dead-letter-reason" not in h, h
    redriven = h[PREFIX + "redriven-at"]
    assert t0 <= redriven <= t1, (redriven, t0, t1)
    # rebound's other headers are kept as they were
    assert h[PREFIX + "source-queue"] == q
    assert h[PREFIX + "original-routing-key"] == q
    assert h[PREFIX + "first-failed-at"] == parked_copy[PREFIX + "first-failed-at"]
    ch.basic_ack(m.delivery_tag)
    conn.close()
    wait_count(direct, q, 0)
    wait_count(direct, d, 0)


# ---- 3. a redriven message fails again ---------------------------------------


def test_redriven_message_is_retried_from_attempt_1(parked, broker, direct):
    """After a redrive, a consumer that nacks every delivery gets it exactly
    max_attempts more times (counts none, 1, 2), then it is parked again
    with count 3."""
    from retryhelp import PoisonConsumer
    rb, q, _, _ = parked
    d = dlq(q)
    run = cli(broker, "redrive", d)
    assert run.rc == EXIT_OK and run.one(MOVED) == 1, run
    wait_count(direct, d, 0)

    conn = rb.pika(broker)
    ch = conn.channel()
    cons = PoisonConsumer(conn, ch, q)
    cons.wait(MAX_ATTEMPTS, timeout=30)
    wait_count(direct, d, 1)
    late = cons.quiet_for(1.0)
    assert not late, [x.count for x in late]
    assert [x.count for x in cons.deliveries] == [None, 1, 2]
    assert all(x.body == POISON_BODY for x in cons.deliveries)
    assert all(PREFIX + "redriven-at" in x.props.headers
               for x in cons.deliveries)
    cons.cancel()
    conn.close()
    got = get_all(direct, d, expect=1)
    assert len(got) == 1, got
    h = got[0][1].headers
    assert h[PREFIX + "retry-count"] == MAX_ATTEMPTS
    assert h[PREFIX + "dead-letter-reason"] == "max-attempts"
    assert h["app-tag"] == "keep-me"
    wait_count(direct, q, 0)


# ---- 4. purge ----------------------------------------------------------------


def test_purge_removes_only_what_it_reports(broker, direct):
    q = rbtest.uniq("dlqpurge")
    d = dlq(q)
    declare_queue(direct, q)
    direct.publish(q, b"not parked")  # the source is never touched
    put_parked(broker, direct, q, 5)
    wait_count(direct, d, 5)

    run = cli(broker, "purge", d, "--limit", "2")
    assert run.rc == EXIT_OK, run
    assert run.one(PURGED) == 2, run
    wait_count(direct, d, 3)
    run = cli(broker, "purge", d)
    assert run.rc == EXIT_OK, run
    assert run.one(PURGED) == 3, run
    wait_count(direct, d, 0)
    run = cli(broker, "purge", d)
    assert run.rc == EXIT_OK and run.one(PURGED) == 0, run

    put_parked(broker, direct, q, 1, start=5)
    run = cli(broker, "purge", d, "--limit", "10")  # at most 10
    assert run.rc == EXIT_OK and run.one(PURGED) == 1, run
    wait_count(direct, d, 0)
    assert count(direct, q) == 1


# ---- 5. errors: refused, absent, unreachable; the password -------------------


def _no_secret(run, secret):
    assert secret not in run.out and secret not in run.err, run


def test_wrong_password_is_refused_exit_4(broker, direct):
    q = rbtest.uniq("dlqpw")
    put_parked(broker, direct, q, 1)
    pw = "wrong-%s" % uuid.uuid4().hex
    for args in (("ls", dlq(q)), ("show", dlq(q)), ("redrive", dlq(q)),
                 ("purge", dlq(q))):
        run = cli(broker, *args, url_=url(broker, password=pw))
        assert run.rc == EXIT_REFUSED, run
        assert "ACCESS_REFUSED" in run.error_line(), run
        _no_secret(run, pw)
    assert count(direct, dlq(q)) == 1  # nothing happened


def test_user_without_permissions_is_refused_exit_4(broker, ctl, direct):
    """A user with no access to the vhost, then one whose permissions
    exclude the DLQ: exit 4 with the broker's text; nothing moves."""
    q = rbtest.uniq("dlqperm")
    d = dlq(q)
    declare_queue(direct, q)
    put_parked(broker, direct, q, 2)
    name = rbtest.uniq("user")
    pw = "pw-%s" % uuid.uuid4().hex
    user(ctl, name, pw)
    try:
        u = url(broker, user=name, password=pw)
        run = cli(broker, "show", d, url_=u)
        assert run.rc == EXIT_REFUSED, run
        assert "access to vhost" in run.error_line(), run
        _no_secret(run, pw)

        # may only touch queues named like "nothing-of-this-test..."
        ctl.ctl("set_permissions", "-p", "/", name, "^nothing-", "^nothing-",
                "^nothing-")
        for args in (("show", d), ("redrive", d), ("purge", d),
                     ("purge", d, "--limit", "1")):
            run = cli(broker, *args, url_=u)
            assert run.rc == EXIT_REFUSED, run
            reason = run.error_line()
            assert "ACCESS_REFUSED" in reason, run
            assert d in reason and name in reason, run  # the broker's text
            _no_secret(run, pw)
        assert count(direct, d) == 2 and count(direct, q) == 0
    finally:
        delete_user(ctl, name)


def test_absent_queue_exit_5_and_not_created(broker, direct):
    absent = rbtest.uniq("absent") + ".dlq"
    direct.own(absent)
    for args in (("show", absent), ("redrive", absent), ("purge", absent),
                 ("purge", absent, "--limit", "3"),
                 ("redrive", absent, "--dry-run")):
        run = cli(broker, *args)
        assert run.rc == EXIT_NOT_FOUND, run
        assert absent in run.error_line(), run
        assert run.out.strip() == "" or not MOVED.search(run.out), run
    assert not direct.exists(absent)


def test_unreachable_broker_exit_3(broker):
    port = rbtest.free_port()
    pw = "secret-%s" % uuid.uuid4().hex
    for args in (("ls", "x.dlq"), ("show", "x.dlq"), ("redrive", "x.dlq"),
                 ("purge", "x.dlq")):
        run = cli(broker, *args, url_=url(broker, password=pw, port=port))
        assert run.rc == EXIT_UNREACHABLE, run
        assert str(port) in run.error_line(), run
        _no_secret(run, pw)


def test_usage_errors_exit_2(broker):
    for args in (("frobnicate",), ("show",), ("show", "a.dlq", "--limit", "x"),
                 ("purge", "a.dlq", "--limit", "-1"),
                 ("redrive", "a.dlq", "--bogus"),
                 # over the broker's 255 bytes: refused, never cut to a
                 # name that may be another queue
                 ("show", "q" * 300), ("redrive", "a.dlq", "--to", "q" * 256)):
        run = cli(broker, *args)
        assert run.rc == EXIT_USAGE, run
        assert run.error_line(), run
        assert not run.out.strip(), run
    run = cli(broker, "ls", "a.dlq", url_="http://127.0.0.1:1/")
    assert run.rc == EXIT_USAGE and run.error_line(), run


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def test_password_file_and_env_stay_off_the_command_line(broker, direct,
                                                         tmp_path):
    """--password-file FILE and REBOUND_PASSWORD: the password is used
    (right one: works; wrong one: exit 4) and appears neither in the
    output nor in the process's command line while it runs."""
    q = rbtest.uniq("dlqpwf")
    d = dlq(q)
    put_parked(broker, direct, q, 1)
    no_pw = url(broker, password=False)
    good = tmp_path / "good.pw"
    good.write_text(broker.password)
    good.chmod(0o600)

    run = cli(broker, "ls", d, "--json", "--password-file", str(good),
              url_=no_pw)
    assert run.rc == EXIT_OK, run
    assert [x["messages"] for x in run.json()["queues"] if x["name"] == d] == [1]
    run = cli(broker, "ls", d, "--json", url_=no_pw,
              env={"REBOUND_PASSWORD_FILE": str(good)})
    assert run.rc == EXIT_OK, run
    run = cli(broker, "ls", d, "--json", url_=no_pw,
              env={"REBOUND_PASSWORD": broker.password})
    assert run.rc == EXIT_OK, run
    assert [x["messages"] for x in run.json()["queues"] if x["name"] == d] == [1]

    wrong = "wrong-%s" % uuid.uuid4().hex
    bad = tmp_path / "bad.pw"
    bad.write_text(wrong)
    bad.chmod(0o600)
    run = cli(broker, "show", d, "--password-file", str(bad), url_=no_pw)
    assert run.rc == EXIT_REFUSED and "ACCESS_REFUSED" in run.error_line(), run
    _no_secret(run, wrong)
    run = cli(broker, "show", d, url_=no_pw, env={"REBOUND_PASSWORD": wrong})
    assert run.rc == EXIT_REFUSED and "ACCESS_REFUSED" in run.error_line(), run
    _no_secret(run, wrong)

    # a "broker" that accepts and never speaks: the run lasts the connect
    # timeout, long enough to read its command line
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    port = silent.getsockname()[1]
    try:
        for how in ("file", "env"):
            u = url(broker, password=False, port=port)
            args = ["show", d, "--connect-timeout", "3s"]
            env = {}
            if how == "file":
                args += ["--password-file", str(bad)]
            else:
                env["REBOUND_PASSWORD"] = wrong
            c = cmd(*args, url_=u)
            p = subprocess.Popen(c, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=cli_env(env))
            try:
                seen = rbtest.wait_until(
                    lambda: _cmdline(p.pid) if p.poll() is None and
                    "dlq" in _cmdline(p.pid) else None, 10,
                    "the running process's command line")
                assert wrong not in seen, (how, seen)
                conn, _ = silent.accept()
                out, err = p.communicate(timeout=30)
                conn.close()
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            assert p.returncode == EXIT_UNREACHABLE, (how, p.returncode, err)
            assert wrong.encode() not in out + err
    finally:
        silent.close()
    assert count(direct, d) == 1


# ---- 6. 10,000 messages --------------------------------------------------------


def test_redrive_10000_with_progress_none_lost(broker, direct):
    n = 10000
    q = rbtest.uniq("dlqbig")
    d = dlq(q)
    declare_queue(direct, q)
    ids = put_parked(broker, direct, q, n, body=lambda i: b"big %d" % i)
    wait_count(direct, d, n, timeout=60)

    run = cli(broker, "redrive", d, timeout=600)
    assert run.rc == EXIT_OK, run
    assert run.one(MOVED) == n, run
    progress = [(int(a), int(b)) for a, b in PROGRESS.findall(run.err)]
    assert progress, "no progress line on stderr: %r" % (run,)
    assert all(total == n for _, total in progress), progress
    moved = [m for m, _ in progress]
    assert moved == sorted(moved) and moved[-1] <= n, progress
    assert not PROGRESS.search(run.out), "progress belongs on stderr"

    wait_count(direct, q, n, timeout=60)
    wait_count(direct, d, 0)
    got = consume_all(direct, q, n)
    seen = Counter(p.message_id for p, _ in got)
    missing = set(ids) - set(seen)
    dups = {k: c for k, c in seen.items() if c > 1}
    assert not missing and not dups, (
        "%d of %d arrived; %d missing (e.g. %r); %d duplicated (e.g. %r)"
        % (len(seen), n, len(missing), sorted(missing)[:5], len(dups),
           sorted(dups.items())[:5]))
    assert len(got) == n
    for p, b in got:
        assert b == b"big %d" % int(p.message_id[2:]), (p.message_id, b)
        h = p.headers
        assert PREFIX + "retry-count" not in h and \
            PREFIX + "dead-letter-reason" not in h, h
        assert PREFIX + "redriven-at" in h and h[PREFIX + "source-queue"] == q
    assert count(direct, q) == 0


# ---- 7. ls -------------------------------------------------------------------


def test_ls_literal_policies_and_given_names(broker, direct):
    """ls lists the DLQ of every policy queue that is a literal name (not
    those of globs) and the names given; an absent one is shown as such."""
    qa, qb = rbtest.uniq("dlqlsa"), rbtest.uniq("dlqlsb")
    glob = "rbt-dlqls-glob-%s-*" % uuid.uuid4().hex[:8]
    put_parked(broker, direct, qa, 3)
    declare_dlq(direct, dlq(qb))
    absent = rbtest.uniq("absent") + ".dlq"
    direct.own(absent)
    # one consumer on qb's (empty) DLQ
    cons_ch = direct.channel()
    cons_ch.basic_consume(dlq(qb), lambda *a: None)
    try:
        policy = ("--retry-queues", "%s,%s,%s" % (qa, glob, qb))
        run = cli(broker, "ls", absent, *policy)
        assert run.rc == EXIT_OK, run
        lines = [l.split() for l in run.out.splitlines() if l.strip()]
        assert lines[0] == ["QUEUE", "MESSAGES", "CONSUMERS"], run
        rows = {r[0]: r for r in lines[1:]}
        assert set(rows) == {dlq(qa), dlq(qb), absent}, run
        assert rows[dlq(qa)][1:3] == ["3", "0"], run
        assert rows[dlq(qb)][1:3] == ["0", "1"], run
        assert rows[absent][1] == "-" and "absent" in rows[absent], run
        assert "glob" not in run.out, run

        run = cli(broker, "ls", absent, "--json", *policy)
        assert run.rc == EXIT_OK, run
        qs = {x["name"]: x for x in run.json()["queues"]}
        assert set(qs) == {dlq(qa), dlq(qb), absent}, run
        assert qs[dlq(qa)] == {"name": dlq(qa), "exists": True, "messages": 3,
                               "consumers": 0}
        assert qs[dlq(qb)] == {"name": dlq(qb), "exists": True, "messages": 0,
                               "consumers": 1}
        assert qs[absent]["exists"] is False
        assert qs[absent].get("messages") in (None,), qs[absent]

        # the URL from REBOUND_URL, the vhost as an empty path
        run = cli(broker, "ls", dlq(qa), "--json", url_=False,
                  env={"REBOUND_URL": url(broker, vhost=None)})
        assert run.rc == EXIT_OK, run
        assert [(x["name"], x["messages"]) for x in run.json()["queues"]] == \
            [(dlq(qa), 3)]
    finally:
        cons_ch.close()
    assert count(direct, dlq(qa)) == 3
    assert not direct.exists(absent)


# ---- 8. dry-run, --to, --limit -------------------------------------------------


def test_redrive_dry_run_to_and_limit(broker, direct):
    q = rbtest.uniq("dlqrd")
    other = rbtest.uniq("dlqother")
    d = dlq(q)
    declare_queue(direct, q)
    declare_queue(direct, other)
    put_parked(broker, direct, q, 5)
    wait_count(direct, d, 5)

    run = cli(broker, "redrive", d, "--dry-run")
    assert run.rc == EXIT_OK, run
    assert run.one(WOULD_MOVE) == 5, run
    assert not MOVED.search(run.out), run
    wait_count(direct, d, 5)
    assert count(direct, q) == 0
    # nothing about them changed either
    run = cli(broker, "show", d, "--json", "--limit", "10")
    assert [m["rebound"]["retry_count"] for m in run.json()["messages"]] == [3] * 5

    run = cli(broker, "redrive", d, "--limit", "2")
    assert run.rc == EXIT_OK and run.one(MOVED) == 2, run
    wait_count(direct, d, 3)
    wait_count(direct, q, 2)

    run = cli(broker, "redrive", d, "--to", other, "--limit", "1")
    assert run.rc == EXIT_OK and run.one(MOVED) == 1, run
    wait_count(direct, d, 2)
    wait_count(direct, other, 1)
    run = cli(broker, "redrive", d, "--to", other)
    assert run.rc == EXIT_OK and run.one(MOVED) == 2, run
    wait_count(direct, d, 0)
    assert count(direct, q) == 2

    got = get_all(direct, other, expect=3)
    assert sorted(p.message_id for _, p, _ in got) == \
        ["m-000002", "m-000003", "m-000004"]
    for _, p, b in got:
        assert b == b"parked %d" % int(p.message_id[2:])
        assert PREFIX + "retry-count" not in p.headers
        assert PREFIX + "redriven-at" in p.headers
    got = get_all(direct, q, expect=2)
    assert sorted(p.message_id for _, p, _ in got) == ["m-000000", "m-000001"]


def test_redrive_to_each_source_queue(broker, direct):
    """One DLQ holding messages of two source queues (a policy whose
    dead_letter names one queue for several): each goes back to the queue
    its rebound-source-queue names."""
    qa, qb = rbtest.uniq("dlqsrca"), rbtest.uniq("dlqsrcb")
    shared = rbtest.uniq("dlqshared") + ".dlq"
    declare_queue(direct, qa)
    declare_queue(direct, qb)
    put_parked(broker, direct, qa, 3, dlq_name=shared)
    put_parked(broker, direct, qb, 2, start=3, dlq_name=shared)
    wait_count(direct, shared, 5)
    run = cli(broker, "redrive", shared)
    assert run.rc == EXIT_OK and run.one(MOVED) == 5, run
    wait_count(direct, shared, 0)
    wait_count(direct, qa, 3)
    wait_count(direct, qb, 2)


def test_redrive_to_an_absent_queue_loses_nothing(broker, direct):
    """--to a queue that does not exist: the run fails and every message
    stays in the DLQ (a copy is acked only after its confirm)."""
    q = rbtest.uniq("dlqnoto")
    d = dlq(q)
    put_parked(broker, direct, q, 3)
    absent = rbtest.uniq("absent-to")
    direct.own(absent)
    run = cli(broker, "redrive", d, "--to", absent)
    assert run.rc == 5, run  # the target is the queue not found
    assert absent in run.error_line(), run  # names what failed
    assert not MOVED.search(run.out) or run.one(MOVED) == 0, run
    wait_count(direct, d, 3)


def test_redrive_leaves_a_message_without_source_and_says_so(broker, direct):
    """A message in a DLQ without rebound-source-queue (put there by hand)
    has nowhere to go without --to: it stays, the others move, and the run
    reports that some were not moved (exit 1)."""
    q = rbtest.uniq("dlqnosrc")
    d = dlq(q)
    declare_queue(direct, q)
    put_parked(broker, direct, q, 2)
    direct.publish(d, b"orphan", pika.BasicProperties(
        message_id="orphan", headers={PREFIX + "retry-count": 3}))
    wait_count(direct, d, 3)
    run = cli(broker, "redrive", d)
    assert run.rc == EXIT_PARTIAL, run
    assert run.one(MOVED) == 2, run
    wait_count(direct, d, 1)
    wait_count(direct, q, 2)
    got = get_all(direct, d, expect=1)
    assert [p.message_id for _, p, _ in got] == ["orphan"]


def test_a_returned_copy_leaves_the_others_in_one_place(broker, direct):
    """One message whose source queue does not exist among hundreds, on
    the real broker: its copy is returned, the run stops (exit 5, naming
    the queue), and every message is in exactly one queue, the returned
    one in the DLQ (test_return_is_matched_to_its_copy pins the order of
    return and confirms that the broker here decides by timing)."""
    q = rbtest.uniq("dlqret")
    d = dlq(q)
    missing = rbtest.uniq("dlqret-missing")
    direct.own(missing)
    declare_dlq(direct, q)
    put_parked(broker, direct, q, 150)
    put_parked(broker, direct, missing, 1, start=150, dlq_name=d)
    put_parked(broker, direct, q, 300, start=151, dlq_name=d)
    wait_count(direct, d, 451)
    run = cli(broker, "redrive", d)
    assert run.rc == EXIT_NOT_FOUND and missing in run.error_line(), run
    moved = run.one(MOVED)
    wait_count(direct, q, moved)
    wait_count(direct, d, 451 - moved)
    in_q, in_d = ids_in(direct, q, moved), ids_in(direct, d, 451 - moved)
    assert not set(in_q) & set(in_d), set(in_q) & set(in_d)
    assert max(in_q.values()) == 1 and max(in_d.values()) == 1
    assert len(in_q) + len(in_d) == 451
    assert "m-000150" in in_d  # the returned one stays


def test_interrupted_redrive_settles_what_is_in_flight(broker, direct):
    """SIGINT during a long redrive: it stops taking messages, acks in the
    DLQ what the broker confirmed, and exits 1; no message is in both
    queues and none is lost."""
    q = rbtest.uniq("dlqint")
    d = dlq(q)
    declare_queue(direct, q)
    put_parked(broker, direct, q, 6000)
    wait_count(direct, d, 6000)
    p = subprocess.Popen(cmd("redrive", d, url_=url(broker, password=False)),
                         env=cli_env({"REBOUND_PASSWORD": broker.password}),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    rbtest.wait_until(lambda: count(direct, q) >= 500, 60,
                      "the redrive under way", interval=0.02)
    p.send_signal(2)
    out, err = p.communicate(timeout=60)
    assert p.returncode == EXIT_PARTIAL, (p.returncode, out, err)
    assert "interrupted" in err, err
    moved = int(re.search(r"moved (\d+) messages", out).group(1))
    assert 500 <= moved < 6000, out
    wait_count(direct, q, moved)
    wait_count(direct, d, 6000 - moved)
    in_q, in_d = ids_in(direct, q, moved), ids_in(direct, d, 6000 - moved)
    assert not set(in_q) & set(in_d)
    assert len(in_q) + len(in_d) == 6000


def test_a_batch_of_confirms_is_acked_so_none_come_back(broker, direct):
    """The copies' confirms arrive as one batch (the source queue's
    process is suspended until every copy is published). The broker's
    quorum-queue client holds back settles past a few dozen unapplied ones
    and drops them when the channel closes: a redrive that acked such a
    batch one message at a time and then closed saw its messages come back
    into the DLQ, so they were in both queues. Every one is moved once."""
    n = 200
    q = rbtest.uniq("dlqbatch")
    d = dlq(q)
    declare_queue(direct, q)
    ids = put_parked(broker, direct, q, n)
    wait_count(direct, d, n)
    queue_process(broker, q, "suspend")
    try:
        p = subprocess.Popen(cmd("redrive", d, url_=url(broker)),
                             env=cli_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        rbtest.wait_until(lambda: str(n) in broker.ctl(
            "list_channels", "messages_unconfirmed", "-q").split(), 60,
            "every copy published, none confirmed", interval=0.2)
    finally:
        queue_process(broker, q, "resume")
    out, err = p.communicate(timeout=120)
    assert p.returncode == EXIT_OK, (p.returncode, out, err)
    assert int(re.search(r"moved (\d+) messages", out).group(1)) == n, out
    wait_count(direct, q, n)
    in_q = ids_in(direct, q, n)
    assert sorted(in_q) == sorted(ids)
    assert count(direct, d) == 0


def test_text_output_cannot_drive_the_terminal(broker, direct):
    """Headers and bodies come from whoever published the message: show
    prints their control characters escaped, never raw."""
    q = rbtest.uniq("dlqesc")
    d = dlq(q)
    put_parked(broker, direct, q, 1, body=lambda i: b"\x1b]0;owned\x07body",
               extra_headers={PREFIX + "dead-letter-reason":
                              "max-attempts\x1b[2J\x9b"})
    run = cli(broker, "show", d)
    assert run.rc == EXIT_OK, run
    assert "\x1b" not in run.out and "\x07" not in run.out, run.out
    assert "\x9b" not in run.out
    assert "max-attempts\\u001b[2J" in run.out, run.out


def test_return_is_matched_to_its_copy(broker):
    """A broker (played by fakebroker.py, so the order is exact) hands out
    three parked messages, returns the second one's copy (no such queue),
    then confirms all three copies at once: the first and third messages
    are acked in the DLQ, the second is not, and the run says which queue
    was missing (exit 5). A run that, after a return, acked nothing left
    the first and third in both queues."""
    import fakebroker as fb
    sources = {1: "src", 2: "gone", 3: "src"}

    def on_declare(conn, ch, args):
        conn.method(ch, (50, 11), fb.a.shortstr(args["queue"])
                    + struct.pack(">II", 3, 0))
        return True

    def on_get(conn, ch, args):
        tag = len(conn.find("basic.get")) + 1  # this one is not listed yet
        if tag > 3:
            return False  # get-empty
        table = fb.field_table([(PREFIX + "source-queue", "S",
                                 struct.pack(">I", len(sources[tag]))
                                 + sources[tag].encode())])
        flags, props = fb.props_headers(table)
        body = b"message %d" % tag
        conn.send(fb.basic_get_ok(ch, tag, "", "x.dlq", 3 - tag)
                  + fb.content_header(ch, len(body), flags, props)
                  + fb.body_frames(ch, body, 131072))
        return True

    b = fb.FakeBroker(confirm=False, on_declare=on_declare, on_get=on_get)
    try:
        p = subprocess.Popen(cmd("redrive", "x.dlq",
                                 url_="amqp://guest@127.0.0.1:%d/" % b.port),
                             env=cli_env({"REBOUND_PASSWORD": "guest"}),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        c = b.wait_conn("rebound dlq")
        c.wait(lambda: len(c.published()) == 3, 10, "three copies")
        assert [m.routing_key for m in c.published()] == ["src", "gone",
                                                          "src"]
        body = b"message 2"
        c.send(fb.basic_return(1, 312, "NO_ROUTE", "", "gone")
               + fb.content_header(1, len(body))
               + fb.body_frames(1, body, 131072)
               + fb.a.method(1, (60, 80), struct.pack(">Q", 3) + b"\x01"))
        out, err = p.communicate(timeout=30)
        acked = sorted(e.args["tag"] for e in c.find("basic.ack"))
        assert acked == [1, 3], (acked, out, err)
        assert p.returncode == EXIT_NOT_FOUND and "'gone'" in err, (out, err)
        assert "moved 2 messages" in out, out
    finally:
        b.stop()


def test_a_message_from_the_dlq_itself_stays_and_the_run_ends(broker, direct):
    """A message whose source-queue header names the dead-letter queue
    itself is never published back into it (the run would take it again
    and again): it stays, the others move, and the run ends (exit 1)."""
    q = rbtest.uniq("dlqself")
    d = dlq(q)
    declare_queue(direct, q)
    put_parked(broker, direct, q, 2)
    put_parked(broker, direct, d, 1, start=2, dlq_name=d)  # its source: d
    wait_count(direct, d, 3)
    run = cli(broker, "redrive", d, timeout=60)
    assert run.rc == EXIT_PARTIAL and run.one(MOVED) == 2, run
    wait_count(direct, q, 2)
    wait_count(direct, d, 1)


def test_redriven_copy_drops_the_dlqs_delivery_count(broker, direct):
    """A quorum dead-letter queue counts a delivery each time a message is
    browsed (x-delivery-count); that count is the DLQ's, not the message's:
    the redriven copy does not carry it."""
    q = rbtest.uniq("dlqxdc")
    d = dlq(q)
    declare_queue(direct, q)
    put_parked(broker, direct, q, 1)
    assert cli(broker, "show", d).rc == EXIT_OK
    again = cli(broker, "show", d, "--json")  # requeued: counted once
    headers = again.json()["messages"][0]["headers"]
    assert headers.get("x-delivery-count"), headers
    wait_count(direct, d, 1)
    assert cli(broker, "redrive", d).rc == EXIT_OK
    (m,) = get_all(direct, q, expect=1)
    assert "x-delivery-count" not in m[1].headers, m[1].headers
    assert PREFIX + "redriven-at" in m[1].headers
