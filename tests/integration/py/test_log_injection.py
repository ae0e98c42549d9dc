"""Values a peer chooses cannot forge a log field or a log line, in
--log-format text or json.

Through a real rebound in front of the real broker:
  - a client logs in with a hostile user name (bytes of its choosing:
    quotes, '=', spaces, a forged "level=error msg=forged", a newline, CR,
    tab, control bytes, DEL, a backslash, invalid UTF-8 of several kinds)
    and is refused: session_close carries the user;
  - a client opens a hostile vhost: the broker's connection.close text
    echoes it (broker_close) and session_close carries it; a vhost of
    invalid UTF-8 is refused by the broker as a frame error, and
    session_close carries it too;
  - hostile queue names (what the broker accepts: valid UTF-8, no CR/LF)
    are retried: retry_published names the tier; for one whose tier exists
    with other arguments, the broker's channel.close text on rebound's own
    channel (own_channel_closed), retry_topology_error and retry_fallback
    name it.

Every line of the log is parsed strictly: the file is UTF-8; a text line is
logfmt as px_log.h writes it (one space between fields, values bare or
quoted with \\" \\\\ \\n \\r \\t \\xHH; also checked with rbtest.logfmt_parse),
a JSON line is one object (json.loads); keys are unique, no field or line
is forged, and every event name carries one set of keys. The hostile
values come back exactly: the same bytes in text, in JSON the same with
each byte of invalid UTF-8 read as U+FFFD.
"""
import codecs
import json
import re

import pytest

import amqp_raw as a
import rbtest
from retryhelp import direct, dlq, pump, tier  # noqa: F401 (fixture)

FORMATS = ("text", "json")

# What every hostile value carries: a forged field and a forged line in
# each format.
FORGE = ' forged=1 level=error x="' + '","forged":1,"level":"error'
FORGE_LINE_TEXT = "\nts=0 msg=forged"
FORGE_LINE_JSON = '\n{"ts":"0","msg":"forged"}'

# A user name (bytes from the PLAIN response, within the 100 rebound keeps).
USER = (b'u"' + FORGE.encode() + b"\r\t\x01\x1b\x7f\\ "
        + FORGE_LINE_TEXT.encode()
        + b"\xff\xfe\x80\xc0\xaf\xe2\x82\xed\xa0\x80\xf4\x90\x80\x80\xc3")
# A vhost the broker echoes in its close text (it must be valid UTF-8).
VHOST = ('v"' + FORGE + '\\ \t\x01\x1b\x7f caf\u00e9 \U0001f600'
         + FORGE_LINE_JSON)
# A vhost the broker refuses (malformed UTF-8), after rebound logged it.
VHOST_BAD = b"w\xc0\x80\xed\xbf\xbf\xf8\x88\x80\x80\x80" + b'"' + \
    FORGE.encode()
# A queue name the broker accepts (no CR/LF, valid UTF-8).
QUEUE = '"' + FORGE + ' ' + FORGE_LINE_TEXT[1:] + ' \t\x01\x1b\x7f\\ caf\u00e9'

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
KEY = re.compile(r"^[a-z0-9_]+$")
LEVELS = {"debug", "info", "warn", "error"}


def _per_byte(e):
    return "\ufffd" * (e.end - e.start), e.end


codecs.register_error("rebound-test-per-byte", _per_byte)


def shown(fmt, value):
    """What a string value (bytes or str) must read back as in `fmt`."""
    b = value.encode() if isinstance(value, str) else value
    return b if fmt == "text" else b.decode("utf-8", "rebound-test-per-byte")


# ---- strict readers ----------------------------------------------------------

_TEXT_FIELD = re.compile(
    r'([a-z0-9_]+)=(?:"((?:[^"\\\x00-\x1f\x7f]|\\["\\nrt]|\\x[0-9a-f]{2})*)"'
    r"|([A-Za-z0-9._:/@+-]+))(?: (?=[a-z0-9_])|$)")
_ESCAPE = re.compile(r'\\(x[0-9a-f]{2}|["\\nrt])')


def _unquote(v):
    out, pos = bytearray(), 0
    for m in _ESCAPE.finditer(v):
        out += v[pos:m.start()].encode()
        e = m.group(1)
        out += bytes([int(e[1:], 16)]) if e[0] == "x" else \
            {'"': b'"', "\\": b"\\", "n": b"\n", "r": b"\r", "t": b"\t"}[e]
        pos = m.end()
    return bytes(out + v[pos:].encode())


def text_fields(line):
    """[(key, bytes)] of one logfmt line as px_log writes it."""
    rbtest.logfmt_parse(line)  # the suite's strict reader agrees
    pos, out = 0, []
    while pos < len(line):
        m = _TEXT_FIELD.match(line, pos)
        if not m:
            raise ValueError("not px_log logfmt at column %d: %r"
                             % (pos, line))
        k, quoted, bare = m.groups()
        out.append((k, _unquote(quoted) if quoted is not None
                    else bare.encode()))
        pos = m.end()
    return out


