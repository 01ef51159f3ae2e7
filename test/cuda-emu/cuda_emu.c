/*
 * cuda-emu: a TEST stand-in for the CUDA driver (libcuda.so.1), enough of
 * its API for libmooncake's device-memory paths (src/client/device.c) on
 * machines without a GPU. Never installed.
 *
 * "Device memory" from cuMemAlloc_v2 is address space mapped PROT_NONE:
 * the CPU cannot read or write it, as with a real GPU's memory, so a test
 * that hands it to libmooncake fails with a fault if the library ever
 * copies it with the CPU. cuPointerGetAttribute knows it as device memory
 * (not managed); cuMemGetHandleForAddressRange answers
 * CUDA_ERROR_NOT_SUPPORTED (no dma-bufs here). Anything else is
 * CUDA_ERROR_INVALID_VALUE.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_SUPPORTED 801
#define ATTR_MEMORY_TYPE 2
#define ATTR_IS_MANAGED 8
#define MEMORYTYPE_DEVICE 2
#define MAX_ALLOCS 64

struct alloc {
	uint64_t base;
	size_t size;
};

static struct alloc allocs[MAX_ALLOCS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static const struct alloc *find(uint64_t p)
{
	for (int i = 0; i < MAX_ALLOCS; i++)
		if (allocs[i].size && p >= allocs[i].base &&
		    p - allocs[i].base < allocs[i].size)
			return &allocs[i];
	return NULL;
}

int cuInit(unsigned flags)
{
	return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

int cuMemAlloc_v2(uint64_t *out, size_t size)
{
	if (!out || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
		       0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&mu);
	int i = 0;
	while (i < MAX_ALLOCS && allocs[i].size)
		i++;
	if (i < MAX_ALLOCS)
		allocs[i] = (struct alloc){(uint64_t)(uintptr_t)p, size};
	pthread_mutex_unlock(&mu);
	if (i == MAX_ALLOCS) {
		munmap(p, size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*out = (uint64_t)(uintptr_t)p;
	return CUDA_SUCCESS;
}

int cuMemFree_v2(uint64_t p)
{
	pthread_mutex_lock(&mu);
	struct alloc *a = (struct alloc *)find(p);
	struct alloc copy = a && a->base == p ? *a : (struct alloc){0, 0};
	if (copy.size)
		a->size = 0;
	pthread_mutex_unlock(&mu);
	if (!copy.size)
		return CUDA_ERROR_INVALID_VALUE;
	munmap((void *)(uintptr_t)copy.base, copy.size);
	return CUDA_SUCCESS;
}

int cuPointerGetAttribute(void *data, int attr, uint64_t p)
{
	pthread_mutex_lock(&mu);
	const struct alloc *a = find(p);
	pthread_mutex_unlock(&mu);
	if (!a || !data)
		return CUDA_ERROR_INVALID_VALUE;
	if (attr == ATTR_MEMORY_TYPE)
		*(unsigned *)data = MEMORYTYPE_DEVICE;
	else if (attr == ATTR_IS_MANAGED)
		*(unsigned *)data = 0;
	else
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

int cuMemGetAddressRange_v2(uint64_t *base, size_t *size, uint64_t p)
{
	pthread_mutex_lock(&mu);
	const struct alloc *a = find(p);
	struct alloc copy = a ? *a : (struct alloc){0, 0};
	pthread_mutex_unlock(&mu);
	if (!copy.size)
		return CUDA_ERROR_INVALID_VALUE;
	if (base)
		*base = copy.base;
	if (size)
		*size = copy.size;
	return CUDA_SUCCESS;
}

int cuMemGetHandleForAddressRange(void *handle, uint64_t p, size_t size, int type,
				  unsigned long long flags)
{
	(void)handle;
	(void)p;
	(void)size;
	(void)type;
	(void)flags;
	return CUDA_ERROR_NOT_SUPPORTED;
}
