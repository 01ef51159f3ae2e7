"""The process frame of build/mooncaked, driven from outside.

Command line and configuration errors, every role's listeners, the
grpc.health.v1.Health service seen by a real gRPC client (Python grpcio),
/metrics validated by promtool and /healthz, signals (SIGTERM drains,
SIGHUP reopens the log, a fatal signal is logged before the daemon dies),
the data-dir lock, 16 MiB messages both ways
through mooncake.diag.Diag, and abuse of the RPC port (garbage, truncated
preface, oversized frame, half-open connection) after which the daemon
still answers.
"""
import hashlib
import os
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request

import mctest
from mctest import case, Daemon, eq, run

import grpc
import health_pb2
import diag_pb2

H = health_pb2.HealthCheckResponse


def health_check(addr, service="", timeout=5):
    with grpc.insecure_channel(addr) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                               response_deserializer=H.FromString)
        return check(health_pb2.HealthCheckRequest(service=service), timeout=timeout).status


def http_get(port, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# ------------------------------------------------------------ command line

@case
def usage_errors_exit_2_with_one_line():
    bad = [
        (["--nope"], "unknown flag '--nope'"),
        (["--rpc-max-message-size=12Q"], "--rpc-max-message-size: '12Q' is not a size"),
        (["--shutdown-timeout=soon"], "--shutdown-timeout: 'soon' is not a duration"),
        (["--data-dir"], "--data-dir: missing value"),
        (["--role=cook"], "--role: 'cook' is not"),
        (["--listen-client=host"], "--listen-client: 'host' is not a numeric host:port"),
        (["--config=/nonexistent.conf"], "cannot open '/nonexistent.conf'"),
    ]
    for args, want in bad:
        r = run([mctest.MOONCAKED] + args, check=False)
        eq(r.returncode, 2, "exit code of %s" % args)
        lines = r.stderr.strip().splitlines()
        eq(len(lines), 1, "lines on stderr for %s: %r" % (args, r.stderr))
        assert want in lines[0], (want, lines[0])
    r = run([mctest.MOONCAKED, "--config="], check=False,
            env=dict(os.environ, MOONCAKE_LOG_LEVEL="info,nosuch=debug"))
    eq(r.returncode, 2, "bad env var")
    assert "MOONCAKE_LOG_LEVEL" in r.stderr, r.stderr


@case
def help_version_print_config():
    r = run([mctest.MOONCAKED, "--help"])
    for word in ["meta", "master", "agent", "standalone", "--data-dir=PATH",
                 "/var/lib/mooncake", "--print-config"]:
        assert word in r.stdout, word
    r = run([mctest.MOONCAKED, "--version"])
    assert r.stdout.startswith("mooncaked "), r.stdout
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        conf = os.path.join(d, "m.conf")
        with open(conf, "w") as f:
            f.write("[common]\nshutdown-timeout = 3s\nlog-level = warn\n[meta]\nlisten-peer = 127.0.0.1:7\n")
        env = dict(os.environ, MOONCAKE_LOG_LEVEL="debug")
        r = run([mctest.MOONCAKED, "--config=" + conf, "--print-config", "--shutdown-timeout=4s"], env=env)
        out = r.stdout
        assert "shutdown-timeout = 4s" in out and "# flag" in out, out
        assert "log-level = debug" in out and "# env (env MOONCAKE_LOG_LEVEL)" in out, out
        assert "listen-peer = 127.0.0.1:7" in out and ("m.conf:5") in out, out
        assert "listen-client = 127.0.0.1:2379" in out, out


# ------------------------------------------------------------ roles, health

@case
def meta_role_health_over_grpcio():
    d = Daemon("meta")
    for key in ("listen-client", "listen-peer"):
        eq(health_check(d.addr(key)), H.SERVING, "overall health on " + key)
    for svc in ("etcdserverpb.KV", "etcdserverpb.Lease", "etcdserverpb.Watch",
                "etcdserverpb.Cluster", "etcdserverpb.Maintenance"):
        eq(health_check(d.addr("listen-client"), svc), H.SERVING, svc)
    eq(health_check(d.addr("listen-peer"), "mooncake.raft.Raft"), H.SERVING, "Raft")
    try:
        health_check(d.addr("listen-client"), "no.such.Service")
        raise AssertionError("unknown service answered")
    except grpc.RpcError as e:
        eq(e.code(), grpc.StatusCode.NOT_FOUND, "unknown service")
    out = d.output()
    assert "not implemented yet" not in out, out
    assert "founded cluster" in out, out
    eq(d.stop(), 0, "exit status after SIGTERM")
    assert "shut down cleanly" in d.output()


@case
def standalone_serves_every_role():
    # Without --meta-endpoints the master and the agent use this process's
    # own meta: the master campaigns there and the agent's transfer-engine
    # segment is published there.
    d = Daemon("standalone")
    for key in ("listen-client", "listen-peer", "master-listen", "agent-listen"):
        eq(health_check(d.addr(key)), H.SERVING, key)
    mctest.wait_for(lambda: health_check(d.addr("master-listen"), "mooncake.master.Master")
                    == H.SERVING or None, 20, "the master elected through its own meta")
    for key in ("meta-http", "master-http", "agent-http"):
        code, body = http_get(d.ports[key], "/healthz")
        eq(code, 200, key)
        assert body.startswith("ok\n"), body
    code, body = http_get(d.ports["meta-http"], "/healthz")
    assert "meta-client (server) SERVING" in body, body
    assert "meta-client etcdserverpb.KV SERVING" in body, body
    assert "meta-peer mooncake.raft.Raft SERVING" in body, body
    ep = "--endpoints=http://" + d.addr("listen-client")
    keys = mctest.wait_for(lambda: (lambda out: out if "/segments/" in out else None)(
        run(["etcdctl", ep] + mctest.etcd_user() + ["get", "--prefix", "--keys-only",
                                                    "/mooncake/mooncake/"],
            env=dict(os.environ, ETCDCTL_API="3")).stdout), 20, "the agent's segment in meta")
    assert "/mooncake/mooncake/master\n" in keys, keys
    eq(d.stop(), 0, "exit")
    assert "cannot delete" not in d.output(), "stopping roles reach meta: " + d.output()[-2000:]


@case
def master_without_meta_serves():
    d = Daemon("master", args=["--meta-endpoints="])
    mctest.wait_for(lambda: health_check(d.addr("master-listen"), "mooncake.master.Master")
                    == H.SERVING, 10, "master SERVING")
    code, body = http_get(d.ports["master-http"], "/healthz")
    assert "master mooncake.master.Master SERVING" in body, body
    assert "not implemented yet" not in d.output(), d.output()
    eq(d.stop(), 0, "exit")


@case
def health_watch_sees_shutdown():
    d = Daemon("master")
    updates = []
    done = threading.Event()

    def watch():
        with grpc.insecure_channel(d.addr("master-listen")) as ch:
            w = ch.unary_stream("/grpc.health.v1.Health/Watch",
                                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                response_deserializer=H.FromString)
            try:
                for resp in w(health_pb2.HealthCheckRequest(service=""), timeout=20):
                    updates.append(resp.status)
                    if len(updates) == 1:
                        done.set()
            except grpc.RpcError:
                pass
        done.set()

    t = threading.Thread(target=watch)
    t.start()
    assert done.wait(10), "no first Watch message"
    eq(updates[0], H.SERVING, "first watch status")
    d.signal(signal.SIGTERM)
    t.join(20)
    assert H.NOT_SERVING in updates, updates
    eq(d.proc.wait(20), 0, "exit")


@case
def second_daemon_on_same_data_dir_refuses():
    d = Daemon("master")
    r = run([mctest.MOONCAKED, "--config=", "--role=master", "--data-dir=" + d.data_dir,
             "--master-listen=127.0.0.1:%d" % mctest.free_port(),
             "--master-http=127.0.0.1:%d" % mctest.free_port()], check=False, timeout=20)
    eq(r.returncode, 1, "second daemon exit code")
    assert "in use by another mooncaked (pid %d)" % d.pid in r.stderr, r.stderr
    pidfile = os.path.join(d.data_dir, "mooncaked.pid")
    eq(open(pidfile).read().strip(), str(d.pid), "pid file")
    eq(d.stop(), 0, "first exits cleanly")
    assert not os.path.exists(pidfile), "pid file removed at exit"


@case
def port_in_use_is_a_clear_error():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    d = Daemon("master", ports={"master-listen": port}, wait=False)
    eq(d.proc.wait(20), 1, "exit code")
    out = d.output()
    assert "cannot listen on 127.0.0.1:%d (--master-listen)" % port in out, out
    busy.close()


def wait_for_text(path, text, timeout=5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and text in open(path).read():
            return
        time.sleep(0.05)
    raise AssertionError("%r never appeared in %s" % (text, path))


@case
def sighup_reopens_log_file():
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        logf = os.path.join(tmp, "mooncaked.log")
        d = Daemon("agent", args=["--log-file=" + logf])
        wait_for_text(logf, "ready")
        os.rename(logf, logf + ".1")  # what logrotate does
        d.signal(signal.SIGHUP)
        wait_for_text(logf, "log file reopened")
        assert "log file reopened" not in open(logf + ".1").read()
        eq(d.stop(), 0, "exit")
        assert "shut down cleanly" in open(logf).read()


@case
def a_fatal_signal_is_logged_before_the_daemon_dies():
    """A daemon that dies of a fault says why in its log, then takes the
    signal's default action (the exit status names the signal)."""
    if os.environ.get("SAN") == "1":
        print("skip: sanitizer builds keep the sanitizers' handlers")
        return
    import tempfile
    for sig, name in ((signal.SIGSEGV, "SIGSEGV"), (signal.SIGABRT, "SIGABRT")):
        with tempfile.TemporaryDirectory() as tmp:
            logf = os.path.join(tmp, "mooncaked.log")
            d = Daemon("meta", args=["--log-file=" + logf])
            wait_for_text(logf, "published name")
            d.signal(sig)
            eq(d.proc.wait(20), -sig, "killed by the signal itself")
            line = [x for x in open(logf).read().splitlines() if "killed by" in x]
            eq(len(line), 1, "one line says why: " + open(logf).read()[-2000:])
            assert " ERROR daemon: killed by %s (signal %d, code 0) sent by pid %d" % (
                name, sig, os.getpid()) in line[0], line[0]
            assert line[0].startswith(time.strftime("%Y-%m-%dT", time.gmtime())), line[0]


# ------------------------------------------------------------ metrics

@case
def the_http_ports_hold_a_bounded_number_of_connections():
    """A metrics port holds at most 256 connections: past them a new one is
    closed as soon as it is accepted, counted and logged, and the port
    serves again once some go. A request head that trickles in is closed
    10 s after its first byte, while an idle connection stays."""
    d = Daemon("meta")
    port = d.ports["meta-http"]
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(256)]
    for s in held:
        s.settimeout(0.5)
    try:
        extra = socket.create_connection(("127.0.0.1", port))
        extra.settimeout(5)
        eq(extra.recv(1), b"", "a connection past the bound is closed")
        extra.close()
        for s in held[:8]:
            s.close()
        del held[:8]
        code, body = mctest.wait_for(lambda: (lambda r: r if r[0] == 200 else None)(
            http_get(port, "/metrics")), 10, "a scrape once some went")
        line = 'mooncake_http_connections_refused_total{server="meta"} '
        assert any(ln.startswith(line) and float(ln.split()[-1]) >= 1
                   for ln in body.splitlines()), "the refusal counted"
        assert "the most it holds: closing new ones" in d.output(), "the log line"
        # One trickles a request head, one byte a second; one stays silent.
        slow, idle = held[0], held[1]
        t0 = time.monotonic()
        closed = None
        for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 30:
            try:
                slow.sendall(bytes([b]))
                if slow.recv(1) == b"":
                    closed = time.monotonic() - t0
                    break
            except socket.timeout:
                continue
            except OSError:
                closed = time.monotonic() - t0
                break
        assert closed is not None and 9 <= closed <= 14, "trickling head closed at %s s" % closed
        try:
            got = idle.recv(1)
        except socket.timeout:
            got = None
        assert got is None, "an idle connection was closed before its timeout"
    finally:
        for s in held:
            s.close()
    eq(d.stop(), 0, "exit")


@case
def metrics_pass_promtool():
    d = Daemon("meta")
    health_check(d.addr("listen-client"))
    health_check(d.addr("listen-client"), "etcdserverpb.KV")
    code, body = http_get(d.ports["meta-http"], "/metrics")
    eq(code, 200, "/metrics")
    for name in ["mooncake_rpc_server_calls_total", "mooncake_rpc_server_call_duration_seconds_bucket",
                 "mooncake_build_info", "process_resident_memory_bytes"]:
        assert name in body, name
    r = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, text=True)
    eq(r.returncode, 0, "promtool: " + r.stdout + r.stderr)
    eq(http_get(d.ports["meta-http"], "/nope")[0], 404, "unknown path")
    # Keep-alive and HEAD work with a raw socket.
    s = socket.create_connection(("127.0.0.1", d.ports["meta-http"]))
    s.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    deadline = time.monotonic() + 5
    while data.count(b"HTTP/1.1 200") < 2 and time.monotonic() < deadline:
        data += s.recv(65536)
    eq(data.count(b"HTTP/1.1 200"), 2, "two pipelined answers")
    s.close()
    eq(d.stop(), 0, "exit")


