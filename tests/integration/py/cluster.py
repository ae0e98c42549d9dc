"""A three-node RabbitMQ cluster on loopback for integration tests.

Three private nodes started with scripts/broker.sh, each in its own
directory (its own node name rebound-test-<port>@localhost, ports, data and
logs), sharing one Erlang cookie: broker.sh keeps DIR/cookie when it
exists, so the same cookie is written into the three directories before
the first start. Nodes 2 and 3 then join node 1 (rabbitmqctl stop_app,
join_cluster, start_app, through each directory's rabbitmqctl wrapper).

Nodes are numbered 1, 2, 3 (node 1 is the one the others join, and the
first upstream a test gives rebound). stop(i) and start_node(i) stop and
start one node keeping its data (kill(i) ends it with SIGKILL instead):
broker.sh starts it again on the same AMQP port, so under the same node
name, and it rejoins the cluster by itself. leader(queue) says which node
hosts a queue's leader; queues() and queue_info() ask whichever node runs.

The `cluster` fixture (module scope) starts the cluster once for all the
tests of a module that imports it, and removes it afterwards.
"""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import defaultdict

import pika
import pika.exceptions
import pytest

import rbtest
from test_broker_restart import BROKER_SH, broker_sh

DLX_CONFIRM_TIMEOUT_MS = 10000

# A node that broker.sh stopped may still be seen as running by the others
# for a moment; a restarted one must be seen by all of them.
MEMBERSHIP_TIMEOUT = 60


class Node:
    """One node of the cluster: its directory, name and broker handle."""

    def __init__(self, index, state_dir):
        self.index = index
        self.dir = state_dir
        self.name = None     # rebound-test-<port>@localhost
        self.broker = None   # rbtest.Broker (url, addr, ctl)
        self.running = False

    @property
    def addr(self):
        return self.broker.addr

    @property
    def url(self):
        return self.broker.url

    @property
    def port(self):
        return self.broker.port

    def ctl(self, *args, timeout=60):
        return self.broker.ctl(*args, timeout=timeout)

    def log_text(self):
        """Everything the node wrote into its log directory."""
        out = []
        logdir = os.path.join(self.dir, "log")
        names = os.listdir(logdir) if os.path.isdir(logdir) else []
        for name in sorted(names):
            path = os.path.join(logdir, name)
            if name.endswith(".log") and os.path.isfile(path):
                with open(path, "rb") as f:
                    out.append(f.read().decode("utf-8", "replace"))
        return "\n".join(out)

    def _started(self, out):
        url = [l for l in out.splitlines()
               if l.startswith("REBOUND_TEST_BROKER=")][-1].split("=", 1)[1]
        env = rbtest.broker_env(self.dir)
        name = env["RABBITMQ_NODENAME"]
        if self.name is not None:
            # a new port would be a new node name: a stranger to the cluster
            # with none of the data
            assert name == self.name and url == self.broker.url, \
                "node %d came back as %s (%s), was %s (%s)" % (
                    self.index, name, url, self.name, self.broker.url)
        assert os.path.exists(os.path.join(self.dir, "rabbitmq.pid")), \
            "node %d did not start (no pid file in %s)" % (self.index,
                                                           self.dir)
        self.name = name
        self.broker = rbtest.Broker(url, self.dir)
        self.running = True

    def __repr__(self):
        return "<node %d %s %s>" % (self.index, self.name,
                                    "up" if self.running else "down")


