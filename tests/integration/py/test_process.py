"""The process at its edges: SIGTERM while the readiness probe is still
connecting, SIGUSR1/SIGUSR2, the cap on client connections, running out of
file descriptors, and the file descriptor limit at start.

A connect that hangs is made on loopback only: a listening socket with
backlog 0 whose accept queue is full and never accepted, so the kernel drops
further SYNs and the connect stays in SYN-SENT."""
import http.client
import os
import resource
import select
import signal
import socket
import subprocess
import threading
import time


import amqp_raw as a
import rbtest
from conftest import PASS_THROUGH

TCP_SYN_SENT = "02"


class HangingListener:
    """127.0.0.1:port where a connect never completes. With `relay_to`, it
    first relays every connection to that address (a broker), until
    hang() fills its accept queue."""

    def __init__(self, relay_to=None):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.port = self.sock.getsockname()[1]
        self.addr = "127.0.0.1:%d" % self.port
        self.relay_to = relay_to
        self.fill = []
        self.pipes = []
        self.accepting = relay_to is not None
        self.thread = None
        if relay_to:
            self.thread = threading.Thread(target=self._accept_loop, daemon=True)
            self.thread.start()
        else:
            self.hang()

    def hang(self):
        """Stop accepting and fill the accept queue (backlog 0 holds one)."""
        self.accepting = False
        if self.thread:
            self.thread.join(5)
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.fill.append(s)

    def _accept_loop(self):
        host, port = self.relay_to.rsplit(":", 1)
        while self.accepting:
            if not select.select([self.sock], [], [], 0.05)[0]:
                continue
            c, _ = self.sock.accept()
            u = socket.create_connection((host, int(port)), timeout=5)
            self.pipes += [c, u]
            for src, dst in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(src, dst),
                                 daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.accepting = False
        for s in [self.sock] + self.fill + self.pipes:
            s.close()


def probe_connecting(rb, port):
    """rebound has a socket in SYN-SENT towards 127.0.0.1:port."""
    return any(st == TCP_SYN_SENT and remote == ("127.0.0.1", port)
               for st, _, remote in rb.sockets())


def wait_probe_connecting(rb, port):
    rbtest.wait_until(lambda: probe_connecting(rb, port), 10,
                      lambda: "rebound's probe to be connecting to %d (sockets %r)"
                      % (port, rb.sockets()))


def assert_clean_exit(rb, timeout=15):
    rc = rb.wait_exit(timeout=timeout)
    assert rc == 0, "exit status %r; log tail:\n%s" % (rc, rb.log()[-3000:])
    assert not rb.sanitizer_report(), rb.log()[-6000:]
    assert rb.log_lines("exit")
    assert not rb.log_lines("exit_handle_unclosed")


def test_sigterm_while_the_readiness_probe_connects(rebound_factory):
    """No session, the probe's connect hanging: SIGTERM ends rebound with
    status 0 (the loop stops with the probe's socket still connecting)."""
    hang = HangingListener()
    try:
        for _ in range(3):
            rb = rebound_factory(upstream=hang.addr)
            wait_probe_connecting(rb, hang.port)
            rb.signal(signal.SIGTERM)
            assert_clean_exit(rb)
    finally:
        hang.close()


def test_drain_timeout_while_the_readiness_probe_connects(rebound_factory,
                                                          broker):
    """A client that never answers connection.close keeps rebound draining
    until the drain timeout, and meanwhile the probe's connect hangs: the
    drain timeout ends rebound with status 0."""
    hang = HangingListener(relay_to=broker.addr)
    try:
        rb = rebound_factory("--drain-timeout", "1s", upstream=hang.addr)
        c = a.RawClient(rb.port)
        c.handshake(broker.user, broker.password, broker.vhost)
        hang.hang()
        wait_probe_connecting(rb, hang.port)
        rb.signal(signal.SIGTERM)
        assert c.expect_connection_close(timeout=5)[0] == 320
        assert_clean_exit(rb)
        assert rb.log_lines("drain_timeout", sessions_left=1)
        c.close()
    finally:
        hang.close()


