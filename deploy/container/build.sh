#!/usr/bin/env bash
# Build rebound's container image with podman, from Debian packages only:
# no image registry is contacted.
#
#   deploy/container/build.sh [--rebase] [PODMAN BUILD OPTIONS...]
#
# 1. A Debian 12 (bookworm) base: scripts/debian-rootfs.sh makes a minimal
#    root file system with mmdebstrap from the apt mirror this machine uses
#    (/etc/apt/sources.list*), as a tarball in the cache directory, and
#    `podman import` turns it into a local image. An image already there is
#    reused; --rebase (or REBOUND_CONTAINER_REBASE=1) makes both afresh.
# 2. `podman build` of deploy/container/Containerfile on that base: a
#    build stage with the build dependencies, a runtime stage with only
#    the libraries rebound links. apt in both stages reaches the mirror
#    over the host's network (--network host).
#
# Last line on stdout: the image's name (REBOUND_IMAGE=...), after
# CONTAINERS_CONF=FILE when podman needs settings of its own to run
# containers here (deploy/container/podman-setup.sh writes them into the
# cache directory; export it for podman run), and
# REBOUND_CONTAINER_STORE_LOCK=FILE, the lock a reader of the store's
# untagged images takes so that no build is caught half-way. Needs root, podman and
# mmdebstrap (apt-get install podman mmdebstrap; runc where crun cannot
# run containers). Exit status 3: podman cannot run containers here.
#
# Environment:
#   REBOUND_CONTAINER_CACHE   cache directory (default build/container)
#   REBOUND_CONTAINER_BASE    base image name (localhost/rebound-base:bookworm)
#   REBOUND_CONTAINER_IMAGE   image name (localhost/rebound:VERSION, also
#                             tagged :latest when the default is used);
#                             its build stage is kept as NAME-build:TAG, and
#                             untagged rebound images of earlier builds go
#   REBOUND_CONTAINER_MIRROR  Debian mirror (default: the host's)
#   REBOUND_CONTAINER_SECURITY_MIRROR  Debian security mirror (the host's)
#   REBOUND_CONTAINER_JOBS    parallel compile jobs (default 2)
#   REBOUND_CONTAINER_STORE_LOCK  lock file held while building (default
#                             $TMPDIR/rebound-podman-build.UID.lock: one
#                             build at a time per user's podman store)
#   SOURCE_DATE_EPOCH         passed to mmdebstrap (reproducible base)
# CONTAINERS_CONF and CONTAINERS_STORAGE_CONF are podman's own.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${REBOUND_CONTAINER_CACHE:-$root/build/container}
base=${REBOUND_CONTAINER_BASE:-localhost/rebound-base:bookworm}
suite=bookworm
rebase=${REBOUND_CONTAINER_REBASE:-0}

die() { echo "build.sh: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

build_args=()
for a in "$@"; do
  case $a in
    --rebase) rebase=1 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) build_args+=("$a") ;;
  esac
done

command -v podman >/dev/null || die "podman not found (apt-get install podman)"

version=$(sed -n 's/^project(rebound VERSION \([0-9.]*\).*/\1/p' \
  "$root/CMakeLists.txt")
[ -n "$version" ] || die "no project VERSION in CMakeLists.txt"
image=${REBOUND_CONTAINER_IMAGE:-localhost/rebound:$version}
tag=${image##*/}
case $tag in
  *:*) stage=${image%:*}-build:${tag##*:} ;;
  *) stage=$image-build ;;
esac

# One build at a time per cache directory (parallel test runs share it),
# and per podman store: the prune at the end must not meet another
# build's untagged images half-way.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock -w 1800 9 || die "timed out waiting for the lock on $cache"
store_lock=${REBOUND_CONTAINER_STORE_LOCK:-${TMPDIR:-/tmp}/rebound-podman-build.$(id -u).lock}
exec 7>"$store_lock"
flock -w 1800 7 || die "timed out waiting for the lock on $store_lock"

# --- the base image -------------------------------------------------------------

if [ "$rebase" = 1 ] || ! podman image exists "$base"; then
  [ "$rebase" = 1 ] && rm -f "$cache/rootfs-$suite.tar"
  tar=$("$root/scripts/debian-rootfs.sh" "$cache") ||
    die "no Debian root file system to make the base from"
  log "podman import $tar as $base"
  podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --message "Debian $suite minbase" \
    "$tar" "$base" >/dev/null
else
  log "reusing base image $base"
fi

# --- podman on this machine -------------------------------------------------------

# shellcheck source=deploy/container/podman-setup.sh
. "$here/podman-setup.sh"
if ! podman_setup "$cache" "$base"; then
  echo "build.sh: $PODMAN_SETUP_ERROR" >&2
  exit 3
fi
[ "${CONTAINERS_CONF:-}" != "$cache/containers.conf" ] ||
  log "podman runs containers here with CONTAINERS_CONF=$CONTAINERS_CONF"

# --- the image ------------------------------------------------------------------

# the commit, marked -dirty when tracked files differ from it (as git
# describe --dirty); "unknown" outside a git checkout
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && ! git -C "$root" diff --quiet HEAD --; then
  revision=$revision-dirty
fi
created=$(date -u ${SOURCE_DATE_EPOCH:+-d @$SOURCE_DATE_EPOCH} +%Y-%m-%dT%H:%M:%SZ)
tags=(--tag "$image")
[ -n "${REBOUND_CONTAINER_IMAGE:-}" ] || tags+=(--tag localhost/rebound:latest)

# The build stage alone first, tagged: it stays as the layer cache of the
# next build, and the one it replaces becomes untagged (removed below).
log "podman build $stage (the build stage) on $base"
podman build --format docker --network host --pull=never \
  --file "$here/Containerfile" --target build --tag "$stage" \
  --build-arg "BASE=$base" \
  --build-arg "JOBS=${REBOUND_CONTAINER_JOBS:-2}" \
  "${build_args[@]}" "$root" >&2

log "podman build $image (rebound $version) on $base"
# docker format: the OCI image format has no HEALTHCHECK.
podman build --format docker --network host --pull=never \
  --file "$here/Containerfile" "${tags[@]}" \
  --build-arg "BASE=$base" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.created=$created" \
  --label "org.opencontainers.image.base.name=$base" \
  --build-arg "JOBS=${REBOUND_CONTAINER_JOBS:-2}" \
  "${build_args[@]}" "$root" >&2
# What earlier builds left: build stages and images whose tags moved on.
for label in io.rebound.stage=build org.opencontainers.image.title=rebound; do
  podman image prune --force --filter "label=$label" >/dev/null ||
    log "could not remove untagged images labelled $label"
done
[ -z "${CONTAINERS_CONF:-}" ] || echo "CONTAINERS_CONF=$CONTAINERS_CONF"
echo "REBOUND_CONTAINER_STORE_LOCK=$store_lock"
echo "REBOUND_IMAGE=$image"
