"""The admin endpoint's dead-letter routes (/v1/dlq...) of a running
rebound, against the real broker: authentication (rebound logs in to the
broker with the request's Basic credentials, so the broker decides),
listing, browsing, redrive, purge, errors, and that a long redrive does
not stop the proxy or the admin endpoint meanwhile."""
import threading
import uuid
from collections import Counter

import pika

import rbtest
from dlqhelp import (PREFIX, count, declare_queue, delete_user, ids_in,
                     park, parse_iso, path, put_parked, queue_process,
                     request, user, wait_count, window)
from retryhelp import direct, dlq
from test_admin import admin_rebound

assert direct  # a fixture

TIERS = "100ms"
MAX_ATTEMPTS = 3
REALM = 'Basic realm="rebound"'


class Admin:
    """A rebound with its admin endpoint on a free port and the policy
    "<glob>,<literal>": queues named glob_name() have tiers 100ms and
    max_attempts 3, and so has the literal queue `lit`."""

    def __init__(self, rb, broker, lit, prefix):
        self.rb, self.broker, self.lit, self.prefix = rb, broker, lit, prefix
        self.port = rb.admin_port
        self.auth = (broker.user, broker.password)

    def glob_name(self):
        return rbtest.uniq(self.prefix)

    def get(self, target, auth=True, **kw):
        return request(self.port, "GET", target,
                       auth=self.auth if auth is True else auth, **kw)

    def post(self, target, auth=True, **kw):
        return request(self.port, "POST", target,
                       auth=self.auth if auth is True else auth, **kw)

    def listed(self):
        r = self.get("/v1/dlq")
        assert r.status == 200, r
        doc = r.json()
        assert doc["vhost"] == "/", doc
        return {x["name"]: x for x in doc["queues"]}


def start_admin(rebound_factory, broker, direct, *extra):
    prefix = "dlqh%s" % uuid.uuid4().hex[:8]
    lit = direct.own(rbtest.uniq("dlqhlit"))
    rb = admin_rebound(rebound_factory, "--retry-queues",
                       "rbt-%s-*,%s" % (prefix, lit), "--retry-tiers", TIERS,
                       "--max-attempts", str(MAX_ATTEMPTS), *extra)
    return Admin(rb, broker, lit, prefix)


def moved(r):
    """The spec's fields of a redrive's answer (others may follow)."""
    doc = r.json()
    return {k: doc.get(k) for k in ("queue", "moved", "not_moved")}


def poison(mid):
    return (b"poison " + mid.encode(), pika.BasicProperties(
        delivery_mode=2, message_id=mid, content_type="text/plain",
        headers={"app-tag": "keep-me"}))


def test_401_without_or_with_bad_authorization(rebound_factory, broker,
                                               direct):
    a = start_admin(rebound_factory, broker, direct)
    d = dlq(a.lit)
    put_parked(broker, direct, a.lit, 2)
    for method, target in (("GET", "/v1/dlq"), ("GET", path(d, "messages")),
                           ("POST", path(d, "redrive")),
                           ("POST", path(d, "purge"))):
        for auth in (None, "Bearer abc", "Basic !!!not-base64!!!",
                     "Basic " + "Z3Vlc3Q="):  # "guest": no colon
            r = request(a.port, method, target, auth=auth)
            assert r.status == 401, (method, target, auth, r)
            assert r.headers.get("www-authenticate") == REALM, r
    wait_count(direct, d, 2)  # nothing happened


def test_403_with_the_brokers_text_for_a_wrong_password(rebound_factory,
                                                        broker, direct):
    a = start_admin(rebound_factory, broker, direct)
    d = dlq(a.lit)
    put_parked(broker, direct, a.lit, 2)
    pw = "wrong-%s" % uuid.uuid4().hex
    for method, target in (("GET", "/v1/dlq"), ("GET", path(d, "messages")),
                           ("POST", path(d, "redrive")),
                           ("POST", path(d, "purge"))):
        r = request(a.port, method, target, auth=(broker.user, pw))
        assert r.status == 403, (method, target, r)
        err = r.json()["error"]
        assert "ACCESS_REFUSED" in err, r
        assert pw not in r.text
    # a vhost the user may not enter: the broker refuses, so 403 too
    r = a.get("/v1/dlq?vhost=" + rbtest.uniq("novhost"))
    assert r.status == 403, r
    assert r.json()["error"], r
    wait_count(direct, d, 2)
    assert count(direct, a.lit) is None  # no redrive created it
    assert pw not in a.rb.log()


