"""etcd 3.4 conformance of mooncaked --role=meta, found by real clients
(issue 14), checked through the real binaries with etcdctl and grpcio, and
side by side with a real etcd 3.4 (Debian etcd-server) where the answer
is etcd's to give:

- a read-only call never stops a member: `etcdctl lease timetolive`
  without --keys on a lease with keys, on the leader and on followers;
- every response carries a full header (cluster_id, member_id, revision,
  raft_term) — every response type of KV, Lease, Watch, Cluster and
  Maintenance, nested Txn responses included, on the leader and on a
  follower; nested revisions as etcd gives them;
- clientv3's STM with serializable snapshot isolation (its algorithm run
  over grpcio): 4 workers x 10 increments through 3 members end at 40;
- LeaseKeepAlive half-closed after one request (python-etcd3's
  refresh_lease) answers on every member, for live and unknown leases;
  a half-closed Watch keeps streaming;
- a second learner, MoveLeader on a follower, request sizes: etcd's codes
  and messages;
- Maintenance: Snapshot saved by etcdctl, read by `etcdctl snapshot
  status` and restored into a real etcd that then holds the same keys,
  revisions, compaction, lease and HashKV; Hash equal on every member;
  HashKV equal to a real etcd's after the same writes and compactions;
  Defragment, Status, Alarm;
- lease IDs chosen like etcd's (member prefix, clock, counter), new ones
  after a restart, explicit and negative IDs taken as etcd takes them.
"""
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

import mctest
from mctest import case, eq

import grpc
import metacluster as mc
from metacluster import Client, Cluster, Requests, etcdctl, deadline_loop
import etcd_rpc_pb2 as pb

_shared = {}


def shared():
    """One 3-member cluster for the cases that leave it as they found it."""
    c = _shared.get("c")
    if c is None:
        c = Cluster(3).start()
        _shared["c"] = c
    return c


def followers(c):
    lead = c.leader()
    return lead, [m for m in c.members if m is not lead and m.alive()]


def stub(ch, svc, method, req, resp, stream=None):
    path = "/etcdserverpb.%s/%s" % (svc, method)
    mk = {None: ch.unary_unary, "out": ch.unary_stream,
          "bidi": ch.stream_stream}[stream]
    return mk(path, request_serializer=req.SerializeToString,
              response_deserializer=resp.FromString)


class Api:
    """Every etcd v3 call on one endpoint (the calls Client lacks)."""

    def __init__(self, addr, timeout=5.0):
        self.c = Client(addr, timeout=timeout)
        ch = self.c.ch
        self.t = timeout
        self.leases = stub(ch, "Lease", "LeaseLeases", pb.LeaseLeasesRequest,
                           pb.LeaseLeasesResponse)
        self.member_add = stub(ch, "Cluster", "MemberAdd", pb.MemberAddRequest,
                               pb.MemberAddResponse)
        self.member_remove = stub(ch, "Cluster", "MemberRemove", pb.MemberRemoveRequest,
                                  pb.MemberRemoveResponse)
        self.member_update = stub(ch, "Cluster", "MemberUpdate", pb.MemberUpdateRequest,
                                  pb.MemberUpdateResponse)
        self.member_promote = stub(ch, "Cluster", "MemberPromote", pb.MemberPromoteRequest,
                                   pb.MemberPromoteResponse)
        self.hash = stub(ch, "Maintenance", "Hash", pb.HashRequest, pb.HashResponse)
        self.hash_kv = stub(ch, "Maintenance", "HashKV", pb.HashKVRequest, pb.HashKVResponse)
        self.defrag = stub(ch, "Maintenance", "Defragment", pb.DefragmentRequest,
                           pb.DefragmentResponse)
        self.move_leader = stub(ch, "Maintenance", "MoveLeader", pb.MoveLeaderRequest,
                                pb.MoveLeaderResponse)
        self.snapshot = stub(ch, "Maintenance", "Snapshot", pb.SnapshotRequest,
                             pb.SnapshotResponse, "out")

    def close(self):
        self.c.close()


def rpc_error(fn, *a, **kw):
    try:
        fn(*a, **kw)
    except grpc.RpcError as e:
        return e.code(), e.details()
    raise AssertionError("the call succeeded")


# ------------------------------------------------------------ 1. read-only calls

