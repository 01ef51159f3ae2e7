/*
 * ctl_bench_sessions: `mooncakectl bench sessions` — one agent with many
 * client sessions at once: what an idle session costs the agent, and
 * that every one of them is served.
 *
 *   1. The agent's memory (resident: its heap and every page of shared
 *      memory it has touched, staging buffers included, but not its DRAM
 *      segment, which it fills in the background after its start) and
 *      descriptors
 *      are read before any session, then after --sessions sessions are
 *      open and idle (each the handshake of an inference process: a
 *      Unix socket, a staging memfd mapped by both sides).
 *   2. --threads threads take the sessions in turn, each a share, and
 *      through every session put a new key of --value-size and get it
 *      back (checked), round after round, for --duration: every session
 *      is served, concurrently with the others. Memory is read again
 *      (sessions that have moved values: their staging pages touched).
 *   3. The sessions close; memory is read a last time.
 *
 * Without --socket the bench starts its own agent (with the master in its
 * process, as standalone runs it) and reads /proc for its pid; with
 * --socket it measures the sessions of a running agent and cannot see its
 * memory. Nothing here is an assertion but the bytes read back.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/cfg.h"
#include "common/err.h"
#include "common/util.h"
#include "ctl/ctl_bench_store.h"
#include "ctl/ctl_int.h"

#define MAX_SESSIONS 100000u
#define MAX_THREADS 256u

struct sess {
	mc_client *c;
	uint64_t ops; /* put+get pairs served */
	int first_err;
};

struct sworker {
	pthread_t t;
	struct sess *s; /* this thread's share */
	unsigned n;
	size_t size;
	unsigned id;
	uint64_t stop_ns;
	uint8_t *val, *got;
	struct ctl_lat lat; /* of a put+get pair */
	uint64_t errors;
};

static void *sworker_main(void *arg)
{
	struct sworker *w = arg;
	char key[96];
	for (uint64_t round = 0; mc_now_ns() < w->stop_ns || round == 0; round++)
		for (unsigned i = 0; i < w->n; i++) {
			struct sess *s = &w->s[i];
			snprintf(key, sizeof(key), "bench-sessions/%d/%u/%u/%llu",
				 (int)getpid(), w->id, i, (unsigned long long)round);
			/* The value names its key's session and round. */
			memcpy(w->val, key, MC_MIN(strlen(key), w->size));
			uint64_t t0 = mc_now_ns();
			int rc = mc_put(s->c, key, strlen(key), w->val, w->size, NULL);
			int64_t n = rc ? rc
				       : mc_get_into(s->c, key, strlen(key), w->got, w->size);
			uint64_t t1 = mc_now_ns();
			if (n == (int64_t)w->size && memcmp(w->got, w->val, w->size) != 0)
				n = MC_EPROTOCOL; /* wrong bytes */
			if (n != (int64_t)w->size) {
				w->errors++;
				if (!s->first_err)
					s->first_err = n < 0 ? (int)n : MC_EPROTOCOL;
				continue;
			}
			s->ops++;
			ctl_lat_add(&w->lat, t1 - t0);
		}
	return NULL;
}

/* The agent's resident memory and open descriptors (0 when unknown). */
struct agent_mem {
	uint64_t rss, fds;
};

static void agent_mem(pid_t pid, struct agent_mem *m)
{
	memset(m, 0, sizeof(*m));
	if (pid <= 0)
		return;
	struct ctl_proc_mem pm;
	if (ctl_proc_mem(pid, &pm) == 0) {
		m->rss = pm.rss_bytes;
		m->fds = pm.fds;
	}
}

/* Read the agent's memory once its descriptors reach fds (it has taken
 * in every handshake, or seen every hang-up), or after 10 s. */
static void agent_mem_settled(pid_t pid, uint64_t fds, struct agent_mem *m)
{
	uint64_t deadline = mc_now_ms() + 10000;
	for (;;) {
		agent_mem(pid, m);
		if (pid <= 0 || m->fds == fds || mc_now_ms() > deadline)
			return;
		usleep(20000);
	}
}

