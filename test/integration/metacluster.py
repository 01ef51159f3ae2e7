"""Helpers for the meta role's integration tests: clusters of mooncaked
--role=meta members on loopback, an etcd v3 client over Python grpcio
(the generated etcd_rpc_pb2), etcdctl, and a load generator that records
every client's history for linearizability.py.

Members use ephemeral ports, temporary data directories and short Raft
timeouts (flags), and are killed by PID.
"""
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import mctest
from mctest import Daemon, free_port, wait_port

import grpc
import etcd_rpc_pb2 as pb
import etcd_kv_pb2 as kvpb  # noqa: F401  (imported for its message classes)

ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"
HEARTBEAT_MS = 50
ELECTION_MS = 500
FAST = ["--heartbeat-interval=%dms" % HEARTBEAT_MS, "--election-timeout=%dms" % ELECTION_MS]


def deadline_loop(timeout, what, step=0.05):
    """Yield until the timeout passes, then raise AssertionError(what)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        yield
        time.sleep(step)
    raise AssertionError("timed out after %.1fs: %s" % (timeout, what))


# ------------------------------------------------------------ etcdctl

def etcdctl(endpoints, *args, check=True, timeout=30, stdin=None, user=None):
    """etcdctl against members started with the tests' cluster secret (user
    root, mctest.etcd_user) or the user given ([]: none)."""
    env = dict(os.environ, ETCDCTL_API="3")
    user = mctest.etcd_user() if user is None else user
    cmd = [ETCDCTL, "--endpoints=" + endpoints, "--command-timeout=10s"] + user + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=stdin,
                       env=env)
    if check and r.returncode != 0:
        raise AssertionError("%s exited %d\nstdout:\n%s\nstderr:\n%s"
                             % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
    return r


# ------------------------------------------------------------ grpcio client

class Requests:
    """A request stream for a bidirectional call: put() messages into it,
    close() ends it (the client half-closes)."""

    def __init__(self, *first):
        import queue
        self.q = queue.Queue()
        for m in first:
            self.q.put(m)

    def put(self, m):
        self.q.put(m)

    def close(self):
        self.q.put(None)

    def __iter__(self):
        while True:
            m = self.q.get()
            if m is None:
                return
            yield m


class Client:
    """A blocking etcd v3 client on one endpoint (host:port)."""

    def __init__(self, addr, timeout=5.0):
        self.addr = addr
        self.timeout = timeout
        self.ch = mctest.token_channel(addr)  # the members want the tests' secret
        u = self.ch.unary_unary

        def stub(svc, method, req, resp):
            return u("/etcdserverpb.%s/%s" % (svc, method),
                     request_serializer=req.SerializeToString,
                     response_deserializer=resp.FromString)
        self.range_ = stub("KV", "Range", pb.RangeRequest, pb.RangeResponse)
        self.put_ = stub("KV", "Put", pb.PutRequest, pb.PutResponse)
        self.delete_ = stub("KV", "DeleteRange", pb.DeleteRangeRequest, pb.DeleteRangeResponse)
        self.txn_ = stub("KV", "Txn", pb.TxnRequest, pb.TxnResponse)
        self.compact_ = stub("KV", "Compact", pb.CompactionRequest, pb.CompactionResponse)
        self.grant_ = stub("Lease", "LeaseGrant", pb.LeaseGrantRequest, pb.LeaseGrantResponse)
        self.revoke_ = stub("Lease", "LeaseRevoke", pb.LeaseRevokeRequest, pb.LeaseRevokeResponse)
        self.ttl_ = stub("Lease", "LeaseTimeToLive", pb.LeaseTimeToLiveRequest,
                         pb.LeaseTimeToLiveResponse)
        self.status_ = stub("Maintenance", "Status", pb.StatusRequest, pb.StatusResponse)
        self.alarm_ = stub("Maintenance", "Alarm", pb.AlarmRequest, pb.AlarmResponse)
        self.members_ = stub("Cluster", "MemberList", pb.MemberListRequest, pb.MemberListResponse)
        self.keepalive_ = self.ch.stream_stream(
            "/etcdserverpb.Lease/LeaseKeepAlive",
            request_serializer=pb.LeaseKeepAliveRequest.SerializeToString,
            response_deserializer=pb.LeaseKeepAliveResponse.FromString)
        self.watch_ = self.ch.stream_stream(
            "/etcdserverpb.Watch/Watch",
            request_serializer=pb.WatchRequest.SerializeToString,
            response_deserializer=pb.WatchResponse.FromString)

    def close(self):
        self.ch.close()

    def get(self, key, **kw):
        r = self.range_(pb.RangeRequest(key=key, **kw), timeout=self.timeout)
        return r.kvs[0].value if r.kvs else None

    def range(self, key, **kw):
        return self.range_(pb.RangeRequest(key=key, **kw), timeout=self.timeout)

    def put(self, key, value, **kw):
        return self.put_(pb.PutRequest(key=key, value=value, **kw), timeout=self.timeout)

    def delete(self, key, **kw):
        return self.delete_(pb.DeleteRangeRequest(key=key, **kw), timeout=self.timeout)

    def cas(self, key, old, new):
        """Put new if the value is old (old None: the key is absent)."""
        if old is None:
            cmp = pb.Compare(key=key, target=pb.Compare.VERSION, result=pb.Compare.EQUAL,
                             version=0)
        else:
            cmp = pb.Compare(key=key, target=pb.Compare.VALUE, result=pb.Compare.EQUAL,
                             value=old)
        op = pb.RequestOp(request_put=pb.PutRequest(key=key, value=new))
        r = self.txn_(pb.TxnRequest(compare=[cmp], success=[op]), timeout=self.timeout)
        return r.succeeded

    def status(self):
        return self.status_(pb.StatusRequest(), timeout=self.timeout)


# ------------------------------------------------------------ clusters

class Member:
    def __init__(self, cluster, name):
        self.cluster = cluster
        self.name = name
        self.client_port = free_port()
        self.peer_port = free_port()
        self.http_port = free_port()
        self.data_dir = os.path.join(cluster.tmp.name, name)
        self.proxy = None  # a faultproxy.Proxy in front of the peer port
        self.daemon = None

    @property
    def peer_addr(self):
        port = self.proxy.port if self.proxy else self.peer_port
        return "127.0.0.1:%d" % port

    @property
    def client_addr(self):
        return "127.0.0.1:%d" % self.client_port

    @property
    def endpoint(self):
        return "http://" + self.client_addr

    def start(self, state="new", extra=()):
        args = ["--name=" + self.name, "--initial-cluster=" + self.cluster.initial,
                "--initial-cluster-state=" + state] + self.cluster.args + list(extra)
        if self.proxy:
            args.append("--advertise-peer=" + self.peer_addr)
        ports = {"listen-client": self.client_port, "listen-peer": self.peer_port,
                 "meta-http": self.http_port}
        self.daemon = Daemon("meta", args=args, data_dir=self.data_dir, ports=ports,
                             wait=False)
        try:
            for p in ports.values():
                wait_port(p, proc=self.daemon.proc)
        except AssertionError as e:
            raise AssertionError("%s: %s\n%s" % (self.name, e, self.daemon.output()[-3000:]))
        return self

    def kill(self):
        if self.daemon:
            self.daemon.kill()

    def stop(self):
        return self.daemon.stop() if self.daemon else None

    def alive(self):
        return self.daemon is not None and self.daemon.proc.poll() is None

    def output(self):
        return self.daemon.output() if self.daemon else ""

    def status(self, timeout=2.0):
        c = Client(self.client_addr, timeout=timeout)
        try:
            return c.status()
        finally:
            c.close()


class Cluster:
    def __init__(self, n, args=(), proxies=False):
        self.tmp = tempfile.TemporaryDirectory(prefix="mooncaked-meta-")
        self.args = FAST + list(args)
        self.members = [Member(self, "m%d" % i) for i in range(n)]
        if proxies:
            import faultproxy
            for m in self.members:
                m.proxy = faultproxy.Proxy(m.peer_port)
        self.initial = ",".join("%s=%s" % (m.name, m.peer_addr) for m in self.members)

    def start(self):
        for m in self.members:
            m.start()
        self.wait_leader()
        return self

    @property
    def endpoints(self):
        return ",".join(m.endpoint for m in self.members if m.alive())

    def leader(self, members=None, timeout=10.0):
        """The member every live member agrees leads (and its term)."""
        members = [m for m in (members or self.members) if m.alive()]
        for _ in deadline_loop(timeout, "no agreed leader among %s"
                               % [m.name for m in members]):
            seen = set()
            try:
                for m in members:
                    seen.add(m.status(timeout=1.0).leader)
            except grpc.RpcError:
                continue
            if len(seen) == 1 and 0 not in seen:
                lid = seen.pop()
                for m in members:
                    if m.status().header.member_id == lid:
                        return m
        return None

    def wait_leader(self, members=None, timeout=10.0):
        return self.leader(members, timeout)

    def wait_applied(self, m, index, timeout=20.0):
        for _ in deadline_loop(timeout, "%s did not apply index %d" % (m.name, index)):
            try:
                if m.status().raftAppliedIndex >= index:
                    return
            except grpc.RpcError:
                pass

    def close(self):
        """Stop every live member with SIGTERM (the graceful path, and the
        sanitizers' exit checks), then the proxies."""
        try:
            for m in self.members:
                if m.alive():
                    m.stop()
        finally:
            for m in self.members:
                m.kill()
                if m.proxy:
                    m.proxy.close()
            self.tmp.cleanup()


# ------------------------------------------------------------ load with history

class Load:
    """Client threads doing put/get/cas on a few keys through every live
    endpoint, recording each op for linearizability.check. An op that
    fails without a definite answer is recorded with an unknown outcome."""

    def __init__(self, cluster, keys=("a", "b", "c"), clients=4, seed=1):
        from linearizability import Recorder
        self.cluster = cluster
        self.keys = [k.encode() for k in keys]
        self.rec = Recorder(time.monotonic)
        self.stop_ev = threading.Event()
        self.threads = []
        self.acked_puts = 0
        self.errors = 0
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.nclients = clients

    def _run(self, cid, seed):
        rng = random.Random(seed)
        seq = 0
        members = list(self.cluster.members)
        m = members[cid % len(members)]
        c = Client(m.client_addr, timeout=2.0)
        while not self.stop_ev.is_set():
            if not m.alive():
                c.close()
                live = [x for x in members if x.alive()]
                if not live:
                    time.sleep(0.05)
                    continue
                m = rng.choice(live)
                c = Client(m.client_addr, timeout=2.0)
            key = rng.choice(self.keys)
            kind = rng.choice(["put", "put", "get", "get", "cas"])
            seq += 1
            val = ("c%d-%d" % (cid, seq)).encode()
            t0 = None if kind == "cas" else self.rec.call()
            old = None
            try:
                if kind == "cas":
                    old = c.get(key)  # a read first; only the txn is recorded
                    t0 = self.rec.call()
                if kind == "put":
                    c.put(key, val)
                    self.rec.done(cid, "put", key, val, t0, None)
                    with self.lock:
                        self.acked_puts += 1
                elif kind == "get":
                    v = c.get(key)
                    self.rec.done(cid, "get", key, None, t0, v)
                else:
                    ok = c.cas(key, old, val)
                    self.rec.done(cid, "cas", key, (old, val), t0, ok)
            except grpc.RpcError:
                with self.lock:
                    self.errors += 1
                if kind == "get" or (kind == "cas" and t0 is None):
                    pass  # an unanswered read constrains nothing
                elif kind == "put":
                    self.rec.done(cid, "put", key, val, t0, None, unknown=True)
                else:
                    self.rec.done(cid, "cas", key, (old, val), t0, None, unknown=True)
                # Move on to another member after a failure.
                live = [x for x in members if x.alive()]
                if live:
                    c.close()
                    m = rng.choice(live)
                    c = Client(m.client_addr, timeout=2.0)
                time.sleep(0.02)
        c.close()

    def start(self):
        for i in range(self.nclients):
            t = threading.Thread(target=self._run, args=(i, self.rng.randrange(1 << 30)),
                                 daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(30)

    def wait_progress(self, n, timeout=20.0):
        """Wait until n more puts were acknowledged (from now): the load
        goes on with the cluster as it is."""
        with self.lock:
            want = self.acked_puts + n
        for _ in deadline_loop(timeout, "the load got no %d more puts acknowledged" % n):
            with self.lock:
                if self.acked_puts >= want:
                    return

    def final_reads(self, member):
        """A last linearizable read of every key, appended to the history."""
        c = Client(member.client_addr, timeout=5.0)
        try:
            for k in self.keys:
                t0 = self.rec.call()
                v = c.get(k)
                self.rec.done(99, "get", k, None, t0, v)
        finally:
            c.close()

    def check_catches_a_lost_write(self):
        """The checker is not blind: make the final read of a key return a
        value some acknowledged put overwrote before that read began (a
        lost write) and expect a failure."""
        import collections
        from linearizability import Op, check_key
        ops = self.rec.ops
        for fin in [o for o in ops if o.client == 99 and o.result is not None]:
            puts = [o for o in ops if o.key == fin.key and o.kind == "put" and
                    o.ret is not None and o.arg != fin.result and o.ret < fin.call]
            if not puts:
                continue
            stale = puts[0]
            later = [o for o in ops if o.key == fin.key and o.kind == "put" and
                     o.ret is not None and o.call > stale.ret and o.ret < fin.call and
                     o.arg != stale.arg]
            if not later:
                continue
            bad = [o for o in ops if o.key == fin.key and o is not fin]
            bad.append(Op(fin.client, fin.kind, fin.key, fin.arg, fin.call, fin.ret,
                          stale.arg))
            ok, info = check_key(bad)
            if ok:
                raise AssertionError("the checker accepted a lost write on %r" % fin.key)
            return
        raise AssertionError("no key with an overwritten acknowledged put to test with")

    def check(self):
        """Check every key's history; an inconclusive search fails too."""
        import collections
        from linearizability import check_key
        by_key = collections.defaultdict(list)
        for o in self.rec.ops:
            by_key[o.key].append(o)
        for key, ops in sorted(by_key.items()):
            ok, info = check_key(ops)
            if not ok or info:
                raise AssertionError("history of key %r (%d ops) is not linearizable: %s"
                                     % (key, len(ops), info))
        return len(self.rec.ops)


def wait_for(pred, timeout, what):
    for _ in deadline_loop(timeout, what):
        if pred():
            return
