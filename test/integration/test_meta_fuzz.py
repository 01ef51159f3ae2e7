"""Robustness of mooncaked --role=meta against hostile etcd v3 requests:
every request type of KV, Lease, Watch, Cluster and Maintenance, with
every combination of its fields (types with more than 6 fields: every
field alone, every pair and 150 random combinations), each field set from
a pool of hostile values (empty, NUL and 64 KiB keys, range_end "\\0",
0, -1, the extreme int64/uint64 values, future and compacted revisions,
unknown lease and watch IDs, enum values out of range, bad URLs, nested
txns), plus random bytes that are no protobuf at all and a txn nested
100000 levels deep, sent in turn to every member of a 3-member cluster
(so the followers' forwarding is fuzzed too). Answers may be errors; no
member may exit. Afterwards every member still serves a linearizable
put and get, and all of them report the same HashKV and Hash at the same
applied index (the state machine stayed deterministic).

The seed is fixed (SEED): a run is reproducible; FUZZ_DEBUG=1 prints how
many answers of each status and message each method got. Calls that change the
cluster are undone at once (an added member is removed, a raised alarm
disarmed) so that the rest of the run still reaches every path.
"""
import contextlib
import itertools
import random
import re
import signal
import socket
import struct
import threading
import time
import urllib.request

import mctest
from mctest import case, eq

import grpc
from google.protobuf import descriptor as D
import metacluster as mc
from metacluster import Client, Cluster, Requests
import etcd_rpc_pb2 as pb

SEED = 14
MAX_ALL_SUBSETS_FIELDS = 6
RANDOM_SUBSETS = 150
ROUNDS = 8  # each combination with this many draws of values
ROUNDS_OF = {"Txn": 80, "Put": 16}  # more for the richest requests
CALL_TIMEOUT = 3.0
KEEPALIVE_STREAMS = 200
WATCH_ROUNDS = 3
DEBUG = {} if __import__('os').environ.get('FUZZ_DEBUG') else None

UNARY = [
    ("KV", "Range", pb.RangeRequest, pb.RangeResponse),
    ("KV", "Put", pb.PutRequest, pb.PutResponse),
    ("KV", "DeleteRange", pb.DeleteRangeRequest, pb.DeleteRangeResponse),
    ("KV", "Txn", pb.TxnRequest, pb.TxnResponse),
    ("KV", "Compact", pb.CompactionRequest, pb.CompactionResponse),
    ("Lease", "LeaseGrant", pb.LeaseGrantRequest, pb.LeaseGrantResponse),
    ("Lease", "LeaseRevoke", pb.LeaseRevokeRequest, pb.LeaseRevokeResponse),
    ("Lease", "LeaseTimeToLive", pb.LeaseTimeToLiveRequest, pb.LeaseTimeToLiveResponse),
    ("Lease", "LeaseLeases", pb.LeaseLeasesRequest, pb.LeaseLeasesResponse),
    ("Cluster", "MemberAdd", pb.MemberAddRequest, pb.MemberAddResponse),
    ("Cluster", "MemberRemove", pb.MemberRemoveRequest, pb.MemberRemoveResponse),
    ("Cluster", "MemberUpdate", pb.MemberUpdateRequest, pb.MemberUpdateResponse),
    ("Cluster", "MemberList", pb.MemberListRequest, pb.MemberListResponse),
    ("Cluster", "MemberPromote", pb.MemberPromoteRequest, pb.MemberPromoteResponse),
    ("Maintenance", "Alarm", pb.AlarmRequest, pb.AlarmResponse),
    ("Maintenance", "Status", pb.StatusRequest, pb.StatusResponse),
    ("Maintenance", "Defragment", pb.DefragmentRequest, pb.DefragmentResponse),
    ("Maintenance", "Hash", pb.HashRequest, pb.HashResponse),
    ("Maintenance", "HashKV", pb.HashKVRequest, pb.HashKVResponse),
    ("Maintenance", "MoveLeader", pb.MoveLeaderRequest, pb.MoveLeaderResponse),
]
STREAMS = [
    ("Lease", "LeaseKeepAlive", pb.LeaseKeepAliveRequest, pb.LeaseKeepAliveResponse, "bidi"),
    ("Watch", "Watch", pb.WatchRequest, pb.WatchResponse, "bidi"),
    ("Maintenance", "Snapshot", pb.SnapshotRequest, pb.SnapshotResponse, "out"),
]

I64 = [0, 1, -1, 2, 7, (1 << 63) - 1, -(1 << 63), 1 << 32, -1000]
U64 = [0, 1, (1 << 64) - 1, 1 << 63, 12345]


