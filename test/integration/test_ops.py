"""The operator's knobs, through the binaries: an agent refuses a segment that
does not fit (memory: issue 17's 64G segment on a 24 GiB host; the
memory-lock limit when RDMA pins it; huge pages with --hugepages=on) with
one line naming the figures and the key, and --force-segment-size starts it
anyway; Mooncake's flag and MC_* spellings reach the keys (--print-config
names them) and MC_MTU reaches the RDMA path MTU; unknown MOONCAKE_* and
meaningless MC_* variables get one warning line in the log; --log-max-size
rotates the log; every role serves the process metrics and SyncSegment
stays out of the latency histogram."""
import glob
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request

import mctest
from mctest import Daemon, case, eq, run, wait_for

EMU = os.path.join(mctest.BUILD, "test", "mooncaked-emu")
GiB = 1 << 30


def meminfo(field):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(field)


def agent_cmd(tmp, *args, exe=None):
    return [exe or mctest.MOONCAKED, "--config=", "--role=agent", "--data-dir=" + tmp,
            "--socket=" + os.path.join(tmp, "s"), "--meta-endpoints=",
            "--master-address=127.0.0.1:1", "--agent-listen=127.0.0.1:%d" % mctest.free_port(),
            "--agent-http=127.0.0.1:%d" % mctest.free_port()] + list(args)


def refused(cmd, env=None, prefix=()):
    r = subprocess.run(list(prefix) + cmd, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, **(env or {})))
    lines = [l for l in (r.stdout + r.stderr).splitlines() if "refusing to start" in l]
    return r.returncode, lines, r.stdout + r.stderr


