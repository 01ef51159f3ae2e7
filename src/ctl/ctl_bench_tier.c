/*
 * ctl_bench_tier: `mooncakectl bench store --tier=ssd` — the agents' SSD
 * tiers through the agents, beside fio on the same file system in the
 * same run.
 *
 * It starts a master and two agents (ctl_bench_local.c), each with an SSD
 * tier of --ssd-size under a temporary directory of --dir, evicted past
 * half of it down to a quarter (as bench ssd keeps its store: puts do not
 * wait for deleted space to be synced) and without promotion, so every
 * get reads the tier. N client threads (--clients), a session each with a
 * buffer from mc_buffer_alloc (aligned: the agent writes and reads the
 * client's memory in place), for each value size:
 *   put    mc_put_from of a new key naming MC_TIER_SSD (into the local
 *          agent's tier);
 *   get    mc_get_into of a random key of a set put into the local
 *          agent's tier beforehand ("local"), or into the other agent's
 *          ("remote": read into its bounce region by the owner, then
 *          through the transfer engine).
 * GB/s and p50/p99 of one operation; beside each, fio with the same
 * block size, as many I/Os in flight as clients, direct I/O and io_uring
 * on a file in the same directory (sequential writes for put, synced as
 * often as the tiers sync: see ctl_fio.c; random reads for get), taking
 * turns with the agents in --rounds rounds.
 * Like bench ssd, both write their whole file once before: fio's file
 * is filled, and each agent's tier takes --ssd-size of 16 MiB values
 * through its agent, removed after (a cache tier past its first fill
 * overwrites blocks written before, which costs less than writing
 * preallocated ones). Nothing here is an assertion.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cfg.h"
#include "common/err.h"
#include "common/sysmem.h"
#include "common/util.h"
#include "ctl/ctl_bench_store.h"
#include "ctl/ctl_int.h"
#include "ssd/ssd.h"

#define MAX_SIZES 8
#define MAX_CLIENTS 64
#define GET_SET_BYTES (64u << 20) /* per client and agent, at most */

enum where { W_LOCAL, W_REMOTE };

struct tw {
	pthread_t t;
	unsigned id;
	mc_client *c;
	void *buf;
	size_t size;
	bool put;
	enum where where;
	unsigned tag, nkeys;
	uint64_t stop_ns;
	struct ctl_lat lat;
	uint64_t ops, errors;
	int first_err;
	uint32_t rnd;
};

static void tkey(char *k, size_t len, unsigned tag, const char *kind, enum where w,
		 size_t size, unsigned id, uint64_t i)
{
	snprintf(k, len, "tier/%u/%s/%d/%zu/%u/%" PRIu64, tag, kind, (int)w, size, id, i);
}

static void *tw_main(void *arg)
{
	struct tw *w = arg;
	char key[128];
	for (uint64_t i = 0;; i++) {
		uint64_t t0 = mc_now_ns();
		if (t0 >= w->stop_ns)
			break;
		int rc;
		if (w->put) {
			tkey(key, sizeof(key), w->tag, "put", W_LOCAL, w->size, w->id, i);
			struct mc_put_opts o = {.tier = MC_TIER_SSD};
			rc = mc_put_from(w->c, key, strlen(key), w->buf, w->size, &o);
		} else {
			w->rnd = w->rnd * 1103515245u + 12345u;
			tkey(key, sizeof(key), w->tag, "get", w->where, w->size, w->id,
			     (w->rnd >> 8) % w->nkeys);
			int64_t n = mc_get_into(w->c, key, strlen(key), w->buf, w->size);
			rc = n < 0 ? (int)n : n == (int64_t)w->size ? 0 : MC_EPROTOCOL;
		}
		uint64_t t1 = mc_now_ns();
		if (rc) {
			w->errors++;
			if (!w->first_err)
				w->first_err = rc;
			continue;
		}
		w->ops++;
		ctl_lat_add(&w->lat, t1 - t0);
	}
	return NULL;
}

struct ttally {
	uint64_t ops, errors;
	double secs;
	int first_err;
	struct ctl_lat lat;
	uint64_t io_n, io_ns; /* the serving tier's own I/Os meanwhile */
};

/* The I/Os of a kind the tier of the agent behind c has finished, and
 * their time; false when it cannot tell. */
