/*
 * Device memory (a GPU's KV cache) for peers' RDMA: a dma-buf of it is
 * handed to the agent (SCM_RIGHTS), which registers it with its RDMA
 * devices at the address the memory has here (mc_register_dmabuf). For
 * CUDA memory the dma-buf comes from the driver: libcuda.so.1 is loaded
 * at run time, only when asked (never linked: a node without CUDA runs
 * this library unchanged), the pointer checked to be device memory, its
 * allocation found and exported whole (cuMemGetHandleForAddressRange).
 */
#include "client/client_int.h"

#include <dlfcn.h>
#include <errno.h>
#include <unistd.h>

MC__PUBLIC int mc_register_dmabuf(mc_client *c, int fd, uint64_t offset, void *addr,
				  size_t len)
{
	if (fd < 0 || !addr || len == 0 || (uintptr_t)addr > UINTPTR_MAX - len)
		return -EINVAL;
	if (mc__overlaps(c, addr, len))
		return -EEXIST;
	Mooncake__Client__RegisterBufferRequest q =
		MOONCAKE__CLIENT__REGISTER_BUFFER_REQUEST__INIT;
	q.offset = offset;
	q.length = len;
	q.address = (uint64_t)(uintptr_t)addr;
	q.dmabuf = true;
	uint64_t id = 0;
	int rc = mc__register_req(c, &q, fd, &id);
	if (rc)
		return rc;
	return mc__range_add_buffer(c, addr, len, id, R_DEVICE);
}

int mc__device_region(mc_client *c, const void *p, size_t len, Region *g)
{
	const uint8_t *a = p;
	int rc = 0;
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < c->nranges && !rc; i++) {
		const struct range *r = &c->ranges[i];
		if (r->kind != R_DEVICE || a >= r->addr + r->len ||
		    r->addr >= a + (len ? len : 1))
			continue;
		if (a < r->addr || len > r->len - (size_t)(a - r->addr)) {
			rc = -EOPNOTSUPP; /* partly device memory */
			break;
		}
		g->where = MOONCAKE__CLIENT__REGION__WHERE__BUFFER;
		g->buffer = r->id;
		g->offset = (uint64_t)(a - r->addr);
		g->length = len;
		rc = 1;
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

bool mc__device_touch(mc_client *c, const void *p, size_t len)
{
	Region g;
	return p && __atomic_load_n(&c->ndevice, __ATOMIC_RELAXED) &&
	       mc__device_region(c, p, len, &g) != 0;
}

bool mc__parts_on_device(mc_client *c, const struct mc_part *parts, size_t n)
{
	for (size_t k = 0; k < n; k++)
		if (mc__device_touch(c, parts[k].buf, parts[k].len))
			return true;
	return false;
}

/* ------------------------------------------------------------ CUDA */

/* The driver API's values this file uses (cuda.h). */
#define CU_SUCCESS 0
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_MEMORYTYPE_DEVICE 2
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 1

struct cuda {
	int (*init)(unsigned flags);
	int (*pointer_attr)(void *data, int attr, uint64_t ptr);
	int (*address_range)(uint64_t *base, size_t *size, uint64_t ptr);
	/* NULL before CUDA 11.7: no dma-bufs */
	int (*handle)(void *handle, uint64_t ptr, size_t size, int type,
		      unsigned long long flags);
};

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static struct cuda cuda_fns;
static bool cuda_ok;

static void cuda_load_once(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return;
	*(void **)&cuda_fns.init = dlsym(h, "cuInit");
	*(void **)&cuda_fns.pointer_attr = dlsym(h, "cuPointerGetAttribute");
	*(void **)&cuda_fns.address_range = dlsym(h, "cuMemGetAddressRange_v2");
	*(void **)&cuda_fns.handle = dlsym(h, "cuMemGetHandleForAddressRange");
	cuda_ok = cuda_fns.init && cuda_fns.pointer_attr && cuda_fns.address_range &&
		  cuda_fns.init(0) == CU_SUCCESS;
	/* The library stays loaded: the process uses CUDA anyway. */
}

/* The driver's entry points, loaded once per process; NULL when the
 * driver is absent. */
static const struct cuda *cuda(void)
{
	pthread_once(&cuda_once, cuda_load_once);
	return cuda_ok ? &cuda_fns : NULL;
}

bool mc__cuda_device(const void *p)
{
	/* Only a process that loaded the driver has device memory: one
	 * that did not is not made to load it here. */
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		return false;
	dlclose(h); /* (the reference RTLD_NOLOAD took) */
	const struct cuda *cu = cuda();
	int type = 0, managed = 0;
	uint64_t a = (uint64_t)(uintptr_t)p;
	return cu &&
	       cu->pointer_attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a) == CU_SUCCESS &&
	       type == CU_MEMORYTYPE_DEVICE &&
	       (cu->pointer_attr(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, a) != CU_SUCCESS ||
		!managed);
}

MC__PUBLIC int mc_register_cuda(mc_client *c, void *addr, size_t len)
{
	if (!addr || len == 0)
		return -EINVAL;
	const struct cuda *cu = cuda();
	if (!cu)
		return -EOPNOTSUPP;
	uint64_t p = (uint64_t)(uintptr_t)addr, base = 0;
	size_t size = 0;
	int type = 0;
	if (cu->pointer_attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) != CU_SUCCESS ||
	    type != CU_MEMORYTYPE_DEVICE)
		return -EINVAL; /* not device memory (or no context) */
	if (cu->address_range(&base, &size, p) != CU_SUCCESS || p - base > size ||
	    len > size - (p - base))
		return -EINVAL; /* not inside one allocation */
	/* The whole allocation, in host pages as the driver wants it. */
	uint64_t ps = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t abase = base & ~(ps - 1);
	uint64_t asize = (base + size - abase + ps - 1) & ~(ps - 1);
	int fd = -1;
	if (!cu->handle ||
	    cu->handle(&fd, abase, (size_t)asize, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) !=
		    CU_SUCCESS ||
	    fd < 0)
		return -EOPNOTSUPP; /* the device exports no dma-bufs */
	int rc = mc_register_dmabuf(c, fd, p - abase, addr, len);
	close(fd);
	return rc;
}
