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

Return conventions are Mooncake's: 0 or a negative code with the numbers
of Mooncake's ErrorCode (mooncake-store/include/types.h), which code
written for it compares with: -200 NO_AVAILABLE_HANDLE (no space), -600
INVALID_PARAMS, -704 OBJECT_NOT_FOUND, -706 OBJECT_HAS_LEASE, -800
TRANSFER_FAIL, -900 RPC_FAIL, ... (the names below; errname() names them).
libmooncake's own code (mooncake.strerror) is what the log lines say.
get() returns b"" on a miss; is_exist() 1, 0 or negative; get_into()
bytes read or negative. A put of a key that exists returns 0 and leaves
the stored value as it is (Mooncake's client treats OBJECT_ALREADY_EXISTS
as success: the same key holds the same KV block); upsert() replaces it.
libmooncake's mc_put itself says -705.

Values are any bytes-like object (bytes, bytearray, memoryview, numpy
arrays): their memory is read in place by the library, which copies it
once into the staging buffer it shares with the agent. Memory from
TransferEngine.allocate_managed_buffer is shared with the agent itself:
put_from/get_into on it copy nothing at all. register_buffer of other
memory is accepted, and that memory is moved by copying through the
staging buffer (it cannot be shared with the agent after the fact).

PyTorch tensors (put_tensor, get_tensor, ... : mooncake.tensor) are
stored in Mooncake's layout, a 40-byte TensorMetadata then the elements;
torch is imported at the first tensor call only.
"""

import ctypes
import enum
import http.server
import json
import logging
import os
import threading
import weakref

from mooncake import _native as n
from mooncake import tensor as _tensor

log = logging.getLogger("mooncake")

# Mooncake's ErrorCode numbers: what the store's methods return.
INTERNAL_ERROR = -1
SEGMENT_NOT_FOUND = -101
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
INVALID_REPLICA = -702
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
OBJECT_HAS_LEASE = -706
LEASE_EXPIRED = -707
TRANSFER_FAIL = -800
RPC_FAIL = -900
UNAVAILABLE_IN_CURRENT_MODE = -1011
# What they mean here: a call before setup() or after close() (Mooncake's
# client without a connection answers INVALID_PARAMS); bytes that fail
# their checksum (verify=True; libmooncake's MC_ECHECKSUM); what mooncaked
# does not do (create_copy_task, device memory without its driver).
NOT_CONNECTED = INVALID_PARAMS
CHECKSUM_MISMATCH = TRANSFER_FAIL
NOT_SUPPORTED = UNAVAILABLE_IN_CURRENT_MODE

_ERRNAMES = {v: k for k, v in list(globals().items())
             if k.isupper() and isinstance(v, int) and v < 0 and k not in
             ("NOT_CONNECTED", "CHECKSUM_MISMATCH", "NOT_SUPPORTED")}

# libmooncake's codes (src/common/err.h, negative errno) as Mooncake's.
# A code not listed is INTERNAL_ERROR; -704..-707 are the same in both.
_FROM_MC = {
    -700: INTERNAL_ERROR,        # MC_EINTERNAL
    -701: SEGMENT_NOT_FOUND,     # MC_ESEGMENT_NOT_FOUND (also: no SSD tier)
    -702: NO_AVAILABLE_HANDLE,   # MC_ENO_SPACE
    -703: INVALID_REPLICA,       # MC_EINVALID_REPLICA
    -708: NO_AVAILABLE_HANDLE,   # MC_ETOO_FEW_SEGMENTS: the replicas cannot be placed
    -801: RPC_FAIL,              # MC_EPROTOCOL
    -802: RPC_FAIL,              # MC_EUNAVAILABLE: the agent or the master unreachable
    -803: RPC_FAIL,              # MC_ETIMEDOUT
    -804: RPC_FAIL,              # MC_ECANCELLED
    -805: INVALID_PARAMS,        # MC_ETOO_LARGE
    -807: RPC_FAIL,              # MC_ENOT_LEADER
    -808: RPC_FAIL,              # MC_ESHUTDOWN: the agent is stopping
    -810: TRANSFER_FAIL,         # MC_ECHECKSUM
    -820: TRANSFER_FAIL,         # MC_EREMOTE_ACCESS
    -95: NOT_SUPPORTED,          # -EOPNOTSUPP
    -12: INTERNAL_ERROR,         # -ENOMEM
    -28: NO_AVAILABLE_HANDLE,    # -ENOSPC
    -104: RPC_FAIL,              # -ECONNRESET
    -32: RPC_FAIL,               # -EPIPE
    -111: RPC_FAIL,              # -ECONNREFUSED
}
for _e in (-2, -7, -9, -14, -17, -22, -34, -36, -90, -105):
    # ENOENT E2BIG EBADF EFAULT EEXIST EINVAL ERANGE ENAMETOOLONG
    # EMSGSIZE ENOBUFS (a buffer smaller than the value): the call's arguments
    _FROM_MC[_e] = INVALID_PARAMS
del _e


_MC_ECHECKSUM = -810


def _rc(code):
    """A result of libmooncake as the method returns it: sizes, counts
    and 0 as they are, an error as Mooncake's ErrorCode."""
    code = int(code)
    if code >= 0 or -707 <= code <= -704:
        return code
    up = _FROM_MC.get(code, INTERNAL_ERROR)
    log.debug("libmooncake %s (%s): %s", n.errname(code), n.strerror(code), errname(up))
    return up


def errname(code):
    """The ErrorCode name of a code the store returned ("NO_AVAILABLE_HANDLE")."""
    return _ERRNAMES.get(int(code), "ErrorCode %d" % int(code))

# health_check() codes, as Mooncake's.
HC_HEALTHY = 0
HC_NOT_INITIALIZED = 1
HC_MASTER_UNREACHABLE = 2


