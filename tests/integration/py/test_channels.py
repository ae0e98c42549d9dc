"""rebound's own channel (README, "Retries") as clients see it:
not at all. With --retry-connection shared it sits on the client's
upstream connection: a client that opens the number rebound holds gets it
(mapped upstream); a client that opens every negotiated channel gets them
all (rebound yields); many channels on one connection just work. With the
separate retry connection no number of the client's is ever taken."""

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

import amqp_raw as a
import rbtest
from conftest import PASS_THROUGH

EXPIRES = {"x-expires": 120000}


@pytest.fixture
def rebound(rebound_factory):
    """rebound with its channel on the client's connection (what these
    tests are about), no queue intercepted."""
    return rebound_factory(*PASS_THROUGH, "--retry-connection", "shared")


def roundtrip(ch, queue, body):
    """publish (confirmed if the channel is in confirm mode) + get."""
    ch.basic_publish("", queue, body, pika.BasicProperties(headers={"b": body}))
    m, props, got = ch.basic_get(queue, auto_ack=True)
    assert m is not None, "basic.get on channel %d found nothing" % ch.channel_number
    assert got == body and props.headers == {"b": body}
    return m


def only_upstream_port(rb):
    ports = rbtest.upstream_ports(rb)
    assert len(ports) == 1, "expected one upstream connection: %r" % rb.sockets()
    return ports.pop()


def test_separate_retry_connection_takes_no_number_and_opens_lazily(
        rebound_factory, broker, ctl, qname):
    """The default: rebound's channel is on a connection of its own. The
    client's highest number (the one rebound would hold on a shared
    connection) is not remapped; no second connection exists until the
    client consumes from an intercepted queue; then the broker sees one
    with one channel in confirm mode, logged in as the client's user; it
    goes when the client goes."""
    rb = rebound_factory("--retry-queues", qname)
    conn = rb.pika(broker)
    hi = conn.channel(2047)
    hi.queue_declare(qname, arguments=EXPIRES)
    roundtrip(hi, qname, b"on-2047")
    assert not rb.log_lines("channel_mapped")
    assert len(rbtest.upstream_ports(rb)) == 1, rb.sockets()
    assert not rb.log_lines("own_channel_ready")

    hi.basic_publish("", qname, b"kept")
    m = None
    for m, _, _ in hi.consume(qname, inactivity_timeout=10):
        break
    assert m is not None
    rb.wait_log("own_channel_ready")
    rbtest.wait_until(lambda: len(rbtest.upstream_ports(rb)) == 2, 10,
                      "the retry connection")
    ports = rbtest.upstream_ports(rb)
    chans = ctl.channels_by_port()
    pub = [p for p in ports if chans.get(p) == {1: True}]
    assert len(pub) == 1, (ports, chans)
    assert ctl.connections()[pub[0]]["user"] == broker.user
    hi.basic_ack(m.delivery_tag)
    hi.cancel()
    conn.close()
    rb.wait_conn_sockets(0, timeout=10)
    rbtest.wait_until(lambda: not (set(ctl.connections()) & ports), 15,
                      "the broker to drop both connections")


def test_client_opens_rebounds_channel_number(rebound, broker, ctl, qname):
    conn = rebound.pika(broker)
    ready = rebound.wait_log("own_channel_ready")
    own = int(ready["channel"])
    assert own == conn._impl.params.channel_max == 2047

    ch1 = conn.channel()
    ch1.queue_declare(qname, arguments=EXPIRES)
    hi = conn.channel(own)
    assert hi.channel_number == own
    mapped = rebound.wait_log("channel_mapped", client_channel=own)
    up = int(mapped["upstream_channel"])
    assert up != own

    # publish with confirms, consume, get: all on the colliding number
    hi.confirm_delivery()
    for i in range(50):
        hi.basic_publish("", qname, b"hi-%d" % i, mandatory=True)
    hi.basic_qos(prefetch_count=10)
    bodies = []
    for m, p, b in hi.consume(qname, inactivity_timeout=10):
        assert m is not None, "delivery on channel %d stalled" % own
        assert m.delivery_tag == len(bodies) + 1
        bodies.append(b)
        hi.basic_ack(m.delivery_tag)
        if len(bodies) == 50:
            break
    hi.cancel()
    assert bodies == [b"hi-%d" % i for i in range(50)]
    roundtrip(hi, qname, b"get-on-%d" % own)

    # the broker: the client's 2 channels + rebound's own, on the numbers
    # the log says; rebound's own is in confirm mode
    port = only_upstream_port(rebound)
    assert ctl.connections()[port]["channels"] == 2 + 1
    chans = ctl.channels_by_port()[port]
    assert set(chans) == {1, up, own}
    assert chans[own] is True, "rebound's own channel is not in confirm mode"
    assert chans[up] is True  # the client's confirm.select went to its channel

    # a channel error on the mapped channel reaches the client with the
    # client's number, and the number can be opened again
    with pytest.raises(ChannelClosedByBroker) as ei:
        hi.queue_declare(rbtest.uniq("missing"), passive=True)
    assert ei.value.reply_code == 404
    assert not hi.is_open and conn.is_open
    hi = conn.channel(own)
    roundtrip(hi, qname, b"after-404")
    # the client now also takes the number its 2047 travels on
    ch_up = conn.channel(up)
    roundtrip(ch_up, qname, b"on-%d" % up)
    assert len(rebound.log_lines("channel_mapped")) >= 3
    assert ctl.connections()[port]["channels"] == 3 + 1

    ch1.queue_delete(qname)
    conn.close()
    rebound.wait_conn_sockets(0)


