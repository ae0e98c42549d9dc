"""The configuration files shipped in deploy/ are accepted by rebound and
mean what they say."""
import json
import os
import signal
import subprocess

import rbtest
from test_admin import get

DEPLOY = os.path.join(os.path.dirname(__file__), "..", "..", "..", "deploy")


def run_with(path, broker, tmp_path):
    """Start rebound with the config file (listen, admin and upstream moved
    to this test's ports by flags) and return its /v1/status."""
    port, admin = rbtest.free_port(), rbtest.free_port()
    log = tmp_path / "rebound.log"
    proc = subprocess.Popen([os.environ["REBOUND_BIN"], "--config", path,
                             "--listen", "127.0.0.1:%d" % port,
                             "--admin", "127.0.0.1:%d" % admin,
                             "--upstream", broker.addr, "--log-format", "text"],
                            stderr=open(log, "w"),
                            preexec_fn=rbtest.die_with_test)
    try:
        rbtest.wait_until(lambda: b"msg=admin_listening" in log.read_bytes()
                          or proc.poll() is not None, 10, "start")
        assert proc.poll() is None, log.read_text()
        status = json.loads(get(admin, "/v1/status")[2])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    return status


def test_sample_config(broker, tmp_path):
    status = run_with(os.path.join(DEPLOY, "rebound.yaml"), broker, tmp_path)
    policies = status["config"]["retry"]["policies"]
    assert [p["queues"] for p in policies] == [["print.render*"], ["mail.*"],
                                               ["*"]]
    assert policies[2]["tiers"] == ["5s", "30s", "2m"]
    assert policies[2]["max_attempts"] == 5
    mail = policies[1]
    assert len(mail["tiers"]) == 28 and mail["processing_timeout"] == "15m"
    assert mail["backoff"] == {"initial": "1s", "max": "10m",
                               "multiplier": 2, "jitter": 0.2, "buckets": 4}
    assert status["config"]["cache_per_connection"] == 8 << 20


def test_kubernetes_configmap_config(broker, tmp_path):
    """The ConfigMap both Kubernetes overlays mount: configMapGenerator
    makes it from deploy/kubernetes/base/rebound.yaml as it is."""
    base = os.path.join(DEPLOY, "kubernetes", "base")
    kustomization = open(os.path.join(base, "kustomization.yaml")).read()
    assert "files: [rebound.yaml]" in kustomization
    status = run_with(os.path.join(base, "rebound.yaml"), broker, tmp_path)
    assert status["config"]["retry"]["policies"][0]["max_attempts"] == 4
    assert status["config"]["drain_timeout_ms"] == 10000
