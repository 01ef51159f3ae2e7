"""The store end to end: mooncaked masters and agents as separate processes
on loopback, driven through the real clients — the Python package
(python/mooncake over libmooncake.so), mooncakectl put/get/rm, and raw
frames on the agent's socket for the failure cases: values of every
size, batches of a thousand, zero-copy views, upserts and leases,
eviction under a Zipf-like load, a client killed in the middle of a put,
and malformed requests that must get clean errors while the agent keeps
serving.
"""
import array
import ctypes
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import storetest as st
from storetest import Cluster, MiB, metric, metric_labels
import mctest
from mctest import case, eq, run, wait_for

import client_pb2 as C

OK = 0
NOT_FOUND = -704
EXISTS = -705
HAS_LEASE = -706
EINVAL = -22
INVALID_PARAMS = -600  # what the Python store says for it (Mooncake's number)


@case
def values_and_keys_of_every_size():
    cl = Cluster(agents=1, segment=256 * MiB)
    s = cl.agents[0].store()
    rnd = random.Random(1)
    plain = cl.agents[0].store(verify_gets=False)  # (copies shared with a copy thread)
    for n in (0, 1, MiB + 3, 2 * MiB, 64 * MiB):
        v = rnd.randbytes(n)
        key = "size/%d" % n
        eq(s.put(key, v), OK, "put %d bytes" % n)
        eq(s.get(key) == v, True, "get %d bytes back" % n)
        eq(s.get_size(key), n, "size of %d" % n)
        for _ in range(3):
            eq(plain.get(key) == v, True, "unverified get of %d bytes" % n)
    plain.close()
    k1 = b"\x00"
    k4 = bytes(range(256)) * 16
    eq(s.put(k1, b"one-byte key"), OK, "1-byte key")
    eq(s.put(k4, b"4 KiB key"), OK, "4 KiB key")
    eq((s.get(k1), s.get(k4)), (b"one-byte key", b"4 KiB key"), "binary keys")
    eq(s.put(k4 + b"x", b"v"), INVALID_PARAMS, "4097-byte key")
    eq(s.put(b"", b"v"), INVALID_PARAMS, "empty key")
    eq(s.get(k4 + b"x"), b"", "get of an oversized key")
    eq(s.is_exist(k4 + b"x"), INVALID_PARAMS, "exist of an oversized key")
    # Bytes-like values of every kind, read in place.
    arr = array.array("d", [1.5] * 1000)
    eq(s.put("array", arr), OK, "array.array")
    eq(s.get("array"), arr.tobytes(), "array back")
    eq(s.put("mv", memoryview(b"0123456789")[2:5]), OK, "memoryview slice")
    eq(s.get("mv"), b"234", "slice back")
    eq(s.put("ba", bytearray(b"mutable")), OK, "bytearray")
    eq(s.put_parts("parts", b"a", b"bc", bytearray(b"d")), OK, "put_parts")
    eq(s.get("parts"), b"abcd", "parts back")
    # Exist, remove, miss.
    eq(s.is_exist("size/1"), 1, "exists")
    eq(s.is_exist("nope"), 0, "does not exist")
    eq(s.get("nope"), b"", "miss is b''")
    eq(s.get_buffer("nope"), None, "get_buffer miss")
    eq(s.remove("nope"), NOT_FOUND, "remove a missing key")
    eq(s.remove("size/1", force=True), OK, "remove")
    eq(s.is_exist("size/1"), 0, "removed")
    s.close()
    eq(cl.agents[0].d.stop(), 0, "agent exits cleanly")


@case
def batches_of_a_thousand():
    cl = Cluster(agents=1)
    s = cl.agents[0].store()
    keys = ["batch/%04d" % i for i in range(1000)]
    vals = [(b"%d:" % i) * (i % 50 + 1) for i in range(1000)]
    eq(s.put_batch(keys, vals), OK, "put_batch")
    eq(s.get_batch(keys) == vals, True, "get_batch")
    eq(s.batch_is_exist(keys + ["nope"]), [1] * 1000 + [0], "batch_is_exist")
    eq(s.put_batch(keys[:3], [b"x"] * 3), OK, "again: existing keys succeed (Mooncake's rule)")
    eq(s.get_batch(keys[:3]), vals[:3], "and keep their values")
    # Zero-copy batch forms over managed memory.
    te = cl.agents[0].engine()
    size = 4096
    buf = te.allocate_managed_buffer(1000 * size)
    assert buf
    ptrs = [buf + i * size for i in range(1000)]
    res = s.batch_get_into(keys, ptrs, [size] * 1000)
    eq(res, [len(v) for v in vals], "batch_get_into sizes")
    eq(all(ctypes.string_at(ptrs[i], len(vals[i])) == vals[i] for i in range(1000)), True,
       "batch_get_into bytes")
    new = ["copy/%04d" % i for i in range(1000)]
    eq(s.batch_put_from(new, ptrs, [len(v) for v in vals]), [0] * 1000, "batch_put_from")
    eq(s.get_batch(new[:5]), vals[:5], "copies")
    eq(s.batch_remove(new[:500], force=True), [0] * 500, "batch_remove")
    eq(s.remove_all(force=True), 1500, "remove_all")
    eq(s.batch_is_exist(keys[:3]), [0, 0, 0], "all gone")
    te.free_managed_buffer(buf, 1000 * size)
    te.close()
    s.close()


