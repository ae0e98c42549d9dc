"""SIGTERM/SIGINT: stop accepting, connection.close 320 to every client,
wait for them (up to --drain-timeout), exit 0."""
import signal
import socket
import time

import pytest
from pika.exceptions import AMQPConnectionError, ConnectionClosedByBroker

import amqp_raw as a
import rbtest


def pump_until_closed(conn, deadline):
    while time.monotonic() < deadline:
        try:
            conn.process_data_events(time_limit=0.1)
        except AMQPConnectionError as e:
            return e
    return None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT],
                         ids=["SIGTERM", "SIGINT"])
def test_drain_three_pika_clients(rebound_factory, broker, ctl, sig):
    rb = rebound_factory("--drain-timeout", "5s")
    conns = [rb.pika(broker) for _ in range(3)]
    for c in conns:
        ch = c.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"x")
        assert ch.basic_get(q, auto_ack=True)[2] == b"x"
    ports = rbtest.upstream_ports(rb)
    assert len(ports) == 3

    t0 = time.monotonic()
    rb.signal(sig)
    errors = [pump_until_closed(c, t0 + 10) for c in conns]
    for e in errors:
        assert isinstance(e, ConnectionClosedByBroker), repr(e)
        assert e.reply_code == 320
        assert "rebound shutting down" in e.reply_text
    rc = rb.wait_exit(timeout=10)
    took = time.monotonic() - t0
    assert rc == 0, "exit status %r" % rc
    assert took < 5, "took %.1fs with every client answering at once" % took
    assert rb.log_lines("shutdown", signal=int(sig))
    assert rb.log_lines("exit")
    assert not rb.log_lines("drain_timeout")
    # rebound closed its upstream connections properly
    rbtest.wait_until(lambda: not (set(ctl.connections()) & ports), 20,
                      "the broker to see the 3 upstream connections go")


def test_drain_timeout_with_a_client_that_never_answers(rebound_factory, broker):
    rb = rebound_factory("--drain-timeout", "1s")
    c = a.RawClient(rb.port)
    c.handshake(broker.user, broker.password, broker.vhost)
    t0 = time.monotonic()
    rb.signal(signal.SIGTERM)
    code, text, _, _ = c.expect_connection_close(timeout=5)
    assert code == 320 and "rebound shutting down" in text
    # new connections are refused once shutdown began
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", rb.port), timeout=2).close()
    # the client never sends close-ok: rebound still exits, in time
    rc = rb.wait_exit(timeout=10)
    took = time.monotonic() - t0
    assert rc == 0
    assert took < 1 + 1.5, "exited %.1fs after SIGTERM, drain timeout 1s" % took
    assert rb.log_lines("drain_timeout", sessions_left=1)
    assert c.wait_eof(timeout=2) >= 0
    c.close()


def test_second_signal_during_drain_is_harmless(rebound_factory, broker):
    rb = rebound_factory("--drain-timeout", "3s")
    c = a.RawClient(rb.port)
    c.handshake(broker.user, broker.password, broker.vhost)
    rb.signal(signal.SIGTERM)
    assert c.expect_connection_close(timeout=5)[0] == 320
    rb.signal(signal.SIGTERM)
    rb.signal(signal.SIGINT)
    c.send(a.connection_close_ok())
    c.wait_eof(timeout=5)
    c.close()
    assert rb.wait_exit(timeout=10) == 0


def test_other_signals_during_drain_are_logged_and_harmless(rebound_factory,
                                                            broker):
    """While draining, SIGHUP (no reload any more) and SIGUSR1/SIGUSR2 are
    logged as ignored; the drain finishes and rebound exits 0."""
    rb = rebound_factory("--drain-timeout", "5s")
    c = a.RawClient(rb.port)
    c.handshake(broker.user, broker.password, broker.vhost)
    rb.signal(signal.SIGTERM)
    assert c.expect_connection_close(timeout=5)[0] == 320
    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        rb.signal(sig)
        rb.wait_log("signal_ignored", signal=int(sig))
    assert rb.log_lines("signal_ignored", signal=int(signal.SIGHUP),
                        reason="already draining")
    assert not rb.log_lines("config_reloaded")
    c.send(a.connection_close_ok())
    c.wait_eof(timeout=5)
    c.close()
    assert rb.wait_exit(timeout=10) == 0
    assert not rb.sanitizer_report()


