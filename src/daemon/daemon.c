/*
 * daemon: the process frame. daemon_run() takes the data-dir lock, writes
 * the pid file, starts each configured role's listeners on one libuv loop
 * and runs it until SIGTERM/SIGINT, then drains in-flight calls (up to
 * --shutdown-timeout) and closes everything in reverse order.
 *
 * A role here is its frame: RPC servers (each with grpc.health.v1.Health
 * and, with --diag-service, mooncake.diag.Diag), an HTTP endpoint for
 * /metrics and /healthz, and a metrics registry of its own. The role's
 * services register on those servers; a service not implemented yet is
 * reported NOT_SERVING and the role says so once at start.
 */
#include "daemon/daemon.h"
#include "daemon/daemon_int.h"

#include <stddef.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <ucontext.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common/auth.h"
#include "common/cfg.h"
#include "common/log.h"
#include "common/pb.h"
#include "common/metrics.h"
#include "common/util.h"
#include "doctor/doctor.h"
#include "http/http.h"
#include "rpc/rpc.h"

#define LOG_SUBSYS LOGS_DAEMON

#define MAX_SERVICES 6

struct rpc_def {
	enum cfg_key key;                   /* listen address */
	const char *label;                  /* server name in logs and metrics */
	const char *services[MAX_SERVICES]; /* served NOT_SERVING until built */
};

struct role_def {
	const char *name;
	unsigned mask;
	struct rpc_def rpc[MAX_RPC];
	enum cfg_key http_key;
	const struct role_ops *ops; /* NULL: the frame only */
	const char *not_yet;        /* what the role does not do yet, logged once;
				NULL when it does everything */
};

static const struct role_def role_defs[] = {
	{"meta",
	 CFG_ROLE_META,
	 {{CFG_LISTEN_CLIENT,
	   "meta-client",
	   {"etcdserverpb.KV", "etcdserverpb.Lease", "etcdserverpb.Watch",
	    "etcdserverpb.Cluster", "etcdserverpb.Maintenance", "etcdserverpb.Auth"}},
	  {CFG_LISTEN_PEER, "meta-peer", {"mooncake.raft.Raft"}}},
	 CFG_META_HTTP,
	 &role_meta_ops,
	 NULL},
	{"master",
	 CFG_ROLE_MASTER,
	 {{CFG_MASTER_LISTEN, "master", {"mooncake.master.Master"}}},
	 CFG_MASTER_HTTP,
	 &role_master_ops,
	 NULL},
	{"agent",
	 CFG_ROLE_AGENT,
	 {{CFG_AGENT_LISTEN, "agent", {"mooncake.transfer.Transfer"}}},
	 CFG_AGENT_HTTP,
	 &role_agent_ops,
	 NULL},
};

#define NROLES (sizeof(role_defs) / sizeof(role_defs[0]))

struct daemon {
	uv_loop_t loop;
	const struct cfg *cfg;
	struct role_rt roles[NROLES];
	uv_signal_t sig_term, sig_int, sig_hup;
	uv_timer_t tick;
	int rpc_open;     /* RPC servers not yet shut down */
	unsigned drains;  /* roles whose drain is not over */
	size_t stop_next; /* roles[stop_next - 1] is the next to stop */
	bool draining;    /* every role stopped (or timed out): calls drain */
	uint64_t drain_timeout_ms;
	uv_timer_t stop_timer; /* bounds the roles' drain and stop hooks */
	bool shutting_down;
	int exit_code;
	int lock_fd;
	char pid_path[PATH_MAX];
	bool pid_written;
	uint64_t start_wall_ms;
	double start_s; /* the same, for process_start_time_seconds */
};

/* ------------------------------------------------------------ systemd */

/*
 * The sd_notify protocol (Type=notify units): one datagram to the socket
 * systemd names in NOTIFY_SOCKET. Without it this is a no-op. NOTIFY_SOCKET
 * is systemd's interface, not a tunable, so it is read here and not in the
 * config table.
 */
static void notify_systemd(const char *state)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t len = path ? strlen(path) : 0;
	if (len == 0 || len >= sizeof(sa.sun_path) || (path[0] != '/' && path[0] != '@'))
		return;
	memcpy(sa.sun_path, path, len);
	if (path[0] == '@')
		sa.sun_path[0] = '\0'; /* abstract namespace */
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa,
		   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) < 0)
		log_warn("cannot notify systemd at %s: %s", path, strerror(errno));
	close(fd);
}

