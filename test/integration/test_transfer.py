"""The transfer engine between processes, with mooncaked's own meta role
(one case with a real etcd, to show the engine works with either).

Engines run in separate processes: `mooncakectl transfer` shells (an
engine with a registered memfd buffer, driven line by line through stdin)
and `mooncaked --role=agent`. Every byte read is checked against the test
pattern (keyed by remote address and seed), for shm and tcp, for blocks of
1 B, 4 KiB, 1 MiB + 1 and 64 MiB and batches of 1,000 requests. Then the
refusals: addresses outside or overflowing a region, unregistered ones, a
wrong or missing cluster secret, a peer killed in the middle of a stream
(errors, no hang, the engine goes on serving others), and a peer restarted
with new regions (the others reconnect through the watch and succeed).
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time

import mctest
from mctest import case, Daemon, eq, free_port, wait_port, run
from teshell import Shell, first_region, secret_file, seg_key

import transfer_pb2

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"
M = 1 << 20


class Etcd:
    """A real etcd on ephemeral loopback ports, in a temporary directory."""

    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="te-etcd-")
        self.port = free_port()
        peer = free_port()
        self.endpoint = "127.0.0.1:%d" % self.port
        self.log = open(os.path.join(self.tmp.name, "log"), "wb")
        self.proc = subprocess.Popen(
            [ETCD, "--name=t", "--data-dir=" + os.path.join(self.tmp.name, "d"),
             "--listen-client-urls=http://" + self.endpoint,
             "--advertise-client-urls=http://" + self.endpoint,
             "--listen-peer-urls=http://127.0.0.1:%d" % peer,
             "--initial-advertise-peer-urls=http://127.0.0.1:%d" % peer,
             "--initial-cluster=t=http://127.0.0.1:%d" % peer],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_port(self.port, proc=self.proc)
        deadline = time.monotonic() + 20
        while self.ctl("endpoint", "health", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise AssertionError("etcd did not become healthy")
            time.sleep(0.05)

    user = []  # etcdctl's --user (none for a real etcd)

    def ctl(self, *args, check=True):
        return run([ETCDCTL, "--endpoints=" + self.endpoint] + self.user + list(args),
                   check=check, env=dict(os.environ, ETCDCTL_API="3"))

    def get(self, key):
        """The value of key (bytes) or None."""
        r = subprocess.run([ETCDCTL, "--endpoints=" + self.endpoint] + self.user +
                           ["get", key, "--print-value-only"], capture_output=True, timeout=30,
                           env=dict(os.environ, ETCDCTL_API="3"))
        if r.returncode != 0:
            raise AssertionError(r.stderr.decode())
        return r.stdout[:-1] if r.stdout else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.tmp.cleanup()


class OwnMeta(Etcd):
    """A one-member mooncaked --role=meta in place of etcd: the same etcd v3
    API, so the same helpers (etcdctl get, endpoint health) apply."""

    def __init__(self):  # noqa: D107 - no etcd process of its own
        self.d = Daemon("meta", args=["--heartbeat-interval=50ms", "--election-timeout=500ms"])
        self.endpoint = self.d.addr("listen-client")
        self.proc = self.d.proc
        self.user = mctest.etcd_user()  # it wants the tests' cluster secret
        deadline = time.monotonic() + 20
        while self.ctl("endpoint", "health", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise AssertionError("meta did not become healthy")
            time.sleep(0.05)

    def stop(self):
        self.d.kill()


META_SRV = {}


def etcd(kind="meta"):
    """The meta service of the tests, started once: mooncaked's own meta,
    or with kind="etcd" a real etcd."""
    if kind not in META_SRV:
        META_SRV[kind] = Etcd() if kind == "etcd" else OwnMeta()
    return META_SRV[kind]


def shell(name, *args, meta=True, wait=True):
    """meta: True (mooncaked's meta), "etcd" (a real etcd) or False (P2P).
    A shell given --insecure-transfer runs without the tests' shared
    secret (the two would contradict each other)."""
    a = ["--segment=" + name] if name else []
    a.append("--meta-endpoints=" + (etcd("etcd" if meta == "etcd" else "meta").endpoint
                                    if meta else ""))
    env = {"MOONCAKE_CLUSTER_SECRET_FILE": None} if "--insecure-transfer" in args else None
    return Shell(a + list(args), wait=wait, env=env)


# ------------------------------------------------------------ data path

def blocks_checksummed(proto, target_args=(), meta=True):
    """Every size both ways against a target filled with pattern 7."""
    b = shell("blocks-b-" + proto if meta else None, "--buffer=80M", "--fill=7", *target_args,
              meta=meta)
    name = b.name
    a = shell("blocks-a-" + proto if meta else None, "--buffer=4M", "--protocol=" + proto,
              meta=meta)
    r = a.ok("open " + name)
    want = "shm" if proto == "auto" else proto
    assert ("transport=%s " % want) in r, r
    # reads of what the target holds
    for off, ln in ((0, "1"), (4097, "4K"), (3, "1M+1"), (0, "64M")):
        r = a.ok("read %s %s %s 7" % (name, off, ln))
        assert "verified" in r, r
    # writes, then reads that see them
    for off, ln, seed in ((70 * M + 5, "1", 21), (70 * M + 11, "4K", 22),
                          (71 * M + 1, "1M+1", 23), (1, "64M", 24)):
        a.ok("write %s %d %s %d" % (name, off, ln, seed))
        r = a.ok("read %s %d %s %d" % (name, off, ln, seed))
        assert "verified" in r, r
    # a batch of 1,000 requests each way
    a.ok("write %s 0 4K 31 1000" % name)
    r = a.ok("read %s 0 4K 31 1000" % name)
    assert "requests=1000" in r and "verified" in r, r
    # and one of 1,000 uneven requests over 1 MiB + 1 slices
    a.ok("write %s 5 65537 32 1000" % name)
    a.ok("read %s 5 65537 32 1000" % name)
    # the target's own view of its memory, through its own engine
    r = b.ok("read %s 5 65537 32 1000" % name)
    assert "verified" in r, r
    eq(a.close(), 0, "initiator exit")
    eq(b.close(), 0, "target exit")


@case
def shm_blocks_checksummed():
    blocks_checksummed("auto")


@case
def tcp_blocks_checksummed():
    blocks_checksummed("tcp")


@case
def shm_and_tcp_blocks_checksummed_with_etcd():
    blocks_checksummed("auto", meta="etcd")
    blocks_checksummed("tcp", meta="etcd")


@case
def tcp_and_shm_in_p2p_mode_without_meta():
    blocks_checksummed("tcp", meta=False)
    blocks_checksummed("auto", meta=False)


@case
def bench_transfer_writes_a_target_only_when_told():
    """`bench transfer --target` with --op=write (the default op) would
    overwrite the target's memory from its start: refused (exit 2) unless
    --overwrite-target says so; reads are measured as they are."""
    b = shell("bench-target", "--buffer=80M", "--fill=7")
    base = [mctest.MOONCAKECTL, "bench", "transfer", "--target=" + b.name,
            "--meta-endpoints=" + etcd("meta").endpoint, "--duration=200ms",
            "--block-size=64K"]
    for op in ([], ["--op=write"]):
        r = run(base + op, check=False)
        eq(r.returncode, 2, "write without --overwrite-target")
        assert "--overwrite-target" in r.stderr and b.name in r.stderr, r.stderr
    r = run(base + ["--op=read"], timeout=120)
    assert "bench transfer: tcp read" in r.stdout, r.stdout
    r = b.ok("read %s 0 4M 7" % b.name)
    assert "verified" in r, "reads left its bytes alone: " + r
    r = run(base + ["--op=write", "--overwrite-target"], timeout=120)
    assert "bench transfer: tcp write" in r.stdout, r.stdout
    eq(b.close(), 0, "target exit")


@case
def refusals_leave_memory_and_connections_alone():
    for proto in ("auto", "tcp"):
        b = shell("refuse-b-" + proto, "--buffer=8M", "--fill=7")
        a = shell("refuse-a-" + proto, "--buffer=0", "--protocol=" + proto)
        r = a.ok("open " + b.name)
        base = first_region(r)[0]
        for what in ("read %s 7M 2M" % b.name,                    # runs past the end
                     "read %s 8M 1" % b.name,                     # one past the end
                     "write %s %d 2 9" % (b.name, 8 * M - 1),     # straddles the end
                     "read %s @0x1000 4096" % b.name,             # never registered
                     "write %s @%d 4096 9" % (b.name, base - 4096),  # just before
                     "read %s @0xffffffffffffff00 4096" % b.name,    # wraps
                     "read %s @%d 8M+1" % (b.name, base)):           # whole + 1
            a.error(what, "MC_EREMOTE_ACCESS")
        # a batch where only some requests are refused
        r = a.error("read %s 7M 512K 7 3" % b.name, "MC_EREMOTE_ACCESS")
        assert "1 of 3 requests failed" in r, r
        # nothing was written: the target still holds pattern 7 everywhere
        r = b.ok("read %s 0 8M 7" % b.name)
        assert "verified" in r, r
        # and the same connections go on working
        a.ok("read %s 0 8M 7" % b.name)
        a.close()
        b.close()


@case
def cluster_secret_is_checked():
    # Through a real etcd: engines with different secrets share it (a meta
    # member with the tests' secret would refuse their descriptors).
    with tempfile.TemporaryDirectory() as tmp:
        s1, s2 = secret_file(tmp, "alpha"), secret_file(tmp, "bravo")
        b = shell("secret-b", "--buffer=1M", "--fill=7", "--cluster-secret-file=" + s1,
                  meta="etcd")
        for proto in ("auto", "tcp"):
            wrong = shell("secret-wrong-" + proto, "--buffer=0", "--protocol=" + proto,
                          "--cluster-secret-file=" + s2, meta="etcd")
            wrong.error("open secret-b", "EACCES")
            wrong.close()
            none = shell("secret-none-" + proto, "--buffer=0", "--protocol=" + proto,
                         "--insecure-transfer", meta="etcd")
            none.error("open secret-b", "EACCES")
            none.close()
            good = shell("secret-good-" + proto, "--buffer=0", "--protocol=" + proto,
                         "--cluster-secret-file=" + s1, meta="etcd")
            r = good.ok("read secret-b 0 1M 7")
            assert "verified" in r, r
            good.close()
        # a peer with a secret refuses one without
        c = shell("secret-c", "--buffer=1M", "--fill=7", "--insecure-transfer", meta="etcd")
        d = shell("secret-d", "--buffer=0", "--protocol=tcp", "--cluster-secret-file=" + s1,
                  meta="etcd")
        d.error("open secret-c", "EACCES")
        assert "cluster secret mismatch" in b.stderr() + c.stderr()
        for s in (b, c, d):
            s.close()


@case
def peer_killed_mid_transfer_fails_requests_not_the_engine():
    for proto in ("tcp", "auto"):
        b = shell("kill-b-" + proto, "--buffer=64M")
        c = shell("kill-c-" + proto, "--buffer=4M", "--fill=7")
        a = shell("kill-a-" + proto, "--buffer=4M", "--fill=5", "--protocol=" + proto,
                  "--te-io-timeout=5s")
        a.ok("open " + b.name)
        a.proc.stdin.write("stress %s 0 8M 8 60\n" % b.name)
        a.proc.stdin.flush()
        eq(a.line(), "progress stress " + b.name, "stress started")
        b.kill()
        r = a.line(timeout=60)  # the stress ends with an error, not a hang
        assert r.startswith("error stress ") and "MC_EUNAVAILABLE" in r, r
        # new requests to the dead peer fail too, quickly
        a.error("write %s 0 4K 1" % b.name, "MC_EUNAVAILABLE", timeout=30)
        # the engine serves others: it reads C, and C reads it
        r = a.ok("read %s 0 4M 7" % c.name)
        assert "verified" in r, r
        r = c.ok("read %s 0 4M 5" % a.name)
        assert "verified" in r, r
        a.close()
        c.close()


@case
def stopped_peer_times_out_and_recovers():
    """A peer that stops answering (SIGSTOP) fails requests after the io
    timeout instead of hanging them; once it runs again it is used again."""
    b = shell("stop-b", "--buffer=16M", "--fill=7")
    a = shell("stop-a", "--buffer=0", "--protocol=tcp", "--te-io-timeout=1s")
    a.ok("read stop-b 0 1M 7")
    b.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = a.cmd("read stop-b 0 16M 7", timeout=60)
        assert r.startswith("error ") and ("MC_ETIMEDOUT" in r or "MC_EUNAVAILABLE" in r), r
        assert time.monotonic() - t0 < 30, "failed after the io timeout, not later"
    finally:
        b.proc.send_signal(signal.SIGCONT)
    r = a.retry_ok("read stop-b 0 16M 7")
    assert "verified" in r, r
    a.close()
    b.close()


@case
def restarted_peer_with_new_regions_is_reopened():
    for proto in ("tcp", "auto"):
        name = "restart-b-" + proto
        b = shell(name, "--buffer=8M", "--fill=7", "--te-lease-ttl=2s")
        a = shell("restart-a-" + proto, "--buffer=0", "--protocol=" + proto)
        old = first_region(a.ok("open " + name))
        a.ok("read %s 0 1M 7" % name)
        b.kill()
        # The new process takes the name once the old lease expired, with
        # a buffer at another address and another pattern.
        b2 = shell(name, "--buffer=16M", "--fill=9", "--te-lease-ttl=2s")
        r = a.retry_ok("read %s 0 1M 9" % name)
        assert "verified" in r, r
        new = first_region(a.ok("open " + name))
        assert new != old and new[1] == 16 * M, (old, new)
        a.ok("write %s 8M 8M 11" % name)
        r = b2.ok("read %s 8M 8M 11" % name)
        assert "verified" in r, r
        # A region registered later reaches the peer; one removed is refused.
        r = b2.ok("register 2M 13")
        addr = int(r.split()[2].split("+")[0], 16)
        r = a.retry_ok("read %s @%d 2M 13" % (name, addr))
        assert "verified" in r, r
        b2.ok("unregister %d" % addr)
        a.error("read %s @%d 2M 13" % (name, addr), "MC_EREMOTE_ACCESS")
        a.close()
        b2.close()


# ------------------------------------------------------------ the agent role

@case
def agent_publishes_its_segment_and_serves_refusals():
    e = etcd()
    d = Daemon("agent", args=["--meta-endpoints=" + e.endpoint, "--agent-name=agent-x",
                              "--te-lease-ttl=2s"])
    r = run([mctest.MOONCAKECTL, "health", "--endpoint=" + d.addr("agent-listen"),
             "--service=mooncake.transfer.Transfer"])
    assert "SERVING" in r.stdout, r.stdout
    deadline = time.monotonic() + 20
    while e.get(seg_key("agent-x")) is None:
        assert time.monotonic() < deadline, d.output()
        time.sleep(0.05)
    desc = transfer_pb2.SegmentDesc.FromString(e.get(seg_key("agent-x")))
    eq(desc.name, "agent-x", "name")
    eq(desc.host, "127.0.0.1", "host")
    assert desc.data_port > 0 and desc.rpc_port == d.ports["agent-listen"], desc
    assert "tcp" in desc.transports and "shm" in desc.transports, desc
    # The agent's DRAM segment (src/agent) is its one region.
    eq(len(desc.regions), 1, "the agent's segment")
    # Through meta and, without meta, through its gRPC port (P2P mode).
    for args, target in ((["--protocol=tcp"], "agent-x"),
                         (["--protocol=auto"], "agent-x")):
        a = shell("agent-peer", "--buffer=0", *args)
        r = a.ok("open " + target)
        assert "regions=1" in r, r
        a.error("read %s @0x1000 4096" % target, "MC_EREMOTE_ACCESS")
        a.error("write %s @0x7f0000000000 1M 3" % target, "MC_EREMOTE_ACCESS")
        a.close()
    p = shell(None, "--buffer=0", "--protocol=tcp", meta=False)
    r = p.ok("open " + d.addr("agent-listen"))
    assert "regions=1" in r, r
    p.error("read %s @0x1000 1" % d.addr("agent-listen"), "MC_EREMOTE_ACCESS")
    p.close()
    metrics = urlopen_text("http://127.0.0.1:%d/metrics" % d.ports["agent-http"])
    assert 'mooncake_te_refused_requests_total' in metrics, metrics
    assert 'mooncake_te_regions 1' in metrics, metrics
    # SIGTERM unpublishes at once
    eq(d.stop(), 0, "exit")
    eq(e.get(seg_key("agent-x")), None, "descriptor deleted on shutdown")
    # SIGKILL: the lease expires
    d = Daemon("agent", args=["--meta-endpoints=" + e.endpoint, "--agent-name=agent-y",
                              "--te-lease-ttl=2s"])
    deadline = time.monotonic() + 20
    while e.get(seg_key("agent-y")) is None:
        assert time.monotonic() < deadline, d.output()
        time.sleep(0.05)
    d.kill()
    deadline = time.monotonic() + 30
    while e.get(seg_key("agent-y")) is not None:
        assert time.monotonic() < deadline, "descriptor outlived its lease"
        time.sleep(0.1)


@case
def agent_segment_name_is_unique_while_its_lease_lives():
    e = etcd()
    d1 = Daemon("agent", args=["--meta-endpoints=" + e.endpoint, "--agent-name=agent-dup"])
    deadline = time.monotonic() + 20
    while e.get(seg_key("agent-dup")) is None:
        assert time.monotonic() < deadline, d1.output()
        time.sleep(0.05)
    first = transfer_pb2.SegmentDesc.FromString(e.get(seg_key("agent-dup")))
    d2 = Daemon("agent", args=["--meta-endpoints=" + e.endpoint, "--agent-name=agent-dup"])
    deadline = time.monotonic() + 20
    while "the name is held in meta" not in d2.output():
        assert time.monotonic() < deadline, d2.output()
        time.sleep(0.05)
    again = transfer_pb2.SegmentDesc.FromString(e.get(seg_key("agent-dup")))
    eq(again.incarnation, first.incarnation, "the first agent keeps its name")
    eq(d1.stop(), 0, "exit")
    # now the second one gets it
    deadline = time.monotonic() + 20
    while True:
        v = e.get(seg_key("agent-dup"))
        if v is not None and transfer_pb2.SegmentDesc.FromString(v).incarnation != first.incarnation:
            break
        assert time.monotonic() < deadline, d2.output()
        time.sleep(0.05)
    eq(d2.stop(), 0, "exit")


def urlopen_text(url):
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


if __name__ == "__main__":
    try:
        mctest.main()
    finally:
        for srv in META_SRV.values():
            srv.stop()
