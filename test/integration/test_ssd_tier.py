"""The agent's SSD tier end to end: a master and agents as separate
mooncaked processes (and a standalone daemon), each agent with
--ssd-path/--ssd-size, clients through the Python package (every get
checking the bytes against the object's checksum), libmooncake's
mooncakectl and the master's Stats.

DRAM filled several times over demotes to SSD instead of dropping: every
key ever put is readable with its own bytes from the owner and from
another agent, or counted as evicted. After kill -9 (of an agent, of the
standalone daemon, during demotions, during recovery) a restart on the
same --ssd-path brings back every object that was on SSD, 0 wrong bytes.
Torn or corrupt records and bytes on disk are dropped with a log line,
never served. Bad configurations exit with status 1 and a clear line,
nothing overwritten. Puts may name the SSD tier; gets through get,
get_into, batch_get_into and zero-copy views, into and from memory the
agent did not allocate (numpy arrays, allocator memory) at any
alignment, from the owner and another node; promotion on a hit;
--ssd-flush-on-stop; metrics and stats of both tiers.
"""
import ctypes
import hashlib
import os
import signal
import subprocess
import tempfile
import time

import storetest as st
from storetest import MiB, metric, metric_labels
import mctest
from mctest import Daemon, case, eq, run, wait_for

OK = 0
INVALID = -600  # Mooncake's INVALID_PARAMS
NOT_FOUND = -704


def value(key, size=MiB):
    """Bytes only this key has (size a multiple of 32)."""
    return hashlib.sha256(key.encode()).digest() * (size // 32)


def ssd_args(path, size="256M", extra=()):
    return ["--ssd-path=" + path, "--ssd-size=" + size, "--ssd-promote-on-hit=false",
            "--te-lease-ttl=1s"] + list(extra)


class Node:
    """A mooncaked --role=agent with an SSD tier, restartable on the same
    ports, socket and --ssd-path (the same segment names)."""

    def __init__(self, master_addr, ssd=None, size="256M", segment="64M", extra=(),
                 wait=True):
        self.tmp = tempfile.TemporaryDirectory(prefix="mooncake-ssd-node-")
        self.ssd = ssd or os.path.join(self.tmp.name, "ssd")
        self.socket = os.path.join(self.tmp.name, "agent.sock")
        self.args = ["--meta-endpoints=", "--master-address=" + master_addr,
                     "--global-segment-size=" + segment, "--local-buffer-size=16M",
                     "--socket=" + self.socket] + ssd_args(self.ssd, size, extra)
        self.ports = None
        self.d = None
        self.start(wait)

    def start(self, wait=True):
        self.d = Daemon("agent", args=self.args, ports=self.ports, env=st.daemon_env(),
                        wait=wait)
        self.ports = dict(self.d.ports)
        self.name = self.d.addr("agent-listen")
        if wait:
            self.wait_ready()

    def wait_ready(self):
        wait_for(lambda: "re-sync with master" in self.d.output(), timeout=30,
                 what="SSD tier mounted and reported")

    def store(self, **kw):
        from mooncake.store import MooncakeDistributedStore
        s = MooncakeDistributedStore()
        kw.setdefault("verify_gets", True)
        eq(s.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", "unused",
                   socket_path=self.socket, **kw), 0, "setup")
        return s

    def metrics(self):
        import urllib.request
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.ports["agent-http"],
                                    timeout=5) as r:
            return r.read().decode()

    def ctl(self, *args, check=True):
        return run([mctest.MOONCAKECTL] + list(args) + ["--socket=" + self.socket],
                   check=check)


def master(args=()):
    """A master that lets a killed agent's segments go soon (a restarted
    agent mounts its DRAM segment again at another address only then), and
    whose read leases (which hold objects where they are) end soon."""
    return Daemon("master", args=["--meta-endpoints=", "--agent-ttl=2s",
                                  "--default-kv-lease-ttl=1s"] + list(args),
                  env=st.daemon_env())


def mstats(m):
    out = run([mctest.MOONCAKECTL, "stats", "--master=" + m.addr("master-listen")]).stdout
    d = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                d[parts[0]] = float(parts[1])
            except ValueError:
                pass
    d["_text"] = out
    return d


def settle(m):
    """Wait until no demotion is on its way."""
    wait_for(lambda: mstats(m)["demoting"] == 0, timeout=60, what="demotions done")


def put_paced(m, s, keys):
    """Put keys, waiting for the demotions every 16 puts. Puts faster than
    the SSD tier takes them make the master evict from DRAM for real (as
    it must: the puts need the room); how many depends on the machine's
    load, and the cases below want demotions they can count on."""
    for i, k in enumerate(keys):
        eq(s.put(k, value(k)), OK, "put " + k)
        if i % 16 == 15:
            settle(m)
    settle(m)


def read_all(s, keys, size=MiB):
    ok = miss = bad = 0
    for k in keys:
        v = s.get(k)
        if v == value(k, size):
            ok += 1
        elif len(v) == 0:
            miss += 1
        else:
            bad += 1
    return ok, miss, bad