/* ------------------------------------------------------------ metrics */

static void register_process_metrics(struct daemon *d, struct metrics_registry *r,
				     const char *role)
{
	metric_set(metrics_gauge(r, "mooncake_build_info",
				 "Always 1; labels name the build and role.",
				 "version,revision,role",
				 (const char *[]){MC_VERSION, MC_GITREV, role}),
		   1);
	if (metrics_register_process(r, &d->start_s) != 0)
		log_warn("%s: some process_* metrics could not be registered", role);
}

/* ------------------------------------------------------------ health */

static void role_before_metrics(void *ctx)
{
	struct role_rt *rt = ctx;
	if (rt->started && !rt->stopping && rt->def->ops && rt->def->ops->before_metrics)
		rt->def->ops->before_metrics(rt);
}

static const char *health_name(enum rpc_health_status s)
{
	switch (s) {
	case RPC_HEALTH_SERVING:
		return "SERVING";
	case RPC_HEALTH_NOT_SERVING:
		return "NOT_SERVING";
	case RPC_HEALTH_SERVICE_UNKNOWN:
		return "SERVICE_UNKNOWN";
	default:
		return "UNKNOWN";
	}
}

struct healthz_ctx {
	struct mc_buf *body;
	const char *server;
	int rc;
};

static void healthz_line(void *ud, const char *service, enum rpc_health_status status)
{
	struct healthz_ctx *h = ud;
	if (h->rc == 0)
		h->rc = mc_buf_printf(h->body, "%s %s %s\n", h->server,
				      *service ? service : "(server)", health_name(status));
}

/* /healthz: 200 while the process runs and is not draining; the body
 * lists every service's status on every RPC server of the role. */
static int role_healthz(void *ctx, struct mc_buf *body)
{
	struct role_rt *rt = ctx;
	int code = rt->d->shutting_down ? 503 : 200;
	struct healthz_ctx h = {body, NULL, 0};
	h.rc = mc_buf_printf(body, "%s\n", rt->d->shutting_down ? "shutting down" : "ok");
	for (int i = 0; h.rc == 0 && i < MAX_RPC; i++) {
		if (!rt->health[i])
			continue;
		h.server = rt->def->rpc[i].label;
		rpc_health_foreach(rt->health[i], healthz_line, &h);
	}
	return h.rc ? 500 : code;
}

/* ------------------------------------------------------------ shutdown */

static void close_frame_handles(struct daemon *d)
{
	uv_close((uv_handle_t *)&d->sig_term, NULL);
	uv_close((uv_handle_t *)&d->sig_int, NULL);
	uv_close((uv_handle_t *)&d->sig_hup, NULL);
	uv_close((uv_handle_t *)&d->tick, NULL);
	uv_close((uv_handle_t *)&d->stop_timer, NULL);
}

static void on_http_closed(struct http_server *s, void *ud)
{
	(void)s;
	(void)ud;
}

static void on_rpc_done(struct rpc_server *s, void *ud)
{
	struct daemon *d = ud;
	(void)s;
	if (--d->rpc_open > 0)
		return;
	/* Every call drained: now the HTTP endpoints and the frame. */
	for (size_t i = 0; i < NROLES; i++)
		if (d->roles[i].http)
			http_server_close(d->roles[i].http, on_http_closed, d);
	close_frame_handles(d);
}

/* Every role's stop hook answered (or the timeout passed): drain calls. */
static void drain_rpc(struct daemon *d)
{
	uv_timer_stop(&d->stop_timer);
	int servers = 0;
	for (size_t i = 0; i < NROLES; i++)
		for (int j = 0; j < MAX_RPC; j++)
			servers += d->roles[i].rpc[j] != NULL;
	d->rpc_open = servers;
	if (servers == 0) {
		d->rpc_open = 1;
		on_rpc_done(NULL, d);
		return;
	}
	for (size_t i = 0; i < NROLES; i++)
		for (int j = 0; j < MAX_RPC; j++)
			if (d->roles[i].rpc[j])
				rpc_server_shutdown(d->roles[i].rpc[j], d->drain_timeout_ms,
						    on_rpc_done, d);
}

static void on_stop_timeout(uv_timer_t *t);

