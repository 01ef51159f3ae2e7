/*
 * Mirror test of src/common/cfg*.c: value parsers, precedence, the INI
 * parser's error paths and the generated outputs.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cfg.h"

static char err[1024];

Test(cfg_size, accepts_suffixes)
{
	struct {
		const char *s;
		uint64_t v;
	} ok[] = {
		{"0", 0},
		{"4096", 4096},
		{"1K", 1024},
		{"512M", 512ull << 20},
		{"4G", 4ull << 30},
		{"4GiB", 4ull << 30},
		{"4GB", 4ull << 30},
		{"4g", 4ull << 30},
		{"1.5T", 3ull << 39},
		{"2P", 2ull << 50},
		{"0.5K", 512},
		{"16383P", 16383ull << 50},
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		uint64_t v = 1;
		cr_assert_eq(cfg_parse_size(ok[i].s, &v), 0, "%s", ok[i].s);
		cr_assert_eq(v, ok[i].v, "%s -> %llu", ok[i].s, (unsigned long long)v);
	}
}

Test(cfg_size, rejects_bad_and_overflow)
{
	const char *bad[] = {"",    "12Q", "K",   "-1",   "1.5", "1..5G",
			     "1.G", "4 G", "4GG", "0x10", " 4G", "4Gi B"};
	uint64_t v;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(cfg_parse_size(bad[i], &v), -EINVAL, "%s", bad[i]);
	cr_assert_eq(cfg_parse_size("16384P", &v), -ERANGE);
	cr_assert_eq(cfg_parse_size("99999999999999999999", &v), -ERANGE);
	cr_assert_eq(cfg_parse_size("18446744073709551615", &v), 0);
	cr_assert_eq(v, UINT64_MAX);
}

Test(cfg_duration, accepts_units)
{
	struct {
		const char *s;
		uint64_t ms;
	} ok[] = {
		{"0ms", 0},      {"500ms", 500},   {"10s", 10000},
		{"1.5s", 1500},  {"5m", 300000},   {"5min", 300000},
		{"2h", 7200000}, {"1d", 86400000}, {"0.5ms", 0},
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		uint64_t v = 1;
		cr_assert_eq(cfg_parse_duration_ms(ok[i].s, &v), 0, "%s", ok[i].s);
		cr_assert_eq(v, ok[i].ms, "%s", ok[i].s);
	}
}

Test(cfg_duration, rejects_bad_and_overflow)
{
	const char *bad[] = {"", "10", "s", "10x", "10 s", "-1s", "1.s", "10S"};
	uint64_t v;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(cfg_parse_duration_ms(bad[i], &v), -EINVAL, "%s", bad[i]);
	cr_assert_eq(cfg_parse_duration_ms("999999999999999999d", &v), -ERANGE);
}

Test(cfg_bool_roles, parse)
{
	bool b;
	cr_assert_eq(cfg_parse_bool("yes", &b), 0);
	cr_assert(b);
	cr_assert_eq(cfg_parse_bool("OFF", &b), 0);
	cr_assert(!b);
	cr_assert_eq(cfg_parse_bool("maybe", &b), -EINVAL);
	unsigned m;
	cr_assert_eq(cfg_parse_roles("meta,master", &m), 0);
	cr_assert_eq(m, CFG_ROLE_META | CFG_ROLE_MASTER);
	cr_assert_eq(cfg_parse_roles("standalone", &m), 0);
	cr_assert_eq(m, CFG_ROLE_ALL);
	cr_assert_eq(cfg_parse_roles("meta,", &m), -EINVAL);
	cr_assert_eq(cfg_parse_roles("", &m), -EINVAL);
	cr_assert_eq(cfg_parse_roles("metaa", &m), -EINVAL);
}

static int load(struct cfg *c, struct cfg_cmdline *cl, char **envp, int argc, char **argv)
{
	return cfg_load(c, argc, argv, envp, cl, err, sizeof(err));
}

#define ARGV(...) \
	(char *[]) \
	{ \
		"mooncaked", __VA_ARGS__, NULL \
	}
#define ARGC(...) ((int)(sizeof((char *[]){"mooncaked", __VA_ARGS__}) / sizeof(char *)))

Test(cfg_load, defaults)
{
	struct cfg c;
	struct cfg_cmdline cl;
	char *envp[] = {"MOONCAKE_CONFIG=", NULL};
	char *argv[] = {"mooncaked", NULL};
	cr_assert_eq(load(&c, &cl, envp, 1, argv), 0, "%s", err);
	cr_assert_str_eq(cfg_str(&c, CFG_LISTEN_CLIENT), "127.0.0.1:2379");
	cr_assert_eq(cfg_u64(&c, CFG_SHUTDOWN_TIMEOUT), 10000);
	cr_assert_eq(cfg_u64(&c, CFG_RPC_MAX_MESSAGE_SIZE), 64u << 20);
	cr_assert_eq(cfg_roles(&c), CFG_ROLE_ALL);
	cr_assert_eq(c.v[CFG_DATA_DIR].src, CFG_SRC_DEFAULT);
	cfg_free(&c);
}

static char *write_tmp(const char *text)
{
	static char path[64];
	snprintf(path, sizeof(path), "/tmp/mooncake-cfg-XXXXXX");
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	return path;
}

Test(cfg_load, precedence_flag_env_file_default)
{
	char *path = write_tmp("# comment\n[common]\ndata-dir = /from/file\n"
			       "log-level = warn\nshutdown-timeout = 3s\n"
			       "[meta]\nlisten-client = 127.0.0.1:1111\n");
	char cfgarg[128];
	snprintf(cfgarg, sizeof(cfgarg), "--config=%s", path);
	char *envp[] = {"MOONCAKE_DATA_DIR=/from/env", "MOONCAKE_LOG_LEVEL=debug", "PATH=/bin",
			NULL};
	char *argv[] = {"mooncaked", cfgarg, "--data-dir", "/from/flag", NULL};
	struct cfg c;
	struct cfg_cmdline cl;
	cr_assert_eq(load(&c, &cl, envp, 4, argv), 0, "%s", err);
	cr_assert_str_eq(cfg_str(&c, CFG_DATA_DIR), "/from/flag");
	cr_assert_eq(c.v[CFG_DATA_DIR].src, CFG_SRC_FLAG);
	cr_assert_str_eq(cfg_str(&c, CFG_LOG_LEVEL), "debug");
	cr_assert_eq(c.v[CFG_LOG_LEVEL].src, CFG_SRC_ENV);
	cr_assert_eq(cfg_u64(&c, CFG_SHUTDOWN_TIMEOUT), 3000);
	cr_assert_eq(c.v[CFG_SHUTDOWN_TIMEOUT].src, CFG_SRC_FILE);
	cr_assert(strstr(c.v[CFG_SHUTDOWN_TIMEOUT].origin, ":5") != NULL,
		  "origin names the line: %s", c.v[CFG_SHUTDOWN_TIMEOUT].origin);
	cr_assert_str_eq(cfg_str(&c, CFG_LISTEN_CLIENT), "127.0.0.1:1111");
	cr_assert_eq(c.v[CFG_LISTEN_PEER].src, CFG_SRC_DEFAULT);

	char *out = NULL;
	size_t outlen = 0;
	FILE *f = open_memstream(&out, &outlen);
	cfg_print_effective(f, &c);
	fclose(f);
	cr_assert(strstr(out, "data-dir = /from/flag") != NULL);
	cr_assert(strstr(out, "# flag (flag --data-dir)") != NULL);
	cr_assert(strstr(out, "# env (env MOONCAKE_LOG_LEVEL)") != NULL);
	cr_assert(strstr(out, "# file (file /tmp/mooncake-cfg-") != NULL);
	free(out);
	cfg_free(&c);
	unlink(path);
}

Test(cfg_load, env_alias_below_the_own_variable)
{
	char *argv[] = {"mooncaked", "--config=", NULL};
	struct cfg c;
	struct cfg_cmdline cl;
	char *alias[] = {"MC_GID_INDEX=3", NULL};
	cr_assert_eq(load(&c, &cl, alias, 2, argv), 0, "%s", err);
	cr_assert_str_eq(cfg_str(&c, CFG_RDMA_GID_INDEX), "3");
	cr_assert_eq(c.v[CFG_RDMA_GID_INDEX].src, CFG_SRC_ENV);
	cr_assert_str_eq(c.v[CFG_RDMA_GID_INDEX].origin, "env MC_GID_INDEX");
	cfg_free(&c);
	char *both[] = {"MC_GID_INDEX=3", "MOONCAKE_RDMA_GID_INDEX=1", NULL};
	cr_assert_eq(load(&c, &cl, both, 2, argv), 0, "%s", err);
	cr_assert_str_eq(cfg_str(&c, CFG_RDMA_GID_INDEX), "1", "MOONCAKE_* wins");
	cfg_free(&c);
	char *flag[] = {"mooncaked", "--config=", "--rdma-gid-index=2", NULL};
	cr_assert_eq(load(&c, &cl, alias, 3, flag), 0, "%s", err);
	cr_assert_str_eq(cfg_str(&c, CFG_RDMA_GID_INDEX), "2", "the flag wins");
	cfg_free(&c);
	/* listed in --help */
	char *out = NULL;
	size_t outlen = 0;
	FILE *f = open_memstream(&out, &outlen);
	cfg_print_help(f, "mooncaked");
	fclose(f);
	cr_assert(strstr(out, "MC_GID_INDEX") != NULL);
	free(out);
}