class Gen:
    """Hostile values for a field, from its type and name."""

    def __init__(self, rng, cluster):
        self.rng = rng
        self.rev = 2
        self.keys = [b"", b"\0", b"fz/a", b"fz/", b"fz0", b"\xff\xff", b"fz/" + b"k" * 300,
                     b"K" * 65536, b"\0\0", b"fz/\0z"]
        self.urls = ["", "http://127.0.0.1:1", "not a url", "http://" + "h" * 3000 + ":1",
                     "http://127.0.0.1:99999", "unix:///x", "http://[::1]:2", "http://:0/"]

    def scalar(self, f):
        rng, name = self.rng, f.name.lower()
        t = f.type
        if t == D.FieldDescriptor.TYPE_BOOL:
            return rng.random() < 0.5
        if t == D.FieldDescriptor.TYPE_ENUM:
            vals = [v.number for v in f.enum_type.values] + [99, -1, 1 << 20]
            return rng.choice(vals)
        if t == D.FieldDescriptor.TYPE_BYTES:
            v = rng.choice(self.keys)
            if name == "key" and not v and rng.random() < 0.8:
                v = rng.choice(self.keys[2:])  # mostly keys that get past the checks
            if rng.random() < 0.05:
                v = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
            return v
        if t == D.FieldDescriptor.TYPE_STRING:
            return rng.choice(self.urls)
        if t in (D.FieldDescriptor.TYPE_UINT64, D.FieldDescriptor.TYPE_FIXED64):
            return rng.choice(U64)
        if t in (D.FieldDescriptor.TYPE_INT64, D.FieldDescriptor.TYPE_SINT64,
                 D.FieldDescriptor.TYPE_INT32):
            pool = list(I64)
            if "rev" in name:
                pool += [self.rev, self.rev - 1, self.rev + 1, self.rev + 10 ** 6]
            if name in ("ttl",):
                pool += [5, 60, 9000000000, 9000000001]
            v = rng.choice(pool)
            if t == D.FieldDescriptor.TYPE_INT32:
                v = max(-(1 << 31), min((1 << 31) - 1, v))
            return v
        raise AssertionError("no values for %s" % f.full_name)

    def fill(self, msg, fields, depth):
        """Set the given fields of msg (repeated ones get 0-3 values)."""
        for f in fields:
            if f.label == D.FieldDescriptor.LABEL_REPEATED:
                n = self.rng.randrange(4)
                for _ in range(n):
                    if f.type == D.FieldDescriptor.TYPE_MESSAGE:
                        if depth > 0:
                            self.random_msg(getattr(msg, f.name).add(), depth - 1)
                    else:
                        getattr(msg, f.name).append(self.scalar(f))
            elif f.type == D.FieldDescriptor.TYPE_MESSAGE:
                if depth > 0:
                    self.random_msg(getattr(msg, f.name), depth - 1)
                    if not getattr(msg, f.name).ListFields():
                        getattr(msg, f.name).SetInParent()
            else:
                setattr(msg, f.name, self.scalar(f))
        return msg

    def random_msg(self, msg, depth):
        fields = [f for f in msg.DESCRIPTOR.fields if self.rng.random() < 0.5]
        return self.fill(msg, fields, depth)


def combinations(fields, rng):
    """Every subset of the fields if few, else every single field, every
    pair and some random subsets (always the empty message and all)."""
    n = len(fields)
    if n <= MAX_ALL_SUBSETS_FIELDS:
        for k in range(n + 1):
            yield from itertools.combinations(fields, k)
        return
    yield ()
    yield tuple(fields)
    yield from itertools.combinations(fields, 1)
    yield from itertools.combinations(fields, 2)
    for _ in range(RANDOM_SUBSETS):
        yield tuple(f for f in fields if rng.random() < 0.5)


