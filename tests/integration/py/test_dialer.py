"""The dialer against real sockets: an upstream that accepts TCP and never
answers, one whose SYNs are dropped (a listener with a full accept
queue), a host name with several addresses, and the memory of upstreams
that failed lately."""
import socket
import subprocess
import time

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
    assert took < TIMEOUT_S + 2, took
    lines = rbtest.wait_until(
        lambda: rb.log_lines("upstream_attempt_failed",
                             upstream="127.0.0.1:%d" % port), 5,
        "the failed try logged")
    assert "no connection.start within" in lines[0]["error"]
    silent.close()


def test_dropped_syns_then_the_next(rebound_factory, broker):
    listener, fillers = syn_dropper()
    port = listener.getsockname()[1]
    rb = rebound_factory("--connect-timeout", "%gs" % TIMEOUT_S,
                         upstream="127.0.0.1:%d,%s" % (port, broker.addr))
    took = connect_time(rb, broker)
    assert took < TIMEOUT_S + 2, took
    rbtest.wait_until(
        lambda: rb.log_lines("upstream_attempt_failed",
                             upstream="127.0.0.1:%d" % port), 5,
        "the failed try logged")
    for c in fillers:
        c.close()
    listener.close()


def test_failed_upstream_is_tried_last(rebound_factory, broker):
    """Once the silent first upstream has cost a timeout (a client's, or
    the readiness probe's), the next clients go to the second upstream at
    once: at most one client ever waits for it."""
    silent = silent_listener()
    port = silent.getsockname()[1]
    rb = rebound_factory("--connect-timeout", "%gs" % TIMEOUT_S,
                         upstream="127.0.0.1:%d,%s" % (port, broker.addr))
    connect_time(rb, broker)
    later = [connect_time(rb, broker) for _ in range(3)]
    assert max(later) < TIMEOUT_S * 0.5, later
    by_clients = [l for l in rb.log_lines("upstream_attempt_failed")
                  if l["id"] != "0"]
    assert len(by_clients) <= 1, by_clients
    silent.close()


NAME = "multi.rebound.test"
HOSTS = "::1 %s\n127.0.0.1 %s\n127.0.0.5 %s\n" % (NAME, NAME, NAME)


def private_hosts(tmp_path):
    """A command prefix that runs the rest in a mount namespace of its own
    whose /etc/hosts gives NAME an AAAA and two A addresses, and the order
    the resolver gives them there (with AI_ADDRCONFIG, as rebound asks)."""
    hosts = tmp_path / "hosts"
    hosts.write_text(HOSTS)
    wrap = ["unshare", "-m", "sh", "-c",
            'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts)]
    probe = ("import socket; print(' '.join(a[4][0] for a in socket."
             "getaddrinfo(%r, 1, type=socket.SOCK_STREAM, "
             "flags=socket.AI_ADDRCONFIG)))" % NAME)
    out = subprocess.run(wrap + ["/usr/bin/python3", "-c", probe],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    return wrap, out.stdout.split()


def test_every_address_of_a_name(rebound_factory, broker, tmp_path):
    """A host name with several addresses (A and AAAA): each is tried in
    the resolver's order. Every address but the resolver's last is a
    silent listener; the last is the way to the broker (a rebound in front
    of it). The client gets through within one connect timeout per
    silent address and a little, and the log names each failed try."""
    wrap, order = private_hosts(tmp_path)
    assert len(order) >= 2, order
    front = rebound_factory("--retry-queues", "none-here",
                            listen_host=order[-1])
    silent = []
    for addr in order[:-1]:
        s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
        s.bind((addr, front.port))
        s.listen(16)
        silent.append(s)
    rb = rebound_factory("--connect-timeout", "%gs" % TIMEOUT_S,
                         "--retry-queues", "none-here", wrapper=wrap,
                         upstream="%s:%d" % (NAME, front.port))
    took = connect_time(rb, broker)
    assert took < TIMEOUT_S * len(silent) + 2, took
    tried = [l["address"] for l in rb.log_lines("upstream_attempt_failed")
             if l["id"] != "0"]
    fmt = lambda a: ("[%s]:%d" if ":" in a else "%s:%d") % (a, front.port)
    assert tried == [fmt(a) for a in order[:-1]], (tried, order)
    assert front.wait_log("session_open")
    for s in silent:
        s.close()


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


# ---- readiness: the probe does what a client does ---------------------------

def readyz(rb):
    from test_admin import get
    status, _, body = get(rb.admin_port, "/readyz")
    return status, body


def test_ready_through_a_host_name_before_any_client(rebound_factory,
                                                     broker):
    from test_admin import admin_rebound
    rb = admin_rebound(rebound_factory,
                       upstream="localhost:%d" % broker.port)
    rbtest.wait_until(lambda: readyz(rb)[0] == 200, 10, "ready")
    assert readyz(rb)[1] == "ready\n"
    assert not rb.log_lines("session_accept")


def test_not_ready_when_the_upstream_never_answers(rebound_factory):
    """A listener that accepts and stays silent is not a broker: not
    ready, with the reason; with --ready-needs-upstream off, ready
    anyway and the reason shown."""
    from test_admin import admin_rebound
    silent = silent_listener()
    up = "127.0.0.1:%d" % silent.getsockname()[1]
    rb = admin_rebound(rebound_factory, "--connect-timeout", "300ms",
                       upstream=up)
    rbtest.wait_until(lambda: readyz(rb)[0] == 503 and "no connection.start"
                      in readyz(rb)[1], 10, "not ready, and why")
    assert up in readyz(rb)[1]
    assert rb.log_lines("readiness_probe_failed")
    side = admin_rebound(rebound_factory, "--connect-timeout", "300ms",
                         "--ready-needs-upstream", "off", upstream=up)
    rbtest.wait_until(lambda: "no connection.start" in readyz(side)[1], 10,
                      "the reason shown")
    status, body = readyz(side)
    assert status == 200 and body.startswith("ready (upstream: "), body
    silent.close()


def test_not_ready_on_a_protocol_mismatch(rebound_factory):
    """Something that answers, but not with connection.start (here an HTTP
    server's reply): not ready, "protocol mismatch"."""
    import threading
    from test_admin import admin_rebound
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()

    def answer():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            try:
                c.recv(100)
                c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            except OSError:
                pass
            c.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    rb = admin_rebound(rebound_factory,
                       upstream="127.0.0.1:%d" % srv.getsockname()[1])
    rbtest.wait_until(lambda: "protocol mismatch" in readyz(rb)[1], 10,
                      "a protocol mismatch")
    assert readyz(rb)[0] == 503
    assert "HTTP/1.1" in readyz(rb)[1]
    stop.set()
    t.join(5)
    srv.close()
