"""Helpers for the dead-letter-queue tests (test_dlq_cli.py,
test_dlq_http.py): run `rebound dlq ...`, park poison messages through a
real rebound, put messages that look parked straight into a DLQ (pipelined,
with publisher confirms), count queues from the broker and read what its
queues hold.

Counts come from a passive queue.declare (retryhelp.ready): exact at once,
also for quorum queues (rabbitmqctl's figures for those lag)."""
import json
import os
import re
import subprocess
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from urllib.parse import quote

import pika
import pika.compat

import rbtest
from retryhelp import PoisonConsumer, dlq, ready

PREFIX = "rebound-"

# What `rebound dlq` prints (README of the feature): "moved N messages from
# DLQ", "DLQ" read as the dead-letter queue's name or the word itself;
# progress "redrive DLQ: moved N of M" likewise.
MOVED = re.compile(r"^moved (\d+) messages? from \S+", re.M)
WOULD_MOVE = re.compile(r"^would move (\d+) messages? from \S+", re.M)
PURGED = re.compile(r"^purged (\d+) messages? from \S+", re.M)
PROGRESS = re.compile(r"^redrive \S+: moved (\d+) of (\d+)\s*$", re.M)

EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_REFUSED, \
    EXIT_NOT_FOUND = 0, 1, 2, 3, 4, 5


# ---- URLs and the CLI --------------------------------------------------------


def url(broker, user=None, password=None, port=None, host=None,
        vhost="%2F"):
    """An amqp:// URL for `rebound dlq --url`; password=False leaves the
    password out (for --password-file / REBOUND_PASSWORD); vhost=None
    leaves the path out (empty path: vhost "/")."""
    user = broker.user if user is None else user
    password = broker.password if password is None else password
    cred = quote(user, safe="")
    if password is not False:
        cred += ":" + quote(password, safe="")
    out = "amqp://%s@%s:%d" % (cred, host or broker.host, port or broker.port)
    if vhost is not None:
        out += "/" + vhost
    return out


class Run:
    """A finished `rebound dlq` run."""

    def __init__(self, cmd, rc, out, err):
        self.cmd, self.rc, self.out, self.err = cmd, rc, out, err

    def __repr__(self):
        return "rebound dlq run %r\n  exit %r\n  stdout: %r\n  stderr: %r" % (
            self.cmd[1:], self.rc, self.out[-3000:], self.err[-3000:])

    def json(self):
        try:
            return json.loads(self.out)
        except ValueError as e:
            raise AssertionError("stdout is not JSON (%s): %r" % (e, self))

    def one(self, pattern):
        """The number of the one line of stdout matching `pattern`."""
        found = pattern.findall(self.out)
        assert len(found) == 1, ("expected one line matching %r: %r"
                                 % (pattern.pattern, self))
        return int(found[0])

    def error_line(self):
        """stderr's "rebound dlq: <reason>" line (the reason)."""
        lines = [l for l in self.err.splitlines()
                 if l.startswith("rebound dlq: ")]
        assert lines, "no 'rebound dlq: <reason>' line on stderr: %r" % (self,)
        return lines[-1][len("rebound dlq: "):]


def cmd(*args, url_=None):
    c = [rbtest.BIN, "dlq", *args]
    if url_ is not None:
        c += ["--url", url_]
    return c


def cli_env(extra=None, drop=("REBOUND_URL", "REBOUND_PASSWORD",
                              "REBOUND_PASSWORD_FILE")):
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
    if extra:
        env.update(extra)
    return env


def cli(broker, *args, url_=None, env=None, timeout=120):
    """Run `rebound dlq ARGS --url URL` (URL: the test broker's unless
    given; url_=False: no --url) and return a Run."""
    if url_ is None:
        url_ = url(broker)
    c = cmd(*args, url_=url_ or None)
    p = subprocess.run(c, capture_output=True, timeout=timeout,
                       env=cli_env(env), stdin=subprocess.DEVNULL)
    run = Run(c, p.returncode, p.stdout.decode("utf-8", "replace"),
              p.stderr.decode("utf-8", "replace"))
    for marker in rbtest.SANITIZER_MARKERS:
        assert marker not in run.err, "sanitizer report: %r" % (run,)
    return run


# ---- the broker ----------------------------------------------------------------


def declare_dlq(direct, name):
    """Declare a DLQ as rebound does on RabbitMQ 3.10+ (durable, quorum)."""
    ch = direct.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    ch.close()
    direct.own(name)
    return name


def declare_queue(direct, name):
    ch = direct.channel()
    ch.queue_declare(name, durable=True)
    ch.close()
    direct.own(name)
    return name


def count(direct, name):
    """Messages ready in `name` now (None: no such queue)."""
    return ready(direct, name)


