/*
 * op_buf: client buffers and transfers. A buffer is client memory the
 * agent maps for a session: registered (the client's memfd, checked:
 * sealed against shrinking, the client's own, writable) or allocated
 * (a memfd the agent makes and passes back). A buffer with an address is
 * published to the transfer engine first, so peers may read and write
 * it; unregistering takes it out of the engine before the reply. A
 * buffer of process memory is the client's ordinary memory (no memfd),
 * published for peers only: the engine reaches it by cross-memory
 * attach, once the client's process is seen to let the agent in and the
 * range to be mapped writable (mem.c); a buffer of device memory is a
 * dma-buf the client attached, registered with the RDMA devices for
 * peers' one-sided access only. A transfer moves bytes between
 * client memory and an address of a segment: another agent's through
 * the engine on a copy thread, or this agent's own segment or a buffer
 * one of its sessions published.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent_int.h"
#include "agent/inst.h"
#include "agent/op.h"
#include "agent/server.h"
#include "agent/xfer.h"
#include "common/log.h"
#include "common/util.h"
#include "transfer/transfer.h"

#define LOG_SUBSYS LOGS_AGENT

/* ------------------------------------------------------------ buffers */

static void buffer_reply(struct agent_req *r, uint64_t id, uint64_t len, int fd)
{
	Mooncake__Client__BufferReply br = MOONCAKE__CLIENT__BUFFER_REPLY__INIT;
	br.buffer = id;
	br.length = len;
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_BUFFER;
	resp.buffer = &br;
	bool own = true;
	agent__reply(r, &resp, fd >= 0 ? &fd : NULL, &own, fd >= 0 ? 1 : 0);
	agent__op_finish(r, 0);
}

static const char *register_why(int rc)
{
	switch (rc) {
	case -EBADF:
		return "the descriptor is not a memfd";
	case -EPERM:
		return "the memfd belongs to another user";
	case -EACCES:
		return "the memfd is not open for reading and writing";
	case -EINVAL:
		return "the memfd is not sealed against shrinking "
		       "(F_SEAL_SHRINK) or is smaller than the range";
	case -ENOSPC:
		return "too many buffers in this session (--client-max-buffers)";
	default:
		return NULL;
	}
}

/* The engine holds the buffers of every session without an engine of its
 * own and the agent's own memory (its segment) at their addresses, each
 * in its own process: a client's buffer may meet either. */
static const char overlap_why[] = "the address range overlaps memory this agent publishes "
				  "already: another session's buffer, or the agent's own";

/* A map just registered with the request's engine: when that is the
 * session's own, the map keeps it alive until its region is gone. */
static void map_engine(struct agent_req *r, struct agent_map *m)
{
	if (r->inst && m->region && !m->inst) {
		agent__inst_ref(r->inst);
		m->inst = r->inst;
	}
}

/*
 * A buffer with an address is published to the transfer engine at that
 * address (peers may then read and write it) before it is added; the
 * registration (an RDMA MR for large buffers) runs on a copy thread.
 */
struct publish {
	struct agent_job job;
	struct agent_req *r;
	struct te_engine *te; /* the session's (agent__op_te) */
	struct agent_map *m;
	uint8_t *base;
	uint64_t len, address, memfd_off;
	int fd; /* to send with the reply (alloc: the agent made m), or -1 */
	int err;
	struct agent_unmap_wait wait;
};

static void publish_run(struct agent_job *j)
{
	struct publish *p = MC_CONTAINER_OF(j, struct publish, job);
	p->err = te_register(p->te, p->address, p->base, p->len, p->m->fd, p->memfd_off,
			     &p->m->region);
	if (p->err)
		p->m->region = NULL;
}

static void publish_done(struct agent_job *j)
{
	struct publish *p = MC_CONTAINER_OF(j, struct publish, job);
	struct agent_req *r = p->r;
	uint64_t id;
	int rc = p->err;
	if (rc == -EEXIST && agent__unmap_wait(r->a, &p->wait))
		return;
	if (rc == -EEXIST)
		log_warn("client %s: buffer at 0x%llx overlaps memory already published "
			 "(another session's buffer, or the agent's own memory, at the same "
			 "addresses)",
			 agent__session_name(r->c), (unsigned long long)p->address);
	if (rc == 0)
		map_engine(r, p->m);
	if (rc == 0)
		rc = agent__session_closed(r->c)
			     ? MC_ECANCELLED
			     : agent__session_buf_add(r->c, p->m, p->base, p->len, p->address,
						      p->fd >= 0, &id);
	if (rc) {
		agent__map_unref(p->m);
		if (p->fd >= 0) {
			close(p->fd);
			agent__server_alloc_give(r->a, p->len);
		}
		agent__op_fail(r, rc, rc == -EEXIST ? overlap_why : NULL);
	} else {
		buffer_reply(r, id, p->len, p->fd);
	}
	free(p);
}