def _no_constant(name):
    raise ValueError("not JSON: %s" % name)


def json_fields(line):
    """[(key, value)] of one JSON line: one flat object, no NaN/Infinity,
    strings of Unicode text (no lone surrogates)."""
    pairs = json.loads(line, object_pairs_hook=lambda p: p,
                       parse_constant=_no_constant)
    if not isinstance(pairs, list):
        raise ValueError("not one JSON object: %r" % line)
    for k, v in pairs:
        if isinstance(v, list):
            raise ValueError("nested value in %r" % line)
        if isinstance(v, str):
            v.encode("utf-8")  # raises on a lone surrogate
    return pairs


def read_log(rb, fmt, complete_only=True):
    """Every line of rebound's log, each as [(key, value)]; raises on the
    first that is not strictly what the format says. With complete_only,
    a last line still being written is left for later."""
    with open(rb.log_path, "rb") as f:
        raw = f.read()
    if complete_only:
        raw = raw[:raw.rfind(b"\n") + 1]
    try:
        text = raw.decode("utf-8")  # px_log writes UTF-8 only
    except UnicodeDecodeError as e:
        raise AssertionError("the log is not UTF-8 at byte %d: %r" % (
            e.start, raw[max(0, e.start - 60):e.start + 20]))
    lines = text.split("\n")
    assert lines[-1] == "", "the log does not end with a newline"
    parse = text_fields if fmt == "text" else json_fields
    out = []
    for n, line in enumerate(lines[:-1], 1):
        try:
            fields = parse(line)
        except ValueError as e:
            raise AssertionError("log line %d does not parse (%s): %r"
                                 % (n, e, line))
        out.append(fields)
    return out


def value(fmt, v):
    """A field's value as text (for msg, level, ts, peer)."""
    return v.decode() if fmt == "text" else str(v)


def lines_of(rb, fmt, msg):
    return [dict(f) for f in read_log(rb, fmt)
            if len(f) > 2 and f[2][0] == "msg" and value(fmt, f[2][1]) == msg]


def wait_line(rb, fmt, msg, pred=lambda d: True, timeout=10):
    return rbtest.wait_until(
        lambda: [d for d in lines_of(rb, fmt, msg) if pred(d)], timeout,
        lambda: "a %s line; log tail:\n%s" % (msg, rb.log()[-3000:]))[0]


def check_whole_log(rb, fmt):
    """After rebound exited: every line strict, nothing forged, one set of
    keys per event name."""
    lines = read_log(rb, fmt, complete_only=False)
    assert lines, "empty log"
    keys_of = {}
    for fields in lines:
        keys = [k for k, _ in fields]
        assert keys[:3] == ["ts", "level", "msg"], fields
        assert len(set(keys)) == len(keys), "a key twice: %r" % (fields,)
        assert all(KEY.match(k) for k in keys), fields
        assert "forged" not in keys, fields
        ts, level, msg = (value(fmt, v) for _, v in fields[:3])
        assert TS.match(ts), "a forged line? %r" % (fields,)
        assert level in LEVELS and KEY.match(msg) and msg != "forged", fields
        keys_of.setdefault(msg, set()).add(tuple(keys))
    several = {m: k for m, k in keys_of.items() if len(k) > 1}
    assert not several, "event names with more than one set of keys: %r" \
        % several


# ---- rebound in either format -------------------------------------------------


class _JsonRebound(rbtest.Rebound):
    """rbtest.Rebound waits for the text format's msg=listening; in JSON
    the line reads "msg":"listening"."""
    starting = True

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.starting = False

    def log(self):
        text = super().log()
        if self.starting and '"msg":"listening"' in text:
            text += "msg=listening"
        return text


@pytest.fixture(params=FORMATS)
def fmt(request, monkeypatch):
    if request.param == "json":
        monkeypatch.setattr(rbtest, "Rebound", _JsonRebound)
    return request.param


def stop(rb):
    assert rb.stop() == 0, rb.log()[-3000:]


# ---- the peers ------------------------------------------------------------------


def login(rb, user, password):
    """A raw client that logs in as `user` (PLAIN) and is refused."""
    c = a.RawClient(rb.port)
    c.send(a.PROTOCOL_HEADER)
    c.recv_method(a.CONNECTION_START)
    props = a.table({"product": "rebound-log-injection",
                     "capabilities": {"authentication_failure_close": True}})
    c.send(a.method(0, a.CONNECTION_START_OK, props + a.shortstr("PLAIN")
                    + a.longstr(b"\x00" + user + b"\x00" + password)
                    + a.shortstr("en_US")))
    code, text = c.expect_connection_close()[:2]
    assert code == 403, (code, text)
    c.close()
    return c.local_port