struct bad_case {
	const char *const *argv;
	const char *expect;
};

Test(cfg_load, flag_errors_name_the_flag)
{
	struct {
		char *argv[4];
		const char *expect;
	} cases[] = {
		{{"--nope=1"}, "unknown flag '--nope'"},
		{{"--rpc-max-message-size=12Q"},
		 "--rpc-max-message-size: '12Q' is not a size"},
		{{"--rpc-max-message-size=2G"}, "out of range (1K to 1G)"},
		{{"--rpc-max-call-memory=127M"},
		 "--rpc-max-call-memory (133169152 bytes) is below twice "
		 "--rpc-max-message-size"},
		{{"--rpc-max-message-size=8M", "--rpc-max-call-memory=15M"},
		 "could not be received and decoded"},
		{{"--shutdown-timeout=10"}, "--shutdown-timeout: '10' is not a duration"},
		{{"--shutdown-timeout=2h"}, "out of range"},
		{{"--data-dir"}, "--data-dir: missing value (expected a path)"},
		{{"--listen-client=localhost:99999"},
		 "--listen-client: 'localhost:99999' is not a numeric host:port"},
		{{"--listen-client=example.com:80"}, "is not a numeric host:port"},
		{{"--role=brain"}, "--role: 'brain' is not meta, master, agent or standalone"},
		{{"--diag-service=perhaps"}, "--diag-service: 'perhaps' is not true or false"},
		{{"--log-level=loud"}, "unknown level 'loud'"},
		{{"--log-level=info,foo=debug"}, "unknown subsystem 'foo'"},
		{{"stray"}, "unexpected argument 'stray'"},
		{{"--config=/nonexistent/mooncake.conf"},
		 "cannot open '/nonexistent/mooncake.conf'"},
		{{"--config"}, "--config: missing value (expected a file path)"},
	};
	char *envp[] = {NULL};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *argv[5] = {"mooncaked"};
		int argc = 1;
		for (int j = 0; cases[i].argv[j]; j++)
			argv[argc++] = cases[i].argv[j];
		struct cfg c;
		struct cfg_cmdline cl;
		err[0] = '\0';
		cr_assert_neq(load(&c, &cl, envp, argc, argv), 0, "case %zu", i);
		cr_assert(strstr(err, cases[i].expect) != NULL, "case %zu: '%s' not in '%s'",
			  i, cases[i].expect, err);
		cr_assert(strchr(err, '\n') == NULL, "one line");
	}
}

