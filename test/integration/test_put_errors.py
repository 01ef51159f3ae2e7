"""The errors a put answers must say what happened (issue 17, items 4
and 6), through the real binaries:

- while the master leader changes (two writers put through two agents,
  the leader is killed with SIGKILL, the standby takes over) every put
  either succeeds or fails with an error that says "try again"
  (MC_EUNAVAILABLE, MC_ETIMEDOUT) — never MC_ENO_SPACE with the pool half
  free, MC_EINVALID_REPLICA or MC_ESEGMENT_NOT_FOUND, which a client
  takes as final and so drops the write;
- a put of more replicas than segments are mounted says so
  (MC_ETOO_FEW_SEGMENTS; mooncakectl with the figures), not "no space";
- a put sent the moment a standalone daemon's socket exists, before its
  agent has mounted the segment, waits for the mount and succeeds (the
  master answers "retry" while no segment is mounted in its first
  --agent-ttl, and the agent retries until the call's deadline).
"""
import os
import tempfile
import threading

import storetest as st
from storetest import MiB
from mooncake.store import ReplicateConfig
import mctest
from mctest import Daemon, Meta, case, eq, run, wait_for

OK = 0
TOO_FEW_SEGMENTS = -200  # Python: Mooncake's NO_AVAILABLE_HANDLE (libmooncake -708)
RETRY = {-900}  # Python: Mooncake's RPC_FAIL (libmooncake MC_EUNAVAILABLE, MC_ETIMEDOUT)


def elected(master):
    return "elected leader" in master.output()


class Writer(threading.Thread):
    """Puts distinct keys of 64 KiB until stopped; counts results."""

    def __init__(self, store, prefix):
        super().__init__(daemon=True)
        self.store, self.prefix = store, prefix
        self.codes = {}
        self.stop = threading.Event()
        self.n = 0

    def run(self):
        value = os.urandom(64 << 10)
        while not self.stop.is_set():
            rc = self.store.put("%s/%d" % (self.prefix, self.n), value)
            self.codes[rc] = self.codes.get(rc, 0) + 1
            self.n += 1
            if self.n % 64 == 0:  # keep the pool at most half full
                for k in range(self.n - 64, self.n - 32):
                    self.store.remove("%s/%d" % (self.prefix, k))


@case
def puts_during_a_master_failover_succeed_or_say_retry():
    meta = Meta(env=st.daemon_env())
    margs = ["--meta-endpoints=" + meta.endpoint, "--leader-lease-ttl=2s"]
    m1 = Daemon("master", args=margs, env=st.daemon_env())
    wait_for(lambda: elected(m1), what="m1 leads")
    m2 = Daemon("master", args=margs, env=st.daemon_env())
    wait_for(lambda: "standby" in m2.output(), what="m2 stands by")
    a = st.Agent(meta=meta.endpoint, segment=256 * MiB)
    b = st.Agent(meta=meta.endpoint, segment=256 * MiB)
    # Half the pool holds objects: the agents have an inventory to report.
    fill = os.urandom(64 << 10)
    for ag, name in ((a, "a"), (b, "b")):
        s = ag.store()
        for i in range(1900):
            eq(s.put("%s-fill/%d" % (name, i), fill), OK, "fill")
        s.close()
    writers = [Writer(a.store(), "a"), Writer(b.store(), "b")]
    for w in writers:
        w.start()
    wait_for(lambda: all(w.codes.get(OK, 0) >= 50 for w in writers), timeout=60,
             what="both writers under way")
    m1.kill()
    wait_for(lambda: elected(m2), timeout=30, what="m2 takes over")
    done = "re-sync with master %s (view" % m2.addr("master-listen")
    for ag in (a, b):
        wait_for(lambda: done in ag.d.output(), timeout=30, what="agent re-synced with m2")
    before = [w.codes.get(OK, 0) for w in writers]
    wait_for(lambda: all(w.codes.get(OK, 0) >= n + 50 for w, n in zip(writers, before)),
             timeout=60, what="puts succeed on the new leader")
    for w in writers:
        w.stop.set()
    for w in writers:
        w.join(60)
    codes = {}
    for w in writers:
        for rc, n in w.codes.items():
            codes[rc] = codes.get(rc, 0) + n
    print("     put results across the failover: %s" % sorted(codes.items()))
    final = {rc: n for rc, n in codes.items() if rc != OK and rc not in RETRY}
    eq(final, {}, "puts that failed with an error other than 'retry'")


@case
def more_replicas_than_segments_says_so():
    d = Daemon("standalone", env=st.daemon_env())
    wait_for(lambda: "mounted with master" in d.output(), what="segment mounted")
    with tempfile.NamedTemporaryFile() as f:
        f.write(b"x" * 5000)
        f.flush()
        r = run([mctest.MOONCAKECTL, "put", "two", f.name, "--replicas=2",
                 "--socket=" + d.socket], check=False)
        eq(r.returncode, 1, "exit status")
        assert "--replicas=2 needs 2 segments, one per replica, and only 1 is mounted" \
            in r.stderr, r.stderr
        assert "no space" not in r.stderr, r.stderr
        run([mctest.MOONCAKECTL, "put", "one", f.name, "--socket=" + d.socket])
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    eq(s.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", "unused",
               socket_path=d.socket), 0, "setup")
    eq(s.put("three", b"v", ReplicateConfig(replica_num=3)), TOO_FEW_SEGMENTS, "put, 3 replicas")
    eq(s.put("three", b"v"), OK, "the same key with one replica")
    s.close()
    eq(d.stop(), 0, "exit")


@case
def a_put_right_after_start_waits_for_the_mount():
    with tempfile.NamedTemporaryFile() as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        for i in range(3):
            d = Daemon("standalone", env=st.daemon_env())
            wait_for(lambda: os.path.exists(d.socket), what="the agent's socket")
            r = run([mctest.MOONCAKECTL, "put", "early", f.name, "--socket=" + d.socket],
                    check=False)
            eq((r.returncode, r.stderr), (0, ""), "round %d: the put at once" % i)
            out = f.name + ".out"
            run([mctest.MOONCAKECTL, "get", "early", out, "--verify", "--socket=" + d.socket])
            with open(f.name, "rb") as g, open(out, "rb") as h:
                eq(h.read() == g.read(), True, "round %d: the bytes" % i)
            os.unlink(out)
            eq(d.stop(), 0, "exit")


mctest.main()
