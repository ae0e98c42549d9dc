"""Helpers for rebound's integration tests: start/stop the real rebound
binary, look at its sockets and logs, ask the real broker (rabbitmqctl) what
it sees.

Environment (set by scripts/test.sh / tests/integration/CMakeLists.txt):
  REBOUND_BIN               the rebound binary under test
  REBOUND_TEST_BROKER       amqp://guest:guest@127.0.0.1:PORT/
  REBOUND_TEST_BROKER_DIR   the broker's state dir (holds a rabbitmqctl wrapper)
"""
import itertools
import os
import re
import resource
import shlex
import signal
import socket
import subprocess
import time
import uuid
from urllib.parse import unquote, urlparse

BIN = os.environ.get("REBOUND_BIN")
if BIN:
    BIN = os.path.abspath(BIN)
BROKER_URL = os.environ.get("REBOUND_TEST_BROKER")
BROKER_DIR = os.environ.get("REBOUND_TEST_BROKER_DIR")
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

SANITIZER_MARKERS = ("AddressSanitizer", "LeakSanitizer", "runtime error",
                     "UndefinedBehaviorSanitizer")

TCP_ESTABLISHED = "01"
TCP_LISTEN = "0A"

_counter = itertools.count(1)


def uniq(prefix="q"):
    """A queue/exchange name no other test (or test run) uses."""
    return "rbt-%s-%d-%d-%s" % (prefix, os.getpid(), next(_counter),
                                uuid.uuid4().hex[:8])


def wait_until(pred, timeout, what, interval=0.05):
    """Poll `pred` until it returns a truthy value; fail with `what` (a
    string or a callable giving one) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            msg = what() if callable(what) else what
            raise AssertionError("timed out after %.1fs waiting for %s"
                                 % (timeout, msg))
        time.sleep(interval)


_PORTS_GIVEN = set()


def free_port(host="127.0.0.1"):
    """A port free now, never one this process was given before: the kernel
    hands a just-closed port out again, and a test often asks for two (the
    listener and the admin) before rebound binds either."""
    while True:
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        s.bind((host, 0))
        port = s.getsockname()[1]
        s.close()
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


def pid_alive(pid):
    """pid runs (a zombie has exited)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


_PR_SET_PDEATHSIG = 1


def die_with_test():
    """preexec_fn of a server a test starts: it is killed when the test's
    process ends, however it ends (a ctest timeout kills the test with no
    time for its clean-up), so no server outlives its test."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def server_preexec():
    raise_nofile()
    die_with_test()


# ---- logfmt ---------------------------------------------------------------

_LOGFMT_TOKEN = re.compile(r'\s*([^\s=]+)=("(?:[^"\\]|\\.)*"|[^\s"]*)(?=\s|$)')


def logfmt_parse(line):
    """Parse one logfmt line strictly: every token must be key=value, values
    with spaces must be quoted. Returns a dict, or raises ValueError naming
    what is not logfmt."""
    out = {}
    pos = 0
    line = line.rstrip("\n")
    while pos < len(line):
        if line[pos:].strip() == "":
            break
        m = _LOGFMT_TOKEN.match(line, pos)
        if not m:
            raise ValueError("not logfmt at column %d: %r" % (pos, line[pos:pos + 40]))
        k, v = m.group(1), m.group(2)
        if v.startswith('"'):
            v = re.sub(r'\\(.)', r'\1', v[1:-1])
        out[k] = v
        pos = m.end()
    return out


# ---- the broker -------------------------------------------------------------


class Broker:
    """The test broker: its URL pieces and rabbitmqctl."""

    def __init__(self, url, state_dir):
        u = urlparse(url)
        self.url = url
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 5672
        self.user = unquote(u.username or "guest")
        self.password = unquote(u.password or "guest")
        vhost = u.path[1:] if u.path.startswith("/") else u.path
        self.vhost = unquote(vhost) if vhost else "/"
        self.dir = state_dir
        self.ctl_path = os.path.join(state_dir, "rabbitmqctl") if state_dir else None

    @property
    def addr(self):
        return "%s:%d" % (self.host, self.port)

    def env(self):
        """The variables scripts/broker.sh wrote for this node (its TLS and
        metrics ports among them); {} for a broker it did not start."""
        return broker_env(self.dir)

    def ctl(self, *args, timeout=60):
        if not self.ctl_path or not os.path.exists(self.ctl_path):
            raise AssertionError("no rabbitmqctl wrapper (REBOUND_TEST_BROKER_DIR)")
        p = subprocess.run([self.ctl_path, *args], capture_output=True,
                           text=True, timeout=timeout)
        if p.returncode != 0:
            raise AssertionError("rabbitmqctl %s failed (%d): %s %s" % (
                " ".join(args), p.returncode, p.stdout, p.stderr))
        return p.stdout

    def _rows(self, *args):
        """Rows of a rabbitmqctl listing of the columns in args[1:]. Tests
        run side by side on one broker, and some use names with tabs,
        newlines or control bytes: a row that does not split into exactly
        those columns is someone else's and is left out."""
        out = self.ctl(*args, "-q", "--no-table-headers")
        rows = [line.split("\t") for line in out.splitlines() if line.strip()]
        return [r for r in rows if len(r) == len(args) - 1]

    def connections(self):
        """{peer_port: {"channels": n, "recv_oct": n, "send_oct": n,
        "pid": pid, "user": user}} for every connection the broker has."""
        rows = self._rows("list_connections", "peer_port", "channels",
                          "recv_oct", "send_oct", "pid", "user")
        out = {}
        for r in rows:
            out[int(r[0])] = {"channels": int(r[1]), "recv_oct": int(r[2]),
                              "send_oct": int(r[3]), "pid": r[4], "user": r[5]}
        return out

    def channels_by_port(self):
        """{peer_port: {channel_number: confirm_mode}} per connection."""
        conns = self.connections()
        pid2port = {c["pid"]: port for port, c in conns.items()}
        out = {}
        for conn_pid, number, confirm in self._rows(
                "list_channels", "connection", "number", "confirm"):
            port = pid2port.get(conn_pid)
            if port is None:
                continue
            out.setdefault(port, {})[int(number)] = confirm == "true"
        return out

    def queue(self, name):
        """(messages_ready, messages_unacknowledged, consumers) or None."""
        for r in self._rows("list_queues", "name", "messages_ready",
                            "messages_unacknowledged", "consumers"):
            if r[0] == name:
                return int(r[1]), int(r[2]), int(r[3])
        return None

    def queue_type(self, name):
        """"classic" or "quorum" (None: no such queue)."""
        for r in self._rows("list_queues", "name", "type"):
            if r[0] == name:
                return r[1]
        return None

    def queue_names(self):
        return {r[0] for r in self._rows("list_queues", "name")}


