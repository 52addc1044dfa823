/* SPDX-License-Identifier: MIT */
/* PROTO_TRAJ_STEP through the real belayer-supervisor's socket: decisions per [policy] mode,
 * the bubble learnt across step events, bad ids refused, other clients unaffected. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto.h"
#include "sv-test.h"
#include "util.h"

static struct proto_traj_decision exchange(int fd, enum traj_event ev, const char *traj,
					   uint64_t out, uint64_t mtps)
{
	struct proto_msg q = {.type = PROTO_TRAJ_STEP}, a;

	q.traj_step.ev = ev;
	snprintf(q.traj_step.trajectory, sizeof(q.traj_step.trajectory), "%s", traj);
	snprintf(q.traj_step.env, sizeof(q.traj_step.env), "env-1");
	q.traj_step.output_tokens = out;
	q.traj_step.decode_mtps = mtps;
	assert_int_equal(proto_send(fd, &q, 0), 0);
	assert_int_equal(client_recv(fd, &a, SV_WAIT_MS), 0);
	if (a.type != PROTO_TRAJ_DECISION)
		fail_msg("reply %s: %s", proto_type_to_string(a.type),
			 a.type == PROTO_ERROR ? a.error.message : "");
	assert_int_equal(a.traj_decision.ev, ev);
	assert_string_equal(a.traj_decision.trajectory, traj);
	assert_string_equal(a.traj_decision.env, "env-1");
	return a.traj_decision;
}

static void adaptive_decisions_over_the_socket(void **state)
{
	static const char *const settings[] = {"policy.mode=adaptive", "policy.confidence=100",
					       NULL};
	struct sv sv;
	struct proto_traj_decision d;
	int fd;

	sv_setup(&sv);
	sv_start(&sv, settings);
	fd = client_connect(&sv);
	assert_true(fd >= 0);
	/* No history: nothing to bet on. */
	d = exchange(fd, TRAJ_STEP_END, "traj-a", 0, 100000);
	assert_int_equal(d.act, TRAJ_ACT_NONE);
	assert_string_equal(d.why, "no-fit");
	assert_int_equal(d.bubble_us, 0);
	assert_int_equal(d.bubble_err_pm, 1000);
	assert_true(d.cost_us > 0);
	d = exchange(fd, TRAJ_STEP_BEGIN, "traj-a", 500, 0);
	assert_int_equal(d.act, TRAJ_ACT_NONE);
	/* 500 tokens at 100 tokens/s: a 5 s bubble, not yet checked against an outcome, but every
	 * remembered length outlasts the checkpoint: a bet even at confidence 100% (advice only:
	 * env-1 is not an environment the supervisor manages). */
	d = exchange(fd, TRAJ_STEP_END, "traj-a", 0, 100000);
	assert_int_equal(d.bubble_us, 5000000);
	assert_int_equal(d.bubble_err_pm, 1000);
	assert_int_equal(d.act, TRAJ_ACT_CHECKPOINT);
	assert_string_equal(d.why, "fits");
	/* A new trajectory starts from the fleet's history. */
	d = exchange(fd, TRAJ_STEP_END, "traj-b", 0, 100000);
	assert_int_equal(d.bubble_us, 5000000);
	assert_int_equal(d.act, TRAJ_ACT_CHECKPOINT);
	assert_int_equal(sv_kill(&sv, SIGTERM), 0);
	close(fd);
	sv_teardown(&sv);
}

static void modes_and_refusals(void **state)
{
	static const char *const every[] = {"policy.mode=every-turn", NULL};
	static const char *const never[] = {"policy.mode=never", NULL};
	struct proto_msg q = {.type = PROTO_TRAJ_STEP}, a;
	struct proto_traj_decision d;
	struct sv sv;
	int fd;

	sv_setup(&sv);
	sv_start(&sv, every);
	fd = client_connect(&sv);
	assert_true(fd >= 0);
	d = exchange(fd, TRAJ_STEP_END, "t", 0, 0);
	assert_int_equal(d.act, TRAJ_ACT_CHECKPOINT_SYNC);
	assert_string_equal(d.why, "every-turn");
	/* No trajectory id: refused, and the connection still serves. */
	snprintf(q.traj_step.env, sizeof(q.traj_step.env), "env-1");
	assert_int_equal(proto_send(fd, &q, 0), 0);
	assert_int_equal(client_recv(fd, &a, SV_WAIT_MS), 0);
	assert_int_equal(a.type, PROTO_ERROR);
	assert_int_equal(a.error.code, EINVAL);
	assert_int_equal(a.error.in_reply_to, PROTO_TRAJ_STEP);
	d = exchange(fd, TRAJ_STEP_BEGIN, "t", 3, 0);
	assert_int_equal(d.act, TRAJ_ACT_NONE);
	assert_int_equal(sv_kill(&sv, SIGTERM), 0);
	close(fd);

	sv_start(&sv, never);
	fd = client_connect(&sv);
	assert_true(fd >= 0);
	d = exchange(fd, TRAJ_STEP_END, "t", 0, 0);
	assert_int_equal(d.act, TRAJ_ACT_NONE);
	assert_string_equal(d.why, "never");
	assert_int_equal(sv_kill(&sv, SIGTERM), 0);
	close(fd);
	sv_teardown(&sv);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(adaptive_decisions_over_the_socket),
		cmocka_unit_test(modes_and_refusals),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
