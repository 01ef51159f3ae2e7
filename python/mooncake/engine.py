"""mooncake.engine: TransferEngine, Mooncake's transfer engine API, on the
local mooncaked agent (which runs the engine: its segment, transports and
connections).

    from mooncake.engine import TransferEngine
    te = TransferEngine()
    te.initialize("10.0.0.1", "P2PHANDSHAKE", "tcp", "")
    buf = te.allocate_managed_buffer(1 << 20)          # shared with the agent
    te.transfer_sync_write("10.0.0.2:12345", buf, peer_addr, 1 << 20)

Peers name this process by the agent's session id "host:rpc_port"
(get_rpc_port() is the agent's transfer-engine port), and address memory
registered here by this process's own virtual addresses.

Memory. allocate_managed_buffer returns memory shared with the agent: it
is read and written in place, and published to the engine so that peers
can transfer into and out of it. register_memory of any other memory is
accepted for this process's own transfers, which then copy through the
session's staging buffer; that memory cannot be the target of a peer's
transfer (the agent cannot reach another process's private memory) — use
managed buffers for memory peers write into (the KV cache of a decode
instance).

Parameters that have no meaning here (local_hostname, metadata_server,
protocol, device_name: the agent was configured with them) are accepted.
Returns: 0 or a negative code; allocate_managed_buffer 0 on failure;
transfer_check_status 1 done, 0 pending, -1 failed, -2 timed out.
"""

import concurrent.futures
import ctypes
import enum
import itertools
import logging
import os
import threading

from mooncake import _native as n

log = logging.getLogger("mooncake")

NOT_CONNECTED = -802


class TransferOpcode(enum.IntEnum):
    READ = 0
    WRITE = 1

    # Mooncake's pybind enum spells them Read/Write too.
    Read = 0
    Write = 1


