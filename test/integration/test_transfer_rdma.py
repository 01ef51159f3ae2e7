"""The transfer engine's rdma transport between processes, on verbs-emu.

There is no RDMA hardware here: the engines are the TEST BUILDS
build/test/mooncakectl-emu and build/test/mooncaked-emu, the same objects
as the production binaries linked with the software verbs device of
test/verbs-emu (one-sided READ/WRITE between processes with rkey, bounds
and QP checks on the target, error completions, QP error state). Meta is
`mooncaked --role=meta` (P2P mode where said).

The same matrix as shm and tcp: blocks of 1 B, 4 KiB, 1 MiB + 1 and 64 MiB
both ways, batches of 1,000 requests, every byte checked; refusals (the
range check over the tcp fallback, and the peer's NIC refusing an rkey of
a region unregistered since: a remote access error, nothing written, the
queue pairs reconnected); a peer killed mid-transfer and one stopped; a
restarted peer with new regions; two emulated NICs per side with the
slices striped over both; how the protocol is chosen (auto, rdma, the
reasons when nothing is usable, --rdma-devices, --rdma-gid-index and
MC_GID_INDEX); RDMA limits (max_mr, ulimit -l, max_qp) as clear errors;
and `mooncakectl bench transfer --protocol=rdma`.
"""
import os
import re
import resource
import signal
import tempfile
import time

import mctest
from mctest import case, Daemon, eq, run
from teshell import Shell, first_region

M = 1 << 20
CTL_EMU = os.path.join(mctest.BUILD, "test", "mooncakectl-emu")
MOONCAKED_EMU = os.path.join(mctest.BUILD, "test", "mooncaked-emu")

META = None


def meta():
    """One mooncaked meta member for the whole file."""
    global META
    if META is None:
        META = Daemon("meta")
    return META.addr("listen-client")


def shell(name, *args, p2p=False, nics=1, env=None, exe=CTL_EMU, wait=True,
          preexec_fn=None):
    a = ["--segment=" + name] if name and not p2p else []
    a.append("--meta-endpoints=" + ("" if p2p else meta()))
    e = {"VERBS_EMU_DEVICES": str(nics)}
    e.update(env or {})
    return Shell(a + list(args), exe=exe, env=e, wait=wait, preexec_fn=preexec_fn)


def metrics(sh, prefix="mooncake_te_"):
    """{name{labels}: value} of the shell's own metrics."""
    r = sh.ok("metrics " + prefix)
    out = {}
    for item in r[len("ok metrics "):].split("; "):
        if item:
            k, v = item.rsplit(" ", 1)
            out[k] = float(v)
    return out


def verified(sh, cmd, retry=False, **kw):
    """Run a read that checks every byte; it must say so."""
    r = sh.retry_ok(cmd, **kw) if retry else sh.ok(cmd)
    assert "verified" in r, r
    return r


def nic_bytes(m, nic, op):
    return m.get('mooncake_te_rdma_nic_bytes_total{nic="%s",op="%s"}' % (nic, op), 0)


def buf0(sh):
    """The address of a shell's --buffer (addresses are absolute: an rdma
    shell also registers the local memory it transfers from, which may
    come first in its segment)."""
    r = sh.ok("info")
    return int(r.split()[5].split("+")[0], 16)


def matrix(a, b):
    """Every size both ways against b (filled with pattern 7 at start)."""
    name, base = b.name, buf0(b)
    r = a.ok("open " + name)
    assert "transport=rdma " in r, r
    for off, ln in ((0, "1"), (4097, "4K"), (3, "1M+1"), (0, "64M")):
        verified(a, "read %s @%d %s 7" % (name, base + off, ln))
    for off, ln, seed in ((70 * M + 5, "1", 21), (70 * M + 11, "4K", 22),
                          (71 * M + 1, "1M+1", 23), (1, "64M", 24)):
        a.ok("write %s @%d %s %d" % (name, base + off, ln, seed))
        verified(a, "read %s @%d %s %d" % (name, base + off, ln, seed))
    a.ok("write %s @%d 4K 31 1000" % (name, base))
    r = a.ok("read %s @%d 4K 31 1000" % (name, base))
    assert "requests=1000" in r and "verified" in r, r
    a.ok("write %s @%d 65537 32 1000" % (name, base + 5))
    verified(a, "read %s @%d 65537 32 1000" % (name, base + 5))
    # what the target holds, read through its own engine
    verified(b, "read %s @%d 65537 32 1000" % (name, base + 5))


