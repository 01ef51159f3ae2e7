/*
 * libmooncake: the client side of proto/client.proto. See mooncake.h.
 *
 * One connection per handle. Requests from many threads are pipelined:
 * each caller sends its frame (under send_mu) and waits for the response
 * with its id. Whoever waits first becomes the reader and reads frames
 * off the socket, handing each response to its waiter, until its own has
 * come; then another waiter takes over (leader/follower, so no thread of
 * the library's own).
 *
 * The staging buffer (a memfd from the agent, mapped here) is carved by a
 * first-fit allocator into per-request blocks: values to put are copied
 * into a block, gets are told to put values there. What does not fit
 * travels in a temporary memfd attached to the request, or comes back in
 * one the agent attaches to the reply.
 */
#include "common/err.h"
#include "common/io.h"
#include "common/uframe.h"
#include "client.pb-c.h"
#include "client/mooncake.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define MC__PUBLIC __attribute__((visibility("default")))

#define PROTOCOL_VERSION 1u
#define ALIGN 64u
#define HUGE_ALIGN ((size_t)2 << 20)
#define MAX_REPLY_FDS MC_UFRAME_MAX_FDS

typedef Mooncake__Client__Request Request;
typedef Mooncake__Client__Response Response;
typedef Mooncake__Client__Region Region;

enum range_kind { R_ALLOC, R_MEMFD, R_SHADOW };

struct range {
	uint8_t *addr;
	size_t len;
	uint64_t id;          /* the agent's buffer id (0 for shadow) */
	enum range_kind kind;
	void *map_base;       /* R_ALLOC: the whole reservation */
	size_t map_len;
};

struct block {
	size_t off, len;
};

/* Spill buffers: at most this many, of at most this many bytes in all. */
#define SPILL_SLOTS 4
#define SPILL_MAX_BYTES ((size_t)256 << 20)
#define SPILL_ALIGN ((size_t)2 << 20)

struct waiter {
	struct waiter *next;
	uint64_t id;
	bool done;
	Response *resp;
	int fds[MAX_REPLY_FDS];
	unsigned nfds;
};

struct mc_client {
	int fd;
	pthread_mutex_t mu;      /* everything below but rx */
	pthread_mutex_t send_mu; /* frame writes */
	pthread_cond_t cv;
	bool reader;             /* a thread is reading frames */
	int broken;              /* sticky error of the connection */
	uint64_t next_id;
	struct waiter *waiters;
	struct mc_uframe_rx rx;  /* the reader's only */
	uint8_t *stg;
	size_t stg_len;
	struct block *blocks;    /* allocated staging blocks, by offset */
	size_t nblocks, blocks_cap;
	struct range *ranges;
	size_t nranges, ranges_cap;
	const uint8_t *seg;      /* read-only mapping of the agent segment */
	size_t seg_len;
	char agent_addr[128];
	uint64_t segment_size;
	bool verify_gets;        /* every get checks the bytes' checksum */
	/* Buffers (mc_buffer_alloc) kept to receive gets without a
	 * destination that do not fit in the staging memfd: reused, so a
	 * big value is not a fresh memfd whose every page faults on both
	 * sides (spill_take). busy: offered to a get in flight, or holding
	 * the bytes of a view. */
	struct spill_buf {
		uint8_t *buf;
		size_t cap;
		bool busy;
	} spills[SPILL_SLOTS];
};

struct mc_view {
	uint64_t id;      /* the agent's view id (mapped), 0 for a copy */
	void *copy;
	int spill;        /* the spill buffer holding its bytes, or -1 */
	int64_t blk;      /* or the staging block holding them, or -1 */
};

MC__PUBLIC const char *mc_version(void)
{
	return MC_VERSION;
}

/* ------------------------------------------------------------ calls */

static void waiter_unlink(mc_client *c, struct waiter *w)
{
	for (struct waiter **pp = &c->waiters; *pp; pp = &(*pp)->next)
		if (*pp == w) {
			*pp = w->next;
			return;
		}
}

static void waiter_clear(struct waiter *w)
{
	if (w->resp)
		mooncake__client__response__free_unpacked(w->resp, NULL);
	for (unsigned i = 0; i < w->nfds; i++)
		if (w->fds[i] >= 0)
			close(w->fds[i]);
	w->resp = NULL;
	w->nfds = 0;
}

/* Read until one response is dispatched. Called by the reader only,
 * without mu. Returns 0 or the error that breaks the connection. */
static int read_one(mc_client *c)
{
	for (;;) {
		const uint8_t *body;
		size_t len;
		int rc = mc_uframe_rx_next(&c->rx, &body, &len);
		if (rc < 0)
			return MC_EPROTOCOL;
		if (rc == 1) {
			Response *resp = mooncake__client__response__unpack(NULL, len, body);
			if (!resp)
				return MC_EPROTOCOL;
			int fds[MAX_REPLY_FDS];
			unsigned nf = resp->nfds;
			if (nf > MAX_REPLY_FDS || mc_uframe_rx_take_fds(&c->rx, nf, fds) != 0) {
				mooncake__client__response__free_unpacked(resp, NULL);
				return MC_EPROTOCOL;
			}
			pthread_mutex_lock(&c->mu);
			struct waiter *w = c->waiters;
			while (w && w->id != resp->id)
				w = w->next;
			if (w && !w->done) {
				w->resp = resp;
				memcpy(w->fds, fds, nf * sizeof(int));
				w->nfds = nf;
				w->done = true;
				resp = NULL;
				nf = 0;
			}
			pthread_mutex_unlock(&c->mu);
			if (resp)
				mooncake__client__response__free_unpacked(resp, NULL);
			for (unsigned i = 0; i < nf; i++)
				close(fds[i]);
			return 0;
		}
		/* Wait in poll, not in a blocking recvmsg: a thread asleep in
		 * recvmsg on a Unix socket is woken each time the agent
		 * consumes one of our frames (write space on the same wait
		 * queue), poll sleeps only until there is something to read. */
		struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
		if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
			return MC_EUNAVAILABLE;
		ssize_t n = mc_uframe_rx_read(&c->rx, c->fd, MSG_DONTWAIT);
		if (n == -EAGAIN)
			continue;
		if (n == 0)
			return MC_EUNAVAILABLE;
		if (n == MC_EPROTOCOL)
			return MC_EPROTOCOL;
		if (n < 0)
			return n == -ENOMEM ? -ENOMEM : MC_EUNAVAILABLE;
	}
}

/*
 * Send req with fds and wait for its response in *w (req->id and
 * req->nfds are set here). Returns 0 with w->resp set (its error field
 * may be non-zero), or MC_EUNAVAILABLE / -ENOMEM / -EMSGSIZE.
 */