@case
def lease_timetolive_without_keys_on_every_member():
    c = shared()
    lead, fols = followers(c)
    lid = etcdctl(c.endpoints, "lease", "grant", "300").stdout.split()[1]
    etcdctl(c.endpoints, "put", "--lease=" + lid, "ttl/k1", "v")
    etcdctl(c.endpoints, "put", "--lease=" + lid, "ttl/k2", "v")
    for m in [lead] + fols + [lead]:
        out = etcdctl(m.endpoint, "lease", "timetolive", lid).stdout
        assert "lease %s granted with TTL(300s)" % lid in out, out
        out = etcdctl(m.endpoint, "lease", "timetolive", "--keys", lid).stdout
        assert "attached keys([ttl/k1 ttl/k2])" in out, out
        api = Api(m.client_addr)
        r = api.c.ttl_(pb.LeaseTimeToLiveRequest(ID=int(lid, 16)), timeout=5)
        eq(list(r.keys), [], "no keys unless asked")
        eq(r.grantedTTL, 300, "granted TTL")
        r = api.c.ttl_(pb.LeaseTimeToLiveRequest(ID=int(lid, 16), keys=True), timeout=5)
        eq(list(r.keys), [b"ttl/k1", b"ttl/k2"], "keys")
        r = api.c.ttl_(pb.LeaseTimeToLiveRequest(ID=0x7777, keys=True), timeout=5)
        eq((r.TTL, list(r.keys)), (-1, []), "an unknown lease (etcd: TTL -1)")
        api.close()
    for m in c.members:
        assert m.alive(), "%s stopped:\n%s" % (m.name, m.output()[-3000:])
    etcdctl(c.endpoints, "lease", "revoke", lid)


# ------------------------------------------------------------ 2. headers

def check_header(h, what, member_id=None, revision=None):
    assert h.cluster_id and h.member_id and h.raft_term and h.revision > 0, \
        "%s: header %s" % (what, str(h).replace("\n", " "))
    if member_id is not None:
        eq(h.member_id, member_id, "%s: member_id" % what)
    if revision is not None:
        eq(h.revision, revision, "%s: revision" % what)


def check_txn_headers(t, what, member_id):
    check_header(t.header, what, member_id)
    for i, r in enumerate(t.responses):
        sub = getattr(r, r.WhichOneof("response"))
        check_header(sub.header, "%s/%d %s" % (what, i, r.WhichOneof("response")), member_id)
        if r.WhichOneof("response") == "response_txn":
            check_txn_headers(sub, "%s/%d" % (what, i), member_id)


# Every response type checked below, on the leader and on a follower.
HEADER_TYPES = [
    "RangeResponse", "PutResponse", "DeleteRangeResponse", "TxnResponse",
    "TxnResponse/RangeResponse", "TxnResponse/PutResponse",
    "TxnResponse/DeleteRangeResponse", "TxnResponse/TxnResponse", "CompactionResponse",
    "LeaseGrantResponse", "LeaseRevokeResponse", "LeaseKeepAliveResponse",
    "LeaseTimeToLiveResponse", "LeaseLeasesResponse",
    "WatchResponse(created)", "WatchResponse(events)", "WatchResponse(progress)",
    "WatchResponse(canceled)", "WatchResponse(create failed)",
    "WatchResponse(canceled: compacted)",
    "MemberAddResponse", "MemberUpdateResponse", "MemberPromoteResponse",
    "MemberRemoveResponse", "MemberListResponse",
    "AlarmResponse", "StatusResponse", "DefragmentResponse", "HashResponse",
    "HashKVResponse", "SnapshotResponse", "MoveLeaderResponse",
]