# ------------------------------------------------------------ data path

@case
def rdma_blocks_checksummed_with_mooncaked_meta():
    b = shell("rdma-blocks-b", "--buffer=80M", "--fill=7", "--protocol=rdma")
    a = shell("rdma-blocks-a", "--buffer=4M", "--protocol=rdma")
    matrix(a, b)
    m = metrics(a)
    # every byte went through the NIC, none through the tcp fallback
    assert nic_bytes(m, "emu_0", "read") > 190 * M, m
    assert nic_bytes(m, "emu_0", "write") > 130 * M, m
    eq(m["mooncake_te_rdma_tcp_fallback_slices_total"], 0, "fallback slices")
    eq(m["mooncake_te_rdma_qp_errors_total"], 0, "QP errors")
    assert m['mooncake_te_bytes_total{transport="rdma",op="read"}'] > 190 * M, m
    assert "RDMA queue pairs (1 NICs here, 1 there)" in a.stderr(), a.stderr()
    eq(a.close(), 0, "initiator exit")
    eq(b.close(), 0, "target exit")


@case
def rdma_blocks_checksummed_in_p2p_mode():
    b = shell(None, "--buffer=80M", "--fill=7", "--protocol=rdma", p2p=True)
    a = shell(None, "--buffer=4M", "--protocol=rdma", p2p=True)
    matrix(a, b)
    eq(a.close(), 0, "initiator exit")
    eq(b.close(), 0, "target exit")


@case
def rdma_two_nics_per_side_stripe_slices():
    b = shell("rdma-nics-b", "--buffer=80M", "--fill=7", "--protocol=rdma", nics=2)
    a = shell("rdma-nics-a", "--buffer=4M", "--protocol=rdma", nics=2)
    base = buf0(b)
    r = a.ok("open " + b.name)
    assert "transport=rdma " in r, r
    verified(a, "read %s @%d 64M 7" % (b.name, base))
    a.ok("write %s @%d 16M 41" % (b.name, base + 1))
    verified(b, "read %s @%d 16M 41" % (b.name, base + 1))
    m = metrics(a)
    for nic in ("emu_0", "emu_1"):
        # 64 slices of 1 MiB striped over two QPs, one per NIC pair
        assert nic_bytes(m, nic, "read") >= 16 * M, (nic, m)
        assert nic_bytes(m, nic, "write") >= 4 * M, (nic, m)
    assert "2 RDMA queue pairs (2 NICs here, 2 there)" in a.stderr(), a.stderr()
    # the descriptor lists both NICs, each region an rkey per NIC
    assert "rdma transport: emu_1 port 1" in b.stderr(), b.stderr()
    # one NIC on one side, two on the other: still two queue pairs
    c = shell("rdma-nics-c", "--buffer=4M", "--protocol=rdma", nics=1)
    verified(c, "read %s @%d 8M 7" % (b.name, base + 32 * M))
    assert "2 RDMA queue pairs (1 NICs here, 2 there)" in c.stderr(), c.stderr()
    for s in (a, b, c):
        eq(s.close(), 0, "exit")


@case
def rdma_local_memory_not_registered_goes_over_tcp():
    b = shell("rdma-local-b", "--buffer=8M", "--fill=7", "--protocol=rdma")
    a = shell("rdma-local-a", "--buffer=0", "--protocol=rdma", "--local-memory=malloc")
    verified(a, "read %s 0 8M 7" % b.name)
    a.ok("write %s 1 1M+1 5" % b.name)
    verified(b, "read %s 1 1M+1 5" % b.name)
    m = metrics(a)
    assert m["mooncake_te_rdma_tcp_fallback_slices_total"] >= 10, m
    eq(nic_bytes(m, "emu_0", "read"), 0, "no RDMA without an lkey")
    a.close()
    b.close()


