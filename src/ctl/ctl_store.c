/*
 * ctl_store: mooncakectl commands that store and fetch objects through
 * the local agent's Unix socket (libmooncake), like an inference process
 * would:
 *
 *   mooncakectl put KEY FILE|- [--socket=PATH] [--replicas=N] [--soft-pin]
 *                   [--ttl=DURATION] [--upsert] [--tier=dram|ssd]
 *   mooncakectl get KEY [FILE] [--socket=PATH] [--verify]
 *   mooncakectl rm KEY [--force] [--socket=PATH]
 *   mooncakectl stats --agent [--socket=PATH]   (ctl_agent_stats)
 *
 * Without --socket the library looks where the agent does
 * ($MOONCAKE_SOCKET, /run/mooncake/agent.sock,
 * $XDG_RUNTIME_DIR/mooncake/agent.sock).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cfg.h"
#include "common/err.h"
#include "common/io.h"
#include "ctl/ctl_int.h"
#include "client/mooncake.h"

struct store_args {
	const char *pos[2];
	int npos;
	const char *socket;
	struct mc_put_opts put;
	int force;
	int verify;
	bool regex;
	const char *put_flag, *get_flag, *rm_flag; /* one given, for refusals */
};

static void store_usage(FILE *f, const char *cmd)
{
	if (strcmp(cmd, "put") == 0)
		fprintf(f, "usage: mooncakectl put KEY FILE|- [--socket=PATH] [--replicas=N] "
			   "[--soft-pin] [--ttl=DURATION] [--upsert] [--tier=dram|ssd]\n"
			   "Store FILE (or standard input) under KEY through the local "
			   "agent. An existing key is refused unless --upsert. --tier=ssd: "
			   "straight into the agent's SSD tier (one replica).\n");
	else if (strcmp(cmd, "get") == 0)
		fprintf(f, "usage: mooncakectl get KEY [FILE] [--socket=PATH] [--verify]\n"
			   "Write the value of KEY to FILE (or standard output). Exit "
			   "status 1 when the key is not in the pool. --verify: check "
			   "the bytes against the CRC-32C their writer sealed the object "
			   "with (exit status 1 and MC_ECHECKSUM when they differ).\n");
	else
		fprintf(f, "usage: mooncakectl rm KEY [--force] [--socket=PATH]\n"
			   "       mooncakectl rm --regex PATTERN [--force] [--socket=PATH]\n"
			   "Remove KEY from the pool; --force even while a reader holds "
			   "its read lease. --regex: every object whose key matches PATTERN "
			   "(a POSIX extended regular expression, matched anywhere in the "
			   "key: anchor it with ^), and print how many went.\n");
}