static bool tier_ios(mc_client *c, bool write, uint64_t *n, uint64_t *ns)
{
	struct mc_agent_stats st;
	if (mc_agent_stats(c, &st))
		return false;
	*n = write ? st.ssd_writes : st.ssd_reads;
	*ns = write ? st.ssd_write_ns : st.ssd_read_ns;
	return true;
}

/* One round of the n clients; the I/Os the tier behind server made
 * meanwhile are added to t. */
static void tier_round(struct tw *ws, unsigned n, uint64_t ms, mc_client *server,
		       struct ttally *t)
{
	uint64_t n0 = 0, ns0 = 0, n1 = 0, ns1 = 0;
	bool ios = tier_ios(server, ws[0].put, &n0, &ns0);
	uint64_t start = mc_now_ns();
	for (unsigned i = 0; i < n; i++) {
		ws[i].stop_ns = start + ms * 1000000ull;
		ws[i].ops = ws[i].errors = 0;
		ws[i].first_err = 0;
		ws[i].lat.n = 0;
		ws[i].rnd = 2654435761u * (i + 1);
		pthread_create(&ws[i].t, NULL, tw_main, &ws[i]);
	}
	for (unsigned i = 0; i < n; i++)
		pthread_join(ws[i].t, NULL);
	t->secs += (double)(mc_now_ns() - start) / 1e9;
	if (ios && tier_ios(server, ws[0].put, &n1, &ns1)) {
		t->io_n += n1 - n0;
		t->io_ns += ns1 - ns0;
	}
	for (unsigned i = 0; i < n; i++) {
		t->ops += ws[i].ops;
		t->errors += ws[i].errors;
		if (!t->first_err)
			t->first_err = ws[i].first_err;
		for (size_t k = 0; k < ws[i].lat.n; k++)
			ctl_lat_add(&t->lat, ws[i].lat.v[k]);
	}
}

/* The get set of every client in the tier of the agent `through`. */
static int tier_populate(struct tw *ws, unsigned n, mc_client *through, enum where w,
			 size_t size, unsigned tag, unsigned nkeys)
{
	for (unsigned id = 0; id < n; id++)
		for (unsigned k = 0; k < nkeys; k++) {
			char key[128];
			tkey(key, sizeof(key), tag, "get", w, size, id, k);
			struct mc_put_opts o = {.tier = MC_TIER_SSD, .upsert = 1};
			int rc = mc_put_from(through, key, strlen(key), ws[id].buf, size, &o);
			if (rc)
				return rc;
		}
	return 0;
}

/* Write --ssd-size of 16 MiB values into the tier of the agent `through`
 * (from buf, WARM_BYTES long), then remove them. */
#define WARM_BYTES (16u << 20)
static int tier_warm_up(mc_client *through, const void *buf, uint64_t ssd_bytes, unsigned tag,
			unsigned agent)
{
	uint64_t n = ssd_bytes / WARM_BYTES;
	char key[128];
	int rc = 0;
	for (uint64_t i = 0; i < n && rc == 0; i++) {
		snprintf(key, sizeof(key), "tier/%u/warm/%u/%" PRIu64, tag, agent, i);
		struct mc_put_opts o = {.tier = MC_TIER_SSD};
		rc = mc_put_from(through, key, strlen(key), buf, WARM_BYTES, &o);
	}
	for (uint64_t i = 0; i < n; i++) {
		snprintf(key, sizeof(key), "tier/%u/warm/%u/%" PRIu64, tag, agent, i);
		/* (The tier's own eviction may have taken it already.) */
		int r = mc_remove(through, key, strlen(key), 1);
		if (r && r != MC_EOBJECT_NOT_FOUND && rc == 0)
			rc = r;
	}
	return rc;
}

/* gbps over fio's GB/s as text ("-" without fio's figure). */
static void ratio(char *buf, size_t len, double gbps, const struct ctl_fio *f)
{
	double fio = f->runs ? f->bw / f->runs / 1e9 : 0;
	if (fio > 0)
		snprintf(buf, len, "%.2f", gbps / fio);
	else
		snprintf(buf, len, "-");
}

