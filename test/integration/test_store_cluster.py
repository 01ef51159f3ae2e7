"""The store across nodes: three agents, a master and meta (mooncaked's
own --role=meta; one case against a real etcd) as separate processes on
loopback, replicas moved between agents by the transfer engine. Put on
one agent and get on the others, replicas on distinct segments, batches
of a thousand keys, an agent killed with SIGKILL, master failovers after
which the agents re-report what their segments hold (replicas other
agents wrote there included, and never an object whose space was reused
behind a stale mirror's back), and transfers between client buffers of
two nodes (prefill/decode disaggregation) — through the Python package,
as users call it, every get checking the bytes against their checksum.
"""
import os
import signal
import tempfile
import time

import storetest as st
from storetest import Cluster, MiB, metric, metric_labels
import mctest
from mctest import Daemon, Etcd, Meta, case, eq, wait_for
from faultproxy import Proxy

import grpc
import master_pb2 as M

OK = 0
NOT_FOUND = -704


def replicas(master_addr, key):
    with mctest.token_channel(master_addr) as ch:
        f = ch.unary_unary("/mooncake.master.Master/GetReplicas",
                           request_serializer=M.GetReplicasRequest.SerializeToString,
                           response_deserializer=M.GetReplicasResponse.FromString)
        return f(M.GetReplicasRequest(key=key), timeout=10).replicas


@case
def put_on_one_agent_get_on_the_others():
    cl = Cluster(agents=3, meta=True, segment=160 * MiB)
    a, b, c = [x.store() for x in cl.agents]
    k1 = b"\x01"
    k4 = bytes(range(256)) * 16
    for n in (0, 1, MiB + 3, 64 * MiB):
        v = os.urandom(n)
        eq(a.put("x/%d" % n, v), OK, "put %d bytes on A" % n)
        eq(b.get("x/%d" % n) == v, True, "%d bytes on B" % n)
        eq(c.get("x/%d" % n) == v, True, "%d bytes on C" % n)
    eq((a.put(k1, b"k1"), a.put(k4, b"k4")), (OK, OK), "1 B and 4 KiB keys")
    eq((c.get(k1), c.get(k4)), (b"k1", b"k4"), "binary keys across agents")
    from mooncake.store import ReplicateConfig
    eq(b.put("two", b"two copies", ReplicateConfig(replica_num=2)), OK, "replica_num=2")
    segs = [r.segment for r in replicas(cl.master_addr, b"two")]
    eq(len(set(segs)), 2, "two replicas on distinct segments: %s" % segs)
    eq(segs[0], cl.agents[1].name, "the writer's own segment first")
    eq(c.get("two"), b"two copies", "read on C")
    eq(a.put("three", b"x", ReplicateConfig(replica_num=3)), OK, "three on three")
    eq(a.put("four", b"x", ReplicateConfig(replica_num=4)), -200,
       "four on three: Mooncake's NO_AVAILABLE_HANDLE")
    cfg = ReplicateConfig(preferred_segment=cl.agents[2].name)
    eq(a.put("onc", b"placed on C", cfg), OK, "preferred segment")
    eq([r.segment for r in replicas(cl.master_addr, b"onc")], [cl.agents[2].name],
       "written into C's segment by A")
    eq(b.get("onc"), b"placed on C", "and read from there by B")
    m = cl.agents[1].metrics()
    assert st.metric_labels(m, "mooncake_agent_get_hits_total", 'source="remote"') > 0, m
    for s in (a, b, c):
        s.close()


