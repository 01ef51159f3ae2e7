"""mooncake.buffer_pool: BufferPool (alias RegisteredBufferPool), Mooncake's
pool of registered local buffers: leases of memory puts read from and gets
write into in place.

    pool = BufferPool(store, max_bytes=256 << 20)
    with pool.acquire(1 << 20) as lease:
        store.get_into(key, lease.ptr, lease.size)
        data = lease.buffer          # a memoryview, no copy

Regions are allocator memory (mc_host_alloc): the agent maps them, so
they are zero copy on every path. Sizes are rounded to size classes
(powers of two up to `alignment`, multiples of it beyond); a region comes
back to its class on release and is reused. Exhaustion blocks (or raises
RuntimeError with block=False, or after timeout seconds).
"""

import threading
import time

from mooncake import _native as n


class BufferLease:
    """A region of a BufferPool: ptr, size, buffer (a memoryview of size
    bytes); release() or the with-statement give it back."""

    def __init__(self, pool, ptr, cls, size):
        self._pool = pool
        self._ptr = ptr
        self._cls = cls
        self._size = size

    @property
    def ptr(self):
        if not self._pool:
            raise RuntimeError("registered buffer lease is closed")
        return self._ptr

    @property
    def size(self):
        return self._size

    @property
    def buffer(self):
        if not self._pool:
            raise RuntimeError("registered buffer lease is closed")
        return memoryview((n.ctypes.c_ubyte * self._size).from_address(self._ptr)).cast("B")

    def release(self):
        pool, self._pool = self._pool, None
        if pool:
            pool._give_back(self._ptr, self._cls)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class BufferPool:
    """Mooncake's (Registered)BufferPool over a MooncakeDistributedStore."""

    def __init__(self, store, max_bytes=0, min_size_class=64 * 1024, max_size_class=None,
                 alignment=8 * 1024 * 1024, block_on_exhaustion=True, default_timeout=None,
                 max_regions=None, prewarm_size=None, prewarm_count=0):
        if store is None or not getattr(store, "_h", None):
            raise RuntimeError("MooncakeDistributedStore is not initialized")
        if min_size_class <= 0 or alignment <= 0:
            raise RuntimeError("min_size_class and alignment must be positive")
        if alignment < 8 or alignment & (alignment - 1):
            raise RuntimeError("alignment must be a power of two and at least sizeof(void*)")
        if max_bytes <= 0:
            raise RuntimeError("max_bytes must be positive")
        self._store = store
        self._max_bytes = max_bytes
        self._min = min_size_class
        self._max_cls = min(max_size_class or max_bytes, max_bytes)
        self._align = alignment
        self._block = block_on_exhaustion
        self._timeout = default_timeout
        self._max_regions = max_regions
        self._cv = threading.Condition()
        self._free = {}      # size class -> [ptr]
        self._regions = {}   # ptr -> size class
        self._in_use = set()
        self._total = 0
        self._closed = False
        if prewarm_size is not None and prewarm_count > 0:
            self.prewarm(prewarm_size, prewarm_count)

    def _class(self, size):
        size = max(int(size), 1)
        if size > self._max_cls:
            return -(-size // self._align) * self._align
        if size <= self._min:
            return self._min
        if size <= self._align:
            return 1 << (size - 1).bit_length()
        return -(-size // self._align) * self._align

    def _fits_locked(self, cls):
        if self._max_regions is not None and len(self._regions) >= self._max_regions:
            return False
        return self._total + cls <= self._max_bytes

    def _new_region_locked(self, cls):
        p = n.mc_host_alloc(cls)
        if not p:
            raise MemoryError("cannot allocate a %d-byte region" % cls)
        rc = self._store.register_buffer(p, cls)
        if rc:
            n.mc_host_free(p)
            raise RuntimeError("register_buffer failed: %d" % rc)
        self._regions[p] = cls
        self._total += cls
        return p

    def acquire(self, size, block=None, timeout=None):
        cls = self._class(size)
        if cls > self._max_bytes:
            raise RuntimeError("requested buffer size exceeds pool capacity")
        block = self._block if block is None else block
        timeout = self._timeout if timeout is None else timeout
        if timeout is not None and timeout < 0:
            raise RuntimeError("timeout must be non-negative")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while True:
                if self._closed:
                    raise RuntimeError("registered buffer pool is closed")
                free = self._free.get(cls)
                if free:
                    p = free.pop()
                elif self._fits_locked(cls):
                    p = self._new_region_locked(cls)
                else:
                    p = None
                if p:
                    self._in_use.add(p)
                    return BufferLease(self, p, cls, int(size))
                if not block:
                    raise RuntimeError("registered buffer pool is exhausted")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RuntimeError("timed out waiting for registered buffer")
                self._cv.wait(left)

    buffer = acquire

    def prewarm(self, size, count):
        cls = self._class(size)
        if cls > self._max_cls:
            raise RuntimeError("cannot prewarm oversize buffers")
        with self._cv:
            for _ in range(count):
                if not self._fits_locked(cls):
                    raise RuntimeError("registered buffer pool capacity exceeded")
                self._free.setdefault(cls, []).append(self._new_region_locked(cls))

    def _give_back(self, p, cls):
        with self._cv:
            self._in_use.discard(p)
            if self._closed or cls > self._max_cls:
                self._drop_locked(p)
            else:
                self._free.setdefault(cls, []).append(p)
            self._cv.notify_all()

    def _drop_locked(self, p):
        cls = self._regions.pop(p)
        self._total -= cls
        self._store.unregister_buffer(p)
        n.mc_host_free(p)

    def close(self):
        with self._cv:
            if self._closed:
                return
            if self._in_use:
                raise RuntimeError("cannot close registered buffer pool with active leases")
            self._closed = True
            for ptrs in self._free.values():
                for p in ptrs:
                    self._drop_locked(p)
            self._free.clear()
            self._cv.notify_all()


RegisteredBufferPool = BufferPool

__all__ = ["BufferPool", "RegisteredBufferPool", "BufferLease"]
