/*
 * mem: the agent's shared memory. Every byte the agent shares with a
 * client or a peer lives in a memfd: the DRAM segment, staging buffers,
 * buffers made for clients and spill areas of large gets. Memfds are
 * sealed against shrinking (a mapping of a file that shrinks faults with
 * SIGBUS on the pages past the end — the agent would die), and the agent
 * maps client memfds only after checking they carry that seal. A
 * client's ordinary memory, which no memfd backs, is reached by
 * cross-memory attach instead (the transfer engine does the copies): mem
 * checks that the client's process lets the agent in and that the range
 * is mapped readable and writable there.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <numa.h>
#include <numaif.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "agent/agent_int.h"
#include "common/log.h"
#include "common/sysmem.h"
#include "common/util.h"
#include "common/vmwin.h"
#include "transfer/transfer.h"

#define LOG_SUBSYS LOGS_AGENT

#define HUGE_2M (2u << 20)

static size_t page_size(void)
{
	long p = sysconf(_SC_PAGESIZE);
	return p > 0 ? (size_t)p : 4096;
}

uint64_t agent__ram_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES);
	return pages > 0 ? (uint64_t)pages * page_size() : 0;
}

uint64_t agent__default_segment_bytes(void)
{
	return mc_default_segment_bytes(agent__ram_bytes());
}

static int bind_numa(void *addr, size_t len, int node)
{
	if (numa_available() < 0) {
		log_error("--numa-node=%d: NUMA is not available on this machine", node);
		return MC_ECONFIG;
	}
	if (node > numa_max_node()) {
		log_error("--numa-node=%d: the highest node is %d", node, numa_max_node());
		return MC_ECONFIG;
	}
	unsigned long mask[16] = {0};
	if ((size_t)node >= sizeof(mask) * 8)
		return MC_ECONFIG;
	mask[node / (8 * sizeof(long))] = 1ul << (node % (8 * sizeof(long)));
	if (mbind(addr, len, MPOL_BIND, mask, sizeof(mask) * 8, 0) != 0) {
		int e = errno;
		log_error("cannot bind memory to NUMA node %d: %s", node, strerror(e));
		return -e;
	}
	return 0;
}

/* Memory published at the agent's own addresses goes in its window
 * (common/vmwin.h), 1 GiB aligned, 8 places tried; else where mmap
 * puts it. */
static void *map_published(size_t len, int fd)
{
	void *p = mc_vmwin_map(MC_VMWIN_AGENT_LO, MC_VMWIN_AGENT_HI, 1ull << 30, len,
			       PROT_READ | PROT_WRITE, MAP_SHARED, fd, 8);
	return p != MAP_FAILED ? p
			       : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
}