@case
def replica_descriptors_name_where_objects_are():
    """get_replica_desc / batch_get_replica_desc (Mooncake's, which vLLM's
    store worker asks for its tier log): each replica's segment, address
    and size as the master placed it, memory or the SSD tier."""
    tmp = tempfile.TemporaryDirectory(prefix="mooncake-rd-")
    cl = Cluster(agents=1, agent_args=["--ssd-path=" + tmp.name + "/a", "--ssd-size=64M"])
    cl.agents.append(cl.add_agent(["--ssd-path=" + tmp.name + "/b", "--ssd-size=64M"]))
    a, b = [x.store() for x in cl.agents]
    from mooncake.store import ReplicateConfig, ReplicaStatus
    eq(a.put("rd/one", b"x" * 1000), OK, "put on A")
    eq(a.put("rd/two", b"y" * 5000, ReplicateConfig(replica_num=2)), OK, "two copies")
    eq(a.put("rd/ssd", b"z" * 3000, ReplicateConfig(tier="ssd")), OK, "into A's SSD tier")
    master = {r.segment: r.address for r in replicas(cl.master_addr, b"rd/one")}
    got = b.get_replica_desc("rd/one")  # asked through the other agent
    eq(len(got), 1, "one replica")
    d = got[0]
    eq((d.is_memory_replica(), d.is_disk_replica(), d.status),
       (True, False, ReplicaStatus.COMPLETE), "a sealed memory replica")
    bd = d.get_memory_descriptor().buffer_descriptor
    eq((bd.transport_endpoint, bd.size), (cl.agents[0].name, 1000), "A's segment, 1000 bytes")
    eq(bd.buffer_address, master[cl.agents[0].name], "the master's address of it")
    all_ = a.batch_get_replica_desc(["rd/one", "rd/two", "rd/ssd", "rd/none", ""])
    eq(sorted(all_), sorted(["rd/one", "rd/two", "rd/ssd", "rd/none", ""]), "every key")
    eq(sorted(r.get_memory_descriptor().buffer_descriptor.transport_endpoint
              for r in all_["rd/two"]), sorted(x.name for x in cl.agents),
       "two copies on the two agents")
    ssd = all_["rd/ssd"]
    eq([(r.is_memory_replica(), r.is_local_disk_replica(), r.segment) for r in ssd],
       [(False, True, cl.agents[0].name + "/ssd")], "a replica in A's SSD tier segment")
    try:
        ssd[0].get_memory_descriptor()
        raise AssertionError("an SSD replica has no memory descriptor")
    except RuntimeError:
        pass
    eq((all_["rd/none"], all_[""]), ([], []), "a missing key and a bad one: no replicas")
    eq(a.get_replica_desc("rd/none"), [], "get_replica_desc of a missing key")
    # The question was a read: the object is leased for a while, as after a get.
    eq(a.remove("rd/one"), -706, "remove while the read lease holds")
    eq(a.remove("rd/one", force=True), OK, "forced remove")
    eq(b.get_replica_desc("rd/one"), [], "gone once removed")
    for s in (a, b):
        s.close()
    cl.stop()


@case
def batches_across_agents():
    cl = Cluster(agents=2, meta=True)
    a, b = [x.store() for x in cl.agents]
    keys = ["b/%04d" % i for i in range(1000)]
    vals = [os.urandom(100 + i) for i in range(1000)]
    eq(a.put_batch(keys, vals), OK, "1000 puts on A")
    eq(b.get_batch(keys) == vals, True, "1000 gets on B")
    eq(b.batch_is_exist(keys[:5] + ["nope"]), [1] * 5 + [0], "exist on B")
    eq(b.batch_remove(keys[:10], force=True), [OK] * 10, "remove on B")
    eq(a.batch_is_exist(keys[:10]), [0] * 10, "gone on A")
    eq(b.remove_all(force=True), 990, "remove_all")
    a.close()
    b.close()


@case
def a_killed_agent_leaves_the_index():
    cl = Cluster(agents=3, meta=True, master_args=["--agent-ttl=1s"])
    a, b, c = cl.agents
    sa, sb = a.store(), b.store()
    from mooncake.store import ReplicateConfig
    on_c = ReplicateConfig(preferred_segment=c.name)
    keys = ["c/%d" % i for i in range(20)]
    for k in keys:
        eq(sa.put(k, b"on C", on_c), OK, "put on C's segment")
    eq(sa.put("safe", b"on A and B", ReplicateConfig(replica_num=2,
                                                    preferred_segment=a.name)), OK, "two copies")
    segs = {r.segment for r in replicas(cl.master_addr, b"safe")}
    if c.name in segs:  # make sure it does not live on C
        eq(sa.remove("safe", force=True), OK, "retry placement")
        cl_safe = ReplicateConfig(replica_num=1, preferred_segment=b.name)
        eq(sa.put("safe", b"on A and B", cl_safe), OK, "on B")
    eq(sa.get("c/1"), b"on C", "read across while C lives (A has its segment open)")
    c.d.kill()
    t0 = time.monotonic()
    # Still in the index: A's read of C's bytes fails, it does not hang;
    # until A has seen C's connection close, A may still read them from
    # the mapping of C's segment it holds (the right bytes: C's memory
    # stays while A maps it).
    assert sa.get("c/2") in (b"", b"on C"), "a read from the killed agent"
    assert time.monotonic() - t0 < 10, "ends soon"
    eq(sa.get("safe"), b"on A and B", "A still serves")
    wait_for(lambda: sb.batch_is_exist(keys) == [0] * 20, timeout=15,
             what="C's objects out of the index")
    assert time.monotonic() - t0 < 10, "within the agent TTL and a sweep"
    eq(sb.get("c/0"), b"", "a get says not found")
    eq(sb.get("safe"), b"on A and B", "others still serve")
    eq(sb.put("after", b"ok"), OK, "puts still succeed")
    eq(sa.get("after"), b"ok", "and are read across")
    sa.close()
    sb.close()


