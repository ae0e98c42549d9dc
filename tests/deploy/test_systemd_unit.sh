#!/bin/sh
# test_systemd_unit.sh UNIT REBOUND: the systemd unit passes
# `systemd-analyze verify` (the built binary in place of the installed
# path), its exposure score (`systemd-analyze security`) is at most 2.0,
# and a reload checks the file (rebound --check) before SIGHUP, so
# `systemctl reload` fails on a file rebound would refuse.
set -eu
unit=$1
bin=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s#/usr/local/bin/rebound#$bin#g" "$unit" >"$tmp/rebound.service"
systemd-analyze verify "$tmp/rebound.service"
if ! systemd-analyze security --offline=yes --threshold=20 \
  "$tmp/rebound.service" >"$tmp/score" 2>&1; then
  cat "$tmp/score"
  echo "test_systemd_unit: exposure over 2.0"
  exit 1
fi
grep 'Overall exposure' "$tmp/score"
first=$(grep '^ExecReload=' "$unit" | head -n 1)
case $first in
*" --check --config /etc/rebound/rebound.yaml") ;;
*) echo "test_systemd_unit: the first ExecReload is not a --check: $first"; exit 1 ;;
esac
printf 'listen: [not an address\n' >"$tmp/bad.yaml"
if "$bin" --check --config "$tmp/bad.yaml" >/dev/null 2>&1; then
  echo "test_systemd_unit: --check accepted a broken file"
  exit 1
fi
echo "test_systemd_unit: ok"
