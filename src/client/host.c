/*
 * Host memory the agent can map (mc_host_alloc): the allocator behind
 * Mooncake's MooncakeHostMemAllocator, alloc_from_mem_pool and the
 * get_alloc_func_addr/get_free_func_addr functions a PyTorch or LMCache
 * allocator calls.
 *
 * Each allocation is a memfd of this process, sealed against resizing and
 * mapped shared at a 2 MiB-aligned address, so it needs no connection to
 * be made. The first time a session meets an address inside one (a put,
 * a get, a transfer, a registration) it hands the memfd to its agent
 * (mc__host_attach), which maps it too; from then on the bytes are read
 * and written in place, by the agent's copies and by peers' transfers
 * when the range is published. Freeing an allocation first takes it back
 * from every session of the process that has it, so an address reused
 * later never reaches an agent's stale mapping.
 *
 * Lock order: host_mu, then a handle's mu. host_mu is held across the
 * agent round trips of mc_host_free (so a session cannot attach an
 * allocation being freed) but not across those of an attach, which
 * checks afterwards that the allocation it attached is still alive.
 */
#include "client/client_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HOST_ALIGN ((size_t)2 << 20)

struct host_alloc {
	uint8_t *addr;
	size_t len;     /* usable bytes (the memfd may be longer: pages) */
	void *map_base; /* the whole reservation */
	size_t map_len;
	int fd;
	uint64_t gen; /* unique per allocation */
};

static pthread_mutex_t host_mu = PTHREAD_MUTEX_INITIALIZER;
static struct host_alloc *allocs;
static size_t nallocs, allocs_cap;
static uint64_t next_gen = 1;
static mc_client **clients; /* open handles, told of frees */
static size_t nclients, clients_cap;

static struct host_alloc *find_locked(const void *p, size_t len)
{
	const uint8_t *a = p;
	for (size_t i = 0; i < nallocs; i++) {
		struct host_alloc *h = &allocs[i];
		if (a >= h->addr && (size_t)(a - h->addr) <= h->len &&
		    len <= h->len - (size_t)(a - h->addr))
			return h;
	}
	return NULL;
}