class Cluster:
    """Three RabbitMQ nodes on loopback forming one cluster."""

    def __init__(self, base=None, size=3):
        self.base = base or tempfile.mkdtemp(prefix="rb-cluster-")
        self.nodes = [Node(i + 1, os.path.join(self.base, "n%d" % (i + 1)))
                      for i in range(size)]
        self.timings = {}

    # -- addressing (1-based)
    def node(self, i):
        return self.nodes[i - 1]

    @property
    def addrs(self):
        return [n.addr for n in self.nodes]

    @property
    def urls(self):
        return [n.url for n in self.nodes]

    @property
    def upstream(self):
        """rebound's --upstream for the whole cluster, node 1 first."""
        return ",".join(self.addrs)

    def index_of(self, node_name):
        for n in self.nodes:
            if n.name == node_name:
                return n.index
        return None

    # -- life cycle
    def start(self):
        """Start the three nodes and cluster them; returns self."""
        t0 = time.monotonic()
        cookie = os.urandom(24).hex().upper()
        for n in self.nodes:
            os.makedirs(n.dir, exist_ok=True)
            path = os.path.join(n.dir, "cookie")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(cookie + "\n")
            # A quorum tier's at-least-once dead-lettering waits this long
            # for the source's confirm before it sends a message again
            # (180 s by default): when the source's leader goes while a
            # message is on its way, that is how long it takes to come.
            # The README tells operators; the test must not wait 3 min.
            with open(os.path.join(n.dir, "advanced.config"), "w") as f:
                f.write("[{rabbit, [{dead_letter_worker_publisher_confirm_"
                        "timeout, %d}]}].\n" % DLX_CONFIRM_TIMEOUT_MS)
        for n in self.nodes:
            n._started(broker_sh("start", n.dir))
        self.timings["nodes_started_s"] = time.monotonic() - t0
        first = self.nodes[0]
        for n in self.nodes[1:]:
            n.ctl("stop_app")
            n.ctl("join_cluster", first.name)
            n.ctl("start_app")
        self.wait_members(timeout=MEMBERSHIP_TIMEOUT)
        self.timings["cluster_formed_s"] = time.monotonic() - t0
        for n in self.nodes:
            got = n.ctl("eval", "application:get_env(rabbit, "
                        "dead_letter_worker_publisher_confirm_timeout).")
            assert str(DLX_CONFIRM_TIMEOUT_MS) in got, (n.name, got)
        return self

    def stop(self, i):
        """Stop node i gracefully (rabbitmqctl stop), keeping its data, and
        wait until the other nodes see it gone."""
        n = self.node(i)
        t0 = time.monotonic()
        broker_sh("stop", n.dir)
        n.running = False
        self.wait_members(timeout=MEMBERSHIP_TIMEOUT)
        self.timings.setdefault("stop_s", []).append(time.monotonic() - t0)

    def start_node(self, i):
        """Start node i again (same directory: same port, name and data) and
        wait until every running node counts it in."""
        n = self.node(i)
        t0 = time.monotonic()
        n._started(broker_sh("start", n.dir))
        self.wait_members(timeout=MEMBERSHIP_TIMEOUT)
        self.timings.setdefault("start_s", []).append(time.monotonic() - t0)

    def kill(self, i):
        """SIGKILL node i's Erlang VM (no goodbye to the cluster); start_node
        brings it back."""
        n = self.node(i)
        with open(os.path.join(n.dir, "rabbitmq.pid")) as f:
            os.kill(int(f.read().strip()), signal.SIGKILL)
        n.running = False
        broker_sh("stop", n.dir)  # reaps the launcher and the pid files
        self.wait_members(timeout=MEMBERSHIP_TIMEOUT)

    def teardown(self):
        """Stop every node (in parallel) and remove their directories."""
        procs = [subprocess.Popen([BROKER_SH, "stop", n.dir],
                                  stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
                 for n in self.nodes
                 if os.path.exists(os.path.join(n.dir, "env"))]
        for p in procs:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
        for n in self.nodes:
            n.running = False
        shutil.rmtree(self.base, ignore_errors=True)

    # -- asking the cluster
    def any_running(self):
        for n in self.nodes:
            if n.running:
                return n
        raise AssertionError("no node of the cluster is running")

    def ctl(self, *args, timeout=60):
        """rabbitmqctl on the first running node."""
        return self.any_running().ctl(*args, timeout=timeout)

    def status(self, i=None):
        """cluster_status of node i (default: the first running node) as a
        dict (running_nodes, disk_nodes, partitions, ...)."""
        n = self.node(i) if i else self.any_running()
        return json.loads(n.ctl("cluster_status", "--formatter", "json"))

    def running_names(self, i=None):
        return sorted(self.status(i)["running_nodes"])

    def wait_members(self, timeout=MEMBERSHIP_TIMEOUT):
        """Wait until every running node sees exactly the running nodes as
        running, all of them as disc members, and no partition."""
        want_running = sorted(n.name for n in self.nodes if n.running)
        want_disk = sorted(n.name for n in self.nodes)
        seen = {}

        def ok():
            seen.clear()
            for n in self.nodes:
                if not n.running:
                    continue
                try:
                    st = self.status(n.index)
                except AssertionError as e:
                    seen[n.index] = str(e)[:200]
                    return False
                seen[n.index] = (sorted(st["running_nodes"]),
                                 sorted(st["disk_nodes"]), st["partitions"])
                if seen[n.index] != (want_running, want_disk, {}) and \
                        seen[n.index] != (want_running, want_disk, []):
                    return False
            return True

        rbtest.wait_until(ok, timeout, lambda: "cluster members running %r "
                          "(disc %r); nodes say %r" % (want_running, want_disk,
                                                       seen), interval=0.5)

    def queue_rows(self, *columns):
        """list_queues name + columns from a running node: [[name, ...]]."""
        return self.any_running().broker._rows("list_queues", "name", *columns)

    def queues(self):
        """{name: (ready, unacked, consumers)} of every queue."""
        out = {}
        for r in self.queue_rows("messages_ready", "messages_unacknowledged",
                                 "consumers"):
            try:
                out[r[0]] = (int(r[1]), int(r[2]), int(r[3]))
            except ValueError:  # not a row of ours (hostile names)
                continue
        return out

    def queue_info(self, name):
        """(type, leader node name or "", [online member names]) of a queue;
        None when there is none. A classic queue's "leader" is its home
        node (the node in its pid), also while that node is down."""
        for r in self.queue_rows("type", "leader", "pid", "online"):
            if r[0] != name:
                continue
            qtype, leader, pid, online = r[1], r[2], r[3], r[4]
            if not leader and pid.startswith("<") and "@" in pid:
                # <rebound-test-P@localhost.N.N.N>: short node names have
                # no dots
                leader = pid[1:].split(".", 1)[0]
            members = [m.strip() for m in online.strip("[]").split(",")
                       if m.strip()]
            return qtype, leader, members
        return None

    def leader(self, name):
        """Index (1..3) of the node hosting queue `name`'s leader (quorum)
        or process (classic); None when it has none right now."""
        info = self.queue_info(name)
        return self.index_of(info[1]) if info and info[1] else None

    def wait_leader(self, name, timeout=30):
        return rbtest.wait_until(lambda: self.leader(name), timeout,
                                 "a leader for queue %s" % name, interval=0.3)


@pytest.fixture(scope="module")
def cluster():
    """A three-node cluster for the tests of one module."""
    if not os.access(BROKER_SH, os.X_OK):
        pytest.skip("needs scripts/broker.sh")
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.teardown()


class Publisher(threading.Thread):
    """Publishes n messages round `queues` straight to a node that stays
    up (`url`), persistent, mandatory, with publisher confirms: the first
    `burst` at once, then `rate` a second. Message i has message_id "i",
    body "i:kind" and header kind = kind_of(i). What the broker does not
    confirm is sent again on a new connection, counted in resent[mid]."""

    def __init__(self, url, queues, n, rate, kind_of, burst=0):
        super().__init__(name="publisher", daemon=True)
        self.url, self.queues = url, queues
        self.n, self.rate, self.kind_of, self.burst = n, rate, kind_of, burst
        self.sent = {}  # mid -> kind
        self.resent = defaultdict(int)
        self.errors = []
        self.done = threading.Event()
        self.started = None

    def run(self):
        conn = ch = None
        self.started = t0 = time.monotonic()
        i = 0
        while i < self.n:
            wait = t0 + (i - self.burst) / self.rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            mid, kind = str(i), self.kind_of(i)
            try:
                if ch is None:
                    conn = pika.BlockingConnection(pika.URLParameters(
                        self.url + "?socket_timeout=10&heartbeat=10"))
                    ch = conn.channel()
                    ch.confirm_delivery()
                ch.basic_publish(
                    "", self.queues[i % len(self.queues)],
                    ("%s:%s" % (mid, kind)).encode(),
                    pika.BasicProperties(message_id=mid, delivery_mode=2,
                                         headers={"kind": kind}),
                    mandatory=True)
            except pika.exceptions.AMQPError as e:
                self.errors.append(repr(e)[:200])
                self.resent[mid] += 1
                ch = None
                try:
                    conn.close()
                except Exception:
                    pass
                time.sleep(0.5)
                continue
            self.sent[mid] = kind
            i += 1
        conn.close()
        self.done.set()
