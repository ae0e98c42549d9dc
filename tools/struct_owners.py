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

--check fails when a field a module owns (OWNED) is named by any other
file (its own header's inline functions excepted): the owner's header is
the only way in.
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src",
                   "proxy")


def strip(text):
    """Comments, strings and character literals blanked, lines kept."""
    return re.sub(r"/\*.*?\*/|//[^\n]*|'(?:\\.|[^'\\\n])*'|"
                  r'"(?:\\.|[^"\\\n])*"',
                  lambda m: re.sub(r"[^\n]", " ", m.group(0)), text,
                  flags=re.S)


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


def check():
    files = sorted(f for f in os.listdir(SRC) if f.endswith((".c", ".h")))
    bad = []
    for field, owner in OWNED.items():
        pat = re.compile(r"\bs->%s\b" % field)
        for f in files:
            if f in (owner, owner[:-2] + ".h"):
                continue
            text = strip(open(os.path.join(SRC, f)).read())
            for line_no, line in enumerate(text.splitlines(), 1):
                if pat.search(line):
                    bad.append("%s:%d: s->%s is %s's" % (f, line_no, field,
                                                           owner))
    for b in bad:
        print(b)
    print("%d owned fields, %d stray uses" % (len(OWNED), len(bad)))
    return 1 if bad else 0


def main():
    if sys.argv[1:] == ["--check"]:
        return check()
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
