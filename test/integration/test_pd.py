"""Prefill/decode disaggregation through mooncake.engine.TransferEngine:
a prefill process and a decode process (separate processes, pd_proc.py)
doing what vLLM's MooncakeConnector and SGLang's conn.py do — the decode
registers its KV cache with batch_register_memory and publishes its
session id "host:get_rpc_port()", the prefill writes every block with
batch_transfer_sync_write — with the decode's KV cache in allocator
memory (MooncakeHostMemAllocator, the get_alloc_func_addr hook) and in
managed buffers; every byte checked. On one agent, between two agents on
one host (shm), over tcp, and over rdma on the verbs emulator; two decode
processes on one node; a decode killed mid-transfer gives the prefill a
negative return, not a hang. Each TransferEngine has a session id of its
own, found by P2P probes and in meta.
"""
import ctypes
import json
import os
import signal
import subprocess
import sys

import storetest as st
import mctest
from mctest import case, eq

HERE = os.path.dirname(os.path.abspath(__file__))
PROC = os.path.join(HERE, "pd_proc.py")
MOONCAKED_EMU = os.path.join(mctest.BUILD, "test", "mooncaked-emu")
BLOCKS, BLOCK_BYTES, LAYERS = 16, 64 * 1024, 3


class Proc:
    def __init__(self, agent, *args, protocol="tcp", src="numpy", register="batch"):
        env = dict(os.environ, MOONCAKE_SOCKET=agent.socket, PD_PROTOCOL=protocol, PD_SRC=src,
                   PD_REGISTER=register)
        self.p = subprocess.Popen([sys.executable, PROC] + [str(a) for a in args],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                  text=True)

    def read(self, timeout=60):
        import select
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not r:
            self.p.kill()
            raise AssertionError("no answer within %ds (a hang)" % timeout)
        line = self.p.stdout.readline()
        if not line:
            raise AssertionError("the process ended (exit %s)" % self.p.wait())
        return json.loads(line)

    def send(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def end(self):
        try:
            self.send("exit")
        except BrokenPipeError:
            pass
        self.p.wait(timeout=30)


def run_pd(decode_agent, prefill_agent, memory, style, seed, protocol="tcp", src="numpy"):
    # SGLang registers buffer by buffer (MooncakeTransferEngine.register).
    register = "each" if style == "sglang" else "batch"
    d = Proc(decode_agent, "decode", memory, BLOCKS, BLOCK_BYTES, LAYERS, protocol=protocol,
             register=register)
    info = d.read()
    p = Proc(prefill_agent, "prefill", info["session"], json.dumps(info["ptrs"]), BLOCKS,
             BLOCK_BYTES, LAYERS, seed, style, protocol=protocol, src=src, register=register)
    eq(p.read(), {"rc": 0}, "prefill %s into %s memory" % (style, memory))
    p.p.wait(timeout=30)
    d.send("check %d" % seed)
    eq(d.read(), {"bad_layers": []}, "every byte of the decode's KV cache")
    d.end()
    return info


_one = None


def one_agent():
    global _one
    if _one is None:
        _one = st.Cluster(agents=1, segment=64 << 20)
    return _one.agents[0]


_two = {}


def two_agents(protocol):
    if protocol not in _two:
        args = ["--protocol=" + protocol] if protocol != "auto" else []
        _two[protocol] = st.Cluster(agents=2, agent_args=args, segment=64 << 20)
    return _two[protocol].agents


@case
def one_agent_vllm_and_sglang():
    a = one_agent()
    for memory in ("allocator", "hook", "managed", "ordinary"):
        info = run_pd(a, a, memory, "vllm", 11)
        # Its own, not the agent's. These instances run one after the
        # other, so the kernel may give one the port another has just
        # freed (a CI run met it): two at once have two ids in
        # two_decode_processes_on_one_node.
        eq(info["session"] != a.name, True, "a session id of the instance's own")
    run_pd(a, a, "allocator", "sglang", 12)
    run_pd(a, a, "ordinary", "sglang", 13)


@case
def two_agents_shm():
    a, b = two_agents("auto")
    run_pd(b, a, "allocator", "vllm", 21)
    run_pd(b, a, "hook", "sglang", 22)
    run_pd(a, b, "managed", "vllm", 23)
    run_pd(b, a, "ordinary", "vllm", 24)
    run_pd(b, a, "ordinary", "sglang", 25)
    m = a.metrics()
    eq(st.metric_labels(m, "mooncake_te_bytes_total", 'transport="shm",op="write"') > 0, True,
       "the bytes went through shared memory")


@case
def two_agents_tcp():
    a, b = two_agents("tcp")
    run_pd(b, a, "allocator", "vllm", 31)
    run_pd(b, a, "hook", "sglang", 32)
    run_pd(b, a, "ordinary", "vllm", 33)
    run_pd(b, a, "ordinary", "sglang", 34)
    m = a.metrics()
    eq(st.metric_labels(m, "mooncake_te_bytes_total", 'transport="tcp",op="write"') > 0, True,
       "the bytes went over tcp")


@case
def two_agents_rdma_on_the_verbs_emulator():
    if not os.path.exists(MOONCAKED_EMU):
        raise AssertionError("%s is not built (make test builds it)" % MOONCAKED_EMU)
    master = mctest.Daemon("master", args=["--meta-endpoints="], env=st.daemon_env())
    agents = []
    for _ in range(2):
        agents.append(st.Agent(master_addr=master.addr("master-listen"), segment=64 << 20,
                               args=["--protocol=rdma"], exe=MOONCAKED_EMU,
                               env={"VERBS_EMU_DEVICES": "1"}))
    a, b = agents
    # The prefill's source in allocator memory: the agent's RDMA needs an
    # lkey for the local side (ordinary memory is staged, and staging is
    # not an RDMA region).
    run_pd(b, a, "allocator", "vllm", 41, protocol="rdma", src="allocator")
    run_pd(b, a, "managed", "sglang", 42, protocol="rdma", src="allocator")
    # Both sides in ordinary memory: no MR on either side, so the bytes
    # take the rdma peer's tcp connection (counted as rdma fallbacks).
    run_pd(b, a, "ordinary", "vllm", 43, protocol="rdma")
    # The decode's KV cache in device memory, by a dma-buf (a memfd in
    # its stead) the agent registers with ibv_reg_dmabuf_mr: written by
    # one-sided RDMA only.
    run_pd(b, a, "dmabuf", "vllm", 44, protocol="rdma", src="allocator")
    # GPU to GPU: the prefill's KV cache a dma-buf too, read by its
    # agent's NIC.
    run_pd(b, a, "dmabuf", "sglang", 45, protocol="rdma", src="dmabuf")
    m = a.metrics()
    eq(st.metric_labels(m, "mooncake_te_rdma_nic_bytes_total", 'nic="emu_0",op="write"') > 0,
       True, "the bytes went over RDMA")


def probe(agent, session):
    """send_probe and get_first_buffer_address of a session, from a
    TransferEngine of this test process on agent."""
    from mooncake.engine import TransferEngine
    te = TransferEngine()
    eq(te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "", socket_path=agent.socket), 0,
       "engine")
    try:
        return te.send_probe(session), te.get_first_buffer_address(session)
    finally:
        te.close()