@case
def every_response_has_a_full_header():
    c = shared()
    lead, fols = followers(c)
    seen = set()
    for m in (lead, fols[0]):
        me = m.status().header.member_id
        a = Api(m.client_addr)
        k = ("hdr/%s/" % m.name).encode()
        check_header(a.c.put(k + b"a", b"1").header, "Put", me)
        seen.add("PutResponse")
        check_header(a.c.range(k + b"a").header, "Range", me)
        seen.add("RangeResponse")
        check_header(a.c.range(k + b"a", serializable=True).header, "Range serializable", me)
        check_header(a.c.delete(k + b"nothing").header, "DeleteRange", me)
        seen.add("DeleteRangeResponse")
        t = a.c.txn_(pb.TxnRequest(success=[
            pb.RequestOp(request_range=pb.RangeRequest(key=k + b"a")),
            pb.RequestOp(request_put=pb.PutRequest(key=k + b"b", value=b"1")),
            pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=k + b"none")),
            pb.RequestOp(request_txn=pb.TxnRequest(success=[
                pb.RequestOp(request_range=pb.RangeRequest(key=k + b"b"))]))]), timeout=5)
        check_txn_headers(t, "Txn", me)
        seen.update(["TxnResponse", "TxnResponse/RangeResponse", "TxnResponse/PutResponse",
                     "TxnResponse/DeleteRangeResponse", "TxnResponse/TxnResponse"])
        t = a.c.txn_(pb.TxnRequest(success=[
            pb.RequestOp(request_range=pb.RangeRequest(key=k + b"a", serializable=True))]),
            timeout=5)
        check_txn_headers(t, "read-only Txn", me)
        g = a.c.grant_(pb.LeaseGrantRequest(TTL=60), timeout=5)
        check_header(g.header, "LeaseGrant", me)
        seen.add("LeaseGrantResponse")
        ka = list(a.c.keepalive_(iter([pb.LeaseKeepAliveRequest(ID=g.ID)]), timeout=5))
        check_header(ka[0].header, "LeaseKeepAlive", me)
        seen.add("LeaseKeepAliveResponse")
        check_header(a.c.ttl_(pb.LeaseTimeToLiveRequest(ID=g.ID), timeout=5).header,
                     "LeaseTimeToLive", me)
        seen.add("LeaseTimeToLiveResponse")
        check_header(a.leases(pb.LeaseLeasesRequest(), timeout=5).header, "LeaseLeases", me)
        seen.add("LeaseLeasesResponse")
        check_header(a.c.revoke_(pb.LeaseRevokeRequest(ID=g.ID), timeout=5).header,
                     "LeaseRevoke", me)
        seen.add("LeaseRevokeResponse")
        check_header(a.c.members_(pb.MemberListRequest(), timeout=5).header, "MemberList", me)
        seen.add("MemberListResponse")
        check_header(a.c.alarm_(pb.AlarmRequest(), timeout=5).header, "Alarm", me)
        seen.add("AlarmResponse")
        check_header(a.c.status().header, "Status", me)
        seen.add("StatusResponse")
        check_header(a.defrag(pb.DefragmentRequest(), timeout=5).header, "Defragment", me)
        seen.add("DefragmentResponse")
        check_header(a.hash(pb.HashRequest(), timeout=5).header, "Hash", me)
        seen.add("HashResponse")
        check_header(a.hash_kv(pb.HashKVRequest(), timeout=5).header, "HashKV", me)
        seen.add("HashKVResponse")
        for r in a.snapshot(pb.SnapshotRequest(), timeout=20):
            check_header(r.header, "Snapshot", me)
        seen.add("SnapshotResponse")
        rev = a.c.range(k + b"a").header.revision
        check_header(a.c.compact_(pb.CompactionRequest(revision=rev - 1), timeout=5).header,
                     "Compaction", me)
        seen.add("CompactionResponse")
        # Watch: created, events, a progress response, canceled, a failed
        # create, and a cancel by the server for compacted history.
        reqs = Requests(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=k + b"w",
                                                                              watch_id=7)))
        stream = a.c.watch_(iter(reqs), timeout=10)
        r = next(stream)
        assert r.created, r
        check_header(r.header, "Watch created", me)
        a.c.put(k + b"w", b"x")
        r = next(stream)
        assert r.events, r
        check_header(r.header, "Watch events", me)
        reqs.put(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))
        r = next(stream)
        eq(r.watch_id, -1, "progress")
        check_header(r.header, "Watch progress", me)
        reqs.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=k + b"w",
                                                                       watch_id=7)))
        r = next(stream)
        assert r.canceled and r.created, r  # ID 7 is taken: create failed
        check_header(r.header, "Watch create failed", me)
        reqs.put(pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=7)))
        r = next(stream)
        assert r.canceled, r
        check_header(r.header, "Watch canceled", me)
        reqs.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=k + b"w", start_revision=2)))
        r = next(stream)
        assert r.created, r  # then, as etcd does, the cancel for compacted history
        r = next(stream)
        check_header(r.header, "Watch compacted", me)
        assert r.canceled and r.compact_revision > 0, r
        reqs.close()
        stream.cancel()
        seen.update(["WatchResponse(created)", "WatchResponse(events)",
                     "WatchResponse(progress)", "WatchResponse(canceled)",
                     "WatchResponse(create failed)", "WatchResponse(canceled: compacted)"])
        a.close()
    # Cluster changes and MoveLeader, asked of a follower (forwarded to the
    # leader; the answer names the follower) and of the leader.
    a = Api(fols[0].client_addr)
    me = fols[0].status().header.member_id
    new = mc.Member(c, "m3")
    r = a.member_add(pb.MemberAddRequest(peerURLs=["http://" + new.peer_addr], isLearner=True),
                     timeout=5)
    check_header(r.header, "MemberAdd", me)
    seen.add("MemberAddResponse")
    r = a.member_update(pb.MemberUpdateRequest(ID=r.member.ID,
                                               peerURLs=["http://" + new.peer_addr]),
                        timeout=5)
    check_header(r.header, "MemberUpdate", me)
    seen.add("MemberUpdateResponse")
    lid = [x.ID for x in r.members if x.isLearner][0]
    c.members.append(new)
    c.initial += ",m3=" + new.peer_addr
    new.start(state="existing")
    for _ in deadline_loop(20, "the learner never caught up"):
        try:
            r = a.member_promote(pb.MemberPromoteRequest(ID=lid), timeout=5)
            break
        except grpc.RpcError as e:
            assert "in sync" in e.details(), e.details()
    check_header(r.header, "MemberPromote", me)
    seen.add("MemberPromoteResponse")
    r = a.member_remove(pb.MemberRemoveRequest(ID=lid), timeout=5)
    check_header(r.header, "MemberRemove", me)
    seen.add("MemberRemoveResponse")
    eq(new.daemon.proc.wait(20), 1, "the removed member stops")
    c.members.remove(new)
    a.close()
    lead = c.leader()
    a = Api(lead.client_addr)
    me = lead.status().header.member_id
    other = [m for m in c.members if m is not lead][0]
    r = a.move_leader(pb.MoveLeaderRequest(targetID=other.status().header.member_id),
                      timeout=10)
    check_header(r.header, "MoveLeader", me)
    seen.add("MoveLeaderResponse")
    a.close()
    eq(sorted(set(HEADER_TYPES) - seen), [], "response types not checked")
    print("  headers checked: %s" % ", ".join(HEADER_TYPES))


