/*
 * mooncakectl: the operator's command-line tool. This file is the
 * subcommand dispatcher and the shared flag helpers; each subcommand
 * lives in its own ctl_<name>.c and returns the exit status (0 ok,
 * 1 failed or not serving, 2 usage error).
 *
 *   mooncakectl health --endpoint=HOST:PORT [--service=NAME] [--watch]
 *   mooncakectl bench rpc [--target=HOST:PORT] [--duration=3s] [--size=16M]
 *   mooncakectl bench master [--target=HOST:PORT] ...
 *   mooncakectl bench resync [--agents=64] [--objects=1M] [--heartbeat=1s]
 *   mooncakectl bench meta --endpoints=URL,... [--clients=N] [--conns=M] ...
 *   mooncakectl ls [PREFIX] [--master=HOST:PORT]
 *   mooncakectl stats [--master=HOST:PORT]
 *   mooncakectl put KEY FILE|- / get KEY [FILE] / rm KEY  (local agent)
 *   mooncakectl doctor [--cluster] [--json]   (ctl_doctor.c)
 *   mooncakectl plan --model=NAME | --layers=... (ctl_plan.c)
 *   mooncakectl secret create FILE            (ctl_secret.c)
 *
 * Log lines from the libraries go to stderr at WARN and above, so that
 * stdout carries only the command's answer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cfg.h"
#include "common/log.h"
#include "ctl/ctl_int.h"

struct ctl_cmd {
	const char *name;
	const char *summary;
	int (*main)(int argc, char **argv);
};

static const struct ctl_cmd cmds[] = {
	{"health", "show (or --watch) a server's grpc.health.v1 status", ctl_health_main},
	{"bench",
	 "benchmarks: `bench rpc` (gRPC vs plain TCP on loopback), `bench master`, `bench resync` (agents through a master failover), `bench meta` (etcd v3 API), `bench transfer`, `bench store` (vs redis), `bench sessions` (many sessions, one agent), `bench ssd` (vs fio)",
	 ctl_bench_main},
	{"ls", "list keys in the master's index by prefix", ctl_ls_main},
	{"stats", "the master's figures and segments", ctl_stats_main},
	{"put", "store a file under a key through the local agent", ctl_put_main},
	{"get", "fetch a key's value through the local agent", ctl_get_main},
	{"rm", "remove a key, or the keys a --regex matches, through the local agent",
	 ctl_rm_main},
	{"transfer", "a transfer engine in this process: check a segment's data path, serve",
	 ctl_transfer_main},
	{"doctor",
	 "check this node (RDMA, PCIe, memlock, huge pages, memory) and the cluster (meta, segments, master)",
	 ctl_doctor_main},
	{"plan",
	 "size the pool for a model: KV bytes per token and request, requests held, segment per node",
	 ctl_plan_main},
	{"secret",
	 "`secret create FILE`: a new random cluster secret (0600) for --cluster-secret-file",
	 ctl_secret_main},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: mooncakectl COMMAND [FLAGS]\n"
		   "       mooncakectl help [COMMAND] | --help | --version\n\n"
		   "commands:\n");
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		fprintf(f, "  %-8s %s\n", cmds[i].name, cmds[i].summary);
	fprintf(f, "\n`mooncakectl COMMAND --help` describes a command's flags.\n"
		   "Exit status: 0 success, 1 failure or not serving, 2 usage error.\n");
}

bool ctl_flag_value(int argc, char **argv, int *i, const char *name, const char **value)
{
	const char *a = argv[*i];
	size_t n = strlen(name);
	if (strncmp(a, "--", 2) != 0 || strncmp(a + 2, name, n) != 0)
		return false;
	if (a[2 + n] == '=') {
		*value = a + 3 + n;
		return true;
	}
	if (a[2 + n] != '\0')
		return false;
	if (*i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0) {
		*value = argv[++*i];
	} else {
		*value = NULL;
	}
	return true;
}

int ctl_parse_count(const char *s, uint64_t *out)
{
	char *end;
	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	uint64_t mul = 1;
	if (*end == 'K' || *end == 'k')
		mul = 1000;
	else if (*end == 'M' || *end == 'm')
		mul = 1000000;
	else if (*end == 'G' || *end == 'g')
		mul = 1000000000;
	if (mul > 1)
		end++;
	if (errno || *end || v == 0 || v > UINT64_MAX / mul)
		return -EINVAL;
	*out = (uint64_t)v * mul;
	return 0;
}

bool ctl_flag_bool(const char *arg, const char *name, bool *out, bool *ok)
{
	size_t n = strlen(name);
	*ok = true;
	if (strncmp(arg, "--", 2) != 0 || strncmp(arg + 2, name, n) != 0)
		return false;
	if (arg[2 + n] == '\0') {
		*out = true;
		return true;
	}
	if (arg[2 + n] != '=')
		return false;
	*ok = cfg_parse_bool(arg + 3 + n, out) == 0;
	return true;
}

int main(int argc, char **argv)
{
	unsigned char levels[LOGS_COUNT];
	if (log_parse_levels("warn", levels, NULL, 0) == 0)
		log_set_levels(levels);

	if (argc < 2) {
		usage(stderr);
		return CTL_EXIT_USAGE;
	}
	const char *cmd = argv[1];
	if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
		printf("mooncakectl %s (%s)\n", MC_VERSION, MC_GITREV);
		return CTL_EXIT_OK;
	}
	if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
		if (argc > 2 && strcmp(cmd, "help") == 0) {
			for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
				if (strcmp(cmds[i].name, argv[2]) == 0) {
					char *sub[] = {argv[2], "--help", NULL};
					return cmds[i].main(2, sub);
				}
			fprintf(stderr, "mooncakectl: unknown command \"%s\"\n", argv[2]);
			return CTL_EXIT_USAGE;
		}
		usage(stdout);
		return CTL_EXIT_OK;
	}
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (strcmp(cmds[i].name, cmd) == 0)
			return cmds[i].main(argc - 1, argv + 1);
	fprintf(stderr, "mooncakectl: unknown command \"%s\"\n", cmd);
	usage(stderr);
	return CTL_EXIT_USAGE;
}
