"""Many connections at once, and clients that die: rebound lets go of every
socket and the broker sees each client's connection go."""
import asyncio
import os
import selectors
import signal
import subprocess
import sys
import time
from collections import Counter

import amqp_raw
import rbtest

N_CONNECTIONS = 500


def _why(rebound, conns):
    """What a failed wait saw: rebound's sockets by state, its sessions,
    the clients whose connection has ended, and rebound's log lines above
    debug."""
    states = Counter(s[0] for s in rebound.sockets())
    fds = sum(1 for fd in os.listdir("/proc/%d/fd" % rebound.pid)
              if os.readlink("/proc/%d/fd/%s" % (rebound.pid, fd))
              .startswith("socket:"))
    ended = sum(1 for r, w in conns if r.at_eof() or w.is_closing())
    lines = [ln for ln in rebound.log().splitlines()
             if "level=debug" not in ln and "msg=session_open" not in ln]
    return ("socket states %s, %d socket descriptors; log: %d session_open, "
            "%d session_close; %d clients see their connection ended\n%s"
            % (dict(states), fds, len(rebound.log_lines("session_open")),
               len(rebound.log_lines("session_close")), ended,
               "\n".join(lines[-40:])))


def test_500_concurrent_connections(rebound, broker, ctl):
    async def run():
        opened = await asyncio.wait_for(asyncio.gather(*[
            amqp_raw.async_open(rebound.port, "rbt-many-%d" % i, broker.user,
                                broker.password, broker.vhost)
            for i in range(N_CONNECTIONS)]), timeout=60)
        return opened

    loop = asyncio.new_event_loop()
    try:
        t0 = time.monotonic()
        conns = loop.run_until_complete(run())
        opened_in = time.monotonic() - t0
        assert len(conns) == N_CONNECTIONS

        # all open at the same time, on both sides of rebound
        rbtest.wait_until(lambda: rebound.established() == 2 * N_CONNECTIONS, 20,
                          lambda: "%d established sockets in rebound (want %d)"
                          "\n%s" % (rebound.established(), 2 * N_CONNECTIONS,
                                    _why(rebound, conns)))
        ports = rbtest.upstream_ports(rebound)
        assert len(ports) == N_CONNECTIONS
        seen = ctl.connections()
        mine = {p: c for p, c in seen.items() if p in ports}
        assert len(mine) == N_CONNECTIONS, "broker sees %d of them" % len(mine)
        # no queue of theirs is intercepted: rebound opened neither a
        # channel nor a retry connection for any of them
        assert not rebound.log_lines("own_channel_ready")
        assert sum(c["channels"] for c in mine.values()) == 0
        assert len(rebound.log_lines("session_open")) == N_CONNECTIONS

        # half say goodbye properly, half just drop the socket
        async def close_all():
            return await asyncio.wait_for(asyncio.gather(*[
                amqp_raw.async_close(r, w, clean=(i % 2 == 0))
                for i, (r, w) in enumerate(conns)]), timeout=60)

        oks = loop.run_until_complete(close_all())
        assert sum(1 for ok in oks if ok is not None) == N_CONNECTIONS // 2
    finally:
        loop.close()

    rebound.wait_conn_sockets(0, timeout=30)
    rbtest.wait_until(lambda: not (set(ctl.connections()) & ports), 30,
                      "the broker to drop every upstream connection")
    closes = rebound.log_lines("session_close")
    assert len(closes) == N_CONNECTIONS
    reasons = {c["reason"] for c in closes}
    assert reasons <= {"client closed the connection", "client disconnected",
                       "client closed"}, reasons
    print("opened %d connections in %.2fs" % (N_CONNECTIONS, opened_in))


PUBLISHER = r"""
import os, sys, pika
conn = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = conn.channel()
ch.queue_declare(sys.argv[2], arguments={"x-expires": 120000})
body = os.urandom(1 << 20)
n = 0
while True:
    ch.basic_publish("", sys.argv[2], body)
    n += 1
    if n == 5:
        print("publishing", flush=True)
"""

CONSUMER = r"""
import sys, pika
conn = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = conn.channel()
ch.basic_qos(prefetch_count=10)
got = 0
for m, p, b in ch.consume(sys.argv[2]):
    got += 1
    if got == 10:
        print("holding 10", flush=True)
        conn.sleep(3600)
"""


def run_child(script, *args):
    return subprocess.Popen([sys.executable, "-c", script, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def wait_line(proc, want, timeout=20):
    deadline = time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while time.monotonic() < deadline:
        if sel.select(timeout=0.2):
            line = proc.stdout.readline()
            if line.strip() == want:
                return
            if not line:
                break
    proc.kill()
    raise AssertionError("child did not print %r: %s" % (want, proc.stderr.read()))


def test_publisher_killed_mid_stream(rebound, broker, ctl, qname):
    child = run_child(PUBLISHER, rebound.url(broker), qname)
    try:
        wait_line(child, "publishing")
        (port,) = rbtest.upstream_ports(rebound)
        assert port in ctl.connections()
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    rebound.wait_conn_sockets(0, timeout=10)
    close = rebound.wait_log("session_close")
    assert close["reason"] in ("client disconnected", "client closed"), close
    rbtest.wait_until(lambda: port not in ctl.connections(), 20,
                      "the broker to drop the killed client's connection")
    # the broker kept what it fully received; the queue is usable
    conn = rebound.pika(broker)
    ch = conn.channel()
    rbtest.wait_until(
        lambda: ch.queue_declare(qname, passive=True).method.message_count >= 5,
        10, "the 5 messages published before the kill")
    ch.queue_delete(qname)
    conn.close()


def test_consumer_killed_with_unacked_deliveries(rebound, broker, ctl, qname):
    conn = rebound.pika(broker)
    ch = conn.channel()
    ch.queue_declare(qname, arguments={"x-expires": 120000})
    for i in range(30):
        ch.basic_publish("", qname, b"m-%d" % i)
    conn.close()
    rebound.wait_conn_sockets(0)

    child = run_child(CONSUMER, rebound.url(broker), qname)
    try:
        wait_line(child, "holding 10")
        (port,) = rbtest.upstream_ports(rebound)
        assert ctl.queue(qname) == (20, 10, 1)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    rebound.wait_conn_sockets(0, timeout=10)
    # rebound closed the upstream connection: the broker requeued the 10
    rbtest.wait_until(lambda: ctl.queue(qname) == (30, 0, 0), 20,
                      lambda: "queue back to (30, 0, 0), is %r" % (ctl.queue(qname),))
    assert port not in ctl.connections()
    conn = rebound.pika(broker)
    conn.channel().queue_delete(qname)
    conn.close()
