/*
 * ctl_secret: `mooncakectl secret create FILE` — write a new cluster
 * secret for --cluster-secret-file: 32 random bytes as 64 hex digits,
 * mode 0600, created atomically and never over an existing file
 * (mc_secret_create). The operator copies it to every host of the
 * cluster, owned by the user the daemon runs as.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/auth.h"
#include "common/err.h"
#include "ctl/ctl_int.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: mooncakectl secret create FILE\n\n"
		   "  Write a new random cluster secret to FILE (64 hex digits, mode 0600).\n"
		   "  An existing FILE is never replaced. Give every host of the cluster the\n"
		   "  same file, readable only by the daemon's user, with\n"
		   "  --cluster-secret-file=FILE (or cluster-secret-file in mooncaked.conf,\n"
		   "  or MOONCAKE_CLUSTER_SECRET_FILE). Run it as that user, or chown the\n"
		   "  file afterwards (for the shipped units: chown mooncake: FILE).\n");
}

int ctl_secret_main(int argc, char **argv)
{
	if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
		usage(stdout);
		return CTL_EXIT_OK;
	}
	if (argc != 3 || strcmp(argv[1], "create") != 0 || !argv[2][0] || argv[2][0] == '-') {
		usage(stderr);
		return CTL_EXIT_USAGE;
	}
	int rc = mc_secret_create(argv[2]);
	if (rc == -EEXIST) {
		fprintf(stderr,
			"mooncakectl secret: %s exists; it is left as it is (remove it "
			"first to replace it, on every host at once)\n",
			argv[2]);
		return CTL_EXIT_FAIL;
	}
	if (rc) {
		fprintf(stderr, "mooncakectl secret: cannot create %s: %s\n", argv[2],
			mc_strerror(rc));
		return CTL_EXIT_FAIL;
	}
	printf("created %s (mode 0600): give every host this file with "
	       "--cluster-secret-file=%s\n",
	       argv[2], argv[2]);
	return CTL_EXIT_OK;
}
