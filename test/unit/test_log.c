/*
 * Mirror test of src/common/log.c: level specs and the identical-line
 * rate limiter (driven with a fake clock).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "common/log.h"

Test(log_levels, specs)
{
	unsigned char lv[LOGS_COUNT];
	char err[256];
	cr_assert_eq(log_parse_levels("info", lv, err, sizeof(err)), 0);
	cr_assert_eq(lv[LOGS_RAFT], LOG_INFO);
	cr_assert_eq(log_parse_levels("info,raft=debug", lv, err, sizeof(err)), 0);
	cr_assert_eq(lv[LOGS_RAFT], LOG_DEBUG);
	cr_assert_eq(lv[LOGS_RPC], LOG_INFO);
	/* Order does not matter: the bare level is the base. */
	cr_assert_eq(log_parse_levels("rpc=trace,warn", lv, err, sizeof(err)), 0);
	cr_assert_eq(lv[LOGS_RPC], LOG_TRACE);
	cr_assert_eq(lv[LOGS_META], LOG_WARN);
	cr_assert_eq(log_parse_levels("ERROR", lv, err, sizeof(err)), 0);
	cr_assert_eq(lv[LOGS_MAIN], LOG_ERROR);
	cr_assert_eq(log_parse_levels("warning", lv, err, sizeof(err)), 0);
	cr_assert_eq(lv[LOGS_MAIN], LOG_WARN);
	/* A subsystem-only spec keeps INFO for the others. */
	cr_assert_eq(log_parse_levels("raft=debug", lv, err, sizeof(err)), 0);
	cr_assert_eq(lv[LOGS_MAIN], LOG_INFO);
}

Test(log_levels, errors)
{
	unsigned char lv[LOGS_COUNT];
	char err[256];
	const char *bad[] = {"",     ",",     "info,",  ",info",        "info,,raft=debug",
			     "loud", "raft=", "=debug", "nosuch=debug", "raft=loud"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		cr_assert_eq(log_parse_levels(bad[i], lv, err, sizeof(err)), -EINVAL, "%s",
			     bad[i]);
		cr_assert(err[0] != '\0', "message for %s", bad[i]);
	}
	cr_assert_eq(log_parse_levels("nosuch=debug", lv, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "unknown subsystem 'nosuch'"));
}

Test(log_levels, default_is_info_not_debug)
{
	cr_assert(log_enabled(LOGS_RAFT, LOG_INFO));
	cr_assert(!log_enabled(LOGS_RAFT, LOG_DEBUG));
}

struct report {
	int calls;
	uint32_t last;
	char text[LOG_RL_TEXT];
};

static void on_report(void *ctx, const char *text, uint32_t n)
{
	struct report *r = ctx;
	r->calls++;
	r->last = n;
	strncpy(r->text, text, sizeof(r->text) - 1);
}

Test(log_ratelimit, burst_then_suppress_then_report)
{
	static struct log_rl rl;
	struct report rep = {0};
	memset(&rl, 0, sizeof(rl));
	int written = 0;
	for (int i = 0; i < 100; i++)
		written += log_rl_admit(&rl, 42, "WARN rpc: boom", 1000 + (uint64_t)i,
					on_report, &rep);
	cr_assert_eq(written, LOG_RL_BURST);
	cr_assert_eq(rep.calls, 0, "nothing reported inside the window");
	/* The window ends: the next identical line is written and the count
	 * of the 95 suppressed ones is reported first. */
	cr_assert(log_rl_admit(&rl, 42, "WARN rpc: boom", 1000 + LOG_RL_WINDOW_MS, on_report,
			       &rep));
	cr_assert_eq(rep.calls, 1);
	cr_assert_eq(rep.last, 100 - LOG_RL_BURST);
	cr_assert_str_eq(rep.text, "WARN rpc: boom");
}

