#!/usr/bin/env python3
"""Rebuild the fuzz seed corpora in tests/fuzz/corpus/ from the golden
recordings in tests/amqp_codec/golden/ (real clients, real broker).

  frame/   runs of consecutive frames (first byte: frame-max selector)
  method/  every distinct method payload
  props/   every distinct content-header payload
  table/   every distinct field table (peer properties, arguments, headers)
"""
import hashlib
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "amqp_codec", "golden")
OUT = os.path.join(HERE, "corpus")
MAX_SEED = 4096


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


def put(kind, blob, seen):
    if len(blob) > MAX_SEED:
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
    for kind in ("frame", "method", "props", "table"):
        print(kind, len(os.listdir(os.path.join(OUT, kind))), file=sys.stderr)


if __name__ == "__main__":
    main()