class Fuzz:
    def __init__(self, cluster):
        self.c = cluster
        self.rng = random.Random(SEED)
        self.gen = Gen(self.rng, cluster)
        self.chans = [mctest.token_channel(m.client_addr,
                                           options=[("grpc.max_send_message_length", 64 << 20),
                                                    ("grpc.max_receive_message_length",
                                                     64 << 20)])
                      for m in cluster.members]
        self.turn = 0
        self.calls = 0
        self.codes = {}

    def chan(self):
        self.turn += 1
        return self.chans[self.turn % len(self.chans)]

    def alive(self, what):
        for m in self.c.members:
            if not m.alive():
                rc = m.daemon.proc.returncode
                how = ("killed by %s" % signal.Signals(-rc).name if rc < 0
                       else "exit status %d" % rc)
                raise AssertionError("%s exited (%s) during %s:\n%s"
                                     % (m.name, how, what, m.output()[-4000:]))

    def unary(self, svc, method, req, resp_type, raw=None):
        ch = self.chan()
        call = ch.unary_unary("/etcdserverpb.%s/%s" % (svc, method),
                              request_serializer=(lambda x: x) if raw is not None
                              else req.SerializeToString,
                              response_deserializer=resp_type.FromString)
        self.calls += 1
        try:
            r = call(raw if raw is not None else req, timeout=CALL_TIMEOUT)
            code = "OK"
        except grpc.RpcError as e:
            r = None
            code = e.code().name
            if DEBUG is not None:
                k = (method, code, (e.details() or "")[:70])
                DEBUG[k] = DEBUG.get(k, 0) + 1
        self.codes[code] = self.codes.get(code, 0) + 1
        if r is not None and r.header.revision:
            self.gen.rev = r.header.revision
        self.undo(method, req, r)
        return r

    def undo(self, method, req, r):
        """Keep the cluster the size it was and free of alarms."""
        if r is None:
            return
        if method == "MemberAdd":
            self.admin(lambda ch: ch.unary_unary(
                "/etcdserverpb.Cluster/MemberRemove",
                request_serializer=pb.MemberRemoveRequest.SerializeToString,
                response_deserializer=pb.MemberRemoveResponse.FromString)(
                    pb.MemberRemoveRequest(ID=r.member.ID), timeout=10))
        if method == "Alarm" and req.action == pb.AlarmRequest.ACTIVATE:
            self.admin(lambda ch: ch.unary_unary(
                "/etcdserverpb.Maintenance/Alarm",
                request_serializer=pb.AlarmRequest.SerializeToString,
                response_deserializer=pb.AlarmResponse.FromString)(
                    pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE), timeout=10))

    def admin(self, fn):
        for _ in mc.deadline_loop(30, "an undo call never went through"):
            try:
                fn(self.chans[0])
                return
            except grpc.RpcError:
                pass

    def run_unary(self):
        for svc, method, req_t, resp_t in UNARY:
            n0 = self.calls
            t0 = time.monotonic()
            fields = list(req_t.DESCRIPTOR.fields)
            for combo in combinations(fields, self.rng):
                for _ in range(ROUNDS_OF.get(method, ROUNDS)):
                    req = self.gen.fill(req_t(), combo, depth=3)
                    self.unary(svc, method, req, resp_t)
            # Not a protobuf at all, or a truncated one.
            for _ in range(30):
                junk = bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 200)))
                self.unary(svc, method, None, resp_t, raw=junk)
            good = self.gen.random_msg(req_t(), 2).SerializeToString()
            if good:
                self.unary(svc, method, None, resp_t, raw=good[:len(good) // 2])
            self.alive(method)
            print("  %-16s %5d calls %.2fs" % (method, self.calls - n0, time.monotonic() - t0))

    def run_deep_txn(self):
        # Built from the inside out as a list of headers: a TxnRequest
        # whose success[0] is a RequestOp whose request_txn is the next.
        heads, inner = [], 0
        for _ in range(100000):
            for tag in (0x22, 0x12):
                h = bytes([tag]) + _varint(inner)
                heads.append(h)
                inner += len(h)
        self.unary("KV", "Txn", None, pb.TxnResponse, raw=b"".join(reversed(heads)))
        self.alive("a txn nested 100000 levels")

    def run_keepalive(self):
        for i in range(KEEPALIVE_STREAMS):
            ids = [self.gen.scalar(pb.LeaseKeepAliveRequest.DESCRIPTOR.fields[0])
                   for _ in range(self.rng.randrange(0, 6))]
            ch = self.chan()
            call = ch.stream_stream("/etcdserverpb.Lease/LeaseKeepAlive",
                                    request_serializer=pb.LeaseKeepAliveRequest.SerializeToString,
                                    response_deserializer=pb.LeaseKeepAliveResponse.FromString)
            self.calls += 1
            try:
                list(call(iter([pb.LeaseKeepAliveRequest(ID=x) for x in ids]),
                          timeout=CALL_TIMEOUT))
            except grpc.RpcError:
                pass
        self.alive("LeaseKeepAlive")
        print("  %-16s %5d streams" % ("LeaseKeepAlive", KEEPALIVE_STREAMS))

    def run_watch(self):
        create_fields = list(pb.WatchCreateRequest.DESCRIPTOR.fields)
        combos = list(combinations(create_fields, self.rng)) * WATCH_ROUNDS
        n = 0
        for start in range(0, len(combos), 16):
            reqs = []
            for combo in combos[start:start + 16]:
                r = self.rng.random()
                if r < 0.7:
                    reqs.append(pb.WatchRequest(create_request=self.gen.fill(
                        pb.WatchCreateRequest(), combo, 1)))
                elif r < 0.85:
                    reqs.append(pb.WatchRequest(cancel_request=pb.WatchCancelRequest(
                        watch_id=self.rng.choice(I64 + [0, 1, 2, 3]))))
                elif r < 0.95:
                    reqs.append(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))
                else:
                    reqs.append(pb.WatchRequest())
            ch = self.chan()
            call = ch.stream_stream("/etcdserverpb.Watch/Watch",
                                    request_serializer=pb.WatchRequest.SerializeToString,
                                    response_deserializer=pb.WatchResponse.FromString)
            q = Requests(*reqs)
            stream = call(iter(q), timeout=CALL_TIMEOUT)
            self.calls += 1
            n += len(reqs)
            got = []
            reader = threading.Thread(target=_drain, args=(stream, got), daemon=True)
            reader.start()
            # Some writes while the watchers watch, then stop.
            self.unary("KV", "Put", pb.PutRequest(key=b"fz/a", value=b"w", prev_kv=True),
                       pb.PutResponse)
            self.unary("KV", "DeleteRange", pb.DeleteRangeRequest(key=b"\0", range_end=b"\0"),
                       pb.DeleteRangeResponse)
            if self.rng.random() < 0.5:
                q.close()  # half-close; the stream goes on until cancelled
            time.sleep(0.05)
            stream.cancel()
            reader.join(CALL_TIMEOUT + 1)
        self.alive("Watch")
        print("  %-16s %5d requests" % ("Watch", n))

    def run_snapshot(self):
        for _ in range(3):
            ch = self.chan()
            call = ch.unary_stream("/etcdserverpb.Maintenance/Snapshot",
                                   request_serializer=pb.SnapshotRequest.SerializeToString,
                                   response_deserializer=pb.SnapshotResponse.FromString)
            total = 0
            for r in call(pb.SnapshotRequest(), timeout=30):
                total += len(r.blob)
            assert total > 4096 * 4, total
            # and one the client walks away from
            it = call(pb.SnapshotRequest(), timeout=30)
            next(it)
            it.cancel()
        self.alive("Snapshot")


def _drain(stream, got):
    try:
        for r in stream:
            got.append(r)
    except grpc.RpcError:
        pass


def _varint(n):
    v = b""
    while True:
        x, n = n & 0x7f, n >> 7
        v += bytes([x | (0x80 if n else 0)])
        if not n:
            return v


@case
def hostile_requests_stop_no_member():
    c = Cluster(3)
    try:
        c.start()
        f = Fuzz(c)
        t0 = time.monotonic()
        f.run_unary()
        for step in (f.run_deep_txn, f.run_keepalive, f.run_watch, f.run_snapshot):
            t1 = time.monotonic()
            step()
            print("  %s %.2fs" % (step.__name__, time.monotonic() - t1))
        print("  %d calls in %.1fs: %s" % (f.calls, time.monotonic() - t0,
                                           ", ".join("%s %d" % kv for kv in
                                                     sorted(f.codes.items()))))
        f.alive("the run")
        for k, v in sorted((DEBUG or {}).items()):
            print("   ", v, k)
        # Everyone still serves, and everyone holds the same state.
        for m in c.members:
            cl = Client(m.client_addr, timeout=10)
            mctest.wait_for(lambda: cl.put(b"fz/after", m.name.encode()), timeout=20,
                            what="a put through %s" % m.name)
            eq(cl.get(b"fz/after"), m.name.encode(), "read your write on %s" % m.name)
            cl.close()
        hk = lambda m: mc.Client(m.client_addr).ch.unary_unary(  # noqa: E731
            "/etcdserverpb.Maintenance/HashKV",
            request_serializer=pb.HashKVRequest.SerializeToString,
            response_deserializer=pb.HashKVResponse.FromString)(pb.HashKVRequest(), timeout=10)
        hs = lambda m: mc.Client(m.client_addr).ch.unary_unary(  # noqa: E731
            "/etcdserverpb.Maintenance/Hash",
            request_serializer=pb.HashRequest.SerializeToString,
            response_deserializer=pb.HashResponse.FromString)(pb.HashRequest(), timeout=10)

        def agree():
            if len({m.status().raftAppliedIndex for m in c.members}) != 1:
                return None
            got = {(hk(m).hash, hk(m).header.revision, hs(m).hash) for m in c.members}
            return got if len(got) == 1 else None
        mctest.wait_for(agree, timeout=30, what="the same HashKV and Hash on every member")
        codes = [(m.name, m.stop()) for m in c.members]
        eq([x for x in codes if x[1] != 0], [], "members that did not exit 0")
    finally:
        c.close()


@contextlib.contextmanager
def _one_member(key, value=b"v", args=()):
    """A one-member cluster started with args, a client of it, and key put
    to value: yields (member, client); after, the member must stop with
    status 0."""
    c = Cluster(1, args=list(args))
    try:
        c.start()
        m = c.members[0]
        cl = Client(m.client_addr, timeout=10)
        mctest.wait_for(lambda: cl.put(key, value), timeout=20, what="a first put")
        yield m, cl
        cl.close()
        eq(m.stop(), 0, "exit status")
    finally:
        c.close()


def _h2_frame(ftype, flags, sid, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + \
        struct.pack(">I", sid) + payload


def _hpack_literal(name, value):
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def _h2_open(port, settings=b""):
    """A raw HTTP/2 connection: the preface and a SETTINGS frame sent."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _h2_frame(4, 0, 0, settings))
    return s


def _grpc_head(path):
    """The header block of a gRPC request to path, without indexing, with
    a fresh token of the tests' cluster secret (the members' etcd API
    wants one on a connection's first call; one per connection)."""
    return b"\x83\x86" + _hpack_literal(b":path", path) + \
        _hpack_literal(b":authority", b"x") + \
        _hpack_literal(b"content-type", b"application/grpc") + \
        _hpack_literal(b"te", b"trailers") + \
        _hpack_literal(b"mooncake-auth", mctest.rpc_token().encode())


@case
def requests_that_decode_past_the_call_memory_are_refused():
    """A 4 MB Txn of empty compares ("0a 00") would decode into 2M
    structs, some 200 MB: --rpc-max-call-memory bounds what the gRPC
    server's calls hold, so it is refused with RESOURCE_EXHAUSTED, from
    8 threads at once too, and the member's peak memory stays far below;
    a real Txn still passes."""
    with _one_member(b"lim/k", args=["--max-request-bytes=4M", "--rpc-max-message-size=8M",
                                      "--rpc-max-call-memory=16M"]) as (m, cl):
        raw_txn = cl.ch.unary_unary("/etcdserverpb.KV/Txn")  # bytes in, bytes out
        hwm0 = mctest.proc_mib(m.daemon.pid, "VmHWM")
        body = b"\x0a\x00" * (2 * 1000 * 1000)
        codes = []

        def send():
            try:
                raw_txn(body, timeout=30)
                codes.append("OK")
            except grpc.RpcError as e:
                codes.append(e.code().name)
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    assert "calls hold" in e.details(), e.details()
        ts = [threading.Thread(target=send) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        eq(codes, ["RESOURCE_EXHAUSTED"] * 8, "8 Txns of 2M empty compares")
        if not mctest.sanitized():
            grew = mctest.proc_mib(m.daemon.pid, "VmHWM") - hwm0
            assert grew < 64, "the member's peak memory grew %.0f MiB" % grew
        txn = pb.TxnRequest(compare=[pb.Compare(key=b"lim/k", value=b"v",
                                                target=pb.Compare.VALUE)] * 100,
                            success=[pb.RequestOp(request_put=pb.PutRequest(
                                key=b"lim/k", value=b"w"))])
        r = pb.TxnResponse.FromString(raw_txn(txn.SerializeToString(), timeout=10))
        eq(r.succeeded, True, "a Txn of 100 compares")
        eq(cl.get(b"lim/k"), b"w", "its put")


@case
def an_hpack_bomb_takes_no_memory():
    """HPACK lets one byte repeat a 4 KiB header of the dynamic table: a
    16 KiB HEADERS frame of such references decodes to some 50 MB, and
    nghttp2 does not hold the peer to the header list size the server
    advertised. 64 such streams on one connection: each is reset once
    its headers pass 64 KiB, and the member's memory does not grow
    (before, 8 of them took 480 MB)."""
    with _one_member(b"hb/k") as (m, cl):
        rss0 = mctest.proc_mib(m.daemon.pid)
        s = _h2_open(m.client_port)
        for i in range(64):
            p = _grpc_head(b"/etcdserverpb.KV/Range")
            if i == 0:
                p += b"\x40\x05x-big\x7f\xa1\x1e" + b"a" * 4000  # into the table
            p += b"\xbe" * (16384 - len(p))  # index 62: x-big, again and again
            s.sendall(_h2_frame(1, 4, 1 + 2 * i, p))
        # Every stream is reset (RST_STREAM, ENHANCE_YOUR_CALM).
        got, resets, deadline = b"", set(), time.monotonic() + 20
        s.settimeout(1)
        while len(resets) < 64 and time.monotonic() < deadline:
            try:
                got += s.recv(65536)
            except socket.timeout:
                continue
            while len(got) >= 9 and len(got) >= 9 + int.from_bytes(got[:3], "big"):
                n, ftype = int.from_bytes(got[:3], "big"), got[3]
                sid = int.from_bytes(got[5:9], "big") & 0x7fffffff
                if ftype == 3:
                    eq(int.from_bytes(got[9:13], "big"), 0xb, "the reset's code")
                    resets.add(sid)
                got = got[9 + n:]
        eq(len(resets), 64, "streams reset")
        assert "sent headers of more than 65536 bytes" in m.output(), "the log line"
        if not mctest.sanitized():
            grew = mctest.proc_mib(m.daemon.pid) - rss0
            assert grew < 32, "the member grew %.0f MiB" % grew
        s.close()
        eq(cl.get(b"hb/k"), b"v", "the member serves on")


@case
def declared_bodies_take_what_came():
    """A request's 5-byte prefix declares its length; its buffer used to
    be allocated whole right then. 8 connections of 1,000 streams, each
    declaring a 1.4 MB Put and sending one byte of it, took 11 GB of the
    member's address space and 400 MB of pages (one touched a body).
    Bodies now get a buffer as their bytes come (64 KiB for the first),
    counted in --rpc-max-call-memory: the member's address space and
    memory grow by what that bound allows, and it serves on."""
    with _one_member(b"db/k", args=["--rpc-max-message-size=8M",
                                     "--rpc-max-call-memory=64M"]) as (m, cl):
        pid = m.daemon.pid
        vm0, rss0 = mctest.proc_mib(pid, "VmSize"), mctest.proc_mib(pid)
        socks = []
        for c in range(8):
            s = _h2_open(m.client_port)
            buf = b""
            for i in range(1000):
                sid = 1 + 2 * i
                buf += _h2_frame(1, 4, sid, _grpc_head(b"/etcdserverpb.KV/Put"))
                buf += _h2_frame(0, 0, sid, b"\x00" + struct.pack(">I", 1400 * 1024) + b"x")
            try:
                s.sendall(buf)
            except OSError:
                pass  # (closed: the bound is full)
            socks.append(s)
        time.sleep(1)
        vm, rss = mctest.proc_mib(pid, "VmSize") - vm0, mctest.proc_mib(pid) - rss0
        for s in socks:
            s.close()
        if not mctest.sanitized():
            assert vm < 512, "address space grew %.0f MiB" % vm
            assert rss < 160, "memory grew %.0f MiB" % rss
        mctest.wait_for(lambda: cl.put(b"db/k", b"w"), timeout=20, what="a put after")
        eq(cl.get(b"db/k"), b"w", "the member serves on")


@case
def watchers_are_bounded():
    """Every watcher a Watch stream creates counts what it may take (its
    keys and a full buffer of pending events, some 9 KB) in
    --rpc-max-call-memory: one stream creating watchers without end
    (200,000 on 1 KB keys took 665 MB before) is refused once its
    connection's share is full, as etcd refuses a create (created and
    canceled, watch ID -1, a reason); its watchers still deliver, the
    member's memory stays small, and what they held comes back when the
    stream goes."""
    with _one_member(b"wb/k", args=["--rpc-max-message-size=8M",
                                     "--rpc-max-call-memory=64M"]) as (m, cl):
        rss0 = mctest.proc_mib(m.daemon.pid)
        reqs, stop = [], threading.Event()

        def gen():
            for i in range(20000):
                if stop.is_set():
                    break
                reqs.append(i)
                key = b"wb/k" if i == 0 else (b"wb/%06d/" % i).ljust(1000, b"x")
                yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key))
            stop.wait(30)
        # A connection of its own: its share fills, the client's does not.
        ch = mctest.token_channel(m.client_addr,
                                  options=[("grpc.use_local_subchannel_pool", 1)])
        stream = ch.stream_stream("/etcdserverpb.Watch/Watch",
                                  request_serializer=pb.WatchRequest.SerializeToString,
                                  response_deserializer=pb.WatchResponse.FromString)(
                                      gen(), timeout=60)
        created, refused = 0, None
        for r in stream:
            if r.canceled:
                refused = r
                break
            created += r.created
        assert refused is not None, "never refused (%d created)" % created
        eq((refused.created, refused.watch_id), (True, -1), "as etcd refuses a create")
        assert "too many watchers" in refused.cancel_reason, refused.cancel_reason
        assert 500 < created < 5000, "%d watchers created on a 16 MiB share" % created
        if not mctest.sanitized():
            grew = mctest.proc_mib(m.daemon.pid) - rss0
            assert grew < 64, "the member grew %.0f MiB" % grew
        cl.put(b"wb/k", b"w2")
        for r in stream:
            if r.events:
                eq((r.watch_id, r.events[0].kv.value), (0, b"w2"), "the first watcher delivers")
                break
        stop.set()
        stream.cancel()
        ch.close()


        def held():
            text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % m.http_port,
                                          timeout=5).read().decode()
            return float(re.search(r'mooncake_rpc_server_call_memory_bytes'
                                   r'\{server="meta-client"\} (\S+)', text).group(1))
        mctest.wait_for(lambda: held() < 1 << 20, 10, "the watchers' memory back")