static void mem_line(const char *what, const struct agent_mem *m, const struct agent_mem *base,
		     unsigned n)
{
	if (!m->rss) {
		printf("  %-34s %12s %14s %8s\n", what, "-", "-", "-");
		return;
	}
	char per[32] = "", fds[32] = "";
	if (base && n) {
		snprintf(per, sizeof(per), "%.1f",
			 ((double)m->rss - (double)base->rss) / n / 1024);
		snprintf(fds, sizeof(fds), "%.2f", ((double)m->fds - (double)base->fds) / n);
	}
	printf("  %-34s %12.1f %14s %8s\n", what, (double)m->rss / (1 << 20), per, fds);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: mooncakectl bench sessions [--sessions=1000] [--threads=8]\n"
		   "           [--value-size=4K] [--duration=3s] [--socket=PATH]\n\n"
		   "Opens --sessions client sessions with one agent (each as an inference\n"
		   "process opens one: a Unix socket and a staging buffer), and prints the\n"
		   "agent's resident memory and descriptors per idle session; then\n"
		   "--threads threads take the sessions in turn, each a share, and put and\n"
		   "get back (checked) a value through every session, round after round,\n"
		   "for --duration: every session is served while all are open. Prints\n"
		   "the put+get pairs per second, their p50/p99, the sessions served and\n"
		   "the memory per session after serving and after closing. Without\n"
		   "--socket it starts its own agent with the master in its process\n"
		   "(mooncaked next to mooncakectl), its session limits set to serve\n"
		   "them all; with --socket the agent's memory is not seen, and its\n"
		   "--client-max-sessions(-per-uid) must allow --sessions + 1.\n");
}

