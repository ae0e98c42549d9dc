"""The admin HTTP server (src/proxy/px_admin.c) over real sockets.

Each test starts tests/proxy/admin_harness.c (path in REBOUND_ADMIN_HARNESS)
on a free port with a fixed router (its routes are listed at the top of
admin_harness.c): GET /ok -> "ok\\n", GET /big -> 2 MiB, /method-check ->
405 for anything but GET, GET /conns -> open admin connections, /count and
/stats -> the harness's counters, /stream, /stream-small, /stream-fail ->
streamed bodies, anything else -> 404. Every harness is stopped with SIGTERM
and must exit 0 with no sanitizer report (LeakSanitizer included).
"""

import http.client
import os
import re
import signal
import socket
import subprocess
import time

import pytest

HARNESS = os.environ.get("REBOUND_ADMIN_HARNESS")
BIG = 2 * 1024 * 1024
SLICE = 64 * 1024  # PX_ADMIN_SLICE
STREAM_SLICES = 320
STREAM_BODY = b"begin\n" + b"".join(
    bytes([ord("a") + i % 26]) * SLICE for i in range(STREAM_SLICES))

pytestmark = pytest.mark.skipif(
    not HARNESS, reason="REBOUND_ADMIN_HARNESS is not set")


class Harness:
    def __init__(self, tmp_path, *args):
        self.err_path = tmp_path / f"harness-{time.monotonic_ns()}.err"
        self.err = open(self.err_path, "wb")
        env = dict(os.environ)
        # ASan's quarantine would count freed bodies as resident memory.
        env.setdefault("ASAN_OPTIONS", "quarantine_size_mb=4:detect_leaks=1")
        self.proc = subprocess.Popen([HARNESS, "--debug", *args],
                                     stdout=subprocess.PIPE, stderr=self.err,
                                     env=env)
        line = self.proc.stdout.readline().decode()
        m = re.match(r"port=(\d+)", line)
        assert m, f"harness did not start: {line!r} {self.stderr()}"
        self.port = int(m.group(1))

    def stderr(self):
        self.err.flush()
        return self.err_path.read_text(errors="replace")

    def connect(self, timeout=5.0, rcvbuf=None):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(timeout)
        s.connect(("127.0.0.1", self.port))
        return s

    def http(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)

    def get(self, path, method="GET", headers=None):
        c = self.http()
        try:
            c.request(method, path, headers=headers or {})
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            c.close()

    def stats(self):
        """The harness's counters (/stats) as a dict of ints."""
        status, _, body = self.get("/stats")
        assert status == 200
        return {k: int(v) for k, v in
                (kv.split("=") for kv in body.decode().split())}

    def routed(self):
        status, _, body = self.get("/count")
        assert status == 200
        return int(body.decode().split("=")[1])

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def stop(self, timeout=10):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("harness did not exit on SIGTERM")
        self.proc.stdout.close()
        self.err.close()
        err = self.err_path.read_text(errors="replace")
        assert rc == 0, f"harness exit {rc}:\n{err}"
        assert "Sanitizer" not in err and "runtime error" not in err, err
        return err


@pytest.fixture
def start(tmp_path):
    started = []

    def _start(*args):
        h = Harness(tmp_path, *[str(a) for a in args])
        started.append(h)
        return h

    yield _start
    for h in started:
        h.stop()


@pytest.fixture
def harness(start):
    return start()


