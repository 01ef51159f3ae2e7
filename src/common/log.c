/*
 * log: formatting, per-subsystem levels, the identical-line rate limiter
 * and the log file. See log.h.
 *
 * A line is formatted into a stack buffer, checked against the rate limiter
 * under one mutex, and written with a single write(2), so lines from
 * different threads never interleave.
 */
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/io.h"
#include "common/util.h"

_Atomic unsigned char log__levels[LOGS_COUNT] = {[0 ... LOGS_COUNT - 1] = LOG_INFO};

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};
static const char *const subsys_names[] = {
#define LOG__NAME(id, name) name,
	LOG_SUBSYSTEMS(LOG__NAME)
#undef LOG__NAME
};

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static struct log_rl log_rl_state;
static int log_fd = STDERR_FILENO;
static char *log_path;
static uint64_t log_size;      /* bytes in the file (when rotating) */
static uint64_t log_max_bytes; /* 0: no rotation */
static unsigned log_max_files = 5;

const char *log_level_name(enum log_level lvl)
{
	return (unsigned)lvl < MC_ARRAY_LEN(level_names) ? level_names[lvl] : "?";
}

const char *log_subsys_name(enum log_subsys sub)
{
	return (unsigned)sub < LOGS_COUNT ? subsys_names[sub] : "?";
}

/* ------------------------------------------------------------ rate limit */

static void slot_report(struct log_rl_slot *s, log_rl_report_fn report, void *ctx)
{
	if (s->suppressed && report)
		report(ctx, s->text, s->suppressed);
	s->suppressed = 0;
}

bool log_rl_admit(struct log_rl *rl, uint64_t hash, const char *text, uint64_t now_ms,
		  log_rl_report_fn report, void *ctx)
{
	struct log_rl_slot *s = &rl->slots[hash % LOG_RL_SLOTS];

	if (s->count == 0 || s->hash != hash ||
	    now_ms - s->window_start_ms >= LOG_RL_WINDOW_MS) {
		/* A new window for this slot: close the old one first. */
		slot_report(s, report, ctx);
		s->hash = hash;
		s->window_start_ms = now_ms;
		s->count = 1;
		snprintf(s->text, sizeof(s->text), "%s", text);
		return true;
	}
	if (s->count < UINT32_MAX)
		s->count++;
	if (s->count <= LOG_RL_BURST)
		return true;
	if (s->suppressed < UINT32_MAX)
		s->suppressed++;
	return false;
}

void log_rl_expire(struct log_rl *rl, uint64_t now_ms, log_rl_report_fn report, void *ctx)
{
	for (size_t i = 0; i < LOG_RL_SLOTS; i++) {
		struct log_rl_slot *s = &rl->slots[i];
		if (s->suppressed == 0)
			continue;
		if (now_ms == UINT64_MAX || now_ms - s->window_start_ms >= LOG_RL_WINDOW_MS) {
			slot_report(s, report, ctx);
			s->count = 0;
		}
	}
}

/* ------------------------------------------------------------ output */

static size_t format_time(char *buf, size_t len)
{
	uint64_t ms = mc_wall_ms();
	time_t secs = (time_t)(ms / 1000);
	struct tm tm;
	gmtime_r(&secs, &tm);
	size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
	int m = snprintf(buf + n, len - n, ".%03uZ ", (unsigned)(ms % 1000));
	return n + (size_t)(m > 0 ? m : 0);
}