@case
def nested_txn_revisions_like_etcd():
    """The revision of every nested response, side by side with etcd."""
    e = mctest.Etcd()
    m = mctest.Meta()
    got = {}
    try:
        for name, ep in (("etcd", e.endpoint), ("meta", m.endpoint)):
            c = Client(ep)
            base = c.put(b"n/k", b"v").header.revision
            inner = pb.TxnRequest(success=[pb.RequestOp(request_range=pb.RangeRequest(
                key=b"n/k"))])
            t = c.txn_(pb.TxnRequest(success=[
                pb.RequestOp(request_range=pb.RangeRequest(key=b"n/k")),
                pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"n/none")),
                pb.RequestOp(request_put=pb.PutRequest(key=b"n/k2", value=b"x")),
                pb.RequestOp(request_range=pb.RangeRequest(key=b"n/k")),
                pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"n/none")),
                pb.RequestOp(request_txn=inner)]), timeout=5)
            revs = [getattr(r, r.WhichOneof("response")).header.revision - base
                    for r in t.responses[:5]]
            revs.append(t.responses[5].response_txn.responses[0].response_range.header
                        .revision - base)
            ro = c.txn_(pb.TxnRequest(success=[pb.RequestOp(request_range=pb.RangeRequest(
                key=b"n/k"))]), timeout=5)
            revs.append(ro.responses[0].response_range.header.revision - base)
            revs.append(t.header.revision - base)
            got[name] = revs
            c.close()
        eq(got["meta"], got["etcd"], "nested revisions (relative to the first put)")
    finally:
        e.kill()
        m.kill()


