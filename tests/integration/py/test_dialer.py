"""The dialer against real sockets: an upstream that accepts TCP and never
answers, one whose SYNs are dropped (a listener with a full accept
queue), a host name with several addresses, and the memory of upstreams
that failed lately."""
import socket
import time

import pika

import rbtest

TIMEOUT_S = 1.0


def silent_listener():
    """Accepts connections (the kernel does) and never says a word."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


def syn_dropper():
    """A listener whose accept queue is full and never drained: Linux
    drops further SYNs, so a connect to it hangs."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(0)
    port = s.getsockname()[1]
    fillers = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        fillers.append(c)
    time.sleep(0.2)
    return s, fillers


def connect_time(rb, broker):
    t0 = time.monotonic()
    conn = rb.pika(broker)
    took = time.monotonic() - t0
    conn.channel().queue_declare("", exclusive=True)
    conn.close()
    return took


def test_silent_upstream_then_the_next(rebound_factory, broker):
    """The first upstream accepts TCP and never sends connection.start:
    the client is connected through the second one within the connect
    timeout and a little, and the log names the failed try."""
    silent = silent_listener()
    port = silent.getsockname()[1]
    rb = rebound_factory("--connect-timeout", "%gs" % TIMEOUT_S,
                         upstream="127.0.0.1:%d,%s" % (port, broker.addr))
    took = connect_time(rb, broker)
    assert TIMEOUT_S * 0.9 <= took < TIMEOUT_S + 2, took
    lines = rb.log_lines("upstream_attempt_failed",
                         upstream="127.0.0.1:%d" % port)
    assert lines and "no connection.start within" in lines[0]["error"]
    silent.close()


def test_dropped_syns_then_the_next(rebound_factory, broker):
    listener, fillers = syn_dropper()
    port = listener.getsockname()[1]
    rb = rebound_factory("--connect-timeout", "%gs" % TIMEOUT_S,
                         upstream="127.0.0.1:%d,%s" % (port, broker.addr))
    took = connect_time(rb, broker)
    assert TIMEOUT_S * 0.9 <= took < TIMEOUT_S + 2, took
    assert rb.log_lines("upstream_attempt_failed",
                        upstream="127.0.0.1:%d" % port)
    for c in fillers:
        c.close()
    listener.close()


def test_failed_upstream_is_tried_last(rebound_factory, broker):
    """Once the silent first upstream has cost one client a timeout, the
    next clients go to the second upstream at once."""
    silent = silent_listener()
    port = silent.getsockname()[1]
    rb = rebound_factory("--connect-timeout", "%gs" % TIMEOUT_S,
                         upstream="127.0.0.1:%d,%s" % (port, broker.addr))
    first = connect_time(rb, broker)
    assert first >= TIMEOUT_S * 0.9
    later = [connect_time(rb, broker) for _ in range(3)]
    assert max(later) < TIMEOUT_S * 0.5, later
    assert len(rb.log_lines("upstream_attempt_failed")) == 1
    silent.close()


def test_every_address_of_a_name(rebound_factory, broker):
    """localhost names 127.0.0.1 and (where configured) ::1; the broker
    listens on 127.0.0.1 only. Each address is tried in the resolver's
    order, so the client gets through either way."""
    addrs = [a[4][0] for a in socket.getaddrinfo(
        "localhost", broker.port, type=socket.SOCK_STREAM,
        flags=socket.AI_ADDRCONFIG)]
    rb = rebound_factory("--connect-timeout", "%gs" % TIMEOUT_S,
                         upstream="localhost:%d" % broker.port)
    connect_time(rb, broker)
    failed = rb.log_lines("upstream_attempt_failed")
    if addrs and addrs[0] != "127.0.0.1":
        assert failed and failed[0]["address"].startswith("[" + addrs[0])
    else:
        assert not failed


def test_unreachable_names_every_try(rebound_factory, broker):
    silent = silent_listener()
    port = silent.getsockname()[1]
    rb = rebound_factory("--connect-timeout", "300ms",
                         upstream="127.0.0.1:%d,127.0.0.1:1" % port)
    try:
        rb.pika(broker)
    except Exception:
        pass
    line = rbtest.wait_until(lambda: rb.log_lines("upstream_unreachable"), 10,
                             "an upstream_unreachable line")[0]
    assert "127.0.0.1:%d" % port in line["tried"]
    assert "127.0.0.1:1" in line["tried"]
    silent.close()