def test_403_for_a_user_without_permission_on_the_queue(rebound_factory,
                                                        broker, ctl, direct):
    a = start_admin(rebound_factory, broker, direct)
    d = dlq(a.lit)
    declare_queue(direct, a.lit)
    put_parked(broker, direct, a.lit, 2)
    name = rbtest.uniq("user")
    pw = "pw-%s" % uuid.uuid4().hex
    user(ctl, name, pw, ("^nothing-", "^nothing-", "^nothing-"))
    try:
        for method, target in (("GET", path(d, "messages")),
                               ("POST", path(d, "redrive")),
                               ("POST", path(d, "purge")),
                               ("POST", path(d, "purge", limit=1))):
            r = request(a.port, method, target, auth=(name, pw))
            assert r.status == 403, (method, target, r)
            err = r.json()["error"]
            assert "ACCESS_REFUSED" in err and d in err and name in err, r
            assert pw not in r.text
        wait_count(direct, d, 2)
        assert count(direct, a.lit) == 0
    finally:
        delete_user(ctl, name)
    assert pw not in a.rb.log()


def test_list_and_browse_a_parked_message(rebound_factory, broker, direct):
    """GET /v1/dlq lists the literal policy's DLQ, and the DLQ of a
    glob-matched queue once rebound parked into it, with counts; GET
    .../messages shows the parked message (as `dlq show --json`) and leaves
    it there."""
    a = start_admin(rebound_factory, broker, direct)
    lit_dlq = dlq(a.lit)
    put_parked(broker, direct, a.lit, 2)
    q = a.glob_name()

    listed = a.listed()
    assert listed.get(lit_dlq) == {"name": lit_dlq, "exists": True,
                                   "messages": 2, "consumers": 0}, listed
    assert not [n for n in listed if n.startswith("rbt-" + a.prefix)], listed

    t0, t1 = window()
    park(a.rb, broker, direct, q, [poison("h-1")], MAX_ATTEMPTS)
    t1 = t1()
    listed = a.listed()
    assert listed.get(dlq(q)) == {"name": dlq(q), "exists": True,
                                  "messages": 1, "consumers": 0}, listed
    assert listed[lit_dlq]["messages"] == 2

    r = a.get(path(dlq(q), "messages"))
    assert r.status == 200, r
    assert r.headers["content-type"].startswith("application/json"), r
    doc = r.json()
    assert doc["queue"] == dlq(q)
    assert len(doc["messages"]) == 1, doc
    m = doc["messages"][0]
    assert m["index"] == 1
    assert m["rebound"]["source_queue"] == q
    assert m["rebound"]["retry_count"] == MAX_ATTEMPTS
    assert m["rebound"]["reason"] == "max-attempts"
    assert m["rebound"]["redriven_at"] is None
    first = parse_iso(m["rebound"]["first_failed_at"])
    assert t0 <= first <= parse_iso(m["rebound"]["last_failed_at"]) <= t1
    assert m["properties"]["message_id"] == "h-1"
    assert m["headers"]["app-tag"] == "keep-me"
    assert m["headers"][PREFIX + "retry-count"] == MAX_ATTEMPTS
    assert m["body"] == "poison h-1" and m["body_size"] == 10
    assert m["body_truncated"] is False
    wait_count(direct, dlq(q), 1)
    r = a.get(path(dlq(q), "messages"))
    assert r.status == 200 and r.json()["messages"][0]["redelivered"] is True

    r = a.get(path(lit_dlq, "messages", limit=1))
    assert r.status == 200, r
    assert [x["properties"]["message_id"] for x in r.json()["messages"]] == \
        ["m-000000"]
    r = a.get(path(lit_dlq, "messages"))
    assert [x["properties"]["message_id"] for x in r.json()["messages"]] == \
        ["m-000000", "m-000001"]
    wait_count(direct, lit_dlq, 2)
    wait_count(direct, dlq(q), 1)


