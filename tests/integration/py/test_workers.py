"""--workers N: N processes on one listening port (SO_REUSEPORT). Clients
land on every worker; the one admin endpoint's /metrics and /v1/status
cover all of them; SIGTERM drains every worker, SIGHUP reloads every
worker; a worker that dies is started again; workers whose first process
is gone drain and exit."""
import json
import os
import signal
import time

import pytest
from pika.exceptions import ConnectionClosedByBroker

import rbtest
from test_admin import admin_rebound, get, metrics
from test_shutdown import pump_until_closed


def start(factory, n, *args, **kw):
    rb = admin_rebound(factory, "--workers", str(n), *args, **kw)
    rbtest.wait_until(lambda: len(rb.log_lines("listening")) >= n, 20,
                      "every worker to listen")
    return rb


def status(rb):
    code, _, body = get(rb.admin_port, "/v1/status")
    assert code == 200, body
    return json.loads(body)


def sessions_by_worker(rb):
    st = status(rb)
    out = {0: len(st["sessions"])}
    for w in st["workers"]:
        assert w["status"] is not None, "worker %d did not answer" % w["worker"]
        out[w["worker"]] = len(w["status"]["sessions"])
    return out


def round_trip(conn, payload):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, payload)
    for _ in range(50):
        m = ch.basic_get(q, auto_ack=True)
        if m[0]:
            return m[2]
        time.sleep(0.02)
    return None


def pids(rb):
    st = status(rb)
    return [st["pid"]] + [w["pid"] for w in st["workers"]]


alive = rbtest.pid_alive


def test_connections_land_on_every_worker(rebound_factory, broker):
    rb = start(rebound_factory, 3)
    assert len(set(pids(rb))) == 3
    conns = [rb.pika(broker) for _ in range(24)]
    for i, c in enumerate(conns):
        assert round_trip(c, b"m%d" % i) == b"m%d" % i
    per = sessions_by_worker(rb)
    assert sorted(per) == [0, 1, 2]
    assert sum(per.values()) == 24
    assert all(n >= 1 for n in per.values()), per
    m = metrics(rb.admin_port)
    # summed over the workers: no single worker accepted all 24
    assert m["rebound_client_connections"] == 24
    assert m["rebound_client_connections_opened_total"] == 24
    assert m["rebound_workers"] == 3
    assert m["rebound_workers_running"] == 3
    assert m["rebound_workers_answered"] == 3
    assert m["rebound_ready"] == 1
    assert m["rebound_upstream_connections"] == 24
    for c in conns:
        c.close()
    rbtest.wait_until(
        lambda: metrics(rb.admin_port)["rebound_client_connections"] == 0, 10,
        "every worker to see its clients go")


def test_sigterm_drains_every_worker(rebound_factory, broker):
    rb = start(rebound_factory, 3, "--drain-timeout", "5s")
    conns = [rb.pika(broker) for _ in range(18)]
    for c in conns:
        assert round_trip(c, b"x") == b"x"
    per = sessions_by_worker(rb)
    assert all(n >= 1 for n in per.values()), per
    workers = pids(rb)
    t0 = time.monotonic()
    rb.signal(signal.SIGTERM)
    errors = [pump_until_closed(c, t0 + 10) for c in conns]
    for e in errors:
        assert isinstance(e, ConnectionClosedByBroker), repr(e)
        assert e.reply_code == 320
    assert rb.wait_exit(timeout=15) == 0
    for k in range(3):
        assert rb.log_lines("shutdown", worker=k, signal=int(signal.SIGTERM))
        assert rb.log_lines("exit", worker=k)
    assert len(rb.log_lines("worker_exited")) == 2
    assert not rb.log_lines("worker_died")
    assert not any(alive(p) for p in workers)


def test_sighup_reloads_every_worker(rebound_factory, tmp_path):
    cfg = tmp_path / "rebound.yaml"
    cfg.write_text("retry:\n  policies:\n    - queues: ['rbt-workers-a*']\n")
    rb = start(rebound_factory, 3, "--config", str(cfg))
    cfg.write_text("retry:\n  policies:\n    - queues: ['rbt-workers-a*']\n"
                   "    - queues: ['rbt-workers-b*']\n")
    rb.signal(signal.SIGHUP)
    rbtest.wait_until(lambda: len(rb.log_lines("config_reloaded")) == 3, 10,
                      "every worker to reload")
    for k in range(3):
        assert rb.log_lines("config_reloaded", worker=k, policies=2)
    st = status(rb)
    assert len(st["config"]["retry"]["policies"]) == 2
    for w in st["workers"]:
        assert len(w["status"]["config"]["retry"]["policies"]) == 2