@case
def unknown_enums_and_compare_operands_like_etcd():
    """Sort orders, sort targets, compare targets and results etcd does
    not know, and compares whose operand is another union member than the
    target names: etcd's answers, side by side."""
    e = mctest.Etcd()
    m = mctest.Meta()
    got = {}
    try:
        for name, ep in (("etcd", e.endpoint), ("meta", m.endpoint)):
            c = Client(ep)
            for k, v in ((b"e/a", b"3"), (b"e/b", b"1"), (b"e/c", b"2"), (b"e/b", b"1x")):
                c.put(k, v)
            bmod = c.range(b"e/b").kvs[0].mod_revision
            res = []
            for order, target in ((99, 0), (99, 1), (1, 1), (2, 4), (-1, 0), (-1, 3),
                                  (99, 99), (-1, 99)):
                r = c.range(b"e/a", range_end=b"e/z", sort_order=order, sort_target=target,
                            limit=2)
                res.append(([x.key for x in r.kvs], r.more, r.count))
            for target, result, operand in (
                    (99, 0, {}), (0, 99, {}), (99, 3, {}),
                    (pb.Compare.MOD, pb.Compare.EQUAL, {"version": bmod}),
                    (pb.Compare.MOD, pb.Compare.EQUAL, {"mod_revision": bmod}),
                    (pb.Compare.VERSION, pb.Compare.EQUAL, {"mod_revision": 2}),
                    (pb.Compare.VALUE, pb.Compare.EQUAL, {"version": 1}),
                    (pb.Compare.VALUE, pb.Compare.GREATER, {"value": b"1"})):
                cmp = pb.Compare(key=b"e/b", target=target, result=result, **operand)
                res.append(c.txn_(pb.TxnRequest(compare=[cmp]), timeout=5).succeeded)
            got[name] = res
            c.close()
        eq(got["meta"], got["etcd"], "answers")
        # etcd 3.4.23 dies on a sort by a target it does not know (a nil
        # sorter); meta refuses the request.
        c = Client(m.endpoint)
        for order in (0, 1, 2):
            eq(rpc_error(c.range, b"e/a", range_end=b"e/z", sort_order=order, sort_target=99),
               (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: invalid request"),
               "sort target 99, order %d" % order)
        c.close()
    finally:
        e.kill()
        m.kill()


# ------------------------------------------------------------ STM

class STM:
    """clientv3/concurrency's stmSerializable (SerializableSnapshot, NewSTM's
    default) over grpcio, step for step: the first read fixes the read
    revision from the nested RangeResponse's header; the commit compares
    every read key's mod revision and every written key's against that
    revision + 1, and on failure prefetches the read set from the Else
    branch."""
    LESS, EQUAL = pb.Compare.LESS, pb.Compare.EQUAL

    def __init__(self, client):
        self.c = client
        self.prefetch = {}
        self.get_opts = {}

    def _reset(self):
        self.rset = {}
        self.wset = {}

    def run(self, apply, attempts=200):
        for _ in range(attempts):
            self._reset()
            apply(self)
            if self._commit():
                return
        raise AssertionError("the STM did not commit in %d attempts" % attempts)

    def _fetch(self, key):
        if key in self.rset:
            return self.rset[key]
        t = self.c.txn_(pb.TxnRequest(success=[pb.RequestOp(
            request_range=pb.RangeRequest(key=key, **self.get_opts))]), timeout=5)
        r = t.responses[0].response_range
        self.rset[key] = r
        return r

    def get(self, key):
        if key in self.wset:
            return self.wset[key]
        first = not self.rset
        if key in self.prefetch:
            self.rset[key] = self.prefetch.pop(key)
        r = self._fetch(key)
        if first:
            self.get_opts = {"revision": r.header.revision, "serializable": True}
        return r.kvs[0].value if r.kvs else b""

    def put(self, key, value):
        self.wset[key] = value

    def _commit(self):
        cmps = []
        for k, r in self.rset.items():
            cmps.append(pb.Compare(key=k, target=pb.Compare.MOD, result=self.EQUAL,
                                   mod_revision=r.kvs[0].mod_revision if r.kvs else 0))
        first = min([r.header.revision for r in self.rset.values()] or [(1 << 63) - 2])
        for k in self.wset:
            cmps.append(pb.Compare(key=k, target=pb.Compare.MOD, result=self.LESS,
                                   mod_revision=first + 1))
        keys = list(self.rset)
        t = self.c.txn_(pb.TxnRequest(
            compare=cmps,
            success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=v))
                     for k, v in self.wset.items()],
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=k)) for k in keys]),
            timeout=5)
        if t.succeeded:
            return True
        for i, k in enumerate(keys):
            self.rset[k] = t.responses[i].response_range
        self.prefetch = dict(self.rset)
        self.get_opts = {}
        return False


@case
def stm_serializable_snapshot_counts_to_40():
    c = shared()
    key = b"stm/counter"
    Client(c.members[0].client_addr).put(key, b"0")
    errors = []

    def worker(i):
        cl = Client(c.members[i % len(c.members)].client_addr, timeout=5)
        try:
            for _ in range(10):
                s = STM(cl)
                s.run(lambda s: s.put(key, str(int(s.get(key) or b"0") + 1).encode()))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
        finally:
            cl.close()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    eq(errors, [], "STM errors")
    eq(Client(c.members[1].client_addr).get(key), b"40", "4 workers x 10 increments")


# ------------------------------------------------------------ half-closed streams

@case
def keepalive_half_closed_answers_on_every_member():
    c = shared()
    lead, fols = followers(c)
    live = Client(lead.client_addr).grant_(pb.LeaseGrantRequest(TTL=120), timeout=5).ID
    for m in [lead] + fols:
        cl = Client(m.client_addr)
        n = {"live": 0, "unknown": 0}
        for i in range(30):
            for kind, lid in (("live", live), ("unknown", 0x5eed0000 + i)):
                # python-etcd3's refresh_lease: one request, then half-close
                rs = list(cl.keepalive_(iter([pb.LeaseKeepAliveRequest(ID=lid)]), timeout=5))
                eq(len(rs), 1, "%s on %s: answers" % (kind, m.name))
                eq(rs[0].ID, lid, "ID")
                if kind == "unknown":
                    eq(rs[0].TTL, 0, "an unknown lease answers TTL 0, as etcd's")
                else:
                    assert rs[0].TTL > 0, rs[0]
                n[kind] += 1
        # Several requests, then half-close: as many answers, in order.
        ids = [live, 0x5eed9999, live, 0x5eed9998, live]
        rs = list(cl.keepalive_(iter([pb.LeaseKeepAliveRequest(ID=i) for i in ids]),
                                timeout=5))
        eq([r.ID for r in rs], ids, "%s: answers in request order" % m.name)
        eq([r.TTL > 0 for r in rs], [True, False, True, False, True], "TTLs")
        cl.close()
    Client(lead.client_addr).revoke_(pb.LeaseRevokeRequest(ID=live), timeout=5)


