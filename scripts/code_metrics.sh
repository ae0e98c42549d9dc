#!/usr/bin/env bash
# code_metrics.sh - function lengths and the include graph of rebound's C
# sources.
#
#   scripts/code_metrics.sh [--root TREE] [--over N] [DIR...]
#
# DIRs are relative to TREE (default: the repository this script is in);
# without DIRs, src/proxy. For the *.c files directly in the DIRs it
# prints the number of top-level function definitions, the median length
# and, per file, count / median / longest; then every function longer than
# N lines (default 60), longest first, as file:line (the line of the
# function's name), name and length. For every *.c and *.h in the DIRs it
# prints which files of the DIRs it includes (`#include "..."`, resolved
# against the including file's directory, else by path suffix); includes
# of anything else (codec, libuv, libc) are left out.
#
# Length = body lines strictly between the line of the opening brace and
# the line of the closing brace (a one-line `{}` body is 0). The parser
# blanks comments, string and character literals and preprocessor lines,
# then counts braces: a `{` at brace depth 0 whose preceding text (since the
# last `;`, `}` or preprocessor line) ends with `)` and has no `=` outside
# parentheses, and does not start with struct/union/enum/typedef, opens a
# function definition; the matching `}` closes it. With the repository's
# formatting (clang-format) that is a signature at column 0 with `{` at
# its end, and a `}` at column 0; a definition formatted otherwise is still
# counted, with a warning on stderr.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OVER=60
usage="usage: $0 [--root TREE] [--over N] [DIR...]"
dirs=()
while [ $# -gt 0 ]; do
    case $1 in
        --root) [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }; ROOT=$2; shift 2 ;;
        --over) [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }; OVER=$2; shift 2 ;;
        -h|--help) echo "$usage"; exit 0 ;;
        -*) echo "$usage" >&2; exit 2 ;;
        *) dirs+=("$1"); shift ;;
    esac