@case
def zero_copy_views_buffers_and_transfers():
    cl = Cluster(agents=1)
    a = cl.agents[0]
    s = a.store()
    eq(s.put("v", b"viewed bytes"), OK, "put")
    b = s.get_buffer("v")
    eq((b.size(), b.is_mapped(), bytes(b)), (12, True, b"viewed bytes"), "a mapped view")
    eq(memoryview(b.view()).tobytes(), b"viewed bytes", "memoryview of the view")
    eq(s.remove("v"), HAS_LEASE, "held view keeps its read lease")
    m = a.metrics()
    eq(metric(m, "mooncake_agent_views"), 1.0, "view counted")
    b.release()
    wait_for(lambda: metric(a.metrics(), "mooncake_agent_views") == 0.0,
             what="the release reached the agent")
    # Managed buffers: put_from / get_into in place.
    te = a.engine()
    p = te.allocate_managed_buffer(2 * MiB)
    te.write_bytes_to_buffer(p, b"managed", 7)
    eq(s.put_from("m", p, 7), OK, "put_from managed memory")
    eq(s.get_into("m", p + MiB, MiB), 7, "get_into managed memory")
    eq(te.read_bytes_from_buffer(p + MiB, 7), b"managed", "bytes in place")
    eq(s.get_into("m", p, 3), INVALID_PARAMS, "get_into a buffer too small")
    # Any other memory works through the staging buffer.
    priv = ctypes.create_string_buffer(64)
    eq(s.register_buffer(ctypes.addressof(priv), 64), OK, "register private memory")
    eq(s.get_into("m", ctypes.addressof(priv), 64), 7, "get_into private memory")
    eq(priv.raw[:7], b"managed", "bytes copied")
    eq(s.unregister_buffer(ctypes.addressof(priv)), OK, "unregister")
    # Transfers against this node's own segment name and managed memory.
    eq(te.transfer_sync_write(te.get_local_hostname(), p, p + 4096, 7), OK, "transfer write")
    eq(te.read_bytes_from_buffer(p + 4096, 7), b"managed", "written")
    eq(te.transfer_sync_read(te.get_local_hostname(), ctypes.addressof(priv), p, 7), OK,
       "transfer read into private memory")
    eq(te.transfer_sync_write(te.get_local_hostname(), p, 12345, 8), -820,
       "an address nobody registered in the instance's segment")
    eq(te.transfer_sync_write(a.name, p, 12345, 8), -703,
       "an address nobody registered in the agent's")
    eq(te.get_rpc_port() != a.d.ports["agent-listen"], True,
       "an rpc port of the instance's own")
    eq(te.free_managed_buffer(p, 2 * MiB), OK, "free")
    te.close()
    s.close()


@case
def upsert_and_leases():
    cl = Cluster(agents=1, master_args=["--default-kv-lease-ttl=300ms"])
    s = cl.agents[0].store()
    eq(s.put("u", b"one"), OK, "put")
    eq(s.put("u", b"two"), OK, "a second put succeeds, as in Mooncake")
    eq(s.get("u"), b"one", "first value kept")
    eq(s.upsert("u", b"three"), HAS_LEASE, "upsert while the get's lease holds")
    wait_for(lambda: s.upsert("u", b"three") == OK, what="upsert after the lease")
    eq(s.get("u"), b"three", "upserted")
    eq(s.remove("u"), HAS_LEASE, "remove while leased")
    eq(s.remove("u", force=True), OK, "forced")
    s.close()


@case
def hot_keys_keep_their_lease_cached():
    """Gets of a key read all the time are answered from the agent's lease
    cache, window after window: a get in the second half of a window renews
    the lease in the background. Without the renewal every window (300 ms
    here) would start with a get that waits on the master."""
    cl = Cluster(agents=1, master_args=["--default-kv-lease-ttl=600ms"])
    a = cl.agents[0]
    s = a.store()
    eq(s.put("hot", b"value"), OK, "put")
    m0 = a.metrics()
    gets = 0
    end = time.monotonic() + 2.4
    while time.monotonic() < end:
        eq(s.get("hot"), b"value", "get")
        gets += 1
        time.sleep(0.02)
    m1 = a.metrics()
    d = {n: metric(m1, n) - metric(m0, n) for n in (
        "mooncake_agent_gets_total", "mooncake_agent_lease_cache_hits_total",
        "mooncake_agent_lease_renewals_total")}
    eq(d["mooncake_agent_gets_total"], gets, "gets counted")
    asked = gets - d["mooncake_agent_lease_cache_hits_total"]
    assert asked <= 3, "gets that waited on the master: %s of %d (%s)" % (asked, gets, d)
    assert d["mooncake_agent_lease_renewals_total"] >= 4, d
    s.close()


