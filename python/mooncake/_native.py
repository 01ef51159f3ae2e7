"""ctypes bindings of libmooncake (src/client/mooncake.h) and buffer helpers."""

import ctypes
import ctypes.util
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    env = os.environ.get("MOONCAKE_LIB")
    if env:
        yield env
    # The source tree: python/mooncake -> build/
    yield os.path.normpath(os.path.join(_HERE, "../../build/libmooncake.so"))
    # Installed: PREFIX/lib/python3/dist-packages/mooncake -> PREFIX/lib
    for up in ("../../..", "../../../.."):
        for name in ("libmooncake.so.0", "libmooncake.so"):
            yield os.path.normpath(os.path.join(_HERE, up, name))
    found = ctypes.util.find_library("mooncake")
    if found:
        yield found
    yield "libmooncake.so.0"


def _load():
    errors = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append("%s: %s" % (path, e))
    raise ImportError("libmooncake.so not found (set MOONCAKE_LIB): " + "; ".join(errors))


lib = _load()

c_void_p = ctypes.c_void_p
c_size_t = ctypes.c_size_t
c_int = ctypes.c_int
c_int64 = ctypes.c_int64
c_uint64 = ctypes.c_uint64
c_char_p = ctypes.c_char_p
POINTER = ctypes.POINTER


class OpenOpts(ctypes.Structure):
    _fields_ = [("socket_path", c_char_p), ("staging_bytes", c_size_t),
                ("client_name", c_char_p), ("verify_gets", c_int)]


class GetOpts(ctypes.Structure):
    _fields_ = [("verify", c_int)]


class PutOpts(ctypes.Structure):
    _fields_ = [("replica_num", ctypes.c_uint), ("soft_pin", c_int),
                ("ttl_ms", c_uint64), ("preferred_segment", c_char_p),
                ("upsert", c_int), ("tier", c_int)]


class Part(ctypes.Structure):
    _fields_ = [("buf", c_void_p), ("len", c_size_t)]


class RangeReq(ctypes.Structure):
    _fields_ = [("key", c_void_p), ("klen", c_size_t), ("dst", c_void_p),
                ("src_offset", c_uint64), ("len", c_size_t)]


class SegmentInfo(ctypes.Structure):
    _fields_ = [("first_address", c_uint64), ("first_length", c_uint64),
                ("regions", c_uint64)]


class Replica(ctypes.Structure):
    """struct mc_replica (mooncake.h)."""
    _fields_ = [("segment", ctypes.c_char * 256), ("address", c_uint64), ("size", c_uint64),
                ("tier", c_int), ("complete", c_int)]


class AgentStats(ctypes.Structure):
    _fields_ = [("agent_id", ctypes.c_char * 128), ("master", ctypes.c_char * 128),
                ("master_view", c_uint64), ("segment_size", c_uint64), ("hugepages", c_int),
                ("numa_node", c_int), ("staging_size", c_uint64), ("clients", c_uint64),
                ("buffers", c_uint64), ("views", c_uint64), ("puts", c_uint64),
                ("gets", c_uint64), ("local_hits", c_uint64), ("remote_hits", c_uint64),
                ("misses", c_uint64), ("bytes_written", c_uint64), ("bytes_read", c_uint64),
                ("inventory", c_uint64), ("get_bad", c_uint64), ("resync_bad", c_uint64),
                ("ssd_segment", ctypes.c_char * 160), ("ssd_size", c_uint64),
                ("ssd_used", c_uint64), ("ssd_objects", c_uint64), ("ssd_hits", c_uint64),
                ("ssd_demotions", c_uint64), ("ssd_promotions", c_uint64),
                ("table_gets", c_uint64), ("ssd_reads", c_uint64),
                ("ssd_read_ns", c_uint64), ("ssd_writes", c_uint64),
                ("ssd_write_ns", c_uint64)]


class TransferReq(ctypes.Structure):
    _fields_ = [("op", c_int), ("local", c_void_p), ("len", c_size_t),
                ("target", c_char_p), ("remote_addr", c_uint64)]


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


