"""Our gRPC client against a real one: build/mooncakectl health talking to
a grpcio server that implements grpc.health.v1.Health with generic
handlers (message classes from build/py/health_pb2.py)."""
import os
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures

import mctest
from mctest import case, eq, run

import grpc  # noqa: E402  (after mctest put build/py on sys.path)
import health_pb2  # noqa: E402

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthServer:
    """grpc.health.v1.Health in the reference implementation's semantics."""

    def __init__(self):
        self.status = {"": SERVING}
        self.cond = threading.Condition()
        self.checks = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handler = grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
            "Check": grpc.unary_unary_rpc_method_handler(
                self.check,
                request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString),
            "Watch": grpc.unary_stream_rpc_method_handler(
                self.watch,
                request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString),
        })
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.endpoint = "127.0.0.1:%d" % self.port

    def set(self, service, status):
        with self.cond:
            self.status[service] = status
            self.cond.notify_all()

    def check(self, req, ctx):
        self.checks += 1
        if req.service == "slow":
            time.sleep(3)
        with self.cond:
            if req.service not in self.status:
                ctx.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
            return health_pb2.HealthCheckResponse(status=self.status[req.service])

    def watch(self, req, ctx):
        last = None
        while ctx.is_active():
            with self.cond:
                cur = self.status.get(req.service, SERVICE_UNKNOWN)
                if cur == last:
                    self.cond.wait(0.1)
                    continue
            last = cur
            yield health_pb2.HealthCheckResponse(status=cur)

    def stop(self):
        self.server.stop(0)


srv = HealthServer()


def ctl(*args, timeout=30):
    return run([mctest.MOONCAKECTL, "health", "--endpoint=" + srv.endpoint] + list(args),
               timeout=timeout, check=False)


def readline(p, timeout=10.0):
    r, _, _ = select.select([p.stdout], [], [], timeout)
    if not r:
        raise AssertionError("no output from mooncakectl --watch within %.0fs" % timeout)
    return p.stdout.readline().strip()


@case
def check_serving():
    r = ctl()
    eq(r.stdout.strip(), "SERVING", "stdout")
    eq(r.returncode, 0, "exit status")


@case
def check_named_service_not_serving():
    srv.set("mooncake.master.Master", NOT_SERVING)
    r = ctl("--service=mooncake.master.Master")
    eq(r.stdout.strip(), "NOT_SERVING", "stdout")
    eq(r.returncode, 1, "exit status")
    srv.set("mooncake.master.Master", SERVING)
    r = ctl("--service", "mooncake.master.Master")
    eq(r.stdout.strip(), "SERVING", "stdout")
    eq(r.returncode, 0, "exit status")


@case
def check_unknown_service():
    r = ctl("--service=no.such.Service")
    eq(r.stdout.strip(), "SERVICE_UNKNOWN", "stdout")
    eq(r.returncode, 1, "exit status")
    assert "unknown" in r.stderr, r.stderr


@case
def check_deadline_against_grpcio():
    t0 = time.monotonic()
    r = ctl("--service=slow", "--timeout=300ms")
    eq(r.returncode, 1, "exit status")
    assert "DEADLINE_EXCEEDED" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 2.5, "the local deadline was not enforced"


@case
def watch_sees_changes():
    srv.set("svc.W", SERVING)
    p = subprocess.Popen([mctest.MOONCAKECTL, "health", "--endpoint=" + srv.endpoint,
                          "--service=svc.W", "--watch"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        eq(readline(p), "SERVING", "first update")
        srv.set("svc.W", NOT_SERVING)
        eq(readline(p), "NOT_SERVING", "second update")
        srv.set("svc.W", SERVING)
        eq(readline(p), "SERVING", "third update")
        srv.set("svc.W", NOT_SERVING)
        eq(readline(p), "NOT_SERVING", "fourth update")
        p.send_signal(signal.SIGINT)
        eq(p.wait(10), 1, "exit status after SIGINT (last status NOT_SERVING)")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@case
def watch_unknown_service_stays_open():
    p = subprocess.Popen([mctest.MOONCAKECTL, "health", "--endpoint=" + srv.endpoint,
                          "--service=svc.Later", "--watch"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        eq(readline(p), "SERVICE_UNKNOWN", "first update")
        srv.set("svc.Later", SERVING)
        eq(readline(p), "SERVING", "after the service appeared")
        p.send_signal(signal.SIGTERM)
        eq(p.wait(10), 0, "exit status (last status SERVING)")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@case
def unreachable_and_usage_errors():
    port = mctest.free_port()
    t0 = time.monotonic()
    r = run([mctest.MOONCAKECTL, "health", "--endpoint=127.0.0.1:%d" % port],
            check=False)
    eq(r.returncode, 1, "exit status for a refused connection")
    assert "UNAVAILABLE" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 5
    eq(run([mctest.MOONCAKECTL, "health"], check=False).returncode, 2, "no endpoint")
    eq(run([mctest.MOONCAKECTL, "health", "--endpoint=nohost"], check=False).returncode, 2,
       "bad endpoint")
    eq(run([mctest.MOONCAKECTL, "health", "--endpoint=" + srv.endpoint, "--timeout=soon"],
           check=False).returncode, 2, "bad timeout")
    eq(run([mctest.MOONCAKECTL, "health", "--bogus"], check=False).returncode, 2, "bad flag")
    eq(run([mctest.MOONCAKECTL, "nonsense"], check=False).returncode, 2, "bad command")
    r = run([mctest.MOONCAKECTL, "--help"])
    assert "health" in r.stdout and "bench" in r.stdout, r.stdout
    r = run([mctest.MOONCAKECTL, "--version"])
    assert r.stdout.startswith("mooncakectl "), r.stdout


@case
def many_checks_reuse_nothing_stale():
    # Twenty processes in a row: each opens, checks and closes cleanly.
    before = srv.checks
    for _ in range(20):
        eq(ctl().returncode, 0, "exit status")
    eq(srv.checks - before, 20, "checks seen by the server")


@case
def bench_rpc_prints_each_pattern_with_its_cpu_per_call():
    r = run([mctest.MOONCAKECTL, "bench", "rpc", "--duration=200ms", "--size=1M",
             "--patterns=large,unary"])
    rows = [l for l in r.stdout.splitlines() if l.strip()]
    assert any(l.startswith("unary, 1 stream") and "calls/s" in l for l in rows), r.stdout
    assert any(l.startswith("1 MiB echo") and "GB/s" in l for l in rows), r.stdout
    assert not any(l.startswith("unary, 64 streams") for l in rows), r.stdout
    cpu = [l.split() for l in rows if l.split()[:2] == ["CPU", "us/call"]]
    eq(len(cpu), 2, "CPU rows (one per pattern)")
    for c in cpu:
        assert float(c[2]) > 0 and float(c[3]) > 0, c
    eq(run([mctest.MOONCAKECTL, "bench", "rpc", "--patterns=unary,bogus"],
           check=False).returncode, 2, "unknown pattern")
    eq(run([mctest.MOONCAKECTL, "bench", "rpc", "--patterns="], check=False).returncode, 2,
       "empty pattern list")


try:
    mctest.main()
finally:
    srv.stop()