/*
 * Roles stop one after the other in reverse start order (agent, master,
 * meta): each may still use the ones below it while it stops (the agent
 * and the master delete their keys in meta). Each gets the shutdown
 * timeout to finish; one that overruns it is left behind and the next
 * is stopped all the same, since a role never stopped keeps the loop
 * alive. Then calls drain.
 */
static void stop_next_role(struct daemon *d)
{
	while (d->stop_next > 0) {
		struct role_rt *rt = &d->roles[--d->stop_next];
		if (!rt->started || !rt->def->ops || !rt->def->ops->stop)
			continue;
		rt->stopping = true;
		uv_timer_start(&d->stop_timer, on_stop_timeout, d->drain_timeout_ms, 0);
		rt->def->ops->stop(rt); /* role_stopped may run inside */
		return;
	}
	if (!d->draining) {
		d->draining = true;
		drain_rpc(d);
	}
}

static void on_stop_timeout(uv_timer_t *t)
{
	struct daemon *d = t->data;
	for (size_t i = 0; i < NROLES; i++)
		if (d->roles[i].stopping) {
			log_warn("%s: did not finish stopping within the shutdown "
				 "timeout; stopping the roles below it anyway",
				 d->roles[i].def->name);
			d->roles[i].stopping = false;
		}
	stop_next_role(d);
}

void role_stopped(struct role_rt *rt)
{
	if (!rt->stopping)
		return; /* late, after the timeout */
	rt->stopping = false;
	stop_next_role(rt->d);
}

/* Every role drained (or the timeout passed): stop them in turn. */
static void begin_stops(struct daemon *d)
{
	uv_timer_stop(&d->stop_timer);
	d->stop_next = NROLES;
	stop_next_role(d);
}

static void on_drain_timeout(uv_timer_t *t)
{
	struct daemon *d = t->data;
	for (size_t i = 0; i < NROLES; i++)
		if (d->roles[i].draining) {
			log_warn("%s: did not drain within the shutdown timeout; stopping "
				 "with work in flight",
				 d->roles[i].def->name);
			d->roles[i].draining = false;
		}
	d->drains = 0;
	begin_stops(d);
}

void role_drained(struct role_rt *rt)
{
	struct daemon *d = rt->d;
	if (!rt->draining)
		return; /* late, after the timeout */
	rt->draining = false;
	if (--d->drains == 0)
		begin_stops(d);
}

/*
 * Shutdown: the roles that serve local clients drain first, all at once
 * and with every role still up (a request in flight may need the
 * master); then the roles stop one after the other; then RPC calls
 * drain. Each phase is bounded by the shutdown timeout.
 */
static void begin_shutdown(struct daemon *d, uint64_t timeout_ms)
{
	if (d->shutting_down)
		return;
	d->shutting_down = true;
	d->drain_timeout_ms = timeout_ms;
	notify_systemd("STOPPING=1");
	for (size_t i = 0; i < NROLES; i++) {
		struct role_rt *rt = &d->roles[i];
		rt->draining = rt->started && rt->def->ops && rt->def->ops->drain;
		d->drains += rt->draining;
	}
	if (d->drains == 0) {
		begin_stops(d);
		return;
	}
	uv_timer_start(&d->stop_timer, on_drain_timeout, timeout_ms, 0);
	/* role_drained may run inside a hook: the count is complete first. */
	for (size_t i = 0; i < NROLES && d->drains > 0; i++)
		if (d->roles[i].draining)
			d->roles[i].def->ops->drain(&d->roles[i]);
}

void role_fatal(struct role_rt *rt)
{
	struct daemon *d = rt->d;
	log_error("%s: stopping the daemon after a fatal error", rt->def->name);
	d->exit_code = 1;
	begin_shutdown(d, cfg_u64(d->cfg, CFG_SHUTDOWN_TIMEOUT));
}

static void on_signal(uv_signal_t *h, int signum)
{
	struct daemon *d = h->data;
	if (signum == SIGHUP) {
		int rc = log_reopen();
		if (rc)
			log_error("SIGHUP: cannot reopen the log file: %s", mc_strerror(rc));
		else
			log_info("SIGHUP: log file reopened");
		return;
	}
	if (d->shutting_down) {
		log_warn("%s again: exiting without waiting for in-flight calls",
			 strsignal(signum));
		log_flush();
		if (d->pid_written)
			unlink(d->pid_path);
		_exit(1);
	}
	uint64_t t = cfg_u64(d->cfg, CFG_SHUTDOWN_TIMEOUT);
	log_info("%s: shutting down, draining in-flight calls for up to %llu ms",
		 strsignal(signum), (unsigned long long)t);
	begin_shutdown(d, t);
}

