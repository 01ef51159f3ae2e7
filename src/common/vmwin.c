/* vmwin: mappings at random places of an address window (vmwin.h). */
#include "common/vmwin.h"

#include <errno.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/types.h>

void *mc_vmwin_map(uint64_t lo, uint64_t hi, uint64_t align, size_t len, int prot, int flags,
		   int fd, unsigned tries)
{
	if (hi <= lo || len >= hi - lo || align == 0)
		return MAP_FAILED;
	uint64_t slots = (hi - lo - len) / align;
	for (unsigned i = 0; i < tries && slots; i++) {
		uint64_t r;
		if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r))
			break;
		void *want = (void *)(uintptr_t)(lo + (r % slots) * align);
		void *p = mmap(want, len, prot, flags | MAP_FIXED_NOREPLACE, fd, 0);
		if (p == want)
			return p;
		if (p != MAP_FAILED) {
			/* A kernel that took the flag for a hint. */
			munmap(p, len);
			break;
		}
		if (errno != EEXIST)
			break;
	}
	return MAP_FAILED;
}
