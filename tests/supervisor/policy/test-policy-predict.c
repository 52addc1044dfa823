/* SPDX-License-Identifier: MIT */
/* Bubble and checkpoint-cost predictors (supervisor/supervisor-policy-predict.h). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "supervisor-policy-predict.h"

#define ALPHA 0.2

static void assert_close(double got, double want, double tol)
{
	double d = got - want;

	if (d < 0)
		d = -d;
	if (d > tol)
		fail_msg("got %g, want %g (+-%g)", got, want, tol);
}

/* Deterministic noise in [-1, 1): a 64-bit LCG (Knuth's MMIX constants). */
static double noise(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (double)(*s >> 11) / (double)(1ull << 52) - 1.0;
}

static void error_estimate_starts_at_one_and_tracks(void **state)
{
	struct predict_error e;

	predict_error_init(&e);
	assert_close(e.mean, 1.0, 0);
	predict_error_update(&e, 1.0, 0.0, ALPHA); /* undefined: ignored */
	assert_int_equal(e.n, 0);
	predict_error_update(&e, 1.5, 1.0, ALPHA); /* first replaces the prior */
	assert_close(e.mean, 0.5, 1e-12);
	predict_error_update(&e, 1.0, 1.0, ALPHA);
	assert_close(e.mean, 0.4, 1e-12);
	predict_error_update(&e, -1.0, 1.0, ALPHA); /* no prediction was made */
	assert_int_equal(e.n, 2);
}

static void bubble_is_mean_residual_life_over_rate(void **state)
{
	struct bubble_predictor p;
	struct bubble_input in = {.tokens_generated = 0, .decode_tps = 100};
	double s;

	bubble_predictor_init(&p, ALPHA);
	assert_int_equal(bubble_predict(&p, &in, &s), -ENODATA);
	bubble_observe(&p, 100, -1, 1);
	bubble_observe(&p, 200, -1, 2);
	bubble_observe(&p, 1500, -1, 15);
	in.decode_tps = 0;
	assert_int_equal(bubble_predict(&p, &in, &s), -EINVAL);
	in.decode_tps = 100;
	assert_int_equal(bubble_predict(&p, &in, &s), 0);
	assert_close(s, 600.0 / 100, 1e-9);
	/* Past the short ones only the long tail is left: (50 + 1350) / 2 tokens. */
	in.tokens_generated = 150;
	assert_int_equal(bubble_predict(&p, &in, &s), 0);
	assert_close(s, 700.0 / 100, 1e-9);
	/* Outlived everything remembered: predicted to end now. */
	in.tokens_generated = 5000;
	assert_int_equal(bubble_predict(&p, &in, &s), 0);
	assert_close(s, 0, 0);
	/* The error estimate only moves with predictions made. */
	assert_int_equal(p.err.n, 0);
}

/* The probability the remaining bubble outlasts a cost: the share of the remembered lengths
 * not reached yet whose remainder at the rate is longer. */
static void bubble_probability_from_history(void **state)
{
	struct bubble_predictor p;
	struct bubble_input in = {.tokens_generated = 0, .decode_tps = 100};
	double prob;

	bubble_predictor_init(&p, 0.2);
	assert_int_equal(bubble_prob_exceeds(&p, &in, 1, &prob), -ENODATA);
	for (uint64_t len = 100; len <= 400; len += 100)
		bubble_observe(&p, len, -1, 1);
	/* remainders 1, 2, 3, 4 s */
	assert_int_equal(bubble_prob_exceeds(&p, &in, 1.5, &prob), 0);
	assert_close(prob, 0.75, 1e-12);
	assert_int_equal(bubble_prob_exceeds(&p, &in, 0.5, &prob), 0);
	assert_close(prob, 1, 1e-12);
	/* 150 generated: 200, 300, 400 remain possible, remainders 0.5, 1.5, 2.5 s */
	in.tokens_generated = 150;
	assert_int_equal(bubble_prob_exceeds(&p, &in, 1.5, &prob), 0);
	assert_close(prob, 1.0 / 3, 1e-12);
	/* outlived every remembered length: no bet */
	in.tokens_generated = 400;
	assert_int_equal(bubble_prob_exceeds(&p, &in, 0, &prob), 0);
	assert_close(prob, 0, 1e-12);
	in.decode_tps = 0;
	assert_int_equal(bubble_prob_exceeds(&p, &in, 1, &prob), -EINVAL);
}

