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