@case
def a_master_held_past_the_agent_ttl_keeps_its_agents():
    """A master whose loop was held longer than --agent-ttl (here the
    process stopped with SIGSTOP; a RemoveRegex over millions of objects
    does the same) finds the agents' heartbeats unread in its sockets:
    that time does not count against them, so no agent expires and every
    object stays (before, the first tick after expired them all). Held
    twice: right after the puts, which is often before the master's
    first tick (that case still expired both agents, in CI), and again
    once it has ticked for a second."""
    cl = Cluster(agents=2, master_args=["--agent-ttl=2s"])
    a, b = cl.agents
    sa, sb = a.store(), b.store()
    eq(sa.put("held/a", b"A" * 1000), OK, "put on A")
    eq(sb.put("held/b", b"B" * 1000), OK, "put on B")
    for hold, after in ((3, 1), (3, 3)):
        cl.master.signal(signal.SIGSTOP)
        time.sleep(hold)
        cl.master.signal(signal.SIGCONT)
        time.sleep(after)
        eq(metric(cl.master_metrics(), "mooncake_master_agents_expired_total"), 0.0,
           "no agent expired")
    # (The last wait is longer than --agent-ttl: the heartbeats came back.)
    eq(cl.stats()["agents"], 2.0, "both agents")
    eq((sb.get("held/a"), sa.get("held/b")), (b"A" * 1000, b"B" * 1000), "every object")
    assert "the loop was held for" in cl.master.output(), "the master says so"
    sa.close()
    sb.close()
    cl.stop()


@case
def a_restarted_agent_takes_its_place_at_once():
    """An agent killed and started again on its data dir mounts at once,
    long before the master's --agent-ttl (60 s here) would have let the
    old process's segment go: its mount names the token the old process
    left in the data dir (agent.instance). What the old process held is
    gone (it was in its memory). Another process claiming the agent's
    name without that token is refused while the agent lives."""
    cl = Cluster(agents=1, master_args=["--agent-ttl=60s"])
    args = ["--meta-endpoints=", "--master-address=" + cl.master_addr,
            "--global-segment-size=64M", "--local-buffer-size=16M"]
    d = Daemon("agent", args=args, env=st.daemon_env())
    name, ddir, ports = d.addr("agent-listen"), d.data_dir, dict(d.ports)
    wait_for(lambda: "mounted with master" in d.output(), what="mounted")
    token = open(os.path.join(ddir, "agent.instance"), "rb").read()
    eq(len(token), 16, "the instance token kept in the data dir")

    def store_of(daemon):
        from mooncake.store import MooncakeDistributedStore
        s = MooncakeDistributedStore()
        eq(s.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", "unused",
                   socket_path=daemon.socket), 0, "setup")
        return s

    s = store_of(d)
    eq(s.put("before", b"in the old process"), OK)
    s.close()
    d.kill()
    t0 = time.monotonic()
    d2 = Daemon("agent", args=args, data_dir=ddir, ports=ports, env=st.daemon_env())
    wait_for(lambda: "mounted with master" in d2.output(), timeout=30,
             what="the restarted agent mounted")
    took = time.monotonic() - t0
    assert took < 30, "mounted %.1f s after the kill, before the 60 s TTL" % took
    assert "agent %s restarted" % name in cl.master.output(), cl.master.output()[-2000:]
    wait_for(lambda: metric(cl.master_metrics(), "mooncake_master_agents_restarted_total") == 1,
             what="the restart counted")
    eq(metric(cl.master_metrics(), "mooncake_master_agents_expired_total"), 0)
    assert open(os.path.join(ddir, "agent.instance"), "rb").read() != token, "a new token"
    s = store_of(d2)
    eq(s.get("before"), b"", "the old process's object went with it")
    eq(s.put("after", b"in the new one"), OK, "puts into the new segment")
    eq(cl.agents[0].store().get("after"), b"in the new one", "read on another agent")

    # Without the token: the agent's name on another data dir is refused.
    dup = Daemon("agent", args=args + ["--agent-name=" + name], env=st.daemon_env())
    wait_for(lambda: "cannot mount segment" in dup.output(), timeout=30,
             what="the impostor's mount refused")
    assert ("is mounted by agent %s" % name) in dup.output() and "--agent-ttl" in dup.output(), \
        dup.output()[-2000:]
    dup.kill()
    eq(s.get("after"), b"in the new one", "the agent still serves")
    eq(metric(cl.master_metrics(), "mooncake_master_agents_restarted_total"), 1)
    s.close()

    # A process that dies before it mounts (its master unreachable) does
    # not cut the chain: the next one names both tokens.
    d2.kill()
    dead = ["--master-address=127.0.0.1:%d" % mctest.free_port()]
    d3 = Daemon("agent", args=args + dead, data_dir=ddir, ports=ports, env=st.daemon_env())
    eq(len(open(os.path.join(ddir, "agent.instance"), "rb").read()), 48,
       "three tokens kept")
    time.sleep(0.5)
    d3.kill()
    assert "mounted with master" not in d3.output(), d3.output()[-2000:]
    t0 = time.monotonic()
    d4 = Daemon("agent", args=args, data_dir=ddir, ports=ports, env=st.daemon_env())
    wait_for(lambda: "mounted with master" in d4.output(), timeout=30,
             what="mounted after a process that never did")
    assert time.monotonic() - t0 < 30, "before the TTL"
    wait_for(lambda: metric(cl.master_metrics(), "mooncake_master_agents_restarted_total") == 2,
             what="the second restart counted")
    eq(store_of(d4).put("last", b"ok"), OK)
    eq(metric(cl.master_metrics(), "mooncake_master_agents_restarted_total"), 2)
    d4.stop()