static int call(mc_client *c, Request *req, const int *fds, unsigned nfds,
		struct waiter *w)
{
	memset(w, 0, sizeof(*w));
	pthread_mutex_lock(&c->mu);
	if (c->broken) {
		pthread_mutex_unlock(&c->mu);
		return MC_EUNAVAILABLE;
	}
	w->id = ++c->next_id;
	w->next = c->waiters;
	c->waiters = w;
	pthread_mutex_unlock(&c->mu);

	req->id = w->id;
	req->nfds = nfds;
	size_t n = mooncake__client__request__get_packed_size(req);
	int rc = 0;
	uint8_t small[512];
	uint8_t *buf = n <= sizeof(small) ? small : malloc(n);
	if (n > MC_UFRAME_MAX_BYTES)
		rc = -EMSGSIZE;
	else if (!buf)
		rc = -ENOMEM;
	if (rc == 0) {
		mooncake__client__request__pack(req, buf);
		pthread_mutex_lock(&c->send_mu);
		rc = mc_uframe_send_all(c->fd, buf, n, fds, nfds);
		pthread_mutex_unlock(&c->send_mu);
	}
	if (buf != small)
		free(buf);
	pthread_mutex_lock(&c->mu);
	if (rc == -EMSGSIZE || rc == -ENOMEM) {
		waiter_unlink(c, w);
		pthread_mutex_unlock(&c->mu);
		return rc;
	}
	if (rc) {
		c->broken = MC_EUNAVAILABLE;
		pthread_cond_broadcast(&c->cv);
	}
	while (!w->done && !c->broken) {
		if (!c->reader) {
			c->reader = true;
			pthread_mutex_unlock(&c->mu);
			int err = read_one(c);
			pthread_mutex_lock(&c->mu);
			c->reader = false;
			if (err)
				c->broken = err;
			pthread_cond_broadcast(&c->cv);
		} else {
			pthread_cond_wait(&c->cv, &c->mu);
		}
	}
	waiter_unlink(c, w);
	bool done = w->done;
	pthread_mutex_unlock(&c->mu);
	return done ? 0 : MC_EUNAVAILABLE;
}

/* Send req without waiting for a response (the reader drops one if it
 * comes). For requests whose outcome nobody can act on. */
static void send_only(mc_client *c, Request *req)
{
	pthread_mutex_lock(&c->mu);
	bool broken = c->broken != 0;
	req->id = ++c->next_id;
	pthread_mutex_unlock(&c->mu);
	if (broken)
		return;
	req->nfds = 0;
	size_t n = mooncake__client__request__get_packed_size(req);
	uint8_t small[512];
	uint8_t *buf = n <= sizeof(small) ? small : malloc(n);
	if (!buf)
		return;
	mooncake__client__request__pack(req, buf);
	pthread_mutex_lock(&c->send_mu);
	int rc = mc_uframe_send_all(c->fd, buf, n, NULL, 0);
	pthread_mutex_unlock(&c->send_mu);
	if (buf != small)
		free(buf);
	if (rc) {
		pthread_mutex_lock(&c->mu);
		c->broken = MC_EUNAVAILABLE;
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
	}
}

/* ------------------------------------------------------------ staging */

/* First-fit block of len bytes (64-byte aligned) under mu; -1 if none. */
static int64_t stg_alloc_locked(mc_client *c, size_t len)
{
	len = (len + ALIGN - 1) & ~(size_t)(ALIGN - 1);
	if (len == 0 || len > c->stg_len)
		return -1;
	if (c->nblocks == c->blocks_cap) {
		size_t cap = c->blocks_cap ? c->blocks_cap * 2 : 16;
		struct block *p = realloc(c->blocks, cap * sizeof(*p));
		if (!p)
			return -1;
		c->blocks = p;
		c->blocks_cap = cap;
	}
	size_t prev_end = 0;
	for (size_t i = 0; i <= c->nblocks; i++) {
		size_t next = i < c->nblocks ? c->blocks[i].off : c->stg_len;
		if (next - prev_end >= len) {
			memmove(&c->blocks[i + 1], &c->blocks[i],
				(c->nblocks - i) * sizeof(*c->blocks));
			c->blocks[i].off = prev_end;
			c->blocks[i].len = len;
			c->nblocks++;
			return (int64_t)prev_end;
		}
		if (i < c->nblocks)
			prev_end = c->blocks[i].off + c->blocks[i].len;
	}
	return -1;
}

static int64_t stg_alloc(mc_client *c, size_t len)
{
	pthread_mutex_lock(&c->mu);
	int64_t off = stg_alloc_locked(c, len);
	pthread_mutex_unlock(&c->mu);
	return off;
}

/* The largest free gap, then allocate up to want bytes of it. */
static int64_t stg_alloc_upto(mc_client *c, size_t want, size_t *got)
{
	pthread_mutex_lock(&c->mu);
	size_t best = 0, prev_end = 0;
	for (size_t i = 0; i <= c->nblocks; i++) {
		size_t next = i < c->nblocks ? c->blocks[i].off : c->stg_len;
		if (next - prev_end > best)
			best = next - prev_end;
		if (i < c->nblocks)
			prev_end = c->blocks[i].off + c->blocks[i].len;
	}
	best &= ~(size_t)(ALIGN - 1);
	size_t len = want < best ? want : best;
	int64_t off = len ? stg_alloc_locked(c, len) : -1;
	pthread_mutex_unlock(&c->mu);
	*got = off >= 0 ? len : 0;
	return off;
}

static void stg_free(mc_client *c, int64_t off)
{
	if (off < 0)
		return;
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < c->nblocks; i++)
		if (c->blocks[i].off == (size_t)off) {
			memmove(&c->blocks[i], &c->blocks[i + 1],
				(c->nblocks - i - 1) * sizeof(*c->blocks));
			c->nblocks--;
			break;
		}
	pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------ memory */

/* A memfd of len bytes sealed against shrinking, holding data (when not
 * NULL). Returns the descriptor or a negative errno. */
static int tmp_memfd(size_t len)
{
	int fd = memfd_create("mooncake-value", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)(len ? len : 1)) != 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

/* The agent-mapped range holding [p, p + len), under mu. */
static const struct range *find_agent_range(mc_client *c, const void *p, size_t len)
{
	const uint8_t *a = p;
	for (size_t i = 0; i < c->nranges; i++) {
		const struct range *r = &c->ranges[i];
		if (r->kind == R_SHADOW)
			continue;
		if (a >= r->addr && (size_t)(a - r->addr) <= r->len &&
		    len <= r->len - (size_t)(a - r->addr))
			return r;
	}
	return NULL;
}

