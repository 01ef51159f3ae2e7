/*
 * open: the SSD tier's store (ssd.h) opened, recovered and closed. It
 * makes or checks the files (header, size, free space), reads the index
 * back (a torn tail cut, corrupt records skipped, extents placed in seq
 * order with overlaps dropped), checks every object's bytes when asked,
 * rewrites the index when anything was dropped, and at close waits for
 * what is in flight. It calls down into store.c's table and commits
 * (ssd_int.h); nothing in store.c calls it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/extalloc.h"
#include "common/io.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "ssd/store_int.h"

#define LOG_SUBSYS LOGS_SSD

#define MIN_CAPACITY (1ull << 20)
#define DEFAULT_DEPTH 32u
#define MAX_DEPTH 1024u
#define DEFAULT_COMPACT_MIN (4ull << 20)
#define READ_WINDOW (4u << 20)         /* recovery reads the index so */
#define VERIFY_BUF_BYTES (64ull << 20) /* recovery's checks in flight */

/* ------------------------------------------------------------ open */

static int path_join(char **out, const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	if (n > PATH_MAX)
		return -ENAMETOOLONG;
	*out = malloc(n);
	if (!*out)
		return -ENOMEM;
	snprintf(*out, n, "%s/%s", dir, name);
	return 0;
}

/* Read and decode the data file's header block. */
static int read_data_hdr(struct ssd_store *s, struct ssd__hdr *h)
{
	uint8_t *blk = ssd_buf_alloc(SSD_ALIGN);
	if (!blk)
		return -ENOMEM;
	int rc = mc_pread_all(s->data_fd, blk, SSD_ALIGN, 0);
	if (rc == 0)
		rc = ssd__hdr_decode(blk, SSD_ALIGN, SSD__DATA_MAGIC, h);
	ssd_buf_free(blk, SSD_ALIGN);
	return rc;
}

static int write_data_hdr(struct ssd_store *s)
{
	uint8_t *blk = ssd_buf_alloc(SSD_ALIGN);
	if (!blk)
		return -ENOMEM;
	struct ssd__hdr h = {.magic = SSD__DATA_MAGIC,
			     .version = SSD__VERSION,
			     .block_bytes = SSD_ALIGN,
			     .store_id = s->store_id,
			     .capacity = s->capacity};
	ssd__hdr_encode(blk, &h);
	int rc = mc_pwrite_all(s->data_fd, blk, SSD_ALIGN, 0);
	if (rc == 0 && fdatasync(s->data_fd) != 0)
		rc = -errno;
	ssd_buf_free(blk, SSD_ALIGN);
	return rc;
}

/* Make the data file total bytes long, its blocks allocated. */
static int size_data_file(struct ssd_store *s, uint64_t total, bool check_free)
{
	struct stat st;
	if (fstat(s->data_fd, &st) != 0)
		return -errno;
	uint64_t have = (uint64_t)st.st_blocks * 512;
	if (total > have && check_free) {
		struct statvfs vfs;
		if (fstatvfs(s->data_fd, &vfs) != 0)
			return -errno;
		uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
		if (total - have > avail) {
			log_error("ssd-path %s: the SSD tier needs %" PRIu64 " MiB more and "
				  "the file system has %" PRIu64 " MiB free; lower ssd-size "
				  "or free space",
				  s->dir, (total - have) >> 20, avail >> 20);
			return MC_ECONFIG;
		}
	}
	if ((uint64_t)st.st_size > total && ftruncate(s->data_fd, (off_t)total) != 0)
		return -errno;
	if (total > have) {
		int rc = fallocate(s->data_fd, 0, 0, (off_t)total);
		if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
			log_warn("ssd-path %s: the file system cannot preallocate; the "
				 "data file is sparse and a full file system fails writes",
				 s->dir);
			rc = ftruncate(s->data_fd, (off_t)total);
		}
		if (rc != 0) {
			rc = -errno;
			log_error("ssd-path %s: allocating %" PRIu64 " MiB: %s", s->dir,
				  total >> 20, mc_strerror(rc));
			return rc;
		}
	}
	return 0;
}