# ------------------------------------------------------------ refusals

@case
def rdma_refusals_leave_memory_and_connections_alone():
    b = shell("rdma-refuse-b", "--buffer=8M", "--fill=7", "--protocol=rdma")
    a = shell("rdma-refuse-a", "--buffer=0", "--protocol=rdma")
    base = buf0(b)
    eq(first_region(a.ok("open " + b.name))[0], base, "b's one region")
    for what in ("read %s @%d 2M" % (b.name, base + 7 * M),
                 "read %s @%d 1" % (b.name, base + 8 * M),
                 "write %s @%d 2 9" % (b.name, base + 8 * M - 1),
                 "read %s @0x1000 4096" % b.name,
                 "write %s @%d 4096 9" % (b.name, base - 4096),
                 "read %s @0xffffffffffffff00 4096" % b.name,
                 "read %s @%d 8M+1" % (b.name, base)):
        a.error(what, "MC_EREMOTE_ACCESS")
    r = a.error("read %s @%d 512K 7 3" % (b.name, base + 7 * M), "MC_EREMOTE_ACCESS")
    assert "1 of 3 requests failed" in r, r
    verified(b, "read %s @%d 8M 7" % (b.name, base))
    verified(a, "read %s @%d 8M 7" % (b.name, base))
    a.close()
    b.close()


@case
def rdma_nic_refuses_an_unregistered_region():
    """P2P mode (no watch): the initiator keeps the descriptor it opened
    with, so after the target unregisters a region its rkey reaches the
    target's NIC, which refuses it: remote access error, nothing written,
    and the queue pair (in error now) is replaced."""
    b = shell(None, "--buffer=8M", "--fill=7", "--protocol=rdma", p2p=True)
    base = buf0(b)
    r = b.ok("register 2M 13")
    addr = int(r.split()[2].split("+")[0], 16)
    a = shell(None, "--buffer=0", "--protocol=rdma", p2p=True)
    r = a.ok("open " + b.name)
    assert "regions=2" in r, r
    verified(a, "read %s @%d 2M 13" % (b.name, addr))
    b.ok("unregister %d" % addr)
    a.error("write %s @%d 1M 9" % (b.name, addr), "MC_EREMOTE_ACCESS")
    a.error("read %s @%d 4K 13" % (b.name, addr), "MC_EREMOTE_ACCESS")
    # The queue pair's error is counted once the failed slice's request
    # has completed (its completion is delivered first).
    mctest.wait_for(lambda: metrics(a)["mooncake_te_rdma_qp_errors_total"] >= 1,
                    what="the queue pair error counted")
    # the other region was not touched, and is still served
    verified(a, "read %s @%d 8M 7" % (b.name, base))
    mctest.wait_for(lambda: metrics(a)["mooncake_te_rdma_reconnects_total"] >= 1,
                    what="queue pairs reconnected")
    mctest.wait_for(lambda: "RDMA queue pairs reconnected" in a.stderr(),
                    what="reconnect logged")
    before = nic_bytes(metrics(a), "emu_0", "read")
    verified(a, "read %s @%d 8M 7" % (b.name, base))
    assert nic_bytes(metrics(a), "emu_0", "read") >= before + 8 * M, "read over RDMA again"
    a.close()
    b.close()


@case
def rdma_peer_killed_mid_transfer_fails_requests_not_the_engine():
    b = shell("rdma-kill-b", "--buffer=64M", "--protocol=rdma")
    c = shell("rdma-kill-c", "--buffer=4M", "--fill=7", "--protocol=rdma")
    a = shell("rdma-kill-a", "--buffer=4M", "--fill=5", "--protocol=rdma",
              "--te-io-timeout=5s")
    abase, cbase = buf0(a), buf0(c)
    a.ok("open " + b.name)
    a.proc.stdin.write("stress %s 0 8M 8 60\n" % b.name)
    a.proc.stdin.flush()
    eq(a.line(), "progress stress " + b.name, "stress started")
    b.kill()
    r = a.line(timeout=60)  # an error, not a hang
    assert r.startswith("error stress ") and "MC_EUNAVAILABLE" in r, r
    a.error("write %s 0 4K 1" % b.name, "MC_EUNAVAILABLE", timeout=30)
    verified(a, "read %s @%d 4M 7" % (c.name, cbase))
    verified(c, "read %s @%d 4M 5" % (a.name, abase))
    a.close()
    c.close()