static int parse(int argc, char **argv, struct store_args *a)
{
	memset(a, 0, sizeof(*a));
	for (int i = 1; i < argc; i++) {
		const char *v;
		bool b, ok;
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			store_usage(stdout, argv[0]);
			return 1;
		}
		if (ctl_flag_value(argc, argv, &i, "socket", &v)) {
			if (!v)
				goto missing;
			a->socket = v;
		} else if (ctl_flag_value(argc, argv, &i, "replicas", &v)) {
			char *end;
			unsigned long n = v ? strtoul(v, &end, 10) : 0;
			if (!v || *end || n < 1 || n > 16) {
				fprintf(stderr, "mooncakectl: --replicas takes 1 to 16\n");
				return -1;
			}
			a->put.replica_num = (unsigned)n;
			a->put_flag = "--replicas";
		} else if (ctl_flag_value(argc, argv, &i, "tier", &v)) {
			if (!v || (strcmp(v, "dram") != 0 && strcmp(v, "ssd") != 0)) {
				fprintf(stderr, "mooncakectl: --tier takes dram or ssd\n");
				return -1;
			}
			a->put.tier = strcmp(v, "ssd") == 0 ? MC_TIER_SSD : MC_TIER_DRAM;
			a->put_flag = "--tier";
		} else if (ctl_flag_value(argc, argv, &i, "ttl", &v)) {
			if (!v || cfg_parse_duration_ms(v, &a->put.ttl_ms) != 0) {
				fprintf(stderr,
					"mooncakectl: --ttl takes a duration (10s, 5m)\n");
				return -1;
			}
			a->put_flag = "--ttl";
		} else if (ctl_flag_bool(argv[i], "soft-pin", &b, &ok)) {
			if (!ok)
				goto badbool;
			a->put.soft_pin = b;
			a->put_flag = "--soft-pin";
		} else if (ctl_flag_bool(argv[i], "upsert", &b, &ok)) {
			if (!ok)
				goto badbool;
			a->put.upsert = b;
			a->put_flag = "--upsert";
		} else if (ctl_flag_bool(argv[i], "force", &b, &ok)) {
			if (!ok)
				goto badbool;
			a->force = b;
			a->rm_flag = "--force";
		} else if (ctl_flag_bool(argv[i], "regex", &b, &ok)) {
			if (!ok)
				goto badbool;
			a->regex = b;
			a->rm_flag = "--regex";
		} else if (ctl_flag_bool(argv[i], "verify", &b, &ok)) {
			if (!ok)
				goto badbool;
			a->verify = b;
			a->get_flag = "--verify";
		} else if (argv[i][0] == '-' && argv[i][1] == '-') {
			fprintf(stderr, "mooncakectl %s: unknown flag %s\n", argv[0], argv[i]);
			return -1;
		} else if (a->npos < 2) {
			a->pos[a->npos++] = argv[i];
		} else {
			fprintf(stderr, "mooncakectl %s: too many arguments\n", argv[0]);
			return -1;
		}
	}
	/* A flag of another command would be ignored: refused instead. */
	const char *other = strcmp(argv[0], "put") == 0
				    ? (a->get_flag ? a->get_flag : a->rm_flag)
			    : strcmp(argv[0], "get") == 0
				    ? (a->put_flag ? a->put_flag : a->rm_flag)
				    : (a->put_flag ? a->put_flag : a->get_flag);
	if (other) {
		fprintf(stderr, "mooncakectl %s: %s is not a flag of %s (see --help)\n",
			argv[0], other, argv[0]);
		return -1;
	}
	return 0;
missing:
	fprintf(stderr, "mooncakectl %s: --socket needs a value\n", argv[0]);
	return -1;
badbool:
	fprintf(stderr, "mooncakectl %s: a boolean flag takes true or false\n", argv[0]);
	return -1;
}

static int open_agent(const struct store_args *a, mc_client **c)
{
	struct mc_open_opts o = {.socket_path = a->socket, .client_name = "mooncakectl"};
	int rc = mc_open_ex(&o, c);
	if (rc)
		fprintf(stderr, "mooncakectl: cannot reach the agent%s%s: %s\n",
			a->socket ? " at " : "", a->socket ? a->socket : "",
			rc == -ENOENT && !a->socket
				? "no socket found (set --socket or MOONCAKE_SOCKET)"
				: mc_strerror(rc));
	return rc;
}

