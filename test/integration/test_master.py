"""mooncaked --role=master driven through mooncake.master.Master with a
real gRPC client (Python grpcio), as agents will drive it: segments,
the put protocol, placement on distinct segments, read leases, removal
rules and error codes, batches, PENDING timeouts, silent agents, eviction
under a Zipf-like load (watermark, leases, soft pins), metrics, and HA
failover between two masters through a real etcd (kill -9 the leader:
the standby takes over, the view bumps, the index is rebuilt from an
agent's heartbeat inventory); the partition and redirect cases run on
mooncaked's own meta. mooncakectl ls and stats talk to it too.
"""
import random
import subprocess
import time
import urllib.request

import mctest
from mctest import case, Daemon, Etcd, Meta, eq, run, wait_for

import grpc
import health_pb2
import master_pb2 as M

MiB = 1 << 20
OK = 0
NOT_FOUND = -704
EXISTS = -705
HAS_LEASE = -706
NO_SPACE = -702
EINVAL = -22


class Master:
    """A client of one master address."""

    def __init__(self, addr):
        self.addr = addr
        self.ch = mctest.token_channel(addr, options=[
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20)])

    def call(self, method, req, resp_cls, timeout=10):
        f = self.ch.unary_unary("/mooncake.master.Master/" + method,
                                request_serializer=req.SerializeToString,
                                response_deserializer=resp_cls.FromString)
        return f(req, timeout=timeout)

    def code(self, method, req, resp_cls):
        """(error code, reply): the code parsed from grpc-message."""
        try:
            return OK, self.call(method, req, resp_cls)
        except grpc.RpcError as e:
            return int(e.details().split()[0]), e

    def mount(self, name, agent, size, base=1 << 40, resync=False):
        return self.call("MountSegment", M.MountSegmentRequest(
            segment=M.Segment(name=name, agent_id=agent, base_address=base, size=size),
            resync=resync), M.MountSegmentResponse)

    def put(self, key, size, replica_num=1, **kw):
        r = self.call("PutStart", M.PutStartRequest(key=key, size=size,
                                                    replica_num=replica_num, **kw),
                      M.PutStartResponse)
        self.call("PutEnd", M.PutEndRequest(key=key), M.PutEndResponse)
        return r

    def get(self, key):
        return self.code("GetReplicas", M.GetReplicasRequest(key=key), M.GetReplicasResponse)

    def exist(self, key):
        return self.call("Exist", M.ExistRequest(key=key), M.ExistResponse).exists

    def stats(self):
        return self.call("Stats", M.StatsRequest(), M.StatsResponse)

    def heartbeat(self, agent, view=0, inventory=(), complete=False):
        return self.call("Heartbeat", M.HeartbeatRequest(
            agent_id=agent, view=view, inventory=list(inventory),
            inventory_complete=complete), M.HeartbeatResponse)

    def close(self):
        self.ch.close()


def master(*args, meta=""):
    d = Daemon("master", args=["--meta-endpoints=" + meta] + list(args))
    return d, Master(d.addr("master-listen"))


def health(addr, service="mooncake.master.Master"):
    with grpc.insecure_channel(addr) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                               response_deserializer=health_pb2.HealthCheckResponse.FromString)
        return check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def metrics(d):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % d.ports["master-http"],
                                timeout=5) as r:
        return r.read().decode()


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError("no metric " + name)


# ------------------------------------------------------------ basics

