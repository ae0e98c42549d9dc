"""A consumer that dies: connects through rebound, consumes QUEUE with
prefetch PREFETCH until it holds N deliveries, appends one JSON line per
delivery to OUT (body, redelivered, rebound-retry-count), then exits at
once without settling anything or closing its connection (as a process
that crashes does).

    crash_consumer.py PORT QUEUE PREFETCH N OUT
"""
import json
import os
import sys

import pika

port, queue, prefetch, n, out = sys.argv[1:6]
conn = pika.BlockingConnection(pika.ConnectionParameters(
    "127.0.0.1", int(port), connection_attempts=1, socket_timeout=10))
ch = conn.channel()
ch.basic_qos(prefetch_count=int(prefetch))
got = []
for m, p, body in ch.consume(queue, inactivity_timeout=10):
    if m is None:
        break
    got.append({"body": body.decode(), "redelivered": m.redelivered,
                "count": (p.headers or {}).get("rebound-retry-count")})
    if len(got) >= int(n):
        break
with open(out, "a") as f:
    for g in got:
        f.write(json.dumps(g) + "\n")
os._exit(3)
