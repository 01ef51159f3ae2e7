/*
 * ctl_plan: `mooncakectl plan` — size a KV-cache pool for a model.
 *
 * The KV cache of one token is, for models with (grouped-query or
 * multi-head) attention:
 *
 *     2 (K and V) x layers x num_key_value_heads x head_dim x dtype bytes
 *
 * and for multi-head latent attention (DeepSeek-V2/V3, --mla), which
 * caches one compressed latent per layer shared by K and V of every head,
 * plus the decoupled RoPE key:
 *
 *     layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes
 *
 * (the GQA formula with DeepSeek-V3's 128 "KV heads" would be 56x too
 * much). From it: a request's KV (x --context-tokens), the part not shared
 * with other requests (x (1 - --prefix-share)), the pool (--nodes x
 * --mem-per-node, each node's --global-segment-size), how many requests'
 * KV it holds (all of it, and at the high watermark where eviction
 * begins), what one eviction round frees, and the objects of
 * --block-tokens tokens the master indexes. --emit-config writes the
 * matching mooncaked.conf keys.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cfg.h"
#include "common/sysmem.h"
#include "ctl/ctl_int.h"

/* Published shapes (each model's config.json: num_hidden_layers,
 * num_key_value_heads, head_dim or hidden_size / num_attention_heads;
 * kv_lora_rank and qk_rope_head_dim for MLA). */
struct model {
	const char *name;
	const char *aliases; /* comma list */
	unsigned layers, kv_heads, head_dim;
	unsigned kv_lora_rank, rope_dim; /* MLA when kv_lora_rank > 0 */
};

static const struct model models[] = {
	{"llama-2-7b", "", 32, 32, 128, 0, 0},
	{"llama-2-13b", "", 40, 40, 128, 0, 0},
	{"llama-2-70b", "", 80, 8, 128, 0, 0},
	{"llama-3.1-8b", "llama-3-8b", 32, 8, 128, 0, 0},
	{"llama-3.1-70b", "llama-3-70b,llama-3.3-70b", 80, 8, 128, 0, 0},
	{"llama-3.1-405b", "", 126, 8, 128, 0, 0},
	{"mistral-7b", "", 32, 8, 128, 0, 0},
	{"mixtral-8x7b", "", 32, 8, 128, 0, 0},
	{"mixtral-8x22b", "", 56, 8, 128, 0, 0},
	{"qwen2.5-7b", "", 28, 4, 128, 0, 0},
	{"qwen2.5-14b", "", 48, 8, 128, 0, 0},
	{"qwen2.5-32b", "", 64, 8, 128, 0, 0},
	{"qwen2.5-72b", "", 80, 8, 128, 0, 0},
	{"qwen3-8b", "", 36, 8, 128, 0, 0},
	{"qwen3-32b", "", 64, 8, 128, 0, 0},
	{"qwen3-30b-a3b", "", 48, 4, 128, 0, 0},
	{"qwen3-235b-a22b", "", 94, 4, 128, 0, 0},
	{"deepseek-v2-lite", "", 27, 0, 0, 512, 64},
	{"deepseek-v2", "", 60, 0, 0, 512, 64},
	{"deepseek-v3", "deepseek-r1", 61, 0, 0, 512, 64},
};

static const struct model *find_model(const char *name)
{
	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
		if (strcasecmp(models[i].name, name) == 0)
			return &models[i];
		const char *a = models[i].aliases;
		size_t n = strlen(name);
		while (*a) {
			size_t len = strcspn(a, ",");
			if (len == n && strncasecmp(a, name, n) == 0)
				return &models[i];
			a += len + (a[len] == ',');
		}
	}
	return NULL;
}

