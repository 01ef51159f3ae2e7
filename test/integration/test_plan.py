"""mooncakectl plan against figures computed by hand: the issue's 70B-class
GQA example (320 KiB a token, 10 GiB a 32k request, 10 nodes x 512 GiB hold
512 requests), DeepSeek-V3's MLA cache, custom shapes and dtypes, prefix
sharing, --json, and --emit-config read back by mooncaked."""
import json
import os
import subprocess
import tempfile

import mctest
from mctest import case, eq, run

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


def plan(*args):
    r = run([mctest.MOONCAKECTL, "plan", "--json"] + list(args))
    return json.loads(r.stdout)


@case
def the_70b_example():
    p = plan("--model=llama-3.1-70b", "--nodes=10", "--mem-per-node=512G",
             "--context-tokens=32768")
    # 2 (K, V) x 80 layers x 8 KV heads x 128 head dim x 2 bytes (bf16)
    eq(p["kv_bytes_per_token"], 2 * 80 * 8 * 128 * 2, "bytes per token")
    eq(p["kv_bytes_per_token"], 320 * KiB, "320 KiB")
    eq(p["kv_bytes_per_request"], 10 * GiB, "32768 tokens: 10 GiB")
    eq(p["pool_bytes"], 10 * 512 * GiB, "pool")
    eq(p["requests_held"], 512, "10 x 512 GiB / 10 GiB")
    eq(p["requests_held_at_high_watermark"], 435, "floor(512 x 0.85)")
    eq(p["tokens_held"], 10 * 512 * GiB // (320 * KiB), "tokens")
    eq(p["segment_bytes_per_node"], 512 * GiB, "segment per node")
    eq((p["high_watermark"], p["eviction_ratio"]), (0.85, 0.15), "watermarks")
    eq(p["eviction_round_requests"], 76, "floor(5 TiB x 0.15 / 10 GiB)")
    eq(p["attention"], "gqa", "attention")
    out = run([mctest.MOONCAKECTL, "plan", "--model=llama-3-70b", "--nodes=10",
               "--mem-per-node=512G"]).stdout
    for want in ["KV per token           320 KiB (2 x 80 x 8 x 128 x 2 B = 327680 bytes)",
                 "KV per request         10 GiB (32768 tokens)",
                 "requests held          512 (435 at the 0.85 high watermark",
                 "segment per node       512 GiB (--global-segment-size=512G)",
                 "--eviction-high-watermark-ratio=0.85 --eviction-ratio=0.15"]:
        assert want in out, "%r not in:\n%s" % (want, out)


@case
def mla_models_cache_a_latent_not_k_and_v():
    p = plan("--model=deepseek-v3", "--mem-per-node=1T")
    # 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes
    eq(p["kv_bytes_per_token"], 61 * (512 + 64) * 2, "MLA bytes per token")
    eq(p["attention"], "mla", "attention")
    eq(p["kv_bytes_per_request"], 61 * 576 * 2 * 32768, "per request")
    eq(p["requests_held"], TiB // (61 * 576 * 2 * 32768), "held")
    eq(plan("--model=deepseek-r1", "--mem-per-node=1T")["kv_bytes_per_token"], 70272, "alias")
    q = plan("--mla", "--layers=27", "--kv-lora-rank=512", "--rope-dim=64", "--dtype=fp8",
             "--mem-per-node=64G")
    eq(q["kv_bytes_per_token"], 27 * 576, "custom MLA in fp8")
    out = run([mctest.MOONCAKECTL, "plan", "--list"]).stdout
    assert "deepseek-v3" in out and "MLA" in out and "512+64" in out, out


@case
def custom_shapes_dtypes_and_prefix_sharing():
    p = plan("--layers=32", "--kv-heads=8", "--head-dim=128", "--dtype=fp8",
             "--mem-per-node=24G", "--context-tokens=8192")
    eq(p["kv_bytes_per_token"], 2 * 32 * 8 * 128, "fp8: one byte")
    eq(p["kv_bytes_per_request"], 2 * 32 * 8 * 128 * 8192, "per request")
    eq(p["requests_held"], 24 * GiB // (64 * KiB * 8192), "held")
    s = plan("--model=llama-3.1-70b", "--nodes=10", "--mem-per-node=512G",
             "--prefix-share=0.5")
    eq(s["unique_bytes_per_request"], 5 * GiB, "half shared")
    eq(s["requests_held"], 1024, "twice as many")
    q = plan("--model=qwen2.5-7b", "--mem-per-node=1G", "--context-tokens=1000",
             "--block-tokens=16")
    eq(q["kv_bytes_per_token"], 2 * 28 * 4 * 128 * 2, "Qwen2.5-7B: 28 layers, 4 KV heads")
    eq(q["object_bytes"], 2 * 28 * 4 * 128 * 2 * 16, "16-token objects")
    o = plan("--model=llama-3.1-8b", "--layers=16", "--mem-per-node=1G")
    eq(o["kv_bytes_per_token"], 2 * 16 * 8 * 128 * 2, "a flag overrides the model's field")


@case
def emit_config_is_read_by_mooncaked():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "mooncaked.conf")
        run([mctest.MOONCAKECTL, "plan", "--model=llama-3.1-70b", "--nodes=10",
             "--mem-per-node=512G", "--emit-config=" + path])
        text = run([mctest.MOONCAKED, "--config=" + path, "--print-config"]).stdout
        for want in ["eviction-high-watermark-ratio = 0.85", "eviction-ratio = 0.15",
                     "global-segment-size = 512G"]:
            line = [l for l in text.splitlines() if l.startswith(want)]
            assert line and "# file (file %s" % path in line[0], (want, text)


@case
def usage_errors():
    for args in (["--model=gpt-5"], ["--model=llama-3.1-70b"], ["--layers=2", "--mem-per-node=1G"],
                 ["--model=llama-3.1-70b", "--mem-per-node=1G", "--dtype=fp4"],
                 ["--model=llama-3.1-70b", "--mem-per-node=1G", "--prefix-share=2"],
                 ["--model=llama-3.1-70b", "--mem-per-node=12Q"], ["--nodes=0"]):
        r = subprocess.run([mctest.MOONCAKECTL, "plan"] + args, capture_output=True, text=True)
        eq(r.returncode, 2, "exit status of %s (%s)" % (args, r.stderr.strip()))


mctest.main()
