/*
 * ctl_bench_local: the servers `mooncakectl bench store` starts for
 * itself (ctl_bench_store.h): a master and two agents (mooncaked next to
 * mooncakectl) and redis-server when installed, each a child process
 * logging into a temporary directory, all on loopback ports picked free;
 * the agents and the master prove a cluster secret made in that
 * directory.
 * Stopping them removes the directory; a process that died first is
 * reported with the end of its log.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/util.h"
#include "ctl/ctl_bench_store.h"

static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	int port = -1;
	if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
		port = ntohs(sa.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

/* Start argv with stdout/stderr to dir/name.log. */
static int spawn(struct ctl_local *cl, const char *name, char *const argv[])
{
	char log[160];
	snprintf(log, sizeof(log), "%s/%s.log", cl->dir, name);
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(argv[0], argv);
		_exit(127);
	}
	struct ctl_proc *p = &cl->procs[cl->nprocs++];
	p->pid = pid;
	snprintf(p->name, sizeof(p->name), "%s", name);
	return 0;
}

void ctl_local_report_dead(struct ctl_local *cl)
{
	for (int i = 0; i < cl->nprocs; i++) {
		int st;
		if (waitpid(cl->procs[i].pid, &st, WNOHANG) != cl->procs[i].pid)
			continue;
		cl->procs[i].pid = -1; /* reaped */
		fprintf(stderr, "bench store: %s exited (%s %d); the end of its log:\n",
			cl->procs[i].name, WIFSIGNALED(st) ? "signal" : "status",
			WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
		char path[160], tail[2048];
		snprintf(path, sizeof(path), "%s/%s.log", cl->dir, cl->procs[i].name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : 0;
		if (fseek(f, size > (long)sizeof(tail) - 1 ? size - (long)sizeof(tail) + 1 : 0,
			  SEEK_SET) == 0) {
			size_t n = fread(tail, 1, sizeof(tail) - 1, f);
			tail[n] = '\0';
			fputs(tail, stderr);
		}
		fclose(f);
	}
}

void ctl_local_stop(struct ctl_local *cl)
{
	for (int i = cl->nprocs; i-- > 0;)
		if (cl->procs[i].pid > 0)
			kill(cl->procs[i].pid, SIGTERM);
	for (int i = cl->nprocs; i-- > 0;)
		if (cl->procs[i].pid > 0)
			waitpid(cl->procs[i].pid, NULL, 0);
	cl->nprocs = 0;
	if (cl->dir[0]) {
		char cmd[128];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", cl->dir);
		if (system(cmd) != 0)
			fprintf(stderr, "bench store: could not remove %s\n", cl->dir);
	}
}

static void sibling(char *out, size_t len, const char *exe)
{
	char self[400];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	self[n > 0 ? n : 0] = '\0';
	char *slash = strrchr(self, '/');
	if (slash)
		*slash = '\0';
	snprintf(out, len, "%s/%s", n > 0 ? self : ".", exe);
}

int ctl_local_start(struct ctl_local *cl, uint64_t segment, bool separate)
{
	snprintf(cl->dir, sizeof(cl->dir), "/tmp/mooncake-bench-XXXXXX");
	if (!mkdtemp(cl->dir)) {
		cl->dir[0] = '\0';
		return -errno;
	}
	char daemon[600], secret[sizeof(cl->dir) + 16];
	sibling(daemon, sizeof(daemon), "mooncaked");
	/* The two agents move bytes to each other and call the master: all
	 * three prove one secret (each agent would make its own in its data
	 * directory, and the environment's may be another). */
	snprintf(secret, sizeof(secret), "%s/cluster.secret", cl->dir);
	int rc = mc_secret_create(secret);
	if (rc)
		return rc;
	int mport = free_port(), mhttp = free_port();
	snprintf(cl->master, sizeof(cl->master), "127.0.0.1:%d", mport);
	char a[16][192];
	int k = 0;
#define ARG(...) (snprintf(a[k], sizeof(a[k]), __VA_ARGS__), a[k++])
	if (separate) {
		char *mv[] = {daemon,
			      "--role=master",
			      ARG("--data-dir=%s/master", cl->dir),
			      "--config=",
			      "--meta-endpoints=",
			      ARG("--master-listen=%s", cl->master),
			      ARG("--master-http=127.0.0.1:%d", mhttp),
			      ARG("--cluster-secret-file=%s", secret),
			      "--log-level=warn",
			      NULL};
		rc = spawn(cl, "master", mv);
	}
	for (int i = 0; rc == 0 && i < 2; i++) {
		k = 0;
		bool with_master = i == 0 && !separate;
		char dir[sizeof(cl->dir)]; /* (not cl's own: snprintf's restrict) */
		memcpy(dir, cl->dir, sizeof(dir));
		snprintf(cl->sock[i], sizeof(cl->sock[i]), "%s/agent%d.sock", dir, i);
		char *av[] = {daemon,
			      with_master ? "--role=master,agent" : "--role=agent",
			      ARG("--data-dir=%s/agent%d", cl->dir, i),
			      "--config=",
			      "--meta-endpoints=",
			      ARG("--master-address=%s", cl->master),
			      ARG("--agent-listen=127.0.0.1:%d", free_port()),
			      ARG("--agent-http=127.0.0.1:%d", free_port()),
			      ARG("--socket=%s", cl->sock[i]),
			      ARG("--global-segment-size=%llu", (unsigned long long)segment),
			      ARG("--cluster-secret-file=%s", secret),
			      "--log-level=warn",
			      NULL,
			      NULL,
			      NULL,
			      NULL,
			      NULL,
			      NULL,
			      NULL,
			      NULL};
		char **more = &av[12];
		if (with_master) {
			*more++ = ARG("--master-listen=%s", cl->master);
			*more++ = ARG("--master-http=127.0.0.1:%d", mhttp);
		}
		if (cl->ssd_dir) {
			*more++ = ARG("--ssd-path=%s/agent%d", cl->ssd_dir, i);
			*more++ = ARG("--ssd-size=%llu", (unsigned long long)cl->ssd_bytes);
			*more++ = "--ssd-promote-on-hit=false";
			/* Evicted past half, down to a quarter, so that free
			 * space is there ahead of the puts (bench ssd keeps its
			 * store within a quarter the same way). Evicted space is
			 * reused only once its removal is synced: at a write
			 * rate near the disk's, puts still wait for that sync. */
			*more++ = "--ssd-high-watermark-ratio=0.5";
			*more++ = "--ssd-eviction-ratio=0.25";
		}
		rc = spawn(cl, i ? "agent1" : "agent0", av);
	}
#undef ARG
	return rc;
}

pid_t ctl_local_pid(const struct ctl_local *cl, const char *name)
{
	for (int i = 0; i < cl->nprocs; i++)
		if (cl->procs[i].pid > 0 && strcmp(cl->procs[i].name, name) == 0)
			return cl->procs[i].pid;
	return -1;
}

/* The first number after `field` in a /proc file (0: none). */
static uint64_t proc_field(const char *path, const char *field)
{
	FILE *f = fopen(path, "re");
	char line[256];
	unsigned long long v = 0;
	size_t fl = strlen(field);
	while (f && fgets(line, sizeof(line), f))
		if (strncmp(line, field, fl) == 0) {
			v = strtoull(line + fl, NULL, 10);
			break;
		}
	if (f)
		fclose(f);
	return v;
}

int ctl_proc_usage(pid_t pid, struct ctl_usage *u)
{
	char path[96];
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	if (!d)
		return -errno;
	memset(u, 0, sizeof(*u));
	for (struct dirent *e; (e = readdir(d)) != NULL;) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%.16s/schedstat", (int)pid,
			 e->d_name);
		u->cpu_ns += proc_field(path, "");
		snprintf(path, sizeof(path), "/proc/%d/task/%.16s/status", (int)pid,
			 e->d_name);
		u->wakeups += proc_field(path, "voluntary_ctxt_switches:");
	}
	closedir(d);
	return 0;
}

