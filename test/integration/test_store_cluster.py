"""The store across nodes: three agents, a master and meta (a real etcd for
now) as separate processes on loopback, replicas moved between agents by
the transfer engine. Put on one agent and get on the others, replicas on
distinct segments, batches of a thousand keys, an agent killed with
SIGKILL, a master failover after which the agents re-report what they
hold, and transfers between client buffers of two nodes (prefill/decode
disaggregation) — through the Python package, as users call it.
"""
import os
import time

import storetest as st
from storetest import Cluster, MiB, metric
import mctest
from mctest import Daemon, Etcd, case, eq, wait_for

import grpc
import master_pb2 as M

OK = 0
NOT_FOUND = -704


def replicas(master_addr, key):
    with grpc.insecure_channel(master_addr) as ch:
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
    eq(a.put("four", b"x", ReplicateConfig(replica_num=4)), -702, "four on three: NO_SPACE")
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
    c.d.kill()
    t0 = time.monotonic()
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
def objects_survive_a_master_failover():
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
