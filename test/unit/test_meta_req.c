/*
 * test_meta_req: client requests on a node without sockets — how a request
 * is routed by what the node knows, here the window in which the node
 * still believes it leads while its Raft core has already stepped down (a
 * message with a higher term stepped in between two readies). A write
 * submitted then must wait for the next ready to say who leads; it used
 * to be submitted again and again until the stack overflowed, the
 * segfault `etcdctl check perf --load=l` found on a leader that was just
 * deposed.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "meta/meta_int.h"

static uv_loop_t loop;
static int answers, last_status;

static void setup(void)
{
	cr_assert_eq(uv_loop_init(&loop), 0);
}

static void teardown(void)
{
	cr_assert_eq(uv_loop_close(&loop), 0);
}

TestSuite(meta_req, .init = setup, .fini = teardown);

static void on_answer(struct meta__op *op, int status, const char *message,
		      const ProtobufCMessage *resp)
{
	(void)op;
	(void)message;
	(void)resp;
	answers++;
	last_status = status;
}

/* A running node whose core is a follower (a fresh core) but which still
 * believes it is the leader. */
static struct meta_node *deposed_leader(void)
{
	struct meta_node *n = calloc(1, sizeof(*n));
	struct mvcc_options mo = {.min_lease_ttl_s = 2};
	struct raft_config c;
	cr_assert_not_null(n);
	n->loop = &loop;
	n->id = 1;
	n->o.quota_backend_bytes = 1 << 20;
	n->o.max_request_bytes = 1 << 20;
	n->o.election_ms = 1000;
	n->request_timeout_ms = 5000;
	n->finishing = true; /* the transport opens no connection */
	cr_assert_eq(meta__sm_init(&n->sm, &mo), 0);
	n->sm.member_id = 1;
	raft_config_init(&c, 1);
	cr_assert_eq(raft_new(&c, NULL, &n->raft), 0);
	n->running = true;
	n->role = RAFT_LEADER;
	n->leader = 1;
	return n;
}

static void node_free(struct meta_node *n)
{
	raft_free(n->raft);
	meta__sm_free(&n->sm);
	free(n);
}

static struct meta__op *put_op(struct meta_node *n)
{
	Etcdserverpb__PutRequest q = ETCDSERVERPB__PUT_REQUEST__INIT;
	q.key = (ProtobufCBinaryData){1, (uint8_t *)"k"};
	q.value = (ProtobufCBinaryData){1, (uint8_t *)"v"};
	struct meta__op *op = meta__op_new(n, META_M_PUT, &q.base, 0, on_answer, NULL);
	cr_assert_not_null(op);
	return op;
}

Test(meta_req, write_on_a_deposed_leader_waits_for_the_next_leader)
{
	struct meta_node *n = deposed_leader();
	answers = 0;
	meta__submit(n, put_op(n));
	cr_assert_eq(answers, 0, "not answered: nothing was decided");
	cr_assert_eq(n->wait_leader.n, 1, "parked until a ready says who leads");

	/* The same when the write was queued during a ready and proposed
	 * when the core was free again (the turn's feed). */
	struct meta__op *op = put_op(n);
	cr_assert_eq(
		meta__wrap_request(op->method, op->req, op->req_len, &op->ent, &op->ent_len),
		0);
	meta__propose(n, op);
	cr_assert_eq(n->wait_leader.n, 2);

	/* Rerun while the node still believes it leads: parked again, not
	 * looped. */
	meta__rerun(n, &n->wait_leader);
	cr_assert_eq(n->wait_leader.n, 2);
	cr_assert_eq(answers, 0);

	meta__fail_list(&n->wait_leader, META_ESTOPPED);
	cr_assert_eq(answers, 2);
	cr_assert_eq(last_status, RPC_UNAVAILABLE);
	node_free(n);
}