@case
def mooncakectl_put_get_rm():
    cl = Cluster(agents=1)
    a = cl.agents[0]
    f = os.path.join(a.tmp.name, "in")
    data = os.urandom(3 * MiB + 1)
    with open(f, "wb") as fh:
        fh.write(data)
    a.ctl("put", "ctl/key", f)
    out = os.path.join(a.tmp.name, "out")
    a.ctl("get", "ctl/key", out)
    with open(out, "rb") as fh:
        eq(fh.read() == data, True, "file round trip")
    r = run([mctest.MOONCAKECTL, "put", "ctl/stdin", "-", "--socket=" + a.socket],
            input="from stdin")
    eq(a.ctl("get", "ctl/stdin").stdout, "from stdin", "stdin to stdout")
    r = a.ctl("put", "ctl/key", f, check=False)
    eq(r.returncode, 1, "existing key")
    assert "MC_EOBJECT_ALREADY_EXISTS" in r.stderr, r.stderr
    a.ctl("rm", "ctl/key", "--force")
    r = a.ctl("get", "ctl/key", check=False)
    eq(r.returncode, 1, "removed")
    assert "object not found" in r.stderr, r.stderr
    r = run([mctest.MOONCAKECTL, "get", "x", "--socket=/nonexistent/agent.sock"], check=False)
    eq(r.returncode, 1, "no agent")
    ls = run([mctest.MOONCAKECTL, "ls", "ctl/", "--master=" + cl.master_addr]).stdout
    assert "ctl/stdin" in ls, ls
    # The agent's own figures (mc_agent_stats): what this case did through it.
    stats = dict(l.split(" ", 1) for l in a.ctl("stats", "--agent").stdout.splitlines())
    eq(stats["master"], cl.master_addr, "the master in use")
    eq(int(stats["puts"]), 2, "two puts stored (one refused)")
    eq(int(stats["bytes_written"]), len(data) + len("from stdin"), "their bytes")
    eq(int(stats["gets"]), 3, "three gets")
    eq(int(stats["misses"]), 1, "one of a removed key")
    eq(int(stats["bytes_read"]), len(data) + len("from stdin"), "bytes read")
    eq(int(stats["segment_bytes"]) > 0 and stats["agent"] != "", True, "segment and name")
    eq(int(stats["clients"]), 1, "this session")
    r = run([mctest.MOONCAKECTL, "stats", "--agent", "--master=" + cl.master_addr],
            check=False)
    eq(r.returncode, 2, "--agent with --master is a usage error")
    r = run([mctest.MOONCAKECTL, "stats", "--socket=/nonexistent/agent.sock"], check=False)
    eq(r.returncode, 1, "no agent")


@case
def bench_store_runs_every_op_beside_redis():
    """`mooncakectl bench store` starts its own master, two agents and
    redis-server, and prints a row per size, op and place, without errors
    (its figures are not judged here)."""
    import shutil
    ops = ("put", "get", "view", "mixed", "batch-put", "batch-get")
    r = run([mctest.MOONCAKECTL, "bench", "store", "--value-size=4K,1M", "--clients=2",
             "--op=" + ",".join(ops), "--batch=4", "--duration=200ms"], timeout=300)
    rows = [l.split() for l in r.stdout.splitlines()]
    for size in ("4K", "1M"):
        lim = [l for l in r.stdout.splitlines() if l.startswith("limit %s: memcpy of one value" % size)]
        eq(len(lim), 1, "the latency limit of %s\n%s" % (size, r.stdout))
        for op in ops:
            for where in ("local", "remote"):
                # size op where ops/s GB/s p50 p99 redis/s x-redis memcpy
                # cli-us agt-us mst-us wake errors
                row = [x for x in rows if x[:3] == [size, op, where]]
                eq(len(row), 1, "one row for %s %s %s\n%s\n%s" % (size, op, where, r.stdout,
                                                                  r.stderr))
                eq(row[0][14], "0", "no errors in %s %s %s" % (size, op, where))
                assert float(row[0][3]) > 0, row
                # CPU per op of the client and the agents (the bench's own
                # processes), no master of its own, the agents' wakeups.
                # Local gets are answered by the client from the shared
                # lease table: the agents may spend next to nothing.
                table = op in ("get", "batch-get") and where == "local"
                assert float(row[0][10]) > 0 and float(row[0][11]) >= (0 if table else 1e-9), row
                eq(row[0][12], "-", "the master is in the agent's process")
                assert float(row[0][13]) >= 0, row
    # redis rows: op, "redis", ops/s, GB/s, p50, p99, memcpy, cli-us,
    # redis-server's us, "-", wake, errors
    redis_rows = [x for x in rows if len(x) == 12 and x[1] == "redis"]
    if shutil.which("redis-server"):
        eq(len(redis_rows), 2 * len(ops), "a redis row per size and op\n" + r.stdout)
        assert all(x[11] == "0" and float(x[2]) > 0 and float(x[8]) > 0
                   for x in redis_rows), r.stdout
    assert "the master in the local agent's process" in r.stdout, r.stdout
    eq([x for x in rows if x[2:3] == ["floor"]], [], "the floor is for one client")
    # The master in a process of its own, no redis: local and remote rows.
    r = run([mctest.MOONCAKECTL, "bench", "store", "--value-size=4K", "--clients=1",
             "--op=put,get", "--duration=200ms", "--master=separate", "--redis=off",
             "--rounds=2"],
            timeout=300)
    assert "the master in a process of its own" in r.stdout, r.stdout
    assert "in 2 rounds" in r.stdout, r.stdout
    rows = [l.split() for l in r.stdout.splitlines()]
    for op in ("put", "get"):
        for where in ("local", "remote"):
            row = [x for x in rows if x[:3] == ["4K", op, where]]
            eq(len(row), 1, "one row for 4K %s %s\n%s" % (op, where, r.stdout))
            eq(row[0][14], "0", "no errors in 4K %s %s" % (op, where))
            # (gets may find their replicas in the agent's lease cache)
            assert float(row[0][12]) > 0 or op == "get", "the master's CPU per op: %s" % row
    # One client: the floor of a get (size op floor ops/s GB/s p50 p99
    # memcpy - - - - errors) ran in the same rounds; puts have none.
    row = [x for x in rows if x[:3] == ["4K", "get", "floor"]]
    eq(len(row), 1, "a floor row for 4K get\n" + r.stdout)
    eq(row[0][12], "0", "no errors in the floor")
    assert float(row[0][3]) > 0 and float(row[0][6]) > 0, row
    eq([x for x in rows if x[:3] == ["4K", "put", "floor"]], [], "no floor for puts")
    for bad in ("--master=elsewhere", "--clients=1,4", "--rounds=0", "--rounds=2x",
                "--batch=0", "--batch=65", "--op=batch"):
        r = run([mctest.MOONCAKECTL, "bench", "store", bad], check=False)
        eq(r.returncode, 2, "%s is a usage error" % bad)


