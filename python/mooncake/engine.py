"""mooncake.engine: TransferEngine, Mooncake's transfer engine API, on the
local mooncaked agent (which runs the engine: its segment, transports and
connections).

    from mooncake.engine import TransferEngine
    te = TransferEngine()
    te.initialize("10.0.0.1", "P2PHANDSHAKE", "tcp", "")
    buf = te.allocate_managed_buffer(1 << 20)          # shared with the agent
    te.transfer_sync_write("10.0.0.2:12345", buf, peer_addr, 1 << 20)

Each TransferEngine has a session id of its own, "host:rpc_port", as in
Mooncake: initialize asks the agent for a transfer engine of this
instance's own (mc_engine_open), with its own RPC port (get_rpc_port())
and segment, published in P2P mode and to meta; two processes on one
node are told apart. Peers address memory registered here by this
process's own virtual addresses.

Memory. allocate_managed_buffer returns memory shared with the agent: it
is read and written in place, and published to the engine so that peers
can transfer into and out of it. Memory from mooncake.store's
MooncakeHostMemAllocator, alloc_from_mem_pool or get_alloc_func_addr
(mc_host_alloc) is shared with the agent on first use: register_memory
publishes it, and peers write into it in place (zero copy).
register_memory of any other memory (numpy, a CPU tensor, pinned or not)
publishes it too: the agent reaches it by cross-memory attach (this
process names the agent with prctl(PR_SET_PTRACER)), one copy per byte
on the agent's side, over tcp; when the agent may not attach, or the
range is not mapped writable, register_memory fails (-1 EPERM, -14
EFAULT) rather than promise what peers cannot do. This process's own
transfers from and into such memory copy through the staging buffer.

Parameters that have no meaning here (local_hostname, metadata_server,
protocol, device_name: the agent was configured with them) are accepted.
transport_hint: the agent picks the transport per peer (shm on one host,
rdma where a device is usable, else tcp); a known name is accepted as
advice, an unknown one is a ValueError, as in Mooncake's TENT builds.
location (register_memory): "cpu..." is host memory; "*" is host memory
or, when the CUDA driver this process loaded says the address is a
GPU's (as Mooncake's "*" finds it), GPU memory as "cuda:N". "cuda:N"
is GPU memory: exported as a dma-buf by the CUDA driver (loaded at run
time) and registered by the agent with its RDMA devices, so peers write
and read it by one-sided RDMA; -95 when CUDA, a dma-buf capable device
or an RDMA device of the agent is missing. It is the local memory of
this process's transfers to RDMA peers too (-95 for an item the agent
cannot move by RDMA: a same-host peer over shm, a tcp peer). Other
devices ("npu:N") are refused with -95.
Notifications (transfer_sync(..., notify=...)) are refused with -95: the
agents do not carry them to a peer (get_notifies() is always empty).
Mismatched list lengths in batch calls return -1 (batch_transfer_async_*:
0), as Mooncake does.
Returns: 0 or a negative code; allocate_managed_buffer 0 on failure;
transfer_check_status 1 done, 0 pending, -1 failed, -2 timed out.
"""

import concurrent.futures
import ctypes
import enum
import itertools
import json
import logging
import os
import threading

from mooncake import _native as n

log = logging.getLogger("mooncake")

NOT_CONNECTED = -802

# What this package was built with, as Mooncake's module reports it: no
# EFA, HIP or NVLink transports, and no *_on_cuda stream-ordered calls
# (GPU memory is registered by dma-buf instead: register_memory's
# location="cuda:N").
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_INTRA_NVLINK = False
SUPPORT_CUDA = False


class TransferOpcode(enum.IntEnum):
    READ = 0
    WRITE = 1

    # Mooncake's pybind enum spells them Read/Write too.
    Read = 0
    Write = 1


_HINTS = {"", "unspec", "rdma", "mnnvl", "shm", "nvlink", "gds", "io_uring", "tcp", "ascend",
          "sunrise_link"}
WILDCARD_LOCATION = "*"


def _check_hint(hint):
    if hint not in _HINTS:
        raise ValueError("Unknown transport_hint '%s' (valid: %s, or empty string for no hint)"
                         % (hint, ", ".join(sorted(h for h in _HINTS if h))))


class TransferNotify:
    """A notification sent with a transfer (Mooncake's TransferNotify)."""

    def __init__(self, name="", msg=""):
        self.name = name
        self.msg = msg