int ctl_proc_mem(pid_t pid, struct ctl_proc_mem *m)
{
	char path[64], line[512];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	if (!d)
		return -errno;
	memset(m, 0, sizeof(*m));
	for (struct dirent *e; (e = readdir(d)) != NULL;)
		m->fds += e->d_name[0] != '.';
	closedir(d);
	snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return -errno;
	/* Every mapping's Rss but the DRAM segment's: the agent fills that
	 * in the background after its start, whatever the sessions do. */
	bool segment = false;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long kb, lo, hi;
		if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2)
			segment = strstr(line, "memfd:mooncake-segment") != NULL;
		else if (!segment && sscanf(line, "Rss: %llu kB", &kb) == 1)
			m->rss_bytes += kb * 1024;
	}
	fclose(f);
	return 0;
}

void ctl_run_id(char out[17])
{
	uint64_t rnd;
	if (mc_random(&rnd, sizeof(rnd)) != 0)
		rnd = mc_now_ns() ^ (uint64_t)getpid() << 32;
	snprintf(out, 17, "%016llx", (unsigned long long)rnd);
}

int ctl_local_open(const char *sock, mc_client **out, uint64_t timeout_ms)
{
	uint64_t deadline = mc_now_ms() + timeout_ms;
	/* (A key of its own: the agent may be one of a user's cluster.) */
	char probe[48], id[17];
	ctl_run_id(id);
	int plen = snprintf(probe, sizeof(probe), "bench/probe/%s", id);
	int rc;
	for (;;) {
		struct mc_open_opts o = {.socket_path = sock, .client_name = "bench store"};
		rc = mc_open_ex(&o, out);
		if (rc == 0) {
			rc = mc_put(*out, probe, (size_t)plen, "x", 1,
				    &(struct mc_put_opts){.upsert = 1});
			if (rc == 0) {
				(void)mc_remove(*out, probe, (size_t)plen, 1);
				return 0;
			}
			mc_close(*out);
		}
		if (mc_now_ms() > deadline)
			return rc;
		usleep(20000);
	}
}

int ctl_local_start_redis(struct ctl_local *cl)
{
	char exe[256] = "";
	const char *path = getenv("PATH");
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s", path ? path : "/usr/bin:/usr/local/bin");
	for (char *save, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
		snprintf(exe, sizeof(exe), "%s/redis-server", d);
		if (access(exe, X_OK) == 0)
			break;
		exe[0] = '\0';
	}
	if (!exe[0])
		return -ENOENT;
	if (!cl->dir[0]) {
		snprintf(cl->dir, sizeof(cl->dir), "/tmp/mooncake-bench-XXXXXX");
		if (!mkdtemp(cl->dir)) {
			cl->dir[0] = '\0';
			return -errno;
		}
	}
	cl->redis_port = free_port();
	char port[16], dir[96];
	snprintf(port, sizeof(port), "%d", cl->redis_port);
	snprintf(dir, sizeof(dir), "%s", cl->dir);
	char *argv[] = {exe,         "--port", port, "--bind",
			"127.0.0.1", "--save", "",   "--appendonly",
			"no",        "--dir",  dir,  "--protected-mode",
			"no",        NULL};
	return spawn(cl, "redis", argv);
}
