/*
 * Client memory the agent can reach. The staging buffer (a memfd from
 * the agent, mapped here) is carved by a first-fit allocator into
 * per-request blocks: values to put are copied into a block, gets are
 * told to put values there. Buffers the agent maps (mc_buffer_alloc,
 * mc_register_memfd) are read and written in place; other registered
 * memory is remembered as a shadow range and copied through staging.
 */
#include "client/client_int.h"
#include "common/vmwin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

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

int64_t mc__stg_alloc(mc_client *c, size_t len)
{
	pthread_mutex_lock(&c->mu);
	int64_t off = stg_alloc_locked(c, len);
	pthread_mutex_unlock(&c->mu);
	return off;
}

/* The largest free gap, then allocate up to want bytes of it. */
int64_t mc__stg_alloc_upto(mc_client *c, size_t want, size_t *got)
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

void mc__stg_free(mc_client *c, int64_t off)
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
int mc__tmp_memfd(size_t len)
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

/* The range of one of the kinds holding [p, p + len), under mu. */
static const struct range *find_range_locked(mc_client *c, const void *p, size_t len,
					     bool proc)
{
	const uint8_t *a = p;
	for (size_t i = 0; i < c->nranges; i++) {
		const struct range *r = &c->ranges[i];
		if (r->kind == R_SHADOW || r->kind == R_DEVICE || (r->kind == R_PROC && !proc))
			continue;
		if (a >= r->addr && (size_t)(a - r->addr) <= r->len &&
		    len <= r->len - (size_t)(a - r->addr))
			return r;
	}
	return NULL;
}

/* The agent-mapped range holding [p, p + len), under mu. Process memory
 * is not mapped by the agent: this process's own operations copy it
 * through staging (faster than the agent's cross-memory attach). */
const struct range *mc__find_agent_range_locked(mc_client *c, const void *p, size_t len)
{
	return find_range_locked(c, p, len, false);
}

/* Region of agent-mapped memory for [p, p + len): true if there is one. */
static bool region_locked(mc_client *c, const void *p, size_t len, Region *g)
{
	const struct range *r = mc__find_agent_range_locked(c, p, len);
	if (r) {
		g->where = MOONCAKE__CLIENT__REGION__WHERE__BUFFER;
		g->buffer = r->id;
		g->offset = (uint64_t)((const uint8_t *)p - r->addr);
		g->length = len;
	}
	return r != NULL;
}

bool mc__registered_room(mc_client *c, const void *p, size_t *room)
{
	const uint8_t *a = p;
	bool found = false;
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < c->nranges && !found; i++) {
		const struct range *r = &c->ranges[i];
		if (a >= r->addr && (size_t)(a - r->addr) < r->len) {
			*room = r->len - (size_t)(a - r->addr);
			found = true;
		}
	}
	pthread_mutex_unlock(&c->mu);
	if (!found && mc__host_attach(c, p, 1, false) == 0)
		return mc__registered_room(c, p, room); /* mc_host_alloc memory */
	return found;
}

bool mc__agent_region(mc_client *c, const void *p, size_t len, Region *g)
{
	if (!p)
		return false;
	pthread_mutex_lock(&c->mu);
	bool found = region_locked(c, p, len, g);
	pthread_mutex_unlock(&c->mu);
	if (found || mc__host_attach(c, p, len, false) != 0)
		return found;
	/* mc_host_alloc memory, attached just now. */
	pthread_mutex_lock(&c->mu);
	found = region_locked(c, p, len, g);
	pthread_mutex_unlock(&c->mu);
	return found;
}

/* ------------------------------------------------------------ buffers */

bool mc__overlaps(mc_client *c, const void *addr, size_t len)
{
	const uint8_t *a = addr;
	bool found = false;
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < c->nranges && !found; i++) {
		const struct range *o = &c->ranges[i];
		found = a < o->addr + o->len && o->addr < a + len;
	}
	pthread_mutex_unlock(&c->mu);
	return found;
}

/* Add a range under mu. Errors: -EEXIST (overlap), -ENOMEM. */
int mc__range_add_locked(mc_client *c, const struct range *r)
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
	if (r->kind == R_DEVICE)
		__atomic_store_n(&c->ndevice, c->ndevice + 1, __ATOMIC_RELAXED);
	return 0;
}

/* Remove the range starting at addr under mu; *out gets it. */
int mc__range_del_locked(mc_client *c, const void *addr, struct range *out)
{
	for (size_t i = 0; i < c->nranges; i++)
		if (c->ranges[i].addr == addr) {
			*out = c->ranges[i];
			c->ranges[i] = c->ranges[--c->nranges];
			if (out->kind == R_DEVICE)
				__atomic_store_n(&c->ndevice, c->ndevice - 1,
						 __ATOMIC_RELAXED);
			return 0;
		}
	return -ENOENT;
}