/* Region of agent-mapped memory for [p, p + len): true if there is one. */
static bool agent_region(mc_client *c, const void *p, size_t len, Region *g)
{
	if (!p)
		return false;
	pthread_mutex_lock(&c->mu);
	const struct range *r = find_agent_range(c, p, len);
	if (r) {
		g->where = MOONCAKE__CLIENT__REGION__WHERE__BUFFER;
		g->buffer = r->id;
		g->offset = (uint64_t)((const uint8_t *)p - r->addr);
		g->length = len;
	}
	pthread_mutex_unlock(&c->mu);
	return r != NULL;
}

static bool key_ok(size_t klen)
{
	return klen >= 1 && klen <= MC_MAX_KEY_BYTES;
}

/* ------------------------------------------------------------ open */

static int find_socket(char *out, size_t len)
{
	const char *env = getenv("MOONCAKE_SOCKET");
	if (env && *env) {
		snprintf(out, len, "%s", env);
		return 0;
	}
	if (access("/run/mooncake/agent.sock", F_OK) == 0) {
		snprintf(out, len, "/run/mooncake/agent.sock");
		return 0;
	}
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (xdg && *xdg) {
		char p[4096];
		snprintf(p, sizeof(p), "%s/mooncake/agent.sock", xdg);
		if (access(p, F_OK) == 0) {
			snprintf(out, len, "%s", p);
			return 0;
		}
	}
	return -ENOENT;
}

static int hello(mc_client *c, const struct mc_open_opts *o)
{
	Mooncake__Client__Hello h = MOONCAKE__CLIENT__HELLO__INIT;
	h.version = PROTOCOL_VERSION;
	h.staging_size = o->staging_bytes;
	h.client_name = (char *)(o->client_name ? o->client_name : "");
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_HELLO;
	req.hello = &h;
	struct waiter w;
	int rc = call(c, &req, NULL, 0, &w);
	if (rc)
		return rc;
	const Response *r = w.resp;
	if (r->error) {
		rc = r->error;
	} else if (r->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_HELLO || w.nfds != 1 ||
		   r->hello->staging_size == 0) {
		rc = MC_EPROTOCOL;
	} else {
		struct stat st;
		size_t len = r->hello->staging_size;
		if (fstat(w.fds[0], &st) != 0 || (uint64_t)st.st_size < len) {
			rc = MC_EPROTOCOL;
		} else {
			void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, w.fds[0], 0);
			if (p == MAP_FAILED) {
				rc = -errno;
			} else {
				c->stg = p;
				c->stg_len = len;
				snprintf(c->agent_addr, sizeof(c->agent_addr), "%s",
					 r->hello->rpc_address ? r->hello->rpc_address : "");
				c->segment_size = r->hello->segment_size;
			}
		}
	}
	waiter_clear(&w);
	return rc;
}

MC__PUBLIC int mc_open_ex(const struct mc_open_opts *opts, mc_client **out)
{
	struct mc_open_opts o = opts ? *opts : (struct mc_open_opts){0};
	char path[4096];
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int rc;
	if (o.socket_path && *o.socket_path)
		snprintf(path, sizeof(path), "%s", o.socket_path);
	else if ((rc = find_socket(path, sizeof(path))) != 0)
		return rc;
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path));
	mc_client *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		rc = -errno;
		goto out_free;
	}
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		rc = -errno;
		goto out_close;
	}
	rc = mc_uframe_rx_init(&c->rx, MC_UFRAME_MAX_BYTES);
	if (rc)
		goto out_close;
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->send_mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	rc = hello(c, &o);
	if (rc) {
		mc_close(c);
		return rc;
	}
	c->verify_gets = o.verify_gets != 0;
	*out = c;
	return 0;

out_close:
	close(c->fd);
out_free:
	free(c);
	return rc;
}

MC__PUBLIC int mc_open(const char *socket_path, mc_client **out)
{
	struct mc_open_opts o = {.socket_path = socket_path};
	return mc_open_ex(&o, out);
}

MC__PUBLIC void mc_close(mc_client *c)
{
	if (!c)
		return;
	close(c->fd);
	for (size_t i = 0; i < c->nranges; i++)
		if (c->ranges[i].kind == R_ALLOC)
			munmap(c->ranges[i].map_base, c->ranges[i].map_len);
	free(c->ranges);
	free(c->blocks);
	if (c->stg)
		munmap(c->stg, c->stg_len);
	if (c->seg)
		munmap((void *)c->seg, c->seg_len);
	mc_uframe_rx_free(&c->rx);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->send_mu);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

MC__PUBLIC const char *mc_agent_address(const mc_client *c)
{
	return c->agent_addr;
}

MC__PUBLIC uint64_t mc_segment_size(const mc_client *c)
{
	return c->segment_size;
}

MC__PUBLIC uint64_t mc_staging_size(const mc_client *c)
{
	return c->stg_len;
}

/* ------------------------------------------------------------ put */

MC__PUBLIC int mc_batch_put(mc_client *c, size_t n, const void *const *keys,
			    const size_t *klens, const void *const *values,
			    const size_t *lens, const struct mc_put_opts *opts,
			    int *results)
{
	if (n == 0)
		return 0;
	Mooncake__Client__PutItem *items = calloc(n, sizeof(*items));
	Mooncake__Client__PutItem **ptrs = calloc(n, sizeof(*ptrs));
	Region *regs = calloc(n, sizeof(*regs));
	int64_t *blk = malloc(n * sizeof(*blk));
	size_t *map = malloc(n * sizeof(*map)); /* request position -> item */
	int rc = 0, tfd = -1;
	size_t nreq = 0;
	if (!items || !ptrs || !regs || !blk || !map) {
		rc = -ENOMEM;
		goto out;
	}
	/* Where each value comes from: in place, staging, or one memfd for
	 * all that do not fit. */
	uint64_t spill = 0;
	for (size_t i = 0; i < n; i++) {
		blk[i] = -1;
		results[i] = 0;
		if (!key_ok(klens[i])) {
			results[i] = -EINVAL;
			continue;
		}
		Region *g = &regs[i];
		mooncake__client__region__init(g);
		if (lens[i] == 0 || agent_region(c, values[i], lens[i], g)) {
			g->length = lens[i];
		} else if ((blk[i] = stg_alloc(c, lens[i])) >= 0) {
			memcpy(c->stg + blk[i], values[i], lens[i]);
			g->offset = (uint64_t)blk[i];
			g->length = lens[i];
		} else {
			g->where = MOONCAKE__CLIENT__REGION__WHERE__ATTACHED;
			g->fd_index = 0;
			g->offset = spill;
			g->length = lens[i];
			spill += lens[i];
		}
		mooncake__client__put_item__init(&items[i]);
		items[i].key.data = (uint8_t *)keys[i];
		items[i].key.len = klens[i];
		items[i].source = g;
		ptrs[nreq] = &items[i];
		map[nreq] = i;
		nreq++;
	}
	if (nreq == 0)
		goto out;
	if (spill) {
		tfd = tmp_memfd(spill);
		if (tfd < 0) {
			rc = tfd;
			goto out;
		}
		for (size_t i = 0; i < n; i++)
			if (!results[i] && regs[i].where == MOONCAKE__CLIENT__REGION__WHERE__ATTACHED &&
			    (rc = mc_pwrite_all(tfd, values[i], lens[i], regs[i].offset)) != 0)
				goto out;
	}
	Mooncake__Client__PutRequest p = MOONCAKE__CLIENT__PUT_REQUEST__INIT;
	p.items = ptrs;
	p.n_items = nreq;
	if (opts) {
		p.replica_num = opts->replica_num;
		p.soft_pin = opts->soft_pin != 0;
		p.ttl_ms = opts->ttl_ms;
		p.preferred_segment = (char *)(opts->preferred_segment ? opts->preferred_segment : "");
		p.upsert = opts->upsert != 0;
	}
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_PUT;
	req.put = &p;
	struct waiter w;
	rc = call(c, &req, tfd >= 0 ? &tfd : NULL, tfd >= 0 ? 1 : 0, &w);
	if (rc == 0) {
		const Response *r = w.resp;
		if (r->error)
			rc = r->error;
		else if (r->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_PUT ||
			 r->put->n_errors != nreq)
			rc = MC_EPROTOCOL;
		else
			for (size_t k = 0; k < nreq; k++)
				results[map[k]] = r->put->errors[k];
		waiter_clear(&w);
	}
out:
	if (blk)
		for (size_t i = 0; i < n; i++)
			stg_free(c, blk[i]);
	if (tfd >= 0)
		close(tfd);
	free(items);
	free(ptrs);
	free(regs);
	free(blk);
	free(map);
	return rc;
}