@case
def objects_survive_a_master_failover_with_etcd():
    """The same failover with a real etcd as meta (compatibility)."""
    etcd = Etcd()
    args = ["--meta-endpoints=" + etcd.endpoint, "--leader-lease-ttl=2s"]
    m1 = Daemon("master", args=args, env=st.daemon_env())
    wait_for(lambda: "elected leader" in m1.output(), what="m1 leads")
    m2 = Daemon("master", args=args, env=st.daemon_env())
    wait_for(lambda: "standby" in m2.output(), what="m2 stands by")
    a = st.Agent(meta=etcd.endpoint)
    b = st.Agent(meta=etcd.endpoint)
    sa, sb = a.store(), b.store()
    vals = {("f/%d" % i): os.urandom(4096 + i) for i in range(50)}
    for k, v in vals.items():
        eq(sa.put(k, v), OK, "put before the failover")
    assert metric(a.metrics(), "mooncake_agent_put_commits_total") > 0, "through the put lease"
    m1.kill()
    wait_for(lambda: "elected leader" in m2.output(), timeout=20, what="m2 takes over")
    wait_for(lambda: "re-sync with master" in a.d.output() and
             "re-sync with master" in b.d.output(), timeout=20, what="agents re-synced")
    got = {k: sb.get(k) for k in vals}
    eq(got == vals, True, "every complete object survives, readable on B")
    eq(sb.put("new", b"after"), OK, "puts on the new leader")
    eq(sa.get("new"), b"after", "gets on the new leader")
    sa.close()
    sb.close()


def wait_inventory(agent, n, what, events=0):
    """Until the agent's mirror holds n objects, having applied at least
    `events` changes from its segment's log (an object counted before the
    change that removes it is not the end)."""
    def done():
        m = agent.metrics()
        return (metric(m, "mooncake_agent_inventory_objects") == n and
                metric(m, "mooncake_agent_mirror_events_total") >= events)
    wait_for(done, timeout=20, what=what)


def elected(master):
    return "elected leader" in master.output()


