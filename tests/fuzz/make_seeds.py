#!/usr/bin/env python3
"""Rebuild the fuzz seed corpora in tests/fuzz/corpus/ from the golden
recordings in tests/amqp_codec/golden/ (real clients, real broker), plus
large inputs made here and config files.

  frame/   runs of consecutive frames (first byte: frame-max selector)
  method/  every distinct method payload
  props/   every distinct content-header payload
  table/   every distinct field table (peer properties, arguments, headers)
  config/  YAML config files, valid and invalid
  dlq/     fuzz_dlq's inputs: messages as the broker hands out parked ones
           (a content header and a body), broker URLs, query strings

The recordings hold no frame over 4 KiB, so large_seeds() adds inputs
around and above RabbitMQ's frame-max of 131072 and up to rebound's cap of
4 MiB: frames of exactly frame-max and one byte over, content headers and
method arguments with tables of hundreds of KiB, cut frames. They are
deterministic (the same bytes on every run).
"""
import hashlib
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "amqp_codec", "golden")
OUT = os.path.join(HERE, "corpus")
MAX_SEED = 4096          # for inputs taken from the recordings
FRAME_MAX = 131072       # RabbitMQ 3.10's offer
REBOUND_FRAME_CAP = 4 << 20


def frames(data):
    off = 8 if data.startswith(b"AMQP") else 0
    while off + 7 <= len(data):
        ftype, ch, size = struct.unpack(">BHI", data[off:off + 7])
        yield ftype, data[off + 7:off + 7 + size], data[off:off + 8 + size]
        off += 8 + size


def tables_in(payload):
    """Long strings that parse as tables: cheap scan for plausible ones."""
    found = []
    for i in range(len(payload) - 4):
        (n,) = struct.unpack(">I", payload[i:i + 4])
        if 2 <= n <= len(payload) - i - 4:
            t = payload[i + 4:i + 4 + n]
            klen = t[0]
            if 0 < klen < n and t[1:1 + klen].isascii() and \
                    1 + klen < n and chr(t[1 + klen]) in "tbBsuIilfdDSxATFV":
                found.append(t)
    return found


def put(kind, blob, seen, limit=MAX_SEED):
    if len(blob) > limit:
        return
    h = hashlib.sha1(blob).hexdigest()[:16]
    if (kind, h) in seen:
        return
    seen.add((kind, h))
    d = os.path.join(OUT, kind)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, h), "wb") as f:
        f.write(blob)


def main():
    seen = set()
    for name in sorted(os.listdir(GOLDEN)):
        if not name.endswith(".hex"):
            continue
        with open(os.path.join(GOLDEN, name)) as f:
            data = bytes.fromhex("".join(f.read().split()))
        run = []
        for ftype, payload, whole in frames(data):
            if ftype == 1:
                put("method", payload, seen)
                for t in tables_in(payload):
                    put("table", t, seen)
            elif ftype == 2:
                put("props", payload, seen)
                for t in tables_in(payload):
                    put("table", t, seen)
            if ftype == 3 and len(whole) > 512:
                whole = whole[:512]  # a cut body frame: partial input
            run.append(whole)
            if len(run) == 6:
                put("frame", b"\x05" + b"".join(run), seen)
                run = []
        if run:
            put("frame", b"\x80" + b"".join(run), seen)
    large_seeds(seen)
    config_seeds()
    dlq_seeds(seen)
    for kind in ("frame", "method", "props", "table", "config", "dlq"):
        print(kind, len(os.listdir(os.path.join(OUT, kind))), file=sys.stderr)


# ---- large inputs ------------------------------------------------------------

def shortstr(b):
    assert len(b) < 256
    return bytes([len(b)]) + b


def longstr(b):
    return struct.pack(">I", len(b)) + b