MC__PUBLIC int mc_put(mc_client *c, const void *key, size_t klen, const void *value,
		      size_t len, const struct mc_put_opts *opts)
{
	int res = 0;
	int rc = mc_batch_put(c, 1, &key, &klen, &value, &len, opts, &res);
	return rc ? rc : res;
}

MC__PUBLIC int mc_put_from(mc_client *c, const void *key, size_t klen, const void *buf,
			   size_t len, const struct mc_put_opts *opts)
{
	return mc_put(c, key, klen, buf, len, opts);
}

/* ------------------------------------------------------------ get */

struct get_item {
	const void *key;
	size_t klen;
	void *buf;        /* destination, or NULL: allocate */
	size_t cap;
	bool zero_copy;
	/* out */
	int err;
	size_t size;
	void *alloc;      /* allocated copy */
	uint64_t view;    /* mapped view id */
	const void *mapped;
	int spill;        /* zero_copy: the spill buffer mapped holds, or -1 */
	int64_t view_blk; /* ... or the staging block it holds, or -1 */
	int64_t blk;      /* staging block used as the item's dest */
};

/* The largest spill buffer not in use, now busy; -1 if none. */
static int spill_take(mc_client *c)
{
	int best = -1;
	pthread_mutex_lock(&c->mu);
	for (int i = 0; i < SPILL_SLOTS; i++)
		if (c->spills[i].buf && !c->spills[i].busy &&
		    (best < 0 || c->spills[i].cap > c->spills[best].cap))
			best = i;
	if (best >= 0)
		c->spills[best].busy = true;
	pthread_mutex_unlock(&c->mu);
	return best;
}

static void spill_give(mc_client *c, int i)
{
	if (i < 0)
		return;
	pthread_mutex_lock(&c->mu);
	c->spills[i].busy = false;
	pthread_mutex_unlock(&c->mu);
}

/* A get needed a fresh memfd of len bytes: keep a buffer that size for
 * the next ones — in an empty slot, or instead of the smallest free one
 * when that is smaller — within SPILL_MAX_BYTES. Best effort. */
static void spill_grow(mc_client *c, size_t len)
{
	size_t cap = (len + SPILL_ALIGN - 1) & ~(SPILL_ALIGN - 1);
	int slot = -1;
	size_t total = 0;
	pthread_mutex_lock(&c->mu);
	for (int i = 0; i < SPILL_SLOTS; i++) {
		total += c->spills[i].cap;
		if (!c->spills[i].buf && slot < 0)
			slot = i;
	}
	for (int i = 0; i < SPILL_SLOTS && slot < 0; i++)
		if (!c->spills[i].busy && c->spills[i].cap < cap &&
		    (slot < 0 || c->spills[i].cap < c->spills[slot].cap))
			slot = i;
	uint8_t *old = NULL;
	if (slot >= 0 && cap <= SPILL_MAX_BYTES && total - c->spills[slot].cap + cap <= SPILL_MAX_BYTES) {
		old = c->spills[slot].buf;
		c->spills[slot].buf = NULL;
		c->spills[slot].cap = 0;
		c->spills[slot].busy = true; /* being replaced */
	} else {
		slot = -1;
	}
	pthread_mutex_unlock(&c->mu);
	if (slot < 0)
		return;
	if (old)
		(void)mc_buffer_free(c, old);
	void *buf = NULL;
	int rc = mc_buffer_alloc(c, cap, &buf);
	pthread_mutex_lock(&c->mu);
	c->spills[slot].buf = rc ? NULL : buf;
	c->spills[slot].cap = rc ? 0 : cap;
	c->spills[slot].busy = false;
	pthread_mutex_unlock(&c->mu);
}

/* Map the segment read-only once (its descriptor came with a reply). */
static int map_segment(mc_client *c, int fd)
{
	struct stat st;
	if (fstat(fd, &st) != 0)
		return -errno;
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	pthread_mutex_lock(&c->mu);
	if (c->seg) {
		munmap(p, (size_t)st.st_size);
	} else {
		c->seg = p;
		c->seg_len = (size_t)st.st_size;
	}
	pthread_mutex_unlock(&c->mu);
	return 0;
}

/* Deliver size bytes at src to the item: its buffer, or a new one. */
static void deliver(struct get_item *it, const void *src)
{
	if (it->buf) {
		if (it->size > it->cap) {
			it->err = -ENOBUFS;
			return;
		}
		if (it->size && it->buf != src)
			memcpy(it->buf, src, it->size);
		return;
	}
	it->alloc = malloc(it->size ? it->size : 1);
	if (!it->alloc) {
		it->err = -ENOMEM;
		return;
	}
	if (it->size)
		memcpy(it->alloc, src, it->size);
}

/* verify: check the bytes against the objects' checksums (so does every
 * get of a session opened with verify_gets). */