@case
def replicas_written_by_others_survive_a_master_failover():
    """Agent A writes replica_num=2 objects onto B and C only (its own
    segment is full), and single replicas onto B; the master leader is
    killed with SIGKILL; after the standby takes over, B and C report what
    others wrote into their segments, and every object is read back from
    every agent with the right bytes."""
    meta = Meta(env=st.daemon_env())
    margs = ["--meta-endpoints=" + meta.endpoint, "--leader-lease-ttl=2s"]
    m1 = Daemon("master", args=margs, env=st.daemon_env())
    wait_for(lambda: elected(m1), what="m1 leads")
    m2 = Daemon("master", args=margs, env=st.daemon_env())
    wait_for(lambda: "standby" in m2.output(), what="m2 stands by")
    # (no put lease on A: its whole segment goes to the filler)
    a = st.Agent(meta=meta.endpoint, segment=16 * MiB, args=["--put-lease-size=0"])
    b = st.Agent(meta=meta.endpoint)
    c = st.Agent(meta=meta.endpoint)
    sa, sb, sc = a.store(), b.store(), c.store()
    from mooncake.store import ReplicateConfig
    filler = os.urandom(16 * MiB)
    eq(sa.put("a/filler", filler), OK, "A's own segment filled")
    vals = {}
    for i, n in enumerate([0, 1, 4096, 100000, MiB + 3] * 6):
        k = "two/%d" % i
        vals[k] = os.urandom(n)
        # (an empty value takes no space: A's own segment, preferred by
        # default, would still do for it)
        two = ReplicateConfig(replica_num=2, preferred_segment=b.name if n == 0 else "")
        eq(sa.put(k, vals[k], two), OK, "put %s from A" % k)
        segs = sorted(r.segment for r in replicas(m1.addr("master-listen"), k.encode()))
        eq(segs, sorted([b.name, c.name]), "%s on B and C" % k)
    on_b = ReplicateConfig(preferred_segment=b.name)
    for i in range(20):
        k = "one/%d" % i
        vals[k] = os.urandom(5000 + i)
        eq(sa.put(k, vals[k], on_b), OK, "put %s from A onto B" % k)
    vals["b/own"] = b"written by B itself"
    eq(sb.put("b/own", vals["b/own"]), OK, "B's own put")
    # (B's count passes through 50 on its way to 51 too: wait for every
    # put first, then for the removal)
    wait_inventory(b, 30 + 20 + 1, "B's mirror holds every put")
    eq(sa.remove("one/0", force=True), OK, "a removal B hears of")
    del vals["one/0"]
    # B and C hear of every replica through their segments' logs.
    wait_inventory(b, 30 + 19 + 1, "B's mirror holds what A wrote there", events=30 + 20 + 1 + 1)
    wait_inventory(c, 30, "C's mirror holds what A wrote there", events=30)
    m1.kill()
    wait_for(lambda: elected(m2), timeout=30, what="m2 takes over")
    done = "re-sync with master %s (view" % m2.addr("master-listen")
    for ag in (a, b, c):
        wait_for(lambda: done in ag.d.output(), timeout=30, what="agent re-synced with m2")
    for name, s in (("A", sa), ("B", sb), ("C", sc)):
        got = {k: s.get(k) for k in vals}
        bad = [k for k in vals if got[k] != vals[k]]
        eq(bad, [], "objects read wrong or missing on %s after the failover" % name)
        eq(len(s.get("one/0")), 0, "the removed object stays removed (%s)" % name)
    eq(sb.get("a/filler") == filler, True, "A's own object, read on B")
    segs = sorted(r.segment for r in replicas(m2.addr("master-listen"), b"two/7"))
    eq(segs, sorted([b.name, c.name]), "both replicas are known to the new leader")
    for s in (sa, sb, sc):
        s.close()


@case
def a_stale_mirror_does_not_resurrect_reused_space():
    """The race a checksum closes: the leader frees X (a removal), reuses
    its space for Y, a remote writer (A) writes Y into B's segment, and
    the leader dies before B heard of either (B's link to it is cut by a
    proxy that drops every byte). B's mirror still says X is at that
    offset; on re-sync B finds the bytes there are not X's and leaves X
    out: X is not brought back holding Y's bytes."""
    meta = Meta(env=st.daemon_env())
    m1_port = mctest.free_port()
    proxy = Proxy(m1_port)  # B's (and the leader key's) way to m1
    margs = ["--meta-endpoints=" + meta.endpoint, "--leader-lease-ttl=2s", "--agent-ttl=60s",
             "--default-kv-lease-ttl=500ms"]
    m1 = Daemon("master", args=margs + ["--master-advertise=127.0.0.1:%d" % proxy.port],
                env=st.daemon_env(), ports={"master-listen": m1_port})
    wait_for(lambda: elected(m1), what="m1 leads")
    m2 = Daemon("master", args=margs, env=st.daemon_env())
    wait_for(lambda: "standby" in m2.output(), what="m2 stands by")
    b = st.Agent(meta=meta.endpoint)
    # A reaches m1 directly, so it can go on writing once B is cut off;
    # without put leases its puts onto B take PutStart, whose placement
    # reuses freed space.
    a = st.Agent(meta=meta.endpoint, args=["--master-address=127.0.0.1:%d" % m1_port,
                                           "--put-lease-size=0"])
    sa, sb = a.store(), b.store()
    from mooncake.store import ReplicateConfig
    on_b = ReplicateConfig(preferred_segment=b.name)
    keep, x, y = os.urandom(70000), os.urandom(100000), os.urandom(100000)
    eq(sa.put("keep", keep, on_b), OK, "keep, onto B")
    eq(sa.put("x", x, on_b), OK, "x, onto B")
    x_rep = replicas("127.0.0.1:%d" % m1_port, b"x")[0]
    eq(x_rep.segment, b.name, "x lives on B")
    wait_inventory(b, 2, "B's mirror holds keep and x", events=2)
    proxy.set_mode("blackhole")
    # (Once the lease of the lookup above ended: a removal under a lease
    # holds the space until the lease ends.)
    wait_for(lambda: sa.remove("x") == OK, what="x removed (B cannot hear of it)")
    eq(sa.put("y", y, on_b), OK, "y, onto B, written by A")
    y_rep = replicas("127.0.0.1:%d" % m1_port, b"y")[0]
    eq((y_rep.segment, y_rep.offset), (b.name, x_rep.offset), "y reuses x's space")
    eq(metric(b.metrics(), "mooncake_agent_inventory_objects"), 2.0,
       "B's mirror is stale: x, not y")
    m1.kill()
    wait_for(lambda: elected(m2), timeout=30, what="m2 takes over")
    m2_addr = m2.addr("master-listen")
    wait_for(lambda: ("re-sync with master %s" % m2_addr) in b.d.output(), timeout=30,
             what="B re-synced with m2")
    c = st.Agent(meta=meta.endpoint)
    sc = c.store(verify_gets=False)  # no check: would X come back with Y's bytes?
    got = sc.get("x")
    eq((len(got), got == y), (0, False), "x is not resurrected (holding y's bytes)")
    eq(sc.is_exist("x"), 0, "x does not exist")
    eq(st.metric_labels(b.metrics(), "mooncake_agent_resync_skipped_total",
                        'reason="checksum"'), 1.0, "x failed its check and was left out")
    eq(sc.get("keep"), keep, "what B held intact survives")
    eq(sb.get("keep"), keep, "and is read on B")
    eq(sb.put("x", b"x again"), OK, "the key can be stored anew")
    eq(sc.get("x"), b"x again", "and read")
    for s in (sa, sb, sc):
        s.close()
    proxy.close()