def test_a_killed_worker_is_started_again(rebound_factory, broker):
    rb = start(rebound_factory, 2)
    first = pids(rb)
    conns = [rb.pika(broker) for _ in range(12)]
    per = sessions_by_worker(rb)
    assert per[1] >= 1, per
    before = metrics(rb.admin_port)["rebound_client_connections_opened_total"]
    assert before == 12
    os.kill(first[1], signal.SIGKILL)
    rb.wait_log("worker_died", index=1, signal=int(signal.SIGKILL))
    # before it is back: answered at once, by worker 0 alone, and the
    # dead worker's counters do not go back
    m = metrics(rb.admin_port)
    if m["rebound_workers_running"] == 1:
        assert m["rebound_workers_answered"] == 1
    assert m["rebound_client_connections_opened_total"] == 12
    assert m["rebound_client_connections"] == 12 - per[1]
    rbtest.wait_until(lambda: len(rb.log_lines("listening")) >= 3, 10,
                      "the new worker to listen")
    now = pids(rb)
    assert now[0] == first[0] and now[1] != first[1]
    assert alive(now[1])
    m = metrics(rb.admin_port)
    assert m["rebound_worker_restarts_total"] == 1
    assert m["rebound_workers_running"] == 2
    assert m["rebound_client_connections_opened_total"] == 12
    for c in conns:
        try:
            c.close()
        except Exception:  # those of the killed worker are gone
            pass
    conns = [rb.pika(broker) for _ in range(8)]
    for c in conns:
        assert round_trip(c, b"after") == b"after"
    assert sorted(sessions_by_worker(rb)) == [0, 1]
    assert metrics(rb.admin_port)["rebound_client_connections_opened_total"] == 20
    for c in conns:
        c.close()


def test_a_new_number_of_workers_in_the_file_waits_for_a_restart(
        rebound_factory, tmp_path):
    cfg = tmp_path / "rebound.yaml"
    cfg.write_text("workers: 3\n")
    rb = admin_rebound(rebound_factory, "--config", str(cfg))
    rbtest.wait_until(lambda: len(rb.log_lines("listening")) >= 3, 20,
                      "every worker to listen")
    cfg.write_text("workers: 2\n")
    rb.signal(signal.SIGHUP)
    rbtest.wait_until(lambda: len(rb.log_lines("config_reloaded")) == 3, 10,
                      "every worker to reload")
    assert not rb.log_lines("config_reload_failed")
    assert rb.log_lines("config_reload_workers_kept", worker=0)
    assert metrics(rb.admin_port)["rebound_workers_running"] == 3


def test_a_port_another_rebound_holds_is_refused(rebound_factory, broker):
    import subprocess
    rb = start(rebound_factory, 2)
    r = subprocess.run([rbtest.BIN, "--workers", "2", "--listen", rb.addr,
                        "--admin", "off", "--upstream", broker.addr],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 1, r.stderr
    assert "msg=listen_bind_failed" in r.stderr
    assert "address already in use" in r.stderr


def test_workers_drain_when_the_first_process_is_gone(tmp_path, broker):
    port = rbtest.free_port()
    rb = rbtest.Rebound(str(tmp_path), broker.addr,
                        ["--workers", "3", "--admin", "127.0.0.1:%d" % port])
    rb.admin_port = port
    workers = []
    try:
        rbtest.wait_until(lambda: len(rb.log_lines("listening")) >= 3, 20,
                          "every worker to listen")
        workers = pids(rb)[1:]
        os.kill(rb.pid, signal.SIGKILL)
        rb.wait_exit(5)
        rbtest.wait_until(lambda: not any(alive(p) for p in workers), 15,
                          "the workers to exit")
        for k in (1, 2):
            assert rb.log_lines("worker_parent_gone", worker=k)
            assert rb.log_lines("exit", worker=k)
        assert not rb.sanitizer_report()
    finally:
        for p in workers:
            if alive(p):
                os.kill(p, signal.SIGKILL)
        if rb.alive():
            rb.proc.kill()
            rb.wait_exit(5)


@pytest.mark.parametrize("value", ["0", "65", "two"])
def test_a_bad_number_of_workers_is_refused(value):
    import subprocess
    r = subprocess.run([rbtest.BIN, "--workers", value], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 2
    assert "--workers: invalid value '%s'" % value in r.stderr
    assert "auto or a whole number from 1 to 64" in r.stderr