/* The whole of fd into a malloc'd buffer. */
static int slurp(int fd, uint8_t **out, size_t *len)
{
	size_t cap = 1 << 16, n = 0;
	struct stat st;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
		cap = (size_t)st.st_size + 1;
	uint8_t *b = malloc(cap);
	if (!b)
		return -ENOMEM;
	for (;;) {
		if (n == cap) {
			uint8_t *p = cap > SIZE_MAX / 2 ? NULL : realloc(b, cap * 2);
			if (!p) {
				free(b);
				return -ENOMEM;
			}
			b = p;
			cap *= 2;
		}
		ssize_t r = read(fd, b + n, cap - n);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			int e = -errno;
			free(b);
			return e;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	*out = b;
	*len = n;
	return 0;
}

int ctl_put_main(int argc, char **argv)
{
	struct store_args a;
	int p = parse(argc, argv, &a);
	if (p)
		return p > 0 ? CTL_EXIT_OK : CTL_EXIT_USAGE;
	if (a.npos != 2) {
		store_usage(stderr, "put");
		return CTL_EXIT_USAGE;
	}
	const char *key = a.pos[0], *file = a.pos[1];
	int fd = strcmp(file, "-") == 0 ? 0 : open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "mooncakectl put: %s: %s\n", file, strerror(errno));
		return CTL_EXIT_FAIL;
	}
	uint8_t *val = NULL;
	size_t len = 0;
	int rc = slurp(fd, &val, &len);
	if (fd)
		close(fd);
	if (rc) {
		fprintf(stderr, "mooncakectl put: reading %s: %s\n", file, mc_strerror(rc));
		return CTL_EXIT_FAIL;
	}
	mc_client *c;
	if (open_agent(&a, &c)) {
		free(val);
		return CTL_EXIT_FAIL;
	}
	rc = mc_put(c, key, strlen(key), val, len, &a.put);
	free(val);
	struct mc_agent_stats st;
	unsigned ready;
	if (rc == MC_ETOO_FEW_SEGMENTS && mc_agent_stats(c, &st) == 0 && st.master[0] &&
	    ctl_master_dram_segments(st.master, &ready) == 0) {
		/* Say it with the figures: N replicas, M segments. */
		unsigned n = a.put.replica_num ? a.put.replica_num : 1;
		fprintf(stderr,
			"mooncakectl put %s: --replicas=%u needs %u segments, one per replica, "
			"and only %u %s mounted (%s)\n",
			key, n, n, ready, ready == 1 ? "is" : "are", mc_errname(rc));
		mc_close(c);
		return CTL_EXIT_FAIL;
	}
	mc_close(c);
	if (rc) {
		fprintf(stderr, "mooncakectl put %s: %s (%s)\n", key, mc_strerror(rc),
			mc_errname(rc));
		return CTL_EXIT_FAIL;
	}
	return CTL_EXIT_OK;
}