@case
def bench_store_against_a_users_redis_removes_only_its_keys():
    """--redis=HOST:PORT names a redis-server of the user's (HOST was
    ignored before: it always went to 127.0.0.1) and the run's SET keys
    (bench/<RUN>/...) are removed from it at the end, its other keys
    kept; a --redis that is not auto, off or HOST:PORT is a usage error."""
    port = mctest.free_port()
    tmp = tempfile.mkdtemp(prefix="mctest-redis-")
    rd = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                           "--save", "", "--appendonly", "no", "--dir", tmp],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        mctest.wait_port(port)

        def cmd(*a):
            return run(["redis-cli", "-p", str(port)] + list(a)).stdout.strip()
        cmd("set", "mine", "kept")
        r = run([mctest.MOONCAKECTL, "bench", "store", "--value-size=4K", "--clients=2",
                 "--op=put,get,batch-put", "--batch=4", "--duration=100ms", "--rounds=1",
                 "--redis=localhost:%d" % port], timeout=300)
        rows = [l.split() for l in r.stdout.splitlines() if l.split()[:2] in
                (["put", "redis"], ["get", "redis"], ["batch-put", "redis"])]
        eq(len(rows), 3, "a redis row per op\n" + r.stdout + r.stderr)
        assert "keys (bench/" in r.stdout and "removed" in r.stdout, r.stdout + r.stderr
        eq((cmd("dbsize"), cmd("get", "mine")), ("1", "kept"), "only the user's key left")
        for bad in ("nohostport", "127.0.0.1:0", "h:99999", ":6379"):
            b = run([mctest.MOONCAKECTL, "bench", "store", "--redis=" + bad], check=False)
            eq(b.returncode, 2, bad)
            assert "want auto, off or HOST:PORT" in b.stderr, b.stderr
    finally:
        rd.kill()
        rd.wait()
        shutil.rmtree(tmp, ignore_errors=True)


@case
def bench_store_on_a_users_agent_removes_only_its_keys():
    """`mooncakectl bench store --socket=PATH` runs against an agent of a
    cluster that holds other objects: after each size and op it removes
    its own keys (bench/<run>/...) and nothing else; `mooncakectl rm
    --regex` removes by pattern; a flag of another command is refused."""
    cl = Cluster(agents=1, segment=256 * MiB)
    ag = cl.agents[0]
    s = ag.store()
    users = {"bench/users/own": b"u1", "model/layer0": b"u2", "bench-notes": b"u3"}
    for k, v in users.items():
        eq(s.put(k, v), OK, "put " + k)
    r = ag.ctl("bench", "store", "--redis=off", "--value-size=4K", "--clients=2",
               "--op=put,get,batch-put", "--batch=4", "--duration=300ms", "--rounds=1",
               timeout=300)
    rows = [l.split() for l in r.stdout.splitlines() if l.startswith("4K")]
    eq(len(rows), 3, "a row per op\n" + r.stdout)
    assert all(x[-1] == "0" for x in rows), r.stdout
    for k, v in users.items():
        eq(s.get(k), v, "the bench left %s alone" % k)
    for k in ("keep/1", "tmp/a1", "tmp/a2", "xtmp/a3"):
        eq(s.put(k, b"x"), OK, "put " + k)
    r = ag.ctl("rm", "--regex", "^(bench/[0-9a-f]{16}/|tmp/)")
    eq(r.stdout.strip(), "removed 2", "the bench's keys were gone already; tmp/a1, tmp/a2")
    eq([s.is_exist(k) for k in ("keep/1", "tmp/a1", "xtmp/a3")], [1, 0, 1], "by the pattern")
    r = ag.ctl("rm", "--regex", "(", check=False)
    eq(r.returncode, 1, "a bad pattern fails")
    assert "not a POSIX extended regular expression" in r.stderr, r.stderr
    for cmd in (("put", "k", "/dev/null", "--force"), ("get", "k", "--upsert"),
                ("rm", "k", "--verify"), ("get", "k", "--regex")):
        r = ag.ctl(*cmd, check=False)
        eq(r.returncode, 2, "%s: a flag of another command" % (cmd,))
        assert "is not a flag of" in r.stderr, r.stderr
    s.close()


@case
def bench_sessions_serves_every_session():
    """`mooncakectl bench sessions` opens many sessions with its own agent,
    prints the agent's memory per idle session, and serves a checked put
    and get through every one of them."""
    r = run([mctest.MOONCAKECTL, "bench", "sessions", "--sessions=64", "--threads=4",
             "--duration=200ms"], timeout=300)
    assert "served: 64 of 64 sessions" in r.stdout and ", 0 errors" in r.stdout, r.stdout
    idle = [l.split() for l in r.stdout.splitlines() if "sessions open, idle" in l]
    eq(len(idle), 1, r.stdout)
    # RSS MiB, KiB/session, fds/session: each session holds its socket
    # and its staging memfd.
    assert float(idle[0][-3]) > 0 and float(idle[0][-2]) > 0, r.stdout
    assert float(idle[0][-1]) >= 1, r.stdout
    for bad in ("--sessions=0", "--threads=65 --sessions=64", "--value-size=0"):
        r = run([mctest.MOONCAKECTL, "bench", "sessions"] + bad.split(), check=False)
        eq(r.returncode, 2, "%s is a usage error" % bad)