@case
def maintenance_calls_are_bounded():
    """Hash, HashKV and Snapshot each hold copies of the whole state
    while they run: a member serves four at once. Four Snapshots whose
    clients never open a flow-control window stay running; a fifth call
    is refused UNAVAILABLE (which etcd's clients retry) and logged. A
    Snapshot its client takes nothing of for 30 s ends, so once they
    have (their connections still open) a Snapshot is served whole."""
    with _one_member(b"mb/k") as (m, cl):
        for i in range(8):
            cl.put(b"mb/%d" % i, bytes([i]) * 1000000)
        window0 = struct.pack(">HI", 4, 0)
        held = []
        for _ in range(4):
            s = _h2_open(m.client_port, window0)
            head = _grpc_head(b"/etcdserverpb.Maintenance/Snapshot")
            s.sendall(_h2_frame(1, 4, 1, head) + _h2_frame(0, 1, 1, b"\x00" * 5))
            held.append(s)
            # Running once its answer's HEADERS come (its DATA cannot).
            got, s_deadline = b"", time.monotonic() + 10
            s.settimeout(1)
            while time.monotonic() < s_deadline:
                try:
                    got += s.recv(65536)
                except socket.timeout:
                    continue
                frames, at = [], 0
                while at + 9 <= len(got):
                    frames.append((got[at + 3], int.from_bytes(got[at + 5:at + 9], "big")))
                    at += 9 + int.from_bytes(got[at:at + 3], "big")
                if (1, 1) in frames:
                    break
            else:
                raise AssertionError("no answer to a held Snapshot")
        snap = cl.ch.unary_stream("/etcdserverpb.Maintenance/Snapshot",
                                  request_serializer=pb.SnapshotRequest.SerializeToString,
                                  response_deserializer=pb.SnapshotResponse.FromString)

        def refused():
            try:
                for _ in snap(pb.SnapshotRequest(), timeout=10):
                    pass
            except grpc.RpcError as e:
                return e if e.code() == grpc.StatusCode.UNAVAILABLE else None
            return None
        err = mctest.wait_for(refused, 10, "a fifth Snapshot refused")
        assert "too many Hash, HashKV or Snapshot calls" in err.details(), err.details()
        assert "Hash, HashKV or Snapshot calls at once" in m.output(), "the log line"

        def served():
            got = b"".join(r.blob for r in snap(pb.SnapshotRequest(), timeout=30))
            return len(got) > 8000000
        mctest.wait_for(served, 45, "a Snapshot served once the stalled ones ended")
        assert "nothing taken for 30 s" in m.output(), "the stalled ones' log lines"
        for s in held:
            s.close()


