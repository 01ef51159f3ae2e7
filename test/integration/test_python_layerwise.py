"""The layerwise session calls of Mooncake's store (PR #2881's contract, as
vLLM Ascend's and SGLang's layerwise KV pools call them) on two agents:
an object written a layer at a time between batch_put_start and
batch_put_end (invisible until then), read a layer at a time on the other
agent between batch_get_start and batch_get_end, and what is refused
(ranges past the object, calls without a session, a second start).
"""
import ctypes

import storetest as st
from storetest import Cluster, MiB
import mctest
from mctest import case, eq

_state = {}

LAYERS = 4
LAYER_BYTES = 64 * 1024


def cluster():
    if "cl" not in _state:
        cl = Cluster(agents=2)
        _state.update(cl=cl, a=cl.agents[0].store(), b=cl.agents[1].store())
    return _state["a"], _state["b"]


def layer_buffers(keys, seed):
    """Per key, LAYERS buffers of LAYER_BYTES (ctypes arrays, kept alive)."""
    out = {}
    for i, k in enumerate(keys):
        out[k] = [(ctypes.c_ubyte * LAYER_BYTES)(*([(seed + i * 7 + layer) % 251] * LAYER_BYTES))
                  for layer in range(LAYERS)]
    return out


def put_layerwise(s, keys, bufs, config=None):
    eq(s.batch_put_start(keys, [LAYERS * LAYER_BYTES] * len(keys)), [0] * len(keys), "start")
    for layer in range(LAYERS):
        res = s.batch_put_from_multi_buffer_ranges(
            keys, [[ctypes.addressof(bufs[k][layer])] for k in keys],
            [[LAYER_BYTES]] * len(keys), [[layer * LAYER_BYTES]] * len(keys), config)
        eq(res, [LAYER_BYTES] * len(keys), "layer %d written" % layer)


@case
def objects_written_and_read_a_layer_at_a_time():
    a, b = cluster()
    keys = ["lw/%d" % i for i in range(3)]
    bufs = layer_buffers(keys, 11)
    put_layerwise(a, keys, bufs)
    eq(a.batch_is_exist(keys), [0, 0, 0], "invisible before batch_put_end")
    eq(b.get(keys[0]), b"", "a get misses it")
    eq(a.batch_put_end(keys), [0, 0, 0], "batch_put_end")
    want = {k: b"".join(bytes(x) for x in bufs[k]) for k in keys}
    for k in keys:
        eq(b.get(k) == want[k], True, "the whole object on the other agent: " + k)
    eq(a.batch_put_end(keys[:1]), [0], "a second batch_put_end of a stored key")

    # read back a layer at a time on B, into one destination per layer
    eq(b.batch_get_start(keys + ["lw/none"]), [0, 0, 0, -704], "batch_get_start")
    dst = {k: [(ctypes.c_ubyte * LAYER_BYTES)() for _ in range(LAYERS)] for k in keys}
    for layer in reversed(range(LAYERS)):
        res = b.batch_get_into_multi_buffer_ranges(
            keys, [[ctypes.addressof(dst[k][layer])] for k in keys],
            [[LAYER_BYTES]] * len(keys), [[layer * LAYER_BYTES]] * len(keys))
        eq(res, [LAYER_BYTES] * len(keys), "layer %d read" % layer)
    for k in keys:
        eq(b"".join(bytes(x) for x in dst[k]) == want[k], True, "the layers of " + k)
    # two ranges of one key in one call, and a range past the end
    two = (ctypes.c_ubyte * 200)()
    p = ctypes.addressof(two)
    eq(b.batch_get_into_multi_buffer_ranges([keys[1]], [[p, p + 100]], [[100, 100]],
                                            [[5, LAYERS * LAYER_BYTES - 100]]), [200],
       "two ranges")
    eq(bytes(two) == want[keys[1]][5:105] + want[keys[1]][-100:], True, "their bytes")
    eq(b.batch_get_into_multi_buffer_ranges([keys[1]], [[p]], [[100]],
                                            [[LAYERS * LAYER_BYTES - 99]]), [-600],
       "a range past the object")
    eq(b.batch_get_into_multi_buffer_ranges(["lw/none"], [[p]], [[1]], [[0]]), [-600],
       "no read session")
    eq(b.batch_get_end(keys), 0, "batch_get_end")
    eq(b.batch_get_into_multi_buffer_ranges([keys[0]], [[p]], [[1]], [[0]]), [-600],
       "ended: no read session")
    # SGLang's names
    eq(b.batch_get_session_start(keys[:1]), [0], "batch_get_session_start")
    eq(b.batch_get_into_multi_buffer_ranges(keys[:1], [[p]], [[10]], [[0]]), [10], "read")
    eq(b.batch_get_session_end(keys[:1]), 0, "batch_get_session_end")