static int do_get(mc_client *c, struct get_item *its, size_t n, bool verify)
{
	Mooncake__Client__GetItem *items = calloc(n, sizeof(*items));
	Mooncake__Client__GetItem **ptrs = calloc(n, sizeof(*ptrs));
	Region *regs = calloc(n, sizeof(*regs));
	size_t *map = malloc(n * sizeof(*map));
	int rc = 0;
	size_t nreq = 0;
	int64_t spill_blk = -1;
	int spill_buf = -1;       /* or the spill buffer offered */
	uint8_t *spill_map = NULL;
	size_t spill_len = 0;
	struct waiter w = {0};
	bool have_w = false;
	for (size_t i = 0; i < n; i++) {
		its[i].spill = -1;
		its[i].view_blk = -1;
	}
	if (!items || !ptrs || !regs || !map) {
		rc = -ENOMEM;
		goto out;
	}
	bool need_spill = false;
	for (size_t i = 0; i < n; i++) {
		struct get_item *it = &its[i];
		it->blk = -1;
		it->err = 0;
		if (!key_ok(it->klen)) {
			it->err = -EINVAL;
			continue;
		}
		mooncake__client__get_item__init(&items[i]);
		items[i].key.data = (uint8_t *)it->key;
		items[i].key.len = it->klen;
		items[i].zero_copy = it->zero_copy;
		Region *g = &regs[i];
		mooncake__client__region__init(g);
		if (it->buf && agent_region(c, it->buf, it->cap, g)) {
			items[i].dest = g;
		} else if (it->buf && it->cap && (it->blk = stg_alloc(c, it->cap)) >= 0) {
			g->offset = (uint64_t)it->blk;
			g->length = it->cap;
			items[i].dest = g;
		} else {
			need_spill = true;
		}
		ptrs[nreq] = &items[i];
		map[nreq] = i;
		nreq++;
	}
	if (nreq == 0)
		goto out;
	Region spill = MOONCAKE__CLIENT__REGION__INIT;
	Mooncake__Client__GetRequest g = MOONCAKE__CLIENT__GET_REQUEST__INIT;
	g.items = ptrs;
	g.n_items = nreq;
	g.verify = verify || c->verify_gets;
	/* Items without a destination land in a spill buffer when one is
	 * free, else in a part of the staging memfd, else (too big) in a
	 * memfd the agent makes for this reply. */
	if (need_spill && (spill_buf = spill_take(c)) >= 0) {
		if (agent_region(c, c->spills[spill_buf].buf, c->spills[spill_buf].cap, &spill)) {
			g.spill = &spill;
		} else {
			spill_give(c, spill_buf);
			spill_buf = -1;
		}
	}
	if (need_spill && spill_buf < 0) {
		size_t want = c->stg_len / 4 > 65536 ? c->stg_len / 4 : 65536;
		size_t got;
		spill_blk = stg_alloc_upto(c, want, &got);
		if (spill_blk >= 0) {
			spill.offset = (uint64_t)spill_blk;
			spill.length = got;
			g.spill = &spill;
		}
	}
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_GET;
	req.get = &g;
	rc = call(c, &req, NULL, 0, &w);
	if (rc)
		goto out;
	have_w = true;
	const Response *r = w.resp;
	if (r->error) {
		rc = r->error;
		goto out;
	}
	if (r->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_GET || r->get->n_results != nreq) {
		rc = MC_EPROTOCOL;
		goto out;
	}
	unsigned fdi = 0;
	int spill_fd = -1;
	bool any_spill = false;
	for (size_t k = 0; k < nreq; k++)
		any_spill |= r->get->results[k]->where == MOONCAKE__CLIENT__GET_RESULT__WHERE__SPILL;
	if (any_spill) {
		if (fdi >= w.nfds) {
			rc = MC_EPROTOCOL;
			goto out;
		}
		spill_fd = w.fds[fdi++];
		struct stat st;
		if (fstat(spill_fd, &st) != 0) {
			rc = -errno;
			goto out;
		}
		spill_len = (size_t)st.st_size;
		void *p = mmap(NULL, spill_len, PROT_READ, MAP_SHARED, spill_fd, 0);
		if (p == MAP_FAILED) {
			rc = -errno;
			goto out;
		}
		spill_map = p;
	}
	if (r->get->segment_fd) {
		if (fdi >= w.nfds) {
			rc = MC_EPROTOCOL;
			goto out;
		}
		rc = map_segment(c, w.fds[fdi++]);
		if (rc)
			goto out;
	}
	for (size_t k = 0; k < nreq; k++) {
		const Mooncake__Client__GetResult *res = r->get->results[k];
		struct get_item *it = &its[map[k]];
		it->size = res->size;
		if (res->error) {
			it->err = res->error;
			continue;
		}
		const uint8_t *src = NULL;
		switch (res->where) {
		case MOONCAKE__CLIENT__GET_RESULT__WHERE__DEST:
			if (it->blk >= 0)
				src = c->stg + it->blk;
			else
				src = it->buf; /* written in place */
			break;
		case MOONCAKE__CLIENT__GET_RESULT__WHERE__STAGING: {
			/* (The spill region offered: a spill buffer or staging.) */
			const uint8_t *base = spill_buf >= 0 ? c->spills[spill_buf].buf : c->stg;
			size_t blen = spill_buf >= 0 ? c->spills[spill_buf].cap : c->stg_len;
			if (res->offset > blen || it->size > blen - res->offset) {
				it->err = MC_EPROTOCOL;
			} else if (it->zero_copy && !it->buf && nreq == 1 &&
				   (spill_buf >= 0 || spill_blk >= 0)) {
				/* A view of a replica elsewhere: its bytes stay in
				 * the spill buffer or staging block until the view
				 * is released. */
				it->mapped = base + res->offset;
				it->spill = spill_buf;
				it->view_blk = spill_buf >= 0 ? -1 : spill_blk;
				spill_buf = -1;
				if (it->view_blk >= 0)
					spill_blk = -1;
				continue;
			} else {
				src = base + res->offset;
			}
			break;
		}
		case MOONCAKE__CLIENT__GET_RESULT__WHERE__SPILL:
			if (!spill_map || res->offset > spill_len ||
			    it->size > spill_len - res->offset)
				it->err = MC_EPROTOCOL;
			else
				src = spill_map + res->offset;
			break;
		case MOONCAKE__CLIENT__GET_RESULT__WHERE__MAPPED:
			if (!c->seg || res->offset > c->seg_len ||
			    it->size > c->seg_len - res->offset) {
				it->err = MC_EPROTOCOL;
			} else {
				it->mapped = c->seg + res->offset;
				it->view = res->view;
			}
			continue;
		default:
			it->err = MC_EPROTOCOL;
			break;
		}
		if (!it->err)
			deliver(it, src);
	}
out:
	if (spill_map)
		munmap(spill_map, spill_len);
	if (have_w)
		waiter_clear(&w);
	stg_free(c, spill_blk);
	spill_give(c, spill_buf);
	if (spill_map && rc == 0)
		spill_grow(c, spill_len); /* (spill_map only says one was made) */
	for (size_t i = 0; i < n; i++)
		stg_free(c, its[i].blk);
	free(items);
	free(ptrs);
	free(regs);
	free(map);
	return rc;
}

