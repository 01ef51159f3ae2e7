"""The Python API as Mooncake's users write it: the examples of Mooncake's
store and transfer-engine documentation, run unchanged against a
mooncaked standalone (master and agent in one process, no meta). Only the
socket is pointed at through MOONCAKE_SOCKET, the one thing that differs
from a default install.
"""
import array
import ctypes
import json
import os
import tempfile

import storetest as st
from storetest import MiB
import mctest
from mctest import Daemon, case, eq

_tmp = tempfile.TemporaryDirectory(prefix="mooncake-py-")
SOCKET = os.path.join(_tmp.name, "agent.sock")
_daemon = None


def daemon():
    global _daemon
    if _daemon is None:
        _daemon = Daemon("standalone", args=["--socket=" + SOCKET, "--global-segment-size=256M"],
                         env=st.daemon_env())
        mctest.wait_for(lambda: "mounted with master" in _daemon.output(), what="ready")
        os.environ["MOONCAKE_SOCKET"] = SOCKET
    return _daemon


@case
def hello_world():
    daemon()
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    ret = store.setup("localhost", "P2PHANDSHAKE", 512 * 1024 * 1024, 128 * 1024 * 1024,
                      "tcp", "", "localhost:50051")
    eq(ret, 0, "setup")
    store.put("hello_key", b"Hello, Mooncake Store!")
    data = store.get("hello_key")
    eq(data.decode(), "Hello, Mooncake Store!", "round trip")
    # As in Mooncake: a put of a key that exists succeeds, the value stays.
    eq(store.put("hello_key", b"again"), 0, "a second put is not an error")
    eq(store.get("hello_key"), b"Hello, Mooncake Store!", "the first value stays")
    if store.get("missing_key"):
        raise AssertionError("a miss must be falsy")
    eq(store.is_exist("hello_key"), 1, "exists")
    store.close()