@case
def rdma_stopped_peer_fails_then_recovers():
    b = shell("rdma-stop-b", "--buffer=16M", "--fill=7", "--protocol=rdma")
    a = shell("rdma-stop-a", "--buffer=0", "--protocol=rdma", "--te-io-timeout=1s")
    base = buf0(b)
    a.ok("read rdma-stop-b @%d 1M 7" % base)
    b.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = a.cmd("read rdma-stop-b @%d 16M 7" % base, timeout=90)
        assert r.startswith("error ") and ("MC_ETIMEDOUT" in r or "MC_EUNAVAILABLE" in r), r
        assert time.monotonic() - t0 < 60, "failed after the timeouts, not later"
    finally:
        b.proc.send_signal(signal.SIGCONT)
    verified(a, "read rdma-stop-b @%d 16M 7" % base, deadline_s=60, retry=True)
    a.close()
    b.close()


@case
def rdma_restarted_peer_with_new_regions_is_reopened():
    name = "rdma-restart-b"
    b = shell(name, "--buffer=8M", "--fill=7", "--te-lease-ttl=2s", "--protocol=rdma")
    a = shell("rdma-restart-a", "--buffer=0", "--protocol=rdma")
    old = first_region(a.ok("open " + name))
    eq(old[0], buf0(b), "b's one region")
    a.ok("read %s 0 1M 7" % name)
    b.kill()
    b2 = shell(name, "--buffer=16M", "--fill=9", "--te-lease-ttl=2s", "--protocol=rdma")
    base = buf0(b2)
    verified(a, "read %s @%d 1M 9" % (name, base), retry=True)
    new = first_region(a.ok("open " + name))
    assert new != old and new == (base, 16 * M), (old, new)
    a.ok("write %s @%d 8M 11" % (name, base + 8 * M))
    verified(b2, "read %s @%d 8M 11" % (name, base + 8 * M))
    # A region registered later: over tcp (the serving side decides)
    # until the descriptor with its rkeys arrives, then over RDMA.
    r = b2.ok("register 2M 13")
    addr = int(r.split()[2].split("+")[0], 16)
    verified(a, "read %s @%d 2M 13" % (name, addr), retry=True)
    mctest.wait_for(lambda: "0x%x+" % addr in a.ok("open " + name), what="descriptor update")
    before = nic_bytes(metrics(a), "emu_0", "read")
    verified(a, "read %s @%d 2M 13" % (name, addr))
    eq(nic_bytes(metrics(a), "emu_0", "read"), before + 2 * M, "read over RDMA")
    # one removed is refused (by the NIC, or over tcp once the descriptor
    # says it is gone)
    b2.ok("unregister %d" % addr)
    a.error("read %s @%d 2M 13" % (name, addr), "MC_EREMOTE_ACCESS")
    verified(a, "read %s @%d 1M 9" % (name, base))
    a.close()
    b2.close()


# ------------------------------------------------------------ choosing the protocol

def agent_refusing(exe, *args, env=None):
    """Run an agent that is expected to refuse to start, on ports and a
    socket of its own (never the defaults: other tests run beside it)."""
    tmp = tempfile.TemporaryDirectory(prefix="mooncaked-refuse-")
    try:
        return run([exe, "--role=agent", "--config=", "--protocol=rdma",
                    "--data-dir=" + os.path.join(tmp.name, "data"),
                    "--agent-listen=127.0.0.1:%d" % mctest.free_port(),
                    "--agent-http=127.0.0.1:%d" % mctest.free_port(),
                    "--socket=" + os.path.join(tmp.name, "agent.sock"),
                    "--meta-endpoints=" + meta()] + list(args),
                   check=False, timeout=60, env=env)
    finally:
        tmp.cleanup()