@case
def demotion_keeps_every_key_readable_from_the_owner_and_another_agent():
    m = master()
    a = Node(m.addr("master-listen"), size="128M")
    b = Node(m.addr("master-listen"), size="128M")
    sa, sb = a.store(), b.store()
    keys = ["d/%d" % i for i in range(200)]  # 200 MiB through a 64 MiB segment
    put_paced(m, sa, keys)
    ms = mstats(m)
    assert ms["demotions"] > 50, ms["_text"]
    ra, rb = read_all(sa, keys), read_all(sb, keys)
    eq((ra[2], rb[2]), (0, 0), "no wrong bytes (owner, other agent)")
    eq(ra[1], rb[1], "the same keys missing from both")
    ms = mstats(m)
    eq(ra[1], int(ms["evictions"] + ms["ssd_evictions"]),
       "every missing key was evicted (from DRAM when the SSD could not keep up, "
       "or from SSD past its watermark): %s" % (ms,))
    ma, mb = a.metrics(), b.metrics()
    eq(metric(ma, "mooncake_agent_ssd_demotions_total") +
       metric(mb, "mooncake_agent_ssd_demotions_total"), ms["demotions"],
       "the agents' demotions are the master's")
    assert metric_labels(mb, "mooncake_agent_get_hits_total", 'source="remote_ssd"') > 0, \
        "B read A's SSD tier"
    assert metric(ma, "mooncake_agent_ssd_peer_reads_total") > 0
    assert metric_labels(ma, "mooncake_agent_get_hits_total", 'source="ssd"') > 0
    # Another round of pressure (once the gets' read leases are over)
    # evicts from SSD past its watermark too.
    # How much reaches the SSD tiers depends on the load (puts that find
    # no room evict from DRAM for real): put until they pass their
    # watermark, 1200 MiB at most through 128 MiB of DRAM and 256 of SSD.
    time.sleep(1.2)
    more = []
    while len(more) < 1200 and mstats(m)["ssd_evictions"] == 0:
        batch = ["e/%d" % i for i in range(len(more), len(more) + 100)]
        put_paced(m, sa, batch)
        more += batch
    ra = read_all(sa, keys + more)
    ms = mstats(m)
    eq(ra[2], 0, "no wrong bytes")
    assert ms["ssd_evictions"] > 0, ms["_text"]
    eq(ra[1], int(ms["evictions"] + ms["ssd_evictions"]), "missing = evicted: %s" % (ms,))
    assert "127.0.0.1:%d/ssd" % a.ports["agent-listen"] in ms["_text"], "stats show it"


@case
def a_restarted_agent_brings_its_ssd_objects_back():
    m = master()
    a = Node(m.addr("master-listen"))
    s = a.store()
    keys = ["r/%d" % i for i in range(150)]
    put_paced(m, s, keys)
    on_ssd = int(mstats(m)["ssd_objects"])
    # 70-98 of the 150 on an idle 2-core VM, 49 in a loaded CI run (puts
    # faster than the demotions make the master evict for real): a few
    # dozen is what the restart needs to show.
    assert on_ssd >= 32, on_ssd
    a.d.kill()
    a.start()
    assert "%d objects (" % on_ssd in a.d.output(), "recovery logs what it found"
    eq(metric(a.metrics(), "mooncake_agent_ssd_recovered_objects"), on_ssd, "and counts it")
    ok, miss, bad = read_all(a.store(), keys)
    eq((ok, bad), (on_ssd, 0), "every SSD object back, no wrong bytes (%d DRAM ones lost)"
       % miss)


@case
def the_standalone_daemon_after_kill9():
    tmp = tempfile.TemporaryDirectory(prefix="mooncake-ssd-sa-")
    data = os.path.join(tmp.name, "data")
    args = ssd_args(os.path.join(tmp.name, "ssd"))
    d = Daemon(args=args, data_dir=data, env=st.daemon_env())
    ports = dict(d.ports)
    wait_for(lambda: "re-sync with master" in d.output(), timeout=30, what="ready")
    node = Node.__new__(Node)
    node.socket, node.ports = d.socket, ports
    from mooncake.store import ReplicateConfig
    s = node.store()
    keys = ["s/%d" % i for i in range(120)]
    for i, k in enumerate(keys):
        cfg = ReplicateConfig(tier="ssd") if i % 4 == 0 else None
        eq(s.put(k, value(k), cfg), OK, "put " + k)
    ms = {}

    def settled():
        ms.update(mstats(d))
        return ms["demoting"] == 0

    wait_for(settled, timeout=60, what="demotions done")
    on_ssd = int(ms["ssd_objects"])
    assert on_ssd >= 30, ms
    d.kill()
    d = Daemon(args=args, data_dir=data, ports=ports, env=st.daemon_env())
    wait_for(lambda: "re-sync with master" in d.output(), timeout=30, what="ready again")
    node.socket = d.socket
    ok, miss, bad = read_all(node.store(), keys)
    eq((ok, bad), (on_ssd, 0), "every SSD object back, no wrong bytes")


