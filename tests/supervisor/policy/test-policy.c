/* SPDX-License-Identifier: MIT */
/* The checkpoint policy's decisions for scripted timelines (supervisor/supervisor-policy.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "supervisor-config.h"
#include "supervisor-policy.h"
#include "util.h"

#define S 1000000ull /* µs per second */

/* One step end of a scripted timeline and the decision it must get. done_at: when the
 * checkpoint it starts completes (0: it does not, or none is started). */
struct step {
	uint64_t t_us;
	bool dirty, known;
	double bubble_p, cost_s; /* P(bubble outlasts the checkpoint), predicted cost */
	enum policy_action want;
	enum policy_reason why;
	uint64_t done_at_us;
};

static void run_timeline(const struct policy_config *c, const struct step *steps, size_t n)
{
	struct policy_traj t;

	policy_traj_init(&t, 0);
	for (size_t i = 0; i < n; i++) {
		const struct step *s = &steps[i];
		struct policy_inputs in = {
			.now_us = s->t_us,
			.dirty = s->dirty,
			.bubble_known = s->known,
			.bubble_s = 1,
			.bubble_err = 0.1,
			.bubble_p = s->bubble_p,
			.cost_s = s->cost_s,
			.cost_err = 0.1,
		};
		struct policy_decision d;

		policy_step_end(c, &t, &in, &d);
		print_message("step %zu: %s\n", i, policy_reason_to_string(d.reason));
		assert_int_equal(d.action, s->want);
		assert_int_equal(d.reason, s->why);
		if (s->done_at_us)
			policy_checkpoint_done(&t, s->done_at_us);
	}
}

static void never_never_checkpoints(void **state)
{
	const struct policy_config c = {
		.mode = POLICY_NEVER, .max_turns = 1, .max_unprotected_us = 1};
	const struct step steps[] = {
		{1 * S, true, true, 10, 0.1, POLICY_SKIP, POLICY_R_MODE_NEVER, 0},
		{2 * S, true, true, 10, 0.1, POLICY_SKIP, POLICY_R_MODE_NEVER, 0},
		{90 * S, true, false, 0, 0.1, POLICY_SKIP, POLICY_R_MODE_NEVER, 0},
	};

	run_timeline(&c, steps, ARRAY_SIZE(steps));
	assert_int_equal(policy_action_hold_us(&c), 0);
}

static void every_turn_is_synchronous_and_skips_clean(void **state)
{
	const struct policy_config c = {.mode = POLICY_EVERY_TURN, .max_delay_us = 1000};
	const struct step steps[] = {
		/* Even a bubble far too short: every-turn waits. */
		{1 * S, true, true, 0.001, 5, POLICY_CHECKPOINT_SYNC, POLICY_R_EVERY_TURN, 6 * S},
		{7 * S, false, true, 10, 0.1, POLICY_SKIP, POLICY_R_CLEAN, 0},
		{8 * S, true, false, 0, 0.1, POLICY_CHECKPOINT_SYNC, POLICY_R_EVERY_TURN, 9 * S},
	};

	run_timeline(&c, steps, ARRAY_SIZE(steps));
	assert_true(policy_action_hold_us(&c) == UINT64_MAX);
}

