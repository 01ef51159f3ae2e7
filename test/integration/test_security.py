"""Authentication of the transfer engine, tried as an intruder would, on a
default standalone daemon (nothing configured: the agent makes its secret
in its data directory):

- the secret file: created once, 0600, never overwritten; an agent that
  listens on a non-loopback address refuses to start without a configured
  secret, and --insecure-transfer says so at every start;
- the data port (tcp) and the shm channel refuse a peer without the
  secret, with a wrong one, and a replayed handshake (the real handshake
  written here from wire.h, checked first with the right secret), and
  serve nothing before it; each refusal is counted in
  mooncake_te_auth_refused_total;
- GetDescriptor refuses a call without a proof, with a wrong or a replayed
  one;
- a master with the secret refuses calls without a token of it, with
  another secret's, a stale or a replayed one;
- a meta member with the secret refuses peer calls (Raft, Forward,
  Members) without a token of it, and members with it form a cluster;
  a member whose peer port is public needs a configured secret;
- a second local user (made here with useradd; skipped when not root)
  reads neither the secret nor the segment: every way in is refused and
  a stored object keeps its bytes.
"""
import json
import os
import pwd
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

import mctest
from mctest import case, Daemon, eq, run, wait_for

import grpc  # noqa: E402  (after mctest put build/py on sys.path)
import health_pb2  # noqa: E402
from teauth import (CHALLENGE, EACCES, HS_BYTES, RESULT, WIRE_MAGIC,  # noqa: E402
                    WIRE_RESP, challenge, desc_mac, get_descriptor, hs_parse, read_header,
                    refused, shm_peer, tcp_peer)

NO_SHARED = {"MOONCAKE_CLUSTER_SECRET_FILE": None}

# ------------------------------------------------------------ the daemon


def standalone(args=()):
    d = Daemon("standalone", args=list(args), env=NO_SHARED)
    wait_for(lambda: "mounted with master" in d.output(), what="segment mounted")
    return d


def secret_of(d):
    with open(os.path.join(d.data_dir, "cluster.secret"), "rb") as f:
        return f.read().rstrip(b"\n")


def auth_refused(d, transport):
    with urllib.request.urlopen("http://%s/metrics" % d.addr("agent-http"), timeout=5) as r:
        text = r.read().decode()
    want = 'mooncake_te_auth_refused_total{transport="%s"} ' % transport
    for line in text.splitlines():
        if line.startswith(want):
            return int(float(line.split()[-1]))
    raise AssertionError("no %s in /metrics" % want)


def descriptor(d):
    """The agent's descriptor, fetched with the right proof."""
    secret, addr = secret_of(d), d.addr("agent-listen")
    nonce = challenge(addr)
    return get_descriptor(addr, addr, nonce, desc_mac(secret, nonce, addr))


@case
def the_secret_is_made_once_and_kept():
    d = standalone()
    path = os.path.join(d.data_dir, "cluster.secret")
    st = os.stat(path)
    eq(oct(st.st_mode & 0o777), "0o600", "mode")
    first = secret_of(d)
    eq(len(first), 64, "64 hex digits")
    int(first, 16)
    assert "cluster secret %s (created now)" % path in d.output(), d.output()
    eq(d.stop(), 0, "exit")
    again = Daemon("standalone", data_dir=d.data_dir, env=NO_SHARED)
    wait_for(lambda: "mounted with master" in again.output(), what="segment mounted")
    eq(secret_of(again), first, "the same secret after a restart")
    out = again.output()
    assert "cluster secret %s\n" % path in out or "cluster secret %s " % path in out, out
    assert "(created now)" not in out, out
    eq(again.stop(), 0, "exit")
    # The operator's command never replaces a file either.
    r = run([mctest.MOONCAKECTL, "secret", "create", path], check=False)
    eq(r.returncode, 1, "exit status over an existing file")
    assert "exists" in r.stderr, r.stderr
    with open(path, "rb") as f:
        eq(f.read().rstrip(b"\n"), first, "untouched")
    with tempfile.TemporaryDirectory() as tmp:
        made = os.path.join(tmp, "s")
        run([mctest.MOONCAKECTL, "secret", "create", made])
        eq(oct(os.stat(made).st_mode & 0o777), "0o600", "mode of a created one")
        eq(sorted(os.listdir(tmp)), ["s"], "no temporary file left")


