#!/usr/bin/env python3
"""The proxy's files call only downward: no call circle among them.

For each .c file of src/proxy, the functions it defines (not static, and
the static inline functions of its header, px_x.h for px_x.c) and the
functions of other files it calls. A calls B when A's text, or the body
of an inline function of A's header, names one of B's functions followed
by "(". A callback a module registers with the layer below is its own
static function, so events go up without naming a module: a module that
takes another module's function as a pointer (a table of hooks) hides a
call the graph cannot place, and fails. Prints the graph and fails on a
cycle, naming it. Also fails when a file includes a header that no
longer exists or when px_session_int.h is back.

    tools/check_layers.py [SRC_DIR]     (default: src/proxy)
    tools/check_layers.py --self-test   (the checker on a known tree)
"""
import os
import re
import sys

DEF = re.compile(r"^(?!static\b)[A-Za-z_][\w \*]*?\b(px_\w+)\(", re.M)
# comments, then character literals ('"' among them) and strings, each on
# its line
LITERAL = re.compile(r"/\*.*?\*/|//[^\n]*|'(?:\\.|[^'\\\n])*'|"
                     r'"(?:\\.|[^"\\\n])*"', re.S)


def strip(text):
    return LITERAL.sub(lambda m: "\n" * m.group(0).count("\n") + " ", text)


INLINE = re.compile(r"^static inline\b[\w \*]*?\b(px_\w+)\(", re.M)


def inline_bodies(text):
    """{name: body} of the static inline functions a header defines."""
    out = {}
    for m in INLINE.finditer(text):
        open_at = text.find("{", m.end())
        semi = text.find(";", m.end())
        if open_at < 0 or (0 <= semi < open_at):
            continue  # a declaration
        depth, i = 0, open_at
        while i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        out[m.group(1)] = text[open_at:i + 1]
    return out


def opener(text, at):
    """The bracket ("{" or "(") that encloses position `at` within its
    statement, or "" when none does."""
    depth = {"{": 0, "(": 0}
    for i in range(at - 1, -1, -1):
        c = text[i]
        if c == ";" and not any(depth.values()):
            return ""
        if c in "})":
            depth["{" if c == "}" else "("] += 1
        elif c in "{(":
            if depth[c]:
                depth[c] -= 1
            else:
                return c
    return ""


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "src/proxy"
    files = sorted(f for f in os.listdir(src) if f.endswith(".c"))
    text = {f: strip(open(os.path.join(src, f)).read()) for f in files}
    defined = {}
    for f in files:
        for name in DEF.findall(text[f]):
            defined.setdefault(name, f)
    # a header's inline functions are its module's: calling one calls the
    # module, and what its body calls, the module calls
    inline_calls = {}
    for h in sorted(f for f in os.listdir(src) if f.endswith(".h")):
        owner = h[:-2] + ".c"
        if owner not in text:
            continue
        for name, body in inline_bodies(
                strip(open(os.path.join(src, h)).read())).items():
            defined.setdefault(name, owner)
            inline_calls.setdefault(owner, set()).update(
                re.findall(r"\b(px_\w+)\s*\(", body))
    calls = {f: set() for f in files}
    for f in files:
        named = set(re.findall(r"\b(px_\w+)\s*\(", text[f]))
        for name in named | inline_calls.get(f, set()):
            g = defined.get(name)
            if g and g != f:
                calls[f].add(g)
    # a function set in a table by field name (".confirm = px_x_confirm")
    # is called by whoever calls that field ("->confirm(")
    fields = {}
    for f in files:
        for field, name in re.findall(
                r"\.(\w+)\s*=\s*(px_\w+)\b(?!\s*\()", text[f]):
            if defined.get(name):
                fields.setdefault(field, set()).add(defined[name])
    for f in files:
        for field, owners in fields.items():
            if re.search(r"(->|\.)%s\s*\(" % field, text[f]):
                calls[f].update(g for g in owners if g != f)
    # another module's function named without a call: in a table of the
    # file's own (its routes), the file calls it; passed on to a third
    # module, whoever calls through the pointer calls it unseen
    pointers = []
    for f in files:
        for m in re.finditer(r"\b(px_\w+)\b(?!\s*\()", text[f]):
            g = defined.get(m.group(1))
            if not g or g == f or m.group(1).isupper():
                continue
            if opener(text[f], m.start()) == "{":
                calls[f].add(g)
            else:
                pointers.append("%s passes %s (%s) on as a pointer: register "
                                "a static function of its own" %
                                (f, m.group(1), g))
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
    problems += sorted(set(pointers))
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


# A known source tree for --self-test: px_a calls px_b; px_b calls back
# only through an inline function of px_a's header (a circle); px_c keeps
# px_b's function in a table of its own (an edge, no circle) and hands
# px_a's function on to px_b (refused); px_f sets px_d's function in a
# hooks table by field, px_e calls that field, and px_d calls px_e (a
# circle through the table).
SELF_TEST = {
    "px_a.h": "static inline int px_a_peek(int x) { return x; }\n",
    "px_a.c": "int px_a_run(void) { return px_b_go(1); }\n",
    "px_b.c": "#include \"px_a.h\"\n"
              "int px_b_go(int x) { return px_a_peek(x); }\n",
    "px_c.c": "static const struct { int (*f)(int); } t[] = {{px_b_go}};\n"
              "int px_c_start(void) { return px_b_take(px_a_run, 0); }\n",
    "px_d.c": "int px_d_done(int x) { return px_e_go(0); }\n",
    "px_e.c": "int px_e_go(struct s *s) { return s->hooks->done(1); }\n",
    "px_f.c": "static const struct hooks h = {.done = px_d_done};\n",
}
SELF_TEST_WANT = [
    "FAIL call circle: px_a.c -> px_b.c -> px_a.c",
    "FAIL call circle: px_d.c -> px_e.c -> px_d.c",
    "FAIL px_c.c passes px_a_run (px_a.c) on as a pointer: register a "
    "static function of its own",
]


def self_test():
    """The checker finds what it must in a known source, and only that."""
    import contextlib
    import io
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for name, body in SELF_TEST.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(body)
        out = io.StringIO()
        argv = sys.argv
        sys.argv = [argv[0], d]
        try:
            with contextlib.redirect_stdout(out):
                rc = main()
        finally:
            sys.argv = argv
    lines = out.getvalue().splitlines()
    got = [line for line in lines if line.startswith("FAIL")]
    edges = [line for line in lines if line.startswith("px_c.c ->")]
    ok = rc == 1 and got == SELF_TEST_WANT and edges == [
        "px_c.c -> px_b.c"]
    print("self-test %s" % ("passed" if ok else "FAILED"))
    if not ok:
        print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(self_test() if sys.argv[1:] == ["--self-test"] else main())