@case
def put_get_remove_and_error_codes():
    d, m = master()
    eq(m.mount("segA", "agentA", 64 * MiB).view, 1, "view without meta")
    m.mount("segB", "agentB", 64 * MiB, base=1 << 41)
    r = m.put(b"k2", 1000, replica_num=2)
    segs = sorted(x.segment for x in r.replicas)
    eq(segs, ["segA", "segB"], "replica_num=2 on distinct segments")
    for x in r.replicas:
        eq(x.address, (1 << 40 if x.segment == "segA" else 1 << 41) + x.offset, "address")
        eq(x.size, 1000, "size")
    code, g = m.get(b"k2")
    eq(code, OK, "get")
    eq(len(g.replicas), 2, "both replicas")
    assert all(x.state == M.REPLICA_COMPLETE for x in g.replicas)
    eq(g.lease_ttl_ms, 5000, "default lease")
    eq(m.code("PutStart", M.PutStartRequest(key=b"k2", size=1), M.PutStartResponse)[0],
       EXISTS, "duplicate put")
    code, err = m.code("Remove", M.RemoveRequest(key=b"k2"), M.RemoveResponse)
    eq(code, HAS_LEASE, "remove while leased")
    eq(err.code(), grpc.StatusCode.FAILED_PRECONDITION, "status of -706")
    eq(m.code("Remove", M.RemoveRequest(key=b"k2", force=True), M.RemoveResponse)[0], OK, "force")
    eq(m.exist(b"k2"), False, "gone")
    code, err = m.get(b"k2")
    eq((code, err.code()), (NOT_FOUND, grpc.StatusCode.NOT_FOUND), "get after remove")
    # Keys of 1 B and 4 KiB (any bytes), values of 0 B; 4097 B refused.
    big = bytes(range(256)) * 16
    m.put(b"\x00", 0)
    m.put(big, 3)
    eq(m.get(big)[1].size, 3, "4 KiB key")
    eq(m.get(b"\x00")[1].size, 0, "0-byte value")
    code, err = m.code("PutStart", M.PutStartRequest(key=big + b"x", size=1), M.PutStartResponse)
    eq((code, err.code()), (EINVAL, grpc.StatusCode.INVALID_ARGUMENT), "4097-byte key")
    code, err = m.code("PutStart", M.PutStartRequest(key=b"three", size=1, replica_num=3),
                       M.PutStartResponse)
    eq(code, -708, "three replicas on two segments: too few segments, not no space")
    assert "3 replicas need 3 segments and only 2 are mounted" in err.details(), err.details()
    eq(m.code("PutStart", M.PutStartRequest(key=b"huge", size=65 * MiB), M.PutStartResponse)[0],
       NO_SPACE, "larger than any segment")
    # PENDING: not visible, revocable once.
    m.call("PutStart", M.PutStartRequest(key=b"p", size=10), M.PutStartResponse)
    eq(m.exist(b"p"), False, "pending does not exist")
    eq(m.code("PutRevoke", M.PutRevokeRequest(key=b"p"), M.PutRevokeResponse)[0], OK, "revoke")
    eq(m.code("PutEnd", M.PutEndRequest(key=b"p"), M.PutEndResponse)[0], NOT_FOUND, "end revoked")
    # Preferred segment first.
    r = m.call("PutStart", M.PutStartRequest(key=b"pref", size=10, preferred_segment="segB"),
               M.PutStartResponse)
    eq(r.replicas[0].segment, "segB", "preferred")
    # RemoveAll leaves leased objects unless forced.
    m.call("PutEnd", M.PutEndRequest(key=b"pref"), M.PutEndResponse)
    m.get(big)
    ra = m.call("RemoveAll", M.RemoveAllRequest(), M.RemoveAllResponse)
    eq((ra.removed, ra.skipped), (1, 2), "RemoveAll without force (two leased)")
    ra = m.call("RemoveAll", M.RemoveAllRequest(force=True), M.RemoveAllResponse)
    eq((ra.removed, ra.skipped), (2, 0), "RemoveAll forced")
    # Segment ownership.
    eq(m.code("MountSegment", M.MountSegmentRequest(segment=M.Segment(
        name="segA", agent_id="thief", base_address=0, size=MiB)), M.MountSegmentResponse)[0],
       -17, "someone else's segment name")
    code, err = m.code("MountSegment", M.MountSegmentRequest(segment=M.Segment(
        name="segA", agent_id="agentA", base_address=1 << 44, size=MiB)), M.MountSegmentResponse)
    eq(code, -17, "another address without the agent's instance token")
    assert "is mounted by agent agentA" in err.details(), err.details()
    for inst, prev, what in ((b"x" * 33, b"", "a 33-byte token"),
                             (b"x" * 16, b"y" * 17, "previous tokens of another length"),
                             (b"x" * 16, b"y" * 80, "five previous tokens"),
                             (b"", b"y" * 16, "previous tokens without an instance")):
        eq(m.code("MountSegment", M.MountSegmentRequest(
            segment=M.Segment(name="segZ", agent_id="agentZ", base_address=0, size=MiB),
            instance=inst, previous_instance=prev), M.MountSegmentResponse)[0], EINVAL, what)
    eq(m.code("UnmountSegment", M.UnmountSegmentRequest(name="segA", agent_id="thief"),
              M.UnmountSegmentResponse)[0], -13, "unmount by another agent")
    m.put(b"on-a", 10, preferred_segment="segA")
    u = m.call("UnmountSegment", M.UnmountSegmentRequest(name="segA", agent_id="agentA"),
               M.UnmountSegmentResponse)
    eq((u.replicas_dropped, u.objects_removed), (1, 1), "unmount drops")
    m.close()
    eq(d.stop(), 0, "clean exit")


