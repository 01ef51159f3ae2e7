/*
 * ctl_bench_ssd: `mooncakectl bench ssd` — the SSD tier's store (src/ssd)
 * on this machine's disk, beside fio doing the same on the same file
 * system in the same run.
 *
 * For each value size (--value-size, default 1M,16M) and operation:
 *   put  ssd_put of a new key, --depth puts in flight; a put counts when
 *        it completes (data written with direct I/O, its record appended
 *        to the index; syncs run beside). The oldest keys are removed to
 *        keep the store within a quarter of its size, as eviction would.
 *   get  ssd_get of a random key put beforehand, --depth in flight, every
 *        value's CRC-32C checked.
 * GB/s and the p50/p99 latency of one operation (submit to callback).
 * Beside each: fio (Debian package fio) with the same block size, direct
 * I/O, io_uring and iodepth, on a file in the same directory — sequential
 * writes, with an fdatasync as often as the store's --sync-interval
 * (ctl_fio.c), and random reads — and the ratio store/fio. Both
 * write their whole file once before (a cache tier past its first fill
 * overwrites blocks written before, which costs less than writing
 * preallocated ones). The store syncs every --sync-interval as the agent
 * does (a device cache flush). The store and
 * fio take turns in --rounds rounds, so a slower moment of a shared
 * machine falls on both. Nothing here is an assertion.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cfg.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/util.h"
#include "ctl/ctl_int.h"
#include "ssd/ssd.h"

#define MAX_SIZES 8
#define MAX_DEPTH 256

struct fig {
	double bytes, secs;
	struct ctl_lat lat;
};

struct slot {
	struct ssd_req r;
	uint8_t *buf;
	uint64_t t0;
	bool busy;
	char key[32];
	struct bench *b;
};

struct bench {
	struct ssd_store *s;
	uint64_t vsize;
	unsigned depth;
	struct slot slots[MAX_DEPTH];
	uint64_t next_key, oldest_key; /* keys [oldest, next) are stored */
	uint64_t keep_bytes;
	struct fig *fig;
	int err;
};

static void key_name(char *out, uint64_t i)
{
	snprintf(out, 32, "b/%" PRIu64, i);
}

static void on_op(struct ssd_req *r)
{
	struct slot *sl = r->data;
	struct bench *b = sl->b;
	sl->busy = false;
	if (r->status == MC_ECANCELLED)
		return; /* a put the bench removed to make room */
	if (r->status < 0) {
		if (!b->err)
			b->err = r->status;
		return;
	}
	b->fig->bytes += (double)b->vsize;
	ctl_lat_add(&b->fig->lat, mc_now_ns() - sl->t0);
}

/* Poll until some removed space came back (or deadline_ms passes). */
static bool wait_reclaim(struct bench *b, uint64_t deadline_ms)
{
	struct ssd_stats st0, st;
	ssd_stats(b->s, &st0);
	while (mc_now_ms() < deadline_ms) {
		ssd_wait(b->s, 50);
		ssd_poll(b->s);
		ssd_stats(b->s, &st);
		if (st.used_bytes < st0.used_bytes || st.used_bytes == 0)
			return true;
	}
	return false;
}

static void on_synced(struct ssd_req *r)
{
	*(bool *)r->data = true;
}

/* Everything removed: sync now (not at the interval's end) and poll until
 * the space is back (30 s at most). */
static void wait_empty(struct ssd_store *s)
{
	bool synced = false;
	struct ssd_req r = {.data = &synced};
	if (ssd_sync(s, &r, on_synced) < 0)
		synced = true;
	for (uint64_t end = mc_now_ms() + 30000; mc_now_ms() < end;) {
		struct ssd_stats st;
		ssd_stats(s, &st);
		if (synced && st.used_bytes == 0)
			break;
		ssd_wait(s, 50);
		ssd_poll(s);
	}
	while (!synced) { /* r must outlive its callback */
		ssd_wait(s, 50);
		ssd_poll(s);
	}
}

