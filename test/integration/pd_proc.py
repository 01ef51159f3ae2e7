"""A prefill or a decode process of a PD-disaggregation test, doing what
vLLM's MooncakeConnector and SGLang's disaggregation conn.py do with
mooncake.engine.TransferEngine (numpy in place of torch). Run by
test_pd.py as a separate process; the agent is the one $MOONCAKE_SOCKET
names. One JSON object per line on stdout, commands on stdin.

decode MEMORY BLOCKS BLOCK_BYTES LAYERS
    initialize(hostname, "P2PHANDSHAKE", protocol, ""), session id
    "host:get_rpc_port()", a KV cache of LAYERS x BLOCKS x BLOCK_BYTES in
    MEMORY (allocator: MooncakeHostMemAllocator; hook: the C functions of
    get_alloc_func_addr/get_free_func_addr, as LMCache calls them;
    managed: allocate_managed_buffer; ordinary: numpy arrays; dmabuf:
    device memory as register_memory(location="cuda:N") hands it to the
    agent, a memfd standing in for the GPU's dma-buf, registered at
    addresses this process reserves without access — a GPU's virtual
    addresses — and checked through a mapping of the memfd),
    batch_register_memory(ptrs, lens).
    Prints {"session", "ptrs", "block_bytes"} (or {"register_rc"} when
    the registration fails); then "check SEED" verifies every byte
    against the pattern the prefill wrote, "exit" ends.
prefill SESSION PTRS BLOCKS BLOCK_BYTES LAYERS SEED STYLE
    Its own KV cache in ordinary numpy memory (allocator memory with
    PD_SRC=allocator, device memory as the decode's dmabuf with
    PD_SRC=dmabuf), filled with the pattern, registered; STYLE vllm: one batch_transfer_sync_write of every block
    of every layer; sglang: per layer, runs of contiguous blocks merged,
    batch_transfer_sync_write each, as conn.py's send_kvcache groups
    them. Prints {"rc": ...}. STYLE readback: vllm's batch, then every
    block read back with batch_transfer_sync_read into fresh numpy memory
    and compared, printing {"rc", "read_back": true/false}. STYLE loop: write again and again until a
    transfer fails, printing {"rc": first failure}. STYLE bench:SECONDS:
    the vllm batch once (page faults), then again and again for SECONDS,
    printing {"rc", "gbps"}.
"""
import ctypes
import json
import os
import socket
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def out(**kw):
    print(json.dumps(kw), flush=True)


def pattern(seed, layer, size):
    base = np.arange(size, dtype=np.uint64)
    return ((base * 2654435761 + seed * 7919 + layer * 104729) >> 3).astype(np.uint8)


def engine():
    from mooncake.engine import TransferEngine
    te = TransferEngine()
    hostname = socket.gethostbyname("localhost")
    rc = te.initialize(hostname, "P2PHANDSHAKE", os.environ.get("PD_PROTOCOL", "tcp"), "")
    if rc != 0:
        raise RuntimeError("Mooncake Transfer Engine initialization failed.")
    return te, "%s:%d" % (hostname, te.get_rpc_port())


def dmabuf(te, size, layers):
    """Device memory of LAYERS x size bytes: a memfd as its dma-buf, known
    by addresses reserved here without access (the GPU's virtual
    addresses: this process's CPU cannot touch them). Returns (rc of the
    registrations, views of the memfd per layer, the addresses)."""
    import mmap
    from mooncake import _native as n
    fd = os.memfd_create("pd-dmabuf")
    os.ftruncate(fd, size * layers)
    view = mmap.mmap(fd, size * layers)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    va = libc.mmap(None, size * layers, 0, 0x22 | 0x4000, -1, 0)  # PRIVATE|ANON|NORESERVE
    caches = [np.frombuffer(view, dtype=np.uint8, count=size, offset=k * size)
              for k in range(layers)]
    ptrs = [va + k * size for k in range(layers)]
    rc = 0
    for k in range(layers):
        rc = rc or n.mc_register_dmabuf(te._h, fd, k * size, ptrs[k], size)
    os.close(fd)  # the agent keeps its own
    return rc, caches, ptrs