@case
def verified_gets_catch_bytes_that_changed():
    """Bytes of a stored object overwritten behind the index's back (here
    by a transfer-engine write into B's segment at the replica's address)
    are served as they are by a plain get, and refused by a
    verifying one (Python: TRANSFER_FAIL; libmooncake and mooncakectl get
    --verify: MC_ECHECKSUM), for
    a copy, a remote read and a zero-copy view."""
    cl = Cluster(agents=2, meta=True)
    a, b = cl.agents
    sa, sb = a.store(verify_gets=False), b.store(verify_gets=False)
    val = os.urandom(300000)
    eq(sb.put("v", val), OK, "put on B")
    eq(sa.get("v", verify=True), val, "intact: verified get on A")
    rep = replicas(cl.master_addr, b"v")[0]
    eq(rep.segment, b.name, "on B's segment")
    te = a.engine()
    buf = te.allocate_managed_buffer(4096)
    te.write_bytes_to_buffer(buf, b"\xff" * 16, 16)
    eq(te.transfer_sync_write(b.name, buf, rep.address + 1000, 16), OK,
       "overwrite 16 bytes in the middle of the value")
    eq(sb.get("v") == val, False, "a plain get serves the changed bytes")
    eq(sb.get("v", verify=True), b"", "a verified local get refuses them")
    eq(sa.get("v", verify=True), b"", "a verified remote get refuses them")
    from mooncake.store import CHECKSUM_MISMATCH
    dst = te.allocate_managed_buffer(len(val))
    eq(sb.get_into("v", dst, len(val), verify=True), CHECKSUM_MISMATCH, "get_into: TRANSFER_FAIL")
    eq(b.store(verify_gets=True).get_buffer("v"), None, "a verified zero-copy view refuses them")
    out = os.path.join(b.tmp.name, "v.out")
    r = b.ctl("get", "v", out, "--verify", check=False)
    eq(r.returncode, 1, "mooncakectl get --verify fails")
    assert "MC_ECHECKSUM" in r.stderr, r.stderr
    eq(b.ctl("get", "v", out).returncode, 0, "mooncakectl get without --verify serves them")
    with open(out, "rb") as f:
        eq(len(f.read()), len(val), "all of them")
    assert metric(b.metrics(), "mooncake_agent_get_checksum_failures_total") >= 2
    te.free_managed_buffer(buf, 4096)
    te.free_managed_buffer(dst, len(val))
    te.close()
    sa.close()
    sb.close()


@case
def a_lone_client_reads_same_host_agents_on_the_loop():
    """A session alone on its agent gets a big value from another agent of
    the same host by a copy on the agent's loop (no hand-off to the
    transfer engine's threads and back); while other sessions send too,
    the engine's threads copy it. The bytes are right either way."""
    cl = Cluster(agents=2)
    a, b = cl.agents
    sa, sa2, sb = a.store(verify_gets=False), a.store(), b.store()
    big = os.urandom(MiB + 3)
    eq(sb.put("big", big), OK, "put on B")

    def inline_bytes():
        return metric(a.metrics(), "mooncake_te_shm_inline_bytes_total")

    # The first get after another session's request starts the lone
    # period; a request another session sends meanwhile (on a loaded
    # machine the ten gets take longer) starts it again.
    eq(sa.get("big") == big, True, "the get that starts the lone period")
    i0 = inline_bytes()
    for _ in range(10):
        time.sleep(0.005)  # alone for more than AGENT_SOLO_NS
        eq(sa.get("big") == big, True, "a lone get on A")
    i1 = inline_bytes()
    assert i1 - i0 >= 8 * (MiB + 3), "copied on the loop: %d bytes" % (i1 - i0)
    for _ in range(10):
        eq(sa2.is_exist("big"), 1, "another session")
        eq(sa.get("big") == big, True, "a get on A among others")
    i2 = inline_bytes()
    assert i2 - i1 < MiB, "copied by the engine's threads: %d inline bytes" % (i2 - i1)
    for s in (sa, sa2, sb):
        s.close()


