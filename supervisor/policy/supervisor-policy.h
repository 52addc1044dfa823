/* SPDX-License-Identifier: MIT */
/*
 * When to checkpoint an agent environment (DESIGN §2, issue 11). An environment step ends
 * (the observation goes back to the RL framework) and the environment sits idle while the
 * model generates the next action: an inference bubble. A checkpoint inside the bubble costs
 * the rollout nothing; one the next action must wait for slows it.
 *
 * Modes:
 *   never       no checkpoints (the baseline for overhead).
 *   every-turn  a checkpoint at every step end, synchronous: the next action waits for it
 *               however long it takes (the baseline for work lost). The delay bound does not
 *               apply: waiting is the mode's definition.
 *   adaptive    at step end, checkpoint when the bubble outlasts the checkpoint with at
 *               least the configured confidence (a probability: the share of remembered
 *               generation lengths whose remainder outlasts the checkpoint's pessimistic cost,
 *               cost x (1 + its predictor's error)), or when more than max_turns turns or
 *               max_unprotected of work are unprotected (forced). Clean environments (no dirty path since their last
 *               checkpoint) are skipped and count as protected: the last checkpoint still
 *               holds everything the side-effect tracer saw change.
 * In adaptive mode a next action that arrives while the checkpoint is still running waits at
 * most max_delay; if the checkpoint is not done by then it is aborted (the environment thaws,
 * the partial checkpoint is discarded) and the action proceeds: the turn stays unprotected,
 * so the force rule picks it up at a later bubble. The bound therefore always holds.
 *
 * Pure functions over explicit state and a caller-supplied clock (µs), unit-testable.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "supervisor-config.h" /* enum policy_mode: [policy] mode */

struct policy_config {
	enum policy_mode mode;
	double confidence;	     /* P(bubble > pessimistic cost) needed to bet, 0..1 */
	uint64_t max_delay_us;	     /* longest an action may wait for a checkpoint (adaptive) */
	uint32_t max_turns;	     /* force after this many unprotected dirty turns (0: never) */
	uint64_t max_unprotected_us; /* force after this much unprotected time (0: never) */
};

/* Per trajectory: what is unprotected since its environment's last checkpoint. */
struct policy_traj {
	uint32_t unprotected_turns; /* dirty turns since the last completed checkpoint */
	uint64_t protected_at_us;   /* when the last checkpoint completed (or tracking began) */
};

/* What the policy knows at a step end. */
struct policy_inputs {
	uint64_t now_us;
	bool dirty;		     /* the environment changed since its last checkpoint */
	bool bubble_known;	     /* bubble_s and bubble_p are predictions (no history: false) */
	double bubble_s, bubble_err; /* predicted bubble and its relative error (reports) */
	double bubble_p;	     /* P(bubble > policy_cost_bound(cost_s, cost_err)) */
	double cost_s, cost_err;     /* predicted checkpoint cost and its relative error */
};

/* The checkpoint's pessimistic cost: the prediction grown by its predictor's error. */
double policy_cost_bound(double cost_s, double cost_err);

enum policy_action {
	POLICY_SKIP = 0,
	POLICY_CHECKPOINT = 1,	    /* in the bubble; the next action waits at most max_delay */
	POLICY_CHECKPOINT_SYNC = 2, /* every-turn: the next action waits until it is done */
};

enum policy_reason {
	POLICY_R_MODE_NEVER = 0,
	POLICY_R_EVERY_TURN,
	POLICY_R_CLEAN,
	POLICY_R_FITS,	 /* the bubble hides the checkpoint with the configured confidence */
	POLICY_R_NO_FIT, /* it would not, and nothing forces it */
	POLICY_R_FORCE_TURNS,
	POLICY_R_FORCE_TIME,
	_POLICY_REASON_MAX,
};

struct policy_decision {
	enum policy_action action;
	enum policy_reason reason;
};

const char *policy_reason_to_string(enum policy_reason r);

void policy_traj_init(struct policy_traj *t, uint64_t now_us);
/* Decides at a step end. Counts the turn just finished as unprotected when dirty. */
void policy_step_end(const struct policy_config *c, struct policy_traj *t,
		     const struct policy_inputs *in, struct policy_decision *ret);
/* A checkpoint decided for t completed at now_us (aborted ones are not reported). */
void policy_checkpoint_done(struct policy_traj *t, uint64_t now_us);

/* The next action arrived while a checkpoint is running: how long to hold it (µs). The caller
 * releases the action when the checkpoint completes or when the hold runs out, whichever is
 * first, and aborts the checkpoint in the latter case. Adaptive: max_delay. Every-turn:
 * UINT64_MAX (wait for completion). Never: 0. */
uint64_t policy_action_hold_us(const struct policy_config *c);
