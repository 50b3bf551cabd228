#!/bin/bash
# Runs a command in a memcg v1 of LIMIT_MB over a 4 GiB swap file in this directory's
# filesystem (the disk tierswap's file tier uses when its swap dir is here), zswap left as
# it is (off on this machine kind); prints the memcg's major faults. The swap file and the
# cgroup go away when the command ends, however it ends. Root.
#   usage: kernel-disk.sh LIMIT_MB COMMAND [ARGS...]
set -u
limit=$1; shift
cg=/sys/fs/cgroup/memory/fault-anatomy.$$
swap=${SWAPFILE:-/tmp/fault-anatomy.swap.$$}
restore() { swapoff "$swap" 2>/dev/null; rm -f "$swap"; rmdir "$cg" 2>/dev/null; }
trap restore EXIT INT TERM
fallocate -l 4G "$swap" && chmod 600 "$swap" && mkswap "$swap" >/dev/null && swapon "$swap" || exit 2
mkdir "$cg" && echo $((limit << 20)) > "$cg/memory.limit_in_bytes" || exit 2
sh -c 'echo $$ > "$1/tasks"; shift; exec "$@"' sh "$cg" "$@"
grep '^pgmajfault ' "$cg/memory.stat"
