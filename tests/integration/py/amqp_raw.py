"""A tiny AMQP 0-9-1 client speaking raw frames, for the tests that need to
send what no client library sends (bad headers, malformed frames) or need
hundreds of cheap connections.

Only what the tests use is here: the connection handshake (PLAIN), channel
open, connection.close / close-ok, and frame encoding/decoding. Everything is
written from the 0-9-1 spec, independently of rebound's codec.
"""
import asyncio
import socket
import struct
import time

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = 0xCE
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8

CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
BASIC_PUBLISH = (60, 40)


class ProtocolError(Exception):
    pass


# ---- encoding ---------------------------------------------------------------


def shortstr(s):
    if isinstance(s, str):
        s = s.encode()
    assert len(s) < 256
    return struct.pack(">B", len(s)) + s


def longstr(s):
    if isinstance(s, str):
        s = s.encode()
    return struct.pack(">I", len(s)) + s


def table(d):
    out = b""
    for k, v in d.items():
        out += shortstr(k)
        if isinstance(v, bool):
            out += b"t" + struct.pack(">B", 1 if v else 0)
        elif isinstance(v, int):
            out += b"I" + struct.pack(">i", v)
        elif isinstance(v, dict):
            out += b"F" + table(v)
        else:
            out += b"S" + longstr(v)
    return struct.pack(">I", len(out)) + out


def frame(ftype, channel, payload, end=FRAME_END):
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes([end])


def method(channel, cm, args=b""):
    return frame(FRAME_METHOD, channel, struct.pack(">HH", *cm) + args)


def start_ok(user="guest", password="guest", name="rebound-raw-test"):
    props = table({"product": "rebound-tests-raw", "connection_name": name,
                   "capabilities": {"connection.blocked": False}})
    resp = b"\x00" + user.encode() + b"\x00" + password.encode()
    return method(0, CONNECTION_START_OK,
                  props + shortstr("PLAIN") + longstr(resp) + shortstr("en_US"))


def tune_ok(channel_max, frame_max, heartbeat):
    return method(0, CONNECTION_TUNE_OK,
                  struct.pack(">HIH", channel_max, frame_max, heartbeat))


def connection_open(vhost="/"):
    return method(0, CONNECTION_OPEN, shortstr(vhost) + shortstr("") + b"\x00")


def connection_close(code=200, text="bye", class_id=0, method_id=0):
    return method(0, CONNECTION_CLOSE,
                  struct.pack(">H", code) + shortstr(text)
                  + struct.pack(">HH", class_id, method_id))


def connection_close_ok():
    return method(0, CONNECTION_CLOSE_OK)


def channel_open(ch):
    return method(ch, CHANNEL_OPEN, shortstr(""))


def basic_publish(ch, exchange, routing_key):
    return method(ch, BASIC_PUBLISH,
                  struct.pack(">H", 0) + shortstr(exchange) + shortstr(routing_key)
                  + b"\x00")


def basic_consume(ch, queue, tag="", no_ack=False):
    return method(ch, (60, 20),
                  struct.pack(">H", 0) + shortstr(queue) + shortstr(tag)
                  + bytes([0x02 if no_ack else 0]) + table({}))


def content_header(ch, body_size, class_id=60):
    return frame(FRAME_HEADER, ch,
                 struct.pack(">HHQH", class_id, 0, body_size, 0))


HEARTBEAT = frame(FRAME_HEARTBEAT, 0, b"")


# ---- decoding ---------------------------------------------------------------


class Frame:
    def __init__(self, ftype, channel, payload):
        self.type = ftype
        self.channel = channel
        self.payload = payload

    @property
    def method(self):
        if self.type != FRAME_METHOD:
            return None
        return struct.unpack(">HH", self.payload[:4])

    def close_args(self):
        """(reply_code, reply_text, class_id, method_id) of connection.close."""
        p = self.payload[4:]
        code = struct.unpack(">H", p[:2])[0]
        n = p[2]
        text = p[3:3 + n].decode("utf-8", "replace")
        cls, meth = struct.unpack(">HH", p[3 + n:7 + n])
        return code, text, cls, meth

    def tune_args(self):
        return struct.unpack(">HIH", self.payload[4:12])

    def __repr__(self):
        return "Frame(type=%d, channel=%d, method=%r, %d bytes)" % (
            self.type, self.channel, self.method, len(self.payload))


def parse_frame(buf):
    """(Frame, consumed) or (None, 0) when more bytes are needed."""
    if len(buf) < 7:
        return None, 0
    ftype, ch, size = struct.unpack(">BHI", buf[:7])
    if len(buf) < 8 + size:
        return None, 0
    if buf[7 + size] != FRAME_END:
        raise ProtocolError("bad frame end from peer: %r" % buf[:16])
    return Frame(ftype, ch, bytes(buf[7:7 + size])), 8 + size


