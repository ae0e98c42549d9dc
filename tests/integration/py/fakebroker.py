"""A small AMQP 0-9-1 broker in Python that a test controls, for what a
real RabbitMQ never does: announce an absurd body size, never confirm a
publish, deliver exactly the frames a test wants.

It speaks just enough for rebound and a raw client: the connection
handshake (any credentials), channel.open/close, confirm.select,
queue/exchange declares and binds, basic.qos, basic.consume/cancel,
basic.get (always empty), publishes (recorded, and confirmed or not), and
it records every method it receives. Each connection has a reader thread;
a test pushes frames with FakeConn.send() from its own thread.

Also here: the encoders the hardening tests need on the client side
(basic.deliver, content headers with properties, settles, nested tables),
written from the 0-9-1 spec like amqp_raw.py.
"""
import itertools
import socket
import struct
import threading
import time

import amqp_raw as a

# ---- encoding (both sides) --------------------------------------------------


def bits(*flags):
    v = 0
    for i, f in enumerate(flags):
        if f:
            v |= 1 << i
    return bytes([v])


def field_table(entries):
    """A field table from [(name, type_char, encoded_value_bytes)]."""
    out = b"".join(a.shortstr(k) + t.encode() + v for k, t, v in entries)
    return struct.pack(">I", len(out)) + out


def nested_table(depth):
    """A table nesting `depth` tables: {"k": {"k": ... {}}}."""
    t = struct.pack(">I", 0)
    for _ in range(depth):
        t = field_table([("k", "F", t)])
    return t


def props_headers(headers_table, delivery_mode=None):
    """Content-header properties with a headers table (and a delivery
    mode): (flags, encoded)."""
    flags = 1 << 13
    out = headers_table
    if delivery_mode is not None:
        flags |= 1 << 12
        out += bytes([delivery_mode])
    return flags, out


def content_header(ch, body_size, flags=0, props=b"", class_id=60):
    return a.frame(a.FRAME_HEADER, ch,
                   struct.pack(">HHQH", class_id, 0, body_size, flags) + props)


def body_frames(ch, body, frame_max):
    step = frame_max - 8
    return b"".join(a.frame(a.FRAME_BODY, ch, body[i:i + step])
                    for i in range(0, len(body), step))


def basic_deliver(ch, consumer_tag, delivery_tag, exchange="", routing_key="",
                  redelivered=False):
    return a.method(ch, (60, 60), a.shortstr(consumer_tag)
                    + struct.pack(">Q", delivery_tag) + bits(redelivered)
                    + a.shortstr(exchange) + a.shortstr(routing_key))


def basic_consume(ch, queue, tag="", no_ack=False, no_wait=False,
                  arguments=None):
    return a.method(ch, (60, 20), struct.pack(">H", 0) + a.shortstr(queue)
                    + a.shortstr(tag) + bits(False, no_ack, False, no_wait)
                    + (arguments if arguments is not None else a.table({})))


def basic_get_ok(ch, delivery_tag, exchange="", routing_key="",
                 message_count=0):
    return a.method(ch, (60, 71), struct.pack(">Q", delivery_tag) + b"\x00"
                    + a.shortstr(exchange) + a.shortstr(routing_key)
                    + struct.pack(">I", message_count))


def basic_return(ch, code, text, exchange, routing_key):
    return a.method(ch, (60, 50), struct.pack(">H", code) + a.shortstr(text)
                    + a.shortstr(exchange) + a.shortstr(routing_key))


def basic_get(ch, queue, no_ack=False):
    return a.method(ch, (60, 70), struct.pack(">H", 0) + a.shortstr(queue)
                    + bits(no_ack))


def basic_ack(ch, tag, multiple=False):
    return a.method(ch, (60, 80), struct.pack(">Q", tag) + bits(multiple))


def basic_nack(ch, tag, requeue=True, multiple=False):
    return a.method(ch, (60, 120), struct.pack(">Q", tag)
                    + bits(multiple, requeue))


