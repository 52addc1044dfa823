/* SPDX-License-Identifier: MIT */
/*
 * Trajectories as the checkpoint policy sees them (issue 11): PROTO_TRAJ_STEP events in,
 * PROTO_TRAJ_DECISION answers out. Per trajectory a bubble predictor and the policy's
 * unprotected-work counters; per environment a checkpoint-cost predictor. No loop, no clock
 * and no I/O: the daemon passes the time and what it knows of the environment (dirty set,
 * memory), runs the checkpoints the decisions ask for and reports them back, so timelines are
 * unit-testable end to end.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "proto.h"
#include "supervisor-policy-predict.h"
#include "supervisor-policy.h"
#include "sv-policy.h"

struct traj_tracker;

/* Tracks at most max trajectories and max environments; past that the least recently seen is
 * forgotten (its history only: a forgotten trajectory starts over with the priors). alpha: the
 * predictors' EWMA weight. NULL with errno on failure. */
struct traj_tracker *traj_tracker_new(uint32_t max, double alpha);
void traj_tracker_free(struct traj_tracker *t);

/* One step event at now_us. Fills ret (held_us 0: the caller sets how long it held a
 * step-begin reply). -EINVAL for an empty trajectory or environment id. A step-begin ends the
 * bubble the last step-end started: its length and q->output_tokens teach the bubble
 * predictor. A step-end decides: ret->act says whether to checkpoint the environment now;
 * the caller then reports traj_checkpoint_done() (or nothing, when it was aborted or failed). */
int traj_on_step(struct traj_tracker *t, const struct policy_config *c,
		 const struct proto_traj_step *q, const struct traj_env_view *v, uint64_t now_us,
		 struct proto_traj_decision *ret);

/* The checkpoint a step-end decision asked for completed at now_us; s is from its manifest. */
int traj_checkpoint_done(struct traj_tracker *t, const char *trajectory, const char *env,
			 const struct cost_sample *s, uint64_t now_us);
/* The same for a checkpoint that holds the environment as of as_of_us (the step end that
 * decided it): turns that ended after it, while it ran, stay unprotected, and the time since
 * as_of_us counts as unprotected. */
int traj_checkpoint_done_at(struct traj_tracker *t, const char *trajectory, const char *env,
			    const struct cost_sample *s, uint64_t as_of_us, uint64_t now_us);

/* The predictors' state, for reports and tests; NULL when unknown. */
const struct bubble_predictor *traj_bubble(const struct traj_tracker *t, const char *trajectory);
const struct cost_predictor *traj_env_cost(const struct traj_tracker *t, const char *env);

/* A checkpoint a step-end decision asked for was aborted (at the delay bound) or failed: only
 * counted, for reports. -ENOENT for an unknown trajectory. */
int traj_checkpoint_aborted(struct traj_tracker *t, const char *trajectory);

/* One trajectory as traj_foreach() shows it; valid during the callback only. */
struct traj_view {
	const char *id, *env;
	const struct policy_traj *policy; /* unprotected turns, protected since */
	const struct bubble_predictor *bubble;
	double bubble_pred_s; /* made at the last step end; < 0: none */
	double tps;	      /* decode rate learnt from its bubbles; 0: none */
	uint32_t ckpt_done, ckpt_aborted;
};

/* Calls on_traj for every trajectory, then on_env for every environment (either may be NULL),
 * in no order; only (NULL or "": all) restricts both to that trajectory and its environment.
 * Stops at the first callback < 0 and returns it. t may be NULL (nothing to list). */
int traj_foreach(const struct traj_tracker *t, const char *only,
		 int (*on_traj)(const struct traj_view *v, void *userdata),
		 int (*on_env)(const char *env, const struct cost_predictor *p, void *userdata),
		 void *userdata);
