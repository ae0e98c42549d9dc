"""The retry policy from a --config YAML file
works the same as from flags (a poison run with a file's policy: its
tiers, max_attempts, dead_letter pattern and header_prefix), flag > env >
file, and a bad file makes rebound refuse to start with "FILE:LINE: reason"
on stderr and exit status 2.

Tier accuracy tolerance: [delay - 50 ms, delay + 600 ms] (retryhelp).
"""
import os
import subprocess
import textwrap
import time

import pytest

import rbtest
from retryhelp import PoisonConsumer, direct, pump, run_poison, wait_counts

assert direct  # a fixture

CONFIG = """\
# rebound, retry acceptance test
retry:
  header_prefix: "retry-meta-"
  policies:
    - queues: ["rbt-cfgnever-*"]
      tiers: [5s]
      max_attempts: 9
    - queues: ["rbt-nothing-*", "rbt-poison-*"]
      tiers: [300ms, 600ms]
      max_attempts: 3
      dead_letter: "{queue}.parking"
"""


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_policy_from_config_file(rebound_factory, broker, ctl, direct,
                                 tmp_path):
    """A poison run with the file's second policy (first match wins):
    exactly 3 deliveries, gaps 0.3 s and 0.6 s, then '<queue>.parking',
    every header under the file's prefix 'retry-meta-' and none under
    'rebound-'. A queue matching no policy of the file is not
    intercepted."""
    rb = rebound_factory("--config", write(tmp_path, "rebound.yaml", CONFIG))
    q, gaps = run_poison(rb, broker, ctl, direct, {}, ["300ms", "600ms"], 3,
                         prefix="retry-meta-", dead_letter="{queue}.parking")
    print("config file policy: gaps %s" % [round(g, 3) for g in gaps])
    assert [p["target"] for p in rb.log_lines("dead_lettered")] == \
        [q + ".parking"]
    assert not direct.exists(q + ".dlq")

    # outside every policy of the file: the broker's requeue, at once
    other = direct.own(rbtest.uniq("cfgout"))
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(other, durable=True)
    ch.basic_publish("", other, b"x")
    cons = PoisonConsumer(conn, ch, other)
    cons.wait(5, timeout=5)
    assert [d.method.redelivered for d in cons.deliveries[:5]] == \
        [False, True, True, True, True]
    assert all(d.props.headers is None for d in cons.deliveries)
    cons.cancel()
    ch.queue_purge(other)
    conn.close()
    wait_counts(ctl, {other: (0, 0)})
    assert not [n for n in direct.ctl.queue_names()
                if n.startswith(other + ".")]


def poison_deliveries(rb, broker, ctl, direct, timeout=8):
    """Deliveries of one always-failing message until its dead-letter copy
    exists; returns their count headers."""
    q = direct.own(rbtest.uniq("prec"))
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.basic_publish("", q, b"p")
    cons = PoisonConsumer(conn, ch, q)
    pump(conn, lambda: direct.exists(q + ".dlq") and
         direct.ch.queue_declare(q + ".dlq", passive=True)
         .method.message_count == 1, timeout,
         lambda: "the dead-letter copy (deliveries %r)" % (
             [d.count for d in cons.deliveries],))
    late = cons.quiet_for(0.5)
    assert not late
    cons.cancel()
    conn.close()
    return [d.count for d in cons.deliveries]


def test_precedence_flag_over_env_over_file(rebound_factory, broker, ctl,
                                            direct, tmp_path):
    """File: max_attempts 5. With REBOUND_MAX_ATTEMPTS=3 in the
    environment: 3 deliveries. With --max-attempts 2 on top: 2."""
    path = write(tmp_path, "prec.yaml", textwrap.dedent("""\
        retry:
          policies:
            - queues: ["rbt-prec-*"]
              tiers: [200ms]
              max_attempts: 5
        """))
    env = {"REBOUND_MAX_ATTEMPTS": "3"}
    file_only = rebound_factory("--config", path)
    file_env = rebound_factory("--config", path, env=env)
    file_env_flag = rebound_factory("--config", path, "--max-attempts", "2",
                                    env=env)
    assert poison_deliveries(file_only, broker, ctl, direct) == \
        [None, 1, 2, 3, 4]
    assert poison_deliveries(file_env, broker, ctl, direct) == [None, 1, 2]
    assert poison_deliveries(file_env_flag, broker, ctl, direct) == [None, 1]


BAD = [
    ("unknown-key", "listen: 127.0.0.1:5999\nlisen: 127.0.0.1:5673\n",
     2, "unknown key 'lisen'"),
    ("bad-tier", textwrap.dedent("""\
        retry:
          policies:
            - queues: ["a*"]
              tiers: [1s, fast, 4s]
        """), 4, "tiers"),
    ("zero-attempts", textwrap.dedent("""\
        retry:
          policies:
            - queues: ["a*"]
              tiers: [1s]

              max_attempts: 0
        """), 6, "max_attempts"),
    ("no-queues", textwrap.dedent("""\
        # comment
        retry:
          policies:
            - tiers: [1s]
        """), 4, "queues"),
    ("unknown-policy-key", textwrap.dedent("""\
        retry:
          policies:
            - queues: ["a*"]
              max_attempt: 3
        """), 4, "max_attempt"),
    ("bad-yaml", "retry:\n  policies: [\n    {queues: [a]\n", 4, ""),
]


@pytest.mark.parametrize("name,text,line,reason", BAD,
                         ids=[b[0] for b in BAD])
def test_bad_config_file_refused_with_file_line_reason(broker, tmp_path, name,
                                                       text, line, reason):
    path = write(tmp_path, name + ".yaml", text)
    port = rbtest.free_port()
    t0 = time.monotonic()
    p = subprocess.run([rbtest.BIN, "--config", path, "--listen",
                        "127.0.0.1:%d" % port, "--upstream", broker.addr],
                       capture_output=True, text=True, timeout=20,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert time.monotonic() - t0 < 15
    err = p.stderr.strip()
    assert "%s:%d: " % (path, line) in err, err
    assert reason in err.split("%s:%d: " % (path, line), 1)[1], err
    assert len(err.splitlines()) == 1, err
    assert "msg=listening" not in p.stdout + p.stderr
    assert not any(m in err for m in rbtest.SANITIZER_MARKERS)


def test_missing_config_file_refused(broker, tmp_path):
    path = str(tmp_path / "nope.yaml")
    p = subprocess.run([rbtest.BIN, "--config", path, "--upstream", broker.addr,
                        "--listen", "127.0.0.1:%d" % rbtest.free_port()],
                       capture_output=True, text=True, timeout=20,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert path in p.stderr and "cannot open" in p.stderr, p.stderr
    assert os.path.exists(str(tmp_path))