@case
def a_public_listener_needs_a_configured_secret():
    d = Daemon("agent", args=["--agent-listen=0.0.0.0:%d" % mctest.free_port(),
                              "--meta-endpoints=", "--master-address=127.0.0.1:1"],
               env=NO_SHARED, wait=False)
    eq(d.proc.wait(30), 1, "exit status")
    out = d.output()
    assert "other than loopback" in out and "--insecure-transfer" in out, out
    assert not os.path.exists(os.path.join(d.data_dir, "cluster.secret")), "none made"
    # Both ways out: --insecure-transfer (a warning at every start) ...
    port = mctest.free_port()
    d = Daemon("agent", args=["--agent-listen=0.0.0.0:%d" % port, "--meta-endpoints=",
                              "--te-data-listen=127.0.0.1:0", "--master-address=127.0.0.1:1",
                              "--insecure-transfer"],
               env=NO_SHARED, wait=False)
    wait_for(lambda: "INSECURE: peers are not authenticated" in d.output(),
             what="the engine started")
    assert "does NOT authenticate" in d.output(), d.output()
    eq(d.stop(), 0, "exit:\n" + d.output()[-3000:])
    # ... and never together with a secret file.
    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "s")
        run([mctest.MOONCAKECTL, "secret", "create", f])
        d = Daemon("agent", args=["--insecure-transfer", "--cluster-secret-file=" + f,
                                  "--meta-endpoints=", "--master-address=127.0.0.1:1"],
                   env=NO_SHARED, wait=False)
        eq(d.proc.wait(30), 1, "exit status")
        assert "contradict" in d.output(), d.output()
        # A configured file that is missing is named.
        d = Daemon("agent", args=["--cluster-secret-file=" + f + ".missing",
                                  "--meta-endpoints=", "--master-address=127.0.0.1:1"],
                   env=NO_SHARED, wait=False)
        eq(d.proc.wait(30), 1, "exit status")
        assert "mooncakectl secret create" in d.output(), d.output()


def check_refusals(d, make_peer, transport, target):
    """No secret, a wrong one, a replay: refused, closed, counted; the
    right one (the control) is accepted."""
    secret = secret_of(d)
    base = auth_refused(d, transport)

    good = make_peer()
    eq(good.handshake(target, secret), 0, "the right secret is accepted")
    recorded = list(good.sent)
    good.close()

    p = make_peer()
    eq(p.handshake(target, None), EACCES, "no secret")
    assert p.closed(), "closed after refusing"
    p.close()
    p = make_peer()
    eq(p.handshake(target, b"0" * 64), EACCES, "a wrong secret")
    assert p.closed(), "closed after refusing"
    p.close()
    # A peer that claims a secret and answers the challenge with garbage.
    p = make_peer()
    eq(p.handshake(target, None, claim=True), EACCES, "a guessed answer")
    p.close()

    # Replay: the recorded HELLO gets a new challenge, the recorded AUTH
    # answers the old one.
    p = make_peer()
    p.send(recorded[0])
    kind, _, _, _ = hs_parse(p.recv())
    eq(kind, CHALLENGE, "a fresh challenge")
    p.send(recorded[1])
    kind, status, _, _ = hs_parse(p.recv())
    eq((kind, status), (RESULT, EACCES), "the replayed answer")
    assert p.closed(), "closed after refusing"
    p.close()
    wait_for(lambda: auth_refused(d, transport) >= base + 4,
             what="%s refusals counted (%d before)" % (transport, base))


@case
def tcp_and_shm_refuse_peers_without_the_secret():
    d = standalone()
    desc = descriptor(d)
    target = desc.name.encode()
    region = desc.regions[0]

    check_refusals(d, lambda: tcp_peer(desc.data_port), "tcp", target)
    # Nothing is served before the handshake: a READ header instead of a
    # HELLO closes the connection without a byte of memory.
    p = tcp_peer(desc.data_port)
    p.s.sendall(read_header(region.addr, 4096).ljust(HS_BYTES, b"\0"))
    eq(p.drain(), b"", "nothing answered")
    p.close()
    # The control: after the right handshake the same READ is served.
    p = tcp_peer(desc.data_port)
    eq(p.handshake(target, secret_of(d)), 0, "accepted")
    p.s.sendall(read_header(region.addr, 4096))
    hdr = b""
    while len(hdr) < 32:
        hdr += p.s.recv(32 - len(hdr))
    magic, typ, _, _, status, length, _, _ = struct.unpack("<IBBHiIQQ", hdr)
    eq((magic, typ, status, length), (WIRE_MAGIC, WIRE_RESP, 0, 4096), "served")
    p.close()

    assert "shm" in desc.transports, desc.transports
    check_refusals(d, lambda: shm_peer(desc.shm_socket), "shm", target)
    assert "cluster secret mismatch" in d.output(), d.output()
    eq(d.stop(), 0, "exit")