def basic_reject(ch, tag, requeue=True):
    return a.method(ch, (60, 90), struct.pack(">Q", tag) + bits(requeue))


def publish(ch, routing_key, body, frame_max=131072, exchange="", flags=0,
            props=b""):
    """basic.publish + content header + body frames."""
    return (a.basic_publish(ch, exchange, routing_key)
            + content_header(ch, len(body), flags, props)
            + body_frames(ch, body, frame_max))


def queue_declare(ch, queue, durable=False, auto_delete=False, arguments=None):
    return a.method(ch, (50, 10), struct.pack(">H", 0) + a.shortstr(queue)
                    + bits(False, durable, False, auto_delete, False)
                    + (arguments if arguments is not None else a.table({})))


def channel_close(ch, code=200, text="bye"):
    return a.method(ch, (20, 40), struct.pack(">H", code) + a.shortstr(text)
                    + struct.pack(">HH", 0, 0))


# ---- decoding ---------------------------------------------------------------


class Reader:
    """Reads the fields of one method's arguments in order."""

    def __init__(self, payload):
        self.p = payload
        self.off = 4
        self.bitbyte = None
        self.bitpos = 0

    def _take(self, n):
        self.bitbyte = None
        v = self.p[self.off:self.off + n]
        if len(v) != n:
            raise a.ProtocolError("short method arguments")
        self.off += n
        return v

    def octet(self):
        return self._take(1)[0]

    def short(self):
        return struct.unpack(">H", self._take(2))[0]

    def long(self):
        return struct.unpack(">I", self._take(4))[0]

    def longlong(self):
        return struct.unpack(">Q", self._take(8))[0]

    def shortstr(self):
        n = self.octet()
        return self._take(n).decode("utf-8", "replace")

    def longstr(self):
        return self._take(self.long())

    table = longstr  # kept raw

    def bit(self):
        if self.bitbyte is None or self.bitpos == 8:
            b = self._take(1)[0]
            self.bitbyte, self.bitpos = b, 0
        v = bool(self.bitbyte >> self.bitpos & 1)
        self.bitpos += 1
        return v


# class/method -> (name, [(field, reader)])
_S, _L, _Q, _B, _O, _T, _H, _X = ("shortstr", "long", "longlong", "bit",
                                  "octet", "table", "short", "longstr")
METHODS = {
    (10, 11): ("connection.start-ok", [("props", _T), ("mechanism", _S),
                                       ("response", _X), ("locale", _S)]),
    (10, 31): ("connection.tune-ok", [("channel_max", _H), ("frame_max", _L),
                                      ("heartbeat", _H)]),
    (10, 40): ("connection.open", [("vhost", _S)]),
    (10, 50): ("connection.close", [("code", _H), ("text", _S),
                                    ("class_id", _H), ("method_id", _H)]),
    (10, 51): ("connection.close-ok", []),
    (20, 10): ("channel.open", []),
    (20, 40): ("channel.close", [("code", _H), ("text", _S)]),
    (20, 41): ("channel.close-ok", []),
    (40, 10): ("exchange.declare", [("reserved", _H), ("exchange", _S)]),
    (50, 10): ("queue.declare", [("reserved", _H), ("queue", _S),
                                 ("passive", _B), ("durable", _B),
                                 ("exclusive", _B), ("auto_delete", _B),
                                 ("no_wait", _B), ("arguments", _T)]),
    (50, 20): ("queue.bind", [("reserved", _H), ("queue", _S)]),
    (60, 10): ("basic.qos", []),
    (60, 20): ("basic.consume", [("reserved", _H), ("queue", _S), ("tag", _S),
                                 ("no_local", _B), ("no_ack", _B),
                                 ("exclusive", _B), ("no_wait", _B),
                                 ("arguments", _T)]),
    (60, 30): ("basic.cancel", [("tag", _S), ("no_wait", _B)]),
    (60, 40): ("basic.publish", [("reserved", _H), ("exchange", _S),
                                 ("routing_key", _S), ("mandatory", _B)]),
    (60, 60): ("basic.deliver", [("tag", _S), ("delivery_tag", _Q),
                                 ("redelivered", _B), ("exchange", _S),
                                 ("routing_key", _S)]),
    (60, 70): ("basic.get", [("reserved", _H), ("queue", _S), ("no_ack", _B)]),
    (60, 71): ("basic.get-ok", [("delivery_tag", _Q), ("redelivered", _B),
                                ("exchange", _S), ("routing_key", _S),
                                ("message_count", _L)]),
    (60, 80): ("basic.ack", [("tag", _Q), ("multiple", _B)]),
    (60, 90): ("basic.reject", [("tag", _Q), ("requeue", _B)]),
    (60, 110): ("basic.recover", []),
    (60, 120): ("basic.nack", [("tag", _Q), ("multiple", _B),
                               ("requeue", _B)]),
    (85, 10): ("confirm.select", [("no_wait", _B)]),
}