static void adaptive_checkpoints_when_bubble_hides_cost(void **state)
{
	const struct policy_config c = {
		.mode = POLICY_ADAPTIVE, .confidence = 0.9, .max_delay_us = 50000};
	const struct step steps[] = {
		/* 95% sure the bubble hides it: above the 90% asked for */
		{1 * S, true, true, 0.95, 0.5, POLICY_CHECKPOINT, POLICY_R_FITS, 2 * S},
		/* 85% sure is not enough */
		{3 * S, true, true, 0.85, 0.5, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		/* no history for the bubble: no bet */
		{4 * S, true, false, 1, 0.001, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		{5 * S, false, true, 1, 0.001, POLICY_SKIP, POLICY_R_CLEAN, 0},
		/* exactly as sure as asked */
		{6 * S, true, true, 0.9, 0.5, POLICY_CHECKPOINT, POLICY_R_FITS, 0},
	};

	run_timeline(&c, steps, ARRAY_SIZE(steps));
	assert_int_equal(policy_action_hold_us(&c), 50000);
}

/* confidence is the probability the bubble must outlast the checkpoint with; the cost it must
 * outlast is the prediction grown by its error. */
static void confidence_is_a_probability(void **state)
{
	struct policy_config c = {.mode = POLICY_ADAPTIVE, .confidence = 0};
	struct policy_inputs in = {
		.now_us = S, .dirty = true, .bubble_known = true, .bubble_p = 0.6, .cost_s = 0.5};
	struct policy_traj t;
	struct policy_decision d;

	policy_traj_init(&t, 0);
	policy_step_end(&c, &t, &in, &d);
	assert_int_equal(d.action, POLICY_CHECKPOINT);
	c.confidence = 0.6;
	policy_step_end(&c, &t, &in, &d);
	assert_int_equal(d.action, POLICY_CHECKPOINT);
	c.confidence = 0.61;
	policy_step_end(&c, &t, &in, &d);
	assert_int_equal(d.action, POLICY_SKIP);
	assert_int_equal(d.reason, POLICY_R_NO_FIT);
	c.confidence = 1;
	in.bubble_p = 1;
	policy_step_end(&c, &t, &in, &d);
	assert_int_equal(d.action, POLICY_CHECKPOINT);
	/* Without a prediction, not even confidence 0 bets. */
	c.confidence = 0;
	in.bubble_known = false;
	policy_step_end(&c, &t, &in, &d);
	assert_int_equal(d.action, POLICY_SKIP);

	assert_float_equal(policy_cost_bound(0.5, 0.5), 0.75, 1e-12);
	assert_float_equal(policy_cost_bound(0.5, 0), 0.5, 1e-12);
	assert_float_equal(policy_cost_bound(0.5, -1), 0.5, 1e-12);
}

static void adaptive_forces_after_k_turns(void **state)
{
	const struct policy_config c = {.mode = POLICY_ADAPTIVE, .confidence = 1, .max_turns = 3};
	const struct step steps[] = {
		{1 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		{2 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		/* three unprotected dirty turns are tolerated... */
		{3 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		/* ...the fourth unprotected dirty turn is forced */
		{4 * S, true, true, 0.01, 1, POLICY_CHECKPOINT, POLICY_R_FORCE_TURNS, 5 * S},
		{6 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		{7 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		{8 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		/* an aborted forced checkpoint (no done) leaves the count: forced again */
		{9 * S, true, true, 0.01, 1, POLICY_CHECKPOINT, POLICY_R_FORCE_TURNS, 0},
		{10 * S, true, true, 0.01, 1, POLICY_CHECKPOINT, POLICY_R_FORCE_TURNS, 11 * S},
		{12 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
	};

	run_timeline(&c, steps, ARRAY_SIZE(steps));
}

static void adaptive_forces_after_unprotected_time(void **state)
{
	const struct policy_config c = {
		.mode = POLICY_ADAPTIVE, .confidence = 1, .max_unprotected_us = 30 * S};
	const struct step steps[] = {
		{10 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		{30 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		{31 * S, true, true, 0.01, 1, POLICY_CHECKPOINT, POLICY_R_FORCE_TIME, 32 * S},
		{60 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		/* a clean step end protects as a checkpoint would */
		{61 * S, false, true, 0.01, 1, POLICY_SKIP, POLICY_R_CLEAN, 0},
		{90 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		{92 * S, true, true, 0.01, 1, POLICY_CHECKPOINT, POLICY_R_FORCE_TIME, 0},
	};

	run_timeline(&c, steps, ARRAY_SIZE(steps));
}

static void clean_resets_the_turn_count(void **state)
{
	const struct policy_config c = {.mode = POLICY_ADAPTIVE, .confidence = 1, .max_turns = 2};
	const struct step steps[] = {
		{1 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		{2 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		{3 * S, false, true, 0.01, 1, POLICY_SKIP, POLICY_R_CLEAN, 0},
		{4 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		{5 * S, true, true, 0.01, 1, POLICY_SKIP, POLICY_R_NO_FIT, 0},
		{6 * S, true, true, 0.01, 1, POLICY_CHECKPOINT, POLICY_R_FORCE_TURNS, 0},
	};

	run_timeline(&c, steps, ARRAY_SIZE(steps));
}

static void mode_names_round_trip(void **state)
{
	enum policy_mode m;

	for (unsigned i = 0; i < _POLICY_MODE_MAX; i++) {
		assert_int_equal(policy_mode_from_string(policy_mode_to_string(i), &m), 0);
		assert_int_equal(m, i);
	}
	assert_int_equal(policy_mode_from_string("always", &m), -EINVAL);
	assert_int_equal(policy_mode_from_string("", &m), -EINVAL);
	assert_string_equal(policy_mode_to_string(POLICY_EVERY_TURN), "every-turn");
	for (unsigned i = 0; i < _POLICY_REASON_MAX; i++)
		assert_string_not_equal(policy_reason_to_string(i), "?");
}

/* The [policy] keys parse into what the policy takes, and refuse what it does not know. */
static void config_policy_section(void **state)
{
	static struct sv_config c; /* large: not on the stack */

	config_init_defaults(&c);
	assert_int_equal(c.policy_mode, POLICY_ADAPTIVE);
	assert_int_equal(c.policy_confidence_pct, 90);
	assert_int_equal(c.policy_max_delay_ms, 50);
	assert_int_equal(c.policy_max_turns, 8);
	assert_int_equal(c.policy_max_unprotected_ms, 300000);
	assert_int_equal(config_set(&c, "policy", "mode", "every-turn"), 0);
	assert_int_equal(c.policy_mode, POLICY_EVERY_TURN);
	assert_int_equal(config_set(&c, "policy", "mode", "never"), 0);
	assert_int_equal(c.policy_mode, POLICY_NEVER);
	assert_true(config_set(&c, "policy", "mode", "sometimes") < 0);
	assert_int_equal(c.policy_mode, POLICY_NEVER);
	assert_int_equal(config_set(&c, "policy", "max_delay", "250ms"), 0);
	assert_int_equal(c.policy_max_delay_ms, 250);
	assert_int_equal(config_set(&c, "policy", "max_unprotected", "2m"), 0);
	assert_int_equal(c.policy_max_unprotected_ms, 120000);
	assert_true(config_set(&c, "policy", "confidence", "101") < 0);
	assert_int_equal(config_set(&c, "policy", "max_turns", "0"), 0);
	assert_int_equal(c.policy_max_turns, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(never_never_checkpoints),
		cmocka_unit_test(every_turn_is_synchronous_and_skips_clean),
		cmocka_unit_test(adaptive_checkpoints_when_bubble_hides_cost),
		cmocka_unit_test(confidence_is_a_probability),
		cmocka_unit_test(adaptive_forces_after_k_turns),
		cmocka_unit_test(adaptive_forces_after_unprotected_time),
		cmocka_unit_test(clean_resets_the_turn_count),
		cmocka_unit_test(mode_names_round_trip),
		cmocka_unit_test(config_policy_section),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