@case
def an_agent_calls_the_master_of_its_own_process_in_process():
    """--role=master,agent (as standalone): the agent's master calls skip
    the network — the master has no connection while puts, gets and
    removes go through, exactly as with a master of its own."""
    import urllib.request
    from mctest import Daemon
    d = Daemon("master,agent", args=["--meta-endpoints="], env=st.daemon_env())
    wait_for(lambda: "mounted with master" in d.output(), what="segment mounted")

    def scrape(key):
        with urllib.request.urlopen("http://%s/metrics" % d.addr(key), timeout=5) as r:
            return r.read().decode()

    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    eq(s.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", "unused",
               socket_path=d.socket, verify_gets=True), 0, "setup")
    vals = {"k/%d" % i: os.urandom(4096 if i % 2 else 70000) for i in range(200)}
    for k, v in vals.items():
        eq(s.put(k, v), OK, "put " + k)
    eq(s.put("k/0", b"again"), OK, "a duplicate put: refused by the master, 0 to Python")
    for k, v in vals.items():
        eq(s.get(k) == v, True, "get " + k)
    eq(s.remove("k/1"), HAS_LEASE, "a key just read is leased")
    eq(s.put("unread", b"x"), OK, "put")
    eq(s.remove("unread"), OK, "remove")
    eq(s.is_exist("unread"), 0, "removed")
    agent_m, master_m = scrape("agent-http"), scrape("master-http")
    eq(metric_labels(master_m, "mooncake_rpc_server_connections", 'server="master"'), 0.0,
       "no connection to the master")
    served = metric_labels(master_m, "mooncake_rpc_server_calls_total",
                           'server="master",method="/mooncake.master.Master/BatchCommit",'
                           'code="OK"')
    sent = metric_labels(agent_m, "mooncake_rpc_client_calls_total",
                         'method="/mooncake.master.Master/BatchCommit",code="OK"')
    assert served > 0 and served == sent, (served, sent)
    s.close()
    eq(d.stop(), 0, "clean stop")


@case
def the_agent_busy_polls_after_requests_and_then_sleeps():
    """--busy-poll-us: after requests and replies the agent's loop polls
    instead of sleeping, and the time it spent so is counted; once the
    clients are quiet it sleeps again (the counter stops moving), and 0
    turns it off."""
    def workload(a):
        t0 = time.monotonic()
        s = a.store()
        for i in range(300):
            eq(s.put("bp/%d" % i, b"v" * 4096), OK, "put")
            eq(s.get("bp/%d" % i), b"v" * 4096, "get")
        s.close()
        took_us = (time.monotonic() - t0) * 1e6
        time.sleep(0.3)
        m1 = metric(a.metrics(), "mooncake_agent_busy_poll_seconds_sum") * 1e6
        time.sleep(0.3)
        m2 = metric(a.metrics(), "mooncake_agent_busy_poll_seconds_sum") * 1e6
        eq(m1, m2, "no polling while no client sends")
        return m1, took_us

    spent, took = workload(Cluster(agents=1, agent_args=["--busy-poll-us=200"]).agents[0])
    # The polling falls between the session's first request and 200 us
    # after its last reply.
    assert 0 < spent <= took + 200, (spent, took)
    eq(workload(Cluster(agents=1, agent_args=["--busy-poll-us=0"]).agents[0])[0], 0.0, "off")