mc_open_ex = _fn("mc_open_ex", c_int, POINTER(OpenOpts), POINTER(c_void_p))
mc_close = _fn("mc_close", None, c_void_p)
mc_put = _fn("mc_put", c_int, c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, POINTER(PutOpts))
mc_put_from = _fn("mc_put_from", c_int, c_void_p, c_void_p, c_size_t, c_void_p, c_size_t,
                  POINTER(PutOpts))
mc_get = _fn("mc_get", c_int, c_void_p, c_void_p, c_size_t, POINTER(c_void_p), POINTER(c_size_t))
mc_get_into = _fn("mc_get_into", c_int64, c_void_p, c_void_p, c_size_t, c_void_p, c_size_t)
mc_get_ex = _fn("mc_get_ex", c_int, c_void_p, c_void_p, c_size_t, POINTER(c_void_p),
                POINTER(c_size_t), POINTER(GetOpts))
mc_get_into_ex = _fn("mc_get_into_ex", c_int64, c_void_p, c_void_p, c_size_t, c_void_p,
                     c_size_t, POINTER(GetOpts))
mc_get_view = _fn("mc_get_view", c_int, c_void_p, c_void_p, c_size_t, POINTER(c_void_p),
                  POINTER(c_size_t), POINTER(c_void_p))
mc_view_is_mapped = _fn("mc_view_is_mapped", c_int, c_void_p)
mc_view_release = _fn("mc_view_release", None, c_void_p, c_void_p)
mc_exist = _fn("mc_exist", c_int, c_void_p, c_void_p, c_size_t)
mc_remove = _fn("mc_remove", c_int, c_void_p, c_void_p, c_size_t, c_int)
mc_remove_all = _fn("mc_remove_all", c_int64, c_void_p, c_int)
mc_batch_put = _fn("mc_batch_put", c_int, c_void_p, c_size_t, POINTER(c_void_p), POINTER(c_size_t),
                   POINTER(c_void_p), POINTER(c_size_t), POINTER(PutOpts), POINTER(c_int))
mc_batch_get = _fn("mc_batch_get", c_int, c_void_p, c_size_t, POINTER(c_void_p), POINTER(c_size_t),
                   POINTER(c_void_p), POINTER(c_size_t), POINTER(c_int))
mc_batch_get_into = _fn("mc_batch_get_into", c_int, c_void_p, c_size_t, POINTER(c_void_p),
                        POINTER(c_size_t), POINTER(c_void_p), POINTER(c_size_t), POINTER(c_int64))
mc_batch_exist = _fn("mc_batch_exist", c_int, c_void_p, c_size_t, POINTER(c_void_p),
                     POINTER(c_size_t), POINTER(c_int))
mc_batch_remove = _fn("mc_batch_remove", c_int, c_void_p, c_size_t, POINTER(c_void_p),
                      POINTER(c_size_t), c_int, POINTER(c_int))
mc_buffer_alloc = _fn("mc_buffer_alloc", c_int, c_void_p, c_size_t, POINTER(c_void_p))
mc_buffer_free = _fn("mc_buffer_free", c_int, c_void_p, c_void_p)
mc_register_buffer = _fn("mc_register_buffer", c_int, c_void_p, c_void_p, c_size_t)
mc_unregister_buffer = _fn("mc_unregister_buffer", c_int, c_void_p, c_void_p)
mc_transfer = _fn("mc_transfer", c_int, c_void_p, POINTER(TransferReq), c_size_t, POINTER(c_int))
mc_register_memory = _fn("mc_register_memory", c_int, c_void_p, c_void_p, c_size_t)
mc_register_dmabuf = _fn("mc_register_dmabuf", c_int, c_void_p, c_int, c_uint64, c_void_p,
                         c_size_t)
mc_register_cuda = _fn("mc_register_cuda", c_int, c_void_p, c_void_p, c_size_t)
mc_host_alloc = _fn("mc_host_alloc", c_void_p, c_size_t)
mc_host_free = _fn("mc_host_free", None, c_void_p)
mc_host_size = _fn("mc_host_size", c_size_t, c_void_p)
mc_batch_put_parts = _fn("mc_batch_put_parts", c_int, c_void_p, c_size_t, POINTER(c_void_p),
                         POINTER(c_size_t), POINTER(POINTER(Part)), POINTER(c_size_t),
                         POINTER(PutOpts), POINTER(c_int))