/* Add the buffer now, or publish it first. Takes the map reference, and
 * fd (>= 0: the agent made the buffer; its --client-alloc-size share is
 * taken). */
static void add_or_publish(struct agent_req *r, struct agent_map *m, uint8_t *base,
			   uint64_t len, uint64_t address, uint64_t memfd_off, int fd)
{
	struct te_engine *te = address ? agent__op_te(r) : NULL;
	if (te) {
		struct publish *p = calloc(1, sizeof(*p));
		if (p) {
			*p = (struct publish){.r = r,
					      .te = te,
					      .m = m,
					      .base = base,
					      .len = len,
					      .address = address,
					      .memfd_off = memfd_off,
					      .fd = fd};
			p->job.run = publish_run;
			p->job.done = publish_done;
			agent__unmap_wait_submit(r->a, &p->wait, &p->job);
			return;
		}
		agent__map_unref(m);
		if (fd >= 0) {
			close(fd);
			agent__server_alloc_give(r->a, len);
		}
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	uint64_t id;
	int rc = agent__session_buf_add(r->c, m, base, len, address, fd >= 0, &id);
	if (rc) {
		agent__map_unref(m);
		if (fd >= 0) {
			close(fd);
			agent__server_alloc_give(r->a, len);
		}
		agent__op_fail(r, rc, register_why(rc));
		return;
	}
	buffer_reply(r, id, len, fd);
}

/* ------------------------------------------------------------ unmapped memory */

static const char *unmapped_why(int rc, bool dmabuf)
{
	switch (rc) {
	case -EPERM:
		return "the process does not let the agent attach (it names the agent "
		       "with prctl(PR_SET_PTRACER); Yama or the ptrace rules refuse)";
	case -EFAULT:
		return "the range is not mapped readable and writable in the process";
	case -ESRCH:
		return "the process exited";
	case -ENOSYS:
		return "the kernel has no pidfds (Linux 5.3): process memory is refused";
	case -ENOSPC:
		return "too many buffers in this session";
	case -EEXIST:
		return overlap_why;
	case -EOPNOTSUPP:
		return dmabuf ? "device memory is reached by RDMA only, and this agent's "
				"engine has no RDMA device that registers dma-bufs"
			      : "this agent runs no transfer engine";
	default:
		return NULL;
	}
}

/*
 * A registration of client memory the agent does not map: its own
 * process memory (checked, then reached by cross-memory attach) or a
 * dma-buf of its device memory (registered with the RDMA devices). Both
 * take time (reading /proc, pinning): on a copy thread.
 */
struct unmapped_reg {
	struct agent_job job;
	struct agent_req *r;
	struct te_engine *te; /* the session's (agent__op_te) */
	struct agent_map *m;
	pid_t pid;
	int pidfd;  /* process memory: a dup, owned; else -1 */
	int dmabuf; /* a dma-buf: the attached fd, owned; else -1 */
	uint64_t address, len, offset;
	int err;
	struct agent_unmap_wait wait;
};

static void unmapped_run(struct agent_job *j)
{
	struct unmapped_reg *p = MC_CONTAINER_OF(j, struct unmapped_reg, job);
	if (p->dmabuf >= 0) {
		p->err = te_register_dmabuf(p->te, p->address, p->len, p->dmabuf, p->offset,
					    &p->m->region);
	} else {
		p->err = agent__check_process(p->pid, p->address, p->len);
		if (p->err == 0)
			p->err = te_register_process(p->te, p->address, p->len, p->pid,
						     p->pidfd, &p->m->region);
	}
	if (p->err)
		p->m->region = NULL;
	/* An overlap may be tried again (agent__unmap_wait): the descriptor
	 * is kept until the done decides. */
	if (p->err != -EEXIST)
		close(p->dmabuf >= 0 ? p->dmabuf : p->pidfd);
}

static void unmapped_done(struct agent_job *j)
{
	struct unmapped_reg *p = MC_CONTAINER_OF(j, struct unmapped_reg, job);
	struct agent_req *r = p->r;
	bool dmabuf = p->dmabuf >= 0;
	uint64_t id;
	int rc = p->err;
	if (rc == -EEXIST && agent__unmap_wait(r->a, &p->wait))
		return;
	if (rc == -EEXIST) /* (kept open by the run) */
		close(dmabuf ? p->dmabuf : p->pidfd);
	if (rc == 0) {
		map_engine(r, p->m);
		p->m->device = dmabuf;
		rc = agent__session_closed(r->c)
			     ? MC_ECANCELLED
			     : agent__session_buf_add(r->c, p->m, NULL, p->len, p->address,
						      false, &id);
	}
	if (rc) {
		const char *why = unmapped_why(rc, dmabuf);
		log_warn("client %s: %s 0x%llx+%llu refused: %s", agent__session_name(r->c),
			 dmabuf ? "device memory" : "process memory",
			 (unsigned long long)p->address, (unsigned long long)p->len,
			 why ? why : mc_strerror(rc));
		agent__map_unref(p->m);
		agent__op_fail(r, rc, why);
	} else {
		buffer_reply(r, id, p->len, -1);
	}
	free(p);
}

/* Register [address, address + length) of the client's process memory,
 * or of its device memory by the attached dma-buf. */
static void register_unmapped(struct agent_req *r)
{
	const Mooncake__Client__RegisterBufferRequest *q = r->msg->register_buffer;
	struct agent_conn *c = r->c;
	int pidfd = -1, rc = 0;
	pid_t pid = q->dmabuf ? 0 : agent__session_pid(c, &pidfd);
	struct unmapped_reg *p = NULL;
	struct agent_map *m = NULL;
	struct te_engine *te = agent__op_te(r);
	if (!te)
		rc = -EOPNOTSUPP;
	else if (agent__session_bufs_full(c))
		rc = -ENOSPC;
	else if (!q->dmabuf && pidfd < 0)
		rc = -ENOSYS;
	else if (!(p = calloc(1, sizeof(*p))) || agent__map_unmapped(r->a, q->length, &m) != 0)
		rc = -ENOMEM;
	else if (!q->dmabuf && (p->pidfd = fcntl(pidfd, F_DUPFD_CLOEXEC, 3)) < 0)
		rc = -errno;
	if (rc) {
		agent__map_unref(m);
		free(p);
		agent__op_fail(r, rc, unmapped_why(rc, q->dmabuf));
		return;
	}
	p->r = r;
	p->te = te;
	p->m = m;
	p->pid = pid;
	if (q->dmabuf) {
		p->pidfd = -1;
		p->dmabuf = r->fds[0];
		r->fds[0] = -1;
	} else {
		p->dmabuf = -1;
	}
	p->address = q->address;
	p->len = q->length;
	p->offset = q->offset;
	p->job.run = unmapped_run;
	p->job.done = unmapped_done;
	agent__unmap_wait_submit(r->a, &p->wait, &p->job);
}

void agent__op_register_buffer(struct agent_req *r)
{
	const Mooncake__Client__RegisterBufferRequest *q = r->msg->register_buffer;
	struct agent_conn *c = r->c;
	if (q->process_memory || q->dmabuf) {
		register_unmapped(r);
		return;
	}
	struct agent_map *m;
	uint8_t *base;
	int rc = agent__session_bufs_full(c)
			 ? -ENOSPC
			 : agent__map_client_fd(r->a, r->fds[0], agent__session_uid(c),
						q->offset, q->length, &m, &base);
	if (rc) {
		const char *why = register_why(rc);
		log_warn("client %s: register_buffer refused: %s", agent__session_name(c),
			 why ? why : mc_strerror(rc));
		agent__op_fail(r, rc, why);
		return;
	}
	r->fds[0] = -1;
	add_or_publish(r, m, base, q->length, q->address, q->offset, -1);
}

/* A published buffer leaves the engine before the reply: once the client
 * hears back, no peer can reach it any more. */
struct unpublish {
	struct agent_job job;
	struct agent_req *r;
	struct agent_map *m;
	uint64_t id;
};

static void unpublish_run(struct agent_job *j)
{
	struct unpublish *u = MC_CONTAINER_OF(j, struct unpublish, job);
	te_unregister(u->m->region);
	u->m->region = NULL;
}

static void unpublish_done(struct agent_job *j)
{
	struct unpublish *u = MC_CONTAINER_OF(j, struct unpublish, job);
	agent__map_unref(u->m);
	buffer_reply(u->r, u->id, 0, -1);
	free(u);
}

void agent__op_unregister_buffer(struct agent_req *r)
{
	uint64_t id = r->msg->unregister_buffer->buffer;
	struct agent_map *m = agent__session_buf_remove(r->c, id);
	if (!m) {
		agent__op_fail(r, -ENOENT, "no such buffer in this session");
		return;
	}
	struct unpublish *u = m->region ? calloc(1, sizeof(*u)) : NULL;
	if (u) {
		u->r = r;
		u->m = m;
		u->id = id;
		u->job.run = unpublish_run;
		u->job.done = unpublish_done;
		agent__pool_submit(&r->a->pool, &u->job);
		return;
	}
	agent__map_unref(m);
	buffer_reply(r, id, 0, -1);
}

void agent__op_alloc_buffer(struct agent_req *r)
{
	struct agent *a = r->a;
	struct agent_conn *c = r->c;
	const Mooncake__Client__AllocBufferRequest *q = r->msg->alloc_buffer;
	if (agent__session_bufs_full(c)) {
		agent__op_fail(r, -ENOSPC, register_why(-ENOSPC));
		return;
	}
	if (agent__server_alloc_take(c, q->length) != 0) {
		agent__op_fail(r, -ENOSPC,
			       "the buffers the agent made for its clients hold "
			       "all the memory it may give them (--client-alloc-size)");
		return;
	}
	struct agent_memfd_opts mo = {
		.name = "mooncake-buffer",
		.len = q->length,
		.hugepages = a->hugepages == AGENT_HUGEPAGES_ON ? AGENT_HUGEPAGES_AUTO
								: a->hugepages,
		.numa_node = a->numa_node,
	};
	struct agent_map *m;
	int rc = agent__memfd_new(a, &mo, &m);
	if (rc) {
		agent__server_alloc_give(a, q->length);
		agent__op_fail(r, rc, "cannot create the buffer");
		return;
	}
	int fd = dup(m->fd);
	if (fd < 0) {
		rc = -errno;
		agent__map_unref(m);
		agent__server_alloc_give(a, q->length);
		agent__op_fail(r, rc, NULL);
		return;
	}
	add_or_publish(r, m, m->addr, q->length, q->address, 0, fd);
}

/* ------------------------------------------------------------ transfer */

/* This agent's memory at a remote address: its segment, or a buffer one
 * of its clients published at that address — mapped here (the pointer),
 * or a client's process memory (NULL, with *proc its region). A
 * reference on the memory is held for the request: another session may
 * unregister its buffer while the copy runs. */
static uint8_t *local_target(struct agent_req *r, uint64_t addr, uint64_t len,
			     struct te_region **proc)
{
	struct agent *a = r->a;
	uint64_t base = (uint64_t)(uintptr_t)a->seg->addr;
	*proc = NULL;
	if (addr >= base && addr - base <= a->seg->len && len <= a->seg->len - (addr - base))
		return a->seg->addr + (addr - base);
	const struct agent_buf *b = agent__server_published(a, addr, len);
	if (!b || agent__op_hold(r, b->map) != 0)
		return NULL;
	if (!b->base)
		*proc = b->map->region;
	return b->base ? b->base + (addr - b->address) : NULL;
}

static void transfer_run(struct agent_job *j)
{
	struct agent_req *r = MC_CONTAINER_OF(j, struct agent_req, job);
	struct agent *a = r->a;
	struct agent_xfer *x = NULL;
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->len == 0 || (it->reps && it->reps[0].local))
			continue;
		if (!x) {
			if (!(x = agent__xfer_new())) {
				it->err = -ENOMEM;
				continue;
			}
			if (r->inst)
				agent__xfer_engine(x, agent__inst_te(r->inst));
		}
		if (it->device)
			agent__xfer_add_device(a, x, it->target, it->write, it->ptr,
					       it->remote, it->len, &it->err);
		else
			agent__xfer_add(a, x, it->target, it->write, it->ptr, it->remote,
					it->len, &it->err);
	}
	if (x)
		agent__xfer_start(a, x);
	for (size_t i = 0; i < r->n; i++) {
		struct agent_item *it = &r->items[i];
		if (it->err || it->len == 0 || !it->reps || !it->reps[0].local)
			continue;
		uint8_t *t = (uint8_t *)(uintptr_t)it->reps[0].address;
		if (it->proc)
			it->err = te_region_io(it->proc, it->remote, it->ptr, it->len,
					       it->write);
		else if (it->write)
			memmove(t, it->ptr, it->len);
		else
			memmove(it->ptr, t, it->len);
	}
	if (x)
		agent__xfer_finish(a, x);
}

