/*
 * libmooncake: version and error names. The store calls (mc_open, mc_put,
 * mc_get, ...) talk to the local agent's Unix socket.
 */
#include "client/mooncake.h"

#define MC__PUBLIC __attribute__((visibility("default")))

MC__PUBLIC const char *mc_version(void)
{
	return MC_VERSION;
}
