"""bench_pd: prefill -> decode KV transfer throughput through
mooncake.engine.TransferEngine, as vLLM's connector moves it (one
batch_transfer_sync_write of every block of every layer, again and again),
between two agents on this host (--protocol, default tcp), by where the
decode's KV cache lives: managed buffers (allocate_managed_buffer),
allocator memory (MooncakeHostMemAllocator) and ordinary memory (numpy),
with the prefill's KV cache in ordinary memory (staged by its agent) and
in allocator memory (read in place); beside, in the same run, the
transfer engine's own figure for registered buffers (mooncakectl bench
transfer). A combination the agents cannot serve prints its error.

    BUILD=build python3 test/bench/bench_pd.py [--protocol=tcp|auto] [--seconds=2]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

import mctest  # noqa: E402
import storetest as st  # noqa: E402
from test_pd import Proc  # noqa: E402  (the processes of test_pd.py)

BLOCKS, BLOCK_BYTES, LAYERS = 64, 256 * 1024, 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--protocol", default="tcp")
    ap.add_argument("--seconds", type=float, default=2.0)
    a = ap.parse_args()
    args = [] if a.protocol == "auto" else ["--protocol=" + a.protocol]
    cl = st.Cluster(agents=2, agent_args=args, segment=64 << 20)
    pre, dec = cl.agents
    print("bench pd: %d blocks x %d KiB x %d layers per batch, %.0fs each, agents --protocol=%s"
          % (BLOCKS, BLOCK_BYTES >> 10, LAYERS, a.seconds, a.protocol))
    for memory in ("managed", "allocator", "ordinary"):
        for src in ("numpy", "allocator"):
            d = Proc(dec, "decode", memory, BLOCKS, BLOCK_BYTES, LAYERS)
            info = d.read()
            p = Proc(pre, "prefill", info["session"], json.dumps(info["ptrs"]), BLOCKS,
                     BLOCK_BYTES, LAYERS, 1, "bench:%g" % a.seconds, src=src)
            r = p.read(timeout=a.seconds + 60)
            p.p.wait(timeout=30)
            d.end()
            what = "%-9s <- %-9s" % (memory, "ordinary" if src == "numpy" else src)
            if r["rc"]:
                from mooncake import errname
                print("decode %s  refused: %d (%s)" % (what, r["rc"], errname(r["rc"])))
            else:
                print("decode %s  %6.2f GB/s" % (what, r["gbps"]))
    proto = "tcp" if a.protocol == "tcp" else "shm"
    out = subprocess.run([mctest.MOONCAKECTL, "bench", "transfer", "--protocol=" + proto,
                          "--op=write", "--block-size=%d" % BLOCK_BYTES,
                          "--duration=%gs" % a.seconds], capture_output=True, text=True)
    print("transfer engine, registered buffers (mooncakectl bench transfer --protocol=%s):"
          % proto)
    print(out.stdout.rstrip() or out.stderr.rstrip())
    cl.stop()
    mctest.Daemon.stop_all()


if __name__ == "__main__":
    main()