static void transfer_done(struct agent_job *j)
{
	struct agent_req *r = MC_CONTAINER_OF(j, struct agent_req, job);
	int32_t *errs = calloc(r->n, sizeof(*errs));
	if (!errs) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	int first = 0;
	for (size_t i = 0; i < r->n; i++) {
		errs[i] = r->items[i].err;
		if (errs[i] && !first)
			first = errs[i];
		if (!errs[i])
			agent__count(&r->a->stats,
				     r->items[i].write ? AGENT_C_BYTES_WRITTEN
						       : AGENT_C_BYTES_READ,
				     r->items[i].len);
	}
	Mooncake__Client__TransferReply tr = MOONCAKE__CLIENT__TRANSFER_REPLY__INIT;
	tr.errors = errs;
	tr.n_errors = r->n;
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_TRANSFER;
	resp.transfer = &tr;
	agent__reply(r, &resp, NULL, NULL, 0);
	free(errs);
	agent__op_finish(r, first);
}

void agent__op_transfer(struct agent_req *r)
{
	struct agent *a = r->a;
	const Mooncake__Client__TransferRequest *q = r->msg->transfer;
	if (agent__op_items(r, q->n_items)) {
		agent__op_fail(r, -ENOMEM, NULL);
		return;
	}
	for (size_t i = 0; i < q->n_items; i++) {
		struct agent_item *it = &r->items[i];
		const Mooncake__Client__TransferItem *ti = q->items[i];
		it->write = ti->op == MOONCAKE__CLIENT__TRANSFER_ITEM__OP__WRITE;
		it->len = ti->local->length;
		it->target = ti->target;
		it->remote = ti->remote_address;
		it->err = agent__op_region(r, ti->local, &it->ptr);
		if (it->err == -EINVAL && agent__op_device(r, ti->local, &it->ptr) == 0) {
			it->device = true;
			it->err = 0;
		}
		if (it->err || it->len == 0)
			continue;
		if (it->device && strcmp(ti->target, a->name) == 0) {
			it->err = -EOPNOTSUPP; /* no CPU copies device memory */
			continue;
		}
		if (strcmp(ti->target, a->name) == 0) {
			uint8_t *t = local_target(r, ti->remote_address, it->len, &it->proc);
			if (!t && !it->proc) {
				it->err = MC_EINVALID_REPLICA; /* not registered here */
				continue;
			}
			it->reps = calloc(1, sizeof(*it->reps));
			if (!it->reps) {
				it->err = -ENOMEM;
				continue;
			}
			it->nrep = 1;
			it->reps[0].local = true;
			it->reps[0].address = (uint64_t)(uintptr_t)t;
		}
	}
	(void)agent__op_te(r); /* the session's engine, held */
	r->job.run = transfer_run;
	r->job.done = transfer_done;
	agent__pool_submit(&a->pool, &r->job);
}