def test_redrive_moves_it_back_with_the_count_reset(rebound_factory, broker,
                                                    direct):
    a = start_admin(rebound_factory, broker, direct)
    q = a.glob_name()
    park(a.rb, broker, direct, q, [poison("h-2")], MAX_ATTEMPTS)
    t0, t1 = window()
    r = a.post(path(dlq(q), "redrive"))
    t1 = t1()
    assert r.status == 200, r
    assert moved(r) == {"queue": dlq(q), "moved": 1, "not_moved": 0}, r
    wait_count(direct, dlq(q), 0)
    wait_count(direct, q, 1)

    # consumed from the source, through rebound
    conn = a.rb.pika(broker)
    ch = conn.channel()
    m, p, b = ch.basic_get(q)
    assert m is not None and b == b"poison h-2"
    assert p.message_id == "h-2" and p.headers["app-tag"] == "keep-me"
    assert PREFIX + "retry-count" not in p.headers, p.headers
    assert PREFIX + "dead-letter-reason" not in p.headers, p.headers
    assert t0 <= p.headers[PREFIX + "redriven-at"] <= t1, p.headers
    ch.basic_ack(m.delivery_tag)
    conn.close()
    wait_count(direct, q, 0)
    wait_count(direct, dlq(q), 0)

    # ?limit and ?to
    other = declare_queue(direct, rbtest.uniq("dlqhother"))
    put_parked(broker, direct, a.lit, 3)
    r = a.post(path(dlq(a.lit), "redrive", limit=2, to=other))
    assert r.status == 200, r
    assert moved(r) == {"queue": dlq(a.lit), "moved": 2, "not_moved": 0}, r
    wait_count(direct, dlq(a.lit), 1)
    wait_count(direct, other, 2)
    assert count(direct, a.lit) is None  # never declared: nothing went there


def test_redrive_to_an_absent_queue_loses_nothing(rebound_factory, broker,
                                                  direct):
    """?to= a queue that does not exist: nothing moves, nothing is lost,
    and the answer says why (the broker was reachable: not a 502)."""
    a = start_admin(rebound_factory, broker, direct)
    put_parked(broker, direct, a.lit, 3)
    absent = direct.own(rbtest.uniq("absent-to"))
    r = a.post(path(dlq(a.lit), "redrive", to=absent))
    assert r.status == 404, r
    body = r.json()
    assert absent in body["error"], r
    assert (body["moved"], body["not_moved"]) == (0, 3), body
    wait_count(direct, dlq(a.lit), 3)


def test_purge_reports_and_removes(rebound_factory, broker, direct):
    a = start_admin(rebound_factory, broker, direct)
    d = dlq(a.lit)
    put_parked(broker, direct, a.lit, 5)
    r = a.post(path(d, "purge", limit=2))
    assert r.status == 200, r
    assert r.json() == {"queue": d, "purged": 2}
    wait_count(direct, d, 3)
    r = a.post(path(d, "purge"))
    assert r.status == 200 and r.json() == {"queue": d, "purged": 3}, r
    wait_count(direct, d, 0)

    # a name that must be percent-encoded in the path
    odd = "rbt dlqh/odd?%%-%s.dlq" % uuid.uuid4().hex[:8]
    put_parked(broker, direct, "src-of-odd", 1, dlq_name=odd)
    r = a.get(path(odd, "messages"))
    assert r.status == 200 and r.json()["queue"] == odd, r
    assert len(r.json()["messages"]) == 1
    r = a.post(path(odd, "purge"))
    assert r.status == 200 and r.json() == {"queue": odd, "purged": 1}, r
    wait_count(direct, odd, 0)


def test_404_405_400(rebound_factory, broker, direct):
    a = start_admin(rebound_factory, broker, direct)
    absent = direct.own(rbtest.uniq("absent") + ".dlq")
    for method, target in (("GET", path(absent, "messages")),
                           ("POST", path(absent, "redrive")),
                           ("POST", path(absent, "purge")),
                           ("POST", path(absent, "purge", limit=2))):
        r = request(a.port, method, target, auth=a.auth)
        assert r.status == 404, (method, target, r)
        assert r.json()["error"], r
    assert not direct.exists(absent)

    d = dlq(a.lit)
    put_parked(broker, direct, a.lit, 2)
    for target in (path(d, "redrive"), path(d, "purge")):
        r = a.get(target)
        assert r.status == 405, (target, r)
    for target in (path(d, "messages", limit="abc"),
                   path(d, "purge", limit="abc"),
                   path(d, "redrive", limit="-1")):
        r = request(a.port, "POST" if "messages" not in target else "GET",
                    target, auth=a.auth)
        assert r.status == 400, (target, r)
    wait_count(direct, d, 2)


