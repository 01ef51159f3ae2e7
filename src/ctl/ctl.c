/*
 * mooncakectl: the operator's command-line tool.
 */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--version") == 0) {
		printf("mooncakectl %s (%s)\n", MC_VERSION, MC_GITREV);
		return 0;
	}
	fprintf(stderr, "usage: mooncakectl --version\n");
	return 2;
}
