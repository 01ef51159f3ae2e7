#!/usr/bin/env bash
# make install into a DESTDIR puts every file where a user expects it, and
# a program can be built against the installed header and libraries.
set -u
BUILD=${BUILD:-build}
SAN=${SAN:-0}
pass=0
fail=0
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
check() {
	local name=$1
	shift
	if out=$("$@" 2>&1); then
		echo "ok   $name"
		pass=$((pass + 1))
	else
		echo "FAIL $name"
		echo "$out" | tail -n 20
		fail=$((fail + 1))
	fi
}
do_install() { make -s install SAN="$SAN" PREFIX=/usr DESTDIR="$dest"; }
files_present() {
	local f rc=0
	for f in bin/mooncaked bin/mooncakectl include/mooncake.h lib/libmooncake.a \
		lib/libmooncake.so lib/libmooncake.so.0 share/man/man8/mooncaked.8 \
		share/man/man1/mooncakectl.1 share/man/man3/libmooncake.3 \
		lib/python3/dist-packages/mooncake/store.py lib/python3/dist-packages/mooncake/engine.py \
		lib/systemd/system/mooncaked.service \
		lib/systemd/system/mooncaked@.service lib/systemd/system/mooncaked@agent.service \
		lib/sysusers.d/mooncaked.conf share/doc/mooncaked/mooncaked.conf; do
		[ -e "$dest/usr/$f" ] || { echo "missing /usr/$f"; rc=1; }
	done
	grep -q "ExecStart=/usr/bin/mooncaked" "$dest/usr/lib/systemd/system/mooncaked.service" ||
		{ echo "unit ExecStart not substituted"; rc=1; }
	return $rc
}
static_binaries() {
	[ "$SAN" = 1 ] && return 0 # sanitizer builds are dynamic by necessity
	file "$dest/usr/bin/mooncaked" | grep -q "statically linked" &&
		file "$dest/usr/bin/mooncakectl" | grep -q "statically linked"
}
links_against_library() {
	cat >"$dest/t.c" <<'C'
#include <mooncake.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
	printf("%s %s\n", mc_version(), mc_strerror(-705));
	return strcmp(mc_errname(-705), "MC_EOBJECT_ALREADY_EXISTS") != 0;
}
C
	local san=
	[ "$SAN" = 1 ] && san="-fsanitize=address,undefined"
	cc $san -I"$dest/usr/include" "$dest/t.c" -L"$dest/usr/lib" -lmooncake -o "$dest/t" &&
		LD_LIBRARY_PATH="$dest/usr/lib" "$dest/t" | grep -q "object already exists" &&
		cc $san -I"$dest/usr/include" "$dest/t.c" "$dest/usr/lib/libmooncake.a" -lprotobuf-c -lpthread -o "$dest/ts" &&
		"$dest/ts" >/dev/null
}
python_package_imports() {
	[ "$SAN" = 1 ] && return 0 # a sanitizer libmooncake.so needs libasan preloaded
	(cd / && env -u MOONCAKE_LIB PYTHONPATH="$dest/usr/lib/python3/dist-packages" \
		"${PYTHON:-/usr/bin/python3}" -c '
import mooncake, mooncake.store, mooncake.engine
assert mooncake.strerror(-705) == "object already exists", mooncake.strerror(-705)
assert mooncake.store.MooncakeDistributedStore().setup(socket_path="/nonexistent.sock") < 0
print(mooncake.version())')
}
man_renders() { mandoc -Tutf8 "$dest/usr/share/man/man8/mooncaked.8" | sed 's/.\x08//g' | grep -q -- "--listen-client"; }

check "make install DESTDIR" do_install
check "installed files" files_present
check "installed binaries are static" static_binaries
check "a program builds against the installed libmooncake" links_against_library
check "the installed Python package finds the installed libmooncake" python_package_imports
check "installed man page renders" man_renders
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
