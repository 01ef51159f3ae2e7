"""MooncakeDistributedStore as the frameworks call it: the call sequences
of SGLang HiCache's MooncakeStore (python/sglang/srt/mem_cache/storage/
mooncake_store/mooncake_store.py), LMCache's MooncakestoreConnector
(lmcache/v1/storage_backend/connector/mooncakestore_connector.py) and
vLLM's MooncakeStoreConnector worker (vllm/distributed/kv_transfer/
kv_connector/v1/mooncake/store/worker.py) and vLLM's ECMooncakeStore
(vllm/distributed/ec_transfer/ec_connector/mooncake_storage), written from their public
sources with numpy arrays in place of torch tensors, against a mooncaked
standalone. Every byte read back is checked. Then the rest of the API
surface those callers and upstream's own tests touch.
"""
import ctypes
import os
import struct
import tempfile
import urllib.request

import numpy as np

import storetest as st
import mctest
from mctest import Daemon, case, eq

_tmp = tempfile.TemporaryDirectory(prefix="mooncake-fw-")
SOCKET = os.path.join(_tmp.name, "agent.sock")
LEASE_S = 0.3
_daemon = None


def daemon():
    global _daemon
    if _daemon is None:
        _daemon = Daemon("standalone", args=["--socket=" + SOCKET, "--global-segment-size=256M",
                                             "--default-kv-lease-ttl=%dms" % (LEASE_S * 1000)],
                         env=st.daemon_env())
        mctest.wait_for(lambda: "mounted with master" in _daemon.output(), what="ready")
        os.environ["MOONCAKE_SOCKET"] = SOCKET
    return _daemon


def wait_leases():
    import time
    time.sleep(LEASE_S + 0.2)


def pattern(seed, size):
    return (np.arange(size, dtype=np.uint64) * 2654435761 + seed * 97).astype(np.uint8)


def ptr(a):
    return a.ctypes.data


# ---------------------------------------------------------------- SGLang

def sglang_setup(store, tp_size=1):
    """MooncakeStore.__init__: setup with 8 positional arguments (the 8th
    the shared transfer engine, None), the warmup put/is_exist/get."""
    global_segment_size = (256 << 20) // tp_size
    ret = store.setup("localhost", "P2PHANDSHAKE", global_segment_size, 16 * 1024 * 1024,
                      "tcp", "", "127.0.0.1:50051", None)
    eq(ret, 0, "setup with 8 positional arguments")
    warmup_key = "sglang_mooncake_store_warmup_key" + os.urandom(8).hex()
    warmup_value = bytes(4 * 1024)
    eq(store.put(warmup_key, warmup_value), 0, "warmup put")
    eq(store.is_exist(warmup_key), 1, "warmup is_exist")
    eq(store.get(warmup_key) == warmup_value, True, "warmup get")