def accepts(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


def test_drain_client_wait_lets_clients_close_first(rebound_factory, broker):
    """--drain-client-wait: on SIGTERM the listener closes and /readyz
    fails, but connected clients are not told to go; one that closes its
    own connection (its work done, as an application stopping before its
    sidecar) never sees a connection.close from rebound, and rebound exits
    as soon as the last one has left."""
    rb = rebound_factory("--drain-client-wait", "60s", "--drain-timeout",
                         "60s")
    clients = [a.RawClient(rb.port) for _ in range(2)]
    for c in clients:
        c.handshake(broker.user, broker.password, broker.vhost)
        c.open_channel(1)
    rb.signal(signal.SIGTERM)
    rb.wait_log("shutdown", client_wait_ms=60000)
    rbtest.wait_until(lambda: not accepts(rb.port), 10, "the listener to close")
    for c in clients:
        # the connection still works, and nothing from rebound is waiting
        c.open_channel(2)
        c.send(a.connection_close())
        f = c.recv_method()
        assert f.method == a.CONNECTION_CLOSE_OK, f
        c.close()  # the client closes the socket after close-ok
    assert rb.wait_exit(timeout=20) == 0
    assert rb.log_lines("drain_client_wait_over", reason="no clients left",
                        sessions_left=0)
    closes = rb.log_lines("session_close")
    assert len(closes) == 2
    assert all(x["reason"] == "client closed the connection" for x in closes)


def test_drain_client_wait_then_the_rest_are_told(rebound_factory, broker):
    """Clients still connected when --drain-client-wait is over get
    connection.close 320, and the drain timeout runs from then."""
    rb = rebound_factory("--drain-client-wait", "1s", "--drain-timeout",
                         "30s")
    c = a.RawClient(rb.port)
    c.handshake(broker.user, broker.password, broker.vhost)
    rb.signal(signal.SIGTERM)
    code, text = c.expect_connection_close(timeout=20)[:2]
    assert code == 320 and "rebound shutting down" in text
    # the 320 comes after the wait, not with the signal
    assert rb.log_lines("drain_client_wait_over", sessions_left=1)
    c.send(a.connection_close_ok())
    c.wait_eof(timeout=10)
    c.close()
    assert rb.wait_exit(timeout=20) == 0
    assert not rb.log_lines("drain_timeout")


def test_drain_client_wait_with_workers_kills_no_worker(rebound_factory,
                                                       broker):
    """With --workers, every worker waits for its clients, and worker 0
    waits while the others do even when it has no client of its own: no
    worker is killed at worker 0's drain timeout in the middle of its
    wait."""
    rb = rebound_factory("--workers", "2", "--drain-client-wait", "60s",
                         "--drain-timeout", "1s")
    rbtest.wait_until(lambda: len(rb.log_lines("listening")) >= 2, 20,
                      "both workers listening")
    clients = [a.RawClient(rb.port) for _ in range(12)]
    for c in clients:
        c.handshake(broker.user, broker.password, broker.vhost)
        c.open_channel(1)
    # worker 0 keeps no client: the case where it has nobody to wait for
    worker_of = {}
    for line in rb.log_lines("session_open"):
        worker_of[int(line["peer"].rsplit(":", 1)[1])] = line["worker"]
    on0 = [c for c in clients if worker_of[c.local_port] == "0"]
    clients = [c for c in clients if worker_of[c.local_port] != "0"]
    assert clients, "all 12 connections went to worker 0"
    for c in on0:
        c.send(a.connection_close())
        assert c.recv_method().method == a.CONNECTION_CLOSE_OK
        c.close()
    rbtest.wait_until(lambda: len(rb.log_lines("session_close")) == len(on0),
                      10, "worker 0's sessions to end")
    rb.signal(signal.SIGTERM)
    rbtest.wait_until(lambda: len(rb.log_lines("shutdown")) == 2, 10,
                      "both workers draining")
    # past worker 0's drain timeout and the 2 s it gives workers after it
    time.sleep(4)
    assert not rb.log_lines("worker_killed")
    for c in clients:
        c.open_channel(2)  # still served, nothing told
        c.send(a.connection_close())
        assert c.recv_method().method == a.CONNECTION_CLOSE_OK
        c.close()
    assert rb.wait_exit(timeout=20) == 0
    assert not rb.log_lines("worker_killed")
    assert not rb.log_lines("drain_timeout")


def test_second_signal_ends_the_client_wait(rebound_factory, broker):
    """A second SIGTERM during --drain-client-wait tells the clients now."""
    rb = rebound_factory("--drain-client-wait", "10m", "--drain-timeout",
                         "30s")
    c = a.RawClient(rb.port)
    c.handshake(broker.user, broker.password, broker.vhost)
    rb.signal(signal.SIGTERM)
    rb.wait_log("shutdown")
    rb.signal(signal.SIGTERM)
    code = c.expect_connection_close(timeout=20)[0]
    assert code == 320
    assert rb.log_lines("drain_client_wait_over", reason="second signal",
                        sessions_left=1)
    c.send(a.connection_close_ok())
    c.close()
    assert rb.wait_exit(timeout=20) == 0
