#!/usr/bin/env bash
# Build the Debian package of rebound from this tree (CPack):
#   scripts/package.sh          -> build/package/rebound-amqp_VERSION_ARCH.deb
# Install it with `dpkg -i` (then `apt-get -f install` for the libraries
# it depends on, if missing) or `apt-get install ./rebound-amqp_*.deb`. It puts
# /usr/bin/rebound, rebound(8), /etc/rebound/rebound.yaml (a conffile) and
# the hardened systemd unit in place, and makes the system user "rebound"
# the service runs as.
#
# Environment: REBOUND_PACKAGE_DIR (default build/package),
# REBOUND_PACKAGE_CONTACT (the maintainer, "Name <address>").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --build
build=${REBOUND_PACKAGE_DIR:-build/package}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
  -DCMAKE_INSTALL_DOCDIR=share/doc/rebound-amqp -DREBOUND_DEB_LAYOUT=ON \
  ${REBOUND_PACKAGE_CONTACT:+"-DREBOUND_PACKAGE_CONTACT=$REBOUND_PACKAGE_CONTACT"} \
  -DREBOUND_TESTS=OFF -DREBOUND_BENCH=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target rebound deb_docs
rm -f "$build"/rebound-amqp_*.deb
(cd "$build" && cpack -G DEB >/dev/null)
ls "$build"/rebound-amqp_*.deb
