#!/usr/bin/env python3
"""Decode a golden capture (*.client.hex / *.server.hex) into a frame listing.

    decode.py FILE.hex [...]      print every frame: byte offset, type, channel,
                                  size, decoded method / content header / body

Independent of the C codec (stdlib only): method and property layouts come from
Debian's amqp-specs XML, field-table types are RabbitMQ's (README, "The codec"). Used to
verify MANIFEST.md against the captured bytes. Table values print as TYPE:value.
"""
import struct
import sys
import xml.etree.ElementTree as ET

SPEC = "/usr/share/amqp/specs/0-9-1-rabbit/amqp0-9-1.stripped.extended.xml"
FRAME_END = 0xCE


def load_spec(path=SPEC):
    root = ET.parse(path).getroot()
    domains = {d.get("name"): d.get("type") for d in root.iter("domain")}
    methods, props = {}, {}
    for c in root.iter("class"):
        cid = int(c.get("index"))
        # basic's 14th property is called "reserved" in this XML: it is cluster-id
        props[cid] = [("cluster-id" if f.get("name") == "reserved" else f.get("name"),
                       domains[f.get("domain")] if f.get("domain") else f.get("type"))
                      for f in c.findall("field")]
        for m in c.findall("method"):
            fields = []
            for f in m.findall("field"):
                t = f.get("type") or domains[f.get("domain")]
                fields.append((f.get("name"), t))
            methods[(cid, int(m.get("index")))] = ("%s.%s" % (c.get("name"), m.get("name")),
                                                   fields, m.get("content") == "1")
    return methods, props


class Reader:
    def __init__(self, buf, off=0):
        self.b, self.o = buf, off

    def take(self, n):
        if self.o + n > len(self.b):
            raise ValueError("truncated at %d (+%d)" % (self.o, n))
        v = self.b[self.o:self.o + n]
        self.o += n
        return v

    def unpack(self, fmt):
        return struct.unpack(">" + fmt, self.take(struct.calcsize(">" + fmt)))[0]

    def shortstr(self):
        return self.take(self.unpack("B")).decode("utf-8", "backslashreplace")

    def longstr(self):
        return bytes(self.take(self.unpack("I")))

    def table(self):
        r = Reader(self.take(self.unpack("I")))
        out = []
        while r.o < len(r.b):
            k = r.shortstr()
            out.append((k, r.value()))
        return out

    def value(self):
        t = chr(self.unpack("B"))
        fmt = {"b": "b", "B": "B", "s": "h", "u": "H", "I": "i", "i": "I", "l": "q",
               "f": "f", "d": "d", "T": "Q"}
        if t == "t":
            return (t, bool(self.unpack("B")))
        if t in fmt:
            return (t, self.unpack(fmt[t]))
        if t == "D":
            scale = self.unpack("B")
            return (t, (scale, self.unpack("i")))
        if t == "S":
            s = self.longstr()
            try:
                return (t, s.decode("utf-8"))
            except UnicodeDecodeError:
                return (t, s)
        if t == "x":
            return (t, self.longstr())
        if t == "A":
            r = Reader(self.take(self.unpack("I")))
            items = []
            while r.o < len(r.b):
                items.append(r.value())
            return (t, items)
        if t == "F":
            return (t, self.table())
        if t == "V":
            return (t, None)
        raise ValueError("unknown field type %r at %d" % (t, self.o - 1))


def fmt_value(tv):
    t, v = tv
    if t == "F":
        return "F{" + ", ".join("%s: %s" % (k, fmt_value(x)) for k, x in v) + "}"
    if t == "A":
        return "A[" + ", ".join(fmt_value(x) for x in v) + "]"
    if t == "D":
        return "D(scale=%d,value=%d)" % v
    return "%s:%r" % (t, v)


def read_fields(r, fields):
    out, bits, bitpos = [], 0, 8
    for name, typ in fields:
        if typ == "bit":
            if bitpos == 8:
                bits, bitpos = r.unpack("B"), 0
            out.append((name, bool(bits >> bitpos & 1)))
            bitpos += 1
            continue
        bitpos = 8
        if typ == "octet":
            v = r.unpack("B")
        elif typ == "short":
            v = r.unpack("H")
        elif typ == "long":
            v = r.unpack("I")
        elif typ in ("longlong", "timestamp"):
            v = r.unpack("Q")
        elif typ == "shortstr":
            v = r.shortstr()
        elif typ == "longstr":
            v = r.longstr()
        elif typ == "table":
            v = ("F", r.table())
        else:
            raise ValueError(typ)
        out.append((name, v))
    return out


def fmt_fields(fields):
    parts = []
    for name, v in fields:
        if name.startswith("reserved"):
            continue
        parts.append("%s=%s" % (name, fmt_value(v) if isinstance(v, tuple) else repr(v)))
    return " ".join(parts)


def frames(data, methods, props):
    """Yield (offset, type, channel, size, description) for each frame."""
    off = 0
    if data[:4] == b"AMQP":
        yield (0, "protocol", 0, 8, "protocol header %s" % data[:8].hex())
        off = 8
    while off < len(data):
        if off + 7 > len(data):
            yield (off, "trailing", 0, 0, "%d trailing bytes" % (len(data) - off))
            return
        ftype, ch, size = struct.unpack_from(">BHI", data, off)
        payload = data[off + 7:off + 7 + size]
        if data[off + 7 + size] != FRAME_END:
            raise ValueError("bad frame-end at %d" % (off + 7 + size))
        r = Reader(payload)
        if ftype == 1:
            cid, mid = r.unpack("H"), r.unpack("H")
            name, fields, _ = methods[(cid, mid)]
            desc = "%s %s" % (name, fmt_fields(read_fields(r, fields)))
            if r.o != len(payload):
                desc += " [!! %d unparsed bytes]" % (len(payload) - r.o)
            kind = "method"
        elif ftype == 2:
            cid, weight, bsize, flags = r.unpack("H"), r.unpack("H"), r.unpack("Q"), r.unpack("H")
            vals = []
            for i, (pname, ptype) in enumerate(props[cid]):
                if flags & (1 << (15 - i)):
                    vals.append((pname, read_fields(r, [(pname, ptype)])[0][1]))
            desc = "class=%d weight=%d body-size=%d flags=0x%04x %s" % (
                cid, weight, bsize, flags, fmt_fields(vals))
            kind = "header"
        elif ftype == 3:
            desc = "%d bytes: %r%s" % (size, bytes(payload[:40]), "..." if size > 40 else "")
            kind = "body"
        elif ftype == 8:
            desc, kind = "", "heartbeat"
        else:
            desc, kind = "?", "type%d" % ftype
        yield (off, kind, ch, size, desc)
        off += 8 + size


def load_hex(path):
    with open(path) as f:
        return bytes.fromhex("".join(line.strip() for line in f))


def main():
    methods, props = load_spec()
    for path in sys.argv[1:]:
        data = load_hex(path)
        print("== %s (%d bytes)" % (path, len(data)))
        for off, kind, ch, size, desc in frames(data, methods, props):
            print("@%-7d %-9s ch=%-4d size=%-6d %s" % (off, kind, ch, size, desc))


if __name__ == "__main__":
    main()
