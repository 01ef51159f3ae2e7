"""Shared helpers for mooncaked integration tests.

A test file defines functions decorated with @case and ends with
`mctest.main()`; each case runs in order, prints "ok NAME" or "FAIL NAME"
with the reason, and the file ends with "N passed, N failed" (the line
test/run.sh counts). Daemons are started from $BUILD on ephemeral ports on
127.0.0.1 with temporary data directories and are killed by PID.

Every process a test starts shares one cluster secret, named by
MOONCAKE_CLUSTER_SECRET_FILE in this process's environment, as the hosts of
a deployment share one file: several agents, each with its own data
directory, would otherwise each make their own and refuse each other.
A test of the default (the secret an agent creates in its data directory)
passes env={"MOONCAKE_CLUSTER_SECRET_FILE": None} to remove it.
"""
import faulthandler
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
MOONCAKED = os.path.join(BUILD, "mooncaked")
MOONCAKECTL = os.path.join(BUILD, "mooncakectl")
sys.path.insert(0, os.path.join(BUILD, "py"))

_cases = []

# test/run.sh's timeout ends a hung file with SIGTERM: print where every
# thread was first, so a hang on a machine nobody can log into says where.
faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)

_secret_dir = tempfile.TemporaryDirectory(prefix="mooncaked-test-secret-")
CLUSTER_SECRET = os.path.join(_secret_dir.name, "cluster.secret")
with open(os.open(CLUSTER_SECRET, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as _f:
    _f.write(os.urandom(32).hex() + "\n")
os.environ.setdefault("MOONCAKE_CLUSTER_SECRET_FILE", CLUSTER_SECRET)


def child_env(env=None):
    """os.environ updated with env; a value of None removes that name."""
    full = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    return full


def as_uid(cmd, uid, gid):
    """cmd run as uid:gid with no supplementary groups, through setpriv.
    Not Popen's user= or a preexec_fn: both make Python fork() rather
    than vfork(), and a fork() in a test process with grpc's threads can
    hang in the parent for good (seen in CI: 900 s in _fork_exec)."""
    return ["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups", "--"] + list(cmd)


def case(fn):
    _cases.append(fn)
    return fn


def main():
    passed = failed = 0
    only = sys.argv[1:]
    for fn in _cases:
        if only and fn.__name__ not in only:
            continue
        t0 = time.monotonic()
        try:
            fn()
        except Exception:  # noqa: BLE001 - report every failure
            failed += 1
            print("FAIL %s (%.2fs)" % (fn.__name__, time.monotonic() - t0))
            traceback.print_exc(file=sys.stdout)
        else:
            passed += 1
            print("ok   %s (%.2fs)" % (fn.__name__, time.monotonic() - t0))
        sys.stdout.flush()
    Daemon.stop_all()
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_random = random.Random(os.getpid() ^ int(time.time() * 1000))
_given = set()  # never hand out a port twice: it may not be bound yet


def _claim(port):
    """Claim port for this process among every test of the run: test/run.sh
    runs test files side by side and names a directory in MCTEST_PORT_DIR
    where each port handed out is a file, created exclusively. Without it
    (a test run alone) the claim is this process's own."""
    if port in _given:
        return False
    d = os.environ.get("MCTEST_PORT_DIR")
    if d:
        try:
            os.close(os.open(os.path.join(d, str(port)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
    _given.add(port)
    return True


def free_port():
    """A port that was free a moment ago and that no other test of the run
    was given, chosen below the kernel's ephemeral range: a port handed
    out by bind(0) can be taken again by any outgoing connection before the
    daemon binds it (a flaky "address already in use"), one outside that
    range only by another listener."""
    hi = min(_ephemeral_low(), 32768)
    lo = max(1024, hi - 12000)
    for _ in range(200 if hi - lo >= 1000 else 0):
        port = _random.randrange(lo, hi)
        if port in _given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if _claim(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=10.0, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError("process exited with %s before listening on %d"
                                 % (proc.returncode, port))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise AssertionError("nothing listening on port %d after %.1fs" % (port, timeout))


class Daemon:
    """A build/mooncaked process on ephemeral ports.

    ports: dict key -> port for every listen key of the roles run, e.g.
    d.ports["listen-client"]. Extra flags in args; exe: another build of
    mooncaked (a test build). stop() sends SIGTERM and returns the exit
    status; kill() sends SIGKILL.
    """
    _all = []
    LISTEN_KEYS = {
        "meta": ["listen-client", "listen-peer", "meta-http"],
        "master": ["master-listen", "master-http"],
        "agent": ["agent-listen", "agent-http"],
    }

    def __init__(self, role="standalone", args=(), data_dir=None, env=None,
                 wait=True, ports=None, exe=None):
        self.role = role
        roles = ["meta", "master", "agent"] if role == "standalone" else role.split(",")
        if "standalone" in roles:
            roles = ["meta", "master", "agent"]
        self.tmp = tempfile.TemporaryDirectory(prefix="mooncaked-test-")
        self.data_dir = data_dir or os.path.join(self.tmp.name, "data")
        self.log_path = os.path.join(self.tmp.name, "log")
        self.ports = dict(ports or {})
        for r in roles:
            for k in self.LISTEN_KEYS[r]:
                self.ports.setdefault(k, free_port())
        cmd = [exe or MOONCAKED, "--role=" + role, "--data-dir=" + self.data_dir, "--config="]
        cmd += ["--%s=127.0.0.1:%d" % (k, p) for k, p in self.ports.items()]
        if "agent" in roles:
            # Never the machine-wide default socket, and a small segment
            # (the agent commits it at start); args may override both.
            self.socket = os.path.join(self.tmp.name, "agent.sock")
            cmd += ["--socket=" + self.socket, "--global-segment-size=64M"]
        cmd += list(args)
        self.cmd = cmd
        full_env = child_env(env)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=full_env)
        Daemon._all.append(self)
        if wait:
            try:
                for p in self.ports.values():
                    wait_port(p, proc=self.proc)
            except AssertionError as e:
                raise AssertionError("%s\n%s log:\n%s" % (e, role, self.output()[-4000:]))

    @property
    def pid(self):
        return self.proc.pid

    def addr(self, key):
        return "127.0.0.1:%d" % self.ports[key]

    def output(self):
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, timeout=20):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("mooncaked did not exit %ds after SIGTERM:\n%s"
                                     % (timeout, self.output()[-3000:]))
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @classmethod
    def stop_all(cls):
        for d in cls._all:
            d.kill()
        cls._all = []


def run(cmd, timeout=60, check=True, **kw):
    """Run a command, return CompletedProcess with text stdout/stderr."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise AssertionError("%s exited %d\nstdout:\n%s\nstderr:\n%s"
                             % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
    return r


def short(v, limit=300):
    """repr of v, cut to limit characters (values can be megabytes)."""
    r = repr(v)
    if len(r) <= limit:
        return r
    return "%s... (%d characters in all%s)" % (
        r[:limit], len(r), ", len %d" % len(v) if hasattr(v, "__len__") else "")


def eq(a, b, what=""):
    if a != b:
        raise AssertionError("%s: expected %s, got %s" % (what, short(b), short(a)))


class Etcd:
    """A real etcd (Debian etcd-server) on ephemeral loopback ports with a
    temporary data directory; endpoint is "127.0.0.1:PORT". kill() sends
    SIGKILL."""

    def __init__(self):
        import shutil
        exe = shutil.which("etcd")
        if not exe:
            raise AssertionError("etcd missing (Debian package etcd-server)")
        self.tmp = tempfile.TemporaryDirectory(prefix="mooncaked-etcd-")
        self.port = free_port()
        peer = free_port()
        self.endpoint = "127.0.0.1:%d" % self.port
        self.log = open(os.path.join(self.tmp.name, "log"), "wb")
        self.proc = subprocess.Popen(
            [exe, "--name=test", "--data-dir=" + os.path.join(self.tmp.name, "data"),
             "--listen-client-urls=http://" + self.endpoint,
             "--advertise-client-urls=http://" + self.endpoint,
             "--listen-peer-urls=http://127.0.0.1:%d" % peer,
             "--initial-advertise-peer-urls=http://127.0.0.1:%d" % peer,
             "--initial-cluster=test=http://127.0.0.1:%d" % peer],
            stdout=self.log, stderr=subprocess.STDOUT)
        Daemon._all.append(self)
        wait_port(self.port, proc=self.proc)

    def ctl(self, *args):
        env = dict(os.environ, ETCDCTL_API="3")
        return run(["etcdctl", "--endpoints=http://" + self.endpoint] + list(args), env=env)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def proc_mib(pid, field="VmRSS"):
    """A memory figure of /proc/PID/status (VmRSS, VmHWM, ...) in MiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no %s in /proc/%d/status" % (field, pid))


def sanitized():
    """The daemons are a sanitizer build: ASan keeps freed memory in its
    quarantine, so their RSS says nothing of what they hold."""
    with open(MOONCAKED, "rb") as f:
        return b"__asan_init" in f.read()


def wait_for(fn, timeout=20.0, what="condition"):
    """Poll fn() until it returns a true value (returned) or time runs out."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - keep polling until the deadline
            last = e
        time.sleep(0.05)
    raise AssertionError("%s not reached in %.1fs (last: %r)" % (what, timeout, last))


class Meta:
    """A one-member mooncaked --role=meta (the project's own metadata
    service) on ephemeral loopback ports with a temporary data directory;
    the same interface as Etcd: endpoint "127.0.0.1:PORT", ctl(*args) runs
    etcdctl against it, kill() sends SIGKILL. Short Raft timeouts, so the
    one member leads at once."""

    def __init__(self, args=(), env=None):
        self.d = Daemon("meta", args=["--heartbeat-interval=50ms", "--election-timeout=500ms"]
                        + list(args), env=env)
        self.endpoint = self.d.addr("listen-client")
        self.proc = self.d.proc
        self.user = etcd_user(args=args, env=env)
        wait_for(lambda: self._serving(), timeout=20, what="meta serving")

    def _serving(self):
        env = dict(os.environ, ETCDCTL_API="3")
        r = subprocess.run(["etcdctl", "--endpoints=http://" + self.endpoint,
                            "--command-timeout=2s"] + self.user + ["put", "/mctest/ready", "1"],
                           capture_output=True, text=True, timeout=10, env=env)
        return r.returncode == 0

    def ctl(self, *args):
        env = dict(os.environ, ETCDCTL_API="3")
        return run(["etcdctl", "--endpoints=http://" + self.endpoint] + self.user + list(args),
                   env=env)

    def output(self):
        return self.d.output()

    def kill(self):
        self.d.kill()


# ------------------------------------------------------------ the master's API

def secret_text(secret_file=None):
    """The cluster secret as a meta member reads it (mc_secret_load: the
    file without trailing newlines and spaces): the etcd API's password of
    user root."""
    path = secret_file or os.environ["MOONCAKE_CLUSTER_SECRET_FILE"]
    with open(path, "rb") as f:
        return f.read().rstrip(b"\r\n \t").decode()


def etcd_user(secret_file=None, args=(), env=None):
    """etcdctl's --user for a meta member started with args and env (as
    Daemon takes them): with a cluster secret (the tests' by default) its
    etcd API wants it (--client-auth), else [] (etcd's answer to a user
    would be "authentication is not enabled")."""
    for a in args:
        if a.startswith("--cluster-secret-file="):
            secret_file = a.split("=", 1)[1]
        if a == "--client-auth=none":
            return []
    secret_file = secret_file or child_env(env).get("MOONCAKE_CLUSTER_SECRET_FILE")
    return ["--user=root:" + secret_text(secret_file)] if secret_file else []


def rpc_token(secret_file=None, ts_ms_offset=0):
    """A token of the cluster secret (src/common/auth.h, written here from
    its comment): what a caller of a master started with a secret sends
    in its "mooncake-auth" header."""
    import hashlib
    import hmac
    import time
    key = secret_text(secret_file).encode()
    ts = str(int(time.time() * 1000) + ts_ms_offset).encode()
    nonce = os.urandom(16)
    mac = hmac.new(key, b"mooncake-rpc-v1\0" + ts + b"\0" + nonce, hashlib.sha256).hexdigest()
    return "v1.%s.%s.%s" % (ts.decode(), nonce.hex(), mac)


def token_channel(addr, options=None, token=None):
    """A grpc channel to a server that wants the cluster secret (a master's
    API, a meta member's peer port or etcd API) whose calls carry a token
    of the tests' cluster secret (or the one given)."""
    import grpc

    meta = (("mooncake-auth", token or rpc_token()),)

    class Auth(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
               grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
        def _add(self, d):
            return d._replace(metadata=tuple(d.metadata or ()) + meta) \
                if hasattr(d, "_replace") else _Details(d, meta)

        def intercept_unary_unary(self, cont, d, req):
            return cont(self._add(d), req)

        def intercept_unary_stream(self, cont, d, req):
            return cont(self._add(d), req)

        def intercept_stream_unary(self, cont, d, it):
            return cont(self._add(d), it)

        def intercept_stream_stream(self, cont, d, it):
            return cont(self._add(d), it)

    return grpc.intercept_channel(grpc.insecure_channel(addr, options=options or []), Auth())


class _Details:
    """grpc.ClientCallDetails with metadata added."""

    def __init__(self, d, meta):
        self.method, self.timeout, self.credentials = d.method, d.timeout, d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)
        self.metadata = tuple(d.metadata or ()) + meta