class Reader:
    """Reads HTTP/1.1 responses off a raw socket, one at a time: bodies by
    Content-Length, chunked (the chunk sizes are kept in `chunks`) or
    delimited by the connection's end."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.chunks = []

    def _fill(self):
        data = self.sock.recv(1 << 20)
        if not data:
            raise EOFError("connection closed")
        self.buf += data

    def _take(self, n):
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _chunked(self):
        body, self.chunks = [], []
        while True:
            size = int(self._line(), 16)
            if size == 0:
                assert self._line() == b"", "trailer after the last chunk"
                return b"".join(body)
            self.chunks.append(size)
            body.append(self._take(size))
            assert self._take(2) == b"\r\n", "chunk not followed by CRLF"

    def _until_eof(self):
        try:
            while True:
                self._fill()
        except EOFError:
            pass
        body, self.buf = self.buf, b""
        return body

    def response(self, head_only=False):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        version, status, _ = (lines[0].split(" ", 2) + [""])[:3]
        assert version == "HTTP/1.1", lines[0]
        headers = {}
        for line in lines[1:]:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
        if head_only:
            body = b""
        elif headers.get("transfer-encoding") == "chunked":
            assert "content-length" not in headers
            body = self._chunked()
        elif "content-length" in headers:
            body = self._take(int(headers["content-length"]))
        else:
            assert headers["connection"] == "close"
            body = self._until_eof()
        return int(status), headers, body

    def closed(self):
        """True once the server has closed (EOF or reset); no extra bytes."""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return self.buf == b""
                self.buf += data
        except ConnectionResetError:
            return self.buf == b""


def req(path, method="GET", version="1.1", headers=()):
    lines = [f"{method} {path} HTTP/{version}", "Host: test", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def wait_for(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


# ---- status codes and routing ----

def test_ok_200_with_module_headers(harness):
    status, headers, body = harness.get("/ok")
    assert (status, body) == (200, b"ok\n")
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert headers["Content-Length"] == "3"
    assert headers["Connection"] == "keep-alive"


def test_unknown_path_404(harness):
    status, _, body = harness.get("/nope")
    assert (status, body) == (404, b"not found\n")


def test_wrong_method_405_with_allow(harness):
    status, headers, body = harness.get("/method-check", method="POST")
    assert status == 405
    assert headers["Allow"] == "GET, HEAD"
    assert body == b"method POST not allowed\n"
    assert harness.get("/method-check")[0] == 200


def test_query_string_stripped(harness):
    assert harness.get("/ok?x=1")[:3:2] == (200, b"ok\n")
    assert harness.get("/ok?")[0] == 200
    with harness.connect() as s:
        s.sendall(req("/method-check?a=b#frag"))
        assert Reader(s).response()[::2] == (200, b"method GET\n")


def echo(harness, path="/echo", pairs=(), **headers):
    with harness.connect() as s:
        s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\n" + b"".join(
            k.encode() + b": " + v.encode() + b"\r\n"
            for k, v in [*pairs, *headers.items()]) + b"\r\n")
        return Reader(s).response()[::2]


def test_router_sees_query_and_kept_headers(harness):
    assert echo(harness, "/echo?limit=5&vhost=%2F",
                Authorization="Basic Z3Vlc3Q6", Origin="http://a:1",
                Host="a:1", **{"Sec-Fetch-Site": "same-origin"}) == (
        200, b"query=limit=5&vhost=%2F authorization=Basic Z3Vlc3Q6 "
        b"origin=http://a:1 host=a:1 fetch=same-origin\n")
    assert echo(harness) == (
        200, b"query= authorization= origin= host= fetch=\n")
    # header names are case-insensitive; the last of a repeated one counts
    assert echo(harness, pairs=[("ORIGIN", "x"), ("origin", "y")])[1] == (
        b"query= authorization= origin=y host= fetch=\n")
    # a value too long to keep is not passed on, cut or otherwise
    assert echo(harness, Authorization="Basic " + "A" * 1100) == (
        200, b"query= authorization= origin= host= fetch=\n")
    assert echo(harness, Origin="http://" + "o" * 300) == (
        200, b"query= authorization= origin= host= fetch=\n")


# ---- deferred answers ----

def test_deferred_answer_then_next_request_in_order(harness):
    with harness.connect() as s:
        s.sendall(req("/deferred") + req("/ok"))
        r = Reader(s)
        assert r.response()[::2] == (200, b"deferred 1\n")
        assert r.response()[::2] == (200, b"ok\n")
    assert harness.stats()["waiting"] == 0


def test_deferred_answers_do_not_block_others(harness):
    socks = [harness.connect() for _ in range(5)]
    for s in socks:
        s.sendall(req("/deferred-never"))
    assert wait_for(lambda: harness.stats()["waiting"] == 5)
    assert harness.get("/ok")[::2] == (200, b"ok\n")
    for s in socks:
        s.close()


def test_sigterm_cancels_deferred_answers(start):
    h = start()
    s = h.connect()
    s.sendall(req("/deferred-never"))
    assert wait_for(lambda: h.stats()["waiting"] == 1)
    err = h.stop()  # LeakSanitizer reports a deferred state never freed
    assert "msg=harness_stopped conns=0 streams=0 waiting=0" in err
    s.close()


# ---- connection handling ----

def test_keep_alive_two_requests_one_socket(harness):
    c = harness.http()
    c.request("GET", "/ok")
    r = c.getresponse()
    assert (r.status, r.read()) == (200, b"ok\n")
    sock = c.sock
    c.request("GET", "/nope")
    r = c.getresponse()
    assert (r.status, r.read()) == (404, b"not found\n")
    assert c.sock is sock, "http.client had to reconnect"
    c.close()
    with harness.connect() as s:
        rd = Reader(s)
        for path in ("/ok", "/ok"):
            s.sendall(req(path))
            status, headers, body = rd.response()
            assert (status, body) == (200, b"ok\n")
            assert headers["connection"] == "keep-alive"


def test_pipelined_requests_answered_in_order(harness):
    with harness.connect() as s:
        s.sendall(req("/ok") + req("/nope") + req("/method-check", "PUT") +
                  req("/method-check") + req("/ok"))
        rd = Reader(s)
        got = [rd.response() for _ in range(5)]
        assert [(st, b) for st, _, b in got] == [
            (200, b"ok\n"), (404, b"not found\n"),
            (405, b"method PUT not allowed\n"), (200, b"method GET\n"),
            (200, b"ok\n")]


def test_pipelined_requests_split_at_every_byte(harness):
    data = req("/ok") + req("/method-check?q", "DELETE") + req("/nope")
    with harness.connect() as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(data)):
            s.send(data[i:i + 1])
            time.sleep(0.001)
        rd = Reader(s)
        assert [rd.response()[0] for _ in range(3)] == [200, 405, 404]


def test_pipelined_requests_routed_one_per_loop_iteration(harness):
    """400 requests arriving at once are not answered in one go: the next is
    parsed only once the previous answer has been written, so no loop
    iteration routes more than one request of a connection."""
    with harness.connect() as s:
        s.sendall(req("/ok") * 400)
        rd = Reader(s)
        for _ in range(400):
            assert rd.response()[::2] == (200, b"ok\n")
    stats = harness.stats()
    assert stats["max_per_iteration"] == 1, stats


def test_next_request_waits_until_answer_written(harness):
    """While the client does not read a big answer, the requests pipelined
    behind it are neither parsed nor answered."""
    with harness.connect(rcvbuf=4096) as s:
        s.sendall(req("/stream") + req("/ok") * 5)
        assert wait_for(lambda: harness.stats()["streams"] == 1)
        produced = []

        def settled():  # the socket buffers are full: no slice moves
            produced.append(harness.stats()["slices"])
            return len(produced) >= 3 and len(set(produced[-3:])) == 1
        assert wait_for(settled, timeout=10)
        assert produced[-1] < STREAM_SLICES, "the whole stream was produced"
        assert harness.routed() == 1, "a request behind the answer was parsed"
        rd = Reader(s)
        assert rd.response()[::2] == (200, STREAM_BODY)
        for _ in range(5):
            assert rd.response()[::2] == (200, b"ok\n")
    assert harness.routed() == 6
    assert harness.stats()["streams"] == 0


def test_connection_close_honoured(harness):
    with harness.connect() as s:
        s.sendall(req("/ok", headers=["Connection: close"]) + req("/ok"))
        rd = Reader(s)
        status, headers, body = rd.response()
        assert (status, body) == (200, b"ok\n")
        assert headers["connection"] == "close"
        assert rd.closed(), "second pipelined request answered after close"


def test_http10_closes_unless_keep_alive(harness):
    with harness.connect() as s:
        s.sendall(req("/ok", version="1.0"))
        rd = Reader(s)
        status, headers, body = rd.response()
        assert (status, body, headers["connection"]) == (200, b"ok\n", "close")
        assert rd.closed()
    with harness.connect() as s:
        rd = Reader(s)
        for _ in range(2):
            s.sendall(req("/ok", version="1.0",
                          headers=["Connection: keep-alive"]))
            status, headers, _ = rd.response()
            assert (status, headers["connection"]) == (200, "keep-alive")


# ---- streamed bodies ----

def test_streamed_body_chunked_then_next_request(harness):
    with harness.connect() as s:
        rd = Reader(s)
        s.sendall(req("/stream") + req("/stream-small") + req("/ok"))
        status, headers, body = rd.response()
        assert status == 200
        assert headers["transfer-encoding"] == "chunked"
        assert headers["connection"] == "keep-alive"
        assert body == STREAM_BODY  # 20 MiB: over any one-shot body's limit
        assert rd.chunks == [len(b"begin\n")] + [SLICE] * STREAM_SLICES
        status, headers, body = rd.response()
        assert (status, body) == (200, b"<1\n2\n3\n")
        assert rd.chunks == [1, 2, 2, 2]
        assert rd.response()[::2] == (200, b"ok\n")
    # A client library reads it as any other body.
    status, headers, body = harness.get("/stream-small")
    assert (status, body) == (200, b"<1\n2\n3\n")
    assert harness.stats()["streams"] == 0


@pytest.mark.parametrize("path,body", [("/stream-small", b"<1\n2\n3\n"),
                                       ("/stream", STREAM_BODY)],
                         ids=["last_slice_full", "last_slice_empty"])
@pytest.mark.parametrize("keep_alive", [False, True])
def test_streamed_body_to_http10_ends_with_the_connection(harness, path, body,
                                                          keep_alive):
    with harness.connect() as s:
        extra = ["Connection: keep-alive"] if keep_alive else []
        s.sendall(req(path, version="1.0", headers=extra) + req("/ok"))
        rd = Reader(s)
        status, headers, got = rd.response()
        assert status == 200
        assert headers["connection"] == "close"
        assert "content-length" not in headers
        assert "transfer-encoding" not in headers
        assert got == body  # read up to the server's close
    assert harness.stats()["streams"] == 0
    assert harness.routed() == 1, "the request after it was answered"


@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_head_of_streamed_body_headers_only(harness, version):
    with harness.connect() as s:
        rd = Reader(s)
        s.sendall(req("/stream-small", version=version))
        _, get_headers, _ = rd.response()
    with harness.connect() as s:
        rd = Reader(s)
        s.sendall(req("/stream-small", "HEAD", version=version) + req("/ok"))
        status, headers, _ = rd.response(head_only=True)
        assert (status, headers) == (200, get_headers)
        if version == "1.1":  # the next response follows the head at once
            assert rd.response()[::2] == (200, b"ok\n")
        else:
            assert rd.closed()
    stats = harness.stats()
    assert (stats["streams"], stats["slices"]) == (0, 3), stats


def test_concurrent_streams_share_a_bounded_loop_iteration(harness):
    """Eight clients reading streams at full speed: between two polls the
    server produces at most 4 slices in all, not one per client."""
    import threading
    bodies, errors = [], []

    def read_one():
        try:
            with harness.connect(timeout=30) as s:
                s.sendall(req("/stream"))
                bodies.append(Reader(s).response()[2])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=read_one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[0]
    assert bodies == [STREAM_BODY] * 8
    stats = harness.stats()
    assert stats["slices"] == 8 * (STREAM_SLICES + 1)
    assert 1 <= stats["max_slices_per_iteration"] <= 4, stats


def test_stream_failure_truncates_and_closes(harness):
    with harness.connect() as s:
        rd = Reader(s)
        s.sendall(req("/stream-fail") + req("/ok"))
        with pytest.raises(EOFError):
            rd.response()
        assert rd.chunks == [len(b"begin\n"), 2], "chunks before the failure"
    assert wait_for(lambda: "msg=admin_stream_failed" in harness.stderr())
    assert "level=warn msg=admin_stream_failed" in harness.stderr()
    assert harness.stats()["streams"] == 0
    assert harness.routed() == 1


def test_stream_not_read_bounded_and_released_at_timeout(start):
    """A client that stops reading a stream holds one slice, not the body,
    and the producer's state goes with the connection at the timeout."""
    h = start("--timeout-ms", 1500)
    time.sleep(0.2)
    rss0 = h.rss_kib()
    stalled = [h.connect(rcvbuf=4096) for _ in range(8)]
    for s in stalled:
        s.sendall(req("/stream"))
    assert wait_for(lambda: h.stats()["streams"] == 8)
    for _ in range(20):
        assert h.get("/ok")[::2] == (200, b"ok\n")
    assert h.rss_kib() - rss0 < 24 * 1024  # the 8 bodies would be 160 MiB
    assert h.stats()["slices"] < 8 * STREAM_SLICES // 2
    assert wait_for(lambda: h.stats()["streams"] == 0, timeout=8)
    for s in stalled:
        assert Reader(s).closed() is not None
        s.close()


