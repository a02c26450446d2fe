#!/usr/bin/env bash
# Runs /rayshift inside ROOT as a container runtime runs the image under manifests/deploy's securityContext:
# a mount and PID namespace of its own with /proc, the runtime's /dev nodes, the root read-only, user 65532, and
# only the environment it is given (the caller's, nothing added). The host's network is shared, so the
# test reaches its ports on 127.0.0.1. Needs root (namespaces and mounts).
#
#   image-root.sh run ROOT ARGS...      exec /rayshift ARGS... in ROOT; killing this process kills it
set -euo pipefail

run() {
  local root=${1:?root}
  shift
  # --kill-child: the namespace's first process (rayshift) gets SIGKILL when this one dies, so a test that
  # kills its child leaves nothing behind.
  exec unshare --mount --pid --fork --kill-child --mount-proc="$root/proc" -- bash -c '
    set -euo pipefail
    root=$1; shift
    mount --make-rprivate /
    mount --rbind "$root" "$root"
    mount -o remount,bind,ro "$root"
    for node in null zero full random urandom; do mount --bind "/dev/$node" "$root/dev/$node"; done
    exec chroot --userspec=65532:65532 "$root" /rayshift "$@"
  ' image-root "$root" "$@"
}

case ${1:-} in
  run) shift; run "$@" ;;
  *) sed -n '2,7p' "$0" >&2; exit 2 ;;
esac