/* Start a put of the next key in sl; removes the oldest keys while full. */
static int start_put(struct bench *b, struct slot *sl)
{
	/* Keep the stored keys within a quarter of the store, as eviction by a
	 * watermark would, so that removed space is back (synced) before it
	 * is needed. */
	while ((b->next_key - b->oldest_key + 1) * ssd_io_len(b->vsize) > b->keep_bytes) {
		char k[32];
		key_name(k, b->oldest_key++);
		int rc = ssd_remove(b->s, k, strlen(k));
		if (rc < 0 && rc != MC_EOBJECT_NOT_FOUND)
			return rc;
	}
	for (;;) {
		key_name(sl->key, b->next_key);
		sl->r.data = sl;
		sl->t0 = mc_now_ns();
		int rc = ssd_put(b->s, &sl->r, sl->key, strlen(sl->key), sl->buf, b->vsize,
				 crc32c(0, sl->buf, b->vsize), on_op);
		if (rc == 0) {
			b->next_key++;
			sl->busy = true;
			return 0;
		}
		if (rc != MC_ENO_SPACE)
			return rc;
		if (b->oldest_key >= b->next_key) {
			/* Removed already: the space comes back with their sync. */
			if (!wait_reclaim(b, mc_now_ms() + 10000))
				return rc;
			continue;
		}
		char k[32];
		key_name(k, b->oldest_key++);
		rc = ssd_remove(b->s, k, strlen(k));
		if (rc < 0 && rc != MC_EOBJECT_NOT_FOUND)
			return rc;
		if (rc == 0) {
			/* Its space comes back once the removal is synced. */
			ssd_wait(b->s, 100);
			ssd_poll(b->s);
		}
	}
}

static uint64_t rnd(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static int start_get(struct bench *b, struct slot *sl, uint64_t *rng)
{
	for (int tries = 0; tries < 64; tries++) {
		uint64_t n = b->next_key - b->oldest_key;
		if (n == 0)
			return MC_EOBJECT_NOT_FOUND;
		key_name(sl->key, b->oldest_key + rnd(rng) % n);
		sl->r.data = sl;
		sl->t0 = mc_now_ns();
		int rc = ssd_get(b->s, &sl->r, sl->key, strlen(sl->key), sl->buf,
				 ssd_io_len(b->vsize), on_op);
		if (rc == 0) {
			sl->busy = true;
			return 0;
		}
		if (rc != MC_EOBJECT_NOT_FOUND)
			return rc;
	}
	return MC_EOBJECT_NOT_FOUND;
}

/* Run puts or gets for ms milliseconds into f. */
static int run_store(struct bench *b, bool put, uint64_t ms, struct fig *f)
{
	uint64_t rng = 0x9e3779b97f4a7c15ull ^ b->next_key;
	b->fig = f;
	b->err = 0;
	uint64_t t0 = mc_now_ns(), end = t0 + ms * 1000000ull;
	bool stop = false;
	for (;;) {
		if (mc_now_ns() >= end)
			stop = true;
		unsigned busy = 0;
		for (unsigned i = 0; i < b->depth; i++) {
			struct slot *sl = &b->slots[i];
			if (!sl->busy && !stop && !b->err) {
				int rc = put ? start_put(b, sl) : start_get(b, sl, &rng);
				if (rc < 0 && !b->err)
					b->err = rc;
			}
			busy += sl->busy;
		}
		if (busy == 0)
			break;
		ssd_wait(b->s, 100);
		ssd_poll(b->s);
	}
	f->secs += (double)(mc_now_ns() - t0) / 1e9;
	return b->err;
}

/* Fill the store with 4 MiB values once, then empty it. */
static int warm_up(struct bench *b, uint64_t bytes)
{
	uint8_t *buf = ssd_buf_alloc(4u << 20);
	if (!buf)
		return -ENOMEM;
	uint64_t vs = b->vsize, keep = b->keep_bytes;
	unsigned depth = b->depth;
	struct slot saved[MAX_DEPTH];
	memcpy(saved, b->slots, sizeof(saved));
	b->vsize = 4u << 20;
	b->keep_bytes = bytes;
	if (b->depth > 8)
		b->depth = 8;
	for (unsigned i = 0; i < b->depth; i++) {
		b->slots[i] = (struct slot){.buf = buf, .b = b};
	}
	struct fig f = {0};
	int rc = 0;
	while (rc == 0 && (b->next_key - b->oldest_key + b->depth) * b->vsize <= bytes)
		rc = run_store(b, true, 100, &f);
	ctl_lat_free(&f.lat);
	while (rc == 0 && b->oldest_key < b->next_key) {
		char k[32];
		key_name(k, b->oldest_key++);
		int r = ssd_remove(b->s, k, strlen(k));
		if (r < 0 && r != MC_EOBJECT_NOT_FOUND)
			rc = r;
	}
	if (rc == 0)
		wait_empty(b->s);
	memcpy(b->slots, saved, sizeof(saved));
	b->vsize = vs;
	b->keep_bytes = keep;
	b->depth = depth;
	ssd_buf_free(buf, 4u << 20);
	if (rc < 0)
		fprintf(stderr, "mooncakectl bench ssd: filling the store: %s\n",
			mc_strerror(rc));
	return rc;
}

/* ---------------------------------------------------------------- main */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mooncakectl bench ssd [--dir=DIR] [--size=SIZE] [--value-size=SIZE[,SIZE...]]\n"
		"                            [--op=put,get] [--depth=N] [--duration=DURATION]\n"
		"                            [--rounds=N] [--io=auto|uring|threads] [--fio=on|off]\n"
		"                            [--sync-interval=DURATION]\n\n"
		"  --dir=DIR          where the store and fio's file go: a temporary directory\n"
		"                     made in DIR, removed at the end (default /var/tmp)\n"
		"  --size=SIZE        the store's data area and fio's file (default 2G)\n"
		"  --value-size=...   value sizes (default 1M,16M)\n"
		"  --depth=N          operations in flight (default 16)\n"
		"  --duration=D       per operation and size, split over the rounds (default 3s)\n"
		"  --rounds=N         store and fio take turns N times (default 3)\n"
		"  --io=KIND          the store's I/O engine (default auto: io_uring)\n"
		"  --sync-interval=D  least time between the store's syncs (default 5s, the\n"
		"                     agent's ssd-sync-interval; 0: back to back)\n"
		"  --fio=off          skip fio\n\n"
		"The SSD tier's store on this file system: put (durable: data and index\n"
		"synced) and get (checksum checked) GB/s and p50/p99 per operation, beside\n"
		"fio with the same block size, direct I/O, io_uring and depth on the same\n"
		"file system (sequential writes synced as often as --sync-interval, random\n"
		"reads), and the ratio.\n");
}