/* One attempt: huge pages or not. Returns 0 or a negative errno. */
static int memfd_try(const char *name, size_t len, bool huge, bool published, int *fd_out,
		     void **addr_out, size_t *len_out)
{
	unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
	if (huge) {
		flags |= MFD_HUGETLB;
		len = (len + HUGE_2M - 1) & ~(size_t)(HUGE_2M - 1);
	}
	int fd = memfd_create(name, flags);
	if (fd < 0)
		return -errno;
	int rc = 0;
	if (ftruncate(fd, (off_t)len) != 0) {
		rc = -errno;
		goto out_close;
	}
	void *p = published ? map_published(len, fd)
			    : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		rc = -errno;
		goto out_close;
	}
	/* Neither side may change the size from now on. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
		rc = -errno;
		munmap(p, len);
		goto out_close;
	}
	*fd_out = fd;
	*addr_out = p;
	*len_out = len;
	return 0;

out_close:
	close(fd);
	return rc;
}

int agent__memfd_new(struct agent *a, const struct agent_memfd_opts *o, struct agent_map **out)
{
	struct agent_map *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	int fd = -1, rc = -EINVAL;
	void *addr = NULL;
	size_t len = 0;
	bool huge = false;
	if (o->len == 0)
		goto out_free;
	if (o->hugepages != AGENT_HUGEPAGES_OFF) {
		rc = memfd_try(o->name, o->len, true, o->published, &fd, &addr, &len);
		huge = rc == 0;
		if (rc && o->hugepages == AGENT_HUGEPAGES_ON) {
			log_error("%s: huge pages required (--hugepages=on) but not "
				  "available: %s (see /proc/sys/vm/nr_hugepages)",
				  o->name, strerror(-rc));
			rc = MC_ECONFIG;
			goto out_free;
		}
	}
	if (!huge) {
		rc = memfd_try(o->name, o->len, false, o->published, &fd, &addr, &len);
		if (rc) {
			log_error("%s: cannot create %zu bytes of shared memory: %s", o->name,
				  o->len, strerror(-rc));
			goto out_free;
		}
	}
	if (o->numa_node >= 0) {
		rc = bind_numa(addr, len, o->numa_node);
		if (rc)
			goto out_unmap;
	}
	m->refs = 1;
	m->fd = fd;
	m->addr = addr;
	m->len = len;
	m->hugepages = huge;
	m->a = a;
	*out = m;
	return 0;

out_unmap:
	munmap(addr, len);
	close(fd);
out_free:
	free(m);
	return rc;
}

int agent__map_client_fd(struct agent *a, int fd, uid_t uid, uint64_t off, uint64_t len,
			 struct agent_map **out, uint8_t **base)
{
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
		return -EBADF;
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0)
		return -EBADF; /* not a memfd (or shmem) */
	if (uid != 0 && st.st_uid != uid)
		return -EPERM;
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || (fl & O_ACCMODE) != O_RDWR)
		return -EACCES;
	if (!(seals & F_SEAL_SHRINK))
		return -EINVAL;
	if (len == 0 || off > UINT64_MAX - len || (uint64_t)st.st_size < off + len)
		return -EINVAL;
	size_t ps = page_size();
	uint64_t aoff = off & ~(uint64_t)(ps - 1);
	size_t mlen = (size_t)(off + len - aoff);
	void *p = mmap(NULL, mlen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)aoff);
	if (p == MAP_FAILED)
		return -errno;
	struct agent_map *m = calloc(1, sizeof(*m));
	if (!m) {
		munmap(p, mlen);
		return -ENOMEM;
	}
	m->refs = 1;
	m->fd = fd;
	m->addr = p;
	m->len = mlen;
	m->hugepages = st.st_blksize >= HUGE_2M; /* (a hugetlbfs memfd) */
	m->a = a;
	*out = m;
	*base = (uint8_t *)p + (off - aoff);
	return 0;
}

void agent__map_ref(struct agent_map *m)
{
	m->refs++;
}

static void free_map(struct agent_map *m)
{
	if (m->addr)
		munmap(m->addr, m->len);
	if (m->fd >= 0)
		close(m->fd);
	free(m);
}

/* te_unregister waits until no transfer touches the region: not on the
 * loop thread. The unmap follows it on the same copy thread. Until its
 * done runs, the region may still be in the engine: it is an unmap under
 * way (struct agent_mem). */
struct unmap_job {
	struct agent_job job;
	struct agent *a;
	struct agent_map *m;
	struct agent_inst *inst; /* the engine's: dropped after */
};

static void unmap_run(struct agent_job *j)
{
	struct unmap_job *u = MC_CONTAINER_OF(j, struct unmap_job, job);
	te_unregister(u->m->region);
	u->m->region = NULL;
	free_map(u->m);
	u->m = NULL;
}

/* A registration that met a region in the way waits for the unmaps this
 * many times at most: after one wait, every region that was on its way
 * out then is gone, and what is in the way is live (or a session closed
 * since). */
#define UNMAP_WAIT_TRIES_MAX 3u

static void unmap_wait_resubmit(struct agent *a, struct agent_unmap_wait *w)
{
	w->mark = a->mem.unmaps_done;
	agent__pool_submit(&a->pool, w->job);
}

static void unmap_done(struct agent_job *j)
{
	struct unmap_job *u = MC_CONTAINER_OF(j, struct unmap_job, job);
	struct agent *a = u->a;
	agent__inst_unref(u->inst);
	free(u);
	a->mem.unmaps_done++;
	if (--a->mem.unmaps > 0)
		return;
	struct agent_unmap_wait *w = a->mem.waiting;
	a->mem.waiting = a->mem.waiting_tail = NULL;
	while (w) {
		struct agent_unmap_wait *next = w->next;
		unmap_wait_resubmit(a, w);
		w = next;
	}
}

void agent__unmap_wait_submit(struct agent *a, struct agent_unmap_wait *w, struct agent_job *j)
{
	*w = (struct agent_unmap_wait){.job = j, .mark = a->mem.unmaps_done};
	agent__pool_submit(&a->pool, j);
}

