"""kombu (py-amqp transport, AMQPLAIN login) through rebound: its normal
producer/consumer path."""
import socket
import time

import kombu
import pytest

import rbtest


def test_kombu_publish_json_drain_ack(rebound, broker, ctl):
    qname = rbtest.uniq("kombu")
    xname = rbtest.uniq("kombu-x")
    conn = kombu.Connection(rebound.url(broker), connect_timeout=10,
                            transport_options={"confirm_publish": True})
    conn.connect()
    try:
        # kombu/py-amqp logs in with AMQPLAIN; rebound still knows the user
        line = rebound.wait_log("session_open", user=broker.user)
        assert line["vhost"] == broker.vhost

        exchange = kombu.Exchange(xname, type="direct", durable=False,
                                  auto_delete=True)
        queue = kombu.Queue(qname, exchange=exchange, routing_key="rk",
                            durable=False, queue_arguments={"x-expires": 120000})
        producer = conn.Producer()
        n = 200
        for i in range(n):
            producer.publish({"i": i, "text": "caf\u00e9", "list": [i, None, True]},
                             exchange=exchange, routing_key="rk",
                             serializer="json", declare=[queue],
                             headers={"seq": i}, retry=False)

        received = []

        def on_message(body, message):
            received.append((body, message.headers, message.content_type,
                             message.delivery_info["redelivered"]))
            message.ack()

        with conn.Consumer(queue, callbacks=[on_message], prefetch_count=50):
            deadline = time.monotonic() + 20
            while len(received) < n and time.monotonic() < deadline:
                try:
                    conn.drain_events(timeout=1)
                except (TimeoutError, socket.timeout):
                    pass
        assert len(received) == n
        for i, (body, headers, ctype, redelivered) in enumerate(received):
            assert body == {"i": i, "text": "caf\u00e9", "list": [i, None, True]}
            assert headers == {"seq": i}
            assert ctype == "application/json"
            assert redelivered is False
        rbtest.wait_until(lambda: ctl.queue(qname)[:2] == (0, 0), 10,
                          lambda: "queue drained and acked: %r" % (ctl.queue(qname),))

        # SimpleQueue: kombu's other everyday path (basic.get + ack)
        sqname = rbtest.uniq("kombu-simple")
        sq = conn.SimpleQueue(sqname,
                              queue_opts={"durable": False},
                              queue_args={"x-expires": 120000},
                              exchange_opts={"durable": False,
                                             "auto_delete": True})
        sq.put({"hello": "world"}, serializer="json")
        msg = sq.get(block=True, timeout=10)
        assert msg.payload == {"hello": "world"}
        msg.ack()
        with pytest.raises(sq.Empty):
            sq.get(block=False)
        sq.close()
        ch = conn.channel()
        # the auto-delete exchange goes with its last binding
        assert ch.queue_delete(sqname) == 0
        ch.close()
        queue.bind(conn).delete()
    finally:
        conn.release()
    rebound.wait_conn_sockets(0)