def test_sigusr1_and_sigusr2_are_logged_and_ignored(rebound_factory, broker):
    rb = rebound_factory(*PASS_THROUGH)
    conn = rb.pika(broker)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    sigs = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGUSR1, signal.SIGUSR2)
    for i, sig in enumerate(sigs):
        rb.signal(sig)
        rbtest.wait_until(lambda: len(rb.log_lines("signal_ignored")) == i + 1,
                          10, "signal_ignored line %d" % (i + 1))
        assert rb.log_lines("signal_ignored")[-1]["signal"] == str(int(sig))
    assert rb.alive()
    # the connection made before still works, and a new one can be made
    ch.basic_publish("", q, b"still here")
    assert ch.basic_get(q, auto_ack=True)[2] == b"still here"
    conn.close()
    other = rb.pika(broker)
    other.channel().queue_declare("", exclusive=True)
    other.close()


# ---- limits ------------------------------------------------------------------


def http_get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read().decode()
    c.close()
    return r.status, body


def metric(port, name):
    status, body = http_get(port, "/metrics")
    assert status == 200
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError("no metric %s in:\n%s" % (name, body))


def admin_rebound(factory, *args, **kw):
    port = rbtest.free_port()
    rb = factory("--admin", "127.0.0.1:%d" % port, *args, **kw)
    rb.admin_port = port
    rbtest.wait_until(lambda: _answers(port), 10, "the admin endpoint")
    return rb


def _answers(port):
    try:
        return http_get(port, "/healthz")[0] == 200
    except OSError:
        return False


def closed_without_a_byte(port, timeout=5):
    """Connect, send the protocol header, and return (bytes received before
    the socket was closed, seconds it took)."""
    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    got = b""
    try:
        try:
            s.sendall(a.PROTOCOL_HEADER)
        except (BrokenPipeError, ConnectionResetError):
            return got, time.monotonic() - t0
        while True:
            try:
                data = s.recv(4096)
            except ConnectionResetError:
                break
            if not data:
                break
            got += data
    finally:
        s.close()
    return got, time.monotonic() - t0


def warn_and_error_lines(rb):
    return [l for l in rb.log_lines() if l.get("level") in ("warn", "error")]


def test_max_connections_refuses_over_the_cap(rebound_factory, broker):
    """--max-connections 3: a fourth client is accepted and closed at once
    with no AMQP byte, counted in rebound_client_connections_refused_total,
    and a burst of refusals is one log line. Below the cap again, a client
    is served."""
    rb = admin_rebound(rebound_factory, *PASS_THROUGH, "--max-connections", "3",
                       "--log-level", "info")
    rb.wait_log("connection_limit", max_connections=3, auto="false")
    conns = [rb.pika(broker) for _ in range(3)]
    chans = [c.channel() for c in conns]
    for _ in range(40):
        got, took = closed_without_a_byte(rb.port)
        assert got == b"", "a refused client got %r" % got
        assert took < 2, "a refused client waited %.1fs" % took
    assert metric(rb.admin_port, "rebound_client_connections_refused_total") == 40
    assert metric(rb.admin_port, "rebound_client_connections") == 3
    lines = rb.log_lines("client_connections_refused")
    assert len(lines) == 1, lines
    assert lines[0]["max_connections"] == "3" and lines[0]["connections"] == "3"
    # the three connections are untouched
    for ch in chans:
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"x")
        assert ch.basic_get(q, auto_ack=True)[2] == b"x"
    # one goes: a new client is served
    conns.pop().close()
    rbtest.wait_until(
        lambda: metric(rb.admin_port, "rebound_client_connections") == 2, 10,
        "the closed connection to be gone")
    conns.append(rb.pika(broker))
    conns[-1].channel().queue_declare("", exclusive=True)
    for c in conns:
        c.close()
    assert metric(rb.admin_port, "rebound_client_connections_refused_total") == 40