def test_stream_released_when_client_leaves(harness):
    s = harness.connect(rcvbuf=4096)
    s.sendall(req("/stream"))
    assert s.recv(1000).startswith(b"HTTP/1.1 200 OK\r\n")
    assert harness.stats()["streams"] == 1
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
    s.close()  # a reset: the next write fails
    assert wait_for(lambda: harness.stats()["streams"] == 0)


def test_sigterm_mid_stream_releases_state(start):
    h = start()
    s = h.connect(rcvbuf=4096)
    s.sendall(req("/stream"))
    assert wait_for(lambda: h.stats()["streams"] == 1)
    err = h.stop()  # LeakSanitizer would report a producer state left
    assert "msg=harness_stopped conns=0 streams=0" in err
    s.close()


# ---- bad requests ----

@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"GET /ok HTTP/1.1\r\nBad Header\r\n\r\n",
    b"GET /ok HTTP/9.9\r\n\r\n",
    b"GET /ok HTTP/1.1\r\nContent-Length: x\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello
])
def test_malformed_request_400_and_close(harness, raw):
    with harness.connect() as s:
        s.sendall(raw + req("/ok"))
        rd = Reader(s)
        status, headers, body = rd.response()
        assert (status, body) == (400, b"Bad Request\n")
        assert headers["connection"] == "close"
        assert rd.closed(), "request after a malformed one was answered"
    assert harness.get("/ok")[0] == 200