static int dtype_bytes(const char *s)
{
	if (!strcmp(s, "fp16") || !strcmp(s, "bf16") || !strcmp(s, "float16") ||
	    !strcmp(s, "bfloat16"))
		return 2;
	if (!strcmp(s, "fp8") || !strcmp(s, "fp8_e4m3") || !strcmp(s, "fp8_e5m2") ||
	    !strcmp(s, "int8"))
		return 1;
	if (!strcmp(s, "fp32") || !strcmp(s, "float32"))
		return 4;
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mooncakectl plan (--model=NAME | --layers=N --kv-heads=N --head-dim=N\n"
		"                         | --mla --layers=N --kv-lora-rank=N --rope-dim=N)\n"
		"                        [--dtype=bf16] --mem-per-node=SIZE [--nodes=1]\n"
		"                        [--context-tokens=32768] [--prefix-share=0]\n"
		"                        [--block-tokens=256] [--high-watermark=0.85]\n"
		"                        [--eviction-ratio=0.15] [--json] [--emit-config=FILE|-]\n"
		"       mooncakectl plan --list\n\n"
		"  KV bytes per token: 2 x layers x kv-heads x head-dim x dtype bytes; for\n"
		"  multi-head latent attention (DeepSeek-V2/V3, --mla): layers x (kv-lora-rank +\n"
		"  rope-dim) x dtype bytes. Then per request (x context tokens), unique per\n"
		"  request (x (1 - prefix share)), the pool (nodes x mem-per-node), the requests\n"
		"  it holds (all, and at the high watermark where eviction begins), what an\n"
		"  eviction round frees, and the objects of block-tokens tokens the master\n"
		"  indexes.\n\n"
		"  --model=NAME         a known model's shape (--list shows them); the shape\n"
		"                       flags override its fields\n"
		"  --dtype=T            KV cache type: bf16, fp16 (2 bytes), fp8, int8 (1), fp32 (4)\n"
		"  --mem-per-node=SIZE  memory each node gives the pool: its --global-segment-size\n"
		"  --prefix-share=R     fraction of a request's KV shared with others (0..1)\n"
		"  --block-tokens=N     tokens per stored object (the connector's chunk)\n"
		"  --emit-config=FILE   write the matching mooncaked.conf keys (- : stdout)\n");
}

static int parse_uint(const char *flag, const char *v, unsigned long long max,
		      unsigned long long *out)
{
	char *end;
	if (!v || !*v)
		goto bad;
	unsigned long long x = strtoull(v, &end, 10);
	if (*end || x > max)
		goto bad;
	*out = x;
	return 0;
bad:
	fprintf(stderr, "mooncakectl plan: --%s wants a whole number up to %llu, not '%s'\n",
		flag, max, v ? v : "");
	return -1;
}

static int parse_ratio(const char *flag, const char *v, double *out)
{
	uint64_t ppm;
	if (!v || cfg_parse_ratio_ppm(v, &ppm) != 0) {
		fprintf(stderr, "mooncakectl plan: --%s wants a ratio from 0 to 1, not '%s'\n",
			flag, v ? v : "");
		return -1;
	}
	*out = (double)ppm / 1e6;
	return 0;
}

/* A size in the config file's syntax (512G), exact. */
static void size_key(uint64_t b, char *buf, size_t len)
{
	static const char sfx[] = "KMGTP";
	int i = -1;
	while (i < 4 && b >= 1024 && b % 1024 == 0) {
		b /= 1024;
		i++;
	}
	if (i >= 0)
		snprintf(buf, len, "%" PRIu64 "%c", b, sfx[i]);
	else
		snprintf(buf, len, "%" PRIu64, b);
}