MC__PUBLIC void *mc_host_alloc(size_t len)
{
	if (len == 0 || len > SIZE_MAX - 2 * HOST_ALIGN) {
		errno = EINVAL;
		return NULL;
	}
	long pg = sysconf(_SC_PAGESIZE);
	size_t flen = (len + (size_t)pg - 1) & ~((size_t)pg - 1);
	int fd = memfd_create("mooncake-host", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return NULL;
	void *base = MAP_FAILED;
	int e = 0;
	if (ftruncate(fd, (off_t)flen) != 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
		e = errno;
		goto out_fd;
	}
	/* Reserve, then map 2 MiB-aligned: transparent huge pages can back
	 * it where shmem allows them, as in the agent's own buffers. */
	size_t rlen = flen + HOST_ALIGN;
	base = mmap(NULL, rlen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (base == MAP_FAILED) {
		e = errno;
		goto out_fd;
	}
	uint8_t *addr = (uint8_t *)(((uintptr_t)base + HOST_ALIGN - 1) &
				    ~(uintptr_t)(HOST_ALIGN - 1));
	if (mmap(addr, flen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
	    MAP_FAILED) {
		e = errno;
		goto out_map;
	}
	(void)madvise(addr, flen, MADV_HUGEPAGE);
	pthread_mutex_lock(&host_mu);
	if (nallocs == allocs_cap) {
		size_t cap = allocs_cap ? allocs_cap * 2 : 16;
		struct host_alloc *p = realloc(allocs, cap * sizeof(*p));
		if (!p) {
			pthread_mutex_unlock(&host_mu);
			e = ENOMEM;
			goto out_map;
		}
		allocs = p;
		allocs_cap = cap;
	}
	allocs[nallocs++] = (struct host_alloc){addr, len, base, rlen, fd, next_gen++};
	pthread_mutex_unlock(&host_mu);
	return addr;

out_map:
	munmap(base, rlen);
out_fd:
	close(fd);
	errno = e;
	return NULL;
}

MC__PUBLIC size_t mc_host_size(const void *p)
{
	size_t len = 0;
	pthread_mutex_lock(&host_mu);
	const struct host_alloc *h = p ? find_locked(p, 0) : NULL;
	if (h && h->addr == p)
		len = h->len;
	pthread_mutex_unlock(&host_mu);
	return len;
}

/* Take allocation gen back from every session (under host_mu). */
static void detach_all_locked(uint64_t gen)
{
	for (size_t i = 0; i < nclients; i++) {
		mc_client *c = clients[i];
		struct range r = {0};
		bool found = false;
		pthread_mutex_lock(&c->mu);
		for (size_t k = 0; k < c->nranges; k++)
			if (c->ranges[k].kind == R_HOST && c->ranges[k].host_gen == gen) {
				r = c->ranges[k];
				c->ranges[k] = c->ranges[--c->nranges];
				found = true;
				break;
			}
		pthread_mutex_unlock(&c->mu);
		if (found)
			(void)mc__unregister_id(c, r.id);
	}
}

MC__PUBLIC void mc_host_free(void *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&host_mu);
	struct host_alloc *h = find_locked(p, 0);
	if (!h || h->addr != p) {
		pthread_mutex_unlock(&host_mu);
		return;
	}
	struct host_alloc gone = *h;
	*h = allocs[--nallocs];
	detach_all_locked(gone.gen);
	pthread_mutex_unlock(&host_mu);
	munmap(gone.map_base, gone.map_len);
	close(gone.fd);
}

int mc__host_attach(mc_client *c, const void *p, size_t len, bool publish)
{
	pthread_mutex_lock(&host_mu);
	const struct host_alloc *h = find_locked(p, len);
	if (!h) {
		pthread_mutex_unlock(&host_mu);
		return -ENOENT;
	}
	struct host_alloc a = *h;
	int fd = fcntl(a.fd, F_DUPFD_CLOEXEC, 0);
	pthread_mutex_unlock(&host_mu);
	if (fd < 0)
		return -errno;
	/* Already attached (by another thread meanwhile, or unpublished
	 * when a published one is wanted now)? */
	pthread_mutex_lock(&c->mu);
	struct range old = {0};
	bool have = false;
	for (size_t k = 0; k < c->nranges; k++)
		if (c->ranges[k].kind == R_HOST && c->ranges[k].host_gen == a.gen) {
			old = c->ranges[k];
			have = true;
			break;
		}
	pthread_mutex_unlock(&c->mu);
	if (have && (old.published || !publish)) {
		close(fd);
		return 0;
	}
	uint64_t id;
	int rc = mc__register_fd(c, fd, 0, a.addr, a.len, publish, &id);
	close(fd);
	if (rc)
		return rc;
	struct range r = {.addr = a.addr,
			  .len = a.len,
			  .id = id,
			  .kind = R_HOST,
			  .host_gen = a.gen,
			  .published = publish};
	pthread_mutex_lock(&host_mu);
	bool alive = false;
	for (size_t i = 0; i < nallocs; i++)
		alive |= allocs[i].gen == a.gen;
	pthread_mutex_lock(&c->mu);
	if (alive) {
		if (have)
			(void)mc__range_del_locked(c, a.addr, &old);
		rc = mc__range_add_locked(c, &r);
	}
	pthread_mutex_unlock(&c->mu);
	pthread_mutex_unlock(&host_mu);
	if (!alive || rc)
		(void)mc__unregister_id(c, id);
	else if (have)
		(void)mc__unregister_id(c, old.id);
	return alive ? rc : -ENOENT;
}

int mc__host_track(mc_client *c)
{
	pthread_mutex_lock(&host_mu);
	if (nclients == clients_cap) {
		size_t cap = clients_cap ? clients_cap * 2 : 8;
		mc_client **p = realloc(clients, cap * sizeof(*p));
		if (!p) {
			pthread_mutex_unlock(&host_mu);
			return -ENOMEM;
		}
		clients = p;
		clients_cap = cap;
	}
	clients[nclients++] = c;
	pthread_mutex_unlock(&host_mu);
	return 0;
}

void mc__host_untrack(mc_client *c)
{
	pthread_mutex_lock(&host_mu);
	for (size_t i = 0; i < nclients; i++)
		if (clients[i] == c) {
			clients[i] = clients[--nclients];
			break;
		}
	pthread_mutex_unlock(&host_mu);
}
