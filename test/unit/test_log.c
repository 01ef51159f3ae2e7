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
	const char *bad[] = {"", ",", "info,", ",info", "info,,raft=debug",
			     "loud", "raft=", "=debug", "nosuch=debug", "raft=loud"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		cr_assert_eq(log_parse_levels(bad[i], lv, err, sizeof(err)), -EINVAL,
			     "%s", bad[i]);
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
	cr_assert(log_rl_admit(&rl, 42, "WARN rpc: boom", 1000 + LOG_RL_WINDOW_MS,
			       on_report, &rep));
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