@pytest.mark.parametrize("shape", ["one_header", "many_headers", "long_url"])
def test_headers_over_8k_431_and_close(harness, shape):
    if shape == "one_header":
        big = req("/ok", headers=["X-Big: " + "a" * 9000])
    elif shape == "many_headers":
        big = req("/ok", headers=[f"X-H{i}: {'b' * 90}" for i in range(100)])
    else:
        big = req("/ok?" + "c" * 9000)
    with harness.connect() as s:
        s.sendall(big)
        rd = Reader(s)
        status, headers, _ = rd.response()
        assert status == 431
        assert headers["connection"] == "close"
        assert rd.closed()


def test_headers_under_8k_accepted(harness):
    with harness.connect() as s:
        s.sendall(req("/ok", headers=["X-Big: " + "a" * 7000]))
        assert Reader(s).response()[::2] == (200, b"ok\n")


def test_small_body_read_and_ignored(harness):
    with harness.connect() as s:
        rd = Reader(s)
        s.sendall(req("/ok", headers=["Content-Length: 20"]) +
                  b"GET /nope HTTP/1.1\r\n" + req("/method-check"))
        assert rd.response()[::2] == (200, b"ok\n")
        assert rd.response()[::2] == (200, b"method GET\n")
        chunked = (req("/ok", headers=["Transfer-Encoding: chunked"]) +
                   b"5\r\nGET /\r\n0\r\n\r\n")
        s.sendall(chunked + req("/ok"))
        assert rd.response()[0] == 200
        assert rd.response()[0] == 200