def decode(memory, blocks, block_bytes, layers):
    te, session = engine()
    size = blocks * block_bytes
    caches, ptrs = [], []
    if memory == "hook":
        from mooncake.store import get_alloc_func_addr, get_free_func_addr
        alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t)(int(get_alloc_func_addr()))
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(int(get_free_func_addr()))
    for _ in range(layers):
        if memory == "allocator":
            from mooncake.store import MooncakeHostMemAllocator
            p = MooncakeHostMemAllocator().alloc(size)
        elif memory == "hook":
            p = alloc(size)
        elif memory == "managed":
            p = te.allocate_managed_buffer(size)
        elif memory == "dmabuf":
            break
        elif memory == "ordinary":
            arr = np.zeros(size, dtype=np.uint8)
            caches.append(arr)
            ptrs.append(arr.ctypes.data)
            continue
        else:
            raise ValueError(memory)
        if not p:
            raise RuntimeError("allocation failed")
        arr = np.frombuffer((ctypes.c_ubyte * size).from_address(p), dtype=np.uint8)
        arr[:] = 0
        caches.append(arr)
        ptrs.append(p)
    if memory == "dmabuf":
        rc, caches, ptrs = dmabuf(te, size, layers)
    else:
        rc = te.batch_register_memory(ptrs, [size] * layers)
    if rc != 0:
        out(register_rc=rc)
        te.close()
        return
    out(session=session, ptrs=ptrs, block_bytes=block_bytes)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "check":
            seed = int(cmd[1])
            bad = [layer for layer in range(layers)
                   if not np.array_equal(caches[layer], pattern(seed, layer, size))]
            out(bad_layers=bad)
        elif cmd[0] == "exit":
            break
    te.close()


def prefill(session, ptrs, blocks, block_bytes, layers, seed, style):
    te, _ = engine()
    size = blocks * block_bytes
    kv = [pattern(seed, layer, size) for layer in range(layers)]
    if os.environ.get("PD_SRC") == "allocator":
        # The prefill's KV cache in allocator memory too (the agent then
        # reads it in place, and over RDMA with the region's lkey).
        from mooncake.store import MooncakeHostMemAllocator
        moved = []
        for a in kv:
            p = MooncakeHostMemAllocator().alloc(size)
            m = np.frombuffer((ctypes.c_ubyte * size).from_address(p), dtype=np.uint8)
            m[:] = a
            moved.append(m)
        kv = moved
    if os.environ.get("PD_SRC") == "dmabuf":
        # The prefill's KV cache in device memory too (a dma-buf in its
        # stead): the agent's NIC reads it by its MR, nothing else can.
        rc, views, base = dmabuf(te, size, layers)
        for k in range(layers):
            views[k][:] = kv[k]
        kv = views
    else:
        base = [a.ctypes.data for a in kv]
        rc = te.batch_register_memory(base, [size] * layers)
    if rc != 0:
        raise RuntimeError("Mooncake batch memory registration failed: %d" % rc)
    src, dst, lens = [], [], []
    if style in ("vllm", "loop", "readback") or style.startswith("bench:"):
        for layer in range(layers):
            for b in range(blocks):
                src.append(base[layer] + b * block_bytes)
                dst.append(ptrs[layer] + b * block_bytes)
                lens.append(block_bytes)
        groups = [(src, dst, lens)]
    else:
        # conn.py: group_concurrent_contiguous over the block ids, per layer.
        groups = []
        runs = [list(range(0, blocks // 2)), list(range(blocks // 2, blocks))]
        for layer in range(layers):
            s, d, n = [], [], []
            for run in runs:
                s.append(base[layer] + run[0] * block_bytes)
                d.append(ptrs[layer] + run[0] * block_bytes)
                n.append(len(run) * block_bytes)
            groups.append((s, d, n))
    if style.startswith("bench:"):
        import time
        seconds = float(style.split(":", 1)[1])
        # One batch first: its page faults on both sides are not the
        # steady state a decode sees.
        rc = te.batch_transfer_sync_write(session, src, dst, lens)
        if rc != 0:
            out(rc=rc)
            return
        moved, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            rc = te.batch_transfer_sync_write(session, src, dst, lens)
            if rc != 0:
                out(rc=rc)
                return
            moved += sum(lens)
        out(rc=0, gbps=moved / (time.monotonic() - t0) / 1e9)
        return
    if style == "readback":
        rc = te.batch_transfer_sync_write(session, src, dst, lens)
        back = [np.zeros(size, dtype=np.uint8) for _ in range(layers)]
        if rc == 0:
            rc = te.batch_transfer_sync_read(
                session, [back[k // blocks].ctypes.data + (k % blocks) * block_bytes
                          for k in range(len(dst))], dst, lens)
        out(rc=rc, read_back=all(np.array_equal(back[k], kv[k]) for k in range(layers)))
        return
    if style == "loop":
        while True:
            rc = te.batch_transfer_sync_write(session, src, dst, lens)
            if rc != 0:
                out(rc=rc)
                return
    for s, d, n in groups:
        rc = te.batch_transfer_sync_write(session, s, d, n)
        if rc != 0:
            out(rc=rc)
            return
    out(rc=0)


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[0] == "decode":
        decode(a[1], int(a[2]), int(a[3]), int(a[4]))
    else:
        prefill(a[1], json.loads(a[2]), int(a[3]), int(a[4]), int(a[5]), int(a[6]), a[7])
