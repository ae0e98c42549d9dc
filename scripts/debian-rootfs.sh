#!/usr/bin/env bash
# debian-rootfs.sh [CACHE_DIR]: a clean Debian 12 (bookworm) minbase root
# file system, made by mmdebstrap from the host's own Debian mirrors (read
# from /etc/apt/sources.list and /etc/apt/sources.list.d), as a tarball
# in CACHE_DIR (default build/container). Prints the tarball's path; made
# once, then reused (delete it to make it anew). The container image's
# base and the package test's clean system both start from it.
#
# Environment: REBOUND_CONTAINER_MIRROR, REBOUND_CONTAINER_SECURITY_MIRROR
# (override the mirrors), SOURCE_DATE_EPOCH (passed to mmdebstrap).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${1:-$(cd "$here/.." && pwd)/build/container}
suite=bookworm
tar=$cache/rootfs-$suite.tar

die() { echo "debian-rootfs.sh: $*" >&2; exit 1; }

mkdir -p "$cache"
exec 8>"$cache/.rootfs.lock"
flock -w 1800 8 || die "timed out waiting for the lock on $cache"
if [ -s "$tar" ]; then
  echo "$tar"
  exit 0
fi
command -v mmdebstrap >/dev/null ||
  die "mmdebstrap not found (apt-get install mmdebstrap)"
[ "$(id -u)" -eq 0 ] || die "making the root file system needs root"

# Print "URI SUITE" for every enabled deb source of the host, one-line
# (.list) and deb822 (.sources) formats alike.
host_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    awk '$1 == "deb" {
           i = 2
           if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
           print $i, $(i + 1)
         }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk 'function flush(   u, s, nu, ns, i, j) {
           if (types ~ /(^| )deb( |$)/ && tolower(enabled) != "no") {
             nu = split(uris, u, " "); ns = split(suites, s, " ")
             for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++)
               print u[i], s[j]
           }
           types = uris = suites = ""; enabled = "yes"
         }
         BEGIN { enabled = "yes" }
         /^[ \t]*#/ { next }
         /^[ \t]*$/ { flush(); next }
         { key = tolower($1); sub(/:$/, "", key); $1 = "" ; sub(/^ /, "")
           if (key == "types") types = $0
           else if (key == "uris") uris = $0
           else if (key == "suites") suites = $0
           else if (key == "enabled") enabled = $0 }
         END { flush() }' "$f"
  done
}

# mirror_for SUITE: the host's first URI serving SUITE.
mirror_for() {
  host_sources | awk -v s="$1" '$2 == s { print $1; exit }'
}

mirror=${REBOUND_CONTAINER_MIRROR:-$(mirror_for $suite)}
mirror=${mirror:-http://deb.debian.org/debian}
security=${REBOUND_CONTAINER_SECURITY_MIRROR:-$(mirror_for $suite-security)}
security=${security:-http://deb.debian.org/debian-security}

# Run "$@" with only standard input, output and error open. mmdebstrap
# hands apt a pipe by its number to a dash hook, and dash takes only
# descriptors 0-9: with our lock and whatever a test runner left open, the
# pipe's number could be 10 or more, and the hook fails ("Bad fd number").
only_std_fds() {
  (
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}
      [ "$fd" -gt 2 ] && eval "exec $fd>&-"
    done 2>/dev/null
    exec "$@"
  )
}

tmp=$tar.tmp
rm -f "$tmp"
echo "debian-rootfs.sh: mmdebstrap $suite from $mirror and $security" >&2
# minbase: Essential packages and apt. Merged /usr made as debootstrap
# does (symlinks and usr-is-merged, not usrmerge and the perl it needs).
# Documentation, manuals and translations are left out by dpkg, in this
# base and whatever is installed on it later; copyright files stay.
# shellcheck disable=SC2016 # $1 is the hook's argument: the new root
only_std_fds mmdebstrap --variant=minbase --format=tar --components=main \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --aptopt='Acquire::Languages "none"' \
  --aptopt='APT::Install-Recommends "false"' \
  --customize-hook='rm -f "$1/etc/hostname" "$1/etc/resolv.conf"' \
  "$suite" "$tmp" \
  "deb $mirror $suite main" \
  "deb $mirror $suite-updates main" \
  "deb $security $suite-security main" >&2
mv "$tmp" "$tar"
echo "$tar"