def test_body_too_large_413_and_close(harness):
    # Refused on the declared length alone, before any body byte...
    with harness.connect(timeout=3) as s:
        s.sendall(req("/ok", headers=["Content-Length: 100000"]))
        rd = Reader(s)
        status, headers, _ = rd.response()
        assert (status, headers["connection"]) == (413, "close")
        assert rd.closed()
    # ...and the body the client sends anyway does not turn into a reset.
    with harness.connect() as s:
        s.sendall(req("/ok", headers=["Content-Length: 100000"]) +
                  b"x" * 20000)
        rd = Reader(s)
        assert rd.response()[0] == 413
        assert rd.closed()
    with harness.connect() as s:
        chunk = b"4000\r\n" + b"y" * 0x4000 + b"\r\n"
        s.sendall(req("/ok", headers=["Transfer-Encoding: chunked"]) + chunk)
        rd = Reader(s)
        assert rd.response()[0] == 413
        assert rd.closed()


def test_head_same_headers_as_get_no_body(harness):
    with harness.connect() as s:
        rd = Reader(s)
        for path, length in (("/ok", "3"), ("/big", str(BIG))):
            s.sendall(req(path))
            get_status, get_headers, body = rd.response()
            assert len(body) == int(length)
            s.sendall(req(path, "HEAD") + req("/nope"))
            status, headers, _ = rd.response(head_only=True)
            assert (status, headers) == (get_status, get_headers)
            assert headers["content-length"] == length
            # The next response follows the head at once: no body was sent.
            assert rd.response()[::2] == (404, b"not found\n")
        s.sendall(req("/method-check", "HEAD"))
        assert rd.response(head_only=True)[0] == 200


