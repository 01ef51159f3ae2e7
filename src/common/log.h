/*
 * log: one line per event on stderr (or --log-file), with a timestamp, a
 * level and a subsystem:
 *
 *   2026-12-02T18:53:33.123Z INFO  rpc: listening on 127.0.0.1:2379
 *
 * Each subsystem has its own level (`--log-level=info,raft=debug`); the
 * macros test the level before formatting, so a disabled DEBUG line costs
 * one relaxed load. Identical lines (same subsystem, level and text) are
 * rate-limited: a burst of LOG_RL_BURST per LOG_RL_WINDOW_MS window passes,
 * the rest are counted and reported once the window ends ("... suppressed
 * N identical messages"). log_tick() reports windows that ended quietly;
 * the daemon calls it once a second and at exit.
 *
 * Usage, in a .c file:   #define LOG_SUBSYS LOGS_RPC
 *                        log_info("listening on %s", addr);
 * Thread-safe.
 */
#ifndef MC_COMMON_LOG_H
#define MC_COMMON_LOG_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

enum log_level { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG, LOG_TRACE };

#define LOG_SUBSYSTEMS(X) \
	X(LOGS_MAIN, "main") \
	X(LOGS_CFG, "cfg") \
	X(LOGS_DAEMON, "daemon") \
	X(LOGS_RPC, "rpc") \
	X(LOGS_HTTP, "http") \
	X(LOGS_META, "meta") \
	X(LOGS_RAFT, "raft") \
	X(LOGS_WAL, "wal") \
	X(LOGS_MVCC, "mvcc") \
	X(LOGS_MASTER, "master") \
	X(LOGS_AGENT, "agent") \
	X(LOGS_TE, "te") \
	X(LOGS_SHM, "shm") \
	X(LOGS_TCP, "tcp") \
	X(LOGS_RDMA, "rdma") \
	X(LOGS_CLIENT, "client") \
	X(LOGS_SSD, "ssd") \
	X(LOGS_CTL, "ctl")

enum log_subsys {
#define LOG__ENUM(id, name) id,
	LOG_SUBSYSTEMS(LOG__ENUM)
#undef LOG__ENUM
		LOGS_COUNT
};

#define LOG_RL_BURST 5
#define LOG_RL_WINDOW_MS 10000u
#define LOG_RL_SLOTS 256
#define LOG_RL_TEXT 160

extern _Atomic unsigned char log__levels[LOGS_COUNT];

#define log_enabled(sub, lvl) \
	((int)(lvl) < (int)atomic_load_explicit(&log__levels[(sub)], memory_order_relaxed) + 1)

#define log_at(sub, lvl, ...) \
	do { \
		if (log_enabled((sub), (lvl))) \
			log__emit((sub), (lvl), __VA_ARGS__); \
	} while (0)

#define log_error(...) log_at(LOG_SUBSYS, LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_at(LOG_SUBSYS, LOG_WARN, __VA_ARGS__)
#define log_info(...) log_at(LOG_SUBSYS, LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_at(LOG_SUBSYS, LOG_DEBUG, __VA_ARGS__)
#define log_trace(...) log_at(LOG_SUBSYS, LOG_TRACE, __VA_ARGS__)

void log__emit(enum log_subsys sub, enum log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * Parse a level spec: "info", "warn,raft=debug", "debug,rpc=info".
 * A bare level sets every subsystem; name=level sets one. On success
 * fills levels[LOGS_COUNT]. Errors: -EINVAL, with a message naming the
 * bad part written to err (may be NULL).
 */
int log_parse_levels(const char *spec, unsigned char levels[LOGS_COUNT], char *err,
		     size_t errlen) MC_MUST_CHECK;
/* Apply a spec parsed by log_parse_levels. */
void log_set_levels(const unsigned char levels[LOGS_COUNT]);

/* Log to this file (appending) instead of stderr; NULL or "" = stderr.
 * Errors: negative errno from open(). */
int log_open_file(const char *path) MC_MUST_CHECK;
/* Reopen the log file (SIGHUP, after logrotate). No-op for stderr. */
int log_reopen(void) MC_MUST_CHECK;
/*
 * Size-based rotation of the log file (--log-max-size, --log-max-files):
 * before a line would take the file past max_bytes, FILE.(N-1) becomes
 * FILE.N (the old FILE.N is deleted), ..., FILE becomes FILE.1, and a new
 * FILE is begun. max_bytes 0 turns it off. Lines are never split. A
 * rotation that fails (rename, open) is reported in the log and tried
 * again after another max_bytes. No-op for stderr.
 */
void log_set_rotation(uint64_t max_bytes, unsigned max_files);
/* Report suppressed repeats whose window ended. Call once a second. */
void log_tick(void);
/* Report every pending suppression count (at exit). */
void log_flush(void);
/*
 * Write len bytes of text (a whole line, newline included) to the log file
 * or stderr as they are: no lock, no time stamp, no rate limit, one
 * write(2). Async-signal-safe: for a fatal signal's handler, which must
 * say why the process dies even when it interrupted a thread holding the
 * log's lock.
 */
void log_write_raw(const char *text, size_t len);

const char *log_level_name(enum log_level lvl);
const char *log_subsys_name(enum log_subsys sub);

/* ---- rate limiter core (pure: time is an argument; exposed for tests) */
struct log_rl_slot {
	uint64_t hash;
	uint64_t window_start_ms;
	uint32_t count;      /* lines seen in this window */
	uint32_t suppressed; /* of those, not written */
	char text[LOG_RL_TEXT];
};

struct log_rl {
	struct log_rl_slot slots[LOG_RL_SLOTS];
};

/* Report of suppressed repeats: the line text and how many were dropped. */
typedef void (*log_rl_report_fn)(void *ctx, const char *text, uint32_t suppressed);

/*
 * Decide whether the line with this hash/text may be written at now_ms.
 * Returns true to write it. Before returning, reports (through report) any
 * suppression count that this call closes (window ended, or slot reused).
 */
bool log_rl_admit(struct log_rl *rl, uint64_t hash, const char *text, uint64_t now_ms,
		  log_rl_report_fn report, void *ctx);
/* Report windows that ended before now_ms (all of them if now_ms is
 * UINT64_MAX). */
void log_rl_expire(struct log_rl *rl, uint64_t now_ms, log_rl_report_fn report, void *ctx);

#endif
