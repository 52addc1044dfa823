/* SPDX-License-Identifier: MIT */
/* Step events through the trajectory tracker (supervisor/supervisor-traj.h): scripted
 * timelines from PROTO_TRAJ_STEP messages to PROTO_TRAJ_DECISION answers. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "supervisor-traj.h"
#include "util.h"

#define S 1000000ull

static struct proto_traj_step step(enum traj_event ev, const char *traj, const char *env,
				   uint64_t out, uint64_t mtps)
{
	struct proto_traj_step q = {.ev = ev, .output_tokens = out, .decode_mtps = mtps};

	strcpy(q.trajectory, traj);
	strcpy(q.env, env);
	return q;
}

/* A trajectory whose actions take 500 tokens at 100 tokens/s: the first bubble is unknown
 * (no history anywhere), from the second on every remembered length says the 5 s bubble
 * outlasts the checkpoint (even at confidence 100%). */
static void bubbles_learnt_then_checkpointed(void **state)
{
	const struct policy_config c = {
		.mode = POLICY_ADAPTIVE, .confidence = 1.0, .max_delay_us = 50000};
	const struct traj_env_view v = {
		.dirty = true, .dirty_bytes = 1 << 20, .mem_bytes = 100 << 20};
	struct traj_tracker *t = traj_tracker_new(8, 0.2);
	const enum traj_action want[] = {TRAJ_ACT_NONE, TRAJ_ACT_CHECKPOINT, TRAJ_ACT_CHECKPOINT,
					 TRAJ_ACT_CHECKPOINT};
	uint64_t now = 10 * S;

	assert_non_null(t);
	for (size_t turn = 0; turn < ARRAY_SIZE(want); turn++) {
		struct proto_traj_step q = step(TRAJ_STEP_END, "T", "E", 0, 100000);
		struct proto_traj_decision d;

		assert_int_equal(traj_on_step(t, &c, &q, &v, now, &d), 0);
		print_message("turn %zu: %s (%s) bubble %lu us err %u, cost %lu us err %u\n", turn,
			      traj_action_to_string(d.act), d.why, (unsigned long)d.bubble_us,
			      d.bubble_err_pm, (unsigned long)d.cost_us, d.cost_err_pm);
		assert_int_equal(d.ev, TRAJ_STEP_END);
		assert_string_equal(d.trajectory, "T");
		assert_string_equal(d.env, "E");
		assert_int_equal(d.act, want[turn]);
		if (turn > 0)
			assert_int_equal(d.bubble_us, 5 * S);
		if (d.act == TRAJ_ACT_CHECKPOINT) {
			struct cost_sample s = {.fs_bytes = 1 << 20,
						.criu_bytes = 100 << 20,
						.fs_s = 0.001,
						.dump_s = 0.100,
						.total_s = 0.130};

			assert_string_equal(d.why, "fits");
			assert_int_equal(traj_checkpoint_done(t, "T", "E", &s, now + 130000), 0);
		}
		now += 5 * S;
		q = step(TRAJ_STEP_BEGIN, "T", "E", 500, 0);
		assert_int_equal(traj_on_step(t, &c, &q, &v, now, &d), 0);
		assert_int_equal(d.ev, TRAJ_STEP_BEGIN);
		assert_int_equal(d.act, TRAJ_ACT_NONE);
		now += 2 * S; /* the environment's step */
	}
	assert_int_equal(traj_bubble(t, "T")->n_lengths, ARRAY_SIZE(want));
	assert_true(traj_bubble(t, "T")->err.mean < 0.01);
	assert_int_equal(traj_env_cost(t, "E")->n, 3);
	assert_true(traj_env_cost(t, "E")->err.mean < 1.0);
	traj_tracker_free(t);
}

/* Short bubbles (10 tokens at a learnt 100 tokens/s) on a big environment never fit: the turn
 * bound forces a checkpoint; it cannot finish within the bubble plus max_delay, so the daemon
 * aborts it when the action arrives (nothing reported done) and the turns stay unprotected:
 * forced again at the next bubble. */
static void short_bubbles_are_forced_by_turns(void **state)
{
	const struct policy_config c = {
		.mode = POLICY_ADAPTIVE, .confidence = 1.0, .max_turns = 2, .max_delay_us = 50000};
	const struct traj_env_view v = {.dirty = true, .mem_bytes = 4ull << 30};
	struct traj_tracker *t = traj_tracker_new(8, 0.2);
	const char *want[] = {"no-fit", "no-fit", "force-turns", "force-turns"};
	uint64_t now = S;

	assert_non_null(t);
	for (size_t turn = 0; turn < ARRAY_SIZE(want); turn++) {
		struct proto_traj_step q = step(TRAJ_STEP_END, "short", "big", 0, 0);
		struct proto_traj_decision d;

		assert_int_equal(traj_on_step(t, &c, &q, &v, now, &d), 0);
		assert_string_equal(d.why, want[turn]);
		if (turn >= 1)
			assert_int_equal(d.bubble_us, 100000);
		/* 4 GiB at the 500 MB/s prior: far longer than the bubble and the bound. */
		assert_true(d.cost_us > d.bubble_us + c.max_delay_us);
		now += S / 10;
		q = step(TRAJ_STEP_BEGIN, "short", "big", 10, 0);
		assert_int_equal(traj_on_step(t, &c, &q, &v, now, &d), 0);
		assert_int_equal(policy_action_hold_us(&c), 50000);
		now += S;
	}
	traj_tracker_free(t);
}

