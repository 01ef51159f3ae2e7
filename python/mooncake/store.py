"""mooncake.store: MooncakeDistributedStore, Mooncake's store client API, on
the local mooncaked agent.

    from mooncake.store import MooncakeDistributedStore
    store = MooncakeDistributedStore()
    store.setup("localhost", "P2PHANDSHAKE", 512 << 20, 128 << 20, "tcp", "",
                "localhost:50051")
    store.put("key", b"value")
    assert store.get("key") == b"value"
    store.close()

What setup's parameters mean here: the agent on this node owns the DRAM
segment, the transports and the link to the master, so local_hostname,
metadata_server, protocol, rdma_devices/device_name and
master_server_addr(ess) are accepted and not used (the agent was
configured with them); global_segment_size is compared with the agent's
segment (a warning when the agent offers less); local_buffer_size is the
staging buffer asked of the agent (it may grant less: --local-buffer-size).

Return conventions are Mooncake's: 0 or a negative code (the numbers
Mooncake users handle: -704 not found, -706 has a lease, ...; see
mooncake.strerror); get() returns b"" on a miss; is_exist() 1, 0 or
negative; get_into() bytes read or negative. A put of a key that exists
returns 0 and leaves the stored value as it is (Mooncake's client treats
OBJECT_ALREADY_EXISTS as success: the same key holds the same KV block);
upsert() replaces it. libmooncake's mc_put itself says -705.

Values are any bytes-like object (bytes, bytearray, memoryview, numpy
arrays): their memory is read in place by the library, which copies it
once into the staging buffer it shares with the agent. Memory from
TransferEngine.allocate_managed_buffer is shared with the agent itself:
put_from/get_into on it copy nothing at all. register_buffer of other
memory is accepted, and that memory is moved by copying through the
staging buffer (it cannot be shared with the agent after the fact).
"""

import ctypes
import json
import logging
import os
import threading

from mooncake import _native as n

log = logging.getLogger("mooncake")

OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
OBJECT_HAS_LEASE = -706
LEASE_EXPIRED = -707
CHECKSUM_MISMATCH = -810
NOT_CONNECTED = -802  # MC_EUNAVAILABLE

_SETUP_KEYS = ("local_hostname", "metadata_server", "global_segment_size",
               "local_buffer_size", "protocol", "rdma_devices", "master_server_addr")
_ALIASES = {"device_name": "rdma_devices", "master_server_address": "master_server_addr"}


class ReplicateConfig:
    """Placement of a put: replica_num copies on distinct segments,
    with_soft_pin (evicted last), preferred_segment ("host:port" of an
    agent; "" = this node's agent). ttl_ms: removed this long after the
    put (0: never)."""

    def __init__(self, replica_num=1, with_soft_pin=False, preferred_segment="", ttl_ms=0):
        self.replica_num = replica_num
        self.with_soft_pin = with_soft_pin
        self.preferred_segment = preferred_segment
        self.ttl_ms = ttl_ms

    def __repr__(self):
        return ("ReplicateConfig(replica_num=%d, with_soft_pin=%s, preferred_segment=%r)"
                % (self.replica_num, self.with_soft_pin, self.preferred_segment))


def _exists_ok(rc):
    """A put of an existing key succeeds, as in Mooncake's client (an
    upsert never sees -705: it replaces)."""
    return 0 if rc == OBJECT_ALREADY_EXISTS else rc


def _put_opts(config, upsert=False):
    o = n.PutOpts()
    if config is not None:
        o.replica_num = int(getattr(config, "replica_num", 1) or 1)
        o.soft_pin = 1 if getattr(config, "with_soft_pin", False) else 0
        o.ttl_ms = int(getattr(config, "ttl_ms", 0) or 0)
        seg = getattr(config, "preferred_segment", "") or ""
        o.preferred_segment = seg.encode() if seg else None
    o.upsert = 1 if upsert else 0
    return o