def te_metric(d, name):
    with urllib.request.urlopen("http://%s/metrics" % d.addr("agent-http"), timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return int(float(line.split()[-1]))
    raise AssertionError("no %s in /metrics" % name)


@case
def connections_without_the_secret_are_bounded():
    """The data port and the shm socket each hold at most 256 connections
    that have not finished their handshake: the next is closed as soon as
    it is accepted (counted and logged), and each of them is closed
    --te-io-timeout after it was accepted; then a peer with the secret
    gets in and is served."""
    d = standalone(["--te-io-timeout=3s"])
    desc = descriptor(d)
    target, region = desc.name.encode(), desc.regions[0]
    for transport, peer in (("tcp", lambda: tcp_peer(desc.data_port)),
                            ("shm", lambda: shm_peer(desc.shm_socket))):
        silent = [peer() for _ in range(256)]
        try:
            extra = peer()
            extra.s.settimeout(2)
            eq(extra.s.recv(1), b"", transport + ": a connection past the bound closed at once")
            extra.close()
            name = 'mooncake_te_connections_refused_total{transport="%s"}' % transport
            assert te_metric(d, name) >= 1, name
            for p in silent:
                p.s.settimeout(15)
                eq(p.s.recv(1), b"", transport + ": closed after --te-io-timeout")
        finally:
            for p in silent:
                p.close()
    assert "connections in their handshake, the most it holds" in d.output()

    def served():
        p = tcp_peer(desc.data_port)
        try:
            if p.handshake(target, secret_of(d)) != 0:
                return None
            p.s.sendall(read_header(region.addr, 4096))
            hdr = b""
            while len(hdr) < 32:
                hdr += p.s.recv(32 - len(hdr))
            return struct.unpack("<IBBHiIQQ", hdr)[4] == 0
        finally:
            p.close()
    wait_for(served, 5, "a peer with the secret served")
    eq(d.stop(), 0, "exit")


@case
def get_descriptor_wants_a_fresh_proof():
    d = standalone()
    addr, secret = d.addr("agent-listen"), secret_of(d)
    base = auth_refused(d, "grpc")
    code, why = refused(lambda: get_descriptor(addr))
    eq(code, grpc.StatusCode.UNAUTHENTICATED, "without a proof: " + why)
    nonce = challenge(addr)
    code, _ = refused(lambda: get_descriptor(addr, "", nonce, desc_mac(b"0" * 64, nonce, "")))
    eq(code, grpc.StatusCode.UNAUTHENTICATED, "a wrong secret")
    code, _ = refused(lambda: get_descriptor(addr, "", os.urandom(40), desc_mac(secret, nonce, "")))
    eq(code, grpc.StatusCode.UNAUTHENTICATED, "a nonce not issued here")
    nonce = challenge(addr)
    mac = desc_mac(secret, nonce, addr)
    code, _ = refused(lambda: get_descriptor(addr, "", nonce, mac))
    eq(code, grpc.StatusCode.UNAUTHENTICATED, "a proof made for another name")
    desc = get_descriptor(addr, addr, nonce, mac)
    eq(desc.name, addr, "the right proof")
    code, why = refused(lambda: get_descriptor(addr, addr, nonce, mac))
    eq(code, grpc.StatusCode.UNAUTHENTICATED, "the same proof again")
    assert "replayed" in why, why
    eq(auth_refused(d, "grpc"), base + 5, "refusals counted")
    assert "refused GetDescriptor from" in d.output(), d.output()
    eq(d.stop(), 0, "exit")


INTRUDER = r'''
import json, sys
sys.path[:0] = sys.argv[2:]
import grpc
from teauth import *
cfg = json.load(open(sys.argv[1]))
out = {}
try:
    open(cfg["secret"], "rb").read()
    out["secret"] = "read"
except PermissionError:
    out["secret"] = "denied"
target = cfg["name"].encode()
for secret in (None, b"0" * 64):
    out["tcp %s" % bool(secret)] = tcp_peer(cfg["data_port"]).handshake(target, secret)
    out["shm %s" % bool(secret)] = shm_peer(cfg["shm"]).handshake(target, secret)
p = tcp_peer(cfg["data_port"])
p.s.sendall(read_header(cfg["addr"], 4096).ljust(HS_BYTES, b"\0"))
out["raw read bytes"] = len(p.drain())
code = refused(lambda: get_descriptor(cfg["rpc"]))
out["descriptor"] = code[0].name if code else "given"
print(json.dumps(out))
'''


@case
def the_masters_api_wants_the_secret():
    """A master started with --cluster-secret-file (here the tests' shared
    one) serves only connections that prove it: a call without a token,
    with another secret's, a stale or a replayed one is refused
    UNAUTHENTICATED and counted; a health check needs none; an agent and
    mooncakectl with the secret are served, mooncakectl without it is told
    why. A master on a non-loopback address without a secret does not
    start."""
    import master_pb2 as M
    m = Daemon("master", args=["--meta-endpoints="])
    addr = m.addr("master-listen")

    def stats(ch):
        f = ch.unary_unary("/mooncake.master.Master/Stats",
                           request_serializer=M.StatsRequest.SerializeToString,
                           response_deserializer=M.StatsResponse.FromString)
        return f(M.StatsRequest(), timeout=10)

    def refused(ch, why):
        try:
            stats(ch)
        except grpc.RpcError as e:
            eq(e.code(), grpc.StatusCode.UNAUTHENTICATED, why)
            assert "cluster secret" in e.details(), e.details()
            return
        raise AssertionError("served: " + why)

    with grpc.insecure_channel(addr) as ch:
        refused(ch, "no token")
        refused(ch, "still none on the same connection")
    with tempfile.TemporaryDirectory() as tmp:
        other = os.path.join(tmp, "other")
        run([mctest.MOONCAKECTL, "secret", "create", other])
        with mctest.token_channel(addr, token=mctest.rpc_token(other)) as ch:
            refused(ch, "another secret's token")
    with mctest.token_channel(addr, token=mctest.rpc_token(ts_ms_offset=-600000)) as ch:
        refused(ch, "a token ten minutes old")
    tok = mctest.rpc_token()
    with mctest.token_channel(addr, token=tok) as ch:
        eq(stats(ch).view, 1, "a fresh token: served")
        eq(stats(ch).view, 1, "and the connection's later calls")
    with mctest.token_channel(addr, token=tok) as ch:
        refused(ch, "the same token on another connection (replayed)")
    with grpc.insecure_channel(addr) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                               response_deserializer=health_pb2.HealthCheckResponse.FromString)
        eq(check(health_pb2.HealthCheckRequest(), timeout=5).status,
           health_pb2.HealthCheckResponse.SERVING, "a health check needs no token")
    with urllib.request.urlopen("http://%s/metrics" % m.addr("master-http"), timeout=5) as r:
        text = r.read().decode()
    line = [x for x in text.splitlines()
            if x.startswith('mooncake_rpc_server_unauthenticated_total{server="master"} ')]
    eq(len(line) == 1 and int(float(line[0].split()[-1])) >= 5, True, "counted: %s" % line)
    assert "no mooncake-auth token" in m.output(), m.output()[-2000:]
    a = Daemon("agent", args=["--meta-endpoints=", "--master-address=" + addr])
    wait_for(lambda: "mounted with master" in a.output(), what="an agent with the secret mounts")
    r = run([mctest.MOONCAKECTL, "stats", "--master=" + addr])
    assert "agents 1" in r.stdout, r.stdout
    r = run([mctest.MOONCAKECTL, "stats", "--master=" + addr], check=False,
            env=mctest.child_env(NO_SHARED))
    eq(r.returncode != 0 and "UNAUTHENTICATED" in r.stderr and "--cluster-secret-file" in r.stderr,
       True, "mooncakectl without the secret: " + r.stderr)
    eq(a.stop(), 0, "agent exit")
    eq(m.stop(), 0, "master exit")
    d = Daemon("master", args=["--meta-endpoints=", "--master-listen=0.0.0.0:%d" % mctest.free_port()],
               env=NO_SHARED, wait=False)
    eq(d.proc.wait(30), 1, "a public master without a secret: exit status")
    assert "without a cluster secret" in d.output() and "--insecure-transfer" in d.output(), \
        d.output()