@case
def kill9_during_demotions_and_during_recovery():
    m = master()
    a = Node(m.addr("master-listen"), extra=["--ssd-sync-interval=0ms"])
    s = a.store()
    keys = ["k/%d" % i for i in range(150)]
    for k in keys:
        eq(s.put(k, value(k)), OK, "put " + k)
    a.d.kill()  # demotions on their way
    a.start()
    ok, miss, bad = read_all(a.store(), keys)
    eq(bad, 0, "no wrong bytes after a kill during demotions")
    assert ok > 0
    assert "ERROR" not in a.d.output(), a.d.output()[-3000:]
    # Recovery that reads every object back (--ssd-verify-on-start), killed
    # while it reads.
    a.d.kill()
    a.args.append("--ssd-verify-on-start=true")
    a.start(wait=False)

    def recovering():
        fds = "/proc/%d/fd" % a.d.pid
        try:
            return any(os.readlink(os.path.join(fds, f)) == os.path.join(a.ssd, "LOCK")
                       for f in os.listdir(fds))
        except OSError:
            return False

    deadline = time.monotonic() + 20
    while not recovering() and time.monotonic() < deadline:
        time.sleep(0.001)
    a.d.kill()
    print("killed %s recovery" % ("after" if "recovered" in a.d.output() else "during"))
    a.args.pop()
    a.start()
    ok2, miss2, bad2 = read_all(a.store(), keys)
    eq((ok2, bad2), (ok, 0), "a kill during recovery loses nothing")


def data_file_find(path, needle):
    with open(path, "rb") as f:
        data = f.read()
    return data.find(needle)


@case
def torn_and_corrupt_records_are_dropped_never_served():
    m = master()
    a = Node(m.addr("master-listen"), extra=["--ssd-sync-interval=0ms"])
    s = a.store()
    from mooncake.store import ReplicateConfig
    keys = ["t/%d" % i for i in range(20)]
    for k in keys:
        eq(s.put(k, value(k, 64 * 1024), ReplicateConfig(tier="ssd")), OK, "put " + k)
    a.d.kill()
    index = os.path.join(a.ssd, "ssd.index")
    data = os.path.join(a.ssd, "ssd.data")
    with open(index, "r+b") as f:
        f.truncate(os.path.getsize(index) - 10)  # the last record torn
    victim = "t/3"
    at = data_file_find(data, value(victim, 64))
    assert at > 0
    with open(data, "r+b") as f:
        f.seek(at + 100)
        b = f.read(1)
        f.seek(at + 100)
        f.write(bytes([b[0] ^ 0xff]))
    a.start()
    out = a.d.output()
    assert "torn record" in out, out[-3000:]
    s = a.store()
    eq(s.get(keys[-1]), b"", "the torn record's object is gone")
    # Read first by another agent: the owner reads it (through its
    # staging memory, copied into its bounce region as it is checked).
    b = Node(m.addr("master-listen"))
    eq(b.store().get(victim), b"", "the corrupt object is never served to another node")
    eq(b.store().get(keys[0]), value(keys[0], 64 * 1024), "a sound one is")
    got = s.get(victim)
    eq(got, b"", "the corrupt object is never served")
    wait_for(lambda: "do not match" in a.d.output() or "checksum" in a.d.output(),
             what="a log line about the bad bytes")
    eq(s.get(victim), b"", "and it stays dropped")
    ok = sum(s.get(k) == value(k, 64 * 1024) for k in keys)
    eq(ok, len(keys) - 2, "every other object")
    assert metric(a.metrics(), "mooncake_agent_ssd_lost_total") >= 1
    # Checked at start instead: dropped before anything is served.
    at = data_file_find(data, value("t/5", 64))
    a.d.kill()
    with open(data, "r+b") as f:
        f.seek(at + 7)
        f.write(b"\0\1\2")
    a.args.append("--ssd-verify-on-start=true")
    a.start()
    a.args.pop()
    assert "1 objects dropped" in a.d.output() or "dropped" in a.d.output()
    eq(a.store().get("t/5"), b"", "dropped at start")


def exit_status(args, timeout=30):
    tmp = tempfile.TemporaryDirectory(prefix="mooncake-ssd-bad-")
    p = subprocess.run([mctest.MOONCAKED, "--role=agent", "--data-dir=" + tmp.name + "/d",
                        "--meta-endpoints=", "--master-address=127.0.0.1:1",
                        "--socket=" + tmp.name + "/a.sock", "--agent-listen=127.0.0.1:0",
                        "--agent-http=127.0.0.1:0", "--global-segment-size=16M"] + args,
                       capture_output=True, text=True, timeout=timeout,
                       env=mctest.child_env(st.daemon_env()))
    return p.returncode, p.stdout + p.stderr


def mounted_tmpfs(size, ro=False):
    d = tempfile.mkdtemp(prefix="mooncake-ssd-fs-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s%s" % (size, ",ro" if ro else ""),
                        "tmpfs", d], capture_output=True)
    return d if r.returncode == 0 else None