/* Write a whole index (header + records) to ssd.index.new, sync, rename
 * over ssd.index, sync the directory. Blocks (open only). */
static int write_index_file(struct ssd_store *s, uint64_t generation, const uint8_t *recs,
			    size_t len)
{
	uint8_t hb[SSD__HDR_BYTES];
	struct ssd__hdr h = {.magic = SSD__INDEX_MAGIC,
			     .version = SSD__VERSION,
			     .block_bytes = SSD_ALIGN,
			     .store_id = s->store_id,
			     .capacity = s->capacity,
			     .generation = generation};
	ssd__hdr_encode(hb, &h);
	int fd = open(s->new_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
	if (fd < 0)
		return -errno;
	int rc = mc_pwrite_all(fd, hb, sizeof(hb), 0);
	if (!rc && len)
		rc = mc_pwrite_all(fd, recs, len, sizeof(hb));
	if (!rc && fdatasync(fd) != 0)
		rc = -errno;
	if (!rc && rename(s->new_path, s->index_path) != 0)
		rc = -errno;
	if (!rc)
		rc = mc_fsync_dir(s->dir);
	if (rc) {
		close(fd);
		unlink(s->new_path);
		return rc;
	}
	if (s->index_fd >= 0)
		close(s->index_fd);
	s->index_fd = fd;
	s->generation = generation;
	s->seed = ssd__rec_seed(s->store_id, generation);
	s->index_end = SSD__HDR_BYTES + len;
	return 0;
}

/* Rewrite the index from the table (recovery dropped something, or it is
 * mostly dead records). */
static int rewrite_index(struct ssd_store *s)
{
	struct bbuf b = {0};
	uint32_t seed = ssd__rec_seed(s->store_id, s->generation + 1);
	for (struct ssd__ent *e = s->head; e; e = e->next) {
		size_t n = ssd__rec_len(e->klen);
		if (ssd__bbuf_reserve(&b, n) < 0) {
			ssd__bbuf_free(&b);
			return -ENOMEM;
		}
		struct ssd__rec r = ssd__put_rec(e);
		ssd__rec_encode(b.p + b.len, &r, seed);
		b.len += n;
	}
	int rc = write_index_file(s, s->generation + 1, b.p, b.len);
	ssd__bbuf_free(&b);
	return rc;
}

struct recov {
	uint64_t dropped_records, torn_bytes, dropped_objects;
	uint64_t max_seq;
	bool rewrite;
};

static void apply_rec(struct ssd_store *s, struct recov *rv, const struct ssd__rec *r)
{
	if (r->seq > rv->max_seq)
		rv->max_seq = r->seq;
	struct ssd__ent *e = ssd__find(s, r->key, r->klen);
	if (r->type == SSD__REC_DEL) {
		if (e && e->seq == r->seq)
			ssd__ent_unlink(s, e), free(e);
		return;
	}
	if (e && e->seq == r->seq)
		return; /* written by a compaction's snapshot and its tail */
	if (e && e->seq > r->seq)
		return; /* an older put met after a newer one */
	if (e) {
		ssd__ent_unlink(s, e);
		free(e);
	}
	e = ssd__ent_new(r->key, r->klen);
	if (!e || ssd__ent_insert(s, e) < 0) {
		free(e);
		rv->dropped_objects++;
		rv->rewrite = true;
		return;
	}
	e->off = r->offset;
	e->size = r->size;
	e->len = ssd_io_len(r->size);
	e->crc = r->crc;
	e->seq = r->seq;
	e->state = ENT_LIVE;
	s->live_objects++;
	s->live_rec_bytes += ssd__rec_len(e->klen);
}

/* Read ssd.index: records applied to the table, a torn tail cut, a
 * corrupt stretch skipped. */
static int read_index(struct ssd_store *s, struct recov *rv)
{
	struct stat st;
	if (fstat(s->index_fd, &st) != 0)
		return -errno;
	uint64_t fsize = (uint64_t)st.st_size;
	uint8_t hb[SSD__HDR_BYTES];
	struct ssd__hdr h;
	int rc = fsize >= SSD__HDR_BYTES ? mc_pread_all(s->index_fd, hb, sizeof(hb), 0) : -EIO;
	if (rc == 0)
		rc = ssd__hdr_decode(hb, sizeof(hb), SSD__INDEX_MAGIC, &h);
	if (rc < 0 || h.store_id != s->store_id) {
		log_error("ssd-path %s: %s is %s; move the directory away or choose "
			  "another ssd-path",
			  s->dir, s->index_path,
			  rc < 0 ? "not an SSD tier index" : "another store's index");
		return MC_ECONFIG;
	}
	s->generation = h.generation;
	s->seed = ssd__rec_seed(s->store_id, h.generation);
	size_t cap = READ_WINDOW + SSD__REC_MAX_BYTES;
	uint8_t *w = malloc(cap);
	if (!w)
		return -ENOMEM;
	uint64_t pos = SSD__HDR_BYTES; /* file offset of w[0] */
	size_t have = 0, at = 0;       /* bytes in w, parse position */
	uint64_t bad_from = 0;         /* start of a stretch being skipped */
	bool skipping = false;
	for (;;) {
		if (have - at < SSD__REC_MAX_BYTES && pos + have < fsize) {
			memmove(w, w + at, have - at);
			pos += at;
			have -= at;
			at = 0;
			size_t n = (size_t)MC_MIN((uint64_t)(cap - have), fsize - pos - have);
			rc = mc_pread_all(s->index_fd, w + have, n, pos + have);
			if (rc < 0)
				break;
			have += n;
		}
		if (at >= have)
			break;
		struct ssd__rec r;
		size_t used;
		enum ssd__dec d = ssd__rec_decode(w + at, have - at, s->seed, &r, &used);
		if (d == SSD__DEC_OK) {
			if (skipping) {
				log_warn("SSD index %s: corrupt bytes %" PRIu64 "..%" PRIu64
					 " skipped (records there are lost)",
					 s->index_path, bad_from, pos + at);
				rv->dropped_records++;
				rv->rewrite = true;
				skipping = false;
			}
			apply_rec(s, rv, &r);
			at += used;
			continue;
		}
		if (!skipping) {
			skipping = true;
			bad_from = pos + at;
		}
		at += 8;
	}
	free(w);
	if (rc < 0)
		return rc;
	if (skipping) {
		/* Nothing valid after bad_from: the tail a crash cut. */
		rv->torn_bytes = fsize - bad_from;
		rv->dropped_records++;
		log_warn("SSD index %s: torn record at %" PRIu64 " (%" PRIu64
			 " bytes) cut off",
			 s->index_path, bad_from, rv->torn_bytes);
		if (ftruncate(s->index_fd, (off_t)bad_from) != 0 ||
		    fdatasync(s->index_fd) != 0)
			return -errno;
		fsize = bad_from;
	}
	s->index_end = fsize;
	return 0;
}

static int cmp_seq(const void *a, const void *b)
{
	const struct ssd__ent *x = *(struct ssd__ent *const *)a;
	const struct ssd__ent *y = *(struct ssd__ent *const *)b;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void drop_ent(struct ssd_store *s, struct recov *rv, struct ssd__ent *e,
		     const char *why)
{
	log_warn("SSD object '%.*s' (seq %" PRIu64 ", %" PRIu64 " bytes at %" PRIu64
		 ") dropped: %s",
		 (int)MC_MIN(e->klen, 64), (const char *)e->key, e->seq, e->size, e->off, why);
	ssd__ent_unlink(s, e);
	free(e);
	rv->dropped_objects++;
	rv->rewrite = true;
}

/* Order the list by seq, then give every object its extent, newest
 * first: an object outside the data area, or overlapping a newer one,
 * is dropped. */
static int place_extents(struct ssd_store *s, struct recov *rv)
{
	size_t n = 0;
	for (struct ssd__ent *e = s->head; e; e = e->next)
		n++;
	struct ssd__ent **v = malloc((n ? n : 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	n = 0;
	for (struct ssd__ent *e = s->head; e; e = e->next)
		v[n++] = e;
	qsort(v, n, sizeof(*v), cmp_seq);
	s->head = s->tail = NULL;
	for (size_t i = 0; i < n; i++) {
		v[i]->prev = s->tail;
		v[i]->next = NULL;
		if (s->tail)
			s->tail->next = v[i];
		else
			s->head = v[i];
		s->tail = v[i];
	}
	int rc = 0;
	for (size_t i = n; i-- > 0;) {
		struct ssd__ent *e = v[i];
		if (e->off > s->capacity || e->len > s->capacity - e->off) {
			drop_ent(s, rv, e, "past the end of the data area");
			continue;
		}
		rc = mc_extalloc_reserve(&s->alloc, e->off, e->len);
		if (rc == -EBUSY) {
			drop_ent(s, rv, e, "its extent overlaps a newer object's");
			rc = 0;
		} else if (rc < 0) {
			break;
		}
	}
	free(v);
	return rc;
}

struct vjob {
	struct ssd__op op;
	struct ssd__ent *e;
	struct recov *rv;
	struct ssd_store *s;
	uint8_t *buf;
	size_t cap;
	bool busy;
};

static void verify_done(struct ssd__op *op)
{
	struct vjob *j = MC_CONTAINER_OF(op, struct vjob, op);
	j->busy = false;
	if (op->result == 0)
		return;
	j->s->st.checksum_failures += op->result == MC_ECHECKSUM;
	ssd__extent_free(j->s, j->e);
	drop_ent(j->s, j->rv, j->e,
		 op->result == MC_ECHECKSUM ? "its bytes fail their checksum"
					    : mc_strerror(op->result));
}

/* Read every object and check its checksum, up to the queue depth at a
 * time (within VERIFY_BUF_BYTES of buffers). */
static int verify_all(struct ssd_store *s, struct recov *rv, unsigned depth)
{
	struct vjob *jobs = calloc(depth, sizeof(*jobs));
	if (!jobs)
		return -ENOMEM;
	int rc = 0;
	size_t per = (size_t)MC_MAX(VERIFY_BUF_BYTES / depth, SSD_ALIGN);
	per &= ~(size_t)(SSD_ALIGN - 1);
	struct ssd__ent *e = s->head;
	for (;;) {
		bool any_busy = false;
		for (unsigned i = 0; i < depth; i++) {
			struct vjob *j = &jobs[i];
			if (j->busy) {
				any_busy = true;
				continue;
			}
			if (!e)
				continue;
			/* e->next is read now: a drop in verify_done may unlink e. */
			struct ssd__ent *cur = e;
			e = e->next;
			size_t need = (size_t)MC_MAX(cur->len, per);
			if (j->cap < need) {
				ssd_buf_free(j->buf, j->cap);
				j->buf = ssd_buf_alloc(need);
				j->cap = j->buf ? need : 0;
				if (!j->buf) {
					rc = -ENOMEM;
					goto out;
				}
			}
			*j = (struct vjob){.buf = j->buf,
					   .cap = j->cap,
					   .e = cur,
					   .rv = rv,
					   .s = s,
					   .busy = true};
			j->op.kind = SSD__OP_READ;
			j->op.fd = s->data_fd;
			j->op.buf = j->buf;
			j->op.len = cur->len;
			j->op.off = SSD__DATA_START + cur->off;
			j->op.verify = true;
			j->op.want_crc = cur->crc;
			j->op.crc_len = cur->size;
			j->op.done = verify_done;
			ssd__io_submit(s->io, &j->op);
			any_busy = true;
		}
		if (!any_busy)
			break;
		ssd__io_wait(s->io, -1);
		ssd__io_reap(s->io);
	}
out:
	while (ssd__io_pending(s->io)) {
		ssd__io_wait(s->io, -1);
		ssd__io_reap(s->io);
	}
	for (unsigned i = 0; i < depth; i++)
		ssd_buf_free(jobs[i].buf, jobs[i].cap);
	free(jobs);
	return rc;
}

static int open_data(struct ssd_store *s)
{
	s->data_fd = open(s->data_path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0640);
	s->direct = true;
	if (s->data_fd < 0 && errno == EINVAL) {
		log_warn("ssd-path %s: the file system refuses direct I/O; the SSD "
			 "tier goes through the page cache",
			 s->dir);
		s->direct = false;
		s->data_fd = open(s->data_path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
	}
	return s->data_fd < 0 ? -errno : 0;
}

/* Create a new store, or take up an existing one: header checks, size. */
static int setup_files(struct ssd_store *s, const struct ssd_opts *o, bool *created)
{
	struct stat st;
	bool have_data = stat(s->data_path, &st) == 0 && st.st_size > 0;
	bool have_index = access(s->index_path, F_OK) == 0;
	int rc = open_data(s);
	if (rc < 0) {
		log_error("ssd-path %s: opening %s: %s", s->dir, s->data_path,
			  mc_strerror(rc));
		return rc;
	}
	struct ssd__hdr h;
	bool data_ok = have_data && read_data_hdr(s, &h) == 0;
	if (have_data && !data_ok && have_index) {
		log_error("ssd-path %s: %s is not an SSD tier data file (or its header "
			  "is damaged); move the directory away or choose another ssd-path",
			  s->dir, s->data_path);
		return MC_ECONFIG;
	}
	if (!have_data && have_index) {
		log_error("ssd-path %s: %s exists without its data file %s; move the "
			  "directory away or choose another ssd-path",
			  s->dir, s->index_path, s->data_path);
		return MC_ECONFIG;
	}
	if (have_data && data_ok && have_index) {
		s->store_id = h.store_id;
		if (h.capacity != s->capacity) {
			log_info("ssd-path %s: data area %" PRIu64 " MiB -> %" PRIu64 " MiB "
				 "(ssd-size)",
				 s->dir, h.capacity >> 20, s->capacity >> 20);
			rc = size_data_file(s, SSD__DATA_START + s->capacity,
					    o->check_free_space);
			if (rc == 0)
				rc = write_data_hdr(s);
			if (rc < 0)
				return rc;
		}
		*created = false;
		return 0;
	}
	/* A new store (also one whose creation a crash interrupted: a data
	 * file without an index holds no object). */
	*created = true;
	if (getrandom(&s->store_id, sizeof(s->store_id), 0) != sizeof(s->store_id))
		return -errno;
	rc = size_data_file(s, SSD__DATA_START + s->capacity, o->check_free_space);
	if (rc == 0)
		rc = write_data_hdr(s);
	if (rc == 0)
		rc = write_index_file(s, 1, NULL, 0);
	if (rc < 0 && !have_data)
		unlink(s->data_path); /* made by this open: leave nothing behind */
	return rc;
}

int ssd_open(const struct ssd_opts *o, struct ssd_store **out, struct ssd_open_report *rep)
{
	uint64_t t0 = mc_now_ms();
	memset(rep, 0, sizeof(*rep));
	uint64_t cap = o->size_bytes & ~(uint64_t)(SSD_ALIGN - 1);
	unsigned depth = o->queue_depth ? o->queue_depth : DEFAULT_DEPTH;
	if (!o->dir || !*o->dir || cap < MIN_CAPACITY || depth > MAX_DEPTH) {
		log_error("SSD tier: %s", !o->dir || !*o->dir ? "no directory"
					  : depth > MAX_DEPTH ? "queue depth above 1024"
							      : "size below 1 MiB");
		return MC_ECONFIG;
	}
	struct ssd_store *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->lock_fd = s->data_fd = s->index_fd = s->new_fd = s->stale_fd = -1;
	s->capacity = cap;
	s->next_seq = 1;
	s->compact_min = o->compact_min_bytes ? o->compact_min_bytes : DEFAULT_COMPACT_MIN;
	s->sync_interval_ns = (uint64_t)o->sync_interval_ms * 1000000ull;
	pthread_mutex_init(&s->kick_mu, NULL);
	pthread_cond_init(&s->kick_cv, NULL);
	struct recov rv = {0};
	int rc = -ENOMEM;
	s->dir = strdup(o->dir);
	if (mc_lhash_init(&s->tab, 1024) != 0 || !s->dir ||
	    path_join(&s->data_path, o->dir, "ssd.data") < 0 ||
	    path_join(&s->index_path, o->dir, "ssd.index") < 0 ||
	    path_join(&s->new_path, o->dir, "ssd.index.new") < 0)
		goto fail;
	rc = mc_mkdir_p(o->dir, 0750);
	if (rc < 0) {
		log_error("ssd-path %s: cannot create it: %s", o->dir, mc_strerror(rc));
		goto fail;
	}
	int holder = 0;
	rc = mc_lock_dir(o->dir, &s->lock_fd, &holder);
	if (rc == MC_ELOCKED) {
		log_error("ssd-path %s is in use by another process (pid %d); every "
			  "agent needs an ssd-path of its own",
			  o->dir, holder);
		goto fail;
	}
	if (rc < 0) {
		log_error("ssd-path %s: %s", o->dir, mc_strerror(rc));
		goto fail;
	}
	unlink(s->new_path); /* a compaction a crash interrupted */
	bool created = false;
	rc = setup_files(s, o, &created);
	if (rc < 0)
		goto fail;
	rc = mc_extalloc_init(&s->alloc, s->capacity, SSD_ALIGN, s->store_id);
	if (rc < 0)
		goto fail;
	s->alloc_ok = true;
	rc = ssd__io_new(o->io, depth, &s->io);
	if (rc < 0)
		goto fail;
	if (!created) {
		if (s->index_fd < 0) {
			s->index_fd = open(s->index_path, O_RDWR | O_CLOEXEC);
			if (s->index_fd < 0) {
				rc = -errno;
				log_error("ssd-path %s: opening %s: %s", o->dir, s->index_path,
					  mc_strerror(rc));
				goto fail;
			}
		}
		rc = read_index(s, &rv);
		if (rc == 0)
			rc = place_extents(s, &rv);
		if (rc == 0 && o->verify_on_open)
			rc = verify_all(s, &rv, depth);
		if (rc < 0)
			goto fail;
		s->next_seq = rv.max_seq + 1;
		if (rv.rewrite || (s->index_end >= s->compact_min &&
				   s->index_end >= 2 * (SSD__HDR_BYTES + s->live_rec_bytes))) {
			rc = rewrite_index(s);
			if (rc < 0) {
				log_error("ssd-path %s: rewriting the index: %s", o->dir,
					  mc_strerror(rc));
				goto fail;
			}
		}
	}
	rep->created = created;
	rep->direct_io = s->direct;
	rep->io = ssd__io_name(s->io);
	rep->objects = s->live_objects;
	for (struct ssd__ent *e = s->head; e; e = e->next)
		rep->bytes += e->size;
	rep->dropped_records = rv.dropped_records;
	rep->torn_bytes = rv.torn_bytes;
	rep->dropped_objects = rv.dropped_objects;
	rep->elapsed_ms = mc_now_ms() - t0;
	ssd__register_metrics(s, o->metrics);
	metric_set(s->m_bytes, (int64_t)s->capacity);
	metric_set(s->m_rec_s, (int64_t)rep->elapsed_ms);
	metric_set(s->m_rec_objects, (int64_t)rep->objects);
	metric_set(s->m_rec_dropped, (int64_t)rep->dropped_objects);
	metric_set(s->m_rec_records, (int64_t)rep->dropped_records);
	ssd__update_gauges(s);
	log_info("SSD tier %s: %s, %" PRIu64 " MiB, %" PRIu64 " objects (%" PRIu64
		 " MiB) recovered, %" PRIu64 " index records and %" PRIu64
		 " objects dropped, %s%s, %" PRIu64 " ms",
		 o->dir, created ? "created" : "opened", s->capacity >> 20, rep->objects,
		 rep->bytes >> 20, rep->dropped_records, rep->dropped_objects, rep->io,
		 s->direct ? ", direct I/O" : ", buffered I/O", rep->elapsed_ms);
	*out = s;
	return 0;
fail:
	ssd_close(s);
	return rc;
}

/* ------------------------------------------------------------ close */

void ssd_close(struct ssd_store *s)
{
	if (!s)
		return;
	s->closing = true;
	if (s->io) {
		ssd__kick_sync(s);
		for (;;) {
			ssd__maybe_commit(s);
			if (ssd__io_pending(s->io) == 0 && !s->commit_running &&
			    !s->cstep_running && !s->sync_running && s->ibuf.len == 0 &&
			    !s->waiting)
				break;
			if (s->failed && ssd__io_pending(s->io) == 0)
				break;
			ssd__io_wait(s->io, -1);
			ssd__io_reap(s->io);
		}
		ssd__io_free(s->io);
		if (!s->failed && (fdatasync(s->data_fd) != 0 || fdatasync(s->index_fd) != 0))
			log_error("SSD tier %s: final sync: %s", s->dir, strerror(errno));
	}
	if (s->stale_fd >= 0)
		close(s->stale_fd);
	if (s->compacting)
		ssd__compact_abort(s);
	for (struct ssd_req *r = s->sync_waiters; r;) {
		struct ssd_req *next = r->next;
		ssd__complete_req(r, s->failed ? s->failed : 0);
		r = next;
	}
	/* Streamed puts never fed whole: nothing of theirs is in flight. */
	while (s->streams) {
		struct ssd_req *r = s->streams;
		s->streams = r->next;
		free(r->stream);
		r->stream = NULL;
		r->ent->put_pending = false;
		ssd__complete_req(r, MC_ESHUTDOWN);
	}
	/* Puts whose records a failed store could not commit. */
	for (struct ssd_req *r = s->waiting; r;) {
		struct ssd_req *next = r->next;
		r->ent->put_pending = false;
		ssd__complete_req(r, s->failed ? s->failed : MC_ESHUTDOWN);
		r = next;
	}
	while (s->head) {
		struct ssd__ent *e = s->head;
		s->head = e->next;
		free(e);
	}
	for (int i = 0; i < 2; i++) {
		struct ssd__ent **l = i ? &s->lost : &s->dead;
		while (*l) {
			struct ssd__ent *e = *l;
			*l = e->dnext;
			free(e);
		}
	}
	ssd__bbuf_free(&s->ibuf);
	ssd__bbuf_free(&s->ctail);
	if (s->alloc_ok)
		mc_extalloc_close(&s->alloc);
	if (s->data_fd >= 0)
		close(s->data_fd);
	if (s->index_fd >= 0)
		close(s->index_fd);
	if (s->lock_fd >= 0)
		mc_unlock_dir(s->lock_fd);
	mc_lhash_free(&s->tab);
	free(s->dir);
	free(s->data_path);
	free(s->index_path);
	free(s->new_path);
	pthread_mutex_destroy(&s->kick_mu);
	pthread_cond_destroy(&s->kick_cv);
	free(s);
}