# ------------------------------------------------------------ big messages

def diag_stub(ch, method, kind, req_cls, resp_cls):
    return getattr(ch, kind)("/mooncake.diag.Diag/" + method,
                             request_serializer=req_cls.SerializeToString,
                             response_deserializer=resp_cls.FromString)


@case
def sixteen_mib_both_directions():
    d = Daemon("master", args=["--diag-service"])
    payload = os.urandom(16 << 20)
    opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    with mctest.token_channel(d.addr("master-listen"), options=opts) as ch:
        echo = diag_stub(ch, "Echo", "unary_unary", diag_pb2.EchoRequest, diag_pb2.EchoResponse)
        resp = echo(diag_pb2.EchoRequest(payload=payload), timeout=30)
        eq(hashlib.sha256(resp.payload).hexdigest(), hashlib.sha256(payload).hexdigest(), "16 MiB echo")
    eq(d.stop(), 0, "exit")


@case
def max_message_size_is_enforced():
    d = Daemon("master", args=["--diag-service", "--rpc-max-message-size=1M"])
    opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    with mctest.token_channel(d.addr("master-listen"), options=opts) as ch:
        echo = diag_stub(ch, "Echo", "unary_unary", diag_pb2.EchoRequest, diag_pb2.EchoResponse)
        try:
            echo(diag_pb2.EchoRequest(payload=b"x" * (2 << 20)), timeout=10)
            raise AssertionError("2 MiB accepted with a 1 MiB limit")
        except grpc.RpcError as e:
            eq(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, "oversized request")
        eq(len(echo(diag_pb2.EchoRequest(payload=b"y" * 1000), timeout=10).payload), 1000, "small ok")
    eq(health_check(d.addr("master-listen")), H.SERVING, "still healthy")
    eq(d.stop(), 0, "exit")


