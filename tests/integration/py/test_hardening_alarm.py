"""Frames held behind a retry while the broker is under a memory alarm:
the broker stops reading the connection that carries rebound's copy, the
copy is not confirmed, and the client keeps publishing on the channel
whose frames wait for it. rebound must stop reading that client rather
than keep what it sends. Uses a private RabbitMQ node (scripts/broker.sh
on its own directory), never the shared test broker: an alarm blocks
every publisher of the node."""
import time

import pytest

import amqp_raw as a
import fakebroker as fb
import rbtest
from test_hardening_upstream import (BODY, GROWTH_BOUND_MIB,
                                     SMALL_QUARANTINE, TOTAL, Publisher,
                                     consume)

@pytest.fixture(scope="module")
def private_broker():
    yield from rbtest.private_broker("rb-alarm-")


def start_ok_blocked_capable():
    """start-ok announcing the connection.blocked capability, so the
    broker tells this client when its alarm is raised."""
    props = a.table({"product": "rebound-tests-raw",
                     "connection_name": "alarm-client",
                     "capabilities": {"connection.blocked": True}})
    return a.method(0, a.CONNECTION_START_OK, props + a.shortstr("PLAIN")
                    + a.longstr(b"\x00guest\x00guest") + a.shortstr("en_US"))


def test_held_frames_under_a_memory_alarm(rebound_factory, private_broker):
    pb = private_broker
    q = rbtest.uniq("alarm")
    rb = rebound_factory("--retry-finish-timeout", "1s", upstream=pb.addr,
                         env=SMALL_QUARANTINE)
    c = a.RawClient(rb.port)
    alarmed = False
    try:
        c.send(a.PROTOCOL_HEADER)
        c.recv_method(a.CONNECTION_START)
        c.send(start_ok_blocked_capable())
        tune = c.recv_method(a.CONNECTION_TUNE).tune_args()
        c.send(a.tune_ok(tune[0], tune[1], 0) + a.connection_open())
        c.recv_method(a.CONNECTION_OPEN_OK)
        c.open_channel(1)
        c.send(fb.queue_declare(1, q, arguments=a.table(
            {"x-expires": 300000})))
        c.recv_method((50, 11))
        c.send(fb.publish(1, q, b"the original"))
        consume(c, 1, q, "held")
        assert c.recv_method((60, 60)).channel == 1
        assert c.recv_frame().type == a.FRAME_HEADER
        assert c.recv_frame().payload == b"the original"

        pb.ctl("set_vm_memory_high_watermark", "0.000001")
        alarmed = True
        rbtest.wait_until(lambda: "memory" in pb.ctl(
            "eval", "rabbit_alarm:get_alarms()."), 30,
            "the broker's memory alarm", interval=0.3)
        # rebound's copy goes to a broker that reads no more publishes
        c.send(fb.basic_nack(1, 1))
        rss0 = rb.rss_kib()
        pub = Publisher(c, TOTAL // BODY, BODY)
        pub.start()
        peak = rss0
        last, still_since = -1, time.monotonic()
        deadline = time.monotonic() + 60
        while not pub.done and pub.error is None and \
                time.monotonic() < deadline:
            time.sleep(0.1)
            peak = max(peak, rb.rss_kib())
            if pub.sent != last:
                last, still_since = pub.sent, time.monotonic()
            elif time.monotonic() - still_since > 2.0:
                break  # nobody reads the client any more
        grown_mib = (peak - rss0) / 1024
        sent_mib = pub.sent / (1 << 20)
        print("alarm: sent %.0f MiB, RSS +%.1f MiB, done=%s"
              % (sent_mib, grown_mib, pub.done))
    finally:
        try:
            c.sock.shutdown(2)
        except OSError:
            pass
        c.close()
        if alarmed:
            pb.ctl("set_vm_memory_high_watermark", "0.4")
    pub.join(10)
    assert grown_mib < GROWTH_BOUND_MIB, (
        "rebound's RSS grew by %.0f MiB while %.0f MiB waited behind a "
        "retry the broker could not confirm" % (grown_mib, sent_mib))
    assert not pub.done, "rebound read all %.0f MiB held behind the retry" \
        % sent_mib
    rb.wait_conn_sockets(0, timeout=30)
