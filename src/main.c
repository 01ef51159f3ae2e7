/*
 * mooncaked: flag parsing and role dispatch, nothing else. The process
 * frame (locking, signals, listeners) is src/daemon/.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cfg.h"
#include "daemon/daemon.h"

extern char **environ;

int main(int argc, char **argv)
{
	struct cfg cfg;
	struct cfg_cmdline cl;
	char err[1024];

	if (cfg_load(&cfg, argc, argv, environ, &cl, err, sizeof(err)) != 0) {
		fprintf(stderr, "mooncaked: %s\n", err);
		return 2;
	}
	int rc = 0;
	bool serve = !cl.help && !cl.version && !cl.print_config && !cl.print_man_options;
	/* A daemon logs them (to --log-file too); other modes say them here. */
	for (const char *w = cfg_warnings(&cfg); !serve && *w;) {
		size_t n = strcspn(w, "\n");
		fprintf(stderr, "mooncaked: warning: %.*s\n", (int)n, w);
		w += n + (w[n] == '\n');
	}
	if (cl.help) {
		cfg_print_help(stdout, "mooncaked");
	} else if (cl.version) {
		printf("mooncaked %s (%s)\n", MC_VERSION, MC_GITREV);
	} else if (cl.print_config) {
		cfg_print_effective(stdout, &cfg);
	} else if (cl.print_man_options) {
		cfg_print_man_options(stdout);
	} else {
		rc = daemon_run(&cfg);
	}
	cfg_free(&cfg);
	return rc;
}