@case
def setup_from_dict_and_config_file():
    daemon()
    from mooncake.store import MooncakeDistributedStore

    cfg = {"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
           "global_segment_size": "256MB", "local_buffer_size": "16MB", "protocol": "tcp",
           "device_name": "", "master_server_address": "localhost:50051"}
    s = MooncakeDistributedStore()
    eq(s.setup(cfg), 0, "setup(dict)")
    s.close()
    eq(s.setup(config=cfg), 0, "setup(config=dict), upstream's keyword")
    s.close()
    eq(s.setup(config=dict(cfg, tenant_id="other")), -600, "setup(config=...) reads its keys")
    path = os.path.join(_tmp.name, "mooncake.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    os.environ["MOONCAKE_CONFIG_PATH"] = path
    s = MooncakeDistributedStore()
    eq(s.setup(), 0, "setup() from MOONCAKE_CONFIG_PATH")
    eq(s.get_hostname(), daemon().addr("agent-listen"), "the agent's address")
    s.close()
    del os.environ["MOONCAKE_CONFIG_PATH"]


@case
def zero_copy_workflow():
    """Mooncake's "Complete Zero-Copy Workflow", with array.array in place
    of numpy (not installed here; numpy arrays take the same path)."""
    daemon()
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    store.setup("localhost", "P2PHANDSHAKE", 512 * 1024 * 1024, 16 * 1024 * 1024, "tcp", "",
                "localhost:50051")
    original = array.array("f", (float(i) for i in range(1000 * 1000)))
    buffer_ptr, n = original.buffer_info()
    size = n * original.itemsize
    result = store.register_buffer(buffer_ptr, size)
    if result != 0:
        raise RuntimeError(f"Failed to register buffer: {result}")
    result = store.put_from("large_tensor", buffer_ptr, size)
    eq(result, 0, "put_from")
    retrieved = array.array("f", bytes(size))
    recv_ptr, _ = retrieved.buffer_info()
    eq(store.register_buffer(recv_ptr, size), 0, "register the receive buffer")
    bytes_read = store.get_into("large_tensor", recv_ptr, size)
    eq(bytes_read, size, "get_into")
    eq(retrieved == original, True, "data matches")
    store.unregister_buffer(buffer_ptr)
    store.unregister_buffer(recv_ptr)
    store.close()


@case
def batch_zero_copy_and_replicate_config():
    daemon()
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    store = MooncakeDistributedStore()
    store.setup("localhost", "P2PHANDSHAKE", 512 * 1024 * 1024, 16 * 1024 * 1024, "tcp", "",
                "localhost:50051")
    config = ReplicateConfig()
    config.replica_num = 1
    config.with_soft_pin = True
    keys = ["tensor1", "tensor2", "tensor3"]
    buffer_size = 1024 * 1024
    buffers = [ctypes.create_string_buffer(bytes([65 + i]) * buffer_size, buffer_size)
               for i in range(len(keys))]
    ptrs = [ctypes.addressof(b) for b in buffers]
    for p in ptrs:
        store.register_buffer(p, buffer_size)
    eq(store.batch_put_from(keys, ptrs, [buffer_size] * 3, config), [0, 0, 0], "batch_put_from")
    out = [ctypes.create_string_buffer(buffer_size) for _ in keys]
    out_ptrs = [ctypes.addressof(b) for b in out]
    results = store.batch_get_into(keys, out_ptrs, [buffer_size] * 3)
    for key, result in zip(keys, results):
        if result <= 0:
            raise AssertionError(f"Failed to retrieve {key}: error {result}")
    eq([o.raw[:1] for o in out], [b"A", b"B", b"C"], "bytes")
    eq(store.batch_is_exist(keys + ["nope"]), [1, 1, 1, 0], "batch_is_exist")
    for p in ptrs:
        store.unregister_buffer(p)
    values = [b"value1", b"value2", b"value3"]
    eq(store.put_batch(["key1", "key2", "key3"], values), 0, "put_batch")
    eq(store.get_batch(["key1", "key2", "key3"]) == values, True, "get_batch")
    buf = store.get_buffer("key2")
    eq((buf.size(), len(buf), buf.tobytes()), (6, 6, b"value2"), "get_buffer")
    del buf
    count = store.remove_all(force=True)
    eq(count >= 6, True, "remove_all removed %d" % count)
    store.close()


@case
def transfer_engine_managed_buffers():
    """Mooncake's TransferEngine "Managed Buffer Allocation" example and a
    loopback transfer on this node."""
    daemon()
    from mooncake.engine import TransferEngine, TransferOpcode

    engine = TransferEngine()
    ret = engine.initialize(local_hostname="127.0.0.1:12345", metadata_server="P2PHANDSHAKE",
                            protocol="tcp", device_name="")
    if ret != 0:
        raise RuntimeError(f"Initialization failed with code {ret}")
    buffer_size = 1024 * 1024
    buffer_addr = engine.allocate_managed_buffer(buffer_size)
    if buffer_addr == 0:
        raise AssertionError("Failed to allocate buffer")
    test_data = b"Test data for managed buffer"
    engine.write_bytes_to_buffer(buffer_addr, test_data, len(test_data))
    read_data = engine.read_bytes_from_buffer(buffer_addr, len(test_data))
    eq(read_data, test_data, "read back")
    peer = engine.allocate_managed_buffer(buffer_size)
    session = "127.0.0.1:%d" % engine.get_rpc_port()
    eq(engine.transfer_sync(session, buffer_addr, peer, len(test_data), TransferOpcode.WRITE), 0,
       "transfer_sync WRITE")
    eq(engine.read_bytes_from_buffer(peer, len(test_data)), test_data, "arrived")
    batch_id = engine.transfer_submit_write(session, buffer_addr, peer + 4096, 64)
    while True:
        status = engine.transfer_check_status(batch_id)
        if status == 1:
            break
        if status < 0:
            raise AssertionError("Transfer failed: %d" % status)
    eq(engine.free_managed_buffer(buffer_addr, buffer_size), 0, "free")
    eq(engine.free_managed_buffer(peer, buffer_size), 0, "free peer")
    engine.close()



@case
def transfer_engine_async_notify_hints_and_mismatches():
    """batch_transfer_async_write/read with get_batch_transfer_status
    between two engines of this process (the target's memory a numpy
    array), transport hints, refused notifications, and mismatched lists
    answered with upstream's codes rather than exceptions."""
    daemon()
    import numpy as np
    from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

    a, b = TransferEngine(), TransferEngine()
    for e in (a, b):
        eq(e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0, "initialize")
    eq(a.get_engine() is a and a.get_engine_ptr() != 0, True, "get_engine, get_engine_ptr")
    n = 256 * 1024
    src = a.allocate_managed_buffer(n)
    ctypes.memmove(src, bytes(range(256)) * (n // 256), n)
    dst = np.zeros(n, dtype=np.uint8)
    eq(b.register_memory(dst.ctypes.data, n), 0, "register numpy memory")
    target = b.get_local_hostname()
    eq(a.send_probe(target), 0, "send_probe")
    bid = a.batch_transfer_async_write(target, [src, src + n // 2], [dst.ctypes.data,
                                       dst.ctypes.data + n // 2], [n // 2, n // 2])
    eq(bid > 0, True, "batch id")
    eq(a.get_batch_transfer_status([bid]), 0, "completed")
    eq(dst.tobytes(), ctypes.string_at(src, n), "every byte written")
    back = a.allocate_managed_buffer(n)
    bid = a.batch_transfer_async_read(target, [back], [dst.ctypes.data], [n], "tcp")
    eq(a.get_batch_transfer_status([bid]), 0, "read completed")
    eq(ctypes.string_at(back, n), dst.tobytes(), "every byte read")
    eq(a.get_batch_transfer_status([bid]), -1, "a batch is forgotten once waited for")
    bad = a.batch_transfer_async_write(target, [src], [dst.ctypes.data], [n], "tcp")
    eq(a.get_batch_transfer_status([bad + 1000]), -1, "an unknown batch")
    eq(a.get_batch_transfer_status([bad]), 0, "the real one")
    # Out of range of the target's registration: the batch fails.
    bid = a.batch_transfer_async_write(target, [src], [dst.ctypes.data + n // 2], [n])
    eq(a.get_batch_transfer_status([bid]), -1, "past the registered range")
    # Mismatched lists: upstream's codes, no exception.
    eq(a.batch_transfer_sync_write(target, [src, src], [dst.ctypes.data], [n]), -1,
       "batch_transfer_sync_write")
    eq(a.batch_transfer_sync_read(target, [src], [dst.ctypes.data], [n, n]), -1,
       "batch_transfer_sync_read")
    eq(a.batch_transfer_async_write(target, [src], [], [n]), 0, "batch_transfer_async_write")
    eq(a.batch_register_memory([src], [n, n]), -1, "batch_register_memory")
    # Notifications are refused, never dropped silently.
    eq(a.transfer_sync(target, src, dst.ctypes.data, 16, TransferOpcode.WRITE,
                       TransferNotify("req-1", "done")), -95, "notify refused")
    eq(a.batch_transfer_sync(target, [src], [dst.ctypes.data], [16], TransferOpcode.Write,
                             notify=TransferNotify("req-1", "done")), -95, "batch notify refused")
    eq(b.get_notifies(), [], "nothing received")
    eq(a.transfer_sync(target, src, dst.ctypes.data, 16, TransferOpcode.WRITE,
                       transport_hint="rdma"), 0, "a known hint is advice")
    try:
        a.transfer_sync_write(target, src, dst.ctypes.data, 16, transport_hint="carrier-pigeon")
        raise AssertionError("an unknown transport_hint must be a ValueError")
    except ValueError:
        pass
    eq(b.unregister_memory(dst.ctypes.data), 0, "unregister")
    rc = a.transfer_sync_write(target, src, dst.ctypes.data, 16)
    eq(rc < 0, True, "after unregister_memory: negative (%d)" % rc)
    a.close()
    b.close()



@case
def a_registration_peers_cannot_use_fails():
    """register_memory of a range that is not mapped readable and
    writable fails (-14) instead of reporting success, and a peer's write
    there is refused."""
    daemon()
    import mmap
    from mooncake.engine import TransferEngine

    a, b = TransferEngine(), TransferEngine()
    for e in (a, b):
        eq(e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), 0, "initialize")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    ro_addr = libc.mmap(None, 1 << 16, mmap.PROT_READ, 0x22, -1, 0)        # PRIVATE|ANON
    none_addr = libc.mmap(None, 1 << 16, 0, 0x22, -1, 0)               # PROT_NONE
    eq(b.register_memory(ro_addr, 1 << 16), -14, "read-only memory")
    eq(b.register_memory(none_addr, 1 << 16), -14, "inaccessible memory")
    eq(b.batch_register_memory([none_addr], [1 << 16]), -14, "batch: the same")
    src = a.allocate_managed_buffer(4096)
    rc = a.transfer_sync_write(b.get_local_hostname(), src, ro_addr, 4096)
    eq(rc < 0, True, "a write there is refused (%d)" % rc)
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    for addr in (ro_addr, none_addr):
        libc.munmap(addr, 1 << 16)
    a.close()
    b.close()


mctest.main()