@case
def a_segment_larger_than_the_memory_is_refused():
    # Issue 17, item 7: a 64G segment on a 24 GiB host. Here: more than the
    # machine's RAM, whatever it is.
    total = meminfo("MemTotal")
    seg = "%dG" % (total // GiB + 40)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        rc, lines, out = refused(agent_cmd(tmp, "--global-segment-size=" + seg))
        eq(rc, 1, "exit status")
        eq(len(lines), 1, "one line:\n" + out)
        line = lines[0]
        assert "--global-segment-size, %s GiB" % seg[:-1] in line, line
        assert "memory available" in line and "--force-segment-size" in line, line
        # ... and what the node has: RAM, huge pages, the memory-lock limit.
        assert re.search(r"this node: .* RAM available, \d+ of \d+ huge pages free .*, "
                         r"memory-lock limit ", line), line
        assert time.monotonic() - t0 < 30, "refused before touching the memory"


@case
def a_refused_start_with_meta_configured_frees_the_engine_cleanly():
    # The engine had asked meta for a lease when the agent refused its
    # segment; freeing the etcd client after the engine ran the lease's
    # callback on freed memory (a garbled segment name in the log, an
    # ASan report under SAN=1).
    total = meminfo("MemTotal")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [a for a in agent_cmd(tmp, "--global-segment-size=%dG" % (total // GiB + 40))
               if not a.startswith("--meta-endpoints=")]
        r = subprocess.run(cmd + ["--meta-endpoints=http://127.0.0.1:%d" % mctest.free_port()],
                           capture_output=True, timeout=60)
        eq(r.returncode, 1, "exit status")
        out = (r.stdout + r.stderr).decode("utf-8")  # raises on a garbled name
        assert "refusing to start" in out, out
        assert "cannot get a lease" not in out, out


@case
def the_memory_lock_limit_counts_when_rdma_pins_the_segment():
    if not os.path.exists(EMU):
        raise AssertionError("%s missing: run through make test" % EMU)
    # Root may pin past its limit (CAP_IPC_LOCK): drop it, as a unit's
    # non-root user would be. 64 KiB, as a default `ulimit -l`.
    drop = ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock",
            "prlimit", "--memlock=65536:65536", "--"] if os.geteuid() == 0 else \
           ["prlimit", "--memlock=65536:65536", "--"]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = agent_cmd(tmp, "--global-segment-size=64M", "--protocol=rdma", exe=EMU)
        rc, lines, out = refused(cmd, prefix=drop)
        eq(rc, 1, "exit status:\n" + out)
        eq(len(lines), 1, "one line:\n" + out)
        assert "RLIMIT_MEMLOCK" in lines[0] and "64 KiB" in lines[0] and "64 MiB" in lines[0] \
            and "LimitMEMLOCK=infinity" in lines[0], lines[0]
        # tcp pins nothing: the same limit is fine.
        cmd = agent_cmd(tmp, "--global-segment-size=64M", "--protocol=tcp")
        p = subprocess.Popen(drop + cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        try:
            wait_for(lambda: p.poll() is None and os.path.exists(os.path.join(tmp, "s")),
                     what="tcp agent up")
        finally:
            p.terminate()
            out = p.communicate(timeout=30)[0]
        assert "refusing" not in out, out


@case
def force_segment_size_starts_anyway_with_a_warning():
    if not os.path.exists(EMU):
        raise AssertionError("%s missing: run through make test" % EMU)
    drop = ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"] \
        if os.geteuid() == 0 else []
    drop += ["prlimit", "--memlock=65536:65536", "--"]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = agent_cmd(tmp, "--global-segment-size=64M", "--protocol=rdma",
                        "--force-segment-size", exe=EMU)
        p = subprocess.Popen(drop + cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        try:
            wait_for(lambda: p.poll() is None and os.path.exists(os.path.join(tmp, "s")),
                     what="forced agent up")
        finally:
            p.terminate()
            out = p.communicate(timeout=30)[0]
        assert re.search(r"WARN .*RLIMIT_MEMLOCK.*starting anyway \(--force-segment-size\)",
                         out), out


@case
def hugepages_on_without_enough_is_refused_with_the_figures():
    free = meminfo("HugePages_Free")
    size = meminfo("Hugepagesize") or (2 << 20)
    seg = (free + 16) * size
    with tempfile.TemporaryDirectory() as tmp:
        rc, lines, out = refused(agent_cmd(tmp, "--global-segment-size=%d" % seg,
                                           "--hugepages=on"))
        eq(rc, 1, "exit status")
        eq(len(lines), 1, "one line:\n" + out)
        assert "free huge pages (%d of" % free in lines[0] and "vm.nr_hugepages" in lines[0], \
            lines[0]


@case
def mooncake_spellings_reach_the_keys():
    r = run([mctest.MOONCAKED, "--config=", "--rpc_port=6123", "-metrics_port", "9123",
             "--eviction_high_watermark_ratio=0.85", "--eviction_ratio=0.15",
             "--default_kv_lease_ttl=250", "--enable_ha", "--etcd_endpoints=10.0.0.1:2379",
             "--cluster_id=prod", "--print-config"],
            env=dict(os.environ, MC_FORCE_TCP="1", MC_SLICE_SIZE="262144",
                     MC_LOG_LEVEL="WARNING"))
    for want in [r"master-listen = 127\.0\.0\.1:6123 +# flag \(flag --rpc_port\)",
                 r"master-http = 127\.0\.0\.1:9123 +# flag \(flag --metrics_port\)",
                 r"eviction-high-watermark-ratio = 0\.85 +# flag \(flag --eviction_high_",
                 r"eviction-ratio = 0\.15 +# flag \(flag --eviction_ratio\)",
                 r"default-kv-lease-ttl = 250ms +# flag \(flag --default_kv_lease_ttl\)",
                 r"meta-endpoints = 10\.0\.0\.1:2379 +# flag \(flag --etcd_endpoints\)",
                 r"cluster-id = prod +# flag \(flag --cluster_id\)",
                 r"protocol = tcp +# env \(env MC_FORCE_TCP\)",
                 r"te-slice-size = 262144 +# env \(env MC_SLICE_SIZE\)",
                 r"log-level = WARNING +# env \(env MC_LOG_LEVEL\)"]:
        assert re.search(want, r.stdout), "%s not in:\n%s" % (want, r.stdout)
    r = subprocess.run([mctest.MOONCAKED, "--config=", "--max_threads=8"], capture_output=True,
                       text=True)
    eq(r.returncode, 2, "a Mooncake flag without a meaning here")
    eq(r.stderr.strip(), "mooncaked: --max_threads is Mooncake's and has no meaning in mooncaked: "
       "the master serves every call on one event loop; there is no thread pool to size",
       "the line")
    man = open(os.path.join(mctest.ROOT, "man", "mooncaked.8")).read()
    for name in ("rpc_port", "MC_FORCE_TCP", "MC_MTU", "max_threads", "MC_IB_SL"):
        assert name.replace("_", "_") in man.replace("\\-", "-"), name


@case
def mc_mtu_caps_the_rdma_path_mtu():
    if not os.path.exists(EMU):
        raise AssertionError("%s missing: run through make test" % EMU)
    d = Daemon("agent", exe=EMU, args=["--meta-endpoints=", "--master-address=127.0.0.1:1",
                                       "--protocol=rdma"],
               env={"VERBS_EMU_MTU": "4096", "MC_MTU": "1024"})
    wait_for(lambda: "rdma transport: emu_0" in d.output(), what="rdma up")
    assert re.search(r"rdma transport: emu_0 port 1, .* MTU 1024", d.output()), d.output()
    d.stop()
    d = Daemon("agent", exe=EMU, args=["--meta-endpoints=", "--master-address=127.0.0.1:1",
                                       "--protocol=rdma"], env={"VERBS_EMU_MTU": "4096"})
    wait_for(lambda: "rdma transport: emu_0" in d.output(), what="rdma up")
    assert re.search(r"rdma transport: emu_0 port 1, .* MTU 4096", d.output()), d.output()
    d.stop()


@case
def unknown_variables_get_one_warning_line_each():
    d = Daemon("master", args=["--meta-endpoints="],
               env={"MOONCAKE_SEGMNT_SIZE": "1G", "MC_NUM_QP_PER_EP": "4",
                    "MOONCAKE_SOCKET": "/tmp/x.sock"})
    out = d.output()
    eq(len(re.findall(r"WARN  cfg: environment variable MOONCAKE_SEGMNT_SIZE names no key",
                      out)), 1, "MOONCAKE_ typo:\n" + out)
    eq(len(re.findall(r"WARN  cfg: environment variable MC_NUM_QP_PER_EP is Mooncake's and has "
                      r"no meaning in mooncaked", out)), 1, "MC_ variable:\n" + out)
    assert "MOONCAKE_SOCKET" not in out, "a client's variable is not warned about"
    eq(d.stop(), 0, "exit status")


@case
def log_max_size_rotates_the_daemons_log():
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "m.log")
        # The start-up alone writes some 1.5 KiB: several rotations at 300 B.
        d = Daemon("meta", args=["--log-file=" + log, "--log-max-size=300", "--log-max-files=2"])
        wait_for(lambda: os.path.exists(log + ".2") and "ready" in "".join(
            open(f).read() for f in glob.glob(log + "*")), what="two rotations")
        assert not os.path.exists(log + ".3"), "only --log-max-files are kept: %s" % \
            os.listdir(tmp)
        for f in (log + ".1", log + ".2"):
            text = open(f).read()
            assert len(text) <= 300 or text.count("\n") == 1, (f, len(text))
            assert text.endswith("\n") and all(
                re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", l)
                for l in text.splitlines()), "whole lines in %s:\n%s" % (f, text)
        d.signal(__import__("signal").SIGHUP)
        wait_for(lambda: "SIGHUP: log file reopened" in open(log).read() or
                 any("SIGHUP" in open(f).read() for f in glob.glob(log + ".*")),
                 what="SIGHUP still reopens")
        eq(d.stop(), 0, "exit status")


def scrape(addr):
    with urllib.request.urlopen("http://%s/metrics" % addr, timeout=5) as r:
        return r.read().decode()


@case
def process_metrics_on_every_role_and_sync_segment_apart():
    d = Daemon("standalone", args=["--heartbeat-interval=50ms", "--election-timeout=500ms"])
    wait_for(lambda: "mounted with master" in d.output(), what="agent mounted")
    for key in ("meta-http", "master-http", "agent-http"):
        text = scrape(d.addr(key))
        for m in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                  "process_open_fds", "process_max_fds", "process_start_time_seconds"):
            assert re.search(r"^%s [0-9.e+]+$" % m, text, re.M), "%s: %s" % (key, m)
        run(["promtool", "check", "metrics"], input=text)
    master = d.addr("master-http")
    wait_for(lambda: "SyncSegment\",le=\"+Inf\"} " in scrape(master)
             and not re.search(r'long_poll_duration_seconds_count\{[^}]*SyncSegment"\} 0\b',
                               scrape(master)),
             what="a SyncSegment call ended")
    text = scrape(master)
    assert not re.search(r"call_duration_seconds_bucket\{[^}]*SyncSegment", text), \
        "SyncSegment is in the latency histogram"
    assert re.search(r'mooncake_rpc_server_call_duration_seconds_count\{server="master",'
                     r'method="/mooncake.master.Master/MountSegment"\} 1', text), \
        "the unary calls are"
    assert re.search(r'mooncake_rpc_server_calls_total\{server="master",'
                     r'method="/mooncake.master.Master/SyncSegment",code="OK"\}', text), \
        "SyncSegment is still counted"
    meta = scrape(d.addr("meta-http"))
    assert not re.search(r"call_duration_seconds_bucket\{[^}]*(Watch|LeaseKeepAlive)", meta), \
        "streams are not in the latency histogram"
    d.stop()


mctest.main()