def unauthenticated(d, http_key, server):
    with urllib.request.urlopen("http://%s/metrics" % d.addr(http_key), timeout=5) as r:
        text = r.read().decode()
    want = 'mooncake_rpc_server_unauthenticated_total{server="%s"} ' % server
    line = [x for x in text.splitlines() if x.startswith(want)]
    return int(float(line[0].split()[-1])) if line else None


@case
def a_meta_members_peer_port_wants_the_secret():
    """Whoever reached a member's peer port could forward writes to the
    leader or append to the log: with a secret it serves only members that
    prove it."""
    import meta_pb2
    m = Daemon("meta", args=["--name=m0"])
    peer = m.addr("listen-peer")
    with grpc.insecure_channel(peer) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                               response_deserializer=health_pb2.HealthCheckResponse.FromString)
        wait_for(lambda: check(health_pb2.HealthCheckRequest(service="mooncake.raft.Raft"),
                               timeout=5).status == health_pb2.HealthCheckResponse.SERVING,
                 what="the peer port serving, its health checked without a token")

    def members(ch):
        call = ch.unary_unary("/mooncake.raft.Raft/Members",
                              request_serializer=meta_pb2.MembersRequest.SerializeToString,
                              response_deserializer=meta_pb2.MembersResponse.FromString)
        try:
            return [x.name for x in call(meta_pb2.MembersRequest(), timeout=5).members]
        except grpc.RpcError as e:
            return e.code().name, e.details()

    with grpc.insecure_channel(peer) as ch:
        code, why = members(ch)
        eq(code, "UNAUTHENTICATED", "Members without a token: " + why)
        fwd = ch.unary_unary("/mooncake.raft.Raft/Forward",
                             request_serializer=meta_pb2.ForwardRequest.SerializeToString,
                             response_deserializer=meta_pb2.ForwardResponse.FromString)
        try:
            fwd(meta_pb2.ForwardRequest(), timeout=5)
            raise AssertionError("Forward without a token was served")
        except grpc.RpcError as e:
            eq(e.code().name, "UNAUTHENTICATED", "Forward without a token")
    other = os.path.join(m.data_dir, "other.secret")
    run([mctest.MOONCAKECTL, "secret", "create", other])
    with mctest.token_channel(peer, token=mctest.rpc_token(other)) as ch:
        eq(members(ch)[0], "UNAUTHENTICATED", "another secret's token")
    with mctest.token_channel(peer) as ch:
        eq(members(ch), ["m0"], "Members with a token")
    eq(unauthenticated(m, "meta-http", "meta-peer") >= 3, True, "refusals counted")
    eq(m.stop(), 0, "member exit")

    # Two members with the secret form a cluster and replicate; a third
    # without it cannot join: the others refuse it.
    ports = [(mctest.free_port(), mctest.free_port()) for _ in range(3)]
    cluster = ",".join("n%d=http://127.0.0.1:%d" % (i, p) for i, (p, _) in enumerate(ports[:2]))

    def member(i, env=None, extra=()):
        return Daemon("meta", env=env, wait=False,
                      ports={"listen-peer": ports[i][0], "listen-client": ports[i][1]},
                      args=["--name=n%d" % i, "--initial-cluster=" + cluster] + list(extra))
    a, b = member(0), member(1)
    ep = "127.0.0.1:%d" % ports[0][1]

    def put_ok():
        r = run(["etcdctl", "--endpoints=" + ep] + mctest.etcd_user() + ["put", "sec/k", "v"],
                check=False)
        return r.returncode == 0
    wait_for(put_ok, timeout=30, what="a put to the two members")
    r = run(["etcdctl", "--endpoints=127.0.0.1:%d" % ports[1][1]] + mctest.etcd_user() +
            ["get", "sec/k", "--print-value-only"])
    eq(r.stdout.strip(), "v", "the value on the second member")
    before = [unauthenticated(x, "meta-http", "meta-peer") for x in (a, b)]
    run(["etcdctl", "--endpoints=" + ep] + mctest.etcd_user() + ["member", "add", "n2",
         "--peer-urls=http://127.0.0.1:%d" % ports[2][0]])
    cluster += ",n2=http://127.0.0.1:%d" % ports[2][0]
    c = member(2, env=NO_SHARED, extra=["--initial-cluster-state=existing"])
    wait_for(lambda: [unauthenticated(x, "meta-http", "meta-peer") for x in (a, b)] != before,
             timeout=30, what="the member without the secret refused")
    wait_for(lambda: "refuses this one" in c.output() and "--cluster-secret-file" in c.output(),
             what="the refusal in its log")
    c.kill()
    eq(a.stop(), 0, "n0 exit")
    eq(b.stop(), 0, "n1 exit")

    d = Daemon("meta", args=["--listen-peer=0.0.0.0:%d" % mctest.free_port()],
               env=NO_SHARED, wait=False)
    eq(d.proc.wait(30), 1, "a public peer port without a secret: exit status")
    assert "without a cluster secret" in d.output() and "--insecure-transfer" in d.output(), \
        d.output()