@case
def batches_larger_than_the_staging_buffer():
    """32 MiB batches from and into ordinary memory, twice the agents'
    16 MiB staging buffers: the prefill's side goes through staging in
    rounds, the decode's by cross-memory attach; written, then read back,
    every byte checked."""
    a, b = two_agents("tcp")
    blocks, block_bytes, layers = 64, 256 * 1024, 2
    d = Proc(b, "decode", "ordinary", blocks, block_bytes, layers)
    info = d.read()
    p = Proc(a, "prefill", info["session"], json.dumps(info["ptrs"]), blocks, block_bytes,
             layers, 81, "readback")
    eq(p.read(), {"rc": 0, "read_back": True}, "written and read back")
    p.p.wait(timeout=30)
    d.send("check 81")
    eq(d.read(), {"bad_layers": []}, "every byte in the decode")
    d.end()


@case
def device_memory_needs_rdma():
    """A dma-buf registration with agents that have no RDMA device fails
    (-95), rather than publish memory nobody could reach."""
    a, b = two_agents("tcp")
    d = Proc(b, "decode", "dmabuf", BLOCKS, BLOCK_BYTES, LAYERS)
    eq(d.read(), {"register_rc": -95}, "refused")
    d.p.wait(timeout=30)
    # CUDA memory: libcuda.so.1 is loaded at run time; this machine has
    # no CUDA driver, so the registration is refused the same way.
    from mooncake.engine import TransferEngine
    te = TransferEngine()
    eq(te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "", socket_path=b.socket), 0, "engine")
    buf = ctypes.create_string_buffer(4096)
    eq(te.register_memory(ctypes.addressof(buf), 4096, "cuda:0"), -95, "no CUDA driver")
    eq(te.register_memory(ctypes.addressof(buf), 4096, "npu:0"), -95, "another device")
    te.close()


