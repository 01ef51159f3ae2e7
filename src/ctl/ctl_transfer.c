/*
 * ctl_transfer: `mooncakectl transfer` — a transfer engine in this
 * process, with a registered buffer of its own, driven by commands: check
 * the data path to a segment (an agent, or another `mooncakectl transfer`)
 * byte for byte, see refusals, or serve as a target. Commands come one per
 * line from stdin, or from -c 'CMD; CMD'; each prints one line, "ok ..."
 * or "error ...". The exit status is 1 when any command failed.
 *
 * Data is the test pattern keyed by remote address and a seed
 * (ctl_te.h), so a reader checks every byte without knowing who wrote it:
 * `--fill=SEED` writes it into this process's buffer at start, `write`
 * sends it, `read` checks it. The local side of a transfer is plain
 * memory, or (--local-memory=registered, the default when the engine uses
 * rdma, where one-sided operations need it) a buffer registered with the
 * engine and reused.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/cfg.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/util.h"
#include "ctl/ctl_int.h"
#include "ctl/ctl_te.h"

#define MAX_BUFS 64
#define MAX_SEGS 64

struct shell {
	struct ctl_te h;
	struct ctl_buf bufs[MAX_BUFS];
	size_t nbufs;
	struct {
		char name[256];
		struct te_segment *s;
	} segs[MAX_SEGS];
	size_t nsegs;
	uint64_t wait_ms;
	int failures;
	bool registered_local;  /* transfers from/to the scratch buffer */
	struct ctl_buf scratch; /* registered, grown on demand */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mooncakectl transfer [FLAGS] [-c 'CMD; CMD...'] [--serve]\n\n"
		"Run a transfer engine with a registered memory buffer in this "
		"process,\nprint \"ready NAME\" once peers can find its segment, "
		"then run commands\n(from -c, else one per line from stdin), "
		"printing one line each: \"ok ...\"\nor \"error CODE text\". With "
		"--serve, keep serving after the commands\nuntil SIGTERM/SIGINT.\n\n"
		"flags:\n"
		"  --buffer=SIZE             memfd buffer registered at start "
		"(default 64M;\n"
		"                            0: none)\n"
		"  --fill=SEED               fill it with the test pattern SEED\n"
		"  --wait=DURATION           per-batch timeout (default 60s)\n"
		"  --local-memory=M          where transfers read/write locally: "
		"malloc,\n"
		"                            registered (with the engine), or auto "
		"(default:\n"
		"                            registered when the protocol in use is "
		"rdma)\n"
		"%s\n"
		"commands (SEG: a segment name; OFF: offset into its first region, "
		"or\n@ADDR an absolute remote address, decimal or 0x hex):\n"
		"  info                          this engine's segment and "
		"buffers\n"
		"  open SEG                      open it; list its regions\n"
		"  write SEG OFF LEN [SEED] [N]  one batch of N requests of LEN "
		"bytes at\n"
		"                                OFF, OFF+LEN, ... carrying "
		"pattern SEED\n"
		"  read SEG OFF LEN [SEED] [N]   the same reads, every byte checked "
		"against\n"
		"                                SEED (0: not checked); prints the "
		"crc32c\n"
		"  stress SEG OFF LEN N SECONDS  write batches until SECONDS pass "
		"or one\n"
		"                                fails; prints \"progress\" after "
		"the first\n"
		"  register SIZE [SEED]          register another buffer (prints "
		"its address)\n"
		"  unregister ADDR               unregister a buffer registered "
		"here\n"
		"  metrics [PREFIX]              this process's metrics whose name "
		"starts\n"
		"                                with PREFIX, \"; \"-separated\n"
		"  quit\n",
		ctl_te_flags_help);
}