def etcd_stub(ch, svc, method, req, resp):
    return ch.unary_unary("/etcdserverpb.%s/%s" % (svc, method),
                          request_serializer=req.SerializeToString,
                          response_deserializer=resp.FromString)


def rpc_error(fn, *args, **kw):
    """(code name, details) of a call that must fail."""
    try:
        fn(*args, **kw)
    except grpc.RpcError as e:
        return e.code().name, e.details()
    raise AssertionError("the call was served")


@case
def a_meta_members_etcd_api_wants_the_secret():
    """Whoever reached a member's etcd API could rewrite the master's
    election or the segment descriptors: with a secret it serves only
    callers that prove it — the daemons with a token per connection,
    etcd's clients as user root with the secret as password."""
    import etcd_rpc_pb2 as pb
    m = Daemon("meta", args=["--auth-token-ttl=2s"])
    ep = m.addr("listen-client")
    user = mctest.etcd_user()
    secret = mctest.secret_text()

    def etcdctl(*args, who=()):
        return run(["etcdctl", "--endpoints=" + ep, "--command-timeout=5s"] + list(who) +
                   list(args), check=False)
    wait_for(lambda: etcdctl("put", "a/k", "v", who=user).returncode == 0,
             what="a put as root with the secret")
    # etcdctl without a user, and with another password: refused, saying why
    r = etcdctl("get", "a/k")
    assert r.returncode != 0 and "--user root" in r.stderr, r.stderr
    wrong = secret[:-1] + ("0" if secret[-1] != "0" else "1")
    r = etcdctl("put", "a/k", "x", who=["--user=root:" + wrong])
    assert r.returncode != 0 and "authentication failed" in r.stderr, r.stderr
    r = etcdctl("get", "a/k", who=["--user=admin:" + secret])
    assert r.returncode != 0 and "authentication failed" in r.stderr, r.stderr
    eq(etcdctl("get", "a/k", "--print-value-only", who=user).stdout.strip(), "v",
       "the value was not rewritten")
    eq(unauthenticated(m, "meta-http", "meta-client") >= 1, True, "refusals counted")

    # The calls underneath: Authenticate needs no proof and gives a token
    # that opens any connection until it expires.
    with grpc.insecure_channel(ep) as ch:
        auth = etcd_stub(ch, "Auth", "Authenticate", pb.AuthenticateRequest,
                         pb.AuthenticateResponse)
        put = etcd_stub(ch, "KV", "Put", pb.PutRequest, pb.PutResponse)
        eq(rpc_error(put, pb.PutRequest(key=b"a/k", value=b"y"), timeout=5)[0],
           "UNAUTHENTICATED", "Put without a token")
        eq(rpc_error(auth, pb.AuthenticateRequest(name="root", password="nope"), timeout=5),
           ("INVALID_ARGUMENT", "etcdserver: authentication failed, invalid user ID or "
            "password"), "a wrong password")
        tok = auth(pb.AuthenticateRequest(name="root", password=secret), timeout=5).token
        assert tok.startswith("b1."), tok
        put(pb.PutRequest(key=b"a/k", value=b"y"), metadata=(("token", tok),), timeout=5)
    with grpc.insecure_channel(ep) as ch:
        rng = etcd_stub(ch, "KV", "Range", pb.RangeRequest, pb.RangeResponse)
        bad = tok[:-1] + ("0" if tok[-1] != "0" else "1")
        eq(rpc_error(rng, pb.RangeRequest(key=b"a/k"), metadata=(("token", bad),), timeout=5),
           ("UNAUTHENTICATED", "etcdserver: invalid auth token"), "a forged token")
    with grpc.insecure_channel(ep) as ch:
        rng = etcd_stub(ch, "KV", "Range", pb.RangeRequest, pb.RangeResponse)
        got = rng(pb.RangeRequest(key=b"a/k"), metadata=(("token", tok),), timeout=5)
        eq(got.kvs[0].value, b"y", "the token on a connection of its own")
    time.sleep(2.5)  # --auth-token-ttl=2s
    with grpc.insecure_channel(ep) as ch:
        rng = etcd_stub(ch, "KV", "Range", pb.RangeRequest, pb.RangeResponse)
        eq(rpc_error(rng, pb.RangeRequest(key=b"a/k"), metadata=(("token", tok),), timeout=5),
           ("UNAUTHENTICATED", "etcdserver: invalid auth token"), "an expired token")
    # the daemons' per-connection token
    with mctest.token_channel(ep) as ch:
        rng = etcd_stub(ch, "KV", "Range", pb.RangeRequest, pb.RangeResponse)
        eq(rng(pb.RangeRequest(key=b"a/k"), timeout=5).kvs[0].value, b"y", "a mooncake-auth token")

    # A master with another secret is refused by meta, and says so.
    other = os.path.join(m.data_dir, "other.secret")
    run([mctest.MOONCAKECTL, "secret", "create", other])
    master = Daemon("master", args=["--meta-endpoints=" + ep, "--cluster-secret-file=" + other],
                    env=NO_SHARED, wait=False)
    wait_for(lambda: "refuses this process" in master.output() and
             "another secret" in master.output(), what="the master's log says meta refuses it")
    master.kill()
    eq(etcdctl("get", "/mooncake/", "--prefix", "--keys-only", who=user).stdout.strip(), "",
       "nothing written by the refused master")
    eq(m.stop(), 0, "member exit")

    # --client-auth=none opens the API on purpose; Authenticate then says
    # what etcd without auth says.
    o = Daemon("meta", args=["--client-auth=none"])
    oep = o.addr("listen-client")
    eq(run(["etcdctl", "--endpoints=" + oep, "put", "o/k", "v"]).stdout.strip(), "OK",
       "an open API")
    assert "--client-auth=none" in o.output(), o.output()
    with grpc.insecure_channel(oep) as ch:
        auth = etcd_stub(ch, "Auth", "Authenticate", pb.AuthenticateRequest,
                         pb.AuthenticateResponse)
        eq(rpc_error(auth, pb.AuthenticateRequest(name="root", password=secret), timeout=5),
           ("FAILED_PRECONDITION", "etcdserver: authentication is not enabled"),
           "Authenticate on an open API")
    eq(o.stop(), 0, "open member exit")

    # A public etcd API without a secret does not start.
    d = Daemon("meta", args=["--listen-client=0.0.0.0:%d" % mctest.free_port()],
               env=NO_SHARED, wait=False)
    eq(d.proc.wait(30), 1, "a public etcd API without a secret: exit status")
    assert "without a cluster secret" in d.output() and "--client-auth=none" in d.output(), \
        d.output()