static void on_tick(uv_timer_t *t)
{
	(void)t;
	log_tick();
}

/* ------------------------------------------------------------ start */

static int start_role(struct daemon *d, struct role_rt *rt)
{
	const struct role_def *def = rt->def;
	const struct cfg *cfg = d->cfg;
	int rc;

	rt->d = d;
	rt->metrics = metrics_registry_new();
	if (!rt->metrics)
		return -ENOMEM;
	register_process_metrics(d, rt->metrics, def->name);

	for (int i = 0; i < MAX_RPC; i++) {
		const struct rpc_def *rd = &def->rpc[i];
		if (!rd->label)
			continue;
		struct rpc_server_opts o = {
			.name = rd->label,
			.max_message_bytes = cfg_u64(cfg, CFG_RPC_MAX_MESSAGE_SIZE),
			.max_call_memory = cfg_u64(cfg, CFG_RPC_MAX_CALL_MEMORY),
			.metrics = rt->metrics,
		};
		rc = rpc_server_new(&d->loop, &o, &rt->rpc[i]);
		if (rc) {
			log_error("%s: cannot create the RPC server: %s", def->name,
				  mc_strerror(rc));
			return rc;
		}
		rc = rpc_health_add(rt->rpc[i], &rt->health[i]);
		for (int j = 0; rc == 0 && j < MAX_SERVICES && rd->services[j]; j++)
			rc = rpc_health_set(rt->health[i], rd->services[j],
					    RPC_HEALTH_NOT_SERVING);
		if (rc == 0 && cfg_bool(cfg, CFG_DIAG_SERVICE))
			rc = rpc_diag_add(rt->rpc[i]);
		/* The node's checks, for mooncakectl doctor --cluster. */
		if (rc == 0 && i == 0)
			rc = doctor_service_add(rt->rpc[i], cfg);
		if (rc) {
			log_error("%s: cannot register services: %s", def->name,
				  mc_strerror(rc));
			return rc;
		}
	}

	if (def->ops && def->ops->start) {
		rc = def->ops->start(rt);
		if (rc)
			return rc;
		rt->started = true;
	}

	for (int i = 0; i < MAX_RPC; i++) {
		const struct rpc_def *rd = &def->rpc[i];
		if (!rd->label)
			continue;
		const char *addr = cfg_str(cfg, rd->key);
		rc = rpc_server_listen(rt->rpc[i], addr);
		if (rc) {
			log_error("%s: cannot listen on %s (--%s): %s", def->name, addr,
				  cfg_keydefs[rd->key].name, mc_strerror(rc));
			return rc;
		}
	}

	struct http_server_opts ho = {
		.name = def->name,
		.metrics = rt->metrics,
		.health = role_healthz,
		.health_ctx = rt,
		.before_metrics = role_before_metrics,
		.before_metrics_ctx = rt,
	};
	rc = http_server_new(&d->loop, &ho, &rt->http);
	if (rc == 0) {
		const char *addr = cfg_str(cfg, def->http_key);
		rc = http_server_listen(rt->http, addr);
		if (rc)
			log_error("%s: cannot listen on %s (--%s): %s", def->name, addr,
				  cfg_keydefs[def->http_key].name, mc_strerror(rc));
	}
	if (rc)
		return rc;
	if (def->not_yet)
		log_warn("%s: %s", def->name, def->not_yet);
	return 0;
}

static int setup_logging(const struct cfg *cfg)
{
	unsigned char levels[LOGS_COUNT];
	char err[256];
	/* Validated when the configuration was loaded. */
	if (log_parse_levels(cfg_str(cfg, CFG_LOG_LEVEL), levels, err, sizeof(err)) == 0)
		log_set_levels(levels);
	const char *file = cfg_str(cfg, CFG_LOG_FILE);
	int rc = log_open_file(file);
	if (rc) {
		fprintf(stderr, "mooncaked: cannot open --log-file %s: %s\n", file,
			mc_strerror(rc));
		return rc;
	}
	log_set_rotation(cfg_u64(cfg, CFG_LOG_MAX_SIZE),
			 (unsigned)cfg_u64(cfg, CFG_LOG_MAX_FILES));
	for (const char *w = cfg_warnings(cfg); *w;) {
		size_t n = strcspn(w, "\n");
		log_at(LOGS_CFG, LOG_WARN, "%.*s", (int)n, w);
		w += n + (w[n] == '\n');
	}
	return 0;
}

