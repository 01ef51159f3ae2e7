/*
 * vmwin: where memory published at a process's own addresses is mapped.
 *
 * An agent's transfer engine holds, in one table, the agent's own memory
 * (its segment, the SSD bounce region) at the agent's addresses and the
 * buffers of its sessions without an engine of their own at their
 * processes' addresses. Left to mmap, large maps of every process land
 * at a random place in the top terabyte of its address space, so two of
 * them meet there now and then and the second is refused (-EEXIST). Two
 * windows of the 47-bit address space that Linux's default layout leaves
 * to nobody (heaps and mmap areas lie above 85 TiB, small programs below
 * 1 TiB, AddressSanitizer's shadow below 16 TiB + 2 GiB) take them
 * instead:
 *   MC_VMWIN_AGENT   the agents' own published memory (agent/mem.c);
 *   MC_VMWIN_CLIENT  where mc_buffer_alloc tries again after its first
 *                    place met another process's buffer (client/mem.c).
 * Disjoint, so a client's buffer never meets an agent's segment there.
 *
 * Used by the agent and by libmooncake (linked into both).
 */
#ifndef MC_COMMON_VMWIN_H
#define MC_COMMON_VMWIN_H

#include <stddef.h>
#include <stdint.h>

#define MC_VMWIN_AGENT_LO (32ull << 40)
#define MC_VMWIN_AGENT_HI (64ull << 40)
#define MC_VMWIN_CLIENT_LO (64ull << 40)
#define MC_VMWIN_CLIENT_HI (84ull << 40)

/*
 * Map len bytes (mmap's prot, flags and fd; MAP_FIXED_NOREPLACE is added)
 * at a random multiple of align in [lo, hi), trying up to tries places.
 * Returns the mapping, or MAP_FAILED: the window is too small, every place
 * tried was taken, the address space ends below it, the kernel predates
 * MAP_FIXED_NOREPLACE (it took the flag for a hint) or has no random
 * bytes. The caller then takes mmap's own choice.
 */
void *mc_vmwin_map(uint64_t lo, uint64_t hi, uint64_t align, size_t len, int prot, int flags,
		   int fd, unsigned tries);

#endif