int ctl_plan_main(int argc, char **argv)
{
	const struct model *m = NULL;
	unsigned long long layers = 0, kv_heads = 0, head_dim = 0, lora = 0, rope = 0,
			   nodes = 1, ctx = 32768, block = 256;
	bool mla = false, json = false, list = false, ok, have_layers = false,
	     have_heads = false, have_dim = false, have_lora = false, have_rope = false;
	const char *dtype = "bf16", *emit = NULL, *v;
	uint64_t mem = 0;
	double share = 0, hw = 0.85, er = 0.15;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return CTL_EXIT_OK;
		} else if (ctl_flag_bool(argv[i], "json", &json, &ok) ||
			   ctl_flag_bool(argv[i], "mla", &mla, &ok) ||
			   ctl_flag_bool(argv[i], "list", &list, &ok)) {
			if (!ok)
				goto usage;
		} else if (ctl_flag_value(argc, argv, &i, "model", &v)) {
			if (!v || !(m = find_model(v))) {
				fprintf(stderr,
					"mooncakectl plan: unknown --model '%s' (see --list, or "
					"give --layers --kv-heads --head-dim)\n",
					v ? v : "");
				return CTL_EXIT_USAGE;
			}
		} else if (ctl_flag_value(argc, argv, &i, "layers", &v)) {
			if (parse_uint("layers", v, 100000, &layers))
				return CTL_EXIT_USAGE;
			have_layers = true;
		} else if (ctl_flag_value(argc, argv, &i, "kv-heads", &v)) {
			if (parse_uint("kv-heads", v, 100000, &kv_heads))
				return CTL_EXIT_USAGE;
			have_heads = true;
		} else if (ctl_flag_value(argc, argv, &i, "head-dim", &v)) {
			if (parse_uint("head-dim", v, 100000, &head_dim))
				return CTL_EXIT_USAGE;
			have_dim = true;
		} else if (ctl_flag_value(argc, argv, &i, "kv-lora-rank", &v)) {
			if (parse_uint("kv-lora-rank", v, 100000, &lora))
				return CTL_EXIT_USAGE;
			have_lora = true;
		} else if (ctl_flag_value(argc, argv, &i, "rope-dim", &v)) {
			if (parse_uint("rope-dim", v, 100000, &rope))
				return CTL_EXIT_USAGE;
			have_rope = true;
		} else if (ctl_flag_value(argc, argv, &i, "dtype", &v)) {
			dtype = v ? v : "";
		} else if (ctl_flag_value(argc, argv, &i, "nodes", &v)) {
			if (parse_uint("nodes", v, 1000000, &nodes) || nodes == 0)
				goto usage;
		} else if (ctl_flag_value(argc, argv, &i, "context-tokens", &v)) {
			if (parse_uint("context-tokens", v, 1ull << 32, &ctx) || ctx == 0)
				goto usage;
		} else if (ctl_flag_value(argc, argv, &i, "block-tokens", &v)) {
			if (parse_uint("block-tokens", v, 1ull << 32, &block) || block == 0)
				goto usage;
		} else if (ctl_flag_value(argc, argv, &i, "mem-per-node", &v)) {
			if (!v || cfg_parse_size(v, &mem) != 0 || mem == 0) {
				fprintf(stderr,
					"mooncakectl plan: --mem-per-node wants a size such as "
					"512G, not '%s'\n",
					v ? v : "");
				return CTL_EXIT_USAGE;
			}
		} else if (ctl_flag_value(argc, argv, &i, "prefix-share", &v)) {
			if (parse_ratio("prefix-share", v, &share))
				return CTL_EXIT_USAGE;
		} else if (ctl_flag_value(argc, argv, &i, "high-watermark", &v)) {
			if (parse_ratio("high-watermark", v, &hw))
				return CTL_EXIT_USAGE;
		} else if (ctl_flag_value(argc, argv, &i, "eviction-ratio", &v)) {
			if (parse_ratio("eviction-ratio", v, &er))
				return CTL_EXIT_USAGE;
		} else if (ctl_flag_value(argc, argv, &i, "emit-config", &v)) {
			if (!v || !*v)
				goto usage;
			emit = v;
		} else {
			fprintf(stderr, "mooncakectl plan: unknown argument '%s'\n", argv[i]);
			goto usage;
		}
	}
	if (list) {
		printf("%-18s %6s %8s %8s %12s  %s\n", "MODEL", "LAYERS", "KV HEADS",
		       "HEAD DIM", "KV/TOKEN", "ALSO");
		for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
			const struct model *x = &models[i];
			char per_s[32], heads[32], dim[48];
			uint64_t per = x->kv_lora_rank
					       ? (uint64_t)x->layers *
							 (x->kv_lora_rank + x->rope_dim) * 2
					       : 2ull * x->layers * x->kv_heads * x->head_dim *
							 2;
			mc_format_bytes(per, per_s, sizeof(per_s));
			if (x->kv_lora_rank) {
				snprintf(heads, sizeof(heads), "MLA");
				snprintf(dim, sizeof(dim), "%u+%u", x->kv_lora_rank,
					 x->rope_dim);
			} else {
				snprintf(heads, sizeof(heads), "%u", x->kv_heads);
				snprintf(dim, sizeof(dim), "%u", x->head_dim);
			}
			printf("%-18s %6u %8s %8s %12s  %s\n", x->name, x->layers, heads, dim,
			       per_s, x->aliases);
		}
		printf("\nKV/TOKEN in bf16. MLA: kv_lora_rank + qk_rope_head_dim per layer.\n");
		return CTL_EXIT_OK;
	}
	if (m) {
		if (!have_layers)
			layers = m->layers;
		if (m->kv_lora_rank)
			mla = true;
		if (!have_heads)
			kv_heads = m->kv_heads;
		if (!have_dim)
			head_dim = m->head_dim;
		if (!have_lora)
			lora = m->kv_lora_rank;
		if (!have_rope)
			rope = m->rope_dim;
	}
	int db = dtype_bytes(dtype);
	if (!db) {
		fprintf(stderr,
			"mooncakectl plan: --dtype wants bf16, fp16, fp8, int8 or fp32, not "
			"'%s'\n",
			dtype);
		return CTL_EXIT_USAGE;
	}
	if (!layers || (mla ? !lora : (!kv_heads || !head_dim))) {
		fprintf(stderr,
			"mooncakectl plan: give --model=NAME, or --layers, --kv-heads and "
			"--head-dim (with --mla: --layers, --kv-lora-rank, --rope-dim)\n");
		return CTL_EXIT_USAGE;
	}
	if (!mem) {
		fprintf(stderr,
			"mooncakectl plan: --mem-per-node=SIZE is required (what each node "
			"gives the pool: its --global-segment-size)\n");
		return CTL_EXIT_USAGE;
	}
	if (hw <= 0 || er <= 0) {
		fprintf(stderr,
			"mooncakectl plan: --high-watermark and --eviction-ratio must be "
			"above 0\n");
		return CTL_EXIT_USAGE;
	}

	/* The figures. Products are at most 2 x 1e5^3 x 4 bytes: they fit. */
	uint64_t per_token = mla ? layers * (lora + rope) * (uint64_t)db
				 : 2ull * layers * kv_heads * head_dim * (uint64_t)db;
	unsigned __int128 per_req128 = (unsigned __int128)per_token * ctx;
	if (per_req128 > UINT64_MAX / 2) {
		fprintf(stderr, "mooncakectl plan: a request's KV does not fit in 64 bits\n");
		return CTL_EXIT_USAGE;
	}
	uint64_t per_req = (uint64_t)per_req128;
	double unique = (double)per_req * (1 - share);
	unsigned __int128 pool128 = (unsigned __int128)mem * nodes;
	double pool = (double)pool128;
	uint64_t held = unique > 0 ? (uint64_t)floor(pool / unique) : 0;
	uint64_t held_hw = unique > 0 ? (uint64_t)floor(pool * hw / unique) : 0;
	uint64_t tokens = (uint64_t)floor(pool / (double)per_token);
	double round_bytes = pool * er;
	uint64_t round_req = unique > 0 ? (uint64_t)floor(round_bytes / unique) : 0;
	uint64_t obj = per_token * block;
	uint64_t objects = (uint64_t)floor(pool / (double)obj);

	char s_tok[32], s_req[32], s_uni[32], s_pool[32], s_mem[32], s_round[32], s_obj[32],
		k_mem[32];
	mc_format_bytes(per_token, s_tok, sizeof(s_tok));
	mc_format_bytes(per_req, s_req, sizeof(s_req));
	mc_format_bytes((uint64_t)unique, s_uni, sizeof(s_uni));
	mc_format_bytes(pool128 > UINT64_MAX ? UINT64_MAX - 1 : (uint64_t)pool128, s_pool,
			sizeof(s_pool));
	mc_format_bytes(mem, s_mem, sizeof(s_mem));
	mc_format_bytes((uint64_t)round_bytes, s_round, sizeof(s_round));
	mc_format_bytes(obj, s_obj, sizeof(s_obj));
	size_key(mem, k_mem, sizeof(k_mem));
	char shape[160], formula[160];
	if (mla) {
		snprintf(shape, sizeof(shape),
			 "MLA: %llu layers, kv_lora_rank %llu + rope %llu, %s", layers, lora,
			 rope, dtype);
		snprintf(formula, sizeof(formula), "%llu x (%llu + %llu) x %d B", layers, lora,
			 rope, db);
	} else {
		snprintf(shape, sizeof(shape), "%llu layers, %llu KV heads x %llu, %s", layers,
			 kv_heads, head_dim, dtype);
		snprintf(formula, sizeof(formula), "2 x %llu x %llu x %llu x %d B", layers,
			 kv_heads, head_dim, db);
	}

	if (json) {
		printf("{\"model\": \"%s\", \"attention\": \"%s\", \"layers\": %llu, "
		       "\"kv_heads\": %llu, \"head_dim\": %llu, \"kv_lora_rank\": %llu, "
		       "\"rope_dim\": %llu, \"dtype\": \"%s\", \"dtype_bytes\": %d,\n"
		       " \"kv_bytes_per_token\": %" PRIu64 ", \"context_tokens\": %llu, "
		       "\"kv_bytes_per_request\": %" PRIu64 ", \"prefix_share\": %g, "
		       "\"unique_bytes_per_request\": %.0f,\n"
		       " \"nodes\": %llu, \"segment_bytes_per_node\": %" PRIu64
		       ", \"pool_bytes\": %.0f, \"tokens_held\": %" PRIu64
		       ", \"requests_held\": %" PRIu64
		       ", \"requests_held_at_high_watermark\": %" PRIu64 ",\n"
		       " \"high_watermark\": %g, \"eviction_ratio\": %g, \"eviction_round_bytes\": %.0f, "
		       "\"eviction_round_requests\": %" PRIu64 ", \"block_tokens\": %llu, "
		       "\"object_bytes\": %" PRIu64 ", \"objects_held\": %" PRIu64 "}\n",
		       m ? m->name : "custom", mla ? "mla" : "gqa", layers, mla ? 0 : kv_heads,
		       mla ? 0 : head_dim, mla ? lora : 0, mla ? rope : 0, dtype, db,
		       per_token, ctx, per_req, share, unique, nodes, mem, pool, tokens, held,
		       held_hw, hw, er, round_bytes, round_req, block, obj, objects);
	} else {
		printf("%-22s %s (%s)\n", "model", m ? m->name : "custom", shape);
		printf("%-22s %s (%s = %" PRIu64 " bytes)\n", "KV per token", s_tok, formula,
		       per_token);
		printf("%-22s %s (%llu tokens)\n", "KV per request", s_req, ctx);
		printf("%-22s %s (prefix share %g)\n", "unique per request", s_uni, share);
		printf("%-22s %s (%llu node%s x %s)\n", "pool", s_pool, nodes,
		       nodes == 1 ? "" : "s", s_mem);
		printf("%-22s %" PRIu64 " (%" PRIu64 " at the %g high watermark; %" PRIu64
		       " tokens in all)\n",
		       "requests held", held, held_hw, hw, tokens);
		printf("%-22s %s (--global-segment-size=%s)\n", "segment per node", s_mem,
		       k_mem);
		printf("%-22s --eviction-high-watermark-ratio=%g --eviction-ratio=%g (a round frees "
		       "%s, %" PRIu64 " requests)\n",
		       "watermarks", hw, er, s_round, round_req);
		printf("%-22s %" PRIu64 " of %s (%llu tokens each)\n", "objects", objects,
		       s_obj, block);
	}
	if (emit) {
		FILE *f = strcmp(emit, "-") == 0 ? stdout : fopen(emit, "w");
		if (!f) {
			perror(emit);
			return CTL_EXIT_FAIL;
		}
		fprintf(f,
			"# mooncaked.conf keys from mooncakectl plan: %s, %llu context tokens,\n"
			"# prefix share %g, %llu node(s) x %s: %" PRIu64
			" requests' KV (%" PRIu64 " before eviction begins).\n"
			"[master]\neviction-high-watermark-ratio = %g\neviction-ratio = %g\n\n"
			"[agent]\nglobal-segment-size = %s\n",
			m ? m->name : shape, ctx, share, nodes, s_mem, held, held_hw, hw, er,
			k_mem);
		if (f != stdout && fclose(f) != 0) {
			perror(emit);
			return CTL_EXIT_FAIL;
		}
	}
	return CTL_EXIT_OK;
usage:
	usage(stderr);
	return CTL_EXIT_USAGE;
}
