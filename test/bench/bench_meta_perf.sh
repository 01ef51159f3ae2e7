#!/usr/bin/env bash
# bench_meta_perf: etcd's own health check, `etcdctl check perf`, against a
# 3-member mooncaked meta cluster and a 3-member etcd cluster (Debian's
# etcd-server, 3.4) on the same machine in the same run, load by load
# (s, m, l, xl: 50 to 1000 clients, 150 to 15,000 writes/s for 60 s each,
# 256-byte keys, 1 KiB values), etcd first, then meta, with the default
# settings of each. Both clusters stay up for the whole run, so later
# loads meet the history earlier ones left. Prints both outputs side by
# side with etcd's verdicts, whether every member still runs, the CPU time
# its members used (the machine may be shared: the load average differs
# between the two halves of a load, CPU time much less), check perf's
# keys counted on every member at the revision before its final delete
# (beside the writes its throughput says were acknowledged), and any error
# that is not one etcd's clients retry. Then for each cluster the leader
# changes and snapshots it saw, and the machine's load average before and
# after. A lost-write check follows:
# `mooncakectl bench meta` with 500 clients puts distinct keys and
# counts them back (every acknowledged put must be there). Last, the p99
# latency of meta while its members write snapshots beside its p99 in
# between: a third meta cluster snapshotting every --snap-count entries is
# filled with --snap-fill keys of 1 KiB, then takes puts at --snap-rate a
# second for --snap-seconds (60; an open load: a stall shows as latency);
# each put counts as "during a snapshot" if it overlaps the time any
# member was taking a snapshot (from the members' logs: from its start to
# the end of the deletion of the files it replaced). With
# --snap-fill=1000000 the store holds 1M keys and about 1.3 GB, issue 20's
# scale. Nothing is asserted; a member that died is reported.
#
#   test/bench/bench_meta_perf.sh [BUILD] [--loads=s,m,l,xl] [--only=meta|etcd]
#       [--verify-total=N] [--snap-fill=N] [--snap-rate=N] [--snap-count=N]
#       [--snap-seconds=N] [--keep]
#
# --keep leaves the data directories and logs (printed) for a look;
# --loads=, --verify-total=0 and --snap-fill=0 skip those parts.
set -u
BUILD=${1:-build}
[ $# -gt 0 ] && shift
LOADS=s,m,l,xl
ONLY=
VERIFY_TOTAL=60000
SNAP_FILL=150000
SNAP_RATE=500
SNAP_COUNT=10000
SNAP_SECONDS=60
KEEP=0
for a in "$@"; do
	case $a in
	--loads=*) LOADS=${a#--loads=} ;;
	--only=*) ONLY=${a#--only=} ;;
	--verify-total=*) VERIFY_TOTAL=${a#--verify-total=} ;;
	--snap-fill=*) SNAP_FILL=${a#--snap-fill=} ;;
	--snap-rate=*) SNAP_RATE=${a#--snap-rate=} ;;
	--snap-count=*) SNAP_COUNT=${a#--snap-count=} ;;
	--snap-seconds=*) SNAP_SECONDS=${a#--snap-seconds=} ;;
	--keep) KEEP=1 ;;
	*) echo "usage: $0 [BUILD] [--loads=s,m,l,xl] [--only=meta|etcd] [--verify-total=N]" \
		"[--snap-fill=N] [--snap-rate=N] [--snap-count=N] [--snap-seconds=N] [--keep]" >&2
		exit 2 ;;
	esac
done
CTL=$BUILD/mooncakectl
D=$BUILD/mooncaked
ETCD=$(command -v etcd || true)
ETCDCTL=$(command -v etcdctl || true)
if [ -z "$ETCDCTL" ]; then
	echo "etcdctl not installed (Debian package etcd-client): nothing to run"
	exit 0