def wait_count(direct, name, n, timeout=20):
    last = []

    def ok():
        last[:] = [count(direct, name)]
        return last[0] == n
    rbtest.wait_until(ok, timeout, lambda: "%s to hold %r messages (has %r)"
                      % (name, n, last and last[0]), interval=0.1)


def unacked(ctl, name):
    q = ctl.queue(name)
    return q and q[1]


def get_all(direct, queue, expect, timeout=20):
    """Every message of `queue`, removed (basic.get, auto-ack):
    [(method, props, body)], waiting up to `timeout` for `expect`."""
    return direct.get_all(queue, timeout=timeout, expect=expect)


def wall_now():
    return datetime.now(timezone.utc).replace(tzinfo=None)


def window():
    """(start, end) for timestamps written between now and end(): AMQP
    timestamps are whole seconds and clocks read a tick apart."""
    start = (wall_now() - timedelta(seconds=1)).replace(microsecond=0)
    return start, lambda: wall_now() + timedelta(seconds=1)


def parse_iso(s):
    """An ISO 8601 UTC timestamp -> naive UTC datetime."""
    assert isinstance(s, str) and re.match(
        r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]00:?00)?$", s), \
        "not an ISO 8601 UTC timestamp: %r" % (s,)
    d = datetime.fromisoformat(s.replace("Z", "+00:00"))
    if d.tzinfo is not None:
        d = d.astimezone(timezone.utc).replace(tzinfo=None)
    return d


# ---- parked messages -----------------------------------------------------------


def parked_headers(source, n=0, reason="max-attempts", count_=3, extra=None):
    """The headers rebound puts on a message it parks from `source`."""
    t = datetime(2024, 5, 1, 12, 0, 0) + timedelta(seconds=n % 1000)
    h = {
        PREFIX + "retry-count": pika.compat.long(count_),
        PREFIX + "source-queue": source,
        PREFIX + "original-exchange": "",
        PREFIX + "original-routing-key": source,
        PREFIX + "first-failed-at": t,
        PREFIX + "last-failed-at": t + timedelta(seconds=3),
        PREFIX + "dead-letter-reason": reason,
    }
    if extra:
        h.update(extra)
    return h


def parked_props(source, i, extra_headers=None):
    return pika.BasicProperties(
        delivery_mode=2, content_type="text/plain", message_id="m-%06d" % i,
        headers=parked_headers(source, i, extra=extra_headers))


def publish_many(broker, queue, messages, window_=256, timeout=300):
    """Publish [(body, props)] to `queue` through the default exchange,
    mandatory, publisher confirms on, up to `window_` unconfirmed at once
    (pika's blocking channel waits for each confirm: too slow for 10,000).
    Returns when every one is confirmed; fails on a nack, a return or a
    timeout."""
    total = len(messages)
    st = {"sent": 0, "pending": set(), "acked": 0, "bad": [], "done": False,
          "ch": None}
    params = pika.URLParameters(broker.url + "?connection_attempts=3")

    def pump():
        ch = st["ch"]
        while st["sent"] < total and len(st["pending"]) < window_:
            body, props = messages[st["sent"]]
            ch.basic_publish("", queue, body, props, mandatory=True)
            st["sent"] += 1
            st["pending"].add(st["sent"])
        if st["sent"] == total and not st["pending"]:
            st["done"] = True
            conn.close()

    def on_confirm(frame):
        m = frame.method
        tags = ({t for t in st["pending"] if t <= m.delivery_tag}
                if m.multiple else {m.delivery_tag} & st["pending"])
        st["pending"] -= tags
        if isinstance(m, pika.spec.Basic.Nack):
            st["bad"].append("nack %r" % (sorted(tags)[:5],))
        else:
            st["acked"] += len(tags)
        if st["bad"]:
            conn.close()
            return
        pump()

    def on_return(ch, method, props, body):
        st["bad"].append("returned %r: %s" % (props.message_id, method.reply_text))

    def on_channel(ch):
        st["ch"] = ch
        ch.add_on_return_callback(on_return)
        ch.confirm_delivery(on_confirm, callback=lambda _f: pump())

    def on_open(c):
        c.channel(on_open_callback=on_channel)

    def on_fail(c, err):
        st["bad"].append("connection failed: %r" % (err,))
        c.ioloop.stop()

    def on_closed(c, reason):
        if not st["done"] and not st["bad"]:
            st["bad"].append("connection closed: %r" % (reason,))
        c.ioloop.stop()

    conn = pika.SelectConnection(params, on_open_callback=on_open,
                                 on_open_error_callback=on_fail,
                                 on_close_callback=on_closed)
    timer = conn.ioloop.call_later(timeout, lambda: (
        st["bad"].append("timed out after %ds (%d of %d confirmed)"
                         % (timeout, st["acked"], total)), conn.close()))
    conn.ioloop.start()
    conn.ioloop.remove_timeout(timer)
    assert not st["bad"], st["bad"]
    assert st["acked"] == total, (st["acked"], total)