@case
def store_calls_refuse_device_memory():
    """Registered device memory (a dma-buf; a memfd stands in for it on the
    verbs emulator) is for peers' RDMA: a store get or put through it
    would copy with the CPU, which device memory does not allow, so the
    item fails (Python: UNAVAILABLE_IN_CURRENT_MODE, libmooncake
    -EOPNOTSUPP) and other items go on."""
    import mmap
    if not os.path.exists(MOONCAKED_EMU):
        raise AssertionError("%s is not built (make test builds it)" % MOONCAKED_EMU)
    master = mctest.Daemon("master", args=["--meta-endpoints="], env=st.daemon_env())
    a = st.Agent(master_addr=master.addr("master-listen"), segment=64 << 20,
                 args=["--protocol=rdma"], exe=MOONCAKED_EMU, env={"VERBS_EMU_DEVICES": "1"})
    s = a.store()
    from mooncake import _native as n
    size = 1 << 20
    fd = os.memfd_create("device")
    os.ftruncate(fd, size)
    m = mmap.mmap(fd, size)
    dev = ctypes.addressof(ctypes.c_char.from_buffer(m))
    eq(n.mc_register_dmabuf(s._h, fd, 0, ctypes.c_void_p(dev), size), 0, "register")
    eq(s.put("k", b"v" * 100), 0, "put")
    eq(s.get("k"), b"v" * 100, "get")
    eq(s.get_into("k", dev, 4096), -1011, "get_into device memory: UNAVAILABLE_IN_CURRENT_MODE")
    host = ctypes.create_string_buffer(4096)
    eq(s.batch_get_into(["k", "k"], [dev + 4096, ctypes.addressof(host)], [4096, 4096]),
       [-1011, 100], "batch_get_into: the device item fails, the host one is served")
    eq(s.put_from("k2", dev, 100), -1011, "put_from device memory")
    eq(s.get("k2"), b"", "nothing stored")
    s.close()
    master.kill()


CUDA_PROBE = r"""
import ctypes, json, os, sys
sys.path.insert(0, os.path.join(%(root)r, "python"))
cuda = ctypes.CDLL(%(emu)r, mode=ctypes.RTLD_GLOBAL)  # as torch loads the driver
dev = ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(dev), 1 << 20) == 0
host = ctypes.create_string_buffer(1 << 20)
from mooncake.store import MooncakeDistributedStore
from mooncake.engine import TransferEngine
s = MooncakeDistributedStore()
assert s.setup("localhost", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", "unused",
               socket_path=%(sock)r) == 0
te = TransferEngine()
assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "", socket_path=%(sock)r) == 0
out = {
    "store_device": s.register_buffer(dev.value, 1 << 20),
    "store_device_part": s.register_buffer(dev.value + 4096, 4096),
    "store_host": s.register_buffer(ctypes.addressof(host), 1 << 20),
    "put_host": s.put_from("cuda-probe", ctypes.addressof(host), 4096),
    "te_device_any": te.register_memory(dev.value, 1 << 20),
    "te_device_cuda": te.register_memory(dev.value, 1 << 20, "cuda:0"),
    "te_host": te.register_memory(ctypes.addressof(host) + (1 << 19), 4096),
}
te.close()
s.close()
print(json.dumps(out), flush=True)
"""


@case
def cuda_memory_is_found_by_its_driver():
    """In a process that loaded the CUDA driver (here cuda-emu, whose device
    memory is mapped PROT_NONE: a CPU copy of it faults), the store's
    register_buffer refuses device memory (-1011: its puts and gets copy
    with the CPU) instead of faulting at the first put, and
    TransferEngine.register_memory with location "*" takes it as Mooncake's
    "*" does, as a GPU's memory: a dma-buf for the agents' NICs, refused
    here (-95: no dma-bufs, no RDMA) where before it went to the host path.
    Host memory is registered as before."""
    emu = os.path.join(mctest.BUILD, "cuda-emu", "libcuda.so.1")
    if not os.path.exists(emu):
        raise AssertionError("%s is not built (make test builds it)" % emu)
    master = mctest.Daemon("master", args=["--meta-endpoints="], env=st.daemon_env())
    a = st.Agent(master_addr=master.addr("master-listen"))
    script = CUDA_PROBE % {"root": mctest.ROOT, "emu": emu, "sock": a.socket}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60)
    eq(r.returncode, 0, "the probe (a fault would be -11): " + r.stderr[-2000:])
    eq(json.loads(r.stdout.strip().splitlines()[-1]),
       {"store_device": -1011, "store_device_part": -1011, "store_host": 0, "put_host": 0,
        "te_device_any": -95, "te_device_cuda": -95, "te_host": 0}, "registrations")
    a.d.stop()
    master.stop()