@case
def bad_frames_get_clean_errors():
    cl = Cluster(agents=1)
    a = cl.agents[0]
    good = a.store()
    eq(good.put("alive", b"yes"), OK, "a client to check the agent with")

    def still_serving(what):
        eq(good.get("alive"), b"yes", "agent serves others after " + what)
        assert a.d.proc.poll() is None, "agent died after " + what

    def closed(sock):
        sock.settimeout(5)
        try:
            return sock.recv(1) == b""
        except ConnectionResetError:
            return True

    # A request before hello: an error, then the session closes.
    s = st.raw_connect(a.socket)
    r = C.Request(id=5)
    r.stats.SetInParent()
    st.send(s, r)
    resp, _ = st.recv_response(s)
    eq((resp.id, resp.error), (5, -801), "request before hello")
    eq(closed(s), True, "closed after a protocol error")
    still_serving("a request before hello")

    # An unknown operation (a field this agent does not know): an error,
    # the session goes on.
    s = st.raw_connect(a.socket)
    st.hello(s)
    s.sendall(struct.pack("<I", 5) + b"\x08\x09\xfa\x06\x00")
    resp, _ = st.recv_response(s)
    eq((resp.id, resp.error), (9, -95), "unknown op: -EOPNOTSUPP")
    r = C.Request(id=10)
    r.exist.keys.append(b"alive")
    st.send(s, r)
    resp, _ = st.recv_response(s)
    eq(list(resp.keys.results), [1], "the session still works")

    # A view that is not the session's: -ENOENT, or with quiet no
    # response at all (the next one answered is the next request's).
    r = C.Request(id=12)
    r.release.views.append(424242)
    st.send(s, r)
    resp, _ = st.recv_response(s)
    eq((resp.id, resp.error), (12, -2), "release of an unknown view")
    r.id = 13
    r.release.quiet = True
    st.send(s, r)
    r = C.Request(id=14)
    r.exist.keys.append(b"alive")
    st.send(s, r)
    resp, _ = st.recv_response(s)
    eq((resp.id, list(resp.keys.results)), (14, [1]), "a quiet release is not answered")

    # Oversized key: the item fails, the request does not.
    r = C.Request(id=11)
    r.exist.keys.extend([b"k" * 4097, b"alive"])
    st.send(s, r)
    resp, _ = st.recv_response(s)
    eq(list(resp.keys.results), [EINVAL, 1], "oversized key")

    # Bad memfds: a regular file, a pipe, a memfd not sealed against
    # shrinking, a read-only descriptor of a sealed memfd.
    def register(fd, length=4096):
        r = C.Request(id=20, nfds=1)
        r.register_buffer.length = length
        st.send(s, r, [fd])
        resp, _ = st.recv_response(s)
        return resp.error

    path = os.path.join(a.tmp.name, "plain")
    with open(path, "wb") as fh:
        fh.write(b"\0" * 8192)
    fd = os.open(path, os.O_RDWR)
    eq(register(fd), -9, "a regular file is not a memfd (-EBADF)")
    os.close(fd)
    pr, pw = os.pipe()
    eq(register(pr), -9, "a pipe (-EBADF)")
    os.close(pr)
    os.close(pw)
    mfd = os.memfd_create("unsealed")
    os.ftruncate(mfd, 8192)
    eq(register(mfd), EINVAL, "memfd without F_SEAL_SHRINK")
    sealed = os.memfd_create("sealed", os.MFD_ALLOW_SEALING)
    os.ftruncate(sealed, 8192)
    import fcntl
    fcntl.fcntl(sealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    ro = os.open("/proc/self/fd/%d" % sealed, os.O_RDONLY)
    eq(register(ro), -13, "read-only descriptor (-EACCES)")
    eq(register(sealed, length=8193), EINVAL, "range beyond the memfd")
    eq(register(sealed), OK, "a good memfd")
    for fd in (mfd, ro):
        os.close(fd)

    # Someone else's buffer: ids are per session.
    s2 = st.raw_connect(a.socket)
    st.hello(s2)
    r = C.Request(id=30)
    it = r.put.items.add()
    it.key = b"other"
    it.source.where = C.Region.BUFFER
    it.source.buffer = 1  # session s's buffer
    it.source.length = 10
    st.send(s2, r)
    resp, _ = st.recv_response(s2)
    eq(list(resp.put.errors), [-2], "another session's buffer id: -ENOENT")
    # Descriptors announced but not sent: the session closes.
    r = C.Request(id=31, nfds=2)
    r.stats.SetInParent()
    st.send(s2, r)
    eq(closed(s2), True, "announced descriptors that did not come")
    still_serving("missing descriptors")

    # A memfd owned by another user, registered by that user's session.
    os.chmod(a.tmp.name, 0o755)
    os.chmod(a.socket, 0o666)
    child = subprocess.run(
        mctest.as_uid([sys.executable, "-c", NOBODY_REGISTERS, a.socket, str(sealed)], 65534,
                      65534),
        pass_fds=[sealed], capture_output=True, text=True, timeout=30,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), LD_PRELOAD=""))
    eq((child.returncode, child.stdout.strip()), (0, "-1"),
       "registering another user's memfd: -EPERM\n" + child.stderr)
    os.close(sealed)
    still_serving("a foreign memfd")

    # Frames of length 0, above the maximum, that do not decode, and a
    # hang-up in the middle of one: each closes its session, with a log
    # line, and nothing else.
    for what, data in (("zero-length frame", b"\0\0\0\0"),
                       ("oversized frame", struct.pack("<I", 64 << 20) + b"x" * 16),
                       ("undecodable frame", struct.pack("<I", 3) + b"\xff\xff\xff")):
        s3 = st.raw_connect(a.socket)
        st.hello(s3)
        s3.sendall(data)
        eq(closed(s3), True, what)
        still_serving(what)
    s3 = st.raw_connect(a.socket)
    st.hello(s3)
    s3.sendall(struct.pack("<I", 100) + b"short")
    s3.close()
    wait_for(lambda: "truncated frame" in a.d.output(), what="truncated frame logged")
    still_serving("a truncated frame")
    for line in ("sent a frame of length 0", "above the maximum size",
                 "does not decode as a Request", "did not come"):
        assert line in a.d.output(), line
    s.close()
    wait_for(lambda: metric(a.metrics(), "mooncake_agent_clients") == 1.0,
             what="sessions released")
    eq(metric(a.metrics(), "mooncake_agent_buffers"), 0.0, "buffers of closed sessions freed")
    good.close()


NOBODY_REGISTERS = r"""
import os, sys, struct, socket
import storetest as st, client_pb2 as C
s = st.raw_connect(sys.argv[1])
st.hello(s)
r = C.Request(id=1, nfds=1)
r.register_buffer.length = 4096
st.send(s, r, [int(sys.argv[2])])
resp, _ = st.recv_response(s)
print(resp.error)
"""