def test_502_when_the_broker_is_unreachable(rebound_factory, broker):
    port = rbtest.free_port()
    lit = rbtest.uniq("dlqhlit")
    rb = admin_rebound(rebound_factory, "--retry-queues", lit,
                       upstream="127.0.0.1:%d" % port)
    auth = (broker.user, broker.password)
    for method, target in (("GET", "/v1/dlq"), ("GET", path(dlq(lit), "messages")),
                           ("POST", path(dlq(lit), "redrive")),
                           ("POST", path(dlq(lit), "purge"))):
        r = request(rb.admin_port, method, target, auth=auth)
        assert r.status == 502, (method, target, r)
        assert r.json()["error"], r


def test_html_page(rebound_factory):
    rb = admin_rebound(rebound_factory)
    r = request(rb.admin_port, "GET", "/")
    assert r.status == 200, r
    assert r.headers["content-type"].startswith("text/html"), r
    assert "<html" in r.text.lower()


def test_long_redrive_does_not_block_the_proxy(rebound_factory, broker,
                                              direct):
    """A redrive of 3,000 messages over HTTP: while its POST is in flight,
    /healthz answers and a client through rebound publishes and gets its
    confirm; both happen before the redrive's response (and while the
    source queue is still filling)."""
    n = 3000
    a = start_admin(rebound_factory, broker, direct)
    d = dlq(a.lit)
    declare_queue(direct, a.lit)
    put_parked(broker, direct, a.lit, n, body=lambda i: b"long %d " % i + b"x" * 2048)
    wait_count(direct, d, n, timeout=60)

    scratch = direct.own(rbtest.uniq("dlqhscratch"))
    conn = a.rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(scratch, durable=True)
    ch.confirm_delivery()

    result = {}
    answered = threading.Event()

    def redrive():
        try:
            result["r"] = a.post(path(d, "redrive"), timeout=600)
        except Exception as e:  # reported below
            result["e"] = e
        answered.set()

    t = threading.Thread(target=redrive, daemon=True)
    t.start()
    # in flight: the DLQ has begun to empty
    rbtest.wait_until(lambda: answered.is_set() or (count(direct, d) or 0) < n,
                      60, "the redrive to start", interval=0.01)
    assert not answered.is_set(), (
        "the redrive answered before it could be observed: %r" % result)

    health = request(a.port, "GET", "/healthz", timeout=60)
    health_before = not answered.is_set()
    ch.basic_publish("", scratch, b"during the redrive", mandatory=True)
    confirm_before = not answered.is_set()
    source_then = count(direct, a.lit)

    t.join(600)
    assert not t.is_alive()
    assert "e" not in result, result
    assert health.status == 200 and health.text == "ok\n", health
    assert health_before, "/healthz answered only after the redrive's response"
    assert confirm_before, "the publish was confirmed only after the redrive's response"
    assert source_then < n, ("the source already held all %d when the checks "
                             "ended: they waited for the redrive" % n)
    r = result["r"]
    assert r.status == 200, r
    assert moved(r) == {"queue": d, "moved": n, "not_moved": 0}, r
    wait_count(direct, a.lit, n, timeout=60)
    wait_count(direct, d, 0)
    assert count(direct, scratch) == 1
    conn.close()


def test_cross_site_requests_refused(rebound_factory, broker, direct):
    """A browser holding Basic credentials for the endpoint would attach
    them to a form another web site posts: requests a browser marks as
    cross-site (Sec-Fetch-Site) or from another origin are refused with 403
    and change nothing; the page's own (same origin) and clients that are
    not browsers (no such headers) go through."""
    a = start_admin(rebound_factory, broker, direct)
    d = dlq(a.lit)
    put_parked(broker, direct, a.lit, 2)
    wait_count(direct, d, 2)
    host = "127.0.0.1:%d" % a.port
    for headers in ({"Origin": "https://evil.example"},
                    {"Origin": "null"},
                    {"Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site", "Origin": "http://" + host}):
        r = a.post(path(d, "purge"), headers=headers)
        assert r.status == 403 and "cross-site" in r.json()["error"], r
    wait_count(direct, d, 2)
    r = a.post(path(d, "purge", limit=1),
               headers={"Origin": "http://" + host,
                        "Sec-Fetch-Site": "same-origin"})
    assert r.status == 200 and r.json()["purged"] == 1, r
    r = a.post(path(d, "purge"))
    assert r.status == 200 and r.json()["purged"] == 1, r
    wait_count(direct, d, 0)