@case
def two_decode_processes_on_one_node():
    """Each TransferEngine its own session id (upstream's "host:port" per
    instance): two decodes on one node with their KV caches at the same
    virtual addresses (ordinary memory of forked-alike processes may
    coincide) are told apart, and each is found by a P2P probe."""
    a, b = two_agents("tcp")
    d1 = Proc(b, "decode", "ordinary", BLOCKS, BLOCK_BYTES, LAYERS)
    d2 = Proc(b, "decode", "hook", BLOCKS, BLOCK_BYTES, LAYERS)
    i1, i2 = d1.read(), d2.read()
    eq(i1["session"] != i2["session"], True, "two session ids")
    for info in (i1, i2):
        rc, first = probe(a, info["session"])
        eq((rc, first in info["ptrs"]), (0, True), "found by its session id (P2P)")
    for info, seed in ((i1, 51), (i2, 52)):
        p = Proc(a, "prefill", info["session"], json.dumps(info["ptrs"]), BLOCKS, BLOCK_BYTES,
                 LAYERS, seed, "vllm")
        eq(p.read(), {"rc": 0}, "prefill")
        p.p.wait(timeout=30)
    d1.send("check 51")
    d2.send("check 52")
    eq((d1.read(), d2.read()), ({"bad_layers": []}, {"bad_layers": []}),
       "each decode has its own bytes")
    d1.end()
    d2.end()


@case
def sessions_in_meta():
    """With meta, each instance's segment is published under its session
    id while it lives (the prefill finds it there) and is gone after."""
    c = st.Cluster(agents=2, meta=True, agent_args=["--protocol=tcp"], segment=64 << 20)
    a, b = c.agents
    d = Proc(b, "decode", "ordinary", BLOCKS, BLOCK_BYTES, LAYERS)
    info = d.read()
    key = "/mooncake/mooncake/segments/" + info["session"]
    mctest.wait_for(lambda: key in c.etcd.ctl("get", "--prefix", "--keys-only",
                                              "/mooncake/mooncake/segments/").stdout,
                    what="the session's segment in meta")
    p = Proc(a, "prefill", info["session"], json.dumps(info["ptrs"]), BLOCKS, BLOCK_BYTES,
             LAYERS, 71, "vllm")
    eq(p.read(), {"rc": 0}, "prefill through meta")
    p.p.wait(timeout=30)
    d.send("check 71")
    eq(d.read(), {"bad_layers": []}, "every byte")
    d.end()
    mctest.wait_for(lambda: key not in c.etcd.ctl("get", "--prefix", "--keys-only",
                                                  "/mooncake/mooncake/segments/").stdout,
                    what="the session's segment gone from meta")
    eq(probe(a, info["session"])[0] < 0, True, "no longer found")
    # An agent stopped under a live instance stops it too, and exits.
    d = Proc(b, "decode", "ordinary", BLOCKS, BLOCK_BYTES, LAYERS)
    d.read()
    eq(b.d.stop(), 0, "the agent exits under a live instance")
    out = b.d.output()
    eq("cannot delete" not in out and "leaking" not in out, True, "a clean stop: " + out[-2000:])
    d.p.kill()
    d.p.wait()
    c.stop()


@case
def decode_dies_mid_transfer():
    for protocol, memory in (("tcp", "allocator"), ("auto", "allocator"),
                             ("tcp", "ordinary")):
        a, b = two_agents(protocol)
        d = Proc(b, "decode", memory, BLOCKS, BLOCK_BYTES, LAYERS)
        info = d.read()
        p = Proc(a, "prefill", info["session"], json.dumps(info["ptrs"]), BLOCKS, BLOCK_BYTES,
                 LAYERS, 61, "loop")
        import time
        time.sleep(0.5)                  # writes are going on
        os.kill(d.p.pid, signal.SIGKILL)
        d.p.wait(timeout=30)
        r = p.read(timeout=60)
        eq(r["rc"] < 0, True, "the prefill's write fails (%s, %s): %s" % (protocol, memory, r))
        p.p.wait(timeout=30)


if __name__ == "__main__":
    mctest.main()
