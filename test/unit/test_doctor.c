/*
 * Mirror test of src/doctor/doctor.c: the report and the node checks on
 * roots with nothing in them (test/integration/test_doctor.py runs them
 * on fake trees of real nodes).
 */
#include <criterion/criterion.h>
#include <string.h>

#include "common/cfg.h"
#include "doctor/doctor.h"

Test(doctor, report_rows_and_worst_verdict)
{
	struct doctor_report r = {0};
	cr_assert_eq(doctor_add(&r, DOCTOR_OK, "a", "found", "want", "ignored when ok"), 0);
	cr_assert_eq(doctor_worst(&r), DOCTOR_OK);
	cr_assert_str_eq(r.rows[0].fix, "");
	cr_assert_eq(doctor_add(&r, DOCTOR_SKIP, "b", "", "", ""), 0);
	cr_assert_eq(doctor_worst(&r), DOCTOR_OK, "SKIP counts as OK");
	cr_assert_eq(doctor_add(&r, DOCTOR_WARN, "c", "", "", "fix c"), 0);
	cr_assert_eq(doctor_worst(&r), DOCTOR_WARN);
	char big[2000];
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	for (int i = 0; i < 100; i++)
		cr_assert_eq(doctor_add(&r, DOCTOR_FAIL, big, big, big, big), 0);
	cr_assert_eq(doctor_worst(&r), DOCTOR_FAIL);
	cr_assert_eq(r.n, 103);
	cr_assert_eq(strlen(r.rows[50].value), sizeof(r.rows[50].value) - 1,
		     "cut to the field");
	cr_assert_str_eq(doctor_verdict_name(DOCTOR_FAIL), "FAIL");
	doctor_report_free(&r);
	cr_assert_eq(r.n, 0);
}

Test(doctor, empty_roots_are_findings_not_crashes)
{
	struct cfg c;
	struct cfg_cmdline cl;
	char err[256];
	char *argv[] = {"mooncaked", "--config=", "--protocol=rdma", NULL};
	char *envp[] = {NULL};
	cr_assert_eq(cfg_load(&c, 3, argv, envp, &cl, err, sizeof(err)), 0, "%s", err);
	struct doctor_env env = {.sysfs_root = "/nonexistent/sys",
				 .procfs_root = "/nonexistent/proc",
				 .dev_root = "/nonexistent/dev",
				 .etc_root = "/nonexistent/etc",
				 .cfg = &c};
	struct doctor_report r = {0};
	cr_assert_eq(doctor_node_checks(&env, &r), 0);
	cr_assert_gt(r.n, 3);
	cr_assert_str_eq(r.rows[0].check, "rdma devices");
	cr_assert_eq(r.rows[0].verdict, DOCTOR_FAIL, "--protocol=rdma and no device");
	bool mem = false;
	for (size_t i = 0; i < r.n; i++)
		mem |= strcmp(r.rows[i].check, "memory available") == 0 &&
		       r.rows[i].verdict == DOCTOR_WARN;
	cr_assert(mem, "no meminfo: a warning");
	doctor_report_free(&r);
	cfg_free(&c);

	/* A master's node has no segment: only the common checks. */
	char *margv[] = {"mooncaked", "--config=", "--role=master", NULL};
	cr_assert_eq(cfg_load(&c, 3, margv, envp, &cl, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(doctor_node_checks(&env, &r), 0);
	for (size_t i = 0; i < r.n; i++)
		cr_assert(strncmp(r.rows[i].check, "rdma", 4) != 0, "%s", r.rows[i].check);
	doctor_report_free(&r);
	cfg_free(&c);
}