static void tier_line(const char *vs, const char *op, const char *where, size_t size,
		      struct ttally *t, const struct ctl_fio *f, const struct ctl_fio *plain)
{
	double ops = t->secs > 0 ? (double)t->ops / t->secs : 0;
	double gbps = ops * (double)size / 1e9;
	double fio = f->runs ? f->bw / f->runs / 1e9 : 0;
	char xs[32], xp[32];
	ratio(xs, sizeof(xs), gbps, f);
	ratio(xp, sizeof(xp), gbps, plain);
	printf("%-6s %-4s %-9s %9.0f %8.2f %9.1f %9.1f %8.1f %9.2f %7s %7s %7llu %s\n", vs, op,
	       where, ops, gbps, ctl_lat_pct_us(&t->lat, 0.50), ctl_lat_pct_us(&t->lat, 0.99),
	       ctl_mean_us(t->io_ns, t->io_n), fio, xs, xp, (unsigned long long)t->errors,
	       t->first_err ? mc_strerror(t->first_err) : "");
}

static void fio_line(const char *op, const char *what, size_t size, const struct ctl_fio *f)
{
	double bw = f->runs ? f->bw / f->runs : 0;
	printf("%-6s %-4s %-9s %9.0f %8.2f %9.1f %9.1f %8.1f\n", "", op, what,
	       bw / (double)size, bw / 1e9, f->runs ? f->p50_us / f->runs : 0,
	       f->runs ? f->p99_us / f->runs : 0, f->runs ? f->mean_us / f->runs : 0);
}