@case
def watch_half_closed_keeps_streaming():
    c = shared()
    _, fols = followers(c)
    cl = Client(fols[0].client_addr)
    reqs = Requests(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"hc/w")))
    stream = cl.watch_(iter(reqs), timeout=10)
    assert next(stream).created
    reqs.close()  # the client half-closes
    time.sleep(0.2)
    Client(c.members[0].client_addr).put(b"hc/w", b"after")
    r = next(stream)
    eq([e.kv.value for e in r.events], [b"after"], "events after the half-close")
    stream.cancel()
    cl.close()


# ------------------------------------------------------------ errors as etcd's

@case
def second_learner_and_move_leader_on_a_follower():
    c = shared()
    lead, fols = followers(c)
    a = Api(fols[0].client_addr)
    r = a.member_add(pb.MemberAddRequest(peerURLs=["http://127.0.0.1:1"], isLearner=True),
                     timeout=5)
    first = r.member.ID
    eq(rpc_error(a.member_add, pb.MemberAddRequest(peerURLs=["http://127.0.0.1:2"],
                                                   isLearner=True), timeout=5),
       (grpc.StatusCode.FAILED_PRECONDITION,
        "etcdserver: too many learner members in cluster"), "a second learner")
    out = etcdctl(c.endpoints, "member", "add", "x", "--learner",
                  "--peer-urls=http://127.0.0.1:3", check=False)
    assert out.returncode != 0 and "too many learner members" in out.stderr, out.stderr
    a.member_remove(pb.MemberRemoveRequest(ID=first), timeout=5)
    target = fols[1].status().header.member_id
    eq(rpc_error(a.move_leader, pb.MoveLeaderRequest(targetID=target), timeout=5),
       (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: not leader"),
       "MoveLeader on a follower")
    b = Api(lead.client_addr)
    eq(rpc_error(b.move_leader, pb.MoveLeaderRequest(targetID=12345), timeout=5),
       (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: bad leader transferee"),
       "MoveLeader to a stranger")
    b.move_leader(pb.MoveLeaderRequest(targetID=lead.status().header.member_id), timeout=5)
    eq(c.leader().name, lead.name, "MoveLeader to the leader itself is done at once")
    a.close()
    b.close()


@case
def request_sizes_like_etcd():
    """--max-request-bytes 1.5 MiB: etcd's answers, side by side."""
    e = mctest.Etcd()
    m = mctest.Meta()
    try:
        sizes = [1 << 20, 1536 * 1024 - 100, 1536 * 1024 + 100, 2048 * 1024 - 200,
                 2048 * 1024 + 100, 3 << 20]
        got = {}
        for name, ep in (("etcd", e.endpoint), ("meta", m.endpoint)):
            ch = mctest.token_channel(ep, options=[("grpc.max_send_message_length", 64 << 20)])
            put = stub(ch, "KV", "Put", pb.PutRequest, pb.PutResponse)
            rng = stub(ch, "KV", "Range", pb.RangeRequest, pb.RangeResponse)
            res = []
            for n in sizes:
                for call, req in ((put, pb.PutRequest(key=b"big", value=b"x" * n)),
                                  (rng, pb.RangeRequest(key=b"x" * n))):
                    try:
                        call(req, timeout=20)
                        res.append("ok")
                    except grpc.RpcError as err:
                        res.append("%s %s" % (err.code().name, err.details()))
            got[name] = res
            ch.close()
        eq(got["meta"], got["etcd"], "answers for puts and ranges of %s bytes" % sizes)
        assert any("RESOURCE_EXHAUSTED grpc: received message larger than max" in x
                   for x in got["meta"]), got["meta"]
        assert any("INVALID_ARGUMENT etcdserver: request is too large" in x
                   for x in got["meta"]), got["meta"]
    finally:
        e.kill()
        m.kill()


# ------------------------------------------------------------ Maintenance

def hashkv(c, rev=0):
    f = stub(c.ch, "Maintenance", "HashKV", pb.HashKVRequest, pb.HashKVResponse)
    try:
        r = f(pb.HashKVRequest(revision=rev), timeout=10)
        return (r.hash, r.compact_revision, r.header.revision)
    except grpc.RpcError as e:
        return (e.code().name, e.details())


def history(c):
    """The same writes for etcd and meta: puts, deletes, a txn, a lease with
    an explicit ID, a compaction, a delete compacted at exactly its
    revision, and a value bigger than a bbolt page."""
    c.put(b"h/a", b"1")
    c.put(b"h/b", b"2")
    c.delete(b"h/a")
    c.put(b"h/big", b"x" * 20000)
    c.grant_(pb.LeaseGrantRequest(TTL=1000, ID=0x1234), timeout=5)
    c.put(b"h/leased", b"v", lease=0x1234)
    for i in range(300):
        c.put(b"h/n%03d" % (i % 60), b"y" * (i % 200))
    c.txn_(pb.TxnRequest(success=[
        pb.RequestOp(request_put=pb.PutRequest(key=b"h/t", value=b"1")),
        pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"h/n010",
                                                                range_end=b"h/n020"))]),
        timeout=5)
    rev = c.range(b"h/a").header.revision
    c.compact_(pb.CompactionRequest(revision=rev - 50), timeout=5)
    c.delete(b"h/b")
    c.compact_(pb.CompactionRequest(revision=c.range(b"h/a").header.revision), timeout=5)
    for i in range(30):
        c.put(b"h/late%02d" % i, b"z")
    return c.range(b"h/a").header.revision


