"""The README's "See a retry happen" walk-through, run as written: its
Python program (taken from the README) against a rebound started with the
README's retry flags in front of the test broker. Only the address comes
from the test (AMQP_URL, which the program reads)."""
import os
import re
import subprocess
import sys

from retryhelp import direct

assert direct  # a fixture

README = os.path.join(os.path.dirname(__file__), "..", "..", "..",
                      "README.md")


def walkthrough():
    """The run.sh flags and the program of the README's section."""
    text = open(README).read()
    section = text[text.index("### See a retry happen"):]
    section = section[:section.index("\n## ")]
    flags = re.search(r"^    scripts/run\.sh (.*)$", section, re.M).group(1)
    body = re.search(r"^    python3 - <<'EOF'\n(.*?)^    EOF$", section,
                     re.M | re.S).group(1)
    program = "\n".join(line[4:] for line in body.splitlines())
    return flags.split(), program


def test_see_a_retry_happen(rebound_factory, direct):
    flags, program = walkthrough()
    assert flags == ["--retry-tiers", "1s", "--max-attempts", "3"], flags
    direct.own("demo")  # and demo.* (tiers, dead-letter queue) at teardown
    for q in ["demo"] + [q for q in direct.ctl.queue_names()
                         if q.startswith("demo.")]:
        direct.channel().queue_delete(q)  # left by an earlier run
    rb = rebound_factory(*flags)
    run = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True,
        timeout=120, env=dict(os.environ, AMQP_URL="amqp://%s:%s@%s/" % (
            direct.broker.user, direct.broker.password, rb.addr)))
    assert run.returncode == 0, run
    lines = run.stdout.splitlines()
    assert lines == [
        "delivery with rebound-retry-count 0 - nack, requeue",
        "delivery with rebound-retry-count 1 - nack, requeue",
        "delivery with rebound-retry-count 2 - nack, requeue",
        "in demo.dlq: 1"], run.stdout
    # what the README says rebound's terminal shows (both at info)
    dead = rb.log_lines("dead_lettered", target="demo.dlq")
    assert [(d["level"], d["queue"], d["reason"], d["attempts"])
            for d in dead] == [("info", "demo", "max-attempts", "3")], dead
    summary = rb.log_lines("retry_summary")
    assert summary and summary[0]["level"] == "info" and \
        int(summary[0]["retried"]) >= 1, summary
