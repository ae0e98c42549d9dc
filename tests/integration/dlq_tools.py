#!/usr/bin/env python3
"""The dead-letter tools end to end, for the valgrind stage of
scripts/test.sh (and the sanitizer build): run through with_rebound.sh,
which starts rebound (under REBOUND_WRAPPER) with the admin endpoint at
REBOUND_DLQ_ADMIN; `rebound dlq` runs under REBOUND_WRAPPER too, over
plain AMQP and over TLS (the test broker's TLS listener).

Checks: show leaves every message in place, redrive over TLS moves what it
says with the counts reset, the admin routes browse and purge, and both
the CLI and rebound exit 0 (valgrind: --error-exitcode)."""
import base64
import json
import os
import shlex
import subprocess
import sys
import urllib.request

import pika

BIN = os.environ["REBOUND_DLQ_BIN"]
WRAP = shlex.split(os.environ.get("REBOUND_WRAPPER", ""))
ADMIN = os.environ["REBOUND_DLQ_ADMIN"]
BROKER = os.environ["REBOUND_TEST_BROKER"]  # amqp://guest:guest@host:port/
HOSTPORT = BROKER.split("@", 1)[1].rstrip("/")
TLS_PORT = os.environ["REBOUND_TEST_BROKER_TLS_PORT"]
CA = os.path.join(os.environ["REBOUND_TEST_CERTS"], "ca.pem")
Q = "dlqtools.%d" % os.getpid()
DLQ = Q + ".dlq"
N = 40


def dlq(*args, tls=False):
    url = ("amqps://guest@localhost:%s/%%2F" % TLS_PORT if tls else
           "amqp://guest@%s/%%2F" % HOSTPORT)
    env = dict(os.environ, REBOUND_PASSWORD="guest")
    extra = ["--upstream-ca", CA] if tls else []
    p = subprocess.run(WRAP + [BIN, "dlq", *args, "--quiet", "--url", url,
                               *extra],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, (args, p.returncode, p.stdout, p.stderr)
    # the password from the environment, none in the URL: nothing to warn
    # about, and no progress asked for: not a line on stderr
    assert p.stderr == "", (args, p.stderr)
    return p.stdout


def http(method, path):
    req = urllib.request.Request("http://%s%s" % (ADMIN, path), method=method)
    req.add_header("Authorization",
                   "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def count(ch, q):
    return ch.queue_declare(q, passive=True).method.message_count


def main():
    conn = pika.BlockingConnection(pika.URLParameters(BROKER + "%2F"))
    ch = conn.channel()
    ch.queue_declare(Q, durable=True)
    ch.queue_declare(DLQ, durable=True)
    ch.confirm_delivery()
    for i in range(N):
        ch.basic_publish("", DLQ, b"body %d" % i, pika.BasicProperties(
            message_id="m%d" % i, delivery_mode=2, headers={
                "rebound-retry-count": 3, "rebound-source-queue": Q,
                "rebound-dead-letter-reason": "max-attempts"}))
    out = dlq("show", DLQ, "--limit", "5")
    assert out.count("reason:               max-attempts") == 5, out
    assert count(ch, DLQ) == N
    shown = http("GET", "/v1/dlq/%s/messages?limit=3" % DLQ)
    assert [m["properties"]["message_id"] for m in shown["messages"]] == [
        "m0", "m1", "m2"], shown
    out = dlq("redrive", DLQ, "--limit", "30", tls=True)
    assert "moved 30 messages" in out, out
    assert (count(ch, Q), count(ch, DLQ)) == (30, N - 30)
    m = ch.basic_get(Q, auto_ack=True)
    assert "rebound-retry-count" not in m[1].headers, m[1].headers
    assert "rebound-redriven-at" in m[1].headers, m[1].headers
    assert http("POST", "/v1/dlq/%s/purge" % DLQ)["purged"] == N - 30
    assert count(ch, DLQ) == 0
    ch.queue_delete(Q)
    ch.queue_delete(DLQ)
    conn.close()
    print("dlq tools: ok")


if __name__ == "__main__":
    sys.exit(main())
