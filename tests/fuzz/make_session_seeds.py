#!/usr/bin/env python3
"""Rebuild tests/fuzz/corpus/session/, the seeds of fuzz_session.

Input format (fuzz_session.c): a flags byte, then records
[op:1][len:2 big-endian][bytes]; op 0 the client sends, 1 the broker sends,
2 time passes (bytes[0] % 8 ms), 3 a side's writes fail, 4 a side's writes
stall, 5 a side hangs up, 6 a side sends its previous record again
(bytes[1] + 1 times). Flags bit 0: a valid handshake first (bits 1-2
channel-max 2047/2/3/10, bit 3 frame-max 4096, bit 4 a consumer of "q" as
"c" on channel 1); bit 5: the upstream refuses the connection.

golden-*: the recorded sessions of tests/amqp_codec/golden (real clients,
real RabbitMQ 3.10.8), client and broker streams interleaved the way the
conversation went: a client request is followed by the broker's frames up
to its answer, a client's settle of a delivery comes after that delivery,
a client's answer (start-ok, tune-ok, close-ok) after the broker's
request. Messages over 64 KiB are left out (the recordings' 300 KB ones),
so every seed stays small. No scripted handshake: the recording has its
own.

scenario-*: short sessions after the scripted handshake that reach the
retry path (a delivery nacked, the copy confirmed, refused, lost with
rebound's channel), the channel remap and yield, a client's close behind
a copy, write failures, stalls and hang-ups.

Deterministic: the same files on every run.
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "amqp_codec", "golden")
OUT = os.path.join(HERE, "corpus", "session")
BIG = 64 * 1024

sys.path.insert(0, GOLDEN)
import decode  # noqa: E402  (the golden recordings' own, spec-driven decoder)

METHODS, _ = decode.load_spec()
BY_NAME = {v[0]: (k, v[1]) for k, v in METHODS.items()}

CLIENT, BROKER, WAIT, WRITE_FAIL, STALL, HANG_UP, REPEAT = range(7)
# With flags bit 6 (--retry-connection separate), the same op + 133 (bit 7
# set, the same op modulo 7) acts on the retry connection's broker.
ON_PUB = 7 * 19


# ---- encoding ---------------------------------------------------------------

def enc_args(fields, args):
    out, bits, nbits = b"", 0, 0
    for name, t in fields:
        v = args.get(name, 0 if t not in ("shortstr", "longstr", "table")
                     else b"")
        if t == "bit":
            bits |= (1 if v else 0) << nbits
            nbits += 1
            continue
        if nbits:
            out += bytes([bits])
            bits = nbits = 0
        if isinstance(v, str):
            v = v.encode()
        if t == "octet":
            out += struct.pack(">B", v)
        elif t == "short":
            out += struct.pack(">H", v)
        elif t == "long":
            out += struct.pack(">I", v)
        elif t in ("longlong", "timestamp"):
            out += struct.pack(">Q", v)
        elif t == "shortstr":
            out += struct.pack(">B", len(v)) + v
        elif t in ("longstr", "table"):
            out += struct.pack(">I", len(v)) + v
        else:
            raise ValueError(t)
    if nbits:
        out += bytes([bits])
    return out


def frame(ftype, ch, payload):
    return struct.pack(">BHI", ftype, ch, len(payload)) + payload + b"\xce"


def method(ch, name, **args):
    (cid, mid), fields = BY_NAME[name]
    args = {k.replace("_", "-"): v for k, v in args.items()}
    return frame(1, ch, struct.pack(">HH", cid, mid) + enc_args(fields, args))


def content(ch, body):
    hdr = struct.pack(">HHQH", 60, 0, len(body), 0)
    return frame(2, ch, hdr) + (frame(3, ch, body) if body else b"")


def record(op, data=b""):
    out = b""
    while True:
        out += struct.pack(">BH", op, min(len(data), 0xFFFF)) + data[:0xFFFF]
        data = data[0xFFFF:]
        if not data:
            return out


# ---- the recordings ---------------------------------------------------------

def read_hex(path):
    with open(path) as f:
        return bytes.fromhex("".join(l.strip() for l in f
                                     if not l.startswith("#")))


class Frame:
    def __init__(self, raw):
        self.raw = raw
        self.type, self.ch, size = struct.unpack(">BHI", raw[:7])
        p = raw[7:7 + size]
        self.id = struct.unpack(">HH", p[:4]) if self.type == 1 else None
        self.name = METHODS[self.id][0] if self.id in METHODS else None
        self.tag = None
        if self.name in ("basic.deliver", "basic.get-ok", "basic.ack",
                         "basic.nack", "basic.reject"):
            off = 4
            if self.name == "basic.deliver":
                off += 1 + p[4]  # consumer-tag
            self.tag = struct.unpack(">Q", p[off:off + 8])[0]
        self.body_size = struct.unpack(">Q", p[4:12])[0] \
            if self.type == 2 else None


def split(data):
    off = 8 if data.startswith(b"AMQP") else 0
    out = []
    while off + 7 <= len(data):
        size = struct.unpack(">I", data[off + 3:off + 7])[0]
        out.append(Frame(data[off:off + 8 + size]))
        off += 8 + size
    return out


def messages(frames):
    """Group a content method with its header and bodies; drop messages
    whose body is over BIG."""
    out, i = [], 0
    while i < len(frames):
        f = frames[i]
        group = [f]
        i += 1
        if f.name and METHODS[f.id][2]:  # a content method
            while i < len(frames) and frames[i].type in (2, 3) and \
                    frames[i].ch == f.ch:
                group.append(frames[i])
                i += 1
            if len(group) > 1 and group[1].body_size > BIG:
                continue
        out.append(group)
    return out


ANSWERS = {"exchange.unbind": ("exchange.unbind-ok",),
           "basic.get": ("basic.get-ok", "basic.get-empty")}


def answers(name):
    if name in ANSWERS:
        return ANSWERS[name]
    return (name + "-ok",) if name + "-ok" in BY_NAME else ()


def interleave(client, server):
    """Records of one recorded session, in conversation order."""
    c = messages(client)
    s = messages(server)
    out = [record(CLIENT, b"AMQP\x00\x00\x09\x01")]
    si = 0

    def server_until(pred):
        nonlocal si
        for j in range(si, len(s)):
            if pred(s[j][0]):
                data = b"".join(f.raw for g in s[si:j + 1] for f in g)
                si = j + 1
                if data:
                    out.append(record(BROKER, data))
                return

    server_until(lambda f: f.name == "connection.start")
    for g in c:
        f = g[0]
        if f.name and f.name.endswith("-ok"):  # answers a broker request
            req = f.name[:-3]
            server_until(lambda x, r=req, ch=f.ch: x.name == r and x.ch == ch)
        elif f.tag is not None:  # settles a delivery
            server_until(lambda x, t=f.tag, ch=f.ch: x.ch == ch and
                         x.name in ("basic.deliver", "basic.get-ok") and
                         x.tag == t)
        out.append(record(CLIENT, b"".join(x.raw for x in g)))
        want = answers(f.name) if f.name else ()
        if want and not (f.name and f.name.endswith("-ok")):
            server_until(lambda x, w=want, ch=f.ch: x.name in w and
                         x.ch == ch)
    rest = b"".join(f.raw for g in s[si:] for f in g)
    if rest:
        out.append(record(BROKER, rest))
    return b"".join(out)


# ---- scenarios after the scripted handshake ---------------------------------

OWN = 2047  # rebound's channel with channel-max 2047


def deliver(tag, body=b"hello", ch=1):
    return method(ch, "basic.deliver", consumer_tag="c", delivery_tag=tag,
                  routing_key="q") + content(ch, body)


def scenarios():
    consumer = 1 | 16  # handshake, channel-max 2047, consumer c on 1
    yield "scenario-retry-confirmed", bytes([consumer]) + b"".join([
        record(BROKER, deliver(1)),
        record(CLIENT, method(1, "basic.nack", delivery_tag=1, requeue=1)),
        record(BROKER, method(OWN, "queue.declare-ok", queue="q.retry.2ms")),
        record(BROKER, method(OWN, "basic.ack", delivery_tag=1)),
        record(BROKER, deliver(2)),
        record(CLIENT, method(1, "basic.reject", delivery_tag=2, requeue=1)),
        record(BROKER, method(OWN, "basic.ack", delivery_tag=2)),
        record(CLIENT, method(1, "basic.ack", delivery_tag=2)),
    ])
    yield "scenario-retry-refused", bytes([consumer]) + b"".join([
        record(BROKER, deliver(1) + deliver(2) + deliver(3)),
        record(CLIENT, method(1, "basic.nack", delivery_tag=3, multiple=1,
                              requeue=1)),
        record(BROKER, method(OWN, "basic.nack", delivery_tag=1)),
        record(WAIT, b"\x07"),
        record(BROKER, method(OWN, "basic.ack", delivery_tag=3,
                              multiple=1)),
        record(BROKER, method(OWN, "basic.return", reply_code=312,
                              reply_text="NO_ROUTE", routing_key="q.retry.2ms")
               + content(OWN, b"hello")),
        record(WAIT, b"\x07"),
    ])
    yield "scenario-own-channel-lost", bytes([consumer]) + b"".join([
        record(BROKER, deliver(1)),
        record(CLIENT, method(1, "basic.nack", delivery_tag=1, requeue=1)),
        record(BROKER, method(OWN, "channel.close", reply_code=404,
                              reply_text="NOT_FOUND - home node of queue "
                              "'q.retry.2ms' in vhost '/' is down")),
        record(BROKER, method(OWN, "channel.open-ok")),
        record(BROKER, method(OWN, "confirm.select-ok")),
        record(BROKER, method(OWN, "basic.ack", delivery_tag=1)),
        record(BROKER, method(OWN, "channel.close", reply_code=406,
                              reply_text="PRECONDITION_FAILED - inequivalent "
                              "arg 'x-queue-type' for queue 'q.retry.2ms'")),
        record(WAIT, b"\x06"),
    ])
    yield "scenario-client-close-waits", bytes([consumer]) + b"".join([
        record(BROKER, deliver(1)),
        record(CLIENT, method(1, "basic.nack", delivery_tag=1, requeue=1) +
               method(1, "basic.publish", routing_key="x") +
               content(1, b"abc") +
               method(0, "connection.close", reply_code=200,
                      reply_text="Goodbye")),
        record(WAIT, b"\x07"),
        record(BROKER, method(OWN, "basic.ack", delivery_tag=1)),
        record(BROKER, method(0, "connection.close-ok")),
        record(HANG_UP, b"\x00"),
    ])
    yield "scenario-yield", bytes([1 | 1 << 1]) + b"".join([  # channel-max 2
        record(CLIENT, method(1, "channel.open")),
        record(BROKER, method(1, "channel.open-ok")),
        record(CLIENT, method(2, "channel.open")),
        record(BROKER, method(2, "channel.close-ok")),
        record(BROKER, method(2, "channel.open-ok")),
        record(CLIENT, method(2, "channel.close", reply_code=200)),
        record(BROKER, method(2, "channel.close-ok")),
    ])
    yield "scenario-remap", bytes([1 | 3 << 1 | 16]) + b"".join([  # max 10
        record(CLIENT, method(10, "channel.open")),
        record(BROKER, method(9, "channel.open-ok")),
        record(CLIENT, method(10, "basic.qos", prefetch_count=1)),
        record(BROKER, method(9, "basic.qos-ok")),
        record(BROKER, method(10, "basic.ack", delivery_tag=1)),
        record(BROKER, method(9, "channel.close", reply_code=406)),
        record(CLIENT, method(10, "channel.close-ok")),
    ])
    yield "scenario-write-failures", bytes([consumer]) + b"".join([
        record(BROKER, deliver(1)),
        record(CLIENT, method(1, "basic.nack", delivery_tag=1, requeue=1)),
        record(WRITE_FAIL, b"\x00"),
        record(BROKER, deliver(2)),
        record(HANG_UP, b"\x02"),
        record(BROKER, method(OWN, "basic.ack", delivery_tag=1)),
        record(WAIT, b"\x07"),
    ])
    yield "scenario-stall", bytes([consumer]) + b"".join([
        record(STALL, b"\x02\x00"),
        record(BROKER, b"".join(deliver(t, b"x" * 4000) for t in
                                range(1, 16))),
        record(CLIENT, method(1, "basic.nack", delivery_tag=15, multiple=1,
                              requeue=1)),
        record(STALL, b"\x00\x04"),
        record(BROKER, method(OWN, "basic.ack", delivery_tag=15,
                              multiple=1)),
        record(STALL, b"\x03\x00"),
        record(HANG_UP, b"\x01"),
    ])
    # a stalled client and a broker that keeps delivering: rebound stops
    # reading the broker at its high-water mark, and reads on once the
    # client takes what it was sent
    yield "scenario-flood", bytes([consumer]) + b"".join([
        record(STALL, b"\x00\x00"),
        record(STALL, b"\x02\x00"),
        record(BROKER, b"".join(deliver(t, b"y" * 2000) for t in
                                range(1, 32))),
        record(REPEAT, b"\x01\xff"),
        record(CLIENT, method(1, "basic.ack", delivery_tag=0, multiple=1)),
        record(REPEAT, b"\x00\x20"),
        record(STALL, b"\x00\x00"),
        record(WAIT, b"\x01"),
        record(HANG_UP, b"\x00"),
    ])
    separate = consumer | 64  # copies on the retry connection
    yield "scenario-separate-retry", bytes([separate | 128]) + b"".join([
        record(BROKER, deliver(1)),
        record(CLIENT, method(1, "basic.nack", delivery_tag=1, requeue=1)),
        record(WAIT, b"\x03"),
        record(BROKER, deliver(2) + deliver(3)),
        record(CLIENT, method(1, "basic.reject", delivery_tag=2, requeue=1) +
               method(1, "basic.nack", delivery_tag=3, multiple=1,
                      requeue=1)),
        record(WAIT, b"\x07"),
        record(CLIENT, method(0, "connection.close", reply_code=200,
                              reply_text="bye")),
    ])
    yield "scenario-separate-lost", bytes([separate]) + b"".join([
        record(BROKER, deliver(1)),
        record(CLIENT, method(1, "basic.nack", delivery_tag=1, requeue=1)),
        record(ON_PUB + BROKER, method(1, "basic.nack", delivery_tag=1)),
        record(WAIT, b"\x03"),
        record(ON_PUB + WRITE_FAIL, b"\x01"),
        record(BROKER, deliver(2)),
        record(CLIENT, method(1, "basic.nack", delivery_tag=2, requeue=1)),
        record(ON_PUB + WRITE_FAIL, b"\x07"),
        record(ON_PUB + HANG_UP, b"\x03"),
        record(WAIT, b"\x07"),
    ])
    yield "scenario-no-upstream", bytes([32]) + record(
        CLIENT, b"AMQP\x00\x00\x09\x01")
    yield "scenario-bad-header", bytes([0]) + record(CLIENT, b"GET / HTTP/1.1")


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in sorted(os.listdir(OUT)):
        if not name.startswith("regress-"):  # crash reproducers stay
            os.remove(os.path.join(OUT, name))
    for session in ("bunny", "kombu", "pika", "tools"):
        client = split(read_hex(os.path.join(GOLDEN, session + ".client.hex")))
        server = split(read_hex(os.path.join(GOLDEN, session + ".server.hex")))
        with open(os.path.join(OUT, "golden-" + session), "wb") as f:
            f.write(bytes([0]) + interleave(client, server))
    for name, data in scenarios():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