/* ------------------------------------------------------------ fatal signals */

/*
 * A daemon that dies of a fault says so in its log: SIGSEGV, SIGBUS,
 * SIGILL, SIGFPE and SIGABRT write one line (the signal, its code, the
 * address it names and the instruction it hit, which `addr2line -f -e
 * mooncaked ADDR` turns into a function and line of the static binary, or
 * the pid that sent it) and then take their default action, so a core is
 * dumped where enabled and the exit status still names the signal. The
 * handler runs on an alternate stack, so a stack overflow on the loop
 * thread is reported too. Sanitizer builds keep the sanitizers' own
 * handlers, which report more.
 */
#if defined(__SANITIZE_ADDRESS__)
#define FATAL_HANDLERS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FATAL_HANDLERS 0
#endif
#endif
#ifndef FATAL_HANDLERS
#define FATAL_HANDLERS 1
#endif

#if FATAL_HANDLERS
static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

/* Appenders for the handler: no stdio, which is not async-signal-safe. */
static size_t put_str(char *b, size_t at, size_t cap, const char *s)
{
	while (*s && at + 1 < cap)
		b[at++] = *s++;
	return at;
}

static size_t put_num(char *b, size_t at, size_t cap, uint64_t v, unsigned base)
{
	char d[24];
	size_t n = 0;
	do {
		d[n++] = "0123456789abcdef"[v % base];
		v /= base;
	} while (v && n < sizeof(d));
	if (base == 16)
		at = put_str(b, at, cap, "0x");
	while (n && at + 1 < cap)
		b[at++] = d[--n];
	return at;
}

static size_t put_2(char *b, size_t at, size_t cap, unsigned v, const char *sep)
{
	if (v < 10)
		at = put_str(b, at, cap, "0");
	at = put_num(b, at, cap, v, 10);
	return put_str(b, at, cap, sep);
}

/* The log's time stamp (2026-01-31T23:59:59.999Z), from clock_gettime,
 * which is async-signal-safe where gmtime_r is not. */
static size_t put_time(char *b, size_t at, size_t cap)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_REALTIME, &ts))
		return at;
	int64_t days = ts.tv_sec / 86400, sec = ts.tv_sec % 86400;
	/* Days since 1970-01-01 to a civil date (H. Hinnant's algorithm). */
	int64_t z = days + 719468, era = z / 146097;
	int64_t doe = z - era * 146097;
	int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	int64_t mp = (5 * doy + 2) / 153;
	unsigned d = (unsigned)(doy - (153 * mp + 2) / 5 + 1);
	unsigned m = (unsigned)(mp < 10 ? mp + 3 : mp - 9);
	int64_t y = yoe + era * 400 + (m <= 2);
	unsigned ms = (unsigned)(ts.tv_nsec / 1000000);
	at = put_num(b, at, cap, (uint64_t)y, 10);
	at = put_str(b, at, cap, "-");
	at = put_2(b, at, cap, m, "-");
	at = put_2(b, at, cap, d, "T");
	at = put_2(b, at, cap, (unsigned)(sec / 3600), ":");
	at = put_2(b, at, cap, (unsigned)(sec / 60 % 60), ":");
	at = put_2(b, at, cap, (unsigned)(sec % 60), ".");
	if (ms < 100)
		at = put_str(b, at, cap, "0");
	return put_2(b, at, cap, ms, "Z ");
}