/* ------------------------------------------------------------ engine */

static void engine_reply(struct agent_req *r, int rc)
{
	if (rc) {
		agent__op_fail(r, rc,
			       rc == -EBUSY ? "the session published buffers with the agent's "
					      "engine already"
			       : rc == -EOPNOTSUPP ? "this agent runs no transfer engine"
						   : NULL);
		return;
	}
	Mooncake__Client__EngineReply er = MOONCAKE__CLIENT__ENGINE_REPLY__INIT;
	er.name = (char *)agent__inst_name(r->inst);
	Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
	resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_ENGINE;
	resp.engine = &er;
	agent__reply(r, &resp, NULL, NULL, 0);
	agent__op_finish(r, 0);
}

/* A new engine answers once its descriptor is in meta (at once in P2P
 * mode), waiting up to the engine's io timeout: peers told its name can
 * open it. */
struct engine_wait {
	struct agent_job job;
	struct agent_req *r;
	int err;
};

static void engine_wait_run(struct agent_job *j)
{
	struct engine_wait *w = MC_CONTAINER_OF(j, struct engine_wait, job);
	struct te_engine *te = agent__inst_te(w->r->inst);
	w->err = te_wait_published(te, te_io_timeout_ms(te));
	if (w->err)
		log_warn("transfer engine %s: not published in meta: %s",
			 agent__inst_name(w->r->inst), mc_strerror(w->err));
}

