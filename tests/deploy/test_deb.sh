#!/usr/bin/env bash
# test_deb.sh: the Debian package builds from the tree (scripts/package.sh),
# installs with dpkg -i on a clean Debian 12 (a minbase root made by
# mmdebstrap; apt-get -f install brings the libraries it depends on) as
# rebound-amqp, makes
# the system user "rebound", and rebound, run as that user with the
# packaged config and unit, passes messages to the test broker
# (REBOUND_TEST_BROKER). The installed unit passes `systemd-analyze
# verify` and scores at most 2.0; remove and purge leave nothing behind
# but the user. Needs root (chroot, mount); exits 77 (skipped) without.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
say() { echo "test_deb: $*"; }
fail() { say "FAIL: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || { say "skipped: needs root for chroot"; exit 77; }
for tool in mmdebstrap dpkg-deb systemd-analyze python3; do
  command -v $tool >/dev/null || { say "skipped: $tool not found"; exit 77; }
done
[ -n "${REBOUND_TEST_BROKER:-}" ] ||
  { say "skipped: needs REBOUND_TEST_BROKER (scripts/test.sh sets it)"; exit 77; }
broker=${REBOUND_TEST_BROKER#amqp://}
broker=${broker#*@}
broker=${broker%%/*}

cache=${REBOUND_CONTAINER_CACHE:-$src/build/container}
pkgdir=${REBOUND_PACKAGE_DIR:-$src/build/package}
root=$(mktemp -d /tmp/rebound-deb.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null
  umount "$root/proc" 2>/dev/null || true
  rm -rf "$root"
}
trap cleanup EXIT

deb=$(REBOUND_PACKAGE_DIR=$pkgdir "$src/scripts/package.sh" | tail -n 1)
say "built $deb"
info=$(dpkg-deb -f "$deb" Depends)
for dep in libuv1 libssl3 libyaml-0-2 passwd; do
  case $info in *"$dep"*) ;; *) fail "Depends lacks $dep: $info" ;; esac
done
[ "$(dpkg-deb -f "$deb" Package)" = rebound-amqp ] || fail "package name"
# Debian's "rebound" (another program) ships /usr/bin/rebound as well
[ "$(dpkg-deb -f "$deb" Conflicts)" = rebound ] || fail "no Conflicts: rebound"
# Debian's layout: documents under the package's name, a changelog, the
# man page compressed (and both as gzip -9n makes them: no name, no time)
files=$(dpkg-deb -c "$deb" | awk '{print $6}')
for f in ./usr/share/doc/rebound-amqp/changelog.gz \
  ./usr/share/man/man8/rebound.8.gz ./usr/share/doc/rebound-amqp/README.md; do
  echo "$files" | grep -qx -- "$f" || fail "the package lacks $f"
done
changelog=$(dpkg-deb --fsys-tarfile "$deb" |
  tar -xO ./usr/share/doc/rebound-amqp/changelog.gz | gzip -dc)
case $changelog in "rebound-amqp ($(dpkg-deb -f "$deb" Version)) "*) ;;
  *) fail "the changelog does not open with this version: $changelog" ;; esac
conffiles=$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles)
for f in /etc/rebound/rebound.yaml /etc/logrotate.d/rebound; do
  echo "$conffiles" | grep -qx "$f" || fail "$f is not a conffile"
done

tarball=$("$src/scripts/debian-rootfs.sh" "$cache")
tar -xf "$tarball" -C "$root"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
cp "$deb" "$root/tmp/rebound.deb"
in_root() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

# dpkg -i on a clean system: the libraries may be missing; apt brings them
if ! in_root dpkg -i /tmp/rebound.deb >"$root/tmp/dpkg.log" 2>&1; then
  grep -q "dependency problems" "$root/tmp/dpkg.log" ||
    { cat "$root/tmp/dpkg.log"; fail "dpkg -i failed"; }
  say "dpkg -i left dependencies to install; apt-get -f install"
  in_root apt-get update -qq >/dev/null
  in_root env DEBIAN_FRONTEND=noninteractive apt-get -f install -y -qq \
    >"$root/tmp/apt.log" 2>&1 || { cat "$root/tmp/apt.log"; fail "apt-get"; }
fi
status=$(in_root dpkg-query -W -f '${Status}' rebound-amqp)
[ "$status" = "install ok installed" ] || fail "package status: $status"
say "installed: $(in_root rebound --version | head -n 1)"

user=$(in_root getent passwd rebound) || fail "no system user rebound"
uid=$(echo "$user" | cut -d: -f3)
[ "$uid" -lt 1000 ] || fail "rebound is not a system user: $user"
case $user in *:/usr/sbin/nologin) ;; *) fail "rebound can log in: $user" ;; esac
gid=$(in_root getent group rebound | cut -d: -f3) || fail "no group rebound"
perms() { stat -c '%u:%g %a' "$root$1"; }
[ "$(perms /etc/rebound)" = "0:$gid 750" ] ||
  fail "/etc/rebound: $(perms /etc/rebound), not root:rebound 0750"
[ "$(perms /etc/rebound/rebound.yaml)" = "0:$gid 640" ] ||
  fail "rebound.yaml: $(perms /etc/rebound/rebound.yaml), not root:rebound 0640"
say "system user rebound (uid $uid), /etc/rebound root:rebound 0750"

unit=$root/usr/lib/systemd/system/rebound.service
grep -qx 'ExecStart=/usr/bin/rebound --config /etc/rebound/rebound.yaml' \
  "$unit" || fail "the unit does not start the packaged binary and config"
# the chroot has no systemd: verify the installed unit on this host, with
# the binary's path inside the chroot
mkdir "$root/tmp/unit"
sed "s#/usr/bin/rebound#$root/usr/bin/rebound#g" "$unit" \
  >"$root/tmp/unit/rebound.service"
systemd-analyze verify "$root/tmp/unit/rebound.service" ||
  fail "systemd-analyze verify"
systemd-analyze security --offline=yes --threshold=20 \
  "$root/tmp/unit/rebound.service" >"$root/tmp/score" 2>&1 ||
  { cat "$root/tmp/score"; fail "exposure over 2.0"; }
say "$(grep 'Overall exposure' "$root/tmp/score")"

# the unit's reload check, as the service user: the packaged file passes,
# a broken one fails
chroot --userspec=rebound:rebound "$root" /usr/bin/rebound --check \
  --config /etc/rebound/rebound.yaml >/dev/null || fail "--check refused the packaged config"
printf 'listen: [not an address\n' >"$root/tmp/bad.yaml"
chmod 644 "$root/tmp/bad.yaml"
if chroot --userspec=rebound:rebound "$root" /usr/bin/rebound --check \
  --config /tmp/bad.yaml >/dev/null 2>&1; then
  fail "--check accepted a broken file"
fi

read -r port admin < <(python3 "$src/tests/deploy/free_ports.py" 2)
chroot --userspec=rebound:rebound "$root" /usr/bin/rebound \
  --config /etc/rebound/rebound.yaml --listen "127.0.0.1:$port" \
  --admin "127.0.0.1:$admin" --upstream "$broker" 2>"$root/tmp/rebound.log" &
pid=$!
/usr/bin/python3 - "$port" "$admin" "$REBOUND_TEST_BROKER" <<'PY' ||
import sys, time, urllib.parse, urllib.request
import pika
port, admin, url = int(sys.argv[1]), sys.argv[2], sys.argv[3]
u = urllib.parse.urlparse(url)
for _ in range(100):
    try:
        ok = urllib.request.urlopen("http://127.0.0.1:%s/readyz" % admin,
                                    timeout=2).status == 200
        if ok:
            break
    except OSError:
        pass
    time.sleep(0.1)
else:
    sys.exit("rebound did not become ready")
conn = pika.BlockingConnection(pika.ConnectionParameters(
    "127.0.0.1", port, credentials=pika.PlainCredentials(
        u.username or "guest", u.password or "guest")))
ch = conn.channel()
q = ch.queue_declare("", exclusive=True).method.queue
ch.basic_publish("", q, b"through the package")
for _ in range(50):
    m = ch.basic_get(q, auto_ack=True)
    if m[0]:
        break
    time.sleep(0.1)
assert m[2] == b"through the package", m
conn.close()
PY
  { cat "$root/tmp/rebound.log"; fail "no message through the packaged rebound"; }
run_uid=$(stat -c %u "/proc/$pid")
[ "$run_uid" = "$uid" ] || fail "rebound runs as uid $run_uid, not $uid"
kill -TERM "$pid"
wait "$pid" || fail "rebound exited $? on SIGTERM"
pid=
say "ran as rebound (uid $uid) with the packaged config; a message went through"

# enabled on the first install (the link deb-systemd-helper makes offline)
wants=$root/etc/systemd/system/multi-user.target.wants/rebound.service
[ -L "$wants" ] || fail "the unit is not enabled after the first install"
# what an administrator did survives a reinstall (an upgrade runs the same
# scripts): a disable, a changed mode, a deleted config
rm "$wants" # what `systemctl disable` does
chmod 0755 "$root/etc/rebound"
rm "$root/etc/rebound/rebound.yaml"
in_root dpkg -i /tmp/rebound.deb >"$root/tmp/dpkg.log" 2>&1 ||
  { cat "$root/tmp/dpkg.log"; fail "the reinstall failed"; }
[ ! -e "$wants" ] || fail "the reinstall enabled the unit again"
[ "$(perms /etc/rebound)" = "0:$gid 755" ] ||
  fail "the reinstall reset /etc/rebound to $(perms /etc/rebound)"
[ ! -e "$root/etc/rebound/rebound.yaml" ] ||
  fail "the reinstall brought a deleted config back"
say "a reinstall keeps the disable, the mode and the deleted config"
printf 'listen: 127.0.0.1:5673\n' >"$root/etc/rebound/rebound.yaml"

in_root dpkg -r rebound-amqp >/dev/null
[ ! -e "$root/usr/bin/rebound" ] || fail "dpkg -r left /usr/bin/rebound"
[ -e "$root/etc/rebound/rebound.yaml" ] || fail "dpkg -r removed the conffile"
in_root dpkg --purge rebound-amqp >/dev/null
[ ! -e "$root/etc/rebound" ] || fail "dpkg --purge left /etc/rebound"
say "ok"