MC__PUBLIC int mc_get_ex(mc_client *c, const void *key, size_t klen, void **value,
			 size_t *len, const struct mc_get_opts *opts)
{
	struct get_item it = {.key = key, .klen = klen};
	int rc = do_get(c, &it, 1, opts && opts->verify);
	if (rc == 0)
		rc = it.err;
	if (rc) {
		free(it.alloc);
		return rc;
	}
	*value = it.alloc;
	*len = it.size;
	return 0;
}

MC__PUBLIC int mc_get(mc_client *c, const void *key, size_t klen, void **value,
		      size_t *len)
{
	return mc_get_ex(c, key, klen, value, len, NULL);
}

MC__PUBLIC int64_t mc_get_into_ex(mc_client *c, const void *key, size_t klen, void *buf,
				  size_t cap, const struct mc_get_opts *opts)
{
	struct get_item it = {.key = key, .klen = klen, .buf = buf, .cap = cap};
	int rc = do_get(c, &it, 1, opts && opts->verify);
	if (rc == 0)
		rc = it.err;
	return rc ? rc : (int64_t)it.size;
}

MC__PUBLIC int64_t mc_get_into(mc_client *c, const void *key, size_t klen, void *buf,
			       size_t cap)
{
	return mc_get_into_ex(c, key, klen, buf, cap, NULL);
}

MC__PUBLIC int mc_batch_get(mc_client *c, size_t n, const void *const *keys,
			    const size_t *klens, void **values, size_t *lens, int *results)
{
	struct get_item *its = calloc(n ? n : 1, sizeof(*its));
	if (!its)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		its[i].key = keys[i];
		its[i].klen = klens[i];
	}
	int rc = do_get(c, its, n, false);
	for (size_t i = 0; i < n; i++) {
		if (rc || its[i].err) {
			free(its[i].alloc);
			values[i] = NULL;
			lens[i] = 0;
			results[i] = rc ? rc : its[i].err;
		} else {
			values[i] = its[i].alloc;
			lens[i] = its[i].size;
			results[i] = 0;
		}
	}
	free(its);
	return rc;
}

MC__PUBLIC int mc_batch_get_into(mc_client *c, size_t n, const void *const *keys,
				 const size_t *klens, void *const *bufs, const size_t *caps,
				 int64_t *results)
{
	struct get_item *its = calloc(n ? n : 1, sizeof(*its));
	if (!its)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		its[i].key = keys[i];
		its[i].klen = klens[i];
		its[i].buf = bufs[i];
		its[i].cap = caps[i];
	}
	int rc = do_get(c, its, n, false);
	for (size_t i = 0; i < n; i++)
		results[i] = rc ? rc : its[i].err ? its[i].err : (int64_t)its[i].size;
	free(its);
	return rc;
}

MC__PUBLIC int mc_get_view(mc_client *c, const void *key, size_t klen, const void **data,
			   size_t *len, mc_view **view)
{
	mc_view *v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	struct get_item it = {.key = key, .klen = klen, .zero_copy = true};
	int rc = do_get(c, &it, 1, false);
	if (rc == 0)
		rc = it.err;
	v->spill = it.spill;
	v->blk = it.view_blk;
	if (rc) {
		free(it.alloc);
		spill_give(c, it.spill);
		stg_free(c, it.view_blk);
		free(v);
		return rc;
	}
	if (it.spill >= 0 || it.view_blk >= 0) {
		*data = it.mapped;
	} else if (it.mapped) {
		v->id = it.view;
		*data = it.mapped;
	} else {
		v->copy = it.alloc;
		*data = it.alloc;
	}
	*len = it.size;
	*view = v;
	return 0;
}

MC__PUBLIC int mc_view_is_mapped(const mc_view *v)
{
	return v && v->id != 0;
}

MC__PUBLIC void mc_view_release(mc_client *c, mc_view *v)
{
	if (!v)
		return;
	if (v->id) {
		Mooncake__Client__ReleaseRequest q = MOONCAKE__CLIENT__RELEASE_REQUEST__INIT;
		q.views = &v->id;
		q.n_views = 1;
		q.quiet = true; /* no answer to read */
		Request req = MOONCAKE__CLIENT__REQUEST__INIT;
		req.op_case = MOONCAKE__CLIENT__REQUEST__OP_RELEASE;
		req.release = &q;
		send_only(c, &req);
	}
	spill_give(c, v->spill);
	stg_free(c, v->blk);
	free(v->copy);
	free(v);
}

/* ------------------------------------------------------------ keys */

static int keys_call(mc_client *c, int op, size_t n, const void *const *keys,
		     const size_t *klens, int force, int *results)
{
	ProtobufCBinaryData *k = calloc(n ? n : 1, sizeof(*k));
	size_t *map = malloc((n ? n : 1) * sizeof(*map));
	size_t nreq = 0;
	int rc = 0;
	if (!k || !map) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		results[i] = 0;
		if (!key_ok(klens[i])) {
			results[i] = -EINVAL;
			continue;
		}
		k[nreq].data = (uint8_t *)keys[i];
		k[nreq].len = klens[i];
		map[nreq++] = i;
	}
	if (nreq == 0)
		goto out;
	Mooncake__Client__KeysRequest q = MOONCAKE__CLIENT__KEYS_REQUEST__INIT;
	q.keys = k;
	q.n_keys = nreq;
	q.force = force != 0;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = op;
	if (op == MOONCAKE__CLIENT__REQUEST__OP_EXIST)
		req.exist = &q;
	else
		req.remove = &q;
	struct waiter w;
	rc = call(c, &req, NULL, 0, &w);
	if (rc)
		goto out;
	const Response *r = w.resp;
	if (r->error)
		rc = r->error;
	else if (r->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_KEYS ||
		 r->keys->n_results != nreq)
		rc = MC_EPROTOCOL;
	else
		for (size_t j = 0; j < nreq; j++)
			results[map[j]] = r->keys->results[j];
	waiter_clear(&w);
out:
	free(k);
	free(map);
	return rc;
}

MC__PUBLIC int mc_batch_exist(mc_client *c, size_t n, const void *const *keys,
			      const size_t *klens, int *results)
{
	return keys_call(c, MOONCAKE__CLIENT__REQUEST__OP_EXIST, n, keys, klens, 0, results);
}

MC__PUBLIC int mc_batch_remove(mc_client *c, size_t n, const void *const *keys,
			       const size_t *klens, int force, int *results)
{
	return keys_call(c, MOONCAKE__CLIENT__REQUEST__OP_REMOVE, n, keys, klens, force,
			 results);
}