mc_batch_get_into_parts = _fn("mc_batch_get_into_parts", c_int, c_void_p, c_size_t,
                              POINTER(c_void_p), POINTER(c_size_t), POINTER(POINTER(Part)),
                              POINTER(c_size_t), POINTER(c_int64))
mc_batch_get_view = _fn("mc_batch_get_view", c_int, c_void_p, c_size_t, POINTER(c_void_p),
                        POINTER(c_size_t), POINTER(c_void_p), POINTER(c_size_t),
                        POINTER(c_void_p), POINTER(c_int))
mc_get_ranges = _fn("mc_get_ranges", c_int, c_void_p, POINTER(RangeReq), c_size_t,
                    POINTER(c_int64))
mc_remove_regex = _fn("mc_remove_regex", c_int64, c_void_p, c_char_p, c_int)
mc_batch_replica_clear = _fn("mc_batch_replica_clear", c_int, c_void_p, c_size_t,
                             POINTER(c_void_p), POINTER(c_size_t), c_char_p, POINTER(c_int))
mc_batch_get_replicas = _fn("mc_batch_get_replicas", c_int, c_void_p, c_size_t,
                            POINTER(c_void_p), POINTER(c_size_t), POINTER(Replica), c_size_t,
                            POINTER(c_size_t), POINTER(c_int))
mc_segment_info = _fn("mc_segment_info", c_int, c_void_p, c_char_p, POINTER(SegmentInfo))
mc_agent_stats = _fn("mc_agent_stats", c_int, c_void_p, POINTER(AgentStats))
mc_agent_address = _fn("mc_agent_address", c_char_p, c_void_p)
mc_engine_open = _fn("mc_engine_open", c_int, c_void_p, c_char_p, c_size_t)
mc_segment_size = _fn("mc_segment_size", c_uint64, c_void_p)
mc_staging_size = _fn("mc_staging_size", c_uint64, c_void_p)
_strerror = _fn("mc_strerror", c_char_p, c_int)
_errname = _fn("mc_errname", c_char_p, c_int)
_version = _fn("mc_version", c_char_p)
libc_free = ctypes.CDLL(None).free
libc_free.argtypes = [c_void_p]
libc_free.restype = None


def strerror(code):
    """Text of a negative error code."""
    return _strerror(int(code)).decode()


def errname(code):
    """Name of a negative error code ("MC_EOBJECT_NOT_FOUND", "ENOENT")."""
    return _errname(int(code)).decode()


def version():
    return _version().decode()


# ---------------------------------------------------------------- buffers

class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", c_int), ("ndim", c_int),
                ("format", c_char_p), ("shape", POINTER(ctypes.c_ssize_t)),
                ("strides", POINTER(ctypes.c_ssize_t)),
                ("suboffsets", POINTER(ctypes.c_ssize_t)), ("internal", c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, POINTER(_PyBuffer), c_int]
_get_buffer.restype = c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [POINTER(_PyBuffer)]
_release_buffer.restype = None


class Pinned:
    """The address and length of a bytes-like object's memory, without a
    copy (bytes, bytearray, memoryview, array.array, numpy arrays: any
    C-contiguous object with the buffer protocol), held until release().
    Non-contiguous buffers are copied once."""

    __slots__ = ("_view", "_copy", "ptr", "len")

    def __init__(self, obj):
        self._copy = None
        if isinstance(obj, str):
            obj = obj.encode()
        v = _PyBuffer()
        try:
            _get_buffer(obj, ctypes.byref(v), 0)  # PyBUF_SIMPLE: contiguous bytes
        except (BufferError, TypeError):
            self._copy = memoryview(obj).tobytes()
            _get_buffer(self._copy, ctypes.byref(v), 0)
        self._view = v
        self.ptr = v.buf or 0
        self.len = v.len

    def release(self):
        if self._view is not None:
            _release_buffer(ctypes.byref(self._view))
            self._view = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        self.release()