@case
def unknown_method_is_unimplemented():
    d = Daemon("agent")
    with grpc.insecure_channel(d.addr("agent-listen")) as ch:
        m = ch.unary_unary("/grpc.health.v1.Health/Nope", request_serializer=lambda x: x,
                           response_deserializer=lambda x: x)
        try:
            m(b"", timeout=5)
            raise AssertionError("unknown method answered")
        except grpc.RpcError as e:
            eq(e.code(), grpc.StatusCode.UNIMPLEMENTED, "unknown method")
        m = ch.unary_unary("/no.Such/Thing", request_serializer=lambda x: x,
                           response_deserializer=lambda x: x)
        try:
            m(b"", timeout=5)
            raise AssertionError("unknown service answered")
        except grpc.RpcError as e:
            eq(e.code(), grpc.StatusCode.UNIMPLEMENTED, "unknown service")
    eq(d.stop(), 0, "exit")


# ------------------------------------------------------------ abuse

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(ftype, flags, stream, payload, length=None):
    n = len(payload) if length is None else length
    return struct.pack(">I", n)[1:] + bytes([ftype, flags]) + struct.pack(">I", stream) + payload


@case
def abuse_does_not_kill_the_server():
    d = Daemon("meta", args=["--shutdown-timeout=2s"])
    port = d.ports["listen-client"]
    attacks = {
        "garbage": os.urandom(4096),
        "http1": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "truncated preface": PREFACE[:10],
        "oversized frame": PREFACE + frame(4, 0, 0, b"") + frame(0, 0, 1, b"x" * 100, length=(1 << 24) - 1),
        "bad settings": PREFACE + frame(4, 0, 0, b"\x00\x01\x00"),
        "data on stream 0": PREFACE + frame(4, 0, 0, b"") + frame(0, 0, 0, b"abc"),
        "headers garbage": PREFACE + frame(4, 0, 0, b"") + frame(1, 5, 1, os.urandom(64)),
    }
    for name, data in attacks.items():
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(data)
        s.settimeout(5)
        try:
            while s.recv(65536):
                pass
        except (socket.timeout, ConnectionResetError):
            pass
        s.close()
        eq(health_check(d.addr("listen-client")), H.SERVING, "after " + name)
    # Half-open connections that never speak: others are still served.
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    eq(health_check(d.addr("listen-client")), H.SERVING, "with idle connections")
    for s in idle:
        s.close()
    # A connection that sends the preface and stops mid-frame.
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(PREFACE + frame(4, 0, 0, b"") + frame(1, 4, 1, b"", length=100))
    eq(health_check(d.addr("listen-client")), H.SERVING, "with a stalled frame")
    eq(d.stop(), 0, "exit with a stalled connection open")
    s.close()


