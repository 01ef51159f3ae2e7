#!/usr/bin/env bash
# Run every test: the criterion unit binaries in $BUILD/test/ and the
# integration tests test/integration/test_*.{py,sh}. Each integration test
# prints its own "N passed, N failed" line last and exits non-zero on a
# failure. The run ends with the total as "N passed, N failed".
#
#   BUILD=build PYTHON=/usr/bin/python3 test/run.sh [name-filter]
set -u
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
filter=${1:-}
export BUILD PYTHON
export MOONCAKE_CONFIG=   # never read /etc/mooncake/mooncaked.conf in tests
pass=0
fail=0
failed=()

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

out=$(mktemp)
sandir=$(mktemp -d)
trap 'rm -rf "$out" "$sandir"' EXIT
# Sanitizer reports go to files: criterion ignores its workers' exit codes
# (a LeakSanitizer report would not fail a test), and daemons started by
# integration tests report at exit. Any report fails the test that made it.
if [ "${SAN:-0}" = 1 ]; then
	export ASAN_OPTIONS="log_path=$sandir/report:detect_leaks=1:abort_on_error=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
	export UBSAN_OPTIONS="log_path=$sandir/report:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
fi
san_reports() { # $1 = test name; fails it when a sanitizer wrote a report
	local f
	shopt -s nullglob
	local files=("$sandir"/report*)
	shopt -u nullglob
	[ ${#files[@]} -gt 0 ] || return 0
	for f in "${files[@]}"; do
		echo "--- sanitizer report ($f):"
		head -n 60 "$f"
	done
	rm -f "${files[@]}"
	fail=$((fail + 1))
	failed+=("$1(sanitizer)")
}
for t in "$BUILD"/test/test_*; do
	[ -x "$t" ] && [ -f "$t" ] || continue
	name=$(basename "$t")
	[ -z "$filter" ] || [[ $name == *$filter* ]] || continue
	echo "== unit: $name"
	timeout 900 "$t" --jobs 2 >"$out" 2>&1
	rc=$?
	grep -vE '^\[----\] .*: (Passed|Skipped)' "$out" | tail -n 40
	count "$out" "$name" "$rc"
	san_reports "$name"
done
for t in "$BUILD"/fuzz-replay/fuzz_*; do
	[ -x "$t" ] || continue
	name=$(basename "$t")
	[ -z "$filter" ] || [[ $name == *$filter* ]] || continue
	echo "== fuzz corpus replay: $name"
	shopt -s nullglob; seeds=(test/fuzz/corpus/"$name"/*); shopt -u nullglob
	if "$t" "${seeds[@]}" >"$out" 2>&1; then
		cat "$out"; pass=$((pass + 1))
	else
		cat "$out"; fail=$((fail + 1)); failed+=("$name")
	fi
done
for t in test/integration/test_*.py test/integration/test_*.sh; do
	[ -f "$t" ] || continue
	name=$(basename "$t")
	[ -z "$filter" ] || [[ $name == *$filter* ]] || continue
	echo "== integration: $name"
	case "$t" in
	*.py) timeout 900 "$PYTHON" "$t" >"$out" 2>&1 ;;
	*) timeout 900 bash "$t" >"$out" 2>&1 ;;
	esac
	rc=$?
	cat "$out"
	count "$out" "$name" "$rc"
	san_reports "$name"
done
if [ ${#failed[@]} -gt 0 ]; then
	echo "failed: ${failed[*]}"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
