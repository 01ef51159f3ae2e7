/*
 * region: the table of this engine's registered regions, which the
 * serving side consults for every request: a sorted array under a
 * read-write lock (lookups share it, registration takes it briefly), and
 * per region a count of requests being served on it so that removing a
 * region can wait until nothing touches its memory any more. A region
 * of another process's memory (te_register_process) is read and written
 * by cross-memory attach (te__region_io).
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "transfer/te_int.h"

int te__rtable_init(struct te_rtable *t)
{
	memset(t, 0, sizeof(*t));
	if (pthread_rwlock_init(&t->lock, NULL))
		return -ENOMEM;
	pthread_mutex_init(&t->wait_mu, NULL);
	pthread_cond_init(&t->wait_cv, NULL);
	t->next_id = 1;
	return 0;
}

void te__rtable_destroy(struct te_rtable *t)
{
	free(t->v);
	pthread_rwlock_destroy(&t->lock);
	pthread_mutex_destroy(&t->wait_mu);
	pthread_cond_destroy(&t->wait_cv);
}

/* Index of the first region whose start is > addr. */
static size_t upper(struct te_rtable *t, uint64_t addr)
{
	size_t lo = 0, hi = t->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (t->v[mid]->addr <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int te__rtable_add(struct te_rtable *t, struct te_region *r)
{
	int rc = 0;
	pthread_rwlock_wrlock(&t->lock);
	size_t i = upper(t, r->addr);
	/* The previous region must end before r, the next start after it. */
	if (i > 0) {
		const struct te_region *p = t->v[i - 1];
		if (r->addr - p->addr < p->len) {
			rc = -EEXIST;
			goto out;
		}
	}
	if (i < t->n && t->v[i]->addr - r->addr < r->len) {
		rc = -EEXIST;
		goto out;
	}
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 16;
		struct te_region **v = realloc(t->v, cap * sizeof(*v));
		if (!v) {
			rc = -ENOMEM;
			goto out;
		}
		t->v = v;
		t->cap = cap;
	}
	memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof(*t->v));
	t->v[i] = r;
	t->n++;
	r->id = t->next_id++;
	if (t->next_id == 0)
		t->next_id = 1;
out:
	pthread_rwlock_unlock(&t->lock);
	return rc;
}

void te__rtable_del(struct te_rtable *t, struct te_region *r)
{
	pthread_rwlock_wrlock(&t->lock);
	for (size_t i = 0; i < t->n; i++) {
		if (t->v[i] == r) {
			memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof(*t->v));
			t->n--;
			break;
		}
	}
	pthread_rwlock_unlock(&t->lock);
	pthread_mutex_lock(&t->wait_mu);
	r->dead = true;
	while (atomic_load(&r->inflight) > 0)
		pthread_cond_wait(&t->wait_cv, &t->wait_mu);
	pthread_mutex_unlock(&t->wait_mu);
}

int te__rtable_acquire(struct te_rtable *t, uint64_t addr, uint64_t len,
		       struct te_region **out)
{
	int rc = MC_EREMOTE_ACCESS;
	pthread_rwlock_rdlock(&t->lock);
	if (t->n) {
		/* The array holds pointers: search a copy of the bounds via
		 * the generic check, one region at a time. */
		size_t i = upper(t, addr);
		if (i > 0) {
			struct te_region *r = t->v[i - 1];
			uint64_t b[2] = {r->addr, r->len};
			if (te__range_find(b, 1, sizeof(b), 0, sizeof(uint64_t), addr, len) ==
			    0) {
				atomic_fetch_add(&r->inflight, 1);
				*out = r;
				rc = 0;
			}
		}
	}
	pthread_rwlock_unlock(&t->lock);
	return rc;
}

void te__rtable_release(struct te_rtable *t, struct te_region *r)
{
	if (atomic_fetch_sub(&r->inflight, 1) == 1) {
		pthread_mutex_lock(&t->wait_mu);
		if (r->dead)
			pthread_cond_broadcast(&t->wait_cv);
		pthread_mutex_unlock(&t->wait_mu);
	}
}

int te__rtable_describe(struct te_rtable *t, struct te_desc *d)
{
	int rc = 0;
	pthread_rwlock_rdlock(&t->lock);
	d->nregions = 0;
	d->regions = NULL;
	if (t->n) {
		d->regions = calloc(t->n, sizeof(*d->regions));
		if (!d->regions) {
			rc = -ENOMEM;
			goto out;
		}
	}
	for (size_t i = 0; i < t->n; i++) {
		const struct te_region *r = t->v[i];
		struct te_desc_region *o = &d->regions[i];
		o->addr = r->addr;
		o->len = r->len;
		o->shm = r->memfd >= 0;
		o->nrkeys = r->nrkeys;
		memcpy(o->rkeys, r->rkeys, sizeof(o->rkeys));
		o->rdma_addr = !r->nrkeys ? 0
			       : r->local ? (uint64_t)(uintptr_t)r->local
					  : r->addr;
	}
	d->nregions = t->n;
out:
	pthread_rwlock_unlock(&t->lock);
	return rc;
}

void te__rtable_foreach(struct te_rtable *t, void (*fn)(void *ud, struct te_region *r),
			void *ud)
{
	pthread_rwlock_rdlock(&t->lock);
	for (size_t i = 0; i < t->n; i++)
		fn(ud, t->v[i]);
	pthread_rwlock_unlock(&t->lock);
}

/* Whether the process behind a pidfd has exited (its pidfd reads as
 * ready then). Checked before each access: the pid of a process that
 * exited may name another process later. */
static bool exited(int pidfd)
{
	struct pollfd p = {.fd = pidfd, .events = POLLIN};
	return pidfd >= 0 && poll(&p, 1, 0) > 0;
}

int te__region_io(const struct te_region *r, uint64_t addr, void *buf, size_t len, bool write)
{
	if (r->dmabuf >= 0)
		return MC_EREMOTE_ACCESS; /* device memory: RDMA only */
	if (!r->pid) {
		uint8_t *at = r->local + (addr - r->addr);
		if (write)
			memcpy(at, buf, len);
		else
			memcpy(buf, at, len);
		return 0;
	}
	size_t done = 0;
	while (done < len) {
		if (exited(r->pidfd))
			return -ESRCH;
		struct iovec l = {.iov_base = (uint8_t *)buf + done, .iov_len = len - done};
		struct iovec m = {.iov_base = (void *)(uintptr_t)(addr + done),
				  .iov_len = len - done};
		ssize_t n = write ? process_vm_writev(r->pid, &l, 1, &m, 1, 0)
				  : process_vm_readv(r->pid, &l, 1, &m, 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == ESRCH)
			return -ESRCH;
		if (n <= 0)
			return MC_EREMOTE_ACCESS; /* EFAULT, EPERM: not reachable */
		done += (size_t)n;
	}
	return 0;
}

int te_region_io(struct te_region *r, uint64_t addr, void *buf, size_t len, bool write)
{
	if (addr < r->addr || addr - r->addr > r->len || len > r->len - (addr - r->addr))
		return MC_EREMOTE_ACCESS;
	return te__region_io(r, addr, buf, len, write);
}
