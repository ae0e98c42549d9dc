#!/usr/bin/python3
"""Golden session "kombu" (python3-kombu 5.2 over python3-amqp 5.1, the pyamqp transport).

    session_kombu.py BROKER_URL RELAY_PORT

Kombu's ordinary path: Producer.publish(declare=[queue]) with the json serializer,
then a Consumer with prefetch, drain_events, message.ack, cancel, delete. Values are
documented in MANIFEST.md; change both together.
"""
import sys

from kombu import Connection, Consumer, Exchange, Producer, Queue

EXCHANGE = Exchange("golden.kombu.x", type="direct", durable=True)
QUEUE = Queue("golden.kombu.q", exchange=EXCHANGE, routing_key="golden.kombu.rk",
              durable=True)
# py-amqp encodes float as 'd', small int as 'I', str as 'S', bool 't', None 'V'.
# (It would encode ints outside int32 as 'L', a type RabbitMQ does not list: avoided.)
HEADERS = {"k.float": 2.5, "k.int": 7, "k.str": "kombu", "k.bool": True, "k.none": None}
MSG_JSON = {"n": 1, "text": "kombu one"}   # json -> {"n": 1, "text": "kombu one"}
MSG_TEXT = "kombu two"                     # sent as text/plain


def cleanup(url):
    """Delete what a previous (failed) run may have left. Not recorded."""
    with Connection(url) as conn:
        ch = conn.channel()
        ch.queue_delete(QUEUE.name)
        ch.exchange_delete(EXCHANGE.name)
        ch.close()


def session(port):
    got = []
    with Connection(hostname="127.0.0.1", port=port, userid="guest", password="guest",
                    virtual_host="/", heartbeat=0, transport="pyamqp") as conn:
        conn.connect()
        with conn.channel() as pch:                     # channel 1
            producer = Producer(pch, exchange=EXCHANGE, routing_key="golden.kombu.rk",
                                serializer="json")
            producer.publish(MSG_JSON, declare=[QUEUE], headers=HEADERS,
                             correlation_id="golden-kombu-corr", message_id="golden-kombu-1")
            producer.publish(MSG_TEXT, content_type="text/plain", content_encoding="utf-8",
                             message_id="golden-kombu-2")
        with conn.channel() as cch:                     # channel 2
            def on_message(body, message):
                got.append(body)
                message.ack()
            with Consumer(cch, queues=[QUEUE], callbacks=[on_message],
                          accept=["json", "text/plain"], prefetch_count=5):
                while len(got) < 2:
                    conn.drain_events(timeout=10)
            QUEUE(cch).delete()
            EXCHANGE(cch).delete()
    assert got == [MSG_JSON, MSG_TEXT], got


if __name__ == "__main__":
    cleanup(sys.argv[1])
    session(int(sys.argv[2]))