def open_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def test_out_of_file_descriptors_is_counted_logged_and_survived(
        rebound_factory, broker):
    """rebound's descriptor limit lowered to 24 over what it holds, then 100
    clients at once: those that do not fit are closed at once and each is
    counted in rebound_accept_errors_total (none dropped uncounted), the
    warnings are a bounded few lines, a client connected before keeps
    working, and once the flood is gone new clients are served."""
    rb = admin_rebound(rebound_factory, *PASS_THROUGH, "--log-level", "info")
    before = rb.pika(broker)
    bch = before.channel()
    bq = bch.queue_declare("", exclusive=True).method.queue
    limit = open_fds(rb.pid) + 24
    resource.prlimit(rb.pid, resource.RLIMIT_NOFILE, (limit, limit))

    flood = []
    for _ in range(100):
        c = a.RawClient(rb.port, timeout=10)
        try:
            c.send(a.PROTOCOL_HEADER)
        except OSError:
            pass  # refused already
        flood.append(c)
    served = refused = 0
    for c in flood:
        try:
            c.recv_method(a.CONNECTION_START, timeout=10)
            served += 1
        except EOFError:
            refused += 1
    assert served + refused == 100
    assert refused > 50, "only %d of 100 refused with 24 descriptors" % refused
    assert served >= 5, "only %d of 100 served with 24 descriptors" % served
    assert rb.alive()
    # the connection made before the flood still works
    bch.basic_publish("", bq, b"during")
    assert bch.basic_get(bq, auto_ack=True)[2] == b"during"
    lines = rb.log_lines("accept_failed")
    assert 1 <= len(lines) <= 2, lines
    assert lines[0]["error"] == "too many open files"
    assert len(warn_and_error_lines(rb)) <= 4, warn_and_error_lines(rb)

    for c in flood:
        c.close()
    rbtest.wait_until(
        lambda: metric(rb.admin_port, "rebound_client_connections") == 1, 15,
        "the flood's sessions to be gone")
    # every refused client is counted
    errors = metric(rb.admin_port, "rebound_accept_errors_total")
    assert errors == refused, "%d accept errors counted for %d of 100 clients " \
        "refused (%d served)" % (errors, refused, served)
    after = [rb.pika(broker) for _ in range(5)]
    for c in after:
        c.channel().queue_declare("", exclusive=True)
        c.close()
    assert metric(rb.admin_port, "rebound_accept_errors_total") == refused
    before.close()