/* The size of the file behind fd, 0 when unknown. */
static uint64_t fd_size(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static void do_rotate(void);

/* Caller holds log_lock. */
static void do_write_line(const char *body, const char *suffix)
{
	char line[4096 + 256];
	size_t n = format_time(line, sizeof(line));
	int m = snprintf(line + n, sizeof(line) - n, "%s%s\n", body, suffix ? suffix : "");
	if (m < 0)
		return;
	n += (size_t)m;
	if (n >= sizeof(line)) {
		n = sizeof(line) - 1;
		line[n - 1] = '\n';
	}
	if (log_max_bytes && log_path && log_size > 0 && log_size + n > log_max_bytes)
		do_rotate();
	/* A failing write has nowhere left to be reported. */
	int rc = mc_write_all(log_fd, line, n);
	(void)rc;
	log_size += n;
}

static void on_rl_report(void *ctx, const char *text, uint32_t suppressed)
{
	char suffix[96];
	snprintf(suffix, sizeof(suffix), " [%u identical messages suppressed]", suppressed);
	do_write_line(text, suffix);
}

void log__emit(enum log_subsys sub, enum log_level lvl, const char *fmt, ...)
{
	char body[4096];
	int n = snprintf(body, sizeof(body), "%-5s %s: ", log_level_name(lvl),
			 log_subsys_name(sub));
	if (n < 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(body + n, sizeof(body) - (size_t)n, fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	size_t len = strlen(body);
	/* One event, one line: fold embedded newlines. */
	for (size_t i = 0; i < len; i++)
		if (body[i] == '\n' || body[i] == '\r')
			body[i] = ' ';
	uint64_t hash = mc_hash64(body, len);

	pthread_mutex_lock(&log_lock);
	if (log_rl_admit(&log_rl_state, hash, body, mc_now_ms(), on_rl_report, NULL))
		do_write_line(body, NULL);
	pthread_mutex_unlock(&log_lock);
}

void log_tick(void)
{
	pthread_mutex_lock(&log_lock);
	log_rl_expire(&log_rl_state, mc_now_ms(), on_rl_report, NULL);
	pthread_mutex_unlock(&log_lock);
}

void log_flush(void)
{
	pthread_mutex_lock(&log_lock);
	log_rl_expire(&log_rl_state, UINT64_MAX, on_rl_report, NULL);
	pthread_mutex_unlock(&log_lock);
}

void log_write_raw(const char *text, size_t len)
{
	int rc = mc_write_all(log_fd, text, len);
	(void)rc; /* nowhere left to report it */
}

/* ------------------------------------------------------------ levels */

static int parse_level(const char *s, size_t len)
{
	for (size_t i = 0; i < MC_ARRAY_LEN(level_names); i++)
		if (strlen(level_names[i]) == len && strncasecmp(level_names[i], s, len) == 0)
			return (int)i;
	if (len == 7 && strncasecmp(s, "warning", 7) == 0)
		return LOG_WARN;
	return -1;
}

static int find_subsys(const char *s, size_t len)
{
	for (size_t i = 0; i < LOGS_COUNT; i++)
		if (strlen(subsys_names[i]) == len && strncmp(subsys_names[i], s, len) == 0)
			return (int)i;
	return -1;
}

int log_parse_levels(const char *spec, unsigned char levels[LOGS_COUNT], char *err,
		     size_t errlen)
{
	char buf[512];
	unsigned char base = LOG_INFO;
	int per[LOGS_COUNT];

	for (size_t i = 0; i < LOGS_COUNT; i++)
		per[i] = -1;
	if (!spec || !*spec || strlen(spec) >= sizeof(buf))
		goto bad_spec;
	snprintf(buf, sizeof(buf), "%s", spec);
	/* "level" sets the base for all; "name=level" overrides one, in
	 * any order: "raft=debug,warn" == "warn,raft=debug". */
	char *save = NULL;
	size_t ntok = 0, nlen = strlen(buf);
	if (buf[0] == ',' || buf[nlen - 1] == ',' || strstr(buf, ",,"))
		goto bad_spec;
	for (char *tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save), ntok++) {
		char *eq = strchr(tok, '=');
		const char *lvl_s = eq ? eq + 1 : tok;
		int lvl = parse_level(lvl_s, strlen(lvl_s));
		if (lvl < 0) {
			if (err)
				snprintf(err, errlen,
					 "unknown level '%s' (use error, warn, "
					 "info, debug or trace)",
					 lvl_s);
			return -EINVAL;
		}
		if (!eq) {
			base = (unsigned char)lvl;
			continue;
		}
		int sub = find_subsys(tok, (size_t)(eq - tok));
		if (sub < 0) {
			if (err)
				snprintf(err, errlen,
					 "unknown subsystem '%.*s' (known: main, "
					 "cfg, daemon, rpc, http, meta, raft, wal, "
					 "mvcc, master, agent, te, shm, tcp, rdma, "
					 "client, ctl)",
					 (int)(eq - tok), tok);
			return -EINVAL;
		}
		per[sub] = lvl;
	}
	if (ntok == 0)
		goto bad_spec;
	for (size_t i = 0; i < LOGS_COUNT; i++)
		levels[i] = per[i] >= 0 ? (unsigned char)per[i] : base;
	return 0;
bad_spec:
	if (err)
		snprintf(err, errlen,
			 "malformed level spec (use e.g. info or info,raft=debug)");
	return -EINVAL;
}

void log_set_levels(const unsigned char levels[LOGS_COUNT])
{
	for (size_t i = 0; i < LOGS_COUNT; i++)
		atomic_store_explicit(&log__levels[i], levels[i], memory_order_relaxed);
}

/* ------------------------------------------------------------ file */

int log_open_file(const char *path)
{
	pthread_mutex_lock(&log_lock);
	int rc = 0;
	if (!path || !*path) {
		if (log_fd != STDERR_FILENO)
			close(log_fd);
		log_fd = STDERR_FILENO;
		free(log_path);
		log_path = NULL;
		goto out;
	}
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	char *copy = strdup(path);
	if (!copy) {
		close(fd);
		rc = -ENOMEM;
		goto out;
	}
	if (log_fd != STDERR_FILENO)
		close(log_fd);
	log_fd = fd;
	free(log_path);
	log_path = copy;
	log_size = fd_size(fd);
out:
	pthread_mutex_unlock(&log_lock);
	return rc;
}

/* Caller holds log_lock; log_path is set. */
static void do_rotate(void)
{
	size_t plen = strlen(log_path) + 16;
	char *from = malloc(plen), *to = malloc(plen);
	const char *fail = NULL;
	int err = 0;
	if (!from || !to) {
		fail = "out of memory";
		goto out;
	}
	for (unsigned i = log_max_files; i >= 1; i--) {
		if (i == 1)
			snprintf(from, plen, "%s", log_path);
		else
			snprintf(from, plen, "%s.%u", log_path, i - 1);
		snprintf(to, plen, "%s.%u", log_path, i);
		if (rename(from, to) != 0 && errno != ENOENT) {
			fail = "rename";
			err = errno;
			goto out;
		}
	}
	int fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
	if (fd < 0) {
		fail = "open";
		err = errno;
		goto out;
	}
	if (dup3(fd, log_fd, O_CLOEXEC) < 0) {
		fail = "dup3";
		err = errno;
	}
	close(fd);
out:
	free(from);
	free(to);
	log_size = fd_size(log_fd);
	if (fail) {
		/* In the old file, which keeps growing until the next try. */
		char msg[512];
		int m = snprintf(msg, sizeof(msg),
				 "ERROR main: log rotation of %s failed (%s: %s); writing on "
				 "and trying again after --log-max-size more bytes\n",
				 log_path, fail, err ? strerror(err) : "");
		if (m > 0) {
			int rc = mc_write_all(log_fd, msg, MC_MIN((size_t)m, sizeof(msg) - 1));
			(void)rc; /* nowhere left to report a failing write */
		}
		log_size = 0;
	}
}

void log_set_rotation(uint64_t max_bytes, unsigned max_files)
{
	pthread_mutex_lock(&log_lock);
	log_max_bytes = max_bytes;
	log_max_files = max_files ? max_files : 1;
	log_size = log_path ? fd_size(log_fd) : 0;
	pthread_mutex_unlock(&log_lock);
}

int log_reopen(void)
{
	pthread_mutex_lock(&log_lock);
	int rc = 0;
	if (log_path) {
		int fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
		if (fd < 0) {
			rc = -errno;
		} else {
			/* dup3 swaps the file under the same descriptor. */
			if (dup3(fd, log_fd, O_CLOEXEC) < 0)
				rc = -errno;
			close(fd);
			log_size = fd_size(log_fd);
		}
	}
	pthread_mutex_unlock(&log_lock);
	return rc;
}