@case
def hot_keys_on_other_agents_are_read_without_the_master():
    """Gets on A of a small object in B's segment are answered from A's
    lease cache after the first, the bytes checked against the object's
    checksum each time: when they change behind A's back (a forced remove
    and a new put on B, the old bytes then overwritten) A notices, asks
    the master and serves the new value. Big values always ask."""
    cl = Cluster(agents=2)
    a, b = cl.agents
    sa, sb = a.store(verify_gets=False), b.store(verify_gets=False)
    v1, big = os.urandom(4096), os.urandom(MiB)
    eq((sb.put("hot", v1), sb.put("big", big)), (OK, OK), "put on B")
    eq(sa.get("hot"), v1, "the first get on A asks the master")
    calls = 'method="/mooncake.master.Master/BatchGetReplicas",code="OK"'

    def counts():
        m = a.metrics()
        return (metric(m, "mooncake_agent_lease_cache_hits_total"),
                metric(m, "mooncake_agent_lease_cache_stale_total"),
                metric_labels(m, "mooncake_rpc_client_calls_total", calls))

    h0, s0, c0 = counts()
    for _ in range(50):
        eq(sa.get("hot"), v1, "get on A")
    for _ in range(5):
        eq(sa.get("big") == big, True, "1 MiB get on A")
    h1, s1, c1 = counts()
    eq((h1 - h0, s1 - s0, c1 - c0), (50, 0, 5), "cache hits, stale entries, master calls")
    # A batch checks at most 1 MiB of cached remote bytes on the loop; a
    # bigger one asks the master for all of them.
    vals = {"b/%d" % i: os.urandom(60000) for i in range(20)}
    eq(sb.put_batch(list(vals), list(vals.values())), OK, "20 x 60 KB on B")
    eq(sa.get_batch(list(vals)), list(vals.values()), "first batch get on A")
    eq(sa.get_batch(list(vals)[:10]), list(vals.values())[:10], "600 KB: from the cache")
    eq(sa.get_batch(list(vals)), list(vals.values()), "1.2 MB: from the master")
    h2, s2, c2 = counts()
    eq((h2 - h1, s2 - s1, c2 - c1), (10, 0, 2), "cache hits, stale entries, master calls")
    h1, s1, c1 = h2, s2, c2

    old = replicas(cl.master_addr, b"hot")[0]
    eq(old.segment, b.name, "on B's segment")
    eq(sb.remove("hot", force=True), OK, "forced remove on B while A holds the lease")
    wait_for(lambda: metric(cl.master_metrics(),
                            "mooncake_master_forced_removes_held_total") == 1.0,
             what="its space held until the lease ends")
    v2 = os.urandom(4096)
    eq(sb.put("hot", v2), OK, "put again on B")
    assert replicas(cl.master_addr, b"hot")[0].address != old.address, "not in the held space" 
    te = b.engine()
    buf = te.allocate_managed_buffer(4096)
    te.write_bytes_to_buffer(buf, b"\0" * 4096, 4096)
    eq(te.transfer_sync_write(b.name, buf, old.address, 4096), OK,
       "the old bytes changed (as after a master failover, which forgets held space)")
    eq(sa.get("hot"), v2, "A serves the new value")
    h2, s2, c2 = counts()
    eq((s2 - s1, c2 - c1), (1, 1), "the stale entry caught, the master asked")
    eq(sa.get("hot"), v2, "and cached again")
    eq(counts()[0] - h2, 1, "a hit")
    te.free_managed_buffer(buf, 4096)
    te.close()
    sa.close()
    sb.close()

    # --remote-lease-cache-size=0: every get asks the master, so a forced
    # remove and a new put elsewhere are seen at once even while the old
    # bytes are intact.
    cl = Cluster(agents=2, agent_args=["--remote-lease-cache-size=0"])
    a, b = cl.agents
    sa, sb = a.store(verify_gets=False), b.store(verify_gets=False)
    eq(sb.put("k", v1), OK, "put on B")
    eq(sa.get("k"), v1, "get on A")
    eq(sb.remove("k", force=True), OK, "forced remove")
    eq(sb.put("k", v2), OK, "put again")
    eq(sa.get("k"), v2, "the new value at once")
    eq(metric(a.metrics(), "mooncake_agent_lease_cache_hits_total"), 0.0, "no cache hit")
    sa.close()
    sb.close()