def test_client_opens_every_channel_rebound_yields(rebound, broker, ctl):
    conn = rebound.pika(broker, channel_max=16)
    assert conn._impl.params.channel_max == 16
    line = rebound.wait_log("session_open")
    assert line["channel_max"] == "16"
    assert rebound.wait_log("own_channel_ready")["channel"] == "16"

    channels = [conn.channel() for _ in range(16)]
    assert [c.channel_number for c in channels] == list(range(1, 17))
    yielded = rebound.wait_log("own_channel_yielded")
    assert yielded["channel"] == "16"

    queues = []
    for c in channels:
        q = rbtest.uniq("yield-%d" % c.channel_number)
        c.queue_declare(q, arguments=EXPIRES, auto_delete=True)
        queues.append(q)
        c.confirm_delivery()
        roundtrip(c, q, b"on-%d" % c.channel_number)

    port = only_upstream_port(rebound)
    assert ctl.connections()[port]["channels"] == 16
    assert set(ctl.channels_by_port()[port]) == set(range(1, 17))

    # a number comes free: rebound takes its channel back on it...
    channels[4].close()
    back = rebound.wait_log("own_channel_ready", channel=5)
    assert back
    assert ctl.connections()[port]["channels"] == 16  # 15 of the client + own
    # ...and yields it again when the client reopens it
    c5 = conn.channel(5)
    rbtest.wait_until(lambda: len(rebound.log_lines("own_channel_yielded")) == 2,
                      10, "a second own_channel_yielded")
    roundtrip(c5, queues[4], b"reopened-5")
    for c, q in zip(channels, queues):
        if c.is_open:
            roundtrip(c, q, b"again-%d" % c.channel_number)
    assert ctl.connections()[port]["channels"] == 16
    for c, q in zip(channels, queues):
        if c.is_open:
            c.queue_delete(q)
    c5.queue_delete(queues[4])
    conn.close()
    rebound.wait_conn_sockets(0)


def test_200_channels_on_one_connection(rebound, broker, ctl):
    conn = rebound.pika(broker)
    channels = [conn.channel() for _ in range(200)]
    assert sorted(c.channel_number for c in channels) == list(range(1, 201))
    for c in channels:
        q = c.queue_declare("", exclusive=True).method.queue
        c.basic_publish("", q, b"ch-%d" % c.channel_number)
        m, _, body = c.basic_get(q, auto_ack=True)
        assert body == b"ch-%d" % c.channel_number
    port = only_upstream_port(rebound)
    assert ctl.connections()[port]["channels"] == 200 + 1
    for c in channels:
        c.close()
    assert ctl.connections()[port]["channels"] == 1  # rebound's own only
    conn.close()
    rebound.wait_conn_sockets(0)
    assert not rebound.log_lines("channel_mapped")


def test_channel_open_pipelined_behind_connection_open(rebound, broker):
    """A client may send channel.open right behind connection.open without
    waiting for open-ok (the broker accepts it). Through rebound the
    channel must open and work, even on the number rebound would pick for
    itself (2047)."""
    c = a.RawClient(rebound.port)
    try:
        c.send(a.PROTOCOL_HEADER)
        c.recv_method(a.CONNECTION_START)
        c.send(a.start_ok(broker.user, broker.password))
        cmax, fmax, _ = c.recv_method(a.CONNECTION_TUNE).tune_args()
        c.send(a.tune_ok(cmax, fmax, 0))
        c.send(a.connection_open(broker.vhost) + a.channel_open(cmax)
               + a.channel_open(1))
        c.recv_method(a.CONNECTION_OPEN_OK)
        got = [c.recv_method(timeout=5) for _ in range(2)]
        closes = [f.close_args() for f in got if f.method == a.CONNECTION_CLOSE]
        assert not closes, "connection closed: %r" % (closes,)
        assert sorted((f.channel, f.method) for f in got) == \
            [(1, a.CHANNEL_OPEN_OK), (cmax, a.CHANNEL_OPEN_OK)]
        c.send(a.connection_close())
        c.recv_method(a.CONNECTION_CLOSE_OK)
    finally:
        c.close()
    rebound.wait_conn_sockets(0)


@pytest.mark.parametrize("channel_max", [1, 2])
def test_yield_while_rebounds_channel_is_still_opening(rebound, broker, ctl,
                                                       channel_max):
    """The client opens every channel at once, right after open-ok, while
    rebound's own channel is still being opened: every channel.open is
    answered, and the broker ends up with exactly the client's channels."""
    c = a.RawClient(rebound.port)
    try:
        c.handshake(broker.user, broker.password, broker.vhost,
                    channel_max=channel_max)
        c.send(b"".join(a.channel_open(n) for n in range(1, channel_max + 1)))
        got = sorted((f.channel, f.method)
                     for f in (c.recv_method(timeout=5) for _ in range(channel_max)))
        assert got == [(n, a.CHANNEL_OPEN_OK) for n in range(1, channel_max + 1)]
        rebound.wait_log("own_channel_yielded", channel=channel_max)
        (port,) = rbtest.upstream_ports(rebound)
        assert set(ctl.channels_by_port()[port]) == set(range(1, channel_max + 1))
        c.send(a.connection_close())
        c.recv_method(a.CONNECTION_CLOSE_OK)
    finally:
        c.close()
    rebound.wait_conn_sockets(0)