@case
def bad_configuration_is_refused_clearly():
    tmp = tempfile.TemporaryDirectory(prefix="mooncake-ssd-cfg-")
    rc, out = exit_status(["--ssd-path=" + tmp.name + "/s"])
    eq(rc, 1, "no --ssd-size")
    assert "needs --ssd-size" in out, out
    rc, out = exit_status(["--ssd-path=" + tmp.name + "/s", "--ssd-size=1P"])
    eq(rc, 1, "larger than the free space")
    assert "free" in out and "ssd-size" in out, out
    rc, out = exit_status(["--ssd-path=" + tmp.name + "/s", "--ssd-size=64M",
                           "--ssd-staging-size=64G"])
    eq(rc, 1, "staging memory the node does not have")
    assert "--ssd-staging-size=64 GiB is more than half the memory available" in out, out
    # Two agents on one path: the second is refused, the first untouched.
    m = master()
    a = Node(m.addr("master-listen"))
    s = a.store()
    from mooncake.store import ReplicateConfig
    eq(s.put("mine", value("mine"), ReplicateConfig(tier="ssd")), OK)
    before = open(os.path.join(a.ssd, "ssd.index"), "rb").read()
    rc, out = exit_status(["--ssd-path=" + a.ssd, "--ssd-size=256M"])
    eq(rc, 1, "a second agent on the same path")
    assert "in use by another process" in out, out
    eq(open(os.path.join(a.ssd, "ssd.index"), "rb").read(), before, "nothing overwritten")
    eq(s.get("mine"), value("mine"), "the first one serves on")
    # The data dir itself.
    d = os.path.join(tmp.name, "dd")
    os.makedirs(d)
    p = subprocess.run([mctest.MOONCAKED, "--role=agent", "--data-dir=" + d, "--ssd-path=" + d,
                        "--ssd-size=64M", "--meta-endpoints=", "--master-address=127.0.0.1:1",
                        "--socket=" + d + "/a.sock", "--agent-listen=127.0.0.1:0",
                        "--agent-http=127.0.0.1:0"], capture_output=True, text=True,
                       timeout=30, env=mctest.child_env(st.daemon_env()))
    eq(p.returncode, 1, "the data dir as --ssd-path")
    assert "is the data dir" in p.stdout + p.stderr
    # A path that cannot be written, and a full file system.
    if os.geteuid() == 0:
        ro = mounted_tmpfs("4m", ro=True)
        full = mounted_tmpfs("4m")
        try:
            if ro:
                rc, out = exit_status(["--ssd-path=" + ro + "/s", "--ssd-size=2M"])
                eq(rc, 1, "unwritable")
                assert "ssd-path " + ro in out, out
            if full:
                with open(full + "/filler", "wb") as f:
                    try:
                        f.write(b"\0" * (4 * MiB))
                    except OSError:
                        pass
                rc, out = exit_status(["--ssd-path=" + full + "/s", "--ssd-size=2M"])
                eq(rc, 1, "a full file system")
                assert "ssd-path " + full in out, out
        finally:
            for p in (ro, full):
                if p:
                    subprocess.run(["umount", p])
                    os.rmdir(p)
    else:
        ro = os.path.join(tmp.name, "ro")
        os.makedirs(ro, mode=0o500)
        rc, out = exit_status(["--ssd-path=" + ro + "/s", "--ssd-size=2M"])
        eq(rc, 1, "unwritable")


@case
def the_thread_pool_engine_serves_the_tier():
    """--ssd-io=threads (what a daemon under valgrind needs) serves puts and
    gets like io_uring does; a value that is not an engine is refused."""
    rc, out = exit_status(["--ssd-io=aio"])
    eq(rc, 2, "an unknown engine: " + out)
    assert "ssd-io" in out, out
    tmp = tempfile.TemporaryDirectory(prefix="mooncake-ssd-thr-")
    d = Daemon(args=ssd_args(os.path.join(tmp.name, "ssd"), extra=["--ssd-io=threads"]),
               data_dir=os.path.join(tmp.name, "data"), env=st.daemon_env())
    wait_for(lambda: "re-sync with master" in d.output(), timeout=30, what="ready")
    assert "recovered, 0 index records and 0 objects dropped, threads" in d.output(), d.output()
    node = Node.__new__(Node)
    node.socket, node.ports = d.socket, dict(d.ports)
    from mooncake.store import ReplicateConfig
    s = node.store()
    keys = ["t/%d" % i for i in range(16)]
    for k in keys:
        eq(s.put(k, value(k), ReplicateConfig(tier="ssd")), OK, "put " + k)
    ok, miss, bad = read_all(s, keys)
    eq((ok, miss, bad), (16, 0, 0), "every object read back from the SSD tier")
    eq(d.stop(), 0, "exit")


