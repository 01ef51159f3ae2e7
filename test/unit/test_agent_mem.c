/*
 * test_agent_mem: the checks of a client's process memory before the
 * agent publishes it — the /proc/<pid>/maps coverage (pure, on texts:
 * holes, read-only mappings, a range over several mappings, the end of
 * the list) and the whole check against this process's own memory and a
 * child that has exited.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/mem.h"

static const char *maps = "00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/x\n"
			  "00651000-00652000 rw-p 00051000 08:02 173521 /usr/bin/x\n"
			  "00652000-00655000 rw-p 00000000 00:00 0 [heap]\n"
			  "00660000-00670000 rw-p 00000000 00:00 0\n"
			  "7f0000000000-7f0000100000 r--p 00000000 00:00 0";

Test(agent_mem, maps_cover)
{
	cr_assert_eq(agent__maps_cover(maps, 0x651000, 0x1000), 0, "one mapping");
	cr_assert_eq(agent__maps_cover(maps, 0x651800, 0x3000), 0, "two adjacent ones");
	cr_assert_eq(agent__maps_cover(maps, 0x654000, 0x2000), -EFAULT, "into a hole");
	cr_assert_eq(agent__maps_cover(maps, 0x656000, 0x10), -EFAULT, "in a hole");
	cr_assert_eq(agent__maps_cover(maps, 0x400000, 0x10), -EFAULT, "not writable");
	cr_assert_eq(agent__maps_cover(maps, 0x66fff0, 0x10), 0, "the last byte");
	cr_assert_eq(agent__maps_cover(maps, 0x66fff0, 0x11), -EFAULT, "one past");
	cr_assert_eq(agent__maps_cover(maps, 0x7f0000000000, 1), -EFAULT,
		     "read-only, last line");
	cr_assert_eq(agent__maps_cover(maps, 0x7f0000200000, 1), -EFAULT, "past every line");
	cr_assert_eq(agent__maps_cover(maps, 0x651000, 0), -EFAULT, "empty");
	cr_assert_eq(agent__maps_cover(maps, UINT64_MAX - 1, 4), -EFAULT, "overflow");
	cr_assert_eq(agent__maps_cover("garbage\n", 0x1000, 1), -EFAULT, "not maps");
	cr_assert_eq(agent__maps_cover("", 0x1000, 1), -EFAULT, "nothing mapped");
}

Test(agent_mem, check_process)
{
	size_t ps = (size_t)sysconf(_SC_PAGESIZE);
	uint8_t *rw = mmap(NULL, 3 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			   -1, 0);
	cr_assert(rw != MAP_FAILED);
	uint64_t a = (uint64_t)(uintptr_t)rw;
	cr_assert_eq(agent__check_process(getpid(), a + 5, 3 * ps - 5), 0,
		     "malloc-like memory");
	cr_assert_eq(mprotect(rw + ps, ps, PROT_READ), 0);
	cr_assert_eq(agent__check_process(getpid(), a, 3 * ps), -EFAULT, "a read-only page");
	cr_assert_eq(munmap(rw + 2 * ps, ps), 0);
	cr_assert_eq(agent__check_process(getpid(), a, ps + 1), -EFAULT, "still read-only");
	cr_assert_eq(agent__check_process(getpid(), a + 2 * ps, 8), -EFAULT, "unmapped");
	munmap(rw, 2 * ps);

	pid_t pid = fork();
	if (pid == 0)
		_exit(0);
	cr_assert_eq(waitpid(pid, NULL, 0), pid);
	cr_assert_eq(agent__check_process(pid, a, 8), -ESRCH, "an exited process");
}