@case
def protocol_rdma_without_a_device_refuses_to_start():
    # The production binary (static libibverbs, no RDMA device here).
    r = agent_refusing(mctest.MOONCAKED)
    assert r.returncode != 0, r
    out = r.stdout + r.stderr
    assert "--protocol=rdma: no RDMA devices found" in out, out
    # The emulator, with its port down / a device that does not exist.
    for env, args, want in (({"VERBS_EMU_PORT_STATE": "down"}, [], "no ACTIVE RDMA port"),
                            ({}, ["--rdma-devices=mlx5_9"],
                             "RDMA device 'mlx5_9' not found (devices: emu_0)"),
                            ({"VERBS_EMU_GIDS": "none"}, [], "no usable GID"),
                            ({"VERBS_EMU_OPEN_ERRNO": "EACCES"}, [],
                             "no permission to open the RDMA devices")):
        e = dict(os.environ, VERBS_EMU_DEVICES="1")
        e.update(env)
        r = agent_refusing(MOONCAKED_EMU, *args, env=e)
        assert r.returncode != 0 and want in r.stdout + r.stderr, (want, r)


@case
def protocol_auto_picks_rdma_when_usable_and_says_why_not():
    # no device: tcp, and the reason
    s = Shell(["--meta-endpoints=" + meta(), "--buffer=0"], exe=mctest.MOONCAKECTL)
    r = s.ok("info")
    assert "protocol=tcp" in r, r
    assert "no usable RDMA device (no RDMA devices found" in s.stderr(), s.stderr()
    s.close()
    # a device: rdma, with the device, port, GID and MTU it uses
    s = shell(None, "--buffer=0", env={"VERBS_EMU_MTU": "4096"})
    r = s.ok("info")
    assert "protocol=rdma" in r, r
    err = s.stderr()
    assert re.search(r"rdma transport: emu_0 port 1, GID ::ffff:127\.[0-9.]+ "
                     r"\(index 3, RoCE v2\), LID 0, MTU 4096", err), err
    assert "(remote peers: rdma)" in err, err
    s.close()
    # --rdma-gid-index picks another GID
    s = shell(None, "--buffer=0", "--rdma-gid-index=1")
    assert "(index 1, RoCE v2)" in s.stderr(), s.stderr()
    s.close()
    # the port down: tcp, and why
    s = shell(None, "--buffer=0", env={"VERBS_EMU_PORT_STATE": "down"})
    assert "protocol=tcp" in s.ok("info")
    assert "no usable RDMA device (no ACTIVE RDMA port: emu_0: port 1 is" in s.stderr()
    s.close()


@case
def agent_rdma_keys_and_mc_gid_index():
    # MC_GID_INDEX is the Mooncake name of --rdma-gid-index, through the
    # key table: --print-config shows it and where it came from.
    r = run([mctest.MOONCAKED, "--print-config", "--config="],
            env=dict(os.environ, MC_GID_INDEX="1"))
    assert re.search(r"rdma-gid-index\s*=\s*1\s.*env MC_GID_INDEX", r.stdout), r.stdout
    r = run([mctest.MOONCAKED, "--print-config", "--config=", "--rdma-gid-index=2"],
            env=dict(os.environ, MC_GID_INDEX="1"))
    assert re.search(r"rdma-gid-index\s*=\s*2\s.*flag", r.stdout), r.stdout
    r = run([mctest.MOONCAKED, "--print-config", "--config="],
            env=dict(os.environ, MC_GID_INDEX="1", MOONCAKE_RDMA_GID_INDEX="0"))
    assert re.search(r"rdma-gid-index\s*=\s*0\s.*MOONCAKE_RDMA_GID_INDEX", r.stdout), r.stdout
    # an agent on the emulator uses it, and a bad one names the table
    env = dict(os.environ, VERBS_EMU_DEVICES="1", MC_GID_INDEX="1")
    d = Daemon("agent", args=["--meta-endpoints=" + meta(), "--agent-name=rdma-agent"],
               env=env, exe=MOONCAKED_EMU)
    mctest.wait_for(lambda: "(remote peers: rdma)" in d.output(), what="engine up")
    assert "GID index 1 (RoCE v2)" in d.output() or "(index 1, RoCE v2)" in d.output(), \
        d.output()
    eq(d.stop(), 0, "agent exit")
    env["MC_GID_INDEX"] = "7"
    r = agent_refusing(MOONCAKED_EMU, env=env)
    assert r.returncode != 0 and "GID index 7 is not valid" in r.stdout + r.stderr, r


