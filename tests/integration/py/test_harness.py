"""The test helpers themselves, where a fault in them would show up only as
a rare failure of some other test."""
import os
import subprocess

import rbtest


def test_free_port_never_repeats_a_port():
    ports = [rbtest.free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)


BROKER_SH = os.path.join(rbtest.REPO, "scripts", "broker.sh")


def test_broker_sh_waits_for_a_launcher_slow_to_start_the_node(tmp_path):
    """On a loaded machine the launcher can take a while from fork to exec;
    broker.sh once took it for a node that had exited and gave up."""
    env = dict(os.environ, REBOUND_BROKER_LAUNCH_DELAY="2")
    state = str(tmp_path / "broker")
    try:
        p = subprocess.run([BROKER_SH, "start", state], env=env,
                           capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "exited" not in p.stderr, p.stderr
        url = p.stdout.strip().splitlines()[-1].split("=", 1)[1]
        assert url.startswith("amqp://guest:guest@127.0.0.1:")
    finally:
        subprocess.run([BROKER_SH, "stop", state], capture_output=True,
                       timeout=120)


KILLED_TEST = r"""
import os, sys, time
sys.path.insert(0, %(here)r)
import rbtest
state, out = sys.argv[1], sys.argv[2]
text = rbtest.broker_sh("start", state)
url = text.strip().splitlines()[-1].split("=", 1)[1]
broker = rbtest.Broker(url, state)
rb = rbtest.Rebound(os.path.dirname(out), broker.addr)
beam = open(os.path.join(state, "rabbitmq.pid")).read().strip()
with open(out + ".tmp", "w") as f:
    f.write("%%s %%d %%d" %% (beam, rb.proc.pid, broker.port))
os.rename(out + ".tmp", out)
time.sleep(3600)
"""


def test_a_killed_test_leaves_no_server_behind(tmp_path):
    """A test killed with no time to clean up (a ctest timeout) takes its
    servers with it: the RabbitMQ node it started through broker.sh
    (REBOUND_BROKER_OWNER's watcher stops it) and its rebound
    (PR_SET_PDEATHSIG)."""
    import signal
    import sys
    state, out = str(tmp_path / "broker"), str(tmp_path / "pids")
    child = subprocess.Popen(
        [sys.executable, "-c",
         KILLED_TEST % {"here": os.path.dirname(os.path.abspath(__file__))},
         state, out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        rbtest.wait_until(lambda: os.path.exists(out) or
                          child.poll() is not None, 240, "the servers up")
        assert os.path.exists(out), child.stderr.read().decode()
        beam, rebound, port = (int(x) for x in open(out).read().split())
        assert alive(beam) and alive(rebound)
        child.send_signal(signal.SIGKILL)
        child.wait()
        rbtest.wait_until(lambda: not alive(rebound), 10, "rebound gone")
        rbtest.wait_until(lambda: not alive(beam), 120, "the node gone")
        rbtest.wait_until(lambda: not watchers(state), 30,
                          lambda: "its watcher gone: %s" % watchers(state))
        assert not os.path.exists(os.path.join(state, "rabbitmq.pid"))
    finally:
        if child.poll() is None:
            child.kill()
        subprocess.run([BROKER_SH, "stop", state], capture_output=True,
                       timeout=120)


alive = rbtest.pid_alive


def watchers(state):
    """broker.sh processes still working on `state`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
        except OSError:
            continue
        if any(b"broker.sh" in c for c in cmd) and state.encode() in cmd:
            found.append(int(pid))
    return found
