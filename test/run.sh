#!/usr/bin/env bash
# Run every test: the criterion unit binaries in $BUILD/test/, the fuzz
# targets' corpus replays in $BUILD/fuzz-replay/, and the integration
# tests test/integration/test_*.{py,sh}. Each integration test prints its
# own "N passed, N failed" line last and exits non-zero on a failure. The
# run ends with the list of failed tests and the total as
# "N passed, N failed".
#
#   BUILD=build PYTHON=/usr/bin/python3 test/run.sh [name-filter]
#
# Unit binaries and corpus replays run JOBS at a time (default: nproc),
# then the integration files IT_JOBS at a time (default 2). Every test
# writes to a file of its own and is printed whole when it ends, so
# outputs never interleave. Tests that take longest start first: each
# run records the durations in $BUILD/test-times and the next run orders
# by them. Integration tests share the machine safely: ports come from
# mctest.free_port, which claims each one in $MCTEST_PORT_DIR so that no
# two tests of a run get the same; data directories, sockets and logs are
# in per-test temporary directories.
#
# SAN=1: sanitizer reports go to files in a directory per test, so a
# report fails the test whose process (or daemon) wrote it.
set -u
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
JOBS=${JOBS:-$(nproc)}
IT_JOBS=${IT_JOBS:-2}
TIMEOUT_S=${TIMEOUT_S:-900}
filter=${1:-}
export BUILD PYTHON
export MOONCAKE_CONFIG= # never read /etc/mooncake/mooncaked.conf in tests
user_asan=${ASAN_OPTIONS:-}
user_ubsan=${UBSAN_OPTIONS:-}

work=$(mktemp -d)
# (Not MC_*: mooncaked warns about MC_ variables it does not know.)
export MCTEST_PORT_DIR=$work/ports
mkdir -p "$MCTEST_PORT_DIR" "$work/jobs"
pass=0
fail=0
failed=()
declare -A running=() # job directory -> name, while it runs
times=$BUILD/test-times

# ------------------------------------------------------------ one test

# Runs in the background: the command under timeout, its output into
# $dir/out, its exit status into $dir/rc (written last: the job is over
# when it exists), its duration in milliseconds into $dir/ms.
run_job() { # dir, command...
	local dir=$1
	shift
	if [ "${SAN:-0}" = 1 ]; then
		mkdir -p "$dir/san"
		export ASAN_OPTIONS="log_path=$dir/san/report:detect_leaks=1:abort_on_error=0${user_asan:+:$user_asan}"
		export UBSAN_OPTIONS="log_path=$dir/san/report:print_stacktrace=1${user_ubsan:+:$user_ubsan}"
	fi
	local t0=${EPOCHREALTIME/[.,]/}
	# timeout puts the test in a process group of its own (pid = pgid):
	# on a timeout, and on an interrupted run, the whole group goes,
	# daemons included.
	timeout "$TIMEOUT_S" "$@" >"$dir/out" 2>&1 </dev/null &
	echo $! >"$dir/pid"
	wait $!
	local rc=$?
	echo $(((${EPOCHREALTIME/[.,]/} - t0) / 1000)) >"$dir/ms"
	echo "$rc" >"$dir/rc"
}

start() { # kind, name, command...
	local dir=$work/jobs/$2
	mkdir -p "$dir"
	echo "$1" >"$dir/kind"
	run_job "$dir" "${@:3}" &
	running[$dir]=$2
}

stop_all() {
	local dir pid
	for dir in "${!running[@]}"; do
		pid=$(cat "$dir/pid" 2>/dev/null) || continue
		kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
	done
	wait
}
trap 'stop_all; echo "interrupted"; exit 130' INT TERM
trap 'rm -rf "$work"' EXIT

# ------------------------------------------------------------ reports

count() { # $1 = output file, $2 = name, $3 = exit status
	local p f line
	line=$(grep -E 'Synthesis: Tested: [0-9]+' "$1" | tail -n 1)
	if [ -n "$line" ]; then
		p=$(sed -E 's/.*Passing: ([0-9]+).*/\1/' <<<"$line")
		f=$(sed -E 's/.*Failing: ([0-9]+) \| Crashing: ([0-9]+).*/\1+\2/' <<<"$line")
		f=$((f))
	else
		line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -n 1)
		p=${line%% passed*}
		f=${line#*, }
		f=${f%% failed}
		[ -n "$line" ] || { p=0; f=1; }
	fi
	if [ "$3" -ne 0 ] && [ "$f" -eq 0 ]; then
		f=1 # crashed or exited badly without a report
	fi
	pass=$((pass + p))
	fail=$((fail + f))
	[ "$f" -eq 0 ] || failed+=("$2")
}