def decode_method(payload):
    """(name, {field: value}) of a method frame's payload."""
    cm = struct.unpack(">HH", payload[:4])
    name, fields = METHODS.get(cm, ("%d.%d" % cm, []))
    r = Reader(payload)
    args = {}
    for fname, kind in fields:
        args[fname] = getattr(r, kind)()
    return name, args


# ---- the broker -------------------------------------------------------------


_order = itertools.count(1)


class Event:
    """One method the fake broker received; `n` orders events and
    messages of a connection as they arrived."""

    def __init__(self, ch, name, args):
        self.n = next(_order)
        self.t = time.monotonic()
        self.ch = ch
        self.name = name
        self.args = args

    def __repr__(self):
        return "Event(ch=%d, %s, %r)" % (self.ch, self.name, self.args)


class Message:
    """One publish the fake broker received (the body's first bytes only:
    tests publish hundreds of MiB)."""

    KEEP = 64

    def __init__(self, ch, args):
        self.ch = ch
        self.routing_key = args["routing_key"]
        self.exchange = args["exchange"]
        self.header = None
        self.size = None
        self.have = 0
        self.head = b""
        self.t = None  # when its last frame arrived
        self.n = None  # its place among the connection's events

    @property
    def complete(self):
        return self.size is not None and self.have == self.size

    def __repr__(self):
        return "Message(ch=%d, rk=%r, %r/%r bytes, head=%r)" % (
            self.ch, self.routing_key, self.have, self.size, self.head[:16])