@case
def views_of_remote_objects_reuse_spill_buffers():
    """get_buffer of an object held by another agent reads it into one of
    the session's spill buffers (kept after the first needed a temporary
    memfd), or into the staging memfd when it fits there, and holds it
    there until release: bytes right, buffers reused rather than made per
    get, more views held than buffers still right, nothing left once the
    session closes."""
    cl = Cluster(agents=2, segment=256 * MiB)
    a, b = cl.agents
    sa, sb = a.store(), b.store()
    vals = {"big/%d" % i: os.urandom(16 * MiB + i) for i in range(6)}
    for k, v in vals.items():
        eq(sb.put(k, v), OK, "put %s on B" % k)
    for rnd in range(3):
        for k, v in vals.items():
            h = sa.get_buffer(k)
            assert h is not None, k
            eq(h.is_mapped(), False, "a remote object is a copy")
            eq(h.tobytes() == v, True, "bytes of %s, round %d" % (k, rnd))
            h.release()
            eq(sa.get(k) == v, True, "copying get of %s" % k)
    bufs = metric(a.metrics(), "mooncake_agent_buffers")
    assert 1 <= bufs <= 4, bufs
    held = [sa.get_buffer(k) for k in vals]
    assert all(h is not None for h in held), "six views held at once"
    for h, (k, v) in zip(held, vals.items()):
        eq(h.tobytes() == v, True, "held view of %s" % k)
    for h in held:
        h.release()
    # The ones beyond the free buffers took temporary memfds and left
    # buffers of their size behind, up to four.
    for rnd in range(2):
        held = [sa.get_buffer(k) for k in vals]
        for h, (k, v) in zip(held, vals.items()):
            eq(h.tobytes() == v, True, "held view of %s" % k)
        for h in held:
            h.release()
        assert bufs <= metric(a.metrics(), "mooncake_agent_buffers") <= 4
    # A smaller one is read into the staging memfd and held there: puts
    # and gets through staging meanwhile do not touch it.
    small = os.urandom(MiB)
    eq(sb.put("small", small), OK, "put 1 MiB on B")
    h = sa.get_buffer("small")
    eq(sa.put("local", os.urandom(3 * MiB)), OK, "a put through staging meanwhile")
    eq(len(sa.get("local")), 3 * MiB, "a get through staging meanwhile")
    eq(h.tobytes() == small, True, "the held view's bytes")
    h.release()
    sa.close()
    wait_for(lambda: metric(a.metrics(), "mooncake_agent_buffers") == 0.0,
             what="the session's spill buffers freed with it")
    sb.close()


@case
def transfers_between_client_buffers_of_two_nodes():
    """Prefill/decode disaggregation: the decode side allocates managed
    memory (published at its address), the prefill side writes into it
    with the decode side's session id and addresses."""
    cl = Cluster(agents=2, meta=True)
    prefill = cl.agents[0].engine()
    decode = cl.agents[1].engine()
    n = 4 * MiB
    dst = decode.allocate_managed_buffer(n)
    src = prefill.allocate_managed_buffer(n)
    assert dst and src
    payload = os.urandom(n)
    prefill.write_bytes_to_buffer(src, payload, n)
    target = "127.0.0.1:%d" % decode.get_rpc_port()
    eq(target, decode.get_local_hostname(), "session id host:port")
    eq(prefill.transfer_sync_write(target, src, dst, n), OK, "write into the peer's buffer")
    eq(decode.read_bytes_from_buffer(dst, n) == payload, True, "bytes arrived")
    blocks = [(src + i * 65536, dst + MiB + i * 65536) for i in range(8)]
    eq(prefill.batch_transfer_sync_write(target, [s for s, _ in blocks], [d for _, d in blocks],
                                         [4096] * 8), OK, "batch write")
    decode.write_bytes_to_buffer(dst, b"from decode", 11)
    eq(prefill.transfer_sync_read(target, src, dst, 11), OK, "read from the peer")
    eq(prefill.read_bytes_from_buffer(src, 11), b"from decode", "read back")
    eq(prefill.transfer_sync_write(target, src, 4096, 16), -820,
       "an address the peer never registered: refused")
    decode.free_managed_buffer(dst, n)
    eq(prefill.transfer_sync_write(target, src, dst, 16) != OK, True,
       "a freed buffer is no longer reachable")
    prefill.close()
    decode.close()


mctest.main()