def broker_env(state_dir):
    """The variables scripts/broker.sh wrote into DIR/env ({} if none)."""
    env = {}
    path = os.path.join(state_dir or "", "env")
    if os.path.exists(path):
        for line in open(path):
            if line.startswith("export ") and "=" in line:
                k, v = line[7:].strip().split("=", 1)
                env[k] = v
    return env


def broker_from_env():
    return Broker(BROKER_URL, BROKER_DIR)


BROKER_SH = os.path.join(REPO, "scripts", "broker.sh")


def broker_sh(cmd, state_dir, timeout=180):
    """scripts/broker.sh CMD DIR; a node it starts belongs to this process
    (REBOUND_BROKER_OWNER) and is stopped once it is gone."""
    env = dict(os.environ, REBOUND_BROKER_OWNER=str(os.getpid()))
    p = subprocess.run([BROKER_SH, cmd, state_dir], capture_output=True,
                       text=True, timeout=timeout, env=env)
    assert p.returncode == 0, "broker.sh %s failed: %s%s" % (cmd, p.stdout,
                                                            p.stderr)
    return p.stdout


def private_broker(prefix):
    """A RabbitMQ node of the test's own (scripts/broker.sh in a fresh
    directory), never the shared test broker: yields its Broker, stops it
    after."""
    import shutil
    import tempfile
    state_dir = tempfile.mkdtemp(prefix=prefix)
    try:
        out = broker_sh("start", state_dir)
        url = [l for l in out.splitlines()
               if l.startswith("REBOUND_TEST_BROKER=")][-1]
        b = Broker(url.split("=", 1)[1], state_dir)
        # broker.sh reports the port it was asked about; make sure the node
        # in *our* directory is the one answering there
        assert os.path.exists(os.path.join(state_dir, "rabbitmq.pid")), \
            "the private broker did not start (pid file missing)"
        yield b
    finally:
        subprocess.run([BROKER_SH, "stop", state_dir], capture_output=True,
                       timeout=120)
        shutil.rmtree(state_dir, ignore_errors=True)


# ---- rebound ---------------------------------------------------------------


def _proc_tcp_table(pid):
    """{inode: (state, (lip, lport), (rip, rport))} of the process's netns."""
    table = {}
    for name in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, name)) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            table[fields[9]] = (fields[3], _addr(fields[1]), _addr(fields[2]))
    return table


def _addr(hexaddr):
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        ipstr = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:
        words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
        ipstr = socket.inet_ntop(socket.AF_INET6, words)
        if ipstr.startswith("::ffff:"):
            ipstr = ipstr[7:]
    return ipstr, int(port, 16)