@case
def answers_a_client_never_takes_are_bounded():
    """A client that opens no flow-control window (SETTINGS_INITIAL_WINDOW
    _SIZE 0) leaves every answer in the server's memory: 1,000 Ranges of a
    1 MB value took a member to 744 MB. With --rpc-max-call-memory=64M
    the answers past it end RESOURCE_EXHAUSTED, the member stays small
    and serves other clients. Which way a Range is refused depends on
    when the member reads its stream: after answers fill the connection's
    share, a new stream is reset at its start (counted under method
    "unknown"); before, its answer is refused. Both count."""
    big = bytes(random.Random(3).getrandbits(8) for _ in range(1000000))
    with _one_member(b"big", big, args=["--rpc-max-message-size=8M",
                                        "--rpc-max-call-memory=64M"]) as (m, cl):
        rss0 = mctest.proc_mib(m.daemon.pid)
        s = _h2_open(m.client_port, struct.pack(">HI", 4, 0))
        body = pb.RangeRequest(key=b"big").SerializeToString()
        msg = b"\x00" + struct.pack(">I", len(body)) + body
        head = _grpc_head(b"/etcdserverpb.KV/Range")
        for i in range(1000):
            sid = 1 + 2 * i
            s.sendall(_h2_frame(1, 4, sid, head) + _h2_frame(0, 1, sid, msg))

        def codes():
            text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % m.http_port,
                                          timeout=5).read().decode()
            return {(k, c): int(v) for k, c, v in re.findall(
                r'mooncake_rpc_server_calls_total\{server="meta-client",'
                r'method="(/etcdserverpb.KV/Range|unknown)",code="(\w+)"\} (\d+)', text)}

        def refused():
            got = codes()
            return sum(v for (k, c), v in got.items() if c == "RESOURCE_EXHAUSTED") >= 900
        try:
            mctest.wait_for(refused, timeout=60, what="900 Ranges refused")
        except AssertionError:
            print("calls by method and status:", codes())
            raise
        if not mctest.sanitized():
            grew = mctest.proc_mib(m.daemon.pid) - rss0
            assert grew < 200, "the member grew %.0f MiB" % grew
        eq(cl.get(b"big"), big, "another client's Range")
        s.close()