Test(log_ratelimit, expire_reports_quiet_windows)
{
	static struct log_rl rl;
	struct report rep = {0};
	memset(&rl, 0, sizeof(rl));
	for (int i = 0; i < 8; i++)
		log_rl_admit(&rl, 7, "x", 0, on_report, &rep);
	log_rl_expire(&rl, LOG_RL_WINDOW_MS - 1, on_report, &rep);
	cr_assert_eq(rep.calls, 0, "window still open");
	log_rl_expire(&rl, LOG_RL_WINDOW_MS, on_report, &rep);
	cr_assert_eq(rep.calls, 1);
	cr_assert_eq(rep.last, 8 - LOG_RL_BURST);
	log_rl_expire(&rl, UINT64_MAX, on_report, &rep);
	cr_assert_eq(rep.calls, 1, "reported once");
}

Test(log_ratelimit, different_lines_and_slot_reuse)
{
	static struct log_rl rl;
	struct report rep = {0};
	memset(&rl, 0, sizeof(rl));
	/* Distinct messages are never suppressed by each other. */
	for (uint64_t h = 0; h < 50; h++)
		cr_assert(log_rl_admit(&rl, h, "m", 5, on_report, &rep));
	/* Two hashes in one slot: the newcomer closes the old window and
	 * its suppressed count is reported, not lost. */
	for (int i = 0; i < 9; i++)
		log_rl_admit(&rl, 1000, "old", 10, on_report, &rep);
	cr_assert(log_rl_admit(&rl, 1000 + LOG_RL_SLOTS, "new", 11, on_report, &rep));
	cr_assert_eq(rep.calls, 1);
	cr_assert_eq(rep.last, 9 - LOG_RL_BURST);
	cr_assert_str_eq(rep.text, "old");
	log_flush();
}

/* ------------------------------------------------------------ rotation */

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOG_SUBSYS LOGS_MAIN

static off_t file_size(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? st.st_size : -1;
}

static size_t count_lines(const char *path, const char *needle)
{
	FILE *f = fopen(path, "r");
	char line[8192];
	size_t n = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

Test(log_rotation, by_size_keeps_n_files_and_sighup_reopen_still_works)
{
	char dir[] = "/tmp/mooncake-logrot-XXXXXX";
	cr_assert(mkdtemp(dir));
	char path[256], p[300];
	snprintf(path, sizeof(path), "%s/d.log", dir);
	cr_assert_eq(log_open_file(path), 0);
	log_set_rotation(4096, 3);
	/* Distinct lines (the rate limiter lets identical ones through only
	 * in bursts), ~100 bytes each: ~40 per file, 600 in all. */
	for (int i = 0; i < 600; i++)
		log_warn("rotation test line %04d %s", i,
			 "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
	cr_assert_leq(file_size(path), 4096);
	for (int i = 1; i <= 3; i++) {
		snprintf(p, sizeof(p), "%s.%d", path, i);
		off_t sz = file_size(p);
		cr_assert(sz > 3000 && sz <= 4096, "%s has %lld bytes", p, (long long)sz);
	}
	snprintf(p, sizeof(p), "%s.4", path);
	cr_assert_eq(file_size(p), -1, "only --log-max-files rotated files are kept");
	/* The newest line is in the file, the one before the rotation in .1,
	 * and no line was cut in two. */
	cr_assert_eq(count_lines(path, "rotation test line 0599"), 1);
	size_t whole = count_lines(path, "xxxxxxx\n");
	cr_assert_eq(whole, count_lines(path, "rotation test line"));

	/* logrotate's way: rename, SIGHUP (log_reopen), a new file begins. */
	snprintf(p, sizeof(p), "%s/moved.log", dir);
	cr_assert_eq(rename(path, p), 0);
	cr_assert_eq(log_reopen(), 0);
	log_warn("after reopen");
	cr_assert_eq(count_lines(path, "after reopen"), 1);
	cr_assert_eq(count_lines(p, "after reopen"), 0);

	log_set_rotation(0, 5);
	cr_assert_eq(log_open_file(NULL), 0);
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	cr_assert_eq(system(cmd), 0);
}