@case
def puts_naming_the_ssd_tier_and_every_get_path():
    m = master()
    a = Node(m.addr("master-listen"))
    b = Node(m.addr("master-listen"))
    from mooncake.store import ReplicateConfig
    sa, sb = a.store(), b.store()
    v = value("p", 3 * MiB)
    eq(sa.put("p", v, ReplicateConfig(tier="ssd")), OK, "put to SSD")
    eq(sa.put("p2", v, ReplicateConfig(tier="ssd", replica_num=2)), INVALID, "one replica")
    for s, who in ((sa, "owner"), (sb, "another agent")):
        eq(s.get("p"), v, "get from " + who)
        buf = (ctypes.c_char * len(v))()
        addr = ctypes.addressof(buf)
        eq(s.register_buffer(addr, len(v)), 0)
        eq(s.get_into("p", addr, len(v)), len(v), "get_into from " + who)
        eq(bytes(buf), v)
        eq(s.batch_get_into(["p"], [addr], [len(v)]), [len(v)], "batch_get_into " + who)
        eq(bytes(buf), v)
        h = s.get_buffer("p")
        eq(bytes(memoryview(h)), v, "a zero-copy view of an SSD object: a copy, " + who)
        h.release() if hasattr(h, "release") else None
    with open(os.path.join(a.tmp.name, "v.bin"), "wb") as f:
        f.write(v)
    a.ctl("put", "q", os.path.join(a.tmp.name, "v.bin"), "--tier=ssd")
    out = os.path.join(b.tmp.name, "q.bin")
    b.ctl("get", "q", out, "--verify")
    eq(open(out, "rb").read(), v, "mooncakectl get from another agent")
    # Mooncake's setup(enable_ssd_offload=True) wants an agent with a tier.
    from mooncake.store import MooncakeDistributedStore
    s3 = MooncakeDistributedStore()
    eq(s3.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", "unused",
                enable_ssd_offload=True, socket_path=a.socket), 0, "SSD offload: the tier")
    s3.close()
    # An agent without an SSD tier refuses such puts.
    plain = st.Agent(master_addr=m.addr("master-listen"))
    eq(s3.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", "unused",
                enable_ssd_offload=True, socket_path=plain.socket), INVALID, "no tier")
    r = plain.ctl("put", "z", os.path.join(a.tmp.name, "v.bin"), "--tier=ssd", check=False)
    eq(r.returncode, 1)
    assert "segment not found" in r.stderr or "no SSD tier" in r.stderr, r.stderr


def pattern(key, size):
    """value(key) for any size, not only multiples of 32."""
    v = value(key, (size + 31) // 32 * 32)
    return v[:size]


@case
def ssd_objects_into_and_out_of_clients_ordinary_memory():
    """The SSD tier meets memory the agent did not allocate: numpy arrays
    registered with register_buffer (ordinary memory, reached through the
    staging buffer) and the process's allocator memory (a memfd the agent
    reads in place), at addresses and sizes that are not whole 4 KiB
    blocks, larger than the 16 MiB staging buffer, from the owner and
    from another node. Every get returns the object's bytes or an error,
    never success with other bytes."""
    import numpy as np
    from mooncake.store import ReplicateConfig
    m = master()
    a = Node(m.addr("master-listen"), extra=["--ssd-bounce-size=48M"])
    b = Node(m.addr("master-listen"))
    sa, sb = a.store(verify_gets=False), b.store(verify_gets=False)
    ssd = ReplicateConfig(tier="ssd")
    sizes = {"o/1m": MiB, "o/odd": 3 * MiB + 4097, "o/small": 5000, "o/big": 40 * MiB + 12}
    # Puts straight to SSD from ordinary memory: one at a time (put_from)
    # and as a batch (batch_put_from), from offsets that are not aligned.
    src = np.zeros(sum(sizes.values()) + 4096, dtype=np.uint8)
    eq(sa.register_buffer(src.ctypes.data, src.nbytes), 0, "register the source")
    at, where = 3, {}
    for k, n in sizes.items():
        src[at:at + n] = np.frombuffer(pattern(k, n), dtype=np.uint8)
        where[k] = at
        at += n + 1
    eq(sa.put_from("o/1m", src.ctypes.data + where["o/1m"], MiB, ssd), OK, "put_from to SSD")
    rest = [k for k in sizes if k != "o/1m"]
    eq(sa.batch_put_from(rest, [src.ctypes.data + where[k] for k in rest],
                         [sizes[k] for k in rest], ssd), [OK] * len(rest),
       "batch_put_from to SSD")
    eq(int(mstats(m)["ssd_objects"]), len(sizes), "all of them on SSD, none in DRAM")
    src[:] = 0  # what a get returns must come from the tier
    eq(sa.unregister_buffer(src.ctypes.data), 0)

    def check(s, who, dst, base):
        """get_into and batch_get_into into dst (registered) at base."""
        for k, n in sizes.items():
            dst[:] = 0xee
            for verify in (False, True):
                eq(s.get_into(k, dst.ctypes.data + base, n + 10, verify), n,
                   "get_into %s from %s (verify=%s)" % (k, who, verify))
                eq(dst[base:base + n].tobytes(), pattern(k, n), "%s's bytes, %s" % (k, who))
                eq(int(dst[base + n]), 0xee, "nothing written past %s, %s" % (k, who))
            eq(s.get_into(k, dst.ctypes.data + base, n - 1), INVALID,
               "a buffer too small for %s, %s" % (k, who))
        dst[:] = 0
        keys = list(sizes)
        offs, at = [], base
        for k in keys:
            offs.append(at)
            at += sizes[k] + 3
        eq(s.batch_get_into(keys, [dst.ctypes.data + o for o in offs],
                            [sizes[k] for k in keys]), [sizes[k] for k in keys],
           "batch_get_into from " + who)
        for k, o in zip(keys, offs):
            eq(dst[o:o + sizes[k]].tobytes(), pattern(k, sizes[k]),
               "%s's bytes after batch_get_into, %s" % (k, who))

    for s, who in ((sa, "the owner"), (sb, "another node")):
        dst = np.empty(sum(sizes.values()) + 4 * 4096, dtype=np.uint8)
        eq(s.register_buffer(dst.ctypes.data, dst.nbytes), 0, "register numpy, " + who)
        check(s, who + " into numpy", dst, 5)
        eq(s.unregister_buffer(dst.ctypes.data), 0)
        # Allocator memory: the agent's SSD reads land in it in place.
        n = sum(sizes.values()) + 4 * 4096
        p = s.alloc_from_mem_pool(n)
        assert p, "alloc_from_mem_pool"
        mem = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(p))
        eq(s.register_buffer(p, n), 0, "register allocator memory, " + who)
        check(s, who + " into allocator memory, aligned", mem, 0)
        check(s, who + " into allocator memory, unaligned", mem, 4095)
        eq(s.unregister_buffer(p), 0)
    eq(int(mstats(m)["ssd_objects"]), len(sizes), "read from SSD throughout (no promotion)")
    # A remote read of an object larger than the owner's bounce region
    # fails clearly instead of returning anything.
    v = pattern("o/huge", 50 * MiB)
    eq(sa.put("o/huge", v, ssd), OK)
    dst = np.zeros(50 * MiB, dtype=np.uint8)
    eq(sb.register_buffer(dst.ctypes.data, dst.nbytes), 0)
    rc = sb.get_into("o/huge", dst.ctypes.data, dst.nbytes)
    assert rc < 0, "a remote get past --ssd-bounce-size fails (%d)" % rc
    eq(int(dst.max()), 0, "and writes nothing")
    eq(sb.unregister_buffer(dst.ctypes.data), 0)
    eq(sa.get("o/huge"), v, "the owner reads it")


