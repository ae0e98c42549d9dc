#!/usr/bin/env python3
"""Who touches a shared struct's fields: the measure of how far the proxy
core is from each module owning its state (docs/ARCHITECTURE.md).

For STRUCT (default px_session, declared in src/proxy/px_session.h; also
px_server) it lists the struct's top-level fields (a nested struct or
union is one field), how many are bool, and for each .c file of
src/proxy which fields it names through the variable the code always
gives that struct (`s->field` for a session, `srv->field` for the
server). Prints the totals, the fields touched by two or more files, and
the number of fields each file touches.

    tools/struct_owners.py [STRUCT [VAR]]
    tools/struct_owners.py --check
    tools/struct_owners.py --self-test   (--check on a known tree)

--check fails when a field a module owns (OWNED) is named by any other
file (its own header's inline functions excepted): the owner's header is
the only way in.
"""
import os
import re
import sys

from check_layers import strip  # comments and literals blanked

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src",
                   "proxy")


def fields_of(header, name):
    """[(field, is_bool)] of `typedef struct NAME {...} NAME;`."""
    text = strip(open(header).read())
    m = re.search(r"typedef struct %s \{" % name, text)
    if not m:
        sys.exit("no struct %s in %s" % (name, header))
    i, depth, start = m.end(), 1, m.end()
    members, nested = [], False
    while depth:
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if depth == 1 and c == ";":
            members.append((text[start:i], nested))
            start, nested = i + 1, False
        elif depth == 1 and c == "}":
            start, nested = i + 1, True  # the names of a nested struct
        i += 1
    out = []
    for decl, after_brace in members:
        decl = " ".join(decl.split())
        if not decl:
            continue
        if after_brace:
            names = re.sub(r"\[[^\]]*\]", "", decl)
            is_bool = False
        else:
            names = re.sub(r"\[[^\]]*\]", "", decl)
            is_bool = decl.startswith("bool ")
            # drop the type: what follows its last word before the names
            names = re.sub(r"^(const\s+)?(struct\s+|union\s+)?\w+\s*", "",
                           names)
        for n in names.split(","):
            n = n.strip(" *")
            if re.fullmatch(r"\w+", n or ""):
                out.append((n, is_bool))
    return out


# px_session fields that one module owns: {field: owner file}.
OWNED = {"own": "px_own.c", "retry": "px_retry.c"}


def check(src=SRC):
    files = sorted(f for f in os.listdir(src) if f.endswith((".c", ".h")))
    bad = []
    for field, owner in OWNED.items():
        pat = re.compile(r"\bs->%s\b" % field)
        for f in files:
            if f in (owner, owner[:-2] + ".h"):
                continue
            text = strip(open(os.path.join(src, f)).read())
            for line_no, line in enumerate(text.splitlines(), 1):
                if pat.search(line):
                    bad.append("%s:%d: s->%s is %s's" % (f, line_no, field,
                                                           owner))
    for b in bad:
        print(b)
    print("%d owned fields, %d stray uses" % (len(OWNED), len(bad)))
    return 1 if bad else 0


def self_test():
    """--check finds the one stray use in a known tree, and only it."""
    import contextlib
    import io
    import tempfile
    tree = {
        "px_own.c": "void f(px_session *s) { s->own.ch = 1; }\n",
        "px_own.h": "static inline int g(px_session *s) { return s->own.ch; }\n",
        "px_retry.c": "void h(px_session *s) { s->retry.n = 0; }\n",
        "px_frames.c": "/* s->own.ch */\nint k(px_session *s) {\n"
                       "  return s->own.ch + px_own_ch(s); }\n",
    }
    with tempfile.TemporaryDirectory() as d:
        for name, body in tree.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(body)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = check(d)
    lines = out.getvalue().splitlines()
    ok = rc == 1 and lines[:-1] == ["px_frames.c:3: s->own is px_own.c's"]
    print("self-test %s" % ("passed" if ok else "FAILED"))
    if not ok:
        print("\n".join(lines))
    return 0 if ok else 1


def main():
    if sys.argv[1:] == ["--check"]:
        return check()
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    name = sys.argv[1] if len(sys.argv) > 1 else "px_session"
    var = sys.argv[2] if len(sys.argv) > 2 else {"px_session": "s",
                                                 "px_server": "srv"}[name]
    header = os.path.join(SRC, name + ".h")
    fields = fields_of(header, name)
    files = sorted(f for f in os.listdir(SRC) if f.endswith(".c"))
    text = {f: strip(open(os.path.join(SRC, f)).read()) for f in files}
    users = {}
    for field, _ in fields:
        pat = re.compile(r"\b%s->%s\b" % (var, re.escape(field)))
        users[field] = [f for f in files if pat.search(text[f])]
    print("%s: %d fields, %d bool" % (name, len(fields),
                                       sum(b for _, b in fields)))
    shared = [f for f, _ in fields if len(users[f]) >= 2]
    print("touched by 2+ files: %d, by 3+: %d" % (
        len(shared), sum(len(users[f]) >= 3 for f, _ in fields)))
    for f in shared:
        print("  %-20s %s" % (f, " ".join(users[f])))
    per = {f: sum(f in users[x] for x, _ in fields) for f in files}
    print("fields each file touches:")
    for f in sorted(per, key=lambda k: -per[k]):
        if per[f]:
            print("  %-18s %d" % (f, per[f]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