class TransferEngine:
    """Thread-safe. Synchronous transfers block the calling thread;
    transfer_submit_write runs on a small pool of threads."""

    def __init__(self):
        self._h = None
        self._lock = threading.Lock()
        self._pool = None
        self._batches = {}
        self._ids = itertools.count(1)
        self._managed = {}

    def initialize(self, local_hostname="", metadata_server="", protocol="tcp",
                   device_name="", socket_path=None):
        with self._lock:
            if self._h:
                return 0
            sock = socket_path or os.environ.get("MOONCAKE_SOCKET") or None
            o = n.OpenOpts(sock.encode() if sock else None, 0,
                           ("python te pid %d" % os.getpid()).encode())
            h = ctypes.c_void_p()
            rc = n.mc_open_ex(ctypes.byref(o), ctypes.byref(h))
            if rc:
                log.error("cannot reach the mooncaked agent: %s", n.strerror(rc))
                return rc
            self._h = h
            return 0

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name,
                       metadata_type="p2p"):
        return self.initialize(local_hostname, metadata_server, protocol, device_name)

    def close(self):
        with self._lock:
            h, self._h = self._h, None
            pool, self._pool = self._pool, None
        if pool:
            pool.shutdown(wait=True)
        if h:
            n.mc_close(h)
        return 0

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def get_rpc_port(self):
        """The agent's transfer-engine port: peers use "host:port"."""
        addr = self.get_local_hostname()
        try:
            return int(addr.rsplit(":", 1)[1])
        except (IndexError, ValueError):
            return -1

    def get_local_hostname(self):
        return n.mc_agent_address(self._h).decode() if self._h else ""

    # ------------------------------------------------------------ memory

    def allocate_managed_buffer(self, length):
        """Address of length bytes shared with the agent, or 0."""
        if not self._h:
            return 0
        p = ctypes.c_void_p()
        rc = n.mc_buffer_alloc(self._h, length, ctypes.byref(p))
        if rc:
            log.error("allocate_managed_buffer(%d): %s", length, n.strerror(rc))
            return 0
        self._managed[p.value] = length
        return p.value

    def free_managed_buffer(self, buffer_addr, length=0):
        if not self._h:
            return NOT_CONNECTED
        rc = n.mc_buffer_free(self._h, buffer_addr)
        if rc == 0:
            self._managed.pop(buffer_addr, None)
        return rc

    def register_memory(self, buffer_addr, capacity):
        if not self._h:
            return NOT_CONNECTED
        rc = n.mc_register_buffer(self._h, buffer_addr, capacity)
        return 0 if rc == -17 and self._inside_managed(buffer_addr, capacity) else rc

    def _inside_managed(self, addr, length):
        return any(a <= addr and addr + length <= a + ln for a, ln in self._managed.items())

    def unregister_memory(self, buffer_addr):
        if not self._h:
            return NOT_CONNECTED
        rc = n.mc_unregister_buffer(self._h, buffer_addr)
        return 0 if rc == -2 and self._inside_managed(buffer_addr, 1) else rc

    def batch_register_memory(self, buffer_addrs, capacities):
        for a, c in zip(buffer_addrs, capacities):
            rc = self.register_memory(a, c)
            if rc:
                return rc
        return 0

    def batch_unregister_memory(self, buffer_addrs):
        rc = 0
        for a in buffer_addrs:
            rc = self.unregister_memory(a) or rc
        return rc

    def write_bytes_to_buffer(self, dest_address, src_ptr, length):
        with n.Pinned(src_ptr) as v:
            if length > v.len:
                return -22
            ctypes.memmove(dest_address, v.ptr, length)
        return 0

    def read_bytes_from_buffer(self, source_address, length):
        return ctypes.string_at(source_address, length)

    # ------------------------------------------------------------ transfers

    def _transfer(self, target, op, buffers, peer_addrs, lengths):
        if not self._h:
            return NOT_CONNECTED
        buffers, peer_addrs, lengths = list(buffers), list(peer_addrs), list(lengths)
        cnt = len(buffers)
        if cnt == 0:
            return 0
        if not (len(peer_addrs) == len(lengths) == cnt):
            return -22
        t = target.encode() if isinstance(target, str) else bytes(target)
        reqs = (n.TransferReq * cnt)()
        for i in range(cnt):
            reqs[i].op = int(op)
            reqs[i].local = buffers[i]
            reqs[i].len = lengths[i]
            reqs[i].target = t
            reqs[i].remote_addr = peer_addrs[i]
        res = (ctypes.c_int * cnt)()
        rc = n.mc_transfer(self._h, reqs, cnt, res)
        if rc:
            return rc
        return next((r for r in res if r), 0)

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length):
        return self._transfer(target_hostname, TransferOpcode.WRITE, [buffer],
                              [peer_buffer_address], [length])

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length):
        return self._transfer(target_hostname, TransferOpcode.READ, [buffer],
                              [peer_buffer_address], [length])

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode):
        return self._transfer(target_hostname, opcode, [buffer], [peer_buffer_address],
                              [length])

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths):
        return self._transfer(target_hostname, TransferOpcode.WRITE, buffers,
                              peer_buffer_addresses, lengths)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses,
                                 lengths):
        return self._transfer(target_hostname, TransferOpcode.READ, buffers,
                              peer_buffer_addresses, lengths)

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length):
        """A batch id for transfer_check_status, or negative."""
        if not self._h:
            return NOT_CONNECTED
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="mooncake-te")
            bid = next(self._ids)
            self._batches[bid] = self._pool.submit(
                self._transfer, target_hostname, TransferOpcode.WRITE, [buffer],
                [peer_buffer_address], [length])
        return bid

    def transfer_check_status(self, batch_id):
        """1 done, 0 pending, -1 failed, -2 timed out (the batch is
        forgotten once it reports an outcome)."""
        fut = self._batches.get(batch_id)
        if fut is None:
            return -1
        if not fut.done():
            return 0
        del self._batches[batch_id]
        rc = fut.result()
        if rc == 0:
            return 1
        return -2 if rc == -803 else -1
