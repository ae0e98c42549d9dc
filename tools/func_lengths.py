#!/usr/bin/env python3
"""Function lengths of rebound's C sources: the median, and every function
longer than a limit.

A function is a definition whose head starts in column 0 and whose body
opens with "{" at the end of the head and closes with "}" in column 0; its
length counts every line from the head to the closing brace. Initialisers
(`= {`), structs and enums are not functions.

usage: tools/func_lengths.py [--limit N] [--max-median M] [DIR ...]
Exits 1 when the median is over M or a function is over N lines, unless
its head is preceded by a comment naming it a state machine.
"""
import argparse
import pathlib
import re
import statistics
import sys

HEAD = re.compile(r"^[A-Za-z_][\w \*]*\b(\w+)\s*\(")


def functions(path):
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = HEAD.match(lines[i])
        if not m or lines[i].startswith(("typedef", "struct", "enum", "#")):
            i += 1
            continue
        j = i
        while j < len(lines) and not lines[j].rstrip().endswith(("{", ";")):
            j += 1
        if j >= len(lines) or lines[j].rstrip().endswith(";") or "=" in lines[j]:
            i = j + 1
            continue
        k = j + 1
        while k < len(lines) and lines[k] != "}":
            k += 1
        before = "\n".join(lines[max(0, i - 12):i])
        yield m.group(1), i + 1, k - i + 1, "state machine" in before
        i = k + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=60)
    ap.add_argument("--max-median", type=float, default=12)
    ap.add_argument("dirs", nargs="*", default=["src/proxy"])
    a = ap.parse_args()
    found = []
    for d in a.dirs:
        for p in sorted(pathlib.Path(d).glob("*.c")):
            found += [(p, *f) for f in functions(p)]
    lengths = [n for _, _, _, n, _ in found]
    med = statistics.median(lengths)
    print(f"{len(found)} functions, median {med:g} lines, "
          f"longest {max(lengths)}")
    bad = med > a.max_median
    for p, name, line, n, machine in sorted(found, key=lambda f: -f[3]):
        if n <= a.limit:
            break
        print(f"  {p}:{line} {name}: {n} lines"
              + (" (a documented state machine)" if machine else ""))
        bad = bad or not machine
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
