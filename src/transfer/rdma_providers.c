/*
 * rdma_providers: registers libibverbs' statically linked providers
 * (mlx5, rxe, ...). A static libibverbs finds no device without it.
 * Only the production link names this object explicitly (Makefile: it is
 * compiled with -DRDMA_STATIC_PROVIDERS=all there); rdma_dev.c refers to it
 * weakly, so test and dynamic builds, which get their providers (or the
 * verbs-emu test device) from elsewhere, do not pull it in.
 */
#include <infiniband/verbs.h>

void te_rdma__static_providers(void);

void te_rdma__static_providers(void)
{
#ifdef RDMA_STATIC_PROVIDERS
	ibv_static_providers(NULL, _RDMA_STATIC_PREFIX(RDMA_STATIC_PROVIDERS), NULL);
#endif
}