class TransferEngine:
    """Thread-safe. Synchronous transfers block the calling thread;
    transfer_submit_write and batch_transfer_async_* run on a small pool
    of threads."""

    _mooncake_engine = True
    TransferOpcode = TransferOpcode

    def __init__(self):
        self._h = None
        self._lock = threading.Lock()
        self._pool = None
        self._batches = {}
        self._ids = itertools.count(1)
        self._managed = {}
        self._name = ""

    def _open_engine(self, h):
        """This instance's own engine: 0 with self._name, or negative."""
        buf = ctypes.create_string_buffer(256)
        rc = n.mc_engine_open(h, buf, len(buf))
        if rc:
            log.error("the agent cannot start a transfer engine for this instance: %s",
                      n.strerror(rc))
            return rc
        self._name = buf.value.decode()
        return 0

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
            rc = self._open_engine(h)
            if rc:
                n.mc_close(h)
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
        """This instance's RPC port: peers use "host:port" (its session
        id), -1 before initialize."""
        addr = self.get_local_hostname()
        try:
            return int(addr.rsplit(":", 1)[1])
        except (IndexError, ValueError):
            return -1

    def get_local_hostname(self):
        """This instance's session id "host:port" ("" before initialize)."""
        return self._name if self._h else ""

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

    def register_memory(self, buffer_addr, capacity, location=WILDCARD_LOCATION):
        """0, or negative. The memory becomes reachable by peers at its
        address: managed buffers and allocator memory in place, other
        memory by the agent's cross-memory attach (see the module's
        text); a registration peers could not use fails."""
        if not self._h:
            return NOT_CONNECTED
        loc = str(location or WILDCARD_LOCATION)
        if loc.startswith("cuda"):
            rc = n.mc_register_cuda(self._h, buffer_addr, capacity)
            if rc:
                log.error("register_memory(%s): GPU memory: %s", loc, n.strerror(rc))
            return rc
        if loc != WILDCARD_LOCATION and not loc.startswith("cpu"):
            log.error("register_memory: location %r: only host and CUDA memory are "
                      "supported", loc)
            return -95
        rc = n.mc_register_memory(self._h, buffer_addr, capacity)
        return 0 if rc == -17 and self._inside_managed(buffer_addr, capacity) else rc

    def _inside_managed(self, addr, length):
        return any(a <= addr and addr + length <= a + ln for a, ln in self._managed.items())

    def unregister_memory(self, buffer_addr):
        if not self._h:
            return NOT_CONNECTED
        rc = n.mc_unregister_buffer(self._h, buffer_addr)
        return 0 if rc == -2 and self._inside_managed(buffer_addr, 1) else rc

    def batch_register_memory(self, buffer_addresses, capacities, location=WILDCARD_LOCATION):
        buffer_addresses, capacities = list(buffer_addresses), list(capacities)
        if len(buffer_addresses) != len(capacities):
            log.error("batch_register_memory: buffer_addresses and capacities differ in length")
            return -1
        for a, c in zip(buffer_addresses, capacities):
            rc = self.register_memory(a, c, location)
            if rc:
                return rc
        return 0

    def batch_unregister_memory(self, buffer_addresses):
        rc = 0
        for a in buffer_addresses:
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

    def _transfer(self, target, op, buffers, peer_addrs, lengths, transport_hint=""):
        if not self._h:
            return NOT_CONNECTED
        _check_hint(transport_hint)
        buffers, peer_addrs, lengths = list(buffers), list(peer_addrs), list(lengths)
        cnt = len(buffers)
        if not (len(peer_addrs) == len(lengths) == cnt):
            log.error("buffers, peer_buffer_addresses and lengths have different size")
            return -1
        if cnt == 0:
            return 0
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

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length,
                            transport_hint=""):
        return self._transfer(target_hostname, TransferOpcode.WRITE, [buffer],
                              [peer_buffer_address], [length], transport_hint)

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length,
                           transport_hint=""):
        return self._transfer(target_hostname, TransferOpcode.READ, [buffer],
                              [peer_buffer_address], [length], transport_hint)

    def _refuse_notify(self, notify):
        if notify is not None:
            log.error("transfer notifications are not supported: the agents do not "
                      "carry them to the peer")
            return -95
        return 0

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode,
                      notify=None, transport_hint=""):
        return self._refuse_notify(notify) or self._transfer(
            target_hostname, opcode, [buffer], [peer_buffer_address], [length], transport_hint)

    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                            opcode, notify=None, transport_hint=""):
        return self._refuse_notify(notify) or self._transfer(
            target_hostname, opcode, buffers, peer_buffer_addresses, lengths, transport_hint)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        return self._transfer(target_hostname, TransferOpcode.WRITE, buffers,
                              peer_buffer_addresses, lengths, transport_hint)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses,
                                 lengths, transport_hint=""):
        return self._transfer(target_hostname, TransferOpcode.READ, buffers,
                              peer_buffer_addresses, lengths, transport_hint)

    def _submit(self, *args):
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="mooncake-te")
            bid = next(self._ids)
            self._batches[bid] = self._pool.submit(self._transfer, *args)
        return bid

    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                             opcode, transport_hint=""):
        """A batch id (> 0) for get_batch_transfer_status, or 0."""
        if not self._h:
            return 0
        _check_hint(transport_hint)
        buffers, peers, lengths = list(buffers), list(peer_buffer_addresses), list(lengths)
        if not len(buffers) == len(peers) == len(lengths):
            log.error("buffers, peer_buffer_addresses and lengths have different size")
            return 0
        return self._submit(target_hostname, opcode, buffers, peers, lengths, transport_hint)

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses,
                                   lengths, transport_hint=""):
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses,
                                         lengths, TransferOpcode.WRITE, transport_hint)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses,
                                         lengths, TransferOpcode.READ, transport_hint)

    def get_batch_transfer_status(self, batch_ids):
        """Wait for the batches: 0 when all completed, -1 when one failed
        or is unknown (every batch is forgotten once waited for)."""
        failed = False
        for bid in list(batch_ids):
            fut = self._batches.pop(bid, None)
            if fut is None or fut.result() != 0:
                failed = True
        return -1 if failed else 0

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length,
                              transport_hint=""):
        """A batch id for transfer_check_status, or negative."""
        if not self._h:
            return NOT_CONNECTED
        _check_hint(transport_hint)
        return self._submit(target_hostname, TransferOpcode.WRITE, [buffer],
                            [peer_buffer_address], [length], transport_hint)

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

    def get_notifies(self):
        """Notifications received: always [] (see transfer_sync)."""
        return []

    def send_probe(self, peer_server_name):
        """0 when the peer "host:port" can be reached (its segment opens),
        else negative."""
        if not self._h:
            return -1
        info = n.SegmentInfo()
        return n.mc_segment_info(self._h, str(peer_server_name).encode(), ctypes.byref(info))

    def get_first_buffer_address(self, segment_name):
        """The address of the first region segment_name registered, or 0."""
        if not self._h:
            return 0
        info = n.SegmentInfo()
        rc = n.mc_segment_info(self._h, str(segment_name).encode(), ctypes.byref(info))
        if rc:
            log.error("get_first_buffer_address(%s): %s", segment_name, n.strerror(rc))
            return 0
        return info.first_address

    def get_local_topology(self, device_name=None):
        """This host's RDMA devices by NUMA node, as the JSON text of
        Mooncake's topology: {"cpu:N": [[devices on node N], [the
        others]]}, "{}" without RDMA devices. device_name: a comma list
        the devices are filtered by (all when empty)."""
        want = [d for d in str(device_name or "").split(",") if d]
        root = "/sys/class/infiniband"
        try:
            devs = sorted(d for d in os.listdir(root) if not want or d in want)
        except OSError:
            devs = []
        node_of = {}
        for d in devs:
            try:
                with open(os.path.join(root, d, "device", "numa_node")) as f:
                    node_of[d] = max(int(f.read().strip() or "0"), 0)
            except (OSError, ValueError):
                node_of[d] = 0
        topo = {}
        for node in sorted(set(node_of.values())):
            near = [d for d in devs if node_of[d] == node]
            topo["cpu:%d" % node] = [near, [d for d in devs if d not in near]]
        return json.dumps(topo)

    def warmup_efa_segment(self, segment_name):
        """0: there is no EFA transport to warm up (Mooncake returns 0 too
        when EFA is not installed)."""
        return 0

    def get_engine(self):
        """The engine itself: what MooncakeDistributedStore.setup(...,
        engine=) accepts."""
        return self

    def get_engine_ptr(self):
        """This engine's native handle (the libmooncake session), as an
        integer; 0 before initialize."""
        return self._h.value if self._h else 0
