#!/bin/sh
# The rebound executable answers --help and --version, lists every option
# with its environment variable and default, and refuses unknown options and
# bad values with exit status 2 and a message saying what is expected.
set -eu
bin=$1
"$bin" --version | grep -Eq '^rebound [0-9]+\.[0-9]+\.[0-9]+ \(libuv '
"$bin" --help | grep -q -- '--version'
"$bin" -h | grep -q '^Usage: rebound'
for flag in max-connections retry-confirm-timeout; do
  "$bin" --help | grep -q -- "--$flag " || { echo "--help lacks --$flag"; exit 1; }
done
"$bin" --help | grep -q 'env REBOUND_MAX_CONNECTIONS, default auto'
"$bin" --help | grep -q 'env REBOUND_RETRY_CONFIRM_TIMEOUT, default 30s'
set +e
"$bin" --no-such-option 2>/dev/null
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "unknown option exited $rc, want 2"; exit 1; }
set +e
msg=$("$bin" --max-connections 0 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "--max-connections 0 exited $rc, want 2"; exit 1; }
echo "$msg" | grep -q "invalid value '0' (expected auto or a whole number" ||
  { echo "unclear error: $msg"; exit 1; }
echo "test_cli: ok"
