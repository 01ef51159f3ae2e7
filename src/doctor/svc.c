/*
 * svc: mooncake.doctor.Doctor on a daemon's RPC port. Check runs the node
 * checks for this process (its configuration, limits and capabilities)
 * on a thread of libuv's pool, since they read sysfs and may open RDMA
 * devices, and answers from the loop once they are done. The handler
 * keeps the call until then; a client that went away meanwhile makes the
 * answer a no-op.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common/util.h"
#include "doctor.pb-c.h"
#include "doctor/doctor.h"
#include "rpc/rpc.h"

#define SERVICE "mooncake.doctor.Doctor"

struct check_job {
	uv_work_t work;
	struct rpc_call *call;
	const struct cfg *cfg;
	struct doctor_report rep;
	int rc;
};

static void check_run(uv_work_t *w)
{
	struct check_job *j = MC_CONTAINER_OF(w, struct check_job, work);
	struct doctor_env env = {.cfg = j->cfg, .daemon_running = true};
	j->rc = doctor_node_checks(&env, &j->rep);
}

static void check_done(uv_work_t *w, int status)
{
	struct check_job *j = MC_CONTAINER_OF(w, struct check_job, work);
	(void)status;
	if (j->rc) {
		rpc_call_finish(j->call, RPC_RESOURCE_EXHAUSTED, "out of memory");
		goto out;
	}
	Mooncake__Doctor__CheckResponse resp = MOONCAKE__DOCTOR__CHECK_RESPONSE__INIT;
	Mooncake__Doctor__Row *rows = calloc(j->rep.n ? j->rep.n : 1, sizeof(*rows));
	Mooncake__Doctor__Row **ptrs = calloc(j->rep.n ? j->rep.n : 1, sizeof(*ptrs));
	char host[256] = "";
	if (!rows || !ptrs) {
		free(rows);
		free(ptrs);
		rpc_call_finish(j->call, RPC_RESOURCE_EXHAUSTED, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < j->rep.n; i++) {
		Mooncake__Doctor__Row init = MOONCAKE__DOCTOR__ROW__INIT;
		const struct doctor_row *r = &j->rep.rows[i];
		rows[i] = init;
		rows[i].check = (char *)r->check;
		rows[i].value = (char *)r->value;
		rows[i].expected = (char *)r->expected;
		rows[i].verdict = (Mooncake__Doctor__Verdict)r->verdict;
		rows[i].fix = (char *)r->fix;
		ptrs[i] = &rows[i];
	}
	(void)gethostname(host, sizeof(host) - 1);
	resp.host = host;
	resp.wall_time_ms = (int64_t)mc_wall_ms();
	resp.version = (char *)MC_VERSION;
	resp.n_rows = j->rep.n;
	resp.rows = ptrs;
	if (rpc_call_send(j->call, &resp.base) == 0)
		rpc_call_finish(j->call, RPC_OK, NULL);
	else
		rpc_call_finish(j->call, RPC_CANCELLED, NULL);
	free(rows);
	free(ptrs);
out:
	doctor_report_free(&j->rep);
	free(j);
}

static void on_check(struct rpc_call *call, const ProtobufCMessage *msg)
{
	(void)msg;
	struct check_job *j = calloc(1, sizeof(*j));
	if (!j) {
		rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	j->call = call;
	j->cfg = rpc_call_service_data(call);
	if (uv_queue_work(rpc_call_loop(call), &j->work, check_run, check_done) != 0) {
		free(j);
		rpc_call_finish(call, RPC_UNAVAILABLE, "cannot queue the checks");
	}
}

static const struct rpc_method methods[] = {
	{.name = "Check",
	 .kind = RPC_UNARY,
	 .request = &mooncake__doctor__check_request__descriptor,
	 .response = &mooncake__doctor__check_response__descriptor,
	 .on_message = on_check},
};

int doctor_service_add(struct rpc_server *s, const struct cfg *cfg)
{
	return rpc_server_add_service(s, SERVICE, methods, MC_ARRAY_LEN(methods), (void *)cfg);
}
