#!/usr/bin/env bash
# Documentation stays in step with the code: the committed man page is
# what the key table generates, mandoc finds nothing to complain about,
# the README's install line names every CI package, and the example
# config file parses and mentions every key.
set -u
BUILD=${BUILD:-build}
pass=0
fail=0
check() { # name, command...
	local name=$1
	shift
	if out=$("$@" 2>&1); then
		echo "ok   $name"
		pass=$((pass + 1))
	else
		echo "FAIL $name"
		echo "$out" | head -n 30
		fail=$((fail + 1))
	fi
}

man_fresh() { diff -u man/mooncaked.8 "$BUILD/man/mooncaked.8"; }
man_lint() {
	local f rc=0
	for f in man/*.[0-9]; do
		out=$(mandoc -Tlint -Wall "$f" 2>&1) || true
		if [ -n "$out" ]; then echo "$out"; rc=1; fi
	done
	return $rc
}
readme_packages() {
	local p line rc=0
	line=$(grep -m1 'apt-get install' README.md) || { echo "no apt-get line"; return 1; }
	for p in $(grep -v '^#' .ci/packages); do
		grep -qw -- "$p" <<<"$line" || { echo "README install line lacks $p"; rc=1; }
	done
	return $rc
}
conf_example() {
	local k rc=0
	"$BUILD/mooncaked" --config=conf/mooncaked.conf --print-config >/dev/null || return 1
	for k in $("$BUILD/mooncaked" --config= --print-config | sed -nE 's/^([a-z0-9-]+) = .*/\1/p'); do
		grep -qE "^#? ?$k =" conf/mooncaked.conf || { echo "conf/mooncaked.conf lacks $k"; rc=1; }
	done
	return $rc
}
help_lists_every_key() {
	local k rc=0 help
	help=$("$BUILD/mooncaked" --help)
	for k in $("$BUILD/mooncaked" --config= --print-config | sed -nE 's/^([a-z0-9-]+) = .*/\1/p'); do
		grep -q -- "--$k=" <<<"$help" || { echo "--help lacks --$k"; rc=1; }
		grep -q -- "\\\\-\\\\-$(sed 's/-/\\\\-/g' <<<"$k")" man/mooncaked.8 || { echo "man page lacks $k"; rc=1; }
	done
	return $rc
}

check "man page matches the key table (run 'make man')" man_fresh
check "mandoc -Tlint is clean" man_lint
check "README install line covers .ci/packages" readme_packages
check "example config parses and names every key" conf_example
check "--help and the man page name every key" help_lists_every_key
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