@case
def hash_kv_matches_etcd():
    e = mctest.Etcd()
    m = mctest.Meta()
    try:
        ce, cm = Client(e.endpoint), Client(m.endpoint)
        ce.put(b"/mctest/ready", b"1")  # what Meta() wrote before us
        cur = history(ce)
        eq(history(cm), cur, "the same revisions")
        for rev in (0, cur, cur - 10, cur - 30, cur - 31, cur - 32, 3, cur + 1):
            eq(hashkv(cm, rev), hashkv(ce, rev), "HashKV at %d" % rev)
        assert isinstance(hashkv(cm, 0)[0], int)
        ce.close()
        cm.close()
    finally:
        e.kill()
        m.kill()


@case
def hash_equal_on_every_member():
    c = shared()
    cl = Client(c.members[0].client_addr)
    for i in range(20):
        cl.put(b"hash/%d" % i, b"v%d" % i)
    cl.delete(b"hash/3")

    def hashes():
        idx = {m.status().raftAppliedIndex for m in c.members}
        if len(idx) != 1:
            return None
        hs = {(Api(m.client_addr).hash(pb.HashRequest(), timeout=5).hash,
               m.status().header.revision) for m in c.members}
        return hs if len(hs) == 1 else None
    h1 = mctest.wait_for(hashes, timeout=20, what="the same Hash on every member")
    cl.put(b"hash/more", b"x")
    h2 = mctest.wait_for(hashes, timeout=20, what="the same Hash again")
    assert h1 != h2, (h1, h2)
    cl.close()