static void engine_wait_done(struct agent_job *j)
{
	struct engine_wait *w = MC_CONTAINER_OF(j, struct engine_wait, job);
	struct agent_req *r = w->r;
	int rc = w->err;
	free(w);
	engine_reply(r, rc);
}

void agent__op_engine(struct agent_req *r)
{
	struct agent_inst *i = agent__session_inst(r->c);
	if (i) {
		(void)agent__op_te(r); /* r->inst */
		engine_reply(r, 0);
		return;
	}
	int rc = agent__inst_new(r->a, &i);
	if (rc == 0 && (rc = agent__session_set_inst(r->c, i)) != 0)
		agent__inst_unref(i);
	struct engine_wait *w = rc ? NULL : calloc(1, sizeof(*w));
	if (!rc && !w)
		rc = -ENOMEM;
	if (rc) {
		engine_reply(r, rc);
		return;
	}
	log_info("client %s: a transfer engine of its own, %s", agent__session_name(r->c),
		 agent__inst_name(i));
	(void)agent__op_te(r); /* r->inst */
	w->r = r;
	w->job.run = engine_wait_run;
	w->job.done = engine_wait_done;
	agent__pool_submit(&r->a->pool, &w->job);
}

/* ------------------------------------------------------------ segment probe */

/* A segment opened as a transfer would (blocking: on a copy thread),
 * and its regions. */
