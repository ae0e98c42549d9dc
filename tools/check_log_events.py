#!/usr/bin/env python3
"""Every log event name is logged from exactly one call site.

Scans the C sources under the given directories (default: the repository's
src/) for calls of px_debug, px_info, px_warn, px_error (event name first),
px_log and px_log_kv (event name second), and fails when

  - an event name is logged from more than one call site, or
  - an event name is not a string literal (a reader of the logs could not
    find what fields the name carries).

Usage: check_log_events.py [DIR...] | --self-test

Prints each offending FILE:LINE and exits 1; prints a one-line summary and
exits 0 otherwise. Comments and strings are not calls, nor are the
logging macros in px_log.h; a log call inside any other macro is refused
(its event names could not be checked). A name followed by "(" after a
type or "*" is a declaration, not a call.
"""
import os
import re
import sys

NAME_ARG = {"px_debug": 0, "px_info": 0, "px_warn": 0, "px_error": 0,
            "px_log": 1, "px_log_kv": 1}
EVENT_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# tokens before "name(" that make it a call, not a declaration
CALL_AFTER_WORD = {"return", "else", "do", "case"}

TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<char>'(?:[^'\\\n]|\\.)*')
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>\.?[0-9](?:[eEpP][+-]|[A-Za-z0-9_.])*)
  | (?P<punct>->|\+\+|--|<<|>>|[<>=!]=|&&|\|\||[-+*/%&|^~!<>=?:;,.(){}\[\]#])
  | (?P<other>.)
""", re.S | re.X)


def tokens(text):
    """(kind, text, line, in_directive) of every token outside comments; a
    preprocessor directive runs to the end of its line, continuations
    included."""
    line = 1
    at_line_start = True
    in_directive = False
    for m in TOKEN.finditer(text):
        kind, tok = m.lastgroup, m.group()
        start_line = line
        line += tok.count("\n")
        if kind in ("ws", "comment"):
            if "\n" in tok:
                newline_at = m.start() + tok.rfind("\n")
                escaped = kind == "ws" and text[newline_at - 1:newline_at] == "\\"
                if in_directive and not escaped:
                    in_directive = False
                at_line_start = True
            continue
        if kind == "other" and tok == "\\":
            continue  # a line continuation
        if at_line_start and tok == "#":
            in_directive = True
        at_line_start = False
        yield kind, tok, start_line, in_directive


def calls(path):
    """(event name, FILE:LINE, argument text) of each log call in one file;
    (None, FILE:LINE, what is wrong) for a call whose name is not known."""
    with open(path, encoding="utf-8", errors="replace") as f:
        toks = list(tokens(f.read()))
    for i, (kind, tok, line, directive) in enumerate(toks):
        if kind != "word" or tok not in NAME_ARG:
            continue
        if i + 1 >= len(toks) or toks[i + 1][1] != "(":
            continue  # the function's address, or a macro name
        if directive:
            if os.path.basename(path) != "px_log.h":
                yield None, "%s:%d" % (path, line), \
                    "a log call inside a macro: its event names cannot be checked"
            continue  # the logging macros themselves
        prev = toks[i - 1] if i > 0 else ("punct", ";", 0, False)
        if prev[1] == "*" or (prev[0] == "word" and
                              prev[1] not in CALL_AFTER_WORD):
            continue  # a declaration or definition
        args = arguments(toks, i + 1)
        want = NAME_ARG[tok]
        where = "%s:%d" % (path, line)
        if want >= len(args):
            yield None, where, "a log call without an event name"
            continue
        arg = args[want]
        text = " ".join(t[1] for t in arg)
        if arg and all(t[0] == "string" for t in arg):
            name = "".join(t[1][1:-1] for t in arg)  # "a" "b" is "ab"
            if EVENT_NAME.match(name):
                yield name, where, text
                continue
        yield None, where, \
            "event name is not a string literal [a-z0-9_]: " + text


def arguments(toks, open_at):
    """The top-level arguments of the call whose "(" is toks[open_at]."""
    args, cur, depth = [], [], 0
    for tok in toks[open_at:]:
        if tok[1] in "([{":
            depth += 1
            if depth == 1:
                continue
        elif tok[1] in ")]}":
            depth -= 1
            if depth == 0:
                args.append(cur)
                return args
        elif tok[1] == "," and depth == 1:
            args.append(cur)
            cur = []
            continue
        cur.append(tok)
    return args


def sources(dirs):
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            subdirs.sort()
            for name in sorted(files):
                if name.endswith((".c", ".h")):
                    yield os.path.join(root, name)


SELF_TEST = r'''
#include "px_log.h"
/* px_warn("in_comment", PX_U("a", 1)); */
static const char *s = "px_warn(\"in_string\", x)";
void px_warn_like(int px_warn);
#define WRAP(n) px_warn(n, PX_U("a", 1))
#define ONE 1 \
  + px_info("in_directive", 1)
void f(int x, const char *name) {
  px_warn("dup", PX_U("a", 1));
  if (x)
    px_info("dup", PX_U("a", f2(1, 2)));
  else px_error(name, PX_U("a", 3));
  px_log(PX_LOG_WARN, "via_px_log", PX_U("a", 4));
  px_log(PX_LOG_WARN, "via_px_log", PX_U("a", 5));
  px_debug("Bad-Name", PX_U("a", 6));
  px_debug("split_" "name", PX_U("a", 7));
  px_log_kv(PX_LOG_INFO, "kv_direct", NULL, 0);
}
'''
SELF_TEST_WANT = [
    "a.c:6: a log call inside a macro",
    "a.c:8: a log call inside a macro",
    "a.c:13: event name is not a string literal [a-z0-9_]: name",
    "a.c:16: event name is not a string literal [a-z0-9_]: \"Bad-Name\"",
    "event dup is logged from 2 places: a.c:10 a.c:12",
    "event via_px_log is logged from 2 places: a.c:14 a.c:15",
]


def self_test():
    """The checker finds what it must in a known source, and only that."""
    import contextlib
    import io
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "a.c"), "w") as f:
            f.write(SELF_TEST)
        out = io.StringIO()
        cwd = os.getcwd()
        os.chdir(d)
        try:
            with contextlib.redirect_stdout(out):
                rc = main(["check", "."])
        finally:
            os.chdir(cwd)
    got = [line.replace("./", "") for line in out.getvalue().splitlines()]
    ok = rc == 1 and len(got) == len(SELF_TEST_WANT) and all(
        g.startswith(w) for g, w in zip(got, SELF_TEST_WANT))
    print("self-test %s" % ("passed" if ok else "FAILED:"))
    if not ok:
        print("\n".join(got))
    return 0 if ok else 1


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = argv[1:] or [os.path.join(repo, "src")]
    sites, bad, n = {}, [], 0
    for path in sources(dirs):
        for name, where, text in calls(os.path.relpath(path)):
            n += 1
            if name is None:
                bad.append("%s: %s" % (where, text))
            else:
                sites.setdefault(name, []).append(where)
    for name, where in sorted(sites.items()):
        if len(where) > 1:
            bad.append("event %s is logged from %d places: %s"
                       % (name, len(where), " ".join(where)))
    if n == 0:
        bad.append("no log call found under %s" % " ".join(dirs))
    for b in bad:
        print(b)
    if bad:
        return 1
    print("%d log calls, %d event names, each logged from one place"
          % (n, len(sites)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