/* A new trajectory starts from the fleet's history: its first step end already bets, with the
 * fleet's lengths and decode rate; from its own 8th length on it uses its own. */
static void new_trajectories_start_from_the_fleet(void **state)
{
	const struct policy_config c = {.mode = POLICY_ADAPTIVE, .confidence = 0.9};
	const struct traj_env_view v = {.dirty = true, .dirty_bytes = 4096, .mem_bytes = 1 << 20};
	const struct traj_env_view vb = {.dirty = true, .mem_bytes = 100 << 20};
	struct traj_tracker *t = traj_tracker_new(8, 0.2);
	struct proto_traj_step q;
	struct proto_traj_decision d;
	uint64_t now = S;

	assert_non_null(t);
	/* A: 3 turns of 400 tokens in 2 s (200 tokens/s learnt; no rate sent). */
	for (int turn = 0; turn < 3; turn++) {
		q = step(TRAJ_STEP_END, "A", "EA", 0, 0);
		assert_int_equal(traj_on_step(t, &c, &q, &v, now, &d), 0);
		now += 2 * S;
		q = step(TRAJ_STEP_BEGIN, "A", "EA", 400, 0);
		assert_int_equal(traj_on_step(t, &c, &q, &v, now, &d), 0);
		now += S;
	}
	/* B's first step end: the fleet's 400 tokens at 200 tokens/s. */
	q = step(TRAJ_STEP_END, "B", "EB", 0, 0);
	assert_int_equal(traj_on_step(t, &c, &q, &vb, now, &d), 0);
	assert_int_equal(d.bubble_us, 2 * S);
	assert_int_equal(d.act, TRAJ_ACT_CHECKPOINT);
	assert_string_equal(d.why, "fits");
	/* B is short (20 tokens): its own history is used only from 8 lengths on. */
	for (int turn = 0; turn < 8; turn++) {
		now += S / 10;
		q = step(TRAJ_STEP_BEGIN, "B", "EB", 20, 0);
		assert_int_equal(traj_on_step(t, &c, &q, &vb, now, &d), 0);
		now += S;
		q = step(TRAJ_STEP_END, "B", "EB", 0, 0);
		assert_int_equal(traj_on_step(t, &c, &q, &vb, now, &d), 0);
		print_message("B turn %d: bubble %lu us, %s\n", turn, (unsigned long)d.bubble_us,
			      d.why);
	}
	assert_int_equal(traj_bubble(t, "B")->n_lengths, 8);
	/* Its own: 20 tokens at its own 200 tokens/s = 0.1 s, shorter than the checkpoint's
	 * pessimistic cost (prior 20 ms + 100 MiB at 500 MB/s, x2 for an unchecked predictor). */
	assert_int_equal(d.bubble_us, S / 10);
	assert_string_equal(d.why, "no-fit");
	traj_tracker_free(t);
}

static void every_turn_and_clean_environments(void **state)
{
	const struct policy_config c = {.mode = POLICY_EVERY_TURN};
	struct traj_env_view v = {.dirty = false};
	struct traj_tracker *t = traj_tracker_new(8, 0.2);
	struct proto_traj_step q = step(TRAJ_STEP_END, "T", "E", 0, 1000);
	struct proto_traj_decision d;

	assert_non_null(t);
	assert_int_equal(traj_on_step(t, &c, &q, &v, S, &d), 0);
	assert_int_equal(d.act, TRAJ_ACT_NONE);
	assert_string_equal(d.why, "clean");
	v.dirty = true;
	assert_int_equal(traj_on_step(t, &c, &q, &v, 2 * S, &d), 0);
	assert_int_equal(d.act, TRAJ_ACT_CHECKPOINT_SYNC);
	assert_string_equal(d.why, "every-turn");
	traj_tracker_free(t);
}

/* A checkpoint protects the trajectory as of the step end that decided it: a turn that ended
 * while it still ran stays unprotected (max_turns 1: the next dirty step end is forced), and
 * the time since that step end counts; a checkpoint no decision asked for protects all. */