done
[[ $OVER =~ ^[0-9]+$ ]] || { echo "--over N: a number" >&2; exit 2; }
[ -d "$ROOT" ] || { echo "no directory $ROOT" >&2; exit 2; }
[ ${#dirs[@]} -gt 0 ] || dirs=(src/proxy)
for d in "${dirs[@]}"; do
    [ -d "$ROOT/$d" ] || { echo "no directory $ROOT/$d" >&2; exit 2; }
done
PY=$(command -v /usr/bin/python3 || command -v python3)

exec "$PY" - "$ROOT" "$OVER" "${dirs[@]}" <<'EOF'
import os, re, signal, statistics, sys

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`

root, over, dirs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
dirs = [os.path.normpath(d) for d in dirs]


def blank(text):
    """Comments, string and char literals replaced by spaces (newlines
    kept, quotes kept so `extern "C"` stays recognisable)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            body = re.sub(r"[^\n]", " ", text[i + 1:j - 1])
            out.append(c + body + (text[j - 1] if j - 1 > i else ""))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_preprocessor(text):
    """Lines; preprocessor lines become "#", and so does the code of
    every #elif / #else branch (only the first branch of a conditional is
    parsed, so alternative signatures do not unbalance the braces)."""
    lines, cont, skip = text.split("\n"), False, []
    for k, line in enumerate(lines):
        if cont or line.lstrip().startswith("#"):
            if not cont:
                m = re.match(r"\s*#\s*(\w+)", line)
                d = m.group(1) if m else ""
                if d in ("if", "ifdef", "ifndef"):
                    skip.append(False)
                elif d in ("elif", "else") and skip:
                    skip[-1] = True
                elif d == "endif" and skip:
                    skip.pop()
            cont = line.rstrip().endswith("\\")
            lines[k] = "#"  # a marker: no code on this line
        elif any(skip):
            lines[k] = "#"
        else:
            cont = False
    return lines


def functions(path, warn):
    """[(name, line of the name, body length)] of one file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = drop_preprocessor(blank(f.read()))
    res = []
    stack = []          # kinds of the open blocks: func, other, extern
    header = []         # (line number, text) since the last boundary
    cur = None          # (name, name line, open line, brace placed as usual)
    for ln, line in enumerate(lines, 1):
        if line == "#":  # a preprocessor line ends any header
            if not any(k != "extern" for k in stack):
                header = []
            continue
        seg_start = 0
        for col, ch in enumerate(line):
            depth = sum(1 for k in stack if k != "extern")
            if ch not in "{};":
                continue
            if depth == 0:
                header.append((ln, line[seg_start:col]))
                seg_start = col + 1
            if ch == ";" and depth == 0:
                header = []
            elif ch == "{":
                if depth > 0:
                    stack.append("other")
                    continue
                kind, info = classify(header)
                stack.append(kind)
                if kind == "func":
                    name, name_ln = info
                    last = header_last_line(header)
                    open_ok = col == len(line.rstrip()) - 1 and (
                        last == ln or (last == ln - 1 and col == 0))
                    cur = (name, name_ln, ln, open_ok)
                header = []
            elif ch == "}":
                if not stack:
                    warn(f"{path}:{ln}: unmatched }}")
                    continue
                kind = stack.pop()
                if kind == "func":
                    name, name_ln, open_ln, open_ok = cur
                    res.append((name, name_ln, max(0, ln - open_ln - 1)))
                    if ln != open_ln and not open_ok:
                        warn(f"{path}:{open_ln}: {name}: opening brace "
                             f"neither at the end of the signature nor "
                             f"alone on the next line")
                    if ln != open_ln and col != 0:
                        warn(f"{path}:{ln}: {name}: closing brace not in "
                             f"column 0")
                    cur = None
                if not any(k != "extern" for k in stack):
                    header = []
                    seg_start = col + 1
        if not any(k != "extern" for k in stack):
            header.append((ln, line[seg_start:] + "\n"))
    if stack:
        warn(f"{path}: {len(stack)} block(s) open at the end of the file")
    return res


def header_last_line(header):
    last = 0
    for ln, t in header:
        if t.strip():
            last = ln
    return last


def classify(header):
    text = "".join(t for _, t in header)
    flat = " ".join(text.split())
    if re.fullmatch(r'extern\s*"\s*"', flat):
        return "extern", None
    if not flat.endswith(")") or re.match(r"(struct|union|enum|typedef)\b",
                                          flat):
        return "other", None
    depth = 0
    for ch in flat:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "=" and depth == 0:
            return "other", None
    m = re.search(r"([A-Za-z_]\w*)\s*\(", flat)
    if not m:
        return "other", None
    name = m.group(1)
    name_ln = next((ln for ln, t in header
                    if re.search(r"\b" + re.escape(name) + r"\s*(\(|$)", t)),
                   header[0][0] if header else 0)
    return "func", (name, name_ln)


warnings = []
files_c, files_all = [], []
for d in dirs:
    for fn in sorted(os.listdir(os.path.join(root, d))):
        rel = os.path.join(d, fn)
        if not os.path.isfile(os.path.join(root, rel)):
            continue
        if fn.endswith(".c"):
            files_c.append(rel)
        if fn.endswith((".c", ".h")):
            files_all.append(rel)

allf = []
per_file = []
for rel in files_c:
    fs = functions(os.path.join(root, rel), warnings.append)
    allf += [(rel, *f) for f in fs]
    if fs:
        lens = [f[2] for f in fs]
        per_file.append((rel, len(fs), statistics.median(lens), max(lens)))
    else:
        per_file.append((rel, 0, 0, 0))

for w in warnings:
    print("warning: " + w.replace(root.rstrip("/") + "/", ""), file=sys.stderr)


def num(x):
    return f"{x:g}"


print(f"# function lengths: *.c in {' '.join(dirs)} (tree {root})")
print("# length = body lines between the opening and the closing brace")
lens = [f[3] for f in allf]
print(f"functions: {len(allf)} in {len(files_c)} files")
if lens:
    print(f"median length: {num(statistics.median(lens))} lines "
          f"(mean {statistics.mean(lens):.1f}, longest {max(lens)})")
long = sorted((f for f in allf if f[3] > over), key=lambda f: (-f[3], f[0], f[2]))
print(f"longer than {over} lines: {len(long)}")
for rel, name, ln, n in long:
    print(f"  {n:4d}  {rel}:{ln}  {name}")
print()
print("# per file: functions, median length, longest")
w = max((len(p[0]) for p in per_file), default=4)
for rel, cnt, med, mx in per_file:
    print(f"{rel:<{w}}  {cnt:4d}  {num(med):>5}  {mx:4d}")

print()
print(f"# includes among {' '.join(dirs)} (quoted #include of a file there)")
known = set(files_all)
inc_re = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
for rel in files_all:
    with open(os.path.join(root, rel), encoding="utf-8",
              errors="replace") as f:
        text = f.read()
    here = os.path.dirname(rel)
    got = []
    for name in inc_re.findall(text):
        cand = os.path.normpath(os.path.join(here, name))
        if cand not in known:
            hits = [k for k in files_all if k == name or
                    k.endswith("/" + name)]
            cand = hits[0] if len(hits) == 1 else None
        if cand and cand != rel and cand not in got:
            got.append(cand)
    shown = [os.path.relpath(g, here) if os.path.dirname(g) == here else g
             for g in got]
    print(f"{rel}: {' '.join(shown) if shown else '-'}")
EOF