MC__PUBLIC int mc_exist(mc_client *c, const void *key, size_t klen)
{
	int res = 0;
	int rc = mc_batch_exist(c, 1, &key, &klen, &res);
	return rc ? rc : res;
}

MC__PUBLIC int mc_remove(mc_client *c, const void *key, size_t klen, int force)
{
	int res = 0;
	int rc = mc_batch_remove(c, 1, &key, &klen, force, &res);
	return rc ? rc : res;
}

MC__PUBLIC int64_t mc_remove_all(mc_client *c, int force)
{
	Mooncake__Client__RemoveAllRequest q = MOONCAKE__CLIENT__REMOVE_ALL_REQUEST__INIT;
	q.force = force != 0;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_REMOVE_ALL;
	req.remove_all = &q;
	struct waiter w;
	int rc = call(c, &req, NULL, 0, &w);
	if (rc)
		return rc;
	int64_t out;
	if (w.resp->error)
		out = w.resp->error;
	else if (w.resp->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_REMOVE_ALL)
		out = MC_EPROTOCOL;
	else
		out = (int64_t)w.resp->remove_all->removed;
	waiter_clear(&w);
	return out;
}

MC__PUBLIC int mc_agent_stats(mc_client *c, struct mc_agent_stats *out)
{
	memset(out, 0, sizeof(*out));
	Mooncake__Client__Empty q = MOONCAKE__CLIENT__EMPTY__INIT;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_STATS;
	req.stats = &q;
	struct waiter w;
	int rc = call(c, &req, NULL, 0, &w);
	if (rc)
		return rc;
	const Mooncake__Client__StatsReply *s = w.resp->stats;
	if (w.resp->error)
		rc = w.resp->error;
	else if (w.resp->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_STATS)
		rc = MC_EPROTOCOL;
	else {
		snprintf(out->agent_id, sizeof(out->agent_id), "%s", s->agent_id);
		snprintf(out->master, sizeof(out->master), "%s", s->master);
		out->master_view = s->view;
		out->segment_size = s->segment_size;
		out->hugepages = s->hugepages;
		out->numa_node = s->numa_node;
		out->staging_size = s->staging_size;
		out->clients = s->clients;
		out->buffers = s->buffers;
		out->views = s->views;
		out->puts = s->puts;
		out->gets = s->gets;
		out->local_hits = s->local_hits;
		out->remote_hits = s->remote_hits;
		out->misses = s->misses;
		out->bytes_written = s->bytes_written;
		out->bytes_read = s->bytes_read;
		out->inventory = s->inventory;
		out->get_bad = s->get_bad;
		out->resync_bad = s->resync_bad;
	}
	waiter_clear(&w);
	return rc;
}

/* ------------------------------------------------------------ buffers */