@case
def a_second_local_user_cannot_reach_the_segment():
    if os.geteuid() != 0:
        print("     skipped: making a second user needs root (useradd)")
        return
    user = "mcsec%d" % os.getpid()
    r = run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user],
            check=False)
    if r.returncode != 0:
        print("     skipped: useradd %s failed: %s" % (user, r.stderr.strip()))
        return
    pw = pwd.getpwnam(user)

    def as_user(cmd):
        return mctest.as_uid(cmd, pw.pw_uid, pw.pw_gid)

    try:
        d = standalone()
        # Only the file's own mode keeps it: the directories above it are
        # opened up for the test.
        os.chmod(d.tmp.name, 0o755)
        os.chmod(d.data_dir, 0o755)
        sock, tmp = d.socket, tempfile.TemporaryDirectory()
        os.chmod(tmp.name, 0o755)
        value, before, after = (os.path.join(tmp.name, n) for n in ("value", "before", "after"))
        with open(value, "wb") as f:
            f.write(os.urandom(1 << 20))
        run([mctest.MOONCAKECTL, "put", "victim", value, "--socket=" + sock])
        run([mctest.MOONCAKECTL, "get", "victim", before, "--socket=" + sock, "--verify"])
        desc = descriptor(d)
        cfg = {"secret": os.path.join(d.data_dir, "cluster.secret"), "name": desc.name,
               "data_port": desc.data_port, "shm": desc.shm_socket,
               "addr": desc.regions[0].addr, "rpc": d.addr("agent-listen")}
        with open(os.path.join(tmp.name, "cfg.json"), "w") as f:
            json.dump(cfg, f)
        with open(os.path.join(tmp.name, "intruder.py"), "w") as f:
            f.write(INTRUDER)
        for n in ("cfg.json", "intruder.py"):
            os.chmod(os.path.join(tmp.name, n), 0o644)
        here = os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run(as_user([sys.executable, os.path.join(tmp.name, "intruder.py"),
                                    os.path.join(tmp.name, "cfg.json"), here,
                                    os.path.join(mctest.BUILD, "py")]),
                           capture_output=True, text=True, timeout=120,
                           cwd=tmp.name, env=mctest.child_env({"HOME": tmp.name}))
        assert r.returncode == 0, r.stdout + r.stderr
        got = json.loads(r.stdout.strip().splitlines()[-1])
        eq(got, {"secret": "denied", "tcp False": EACCES, "tcp True": EACCES,
                 "shm False": EACCES, "shm True": EACCES, "raw read bytes": 0,
                 "descriptor": "UNAUTHENTICATED"}, "every way in, as uid %d" % pw.pw_uid)
        # The tools say what they need rather than run unauthenticated.
        r = subprocess.run(as_user([mctest.MOONCAKECTL, "transfer", "--meta-endpoints=",
                                    "--data-dir=" + d.data_dir, "-c",
                                    "open " + d.addr("agent-listen")]),
                           capture_output=True, text=True, timeout=60,
                           env=mctest.child_env(NO_SHARED), cwd=tmp.name)
        assert r.returncode != 0 and "cannot be read by uid %d" % pw.pw_uid in r.stderr, \
            r.stdout + r.stderr
        # Nor is the client socket (0660, root's group).
        r = subprocess.run(as_user([mctest.MOONCAKECTL, "get", "victim", "--socket=" + sock]),
                           capture_output=True, timeout=60, cwd=tmp.name)
        assert r.returncode != 0, r
        run([mctest.MOONCAKECTL, "get", "victim", after, "--socket=" + sock, "--verify"])
        with open(before, "rb") as b, open(after, "rb") as a, open(value, "rb") as v:
            eq(a.read() == b.read() == v.read(), True, "the stored object kept its bytes")
        eq(d.stop(), 0, "exit")
        tmp.cleanup()
    finally:
        run(["userdel", user], check=False)