class SoftPinAction(enum.IntEnum):
    """What a put does to the object's soft pin: PRESERVE (a new object is
    not pinned), ENABLE, DISABLE."""
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ReplicaStatus(enum.IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class ObjectDataType(enum.IntEnum):
    """What an object holds (ReplicateConfig.data_type): accepted, not
    stored — every object here is a block of bytes under its key."""
    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class TaskType(enum.IntEnum):
    REPLICA_COPY = 0
    REPLICA_MOVE = 1


class TaskStatus(enum.IntEnum):
    PENDING = 0
    PROCESSING = 1
    SUCCESS = 2
    FAILED = 3


# The enums' values at module level too, as pybind11's export_values()
# leaves them (a later enum's name wins: PROCESSING and FAILED are
# TaskStatus's).
for _e in (ObjectDataType, ReplicaStatus, TaskType, TaskStatus):
    globals().update(_e.__members__)
del _e


class Descriptor:
    """Where a memory replica's bytes are (upstream's AllocatedBuffer
    descriptor): size, buffer_address (in its segment) and
    transport_endpoint (the segment's name: its agent)."""
    __slots__ = ("size", "buffer_address", "transport_endpoint")

    def __init__(self, size=0, buffer_address=0, transport_endpoint=""):
        self.size = size
        self.buffer_address = buffer_address
        self.transport_endpoint = transport_endpoint

    def __repr__(self):
        return "<Descriptor size=%d buffer_address=%d transport_endpoint=%s>" % (
            self.size, self.buffer_address, self.transport_endpoint)


class MemoryDescriptor:
    __slots__ = ("buffer_descriptor",)

    def __init__(self, buffer_descriptor=None):
        self.buffer_descriptor = buffer_descriptor or Descriptor()


class DiskDescriptor:
    """A disk replica's file (upstream's shared-file-system replicas; an
    SSD-tier replica here has none: is_local_disk_replica)."""
    __slots__ = ("file_path", "object_size")

    def __init__(self, file_path="", object_size=0):
        self.file_path = file_path
        self.object_size = object_size


class ReplicaDescriptor:
    """One replica of get_replica_desc: status (ReplicaStatus.COMPLETE,
    or PROCESSING while it is written) and where it is. A DRAM replica is
    a memory replica (get_memory_descriptor); one in an agent's SSD tier
    is a local disk replica (is_local_disk_replica; segment names that
    tier's segment, "<agent>/ssd"). get_memory_descriptor of another kind raises, as upstream's
    does; mooncaked has no shared-file-system (DISK) replicas, so
    is_disk_replica is False and get_disk_descriptor always raises."""
    __slots__ = ("status", "segment", "_mem")

    def __init__(self, status, segment, mem=None):
        self.status = status
        self.segment = segment
        self._mem = mem

    def is_memory_replica(self):
        return self._mem is not None

    def is_disk_replica(self):
        return False

    def is_local_disk_replica(self):
        return self._mem is None

    def get_memory_descriptor(self):
        if self._mem is None:
            raise RuntimeError("not a memory replica (it is in %s's SSD tier)" % self.segment)
        return self._mem

    def get_disk_descriptor(self):
        raise RuntimeError("not a disk replica (mooncaked keeps no shared-file-system "
                           "replicas)")

    def __repr__(self):
        kind = "memory" if self._mem is not None else "local disk"
        return "<ReplicaDescriptor %s on %s status=%s>" % (kind, self.segment,
                                                           self.status.name)


class QueryTaskResponse:
    """The result type of query_task (never returned here: see
    create_copy_task)."""
    __slots__ = ("id", "type", "status", "created_at_ms_epoch", "last_updated_at_ms_epoch",
                 "assigned_client", "message")

    def __init__(self):
        self.id = (0, 0)
        self.type = TaskType.REPLICA_COPY
        self.status = TaskStatus.PENDING
        self.created_at_ms_epoch = 0
        self.last_updated_at_ms_epoch = 0
        self.assigned_client = (0, 0)
        self.message = ""

_SETUP_KEYS = ("local_hostname", "metadata_server", "global_segment_size",
               "local_buffer_size", "protocol", "rdma_devices", "master_server_addr")
_ALIASES = {"device_name": "rdma_devices", "master_server_address": "master_server_addr"}


class ReplicateConfig:
    """Placement of a put, with Mooncake's fields. Acted on: replica_num
    (copies on distinct segments), soft_pin_action / with_soft_pin
    (evicted only when nothing else is), preferred_segment or a
    preferred_segments list of one ("host:port" of an agent; none: this
    node's agent, which is also what prefer_alloc_in_same_node asks),
    ttl_ms (removed this long after the put; mooncaked's own), tier ("dram",
    the default, or "ssd": straight into this node's agent's SSD tier, one
    replica; mooncaked's own). data_type
    is accepted and not stored. Refused with -600 (the put fails, the log
    says why) because mooncaked cannot do them: with_hard_pin (the master
    evicts every object under pressure), soft_pin_ttl_ms (a soft pin lasts
    as long as its object), more than one preferred segment,
    nof_replica_num / preferred_nof_segments (no NVMe-oF tier), host_id.
    An unknown attribute is an AttributeError, as in Mooncake's class."""

    __slots__ = ("replica_num", "soft_pin_action", "soft_pin_ttl_ms", "with_hard_pin",
                 "preferred_segments", "preferred_segment", "prefer_alloc_in_same_node",
                 "data_type", "nof_replica_num", "preferred_nof_segments", "host_id", "ttl_ms",
                 "tier")

    def __init__(self, replica_num=1, with_soft_pin=False, preferred_segment="", ttl_ms=0,
                 tier="dram", **kw):
        self.replica_num = replica_num
        self.soft_pin_action = SoftPinAction.ENABLE if with_soft_pin else SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms = None
        self.with_hard_pin = False
        self.preferred_segments = []
        self.preferred_segment = preferred_segment
        self.prefer_alloc_in_same_node = False
        self.data_type = ObjectDataType.UNKNOWN
        self.nof_replica_num = 0
        self.preferred_nof_segments = []
        self.host_id = ""
        self.ttl_ms = ttl_ms
        self.tier = tier
        for k, v in kw.items():
            setattr(self, k, v)

    @property
    def with_soft_pin(self):
        return self.soft_pin_action == SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, on):
        self.soft_pin_action = SoftPinAction.ENABLE if on else SoftPinAction.PRESERVE

    def __repr__(self):
        return ("ReplicateConfig(replica_num=%s, soft_pin_action=%s, with_hard_pin=%s, "
                "preferred_segment=%r, preferred_segments=%r, ttl_ms=%s, tier=%r)"
                % (self.replica_num, SoftPinAction(int(self.soft_pin_action)).name,
                   self.with_hard_pin, self.preferred_segment, self.preferred_segments,
                   self.ttl_ms, self.tier))

    __str__ = __repr__


def _exists_ok(rc):
    """A put of an existing key succeeds, as in Mooncake's client (an
    upsert never sees -705: it replaces)."""
    return 0 if rc == OBJECT_ALREADY_EXISTS else rc


def _put_opts(config, upsert=False):
    """The C options of a put, or (None, error) when config asks what
    mooncaked cannot do (logged)."""
    o = n.PutOpts()
    o.upsert = 1 if upsert else 0
    if config is None:
        return o, 0
    why = None
    segs = [x for x in (getattr(config, "preferred_segments", None) or []) if x]
    seg = getattr(config, "preferred_segment", "") or ""
    try:
        action = SoftPinAction(int(getattr(config, "soft_pin_action", SoftPinAction.PRESERVE)))
    except ValueError:
        action = None
        why = "soft_pin_action must be a SoftPinAction"
    if getattr(config, "with_hard_pin", False):
        why = ("with_hard_pin: hard pins are not supported (the master may evict any object "
               "under memory pressure; soft-pinned ones last)")
    elif getattr(config, "soft_pin_ttl_ms", None) is not None:
        why = "soft_pin_ttl_ms: a soft pin lasts as long as its object here (no pin TTL)"
    elif len(segs) > 1 or (segs and seg and segs != [seg]):
        why = "preferred_segments: at most one preferred segment is supported"
    elif getattr(config, "nof_replica_num", 0) or getattr(config, "preferred_nof_segments", None):
        why = "nof_replica_num/preferred_nof_segments: there is no NVMe-oF tier"
    elif getattr(config, "host_id", ""):
        why = "host_id: placement by host id is not supported (use preferred_segment)"
    elif int(getattr(config, "replica_num", 1) or 1) < 0:
        why = "replica_num must not be negative"
    elif str(getattr(config, "tier", "dram") or "dram").lower() not in ("dram", "ssd"):
        why = "tier must be 'dram' or 'ssd'"
    if why:
        log.error("ReplicateConfig refused: %s", why)
        return None, INVALID_PARAMS
    o.replica_num = int(getattr(config, "replica_num", 1) or 1)
    o.soft_pin = 1 if action == SoftPinAction.ENABLE else 0
    o.ttl_ms = int(getattr(config, "ttl_ms", 0) or 0)
    seg = seg or (segs[0] if segs else "")
    o.preferred_segment = seg.encode() if seg else None
    o.tier = 1 if str(getattr(config, "tier", "dram") or "dram").lower() == "ssd" else 0
    return o, 0