int ctl_bench_tier_main(int argc, char **argv)
{
	const char *sizes_s = "1M,16M", *ops_s = "put,get", *dur_s = "3s", *v;
	const char *dir_s = "/var/tmp", *ssd_size_s = "2G";
	unsigned clients = 4, rounds = 3;
	for (int i = 1; i < argc; i++) {
		bool ok = true;
		if (ctl_flag_value(argc, argv, &i, "value-size", &v))
			ok = v && (sizes_s = v);
		else if (ctl_flag_value(argc, argv, &i, "op", &v))
			ok = v && (ops_s = v);
		else if (ctl_flag_value(argc, argv, &i, "duration", &v))
			ok = v && (dur_s = v);
		else if (ctl_flag_value(argc, argv, &i, "dir", &v))
			ok = v && (dir_s = v);
		else if (ctl_flag_value(argc, argv, &i, "ssd-size", &v))
			ok = v && (ssd_size_s = v);
		else if (ctl_flag_value(argc, argv, &i, "tier", &v))
			ok = v && strcmp(v, "ssd") == 0;
		else if (ctl_flag_value(argc, argv, &i, "clients", &v))
			ok = v && (clients = (unsigned)strtoul(v, NULL, 10)) >= 1 &&
			     clients <= MAX_CLIENTS;
		else if (ctl_flag_value(argc, argv, &i, "rounds", &v))
			ok = v && (rounds = (unsigned)strtoul(v, NULL, 10)) >= 1 &&
			     rounds <= 100;
		else
			ok = false;
		if (!ok) {
			fprintf(stderr,
				"mooncakectl bench store --tier=ssd: bad argument \"%s\" (takes "
				"--value-size, --op=put,get, --duration, --rounds, --clients "
				"1-%d, --dir, --ssd-size)\n",
				argv[i], MAX_CLIENTS);
			return CTL_EXIT_USAGE;
		}
	}
	uint64_t ms, ssd_bytes;
	size_t sizes[MAX_SIZES];
	unsigned nsizes = 0;
	char list[128];
	snprintf(list, sizeof(list), "%s", sizes_s);
	for (char *save, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		uint64_t s;
		if (nsizes == MAX_SIZES || cfg_parse_size(t, &s) || s == 0 ||
		    s > (256ull << 20)) {
			fprintf(stderr,
				"mooncakectl bench store: bad --value-size (1 to 256M each)\n");
			return CTL_EXIT_USAGE;
		}
		sizes[nsizes++] = s;
	}
	bool do_put = strstr(ops_s, "put") != NULL, do_get = strstr(ops_s, "get") != NULL;
	if (cfg_parse_duration_ms(dur_s, &ms) || ms < rounds ||
	    cfg_parse_size(ssd_size_s, &ssd_bytes) || ssd_bytes < (256u << 20) ||
	    (!do_put && !do_get)) {
		fprintf(stderr,
			"mooncakectl bench store --tier=ssd: bad --duration, --op (put, "
			"get) or --ssd-size (256M or more)\n");
		return CTL_EXIT_USAGE;
	}
	size_t maxsize = 0;
	for (unsigned i = 0; i < nsizes; i++)
		maxsize = MC_MAX(maxsize, sizes[i]);

	signal(SIGPIPE, SIG_IGN);
	char sdir[512], fiofile[600], plainfile[600];
	snprintf(sdir, sizeof(sdir), "%s/mooncake-bench-tier.XXXXXX", dir_s);
	if (!mkdtemp(sdir)) {
		fprintf(stderr, "mooncakectl bench store: mkdtemp in %s: %s\n", dir_s,
			strerror(errno));
		return CTL_EXIT_FAIL;
	}
	snprintf(fiofile, sizeof(fiofile), "%s/fio.dat", sdir);
	/* Plain fio, and all fio's writes, on a file of their own: they write
	 * blocks without the checksums that the reads of fio.dat check. */
	snprintf(plainfile, sizeof(plainfile), "%s/fio-plain.dat", sdir);
	struct ctl_local cl = {.ssd_dir = sdir, .ssd_bytes = ssd_bytes};
	mc_client *holder[2] = {NULL, NULL};
	struct tw *ws = NULL;
	int rc = -1, ret = CTL_EXIT_FAIL;
	for (int attempt = 1; attempt <= 3; attempt++) {
		rc = ctl_local_start(&cl, 256u << 20, false);
		if (rc == 0)
			rc = ctl_local_open(cl.sock[0], &holder[0], 30000);
		if (rc == 0)
			rc = ctl_local_open(cl.sock[1], &holder[1], 30000);
		if (rc == 0)
			break;
		fprintf(stderr, "bench store: mooncaked not ready (attempt %d of 3): %s\n",
			attempt, mc_strerror(rc));
		ctl_local_report_dead(&cl);
		mc_close(holder[0]);
		mc_close(holder[1]);
		holder[0] = holder[1] = NULL;
		ctl_local_stop(&cl);
		cl = (struct ctl_local){.ssd_dir = sdir, .ssd_bytes = ssd_bytes};
	}
	if (rc)
		goto out;
	ws = calloc(clients, sizeof(*ws));
	if (!ws)
		goto out;
	for (unsigned i = 0; i < clients && rc == 0; i++) {
		ws[i].id = i;
		struct mc_open_opts o = {.socket_path = cl.sock[0],
					 .client_name = "bench store"};
		rc = mc_open_ex(&o, &ws[i].c);
		if (rc == 0)
			rc = mc_buffer_alloc(ws[i].c, maxsize, &ws[i].buf);
		if (rc == 0)
			memset(ws[i].buf, (int)(0x41 + i), maxsize);
	}
	if (rc) {
		fprintf(stderr, "bench store: cannot open client sessions: %s\n",
			mc_strerror(rc));
		goto out;
	}
	printf("bench store --tier=ssd: %u clients, %s per run in %u rounds, SSD tiers of "
	       "%" PRIu64
	       " MiB (evicted past half of it, to a quarter) and fio's file in %s\n",
	       clients, dur_s, rounds, ssd_bytes >> 20, sdir);
	double fill_bw = 0;
	bool fio_ok = ctl_fio_fill(fiofile, ssd_bytes, &fill_bw);
	double plain_bw = 0;
	bool plain_fill_ok = fio_ok && ctl_fio_fill(plainfile, ssd_bytes, &plain_bw);
	unsigned tag = (unsigned)getpid();
	void *warm = NULL;
	rc = mc_buffer_alloc(ws[0].c, WARM_BYTES, &warm);
	for (unsigned w = 0; w < 2 && rc == 0; w++)
		rc = tier_warm_up(holder[w], warm, ssd_bytes, tag, w);
	if (warm)
		(void)mc_buffer_free(ws[0].c, warm);
	if (rc) {
		fprintf(stderr, "bench store: filling the tiers once: %s\n", mc_strerror(rc));
		goto out;
	}
	/* fio like the tiers: every block's CRC-32C computed or checked,
	 * and its buffers on 2 MiB pages where the agents' staging memory
	 * is (--ssd-staging-size); and fio as it runs by default. */
	bool huge = mc_thp_madvise_ok(NULL, NULL, 0), plain_ok = plain_fill_ok;
	printf("%-6s %-4s %-9s %9s %8s %9s %9s %8s %9s %7s %7s %7s\n", "size", "op", "where",
	       "ops/s", "GB/s", "p50(us)", "p99(us)", "io(us)", "fio GB/s", "x fio", "x plain",
	       "errors");
	for (unsigned si = 0; si < nsizes; si++) {
		size_t size = sizes[si];
		char vs[32];
		snprintf(vs, sizeof(vs), "%zuK", size >> 10);
		if (size >= (1u << 20))
			snprintf(vs, sizeof(vs), "%zuM", size >> 20);
		/* The get set of every client within an eighth of a tier, so
		 * that the tier's evictions (down to a quarter) leave it. */
		size_t fit = (size_t)(ssd_bytes / 8 / clients / size);
		unsigned nkeys = (unsigned)MC_MAX(
			(size_t)2, MC_MIN(MC_MIN((size_t)64, GET_SET_BYTES / size), fit));
		for (int pass = 0; pass < 2; pass++) {
			bool put = pass == 0;
			if ((put && !do_put) || (!put && !do_get))
				continue;
			unsigned nwhere = put ? 1 : 2;
			struct ttally tal[2] = {{0}};
			/* fio syncs as often as the agents' tiers do (ctl_fio.c). */
			struct ctl_fio plain = {.sync = true,
						.sync_ms = SSD_SYNC_INTERVAL_DEFAULT_MS,
						.fill_bw = fill_bw};
			struct ctl_fio fio = plain;
			fio.huge = huge;
			fio.check = !put;
			if (!put)
				for (unsigned w = 0; w < nwhere && rc == 0; w++)
					rc = tier_populate(ws, clients, holder[w],
							   (enum where)w, size, tag, nkeys);
			if (rc) {
				fprintf(stderr, "bench store: filling the get set: %s\n",
					mc_strerror(rc));
				goto out;
			}
			for (unsigned r = 0; r < rounds; r++) {
				for (unsigned w = 0; w < nwhere; w++) {
					for (unsigned i = 0; i < clients; i++) {
						ws[i].size = size;
						ws[i].put = put;
						ws[i].where = (enum where)w;
						ws[i].tag = put ? tag + 1 + r : tag;
						ws[i].nkeys = nkeys;
					}
					tier_round(ws, clients, ms / rounds,
						   holder[put ? 0 : w], &tal[w]);
				}
				if (fio_ok)
					fio_ok = ctl_fio_run(put ? plainfile : fiofile,
							     ssd_bytes, size, clients, put,
							     ms / rounds, &fio);
				if (plain_ok)
					plain_ok = ctl_fio_run(plainfile, ssd_bytes, size,
							       clients, put, ms / rounds,
							       &plain);
			}
			for (unsigned w = 0; w < nwhere; w++) {
				tier_line(vs, put ? "put" : "get", w ? "remote" : "local",
					  size, &tal[w], &fio, &plain);
				ctl_lat_free(&tal[w].lat);
			}
			if (fio.runs)
				fio_line(put ? "put" : "get", "fio", size, &fio);
			if (plain.runs)
				fio_line(put ? "put" : "get", "fio-plain", size, &plain);
			tag += 1 + rounds;
		}
	}
	printf("x fio = GB/s over fio's GB/s for the same block size and I/Os in flight (fio: "
	       "sequential writes for put, synced once per %u s as the tiers are, random reads "
	       "for get), fio run as the tiers work: the CRC-32C of every block it reads checked "
	       "(--verify=crc32c; the tiers' puts compute theirs as they copy into staging), "
	       "and its buffers on 2 MiB pages%s; x plain = the same over fio with its defaults (no checksums, buffers on "
	       "4 KiB pages). local = the client's agent's "
	       "SSD tier; remote = the other agent's, read into its bounce region and then "
	       "through the transfer engine. io(us) = the mean time of the serving tier's own "
	       "I/Os meanwhile, submitted to finished (a read's with its checksum), and of "
	       "fio's.\n",
	       SSD_SYNC_INTERVAL_DEFAULT_MS / 1000,
	       huge ? " as the tiers' staging memory is (--ssd-staging-size)"
		    : " where transparent huge pages are on (off here: 4 KiB pages, as the tiers "
		      "have no staging memory)");
	ret = CTL_EXIT_OK;
out:
	for (unsigned i = 0; ws && i < clients; i++) {
		if (ws[i].buf)
			(void)mc_buffer_free(ws[i].c, ws[i].buf);
		mc_close(ws[i].c);
		ctl_lat_free(&ws[i].lat);
	}
	free(ws);
	mc_close(holder[0]);
	mc_close(holder[1]);
	ctl_local_stop(&cl);
	unlink(fiofile);
	unlink(plainfile);
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", sdir);
	if (system(cmd) != 0)
		fprintf(stderr, "bench store: cannot remove %s\n", sdir);
	return ret;
}