Test(cfg_load, env_errors_name_the_variable)
{
	char *envp[] = {"MOONCAKE_SHUTDOWN_TIMEOUT=soon", NULL};
	char *argv[] = {"mooncaked", "--config=", NULL};
	struct cfg c;
	struct cfg_cmdline cl;
	cr_assert_eq(load(&c, &cl, envp, 2, argv), -EINVAL);
	cr_assert(strstr(err, "MOONCAKE_SHUTDOWN_TIMEOUT: 'soon' is not a duration"), "%s",
		  err);
}

Test(cfg_load, commands_and_bool_flags)
{
	char *envp[] = {NULL};
	char *argv[] = {"mooncaked", "--config=", "--print-config", "--diag-service", "--help",
			"--version", NULL};
	struct cfg c;
	struct cfg_cmdline cl;
	cr_assert_eq(load(&c, &cl, envp, 6, argv), 0, "%s", err);
	cr_assert(cl.print_config && cl.help && cl.version);
	cr_assert(cfg_bool(&c, CFG_DIAG_SERVICE));
	cfg_free(&c);
}

static int ini(const char *text)
{
	struct cfg c;
	struct cfg_cmdline cl;
	char *envp[] = {NULL};
	char *argv[] = {"mooncaked", "--config=", NULL};
	cr_assert_eq(load(&c, &cl, envp, 2, argv), 0);
	err[0] = '\0';
	int rc = cfg_parse_ini(&c, "test.conf", text, strlen(text), err, sizeof(err));
	cfg_free(&c);
	return rc;
}