static void on_fatal_signal(int sig, siginfo_t *si, void *ucv)
{
	char b[320];
	size_t n = 0, cap = sizeof(b);
	const char *name = sigabbrev_np(sig);
	uint64_t ip = 0;
#if defined(__x86_64__)
	ip = (uint64_t)((ucontext_t *)ucv)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
	ip = (uint64_t)((ucontext_t *)ucv)->uc_mcontext.pc;
#else
	(void)ucv;
#endif
	n = put_time(b, n, cap);
	n = put_str(b, n, cap, "ERROR daemon: killed by SIG");
	n = put_str(b, n, cap, name ? name : "?");
	n = put_str(b, n, cap, " (signal ");
	n = put_num(b, n, cap, (uint64_t)sig, 10);
	n = put_str(b, n, cap, ", code ");
	n = put_num(b, n, cap, (uint64_t)(int64_t)si->si_code, 10);
	if (si->si_code <= 0) { /* sent: kill(2), tgkill(2), abort(3) */
		n = put_str(b, n, cap, ") sent by pid ");
		n = put_num(b, n, cap, (uint64_t)si->si_pid, 10);
	} else {
		n = put_str(b, n, cap, ") at address ");
		n = put_num(b, n, cap, (uint64_t)(uintptr_t)si->si_addr, 16);
	}
	if (ip) {
		n = put_str(b, n, cap, ", instruction ");
		n = put_num(b, n, cap, ip, 16);
		n = put_str(b, n, cap, " (addr2line -f -e mooncaked ADDR)");
	}
	n = put_str(b, n, cap, "; exiting\n");
	log_write_raw(b, n);
	/* SA_RESETHAND restored the default action: a fault happens again
	 * when the handler returns, a sent signal is raised once more. */
	if (si->si_code <= 0)
		raise(sig);
}

static void install_fatal_handlers(void)
{
	static char alt[64 * 1024];
	stack_t ss = {.ss_sp = alt, .ss_size = sizeof(alt)};
	struct sigaction sa = {.sa_sigaction = on_fatal_signal,
			       .sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND};
	if (sigaltstack(&ss, NULL))
		log_warn("no alternate signal stack (%s): a stack overflow would "
			 "not be reported",
			 strerror(errno));
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < MC_ARRAY_LEN(fatal_signals); i++)
		if (sigaction(fatal_signals[i], &sa, NULL))
			log_warn("cannot catch %s: %s", strsignal(fatal_signals[i]),
				 strerror(errno));
}
#else
static void install_fatal_handlers(void)
{
}
#endif

static int lock_data_dir(struct daemon *d)
{
	const char *dir = cfg_str(d->cfg, CFG_DATA_DIR);
	int holder = 0;
	int rc = mc_mkdir_p(dir, 0750);
	if (rc) {
		log_error("cannot create data dir %s: %s (set --data-dir)", dir,
			  mc_strerror(rc));
		return rc;
	}
	rc = mc_lock_dir(dir, &d->lock_fd, &holder);
	if (rc == MC_ELOCKED) {
		log_error("data dir %s is in use by another mooncaked (pid %d); "
			  "refusing to start",
			  dir, holder);
		return rc;
	}
	if (rc) {
		log_error("cannot lock data dir %s: %s", dir, mc_strerror(rc));
		return rc;
	}
	const char *pid = cfg_str(d->cfg, CFG_PID_FILE);
	if (*pid)
		snprintf(d->pid_path, sizeof(d->pid_path), "%s", pid);
	else
		snprintf(d->pid_path, sizeof(d->pid_path), "%s/mooncaked.pid", dir);
	rc = mc_write_pidfile(d->pid_path);
	if (rc) {
		log_error("cannot write pid file %s: %s", d->pid_path, mc_strerror(rc));
		return rc;
	}
	d->pid_written = true;
	return 0;
}

static void free_roles(struct daemon *d)
{
	for (size_t i = 0; i < NROLES; i++) {
		struct role_rt *rt = &d->roles[i];
		if (rt->started && rt->def->ops->free)
			rt->def->ops->free(rt);
		for (int j = 0; j < MAX_RPC; j++)
			if (rt->rpc[j])
				rpc_server_free(rt->rpc[j]);
		if (rt->http)
			http_server_free(rt->http);
		metrics_registry_free(rt->metrics);
		memset(rt, 0, sizeof(*rt));
	}
}