@case
def a_closed_sessions_addresses_are_free_at_once():
    """A client's next process often maps its buffer where the last one
    had it, and registers it as soon as it connects: while the closed
    session's buffer is still leaving the engine (on a copy thread), the
    new one waits for it rather than failing with -EEXIST. A buffer over
    a live one, or over the agent's own segment, is still refused."""
    # Several copy threads (one takes the unmap as another takes the
    # registration), whatever the machine's cores.
    cl = Cluster(agents=1, agent_args=["--agent-copy-threads=4"])
    a = cl.agents[0]
    mfd = os.memfd_create("buf", os.MFD_ALLOW_SEALING)
    os.ftruncate(mfd, MiB)
    import fcntl
    fcntl.fcntl(mfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    priv = ctypes.create_string_buffer(64 << 10)
    mem = ctypes.addressof(priv)
    fixed = 0x7e0000000000  # (the client's address: the agent maps its own)
    ROUNDS = 1000

    def session():
        s = st.raw_connect(a.socket)
        st.hello(s)
        return s

    def register(s, address, fd=None, length=MiB):
        r = C.Request(id=40, nfds=0 if fd is None else 1)
        r.register_buffer.length = length
        r.register_buffer.address = address
        r.register_buffer.process_memory = fd is None
        st.send(s, r, [] if fd is None else [fd])
        resp, _ = st.recv_response(s)
        return resp.error

    # The race is narrow: many rounds, every refusal counted. The next
    # session is open before the last one closes, so its registration
    # comes after the agent saw the close.
    refused = {}
    for what, address, fd, length in (("a memfd", fixed, mfd, MiB),
                                      ("process memory", mem, None, len(priv))):
        last = session()
        eq(register(last, address, fd, length), OK, "%s registered" % what)
        refused[what] = 0
        for _ in range(ROUNDS):
            s = session()
            last.close()
            if register(s, address, fd, length) != OK:
                refused[what] += 1
            last = s
        last.close()
    eq(refused, {"a memfd": 0, "process memory": 0},
       "registrations at a closed session's addresses refused, of %d each" % ROUNDS)

    # Live overlaps: another session's buffer is in the way for good.
    s1, s2 = session(), session()
    eq(register(s1, fixed, mfd), OK, "a live buffer")
    eq(register(s2, fixed, mfd), -17, "the same addresses: -EEXIST")
    eq(register(s2, fixed + MiB // 2, mfd), -17, "half over it: -EEXIST")
    eq(register(s2, fixed + MiB, mfd), OK, "just past it")
    assert "overlaps memory already published" in a.d.output(), a.d.output()
    # The agent's own segment is in the same engine, at its address in
    # the agent: a client's buffer at those addresses meets it. The agent
    # maps it in [32 TiB, 64 TiB), where a process's own maps do not fall
    # (nor, under SAN=1, AddressSanitizer's shadow).
    with open("/proc/%d/maps" % a.d.proc.pid) as f:
        seg = [int(l.split("-")[0], 16) for l in f if "mooncake-segment" in l][0]
    assert 32 << 40 <= seg < 64 << 40, "segment at %#x" % seg
    with open("/proc/self/maps") as f:
        spans = [[int(x, 16) for x in l.split()[0].split("-")] for l in f]
    mine = ["%#x-%#x" % (lo, hi) for lo, hi in spans if hi > 32 << 40 and lo < 64 << 40]
    eq(mine, [], "this process's maps in the agent's window")
    eq(register(s2, seg, mfd), -17, "over the agent's own segment: -EEXIST")
    assert "or the agent's own memory" in a.d.output(), a.d.output()
    s1.close()
    s2.close()
    os.close(mfd)
    wait_for(lambda: metric(a.metrics(), "mooncake_agent_buffers") == 0.0,
             what="buffers of closed sessions freed")
    cl.stop()


@case
def a_buffer_alloc_moves_past_another_sessions_buffer():
    """mc_buffer_alloc of a session without an engine of its own publishes
    the buffer in the agent's engine at this process's address. When
    another process's buffer is there already, it takes another place
    (libmooncake's retry window, [64 TiB, 84 TiB)) instead of failing."""
    from mooncake import _native as n
    cl = Cluster(agents=1)
    a = cl.agents[0]
    # Another session publishes a sparse memfd over the top 16 TiB of the
    # address space, where mmap places this process's reservations.
    top = [int(l.split()[0].split("-")[0], 16) for l in open("/proc/self/maps")
           if "[stack]" in l][0]
    lo = (top - (16 << 40)) & ~((1 << 30) - 1)
    length = top - lo
    mfd = os.memfd_create("wide", os.MFD_ALLOW_SEALING)
    os.ftruncate(mfd, length)
    import fcntl
    fcntl.fcntl(mfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    s = st.raw_connect(a.socket)
    st.hello(s)
    r = C.Request(id=1, nfds=1)
    r.register_buffer.length = length
    r.register_buffer.address = lo
    st.send(s, r, [mfd])
    resp, _ = st.recv_response(s)
    eq(resp.error, OK, "the wide buffer registered")
    h = ctypes.c_void_p()
    o = n.OpenOpts(socket_path=a.socket.encode(), client_name=b"alloc")
    eq(n.mc_open_ex(ctypes.byref(o), ctypes.byref(h)), OK, "session opened")
    p = ctypes.c_void_p()
    eq(n.mc_buffer_alloc(h, MiB, ctypes.byref(p)), OK, "a buffer past the wide one")
    assert 64 << 40 <= p.value < 84 << 40, "buffer at %#x" % p.value
    ctypes.memset(p.value, 0x5a, MiB)
    eq(n.mc_buffer_free(h, p), OK, "freed")
    assert "overlaps memory already published" in a.d.output(), a.d.output()
    n.mc_close(h)
    s.close()
    os.close(mfd)
    cl.stop()


@case
def client_killed_mid_put_leaves_nothing():
    cl = Cluster(agents=1, segment=256 * MiB, master_args=["--put-timeout=2s"])
    a = cl.agents[0]
    marker = os.path.join(a.tmp.name, "started")
    child = subprocess.Popen(
        [sys.executable, "-c", PUT_FOREVER, a.socket, marker],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    wait_for(lambda: os.path.exists(marker), what="client putting")
    time.sleep(0.05)  # let a put be in flight
    child.kill()
    child.wait()
    wait_for(lambda: cl.stats().get("pending") == 0.0, timeout=10,
             what="no PENDING object after the put timeout")
    wait_for(lambda: metric(a.metrics(), "mooncake_agent_clients") == 0.0,
             what="the session is gone")
    eq(metric(a.metrics(), "mooncake_agent_staging_bytes"), 0.0, "staging released")
    s = a.store()
    eq(s.put("after", b"ok"), OK, "agent still serves")
    s.close()


PUT_FOREVER = r"""
import os, sys
from mooncake.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup("localhost", "P2PHANDSHAKE", 0, 0, "tcp", "", "", socket_path=sys.argv[1]) == 0
v = os.urandom(32 << 20)
i = 0
while True:
    s.put("kill/%d" % i, v)
    if i == 0:
        open(sys.argv[2], "w").close()
    s.remove("kill/%d" % i, force=True)
    i += 1
"""


@case
def eviction_under_zipf_load():
    """Fill a 64 MiB pool three times over, reading with a Zipf-like skew:
    usage stays under the watermark, every put succeeds, soft-pinned
    objects outlive the others, and a reader holding zero-copy views
    keeps its objects and bytes intact (the agent renews their leases)."""
    cl = Cluster(agents=1, segment=64 * MiB,
                 master_args=["--default-kv-lease-ttl=500ms"])
    a = cl.agents[0]
    s = a.store()
    reader = a.store()
    from mooncake.store import ReplicateConfig
    size = 256 * 1024
    pinned = ReplicateConfig(with_soft_pin=True)
    for i in range(8):
        eq(s.put("pin/%d" % i, bytes([i]) * size, pinned), OK, "pinned put")
    held = []
    for i in range(4):
        v = os.urandom(size)
        eq(s.put("held/%d" % i, v), OK, "held put")
        b = reader.get_buffer("held/%d" % i)
        assert b is not None and b.is_mapped()
        held.append((b, v))
    rnd = random.Random(7)
    n = 3 * 64 * MiB // size
    for i in range(n):
        eq(s.put("zipf/%d" % i, bytes([i % 251]) * size), OK, "put %d under pressure" % i)
        for _ in range(2):  # reads skewed toward the newest keys
            j = int(i - (rnd.paretovariate(1.2) - 1) * 4)
            if j >= 0:
                s.get("zipf/%d" % j)
        if i % 64 == 0:
            stt = cl.stats()
            assert stt["used_ratio"] <= 0.9 + size / (64.0 * MiB), stt
    stt = cl.stats()
    assert stt["evictions"] > 0, stt
    assert stt["used_ratio"] <= 0.9, stt
    # Leases are granted only below the watermark (they never evict):
    # some puts go through them, the others through PutStart, which evicts.
    assert stt["commits"] > 0, "puts went through the put lease: %s" % stt
    eq(s.batch_is_exist(["pin/%d" % i for i in range(8)]), [1] * 8, "soft-pinned survive")
    for b, v in held:
        eq(bytes(b) == v, True, "a held view's bytes never change")
    eq(s.batch_is_exist(["held/%d" % i for i in range(4)]), [1] * 4, "held objects kept")
    alive = sum(s.batch_is_exist(["zipf/%d" % i for i in range(n)]))
    assert alive <= 64 * MiB // size, alive
    eq(s.is_exist("zipf/%d" % (n - 1)), 1, "the newest object is there")
    for b, _ in held:
        b.release()
    reader.close()
    s.close()


@case
def metrics_and_graceful_stop():
    cl = Cluster(agents=1, segment=32 * MiB)
    a = cl.agents[0]
    s = a.store()
    eq(s.put("m/1", b"x" * 100), OK, "put")
    s.get("m/1")
    s.get("m/none")
    text = a.metrics()
    eq(metric(text, "mooncake_agent_segment_bytes"), 32.0 * MiB, "segment size")
    eq(metric(text, "mooncake_agent_local_buffer_bytes"), 16.0 * MiB, "staging size")
    eq(metric(text, "mooncake_agent_segment_mounted"), 1.0, "mounted")
    eq(metric_labels(text, "mooncake_agent_get_hits_total", 'source="local"'), 1.0, "hit")
    eq(metric(text, "mooncake_agent_get_misses_total"), 1.0, "miss")
    eq(metric_labels(text, "mooncake_agent_requests_total", 'op="put",result="ok"'), 1.0,
       "requests counted")
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True)
    eq(p.returncode, 0, "promtool: " + p.stdout + p.stderr)
    s.close()
    eq(cl.stats()["objects"], 1.0, "one object")
    eq(a.d.stop(), 0, "agent exits 0 on SIGTERM")
    assert "unmounted" in a.d.output(), a.d.output()
    eq(cl.stats()["objects"], 0.0, "its objects left the index at once")
    eq(os.path.exists(a.socket), False, "socket removed")


mctest.main()
