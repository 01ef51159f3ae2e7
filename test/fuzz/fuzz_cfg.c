/* Fuzz target: the INI config file parser (cfg_parse_ini). */
#include <stdint.h>
#include <stdlib.h>

#include "common/cfg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char *const argv[] = {"mooncaked", "--config=", NULL};
	static char *const envp[] = {NULL};
	struct cfg c;
	struct cfg_cmdline cl;
	char err[512];
	if (cfg_load(&c, 2, argv, envp, &cl, err, sizeof(err)) != 0)
		abort();
	(void)!cfg_parse_ini(&c, "fuzz", (const char *)data, size, err, sizeof(err));
	cfg_free(&c);
	return 0;
}