def start_with_fd_limit(tmp_path, broker, soft, hard, *args):
    log = tmp_path / ("rebound-fd-%d-%d.log" % (soft, hard))
    port = rbtest.free_port()

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        rbtest.die_with_test()

    proc = subprocess.Popen(
        [rbtest.BIN, "--listen", "127.0.0.1:%d" % port, "--admin", "off",
         "--upstream", broker.addr, *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"), preexec_fn=limit)
    rbtest.wait_until(lambda: b"msg=listening" in log.read_bytes()
                      or proc.poll() is not None, 20, "rebound to start")
    rbtest.wait_until(lambda: b"msg=connection_limit" in log.read_bytes()
                      or proc.poll() is not None, 5,
                      lambda: "a connection_limit line:\n" + log.read_text())
    return proc, log


def soft_nofile(pid):
    with open("/proc/%d/limits" % pid) as f:
        for line in f:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError("no open files limit in /proc/%d/limits" % pid)


def parsed(log, msg):
    out = []
    for line in log.read_text().splitlines():
        d = rbtest.logfmt_parse(line) if line.startswith("ts=") else {}
        if d.get("msg") == msg:
            out.append(d)
    return out


def stop(proc, log):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert not [m for m in rbtest.SANITIZER_MARKERS if m in text], text


def test_fd_limit_raised_at_start_and_the_cap_sized_from_it(tmp_path, broker):
    """Started with a soft limit of 200 under a hard one of 400, rebound
    raises the soft limit to 400; "auto" sizes the cap from it (three
    descriptors per client: its socket, its upstream, its retry connection;
    two with --retry-connection shared), and a configured cap that cannot
    fit is kept with a warning."""
    proc, log = start_with_fd_limit(tmp_path, broker, 200, 400)
    try:
        assert proc.poll() is None, log.read_text()
        assert soft_nofile(proc.pid) == 400
        assert parsed(log, "fd_limit_raised")[0]["to"] == "400"
        lim = parsed(log, "connection_limit")[0]
        assert lim["auto"] == "true" and lim["fd_limit"] == "400", lim
        assert 80 <= int(lim["max_connections"]) <= 127, lim
        assert not parsed(log, "max_connections_over_fd_limit")
    finally:
        stop(proc, log)

    proc, log = start_with_fd_limit(tmp_path, broker, 400, 400,
                                    "--retry-connection", "shared")
    try:
        lim = parsed(log, "connection_limit")[0]
        assert 120 <= int(lim["max_connections"]) <= 190, lim
    finally:
        stop(proc, log)

    proc, log = start_with_fd_limit(tmp_path, broker, 400, 400,
                                    "--max-connections", "1000")
    try:
        assert proc.poll() is None, log.read_text()
        lim = parsed(log, "connection_limit")[0]
        assert lim["max_connections"] == "1000" and lim["auto"] == "false"
        warn = parsed(log, "max_connections_over_fd_limit")
        assert len(warn) == 1 and 80 <= int(warn[0]["fits"]) <= 127, warn
    finally:
        stop(proc, log)


def test_an_admin_address_that_cannot_be_bound_stops_the_start(broker):
    """The admin port is taken: rebound exits 1 at once, saying which
    address and why (it does not run on without /metrics and /readyz);
    with --admin off it starts."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        base = [rbtest.BIN, "--listen", "127.0.0.1:%d" % rbtest.free_port(),
                "--upstream", broker.addr]
        run = subprocess.run(base + ["--admin", "127.0.0.1:%d" % port],
                             capture_output=True, text=True, timeout=30)
        assert run.returncode == 1, run
        line = [ln for ln in run.stdout.splitlines() + run.stderr.splitlines()
                if "msg=admin_listen_failed" in ln]
        assert line and "address=127.0.0.1:%d" % port in line[0] and \
            'error="address already in use"' in line[0], run
        p = subprocess.Popen(base + ["--admin", "off"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True,
                             preexec_fn=rbtest.die_with_test)
        try:
            rbtest.wait_until(lambda: "msg=listening" in p.stdout.readline(),
                              20, "rebound to listen with --admin off")
            assert p.poll() is None
        finally:
            p.terminate()
            p.wait(30)
    finally:
        taken.close()


# ---- the log file ------------------------------------------------------------


def test_log_file_is_reopened_on_sigusr1_by_every_worker(broker, tmp_path):
    """--log-file takes the log off standard error; after a rotation moved
    the file, SIGUSR1 makes every worker write to a new file at the path,
    and nothing is lost or written to the old one after that."""
    import pika
    log, rotated = tmp_path / "rebound.log", tmp_path / "rebound.log.1"
    port = rbtest.free_port()
    stderr = open(tmp_path / "stderr", "w+")
    proc = subprocess.Popen(
        [rbtest.BIN, "--listen", "127.0.0.1:%d" % port, "--admin", "off",
         "--upstream", broker.addr, "--workers", "2", "--log-file", str(log)],
        stderr=stderr, preexec_fn=rbtest.die_with_test)
    try:
        rbtest.wait_until(lambda: log.exists() and log.read_text().count(
            "msg=listening") >= 2, 20, "both workers listening")
        os.rename(log, rotated)
        proc.send_signal(signal.SIGUSR1)
        rbtest.wait_until(lambda: log.exists() and log.read_text().count(
            "msg=log_reopened") == 2, 10, "both workers reopen the log")
        assert "worker=0" in log.read_text() and "worker=1" in log.read_text()
        # sessions land on either worker: each logs to the new file only
        for _ in range(6):
            conn = pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", port, credentials=pika.PlainCredentials(
                    broker.user, broker.password)))
            conn.close()
        rbtest.wait_until(lambda: log.read_text().count("msg=session_close ")
                          == 6, 10, "6 sessions logged in the new file")
        assert "msg=session" not in rotated.read_text()
        proc.send_signal(signal.SIGUSR2)
        rbtest.wait_until(lambda: "msg=signal_ignored" in log.read_text(),
                          10, "SIGUSR2 logged as ignored")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert "msg=exit" in log.read_text()
    stderr.seek(0)
    assert stderr.read() == ""


def test_log_file_that_cannot_be_opened_stops_the_start(tmp_path):
    bad = str(tmp_path / "no" / "such" / "dir" / "rebound.log")
    p = subprocess.run([rbtest.BIN, "--listen", "127.0.0.1:%d" %
                        rbtest.free_port(), "--admin", "off", "--log-file",
                        bad], capture_output=True, text=True, timeout=20)
    assert p.returncode == 2
    assert bad in p.stderr and "No such file or directory" in p.stderr
    assert "expected a file rebound can create or append to" in p.stderr