def key_bytes(key):
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise TypeError("a key is str or bytes, not %s" % type(key).__name__)


def keys_arrays(keys):
    """Keys as ctypes arrays of pointers and lengths (kept alive by the
    returned list)."""
    kb = [key_bytes(k) for k in keys]
    n = len(kb)
    ptrs = (c_void_p * max(n, 1))(*[ctypes.cast(ctypes.c_char_p(k), c_void_p) for k in kb])
    lens = (c_size_t * max(n, 1))(*[len(k) for k in kb])
    return ptrs, lens, kb


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30,
          "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}


def parse_size(v):
    """An int, or a string like "512MB", "4G", "1073741824"."""
    if isinstance(v, int):
        return v
    s = str(v).strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    unit = s[len(num):]
    if unit not in _UNITS or not num:
        raise ValueError("not a size: %r" % (v,))
    return int(float(num) * _UNITS[unit])


def parts_arrays(groups):
    """Lists of (address, length) lists as the C arrays of mc_batch_*_parts
    (kept alive by the returned tuple's last item)."""
    n = len(groups)
    rows = [(Part * max(len(g), 1))(*[Part(int(a), int(ln)) for a, ln in g]) for g in groups]
    ptrs = (POINTER(Part) * max(n, 1))(*[ctypes.cast(r, POINTER(Part)) for r in rows])
    counts = (c_size_t * max(n, 1))(*[len(g) for g in groups])
    return ptrs, counts, rows


# ---------------------------------------------------------------- buffer protocol

class _TypeSlot(ctypes.Structure):
    _fields_ = [("slot", c_int), ("pfunc", c_void_p)]


class _TypeSpec(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("basicsize", c_int), ("itemsize", c_int),
                ("flags", ctypes.c_uint), ("slots", POINTER(_TypeSlot))]


_fill_info = ctypes.pythonapi.PyBuffer_FillInfo
_fill_info.argtypes = [c_void_p, ctypes.py_object, c_void_p, ctypes.c_ssize_t, c_int, c_int]
_fill_info.restype = c_int
_GETBUF = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, c_void_p, c_int)


_RELBUF = ctypes.PYFUNCTYPE(None, ctypes.py_object, c_void_p)


def _getbuffer(obj, view, flags):
    # Writable, as Mooncake's BufferHandle: a copy is the caller's; do
    # not write into a mapped view (read-only pages).
    rc = _fill_info(view, obj, obj._buf_ptr or None, obj._buf_len, 0, flags)
    obj._buf_exports += 1
    return rc


def _releasebuffer(obj, view):
    obj._buf_exports -= 1
    if obj._buf_exports == 0:
        obj._buf_unexported()


_getbuffer_c = _GETBUF(_getbuffer)
_releasebuffer_c = _RELBUF(_releasebuffer)
_PY_BF_GETBUFFER = 1
_PY_BF_RELEASEBUFFER = 2
_TPFLAGS = (1 << 18) | (1 << 10)  # HAVE_VERSION_TAG | BASETYPE


def _buffer_base():
    """A base class whose instances export [_buf_ptr, _buf_ptr + _buf_len)
    through the buffer protocol, on every Python 3 (PEP 688's __buffer__
    is 3.12+ only): a type made with PyType_FromSpec and bf_getbuffer /
    bf_releasebuffer slots, the way a C extension declares one. Subclasses
    set _buf_ptr, _buf_len and _buf_exports (0), and get _buf_unexported()
    called when the last exported view is released."""
    slots = (_TypeSlot * 3)(_TypeSlot(_PY_BF_GETBUFFER, ctypes.cast(_getbuffer_c, c_void_p)),
                            _TypeSlot(_PY_BF_RELEASEBUFFER,
                                      ctypes.cast(_releasebuffer_c, c_void_p)),
                            _TypeSlot(0, None))
    spec = _TypeSpec(b"mooncake.BufferBase", 0, 0, _TPFLAGS, slots)
    make = ctypes.pythonapi.PyType_FromSpec
    make.argtypes = [POINTER(_TypeSpec)]
    make.restype = ctypes.py_object
    return make(ctypes.byref(spec))


BufferBase = _buffer_base()