/* Add a range under mu. Errors: -EEXIST (overlap), -ENOMEM. */
static int range_add_locked(mc_client *c, const struct range *r)
{
	for (size_t i = 0; i < c->nranges; i++) {
		const struct range *o = &c->ranges[i];
		if (r->addr < o->addr + o->len && o->addr < r->addr + r->len)
			return -EEXIST;
	}
	if (c->nranges == c->ranges_cap) {
		size_t cap = c->ranges_cap ? c->ranges_cap * 2 : 8;
		struct range *p = realloc(c->ranges, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		c->ranges = p;
		c->ranges_cap = cap;
	}
	c->ranges[c->nranges++] = *r;
	return 0;
}

/* Remove the range starting at addr under mu; *out gets it. */
static int range_del_locked(mc_client *c, const void *addr, struct range *out)
{
	for (size_t i = 0; i < c->nranges; i++)
		if (c->ranges[i].addr == addr) {
			*out = c->ranges[i];
			c->ranges[i] = c->ranges[--c->nranges];
			return 0;
		}
	return -ENOENT;
}

static int unregister_id(mc_client *c, uint64_t id)
{
	Mooncake__Client__BufferRequest q = MOONCAKE__CLIENT__BUFFER_REQUEST__INIT;
	q.buffer = id;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_UNREGISTER_BUFFER;
	req.unregister_buffer = &q;
	struct waiter w;
	int rc = call(c, &req, NULL, 0, &w);
	if (rc)
		return rc;
	rc = w.resp->error;
	waiter_clear(&w);
	return rc;
}

MC__PUBLIC int mc_buffer_alloc(mc_client *c, size_t len, void **buf)
{
	if (len == 0)
		return -EINVAL;
	/* Reserve address space, 2 MiB aligned (the agent may use huge
	 * pages), and tell the agent the address peers will use. */
	size_t rlen = ((len + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1)) + HUGE_ALIGN;
	void *base = mmap(NULL, rlen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			  -1, 0);
	if (base == MAP_FAILED)
		return -errno;
	uint8_t *addr = (uint8_t *)(((uintptr_t)base + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1));
	Mooncake__Client__AllocBufferRequest q = MOONCAKE__CLIENT__ALLOC_BUFFER_REQUEST__INIT;
	q.length = len;
	q.address = (uint64_t)(uintptr_t)addr;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_ALLOC_BUFFER;
	req.alloc_buffer = &q;
	struct waiter w;
	int rc = call(c, &req, NULL, 0, &w);
	if (rc) {
		munmap(base, rlen);
		return rc;
	}
	uint64_t id = 0;
	if (w.resp->error) {
		rc = w.resp->error;
	} else if (w.resp->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_BUFFER || w.nfds != 1) {
		rc = MC_EPROTOCOL;
	} else {
		id = w.resp->buffer->buffer;
		struct stat st;
		if (fstat(w.fds[0], &st) != 0 || (uint64_t)st.st_size < len ||
		    (uint64_t)st.st_size > rlen - (size_t)(addr - (uint8_t *)base)) {
			rc = MC_EPROTOCOL;
		} else if (mmap(addr, (size_t)st.st_size, PROT_READ | PROT_WRITE,
				MAP_SHARED | MAP_FIXED, w.fds[0], 0) == MAP_FAILED) {
			rc = -errno;
		}
	}
	waiter_clear(&w);
	if (rc == 0) {
		struct range r = {addr, len, id, R_ALLOC, base, rlen};
		pthread_mutex_lock(&c->mu);
		rc = range_add_locked(c, &r);
		pthread_mutex_unlock(&c->mu);
	}
	if (rc) {
		if (id)
			(void)unregister_id(c, id);
		munmap(base, rlen);
		return rc;
	}
	*buf = addr;
	return 0;
}

MC__PUBLIC int mc_buffer_free(mc_client *c, void *buf)
{
	struct range r;
	pthread_mutex_lock(&c->mu);
	int rc = range_del_locked(c, buf, &r);
	if (rc == 0 && r.kind != R_ALLOC) {
		(void)range_add_locked(c, &r);
		rc = -ENOENT;
	}
	pthread_mutex_unlock(&c->mu);
	if (rc)
		return rc;
	rc = unregister_id(c, r.id);
	munmap(r.map_base, r.map_len);
	return rc;
}

MC__PUBLIC int mc_register_memfd(mc_client *c, int fd, uint64_t offset, void *addr,
				 size_t len)
{
	if (len == 0 || !addr)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	int rc = 0;
	for (size_t i = 0; i < c->nranges && !rc; i++) {
		const struct range *o = &c->ranges[i];
		if ((uint8_t *)addr < o->addr + o->len && o->addr < (uint8_t *)addr + len)
			rc = -EEXIST;
	}
	pthread_mutex_unlock(&c->mu);
	if (rc)
		return rc;
	Mooncake__Client__RegisterBufferRequest q = MOONCAKE__CLIENT__REGISTER_BUFFER_REQUEST__INIT;
	q.offset = offset;
	q.length = len;
	q.address = (uint64_t)(uintptr_t)addr;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_REGISTER_BUFFER;
	req.register_buffer = &q;
	struct waiter w;
	rc = call(c, &req, &fd, 1, &w);
	if (rc)
		return rc;
	uint64_t id = 0;
	if (w.resp->error)
		rc = w.resp->error;
	else if (w.resp->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_BUFFER)
		rc = MC_EPROTOCOL;
	else
		id = w.resp->buffer->buffer;
	waiter_clear(&w);
	if (rc)
		return rc;
	struct range r = {addr, len, id, R_MEMFD, NULL, 0};
	pthread_mutex_lock(&c->mu);
	rc = range_add_locked(c, &r);
	pthread_mutex_unlock(&c->mu);
	if (rc)
		(void)unregister_id(c, id);
	return rc;
}

MC__PUBLIC int mc_register_buffer(mc_client *c, void *addr, size_t len)
{
	if (len == 0 || !addr)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	int rc = 0;
	/* Inside a buffer of the session already: nothing to do. */
	if (find_agent_range(c, addr, len)) {
		pthread_mutex_unlock(&c->mu);
		return 0;
	}
	struct range r = {addr, len, 0, R_SHADOW, NULL, 0};
	rc = range_add_locked(c, &r);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

MC__PUBLIC int mc_unregister_buffer(mc_client *c, void *addr)
{
	struct range r;
	pthread_mutex_lock(&c->mu);
	int rc = range_del_locked(c, addr, &r);
	if (rc == 0 && r.kind == R_ALLOC) {
		(void)range_add_locked(c, &r); /* mc_buffer_free frees those */
		rc = 0;
		pthread_mutex_unlock(&c->mu);
		return 0;
	}
	pthread_mutex_unlock(&c->mu);
	if (rc == 0 && r.kind == R_MEMFD)
		rc = unregister_id(c, r.id);
	return rc;
}

/* ------------------------------------------------------------ transfer */

MC__PUBLIC int mc_transfer(mc_client *c, const struct mc_transfer_req *reqs, size_t n,
			   int *results)
{
	if (n == 0)
		return 0;
	Mooncake__Client__TransferItem *items = calloc(n, sizeof(*items));
	Mooncake__Client__TransferItem **ptrs = calloc(n, sizeof(*ptrs));
	Region *regs = calloc(n, sizeof(*regs));
	int64_t *blk = malloc(n * sizeof(*blk));
	int rc = 0, tfd = -1;
	if (!items || !ptrs || !regs || !blk) {
		rc = -ENOMEM;
		goto out;
	}
	uint64_t spill = 0;
	for (size_t i = 0; i < n; i++) {
		const struct mc_transfer_req *t = &reqs[i];
		bool write = t->op == MC_TRANSFER_WRITE;
		Region *g = &regs[i];
		mooncake__client__region__init(g);
		blk[i] = -1;
		results[i] = 0;
		if (t->len == 0 || agent_region(c, t->local, t->len, g)) {
			g->length = t->len;
		} else if ((blk[i] = stg_alloc(c, t->len)) >= 0) {
			if (write)
				memcpy(c->stg + blk[i], t->local, t->len);
			g->offset = (uint64_t)blk[i];
			g->length = t->len;
		} else {
			g->where = MOONCAKE__CLIENT__REGION__WHERE__ATTACHED;
			g->offset = spill;
			g->length = t->len;
			spill += t->len;
		}
		mooncake__client__transfer_item__init(&items[i]);
		items[i].op = write ? MOONCAKE__CLIENT__TRANSFER_ITEM__OP__WRITE
				    : MOONCAKE__CLIENT__TRANSFER_ITEM__OP__READ;
		items[i].local = g;
		items[i].target = (char *)(t->target ? t->target : "");
		items[i].remote_address = t->remote_addr;
		ptrs[i] = &items[i];
	}
	if (spill) {
		tfd = tmp_memfd(spill);
		if (tfd < 0) {
			rc = tfd;
			goto out;
		}
		for (size_t i = 0; i < n; i++)
			if (regs[i].where == MOONCAKE__CLIENT__REGION__WHERE__ATTACHED &&
			    reqs[i].op == MC_TRANSFER_WRITE &&
			    (rc = mc_pwrite_all(tfd, reqs[i].local, reqs[i].len, regs[i].offset)) != 0)
				goto out;
	}
	Mooncake__Client__TransferRequest q = MOONCAKE__CLIENT__TRANSFER_REQUEST__INIT;
	q.items = ptrs;
	q.n_items = n;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_TRANSFER;
	req.transfer = &q;
	struct waiter w;
	rc = call(c, &req, tfd >= 0 ? &tfd : NULL, tfd >= 0 ? 1 : 0, &w);
	if (rc)
		goto out;
	if (w.resp->error)
		rc = w.resp->error;
	else if (w.resp->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_TRANSFER ||
		 w.resp->transfer->n_errors != n)
		rc = MC_EPROTOCOL;
	else
		for (size_t i = 0; i < n; i++)
			results[i] = w.resp->transfer->errors[i];
	waiter_clear(&w);
	for (size_t i = 0; rc == 0 && i < n; i++) {
		if (results[i] || reqs[i].op != MC_TRANSFER_READ || reqs[i].len == 0)
			continue;
		if (blk[i] >= 0)
			memcpy(reqs[i].local, c->stg + blk[i], reqs[i].len);
		else if (regs[i].where == MOONCAKE__CLIENT__REGION__WHERE__ATTACHED)
			results[i] = mc_pread_all(tfd, reqs[i].local, reqs[i].len, regs[i].offset);
	}
out:
	if (blk)
		for (size_t i = 0; i < n; i++)
			stg_free(c, blk[i]);
	if (tfd >= 0)
		close(tfd);
	free(items);
	free(ptrs);
	free(regs);
	free(blk);
	return rc;
}