def _copy_ranges(key, base, size, ptrs, sizes, offsets, into_object):
    """Copy the ranges between an object of size bytes at base and the
    caller's buffers (into_object: the buffers' bytes into the object).
    Returns the bytes copied, or INVALID_PARAMS (logged) when a range
    does not fit in the object or the lists do not align."""
    if not (len(ptrs) == len(sizes) == len(offsets)):
        log.error("ranges of %r: %d buffers, %d sizes, %d offsets", key, len(ptrs),
                  len(sizes), len(offsets))
        return INVALID_PARAMS
    for p, z, o in zip(ptrs, sizes, offsets):
        if z < 0 or o < 0 or o + z > size or (z and not p):
            log.error("ranges of %r: %d bytes at offset %d of a %d-byte object", key, z, o,
                      size)
            return INVALID_PARAMS
    total = 0
    for p, z, o in zip(ptrs, sizes, offsets):
        if z:
            if into_object:
                ctypes.memmove(base + o, p, z)
            else:
                ctypes.memmove(p, base + o, z)
        total += z
    return total


class _HostCache:
    """Agent-mapped memory (mc_host_alloc) of ended put sessions, kept for
    the next session of the same size: its pages are in, and the agent
    has it mapped already, so neither is paid again. At most _HOST_CACHE
    bytes; emptied by close()."""

    def __init__(self):
        self._free = {}  # size -> [addr]
        self._bytes = 0
        self._mu = threading.Lock()

    def take(self, size):
        with self._mu:
            lst = self._free.get(size)
            if not lst:
                return None
            self._bytes -= size
            return lst.pop()

    def give(self, addr, size):
        """Keep addr for reuse, or free it when the cache is full."""
        with self._mu:
            if self._bytes + size <= _HOST_CACHE:
                self._free.setdefault(size, []).append(addr)
                self._bytes += size
                return
        n.mc_host_free(addr)

    def clear(self):
        with self._mu:
            lists, self._free, self._bytes = self._free, {}, 0
        for lst in lists.values():
            for addr in lst:
                n.mc_host_free(addr)


class _PutSession:
    """An object being assembled by a layerwise put (batch_put_start).
    From _HOST_MIN bytes on it is assembled in memory the agent maps
    (mc_host_alloc, or one of the cache's), so batch_put_end's put reads
    it in place instead of copying it through the session's staging
    buffer or a temporary memfd first; smaller ones (or when that memory
    is refused) in a ctypes buffer. end() gives the memory back to the
    cache; a session dropped unended frees it when collected."""
    __slots__ = ("size", "buf", "addr", "config", "_free", "__weakref__")

    def __init__(self, size, cache):
        self.size = size
        self.config = None
        self.buf = self._free = None
        self.addr = None
        if size >= _HOST_MIN:
            self.addr = cache.take(size) or n.mc_host_alloc(size)
        if self.addr:
            # (runs at most once, when collected unless end() detached it)
            self._free = weakref.finalize(self, n.mc_host_free, self.addr)
        else:
            self.buf = ctypes.create_string_buffer(size)
            self.addr = ctypes.addressof(self.buf)

    def end(self, cache):
        if self._free and self._free.detach():
            cache.give(self.addr, self.size)
        self.addr = self.buf = self._free = None


# Put sessions this large are assembled in agent-mapped memory (a memfd
# of their own: below this, a copy through staging costs less), and up to
# _HOST_CACHE bytes of it are kept for the next sessions of a store.
_HOST_MIN = 1 << 20
_HOST_CACHE = 256 << 20


class BufferHandle(n.BufferBase):
    """An object's bytes without a copy when the local agent holds a
    replica (a read-only mapping kept under the object's read lease until
    release(), or until the handle is garbage-collected); else a private
    copy. ptr(), size(), len(); the buffer protocol on every Python 3:
    memoryview(handle), numpy.frombuffer(handle), torch.frombuffer(handle)
    do not copy. As in Mooncake the exported buffer is writable; do not
    write into a mapped one (is_mapped()): its pages are read-only. A
    release() while exported views exist takes effect when the last one
    is released."""

    def __init__(self, store, view, ptr, size):
        self._store = store
        self._view = view
        self._buf_ptr = ptr
        self._buf_len = size
        self._buf_exports = 0
        self._release_pending = False

    def ptr(self):
        return self._buf_ptr

    def size(self):
        return self._buf_len

    def __len__(self):
        return self._buf_len

    def is_mapped(self):
        """True when the bytes are the agent's own (zero copy)."""
        return bool(self._view and n.mc_view_is_mapped(self._view))

    def view(self):
        """A ctypes array over the bytes."""
        if not self._buf_len:
            return (ctypes.c_ubyte * 0)()
        return (ctypes.c_ubyte * self._buf_len).from_address(self._buf_ptr)

    def tobytes(self):
        return ctypes.string_at(self._buf_ptr, self._buf_len) if self._buf_len else b""

    def __bytes__(self):
        return self.tobytes()

    def _buf_unexported(self):
        if self._release_pending:
            self.release()

    def release(self):
        if self._buf_exports:
            self._release_pending = True
            return
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


class MooncakeHostMemAllocator:
    """Mooncake's host-memory allocator: memory every session of this
    process hands to its agent on first use, so puts, gets and peers'
    transfers read and write it in place (mc_host_alloc). alloc returns
    an address (0 on failure), free 0 or -2 (not an allocation)."""

    def alloc(self, size):
        return n.mc_host_alloc(int(size)) or 0

    def free(self, ptr):
        if not n.mc_host_size(ptr):
            return -2
        n.mc_host_free(ptr)
        return 0


def get_alloc_func_addr():
    """Address of void *mc_host_alloc(size_t): the allocation hook a
    PyTorch pluggable allocator or LMCache calls."""
    return ctypes.cast(n.lib.mc_host_alloc, ctypes.c_void_p).value


def get_free_func_addr():
    """Address of void mc_host_free(void *)."""
    return ctypes.cast(n.lib.mc_host_free, ctypes.c_void_p).value


def bind_to_numa_node(node):
    """Run this thread on NUMA node `node` (its CPUs, from sysfs); memory
    then comes from there by first touch. Logs and does nothing where
    NUMA information is missing or the node is unknown."""
    try:
        with open("/sys/devices/system/node/node%d/cpulist" % int(node)) as f:
            spec = f.read().strip()
    except OSError:
        log.warning("NUMA node %s is not available; binding skipped", node)
        return
    cpus = set()
    for part in spec.split(","):
        if part:
            a, _, b = part.partition("-")
            cpus.update(range(int(a), int(b or a) + 1))
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        log.warning("binding to NUMA node %s failed: %s", node, e)


class _ClientHTTP:
    """The client-side HTTP endpoints Mooncake's setup(...,
    enable_client_http_server=True) serves: /health (200 when
    health_check() is 0, else 503), /metrics (Prometheus text: this
    node's agent's figures) and /metrics/summary."""

    def __init__(self, store, port):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                code, ctype, body = outer.answer(self.path)
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.store = store
        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                       name="mooncake-client-http")
        self.thread.start()

    def answer(self, path):
        path = path.split("?", 1)[0]
        hc = self.store.health_check()
        if path == "/health":
            return (200 if hc == HC_HEALTHY else 503, "text/plain",
                    b"OK\n" if hc == HC_HEALTHY else b"UNHEALTHY %d\n" % hc)
        st = self.store._stats()
        if path == "/metrics":
            lines = ["# TYPE mooncake_client_healthy gauge",
                     "mooncake_client_healthy %d" % (hc == HC_HEALTHY)]
            if st:
                for name in ("puts", "gets", "local_hits", "remote_hits", "misses",
                             "bytes_written", "bytes_read"):
                    lines += ["# TYPE mooncake_client_agent_%s_total counter" % name,
                              "mooncake_client_agent_%s_total %d" % (name, getattr(st, name))]
                for name in ("segment_size", "staging_size", "clients", "buffers", "views"):
                    lines += ["# TYPE mooncake_client_agent_%s gauge" % name,
                              "mooncake_client_agent_%s %d" % (name, getattr(st, name))]
            return 200, "text/plain; version=0.0.4", ("\n".join(lines) + "\n").encode()
        if path == "/metrics/summary":
            if not st:
                return 503, "text/plain", b"not connected\n"
            text = ("agent %s master %s healthy %s\nputs %d gets %d hits %d/%d misses %d\n"
                    % (st.agent_id.decode(), st.master.decode() or "-", hc == HC_HEALTHY,
                       st.puts, st.gets, st.local_hits, st.remote_hits, st.misses))
            return 200, "text/plain", text.encode()
        return 404, "text/plain", b"not found\n"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _mismatch(what, *lists):
    n0 = len(lists[0])
    if any(len(x) != n0 for x in lists[1:]):
        log.error("%s: the lists have different lengths (%s)", what,
                  ", ".join(str(len(x)) for x in lists))
        return True
    return False