int daemon_run(const struct cfg *cfg)
{
	struct daemon *d = calloc(1, sizeof(*d));
	int rc;

	if (!d) {
		fprintf(stderr, "mooncaked: out of memory\n");
		return 1;
	}
	d->cfg = cfg;
	d->lock_fd = -1;
	d->start_wall_ms = mc_wall_ms();
	d->start_s = (double)d->start_wall_ms / 1000.0;
	if (setup_logging(cfg) != 0) {
		free(d);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	install_fatal_handlers();
	rc = uv_loop_init(&d->loop);
	if (rc) {
		log_error("cannot create the event loop: %s", uv_strerror(rc));
		goto out_free;
	}
	rc = lock_data_dir(d);
	if (rc)
		goto out_loop;

	unsigned roles = cfg_roles(cfg);
	char names[64] = "";
	for (size_t i = 0; i < NROLES; i++)
		if (roles & role_defs[i].mask)
			snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s",
				 *names ? "," : "", role_defs[i].name);
	log_info("mooncaked %s (%s) starting: pid %d, roles %s, data dir %s", MC_VERSION,
		 MC_GITREV, (int)getpid(), names, cfg_str(cfg, CFG_DATA_DIR));

	uv_signal_init(&d->loop, &d->sig_term);
	uv_signal_init(&d->loop, &d->sig_int);
	uv_signal_init(&d->loop, &d->sig_hup);
	uv_timer_init(&d->loop, &d->tick);
	uv_timer_init(&d->loop, &d->stop_timer);
	d->stop_timer.data = d;
	d->sig_term.data = d->sig_int.data = d->sig_hup.data = d;
	uv_signal_start(&d->sig_term, on_signal, SIGTERM);
	uv_signal_start(&d->sig_int, on_signal, SIGINT);
	uv_signal_start(&d->sig_hup, on_signal, SIGHUP);
	uv_timer_start(&d->tick, on_tick, 1000, 1000);

	for (size_t i = 0; i < NROLES && rc == 0; i++) {
		if (!(roles & role_defs[i].mask))
			continue;
		d->roles[i].def = &role_defs[i];
		rc = start_role(d, &d->roles[i]);
	}
	if (rc) {
		/* The roles that started stop as on SIGTERM. */
		d->exit_code = 1;
		begin_shutdown(d, cfg_u64(cfg, CFG_SHUTDOWN_TIMEOUT));
	} else {
		log_info("ready");
		char st[64];
		snprintf(st, sizeof(st), "READY=1\nMAINPID=%d", (int)getpid());
		notify_systemd(st);
	}
	uv_run(&d->loop, UV_RUN_DEFAULT);
	if (d->exit_code == 0)
		log_info("shut down cleanly");
	free_roles(d);
	rc = uv_loop_close(&d->loop);
	if (rc)
		log_warn("event loop closed with handles open: %s", uv_strerror(rc));
	rc = d->exit_code;
	goto out_unlock;

out_loop:
	rc = 1;
	(void)uv_loop_close(&d->loop);
out_unlock:
	if (d->pid_written)
		unlink(d->pid_path);
	mc_unlock_dir(d->lock_fd);
	log_flush();
out_free:
	free(d);
	mc_pb_cache_release(); /* (the chunks this thread kept) */
	return rc ? 1 : 0;
}

uv_loop_t *role_loop(const struct role_rt *rt)
{
	return &rt->d->loop;
}

const struct cfg *role_cfg(const struct role_rt *rt)
{
	return rt->d->cfg;
}

void role_meta_endpoints(const struct cfg *cfg, char *out, size_t len)
{
	cfg_meta_endpoints(cfg, out, len);
}

int role_require_secret(const struct cfg *cfg, struct rpc_server *srv, const char *what,
			const char *listen, const char *harm, struct mc_secret *out)
{
	struct sockaddr_storage ss;
	bool public_listen = mc_parse_hostport(listen, &ss) != 0 ||
			     !mc_addr_is_loopback((const struct sockaddr *)&ss);
	out->len = 0;
	if (!*cfg_str(cfg, CFG_CLUSTER_SECRET_FILE)) {
		if (public_listen && !cfg_bool(cfg, CFG_INSECURE_TRANSFER)) {
			log_error(
				"the %s listens on %s without a cluster secret: anyone who "
				"reaches it could %s. Give it the agents' --cluster-secret-file "
				"(its callers then prove it), or --insecure-transfer to leave "
				"it open",
				what, listen, harm);
			return MC_ECONFIG;
		}
		if (public_listen)
			log_warn("--insecure-transfer: the %s on %s is open to anyone who "
				 "reaches it",
				 what, listen);
		return 0;
	}
	char err[1024];
	int rc = mc_secret_find(cfg, false, public_listen, out, err, sizeof(err));
	if (rc) {
		log_error("%s", err);
		return rc;
	}
	rc = rpc_server_require_auth(srv, out->key, out->len);
	if (rc) {
		log_error("%s: cannot require the cluster secret: %s", what, mc_strerror(rc));
		return rc;
	}
	log_info("%s: callers prove the cluster secret %s", what, out->path);
	return 0;
}