def pattern(n, salt):
    """n bytes of a repeating, printable-ish pattern (compresses in git)."""
    unit = bytes((salt * 7 + i * 13) % 251 for i in range(251))
    return (unit * (n // 251 + 1))[:n]


def field(kind, i):
    """One field value (type letter + encoding) of each of RabbitMQ's
    types, varied by i."""
    simple = {
        "t": b"t" + bytes([i & 1]),
        "b": b"b" + struct.pack(">b", (i % 256) - 128),
        "B": b"B" + bytes([i % 256]),
        "s": b"s" + struct.pack(">h", (i * 37) % 65536 - 32768),
        "u": b"u" + struct.pack(">H", (i * 41) % 65536),
        "I": b"I" + struct.pack(">i", (i * 7919) % 2**32 - 2**31),
        "i": b"i" + struct.pack(">I", (i * 104729) % 2**32),
        "l": b"l" + struct.pack(">q", i * 1000003 - 2**40),
        "f": b"f" + struct.pack(">f", i / 3.0),
        "d": b"d" + struct.pack(">d", i / 7.0),
        "D": b"D" + bytes([i % 10]) + struct.pack(">I", i),
        "T": b"T" + struct.pack(">Q", 1700000000 + i),
        "V": b"V",
    }
    if kind in simple:
        return simple[kind]
    if kind == "S":
        return b"S" + longstr(pattern(i % 97, i))
    if kind == "x":
        return b"x" + longstr(pattern(i % 61, i + 1))
    if kind == "A":
        return b"A" + longstr(b"".join(field(k, i + j) for j, k in
                                        enumerate("tbsIlfdSTV")))
    if kind == "F":
        return b"F" + longstr(table_entries(3, i))
    raise ValueError(kind)


def table_entries(n, salt):
    """n entries of scalar types (a nested table's content)."""
    return b"".join(shortstr(b"k%d.%d" % (salt, j)) +
                    field("tbBsuIilfdDSxTV"[(salt + j) % 15], salt + j)
                    for j in range(n))


def big_table(size, salt=0, long_value=0, depth=0):
    """A table payload (no length prefix) of at least `size` bytes: every
    field type, nested tables and arrays, optionally one long string of
    `long_value` bytes and a chain of `depth` nested tables."""
    parts, total, j = [], 0, 0
    if long_value:
        parts.append(shortstr(b"long") + b"S" + longstr(pattern(long_value,
                                                                salt)))
    if depth:
        inner = b""
        for d in range(depth):
            inner = shortstr(b"n%d" % d) + b"F" + longstr(inner)
        parts.append(inner)
    total = sum(map(len, parts))
    while total < size:
        e = shortstr(b"h%07d" % j) + field("tbBsuIilfdDSxATFV"[j % 17],
                                            salt + j % 51)
        if j % 17 == 16:  # long values: fewer entries (smaller in git)
            e += shortstr(b"v%07d" % j) + b"S" + longstr(pattern(1500, j % 7))
        parts.append(e)
        total += len(e)
        j += 1
    return b"".join(parts)


def big_array(size, salt=0):
    parts, total, j = [], 0, 0
    while total < size:
        e = field("tbBsuIilfdDSxATFV"[j % 17], salt + j % 51)
        parts.append(e)
        total += len(e)
        j += 1
    return b"".join(parts)


def frame(ftype, channel, payload):
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + \
        b"\xce"


def method(cls, mid, args):
    return struct.pack(">HH", cls, mid) + args


def content_header(body_size, headers, flags=0xfffc):
    """basic class, every property present (flags 0xfffc) by default."""
    props = b""
    strs = {15: b"application/octet-stream", 14: b"gzip", 10: b"corr-1",
            9: b"reply.to", 8: b"60000", 7: b"msg-1", 5: b"type",
            4: b"guest", 3: b"app", 2: b"cluster"}
    for bit in range(15, 1, -1):
        if not flags & (1 << bit):
            continue
        if bit == 13:
            props += longstr(headers)
        elif bit in (12, 11):
            props += bytes([2 if bit == 12 else 5])
        elif bit == 6:
            props += struct.pack(">Q", 1700000000)
        else:
            props += shortstr(strs[bit])
    return struct.pack(">HHQH", 60, 0, body_size, flags) + props


def header_of_size(total, body_size, salt):
    """A content header payload of exactly `total` bytes."""
    h = content_header(body_size, b"")
    need = total - len(h)
    table = big_table(need - 4000, salt)
    pad = need - len(table) - 7  # a final 'x' entry fills the rest
    table += shortstr(b"z") + b"x" + longstr(pattern(pad, salt))
    h = content_header(body_size, table)
    assert len(h) == total, (len(h), total)
    return h


def selector(frame_max):
    """fuzz_frame's first byte: 0x80 no bound, else 4096 << (b % 11)."""
    if frame_max == 0:
        return b"\x80"
    return bytes([(frame_max // 4096).bit_length() - 1])


def large_seeds(seen):
    def seed(kind, blob):
        put(kind, blob, seen, limit=REBOUND_FRAME_CAP + 4096)

    publish = method(60, 40, struct.pack(">H", 0) + shortstr(b"") +
                     shortstr(b"orders") + b"\x00")
    body_max = FRAME_MAX - 8
    # a message whose header and first body frame are exactly frame-max
    hdr = header_of_size(body_max, body_max + 1000, 1)
    seed("frame", selector(FRAME_MAX) + frame(1, 1, publish) +
         frame(2, 1, hdr) + frame(3, 1, pattern(body_max, 2)) +
         frame(3, 1, pattern(1000, 3)) + frame(8, 0, b""))
    # one byte over frame-max: refused, though all its bytes are there
    seed("frame", selector(FRAME_MAX) + frame(3, 1, pattern(body_max + 1, 4)))
    seed("frame", selector(FRAME_MAX) + frame(2, 1, header_of_size(
        body_max + 1, 10, 5)))
    # no bound before tuning: large method arguments and headers
    declare = method(50, 10, struct.pack(">H", 0) + shortstr(b"orders") +
                     b"\x02" + longstr(big_table(300000, 6, depth=31)))
    seed("frame", selector(0) + frame(1, 1, declare) +
         frame(2, 1, header_of_size(200000, 5, 7)) + frame(3, 1, b"hello"))
    # rebound's cap: 1 MiB headers, then a 4 MiB body frame cut short
    seed("frame", selector(REBOUND_FRAME_CAP) + frame(1, 1, publish) +
         frame(2, 1, header_of_size(1 << 20, 1 << 22, 8)) +
         frame(3, 1, pattern(REBOUND_FRAME_CAP - 8, 10))[:300000])
    start_ok = method(10, 11, longstr(big_table(200000, 11, long_value=65536))
                      + shortstr(b"PLAIN") + longstr(b"\x00guest\x00guest")
                      + shortstr(b"en_US"))
    seed("frame", selector(262144) + frame(1, 0, start_ok))

    consume = method(60, 20, struct.pack(">H", 0) + shortstr(b"orders") +
                     shortstr(b"ctag") + b"\x00" +
                     longstr(big_table(FRAME_MAX, 12, depth=32)))
    start = method(10, 10, b"\x00\x09" + longstr(big_table(150000, 13)) +
                   longstr(pattern(300000, 14)) + longstr(b"en_US"))
    xdeclare = method(40, 10, struct.pack(">H", 0) + shortstr(b"ex") +
                      shortstr(b"headers") + b"\x02" +
                      longstr(big_table(body_max - 40, 15)))
    for m in (declare, start_ok, consume, start, xdeclare):
        seed("method", m)

    seed("props", hdr)
    seed("props", header_of_size(1 << 20, 3, 16))
    seed("props", content_header(7, big_table(150000, 17, long_value=100000,
                                              depth=20), flags=0x2000))

    seed("table", big_table(200000, 18))
    seed("table", big_table(1 << 20, 19, long_value=300000, depth=31))
    seed("table", shortstr(b"arr") + b"A" + longstr(big_array(150000, 20)))


# ---- dead-letter operations --------------------------------------------------

DLQ_URLS = [
    b"amqp://guest:guest@127.0.0.1:5672/%2F", b"amqps://ops@[::1]/prod",
    b"amqp://u@h", b"amqp://u:p%40ss@rabbit-a:5671/v%2Fhost",
    b"amqp://:@:/", b"amqp://u@h:99999/", b"amqp://u:p%zz@h/", b"amqp://@h",
    b"amqp://u@[::1/", b"amqp://u@h/a%00b",
]
DLQ_QUERIES = [b"limit=5&vhost=%2F", b"limit=&to=a+b", b"to=%4",
               b"limit=18446744073709551616", b"&&limit=1&", b"vhost=%E2%82%AC"]


def dlq_seeds(seen):
    parked = big_table(0) + b"".join(
        shortstr(k) + v for k, v in [
            (b"rebound-retry-count", b"l" + struct.pack(">q", 3)),
            (b"rebound-source-queue", b"S" + longstr(b"orders")),
            (b"rebound-dead-letter-reason", b"S" + longstr(b"max-attempts")),
            (b"rebound-first-failed-at", b"T" + struct.pack(">Q", 1764651600)),
            (b"x-death", b"A" + longstr(b"F" + longstr(table_entries(4, 1)))),
        ])
    for i, hdr in enumerate([content_header(11, parked),
                             content_header(3, big_table(3000, 21, depth=12)),
                             content_header(0, b"", flags=0)]):
        body = [b"hello \xc3\xa9t\xc3", pattern(3000, i), b""][i]
        put("dlq", b"\x00" + struct.pack(">H", len(hdr)) + hdr + body, seen,
            limit=65536)
    for u in DLQ_URLS:
        put("dlq", b"\x01" + u, seen)
    for q in DLQ_QUERIES:
        put("dlq", b"\x02" + q, seen)
    # the tier watch: a copy's headers, a client's PLAIN and AMQPLAIN logins
    for tbl in [shortstr(b"rebound-last-failed-at") + b"T" +
                struct.pack(">Q", 1700000000),
                shortstr(b"x") + b"S" + longstr(b"y") +
                shortstr(b"rebound-last-failed-at") + b"l" +
                struct.pack(">q", -5)]:
        put("dlq", b"\x03" + tbl, seen)
    for plain in [b"\x00guest\x00guest", b"authz\x00u\x00p"]:
        put("dlq", b"\x04" + plain, seen)
    put("dlq", b"\x05" + shortstr(b"LOGIN") + b"S" + longstr(b"guest") +
        shortstr(b"PASSWORD") + b"S" + longstr(b"guest"), seen)


# ---- config files -------------------------------------------------------------

CONFIGS = {
    "deploy.yaml": None,  # deploy/rebound.yaml
    "empty.yaml": "",
    "minimal.yaml": "listen: 127.0.0.1:5673\n",
    "ipv6.yaml": "listen: \"[::1]:5673\"\nupstreams: [\"[::1]:5672\", "
                 "\"rabbit-b:5672\"]\nadmin: \"[::1]:9900\"\n",
    "admin-off.yaml": "admin: \"off\"\nlog_format: json\nlog_level: debug\n",
    "flow.yaml": "{listen: 0.0.0.0:5673, upstreams: [a:1, b:2, c:3], retry: "
                 "{header_prefix: x-, policies: [{queues: [q], tiers: 1s}]}}\n",
    "policies-none.yaml": "retry:\n  policies: []\n",
    "policies-max.yaml": "retry:\n  policies:\n" + "".join(
        "    - queues: [%s]\n      tiers: [%s]\n      max_attempts: %d\n"
        "      dead_letter: \"%s.{queue}\"\n"
        % (", ".join("q%d.g%d*" % (i, g) for g in range(16)),
           ", ".join("%d%s" % (t + 1, "ms s m h".split()[t % 4])
                     for t in range(16)), i + 1, "dl%d" % i)
        for i in range(16)),
    "sizes.yaml": "cache_per_connection: 512KiB\ncache_total: 1GiB\n"
                  "drain_timeout: 250ms\nhandshake_timeout: 24h\n"
                  "retry_finish_timeout: 2m\n",
    "anchors.yaml": "defaults: &d\n  tiers: [1s]\nretry:\n  policies:\n"
                    "    - <<: *d\n      queues: [a]\n",
    "alias.yaml": "upstreams: &u [\"a:1\"]\nlisten: *u\n",
    "bad-key.yaml": "listne: 127.0.0.1:5673\n",
    "bad-port.yaml": "listen: 127.0.0.1:99999\n",
    "bad-tiers.yaml": "retry:\n  policies:\n    - queues: [a]\n"
                      "      tiers: [1s, 25h, 0s, 1.5s]\n",
    "bad-policy.yaml": "retry:\n  policies:\n    - tiers: [1s]\n"
                       "    - queues: [a]\n      color: red\n",
    "too-many-upstreams.yaml": "upstreams: [%s]\n" % ", ".join(
        "h%d:%d" % (i, 5000 + i) for i in range(9)),
    "too-long.yaml": "retry:\n  header_prefix: \"%s\"\n  policies:\n"
                     "    - queues: [\"%s\"]\n      dead_letter: \"%s\"\n"
                     % ("p" * 70, "q" * 300, "d" * 300),
    "not-mapping.yaml": "- listen\n- 127.0.0.1:5673\n",
    "unclosed.yaml": "listen: [unclosed\n",
    "tabs.yaml": "retry:\n\tpolicies: []\n",
    "nul-escape.yaml": "listen: \"127.0.0.1\\0:5673\"\n",
    "two-docs.yaml": "listen: a:1\n---\nlisten: b:2\n",
    "nested-deep.yaml": "retry: " + "[" * 200 + "]" * 200 + "\n",
    "utf8.yaml": "retry:\n  policies:\n    - queues: [\"caf\u00e9.*\", "
                 "\"\U0001f600\"]\n",
}


def config_seeds():
    d = os.path.join(OUT, "config")
    os.makedirs(d, exist_ok=True)
    for name, text in CONFIGS.items():
        if text is None:
            with open(os.path.join(HERE, "..", "..", "deploy",
                                   "rebound.yaml")) as f:
                text = f.read()
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
