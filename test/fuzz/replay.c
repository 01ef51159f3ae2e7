/*
 * Replay driver: runs a libFuzzer target's entry point over files given on
 * the command line (a corpus), so every build exercises the fuzz targets
 * on their seeds without clang. `make fuzz` builds the real fuzzers.
 * A target run without a single input fails: a corpus that is missing
 * (or a glob that matched nothing) would otherwise pass while testing
 * nothing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
	int n = 0;
	if (argc < 2) {
		fprintf(stderr, "%s: no corpus: give the target seed inputs in "
				"test/fuzz/corpus/<target>/\n",
			argv[0]);
		return 1;
	}
	for (int i = 1; i < argc; i++) {
		FILE *f = fopen(argv[i], "rb");
		if (!f) {
			perror(argv[i]);
			return 1;
		}
		fseek(f, 0, SEEK_END);
		long len = ftell(f);
		fseek(f, 0, SEEK_SET);
		uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
		if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
			fprintf(stderr, "%s: read failed\n", argv[i]);
			return 1;
		}
		fclose(f);
		LLVMFuzzerTestOneInput(buf, (size_t)len);
		free(buf);
		n++;
	}
	printf("replayed %d inputs\n", n);
	return 0;
}