static void checkpoint_protects_up_to_its_decision(void **state)
{
	const struct policy_config c = {
		.mode = POLICY_ADAPTIVE, .max_turns = 1, .max_unprotected_us = 10 * S};
	const struct traj_env_view v = {.dirty = true};
	struct traj_tracker *t = traj_tracker_new(8, 0.2);
	struct proto_traj_step end = step(TRAJ_STEP_END, "T", "E", 0, 0);
	struct cost_sample s = {.total_s = 0.1};
	struct proto_traj_decision d;

	assert_non_null(t);
	assert_int_equal(traj_on_step(t, &c, &end, &v, 1 * S, &d), 0);
	assert_string_equal(d.why, "no-fit");
	assert_int_equal(traj_on_step(t, &c, &end, &v, 2 * S, &d), 0);
	assert_string_equal(d.why, "force-turns");		       /* decided at 2 s */
	assert_int_equal(traj_on_step(t, &c, &end, &v, 3 * S, &d), 0); /* while it runs */
	assert_string_equal(d.why, "force-turns");
	/* Done at 4 s, as of 2 s: the 3 s turn is still unprotected, the next one is forced. */
	assert_int_equal(traj_checkpoint_done_at(t, "T", "E", &s, 2 * S, 4 * S), 0);
	assert_int_equal(traj_on_step(t, &c, &end, &v, 5 * S, &d), 0);
	assert_string_equal(d.why, "force-turns");
	/* The framework's own checkpoint at 6 s protects everything: one turn allowed again. */
	assert_int_equal(traj_checkpoint_done(t, "T", "E", &s, 6 * S), 0);
	assert_int_equal(traj_on_step(t, &c, &end, &v, 7 * S, &d), 0);
	assert_string_equal(d.why, "no-fit");
	/* Unprotected time counts from the decision, not from the completion. */
	assert_int_equal(traj_on_step(t, &c, &end, &v, 8 * S, &d), 0);
	assert_string_equal(d.why, "force-turns");
	assert_int_equal(traj_checkpoint_done_at(t, "T", "E", &s, 8 * S, 9 * S), 0);
	assert_int_equal(traj_on_step(t, &c, &end, &v, 18 * S + 1, &d), 0);
	assert_string_equal(d.why, "force-time"); /* 10 s after 8 s, though done at 9 s */
	traj_tracker_free(t);
}

static void bad_ids_and_bounded_tracking(void **state)
{
	const struct policy_config c = {.mode = POLICY_NEVER};
	const struct traj_env_view v = {0};
	struct traj_tracker *t = traj_tracker_new(2, 0.2);
	struct proto_traj_step q = step(TRAJ_STEP_END, "", "E", 0, 0);
	struct proto_traj_decision d;
	struct cost_sample s = {.total_s = 1};

	assert_non_null(t);
	assert_int_equal(traj_on_step(t, &c, &q, &v, S, &d), -EINVAL);
	q = step(TRAJ_STEP_END, "T", "", 0, 0);
	assert_int_equal(traj_on_step(t, &c, &q, &v, S, &d), -EINVAL);
	/* Two trajectories fit; a third forgets the least recently seen. */
	q = step(TRAJ_STEP_END, "a", "E", 0, 0);
	assert_int_equal(traj_on_step(t, &c, &q, &v, 1 * S, &d), 0);
	q = step(TRAJ_STEP_END, "b", "E", 0, 0);
	assert_int_equal(traj_on_step(t, &c, &q, &v, 2 * S, &d), 0);
	q = step(TRAJ_STEP_END, "a", "E", 0, 0);
	assert_int_equal(traj_on_step(t, &c, &q, &v, 3 * S, &d), 0);
	q = step(TRAJ_STEP_END, "c", "E", 0, 0);
	assert_int_equal(traj_on_step(t, &c, &q, &v, 4 * S, &d), 0);
	assert_non_null(traj_bubble(t, "a"));
	assert_null(traj_bubble(t, "b"));
	assert_non_null(traj_bubble(t, "c"));
	/* A checkpoint of a forgotten trajectory still teaches its environment's cost. */
	assert_int_equal(traj_checkpoint_done(t, "b", "E", &s, 5 * S), -ENOENT);
	assert_int_equal(traj_env_cost(t, "E")->n, 1);
	assert_null(traj_env_cost(t, "nope"));
	traj_tracker_free(t);
	assert_null(traj_tracker_new(0, 0.2));
	assert_int_equal(errno, EINVAL);
	assert_null(traj_tracker_new(4, 0));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(bubbles_learnt_then_checkpointed),
		cmocka_unit_test(short_bubbles_are_forced_by_turns),
		cmocka_unit_test(new_trajectories_start_from_the_fleet),
		cmocka_unit_test(every_turn_and_clean_environments),
		cmocka_unit_test(checkpoint_protects_up_to_its_decision),
		cmocka_unit_test(bad_ids_and_bounded_tracking),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
