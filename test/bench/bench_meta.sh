#!/usr/bin/env bash
# bench_meta: a 3-member mooncaked meta cluster and a 3-member etcd cluster
# (Debian's etcd-server, 3.4) on loopback, same disk, fsync on, default
# Raft timings (100 ms heartbeat, 1 s election), measured in turn by the
# same client: `mooncakectl bench meta` (puts, then linearizable gets).
# Prints both side by side with the ratio mooncaked/etcd, and the disk's
# fdatasync rate measured in the same run.
#
#   test/bench/bench_meta.sh [BUILD] [--total=N] [--clients=N] [--conns=N]
set -u
BUILD=${1:-build}
shift || true
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(--total=20000 --clients=64 --conns=8)
CTL=$BUILD/mooncakectl
D=$BUILD/mooncaked
ETCD=$(command -v etcd || true)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-meta.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { # mctest.free_port: below the ephemeral range, so no client takes it first
	"${PYTHON:-/usr/bin/python3}" -c 'import sys; sys.path.insert(0, "'"$(dirname "$0")"'/../integration"); import mctest; print(mctest.free_port())'
}
wait_port() {
	local i
	for i in $(seq 1 200); do
		(exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
		sleep 0.05
	done
	echo "nothing listening on port $1" >&2
	return 1
}
result() { # file key
	sed -nE "s/^RESULT .*\\b$2=([0-9.]+).*/\\1/p" "$1"
}

# ---- mooncaked
declare -a mc=() mp=()
for i in 0 1 2; do mc[$i]=$(free_port); mp[$i]=$(free_port); done
ic="m0=127.0.0.1:${mp[0]},m1=127.0.0.1:${mp[1]},m2=127.0.0.1:${mp[2]}"
for i in 0 1 2; do
	"$D" --config= --role=meta --name=m$i --initial-cluster="$ic" --data-dir="$tmp/m$i" \
		--listen-client=127.0.0.1:${mc[$i]} --listen-peer=127.0.0.1:${mp[$i]} \
		--meta-http=127.0.0.1:$(free_port) --log-level=warn >"$tmp/m$i.log" 2>&1 &
	pids+=($!)
done
for i in 0 1 2; do wait_port ${mc[$i]} || { echo "mooncaked m$i:" >&2; tail -5 "$tmp/m$i.log" >&2; exit 1; }; done
mep="http://127.0.0.1:${mc[0]},http://127.0.0.1:${mc[1]},http://127.0.0.1:${mc[2]}"
# wait for a leader: a put through the API answers once one is elected
for i in $(seq 1 100); do
	"$CTL" bench meta --endpoints="$mep" --total=1 --clients=1 --conns=1 >/dev/null 2>&1 && break
	sleep 0.1
done

echo "== mooncaked meta, 3 members"
"$CTL" bench meta --endpoints="$mep" "${ARGS[@]}" --fsync-dir="$tmp" | tee "$tmp/mc.out" | grep -v '^RESULT'

# ---- etcd
if [ -z "$ETCD" ]; then
	echo "etcd not installed (Debian package etcd-server): no comparison"
	exit 0
fi
declare -a ec=() ep=()
for i in 0 1 2; do ec[$i]=$(free_port); ep[$i]=$(free_port); done
eic="e0=http://127.0.0.1:${ep[0]},e1=http://127.0.0.1:${ep[1]},e2=http://127.0.0.1:${ep[2]}"
for i in 0 1 2; do
	"$ETCD" --name e$i --data-dir "$tmp/e$i" --log-level error \
		--listen-client-urls http://127.0.0.1:${ec[$i]} --advertise-client-urls http://127.0.0.1:${ec[$i]} \
		--listen-peer-urls http://127.0.0.1:${ep[$i]} --initial-advertise-peer-urls http://127.0.0.1:${ep[$i]} \
		--initial-cluster "$eic" --initial-cluster-state new >"$tmp/e$i.log" 2>&1 &
	pids+=($!)
done
for i in 0 1 2; do wait_port ${ec[$i]} || { echo "etcd e$i:" >&2; tail -5 "$tmp/e$i.log" >&2; exit 1; }; done
eep="http://127.0.0.1:${ec[0]},http://127.0.0.1:${ec[1]},http://127.0.0.1:${ec[2]}"
for i in $(seq 1 100); do
	"$CTL" bench meta --endpoints="$eep" --total=1 --clients=1 --conns=1 >/dev/null 2>&1 && break
	sleep 0.1
done
echo "== etcd $("$ETCD" --version | sed -n 's/etcd Version: //p'), 3 members"
"$CTL" bench meta --endpoints="$eep" "${ARGS[@]}" --fsync-dir="$tmp" | tee "$tmp/etcd.out" | grep -v '^RESULT'

echo "== mooncaked / etcd (same client, same disk, same run)"
python3 - "$tmp/mc.out" "$tmp/etcd.out" <<'EOF'
import re, sys
def res(path):
    line = [l for l in open(path) if l.startswith("RESULT ")][-1]
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", line)}
m, e = res(sys.argv[1]), res(sys.argv[2])
print("  %-16s %12s %12s %8s" % ("", "mooncaked", "etcd", "ratio"))
for key, label, unit in (("put_ops", "puts/s", ""), ("put_p99_ms", "put p99 ms", ""),
                         ("get_ops", "gets/s (lin.)", ""), ("get_p99_ms", "get p99 ms", "")):
    r = m[key] / e[key] if e[key] else float("inf")
    print("  %-16s %12.1f %12.1f %8.2f" % (label, m[key], e[key], r))
print("  disk fdatasync/s during the runs: %.0f (mooncaked) / %.0f (etcd)"
      % (m["fsync_per_s"], e["fsync_per_s"]))
EOF
