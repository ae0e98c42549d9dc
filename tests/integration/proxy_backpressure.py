"""Integration: a consumer that stops reading cannot grow rebound's memory.

Run by with_rebound.sh. 200 MiB wait in a queue (published straight to the
broker); a no-ack consumer through rebound then stops reading its socket
while the broker pushes. rebound's resident memory must stay bounded (it
stops reading the broker once the client side passes its high-water mark),
and once the consumer reads again every message arrives, in order.
"""
import os
import sys
import time

import pika

MSG = 10 * 1024
COUNT = 20 * 1024  # 200 MiB
BOUND_MIB = 48     # growth allowed while the client is stalled


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def main():
    broker = os.environ["REBOUND_TEST_BROKER"].rstrip("/") + "/%2F"
    proxy = os.environ["REBOUND_PROXY_URL"]
    pid = int(os.environ["REBOUND_PID"])
    q = f"backpressure.{os.getpid()}"

    direct = pika.BlockingConnection(pika.URLParameters(broker))
    pch = direct.channel()
    pch.queue_declare(q, auto_delete=False)
    pch.queue_purge(q)
    for i in range(COUNT):
        body = i.to_bytes(4, "big") + b"x" * (MSG - 4)
        pch.basic_publish("", q, body)
    direct.process_data_events(0)

    conn = pika.BlockingConnection(pika.URLParameters(proxy))
    ch = conn.channel()
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b[:4]), auto_ack=True)
    base = rss_kib(pid)
    # Stall: the client does not read. The broker keeps pushing until
    # rebound stops reading it; rebound's memory must level off.
    peak = base
    for _ in range(30):
        time.sleep(0.1)
        peak = max(peak, rss_kib(pid))
    growth_mib = (peak - base) / 1024
    print(f"rss base {base} KiB, peak while stalled {peak} KiB, "
          f"growth {growth_mib:.1f} MiB for {COUNT * MSG >> 20} MiB queued")
    assert growth_mib < BOUND_MIB, f"rebound grew {growth_mib:.1f} MiB"

    deadline = time.time() + 120
    while len(got) < COUNT and time.time() < deadline:
        conn.process_data_events(0.5)
    assert len(got) == COUNT, f"received {len(got)} of {COUNT}"
    assert [int.from_bytes(b, "big") for b in got] == list(range(COUNT))
    conn.close()
    pch.queue_delete(q)
    direct.close()
    print("backpressure: 1 passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