def thp_on():
    """Whether madvise gets transparent huge pages here (what the SSD
    tier's staging memory needs)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


@case
def staging_memory_on_huge_pages_and_without_it():
    """--ssd-staging-size: the tier's reads and writes go through memory on
    transparent huge pages (a virtual disk moves a MiB of 4 KiB pages as
    256 pieces); with 0 they go straight to and from the values' memory;
    a value that finds the staging memory full goes without it. Every path
    gives the object's bytes, from the owner and from other agents."""
    m = master()
    huge = thp_on()
    a = Node(m.addr("master-listen"))
    b = Node(m.addr("master-listen"), extra=["--ssd-staging-size=0"])
    c = Node(m.addr("master-listen"), extra=["--ssd-staging-size=2M"])
    if huge:
        eq(metric(a.metrics(), "mooncake_agent_ssd_staging_bytes"), 64 * MiB)
        assert "64 MiB of staging memory on huge pages" in a.d.output(), a.d.output()
    else:
        eq(metric(a.metrics(), "mooncake_agent_ssd_staging_bytes"), 0)
        assert "no staging memory" in a.d.output(), a.d.output()
    eq(metric(b.metrics(), "mooncake_agent_ssd_staging_bytes"), 0)
    assert "staging memory" not in b.d.output(), b.d.output()
    from mooncake.store import ReplicateConfig
    # (4 MiB and 9 MiB+7 are copied and written in parts when staged.)
    sizes = [MiB, 4 * MiB, 3 * MiB + 5, 9 * MiB + 7, 4096, 100]
    written = {}
    for n in (a, b, c):
        s = n.store()
        for i, sz in enumerate(sizes):
            k = "stg/%d/%d" % (n.ports["agent-listen"], i)
            written[k] = sz
            eq(s.put(k, pattern(k, sz), ReplicateConfig(tier="ssd")), OK, "put " + k)
        # Eight at once: more than the 2 MiB of staging memory of c holds.
        big = ["stg/%d/big/%d" % (n.ports["agent-listen"], i) for i in range(8)]
        for k in big:
            eq(s.put(k, pattern(k, MiB), ReplicateConfig(tier="ssd")), OK, "put " + k)
        s.close()
    for reader in (a, b, c):
        r = reader.store()
        for k, sz in written.items():
            eq(r.get(k), pattern(k, sz), "get %s through agent %d" % (
                k, reader.ports["agent-listen"]))
        buf = (ctypes.c_char * (8 * MiB))()
        addr = ctypes.addressof(buf)
        eq(r.register_buffer(addr, 8 * MiB), 0)
        for n in (a, b, c):
            big = ["stg/%d/big/%d" % (n.ports["agent-listen"], i) for i in range(8)]
            eq(r.batch_get_into(big, [addr + i * MiB for i in range(8)], [MiB] * 8),
               [MiB] * 8, "batch_get_into of eight")
            for i, k in enumerate(big):
                eq(bytes(buf[i * MiB:(i + 1) * MiB]), pattern(k, MiB), k)
        eq(r.unregister_buffer(addr), 0)
        r.close()
    ta, tb, tc = a.metrics(), b.metrics(), c.metrics()
    if huge:
        assert metric(ta, "mooncake_agent_ssd_staged_total") > 0, "staged"
        assert metric(tc, "mooncake_agent_ssd_staging_full_total") > 0, "2 MiB for 8 at once"
    eq(metric(tb, "mooncake_agent_ssd_staged_total"), 0)
    eq(metric(tb, "mooncake_agent_ssd_staging_full_total"), 0)


