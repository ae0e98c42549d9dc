#!/bin/sh
# The rebound executable answers --help and --version and refuses unknown
# options with exit status 2.
set -eu
bin=$1
"$bin" --version | grep -Eq '^rebound [0-9]+\.[0-9]+\.[0-9]+ \(libuv '
"$bin" --help | grep -q -- '--version'
"$bin" -h | grep -q '^Usage: rebound'
set +e
"$bin" --no-such-option 2>/dev/null
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "unknown option exited $rc, want 2"; exit 1; }
echo "test_cli: ok"