int mc__range_add_buffer(mc_client *c, void *addr, size_t len, uint64_t id,
			 enum range_kind kind)
{
	struct range r = {.addr = addr, .len = len, .id = id, .kind = kind, .published = true};
	pthread_mutex_lock(&c->mu);
	int rc = mc__range_add_locked(c, &r);
	pthread_mutex_unlock(&c->mu);
	if (rc)
		(void)mc__unregister_id(c, id);
	return rc;
}

int mc__unregister_id(mc_client *c, uint64_t id)
{
	Mooncake__Client__BufferRequest q = MOONCAKE__CLIENT__BUFFER_REQUEST__INIT;
	q.buffer = id;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_UNREGISTER_BUFFER;
	req.unregister_buffer = &q;
	struct waiter w;
	int rc = mc__call(c, &req, NULL, 0, &w);
	if (rc)
		return rc;
	rc = w.resp->error;
	mc__waiter_clear(&w);
	return rc;
}

/*
 * A buffer's address is where peers reach it, and a session without an
 * engine of its own publishes it in the agent's engine beside the
 * buffers of the agent's other such sessions, each at its process's
 * address: two processes' buffers may meet there, and the agent refuses
 * the second with -EEXIST. The address is this library's choice, so it
 * tries again at a random 2 MiB boundary of the client window
 * (common/vmwin.h), ALLOC_TRIES times in all.
 */
#define ALLOC_TRIES 8

/* Address space for a buffer of rlen: mmap's choice, or (elsewhere) a
 * random place of the client window when that can be had. */
static void *reserve(size_t rlen, bool elsewhere)
{
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
	void *p = elsewhere ? mc_vmwin_map(MC_VMWIN_CLIENT_LO, MC_VMWIN_CLIENT_HI, HUGE_ALIGN,
					   rlen, PROT_NONE, flags, -1, 1)
			    : MAP_FAILED;
	return p != MAP_FAILED ? p : mmap(NULL, rlen, PROT_NONE, flags, -1, 0);
}