@case
def sigterm_drains_in_flight_call():
    d = Daemon("master", args=["--diag-service", "--shutdown-timeout=10s"])
    result = {}

    def slow_call():
        with mctest.token_channel(d.addr("master-listen")) as ch:
            echo = diag_stub(ch, "Echo", "unary_unary", diag_pb2.EchoRequest, diag_pb2.EchoResponse)
            try:
                result["resp"] = echo(diag_pb2.EchoRequest(payload=b"drain", delay_ms=1500), timeout=20)
            except grpc.RpcError as e:
                result["err"] = e

    t = threading.Thread(target=slow_call)
    t.start()
    time.sleep(0.5)  # let the call reach the server (it is delayed 1.5 s there)
    d.signal(signal.SIGTERM)
    t.join(20)
    assert "resp" in result, result
    eq(result["resp"].payload, b"drain", "drained call completed")
    eq(d.proc.wait(20), 0, "exit after draining")


@case
def sigterm_closes_idle_connection_without_waiting_for_the_client():
    # A client that keeps its connection open but reads nothing (as an idle
    # grpcio channel does) must not hold shutdown for the whole drain: with
    # no call in flight the server sends the final GOAWAY at once and closes.
    d = Daemon("master", args=["--shutdown-timeout=60s"])
    s = socket.create_connection(("127.0.0.1", d.ports["master-listen"]))
    s.sendall(PREFACE + frame(4, 0, 0, b""))
    eq(health_check(d.addr("master-listen")), H.SERVING, "serving")
    d.signal(signal.SIGTERM)
    eq(d.proc.wait(30), 0, "exit while the idle client still holds its connection")
    s.settimeout(5)
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    s.close()
    types, off = [], 0
    while off + 9 <= len(got):
        n = int.from_bytes(got[off:off + 3], "big")
        types.append(got[off + 3])
        off += 9 + n
    assert 7 in types, "a GOAWAY frame among %s" % types


