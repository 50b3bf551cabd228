#!/usr/bin/env bash
# A local Redis cluster for the remote tier's tests and lab: 3 primaries and 3 replicas on
# 127.0.0.1, ports BASEPORT..BASEPORT+5, data and pid files under DIR/PORT/.
#
#   scripts/redis-cluster.sh start DIR BASEPORT   # prints the seeds when the cluster is up
#   scripts/redis-cluster.sh stop  DIR BASEPORT   # stops every server of DIR, removes nothing else
#
# No persistence (the remote tier's objects die with their pager anyway); a node timeout of
# 1 s so a replica takes over quickly when a primary dies. Exits non-zero with a reason when
# the cluster does not come up within 30 s.
set -euo pipefail

cmd=${1:-}; dir=${2:-}; base=${3:-}
if [ -z "$cmd" ] || [ -z "$dir" ] || [ -z "$base" ]; then
  echo "usage: $0 start|stop DIR BASEPORT" >&2
  exit 2
fi
ports=()
for i in 0 1 2 3 4 5; do ports+=($((base + i))); done

stop() {
  for p in "${ports[@]}"; do
    pidf="$dir/$p/redis.pid"
    [ -f "$pidf" ] || continue
    pid=$(cat "$pidf")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
    fi
  done
  for p in "${ports[@]}"; do
    pidf="$dir/$p/redis.pid"
    [ -f "$pidf" ] || continue
    pid=$(cat "$pidf")
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidf"
  done
}

case "$cmd" in
  start)
    command -v redis-server >/dev/null || { echo "redis-server is not installed (scripts/setup.sh installs it)" >&2; exit 3; }
    mkdir -p "$dir"
    for p in "${ports[@]}"; do
      mkdir -p "$dir/$p"
      rm -f "$dir/$p/nodes.conf"
      redis-server --port "$p" --bind 127.0.0.1 --dir "$dir/$p" --daemonize yes \
        --pidfile "$dir/$p/redis.pid" --logfile "$dir/$p/redis.log" \
        --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 1000 \
        --appendonly no --save '' --protected-mode no --maxmemory-policy noeviction
    done
    for p in "${ports[@]}"; do
      for _ in $(seq 100); do
        redis-cli -p "$p" ping >/dev/null 2>&1 && break
        sleep 0.1
      done
      redis-cli -p "$p" ping >/dev/null 2>&1 || { echo "redis on port $p did not start, see $dir/$p/redis.log" >&2; stop; exit 1; }
    done
    addrs=()
    for p in "${ports[@]}"; do addrs+=("127.0.0.1:$p"); done
    if ! redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1; then
      echo "redis-cli --cluster create failed, see $dir/create.log" >&2; stop; exit 1
    fi
    # Up when every node says so and each primary has its replica attached.
    for _ in $(seq 300); do
      ok=1
      for p in "${ports[@]}"; do
        redis-cli -p "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
      done
      if [ $ok = 1 ]; then
        replicas=$(redis-cli -p "$base" cluster nodes 2>/dev/null | grep -c slave || true)
        [ "$replicas" -ge 3 ] && break
        ok=0
      fi
      sleep 0.1
    done
    if [ $ok != 1 ]; then echo "the cluster in $dir did not become ready" >&2; stop; exit 1; fi
    # Replicas report their link up once the first sync is done.
    for p in "${ports[@]}"; do
      for _ in $(seq 100); do
        info=$(redis-cli -p "$p" info replication 2>/dev/null)
        if echo "$info" | grep -q 'role:master' || echo "$info" | grep -q 'master_link_status:up'; then break; fi
        sleep 0.1
      done
    done
    echo "redis://$(IFS=,; echo "${addrs[*]}")"
    ;;
  stop)
    stop
    ;;
  *)
    echo "usage: $0 start|stop DIR BASEPORT" >&2
    exit 2
    ;;
esac