static void bubble_history_is_a_bounded_ring(void **state)
{
	struct bubble_predictor p;
	struct bubble_input in = {.tokens_generated = 0, .decode_tps = 1};
	double s;

	bubble_predictor_init(&p, ALPHA);
	for (int i = 0; i < PREDICT_HISTORY; i++)
		bubble_observe(&p, 10, -1, 1);
	for (int i = 0; i < PREDICT_HISTORY; i++)
		bubble_observe(&p, 1000, -1, 1);
	assert_int_equal(p.n_lengths, PREDICT_HISTORY);
	assert_int_equal(bubble_predict(&p, &in, &s), 0);
	assert_close(s, 1000, 1e-9); /* the old short lengths are gone */
}

/* A trajectory whose output lengths scatter +-10% around 800 tokens at 50 tokens/s: the error
 * estimate falls from the prior as the history fills, and settles near the noise. */
static void bubble_error_shrinks_with_history(void **state)
{
	struct bubble_predictor p;
	uint64_t seed = 42;
	double err_early = 0;

	bubble_predictor_init(&p, ALPHA);
	for (int turn = 0; turn < 200; turn++) {
		struct bubble_input in = {.tokens_generated = 0, .decode_tps = 50};
		uint64_t len = (uint64_t)(800 * (1 + 0.1 * noise(&seed)));
		double predicted = -1;

		(void)bubble_predict(&p, &in, &predicted);
		bubble_observe(&p, len, predicted, (double)len / 50);
		if (turn == 2)
			err_early = p.err.mean;
	}
	print_message("bubble error: after 3 turns %.3f, after 200 %.3f\n", err_early, p.err.mean);
	assert_true(err_early < 1.0);
	assert_true(p.err.mean < err_early);
	assert_true(p.err.mean < 0.1);
}

/* Checkpoints of an environment whose true cost is 30 ms + 1 ns/B dirty + 2 ns/B memory,
 * each measurement +-5%: the learnt model predicts within 10% and its error estimate falls. */
static void cost_learns_rates_and_error_shrinks(void **state)
{
	struct cost_predictor p;
	uint64_t seed = 7;
	double err_first = 0;

	cost_predictor_init(&p, ALPHA);
	assert_close(cost_predict(&p, 0, 0), 0.020, 1e-12);
	assert_close(cost_predict(&p, 500000000, 0), 1.020, 1e-9);
	for (int i = 0; i < 100; i++) {
		uint64_t fsb = (uint64_t)(20e6 * (1.5 + noise(&seed)));
		uint64_t mem = (uint64_t)(100e6 * (1.5 + noise(&seed)));
		struct cost_sample s = {
			.fs_bytes = fsb,
			.criu_bytes = mem,
			.fs_s = 1e-9 * (double)fsb * (1 + 0.05 * noise(&seed)),
			.dump_s = 2e-9 * (double)mem * (1 + 0.05 * noise(&seed)),
		};

		s.total_s = 0.030 * (1 + 0.05 * noise(&seed)) + s.fs_s + s.dump_s;
		cost_observe(&p, &s, cost_predict(&p, fsb, mem));
		if (i == 0)
			err_first = p.err.mean;
	}
	print_message("cost error: first %.3f, after 100 %.3f\n", err_first, p.err.mean);
	assert_true(p.err.mean < err_first);
	assert_true(p.err.mean < 0.05);
	assert_close(cost_predict(&p, 10000000, 50000000), 0.030 + 0.010 + 0.100, 0.014);
	/* Tiny copies do not teach a rate (their time is overhead). */
	{
		double rate = p.fs_s_per_b;
		struct cost_sample s = {.fs_bytes = 10, .fs_s = 1, .total_s = 1};

		cost_observe(&p, &s, -1);
		assert_close(p.fs_s_per_b, rate, 0);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(error_estimate_starts_at_one_and_tracks),
		cmocka_unit_test(bubble_is_mean_residual_life_over_rate),
		cmocka_unit_test(bubble_probability_from_history),
		cmocka_unit_test(bubble_history_is_a_bounded_ring),
		cmocka_unit_test(bubble_error_shrinks_with_history),
		cmocka_unit_test(cost_learns_rates_and_error_shrinks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
