"""The store's PyTorch tensor calls (put_tensor, get_tensor and their
batch_, pub_, _into and _with_tp forms) with real torch (Debian
python3-torch) against a mooncaked standalone, as Mooncake's tensor tests
and TransferQueue's Mooncake backend call them: every dtype Mooncake
stores, shapes of 0 to 4 dimensions, empty and non-contiguous tensors,
Mooncake's byte layout of the object (read back with get), tensors read
into a registered buffer as views of it, the tensor-parallel shards, and
what is refused (5 dimensions, non-tensors, a missing key).
"""
import ctypes
import os
import struct
import tempfile

import storetest as st
import mctest
from mctest import Daemon, case, eq

_tmp = tempfile.TemporaryDirectory(prefix="mooncake-tensor-")
SOCKET = os.path.join(_tmp.name, "agent.sock")
_state = {}


def store():
    """The one store of the cases, on a standalone daemon of their own."""
    if "store" not in _state:
        d = Daemon("standalone", args=["--socket=" + SOCKET, "--global-segment-size=256M"],
                   env=st.daemon_env())
        mctest.wait_for(lambda: "mounted with master" in d.output(), what="ready")
        os.environ["MOONCAKE_SOCKET"] = SOCKET
        from mooncake.store import MooncakeDistributedStore
        s = MooncakeDistributedStore()
        eq(s.setup("localhost", "P2PHANDSHAKE", 256 << 20, 64 << 20, "tcp", "",
                   "localhost:50051"), 0, "setup")
        _state.update(daemon=d, store=s)
    return _state["store"]


def torch():
    try:
        import torch as t
    except ImportError:
        raise AssertionError("torch missing (Debian package python3-torch)")
    return t


def same(a, b, what):
    assert b is not None, what + ": None"
    eq((b.dtype, tuple(b.shape)), (a.dtype, tuple(a.shape)), what + ": dtype and shape")
    assert torch().equal(a, b), what + ": values differ"


def samples():
    t = torch()
    g = t.Generator().manual_seed(7)
    out = [
        ("f32", t.randn(3, 5, generator=g)),
        ("f64", t.randn(2, 3, 4, generator=g, dtype=t.float64)),
        ("f16", t.randn(17, generator=g).half()),
        ("bf16", t.randn(4, 4, generator=g).bfloat16()),
        ("i8", t.randint(-128, 127, (9,), generator=g, dtype=t.int8)),
        ("u8", t.randint(0, 255, (2, 2, 2, 2), generator=g, dtype=t.uint8)),
        ("i16", t.randint(-999, 999, (5, 1), generator=g, dtype=t.int16)),
        ("i32", t.arange(24, dtype=t.int32).reshape(2, 3, 4)),
        ("i64", t.arange(-5, 5, dtype=t.int64)),
        ("bool", t.tensor([[True, False], [False, True]])),
        ("scalar", t.tensor(3.5)),
        ("empty", t.zeros(0, 3)),
        ("strided", t.arange(12, dtype=t.float32).reshape(3, 4).t()),  # not contiguous
        ("big", t.randn(512, 1024, generator=g)),  # 2 MiB
    ]
    for name in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"):
        dt = getattr(t, name, None)  # newer torch only
        if dt is not None:
            out.append((name, t.zeros(6, dtype=dt)))
    return out


@case
def put_get_every_dtype_and_shape():
    s = store()
    for name, x in samples():
        eq(s.put_tensor("t/" + name, x), 0, "put_tensor " + name)
        same(x, s.get_tensor("t/" + name), "get_tensor " + name)


@case
def the_object_is_mooncakes_layout():
    """40 bytes of TensorMetadata (int32 dtype, int32 ndim, int64
    shape[4], unused -1), then the elements: what Mooncake's readers of
    the raw object expect."""
    t = torch()
    s = store()
    x = t.arange(6, dtype=t.int32).reshape(2, 3)
    eq(s.put_tensor("lay/i32", x), 0, "put")
    raw = s.get("lay/i32")
    eq(struct.unpack("=ii4q", raw[:40]), (6, 2, 2, 3, -1, -1), "the metadata")
    eq(raw[40:], x.numpy().tobytes(), "the elements")
    eq(s.get_size("lay/i32"), 40 + 24, "its size")
    # and a tensor written by another client as Mooncake writes it reads back
    meta = struct.pack("=ii4q", 12, 1, 3, -1, -1, -1)  # bfloat16, (3,)
    y = t.tensor([1.0, -2.0, 0.5]).bfloat16()
    eq(s.put("lay/bf16", meta + y.view(t.uint8).numpy().tobytes()), 0, "raw put")
    same(y, s.get_tensor("lay/bf16"), "read as a tensor")


@case
def batches_and_misses():
    t = torch()
    s = store()
    xs = [t.randn(8, 8), t.arange(10), t.ones(2, 2, dtype=t.bool)]
    keys = ["b/%d" % i for i in range(len(xs))]
    eq(s.batch_put_tensor(keys, xs), [0, 0, 0], "batch_put_tensor")
    got = s.batch_get_tensor(keys + ["b/missing"])
    for i, x in enumerate(xs):
        same(x, got[i], "batch_get_tensor %d" % i)
    eq(got[3], None, "a missing key")
    eq(s.get_tensor("b/missing"), None, "get_tensor of a missing key")
    eq(s.put("b/raw", b"not a tensor at all, 40 bytes or more........"), 0, "raw put")
    eq(s.get_tensor("b/raw"), None, "an object that is no tensor")
    # what is refused: put returns INVALID_PARAMS (-600), nothing stored
    eq(s.put_tensor("b/5d", t.zeros(1, 1, 1, 1, 2)), -600, "5 dimensions")
    eq(s.put_tensor("b/list", [1, 2, 3]), -600, "not a tensor")
    eq(s.is_exist("b/5d"), 0, "nothing stored for the 5-D tensor")
    eq(s.batch_put_tensor(["b/ok", "b/bad"], [t.ones(3), "x"]), [0, -600], "mixed batch")
    eq(s.batch_put_tensor(["b/1", "b/2"], [t.ones(3)]), [-600, -600], "lengths differ")
    same(t.ones(3), s.get_tensor("b/ok"), "the good one of the mixed batch")


