/*
 * mem.h: the agent's shared memory (mem.c) — memfds (huge pages, NUMA,
 * seals), their mappings, and the checks of a client's memfd. A shared
 * service: it calls only the copy threads (to unregister a mapping from
 * the transfer engine off the loop).
 */
#ifndef MC_AGENT_MEM_H
#define MC_AGENT_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent/agent.h"
#include "common/err.h"

struct agent;
struct agent_inst;
struct agent_job;
struct te_region;

/* The unmaps under way, embedded in struct agent (touched only by
 * mem.c): a registration that met a region one of them may have been
 * taking out of the engine waits for them. */
struct agent_mem {
	unsigned unmaps;      /* unmap jobs not done yet */
	uint64_t unmaps_done; /* unmap jobs done since the start */
	struct agent_unmap_wait *waiting, *waiting_tail;
};

/* A registration job's wait for unmaps, embedded beside its job
 * (touched only by mem.c). */
struct agent_unmap_wait {
	struct agent_unmap_wait *next; /* in agent_mem.waiting */
	struct agent_job *job;
	uint64_t mark; /* unmaps_done when the job was last submitted */
	unsigned tries;
};

/* A shared mapping of a memfd, reference-counted on the loop thread. */
struct agent_map {
	unsigned refs;
	int fd;        /* the memfd (owned) */
	uint8_t *addr; /* mapping of [map_off, map_off + len) */
	size_t len;
	bool hugepages;
	struct agent *a;
	struct te_region *region; /* registered with the engine, or NULL */
	struct agent_inst *inst;  /* ... with this session's engine (a
				     reference), or NULL: the agent's */
	bool device;              /* its region is a client's dma-buf */
};

struct agent_memfd_opts {
	const char *name;
	size_t len;
	enum agent_hugepages hugepages;
	int numa_node; /* -1: none */
	/* Published to the engine at the agent's own addresses: mapped
	 * where clients' buffers do not fall (mem.c, map_published). */
	bool published;
};

/*
 * A new memfd of len bytes, sealed against shrinking and growing, mapped
 * read-write, with one reference. Huge pages: AUTO tries them and falls
 * back (*used_huge tells), ON fails with MC_ECONFIG. Errors: negative
 * errno of memfd_create/ftruncate/mmap, MC_ECONFIG (NUMA or huge pages).
 */
int agent__memfd_new(struct agent *a, const struct agent_memfd_opts *o,
		     struct agent_map **out) MC_MUST_CHECK;

/*
 * Check and map a client's memfd: it must be a memfd (sealable, with
 * F_SEAL_SHRINK), owned by uid (unless uid is 0), open read-write, and
 * at least off + len bytes long. Maps [off rounded down to a page,
 * off + len) shared. On success *out holds one reference and *base the
 * address of byte off. Takes ownership of fd on success only. Errors:
 * -EBADF (not a memfd), -EPERM (another user's), -EACCES (not writable),
 * -EINVAL (not sealed against shrinking, range, size), negative errno of
 * mmap.
 */
int agent__map_client_fd(struct agent *a, int fd, uid_t uid, uint64_t off, uint64_t len,
			 struct agent_map **out, uint8_t **base) MC_MUST_CHECK;

void agent__map_ref(struct agent_map *m);
/* Drop a reference; the last one unregisters, unmaps and closes (the
 * unregistration waits for transfers, so it runs on a copy thread and
 * ends later: an unmap under way). */
void agent__map_unref(struct agent_map *m);
/*
 * A registration with the engine may meet a region an unmap is taking
 * out: a closed session's (a client's next process often maps its buffer
 * where the last one had it). agent__unmap_wait_submit submits j, the
 * registration, to the copy threads. When j's done gets -EEXIST, it calls
 * agent__unmap_wait: if an unmap was under way at some moment since j was
 * submitted, the region in the way may have been that unmap's; j is
 * submitted again once no unmap is under way (at once if none is) and
 * true is returned: the caller leaves j as it is. A registration waits a
 * few times at most. False: the region in the way is live. On the loop
 * thread. Nothing is allocated: each waiting job is a request in flight,
 * which the sessions' limits bound.
 */
void agent__unmap_wait_submit(struct agent *a, struct agent_unmap_wait *w,
			      struct agent_job *j);
bool agent__unmap_wait(struct agent *a, struct agent_unmap_wait *w);

/*
 * A map of memory the agent does not map: len bytes of a client's own
 * memory (process memory, which the transfer engine reaches by
 * cross-memory attach) or of its device (a dma-buf, reached by RDMA); it
 * holds only the region registered for it (fd -1, addr NULL). One
 * reference. Errors: -ENOMEM.
 */
int agent__map_unmapped(struct agent *a, uint64_t len, struct agent_map **out) MC_MUST_CHECK;
/*
 * Whether process pid lets the agent reach [addr, addr + len) of its
 * memory by cross-memory attach: both ends can be read, and every byte
 * is in a mapping readable and writable (its /proc/<pid>/maps). Blocking
 * (reads /proc): not on the loop thread. Errors: -EPERM (the process does
 * not let the agent attach: it has not named the agent with
 * prctl(PR_SET_PTRACER), or the kernel's ptrace rules refuse), -EFAULT
 * (a byte of the range is not mapped readable and writable), -ESRCH (the
 * process exited), -ENOMEM.
 */
int agent__check_process(pid_t pid, uint64_t addr, uint64_t len) MC_MUST_CHECK;
/* The part of that check that reads maps (the text of a /proc/<pid>/maps,
 * NUL-terminated): 0 when its readable and writable mappings cover
 * [addr, addr + len), else -EFAULT. Pure. */
int agent__maps_cover(const char *maps, uint64_t addr, uint64_t len) MC_MUST_CHECK;

/* The machine's physical RAM (0 when unknown). */
uint64_t agent__ram_bytes(void);
/* min(1 GiB, physical RAM / 4), rounded down to 2 MiB. */
uint64_t agent__default_segment_bytes(void);

#endif