class FakeConn:
    """One connection accepted by the fake broker (normally rebound's
    upstream connection for one client session)."""

    def __init__(self, broker, sock):
        self.broker = broker
        self.sock = sock
        self.lock = threading.Lock()  # serialises sends
        self.cond = threading.Condition()
        self.events = []
        self.messages = []
        self.client_props = b""
        self.tune_ok = None
        self.confirm_channels = {}  # channel -> next publish seq
        self.closed = False  # EOF or error on the socket
        self.error = None
        self._partial = {}  # channel -> Message awaiting content
        self._consumer_n = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    # -- sending
    def send(self, data):
        with self.lock:
            try:
                self.sock.sendall(data)
            except OSError as e:
                self.error = self.error or e

    def method(self, ch, cm, args=b""):
        self.send(a.method(ch, cm, args))

    # -- waiting
    def wait(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                v = pred()
                if v:
                    return v
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        "fake broker: timed out after %.1fs waiting for %s; "
                        "last events %r" % (timeout, what() if callable(what)
                                            else what, self.events[-8:]))
                self.cond.wait(min(left, 0.2))

    def find(self, name, **args):
        return [e for e in self.events if e.name == name and
                all(e.args.get(k) == v for k, v in args.items())]

    def wait_event(self, name, timeout=10, **args):
        return self.wait(lambda: self.find(name, **args), timeout,
                         "%s %r" % (name, args))[0]

    def wait_closed(self, timeout=10):
        self.wait(lambda: self.closed, timeout, "the peer to close")

    # -- reading
    def _run(self):
        buf = bytearray()
        try:
            self.sock.settimeout(None)
            hdr = self._recv_exact(buf, 8)
            if hdr != a.PROTOCOL_HEADER:
                return
            del buf[:8]
            self._send_start()
            while True:
                data = self.sock.recv(1 << 20)
                if not data:
                    break
                buf += data
                off = 0
                while True:
                    if len(buf) - off < 7:
                        break
                    ftype, ch, size = struct.unpack_from(">BHI", buf, off)
                    if len(buf) - off < size + 8:
                        break
                    payload = bytes(buf[off + 7:off + 7 + size])
                    off += size + 8
                    self._frame(ftype, ch, payload)
                del buf[:off]
        except OSError as e:
            self.error = e
        finally:
            with self.cond:
                self.closed = True
                self.cond.notify_all()
            try:
                self.sock.close()
            except OSError:
                pass

    def _recv_exact(self, buf, n):
        while len(buf) < n:
            data = self.sock.recv(65536)
            if not data:
                raise OSError("EOF during the protocol header")
            buf += data
        return bytes(buf[:n])

    def _send_start(self):
        props = a.table({"product": "rebound-fake-broker", "version": "0",
                         "capabilities": {"publisher_confirms": True,
                                          "basic.nack": True,
                                          "consumer_cancel_notify": True}})
        self.method(0, a.CONNECTION_START, b"\x00\x09" + props
                    + a.longstr("PLAIN AMQPLAIN") + a.longstr("en_US"))

    def _frame(self, ftype, ch, payload):
        if ftype == a.FRAME_METHOD:
            name, args = decode_method(payload)
            ev = Event(ch, name, args)
            self._method(ev)
            with self.cond:
                self.events.append(ev)
                self.cond.notify_all()
        elif ftype in (a.FRAME_HEADER, a.FRAME_BODY):
            self._content(ftype, ch, payload)

    def _content(self, ftype, ch, payload):
        m = self._partial.get(ch)
        if m is None:
            return
        if ftype == a.FRAME_HEADER:
            m.size = struct.unpack(">Q", payload[4:12])[0]
            m.header = payload
        else:
            m.have += len(payload)
            if len(m.head) < Message.KEEP:
                m.head += payload[:Message.KEEP - len(m.head)]
        if m.complete:
            m.t = time.monotonic()
            m.n = next(_order)
            del self._partial[ch]
            with self.cond:
                self.messages.append(m)
                self.cond.notify_all()
            seq = self.confirm_channels.get(ch)
            if seq is not None:
                self.confirm_channels[ch] = seq + 1
                answer = self.broker.confirm
                if callable(answer):
                    answer = answer(self, ch, m)
                if answer == "nack":
                    self.send(a.method(ch, (60, 120), struct.pack(">Q", seq)
                                       + b"\x00"))
                elif answer:
                    self.send(a.method(ch, (60, 80), struct.pack(">Q", seq)
                                       + b"\x00"))

    def _method(self, ev):
        ch, name, args = ev.ch, ev.name, ev.args
        if name == "connection.start-ok":
            self.client_props = args["props"]
            b = self.broker
            if b.on_login and b.on_login(self):
                return  # answered (or refused) by the test
            self.method(0, a.CONNECTION_TUNE, struct.pack(
                ">HIH", b.channel_max, b.frame_max, b.heartbeat))
        elif name == "connection.tune-ok":
            self.tune_ok = args
        elif name == "connection.open":
            self.method(0, a.CONNECTION_OPEN_OK, a.shortstr(""))
        elif name == "connection.close":
            self.method(0, a.CONNECTION_CLOSE_OK)
        elif name == "channel.open":
            self.method(ch, a.CHANNEL_OPEN_OK, a.longstr(""))
        elif name == "channel.close":
            self.confirm_channels.pop(ch, None)
            self.method(ch, (20, 41))
        elif name == "confirm.select":
            self.confirm_channels[ch] = 1
            if not args["no_wait"]:
                self.method(ch, (85, 11))
        elif name == "exchange.declare":
            self.method(ch, (40, 11))
        elif name == "queue.declare":
            if self.broker.on_declare and self.broker.on_declare(self, ch,
                                                                 args):
                return  # answered (or refused) by the test
            if not args["no_wait"]:
                self.method(ch, (50, 11), a.shortstr(args["queue"])
                            + struct.pack(">II", 0, 0))
        elif name == "queue.bind":
            self.method(ch, (50, 21))
        elif name == "basic.qos":
            self.method(ch, (60, 11))
        elif name == "basic.consume":
            if not args["tag"]:
                self._consumer_n += 1
                args["tag"] = "amq.ctag-fake-%d" % self._consumer_n
            if not args["no_wait"]:
                self.method(ch, (60, 21), a.shortstr(args["tag"]))
            if self.broker.on_consume:
                self.broker.on_consume(self, ch, args)
        elif name == "basic.cancel":
            if not args["no_wait"]:
                self.method(ch, (60, 31), a.shortstr(args["tag"]))
        elif name == "basic.get":
            if self.broker.on_get and self.broker.on_get(self, ch, args):
                return  # answered by the test
            self.method(ch, (60, 72), a.shortstr(""))
        elif name == "basic.publish":
            self._partial[ch] = Message(ch, args)

    # -- scenario helpers
    def deliver(self, ch, consumer_tag, delivery_tag, body, flags=0, props=b"",
                routing_key="rk", exchange="ex"):
        """A well-formed delivery of `body`."""
        self.send(basic_deliver(ch, consumer_tag, delivery_tag, exchange,
                                routing_key)
                  + content_header(ch, len(body), flags, props)
                  + body_frames(ch, body, self.broker.frame_max))

    def published(self, routing_key=None):
        with self.cond:
            return [m for m in self.messages
                    if routing_key is None or m.routing_key == routing_key]