int ctl_bench_sessions_main(int argc, char **argv)
{
	const char *sock = NULL, *dur_s = "3s", *size_s = "4K", *v;
	uint64_t nsess = 1000, nthreads = 8, duration_ms, size;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return CTL_EXIT_OK;
		} else if (ctl_flag_value(argc, argv, &i, "sessions", &v) && v) {
			if (ctl_parse_count(v, &nsess))
				nsess = 0; /* refused below */
		} else if (ctl_flag_value(argc, argv, &i, "threads", &v) && v) {
			if (ctl_parse_count(v, &nthreads))
				nthreads = 0;
		} else if (ctl_flag_value(argc, argv, &i, "value-size", &v) && v) {
			size_s = v;
		} else if (ctl_flag_value(argc, argv, &i, "duration", &v) && v) {
			dur_s = v;
		} else if (ctl_flag_value(argc, argv, &i, "socket", &v) && v) {
			sock = v;
		} else {
			fprintf(stderr,
				"mooncakectl bench sessions: unknown argument \"%s\"\n",
				argv[i]);
			usage(stderr);
			return CTL_EXIT_USAGE;
		}
	}
	if (nsess < 1 || nsess > MAX_SESSIONS || nthreads < 1 || nthreads > MAX_THREADS ||
	    nthreads > nsess || cfg_parse_size(size_s, &size) || size < 1 ||
	    size > (64u << 20) || cfg_parse_duration_ms(dur_s, &duration_ms)) {
		fprintf(stderr,
			"mooncakectl bench sessions: bad --sessions (1 to %u), --threads "
			"(1 to %u, at most the sessions), --value-size (1 to 64M) or "
			"--duration\n",
			MAX_SESSIONS, MAX_THREADS);
		return CTL_EXIT_USAGE;
	}
	unsigned n = (unsigned)nsess, nt = (unsigned)nthreads;
	signal(SIGPIPE, SIG_IGN);
	/* A session holds a socket and, for a moment, its staging memfd. */
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)n + 64) {
		fprintf(stderr,
			"bench sessions: %u sessions need %u descriptors; the limit is "
			"%llu (ulimit -n)\n",
			n, n + 64, (unsigned long long)rl.rlim_cur);
		return CTL_EXIT_FAIL;
	}

	struct ctl_local cl = {0};
	mc_client *holder = NULL;
	int rc = 0;
	if (!sock) {
		/* Its own agent serves every session it opens (and the one
		 * that holds it), past the agent's default session limits if
		 * need be: the agent reads its keys from the environment. */
		char lim[24];
		snprintf(lim, sizeof(lim), "%u", n + 16);
		setenv("MOONCAKE_CLIENT_MAX_SESSIONS", lim, 1);
		setenv("MOONCAKE_CLIENT_MAX_SESSIONS_PER_UID", lim, 1);
	}
	for (int attempt = 1; !sock; attempt++) {
		rc = ctl_local_start(&cl, MC_MAX((uint64_t)1 << 30, 4 * (uint64_t)n * size),
				     false);
		if (rc == 0)
			rc = ctl_local_open(cl.sock[0], &holder, 15000);
		if (rc == 0) {
			sock = cl.sock[0];
			break;
		}
		fprintf(stderr, "bench sessions: mooncaked not ready (attempt %d of 3): %s\n",
			attempt, mc_strerror(rc));
		ctl_local_report_dead(&cl);
		ctl_local_stop(&cl);
		if (attempt == 3)
			return CTL_EXIT_FAIL;
	}
	pid_t apid = ctl_local_pid(&cl, "agent0");
	struct sess *ss = calloc(n, sizeof(*ss));
	struct sworker *ws = calloc(nt, sizeof(*ws));
	if (!ss || !ws) {
		rc = -ENOMEM;
		goto out;
	}
	struct agent_mem m0, m1, m2, m3;
	agent_mem(apid, &m0);
	uint64_t t0 = mc_now_ns();
	for (unsigned i = 0; i < n && rc == 0; i++) {
		struct mc_open_opts o = {.socket_path = sock, .client_name = "bench sessions"};
		rc = mc_open_ex(&o, &ss[i].c);
		if (rc)
			fprintf(stderr, "bench sessions: session %u of %u: %s\n", i + 1, n,
				mc_strerror(rc));
	}
	if (rc)
		goto out;
	double open_s = (double)(mc_now_ns() - t0) / 1e9;
	/* Each session: its socket and its staging memfd. */
	agent_mem_settled(apid, m0.fds + 2 * (uint64_t)n, &m1);

	uint64_t start = mc_now_ns(), stop = start + duration_ms * 1000000ull;
	for (unsigned t = 0; t < nt; t++) {
		struct sworker *w = &ws[t];
		unsigned from = (unsigned)((uint64_t)n * t / nt),
			 to = (unsigned)((uint64_t)n * (t + 1) / nt);
		w->s = &ss[from];
		w->n = to - from;
		w->size = size;
		w->id = t;
		w->stop_ns = stop;
		w->val = malloc(size);
		w->got = malloc(size);
		if (!w->val || !w->got) {
			rc = -ENOMEM;
			break;
		}
		memset(w->val, 0x5a, size);
	}
	for (unsigned t = 0; t < nt && rc == 0; t++)
		pthread_create(&ws[t].t, NULL, sworker_main, &ws[t]);
	for (unsigned t = 0; t < nt && rc == 0; t++)
		pthread_join(ws[t].t, NULL);
	if (rc)
		goto out;
	double secs = (double)(mc_now_ns() - start) / 1e9;
	agent_mem(apid, &m2);
	struct ctl_lat lat = {0};
	uint64_t ops = 0, errors = 0;
	unsigned served = 0;
	int first_err = 0;
	for (unsigned t = 0; t < nt; t++) {
		for (size_t k = 0; k < ws[t].lat.n; k++)
			ctl_lat_add(&lat, ws[t].lat.v[k]);
		errors += ws[t].errors;
	}
	for (unsigned i = 0; i < n; i++) {
		ops += ss[i].ops;
		served += ss[i].ops > 0;
		if (!first_err)
			first_err = ss[i].first_err;
	}
	for (unsigned i = 0; i < n; i++) {
		mc_close(ss[i].c);
		ss[i].c = NULL;
	}
	agent_mem_settled(apid, m0.fds, &m3);

	printf("bench sessions: %u sessions with one agent%s, %u threads, %s values\n", n,
	       apid > 0 ? " (the master in its process)" : "", nt, size_s);
	printf("  opened in %.2f s (%.0f a second)\n\n", open_s, n / MC_MAX(open_s, 1e-9));
	printf("  %-34s %12s %14s %8s\n", "the agent", "RSS MiB", "KiB/session", "fds/sess");
	mem_line("before the sessions", &m0, NULL, 0);
	mem_line("sessions open, idle", &m1, &m0, n);
	mem_line("after serving each of them (*)", &m2, &m0, n);
	mem_line("after closing them (*)", &m3, &m0, n);
	printf("  (*) with the index entries of the objects put%s\n",
	       apid > 0 ? " (the master is in the agent)" : "");
	printf("\n  served: %u of %u sessions, %.0f put+get pairs/s, p50 %.1f us, p99 %.1f us, "
	       "%llu errors%s%s\n",
	       served, n, (double)ops / MC_MAX(secs, 1e-9), ctl_lat_pct_us(&lat, 0.50),
	       ctl_lat_pct_us(&lat, 0.99), (unsigned long long)errors, first_err ? ": " : "",
	       first_err ? mc_strerror(first_err) : "");
	ctl_lat_free(&lat);
	if (served < n || errors)
		rc = first_err ? first_err : MC_EPROTOCOL;
out:
	if (ss)
		for (unsigned i = 0; i < n; i++)
			mc_close(ss[i].c);
	if (ws)
		for (unsigned t = 0; t < nt; t++) {
			free(ws[t].val);
			free(ws[t].got);
			ctl_lat_free(&ws[t].lat);
		}
	free(ss);
	free(ws);
	mc_close(holder);
	ctl_local_stop(&cl);
	return rc ? CTL_EXIT_FAIL : CTL_EXIT_OK;
}
