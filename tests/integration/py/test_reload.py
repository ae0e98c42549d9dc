"""SIGHUP reload: a new policy applies to new decisions; an invalid file
keeps the running config and logs file:line and the reason."""
import signal
import time

import pika

import rbtest


def poison_deliveries(rb, broker, q, window):
    """Deliveries of one always-failing message within `window` seconds."""
    conn = rb.pika(broker)
    ch = conn.channel()
    ch.queue_declare(q, auto_delete=False)
    ch.basic_publish("", q, b"poison")
    seen = []

    def cb(c, m, p, b):
        seen.append(time.time())
        if len(seen) < 50:
            c.basic_nack(m.delivery_tag, requeue=True)
        else:
            c.basic_ack(m.delivery_tag)
    ch.basic_consume(q, cb)
    end = time.time() + window
    while time.time() < end:
        conn.process_data_events(0.05)
    for name in (q, q + ".dlq", q + ".retry.100ms"):
        ch.queue_delete(name)
    conn.close()
    return len(seen)


POLICY = """retry:
  policies:
    - queues: ["%s*"]
      tiers: [100ms]
      max_attempts: %d
"""


def test_sighup_reload_good_and_bad(rebound_factory, broker, tmp_path):
    cfg = tmp_path / "rebound.yaml"
    a, b = rbtest.uniq("reload-a"), rbtest.uniq("reload-b")
    cfg.write_text(POLICY % (a, 2))
    rb = rebound_factory("--config", str(cfg))
    assert poison_deliveries(rb, broker, a + ".q1", 1.0) == 2
    assert poison_deliveries(rb, broker, b + ".q1", 0.5) == 50  # no policy: loops

    # a good file: the new policy decides from now on
    cfg.write_text(POLICY % (b, 3))
    rb.proc.send_signal(signal.SIGHUP)
    rb.wait_log("config_reloaded", generation="1")
    assert poison_deliveries(rb, broker, b + ".q2", 1.0) == 3
    assert poison_deliveries(rb, broker, a + ".q2", 0.5) == 50  # a: no policy now

    # a bad file: refused with file:line, the running config stays
    cfg.write_text("retry:\n  policies:\n    - queues: [x]\n      max_attempts: zero\n")
    rb.proc.send_signal(signal.SIGHUP)
    line = rb.wait_log("config_reload_failed")
    assert "%s:4:" % cfg in line["error"] and "max_attempts" in line["error"]
    assert poison_deliveries(rb, broker, b + ".q3", 1.0) == 3
