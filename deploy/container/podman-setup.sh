# shellcheck shell=bash
# Sourced by deploy/container/build.sh and tests/deploy/test_container.sh:
# make podman able to run containers on this machine, without touching the
# host's podman configuration.
#
#   podman_setup CACHE_DIR IMAGE
#
# Runs /bin/true in IMAGE. If that fails and CONTAINERS_CONF is not set,
# writes CACHE_DIR/containers.conf with what lets containers run where
# podman's defaults do not, exports CONTAINERS_CONF pointing at it and
# tries again:
#   - open-files and processes limits no higher than this process may set:
#     podman asks for 1048576 of each, which needs CAP_SYS_RESOURCE when
#     the hard limits are lower (crun/runc: "setrlimit ... Operation not
#     permitted"); podman itself runs with at most kernel.pid_max processes;
#   - runc instead of crun on a host with cgroups v1 and v2 controllers
#     mounted together (crun: "cgroups in hybrid mode not supported");
#   - cgroupfs and a file for events where systemd is not running.
# Returns 1, with the reason in PODMAN_SETUP_ERROR, if containers still
# cannot run.

# shellcheck disable=SC2034 # PODMAN_SETUP_ERROR is for the caller

# podman_probe IMAGE: run /bin/true in IMAGE; podman's errors on stdout.
podman_probe() {
  # shellcheck disable=SC2069 # stderr to the caller, stdout dropped
  podman run --rm --network none --entrypoint /bin/true "$1" 2>&1 >/dev/null
}

podman_setup() {
  local cache=$1 image=$2 conf=$1/containers.conf err first nofile nproc
  local pidmax runtime='' 
  PODMAN_SETUP_ERROR=
  err=$(podman_probe "$image") && return 0
  if [ -n "${CONTAINERS_CONF:-}" ]; then
    PODMAN_SETUP_ERROR="podman cannot run a container with CONTAINERS_CONF=$CONTAINERS_CONF: ${err##*$'\n'}"
    return 1
  fi
  first=${err##*$'\n'}
  nofile=$(ulimit -Hn)
  { [ "$nofile" = unlimited ] || [ "$nofile" -gt 1048576 ]; } && nofile=1048576
  nproc=$(ulimit -Hu)
  pidmax=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 32768)
  { [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pidmax" ]; } && nproc=$pidmax
  mkdir -p "$cache"
  # Each try adds what the last error asks for.
  for _ in 1 2 3; do
    if printf '%s' "$err" | grep -q "hybrid mode"; then
      command -v runc >/dev/null || {
        PODMAN_SETUP_ERROR="crun cannot run containers on a host with cgroups v1 and v2 controllers mounted together (\"${err##*$'\n'}\"); runc can: apt-get install runc"
        return 1
      }
      runtime=runc
    fi
    {
      echo "# podman settings that let containers run on this machine"
      echo "# (deploy/container/podman-setup.sh). Error with podman's defaults:"
      echo "#   $first"
      echo "[containers]"
      echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
      echo "[engine]"
      [ -z "$runtime" ] || echo "runtime = \"$runtime\""
      if [ ! -d /run/systemd/system ]; then
        echo 'cgroup_manager = "cgroupfs"'
        echo 'events_logger = "file"'
      fi
    } >"$conf"
    if err=$(CONTAINERS_CONF=$conf podman_probe "$image"); then
      export CONTAINERS_CONF=$conf
      return 0
    fi
  done
  PODMAN_SETUP_ERROR="podman cannot run a container, not even with $conf: ${err##*$'\n'} (with podman's defaults: $first)"
  return 1
}