def open_vhost(rb, broker, vhost):
    """A raw client that opens `vhost` (bytes) and is refused; returns its
    port and the broker's close (code, text)."""
    c = a.RawClient(rb.port)
    c.send(a.PROTOCOL_HEADER)
    c.recv_method(a.CONNECTION_START)
    c.send(a.start_ok(broker.user, broker.password))
    tune = c.recv_method(a.CONNECTION_TUNE).tune_args()
    c.send(a.tune_ok(tune[0], tune[1], 0))
    c.send(a.method(0, a.CONNECTION_OPEN,
                    a.shortstr(vhost) + a.shortstr("") + b"\x00"))
    close = c.expect_connection_close()
    c.send(a.connection_close_ok())
    c.close()
    return c.local_port, close[:2]


def test_hostile_user_and_vhost(rebound_factory, broker, fmt):
    rb = rebound_factory("--log-format", fmt)
    peer = {}
    peer["user"] = login(rb, USER, b"not-the-password")
    peer["vhost"], (code, text) = open_vhost(rb, broker, VHOST.encode())
    assert code == 530 and VHOST in text, (code, text)
    peer["bad"], (code, _) = open_vhost(rb, broker, VHOST_BAD)
    assert code == 501, code

    def of(name):
        return lambda d: value(fmt, d["peer"]) == "127.0.0.1:%d" % peer[name]

    d = wait_line(rb, fmt, "session_close", of("user"))
    assert d["user"] == shown(fmt, USER), d
    bc = wait_line(rb, fmt, "broker_close", of("vhost"))
    assert bc["text"] == shown(fmt, text) == \
        shown(fmt, "NOT_ALLOWED - vhost %s not found" % VHOST), bc
    d = wait_line(rb, fmt, "session_close", of("vhost"))
    assert d["vhost"] == shown(fmt, VHOST), d
    d = wait_line(rb, fmt, "session_close", of("bad"))
    assert d["vhost"] == shown(fmt, VHOST_BAD), d
    stop(rb)
    check_whole_log(rb, fmt)


def test_hostile_queue_names_in_retries(rebound_factory, broker, ctl, direct,
                                        fmt):
    rb = rebound_factory("--log-format", fmt, "--retry-tiers", "1s",
                         "--max-attempts", "3")
    q1 = rbtest.uniq("inj") + QUEUE
    q2 = rbtest.uniq("inj") + QUEUE
    pre = tier(q2, "1s")
    direct.own(q1, q2, tier(q1, "1s"), dlq(q1), pre, dlq(q2))
    direct.ch.queue_declare(q1, durable=True)
    direct.ch.queue_declare(q2, durable=True)
    # q2's tier exists with another TTL: rebound's declare of it is refused
    direct.ch.queue_declare(pre, durable=True, arguments={
        "x-message-ttl": 5000, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": q2})

    conn = rb.pika(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    seen = {q1: 0, q2: 0}

    def on_message(chan, method, props, body):
        seen[body.decode()] += 1
        if seen[body.decode()] == 1:
            chan.basic_nack(method.delivery_tag, requeue=True)
        else:
            chan.basic_ack(method.delivery_tag)

    ch.basic_qos(prefetch_count=10)
    for q in (q1, q2):
        ch.basic_consume(q, on_message)
        ch.basic_publish("", q, q.encode(), mandatory=True)
    # q1: back from its tier after 1s; q2: dead-lettered, its tier refused.
    # q2's tier is declared only once q1's copy is confirmed, so its
    # refusal (which closes rebound's channel) costs q1 nothing
    pump(conn, lambda: seen[q1] == 2, 20,
         lambda: "two deliveries of q1 (seen %r)" % seen)
    d = wait_line(rb, fmt, "dead_lettered")
    assert d["queue"] == shown(fmt, q2) and d["target"] == \
        shown(fmt, dlq(q2)) and d["reason"] == shown(fmt, "tier-refused"), d
    assert seen[q2] == 1, seen
    d = wait_line(rb, fmt, "retry_tier_refused")
    assert d["tier"] == shown(fmt, pre), d

    d = wait_line(rb, fmt, "retry_published")
    assert d["target"] == shown(fmt, tier(q1, "1s")), d
    d = wait_line(rb, fmt, "retry_topology_error")
    assert d["queue"] == shown(fmt, pre), d
    d = wait_line(rb, fmt, "own_channel_closed")
    assert shown(fmt, "'%s'" % pre) in d["text"], d  # the broker's words
    d = wait_line(rb, fmt, "retry_fallback")
    assert d["target"] == shown(fmt, pre), d
    conn.close()
    stop(rb)
    check_whole_log(rb, fmt)