class Rebound:
    """One rebound process started for a test."""

    def __init__(self, log_dir, upstream, args=(), listen_host="127.0.0.1",
                 env=None, name="rebound", wrapper=()):
        self.upstream = upstream
        self.args = list(args)
        self.listen_host = listen_host
        self.log_path = None
        self.proc = None
        self.port = None
        self.returncode = None
        self.stopped_at = None
        last_err = None
        for attempt in range(5):  # a free port can be taken before we bind
            self.port = free_port(listen_host)
            self.log_path = os.path.join(log_dir, "%s-%d.log" % (name, self.port))
            self._logf = open(self.log_path, "wb")
            # no admin endpoint unless a test asks for one (--admin later
            # in args wins): parallel instances would share its port
            # wrapper: a command that execs the rest (the pid stays rebound's)
            cmd = [*wrapper, BIN, "--listen", self.addr, "--admin", "off",
                   "--upstream", upstream, "--log-level", "debug", *self.args]
            self.cmd = cmd
            penv = dict(os.environ)
            penv.setdefault("ASAN_OPTIONS", "detect_leaks=1")
            penv.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
            if env:
                penv.update(env)
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                         stdout=self._logf, stderr=self._logf,
                                         env=penv, preexec_fn=server_preexec)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if "msg=listening" in self.log():
                    return
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
            last_err = self.log()
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("rebound did not log msg=listening in 20s:\n"
                                     + last_err)
            self._logf.close()
            if "address already in use" not in last_err:
                break
        raise AssertionError("rebound failed to start (%s):\n%s"
                             % (shlex.join(self.cmd), last_err))

    # -- identity
    @property
    def pid(self):
        return self.proc.pid

    @property
    def addr(self):
        fmt = "[%s]:%d" if ":" in self.listen_host else "%s:%d"
        return fmt % (self.listen_host, self.port)

    def alive(self):
        return self.proc.poll() is None

    # -- log
    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def log_lines(self, msg=None, **fields):
        """Parsed (logfmt) lines, optionally only msg=`msg` whose fields
        equal `fields` (values compared as strings). Lines that do not parse
        are skipped here (see logfmt_parse for the strict check)."""
        out = []
        for line in self.log().splitlines():
            if not line.startswith("ts="):
                continue
            try:
                d = logfmt_parse(line)
            except ValueError:
                d = {}
                for tok in line.split():
                    if "=" in tok:
                        k, v = tok.split("=", 1)
                        d[k] = v.strip('"')
            if msg is not None and d.get("msg") != msg:
                continue
            if all(d.get(k) == str(v) for k, v in fields.items()):
                out.append(d)
        return out

    def wait_log(self, msg, timeout=10, **fields):
        return wait_until(lambda: self.log_lines(msg, **fields), timeout,
                          lambda: "log line msg=%s %r; log tail:\n%s"
                          % (msg, fields, self.log()[-3000:]))[0]

    def sanitizer_report(self):
        text = self.log()
        return [m for m in SANITIZER_MARKERS if m in text]

    # -- sockets
    def sockets(self):
        """rebound's TCP sockets: [(state, (lip, lport), (rip, rport))]."""
        if not self.alive():
            return []
        table = _proc_tcp_table(self.pid)
        out = []
        try:
            fds = os.listdir("/proc/%d/fd" % self.pid)
        except OSError:
            return []
        for fd in fds:
            try:
                link = os.readlink("/proc/%d/fd/%s" % (self.pid, fd))
            except OSError:
                continue
            m = re.match(r"socket:\[(\d+)\]$", link)
            if m and m.group(1) in table:
                out.append(table[m.group(1)])
        return out

    def conn_sockets(self):
        """rebound's TCP sockets other than its listener."""
        return [s for s in self.sockets() if s[0] != TCP_LISTEN]

    def established(self):
        return sum(1 for s in self.sockets() if s[0] == TCP_ESTABLISHED)

    def client_sockets(self):
        return [s for s in self.conn_sockets() if s[1][1] == self.port]

    def upstream_sockets(self):
        return [s for s in self.conn_sockets() if s[1][1] != self.port]

    def wait_conn_sockets(self, n, timeout=15):
        return wait_until(lambda: len(self.conn_sockets()) == n, timeout,
                          lambda: "rebound to hold %d connection sockets "
                          "(has %r)" % (n, self.conn_sockets()))

    # -- memory
    def rss_kib(self):
        with open("/proc/%d/status" % self.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def io_read_bytes(self):
        """Bytes rebound has read with read()-family calls, sockets
        included (/proc/PID/io rchar)."""
        with open("/proc/%d/io" % self.pid) as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
        return 0

    # -- stop
    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout):
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self.stopped_at = time.monotonic()
        self._logf.close()
        return self.returncode

    def stop(self, timeout=30):
        """SIGTERM and wait; returns the exit status (None: it had to be
        killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if self.wait_exit(timeout) is None:
                self.proc.kill()
                self.proc.wait()
                self._logf.close()
                return None
        else:
            self.wait_exit(1)
        return self.proc.returncode

    # -- clients
    def pika_params(self, broker, **kw):
        import pika
        kw.setdefault("connection_attempts", 1)
        kw.setdefault("socket_timeout", 10)
        kw.setdefault("blocked_connection_timeout", 30)
        return pika.ConnectionParameters(
            host=self.listen_host, port=self.port, virtual_host=broker.vhost,
            credentials=pika.PlainCredentials(broker.user, broker.password),
            **kw)

    def pika(self, broker, **kw):
        import pika
        return pika.BlockingConnection(self.pika_params(broker, **kw))

    def url(self, broker, vhost=True):
        return "amqp://%s:%s@%s/%s" % (
            broker.user, broker.password, self.addr,
            "%2F" if broker.vhost == "/" else broker.vhost)


def upstream_ports(rb):
    """Local ports of rebound's connections to a broker."""
    return {s[1][1] for s in rb.upstream_sockets()}