int ctl_get_main(int argc, char **argv)
{
	struct store_args a;
	int p = parse(argc, argv, &a);
	if (p)
		return p > 0 ? CTL_EXIT_OK : CTL_EXIT_USAGE;
	if (a.npos < 1) {
		store_usage(stderr, "get");
		return CTL_EXIT_USAGE;
	}
	const char *key = a.pos[0];
	mc_client *c;
	if (open_agent(&a, &c))
		return CTL_EXIT_FAIL;
	void *val;
	size_t len;
	struct mc_get_opts go = {.verify = a.verify};
	int rc = mc_get_ex(c, key, strlen(key), &val, &len, &go);
	mc_close(c);
	if (rc) {
		fprintf(stderr, "mooncakectl get %s: %s (%s)\n", key, mc_strerror(rc),
			mc_errname(rc));
		return CTL_EXIT_FAIL;
	}
	int fd = 1;
	if (a.npos == 2 && strcmp(a.pos[1], "-") != 0) {
		fd = open(a.pos[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0) {
			fprintf(stderr, "mooncakectl get: %s: %s\n", a.pos[1],
				strerror(errno));
			free(val);
			return CTL_EXIT_FAIL;
		}
	}
	rc = mc_write_all(fd, val, len);
	if (fd != 1 && close(fd) != 0 && rc == 0)
		rc = -errno;
	free(val);
	if (rc) {
		fprintf(stderr, "mooncakectl get: writing: %s\n", mc_strerror(rc));
		return CTL_EXIT_FAIL;
	}
	return CTL_EXIT_OK;
}

int ctl_rm_main(int argc, char **argv)
{
	struct store_args a;
	int p = parse(argc, argv, &a);
	if (p)
		return p > 0 ? CTL_EXIT_OK : CTL_EXIT_USAGE;
	if (a.npos != 1) {
		store_usage(stderr, "rm");
		return CTL_EXIT_USAGE;
	}
	mc_client *c;
	if (open_agent(&a, &c))
		return CTL_EXIT_FAIL;
	if (a.regex) {
		int64_t n = mc_remove_regex(c, a.pos[0], a.force);
		mc_close(c);
		if (n < 0) {
			fprintf(stderr, "mooncakectl rm --regex %s: %s (%s)\n", a.pos[0],
				n == -EINVAL ? "not a POSIX extended regular expression"
					     : mc_strerror((int)n),
				mc_errname((int)n));
			return CTL_EXIT_FAIL;
		}
		printf("removed %lld\n", (long long)n);
		return CTL_EXIT_OK;
	}
	int rc = mc_remove(c, a.pos[0], strlen(a.pos[0]), a.force);
	mc_close(c);
	if (rc) {
		fprintf(stderr, "mooncakectl rm %s: %s (%s)\n", a.pos[0], mc_strerror(rc),
			mc_errname(rc));
		return CTL_EXIT_FAIL;
	}
	return CTL_EXIT_OK;
}

int ctl_agent_stats(const char *socket)
{
	struct store_args a = {.socket = socket};
	mc_client *c;
	if (open_agent(&a, &c))
		return CTL_EXIT_FAIL;
	struct mc_agent_stats s;
	int rc = mc_agent_stats(c, &s);
	mc_close(c);
	if (rc) {
		fprintf(stderr, "mooncakectl stats: %s (%s)\n", mc_strerror(rc),
			mc_errname(rc));
		return CTL_EXIT_FAIL;
	}
	printf("agent %s\nmaster %s\nmaster_view %" PRIu64 "\nsegment_bytes %" PRIu64
	       "\nhugepages %d\nnuma_node %d\nstaging_bytes %" PRIu64 "\nclients %" PRIu64
	       "\nbuffers %" PRIu64 "\nviews %" PRIu64 "\nputs %" PRIu64 "\ngets %" PRIu64
	       "\nlocal_hits %" PRIu64 "\nremote_hits %" PRIu64 "\nmisses %" PRIu64
	       "\nbytes_written %" PRIu64 "\nbytes_read %" PRIu64 "\ninventory %" PRIu64
	       "\nget_checksum_failures %" PRIu64 "\nresync_skipped %" PRIu64
	       "\nclient_table_gets %" PRIu64 "\n",
	       s.agent_id, s.master[0] ? s.master : "-", s.master_view, s.segment_size,
	       s.hugepages, s.numa_node, s.staging_size, s.clients, s.buffers, s.views, s.puts,
	       s.gets, s.local_hits, s.remote_hits, s.misses, s.bytes_written, s.bytes_read,
	       s.inventory, s.get_bad, s.resync_bad, s.table_gets);
	if (s.ssd_segment[0])
		printf("ssd_segment %s\nssd_bytes %" PRIu64 "\nssd_used_bytes %" PRIu64
		       "\nssd_objects %" PRIu64 "\nssd_hits %" PRIu64
		       "\nssd_demotions %" PRIu64 "\nssd_promotions %" PRIu64
		       "\nssd_reads %" PRIu64 "\nssd_read_mean_us %.1f\nssd_writes %" PRIu64
		       "\nssd_write_mean_us %.1f\n",
		       s.ssd_segment, s.ssd_size, s.ssd_used, s.ssd_objects, s.ssd_hits,
		       s.ssd_demotions, s.ssd_promotions, s.ssd_reads,
		       ctl_mean_us(s.ssd_read_ns, s.ssd_reads), s.ssd_writes,
		       ctl_mean_us(s.ssd_write_ns, s.ssd_writes));
	return CTL_EXIT_OK;
}