static void reply(struct shell *sh, bool ok, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void reply(struct shell *sh, bool ok, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs(ok ? "ok " : "error ", stdout);
	vprintf(fmt, ap);
	putchar('\n');
	fflush(stdout);
	va_end(ap);
	if (!ok)
		sh->failures++;
}

static void reply_err(struct shell *sh, const char *what, int err)
{
	reply(sh, false, "%s %s %s", what, mc_errname(err), mc_strerror(err));
}

static int get_seg(struct shell *sh, const char *name, struct te_segment **out)
{
	for (size_t i = 0; i < sh->nsegs; i++) {
		if (strcmp(sh->segs[i].name, name) == 0) {
			*out = sh->segs[i].s;
			return 0;
		}
	}
	if (sh->nsegs == MAX_SEGS || strlen(name) >= sizeof(sh->segs[0].name))
		return -E2BIG;
	int rc = te_open_segment(sh->h.te, name, out);
	if (rc)
		return rc;
	snprintf(sh->segs[sh->nsegs].name, sizeof(sh->segs[0].name), "%s", name);
	sh->segs[sh->nsegs++].s = *out;
	return 0;
}

static int parse_u64(const char *s, uint64_t *v)
{
	char *end;
	if (!s || !*s)
		return -EINVAL;
	errno = 0;
	*v = strtoull(s, &end, 0);
	return errno || *end ? -EINVAL : 0;
}

static int parse_len(const char *s, uint64_t *v)
{
	if (!s)
		return -EINVAL;
	if (cfg_parse_size(s, v) == 0)
		return 0;
	/* "1M+1" */
	const char *plus = strchr(s, '+');
	if (plus) {
		char a[64];
		uint64_t x, y;
		size_t n = (size_t)(plus - s);
		if (n >= sizeof(a))
			return -EINVAL;
		memcpy(a, s, n);
		a[n] = '\0';
		if (cfg_parse_size(a, &x) == 0 && parse_u64(plus + 1, &y) == 0) {
			*v = x + y;
			return 0;
		}
	}
	return parse_u64(s, v);
}

/* OFF or @ADDR into a remote address. */
static int resolve_addr(struct te_segment *s, const char *off, uint64_t *addr)
{
	if (off[0] == '@')
		return parse_u64(off + 1, addr);
	uint64_t o;
	if (parse_len(off, &o))
		return -EINVAL;
	struct te_region_info r;
	if (te_segment_info(s, NULL, &r, 1) == 0)
		return -ENOENT;
	*addr = r.addr + o;
	return 0;
}

static void cmd_info(struct shell *sh)
{
	printf("ok info %s protocol=%s buffers=%zu", te_name(sh->h.te),
	       te_protocol_name(te_protocol_in_use(sh->h.te)), sh->nbufs);
	for (size_t i = 0; i < sh->nbufs; i++)
		printf(" 0x%" PRIx64 "+%zu", (uint64_t)(uintptr_t)sh->bufs[i].p,
		       sh->bufs[i].len);
	putchar('\n');
	fflush(stdout);
}

static void cmd_open(struct shell *sh, char **a, int n)
{
	struct te_segment *s;
	if (n != 1) {
		reply(sh, false, "open usage: open SEG");
		return;
	}
	int rc = get_seg(sh, a[0], &s);
	if (rc) {
		reply_err(sh, "open", rc);
		return;
	}
	struct te_segment_info info;
	struct te_region_info r[16];
	size_t nr = te_segment_info(s, &info, r, 16);
	printf("ok open %s transport=%s regions=%zu", a[0], te_protocol_name(info.transport),
	       nr);
	for (size_t i = 0; i < nr && i < 16; i++)
		printf(" 0x%" PRIx64 "+%" PRIu64 "%s", r[i].addr, r[i].len,
		       r[i].shm ? "(shm)" : "");
	putchar('\n');
	fflush(stdout);
}

/* Submit and wait for one batch; on failure *failed = how many failed and
 * the first error is returned. */
static int run_batch(struct shell *sh, struct te_request *reqs, size_t n, size_t *failed)
{
	struct te_batch *b;
	int rc = te_submit(sh->h.te, reqs, n, &b);
	if (rc)
		return rc;
	rc = te_wait(b, sh->wait_ms);
	if (rc) {
		/* The engine still owns the buffers until the batch ends:
		 * report the timeout, then wait it out (paths time out). */
		te_batch_free(b);
		return rc;
	}
	struct te_result *res = calloc(n, sizeof(*res));
	if (!res) {
		te_batch_free(b);
		return -ENOMEM;
	}
	(void)te_poll(b, res);
	*failed = 0;
	for (size_t i = 0; i < n; i++) {
		if (res[i].status == TE_FAILED) {
			if (!*failed)
				rc = res[i].err;
			(*failed)++;
		}
	}
	free(res);
	te_batch_free(b);
	return rc;
}

/* Local memory for a transfer of len bytes: malloc'd (free it), or the
 * registered scratch buffer (do not). NULL when out of memory. */
static uint8_t *local_get(struct shell *sh, size_t len)
{
	if (!sh->registered_local)
		return malloc(len ? len : 1);
	if (sh->scratch.len < len || !sh->scratch.p) {
		ctl_buf_free(&sh->scratch);
		int rc = ctl_buf_new(&sh->h, MC_MAX(len, (size_t)4096), &sh->scratch);
		if (rc) {
			fprintf(stderr,
				"mooncakectl transfer: cannot register %zu bytes of "
				"local memory: %s\n",
				len, mc_strerror(rc));
			return NULL;
		}
	}
	return sh->scratch.p;
}

static void local_put(struct shell *sh, uint8_t *p)
{
	if (p != sh->scratch.p)
		free(p);
}

static void cmd_rw(struct shell *sh, bool write, char **a, int n)
{
	const char *what = write ? "write" : "read";
	uint64_t addr, len, seed = write ? 1 : 0, count = 1;
	struct te_segment *s;
	if (n < 3 || n > 5 || parse_len(a[2], &len) || (n > 3 && parse_u64(a[3], &seed)) ||
	    (n > 4 && parse_u64(a[4], &count)) || count == 0 || count > (1u << 20) ||
	    (len && count > SIZE_MAX / len)) {
		reply(sh, false, "%s usage: %s SEG OFF LEN [SEED] [N]", what, what);
		return;
	}
	int rc = get_seg(sh, a[0], &s);
	if (rc == 0)
		rc = resolve_addr(s, a[1], &addr);
	if (rc) {
		reply_err(sh, what, rc);
		return;
	}
	size_t total = (size_t)(len * count);
	uint8_t *buf = local_get(sh, total);
	struct te_request *reqs = calloc((size_t)count, sizeof(*reqs));
	if (!buf || !reqs) {
		if (buf)
			local_put(sh, buf);
		free(reqs);
		reply_err(sh, what, -ENOMEM);
		return;
	}
	if (write && seed)
		ctl_pattern_fill(buf, total, seed, addr);
	else if (!write)
		memset(buf, 0, total);
	for (uint64_t i = 0; i < count; i++)
		reqs[i] = (struct te_request){.op = write ? TE_WRITE : TE_READ,
					      .local = buf + i * len,
					      .segment = s,
					      .remote_addr = addr + i * len,
					      .len = (size_t)len};
	size_t failed = 0;
	uint64_t t0 = mc_now_ns();
	rc = run_batch(sh, reqs, (size_t)count, &failed);
	uint64_t us = (mc_now_ns() - t0) / 1000;
	if (rc) {
		if (failed)
			reply(sh, false, "%s %s %s (%zu of %" PRIu64 " requests failed)", what,
			      mc_errname(rc), mc_strerror(rc), failed, count);
		else
			reply_err(sh, what, rc);
	} else if (!write && seed && ctl_pattern_check(buf, total, seed, addr) != total) {
		size_t at = ctl_pattern_check(buf, total, seed, addr);
		reply(sh, false,
		      "%s MISMATCH byte %zu (remote 0x%" PRIx64 ") differs "
		      "from pattern %" PRIu64,
		      what, at, addr + at, seed);
	} else {
		reply(sh, true,
		      "%s %s bytes=%zu requests=%" PRIu64 " crc32c=%08x us=%" PRIu64 "%s",
		      what, a[0], total, count, crc32c(0, buf, total), us,
		      !write && seed ? " verified" : "");
	}
	free(reqs);
	local_put(sh, buf);
}

static void cmd_stress(struct shell *sh, char **a, int n)
{
	uint64_t addr, len, count, secs;
	struct te_segment *s;
	if (n != 5 || parse_len(a[2], &len) || parse_u64(a[3], &count) ||
	    parse_u64(a[4], &secs) || count == 0 || count > 4096 || len == 0 ||
	    len > (64u << 20)) {
		reply(sh, false, "stress usage: stress SEG OFF LEN N SECONDS");
		return;
	}
	int rc = get_seg(sh, a[0], &s);
	if (rc == 0)
		rc = resolve_addr(s, a[1], &addr);
	if (rc) {
		reply_err(sh, "stress", rc);
		return;
	}
	uint8_t *buf = local_get(sh, (size_t)(len * count));
	struct te_request *reqs = calloc((size_t)count, sizeof(*reqs));
	if (!buf || !reqs) {
		if (buf)
			local_put(sh, buf);
		free(reqs);
		reply_err(sh, "stress", -ENOMEM);
		return;
	}
	ctl_pattern_fill(buf, (size_t)(len * count), 1, addr);
	for (uint64_t i = 0; i < count; i++)
		reqs[i] = (struct te_request){.op = TE_WRITE,
					      .local = buf + i * len,
					      .segment = s,
					      .remote_addr = addr + i * len,
					      .len = (size_t)len};
	uint64_t end = mc_now_ms() + secs * 1000, batches = 0;
	size_t failed = 0;
	while (mc_now_ms() < end) {
		rc = run_batch(sh, reqs, (size_t)count, &failed);
		if (rc)
			break;
		if (batches++ == 0) {
			printf("progress stress %s\n", a[0]);
			fflush(stdout);
		}
	}
	if (rc)
		reply(sh, false, "stress %s %s after %" PRIu64 " batches", mc_errname(rc),
		      mc_strerror(rc), batches);
	else
		reply(sh, true, "stress %s batches=%" PRIu64 " bytes=%" PRIu64, a[0], batches,
		      batches * len * count);
	free(reqs);
	local_put(sh, buf);
}

static void cmd_register(struct shell *sh, char **a, int n)
{
	uint64_t size, seed = 0;
	if (n < 1 || n > 2 || parse_len(a[0], &size) || size == 0 ||
	    (n > 1 && parse_u64(a[1], &seed)) || sh->nbufs == MAX_BUFS) {
		reply(sh, false, "register usage: register SIZE [SEED]");
		return;
	}
	struct ctl_buf *b = &sh->bufs[sh->nbufs];
	int rc = ctl_buf_new(&sh->h, (size_t)size, b);
	if (rc) {
		reply_err(sh, "register", rc);
		return;
	}
	if (seed)
		ctl_pattern_fill(b->p, b->len, seed, (uint64_t)(uintptr_t)b->p);
	sh->nbufs++;
	reply(sh, true, "register 0x%" PRIx64 "+%zu", (uint64_t)(uintptr_t)b->p, b->len);
}

static void cmd_unregister(struct shell *sh, char **a, int n)
{
	uint64_t addr;
	if (n != 1 || parse_u64(a[0], &addr)) {
		reply(sh, false, "unregister usage: unregister ADDR");
		return;
	}
	for (size_t i = 0; i < sh->nbufs; i++) {
		if ((uint64_t)(uintptr_t)sh->bufs[i].p == addr) {
			ctl_buf_free(&sh->bufs[i]);
			sh->bufs[i] = sh->bufs[--sh->nbufs];
			reply(sh, true, "unregister 0x%" PRIx64, addr);
			return;
		}
	}
	reply_err(sh, "unregister", -ENOENT);
}

static void cmd_metrics(struct shell *sh, char **a, int n)
{
	struct mc_buf b = {0};
	const char *prefix = n > 0 ? a[0] : "";
	if (n > 1 || metrics_format(metrics_global(), &b) != 0) {
		mc_buf_free(&b);
		reply(sh, false, "metrics usage: metrics [PREFIX]");
		return;
	}
	fputs("ok metrics", stdout);
	const char *sep = " ";
	for (char *line = b.data, *end; line && line < b.data + b.len; line = end + 1) {
		end = memchr(line, '\n', (size_t)(b.data + b.len - line));
		if (!end)
			end = b.data + b.len;
		if (line[0] != '#' && strncmp(line, prefix, strlen(prefix)) == 0) {
			printf("%s%.*s", sep, (int)(end - line), line);
			sep = "; ";
		}
	}
	putchar('\n');
	fflush(stdout);
	mc_buf_free(&b);
}

/* Run one command line. Returns false on quit. */
static bool run_line(struct shell *sh, char *line)
{
	char *a[8];
	int n = 0;
	for (char *tok = strtok(line, " \t\r\n"); tok && n < 8; tok = strtok(NULL, " \t\r\n"))
		a[n++] = tok;
	if (n == 0 || a[0][0] == '#')
		return true;
	if (strcmp(a[0], "quit") == 0)
		return false;
	if (strcmp(a[0], "info") == 0)
		cmd_info(sh);
	else if (strcmp(a[0], "open") == 0)
		cmd_open(sh, a + 1, n - 1);
	else if (strcmp(a[0], "write") == 0 || strcmp(a[0], "read") == 0)
		cmd_rw(sh, a[0][0] == 'w', a + 1, n - 1);
	else if (strcmp(a[0], "stress") == 0)
		cmd_stress(sh, a + 1, n - 1);
	else if (strcmp(a[0], "register") == 0)
		cmd_register(sh, a + 1, n - 1);
	else if (strcmp(a[0], "unregister") == 0)
		cmd_unregister(sh, a + 1, n - 1);
	else if (strcmp(a[0], "metrics") == 0)
		cmd_metrics(sh, a + 1, n - 1);
	else
		reply(sh, false, "%s unknown command", a[0]);
	return true;
}

int ctl_transfer_main(int argc, char **argv)
{
	struct ctl_te_opts o = CTL_TE_OPTS_INIT;
	const char *buffer = "64M", *fill = NULL, *cmds = NULL, *wait = "60s", *v,
		   *local = "auto";
	bool serve = false, ok;
	uint64_t bufsize, seed = 0, wait_ms;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return CTL_EXIT_OK;
		} else if (ctl_te_flag(&o, argc, argv, &i)) {
		} else if (ctl_flag_value(argc, argv, &i, "buffer", &v)) {
			buffer = v;
		} else if (ctl_flag_value(argc, argv, &i, "fill", &v)) {
			fill = v;
		} else if (ctl_flag_value(argc, argv, &i, "wait", &v)) {
			wait = v;
		} else if (ctl_flag_value(argc, argv, &i, "local-memory", &v)) {
			local = v;
		} else if (strcmp(argv[i], "-c") == 0 && i + 1 < argc) {
			cmds = argv[++i];
		} else if (ctl_flag_bool(argv[i], "serve", &serve, &ok)) {
			if (!ok)
				goto bad;
		} else {
			fprintf(stderr, "mooncakectl transfer: unknown argument \"%s\"\n",
				argv[i]);
			goto bad;
		}
	}
	if (!buffer || cfg_parse_size(buffer, &bufsize) || bufsize > (1ull << 40) ||
	    (fill && parse_u64(fill, &seed)) || !wait ||
	    cfg_parse_duration_ms(wait, &wait_ms) || wait_ms == 0 || !local ||
	    (strcmp(local, "auto") && strcmp(local, "malloc") &&
	     strcmp(local, "registered"))) {
		fprintf(stderr, "mooncakectl transfer: bad --buffer, --fill, --wait or "
				"--local-memory\n");
		goto bad;
	}

	struct shell *sh = calloc(1, sizeof(*sh));
	char err[512];
	if (!sh)
		return CTL_EXIT_FAIL;
	sh->wait_ms = wait_ms;
	/* Engine logs at INFO go to stderr too: they say what was connected. */
	unsigned char levels[LOGS_COUNT];
	if (log_parse_levels("info", levels, NULL, 0) == 0)
		log_set_levels(levels);
	sigset_t ss;
	sigemptyset(&ss);
	sigaddset(&ss, SIGTERM);
	sigaddset(&ss, SIGINT);
	if (serve) /* before any thread starts, so every thread blocks them */
		pthread_sigmask(SIG_BLOCK, &ss, NULL);
	if (ctl_te_start(&sh->h, &o, err, sizeof(err)) != 0) {
		fprintf(stderr, "mooncakectl transfer: %s\n", err);
		free(sh);
		return CTL_EXIT_FAIL;
	}
	int rc = CTL_EXIT_OK;
	sh->scratch.fd = -1;
	sh->registered_local = strcmp(local, "registered") == 0 ||
			       (strcmp(local, "auto") == 0 &&
				te_protocol_in_use(sh->h.te) == TE_PROTO_RDMA);
	if (bufsize) {
		int r = ctl_buf_new(&sh->h, (size_t)bufsize, &sh->bufs[0]);
		if (r) {
			fprintf(stderr,
				"mooncakectl transfer: cannot register a %s buffer: "
				"%s\n",
				buffer, mc_strerror(r));
			rc = CTL_EXIT_FAIL;
			goto out;
		}
		if (seed)
			ctl_pattern_fill(sh->bufs[0].p, sh->bufs[0].len, seed,
					 (uint64_t)(uintptr_t)sh->bufs[0].p);
		sh->nbufs = 1;
	}
	int pr = te_wait_published(sh->h.te, 30000);
	if (pr) {
		fprintf(stderr,
			"mooncakectl transfer: segment %s not published in "
			"meta: %s\n",
			sh->h.name, mc_strerror(pr));
		rc = CTL_EXIT_FAIL;
		goto out;
	}
	printf("ready %s\n", sh->h.name);
	fflush(stdout);
	if (cmds) {
		char *copy = strdup(cmds), *save = NULL;
		for (char *c = copy ? strtok_r(copy, ";", &save) : NULL; c;
		     c = strtok_r(NULL, ";", &save))
			if (!run_line(sh, c))
				break;
		free(copy);
	} else if (!serve) {
		char line[1024];
		while (fgets(line, sizeof(line), stdin))
			if (!run_line(sh, line))
				break;
	}
	if (serve) {
		int sig;
		sigwait(&ss, &sig);
	}
	rc = sh->failures ? CTL_EXIT_FAIL : CTL_EXIT_OK;
out:
	for (size_t i = 0; i < sh->nsegs; i++)
		te_close_segment(sh->segs[i].s);
	/* Unregister the buffers (shm peers let go of them), then stop. */
	for (size_t i = 0; i < sh->nbufs; i++)
		ctl_buf_free(&sh->bufs[i]);
	ctl_buf_free(&sh->scratch);
	ctl_te_stop(&sh->h);
	free(sh);
	return rc;
bad:
	usage(stderr);
	return CTL_EXIT_USAGE;
}