class MooncakeDistributedStore:
    """Mooncake's store client, served by the mooncaked agent on this node.
    Thread-safe: one connection, requests from many threads pipelined.

    close() ends the session (its views, buffers and allocations from
    alloc_from_mem_pool go with it) and returns 0, as often as it is
    called; calls after it fail as before setup (NOT_CONNECTED, b"",
    None, HC_NOT_INITIALIZED), and setup() may be called again."""

    def __init__(self):
        self._h = None
        self._lock = threading.Lock()
        self._pool = []          # alloc_from_mem_pool allocations
        self._pool_left = None   # setup_dummy's mem_pool_size budget
        self._http = None
        self._puts = {}          # layerwise put sessions: key -> _PutSession
        self._host_cache = _HostCache()  # their memory, for the next ones
        self._regs = {}          # register_buffer's ranges: address -> size
        self._reads = {}         # layerwise read sessions: key -> BufferHandle

    # ------------------------------------------------------------ session

    def setup(self, local_hostname=None, metadata_server=None, global_segment_size=16 << 20,
              local_buffer_size=16 << 20, protocol="tcp", rdma_devices="",
              master_server_addr="127.0.0.1:50051", engine=None, enable_ssd_offload=False,
              ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
              client_http_port=9300, **kwargs):
        """Connect to the local agent. Also setup(config_dict) or
        setup(config=config_dict) with the same names as keys, or setup()
        alone: the JSON file named by
        $MOONCAKE_CONFIG_PATH. Returns 0 or a negative code; a failed
        setup leaves the store as it was before.

        Parameters the agent owns (local_hostname, metadata_server,
        protocol, rdma_devices, master_server_addr: it was configured
        with them) are accepted and not used. engine: a TransferEngine of
        this package (or its get_engine()) — both sessions reach the same
        agent. enable_ssd_offload=True asks that the agent has an SSD
        tier (its --ssd-path, not ssd_offload_path, says where): refused
        (-600, logged) when it has none, as is a tenant_id other than
        "default" (no tenants)."""
        cfg = {}
        if local_hostname is None and isinstance(kwargs.get("config"), dict):
            local_hostname = kwargs.pop("config")  # setup(config={...}), upstream's name
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
                       rdma_devices=rdma_devices, master_server_addr=master_server_addr,
                       enable_ssd_offload=enable_ssd_offload,
                       ssd_offload_path=ssd_offload_path, tenant_id=tenant_id,
                       enable_client_http_server=enable_client_http_server,
                       client_http_port=client_http_port)
        for k, v in kwargs.items():
            cfg[_ALIASES.get(k, k)] = v
        for k, v in list(cfg.items()):
            if k in _ALIASES:
                cfg[_ALIASES[k]] = cfg.pop(k)
        if engine is not None and not hasattr(engine, "_mooncake_engine"):
            raise TypeError("setup(): engine must be a mooncake.engine.TransferEngine, not %s"
                            % type(engine).__name__)
        tenant = str(cfg.get("tenant_id") or "default").strip() or "default"
        if tenant != "default":
            log.error("setup: tenant_id %r: mooncaked has one key space (tenant 'default')",
                      tenant)
            return INVALID_PARAMS
        port = int(cfg.get("client_http_port", 9300))
        if cfg.get("enable_client_http_server") and not 0 < port < 65536:
            log.error("setup: client_http_port %d is not a port", port)
            return INVALID_PARAMS
        try:
            seg = n.parse_size(cfg.get("global_segment_size", 16 << 20))
            stg = n.parse_size(cfg.get("local_buffer_size", 16 << 20))
        except ValueError as e:
            log.error("setup: %s", e)
            return INVALID_PARAMS
        rc = self._connect(cfg, stg)
        if rc:
            return rc
        if cfg.get("enable_ssd_offload"):
            st = self._stats()
            if st is None or not st.ssd_segment:
                log.error("setup: enable_ssd_offload: the agent on this node has no SSD "
                          "tier (start it with --ssd-path and --ssd-size)")
                self.close()
                return INVALID_PARAMS
            if cfg.get("ssd_offload_path"):
                log.warning("setup: ssd_offload_path %r is not used: the agent's SSD tier "
                            "(--ssd-path) holds what it demotes", cfg["ssd_offload_path"])
        offered = n.mc_segment_size(self._h)
        if seg > offered:
            log.warning("global_segment_size %d: the agent on this node contributes a "
                        "segment of %d bytes (--global-segment-size)", seg, offered)
        granted = n.mc_staging_size(self._h)
        if stg > granted:
            log.warning("local_buffer_size %d: the agent granted a staging buffer of %d "
                        "bytes (--local-buffer-size); larger values travel in "
                        "temporary shared memory", stg, granted)
        if cfg.get("enable_client_http_server") and self._http is None:
            try:
                self._http = _ClientHTTP(self, port)
            except OSError as e:
                log.error("setup: client HTTP server on port %d: %s", port, e)
                self.close()
                return INVALID_PARAMS
        return 0

    def _connect(self, cfg, staging):
        with self._lock:
            if self._h:
                return 0
            sock = cfg.get("socket_path") or os.environ.get("MOONCAKE_SOCKET") or None
            o = n.OpenOpts(sock.encode() if sock else None, max(staging, 0),
                           ("python pid %d" % os.getpid()).encode(),
                           1 if cfg.get("verify_gets") else 0)
            h = ctypes.c_void_p()
            rc = n.mc_open_ex(ctypes.byref(o), ctypes.byref(h))
            if rc:
                log.error("cannot reach the mooncaked agent%s: %s",
                          " at " + sock if sock else "", n.strerror(rc))
                return INVALID_PARAMS if rc == -22 else RPC_FAIL
            self._h = h
        return 0

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """Mooncake's standalone-storage client (SGLang HiCache's
        standalone_storage): here too a client of the local agent, which
        plays the separate "real client" process (server_address names it
        in Mooncake; the agent is found as by setup). mem_pool_size bounds
        what alloc_from_mem_pool hands out."""
        try:
            pool = n.parse_size(mem_pool_size)
            stg = n.parse_size(local_buffer_size)
        except ValueError as e:
            log.error("setup_dummy: %s", e)
            return INVALID_PARAMS
        rc = self._connect({}, stg)
        if rc == 0:
            self._pool_left = pool
            log.info("setup_dummy: served by the local agent %s (server_address %s)",
                     self.get_hostname(), server_address)
        return rc

    def init_all(self, protocol, device_name, mount_segment_size=16 << 20):
        """Mooncake's setup with its defaults (its initAll): connect to the
        local agent, mount_segment_size compared with the agent's segment
        as setup's global_segment_size is. Returns 0 or a negative code."""
        return self.setup("localhost", "P2PHANDSHAKE", mount_segment_size, 16 << 20, protocol,
                          device_name, "127.0.0.1:50051")

    def alloc_from_mem_pool(self, size):
        """Address of size bytes the agent reads and writes in place (see
        MooncakeHostMemAllocator), freed by close(); 0 on failure or when
        setup_dummy's mem_pool_size is used up."""
        size = int(size)
        with self._lock:
            if not self._h or size <= 0:
                return 0
            if self._pool_left is not None and size > self._pool_left:
                log.error("alloc_from_mem_pool(%d): the pool has %d bytes left", size,
                          self._pool_left)
                return 0
            p = n.mc_host_alloc(size)
            if not p:
                return 0
            self._pool.append(p)
            if self._pool_left is not None:
                self._pool_left -= size
            return p

    def close(self):
        with self._lock:
            h, self._h = self._h, None
            pool, self._pool = self._pool, []
            srv, self._http = self._http, None
            self._pool_left = None
            reads, self._reads = self._reads, {}
            puts, self._puts = self._puts, {}
            self._regs = {}
        for b in reads.values():
            b.release()
        for ss in puts.values():
            ss.end(self._host_cache)
        self._host_cache.clear()
        if srv:
            srv.close()
        if h:
            n.mc_close(h)
        for p in pool:
            n.mc_host_free(p)
        return 0

    def get_hostname(self):
        """The agent's "host:port" (its segment name)."""
        return n.mc_agent_address(self._h).decode() if self._h else ""

    def _stats(self):
        h = self._h
        if not h:
            return None
        st = n.AgentStats()
        return st if n.mc_agent_stats(h, ctypes.byref(st)) == 0 else None

    def health_check(self):
        """0 healthy, 1 not set up (or closed), 2 the agent or its master
        cannot be reached."""
        if not self._h:
            return HC_NOT_INITIALIZED
        st = self._stats()
        return HC_HEALTHY if st is not None and st.master else HC_MASTER_UNREACHABLE

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _handle(self):
        return self._h

    # ------------------------------------------------------------ put

    def _put_parts(self, keys, groups, config, upsert):
        """Batch put of values given as lists of (address, length)."""
        h = self._h
        cnt = len(keys)
        if not h:
            return [NOT_CONNECTED] * cnt
        if cnt == 0:
            return []
        o, err = _put_opts(config, upsert)
        if err:
            return [err] * cnt
        kp, kl, _keep = n.keys_arrays(keys)
        pp, pc, _rows = n.parts_arrays(groups)
        res = (ctypes.c_int * cnt)()
        rc = n.mc_batch_put_parts(h, cnt, kp, kl, pp, pc, ctypes.byref(o), res)
        out = [_rc(rc)] * cnt if rc else [_rc(r) for r in res]
        return out if upsert else [_exists_ok(r) for r in out]

    def _put_values(self, keys, values, config, upsert):
        pins = [n.Pinned(v) for v in values]
        try:
            return self._put_parts(keys, [[(p.ptr, p.len)] for p in pins], config, upsert)
        finally:
            for p in pins:
                p.release()

    def put(self, key, value, config=None):
        return self._put_values([key], [value], config, False)[0]

    def upsert(self, key, value, config=None):
        """put() that replaces an existing object (refused with -706 while
        a reader holds its lease)."""
        return self._put_values([key], [value], config, True)[0]

    def put_parts(self, key, *parts, config=None):
        """One object from several bytes-like parts, gathered once."""
        return self._put_multi(key, parts, config, False)

    def upsert_parts(self, key, *parts, config=None):
        return self._put_multi(key, parts, config, True)

    def _put_multi(self, key, parts, config, upsert):
        if not parts:
            return INVALID_PARAMS
        pins = [n.Pinned(p) for p in parts]
        try:
            return self._put_parts([key], [[(p.ptr, p.len) for p in pins]], config, upsert)[0]
        finally:
            for p in pins:
                p.release()

    def put_from(self, key, buffer_ptr, size, config=None):
        return self._put_parts([key], [[(buffer_ptr, size)]], config, False)[0]

    def upsert_from(self, key, buffer_ptr, size, config=None):
        return self._put_parts([key], [[(buffer_ptr, size)]], config, True)[0]

    def put_from_with_metadata(self, key, buffer_ptr, metadata_buffer_ptr, size,
                               metadata_size, config=None):
        """One object of metadata_size bytes at metadata_buffer_ptr
        followed by size bytes at buffer_ptr (the metadata first, as
        get_buffer's readers split it)."""
        return self._put_parts([key], [[(metadata_buffer_ptr, metadata_size),
                                        (buffer_ptr, size)]], config, False)[0]

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if _mismatch("batch_put_from", keys, buffer_ptrs, sizes):
            return [INVALID_PARAMS] * len(keys)
        return self._put_parts(keys, [[(p, s)] for p, s in zip(buffer_ptrs, sizes)], config,
                               False)

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if _mismatch("batch_upsert_from", keys, buffer_ptrs, sizes):
            return [INVALID_PARAMS] * len(keys)
        return self._put_parts(keys, [[(p, s)] for p, s in zip(buffer_ptrs, sizes)], config,
                               True)

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        """Object i is the concatenation of the buffers all_buffer_ptrs[i]
        (lengths all_sizes[i]): one value per KV block from its per-layer
        or K/V pieces."""
        keys, ptrs, sizes = list(keys), list(all_buffer_ptrs), list(all_sizes)
        if _mismatch("batch_put_from_multi_buffers", keys, ptrs, sizes) or any(
                len(p) != len(s) for p, s in zip(ptrs, sizes)):
            return [INVALID_PARAMS] * len(keys)
        return self._put_parts(keys, [list(zip(p, s)) for p, s in zip(ptrs, sizes)], config,
                               False)

    def put_batch(self, keys, values, config=None):
        """Returns 0, or the first item's error."""
        keys, values = list(keys), list(values)
        if _mismatch("put_batch", keys, values):
            return INVALID_PARAMS
        return next((r for r in self._put_values(keys, values, config, False) if r), 0)

    def upsert_batch(self, keys, values, config=None):
        """Returns 0, or the first item's error."""
        keys, values = list(keys), list(values)
        if _mismatch("upsert_batch", keys, values):
            return INVALID_PARAMS
        return next((r for r in self._put_values(keys, values, config, True) if r), 0)

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
        if rc == _MC_ECHECKSUM:
            log.error("get %r: %s", key, n.strerror(rc))
            return b""
        if rc:
            if rc != OBJECT_NOT_FOUND:  # (the same number in libmooncake)
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
        return self.batch_get_buffer([key])[0]

    def batch_get_buffer(self, keys):
        """BufferHandles in one round trip, None for keys not found."""
        keys = list(keys)
        h = self._h
        cnt = len(keys)
        if not h or cnt == 0:
            return [None] * cnt
        kp, kl, _keep = n.keys_arrays(keys)
        datas = (ctypes.c_void_p * cnt)()
        lens = (ctypes.c_size_t * cnt)()
        views = (ctypes.c_void_p * cnt)()
        res = (ctypes.c_int * cnt)()
        rc = n.mc_batch_get_view(h, cnt, kp, kl, datas, lens, views, res)
        out = []
        for i in range(cnt):
            if rc == 0 and res[i] == 0:
                out.append(BufferHandle(self, ctypes.c_void_p(views[i]), datas[i] or 0, lens[i]))
            else:
                out.append(None)
        return out

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
        (INVALID_PARAMS -600: the value is larger than size; TRANSFER_FAIL
        -800: verify found bytes that do not match the object's checksum)."""
        h = self._h
        if not h:
            return NOT_CONNECTED
        k = n.key_bytes(key)
        return _rc(n.mc_get_into_ex(h, k, len(k), buffer_ptr, size,
                                    ctypes.byref(n.GetOpts(1 if verify else 0))))

    def _get_parts(self, keys, groups):
        h = self._h
        cnt = len(keys)
        if not h:
            return [NOT_CONNECTED] * cnt
        if cnt == 0:
            return []
        kp, kl, _keep = n.keys_arrays(keys)
        pp, pc, _rows = n.parts_arrays(groups)
        res = (ctypes.c_int64 * cnt)()
        rc = n.mc_batch_get_into_parts(h, cnt, kp, kl, pp, pc, res)
        return [_rc(rc)] * cnt if rc else [_rc(r) for r in res]

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if _mismatch("batch_get_into", keys, buffer_ptrs, sizes):
            return [INVALID_PARAMS] * len(keys)
        return self._get_parts(keys, [[(p, s)] for p, s in zip(buffer_ptrs, sizes)])

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node=False):
        """Object i scattered over the buffers all_buffer_ptrs[i] in order:
        bytes read per key, or negative. prefer_alloc_in_same_node: gets
        read the nearest replica whatever it says."""
        keys, ptrs, sizes = list(keys), list(all_buffer_ptrs), list(all_sizes)
        if _mismatch("batch_get_into_multi_buffers", keys, ptrs, sizes) or any(
                len(p) != len(s) for p, s in zip(ptrs, sizes)):
            return [INVALID_PARAMS] * len(keys)
        return self._get_parts(keys, [list(zip(p, s)) for p, s in zip(ptrs, sizes)])

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                        all_sizes):
        """Byte ranges of objects into registered buffers, buffer-major:
        results[i][j][k] is the bytes of fragment k of key all_keys[i][j]
        read into buffer_ptrs[i], or negative (its key missing, a range
        past the object's or the registered buffer's end, a shape that
        does not match)."""
        n_buf = len(buffer_ptrs)
        if _mismatch("get_into_ranges", buffer_ptrs, all_keys, all_dst_offsets,
                     all_src_offsets, all_sizes):
            return [[[INVALID_PARAMS] * len(frags) for frags in
                     (all_sizes[i] if i < len(all_sizes) else [])]
                    for i in range(len(all_keys))]
        out, reqs, where, keep = [], [], [], []
        for i in range(n_buf):
            keys_i = all_keys[i]
            row = []
            shapes_ok = len(keys_i) == len(all_dst_offsets[i]) == len(all_src_offsets[i]) == \
                len(all_sizes[i])
            for j in range(len(keys_i)):
                d = all_dst_offsets[i][j] if shapes_ok else []
                s_ = all_src_offsets[i][j] if shapes_ok else []
                z = all_sizes[i][j] if j < len(all_sizes[i]) else []
                if not shapes_ok or not len(d) == len(s_) == len(z):
                    row.append([INVALID_PARAMS] * len(z))
                    continue
                kb = n.key_bytes(keys_i[j])
                keep.append(kb)
                row.append([INVALID_PARAMS] * len(z))
                for k in range(len(z)):
                    reqs.append(n.RangeReq(ctypes.cast(ctypes.c_char_p(kb), ctypes.c_void_p),
                                           len(kb), int(buffer_ptrs[i]) + int(d[k]),
                                           int(s_[k]), int(z[k])))
                    where.append((i, j, k))
            out.append(row)
        if reqs:
            h = self._h
            cnt = len(reqs)
            res = (ctypes.c_int64 * cnt)()
            rc = _rc(n.mc_get_ranges(h, (n.RangeReq * cnt)(*reqs), cnt, res)) if h else \
                NOT_CONNECTED
            for q, (i, j, k) in enumerate(where):
                out[i][j][k] = rc if rc else _rc(res[q])
        return out

    # ------------------------------------------------------------ keys

    def is_exist(self, key):
        h = self._h
        if not h:
            return NOT_CONNECTED
        k = n.key_bytes(key)
        return _rc(n.mc_exist(h, k, len(k)))

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
        return [_rc(rc)] * cnt if rc else [_rc(r) for r in res]

    def remove(self, key, force=False):
        h = self._h
        if not h:
            return NOT_CONNECTED
        k = n.key_bytes(key)
        return _rc(n.mc_remove(h, k, len(k), 1 if force else 0))

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
        return [_rc(rc)] * cnt if rc else [_rc(r) for r in res]

    def remove_all(self, force=False):
        """Objects removed (leased ones only with force), or negative."""
        h = self._h
        if not h:
            return NOT_CONNECTED
        return _rc(n.mc_remove_all(h, 1 if force else 0))

    def remove_by_regex(self, regex_pattern, force=False):
        """Objects whose key matches regex_pattern removed (leased ones
        only with force): their count, or negative (-600: the pattern is
        not a POSIX extended regular expression). Mooncake's patterns are
        ECMAScript: the common ones (^prefix, .*, [0-9]+, alternation)
        mean the same; \\d and lookarounds do not exist in POSIX."""
        h = self._h
        if not h:
            return NOT_CONNECTED
        rc = int(n.mc_remove_regex(h, str(regex_pattern).encode(), 1 if force else 0))
        if rc < 0:
            log.error("remove_by_regex %r: %s", regex_pattern, n.strerror(rc))
        return _rc(rc)

    def batch_replica_clear(self, keys, segment_name=""):
        """Mooncake's BatchReplicaClear: the keys cleared (list), skipping
        leased objects and those still being written. segment_name "" =
        the whole object; a segment name = its replicas there only. Any
        client's objects may be cleared (Mooncake checks that the caller
        wrote them; mooncaked does not record writers)."""
        keys = list(keys)
        h = self._h
        if not h or not keys:
            return []
        kp, kl, _keep = n.keys_arrays(keys)
        res = (ctypes.c_int * len(keys))()
        seg = segment_name.encode() if segment_name else None
        rc = n.mc_batch_replica_clear(h, len(keys), kp, kl, seg, res)
        if rc:
            log.error("batch_replica_clear: %s", n.strerror(rc))
            return []
        return [k for k, r in zip(keys, res) if r == 1]

    def create_copy_task(self, key, targets):
        """Refused: (UUID (0, 0), -1011). The master has no task queue for
        replica copies (replicate with ReplicateConfig.replica_num)."""
        log.error("create_copy_task %r: replica copy tasks are not supported by "
                  "mooncaked's master", key)
        return (0, 0), NOT_SUPPORTED

    def create_move_task(self, key, source, target):
        """Refused: (UUID (0, 0), -1011), as create_copy_task."""
        log.error("create_move_task %r: replica move tasks are not supported by "
                  "mooncaked's master", key)
        return (0, 0), NOT_SUPPORTED

    def query_task(self, task_id):
        """(None, -1011): no task can exist (see create_copy_task)."""
        log.error("query_task %r: replica tasks are not supported by mooncaked's master",
                  task_id)
        return None, NOT_SUPPORTED

    # ------------------------------------------------------------ layerwise sessions
    # The calls of Mooncake's layerwise contract (PR #2881, as vLLM
    # Ascend's and SGLang's layerwise KV pools call them): an object is
    # written range by range (a layer at a time) between batch_put_start
    # and batch_put_end, and read range by range between batch_get_start
    # and batch_get_end. Inputs are key-major and aligned by index;
    # offsets are byte offsets in the object. Start, end and revoke return
    # 0 or a negative code per key (batch_get_end one code); range calls
    # the bytes moved per key or a negative code.
    #
    # Here a put session assembles the object in this process's memory
    # and batch_put_end stores it whole (one batch put): until then it is
    # invisible (is_exist 0, a get misses), as upstream's PROCESSING
    # object. A read session holds the object's bytes from
    # batch_get_start (a zero-copy view of a local replica under its read
    # lease, else a copy), so its range reads never ask the master; a
    # second batch_get_start of a key takes them again (a newer value).

    def batch_put_start(self, keys, sizes):
        """Opens a put session per key for an object of its size, written
        by batch_put_from_multi_buffer_ranges and stored by batch_put_end.
        From 1 MiB on the object is assembled in memory the agent maps,
        reused by later sessions of the same size; bytes no range wrote
        are unspecified, as upstream's."""
        keys, sizes = list(keys), list(sizes)
        if _mismatch("batch_put_start", keys, sizes):
            return [INVALID_PARAMS] * len(keys)
        out = []
        with self._lock:
            for k, size in zip(keys, sizes):
                if not self._h:
                    out.append(NOT_CONNECTED)
                elif not isinstance(size, int) or size <= 0 or k in self._puts:
                    log.error("batch_put_start %r: %s", k, "a put session of it is open"
                              if k in self._puts else "size %r" % (size,))
                    out.append(INVALID_PARAMS)
                else:
                    self._puts[k] = _PutSession(size, self._host_cache)
                    out.append(0)
        return out

    def _ranges(self, what, write, keys, all_buffers, all_sizes, all_offsets, config=None):
        """Copy each key's ranges between the caller's buffers and its
        session's object: into it (write, a put session) or out of it."""
        keys, bufs = list(keys), list(all_buffers)
        sizes, offs = list(all_sizes), list(all_offsets)
        if _mismatch(what, keys, bufs, sizes, offs):
            return [INVALID_PARAMS] * len(keys)
        out = []
        with self._lock:
            table = self._puts if write else self._reads
            for k, bs, zs, os_ in zip(keys, bufs, sizes, offs):
                sess = table.get(k)
                if sess is None:
                    log.error("%s %r: no %s session (%s)", what, k, "put" if write else "read",
                              "batch_put_start" if write else "batch_get_start")
                    out.append(INVALID_PARAMS)
                    continue
                if write:
                    if config is not None:
                        sess.config = config
                    base, size = sess.addr, sess.size
                else:
                    base, size = sess.ptr(), sess.size()
                out.append(_copy_ranges(k, base, size, list(bs), list(zs), list(os_), write))
        return out

    def batch_put_from_multi_buffer_ranges(self, keys, all_buffers, all_sizes,
                                           all_dst_offsets, config=None):
        """Copies each key's buffers to their offsets in its object."""
        return self._ranges("batch_put_from_multi_buffer_ranges", True, keys, all_buffers,
                            all_sizes, all_dst_offsets, config)

    def batch_put_end(self, keys):
        """Stores the assembled objects (one batch put); a key whose
        session ended already answers 0 when the object is there."""
        keys = list(keys)
        with self._lock:
            sess = {k: self._puts.pop(k) for k in dict.fromkeys(keys) if k in self._puts}
        out = {}
        by_config = {}
        for k, ss in sess.items():
            by_config.setdefault(id(ss.config), (ss.config, []))[1].append(k)
        try:
            for config, ks in by_config.values():
                res = self._put_parts(ks, [[(sess[k].addr, sess[k].size)] for k in ks],
                                      config, False)
                out.update(zip(ks, res))
        finally:
            for ss in sess.values():
                ss.end(self._host_cache)
        rest = [k for k in dict.fromkeys(keys) if k not in out]
        if rest:
            there = self.batch_is_exist(rest)
            for k, e in zip(rest, there):
                if e != 1:
                    log.error("batch_put_end %r: no put session and no such object", k)
                out[k] = 0 if e == 1 else INVALID_PARAMS
        return [out[k] for k in keys]

    def batch_put_revoke(self, keys):
        """Drops the put sessions: nothing is stored."""
        keys = list(keys)
        with self._lock:
            gone = [self._puts.pop(k, None) for k in keys]
        for ss in gone:
            if ss:
                ss.end(self._host_cache)
        return [0] * len(keys)

    def batch_get_start(self, keys):
        keys = list(keys)
        handles = self.batch_get_buffer(keys)
        out, old = [], []
        with self._lock:
            for k, b in zip(keys, handles):
                prev = self._reads.pop(k, None)
                if prev is not None:
                    old.append(prev)
                if b is None:
                    out.append(OBJECT_NOT_FOUND if self._h else NOT_CONNECTED)
                else:
                    self._reads[k] = b
                    out.append(0)
        for b in old:
            b.release()
        return out

    def batch_get_into_multi_buffer_ranges(self, keys, all_buffers, all_sizes, all_src_offsets):
        """Copies ranges of each key's object (held since batch_get_start)
        into the buffers; a key without a read session fails, the master
        is not asked."""
        return self._ranges("batch_get_into_multi_buffer_ranges", False, keys, all_buffers,
                            all_sizes, all_src_offsets)

    def batch_get_end(self, keys):
        with self._lock:
            done = [self._reads.pop(k) for k in list(keys) if k in self._reads]
        for b in done:
            b.release()
        return 0

    # SGLang's names of the read session.
    batch_get_session_start = batch_get_start
    batch_get_session_end = batch_get_end

    # ------------------------------------------------------------ replicas

    def batch_get_replica_desc(self, keys):
        """{key: [ReplicaDescriptor, ...]} as the master places them, an
        empty list for a key not found (or on an error, logged). The
        master counts the question as a read (a read lease)."""
        keys = list(keys)
        out = {k: [] for k in keys}
        h = self._h
        if not h or not keys:
            return out
        cap = 16
        kp, kl, _keep = n.keys_arrays(keys)
        reps = (n.Replica * (cap * len(keys)))()
        counts = (ctypes.c_size_t * len(keys))()
        res = (ctypes.c_int * len(keys))()
        rc = n.mc_batch_get_replicas(h, len(keys), kp, kl, reps, cap, counts, res)
        if rc:
            log.error("batch_get_replica_desc: %s", n.strerror(rc))
            return out
        for i, k in enumerate(keys):
            if res[i]:
                if res[i] != OBJECT_NOT_FOUND:
                    log.error("get_replica_desc %r: %s", k, n.strerror(res[i]))
                continue
            found = []
            for j in range(min(counts[i], cap)):
                r = reps[i * cap + j]
                seg = r.segment.decode(errors="replace")
                status = ReplicaStatus.COMPLETE if r.complete else ReplicaStatus.PROCESSING
                mem = None if r.tier == 1 else MemoryDescriptor(
                    Descriptor(r.size, r.address, seg))
                found.append(ReplicaDescriptor(status, seg, mem))
            out[k] = found
        return out

    def get_replica_desc(self, key):
        """[ReplicaDescriptor, ...] of one key ([] when not found)."""
        return self.batch_get_replica_desc([key])[key]

    # ------------------------------------------------------------ tensors
    # PyTorch tensors, laid out as Mooncake lays them out (mooncake.tensor):
    # Mooncake's 40-byte TensorMetadata, then the elements. Puts return 0
    # or negative (-600 INVALID_PARAMS for what is not a tensor of at most
    # 4 dimensions and a Mooncake dtype, or when torch cannot be
    # imported); gets a tensor or None. A GPU tensor is copied to host
    # memory first. The _with_tp forms store shard r of
    # tensor.chunk(tp_size, split_dim) under "<key>_tp_<r>" (every shard
    # at once: tp_rank does not matter to a put) and read the caller's
    # shard, tp_rank.

    def _put_tensors(self, keys, tensors, config, what):
        keys, tensors = list(keys), list(tensors)
        if not keys or _mismatch(what, keys, tensors):
            return [INVALID_PARAMS] * len(keys)
        out = [INVALID_PARAMS] * len(keys)
        packed, idx = [], []
        for i, (k, t) in enumerate(zip(keys, tensors)):
            p, why = _tensor.pack(t)
            if p is None:
                log.error("%s %r: %s", what, k, why)
                continue
            packed.append(p)
            idx.append(i)
        if packed:
            res = self._put_parts([keys[i] for i in idx], [p.parts() for p in packed],
                                  config, False)
            for i, r in zip(idx, res):
                out[i] = r
        return out

    def _put_tensors_tp(self, keys, tensors, config, tp_size, split_dim, what):
        """Every shard of every tensor; a key's result is its first
        shard's error, or 0."""
        keys, tensors = list(keys), list(tensors)
        if not keys or _mismatch(what, keys, tensors):
            return [INVALID_PARAMS] * len(keys)
        torch = _tensor.torch_module()
        shard_keys, shards, owner = [], [], []
        out = [INVALID_PARAMS] * len(keys)
        for i, (k, t) in enumerate(zip(keys, tensors)):
            parts = None
            if torch is not None and isinstance(t, torch.Tensor):
                try:
                    parts = _tensor.chunks(t, tp_size, split_dim)
                except (RuntimeError, IndexError) as e:
                    log.error("%s %r: %s", what, k, e)
            if parts is None:
                log.error("%s %r: not a tensor that splits into %d shards along "
                          "dimension %d", what, k, tp_size, split_dim)
                continue
            out[i] = 0
            for r, part in enumerate(parts):
                shard_keys.append(_tensor.tp_key(k, r))
                shards.append(part)
                owner.append(i)
        if shard_keys:
            res = self._put_tensors(shard_keys, shards, config, what)
            for i, r in zip(owner, res):
                if r and not out[i]:
                    out[i] = r
        return out

    @staticmethod
    def _check_pub(config):
        """0, or INVALID_PARAMS when config names preferred segments whose
        number is not its replica_num (as Mooncake checks a pub)."""
        segs = [x for x in (getattr(config, "preferred_segments", None) or []) if x]
        if segs and len(segs) != int(getattr(config, "replica_num", 1) or 1):
            log.error("pub: %d preferred segments for replica_num %d", len(segs),
                      int(getattr(config, "replica_num", 1) or 1))
            return INVALID_PARAMS
        return 0

    def put_tensor(self, key, tensor):
        return self._put_tensors([key], [tensor], None, "put_tensor")[0]

    def batch_put_tensor(self, keys, tensors_list):
        return self._put_tensors(keys, tensors_list, None, "batch_put_tensor")

    def pub_tensor(self, key, tensor, config=None):
        return self._check_pub(config) or \
            self._put_tensors([key], [tensor], config, "pub_tensor")[0]

    def batch_pub_tensor(self, keys, tensors_list, config=None):
        keys = list(keys)
        if self._check_pub(config):
            return [INVALID_PARAMS] * len(keys)
        return self._put_tensors(keys, tensors_list, config, "batch_pub_tensor")

    def put_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0):
        if tp_size <= 1:
            return self.put_tensor(key, tensor)
        return self._put_tensors_tp([key], [tensor], None, tp_size, split_dim,
                                    "put_tensor_with_tp")[0]

    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1,
                                 split_dim=0):
        if tp_size <= 1:
            return self.batch_put_tensor(base_keys, tensors_list)
        return self._put_tensors_tp(base_keys, tensors_list, None, tp_size, split_dim,
                                    "batch_put_tensor_with_tp")

    def pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0):
        if tp_size <= 1:
            return self.pub_tensor(key, tensor, config)
        return self._check_pub(config) or self._put_tensors_tp(
            [key], [tensor], config, tp_size, split_dim, "pub_tensor_with_tp")[0]

    def batch_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0,
                                 tp_size=1, split_dim=0):
        base_keys = list(base_keys)
        if tp_size <= 1:
            return self.batch_pub_tensor(base_keys, tensors_list, config)
        if self._check_pub(config):
            return [INVALID_PARAMS] * len(base_keys)
        return self._put_tensors_tp(base_keys, tensors_list, config, tp_size, split_dim,
                                    "batch_pub_tensor_with_tp")

    def batch_get_tensor(self, keys):
        """A new tensor per key (its bytes copied once), None for a key
        not found or an object that is not a stored tensor."""
        keys = list(keys)
        out = []
        for k, b in zip(keys, self.batch_get_buffer(keys)):
            t = None
            if b is not None:
                try:
                    t = _tensor.copy_out(b.ptr(), b.size())
                finally:
                    b.release()
                if t is None:
                    log.error("get_tensor %r: not a tensor stored by put_tensor", k)
            out.append(t)
        return out

    def get_tensor(self, key):
        return self.batch_get_tensor([key])[0]

    def get_tensor_with_tp(self, key, tp_rank=0, tp_size=1, split_dim=0):
        return self.get_tensor(key if tp_size <= 1 else _tensor.tp_key(key, tp_rank))

    def batch_get_tensor_with_tp(self, base_keys, tp_rank=0, tp_size=1):
        keys = list(base_keys)
        return self.batch_get_tensor(
            keys if tp_size <= 1 else [_tensor.tp_key(k, tp_rank) for k in keys])

    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes):
        """Tensors read into [buffer_ptrs[i], + sizes[i]) (the object
        whole: its 40-byte header first) and returned as views of that
        memory, without a copy; None where the get failed."""
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if _mismatch("batch_get_tensor_into", keys, buffer_ptrs, sizes):
            return [None] * len(keys)
        out = []
        for k, p, r in zip(keys, buffer_ptrs, self.batch_get_into(keys, buffer_ptrs, sizes)):
            t = _tensor.view_of(p, r) if r >= 0 else None
            if r >= 0 and t is None:
                log.error("get_tensor_into %r: not a tensor stored by put_tensor", k)
            out.append(t)
        return out

    def get_tensor_into(self, key, buffer_ptr, size):
        return self.batch_get_tensor_into([key], [buffer_ptr], [size])[0]

    def get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank=0, tp_size=1,
                                split_dim=0):
        return self.get_tensor_into(key if tp_size <= 1 else _tensor.tp_key(key, tp_rank),
                                    buffer_ptr, size)

    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank=0,
                                      tp_size=1):
        keys = list(base_keys)
        if tp_size > 1:
            keys = [_tensor.tp_key(k, tp_rank) for k in keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    # ------------------------------------------------------------ buffers

    def register_buffer(self, buffer_ptr, size):
        """0, or negative (-600 INVALID_PARAMS: it overlaps a registered range).
        Memory from alloc_from_mem_pool / MooncakeHostMemAllocator /
        get_alloc_func_addr is handed to the agent (zero copy); other
        memory is copied through the staging buffer. A GPU's memory (the
        CUDA driver says so) is refused, -1011 UNAVAILABLE_IN_CURRENT_MODE:
        the CPU would have to copy it."""
        h = self._h
        if not h:
            return NOT_CONNECTED
        rc = n.mc_register_buffer(h, buffer_ptr, size)
        if rc == 0:
            with self._lock:
                self._regs[buffer_ptr] = size
        if rc == -95:  # -EOPNOTSUPP
            log.error("register_buffer(0x%x, %d): GPU memory: the store's puts and gets "
                      "copy values with the CPU, which cannot read it; use host memory "
                      "(MooncakeHostMemAllocator, pinned CPU tensors)", buffer_ptr, size)
        return _rc(rc)

    def unregister_buffer(self, buffer_ptr, size=None):
        """0, or -600 (not registered, or size given and not the one
        register_buffer gave: vLLM's EC connector passes it)."""
        h = self._h
        if not h:
            return NOT_CONNECTED
        with self._lock:
            known = self._regs.get(buffer_ptr)
        if size is not None and known is not None and size != known:
            log.error("unregister_buffer(0x%x, %d): it was registered with size %d",
                      buffer_ptr, size, known)
            return INVALID_PARAMS
        rc = _rc(n.mc_unregister_buffer(h, buffer_ptr))
        if rc == 0:
            with self._lock:
                self._regs.pop(buffer_ptr, None)
        return rc


from mooncake.buffer_pool import BufferLease, BufferPool, RegisteredBufferPool  # noqa: E402,F401
