#!/usr/bin/env python3
"""The proxy's files call only downward: no call circle among them.

For each .c file of src/proxy, the functions it defines (not static) and
the functions of other files it calls. A calls B when A's text names one
of B's functions followed by "(" (a function pointer registered by an
owner, named without "(", is not a call). Prints the graph and fails on a
cycle, naming it. Also fails when a file includes a header that no
longer exists or when px_session_int.h is back.

    tools/check_layers.py [SRC_DIR]     (default: src/proxy)
"""
import os
import re
import sys

DEF = re.compile(r"^(?!static\b)[A-Za-z_][\w \*]*?\b(px_\w+)\(", re.M)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\])*"')


def strip(text):
    return STRING.sub('""', COMMENT.sub(" ", text))


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "src/proxy"
    files = sorted(f for f in os.listdir(src) if f.endswith(".c"))
    text = {f: strip(open(os.path.join(src, f)).read()) for f in files}
    defined = {}
    for f in files:
        for name in DEF.findall(text[f]):
            defined.setdefault(name, f)
    calls = {f: set() for f in files}
    for f in files:
        for name in set(re.findall(r"\b(px_\w+)\s*\(", text[f])):
            g = defined.get(name)
            if g and g != f:
                calls[f].add(g)
    for f in files:
        print("%s -> %s" % (f, " ".join(sorted(calls[f])) or "-"))
    # cycles: depth-first search over the call graph
    state, stack, cycles = {}, [], []

    def visit(f):
        state[f] = 1
        stack.append(f)
        for g in sorted(calls[f]):
            if state.get(g) == 1:
                cycles.append(stack[stack.index(g):] + [g])
            elif not state.get(g):
                visit(g)
        stack.pop()
        state[f] = 2

    for f in files:
        if not state.get(f):
            visit(f)
    problems = ["call circle: " + " -> ".join(c) for c in cycles]
    if os.path.exists(os.path.join(src, "px_session_int.h")):
        problems.append("px_session_int.h exists again")
    for f in sorted(os.listdir(src)):
        if f.endswith((".c", ".h")):
            for inc in re.findall(r'#include "([^"]+)"',
                                  open(os.path.join(src, f)).read()):
                if inc.startswith("px_") and \
                        not os.path.exists(os.path.join(src, inc)):
                    problems.append("%s includes %s, which is not there"
                                    % (f, inc))
    for p in problems:
        print("FAIL " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
