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
struct te_region;

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
	bool populate;
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
/* Drop a reference; the last one unregisters, unmaps and closes. */
void agent__map_unref(struct agent_map *m);

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