Test(cfg_ini, error_paths)
{
	struct {
		const char *text, *expect;
	} cases[] = {
		{"data-dir = /x\n",
		 "test.conf:1: key 'data-dir' outside a section (it belongs in [common])"},
		{"[common]\nnope = 1\n", "test.conf:2: unknown key 'nope'"},
		{"[bogus]\n", "test.conf:1: unknown section [bogus]"},
		{"[common\n", "test.conf:1: malformed section header"},
		{"[common] x\n", "test.conf:1: malformed section header"},
		{"[common]\njust words\n", "test.conf:2: expected 'key = value'"},
		{"[meta]\ndata-dir = /x\n",
		 "test.conf:2: key 'data-dir' belongs in [common], not [meta]"},
		{"[common]\nshutdown-timeout = 1s\nshutdown-timeout = 2s\n",
		 "test.conf:3: key 'shutdown-timeout' set twice"},
		{"[common]\n\n\nrpc-max-message-size = 12Q\n",
		 "test.conf:4: rpc-max-message-size: '12Q' is not a size"},
		{"[master]\nmaster-listen = nowhere\n",
		 "test.conf:2: master-listen: 'nowhere' is not a numeric host:port"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cr_assert_eq(ini(cases[i].text), -EINVAL, "case %zu", i);
		cr_assert(strstr(err, cases[i].expect) != NULL, "case %zu: '%s' not in '%s'",
			  i, cases[i].expect, err);
	}
	char nul[] = "[common]\ndata-dir = a\0b\n";
	struct cfg c;
	struct cfg_cmdline cl;
	char *envp[] = {NULL};
	char *argv[] = {"mooncaked", "--config=", NULL};
	cr_assert_eq(load(&c, &cl, envp, 2, argv), 0);
	cr_assert_eq(cfg_parse_ini(&c, "n", nul, sizeof(nul) - 1, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "NUL byte") != NULL);
	cfg_free(&c);
}

Test(cfg_ini, accepts_comments_quotes_crlf_and_blank)
{
	cr_assert_eq(ini("; top comment\r\n\r\n[common]\r\n  data-dir = \"/a b\"  \r\n"
			 "# x\n[agent]\nagent-http=:0\n"),
		     0, "%s", err);
	cr_assert_eq(ini(""), 0);
}

Test(cfg_output, help_and_man_cover_every_key)
{
	char *help = NULL, *man = NULL;
	size_t hl = 0, ml = 0;
	FILE *f = open_memstream(&help, &hl);
	cfg_print_help(f, "mooncaked");
	fclose(f);
	f = open_memstream(&man, &ml);
	cfg_print_man_options(f);
	fclose(f);
	for (int k = 0; k < CFG_NKEYS; k++) {
		char flag[128], mflag[160], *o = mflag;
		snprintf(flag, sizeof(flag), "--%s=", cfg_keydefs[k].name);
		cr_assert(strstr(help, flag) != NULL, "help lacks %s", flag);
		o += sprintf(o, "\\-\\-");
		for (const char *p = cfg_keydefs[k].name; *p; p++)
			o += *p == '-' ? sprintf(o, "\\-") : sprintf(o, "%c", *p);
		cr_assert(strstr(man, mflag) != NULL, "man lacks %s", mflag);
		/* Every default parses: cfg_load asserts it, check the text too. */
		char d[160];
		snprintf(d, sizeof(d), "(default: %s)",
			 *cfg_keydefs[k].def ? cfg_keydefs[k].def : "none");
		(void)d;
	}
	free(help);
	free(man);
}

Test(cfg_ratio, parse_and_bounds)
{
	struct {
		const char *s;
		uint64_t ppm;
	} ok[] = {
		{"0", 0},         {"1", 1000000},  {"0.9", 900000},  {"0.1", 100000},
		{"1.0", 1000000}, {"0.000001", 1}, {"0.25", 250000},
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		uint64_t v = 7;
		cr_assert_eq(cfg_parse_ratio_ppm(ok[i].s, &v), 0, "%s", ok[i].s);
		cr_assert_eq(v, ok[i].ppm, "%s -> %llu", ok[i].s, (unsigned long long)v);
	}
	const char *bad[] = {"", ".5", "0.", "-0.1", "0.9x", "90%", "1e-1", " 0.5"};
	uint64_t v;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(cfg_parse_ratio_ppm(bad[i], &v), -EINVAL, "%s", bad[i]);
	cr_assert_eq(cfg_parse_ratio_ppm("1.5", &v), -ERANGE);
	cr_assert_eq(cfg_parse_ratio_ppm("2", &v), -ERANGE);

	/* Through the key table: defaults, a flag, and the errors. */
	struct cfg c;
	struct cfg_cmdline cl;
	char *ok_argv[] = {"mooncaked", "--eviction-ratio=0.25", NULL};
	char *envp[] = {NULL};
	cr_assert_eq(cfg_load(&c, 2, ok_argv, envp, &cl, err, sizeof(err)), 0, "%s", err);
	cr_assert_float_eq(cfg_ratio(&c, CFG_EVICTION_RATIO), 0.25, 1e-12);
	cr_assert_float_eq(cfg_ratio(&c, CFG_EVICTION_HIGH_WATERMARK_RATIO), 0.9, 1e-12);
	cfg_free(&c);
	char *bad_argv[] = {"mooncaked", "--eviction-high-watermark-ratio=1.5", NULL};
	cr_assert_eq(cfg_load(&c, 2, bad_argv, envp, &cl, err, sizeof(err)), -EINVAL);
	cr_assert(
		strstr(err,
		       "--eviction-high-watermark-ratio: '1.5' is not a ratio between 0 and 1"),
		"%s", err);
	char *zero_argv[] = {"mooncaked", "--eviction-ratio=0", NULL};
	cr_assert_eq(cfg_load(&c, 2, zero_argv, envp, &cl, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "out of range (1e-06 to 1)"), "%s", err);
}

/* ------------------------------------------------------------ Mooncake's spellings */

/* cfg_load of a NULL-terminated argv, never reading /etc/mooncake. */
static int loadv(struct cfg *c, struct cfg_cmdline *cl, char **envp, char **argv)
{
	char *full[32] = {"mooncaked", "--config="};
	int n = 2;
	for (int i = 1; argv[i] && n < 31; i++)
		full[n++] = argv[i];
	full[n] = NULL;
	return cfg_load(c, n, full, envp, cl, err, sizeof(err));
}

Test(cfg_mooncake, master_flags_map_onto_keys)
{
	char *envp[] = {NULL};
	char *argv[] = {"mooncaked",
			"--master-listen=0.0.0.0:1",
			"--rpc_port=6000",
			"-metrics_port",
			"9999",
			"--eviction_high_watermark_ratio=0.85",
			"--eviction_ratio=0.15",
			"--default_kv_lease_ttl=200",
			"--client_ttl=30",
			"--put_start_discard_timeout_sec=60",
			"--cluster_id=prod",
			"--etcd_endpoints=10.0.0.1:2379;10.0.0.2:2379",
			"--enable_ha",
			"--global_segment_size=4 GB",
			NULL};
	struct cfg c;
	struct cfg_cmdline cl;
	cr_assert_eq(loadv(&c, &cl, envp, argv), 0, "%s", err);
	cr_assert_str_eq(cfg_str(&c, CFG_MASTER_LISTEN), "0.0.0.0:6000");
	cr_assert_str_eq(c.v[CFG_MASTER_LISTEN].origin, "flag --rpc_port");
	cr_assert_str_eq(cfg_str(&c, CFG_MASTER_HTTP), "127.0.0.1:9999");
	cr_assert_eq(c.v[CFG_EVICTION_HIGH_WATERMARK_RATIO].num, 850000);
	cr_assert_eq(c.v[CFG_EVICTION_RATIO].num, 150000);
	cr_assert_eq(cfg_u64(&c, CFG_DEFAULT_KV_LEASE_TTL), 200, "milliseconds, as upstream");
	cr_assert_eq(cfg_u64(&c, CFG_AGENT_TTL), 30000);
	cr_assert_eq(cfg_u64(&c, CFG_PUT_TIMEOUT), 60000);
	cr_assert_str_eq(cfg_str(&c, CFG_CLUSTER_ID), "prod");
	cr_assert_str_eq(cfg_str(&c, CFG_META_ENDPOINTS), "10.0.0.1:2379,10.0.0.2:2379");
	cr_assert_str_eq(c.v[CFG_META_ENDPOINTS].origin, "flag --enable_ha");
	cr_assert_eq(cfg_u64(&c, CFG_GLOBAL_SEGMENT_SIZE), 4ull << 30);
	cr_assert_str_eq(cfg_warnings(&c), "");
	cfg_free(&c);
}

Test(cfg_mooncake, order_and_ha)
{
	char *envp[] = {NULL};
	char *a1[] = {"mooncaked", "--rpc_address=10.1.2.3", "--master-listen=127.0.0.1:7",
		      "--noenable_ha", NULL};
	struct cfg c;
	struct cfg_cmdline cl;
	cr_assert_eq(loadv(&c, &cl, envp, a1), 0, "%s", err);
	cr_assert_str_eq(cfg_str(&c, CFG_MASTER_LISTEN), "127.0.0.1:7", "the later flag wins");
	cr_assert_str_eq(cfg_str(&c, CFG_META_ENDPOINTS), "", "--noenable_ha: no meta");
	cfg_free(&c);

	char *a2[] = {"mooncaked", "--rpc_address=::1", NULL};
	cr_assert_eq(loadv(&c, &cl, envp, a2), 0, "%s", err);
	cr_assert_str_eq(cfg_str(&c, CFG_MASTER_LISTEN), "[::1]:50051");
	cfg_free(&c);

	char *a3[] = {"mooncaked", "--meta-endpoints=", "--enable_ha=true", NULL};
	cr_assert_eq(loadv(&c, &cl, envp, a3), -EINVAL);
	cr_assert(strstr(err, "--enable_ha") && strstr(err, "--etcd_endpoints"), "%s", err);

	char *a4[] = {"mooncaked", "--metadata_server=P2PHANDSHAKE", NULL};
	cr_assert_eq(loadv(&c, &cl, envp, a4), 0, "%s", err);
	cr_assert_str_eq(cfg_str(&c, CFG_META_ENDPOINTS), "");
	cfg_free(&c);
	char *a5[] = {"mooncaked", "--metadata_server=etcd://10.0.0.9:2379", NULL};
	cr_assert_eq(loadv(&c, &cl, envp, a5), 0, "%s", err);
	cr_assert_str_eq(cfg_str(&c, CFG_META_ENDPOINTS), "10.0.0.9:2379");
	cfg_free(&c);
	char *a6[] = {"mooncaked", "--metadata_server=http://10.0.0.9:8080/metadata", NULL};
	cr_assert_eq(loadv(&c, &cl, envp, a6), -EINVAL);
	cr_assert(strstr(err, "etcd v3"), "%s", err);
}

Test(cfg_mooncake, refused_flags_say_why)
{
	char *envp[] = {NULL};
	struct cfg c;
	struct cfg_cmdline cl;
	char *a1[] = {"mooncaked", "--rpc_thread_num=8", NULL};
	cr_assert_eq(loadv(&c, &cl, envp, a1), -EINVAL);
	cr_assert(strstr(err, "--rpc_thread_num is Mooncake's and has no meaning") &&
			  strstr(err, "event loop"),
		  "%s", err);
	char *a2[] = {"mooncaked", "-enable_http_metadata_server=true", NULL};
	cr_assert_eq(loadv(&c, &cl, envp, a2), -EINVAL);
	cr_assert(strstr(err, "-enable_http_metadata_server is Mooncake's"), "%s", err);
	char *a3[] = {"mooncaked", "--rpc_port=http", NULL};
	cr_assert_eq(loadv(&c, &cl, envp, a3), -EINVAL);
	cr_assert(strstr(err, "--rpc_port: 'http' is not a port") &&
			  strstr(err, "--master-listen"),
		  "%s", err);
	char *a4[] = {"mooncaked", "-data-dir=/x", NULL};
	cr_assert_eq(loadv(&c, &cl, envp, a4), -EINVAL,
		     "one dash is for Mooncake's names only");
}

Test(cfg_mooncake, mc_variables)
{
	char *envp[] = {"MC_FORCE_TCP=1",
			"MC_MTU=2048",
			"MC_LOG_LEVEL=WARNING",
			"MC_SLICE_SIZE=262144",
			"MC_STORE_CLUSTER_ID=c2",
			"MC_MS_FILTERS=mlx5_0,mlx5_1",
			"MC_GID_INDEX=3",
			"MOONCAKE_RDMA_GID_INDEX=5",
			NULL};
	char *argv[] = {"mooncaked", NULL};
	struct cfg c;
	struct cfg_cmdline cl;
	cr_assert_eq(loadv(&c, &cl, envp, argv), 0, "%s", err);
	cr_assert_str_eq(cfg_str(&c, CFG_PROTOCOL), "tcp");
	cr_assert_str_eq(c.v[CFG_PROTOCOL].origin, "env MC_FORCE_TCP");
	cr_assert_str_eq(cfg_str(&c, CFG_RDMA_MTU), "2048");
	cr_assert_str_eq(cfg_str(&c, CFG_LOG_LEVEL), "WARNING");
	cr_assert_eq(cfg_u64(&c, CFG_TE_SLICE_SIZE), 262144);
	cr_assert_str_eq(cfg_str(&c, CFG_CLUSTER_ID), "c2");
	cr_assert_str_eq(cfg_str(&c, CFG_RDMA_DEVICES), "mlx5_0,mlx5_1");
	cr_assert_str_eq(cfg_str(&c, CFG_RDMA_GID_INDEX), "5", "MOONCAKE_* above MC_*");
	cr_assert_str_eq(cfg_warnings(&c), "");
	cfg_free(&c);

	char *e2[] = {"MC_MTU=1000", NULL};
	cr_assert_eq(loadv(&c, &cl, e2, argv), -EINVAL);
	cr_assert(strstr(err, "MC_MTU: '1000' is not one of auto|256|512|1024|2048|4096"),
		  "%s", err);
}

Test(cfg_mooncake, unknown_and_meaningless_variables_warn_once_each)
{
	char *envp[] = {"MOONCAKE_SEGMENT_SIZE=1G",
			"MOONCAKE_SOCKET=/x",
			"MOONCAKE_MASTER=a:1",
			"MC_NUM_QP_PER_EP=2",
			"MC_WHATEVER=1",
			"MC_FORCE_TCP=0",
			NULL};
	char *argv[] = {"mooncaked", NULL};
	struct cfg c;
	struct cfg_cmdline cl;
	cr_assert_eq(loadv(&c, &cl, envp, argv), 0, "%s", err);
	const char *w = cfg_warnings(&c);
	cr_assert(strstr(w, "MOONCAKE_SEGMENT_SIZE names no key"), "%s", w);
	cr_assert(!strstr(w, "MOONCAKE_SOCKET") && !strstr(w, "MOONCAKE_MASTER"),
		  "client variables are not warned about: %s", w);
	cr_assert(strstr(w,
			 "MC_NUM_QP_PER_EP is Mooncake's and has no meaning in mooncaked (one "
			 "queue pair"),
		  "%s", w);
	cr_assert(strstr(w, "MC_WHATEVER is not one of Mooncake's variables"), "%s", w);
	cr_assert(strstr(w, "MC_FORCE_TCP=0"), "%s", w);
	cr_assert_str_eq(cfg_str(&c, CFG_PROTOCOL), "auto", "MC_FORCE_TCP=0 is not applied");
	size_t lines = 0;
	for (const char *p = w; *p; p++)
		lines += *p == '\n';
	cr_assert_eq(lines, 4, "one line each: %s", w);
	cfg_free(&c);
}

Test(cfg_mooncake, help_and_man_list_them)
{
	char *out = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&out, &len);
	cfg_print_help(f, "mooncaked");
	cfg_print_man_options(f);
	fclose(f);
	const char *names[] = {
		"rpc_port",       "metrics_port",         "eviction_high_watermark_ratio",
		"eviction_ratio", "default_kv_lease_ttl", "enable_ha",
		"etcd_endpoints", "cluster_id",           "MC_FORCE_TCP",
		"MC_MTU",         "MC_LOG_LEVEL",         "MC_SLICE_SIZE",
		"MC_GID_INDEX",   "rpc_thread_num",       "MC_IB_SL"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		cr_assert(strstr(out, names[i]), "%s missing", names[i]);
	cr_assert(strstr(out, ".SH MOONCAKE SPELLINGS"));
	free(out);
}