struct probe {
	struct agent_job job;
	struct agent_req *r;
	struct te_engine *te;
	int err;
	size_t n;
	struct te_region_info *regions;
};

static void probe_run(struct agent_job *j)
{
	struct probe *p = MC_CONTAINER_OF(j, struct probe, job);
	struct te_segment *s;
	p->err = te_open_segment(p->te, p->r->msg->segment->name, &s);
	if (p->err)
		return;
	struct te_segment_info info;
	size_t n = te_segment_info(s, &info, NULL, 0);
	p->regions = calloc(n ? n : 1, sizeof(*p->regions));
	if (p->regions)
		p->n = MC_MIN(n, te_segment_info(s, &info, p->regions, n));
	else
		p->err = -ENOMEM;
	te_close_segment(s);
}

static void probe_done(struct agent_job *j)
{
	struct probe *p = MC_CONTAINER_OF(j, struct probe, job);
	struct agent_req *r = p->r;
	Mooncake__Client__SegmentRegion *regs = calloc(p->n ? p->n : 1, sizeof(*regs));
	Mooncake__Client__SegmentRegion **ptrs = calloc(p->n ? p->n : 1, sizeof(*ptrs));
	if (!p->err && (!regs || !ptrs))
		p->err = -ENOMEM;
	if (p->err) {
		log_debug("client %s: segment %s: %s", agent__session_name(r->c),
			  r->msg->segment->name, mc_strerror(p->err));
		agent__op_fail(r, p->err, NULL);
	} else {
		for (size_t i = 0; i < p->n; i++) {
			mooncake__client__segment_region__init(&regs[i]);
			regs[i].address = p->regions[i].addr;
			regs[i].length = p->regions[i].len;
			ptrs[i] = &regs[i];
		}
		Mooncake__Client__SegmentReply sr = MOONCAKE__CLIENT__SEGMENT_REPLY__INIT;
		sr.regions = ptrs;
		sr.n_regions = p->n;
		Mooncake__Client__Response resp = MOONCAKE__CLIENT__RESPONSE__INIT;
		resp.body_case = MOONCAKE__CLIENT__RESPONSE__BODY_SEGMENT;
		resp.segment = &sr;
		agent__reply(r, &resp, NULL, NULL, 0);
		agent__op_finish(r, 0);
	}
	free(regs);
	free(ptrs);
	free(p->regions);
	free(p);
}

void agent__op_segment(struct agent_req *r)
{
	struct te_engine *te = agent__op_te(r);
	struct probe *p = te ? calloc(1, sizeof(*p)) : NULL;
	if (!p) {
		agent__op_fail(r, te ? -ENOMEM : MC_EUNAVAILABLE,
			       te ? NULL : "this agent runs no transfer engine");
		return;
	}
	p->r = r;
	p->te = te;
	p->job.run = probe_run;
	p->job.done = probe_done;
	agent__pool_submit(&r->a->pool, &p->job);
}