# ---- limits ----

def busy_conn(h, tail=b"GET /ok HTTP/1.1\r\nHost:"):
    """A connection the harness has seen start a request it has not
    finished: `tail` follows a complete request in one segment, and once
    that request's answer is read, the harness has parsed `tail` too (it
    does so when the answer's write completes, before it polls again)."""
    s = h.connect()
    rd = Reader(s)
    s.sendall(req("/ok") + tail)
    assert rd.response()[::2] == (200, b"ok\n")
    return s, rd


@pytest.mark.parametrize("args,cap", [((), 64), (("--max-conns", 4), 4)],
                         ids=["default_64", "configured_4"])
def test_connection_cap_refuses_when_none_idle(start, args, cap):
    h = start(*args)
    kept = [busy_conn(h) for _ in range(cap)]
    for _ in range(3):  # one burst of refusals
        with h.connect(timeout=3) as extra:
            assert Reader(extra).closed(), "over-cap connection was kept"
    for s, rd in kept:  # none was closed to make room
        s.sendall(b" test\r\n\r\n")
        assert rd.response()[::2] == (200, b"ok\n")
        s.sendall(b"GET /ok HTTP/1.1\r\nHost:")  # busy again
    assert wait_for(lambda: h.stderr().count("msg=admin_conn_refused ") == 1)
    assert "level=warn msg=admin_conn_refused address=127.0.0.1:" in h.stderr()
    assert "msg=admin_conn_evicted" not in h.stderr()
    kept.pop()[0].close()
    assert wait_for(lambda: "msg=admin_conn_refused_end" in h.stderr())
    with h.connect() as s:
        rd = Reader(s)
        s.sendall(req("/stats") + req("/conns"))
        assert rd.response()[2].startswith(b"evicted=0 refused=3 ")
        assert rd.response()[::2] == (200, f"{cap}\n".encode())
    for s, _ in kept:
        s.close()


@pytest.mark.parametrize("args,cap", [((), 64), (("--max-conns", 4), 4)],
                         ids=["default_64", "configured_4"])
def test_idle_keep_alive_closed_for_newcomer(start, args, cap):
    """Keep-alive clients sitting on every slot do not lock a probe out:
    the connection idle the longest makes room."""
    h = start(*args)
    kept = [h.connect() for _ in range(cap)]
    readers = [Reader(s) for s in kept]
    for s, rd in zip(kept, readers):
        s.sendall(req("/ok"))
        assert rd.response()[0] == 200
    time.sleep(0.02)  # let the loop clock move: kept[0] is then used last
    kept[0].sendall(req("/ok"))
    assert readers[0].response()[0] == 200
    with h.connect(timeout=3) as probe:
        rd = Reader(probe)
        probe.sendall(req("/ok"))
        assert rd.response()[::2] == (200, b"ok\n")
        assert readers[1].closed(), "the longest idle was not the one closed"
        others = list(zip(kept, readers))
        del others[1]
        for s, r in others:
            s.sendall(req("/ok"))
            assert r.response()[::2] == (200, b"ok\n")
        probe.sendall(req("/stats"))
        _, _, body = rd.response()
        assert b"evicted=1 refused=0 " in body
    lines = [ln for ln in h.stderr().splitlines()
             if "admin_conn_evicted" in ln]
    assert len(lines) == 1, lines
    assert "level=info msg=admin_conn_evicted address=127.0.0.1:" in lines[0]
    assert f"max_conns={cap}" in lines[0]
    assert "refused" not in h.stderr()
    for s in kept:
        s.close()


