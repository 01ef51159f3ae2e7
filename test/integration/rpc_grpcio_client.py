"""A real gRPC client (grpcio) against our server: run by test_rpc.c's
interop test as `python3 rpc_grpcio_client.py PORT PYDIR` while the
criterion process serves Diag and Health on PORT. Exit status 0 when every
check passed, 1 on a failure (printed), 77 when grpcio is missing."""
import sys

sys.path.insert(0, sys.argv[2])
try:
    import grpc
    import diag_pb2
    import health_pb2
except ImportError as e:  # pragma: no cover - environment problem
    print("skip: %s" % e)
    sys.exit(77)

MiB = 1 << 20
target = "127.0.0.1:%s" % sys.argv[1]
ch = grpc.insecure_channel(target, options=[
    ("grpc.max_send_message_length", 128 * MiB),
    ("grpc.max_receive_message_length", 64 * MiB),
])


def m(name, req, resp, kind="unary_unary"):
    return getattr(ch, kind)("/mooncake.diag.Diag/" + name,
                             request_serializer=req.SerializeToString,
                             response_deserializer=resp.FromString)


echo = m("Echo", diag_pb2.EchoRequest, diag_pb2.EchoResponse)
echo_stream = m("EchoStream", diag_pb2.EchoRequest, diag_pb2.EchoResponse, "stream_stream")
download = m("Download", diag_pb2.DownloadRequest, diag_pb2.Chunk, "unary_stream")
upload = m("Upload", diag_pb2.Chunk, diag_pb2.UploadSummary, "stream_unary")
check = ch.unary_unary("/grpc.health.v1.Health/Check",
                       request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                       response_deserializer=health_pb2.HealthCheckResponse.FromString)
failures = []


def expect(what, cond, detail=""):
    if not cond:
        failures.append("%s %s" % (what, detail))
        print("FAIL", what, detail)
    else:
        print("ok  ", what)


def code_of(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


r = echo(diag_pb2.EchoRequest(payload=b"hello"), timeout=10)
expect("unary echo", r.payload == b"hello", repr(r.payload))
r = echo(diag_pb2.EchoRequest(), timeout=10)
expect("empty echo", r.payload == b"")

msg = "not ready: 100% \"busy\"\n\tcaf\u00e9"
code, details = code_of(lambda: echo(diag_pb2.EchoRequest(status=9, message=msg), timeout=10))
expect("status and percent-encoded message", code == grpc.StatusCode.FAILED_PRECONDITION
       and details == msg, "%s %r" % (code, details))

chunks = list(download(diag_pb2.DownloadRequest(total_bytes=3 * MiB + 5, chunk_bytes=65536),
                       timeout=30))
data = b"".join(c.data for c in chunks)
expect("server streaming", len(data) == 3 * MiB + 5 and
       all(data[i] == i % 251 for i in range(0, len(data), 4093)), "%d bytes" % len(data))


def gen():
    for i in range(40):
        yield diag_pb2.Chunk(data=bytes([i]) * (i * 1000))


s = upload(gen(), timeout=30)
expect("client streaming", s.messages == 40 and s.total_bytes == sum(i * 1000 for i in range(40)),
       str(s))

reqs = [diag_pb2.EchoRequest(payload=b"%d" % i) for i in range(100)]
got = [x.payload for x in echo_stream(iter(reqs), timeout=30)]
expect("bidi streaming", got == [q.payload for q in reqs], "%d replies" % len(got))

big = bytes(range(256)) * (16 * MiB // 256)
r = echo(diag_pb2.EchoRequest(payload=big), timeout=60)
expect("16 MiB both ways", r.payload == big, "%d bytes" % len(r.payload))

code, _ = code_of(lambda: echo(diag_pb2.EchoRequest(delay_ms=3000), timeout=0.3))
expect("deadline", code == grpc.StatusCode.DEADLINE_EXCEEDED, str(code))

code, _ = code_of(lambda: ch.unary_unary("/mooncake.diag.Diag/Nope")(b"", timeout=10))
expect("unknown method", code == grpc.StatusCode.UNIMPLEMENTED, str(code))
code, _ = code_of(lambda: ch.unary_unary("/no.Such/Thing")(b"", timeout=10))
expect("unknown service", code == grpc.StatusCode.UNIMPLEMENTED, str(code))

code, _ = code_of(lambda: echo(diag_pb2.EchoRequest(payload=b"x" * (65 * MiB)),
                               timeout=30))
expect("too large for the server", code in (grpc.StatusCode.RESOURCE_EXHAUSTED,), str(code))

h = check(health_pb2.HealthCheckRequest(), timeout=10)
expect("health check", h.status == health_pb2.HealthCheckResponse.SERVING, str(h))
code, _ = code_of(lambda: check(health_pb2.HealthCheckRequest(service="nope"), timeout=10))
expect("health unknown service", code == grpc.StatusCode.NOT_FOUND, str(code))

# Cancel a server stream half way: the server must cope and keep serving.
it = download(diag_pb2.DownloadRequest(total_bytes=256 * MiB, chunk_bytes=65536), timeout=30)
next(it)
it.cancel()
r = echo(diag_pb2.EchoRequest(payload=b"after cancel"), timeout=10)
expect("serving after a cancel", r.payload == b"after cancel")

ch.close()
sys.exit(1 if failures else 0)