@case
def snapshot_save_status_restore_into_etcd():
    c = shared()
    _, fols = followers(c)
    m = fols[0]
    cl = Client(m.client_addr)
    cl.grant_(pb.LeaseGrantRequest(TTL=3000, ID=0x5151), timeout=5)
    cl.put(b"snap/leased", b"v", lease=0x5151)
    for i in range(200):
        cl.put(b"snap/k%03d" % (i % 80), b"v" * (i * 7 % 5000))
    cl.delete(b"snap/k007")
    rev = cl.range(b"snap/k000").header.revision
    cl.compact_(pb.CompactionRequest(revision=rev - 20), timeout=5)
    for _ in deadline_loop(20, "the follower applied everything"):
        if m.status().header.revision == c.leader().status().header.revision:
            break
    want_rev = m.status().header.revision
    want_hkv = hashkv(cl)
    tmp = tempfile.TemporaryDirectory(prefix="mooncaked-snap-")
    f = os.path.join(tmp.name, "s.db")
    out = etcdctl(m.endpoint, "snapshot", "save", f).stdout
    assert "Snapshot saved at " + f in out, out
    env = dict(os.environ, ETCDCTL_API="3")
    st = json.loads(mctest.run(["etcdctl", "snapshot", "status", f, "-w", "json"],
                               env=env).stdout)
    eq(st["revision"], want_rev, "snapshot status: revision")
    assert st["totalKey"] > 80 and st["totalSize"] % 4096 == 0, st
    out = mctest.run(["etcdctl", "snapshot", "status", f, "-w", "table"], env=env).stdout
    assert "%x" % st["hash"] in out and str(want_rev) in out, out
    # Restore into a real etcd and compare what it holds.
    data = os.path.join(tmp.name, "etcd")
    cport, pport = mctest.free_port(), mctest.free_port()
    peer = "http://127.0.0.1:%d" % pport
    mctest.run(["etcdctl", "snapshot", "restore", f, "--data-dir", data, "--name", "r",
                "--initial-cluster", "r=" + peer, "--initial-advertise-peer-urls", peer],
               env=env)
    log = open(os.path.join(tmp.name, "etcd.log"), "wb")
    p = subprocess.Popen(["etcd", "--name=r", "--data-dir=" + data,
                          "--listen-client-urls=http://127.0.0.1:%d" % cport,
                          "--advertise-client-urls=http://127.0.0.1:%d" % cport,
                          "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
                          "--initial-cluster=r=" + peer],
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        mctest.wait_port(cport, proc=p)
        ce = Client("127.0.0.1:%d" % cport)
        mctest.wait_for(lambda: ce.range(b"snap/k000").header.revision, timeout=20,
                        what="the restored etcd serving")
        eq(ce.range(b"snap/k000").header.revision, want_rev, "restored revision")

        def kvs(x):
            r = x.range(b"\0", range_end=b"\0")
            return [(k.key, k.value, k.create_revision, k.mod_revision, k.version, k.lease)
                    for k in r.kvs]
        eq(kvs(ce), kvs(cl), "every key, value, revision, version and lease")
        eq(hashkv(ce), want_hkv, "HashKV of the restored etcd")
        eq(hashkv(ce, rev - 21)[0], "OUT_OF_RANGE", "the compaction came along")
        r = ce.ttl_(pb.LeaseTimeToLiveRequest(ID=0x5151, keys=True), timeout=5)
        eq((r.grantedTTL, list(r.keys)), (3000, [b"snap/leased"]), "the lease came along")
        ce.close()
    finally:
        p.kill()
        p.wait()
        log.close()
        tmp.cleanup()
    cl.revoke_(pb.LeaseRevokeRequest(ID=0x5151), timeout=5)
    cl.close()


@case
def defragment_status_alarm():
    c = shared()
    out = etcdctl(c.endpoints, "defrag").stdout
    eq(out.count("Finished defragmenting etcd member"), 3, "defrag on every endpoint: " + out)
    st = json.loads(etcdctl(c.endpoints, "endpoint", "status", "-w", "json").stdout)
    eq(len(st), 3, "endpoint status")
    assert all(s["Status"]["leader"] == st[0]["Status"]["leader"] for s in st), st
    eq(etcdctl(c.endpoints, "alarm", "list").stdout, "", "no alarm")
    out = etcdctl(c.members[0].endpoint, "endpoint", "hashkv", "-w", "json").stdout
    assert json.loads(out)[0]["HashKV"]["hash"], out


# ------------------------------------------------------------ lease IDs

@case
def lease_ids_like_etcd():
    cl = Cluster(1)
    try:
        cl.start()
        m = cl.members[0]
        c = Client(m.client_addr)
        me = m.status().header.member_id
        ids = [c.grant_(pb.LeaseGrantRequest(TTL=600), timeout=5).ID for _ in range(3)]
        for i in ids:
            # etcd's reqIDGen: 2 bytes of the member ID, then the clock
            eq(i >> 48, (me & 0xffff) & 0x7fff, "the member's prefix in %x" % i)
        eq(ids[1] - ids[0], 1, "a counter after the prefix and the time")
        # An explicit ID, the next one the generator would give: skipped.
        c.grant_(pb.LeaseGrantRequest(TTL=600, ID=ids[2] + 1), timeout=5)
        nxt = c.grant_(pb.LeaseGrantRequest(TTL=600), timeout=5).ID
        assert nxt not in ids + [ids[2] + 1], hex(nxt)
        # Explicit IDs as etcd takes them: negative ones too; a duplicate
        # is refused.
        eq(c.grant_(pb.LeaseGrantRequest(TTL=600, ID=-5), timeout=5).ID, -5, "ID -5")
        eq(rpc_error(c.grant_, pb.LeaseGrantRequest(TTL=600, ID=-5), timeout=5),
           (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: lease already exists"),
           "a duplicate")
        c.put(b"neg", b"v", lease=-5)
        eq(c.range(b"neg").kvs[0].lease, -5, "a key on lease -5")
        eq(rpc_error(c.revoke_, pb.LeaseRevokeRequest(ID=0), timeout=5),
           (grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found"), "revoke 0")
        c.close()
        # After a restart the IDs are new, not the old ones again.
        m.stop()
        m.start()
        cl.wait_leader()
        c = Client(m.client_addr)
        again = mctest.wait_for(
            lambda: c.grant_(pb.LeaseGrantRequest(TTL=600), timeout=5).ID, timeout=20,
            what="a grant after the restart")
        assert again not in ids and again > ids[-1], (hex(again), [hex(i) for i in ids])
        leases = {x.ID for x in stub(c.ch, "Lease", "LeaseLeases", pb.LeaseLeasesRequest,
                                     pb.LeaseLeasesResponse)(pb.LeaseLeasesRequest(),
                                                             timeout=5).leases}
        assert set(ids) | {-5, again} <= leases, leases
        c.close()
    finally:
        cl.close()


@case
def zz_shared_cluster_stops_cleanly():
    c = _shared.pop("c", None)
    if c is None:
        return
    codes = [(m.name, m.stop()) for m in c.members if m.alive()]
    c.close()
    eq([x for x in codes if x[1] != 0], [], "members that did not exit 0")


mctest.main()