def test_non_idle_connection_not_evicted(start):
    """At the cap only an idle connection is closed for a newcomer: not one
    inside a request (head or body) nor one whose answer is in flight."""
    h = start("--max-conns", 5)
    head, head_rd = busy_conn(h)
    body, body_rd = busy_conn(
        h, b"GET /ok HTTP/1.1\r\nHost: test\r\nContent-Length: 10\r\n\r\nabc")
    stream = h.connect(rcvbuf=4096)
    stream_rd = Reader(stream)
    stream.sendall(req("/ok") + req("/stream"))
    assert stream_rd.response()[::2] == (200, b"ok\n")  # /stream now routed
    idle = h.connect()
    idle_rd = Reader(idle)
    idle.sendall(req("/ok"))
    assert idle_rd.response()[0] == 200
    # Slot 5 taken by a connection that completes a request later: busy.
    late, late_rd = busy_conn(h)
    newcomer, newcomer_rd = busy_conn(h)  # takes the idle one's place
    assert idle_rd.closed()
    with h.connect(timeout=3) as extra:
        assert Reader(extra).closed(), "a busy connection was closed for it"
    head.sendall(b" test\r\n\r\n")
    assert head_rd.response()[::2] == (200, b"ok\n")
    body.sendall(b"defghij")
    assert body_rd.response()[::2] == (200, b"ok\n")
    late.sendall(b" test\r\n\r\n")
    assert late_rd.response()[::2] == (200, b"ok\n")
    assert stream_rd.response()[::2] == (200, STREAM_BODY)
    newcomer.sendall(b" test\r\n\r\n" + req("/stats"))
    assert newcomer_rd.response()[::2] == (200, b"ok\n")
    _, _, stats = newcomer_rd.response()
    assert stats.startswith(b"evicted=1 refused=1 streams=0 "), stats
    for s in (head, body, stream, idle, late, newcomer):
        s.close()


def test_idle_connection_closed_after_timeout(start):
    h = start("--timeout-ms", 1000)
    t0 = time.monotonic()
    with h.connect(timeout=5) as s:
        assert Reader(s).closed()
    assert 0.8 < time.monotonic() - t0 < 4
    # Idle after a response (keep-alive) too.
    with h.connect(timeout=5) as s:
        rd = Reader(s)
        s.sendall(req("/ok"))
        assert rd.response()[0] == 200
        t0 = time.monotonic()
        assert rd.closed()
        assert 0.8 < time.monotonic() - t0 < 4


def test_slow_request_closed_after_timeout(start):
    h = start("--timeout-ms", 1000)
    with h.connect(timeout=5) as s:
        s.sendall(b"GET /ok HTTP/1.1\r\n")
        t0 = time.monotonic()
        closed = False
        while time.monotonic() - t0 < 4:
            try:
                s.sendall(b"X: y\r\n")  # always busy, never complete
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.1)
        assert closed or Reader(s).closed()
        assert time.monotonic() - t0 < 4


def test_client_not_reading_big_does_not_block_others(start):
    h = start("--timeout-ms", 3000)
    time.sleep(0.2)
    rss0 = h.rss_kib()
    stalled = h.connect(rcvbuf=65536)
    stalled.sendall(req("/big") * 100)  # 200 MiB asked, never read
    time.sleep(0.5)
    t0 = time.monotonic()
    for _ in range(20):
        status, _, body = h.get("/ok")
        assert (status, body) == (200, b"ok\n")
    assert time.monotonic() - t0 < 5
    # Only one response per connection is ever waiting.
    assert h.rss_kib() - rss0 < 48 * 1024
    assert h.get("/conns")[2] == b"2\n"
    # The stalled client is closed by the timeout; the others carry on.
    assert wait_for(lambda: h.get("/conns")[2] == b"1\n", timeout=8)
    stalled.close()


def test_sigterm_with_busy_connections_exits_clean(start):
    h = start()
    idle = h.connect()
    partial = h.connect()
    partial.sendall(b"GET /ok HTTP/1.1\r\nHost:")
    stalled = h.connect(rcvbuf=65536)
    stalled.sendall(req("/big") * 10)
    with h.connect() as s:
        s.sendall(req("/ok"))
        assert Reader(s).response()[0] == 200
    assert wait_for(lambda: h.get("/conns")[2] == b"4\n")
    err = h.stop()
    assert "msg=harness_stopped conns=0" in err
    for s in (idle, partial):
        assert Reader(s).closed()
    stalled.close()
    idle.close()
    partial.close()


def test_listen_failure_logged_with_address(start, tmp_path):
    h = start()
    p = subprocess.run([HARNESS, "--port", str(h.port)],
                       capture_output=True, timeout=10)
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert f"msg=admin_listen_failed address=127.0.0.1:{h.port}" in err
    assert "Sanitizer" not in err
    p = subprocess.run([HARNESS, "--host", "nosuchhost.invalid"],
                       capture_output=True, timeout=10)
    assert p.returncode == 1
    assert "cannot resolve host name 'nosuchhost.invalid'" in \
        p.stderr.decode()
