#!/usr/bin/env python3
"""pika over TLS through rebound (REBOUND_TLS_PORT, REBOUND_TEST_CERTS):
confirmed publishes, acked deliveries and one poison message retried to
its dead-letter queue. Run by tls_under_rebound.sh, e.g. under valgrind."""
import os
import ssl
import sys
import uuid

import pika

certs = os.environ["REBOUND_TEST_CERTS"]
ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))
params = pika.ConnectionParameters(
    host="localhost", port=int(os.environ["REBOUND_TLS_PORT"]),
    credentials=pika.PlainCredentials("guest", "guest"),
    ssl_options=pika.SSLOptions(ctx, "localhost"), connection_attempts=1,
    socket_timeout=30, blocked_connection_timeout=60)
q = "tlsvg-" + uuid.uuid4().hex[:8]
conn = pika.BlockingConnection(params)
ch = conn.channel()
ch.confirm_delivery()
ch.queue_declare(q)
bodies = [os.urandom(n) for n in (0, 1, 4096, 200000)] * 5
for b in bodies:
    ch.basic_publish("", q, b)
ch.basic_publish("", q, b"poison", pika.BasicProperties(message_id="p"))
got, poison = [], 0
for m, p, b in ch.consume(q, inactivity_timeout=5):
    if m is None:
        break
    if b == b"poison":
        poison += 1
        ch.basic_nack(m.delivery_tag, requeue=True)
        continue
    got.append(b)
    ch.basic_ack(m.delivery_tag)
ch.cancel()
dlq = ch.queue_declare(q + ".dlq", passive=True).method.message_count
ch.queue_delete(q)
ch.queue_delete(q + ".dlq")
conn.close()
ok = sorted(got) == sorted(bodies) and poison == 3 and dlq == 1
print("deliveries %d of %d, poison delivered %d times, dlq %d"
      % (len(got), len(bodies), poison, dlq))
sys.exit(0 if ok else 1)