MC__PUBLIC int mc_buffer_alloc(mc_client *c, size_t len, void **buf)
{
	if (len == 0)
		return -EINVAL;
	/* Reserve address space, 2 MiB aligned (the agent may use huge
	 * pages), and tell the agent the address peers will use. */
	size_t rlen = ((len + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1)) + HUGE_ALIGN;
	Mooncake__Client__AllocBufferRequest q = MOONCAKE__CLIENT__ALLOC_BUFFER_REQUEST__INIT;
	q.length = len;
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_ALLOC_BUFFER;
	req.alloc_buffer = &q;
	struct waiter w;
	void *base;
	uint8_t *addr;
	for (int attempt = 1;; attempt++) {
		base = reserve(rlen, attempt > 1);
		if (base == MAP_FAILED)
			return -errno;
		addr = (uint8_t *)(((uintptr_t)base + HUGE_ALIGN - 1) &
				   ~(uintptr_t)(HUGE_ALIGN - 1));
		q.address = (uint64_t)(uintptr_t)addr;
		int rc = mc__call(c, &req, NULL, 0, &w);
		if (rc) {
			munmap(base, rlen);
			return rc;
		}
		if (w.resp->error != -EEXIST || attempt == ALLOC_TRIES)
			break;
		/* Another session's buffer is there in the agent's engine. */
		mc__waiter_clear(&w);
		munmap(base, rlen);
	}
	int rc = 0;
	uint64_t id = 0;
	if (w.resp->error) {
		rc = w.resp->error;
	} else if (w.resp->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_BUFFER ||
		   w.nfds != 1) {
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
	mc__waiter_clear(&w);
	if (rc == 0) {
		struct range r = {.addr = addr,
				  .len = len,
				  .id = id,
				  .kind = R_ALLOC,
				  .map_base = base,
				  .map_len = rlen,
				  .published = true};
		pthread_mutex_lock(&c->mu);
		rc = mc__range_add_locked(c, &r);
		pthread_mutex_unlock(&c->mu);
	}
	if (rc) {
		if (id)
			(void)mc__unregister_id(c, id);
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
	int rc = mc__range_del_locked(c, buf, &r);
	if (rc == 0 && r.kind != R_ALLOC) {
		(void)mc__range_add_locked(c, &r);
		rc = -ENOENT;
	}
	pthread_mutex_unlock(&c->mu);
	if (rc)
		return rc;
	rc = mc__unregister_id(c, r.id);
	munmap(r.map_base, r.map_len);
	return rc;
}

int mc__register_req(mc_client *c, Mooncake__Client__RegisterBufferRequest *q, int fd,
		     uint64_t *id)
{
	Request req = MOONCAKE__CLIENT__REQUEST__INIT;
	req.op_case = MOONCAKE__CLIENT__REQUEST__OP_REGISTER_BUFFER;
	req.register_buffer = q;
	struct waiter w;
	int rc = mc__call(c, &req, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, &w);
	if (rc)
		return rc;
	if (w.resp->error)
		rc = w.resp->error;
	else if (w.resp->body_case != MOONCAKE__CLIENT__RESPONSE__BODY_BUFFER)
		rc = MC_EPROTOCOL;
	else
		*id = w.resp->buffer->buffer;
	mc__waiter_clear(&w);
	return rc;
}

int mc__register_fd(mc_client *c, int fd, uint64_t offset, void *addr, size_t len,
		    bool publish, uint64_t *id)
{
	Mooncake__Client__RegisterBufferRequest q =
		MOONCAKE__CLIENT__REGISTER_BUFFER_REQUEST__INIT;
	q.offset = offset;
	q.length = len;
	q.address = publish ? (uint64_t)(uintptr_t)addr : 0;
	return mc__register_req(c, &q, fd, id);
}

MC__PUBLIC int mc_register_memfd(mc_client *c, int fd, uint64_t offset, void *addr, size_t len)
{
	if (len == 0 || !addr)
		return -EINVAL;
	if (mc__overlaps(c, addr, len))
		return -EEXIST;
	uint64_t id = 0;
	int rc = mc__register_fd(c, fd, offset, addr, len, true, &id);
	if (rc)
		return rc;
	return mc__range_add_buffer(c, addr, len, id, R_MEMFD);
}

/*
 * Ordinary memory peers may reach: ask the agent to reach it by
 * cross-memory attach (after naming it as this process's ptracer).
 * Returns 0 with the range added, or the agent's refusal.
 */
static int register_process(mc_client *c, void *addr, size_t len)
{
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0)
		return -errno;
	if (cred.pid <= 0)
		return -EPERM; /* the agent is not in this pid namespace */
	/* Yama (ptrace_scope 1) lets only a named process attach; without
	 * Yama the call is EINVAL and the usual ptrace rules apply. */
	if (prctl(PR_SET_PTRACER, (unsigned long)cred.pid, 0, 0, 0) != 0 && errno != EINVAL)
		return -errno;
	Mooncake__Client__RegisterBufferRequest q =
		MOONCAKE__CLIENT__REGISTER_BUFFER_REQUEST__INIT;
	q.length = len;
	q.address = (uint64_t)(uintptr_t)addr;
	q.process_memory = true;
	uint64_t id = 0;
	int rc = mc__register_req(c, &q, -1, &id);
	if (rc)
		return rc;
	return mc__range_add_buffer(c, addr, len, id, R_PROC);
}

static int register_any(mc_client *c, void *addr, size_t len, bool publish)
{
	if (len == 0 || !addr)
		return -EINVAL;
	int rc = mc__host_attach(c, addr, len, publish);
	if (rc != -ENOENT)
		return rc;
	/* A GPU's memory, which this process's CPU cannot copy: for peers
	 * it is a dma-buf the agent's NICs reach (as Mooncake's location
	 * "*" finds it); the store's calls would copy it, so they refuse
	 * it here rather than fault at the first put. */
	if (mc__cuda_device(addr))
		return publish ? mc_register_cuda(c, addr, len) : -EOPNOTSUPP;
	pthread_mutex_lock(&c->mu);
	/* Inside a buffer of the session (or process memory it published)
	 * already: nothing to do. */
	if (find_range_locked(c, addr, len, true)) {
		pthread_mutex_unlock(&c->mu);
		return 0;
	}
	pthread_mutex_unlock(&c->mu);
	/* Memory peers must reach: the agent reaches it, or the
	 * registration fails (it would promise what cannot happen). */
	if (publish)
		return register_process(c, addr, len);
	pthread_mutex_lock(&c->mu);
	struct range r = {.addr = addr, .len = len, .kind = R_SHADOW};
	rc = mc__range_add_locked(c, &r);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

MC__PUBLIC int mc_register_buffer(mc_client *c, void *addr, size_t len)
{
	return register_any(c, addr, len, false);
}

MC__PUBLIC int mc_register_memory(mc_client *c, void *addr, size_t len)
{
	return register_any(c, addr, len, true);
}

MC__PUBLIC int mc_unregister_buffer(mc_client *c, void *addr)
{
	struct range r;
	pthread_mutex_lock(&c->mu);
	const struct range *in = mc__find_agent_range_locked(c, addr, 1);
	if (in && in->kind == R_HOST && in->addr != addr) {
		/* A part of an attached mc_host_alloc allocation: the
		 * session keeps the whole. */
		pthread_mutex_unlock(&c->mu);
		return 0;
	}
	int rc = mc__range_del_locked(c, addr, &r);
	if (rc == 0 && r.kind == R_ALLOC) {
		(void)mc__range_add_locked(c, &r); /* mc_buffer_free frees those */
		pthread_mutex_unlock(&c->mu);
		return 0;
	}
	pthread_mutex_unlock(&c->mu);
	if (rc == 0 &&
	    (r.kind == R_MEMFD || r.kind == R_HOST || r.kind == R_PROC || r.kind == R_DEVICE))
		rc = mc__unregister_id(c, r.id);
	return rc;
}
