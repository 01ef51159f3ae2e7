"""etcd's own Go client against mooncaked --role=meta: clientv3 and
clientv3/concurrency 3.4 (Debian golang-etcd-server-dev), built offline in
GOPATH mode from test/integration/clientv3/main.go, run against a
3-member meta cluster and, for reference, against a real etcd 3.4: the
STM at the isolation levels that keep increments (serializable snapshot,
NewSTM's default, serializable, repeatable reads; 4 goroutines x 10
increments through different members end at 40), Mutex (never two
holders), Election (campaign order, Observe, Leader, Resign), a
Session's keep-alives and revoke, and Status/Defragment/HashKV/Snapshot
on every member.

The binary goes to $BUILD/test/clientv3-check with its Go build cache in
$BUILD/gocache, so only the first run pays for the build.
"""
import os
import shutil
import subprocess

import mctest
from mctest import case, BUILD

from metacluster import Cluster

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clientv3", "main.go")
BIN = os.path.join(BUILD, "test", "clientv3-check")


def build():
    go = shutil.which("go")
    if not go:
        raise AssertionError("go missing (Debian packages golang-go, golang-etcd-server-dev)")
    if os.path.exists(BIN) and os.path.getmtime(BIN) >= os.path.getmtime(SRC):
        return
    os.makedirs(os.path.dirname(BIN), exist_ok=True)
    env = dict(os.environ, GO111MODULE="off", GOPATH="/usr/share/gocode",
               GOCACHE=os.path.join(BUILD, "gocache"), GOFLAGS="", CGO_ENABLED="0")
    r = subprocess.run([go, "build", "-o", BIN, SRC], env=env, capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        raise AssertionError("go build failed:\n%s%s" % (r.stdout, r.stderr))


def check(endpoints, user=()):
    r = subprocess.run([BIN, "-endpoints=" + endpoints] + list(user), capture_output=True,
                       text=True, timeout=300)
    for line in r.stdout.splitlines():
        print("  " + line)
    if r.returncode != 0:
        raise AssertionError("clientv3-check exited %d\n%s%s" % (r.returncode, r.stdout,
                                                                 r.stderr[-3000:]))
    return r.stdout


@case
def clientv3_against_etcd_for_reference():
    build()
    e = mctest.Etcd()
    try:
        check(e.endpoint)
    finally:
        e.kill()


@case
def clientv3_against_three_meta_members():
    build()
    c = Cluster(3)
    try:
        c.start()
        # As user root with the tests' cluster secret: the members' etcd
        # API wants it, so clientv3 authenticates and sends its token.
        check(",".join(m.client_addr for m in c.members), mctest.etcd_user())
        for m in c.members:
            assert m.alive(), "%s stopped:\n%s" % (m.name, m.output()[-3000:])
    finally:
        c.close()


mctest.main()