int ctl_bench_ssd_main(int argc, char **argv)
{
	const char *dir_s = "/var/tmp", *size_s = "2G", *vs = "1M,16M", *ops = "put,get";
	const char *dur_s = "3s", *v, *io_s = "auto";
	unsigned depth = 16, rounds = 3, sync_ms = SSD_SYNC_INTERVAL_DEFAULT_MS;
	bool use_fio = true;
	for (int i = 1; i < argc; i++) {
		bool ok = true;
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return CTL_EXIT_OK;
		} else if (ctl_flag_value(argc, argv, &i, "dir", &v)) {
			dir_s = v;
		} else if (ctl_flag_value(argc, argv, &i, "size", &v)) {
			size_s = v;
		} else if (ctl_flag_value(argc, argv, &i, "value-size", &v)) {
			vs = v;
		} else if (ctl_flag_value(argc, argv, &i, "op", &v)) {
			ops = v;
		} else if (ctl_flag_value(argc, argv, &i, "duration", &v)) {
			dur_s = v;
		} else if (ctl_flag_value(argc, argv, &i, "io", &v)) {
			io_s = v;
		} else if (ctl_flag_value(argc, argv, &i, "depth", &v)) {
			depth = v ? (unsigned)strtoul(v, NULL, 10) : 0;
			ok = depth >= 1 && depth <= MAX_DEPTH;
		} else if (ctl_flag_value(argc, argv, &i, "sync-interval", &v)) {
			uint64_t x;
			ok = v && cfg_parse_duration_ms(v, &x) == 0 && x <= 60000;
			sync_ms = ok ? (unsigned)x : 0;
		} else if (ctl_flag_value(argc, argv, &i, "rounds", &v)) {
			rounds = v ? (unsigned)strtoul(v, NULL, 10) : 0;
			ok = rounds >= 1 && rounds <= 100;
		} else if (ctl_flag_value(argc, argv, &i, "fio", &v)) {
			ok = v && (strcmp(v, "on") == 0 || strcmp(v, "off") == 0);
			use_fio = ok && strcmp(v, "on") == 0;
		} else {
			ok = false;
		}
		if (!ok) {
			fprintf(stderr, "mooncakectl bench ssd: bad argument \"%s\"\n",
				argv[i]);
			usage(stderr);
			return CTL_EXIT_USAGE;
		}
	}
	uint64_t size, ms, sizes[MAX_SIZES];
	unsigned nsizes = 0;
	enum ssd_io_kind io = strcmp(io_s ? io_s : "", "uring") == 0     ? SSD_IO_URING
			      : strcmp(io_s ? io_s : "", "threads") == 0 ? SSD_IO_THREADS
									 : SSD_IO_AUTO;
	if (!dir_s || !*dir_s || !size_s || cfg_parse_size(size_s, &size) ||
	    size < (64u << 20) || !dur_s || cfg_parse_duration_ms(dur_s, &ms) || ms == 0 ||
	    !vs || !ops || !io_s || (io == SSD_IO_AUTO && strcmp(io_s, "auto") != 0)) {
		fprintf(stderr, "mooncakectl bench ssd: bad --dir, --size (64M or more), "
				"--duration or --io\n");
		return CTL_EXIT_USAGE;
	}
	char list[256];
	snprintf(list, sizeof(list), "%s", vs);
	for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
		if (nsizes == MAX_SIZES || cfg_parse_size(t, &sizes[nsizes]) ||
		    sizes[nsizes] == 0 || sizes[nsizes] > size / 4) {
			fprintf(stderr,
				"mooncakectl bench ssd: bad --value-size \"%s\" (at most "
				"--size/4)\n",
				t);
			return CTL_EXIT_USAGE;
		}
		nsizes++;
	}
	bool do_put = strstr(ops, "put") != NULL, do_get = strstr(ops, "get") != NULL;
	if (!do_put && !do_get) {
		fprintf(stderr, "mooncakectl bench ssd: --op wants put, get or both\n");
		return CTL_EXIT_USAGE;
	}

	char dir[512], sdir[600], fiofile[600];
	snprintf(dir, sizeof(dir), "%s/mooncake-bench-ssd.XXXXXX", dir_s);
	if (!mkdtemp(dir)) {
		fprintf(stderr, "mooncakectl bench ssd: mkdtemp in %s: %s\n", dir_s,
			strerror(errno));
		return CTL_EXIT_FAIL;
	}
	snprintf(sdir, sizeof(sdir), "%s/store", dir);
	snprintf(fiofile, sizeof(fiofile), "%s/fio.dat", dir);
	/* The store and fio's file must both fit: half the size each. */
	uint64_t half = (size / 2) & ~(uint64_t)(SSD_ALIGN - 1);
	struct ssd_opts o = {.dir = sdir,
			     .size_bytes = half,
			     .queue_depth = depth,
			     .io = io,
			     .check_free_space = true,
			     .sync_interval_ms = sync_ms};
	struct ssd_open_report rep;
	static struct bench b;
	memset(&b, 0, sizeof(b));
	int rc = ssd_open(&o, &b.s, &rep);
	int ret = CTL_EXIT_FAIL;
	if (rc < 0) {
		fprintf(stderr, "mooncakectl bench ssd: opening the store in %s: %s\n", sdir,
			mc_strerror(rc));
		goto out;
	}
	b.depth = depth;
	b.keep_bytes = half / 4;
	printf("ssd bench: %s, %s, depth %u, store %" PRIu64 " MiB and fio file %" PRIu64
	       " MiB in %s, %u rounds\n",
	       rep.io, rep.direct_io ? "direct I/O" : "buffered I/O (no O_DIRECT here)", depth,
	       half >> 20, half >> 20, dir, rounds);
	/* Both write their whole file once first: writes to blocks written
	 * before cost less than to preallocated ones (no extent conversion),
	 * and a cache tier past its first fill only overwrites. */
	double fill_bw = 0;
	if (warm_up(&b, half) < 0 || (use_fio && !ctl_fio_fill(fiofile, half, &fill_bw)))
		goto out;

	printf("%-4s %6s  %10s %9s %9s  %10s %9s %9s  %6s\n", "op", "value", "store GB/s",
	       "p50 us", "p99 us", "fio GB/s", "p50 us", "p99 us", "ratio");
	for (unsigned z = 0; z < nsizes; z++) {
		uint64_t vsz = sizes[z];
		b.vsize = vsz;
		for (unsigned i = 0; i < depth; i++) {
			b.slots[i].b = &b;
			b.slots[i].buf = ssd_buf_alloc(ssd_io_len(vsz));
			if (!b.slots[i].buf) {
				fprintf(stderr, "mooncakectl bench ssd: out of memory\n");
				goto out;
			}
			for (uint64_t k = 0; k < vsz; k += 8)
				memcpy(b.slots[i].buf + k,
				       &(uint64_t){k * 0x9e3779b97f4a7c15ull + i},
				       MC_MIN(8, vsz - k));
		}
		for (int pass = 0; pass < 2; pass++) {
			bool put = pass == 0;
			if ((put && !do_put) || (!put && !do_get))
				continue;
			if (!put && b.next_key == b.oldest_key) {
				/* Gets need objects: fill half the store. */
				struct fig fill = {0};
				while ((b.next_key - b.oldest_key + depth) * ssd_io_len(vsz) <
					       b.keep_bytes &&
				       run_store(&b, true, 200, &fill) == 0)
					;
				ctl_lat_free(&fill.lat);
			}
			struct fig f = {0};
			/* fio syncs as often as the store does (ctl_fio.c). */
			struct ctl_fio ff = {
				.sync = true, .sync_ms = sync_ms, .fill_bw = fill_bw};
			bool fio_ok = use_fio;
			for (unsigned r = 0; r < rounds; r++) {
				rc = run_store(&b, put, ms / rounds, &f);
				if (rc < 0) {
					fprintf(stderr, "mooncakectl bench ssd: %s: %s\n",
						put ? "put" : "get", mc_strerror(rc));
					goto out;
				}
				if (fio_ok)
					fio_ok = ctl_fio_run(fiofile, half, vsz, depth, put,
							     ms / rounds, &ff);
			}
			char vname[32];
			if (vsz >= (1u << 20) && vsz % (1u << 20) == 0)
				snprintf(vname, sizeof(vname), "%" PRIu64 "M", vsz >> 20);
			else
				snprintf(vname, sizeof(vname), "%" PRIu64 "K", vsz >> 10);
			double gbs = f.bytes / f.secs / 1e9;
			double p50 = ctl_lat_pct_us(&f.lat, 0.50),
			       p99 = ctl_lat_pct_us(&f.lat, 0.99);
			if (fio_ok && ff.runs) {
				double fg = ff.bw / ff.runs / 1e9;
				printf("%-4s %6s  %10.2f %9.0f %9.0f  %10.2f %9.0f %9.0f  %6.2f\n",
				       put ? "put" : "get", vname, gbs, p50, p99, fg,
				       ff.p50_us / ff.runs, ff.p99_us / ff.runs,
				       fg > 0 ? gbs / fg : 0);
			} else {
				printf("%-4s %6s  %10.2f %9.0f %9.0f  %10s %9s %9s  %6s\n",
				       put ? "put" : "get", vname, gbs, p50, p99, "-", "-",
				       "-", "-");
			}
			fflush(stdout);
			ctl_lat_free(&f.lat);
		}
		/* Empty the store for the next size. */
		while (b.oldest_key < b.next_key) {
			char k[32];
			key_name(k, b.oldest_key++);
			int r = ssd_remove(b.s, k, strlen(k));
			(void)r; /* a key already removed by a failed get */
		}
		wait_empty(b.s);
		for (unsigned i = 0; i < depth; i++) {
			ssd_buf_free(b.slots[i].buf, ssd_io_len(vsz));
			b.slots[i].buf = NULL;
		}
	}
	printf("put: written and in the index (survives kill -9), data and index synced every "
	       "%u ms (a device cache flush);\n     fio: direct writes synced as often.\n     get: checksum "
	       "checked; fio: random direct reads.\n",
	       sync_ms);
	ret = CTL_EXIT_OK;
out:
	ssd_close(b.s);
	for (unsigned i = 0; i < MAX_DEPTH; i++)
		ssd_buf_free(b.slots[i].buf, ssd_io_len(b.vsize));
	char cmd[700];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "mooncakectl bench ssd: could not remove %s\n", dir);
	return ret;
}
