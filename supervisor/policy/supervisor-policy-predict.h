/* SPDX-License-Identifier: MIT */
/*
 * Predictors for the adaptive checkpoint policy (DESIGN §2, issue 11): how long a trajectory's
 * inference bubble will last, and how long a checkpoint of its environment will take. Pure
 * functions over explicit state (no clock, no I/O), so the daemon owns one state per
 * trajectory / environment and the tests drive them with scripted histories.
 *
 * Each predictor carries an online error estimate: an exponentially weighted mean of the
 * absolute relative error |predicted - actual| / actual of its past predictions. The policy
 * widens its margins by that error, so a predictor that has seen nothing (error 1.0) is
 * trusted little and one whose predictions land is trusted more.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* Output lengths a trajectory's bubble predictor remembers (its most recent turns). */
#define PREDICT_HISTORY 64

/* EWMA of absolute relative error; starts at 1.0 (100%: nothing known). */
struct predict_error {
	double mean; /* the estimate */
	uint32_t n;  /* observations folded in */
};

void predict_error_init(struct predict_error *e);
/* Folds in one (predicted, actual) pair with weight alpha in (0, 1]; actual <= 0 is ignored
 * (a relative error of nothing is undefined). The first observation replaces the prior. */
void predict_error_update(struct predict_error *e, double predicted, double actual, double alpha);

/* Bubble length: the remaining generation time of a trajectory's pending request. The
 * remaining tokens are the mean residual life of the trajectory's past output lengths given
 * what is generated already (E[L - g | L > g] over the history), so long-tailed lengths give
 * long predictions once a request has outlived the short ones; divided by the decode rate. */
struct bubble_predictor {
	uint32_t lengths[PREDICT_HISTORY]; /* ring of past output lengths, in tokens */
	uint32_t n_lengths;		   /* valid entries (<= PREDICT_HISTORY) */
	uint32_t next;			   /* ring write position */
	double alpha;			   /* error EWMA weight */
	struct predict_error err;
};

struct bubble_input {
	uint64_t tokens_generated; /* of the pending request, so far */
	double decode_tps;	   /* the engine's current decode rate for it, tokens/s (> 0) */
};

void bubble_predictor_init(struct bubble_predictor *p, double alpha);
/* Predicted remaining bubble in seconds. -ENODATA without history (the caller treats the
 * bubble as unknown: the adaptive policy then does not bet on it), -EINVAL on a rate <= 0.
 * A request that has outlived every remembered length is predicted to end now (0 s). */
int bubble_predict(const struct bubble_predictor *p, const struct bubble_input *in,
		   double *ret_secs);
/* The probability, from the history, that the remaining bubble outlasts secs: among the
 * remembered lengths L the pending request has not reached yet (L > generated), the fraction
 * whose remainder (L - generated) / rate exceeds secs. 0 when the request has outlived every
 * remembered length. -ENODATA / -EINVAL as bubble_predict. */
int bubble_prob_exceeds(const struct bubble_predictor *p, const struct bubble_input *in,
			double secs, double *ret_p);
/* The bubble ended: the request produced output_tokens in total; predicted_secs was the
 * prediction made at its start (negative: none was made) and actual_secs what it lasted. */
void bubble_observe(struct bubble_predictor *p, uint64_t output_tokens, double predicted_secs,
		    double actual_secs);

/* Checkpoint cost: fixed + dirty bytes x fs rate + memory bytes x dump rate, each term learnt
 * as an EWMA from the environment's past checkpoints (the manifest's fs/criu sizes and µs). */
struct cost_predictor {
	double fixed_s;	     /* freeze, commit, fsync: what does not scale with size */
	double fs_s_per_b;   /* file-system delta copy */
	double dump_s_per_b; /* CRIU dump of the process tree's memory */
	uint32_t n;	     /* checkpoints observed */
	double alpha;
	struct predict_error err;
};

/* One finished checkpoint, as its manifest reports it. */
struct cost_sample {
	uint64_t fs_bytes, criu_bytes;
	double fs_s, dump_s, total_s;
};

/* Priors: 20 ms fixed, 500 MB/s for both copies (conservative for local disks). */
void cost_predictor_init(struct cost_predictor *p, double alpha);
double cost_predict(const struct cost_predictor *p, uint64_t dirty_bytes, uint64_t mem_bytes);
/* A checkpoint finished; predicted_s was the prediction made when it was decided (negative:
 * none). */
void cost_observe(struct cost_predictor *p, const struct cost_sample *s, double predicted_s);