@case
def what_put_sessions_refuse():
    a, _ = cluster()
    buf = (ctypes.c_ubyte * 16)(*range(16))
    p = ctypes.addressof(buf)
    eq(a.batch_put_start(["r/a", "r/b", "r/c"], [32, 0, 32]), [0, -600, 0], "a zero size")
    eq(a.batch_put_start(["r/a"], [32]), [-600], "a second start while open")
    eq(a.batch_put_from_multi_buffer_ranges(["r/a"], [[p]], [[16]], [[17]]), [-600],
       "a range past the object")
    eq(a.batch_put_from_multi_buffer_ranges(["r/none"], [[p]], [[16]], [[0]]), [-600],
       "no put session")
    eq(a.batch_put_from_multi_buffer_ranges(["r/a"], [[p, p]], [[16, 16]], [[0, 16]]), [32],
       "two ranges")
    eq(a.batch_put_revoke(["r/a", "r/c"]), [0, 0], "revoke")
    eq(a.batch_put_end(["r/a"]), [-600], "revoked: nothing to end")
    eq(a.is_exist("r/a"), 0, "nothing stored")
    eq(a.batch_put_start(["r/a"], [32]), [0], "a new session after the revoke")
    eq(a.batch_put_from_multi_buffer_ranges(["r/a"], [[p]], [[16]], [[16]]), [16], "half")
    eq(a.batch_put_end(["r/a"]), [0], "stored")
    eq(a.get("r/a"), bytes(16) + bytes(range(16)), "the unwritten half is zeros")


@case
def the_ranges_config_places_the_object():
    a, b = cluster()
    from mooncake.store import ReplicateConfig
    keys = ["cfg/two"]
    bufs = layer_buffers(keys, 3)
    put_layerwise(a, keys, bufs, ReplicateConfig(replica_num=2))
    eq(a.batch_put_end(keys), [0], "end")
    segs = sorted(r.segment for r in b.get_replica_desc("cfg/two"))
    eq(segs, sorted(x.name for x in _state["cl"].agents), "replica_num=2 from the range call")


@case
def big_objects_are_assembled_in_memory_the_agent_maps():
    """From 1 MiB on, a put session's object is assembled in mc_host_alloc
    memory, which batch_put_end's put reads in place; ended and revoked
    sessions leave it to the next sessions of the same size (at most 256
    MiB kept), and close() frees it."""
    _, b = cluster()
    a = _state["cl"].agents[0].store()
    from mooncake import _native as n
    size = 2 * MiB
    half = size // 2
    keys = ["big/%d" % i for i in range(3)]
    eq(a.batch_put_start(keys, [size] * 3), [0] * 3, "start")
    addrs = {k: a._puts[k].addr for k in keys}
    for k in keys:
        eq(n.mc_host_size(addrs[k]), size, "agent-mapped memory of its size: " + k)
    src = {k: [(ctypes.c_ubyte * half)(*([(i * 2 + j) % 251 + 1] * half)) for j in range(2)]
           for i, k in enumerate(keys)}
    for j in range(2):
        res = a.batch_put_from_multi_buffer_ranges(
            keys, [[ctypes.addressof(src[k][j])] for k in keys], [[half]] * 3,
            [[j * half]] * 3)
        eq(res, [half] * 3, "half %d written" % j)
    eq(a.batch_put_end(keys[:2]), [0, 0], "end of two")
    eq(a.batch_put_revoke(keys[2:]), [0], "the third revoked")
    for k in keys[:2]:
        eq(b.get(k) == bytes(src[k][0]) + bytes(src[k][1]), True, "the object on B: " + k)
    eq(b.batch_is_exist(keys[2:]), [0], "the revoked one is not stored")

    # the next sessions of that size take the same memory; another size not
    again = ["big/again/%d" % i for i in range(3)]
    eq(a.batch_put_start(again + ["big/other"], [size] * 3 + [3 * MiB]), [0] * 4)
    eq(sorted(a._puts[k].addr for k in again), sorted(addrs.values()), "reused")
    other = a._puts["big/other"].addr
    assert other not in addrs.values(), "a new allocation for another size"
    eq(a.batch_put_from_multi_buffer_ranges(
        again[:1], [[ctypes.addressof(src[keys[2]][0])]], [[half]], [[half]]), [half])
    eq(a.batch_put_end(again[:1]), [0])
    got = b.get(again[0])
    eq(len(got), size)
    eq(got[half:] == bytes(src[keys[2]][0]), True, "the range written")

    # a collected session frees its memory; close() frees the kept ones
    sess = a._puts.pop("big/other")
    del sess
    import gc
    gc.collect()
    eq(n.mc_host_size(other), 0, "a dropped session's memory freed")
    a.close()
    for addr in list(addrs.values()):
        eq(n.mc_host_size(addr), 0, "freed by close()")

if __name__ == "__main__":
    try:
        mctest.main()
    finally:
        if "cl" in _state:
            for s in ("a", "b"):
                _state[s].close()