bool agent__unmap_wait(struct agent *a, struct agent_unmap_wait *w)
{
	if (w->tries >= UNMAP_WAIT_TRIES_MAX ||
	    (a->mem.unmaps == 0 && a->mem.unmaps_done == w->mark))
		return false;
	w->tries++;
	if (a->mem.unmaps == 0) {
		unmap_wait_resubmit(a, w); /* the unmap ended before this done */
		return true;
	}
	w->next = NULL;
	if (a->mem.waiting_tail)
		a->mem.waiting_tail->next = w;
	else
		a->mem.waiting = w;
	a->mem.waiting_tail = w;
	return true;
}

void agent__map_unref(struct agent_map *m)
{
	if (!m || --m->refs > 0)
		return;
	if (m->region && m->a && agent__pool_started(&m->a->pool)) {
		struct unmap_job *u = calloc(1, sizeof(*u));
		if (u) {
			u->a = m->a;
			u->m = m;
			u->inst = m->inst;
			u->job.run = unmap_run;
			u->job.done = unmap_done;
			m->a->mem.unmaps++;
			agent__pool_submit(&m->a->pool, &u->job);
			return;
		}
	}
	/* No copy thread to wait on (start-up failed, or out of memory):
	 * leave the region registered with the engine, which frees it with
	 * everything else, and keep the memory mapped. */
	if (m->region) {
		log_error("a region could not be unregistered from the transfer "
			  "engine; its memory stays mapped until exit");
		return;
	}
	agent__inst_unref(m->inst);
	free_map(m);
}

/* ------------------------------------------------------------ process memory */

int agent__map_unmapped(struct agent *a, uint64_t len, struct agent_map **out)
{
	struct agent_map *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->refs = 1;
	m->fd = -1;
	m->len = (size_t)len;
	m->a = a;
	*out = m;
	return 0;
}

int agent__maps_cover(const char *maps, uint64_t addr, uint64_t len)
{
	uint64_t cur = addr, end = addr + len;
	if (len == 0 || end < addr)
		return -EFAULT;
	for (const char *p = maps; p && *p && cur < end;) {
		char *q;
		uint64_t lo = strtoull(p, &q, 16);
		uint64_t hi = *q == '-' ? strtoull(q + 1, &q, 16) : 0;
		bool rw = *q == ' ' && q[1] == 'r' && q[2] == 'w';
		if (hi <= lo)
			return -EFAULT; /* not a maps line */
		if (lo > cur)
			return -EFAULT; /* a hole (lines come sorted) */
		if (hi > cur) {
			if (!rw)
				return -EFAULT;
			cur = hi;
		}
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return cur >= end ? 0 : -EFAULT;
}

/* /proc/<pid>/maps, NUL-terminated, malloc'd; NULL with errno. */
static char *read_maps(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	size_t cap = 0, n = 0;
	char *buf = NULL;
	int err;
	for (;;) {
		if (cap - n < 4096) {
			size_t ncap = cap ? cap * 2 : 64 << 10;
			char *b = realloc(buf, ncap);
			if (!b) {
				err = ENOMEM;
				break;
			}
			buf = b;
			cap = ncap;
		}
		ssize_t got = read(fd, buf + n, cap - n - 1);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			err = errno;
			break;
		}
		if (got == 0) {
			buf[n] = '\0';
			close(fd);
			return buf;
		}
		n += (size_t)got;
	}
	free(buf);
	close(fd);
	errno = err;
	return NULL;
}

/* Read one byte at addr of pid: 0 or a negative errno. */
static int probe(pid_t pid, uint64_t addr)
{
	uint8_t b;
	struct iovec l = {.iov_base = &b, .iov_len = 1};
	struct iovec r = {.iov_base = (void *)(uintptr_t)addr, .iov_len = 1};
	return process_vm_readv(pid, &l, 1, &r, 1, 0) == 1 ? 0 : -errno;
}

int agent__check_process(pid_t pid, uint64_t addr, uint64_t len)
{
	int rc = probe(pid, addr);
	if (rc == 0 && len > 1)
		rc = probe(pid, addr + len - 1);
	if (rc)
		return rc == -ESRCH ? -ESRCH : rc == -EFAULT ? -EFAULT : -EPERM;
	char *maps = read_maps(pid);
	if (!maps)
		return errno == ENOENT || errno == ESRCH ? -ESRCH
		       : errno == ENOMEM                 ? -ENOMEM
							 : -EPERM;
	rc = agent__maps_cover(maps, addr, len);
	free(maps);
	return rc;
}