@case
def sglang_hicache_mha_page_first():
    """batch_set_v1 / batch_get_v1 / batch_exists for an MHA host pool:
    keys {hash}_{rank}_k and _v, one buffer per key, existing keys
    skipped on set."""
    daemon()
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    sglang_setup(store)
    page_bytes, pages = 64 * 1024, 16
    kv_buffer = np.zeros(2 * pages * page_bytes, dtype=np.uint8)   # the host KV pool
    eq(store.register_buffer(ptr(kv_buffer), kv_buffer.nbytes), 0, "register_buffer(kv_buffer)")
    for i in range(2 * pages):
        kv_buffer[i * page_bytes:(i + 1) * page_bytes] = pattern(i, page_bytes)
    mha_suffix = "0"
    keys = ["sgl-page-%d" % p for p in range(pages)]
    key_strs, ptrs, sizes = [], [], []
    for p, k in enumerate(keys):
        for j, kv in enumerate(("k", "v")):
            key_strs.append("%s_%s_%s" % (k, mha_suffix, kv))
            ptrs.append(ptr(kv_buffer) + (2 * p + j) * page_bytes)
            sizes.append(page_bytes)
    # batch_set_v1: only keys that do not exist are put.
    exist = store.batch_is_exist(key_strs)
    eq(exist, [0] * len(key_strs), "nothing stored yet")
    missing = [i for i, e in enumerate(exist) if e != 1][:len(key_strs) // 2]
    put = store.batch_put_from([key_strs[i] for i in missing], [ptrs[i] for i in missing],
                               [sizes[i] for i in missing])
    eq(put, [0] * len(missing), "first half put")
    exist = store.batch_is_exist(key_strs)
    eq(sum(1 for e in exist if e == 1), len(missing), "half exists")
    # batch_exists: the prefix of pages whose k and v both exist.
    prefix = next((i // 2 for i, e in enumerate(exist) if e != 1), len(exist) // 2)
    eq(prefix, pages // 2, "batch_exists prefix")
    missing = [i for i, e in enumerate(exist) if e != 1]
    put = store.batch_put_from([key_strs[i] for i in missing], [ptrs[i] for i in missing],
                               [sizes[i] for i in missing])
    eq(put, [0] * len(missing), "second half put")
    # batch_get_v1 into another host pool.
    dst = np.zeros_like(kv_buffer)
    eq(store.register_buffer(ptr(dst), dst.nbytes), 0, "register_buffer(dst)")
    dptrs = [p - ptr(kv_buffer) + ptr(dst) for p in ptrs]
    got = store.batch_get_into(key_strs, dptrs, sizes)
    eq(all(r == page_bytes for r in got), True, "batch_get_into sizes %s" % got[:4])
    eq(np.array_equal(dst, kv_buffer), True, "every byte")
    wait_leases()                    # the gets leased every object
    eq(store.remove_all(), len(key_strs) + 1, "clear(): remove_all")
    store.close()


@case
def sglang_hicache_mla_layer_first_multi_buffers():
    """The MLA layer_first layout: one object per page from one piece
    per layer (batch_put_from_multi_buffers with a ReplicateConfig, then
    batch_get_into_multi_buffers)."""
    daemon()
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    store = MooncakeDistributedStore()
    sglang_setup(store)
    layers, pages, piece = 6, 8, 4096
    kv = [pattern(100 + layer, pages * piece) for layer in range(layers)]  # one buffer per layer
    for a in kv:
        eq(store.register_buffer(ptr(a), a.nbytes), 0, "register a layer buffer")
    keys = ["mla-page-%d__k" % p for p in range(pages)]
    all_ptrs = [[ptr(kv[layer]) + p * piece for layer in range(layers)] for p in range(pages)]
    all_sizes = [[piece] * layers for _ in range(pages)]
    config = ReplicateConfig()
    eq(store.batch_put_from_multi_buffers(keys, all_ptrs, all_sizes, config), [0] * pages,
       "batch_put_from_multi_buffers")
    eq(store.get_size(keys[3]), layers * piece, "one object per page")
    out = [np.zeros(pages * piece, dtype=np.uint8) for _ in range(layers)]
    for a in out:
        store.register_buffer(ptr(a), a.nbytes)
    dst_ptrs = [[ptr(out[layer]) + p * piece for layer in range(layers)] for p in range(pages)]
    res = store.batch_get_into_multi_buffers(keys, dst_ptrs, all_sizes)
    eq(res, [layers * piece] * pages, "bytes read per key")
    for layer in range(layers):
        eq(np.array_equal(out[layer], kv[layer]), True, "layer %d" % layer)
    # A page is the layers' pieces one after another.
    eq(store.get(keys[2]) == b"".join(bytes(kv[layer][2 * piece:3 * piece])
                                      for layer in range(layers)), True, "value layout")
    # Mismatched lists: negative per key, no exception.
    bad = store.batch_put_from_multi_buffers(keys[:2], all_ptrs[:1], all_sizes[:1], config)
    eq(len(bad) == 2 and all(r < 0 for r in bad), True, "mismatched lists %s" % bad)
    bad = store.batch_get_into_multi_buffers(keys[:1], [[ptr(out[0])]], [[1, 2]])
    eq(len(bad) == 1 and bad[0] < 0, True, "mismatched pieces %s" % bad)
    small = store.batch_get_into_multi_buffers(keys[:1], [[ptr(out[0])]], [[piece]])
    eq(small, [-600], "value larger than its buffers: INVALID_PARAMS")
    store.remove_all()
    store.close()


@case
def sglang_hicache_standalone_storage():
    """standalone_storage=True: the host pool from MooncakeHostTensorAllocator
    (MooncakeHostMemAllocator().alloc), setup_dummy(required_bytes,
    DEFAULT_LOCAL_BUFFER_SIZE, client_server_address), zero-copy puts and
    gets of that pool."""
    daemon()
    from mooncake.store import MooncakeDistributedStore, MooncakeHostMemAllocator

    allocator = MooncakeHostMemAllocator()
    size = 4 << 20
    ptr_int = allocator.alloc(size)
    eq(ptr_int != 0, True, "alloc")
    c_array = (ctypes.c_byte * size).from_address(ptr_int)
    pool = np.frombuffer(c_array, dtype=np.uint8)          # torch.frombuffer(c_array)
    pool[:] = pattern(7, size)
    store = MooncakeDistributedStore()
    eq(store.setup_dummy(size, 16 * 1024 * 1024, "127.0.0.1:50052"), 0, "setup_dummy")
    eq(store.register_buffer(ptr_int, size), 0, "register_buffer of allocator memory")
    keys = ["standalone-%d" % i for i in range(4)]
    chunk = size // 8
    eq(store.batch_put_from(keys, [ptr_int + i * chunk for i in range(4)], [chunk] * 4),
       [0] * 4, "batch_put_from")
    got = store.batch_get_into(keys, [ptr_int + (4 + i) * chunk for i in range(4)], [chunk] * 4)
    eq(got, [chunk] * 4, "batch_get_into")
    eq(np.array_equal(pool[4 * chunk:], pool[:4 * chunk]), True, "every byte")
    stats = store._stats()
    eq(stats.buffers >= 1, True, "the allocator memory is an agent buffer (zero copy)")
    # alloc_from_mem_pool is bounded by mem_pool_size.
    p = store.alloc_from_mem_pool(size // 2)
    eq(p != 0, True, "alloc_from_mem_pool within the pool")
    eq(store.alloc_from_mem_pool(size), 0, "beyond the pool: 0")
    eq(allocator.free(ptr_int), 0, "free")
    eq(allocator.free(ptr_int), -2, "free twice: not an allocation")
    store.remove_all()
    store.close()


@case
def allocator_memory_across_sessions_and_freed():
    """One allocation used by two sessions of the process (each hands it
    to the agent once); freeing it takes it back from both, and memory
    allocated after it — at the same address or not — is never read
    through an agent's stale mapping."""
    daemon()
    from mooncake.store import MooncakeDistributedStore, MooncakeHostMemAllocator

    s1, s2 = MooncakeDistributedStore(), MooncakeDistributedStore()
    for s in (s1, s2):
        eq(s.setup("localhost", "P2PHANDSHAKE", 1 << 26, 1 << 24, "tcp", "", "x"), 0, "setup")
    al = MooncakeHostMemAllocator()
    n = 1 << 20
    before = s1._stats().buffers
    p = al.alloc(n)
    ctypes.memset(p, 0x11, n)
    eq(s1.put_from("alloc-a1", p, n), 0, "put_from (first use by session 1)")
    eq(s2.register_buffer(p, n), 0, "register_buffer (session 2)")
    eq(s2.put_from("alloc-a2", p, n), 0, "put_from by session 2")
    eq(s1._stats().buffers, before + 2, "each session handed it to the agent once")
    eq(al.free(p), 0, "free")
    eq(s1._stats().buffers, before, "both sessions gave it back")
    for i in range(4):
        q = al.alloc(n)
        ctypes.memset(q, 0x20 + i, n)
        eq(s1.put_from("alloc-b%d" % i, q, n), 0, "put_from of new memory")
        eq(s1.get("alloc-b%d" % i) == bytes([0x20 + i]) * n, True, "its own bytes")
        eq(al.free(q), 0, "free")
    eq(s1.get("alloc-a2") == b"\x11" * n, True, "the first value")
    for s in (s1, s2):
        s.remove_all(force=True)
        s.close()


# ---------------------------------------------------------------- LMCache

METADATA_BYTES_LEN = 28


@case
def lmcache_connector():
    """MooncakestoreConnector: setup with 7 positional arguments, a
    ReplicateConfig(replica_num=1, preferred_segment=get_hostname()), the
    pinned CPU buffer registered, put_from / batch_get_into (no chunk
    metadata), put_parts(key, metadata, kv_bytes) / batch_get_buffer
    (chunk metadata: memoryview(buffer)[:28], frombuffer(buffer,
    offset=28)), is_exist, unregister_buffer, close."""
    daemon()
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    store = MooncakeDistributedStore()
    store.setup("localhost", "P2PHANDSHAKE", 3355443200, 1073741824, "tcp", "",
                "127.0.0.1:50051")
    replica_config = ReplicateConfig()
    replica_config.replica_num = 1
    replica_config.preferred_segment = store.get_hostname()   # prefer_local_alloc
    chunk = 256 * 1024
    pinned = np.zeros(8 * chunk, dtype=np.uint8)               # pin_allocator.buffer
    eq(store.register_buffer(ptr(pinned), pinned.size), 0, "register pinned buffer")
    # save_chunk_meta=False: put_from, then batch_get_into.
    keys = ["lmcache@model@0@%d@bf16" % i for i in range(4)]
    for i, k in enumerate(keys):
        pinned[i * chunk:(i + 1) * chunk] = pattern(200 + i, chunk)
        eq(store.put_from(k, ptr(pinned) + i * chunk, chunk, replica_config), 0, "put_from")
    eq(store.is_exist(keys[0]), 1, "exists")
    n_read = store.batch_get_into(keys, [ptr(pinned) + (4 + i) * chunk for i in range(4)],
                                  [chunk] * 4)
    eq(n_read, [chunk] * 4, "batch_get_into")
    eq(np.array_equal(pinned[4 * chunk:], pinned[:4 * chunk]), True, "every byte")
    # save_chunk_meta=True: put_parts(key, metadata, kv) and batch_get_buffer.
    kv = pattern(300, 3 * 4096).view(np.uint16)                 # a bf16-like chunk
    kv_bytes = kv.tobytes()
    meta = struct.pack("<iiiiiii", len(kv_bytes), 2, 3, 2048, 0, 1, 0)
    eq(len(meta), METADATA_BYTES_LEN, "metadata length")
    eq(store.put_parts("lmcache-meta-0", meta, kv_bytes), 0, "put_parts")
    buffers = store.batch_get_buffer(["lmcache-meta-0", "lmcache-missing"])
    eq(buffers[1], None, "a missing key is None")
    buffer = buffers[0]
    view = memoryview(buffer)
    eq(bytes(view[:METADATA_BYTES_LEN]), meta, "metadata bytes")
    eq(len(view), len(kv_bytes) + METADATA_BYTES_LEN, "length")
    tensor = np.frombuffer(buffer, dtype=np.uint16, offset=METADATA_BYTES_LEN,
                           count=kv.size).reshape(kv.shape)
    eq(np.array_equal(tensor, kv), True, "torch.frombuffer(buffer, offset=28, count)")
    del view, tensor, buffer, buffers
    eq(store.unregister_buffer(ptr(pinned)), 0, "unregister")
    eq(store.close(), 0, "close")
    eq(store.close(), 0, "close again")


@case
def vllm_ec_connector():
    """vLLM's ECMooncakeStore (vllm/distributed/ec_transfer/ec_connector/
    mooncake_storage, fast_transfer): setup with 7 positional arguments,
    ReplicateConfig() with replica_num set, register_buffer of its tensor
    pool, put_batch of JSON metadata under "<key>_metadata" then
    batch_put_from of the tensors from the pool, batch_is_exist,
    get_batch of the metadata then batch_get_into the pool; the other
    path's get_batch of length-prefixed values; and close() calling
    unregister_buffer(base, size) with the size, then close."""
    import json
    daemon()
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    store = MooncakeDistributedStore()
    eq(store.setup("localhost", "P2PHANDSHAKE", 3355443200, 1073741824, "tcp", "",
                   "127.0.0.1:50051"), 0, "setup")
    replica_config = ReplicateConfig()
    replica_config.replica_num = 1
    pool_size = 4 << 20
    pool = np.zeros(pool_size, dtype=np.uint8)              # TensorMemoryPool
    eq(store.register_buffer(ptr(pool), pool_size), 0, "register the tensor pool")
    keys = ["ec/mm-hash-%d" % i for i in range(3)]
    shapes = [(16, 64), (8, 128), (4, 32)]                   # bf16 encoder outputs
    addrs, sizes, metas = [], [], []
    off = 0
    for i, shp in enumerate(shapes):
        n_bytes = int(np.prod(shp)) * 2
        pool[off:off + n_bytes] = pattern(500 + i, n_bytes)
        addrs.append(ptr(pool) + off)
        sizes.append(n_bytes)
        metas.append(json.dumps({"shape": list(shp), "dtype": "torch.bfloat16"}).encode())
        off += n_bytes
    eq(store.put_batch([k + "_metadata" for k in keys], metas, replica_config), 0,
       "put_batch of the metadata")
    eq(store.batch_put_from(keys, addrs, sizes, replica_config), [0] * 3, "batch_put_from")
    eq(store.batch_is_exist(keys + ["ec/none"]), [1, 1, 1, 0], "batch_is_exist")
    meta_bytes = store.get_batch([k + "_metadata" for k in keys] + ["ec/none_metadata"])
    eq(meta_bytes[3], b"", "a missing key's metadata is empty")
    dst, dst_addrs = off, []
    for i, mb in enumerate(meta_bytes[:3]):
        meta = json.loads(mb.decode("utf-8"))
        eq(tuple(meta["shape"]), shapes[i], "metadata shape")
        dst_addrs.append(ptr(pool) + dst)
        dst += sizes[i]
    eq(store.batch_get_into(keys, dst_addrs, sizes), sizes, "batch_get_into the pool")
    eq(np.array_equal(pool[off:dst], pool[:off]), True, "every byte")
    # fast_transfer off: one value, a 4-byte big-endian metadata length first
    meta = json.dumps({"shape": [2, 3], "serialized_dtype": "uint16",
                       "original_dtype": "torch.bfloat16"}).encode()
    data = pattern(600, 12).tobytes()
    eq(store.put_batch(["ec/plain"], [len(meta).to_bytes(4, "big") + meta + data],
                       replica_config), 0, "put_batch")
    got = store.get_batch(["ec/plain"])[0]
    n_meta = int.from_bytes(got[:4], "big")
    eq((json.loads(got[4:4 + n_meta])["shape"], got[4 + n_meta:]), ([2, 3], data), "get_batch")
    # close(): unregister_buffer with the base address and the size
    eq(store.unregister_buffer(ptr(pool), pool_size + 1), -600, "another size is refused")
    eq(store.unregister_buffer(ptr(pool), pool_size), 0, "unregister_buffer(base, size)")
    eq(store.unregister_buffer(ptr(pool)), -600, "unregistered already")
    eq(store.close(), 0, "close")


@case
def vllm_embedding_store_client():
    """vLLM's MooncakeEmbeddingStoreClient (ec_connector/
    mooncake_store_embedding/store_client.py): setup as
    setup_mooncake_store does in "standalone-store" mode
    (global_segment_size 0), ReplicateConfig with data_type
    ObjectDataType.TENSOR; a put registers the tensor and a 24-byte
    header ("<IIQQ": magic, dtype, tokens, hidden), puts both with
    batch_put_from_multi_buffers and unregisters them; a load registers
    one read buffer once and batch_get_into's header and data at offsets
    in it; close unregisters it. Every call's result as that client
    checks it (0, 1 per exist, bytes read)."""
    daemon()
    from mooncake.store import MooncakeDistributedStore, ObjectDataType, ReplicateConfig

    store = MooncakeDistributedStore()
    eq(store.setup("10.0.0.7", "P2PHANDSHAKE", 0, 4 * 1024 ** 3, "rdma", "",
                   "127.0.0.1:50051"), 0, "setup, standalone-store mode")
    rc = ReplicateConfig()
    rc.data_type = ObjectDataType.TENSOR
    header_fmt = struct.Struct("<IIQQ")
    keys, tensors = [], []
    for i, (tokens, hidden) in enumerate([(7, 64), (3, 128), (12, 32)]):
        t = pattern(700 + i, tokens * hidden * 2)            # bf16 [tokens, hidden]
        hdr = (ctypes.c_ubyte * header_fmt.size).from_buffer_copy(
            header_fmt.pack(0x4D4F4F4E, 12, tokens, hidden))
        hptr = ctypes.addressof(hdr)
        key = "emb/v3/%d" % i
        for addr, size in ((ptr(t), t.nbytes), (hptr, header_fmt.size)):
            eq(store.register_buffer(addr, size), 0, "register for the put")
        eq(store.batch_put_from_multi_buffers([key], [[hptr, ptr(t)]],
                                              [[header_fmt.size, t.nbytes]], rc), [0],
           "batch_put_from_multi_buffers(header, tensor)")
        for addr in (hptr, ptr(t)):
            eq(store.unregister_buffer(addr), 0, "unregister after the put")
        keys.append(key)
        tensors.append((t, tokens, hidden))
    eq(store.batch_is_exist(keys + ["emb/v3/none"]), [1, 1, 1, 0], "batch_is_exist")
    read = np.zeros(1 << 20, dtype=np.uint8)
    eq(store.register_buffer(ptr(read), read.nbytes), 0, "register the read buffer")
    sizes = [header_fmt.size + t.nbytes for t, _, _ in tensors]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    eq(store.batch_get_into(keys, [ptr(read) + o for o in offsets], sizes), sizes,
       "batch_get_into the read buffer")
    for (t, tokens, hidden), off in zip(tensors, offsets):
        magic, dtype, n_tok, n_hid = header_fmt.unpack_from(read, off)
        eq((magic, dtype, n_tok, n_hid), (0x4D4F4F4E, 12, tokens, hidden), "header")
        eq(np.array_equal(read[off + header_fmt.size:off + header_fmt.size + t.nbytes], t),
           True, "tensor bytes")
    eq(store.unregister_buffer(ptr(read)), 0, "close: unregister the read buffer")
    eq(store.close(), 0, "close")


@case
def put_from_with_metadata_and_init_all():
    """put_from_with_metadata stores the metadata then the data, as
    get_buffer's readers split them; init_all is setup with Mooncake's
    defaults."""
    daemon()
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    eq(store.init_all("tcp", "", 1 << 26), 0, "init_all")
    meta = np.frombuffer(struct.pack("<iiiiiii", 4096, 2, 3, 2048, 0, 1, 0), dtype=np.uint8)
    kv = pattern(400, 4096)
    eq(store.put_from_with_metadata("meta-kv", ptr(kv), ptr(meta), kv.size, meta.size), 0,
       "put_from_with_metadata")
    buf = store.get_buffer("meta-kv")
    eq(bytes(memoryview(buf)), meta.tobytes() + kv.tobytes(), "metadata, then data")
    del buf
    eq(store.put_from_with_metadata("meta-kv", ptr(kv), ptr(meta), kv.size, meta.size), 0,
       "again: an existing key is success")
    wait_leases()
    eq(store.remove("meta-kv"), 0, "remove")
    store.close()


# ---------------------------------------------------------------- vLLM

@case
def vllm_store_connector():
    """MooncakeStoreConnector's worker: setup (embedded mode), the KV
    caches registered, KVCacheStoreSendingThread (batch_is_exist, then
    batch_put_from_multi_buffers(keys, addrs, sizes, replicate_config)
    for the missing blocks, one object per block from its K and V pieces
    of every layer), KVCacheStoreRecvingThread
    (batch_get_into_multi_buffers into other blocks)."""
    daemon()
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    store = MooncakeDistributedStore()
    eq(store.setup("127.0.0.1", "P2PHANDSHAKE", 4 << 30, 64 << 20, "tcp", "",
                   "127.0.0.1:50051"), 0, "setup")
    layers, blocks, block_bytes = 4, 32, 8192
    caches = []   # per layer: [2 (K, V), blocks, block_bytes]
    for layer in range(layers):
        c = np.zeros((2, blocks, block_bytes), dtype=np.uint8)
        eq(store.register_buffer(ptr(c), c.nbytes), 0, "register kv cache")
        caches.append(c)
    for layer in range(layers):
        for kv in range(2):
            for b in range(blocks // 2):
                caches[layer][kv, b] = pattern(layer * 1000 + kv * 100 + b, block_bytes)
    replicate_config = ReplicateConfig()

    def prepare(block_ids):
        addrs, sizes = [], []
        for b in block_ids:
            a, s = [], []
            for layer in range(layers):
                for kv in range(2):
                    a.append(ptr(caches[layer]) + (kv * blocks + b) * block_bytes)
                    s.append(block_bytes)
            addrs.append(a)
            sizes.append(s)
        return addrs, sizes

    keys = ["vllm@%016x@tp0" % (0xabc0 + b) for b in range(blocks // 2)]
    exists = store.batch_is_exist(keys)
    missing = [i for i, e in enumerate(exists) if e != 1]
    eq(len(missing), len(keys), "all missing")
    addrs, sizes = prepare(range(blocks // 2))
    res = store.batch_put_from_multi_buffers(keys, addrs, sizes, replicate_config)
    eq([i for i, v in enumerate(res) if v < 0], [], "no failed keys")
    eq(store.batch_is_exist(keys), [1] * len(keys), "stored")
    # Load into the other half of the blocks.
    addrs, sizes = prepare(range(blocks // 2, blocks))
    res = store.batch_get_into_multi_buffers(keys, addrs, sizes)
    eq(res, [2 * layers * block_bytes] * len(keys), "bytes loaded")
    for layer in range(layers):
        eq(np.array_equal(caches[layer][:, blocks // 2:], caches[layer][:, :blocks // 2]), True,
           "layer %d blocks" % layer)
    # A second save of the same blocks finds them all (dedup).
    eq([e for e in store.batch_is_exist(keys) if e != 1], [], "dedup")
    store.remove_all()
    store.close()


# ---------------------------------------------------------------- the rest

@case
def setup_signature_and_close():
    """Upstream's full positional signature; refused options; a failed
    setup leaves the store unset; close() and setup() again."""
    daemon()
    from mooncake.store import MooncakeDistributedStore, HC_HEALTHY, HC_NOT_INITIALIZED

    s = MooncakeDistributedStore()
    eq(s.health_check(), HC_NOT_INITIALIZED, "before setup")
    eq(s.setup("localhost", "P2PHANDSHAKE", 1 << 26, 1 << 24, "tcp", "", "127.0.0.1:50051",
               None, False, "", "default", False, 9300), 0, "13 positional arguments")
    eq(s.health_check(), HC_HEALTHY, "healthy")
    eq(s.close(), 0, "close")
    eq(s.health_check(), HC_NOT_INITIALIZED, "after close")
    eq(s.put("k", b"v"), -600, "a call after close: INVALID_PARAMS")
    eq(s.get("k"), b"", "a get after close")
    eq(s.setup("localhost", "P2PHANDSHAKE", 1 << 26, 1 << 24, "tcp", "", "x",
               enable_ssd_offload=True), -600, "SSD offload refused")
    eq(s.setup("localhost", "P2PHANDSHAKE", 1 << 26, 1 << 24, "tcp", "", "x",
               tenant_id="tenant-a"), -600, "a tenant refused")
    eq(s.health_check(), HC_NOT_INITIALIZED, "a failed setup leaves it unset")
    try:
        s.setup("localhost", "P2PHANDSHAKE", 1 << 26, 1 << 24, "tcp", "", "x", engine=object())
        raise AssertionError("a foreign engine must be a TypeError")
    except TypeError:
        pass
    from mooncake.engine import TransferEngine
    te = TransferEngine()
    eq(te.initialize("localhost", "P2PHANDSHAKE", "tcp", ""), 0, "engine")
    eq(s.setup("localhost", "P2PHANDSHAKE", 1 << 26, 1 << 24, "tcp", "", "x",
               te.get_engine()), 0, "setup with engine=get_engine()")
    eq(s.put("k", b"v"), 0, "usable")
    s.remove("k", force=True)
    s.close()
    te.close()


@case
def client_http_server():
    daemon()
    from mooncake.store import MooncakeDistributedStore

    port = mctest.free_port() if hasattr(mctest, "free_port") else 0
    if not port:
        import socket
        sk = socket.socket()
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
        sk.close()
    s = MooncakeDistributedStore()
    eq(s.setup("localhost", "P2PHANDSHAKE", 1 << 26, 1 << 24, "tcp", "", "x",
               enable_client_http_server=True, client_http_port=port), 0, "setup")
    base = "http://127.0.0.1:%d" % port
    with urllib.request.urlopen(base + "/health", timeout=5) as r:
        eq((r.status, r.read()), (200, b"OK\n"), "/health")
    s.put("http-k", b"x" * 10)
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        text = r.read().decode()
    eq("mooncake_client_healthy 1" in text and "mooncake_client_agent_puts_total" in text, True,
       "/metrics")
    with urllib.request.urlopen(base + "/metrics/summary", timeout=5) as r:
        eq(r.status, 200, "/metrics/summary")
    s.remove("http-k", force=True)
    s.close()


@case
def buffer_handle_buffer_protocol():
    """memoryview(h) and numpy.frombuffer(h) on this interpreter (3.11:
    no PEP 688), zero copy for a local object; a release while a view is
    exported waits for it."""
    daemon()
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    s.setup("localhost", "P2PHANDSHAKE", 1 << 26, 1 << 24, "tcp", "", "x")
    value = bytes(pattern(9, 100000))
    eq(s.put("bp", value), 0, "put")
    h = s.get_buffer("bp")
    eq(h.is_mapped(), True, "a local object is mapped")
    m = memoryview(h)
    eq((m.format, m.nbytes, bytes(m) == value), ("B", len(value), True), "memoryview")
    eq(m.obj is h, True, "the view exports the handle")
    a = np.frombuffer(h, dtype=np.uint8)
    eq(a.ctypes.data, h.ptr(), "numpy.frombuffer does not copy")
    h.release()                      # views exported: deferred
    eq(bytes(m[:10]), value[:10], "still readable")
    del a, m
    eq(h._view, None, "released with the last view")
    hs = s.batch_get_buffer(["bp", "nope", "bp"])
    eq([x is not None for x in hs], [True, False, True], "batch_get_buffer")
    eq(bytes(memoryview(hs[2])) == value, True, "bytes")
    del hs
    s.remove("bp", force=True)
    s.close()


@case
def replicate_config_fields():
    daemon()
    from mooncake.store import (MooncakeDistributedStore, ObjectDataType, ReplicateConfig,
                                SoftPinAction)
    import mooncake.store as ms

    for name in ("SoftPinAction", "ReplicaStatus", "ObjectDataType", "TaskType", "TaskStatus",
                 "KVCACHE", "COMPLETE", "REPLICA_COPY", "SUCCESS", "BufferPool",
                 "get_alloc_func_addr", "get_free_func_addr", "QueryTaskResponse"):
        eq(hasattr(ms, name), True, "mooncake.store." + name)
    import mooncake
    eq(mooncake.BufferPool is ms.BufferPool, True, "mooncake.BufferPool")
    s = MooncakeDistributedStore()
    s.setup("localhost", "P2PHANDSHAKE", 1 << 26, 1 << 24, "tcp", "", "x")
    c = ReplicateConfig()
    eq((c.replica_num, c.soft_pin_action, c.preferred_segment), (1, SoftPinAction.PRESERVE, ""),
       "defaults")
    c.soft_pin_action = SoftPinAction.ENABLE
    c.preferred_segments = [s.get_hostname()]
    c.data_type = ObjectDataType.KVCACHE
    c.prefer_alloc_in_same_node = True
    eq(s.put("rc-ok", b"x", c), 0, "acted-on fields")
    eq(c.with_soft_pin, True, "with_soft_pin follows soft_pin_action")
    for field, value in (("with_hard_pin", True), ("soft_pin_ttl_ms", 1234),
                         ("preferred_segments", ["a:1", "b:2"]), ("nof_replica_num", 1),
                         ("host_id", "h1")):
        bad = ReplicateConfig()
        setattr(bad, field, value)
        eq(s.put("rc-" + field, b"x", bad), -600, "refused: " + field)
        eq(s.is_exist("rc-" + field), 0, "nothing stored for " + field)
    try:
        c.group_ids = ["g"]
        raise AssertionError("an unknown field must be an AttributeError")
    except AttributeError:
        pass
    eq(s.create_copy_task("rc-ok", ["a:1"]), ((0, 0), -1011), "copy task refused")
    eq(s.create_move_task("rc-ok", "a:1", "b:2"), ((0, 0), -1011), "move task refused")
    eq(s.query_task((1, 2)), (None, -1011), "query refused")
    s.remove_all(force=True)
    s.close()


@case
def upserts_ranges_and_clear():
    daemon()
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    s.setup("localhost", "P2PHANDSHAKE", 1 << 26, 1 << 24, "tcp", "", "x")
    eq(s.put("u1", b"old"), 0, "put")
    eq(s.upsert_parts("u1", b"ne", b"w"), 0, "upsert_parts")
    eq(s.get("u1"), b"new", "replaced")
    wait_leases()
    eq(s.upsert_batch(["u1", "u2"], [b"a", b"b"]), 0, "upsert_batch")
    eq(s.get_batch(["u1", "u2"]), [b"a", b"b"], "values")
    eq(s.upsert_batch(["u1"], [b"a", b"b"]), -600, "mismatched upsert_batch")
    # get_into_ranges: upstream's example, byte for byte.
    data1 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    data2 = b"abcdefghijklmnopqrstuvwxyz0123456789"
    eq(s.put("rk1", data1), 0, "put key1")
    eq(s.put("rk2", data2), 0, "put key2")
    b0 = (ctypes.c_ubyte * 32)()
    b1 = (ctypes.c_ubyte * 32)()
    p0, p1 = ctypes.addressof(b0), ctypes.addressof(b1)
    eq(s.register_buffer(p0, 32), 0, "register")
    eq(s.register_buffer(p1, 32), 0, "register")
    ctypes.memset(p0, ord("_"), 32)
    ctypes.memset(p1, ord("_"), 32)
    res = s.get_into_ranges([p0, p1], [["rk1", "rk2"], ["rk2", "rk1"]],
                            [[[0, 20], [8]], [[4], [16]]], [[[2, 30], [10]], [[0], [12]]],
                            [[[4, 3], [6]], [[6], [4]]])
    eq(res, [[[4, 3], [6]], [[6], [4]]], "results")
    eq(bytes(b0[0:4]), data1[2:6], "b0[0:4]")
    eq(bytes(b0[8:14]), data2[10:16], "b0[8:14]")
    eq(bytes(b0[20:23]), data1[30:33], "b0[20:23]")
    eq(bytes(b1[4:10]), data2[0:6], "b1[4:10]")
    eq(bytes(b1[16:20]), data1[12:16], "b1[16:20]")
    mism = s.get_into_ranges([p0], [["rk1", "rk2"]], [[[0], []]], [[[0, 1], []]],
                             [[[4, 4], []]])
    eq((len(mism), len(mism[0]), mism[0][0][0] < 0, mism[0][1]), (1, 2, True, []),
       "shape mismatch")
    eq(s.get_into_ranges([p0], [["rk1"]], [[[0]]], [[[len(data1) - 1]]], [[[4]]])[0][0][0] < 0,
       True, "source overflow")
    eq(s.get_into_ranges([p0], [["rk1"]], [[[30]]], [[[0]]], [[[4]]])[0][0][0] < 0, True,
       "destination overflow")
    miss = s.get_into_ranges([p0], [["missing", "rk1"]], [[[0], [8]]], [[[0], [0]]],
                             [[[4], [4]]])
    eq((miss[0][0][0] < 0, miss[0][1][0]), (True, 4), "a missing key fails alone")
    # batch_replica_clear: leased keys are skipped, then cleared.
    keys = ["clr-%d" % i for i in range(3)]
    for k in keys:
        eq(s.put(k, b"clear me"), 0, "put")
    eq(s.get(keys[0]), b"clear me", "read: leased")
    cleared = s.batch_replica_clear(keys + ["clr-missing"])
    eq(sorted(cleared), keys[1:], "the leased key is skipped")
    wait_leases()
    eq(s.batch_replica_clear(keys), [keys[0]], "cleared after its lease")
    eq(s.batch_is_exist(keys), [0, 0, 0], "gone")
    eq(s.batch_replica_clear([]), [], "empty")
    # remove_by_regex: upstream's prefix and alternation patterns.
    for k in ("rx/a/1", "rx/a/2", "rx/b/1", "other"):
        eq(s.put(k, b"x"), 0, "put " + k)
    eq(s.get("rx/b/1"), b"x", "read: leased")
    eq(s.remove_by_regex("^rx/a/"), 2, "a prefix")
    eq(s.batch_is_exist(["rx/a/1", "rx/a/2", "rx/b/1", "other"]), [0, 0, 1, 1], "matches gone")
    eq(s.remove_by_regex("^rx/(b|c)/[0-9]+$"), 0, "a leased match stays")
    eq(s.remove_by_regex("^rx/(b|c)/[0-9]+$", force=True), 1, "forced")
    eq(s.remove_by_regex("("), -600, "not a pattern")
    eq(s.is_exist("other"), 1, "untouched")
    s.remove_all(force=True)
    s.close()


@case
def replica_clear_on_a_segment():
    """batch_replica_clear naming a segment drops only the replicas
    there: the object lives on in its other replica, and goes with its
    last."""
    from mooncake.store import ReplicateConfig
    c = st.Cluster(agents=2, master_args=["--default-kv-lease-ttl=%dms" % (LEASE_S * 1000)])
    a, b = c.agents
    s = a.store()
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    keys = ["rep-%d" % i for i in range(3)]
    for k in keys:
        eq(s.put(k, b"two copies of me", cfg), 0, "put with two replicas")
    eq(s.batch_replica_clear(keys[:2], b.name), keys[:2], "b's replicas")
    eq(s.batch_replica_clear(keys[:2], b.name), [], "none left there")
    eq(s.batch_is_exist(keys), [1, 1, 1], "the objects live on")
    eq([s.get(k) for k in keys], [b"two copies of me"] * 3, "their bytes")
    wait_leases()
    eq(s.batch_replica_clear(keys[:1], a.name), keys[:1], "the last replica")
    eq(s.batch_is_exist(keys), [0, 1, 1], "the object goes with it")
    eq(s.get(keys[2]), b"two copies of me", "read: leased")
    eq(s.batch_replica_clear(keys[2:], b.name), [], "a leased object is skipped")
    eq(s.batch_replica_clear(["x"], "no-such-segment:1"), [], "an unknown segment")
    s.close()
    c.stop()



@case
def error_codes_are_mooncakes():
    """The codes callers written for Mooncake compare with (its ErrorCode
    numbers, mooncake-store/include/types.h): a put that finds no room is
    NO_AVAILABLE_HANDLE (-200), which upstream's own dict fuzz test skips
    over; bad arguments INVALID_PARAMS (-600), as is a call without a
    session; a missing key OBJECT_NOT_FOUND (-704); an unreachable agent
    RPC_FAIL (-900). errname names them."""
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig, errname
    import mooncake.store as ms
    daemon()
    s = MooncakeDistributedStore()
    eq(s.put("ec", b"v"), -600, "before setup: INVALID_PARAMS")
    eq(s.setup("localhost", "P2PHANDSHAKE", 256 << 20, 16 << 20, "tcp", "", "127.0.0.1:50051"),
       0, "setup")
    big = np.zeros(300 << 20, dtype=np.uint8)  # more than the 256 MiB segment
    eq(s.put_from("ec-big", ptr(big), big.nbytes), -200, "no room: NO_AVAILABLE_HANDLE")
    eq(errname(-200), "NO_AVAILABLE_HANDLE", "errname")
    eq(s.put("ec-big", b"small"), 0, "a value that fits, under the same key")
    eq(s.put("", b"v"), -600, "empty key: INVALID_PARAMS")
    eq(s.put("ec-2", b"v", ReplicateConfig(replica_num=2)), -200,
       "two replicas on one segment: NO_AVAILABLE_HANDLE")
    out = np.zeros(2, dtype=np.uint8)
    eq(s.get_into("ec-big", ptr(out), 2), -600, "a buffer too small: INVALID_PARAMS")
    eq(s.get_into("ec-none", ptr(out), 2), -704, "missing: OBJECT_NOT_FOUND")
    eq(s.remove("ec-none"), -704, "remove of a missing key")
    eq(s.is_exist("ec-none"), 0, "is_exist of a missing key")
    eq(s.batch_put_from(["a", "b"], [ptr(out)], [1, 1]), [-600, -600], "mismatched lists")
    eq(s.get_size("ec-big"), 5, "get_size")
    eq(s.get_size("ec-none"), -704, "get_size of a missing key")
    eq((ms.NO_AVAILABLE_HANDLE, ms.INVALID_PARAMS, ms.OBJECT_NOT_FOUND, ms.TRANSFER_FAIL,
        ms.RPC_FAIL), (-200, -600, -704, -800, -900), "the names")
    wait_leases()
    eq(s.remove("ec-big"), 0, "remove, once the read leases are over")
    s.close()
    eq(s.is_exist("ec-big"), -600, "after close: INVALID_PARAMS")
    gone = MooncakeDistributedStore()
    eq(gone.setup("localhost", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", "unused",
                  socket_path=os.path.join(_tmp.name, "nobody.sock")), -900,
       "no agent at that socket: RPC_FAIL")


mctest.main()