# ---- blocking client --------------------------------------------------------


class RawClient:
    """One blocking socket to rebound (or a broker)."""

    def __init__(self, port, host="127.0.0.1", timeout=10, rcvbuf=None):
        if rcvbuf is None:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        else:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.settimeout(timeout)
            self.sock.connect((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.eof = False
        self.local_port = self.sock.getsockname()[1]

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no data from peer in time")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            raise TimeoutError("no data from peer in time")
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            raise EOFError("peer closed the connection")
        self.buf += data

    def recv_frame(self, timeout=10):
        deadline = time.monotonic() + timeout
        while True:
            f, n = parse_frame(self.buf)
            if f is not None:
                self.buf = self.buf[n:]
                return f
            self._fill(deadline)

    def recv_method(self, expect=None, timeout=10, skip_heartbeats=True):
        deadline = time.monotonic() + timeout
        while True:
            f = self.recv_frame(max(0.001, deadline - time.monotonic()))
            if skip_heartbeats and f.type == FRAME_HEARTBEAT:
                continue
            if expect is not None and f.method != expect:
                raise ProtocolError("expected %r, got %r" % (expect, f))
            return f

    def read_until_eof(self, timeout=10):
        """Every byte until the peer closes; raises TimeoutError if it does
        not close in time."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            try:
                self._fill(deadline)
            except EOFError:
                break
        data, self.buf = self.buf, b""
        return data

    def wait_eof(self, timeout=10):
        """Wait for the peer to close, discarding frames. Returns seconds
        waited."""
        t0 = time.monotonic()
        self.read_until_eof(timeout)
        return time.monotonic() - t0

    def handshake(self, user="guest", password="guest", vhost="/",
                  channel_max=None, frame_max=None, heartbeat=0,
                  name="rebound-raw-test"):
        """Full connection handshake; returns the broker's tune offer
        (channel_max, frame_max, heartbeat). channel_max and frame_max
        default to what the broker offers."""
        self.send(PROTOCOL_HEADER)
        self.recv_method(CONNECTION_START)
        self.send(start_ok(user, password, name))
        tune = self.recv_method(CONNECTION_TUNE).tune_args()
        self.send(tune_ok(tune[0] if channel_max is None else channel_max,
                          tune[1] if frame_max is None else frame_max,
                          heartbeat))
        self.send(connection_open(vhost))
        self.recv_method(CONNECTION_OPEN_OK)
        return tune

    def open_channel(self, ch):
        self.send(channel_open(ch))
        f = self.recv_method()
        if f.method != CHANNEL_OPEN_OK or f.channel != ch:
            raise ProtocolError("channel.open %d answered with %r" % (ch, f))

    def expect_connection_close(self, timeout=10):
        """Read until connection.close arrives; returns its arguments."""
        deadline = time.monotonic() + timeout
        while True:
            f = self.recv_method(timeout=max(0.001, deadline - time.monotonic()))
            if f.channel == 0 and f.method == CONNECTION_CLOSE:
                return f.close_args()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


# ---- asyncio client (many connections) --------------------------------------


async def _read_frame(reader):
    hdr = await reader.readexactly(7)
    ftype, ch, size = struct.unpack(">BHI", hdr)
    rest = await reader.readexactly(size + 1)
    if rest[-1] != FRAME_END:
        raise ProtocolError("bad frame end")
    return Frame(ftype, ch, rest[:-1])


async def _read_method(reader, expect):
    while True:
        f = await _read_frame(reader)
        if f.type == FRAME_HEARTBEAT:
            continue
        if f.method != expect:
            raise ProtocolError("expected %r, got %r" % (expect, f))
        return f


async def async_open(port, name, user="guest", password="guest", vhost="/",
                     host="127.0.0.1"):
    """Open one AMQP connection (handshake done, heartbeat off). Returns
    (reader, writer)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(PROTOCOL_HEADER)
    await _read_method(reader, CONNECTION_START)
    writer.write(start_ok(user, password, name))
    offer = (await _read_method(reader, CONNECTION_TUNE)).tune_args()
    writer.write(tune_ok(offer[0], offer[1], 0))
    writer.write(connection_open(vhost))
    await writer.drain()
    await _read_method(reader, CONNECTION_OPEN_OK)
    return reader, writer


async def async_close(reader, writer, clean=True):
    """Close a connection: connection.close + close-ok when clean, a bare TCP
    close otherwise. Returns the close-ok frame (clean) or None."""
    ok = None
    if clean:
        writer.write(connection_close())
        await writer.drain()
        ok = await _read_method(reader, CONNECTION_CLOSE_OK)
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass
    return ok