@case
def batches_of_a_thousand():
    d, m = master()
    m.mount("s1", "a1", 256 * MiB)
    m.mount("s2", "a2", 256 * MiB)
    keys = [b"batch/%04d" % i for i in range(1000)]
    items = [M.PutStartRequest(key=k, size=4096 + i, replica_num=2) for i, k in enumerate(keys)]
    items.append(M.PutStartRequest(key=keys[0], size=1))  # duplicate inside the batch
    r = m.call("BatchPutStart", M.BatchPutStartRequest(items=items), M.BatchPutStartResponse)
    eq(len(r.results), 1001, "one result per item")
    eq([x.error for x in r.results[:1000]], [0] * 1000, "all placed")
    eq(r.results[1000].error, EXISTS, "duplicate in the batch")
    assert all(len({p.segment for p in x.replicas}) == 2 for x in r.results[:1000])
    e = m.call("BatchPutEnd", M.BatchKeysRequest(keys=keys + [b"nope"]), M.BatchErrorsResponse)
    eq(list(e.errors), [0] * 1000 + [NOT_FOUND], "batch put end")
    g = m.call("BatchGetReplicas", M.BatchKeysRequest(keys=keys + [b"nope", b""]),
               M.BatchGetReplicasResponse)
    eq([x.error for x in g.results], [0] * 1000 + [NOT_FOUND, EINVAL], "batch get")
    eq([x.size for x in g.results[:1000]], [4096 + i for i in range(1000)], "sizes")
    x = m.call("BatchExist", M.BatchKeysRequest(keys=[keys[5], b"nope", b""]),
               M.BatchExistResponse)
    eq((list(x.exists), list(x.errors)), ([True, False, False], [0, 0, EINVAL]), "batch exist")
    rm = m.call("BatchRemove", M.BatchRemoveRequest(keys=keys[:10]), M.BatchErrorsResponse)
    eq(list(rm.errors), [HAS_LEASE] * 10, "leased")
    rm = m.call("BatchRemove", M.BatchRemoveRequest(keys=keys[:10], force=True),
                M.BatchErrorsResponse)
    eq(list(rm.errors), [0] * 10, "forced")
    # mooncakectl ls and stats against it.
    out = run([mctest.MOONCAKECTL, "ls", "--master=" + m.addr, "batch/099"]).stdout
    eq(out.split(), ["batch/0990", "batch/0991", "batch/0992", "batch/0993", "batch/0994",
                     "batch/0995", "batch/0996", "batch/0997", "batch/0998", "batch/0999"], "ls")
    out = run([mctest.MOONCAKECTL, "ls", "--master=" + m.addr, "--limit=7"]).stdout
    eq(len(out.split()), 990, "ls pages through everything")
    # List keeps the page's smallest keys (a heap of `limit`): pages in
    # order, each `more` but the last.
    got, after, pages = [], b"", 0
    while True:
        r = m.call("List", M.ListRequest(limit=37, start_after=after), M.ListResponse)
        got += [i.key for i in r.items]
        pages += 1
        if not r.more:
            break
        after = r.items[-1].key
    eq((got, pages), (sorted(got), (990 + 36) // 37), "pages in key order")
    eq(len(set(got)), 990, "each key once")
    r = m.call("List", M.ListRequest(limit=990), M.ListResponse)
    eq((len(r.items), r.more), (990, False), "a page of all of them")
    # One call's items are handled in one turn of the loop: at most 65536.
    many = [b"m/%d" % i for i in range(65537)]
    code, e = m.code("BatchGetReplicas", M.BatchKeysRequest(keys=many),
                     M.BatchGetReplicasResponse)
    eq(code, EINVAL, "a batch past the limit")
    assert "65537 items in one call, at most 65536" in e.details(), e.details()
    x = m.call("BatchExist", M.BatchKeysRequest(keys=many[:65536]), M.BatchExistResponse)
    eq(len(x.exists), 65536, "a batch at the limit")
    code, e = m.code("Heartbeat", M.HeartbeatRequest(agent_id="a", inventory=[
        M.InventoryItem(key=k, segment="s1", size=1) for k in many]), M.HeartbeatResponse)
    eq(code, EINVAL, "an inventory past the limit")
    for req, why in ((M.ListRequest(limit=100001), "limit above 100000"),
                     (M.ListRequest(prefix=b"p" * 4097), "a prefix longer than a key"),
                     (M.ListRequest(start_after=b"a" * 4097), "a start_after longer")):
        code, e = m.code("List", req, M.ListResponse)
        eq(code, EINVAL, why)
        assert why in e.details(), e.details()
    out = run([mctest.MOONCAKECTL, "stats", "--master=" + m.addr]).stdout
    assert "objects 990" in out and "s1" in out and "s2" in out, out
    m.close()
    eq(d.stop(), 0, "clean exit")


@case
def removal_walks_let_other_calls_through():
    """RemoveRegex and RemoveAll walk the whole index, some 2.7 us an
    object removed: on the master's loop, 300,000 objects held every
    other call for most of a second. They walk in slices now, so Stats
    asked meanwhile sees the objects going (neither all nor none), and
    the counts stay exact: each object is looked at once. A walk whose
    client goes away runs on to its end. Patterns with back-references
    (matching time without bound) or repetition bounds that regcomp
    would write out into gigabytes are refused."""
    d, m = master()
    m.mount("s1", "a1", 1 << 40)
    # Patterns whose matching or compiling would hold the master: refused.
    for pat, why in (("(a|aa)*\\1\\1b", "back-references"),
                     ("(a{1000}){1000}", "repetition bounds multiply past 65536"),
                     ("a" * 4097, "longer than 4096 bytes")):
        code, e = m.code("RemoveRegex", M.RemoveRegexRequest(pattern=pat), M.RemoveAllResponse)
        eq(code, EINVAL, pat[:20])
        assert why in e.details(), e.details()
    for pat in ("^[\\1{]x{3}", "^(p|q){2,5}/[[:digit:]]{1,4}$", "a{256}"):
        eq(m.code("RemoveRegex", M.RemoveRegexRequest(pattern=pat), M.RemoveAllResponse)[0],
           OK, pat)
    n = 300000
    for b in range(0, n, 5000):
        keys = [b"w/%06d" % i for i in range(b, b + 5000)]
        r = m.call("BatchPutStart", M.BatchPutStartRequest(
            items=[M.PutStartRequest(key=k, size=64) for k in keys]), M.BatchPutStartResponse)
        assert all(x.error == 0 for x in r.results)
        m.call("BatchPutEnd", M.BatchKeysRequest(keys=keys), M.BatchErrorsResponse)
    # List walks in slices too: Stats is answered while it walks, the
    # page is the first keys in order, and a List whose client gives up
    # stops (its slot among the walks is free again).
    lx = m.ch.unary_unary("/mooncake.master.Master/List",
                          request_serializer=M.ListRequest.SerializeToString,
                          response_deserializer=M.ListResponse.FromString)
    fut = lx.future(M.ListRequest(prefix=b"w/", limit=5), timeout=60)
    polls = 0
    while not fut.done():
        m.stats()
        polls += 1
    r = fut.result()
    eq(([i.key for i in r.items], r.more), ([b"w/%06d" % i for i in range(5)], True), "List")
    assert polls >= 2, "Stats answered during the List: %d" % polls
    for _ in range(12):
        try:
            lx(M.ListRequest(limit=5), timeout=0.002)
        except grpc.RpcError as e:
            eq(e.code(), grpc.StatusCode.DEADLINE_EXCEEDED, "a List given up")
    eq(m.code("GetReplicas", M.GetReplicasRequest(key=b"w/000007"), M.GetReplicasResponse)[0],
       OK, "a leased one")
    rx = m.ch.unary_unary("/mooncake.master.Master/RemoveRegex",
                          request_serializer=M.RemoveRegexRequest.SerializeToString,
                          response_deserializer=M.RemoveAllResponse.FromString)
    fut = rx.future(M.RemoveRegexRequest(pattern="^w/"), timeout=60)
    seen = []
    while not fut.done():
        seen.append(m.stats().objects)
    r = fut.result()
    eq((r.removed, r.skipped), (n - 1, 1), "removed once each, the leased one skipped")
    assert any(1 < x < n for x in seen), "Stats answered during the walk: %s" % seen[:20]
    eq(m.stats().objects, 1, "the leased one is left")
    # A walk whose client gives up goes on; RemoveAll takes the rest.
    for b in range(0, n, 5000):
        keys = [b"v/%06d" % i for i in range(b, b + 5000)]
        m.call("BatchPutStart", M.BatchPutStartRequest(
            items=[M.PutStartRequest(key=k, size=64) for k in keys]), M.BatchPutStartResponse)
        m.call("BatchPutEnd", M.BatchKeysRequest(keys=keys), M.BatchErrorsResponse)
    fut = rx.future(M.RemoveRegexRequest(pattern="^v/"), timeout=60)
    while m.stats().objects > n * 3 // 4:
        pass
    fut.cancel()
    wait_for(lambda: "RemoveRegex '^v/': %d removed, 0 leased left" % n in d.output()
             and "its client had gone" in d.output(), what="the walk's end in the log")
    eq(m.stats().objects, 1, "the walk went on")
    ra = m.call("RemoveAll", M.RemoveAllRequest(force=True), M.RemoveAllResponse, timeout=60)
    eq((ra.removed, ra.skipped), (1, 0), "RemoveAll")
    eq(m.stats().objects, 0, "none left")
    m.close()
    eq(d.stop(), 0, "clean exit")


@case
def pending_put_times_out():
    d, m = master("--put-timeout=300ms")
    m.mount("s", "a", 16 * MiB)
    m.call("PutStart", M.PutStartRequest(key=b"slow", size=8 * MiB), M.PutStartResponse)
    eq(m.stats().pending, 1, "pending")
    eq(m.stats().used, 8 * MiB, "space held")
    # The agent keeps heartbeating; only the put is abandoned.
    wait_for(lambda: m.heartbeat("a") and m.stats().pending == 0, 10, "PENDING revoked")
    eq(m.stats().used, 0, "space back")
    eq(m.code("PutEnd", M.PutEndRequest(key=b"slow"), M.PutEndResponse)[0], NOT_FOUND, "too late")
    wait_for(lambda: metric(metrics(d), "mooncake_master_put_timeouts_total") == 1, 5, "metric")
    m.close()
    eq(d.stop(), 0, "clean exit")


@case
def silent_agent_loses_its_segments_and_objects():
    d, m = master("--agent-ttl=1s")
    m.mount("alive", "a", 64 * MiB)
    m.mount("silent", "b", 64 * MiB, base=1 << 41)
    m.put(b"both", 100, replica_num=2)
    m.put(b"on-silent", 100, preferred_segment="silent")
    m.put(b"on-alive", 100, preferred_segment="alive")

    def gone():
        m.heartbeat("a")
        return [s.segment.name for s in m.stats().segments] == ["alive"]
    wait_for(gone, 15, "silent agent expired")
    eq(m.exist(b"on-silent"), False, "object only on the dead agent is gone")
    eq(m.get(b"on-silent")[0], NOT_FOUND, "get says not found")
    eq([r.segment for r in m.get(b"both")[1].replicas], ["alive"], "other replica survives")
    eq(m.exist(b"on-alive"), True, "untouched")
    hb = m.heartbeat("b", view=1)
    eq(hb.resync, True, "the silent agent must re-sync")
    eq(m.heartbeat("a", view=1).resync, False, "the live one need not")
    m.close()
    eq(d.stop(), 0, "clean exit")


@case
def an_agents_expiry_lets_other_calls_through():
    """A segment that goes (its agent's expiry, unmount or restart) used
    to drop its replicas in one walk of the index on the master's loop:
    0.4 s a million objects, every other call waiting. Its replicas now
    read as gone at once and the reaper drops them in slices: Stats
    asked meanwhile sees the objects going, gets of them say NOT_FOUND
    from the first answer without the segment, and the log says what
    went. An unmount answers at once with the replicas it dropped."""
    d, m = master("--agent-ttl=1s")
    m.mount("alive", "a", 1 << 30)
    m.mount("silent", "b", 1 << 40, base=1 << 41)
    n = 300000

    def fill(prefix, seg, agent):
        for b in range(0, n, 5000):
            keys = [b"%s/%06d" % (prefix, i) for i in range(b, b + 5000)]
            r = m.call("BatchPutStart", M.BatchPutStartRequest(items=[
                M.PutStartRequest(key=k, size=64, preferred_segment=seg) for k in keys]),
                M.BatchPutStartResponse)
            assert all(x.error == 0 for x in r.results)
            m.call("BatchPutEnd", M.BatchKeysRequest(keys=keys), M.BatchErrorsResponse)
            m.heartbeat("a")
            m.heartbeat(agent)
    fill(b"x", "silent", "b")
    m.put(b"on-alive", 100, preferred_segment="alive")
    eq(m.stats().objects, n + 1)
    seen = []
    while True:  # b goes silent
        m.heartbeat("a")
        st = m.stats()
        if "silent" not in [s.segment.name for s in st.segments]:
            eq(m.get(b"x/000007")[0], NOT_FOUND, "gone from the first answer without it")
            seen.append(m.stats().objects)
            break
    while seen[-1] > 1:
        seen.append(m.stats().objects)
    assert any(1 < x < n for x in seen), "Stats answered during the reap: %s" % seen[:20]
    eq(m.exist(b"on-alive"), True, "the other agent's object stays")
    wait_for(lambda: "segment silent gone: its %d replicas dropped, %d objects removed" % (n, n)
             in d.output(), what="the reaper's line")
    # An unmount answers with the replicas dropped; the log has the rest.
    m.mount("big", "c", 1 << 40, base=1 << 42)
    fill(b"y", "big", "c")
    u = m.call("UnmountSegment", M.UnmountSegmentRequest(name="big", agent_id="c"),
               M.UnmountSegmentResponse)
    eq(u.replicas_dropped, n, "the segment's replicas")
    assert u.objects_removed <= n, u.objects_removed
    eq(m.exist(b"y/000009"), False, "none served after the answer")
    wait_for(lambda: m.stats().objects == 1, what="the reaper's end")
    wait_for(lambda: "segment big gone: its %d replicas dropped, %d objects removed" % (n, n)
             in d.output(), what="the reaper's line")
    m.close()
    eq(d.stop(), 0, "clean exit")


# ------------------------------------------------------------ eviction

@case
def eviction_under_zipf_load():
    # Short leases: Zipf-like reads lease only a small part of the pool
    # (a few dozen objects of the ~225 resident), so pinned objects never
    # need to go.
    d, m = master("--default-kv-lease-ttl=50ms", "--eviction-high-watermark-ratio=0.9",
                  "--eviction-ratio=0.1")
    cap = 64 * MiB
    m.mount("s", "a", cap)
    size = 256 << 10  # 256 objects fill the segment
    for i in range(8):
        m.put(b"pinned/%d" % i, size, soft_pin=True)
    rng = random.Random(5)
    weights = [1.0 / (r + 1) ** 1.1 for r in range(2000)]
    for i in range(1000):  # 4x the capacity, every put succeeds
        m.put(b"obj/%d" % i, size)
        n = i + 1
        for _ in range(2):
            j = rng.choices(range(min(n, 2000)), weights[:min(n, 2000)])[0]
            m.get(b"obj/%d" % (n - 1 - j))
        if i % 10 == 0:
            st = m.stats()
            assert st.used <= 0.9 * cap, "usage %d above the watermark" % st.used
    st = m.stats()
    assert st.evictions >= 1000 + 8 - 256, st
    assert st.used <= 0.9 * cap, st.used
    for i in range(8):
        eq(m.exist(b"pinned/%d" % i), True, "soft-pinned kept while others are evictable")
    eq(m.exist(b"obj/999"), True, "newest")
    eq(m.exist(b"obj/0"), False, "oldest cold object evicted")
    text = metrics(d)
    eq(metric(text, "mooncake_master_evictions_total"), st.evictions, "evictions metric")
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    eq(r.returncode, 0, "promtool: " + r.stdout + r.stderr)
    for name in ["mooncake_master_objects", "mooncake_master_bytes_per_object",
                 'mooncake_master_capacity_bytes{tier="dram"}',
                 'mooncake_master_segment_used_bytes{segment="s"}',
                 "mooncake_master_segment_fragmentation_ppm",
                 "mooncake_master_lease_waits_total", "mooncake_master_hits_total",
                 "mooncake_rpc_server_call_duration_seconds_bucket"]:
        assert name in text, name
    m.close()
    eq(d.stop(), 0, "clean exit")


@case
def eviction_spares_leased_then_pinned():
    # Leases far longer than the test: what is leased stays leased.
    d, m = master("--default-kv-lease-ttl=10m")
    cap = 64 * MiB
    m.mount("s", "a", cap)
    size = 256 << 10
    for i in range(8):
        m.put(b"pinned/%d" % i, size, soft_pin=True)
    leased = [b"leased/%d" % i for i in range(100)]
    for k in leased:
        m.put(k, size)
    g = m.call("BatchGetReplicas", M.BatchKeysRequest(keys=leased), M.BatchGetReplicasResponse)
    eq([x.error for x in g.results], [0] * 100, "leased")
    for i in range(300):
        m.put(b"cold/%d" % i, size)
        assert m.stats().used <= 0.9 * cap
    for k in leased:
        eq(m.exist(k), True, "leased objects are never evicted")
    eq(sum(m.exist(b"pinned/%d" % i) for i in range(8)), 8, "pinned kept while cold ones exist")
    # Lease everything unpinned: the next puts can only take pinned space.
    cold = [b"cold/%d" % i for i in range(300) if m.exist(b"cold/%d" % i)]
    m.call("BatchGetReplicas", M.BatchKeysRequest(keys=cold), M.BatchGetReplicasResponse)
    for i in range(64):  # until the room under the watermark is used up
        m.put(b"more/%d" % i, size)
        m.get(b"more/%d" % i)
        cold.append(b"more/%d" % i)
        if sum(m.exist(b"pinned/%d" % i) for i in range(8)) < 8:
            break
    assert sum(m.exist(b"pinned/%d" % i) for i in range(8)) < 8, "pinned go last"
    for k in leased + cold:
        eq(m.exist(k), True, "still leased, still there")
    # Once nothing at all can go, and only then: NO_SPACE.
    code = OK
    for i in range(300):
        code, _ = m.code("PutStart", M.PutStartRequest(key=b"full/%d" % i, size=size),
                         M.PutStartResponse)
        if code != OK:
            break
        m.call("PutEnd", M.PutEndRequest(key=b"full/%d" % i), M.PutEndResponse)
        m.get(b"full/%d" % i)
    eq(code, NO_SPACE, "no space when everything is leased")
    eq(sum(m.exist(b"pinned/%d" % i) for i in range(8)), 0, "every pinned object went first")
    m.close()
    eq(d.stop(), 0, "clean exit")


# ------------------------------------------------------------ HA

def leader_of(*pairs):
    for d, m in pairs:
        if d.proc.poll() is None and health(m.addr) == health_pb2.HealthCheckResponse.SERVING:
            return d, m
    return None


@case
def failover_between_two_masters_with_etcd():
    etcd = Etcd()
    args = ["--leader-lease-ttl=2s", "--cluster-id=hatest"]
    a = master(*args, meta=etcd.endpoint)
    b = master(*args, meta=etcd.endpoint)
    (ld, lm) = wait_for(lambda: leader_of(a, b), 20, "a leader")
    (sd, sm) = b if ld is a[0] else a
    view = lm.stats().view
    assert view >= 1
    # The standby redirects, once its watch has seen the leader's key.
    want = "-807 not the leader: leader=%s view=%d" % (lm.addr, view)

    def redirects():
        code, err = sm.code("PutStart", M.PutStartRequest(key=b"x", size=1), M.PutStartResponse)
        eq(err.code(), grpc.StatusCode.UNAVAILABLE, "standby status")
        assert err.details().startswith(want), err.details()
        return True
    wait_for(redirects, 10, "the standby redirecting to the leader")
    eq(health(sm.addr), health_pb2.HealthCheckResponse.NOT_SERVING, "standby health")
    value = etcd.ctl("get", "--print-value-only", "/mooncake/hatest/master").stdout.strip()
    eq(value, "%s %d" % (lm.addr, view), "leader key value")
    # An agent mounts and writes on the leader.
    lm.mount("seg", "agent1", 64 * MiB)
    placed = lm.put(b"survivor", 5000, soft_pin=True).replicas[0]
    lm.put(b"second", 100)
    second = lm.get(b"second")[1].replicas[0]
    # kill -9 the leader: the standby takes over once the lease expires.
    ld.kill()
    wait_for(lambda: health(sm.addr) == health_pb2.HealthCheckResponse.SERVING, 30, "takeover")
    st = sm.stats()
    eq(st.view, view + 1, "view bumped")
    eq(st.objects, 0, "the new leader starts empty")
    eq(sm.get(b"survivor")[0], NOT_FOUND, "not known before the re-sync")
    eq(etcd.ctl("get", "--print-value-only", "/mooncake/hatest/master").stdout.strip(),
       "%s %d" % (sm.addr, view + 1), "leader key names the new leader")
    # The agent notices the new view, re-mounts and reports its inventory.
    hb = sm.heartbeat("agent1", view=view)
    eq((hb.resync, hb.view), (True, view + 1), "heartbeat asks for a re-sync")
    eq(sm.mount("seg", "agent1", 64 * MiB, resync=True).view, view + 1, "remount")
    # No placement on a segment still re-syncing, and while it reports
    # the answer says "retry", never NO_SPACE (which a client takes as
    # final).
    code, err = sm.code("PutStart", M.PutStartRequest(key=b"new", size=10), M.PutStartResponse)
    eq((code, err.code()), (-802, grpc.StatusCode.UNAVAILABLE), "put while re-syncing")
    assert "taking the agents' segments back (0 mounted, 1 reporting)" in err.details(), \
        err.details()
    inv = [M.InventoryItem(key=b"survivor", segment="seg", offset=placed.offset, size=5000,
                           soft_pin=True),
           M.InventoryItem(key=b"second", segment="seg", offset=second.offset, size=100),
           M.InventoryItem(key=b"clash", segment="seg", offset=placed.offset, size=10)]
    hb = sm.heartbeat("agent1", view=view + 1, inventory=inv, complete=True)
    eq((hb.resync, hb.items_accepted, hb.items_skipped), (False, 2, 1), "inventory")
    code, g = sm.get(b"survivor")
    eq(code, OK, "rebuilt")
    eq((g.size, g.replicas[0].segment, g.replicas[0].offset), (5000, "seg", placed.offset),
       "same placement")
    r = sm.put(b"new", 10).replicas[0]
    assert r.offset not in (placed.offset, second.offset), "new space avoids reported objects"
    # The old leader comes back as a standby of the new view.
    c = master(*args, meta=etcd.endpoint)
    code, err = wait_for(lambda: (lambda r: r if r[0] == -807 and "view=%d" % (view + 1)
                                  in r[1].details() else None)(
        c[1].code("Exist", M.ExistRequest(key=b"new"), M.ExistResponse)), 20, "new standby")
    assert "leader=" + sm.addr in err.details(), err.details()
    # A graceful stop resigns at once: the standby leads view + 2.
    eq(sd.stop(), 0, "leader stops cleanly")
    wait_for(lambda: health(c[1].addr) == health_pb2.HealthCheckResponse.SERVING, 10,
             "takeover after resign")
    eq(c[1].stats().view, view + 2, "view bumped again")
    # mooncakectl follows the redirect from a standby... there is none now;
    # it reads the leader straight.
    out = run([mctest.MOONCAKECTL, "stats", "--master=" + c[1].addr]).stdout
    assert "view %d" % (view + 2) in out, out
    eq(c[0].stop(), 0, "clean exit")
    etcd.kill()


def log_time(daemon, text):
    """Wall time (s) of the first log line of daemon containing text."""
    import datetime
    for line in daemon.output().splitlines():
        if text in line:
            ts = datetime.datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ")
            return ts.replace(tzinfo=datetime.timezone.utc).timestamp()
    return None


@case
def partitioned_leader_stops_before_the_standby_leads():
    # The leader reaches etcd through a proxy that then drops every byte:
    # it must stop serving while its lease surely still holds on etcd,
    # so it has stopped before the standby (which gets the leader key only
    # after etcd expired that lease) starts leading. Two leaders at once
    # would place objects on the same space.
    from faultproxy import Proxy
    etcd = Meta()
    proxy = Proxy(int(etcd.endpoint.rsplit(":", 1)[1]))
    args = ["--leader-lease-ttl=2s", "--cluster-id=splitbrain"]
    a = master(*args, meta="127.0.0.1:%d" % proxy.port)
    wait_for(lambda: health(a[1].addr) == health_pb2.HealthCheckResponse.SERVING, 20, "a leads")
    b = master(*args, meta=etcd.endpoint)
    wait_for(lambda: "standby: leader is" in b[0].output() or None, 20, "b is standby")
    proxy.set_mode("blackhole")
    wait_for(lambda: health(b[1].addr) == health_pb2.HealthCheckResponse.SERVING, 30, "b takes over")
    wait_for(lambda: health(a[1].addr) == health_pb2.HealthCheckResponse.NOT_SERVING, 10, "a stopped")
    stopped = log_time(a[0], "stopped serving at once")
    elected = log_time(b[0], "elected leader of view")
    assert stopped is not None and elected is not None, (stopped, elected)
    assert stopped < elected, "old leader stopped at %.3f, new one elected at %.3f" % (stopped, elected)
    proxy.close()


@case
def ctl_follows_standby_redirect():
    etcd = Meta()
    args = ["--leader-lease-ttl=2s", "--cluster-id=redir"]
    a = master(*args, meta=etcd.endpoint)
    ld, lm = wait_for(lambda: leader_of(a), 20, "leader")
    b = master(*args, meta=etcd.endpoint)
    # A standby that knows the leader (it may answer -807 with leader=none
    # before its watch has told it).
    wait_for(lambda: "leader=none" not in str(
        b[1].code("Exist", M.ExistRequest(key=b"k"), M.ExistResponse)[1].details()),
             20, "standby naming the leader")
    lm.mount("s", "ag", 16 * MiB)
    lm.put(b"via-standby", 1)
    out = run([mctest.MOONCAKECTL, "ls", "--master=" + b[1].addr]).stdout
    eq(out.split(), ["via-standby"], "ls through a standby")
    eq(b[0].stop(), 0, "standby exit")
    eq(ld.stop(), 0, "leader exit")
    etcd.kill()


@case
def bench_master_prints_memory_and_scale():
    # Small and fast: the rows and their shape, not the figures.
    r = run([mctest.MOONCAKECTL, "bench", "master", "--duration=100ms", "--batch=10",
             "--objects=30K"])
    out = r.stdout
    mem = [l for l in out.splitlines() if "B/object + key" in l]
    eq(len(mem), 1, "index memory line")
    per_obj = float(mem[0].split()[3])
    assert 40 < per_obj <= 100, mem[0]
    lines = out.splitlines()
    head = [i for i, l in enumerate(lines) if l.startswith("ops/s and master CPU per key")]
    eq(len(head), 1, "scale table heading")
    assert " at 10000 and " in lines[head[0]], lines[head[0]]
    rows = lines[head[0] + 3:head[0] + 6]
    for name, l in zip(["GetReplicas", "BatchGetReplicas", "BatchPutStart"], rows):
        assert l.startswith(name), (name, l)
        f = l.split()
        small, large, cpu0, cpu1 = (float(f[-6]), float(f[-5]), float(f[-3]), float(f[-2]))
        assert small > 0 and large > 0 and cpu0 > 0 and cpu1 > 0, l


@case
def bench_master_target_wants_a_master_of_its_own():
    """`bench master --target` measures a master that serves nothing: it
    unmounts its segment at the end (its objects go with it, so a second
    run finds the master empty again), and refuses one with agents or
    objects, where its 64 TiB segment would take real puts."""
    d, m = master("--diag-service")
    addr = d.addr("master-listen")
    cmd = [mctest.MOONCAKECTL, "bench", "master", "--target=" + addr, "--duration=100ms",
           "--batch=10", "--objects=20K"]
    for i in range(2):
        r = run(cmd, timeout=120)
        assert "B/object + key" in r.stdout, r.stdout
        out = run([mctest.MOONCAKECTL, "stats", "--master=" + addr]).stdout.splitlines()
        eq(("agents 0" in out, "objects 0" in out), (True, True), "run %d left nothing" % i)
    m.mount("s", "ag", 16 * MiB)
    r = run(cmd, check=False, timeout=120)
    eq(r.returncode, 1, "a master with an agent is refused")
    assert "serves a cluster (1 agents, 0 objects)" in r.stderr, r.stderr
    out = run([mctest.MOONCAKECTL, "stats", "--master=" + addr]).stdout.splitlines()
    assert "agents 1" in out, out
    eq(d.stop(), 0, "master exit")


@case
def bench_resync_brings_back_64_agents_objects_after_a_failover():
    # The bench checks what came back itself (exit 1 on any miss); here
    # the figures' lines and the counts.
    r = run([mctest.MOONCAKECTL, "bench", "resync", "--agents=64", "--objects=20K",
             "--heartbeat=200ms"])
    out = r.stdout
    assert "64 agents, 20000 objects" in out, out
    acc = [l for l in out.splitlines() if l.startswith("inventory items accepted")]
    eq(len(acc), 1, "accepted line")
    eq(acc[0].split()[3], "20000", "items accepted")
    assert "of 20000, 0 skipped" in acc[0], acc[0]
    rs = [l for l in out.splitlines() if l.startswith("re-sync after a failover")]
    eq(len(rs), 1, "re-sync line")
    assert "s per million objects" in rs[0], rs[0]
    assert "checked: the index holds every object" in out, out
    eq(run([mctest.MOONCAKECTL, "bench", "resync", "--agents=0"], check=False).returncode, 2,
       "no agents")
    eq(run([mctest.MOONCAKECTL, "bench", "resync", "--objects=lots"], check=False).returncode,
       2, "bad count")


mctest.main()