class FakeBroker:
    """Listens on 127.0.0.1 (a free port); every accepted connection gets a
    FakeConn. `confirm`: what publishes on a channel in confirm mode get:
    True a basic.ack, "nack" a basic.nack, False nothing; or a function
    (conn, channel, message) returning one of those, per publish. `on_consume(conn, channel, args)` runs on the connection's
    reader thread after consume-ok was sent (args["tag"] is the consumer
    tag). `on_declare(conn, channel, args)` runs for each queue.declare
    first; if it returns true it has answered it (e.g. closed the
    channel) and the usual declare-ok is not sent. `on_get` does the same
    for basic.get (default: get-empty), and `on_login(conn)` for
    connection.start-ok (conn.client_props is set; default: tune)."""

    def __init__(self, channel_max=2047, frame_max=131072, heartbeat=0,
                 confirm=True, on_consume=None, on_declare=None, on_get=None,
                 on_login=None):
        self.channel_max = channel_max
        self.frame_max = frame_max
        self.heartbeat = heartbeat
        self.confirm = confirm
        self.on_consume = on_consume
        self.on_declare = on_declare
        self.on_get = on_get
        self.on_login = on_login
        self.conns = []
        self.cond = threading.Condition()
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self._stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def addr(self):
        return "127.0.0.1:%d" % self.port

    def _accept(self):
        while not self._stopping:
            try:
                sock, _ = self.lsock.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = FakeConn(self, sock)
            with self.cond:
                self.conns.append(c)
                self.cond.notify_all()
            c.thread.start()

    def wait_conn(self, name, timeout=10):
        """The connection whose client properties name it `name` (rebound
        passes the client's start-ok through; its readiness probe opens
        connections of its own), once it is open."""
        key = name.encode()

        def found():
            for c in self.conns:
                if key in c.client_props and c.find("connection.open"):
                    return c
            return None

        deadline = time.monotonic() + timeout
        while True:
            c = found()
            if c:
                return c
            if time.monotonic() >= deadline:
                raise AssertionError("fake broker: no open connection named "
                                     "%r among %d" % (name, len(self.conns)))
            with self.cond:
                self.cond.wait(0.05)

    def stop(self):
        self._stopping = True
        try:
            self.lsock.close()
        except OSError:
            pass
        for c in list(self.conns):
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