@case
def rdma_initiator_and_a_peer_without_rdma():
    # a peer whose binary has no RDMA device offers tcp and shm only
    b = Shell(["--meta-endpoints=" + meta(), "--segment=no-rdma-b", "--buffer=4M",
               "--fill=7"], exe=mctest.MOONCAKECTL)
    a = shell("rdma-only-a", "--buffer=0", "--protocol=rdma")
    a.error("open no-rdma-b", "MC_EUNAVAILABLE")
    assert "segment no-rdma-b offers no rdma transport" in a.stderr(), a.stderr()
    a.close()
    # tcp forced on the emulator build: neither offers nor uses rdma
    c = shell("tcp-c", "--buffer=0", "--protocol=tcp")
    verified(c, "read no-rdma-b 0 4M 7")
    eq(metrics(c, "mooncake_te_rdma").get("mooncake_te_rdma_qp_errors_total"), None,
       "no rdma transport at all")
    c.close()
    b.close()


# ------------------------------------------------------------ limits

def memlock(nbytes):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (nbytes, nbytes))
    return set_limit


@case
def rdma_limits_are_clear_errors():
    # max_mr: the second region cannot be registered
    s = shell(None, "--buffer=4M", "--protocol=rdma", env={"VERBS_EMU_MAX_MR": "1"})
    s.error("register 1M", "ENOMEM")
    assert "allows 1 memory regions (max_mr)" in s.stderr(), s.stderr()
    s.close()
    # ulimit -l: the buffer cannot be pinned, start-up says so
    s = shell(None, "--buffer=64M", "--protocol=rdma", wait=False,
              env={"VERBS_EMU_ENFORCE_MEMLOCK": "1"}, preexec_fn=memlock(1 << 20))
    rc = s.proc.wait(60)
    assert rc != 0, rc
    err = s.stderr()
    assert "locked-memory limit (RLIMIT_MEMLOCK, ulimit -l) is 1024 KiB" in err, err
    assert "cannot register a 64M buffer" in err, err
    # max_qp on the target: a second initiator cannot get queue pairs
    b = shell("rdma-qp-b", "--buffer=4M", "--fill=7", "--protocol=rdma",
              env={"VERBS_EMU_MAX_QP": "1"})
    a = shell("rdma-qp-a", "--buffer=0", "--protocol=rdma")
    verified(a, "read %s 0 4M 7" % b.name)
    c = shell("rdma-qp-c", "--buffer=0", "--protocol=rdma")
    c.error("open " + b.name, "ENOMEM")
    assert "allows 1 queue pairs (max_qp)" in b.stderr(), b.stderr()
    assert "the peer could not set up its queue pairs" in c.stderr(), c.stderr()
    c.close()
    a.close()
    b.close()


# ------------------------------------------------------------ benchmark

@case
def bench_transfer_rdma_on_the_emulator():
    r = run([CTL_EMU, "bench", "transfer", "--protocol=rdma", "--op=read",
             "--duration=1s", "--batch-size=8", "--block-size=256K"],
            timeout=180, env=dict(os.environ, VERBS_EMU_DEVICES="1"))
    out = r.stdout
    assert "bench transfer: rdma read" in out, out
    assert re.search(r"engine, 2 batches in flight\s+[0-9.]+ GB/s", out), out
    assert re.search(r"engine, closed loop \(1 in flight\)\s+[0-9.]+ GB/s",
                     out), out
    assert re.search(r"engine/limit [0-9.]+ \(closed loop [0-9.]+\)", out), out
    assert "software verbs device" in out and "not a NIC's" in out, out


if __name__ == "__main__":
    try:
        mctest.main()
    finally:
        if META is not None:
            META.kill()