def test_sigterm_lets_a_redrive_finish(rebound_factory, broker, direct):
    """SIGTERM while a redrive started over HTTP runs: rebound drains, and
    the drain waits for the redrive, which answers 200 with everything
    moved; every message is then in the source queue once, none in the
    DLQ (a rebound that cut the redrive off at SIGTERM left copies in both
    queues)."""
    n = 3000
    a = start_admin(rebound_factory, broker, direct, "--drain-timeout", "300s")
    d = dlq(a.lit)
    declare_queue(direct, a.lit)
    put_parked(broker, direct, a.lit, n, body=lambda i: b"drain %d " % i
               + b"x" * 2048)
    wait_count(direct, d, n, timeout=60)
    r = _sigterm_during_redrive(a, direct, d, n)
    assert r.status == 200 and moved(r) == {"queue": d, "moved": n,
                                            "not_moved": 0}, r
    assert a.rb.wait_exit(60) == 0
    wait_count(direct, d, 0)
    wait_count(direct, a.lit, n, timeout=60)


def _redrive_in_thread(a, d):
    result = {}

    def redrive():
        result["r"] = a.post(path(d, "redrive"), timeout=120)

    t = threading.Thread(target=redrive, daemon=True)
    t.start()
    return t, result


def _sigterm_during_redrive(a, direct, d, n, then=None):
    """POST a redrive of DLQ `d` (holding `n`), SIGTERM rebound once it
    has taken 100 messages (then call `then`); the redrive's answer."""
    t, result = _redrive_in_thread(a, d)
    rbtest.wait_until(lambda: (count(direct, d) or 0) < n - 100, 60,
                      "the redrive to start", interval=0.01)
    a.rb.signal()  # SIGTERM
    if then:
        then()
    t.join(120)
    assert not t.is_alive() and "r" in result, result
    return result["r"]


def test_drain_timeout_stops_a_redrive_which_answers_503(rebound_factory,
                                                         broker, direct):
    """The drain timeout passes while a redrive runs: the redrive stops
    taking messages, settles the copies in flight and answers 503 with what
    it moved; rebound exits 0. Every message is in exactly one of the two
    queues (a redrive cut off at the timeout would leave copies in both).
    While it drains, a new operation is refused with 503."""
    n = 20000
    a = start_admin(rebound_factory, broker, direct, "--drain-timeout", "1s")
    d = dlq(a.lit)
    declare_queue(direct, a.lit)
    ids = put_parked(broker, direct, a.lit, n)
    wait_count(direct, d, n, timeout=120)
    refused = []

    def purge_once_draining():  # the signal may reach rebound after a request
        a.rb.wait_log("shutdown")
        refused.append(a.post(path(d, "purge")))

    r = _sigterm_during_redrive(a, direct, d, n, then=purge_once_draining)
    assert refused[0].status == 503 and "no new" in \
        refused[0].json()["error"], refused[0]
    doc = r.json()
    assert r.status == 503 and "shutting down" in doc["error"], (r, doc)
    moved = doc["moved"]
    assert 0 < moved < n and doc["not_moved"] == n - moved, doc
    assert a.rb.wait_exit(60) == 0
    a.rb.wait_log("drain_timeout", dlq_operations_left="1")
    wait_count(direct, a.lit, moved, timeout=60)
    wait_count(direct, d, n - moved, timeout=60)
    in_q, in_d = ids_in(direct, a.lit, moved), ids_in(direct, d, n - moved)
    assert in_q + in_d == Counter(ids), "a message in both queues, or lost"


def test_a_redrive_that_cannot_settle_is_cut_off_with_an_answer(
        rebound_factory, broker, direct):
    """The source queue confirms nothing (its process is suspended), so a
    redrive stopped by the drain timeout cannot settle: 2 s later it is cut
    off, still answered (503, saying so), and rebound exits 0."""
    n = 400
    a = start_admin(rebound_factory, broker, direct, "--drain-timeout", "1s")
    d = dlq(a.lit)
    declare_queue(direct, a.lit)
    put_parked(broker, direct, a.lit, n)
    wait_count(direct, d, n)
    queue_process(broker, a.lit, "suspend")
    try:
        t, result = _redrive_in_thread(a, d)
        rbtest.wait_until(lambda: (count(direct, d) or 0) < n - 100, 60,
                          "the redrive to fill its window", interval=0.05)
        a.rb.signal()  # SIGTERM
        t.join(60)
        assert a.rb.wait_exit(60) == 0
    finally:
        queue_process(broker, a.lit, "resume")
    assert not t.is_alive() and "r" in result, result
    r = result["r"]
    assert r.status == 503 and "cut off" in r.json()["error"], r
    a.rb.wait_log("dlq_stop_timeout", operations_left="1")
    a.rb.wait_log("dlq_cancelled", queue=d)
