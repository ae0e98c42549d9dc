#!/usr/bin/env bash
# Install what rebound needs to build, test and run on Debian 12, and
# nothing that is already there. Idempotent; run as root (or with sudo).
#
#   scripts/setup.sh            build + test + run dependencies
#   scripts/setup.sh --run      only what building and running rebound needs
#   scripts/setup.sh --build    only what building rebound (and its package)
#                               needs
set -euo pipefail
mode=${1:-all}

build_pkgs=(build-essential cmake pkg-config libuv1-dev libssl-dev
            libyaml-dev node-llhttp)
run_pkgs=(rabbitmq-server python3 openssl ca-certificates)
test_pkgs=(clang libclang-rt-14-dev libcmocka-dev amqp-specs python3-pika
           python3-kombu python3-pytest amqp-tools librabbitmq-dev ruby-bunny
           valgrind haproxy chromium nodejs systemd groff-base mmdebstrap
           podman runc prometheus)

pkgs=("${build_pkgs[@]}")
[ "$mode" = --build ] || pkgs+=("${run_pkgs[@]}")
[ "$mode" != all ] || pkgs+=("${test_pkgs[@]}")
# Debian's npm unless one is there (Node.js from elsewhere brings its own)
[ "$mode" != all ] || command -v npm >/dev/null || pkgs+=(npm)
# kubectl renders the Kustomize overlays (Debian's kubernetes-client unless
# a kubectl is there)
[ "$mode" != all ] || command -v kubectl >/dev/null ||
  pkgs+=(kubernetes-client)

# prometheus brings promtool, which checks and runs the shipped alert rules
# (its service is not started: see policy-rc.d below).
# The admin page's browser test drives Debian's chromium through
# playwright-core (npm, pinned by tests/integration/web/package-lock.json;
# no browser download).
# The Node.js AMQP client the integration tests drive (npm, pinned by
# tests/integration/node/package-lock.json) comes the same way.
web_modules() {
  [ "$mode" != all ] && return 0
  local tests
  tests="$(cd "$(dirname "$0")/.." && pwd)/tests/integration"
  if [ ! -d "$tests/web/node_modules/playwright-core" ]; then
    echo "setup: npm ci in tests/integration/web"
    (cd "$tests/web" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit \
      --no-fund --loglevel=error)
  fi
  if [ ! -d "$tests/node/node_modules/rabbitmq-client" ]; then
    echo "setup: npm ci in tests/integration/node"
    (cd "$tests/node" && npm ci --no-audit --no-fund --loglevel=error)
  fi
}

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#pkgs[@]} packages present"
  web_modules "$@"
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
web_modules "$@"
echo "setup: done"