@case
def the_ssd_watermark_keys_reach_the_master():
    """--ssd-high-watermark-ratio and --ssd-eviction-ratio of the agent are
    its SSD segment's: puts straight to SSD past half of it evict a
    quarter of it, the least recently read first."""
    from mooncake.store import ReplicateConfig
    m = master()
    a = Node(m.addr("master-listen"), size="32M",
             extra=["--ssd-high-watermark-ratio=0.5", "--ssd-eviction-ratio=0.25"])
    s = a.store()
    keys = ["w/%d" % i for i in range(24)]
    for k in keys:
        eq(s.put(k, value(k), ReplicateConfig(tier="ssd")), OK, "put " + k)
    ms = mstats(m)
    assert ms["ssd_used_bytes"] <= 16 * MiB, ms["_text"]
    assert ms["ssd_evictions"] >= 8, ms["_text"]
    ok, miss, bad = read_all(s, keys)
    eq((ok + miss, bad), (len(keys), 0), "no wrong bytes")
    eq(miss, int(ms["ssd_evictions"]), "missing = evicted from SSD")
    eq(ok, int(ms["ssd_objects"]))
    eq(read_all(s, keys[-ok:]), (ok, 0, 0), "the most recent ones kept")


@case
def a_cached_ssd_replica_gone_asks_the_master_again():
    """Gets of an object in the agent's own SSD tier are answered from its
    lease cache (no master call) while the lease lasts; one whose object
    left the tier meanwhile (force-removed elsewhere, put again on another
    agent with other bytes) asks the master and returns the new bytes."""
    from mooncake.store import ReplicateConfig
    m = master()
    a = Node(m.addr("master-listen"))
    b = Node(m.addr("master-listen"))
    sa, sb = a.store(), b.store()
    ssd = ReplicateConfig(tier="ssd")
    eq(sa.put("c", value("c"), ssd), OK)
    eq(sa.get("c"), value("c"))
    hits = metric(a.metrics(), "mooncake_agent_lease_cache_hits_total")
    eq(sa.get("c"), value("c"), "from the cache")
    eq(metric(a.metrics(), "mooncake_agent_lease_cache_hits_total"), hits + 1, "a cache hit")
    eq(sb.remove("c", True), OK, "force-removed through the other agent")
    wait_for(lambda: metric(a.metrics(), "mooncake_agent_ssd_objects") == 0,
             what="the owner deleted it")
    v2 = value("c2")
    eq(sb.put("c", v2, ssd), OK, "put again, into the other agent's tier")
    eq(sa.get("c"), v2, "the new bytes, not the old ones or a miss")
    eq(sb.remove("c", True), OK)
    wait_for(lambda: metric(b.metrics(), "mooncake_agent_ssd_objects") == 0,
             what="gone from the other tier")
    eq(sa.get("c"), b"", "and a miss once it is gone")


@case
def a_hit_promotes_back_to_dram():
    m = master()
    a = Node(m.addr("master-listen"), extra=["--ssd-promote-on-hit=true"])
    s = a.store()
    from mooncake.store import ReplicateConfig
    eq(s.put("hot", value("hot"), ReplicateConfig(tier="ssd")), OK)
    eq(mstats(m)["ssd_objects"], 1)
    eq(s.get("hot"), value("hot"))
    wait_for(lambda: mstats(m)["promotions"] == 1, what="promoted")
    eq(mstats(m)["ssd_objects"], 0, "in DRAM now")
    wait_for(lambda: metric(a.metrics(), "mooncake_agent_ssd_objects") == 0,
             what="the SSD copy deleted")
    eq(s.get("hot"), value("hot"), "still the same bytes")
    eq(metric(a.metrics(), "mooncake_agent_ssd_promotions_total"), 1)


@case
def sigterm_with_flush_writes_dram_down():
    m = master()
    a = Node(m.addr("master-listen"), extra=["--ssd-flush-on-stop=true"])
    s = a.store()
    keys = ["f/%d" % i for i in range(30)]  # fits in DRAM: nothing demoted
    for k in keys:
        eq(s.put(k, value(k)), OK)
    eq(mstats(m)["ssd_objects"], 0)
    eq(a.d.stop(), 0, "exit status of the stop")
    assert "30 of the 30 objects" in a.d.output(), a.d.output()[-2000:]
    a.start()
    eq(read_all(a.store(), keys), (30, 0, 0), "every object after the restart")


