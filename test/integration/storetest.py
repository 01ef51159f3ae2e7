"""Helpers for tests of the store end to end: a master (with mooncaked's own
meta role, or a real etcd to show compatibility) and agents as separate
mooncaked processes on loopback, and clients through the Python package
(python/mooncake, ctypes over $BUILD/libmooncake.so). Stores opened here
verify every get against the objects' checksums.

Under SAN=1 libmooncake.so is built with AddressSanitizer, which must be
the first library of the process: the test re-executes itself with
libasan preloaded (and leak detection off for the Python interpreter
only; the daemons keep theirs).
"""
import os
import socket
import struct
import subprocess
import sys
import tempfile
import urllib.request

import mctest
from mctest import Daemon, Etcd, Meta, run, wait_for

ROOT = mctest.ROOT
LIB = os.path.join(mctest.BUILD, "libmooncake.so")
os.environ["MOONCAKE_LIB"] = LIB
sys.path.insert(0, os.path.join(ROOT, "python"))

MiB = 1 << 20


def _san_reexec():
    if os.environ.get("SAN") != "1" or os.environ.get("MC_TEST_SAN_REEXEC"):
        return
    asan = subprocess.run(["cc", "-print-file-name=libasan.so"], capture_output=True,
                          text=True).stdout.strip()
    ubsan = subprocess.run(["cc", "-print-file-name=libubsan.so"], capture_output=True,
                           text=True).stdout.strip()
    env = dict(os.environ)
    env["MC_TEST_SAN_REEXEC"] = "1"
    env["MC_DAEMON_ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "")
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    env["LD_PRELOAD"] = " ".join(p for p in (asan, ubsan) if os.path.sep in p)
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


_san_reexec()


def daemon_env():
    """Environment for daemons: without the interpreter's preload and with
    the sanitizer options test/run.sh chose."""
    env = {"LD_PRELOAD": ""}
    if os.environ.get("MC_TEST_SAN_REEXEC"):
        env["ASAN_OPTIONS"] = os.environ.get("MC_DAEMON_ASAN_OPTIONS", "")
    return env


class Agent:
    """One mooncaked --role=agent with its own socket."""

    def __init__(self, master_addr=None, meta=None, segment=64 * MiB, args=(), exe=None,
                 env=None):
        self.d = None
        base = ["--global-segment-size=%d" % segment, "--local-buffer-size=16M"]
        if meta:
            base.append("--meta-endpoints=" + meta)
        else:
            base.append("--meta-endpoints=")
        if master_addr:
            base.append("--master-address=" + master_addr)
        self.tmp = tempfile.TemporaryDirectory(prefix="mooncake-sock-")
        self.socket = os.path.join(self.tmp.name, "agent.sock")
        denv = daemon_env()
        denv.update(env or {})
        self.d = Daemon("agent", args=base + ["--socket=" + self.socket] + list(args),
                        env=denv, exe=exe)
        self.name = self.d.addr("agent-listen")
        wait_for(lambda: os.path.exists(self.socket), what="agent socket")
        wait_for(lambda: "mounted with master" in self.d.output(), what="segment mounted")

    def store(self, **kw):
        from mooncake.store import MooncakeDistributedStore
        s = MooncakeDistributedStore()
        kw.setdefault("verify_gets", True)
        rc = s.setup("localhost", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "",
                     "unused", socket_path=self.socket, **kw)
        assert rc == 0, "setup: %d" % rc
        return s

    def engine(self):
        from mooncake.engine import TransferEngine
        te = TransferEngine()
        assert te.initialize("localhost", "P2PHANDSHAKE", "tcp", "", socket_path=self.socket) == 0
        return te

    def metrics(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.d.ports["agent-http"],
                                    timeout=5) as r:
            return r.read().decode()

    def ctl(self, *args, check=True, **kw):
        return run([mctest.MOONCAKECTL] + list(args) + ["--socket=" + self.socket],
                   check=check, **kw)


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            if line.startswith(name + " "):
                return float(line.split()[-1])
    raise AssertionError("no metric " + name)


def metric_labels(text, name, labels):
    want = name + "{" + labels + "}"
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


class Cluster:
    """A master and n agents; with meta=True (or "meta") they find each
    other through a mooncaked --role=meta, with meta="etcd" through a real
    etcd, else the agents are given the master's address."""

    def __init__(self, agents=1, meta=False, master_args=(), agent_args=(), segment=64 * MiB):
        self.etcd = None
        if meta == "etcd":
            self.etcd = Etcd()
        elif meta:
            self.etcd = Meta(env=daemon_env())
        margs = ["--meta-endpoints=" + (self.etcd.endpoint if meta else "")]
        self.master = Daemon("master", args=margs + list(master_args), env=daemon_env())
        self.master_addr = self.master.addr("master-listen")
        self.agents = [self.add_agent(agent_args, segment) for _ in range(agents)]

    def add_agent(self, args=(), segment=64 * MiB):
        if self.etcd:
            return Agent(meta=self.etcd.endpoint, segment=segment, args=args)
        return Agent(master_addr=self.master_addr, segment=segment, args=args)

    def stats(self):
        """mooncakectl stats of the master, as a dict of its number lines."""
        out = run([mctest.MOONCAKECTL, "stats", "--master=" + self.master_addr]).stdout
        d = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 2:
                try:
                    d[parts[0]] = float(parts[1])
                except ValueError:
                    pass
        return d

    def master_metrics(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.master.ports["master-http"],
                                    timeout=5) as r:
            return r.read().decode()

    def stop(self):
        for a in self.agents:
            a.d.stop()
        self.master.stop()
        if self.etcd:
            self.etcd.kill()


# ------------------------------------------------------------ raw protocol

def raw_connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.settimeout(10)
    return s


def frame(msg):
    b = msg.SerializeToString()
    return struct.pack("<I", len(b)) + b


def send(s, msg, fds=()):
    data = frame(msg)
    if fds:
        s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("%di" % len(fds),
                                                                              *fds))])
    else:
        s.sendall(data)


def recv_response(s):
    """(Response, fds) or (None, []) at end of stream."""
    import client_pb2
    fds = []
    buf = b""
    while len(buf) < 4:
        data, anc, _flags, _addr = s.recvmsg(4 - len(buf), socket.CMSG_SPACE(64))
        if not data:
            return None, []
        buf += data
        fds += _fds(anc)
    n = struct.unpack("<I", buf)[0]
    body = b""
    while len(body) < n:
        data, anc, _flags, _addr = s.recvmsg(n - len(body), socket.CMSG_SPACE(64))
        if not data:
            return None, []
        body += data
        fds += _fds(anc)
    r = client_pb2.Response()
    r.ParseFromString(body)
    return r, fds


def _fds(anc):
    out = []
    for level, typ, data in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            out += list(struct.unpack("%di" % (len(data) // 4), data[: len(data) // 4 * 4]))
    return out


def hello(s):
    import client_pb2
    r = client_pb2.Request(id=1)
    r.hello.version = 1
    send(s, r)
    resp, fds = recv_response(s)
    assert resp is not None and resp.error == 0, resp
    for fd in fds:
        os.close(fd)
    return resp