@case
def systemd_notify_ready_and_stopping():
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(10)
        d = Daemon("master", env={"NOTIFY_SOCKET": path})
        msg = sock.recv(4096).decode()
        assert "READY=1" in msg and "MAINPID=%d" % d.pid in msg, msg
        d.signal(signal.SIGTERM)
        eq(sock.recv(4096).decode(), "STOPPING=1", "stopping notice")
        eq(d.proc.wait(20), 0, "exit")
        sock.close()


@case
def systemd_units_verify():
    import shutil
    import tempfile
    if not shutil.which("systemd-analyze"):
        raise AssertionError("systemd-analyze missing (Debian package systemd)")
    with tempfile.TemporaryDirectory() as tmp:
        for unit, name in (("mooncaked.service.in", "mooncaked.service"),
                           ("mooncaked@.service.in", "mooncaked@meta.service"),
                           ("mooncaked@agent.service.in", "mooncaked@agent.service")):
            text = open(os.path.join(mctest.ROOT, "deploy", unit)).read()
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                f.write(text.replace("@PREFIX@/bin/mooncaked", mctest.MOONCAKED))
            r = run(["systemd-analyze", "verify", "--man=no", path], check=False)
            eq((r.returncode, r.stdout + r.stderr), (0, ""), "systemd-analyze verify " + name)


mctest.main()
