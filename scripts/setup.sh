#!/usr/bin/env bash
# Install what rebound needs to build, test and run on Debian 12, and
# nothing that is already there. Idempotent; run as root (or with sudo).
#
#   scripts/setup.sh            build + test + run dependencies
#   scripts/setup.sh --run      only what building and running rebound needs
set -euo pipefail

build_pkgs=(build-essential cmake pkg-config libuv1-dev libssl-dev
            libyaml-dev node-llhttp)
run_pkgs=(rabbitmq-server python3 openssl ca-certificates)
test_pkgs=(clang libclang-rt-14-dev libcmocka-dev amqp-specs python3-pika
           python3-kombu python3-pytest amqp-tools librabbitmq-dev ruby-bunny
           valgrind haproxy)

pkgs=("${build_pkgs[@]}" "${run_pkgs[@]}")
[ "${1:-}" = "--run" ] || pkgs+=("${test_pkgs[@]}")

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#pkgs[@]} packages present"
  exit 0
fi

SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Keep the packaged rabbitmq-server from starting a system-wide node: the
# test suite and the quick start run private nodes of their own.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod +x "$policy"
  trap '$SUDO rm -f "$policy"' EXIT
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
