#!/bin/sh
# test_man_page.sh BUILD_DIR MAN_PAGE: rebound(8) renders without a groff
# warning and names every flag and environment variable `rebound --help`
# lists and every metric family a running rebound serves; `cmake
# --install` puts the binary, the man page and the sample config in place.
set -eu
build=$1
page=$2
bin=$build/rebound
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
warn=$(groff -man -Tutf8 -ww -z "$page" 2>&1)
[ -z "$warn" ] || { echo "test_man_page: groff: $warn"; exit 1; }
text=$(groff -man -Tascii -P-cbou "$page" 2>/dev/null)
missing=
for word in $("$bin" --help | grep -oE -- '(--[a-z0-9-]+|REBOUND_[A-Z0-9_]+)' |
  sort -u); do
  echo "$text" | grep -qF -- "$word" || missing="$missing $word"
done
ports=$(python3 "$(dirname "$0")/free_ports.py" 2)
port=${ports% *}
listen=${ports#* }
"$bin" --listen "127.0.0.1:$listen" --admin "127.0.0.1:$port" \
  --upstream 127.0.0.1:1 >"$tmp/log" 2>&1 &
pid=$!
python3 - "$port" >"$tmp/metrics" <<'PY'
import sys, time, urllib.request
for _ in range(100):
    try:
        url = "http://127.0.0.1:%s/metrics" % sys.argv[1]
        print(urllib.request.urlopen(url, timeout=2).read().decode())
        break
    except OSError:
        time.sleep(0.1)
PY
families=$(grep '^# TYPE ' "$tmp/metrics" | cut -d' ' -f3)
[ -n "$families" ] || { echo "test_man_page: no metrics"; cat "$tmp/log"; exit 1; }
for f in $families; do
  echo "$text" | grep -qF -- "$f" || missing="$missing $f"
done
[ -z "$missing" ] || { echo "test_man_page: rebound.8 lacks:$missing"; exit 1; }
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in bin/rebound share/man/man8/rebound.8 \
  share/doc/rebound/examples/rebound.yaml \
  share/doc/rebound/examples/rebound.service; do
  [ -e "$tmp/prefix/$f" ] || { echo "test_man_page: not installed: $f"; exit 1; }
done
echo "test_man_page: ok ($(echo "$families" | wc -l) metric families)"