# Sanitizer reports go to files: criterion ignores its workers' exit codes
# (a LeakSanitizer report would not fail a test), and daemons started by
# integration tests report at exit. Any report fails the test that made it.
san_reports() { # $1 = job directory, $2 = test name
	local f
	shopt -s nullglob
	local files=("$1"/san/report*)
	shopt -u nullglob
	[ ${#files[@]} -gt 0 ] || return 0
	for f in "${files[@]}"; do
		echo "--- sanitizer report ($(basename "$f")):"
		head -n 60 "$f"
	done
	fail=$((fail + 1))
	failed+=("$2(sanitizer)")
}

# The whole report of a finished test, printed at once.
report() { # job directory
	local dir=$1 name=${running[$1]} kind rc ms
	kind=$(cat "$dir/kind")
	rc=$(cat "$dir/rc")
	ms=$(cat "$dir/ms")
	unset 'running[$dir]'
	printf '%s %s\n' "$name" "$ms" >>"$work/times"
	{
		case $kind in
		unit)
			echo "== unit: $name ($((ms / 1000)).$((ms % 1000 / 100))s)"
			grep -vE '^\[----\] .*: (Passed|Skipped)' "$dir/out" | tail -n 40
			;;
		fuzz)
			echo "== fuzz corpus replay: $name ($((ms / 1000)).$((ms % 1000 / 100))s)"
			cat "$dir/out"
			[ "$rc" -eq 0 ] || echo "exit status $rc"
			;;
		*)
			echo "== integration: $name ($((ms / 1000)).$((ms % 1000 / 100))s)"
			cat "$dir/out"
			;;
		esac
	} >"$dir/report"
	if [ "$kind" = fuzz ]; then
		if [ "$rc" -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); failed+=("$name"); fi
	else
		count "$dir/out" "$name" "$rc"
	fi
	san_reports "$dir" "$name" >>"$dir/report"
	cat "$dir/report"
	rm -rf "$dir"
}

# Wait until fewer than $1 tests run, reporting each that ends.
drain_to() { # max running
	local dir any
	while [ ${#running[@]} -ge "$1" ] && [ ${#running[@]} -gt 0 ]; do
		any=0
		for dir in "${!running[@]}"; do
			if [ -e "$dir/rc" ]; then
				report "$dir"
				any=1
			fi
		done
		[ $any = 1 ] || sleep 0.1
	done
}

# ------------------------------------------------------------ scheduling

# The candidates ("kind name path" lines) longest first by the last
# recorded durations; tests without one keep their order, after the rest.
by_duration() {
	awk -v tf="$times" 'BEGIN { while ((getline l < tf) > 0) { split(l, a, " "); ms[a[1]] = a[2] } }
	     { print ($2 in ms ? ms[$2] : -1), NR, $0 }' |
		sort -k1,1nr -k2,2n | cut -d' ' -f3-
}

run_pool() { # slots; reads "kind name path" lines
	local slots=$1 kind name path seeds
	while read -r kind name path; do
		drain_to "$slots"
		case $kind in
		unit) start unit "$name" "$path" --jobs 2 ;;
		fuzz)
			shopt -s nullglob
			seeds=(test/fuzz/corpus/"$name"/*)
			shopt -u nullglob
			start fuzz "$name" "$path" "${seeds[@]}"
			;;
		py) start integration "$name" "$PYTHON" "$path" ;;
		sh) start integration "$name" bash "$path" ;;
		esac
	done
	drain_to 1
}

selected() { # name
	[ -z "$filter" ] || [[ $1 == *$filter* ]]
}

{
	for t in "$BUILD"/test/test_*; do
		[ -x "$t" ] && [ -f "$t" ] || continue
		name=$(basename "$t")
		selected "$name" && echo "unit $name $t"
	done
	for t in "$BUILD"/fuzz-replay/fuzz_*; do
		[ -x "$t" ] || continue
		name=$(basename "$t")
		selected "$name" && echo "fuzz $name $t"
	done
} | by_duration >"$work/units"
run_pool "$JOBS" <"$work/units"

for t in test/integration/test_*.py test/integration/test_*.sh; do
	[ -f "$t" ] || continue
	name=$(basename "$t")
	selected "$name" && echo "${t##*.} $name $t"
done | by_duration >"$work/integration"
run_pool "$IT_JOBS" <"$work/integration"

# Remember the durations (the newest for each test) for the next run.
if [ -s "$work/times" ]; then
	cat "$times" "$work/times" 2>/dev/null |
		awk '{ ms[$1] = $2 } END { for (n in ms) print n, ms[n] }' | sort >"$work/times.all" &&
		mv "$work/times.all" "$times" 2>/dev/null
fi

if [ ${#failed[@]} -gt 0 ]; then
	echo "failed: ${failed[*]}"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