@case
def metrics_and_stats_show_both_tiers():
    m = master()
    a = Node(m.addr("master-listen"), size="128M")
    text = a.metrics()
    eq(metric(text, "mooncake_agent_ssd_bytes"), 128 * MiB)
    for name in ("mooncake_agent_ssd_used_bytes", "mooncake_agent_ssd_demotions_total",
                 "mooncake_agent_ssd_promotions_total", "mooncake_agent_ssd_recovered_objects",
                 "mooncake_agent_ssd_recovery_milliseconds",
                 "mooncake_agent_ssd_dropped_objects"):
        metric(text, name)
    assert "mooncake_agent_ssd_io_seconds_bucket" in text
    assert 'mooncake_agent_ssd_ios_total{op="read"}' in text
    import urllib.request
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % m.ports["master-http"],
                                timeout=5) as r:
        mt = r.read().decode()
    wait_for(lambda: metric_labels(urllib.request.urlopen(
        "http://127.0.0.1:%d/metrics" % m.ports["master-http"], timeout=5).read().decode(),
        "mooncake_master_capacity_bytes", 'tier="ssd"') == 128 * MiB, what="master's SSD figure")
    assert "mooncake_master_demotions_total" in mt
    ms = mstats(m)
    eq(ms["ssd_capacity_bytes"], 128 * MiB)
    out = a.ctl("stats", "--agent").stdout
    assert "ssd_bytes %d" % (128 * MiB) in out, out
    assert "ssd_segment 127.0.0.1:%d/ssd" % a.ports["agent-listen"] in out, out
    # The tier's I/Os and their mean time, as its metrics count them.
    from mooncake.store import ReplicateConfig
    s = a.store()
    for k in ("io/1", "io/2"):
        eq(s.put(k, value(k), ReplicateConfig(tier="ssd")), OK)
    eq(s.get("io/1"), value("io/1"))
    ag = dict(l.split(" ", 1) for l in a.ctl("stats", "--agent").stdout.splitlines())
    text = a.metrics()
    eq(int(ag["ssd_writes"]), 2)
    eq(int(ag["ssd_reads"]), 1)
    eq(int(ag["ssd_writes"]), metric_labels(text, "mooncake_agent_ssd_ios_total", 'op="write"'))
    eq(int(ag["ssd_reads"]), metric_labels(text, "mooncake_agent_ssd_ios_total", 'op="read"'))
    for op in ("read", "write"):
        mean = float(ag["ssd_%s_mean_us" % op])
        total = metric_labels(text, "mooncake_agent_ssd_io_seconds_sum", 'op="%s"' % op)
        n = int(ag["ssd_%ss" % op])
        assert mean > 0 and abs(mean - total * 1e6 / n) <= 1, (op, mean, total, n)


@case
def bench_store_tier_ssd_runs_beside_fio():
    """mooncakectl bench store --tier=ssd: a master and two agents with SSD
    tiers, puts into the tier and gets from the local and the remote one,
    every operation right, beside fio (a Debian package, as in CI)."""
    tmp = tempfile.TemporaryDirectory()
    cwd = tempfile.TemporaryDirectory()
    r = run([mctest.MOONCAKECTL, "bench", "store", "--tier=ssd", "--value-size=1M",
             "--clients=2", "--duration=1s", "--rounds=1", "--ssd-size=256M",
             "--dir=" + tmp.name], timeout=120, cwd=cwd.name)
    eq(os.listdir(cwd.name), [], "nothing left in the working directory")
    rows = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 12 and f[0] == "1M":
            rows[(f[1], f[2])] = f
        elif len(f) >= 7 and f[0] in ("put", "get") and f[1].startswith("fio"):
            rows[(f[0], f[1])] = f
    for op, where in (("put", "local"), ("get", "local"), ("get", "remote")):
        f = rows.get((op, where))
        assert f, (op, where, r.stdout)
        assert float(f[3]) > 0, (op, where, r.stdout)
        eq(f[11], "0", "%s %s errors" % (op, where))
        # Ratios to fio run as the tiers work (gets check every block's
        # CRC-32C) and to fio with its defaults.
        assert float(f[9]) > 0 and float(f[10]) > 0, ("ratios to fio", op, where, r.stdout)
        # The serving tier's own I/O time beside the operation's.
        assert 0 < float(f[7]) <= float(f[6]) * 2, ("the tier's io(us)", op, where, r.stdout)
    for op in ("put", "get"):
        for fio in ("fio", "fio-plain"):
            assert (op, fio) in rows, (op, fio, r.stdout)
            assert float(rows[(op, fio)][6]) > 0, ("fio's io(us)", op, fio, r.stdout)
    assert "--verify=crc32c" in r.stdout, r.stdout
    eq(os.listdir(tmp.name), [], "its directory removed")
    tmp.cleanup()


@case
def bench_ssd_runs_the_store_beside_fio():
    """mooncakectl bench ssd: the tier's store alone, puts and checked
    gets beside fio."""
    tmp = tempfile.TemporaryDirectory()
    r = run([mctest.MOONCAKECTL, "bench", "ssd", "--size=512M", "--value-size=1M",
             "--depth=4", "--duration=2s", "--rounds=1", "--dir=" + tmp.name], timeout=120)
    lines = r.stdout.splitlines()
    for op in ("put", "get"):
        row = [l.split() for l in lines if l.split()[:2] == [op, "1M"]]
        assert row, (op, r.stdout)
        f = row[0]
        assert float(f[2]) > 0 and float(f[5]) > 0 and float(f[8]) > 0, (op, r.stdout)
    eq(os.listdir(tmp.name), [], "its directory removed")
    tmp.cleanup()


mctest.main()