def queue_process(broker, queue, fun):
    """Call sys:`fun` on a classic queue's Erlang process (suspend or
    resume): a suspended queue takes publishes but confirms none."""
    broker.ctl("eval", "Q = rabbit_misc:r(<<\"%s\">>, queue, <<\"%s\">>), "
               "{ok, A} = rabbit_amqqueue:lookup(Q), "
               "sys:%s(amqqueue:get_pid(A))." % (broker.vhost, queue, fun))


def ids_in(direct, queue, expect):
    """The message ids in `queue` (a Counter), taken with basic.get."""
    return Counter(p.message_id for _, p, _ in get_all(direct, queue,
                                                       expect=expect))


def put_parked(broker, direct, source, n, start=0, body=None,
               extra_headers=None, dlq_name=None):
    """Put `n` messages that look parked from `source` (rebound's headers,
    message ids m-<start..>, bodies "parked <i>") into its DLQ (declared as
    rebound would). Returns the message ids."""
    name = dlq_name or dlq(source)
    declare_dlq(direct, name)
    msgs = [(body(i) if body else b"parked %d" % i,
             parked_props(source, i, extra_headers))
            for i in range(start, start + n)]
    publish_many(broker, name, msgs)
    return [p.message_id for _, p in msgs]


def consume_all(direct, queue, expect, timeout=120, quiet=2.0):
    """Consume every message of `queue` (auto-ack) until `expect` have come
    and the queue stayed quiet for `quiet` s; [(props, body)]."""
    out = []
    ch = direct.channel()
    ch.basic_qos(prefetch_count=1000)
    deadline = time.monotonic() + timeout
    for m, p, b in ch.consume(queue, auto_ack=True, inactivity_timeout=quiet):
        if m is None:
            if len(out) >= expect or time.monotonic() > deadline:
                break
            continue
        out.append((p, b))
        if time.monotonic() > deadline:
            break
    ch.cancel()
    ch.close()
    return out


def park(rb, broker, direct, q, messages, max_attempts, timeout=30):
    """Publish [(body, props)] to a fresh durable queue `q` through rebound
    (whose policy gives q `max_attempts` and short tiers) and fail every
    delivery until each is parked in q.dlq. Returns the deliveries the
    consumer saw (retryhelp.Delivery)."""
    direct.own(q, dlq(q))
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    for body, props in messages:
        ch.basic_publish("", q, body, props, mandatory=True)
    cons = PoisonConsumer(conn, ch, q)
    cons.wait(len(messages) * max_attempts, timeout=timeout)
    wait_count(direct, dlq(q), len(messages))
    late = cons.quiet_for(0.5)
    assert not late, "delivered after being parked: %r" % (late,)
    cons.cancel()
    conn.close()
    assert len(cons.deliveries) == len(messages) * max_attempts
    return cons.deliveries


def user(ctl, name, password, permissions=None):
    """Create a broker user; permissions (configure, write, read) regexes on
    vhost "/" or None for none at all (no access to the vhost)."""
    ctl.ctl("add_user", name, password)
    if permissions is not None:
        ctl.ctl("set_permissions", "-p", "/", name, *permissions)
    return name


def delete_user(ctl, name):
    try:
        ctl.ctl("delete_user", name)
    except AssertionError:
        pass


# ---- the admin HTTP routes -------------------------------------------------------


def basic(user, password):
    import base64
    return "Basic " + base64.b64encode(
        ("%s:%s" % (user, password)).encode()).decode()


def path(queue, route, **query):
    """/v1/dlq/{queue}/{route}?query, the queue percent-encoded."""
    from urllib.parse import urlencode
    p = "/v1/dlq/%s/%s" % (quote(queue, safe=""), route)
    if query:
        p += "?" + urlencode(query)
    return p


class Response:
    def __init__(self, status, headers, text):
        self.status, self.headers, self.text = status, headers, text

    def json(self):
        try:
            return json.loads(self.text)
        except ValueError as e:
            raise AssertionError("not JSON (%s): %r" % (e, self))

    def __repr__(self):
        return "HTTP %d %r %r" % (self.status, self.headers, self.text[:2000])


def request(port, method, target, auth=None, headers=None, timeout=60):
    """One request to the admin endpoint; auth: an Authorization header
    value, or (user, password), or None for none."""
    import http.client
    h = dict(headers or {})
    if isinstance(auth, tuple):
        h["Authorization"] = basic(*auth)
    elif auth is not None:
        h["Authorization"] = auth
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, target, headers=h)
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()},
                        text)
    finally:
        c.close()