@case
def into_a_registered_buffer_without_a_copy():
    t = torch()
    s = store()
    xs = [t.randn(256, 64), t.arange(100, dtype=t.int16)]
    keys = ["into/%d" % i for i in range(len(xs))]
    eq(s.batch_put_tensor(keys, xs), [0, 0], "put")
    size = 1 << 20
    buf = (ctypes.c_ubyte * (2 * size))()
    base = ctypes.addressof(buf)
    eq(s.register_buffer(base, 2 * size), 0, "register_buffer")
    try:
        x = s.get_tensor_into(keys[0], base, size)
        same(xs[0], x, "get_tensor_into")
        eq(x.data_ptr(), base + 40, "a view of the buffer, past the metadata")
        got = s.batch_get_tensor_into(keys, [base, base + size], [size, size])
        same(xs[0], got[0], "batch_get_tensor_into 0")
        same(xs[1], got[1], "batch_get_tensor_into 1")
        eq(got[1].data_ptr(), base + size + 40, "the second view")
        eq(s.get_tensor_into(keys[0], base, 100), None, "a buffer too small")
        eq(s.get_tensor_into("into/missing", base, size), None, "a missing key")
    finally:
        eq(s.unregister_buffer(base), 0, "unregister_buffer")


@case
def tensor_parallel_shards():
    t = torch()
    s = store()
    w = t.randn(8, 6)
    eq(s.put_tensor_with_tp("tp/w", w, tp_rank=0, tp_size=4, split_dim=0), 0, "put 4 shards")
    for r, part in enumerate(w.chunk(4, 0)):
        same(part, s.get_tensor_with_tp("tp/w", tp_rank=r, tp_size=4), "shard %d" % r)
        same(part, s.get_tensor("tp/w_tp_%d" % r), "shard %d by its key" % r)
    eq(s.put_tensor_with_tp("tp/c", w, tp_size=3, split_dim=1), 0, "along dim 1")
    same(w.chunk(3, 1)[2], s.get_tensor_with_tp("tp/c", tp_rank=2, tp_size=3), "a column shard")
    ws = [t.randn(4, 4), t.arange(8, dtype=t.float32)]
    eq(s.batch_put_tensor_with_tp(["tp/a", "tp/b"], ws, tp_size=2), [0, 0], "batch, 2 shards")
    got = s.batch_get_tensor_with_tp(["tp/a", "tp/b"], tp_rank=1, tp_size=2)
    same(ws[0].chunk(2, 0)[1], got[0], "batch shard a")
    same(ws[1].chunk(2, 0)[1], got[1], "batch shard b")
    eq(s.put_tensor_with_tp("tp/short", t.ones(1), tp_size=2), -600, "fewer rows than shards")
    buf = (ctypes.c_ubyte * 4096)()
    base = ctypes.addressof(buf)
    eq(s.register_buffer(base, 4096), 0, "register")
    try:
        same(w.chunk(4, 0)[3], s.get_tensor_with_tp_into("tp/w", base, 4096, tp_rank=3,
                                                         tp_size=4), "a shard into a buffer")
        got = s.batch_get_tensor_with_tp_into(["tp/a", "tp/b"], [base, base + 2048],
                                              [2048, 2048], tp_rank=0, tp_size=2)
        same(ws[0].chunk(2, 0)[0], got[0], "batch shard into a buffer")
        same(ws[1].chunk(2, 0)[0], got[1], "batch shard into a buffer, second")
    finally:
        eq(s.unregister_buffer(base), 0, "unregister")
    # tp_size 1 is the plain call
    eq(s.put_tensor_with_tp("tp/one", w), 0, "tp_size 1")
    same(w, s.get_tensor("tp/one"), "stored under the key itself")


@case
def pub_with_a_replicate_config():
    t = torch()
    from mooncake.store import ReplicateConfig
    s = store()
    c = ReplicateConfig()
    c.replica_num = 1
    x = t.randn(5, 5)
    eq(s.pub_tensor("pub/x", x, c), 0, "pub_tensor")
    same(x, s.get_tensor("pub/x"), "read back")
    eq(s.batch_pub_tensor(["pub/a", "pub/b"], [x, x * 2], c), [0, 0], "batch_pub_tensor")
    same(x * 2, s.get_tensor("pub/b"), "batch read back")
    eq(s.pub_tensor_with_tp("pub/tp", x, c, tp_size=5, split_dim=1), 0, "pub_tensor_with_tp")
    same(x.chunk(5, 1)[4], s.get_tensor_with_tp("pub/tp", 4, 5), "a published shard")
    eq(s.batch_pub_tensor_with_tp(["pub/t2"], [x], c, tp_size=5), [0], "batch, with tp")
    bad = ReplicateConfig()
    bad.replica_num = 1
    bad.preferred_segments = ["a", "b"]
    eq(s.pub_tensor("pub/bad", x, bad), -600, "preferred segments that are not replica_num")
    eq(s.batch_pub_tensor(["pub/bad"], [x], bad), [-600], "the same, batched")


if __name__ == "__main__":
    mctest.main()
