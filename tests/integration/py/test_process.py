"""The process at its edges: SIGTERM while the readiness probe is still
connecting, SIGUSR1/SIGUSR2.

A connect that hangs is made on loopback only: a listening socket with
backlog 0 whose accept queue is full and never accepted, so the kernel drops
further SYNs and the connect stays in SYN-SENT."""
import select
import signal
import socket
import threading

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
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGUSR1, signal.SIGUSR2):
        rb.signal(sig)
        rb.wait_log("signal_ignored", signal=int(sig))
    assert rb.alive()
    # the connection made before still works, and a new one can be made
    ch.basic_publish("", q, b"still here")
    assert ch.basic_get(q, auto_ack=True)[2] == b"still here"
    conn.close()
    other = rb.pika(broker)
    other.channel().queue_declare("", exclusive=True)
    other.close()