@case
def connections_past_the_bound_are_closed():
    """Each connection counts some 66 KiB in --rpc-max-call-memory (its
    nghttp2 session), each stream a little more: a client that opens
    connections without number meets the bound, and the new ones are
    closed at once with one log line; once they go, the member serves."""
    with _one_member(b"cn/k", args=["--rpc-max-message-size=4M",
                                     "--rpc-max-call-memory=16M"]) as (m, cl):
        socks = []
        for _ in range(400):
            socks.append(_h2_open(m.client_port))
        mctest.wait_for(lambda: "closing new connections" in m.output(), what="the log line")
        closed = 0
        for s in socks:
            s.settimeout(0.5)
            try:
                while True:
                    d = s.recv(65536)
                    if not d:
                        closed += 1
                        break
                    s.settimeout(0.01)  # (its SETTINGS: it stays open)
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed += 1
            s.close()
        assert 100 <= closed < 400, "%d of 400 connections closed" % closed
        mctest.wait_for(lambda: cl.put(b"cn/k", b"w") is not None, timeout=20,
                        what="a put once they are gone")
        eq(cl.get(b"cn/k"), b"w", "its value")


@case
def one_snapshot_is_received_at_a_time():
    """InstallSnapshot (the peer port) gathers a snapshot in the member's
    memory, up to 2 x --quota-backend-bytes + 64 MiB a stream. While one
    is being received another is refused UNAVAILABLE, so streams without
    number cannot each take that much; once it ends the next is taken."""
    import raft_pb2
    with _one_member(b"sn/k") as (m, cl):
        cid = cl.range(b"sn/k").header.cluster_id
        ch = mctest.token_channel("127.0.0.1:%d" % m.peer_port)
        install = ch.stream_unary("/mooncake.raft.Raft/InstallSnapshot",
                                  request_serializer=raft_pb2.SnapshotChunk.SerializeToString,
                                  response_deserializer=raft_pb2.SnapshotResult.FromString)
        first = raft_pb2.SnapshotChunk(
            cluster_id=cid, msg=raft_pb2.Message(type=9, snapshot=raft_pb2.SnapshotMeta(
                index=1000, term=1)), data=b"x" * (1 << 20), total_bytes=64 << 20)
        gate = threading.Event()

        def held():
            yield first
            gate.wait(30)
        f1 = install.future(held(), timeout=60)
        mctest.wait_for(lambda: "receiving a snapshot at index 1000" in m.output(),
                        what="the first reception")

        def code_of(chunks):
            try:
                install(iter(chunks), timeout=10)
                return "OK"
            except grpc.RpcError as e:
                return e.code().name, e.details()
        eq(code_of([first]), ("UNAVAILABLE", "busy receiving another snapshot"),
           "a second reception")
        gate.set()
        try:
            f1.result()
        except grpc.RpcError as e:
            eq(e.code().name, "INVALID_ARGUMENT", "the first, ended early")
        eq(code_of([first]), ("INVALID_ARGUMENT", "snapshot stream ended early"),
           "the next one, taken (and ended early)")
        eq(cl.get(b"sn/k"), b"v", "the member serves on")
        ch.close()


mctest.main()