class BufferHandle:
    """An object's bytes without a copy when the local agent holds a
    replica (a read-only mapping kept under the object's read lease until
    release(), or until the handle is garbage-collected); else a private
    copy (in a buffer the session keeps for such reads, until release()). ptr(), size(), len(); numpy.asarray(handle), memoryview(handle)
    (Python 3.12+) and memoryview(handle.view()) do not copy. The memory
    is read-only."""

    def __init__(self, store, view, ptr, size):
        self._store = store
        self._view = view
        self._ptr = ptr
        self._size = size

    def ptr(self):
        return self._ptr

    def size(self):
        return self._size

    def __len__(self):
        return self._size

    def is_mapped(self):
        """True when the bytes are the agent's own (zero copy)."""
        return bool(self._view and n.mc_view_is_mapped(self._view))

    @property
    def __array_interface__(self):
        return {"shape": (self._size,), "typestr": "|u1", "version": 3,
                "data": (self._ptr, True)}

    def view(self):
        """A ctypes array over the bytes (wrap it in memoryview(); do not
        write: the memory is read-only)."""
        return (ctypes.c_ubyte * self._size).from_address(self._ptr) if self._size else \
            (ctypes.c_ubyte * 0)()

    def __buffer__(self, flags):
        """memoryview(handle) on Python 3.12+ (PEP 688), read-only."""
        return memoryview(self.view()).cast("B").toreadonly()

    def tobytes(self):
        return ctypes.string_at(self._ptr, self._size) if self._size else b""

    def __bytes__(self):
        return self.tobytes()

    def release(self):
        if self._view:
            h = self._store._h
            if h:
                n.mc_view_release(h, self._view)
            self._view = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class MooncakeDistributedStore:
    """Mooncake's store client, served by the mooncaked agent on this node.
    Thread-safe: one connection, requests from many threads pipelined."""

    def __init__(self):
        self._h = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------ session

    def setup(self, local_hostname=None, metadata_server=None, global_segment_size=16 << 20,
              local_buffer_size=16 << 20, protocol="tcp", rdma_devices="",
              master_server_addr="127.0.0.1:50051", **kwargs):
        """Connect to the local agent. Also setup(config_dict) with the same
        names as keys, or setup() alone: the JSON file named by
        $MOONCAKE_CONFIG_PATH. Returns 0 or a negative code."""
        cfg = {}
        if isinstance(local_hostname, dict):
            cfg.update(local_hostname)
        elif local_hostname is None and metadata_server is None and not kwargs:
            path = os.environ.get("MOONCAKE_CONFIG_PATH")
            if path:
                with open(path) as f:
                    cfg.update(json.load(f))
        else:
            cfg.update(local_hostname=local_hostname, metadata_server=metadata_server,
                       global_segment_size=global_segment_size,
                       local_buffer_size=local_buffer_size, protocol=protocol,
                       rdma_devices=rdma_devices, master_server_addr=master_server_addr)
        for k, v in kwargs.items():
            cfg[_ALIASES.get(k, k)] = v
        for k, v in list(cfg.items()):
            if k in _ALIASES:
                cfg[_ALIASES[k]] = cfg.pop(k)
        try:
            seg = n.parse_size(cfg.get("global_segment_size", 16 << 20))
            stg = n.parse_size(cfg.get("local_buffer_size", 16 << 20))
        except ValueError as e:
            log.error("setup: %s", e)
            return -22
        with self._lock:
            if self._h:
                return 0
            sock = cfg.get("socket_path") or os.environ.get("MOONCAKE_SOCKET") or None
            o = n.OpenOpts(sock.encode() if sock else None, max(stg, 0),
                           ("python pid %d" % os.getpid()).encode(),
                           1 if cfg.get("verify_gets") else 0)
            h = ctypes.c_void_p()
            rc = n.mc_open_ex(ctypes.byref(o), ctypes.byref(h))
            if rc:
                log.error("cannot reach the mooncaked agent%s: %s",
                          " at " + sock if sock else "", n.strerror(rc))
                return rc
            self._h = h
        offered = n.mc_segment_size(self._h)
        if seg > offered:
            log.warning("global_segment_size %d: the agent on this node contributes a "
                        "segment of %d bytes (--global-segment-size)", seg, offered)
        granted = n.mc_staging_size(self._h)
        if stg > granted:
            log.warning("local_buffer_size %d: the agent granted a staging buffer of %d "
                        "bytes (--local-buffer-size); larger values travel in "
                        "temporary shared memory", stg, granted)
        return 0

    def close(self):
        with self._lock:
            h, self._h = self._h, None
        if h:
            n.mc_close(h)
        return 0

    def get_hostname(self):
        """The agent's "host:port" (its segment name)."""
        return n.mc_agent_address(self._h).decode() if self._h else ""

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _handle(self):
        return self._h

    # ------------------------------------------------------------ put

    def put(self, key, value, config=None):
        h = self._h
        if not h:
            return NOT_CONNECTED
        k = n.key_bytes(key)
        with n.Pinned(value) as v:
            o = _put_opts(config)
            return _exists_ok(n.mc_put(h, k, len(k), v.ptr, v.len, ctypes.byref(o)))

    def upsert(self, key, value, config=None):
        """put() that replaces an existing object (refused with -706 while
        a reader holds its lease)."""
        h = self._h
        if not h:
            return NOT_CONNECTED
        k = n.key_bytes(key)
        with n.Pinned(value) as v:
            o = _put_opts(config, upsert=True)
            return n.mc_put(h, k, len(k), v.ptr, v.len, ctypes.byref(o))

    def put_parts(self, key, *parts, config=None):
        return self.put(key, b"".join(bytes(memoryview(p)) for p in parts), config)

    def put_from(self, key, buffer_ptr, size, config=None):
        h = self._h
        if not h:
            return NOT_CONNECTED
        k = n.key_bytes(key)
        o = _put_opts(config)
        return _exists_ok(n.mc_put_from(h, k, len(k), buffer_ptr, size, ctypes.byref(o)))

    def upsert_from(self, key, buffer_ptr, size, config=None):
        h = self._h
        if not h:
            return NOT_CONNECTED
        k = n.key_bytes(key)
        o = _put_opts(config, upsert=True)
        return n.mc_put_from(h, k, len(k), buffer_ptr, size, ctypes.byref(o))

    def _batch_put(self, keys, ptrs, sizes, config, upsert=False):
        h = self._h
        cnt = len(keys)
        if not h:
            return [NOT_CONNECTED] * cnt
        if cnt == 0:
            return []
        kp, kl, _keep = n.keys_arrays(keys)
        vp = (ctypes.c_void_p * cnt)(*ptrs)
        vl = (ctypes.c_size_t * cnt)(*sizes)
        res = (ctypes.c_int * cnt)()
        o = _put_opts(config, upsert)
        rc = n.mc_batch_put(h, cnt, kp, kl, vp, vl, ctypes.byref(o), res)
        return [rc] * cnt if rc else [_exists_ok(r) for r in res]

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        return self._batch_put(list(keys), list(buffer_ptrs), list(sizes), config)

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        return self._batch_put(list(keys), list(buffer_ptrs), list(sizes), config, True)

    def put_batch(self, keys, values, config=None):
        """Returns 0, or the first item's error."""
        pins = [n.Pinned(v) for v in values]
        try:
            res = self._batch_put(list(keys), [p.ptr for p in pins], [p.len for p in pins],
                                  config)
        finally:
            for p in pins:
                p.release()
        return next((r for r in res if r), 0)

    # ------------------------------------------------------------ get

    def get(self, key, verify=False):
        """The value, or b"" when the key is not in the pool. verify:
        check its bytes against the checksum its writer sealed it with
        (b"" and a logged error when they differ); setup(...,
        verify_gets=True) makes every get of the store verify."""
        h = self._h
        if not h:
            return b""
        k = n.key_bytes(key)
        p = ctypes.c_void_p()
        ln = ctypes.c_size_t()
        rc = n.mc_get_ex(h, k, len(k), ctypes.byref(p), ctypes.byref(ln),
                         ctypes.byref(n.GetOpts(1 if verify else 0)))
        if rc == CHECKSUM_MISMATCH:
            log.error("get %r: %s", key, n.strerror(rc))
            return b""
        if rc:
            if rc != OBJECT_NOT_FOUND:
                log.debug("get %r: %s", key, n.strerror(rc))
            return b""
        try:
            return ctypes.string_at(p.value, ln.value) if ln.value else b""
        finally:
            n.libc_free(p)

    def get_batch(self, keys):
        keys = list(keys)
        h = self._h
        cnt = len(keys)
        if not h or cnt == 0:
            return [b""] * cnt
        kp, kl, _keep = n.keys_arrays(keys)
        vals = (ctypes.c_void_p * cnt)()
        lens = (ctypes.c_size_t * cnt)()
        res = (ctypes.c_int * cnt)()
        rc = n.mc_batch_get(h, cnt, kp, kl, vals, lens, res)
        out = []
        for i in range(cnt):
            if rc == 0 and res[i] == 0 and vals[i]:
                out.append(ctypes.string_at(vals[i], lens[i]) if lens[i] else b"")
            else:
                out.append(b"")
            if vals[i]:
                n.libc_free(vals[i])
        return out

    def get_buffer(self, key):
        """A BufferHandle (zero copy for local replicas), or None."""
        h = self._h
        if not h:
            return None
        k = n.key_bytes(key)
        data = ctypes.c_void_p()
        ln = ctypes.c_size_t()
        view = ctypes.c_void_p()
        rc = n.mc_get_view(h, k, len(k), ctypes.byref(data), ctypes.byref(ln),
                           ctypes.byref(view))
        if rc:
            return None
        return BufferHandle(self, view, data.value or 0, ln.value)

    def get_size(self, key):
        """The object's size in bytes, or a negative code."""
        b = self.get_buffer(key)
        if b is None:
            return OBJECT_NOT_FOUND if self._h else NOT_CONNECTED
        try:
            return b.size()
        finally:
            b.release()

    def get_into(self, key, buffer_ptr, size, verify=False):
        """Bytes read into [buffer_ptr, buffer_ptr + size), or negative
        (-105 ENOBUFS: the value is larger than size; -810: verify found
        bytes that do not match the object's checksum)."""
        h = self._h
        if not h:
            return NOT_CONNECTED
        k = n.key_bytes(key)
        return int(n.mc_get_into_ex(h, k, len(k), buffer_ptr, size,
                                    ctypes.byref(n.GetOpts(1 if verify else 0))))

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        keys = list(keys)
        h = self._h
        cnt = len(keys)
        if not h:
            return [NOT_CONNECTED] * cnt
        if cnt == 0:
            return []
        kp, kl, _keep = n.keys_arrays(keys)
        bp = (ctypes.c_void_p * cnt)(*list(buffer_ptrs))
        bl = (ctypes.c_size_t * cnt)(*list(sizes))
        res = (ctypes.c_int64 * cnt)()
        rc = n.mc_batch_get_into(h, cnt, kp, kl, bp, bl, res)
        return [rc] * cnt if rc else [int(r) for r in res]

    # ------------------------------------------------------------ keys

    def is_exist(self, key):
        h = self._h
        if not h:
            return NOT_CONNECTED
        k = n.key_bytes(key)
        return n.mc_exist(h, k, len(k))

    def batch_is_exist(self, keys):
        keys = list(keys)
        h = self._h
        cnt = len(keys)
        if not h:
            return [NOT_CONNECTED] * cnt
        if cnt == 0:
            return []
        kp, kl, _keep = n.keys_arrays(keys)
        res = (ctypes.c_int * cnt)()
        rc = n.mc_batch_exist(h, cnt, kp, kl, res)
        return [rc] * cnt if rc else list(res)

    def remove(self, key, force=False):
        h = self._h
        if not h:
            return NOT_CONNECTED
        k = n.key_bytes(key)
        return n.mc_remove(h, k, len(k), 1 if force else 0)

    def batch_remove(self, keys, force=False):
        keys = list(keys)
        h = self._h
        cnt = len(keys)
        if not h:
            return [NOT_CONNECTED] * cnt
        if cnt == 0:
            return []
        kp, kl, _keep = n.keys_arrays(keys)
        res = (ctypes.c_int * cnt)()
        rc = n.mc_batch_remove(h, cnt, kp, kl, 1 if force else 0, res)
        return [rc] * cnt if rc else list(res)

    def remove_all(self, force=False):
        """Objects removed (leased ones only with force), or negative."""
        h = self._h
        if not h:
            return NOT_CONNECTED
        return int(n.mc_remove_all(h, 1 if force else 0))

    # ------------------------------------------------------------ buffers

    def register_buffer(self, buffer_ptr, size):
        """0, or negative (-17 EEXIST: overlaps a registered range)."""
        h = self._h
        if not h:
            return NOT_CONNECTED
        return n.mc_register_buffer(h, buffer_ptr, size)

    def unregister_buffer(self, buffer_ptr):
        h = self._h
        if not h:
            return NOT_CONNECTED
        return n.mc_unregister_buffer(h, buffer_ptr)