@case
def an_agents_ssd_reads_want_the_secrets_token():
    """Another agent's read of this one's SSD tier (mooncake.agent.Tier)
    comes on a connection that proved the cluster secret, as calls to the
    master's API do: without a token, or with one replayed from another
    connection, it is refused UNAUTHENTICATED before its own proof is
    looked at; with a fresh token it reaches the tier (here to be refused
    for its forged proof). The engine's Challenge needs no token (its
    descriptor proof is fresh by itself). `mooncakectl bench rpc --target`
    sends the token of $MOONCAKE_CLUSTER_SECRET_FILE, and says why it is
    refused without it."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon("standalone", args=["--ssd-path=" + os.path.join(tmp, "ssd"),
                                       "--ssd-size=64M", "--diag-service"])
        wait_for(lambda: "mounted with master" in d.output(), what="segment mounted")
        addr = d.addr("agent-listen")
        req = b"\x0a\x01k\x12\x05other"  # TierReadRequest{key: "k", reader: "other"}

        def refusal(ch):
            try:
                ch.unary_unary("/mooncake.agent.Tier/Read")(req, timeout=10)
            except grpc.RpcError as e:
                return e.code(), e.details()
            return None, "served"

        with grpc.insecure_channel(addr) as ch:
            c, why = refusal(ch)
            eq(c, grpc.StatusCode.UNAUTHENTICATED, "no token: %s" % why)
        tok = mctest.rpc_token()
        with mctest.token_channel(addr, token=tok) as ch:
            c, why = refusal(ch)
            eq(c, grpc.StatusCode.PERMISSION_DENIED, "a fresh token, a forged proof: %s" % why)
        with mctest.token_channel(addr, token=tok) as ch:
            c, why = refusal(ch)
            eq(c, grpc.StatusCode.UNAUTHENTICATED, "the token replayed: %s" % why)
        eq(len(challenge(addr)) > 0, True, "the engine's Challenge needs no token")
        bench = [mctest.MOONCAKECTL, "bench", "rpc", "--target=" + addr,
                 "--duration=100ms", "--patterns=unary"]
        r = run(bench, check=False)
        eq(r.returncode, 0, "bench rpc with the secret: " + r.stderr)
        r = run(bench, check=False, env=mctest.child_env(NO_SHARED))
        eq(r.returncode == 1 and "UNAUTHENTICATED" in r.stderr, True,
           "bench rpc without it: " + r.stderr)
        eq(d.stop(), 0, "exit")


mctest.main()