fi
[ -n "$ETCD" ] || { [ "$ONLY" = meta ] || { echo "etcd not installed (etcd-server): meta only"; ONLY=meta; }; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-meta-perf.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	if [ "$KEEP" = 1 ]; then echo "kept: $tmp"; else rm -rf "$tmp"; fi
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
TICKS=$(getconf CLK_TCK)
load_avg() { cut -d' ' -f1-3 /proc/loadavg; }

declare -A EP=() PIDS=() HTTP=()
start_meta() { # name prefix [extra flags...]
	local name=$1 pre=$2
	shift 2
	local -a c=() p=() h=()
	for i in 0 1 2; do c[$i]=$(free_port); p[$i]=$(free_port); h[$i]=$(free_port); done
	local ic="${pre}0=127.0.0.1:${p[0]},${pre}1=127.0.0.1:${p[1]},${pre}2=127.0.0.1:${p[2]}" mp=
	for i in 0 1 2; do
		"$D" --config= --role=meta --name=$pre$i --initial-cluster="$ic" --data-dir="$tmp/$pre$i" \
			--listen-client=127.0.0.1:${c[$i]} --listen-peer=127.0.0.1:${p[$i]} \
			--meta-http=127.0.0.1:${h[$i]} "$@" >"$tmp/$pre$i.log" 2>&1 &
		pids+=($!)
		mp+=" $!"
	done
	for i in 0 1 2; do wait_port ${c[$i]} || return 1; done
	EP[$name]="http://127.0.0.1:${c[0]},http://127.0.0.1:${c[1]},http://127.0.0.1:${c[2]}"
	HTTP[$name]="${h[0]} ${h[1]} ${h[2]}"
	PIDS[$name]=$mp
}
start_etcd() {
	local -a c=() p=()
	for i in 0 1 2; do c[$i]=$(free_port); p[$i]=$(free_port); done
	local ic="e0=http://127.0.0.1:${p[0]},e1=http://127.0.0.1:${p[1]},e2=http://127.0.0.1:${p[2]}" ep=
	for i in 0 1 2; do
		"$ETCD" --name e$i --data-dir "$tmp/e$i" --log-level info --logger zap \
			--listen-client-urls http://127.0.0.1:${c[$i]} --advertise-client-urls http://127.0.0.1:${c[$i]} \
			--listen-peer-urls http://127.0.0.1:${p[$i]} --initial-advertise-peer-urls http://127.0.0.1:${p[$i]} \
			--initial-cluster "$ic" --initial-cluster-state new >"$tmp/e$i.log" 2>&1 &
		pids+=($!)
		ep+=" $!"
	done
	for i in 0 1 2; do wait_port ${c[$i]} || return 1; done
	EP[etcd]="http://127.0.0.1:${c[0]},http://127.0.0.1:${c[1]},http://127.0.0.1:${c[2]}"
	PIDS[etcd]=$ep
}
wait_leader() { # system
	for i in $(seq 1 100); do
		ETCDCTL_API=3 "$ETCDCTL" --endpoints="${EP[$1]}" --command-timeout=2s put /bench-ready 1 >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "$1: no leader" >&2
	return 1
}
alive() { # system: "3 of 3 members running" or which died
	local n=0 dead=
	for p in ${PIDS[$1]}; do
		if kill -0 "$p" 2>/dev/null; then n=$((n + 1)); else
			wait "$p" 2>/dev/null; dead+=" pid $p exit $?"; fi
	done
	echo "$n of 3 members running${dead:+ (died:$dead)}"
}
metric_sum() { # metric name: summed over the meta members
	local s=0 v
	for h in ${HTTP[meta]}; do
		v=$(curl -s --max-time 2 "http://127.0.0.1:$h/metrics" | awk -v m="$1" '$1 == m {print $2}')
		v=${v%.*}
		s=$((s + ${v:-0}))
	done
	echo $s
}
cpu_ticks() { # system: CPU time its members used so far, in clock ticks
	local s=0 st
	for p in ${PIDS[$1]}; do
		st=$(cat /proc/"$p"/stat 2>/dev/null) || continue
		set -- ${st##*) }
		s=$((s + ${12} + ${13}))
	done
	echo $s
}
ctl() { # endpoints etcdctl-args...
	local e=$1
	shift
	ETCDCTL_API=3 "$ETCDCTL" --endpoints="$e" --command-timeout=30s "$@"
}
json() { # python expression on the JSON document j read from stdin
	"${PYTHON:-/usr/bin/python3}" -c 'import json, sys
try:
    j = json.load(sys.stdin)
    print('"$1"')
except Exception:
    print("?")'
}
rev_of() { # endpoint: the revision it has applied
	ctl "$1" endpoint status -w json 2>/dev/null | json 'j[0]["Status"]["header"]["revision"]'
}
perf_keys() { # endpoint revision: check perf's keys in that member's own copy
	ctl "$1" get --prefix /etcdctl-check-perf/ --keys-only --limit=1 --consistency=s --rev="$2" -w json \
		2>/dev/null | json 'j.get("count", 0)'
}
# After a check: its keys counted on every member at the revision before
# its final delete (every revision since rev0 is one of its puts, then the
# delete), beside the writes its throughput says were acknowledged (at
# least writes/s x 60 s); and whether every error it saw is one etcd's
# clients retry (not a dropped connection).
kept() { # system rev0 output
	local sys=$1 rev0=$2 out=$3 rev1 e at n counts= w verdict errs
	rev1=$(rev_of "${EP[$sys]%%,*}")
	for e in ${EP[$sys]//,/ }; do
		for i in $(seq 1 100); do
			[ "$(rev_of "$e")" -ge "$rev1" ] 2>/dev/null && break
			sleep 0.2
		done
		at=$rev1
		[ "$(perf_keys "$e" "$rev1")" = 0 ] && at=$((rev1 - 1))
		n=$(perf_keys "$e" "$at")
		counts+=" ${n:-?}"
	done
	w=$(grep -oE 'Throughput (is|too low:) [0-9]+' "$out" | grep -oE '[0-9]+$')
	verdict="none lost"
	[ "$(printf '%s\n' $counts | sort -u | wc -l)" = 1 ] || verdict="MEMBERS DIFFER"
	for n in $counts; do
		case $n in
		'' | *[!0-9]*) verdict="cannot count" ;;
		*) [ -n "$w" ] && [ "$n" -lt $(((w - 1) * 57)) ] && verdict="LOST WRITES" ;;
		esac
	done
	echo "   keys kept per member:$counts"
	echo "   ($((rev1 - rev0)) revisions; >= ${w:-?}/s x 60 s acked): $verdict"
	errs=$(grep -oE 'ERROR\(.*\) -> [0-9]+|^Error: .*' "$out" |
		grep -vE 'etcdserver: (request timed out|leader changed|no leader|too many requests)')
	echo "   errors clients do not retry: ${errs:-none}" | fold -s -w 56 | sed '2,$s/^/      /'
}
check() { # system load
	local out="$tmp/$1.$2.out" rev0 cpu0 cpu
	rev0=$(rev_of "${EP[$1]%%,*}")
	cpu0=$(cpu_ticks "$1")
	echo "   [$1 --load=$2 from load average $(load_avg)]" >"$out"
	ETCDCTL_API=3 timeout 300 "$ETCDCTL" --endpoints="${EP[$1]}" check perf --load="$2" 2>&1 |
		tr '\r' '\n' | sed -E 's#^ *[0-9]+ / [0-9]+ +[0-9.]+%( *[0-9hms]+)?##' |
		grep -Ev '^\{"level":"warn"|^ *$' >>"$out"
	echo "   (exit ${PIPESTATUS[0]}; $(alive "$1"))" >>"$out"
	cpu=$(($(cpu_ticks "$1") - cpu0))
	echo "   members' CPU: $((cpu / TICKS)).$((cpu % TICKS * 10 / TICKS)) s" >>"$out"
	kept "$1" "$rev0" "$out" >>"$out"
}

echo "== bench_meta_perf: etcdctl check perf, 3 etcd members beside 3 meta members"
echo "   $(nproc) cores, load average $(load_avg) at the start; $("$ETCDCTL" version | head -1)"
systems=()
[ "$ONLY" != meta ] && { start_etcd || exit 1; systems+=(etcd); }
[ "$ONLY" != etcd ] && { start_meta meta m || exit 1; systems+=(meta); }
for s in "${systems[@]}"; do wait_leader "$s" || exit 1; done

for load in ${LOADS//,/ }; do
	echo
	echo "== --load=$load"
	for s in "${systems[@]}"; do check "$s" "$load"; done
	if [ ${#systems[@]} = 2 ]; then
		pr -m -t -w 120 "$tmp/etcd.$load.out" "$tmp/meta.$load.out"
	else
		cat "$tmp/${systems[0]}.$load.out"
	fi
done

echo
echo "== after the loads (load average $(load_avg))"
for s in "${systems[@]}"; do echo "   $s: $(alive "$s")"; done
if [ "$ONLY" != etcd ]; then
	echo "   meta: leader changes seen $(metric_sum mooncake_meta_leader_changes_total) (summed" \
		"over members), snapshots taken $(metric_sum mooncake_meta_snapshots_total)," \
		"sent $(metric_sum mooncake_meta_snapshots_sent_total)"
	du -sh "$tmp"/m0/meta/snap 2>/dev/null | sed 's/^/   meta m0 snapshot directory: /'
	grep -h -E 'segmentation|SIGSEGV|AddressSanitizer|runtime error|lost the leader' "$tmp"/m?.log |
		sort | uniq -c | sort -rn | head -5 | sed 's/^/   meta log: /'
fi
if [ "$ONLY" != meta ]; then
	grep -h -o 'lost leader[^"]*\|elected leader' "$tmp"/e?.log | sort | uniq -c | sed 's/^/   etcd log: /'
fi

[ "$VERIFY_TOTAL" -gt 0 ] && echo && echo "== lost writes: mooncakectl bench meta, 500 clients," \
	"256-byte keys, 1 KiB values"
for s in "${systems[@]}"; do
	[ "$VERIFY_TOTAL" -gt 0 ] || break
	echo "   $s:"
	"$CTL" bench meta --endpoints="${EP[$s]}" --clients=500 --conns=50 --key-size=256 \
		--val-size=1024 --total="$VERIFY_TOTAL" 2>&1 | grep -v '^RESULT' | sed 's/^/   /'
	echo "   ($(alive "$s"))"
done
echo
echo "   load average $(load_avg) at the end"

[ "$ONLY" = etcd ] || [ "$SNAP_FILL" = 0 ] && exit 0
echo
echo "== meta p99 while snapshots are written: --snapshot-count=$SNAP_COUNT, $SNAP_FILL keys" \
	"of 1 KiB, then $SNAP_RATE puts/s for $SNAP_SECONDS s"
# The clusters of the loads are done with: stopped, and their writes on
# disk before this part starts, so their write-back does not land in it.
for s in "${systems[@]}"; do
	for p in ${PIDS[$s]}; do kill "$p" 2>/dev/null; done
	for p in ${PIDS[$s]}; do wait "$p" 2>/dev/null; done
done
sync
start_meta snap s --snapshot-count="$SNAP_COUNT" || exit 1
wait_leader snap || exit 1
"$CTL" bench meta --endpoints="${EP[snap]}" --clients=200 --conns=20 --key-size=256 \
	--val-size=1024 --total="$SNAP_FILL" --keep-keys 2>&1 | grep -E '^  put' |
	sed 's/^/   fill: /'
"$CTL" bench meta --endpoints="${EP[snap]}" --clients=200 --conns=20 --key-size=256 \
	--val-size=1024 --total=$((SNAP_RATE * SNAP_SECONDS)) --rate="$SNAP_RATE" \
	--overwrite-keys \
	--latency-log="$tmp/snap.lat" 2>&1 | grep -E '^  (put|lost)' | sed 's/^/   load: /'
"${PYTHON:-/usr/bin/python3}" - "$tmp/snap.lat" "$tmp"/s?.log <<'EOF'
import datetime, re, sys
lat = [l.split() for l in open(sys.argv[1])]
starts, wins, sizes, last = {}, [], [], {}
def stamp(s):
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp() * 1000
for path in sys.argv[2:]:
    for line in open(path):
        m = re.search(r"meta: snapshot at index \d+ \((\d+) bytes\) saved in (\d+) ms, "
                      r"(\d+) ms of them encoding on the loop", line)
        if m:
            sizes.append(tuple(int(x) for x in m.groups()))
        # The old files' deletion after a snapshot belongs to its window.
        m = re.match(r"(\S+Z) INFO  meta: deleted \d+ released WAL segments", line)
        if m and path in last:
            k = last.pop(path)
            wins[k] = (wins[k][0], stamp(m.group(1)))
            continue
        m = re.match(r"(\S+Z) INFO  meta: (writing the snapshot at index|snapshot at index) (\d+)",
                     line)
        if not m:
            continue
        t = stamp(m.group(1))
        key = (path, m.group(3))
        if m.group(2).startswith("writing"):
            starts[key] = t
            last.pop(path, None)
        elif key in starts:
            wins.append((starts.pop(key), t))
            last[path] = len(wins) - 1
def during(end, lat_ms):
    return any(a <= end and end - lat_ms <= b for a, b in wins)
dur, steady = [], []
for end, lat_us, ok in lat:
    end, lat_ms = float(end), int(lat_us) / 1000.0
    (dur if during(end, lat_ms) else steady).append(lat_ms)
def p99(v):
    v = sorted(v)
    return v[min(len(v) - 1, len(v) * 99 // 100)] if v else float("nan")
span = sum(b - a for a, b in wins) / 1000.0
print("   snapshots written: %d (%.1f s of snapshot time, summed over members)" % (len(wins), span))
if sizes:
    b, ms, loop = max(sizes)
    print("   largest: %.0f MB in %d ms, %d ms of them encoding on the loop (in slices of 1 ms)"
          % (b / 1e6, ms, loop))
print("   puts during a snapshot: %6d  p99 %8.1f ms" % (len(dur), p99(dur)))
print("   puts in between:        %6d  p99 %8.1f ms" % (len(steady), p99(steady)))
if dur and steady:
    print("   ratio during/between: %.2f (the issue's limit: 2)" % (p99(dur) / p99(steady)))
EOF
echo "   ($(alive snap); load average $(load_avg))"
