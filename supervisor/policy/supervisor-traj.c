/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor-lru.h"
#include "supervisor-traj.h"
#include "util.h"

/* A trajectory predicts its bubbles from its own output lengths once it has this many; before
 * that, from the fleet's (every trajectory's recent lengths and decode rate): an RL batch runs
 * many trajectories of the same tasks, and a few turns of one are too few to bet on. */
#define TRAJ_OWN_MIN 8

struct traj {
	char id[PROTO_MAX_STR + 1]; /* "" : free slot */
	char env[64];
	uint64_t seen_us;
	struct bubble_predictor bubble;
	struct policy_traj policy;
	bool in_bubble;
	uint64_t bubble_start_us;
	double bubble_pred_s; /* at the bubble's start; < 0: none */
	bool bubble_pooled;   /* ...made from the fleet's history */
	double tps;	      /* learnt decode rate (output tokens / bubble), 0: none */
	double cost_pred_s;   /* of the checkpoint decided at the last step end; < 0: none */
	/* When the latest unprotected turns ended (a ring): a checkpoint protects those up to its
	 * decision only. */
	uint64_t turn_end_us[PREDICT_HISTORY];
	uint32_t next_turn_end;
	uint32_t ckpt_done, ckpt_aborted; /* reported to traj_foreach() */
};

struct env_cost {
	char id[64];
	uint64_t seen_us;
	struct cost_predictor cost;
};

struct traj_tracker {
	uint32_t max;
	double alpha;
	struct bubble_predictor fleet; /* every trajectory's recent output lengths */
	double fleet_tps;	       /* every trajectory's learnt decode rate (EWMA), 0: none */
	struct traj *trajs;
	struct env_cost *envs;
};

struct traj_tracker *traj_tracker_new(uint32_t max, double alpha)
{
	struct traj_tracker *t;

	if (max == 0 || !(alpha > 0 && alpha <= 1)) {
		errno = EINVAL;
		return NULL;
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->max = max;
	t->alpha = alpha;
	bubble_predictor_init(&t->fleet, alpha);
	t->trajs = calloc(max, sizeof(*t->trajs));
	t->envs = calloc(max, sizeof(*t->envs));
	if (!t->trajs || !t->envs) {
		traj_tracker_free(t);
		errno = ENOMEM;
		return NULL;
	}
	return t;
}

void traj_tracker_free(struct traj_tracker *t)
{
	if (!t)
		return;
	free(t->trajs);
	free(t->envs);
	free(t);
}

static struct traj *traj_find(const struct traj_tracker *t, const char *id)
{
	for (uint32_t i = 0; i < t->max; i++)
		if (t->trajs[i].id[0] && strcmp(t->trajs[i].id, id) == 0)
			return &t->trajs[i];
	return NULL;
}

/* Found, or a free slot, or the least recently seen one, reset. */
static struct traj *traj_get(struct traj_tracker *t, const char *id, uint64_t now_us)
{
	struct traj *x = traj_find(t, id), *victim;

	if (x)
		return x;
	victim = &t->trajs[LRU_SLOT(t->trajs, t->max, id, seen_us)];
	memset(victim, 0, sizeof(*victim));
	snprintf(victim->id, sizeof(victim->id), "%s", id);
	bubble_predictor_init(&victim->bubble, t->alpha);
	policy_traj_init(&victim->policy, now_us);
	victim->bubble_pred_s = victim->cost_pred_s = -1;
	return victim;
}

static struct env_cost *env_find(const struct traj_tracker *t, const char *id)
{
	for (uint32_t i = 0; i < t->max; i++)
		if (t->envs[i].id[0] && strcmp(t->envs[i].id, id) == 0)
			return &t->envs[i];
	return NULL;
}

static struct env_cost *env_get(struct traj_tracker *t, const char *id, uint64_t now_us)
{
	struct env_cost *x = env_find(t, id);

	if (!x) {
		x = &t->envs[LRU_SLOT(t->envs, t->max, id, seen_us)];
		memset(x, 0, sizeof(*x));
		snprintf(x->id, sizeof(x->id), "%s", id);
		cost_predictor_init(&x->cost, t->alpha);
	}
	x->seen_us = now_us;
	return x;
}

static uint32_t per_mille(double err)
{
	double pm = err * 1000;

	return pm >= UINT32_MAX ? UINT32_MAX : pm <= 0 ? 0 : (uint32_t)pm;
}

static enum traj_action action_of(enum policy_action a)
{
	switch (a) {
	case POLICY_CHECKPOINT:
		return TRAJ_ACT_CHECKPOINT;
	case POLICY_CHECKPOINT_SYNC:
		return TRAJ_ACT_CHECKPOINT_SYNC;
	default:
		return TRAJ_ACT_NONE;
	}
}

static double ewma_rate(double old, double sample, double alpha)
{
	return old > 0 ? old + alpha * (sample - old) : sample;
}

static void step_begin(struct traj_tracker *t, struct traj *x, const struct proto_traj_step *q,
		       uint64_t now_us)
{
	double actual, pred;

	if (!x->in_bubble)
		return; /* a begin without an end before it: nothing to learn */
	x->in_bubble = false;
	actual = (double)(now_us - x->bubble_start_us) / 1e6;
	if (q->output_tokens == 0 || !(actual > 0))
		return;
	/* Each predictor's error learns from the predictions it made. */
	pred = x->bubble_pred_s;
	bubble_observe(&x->bubble, q->output_tokens, x->bubble_pooled ? -1 : pred, actual);
	bubble_observe(&t->fleet, q->output_tokens, x->bubble_pooled ? pred : -1, actual);
	x->tps = ewma_rate(x->tps, q->output_tokens / actual, x->bubble.alpha);
	t->fleet_tps = ewma_rate(t->fleet_tps, q->output_tokens / actual, t->alpha);
}

static void step_end(struct traj_tracker *t, const struct policy_config *c, struct traj *x,
		     const struct proto_traj_step *q, const struct traj_env_view *v,
		     uint64_t now_us, struct proto_traj_decision *ret)
{
	struct env_cost *e = env_get(t, q->env, now_us);
	bool pooled =
		x->bubble.n_lengths < TRAJ_OWN_MIN && t->fleet.n_lengths > x->bubble.n_lengths;
	const struct bubble_predictor *bp = pooled ? &t->fleet : &x->bubble;
	struct bubble_input bi = {
		.tokens_generated = q->generated_tokens,
		.decode_tps = q->decode_mtps ? (double)q->decode_mtps / 1000
			      : x->tps > 0   ? x->tps
					     : t->fleet_tps,
	};
	struct policy_inputs in = {
		.now_us = now_us,
		.dirty = v->dirty,
		.bubble_err = bp->err.mean,
		.cost_err = e->cost.err.mean,
	};
	struct policy_decision d;
	uint32_t turns;

	in.cost_s = cost_predict(&e->cost, v->dirty_bytes, v->mem_bytes);
	in.bubble_known = bubble_predict(bp, &bi, &in.bubble_s) >= 0 &&
			  bubble_prob_exceeds(bp, &bi, policy_cost_bound(in.cost_s, in.cost_err),
					      &in.bubble_p) >= 0;
	turns = x->policy.unprotected_turns;
	policy_step_end(c, &x->policy, &in, &d);
	if (x->policy.unprotected_turns > turns) {
		x->turn_end_us[x->next_turn_end] = now_us;
		x->next_turn_end = (x->next_turn_end + 1) % PREDICT_HISTORY;
	}
	x->in_bubble = true;
	x->bubble_start_us = now_us;
	x->bubble_pred_s = in.bubble_known ? in.bubble_s : -1;
	x->bubble_pooled = pooled;
	x->cost_pred_s = d.action != POLICY_SKIP ? in.cost_s : -1;
	ret->act = action_of(d.action);
	snprintf(ret->why, sizeof(ret->why), "%s", policy_reason_to_string(d.reason));
	ret->bubble_us = in.bubble_known ? (uint64_t)(in.bubble_s * 1e6 + 0.5) : 0;
	ret->bubble_err_pm = per_mille(in.bubble_err);
	ret->cost_us = (uint64_t)(in.cost_s * 1e6 + 0.5);
	ret->cost_err_pm = per_mille(in.cost_err);
}

int traj_on_step(struct traj_tracker *t, const struct policy_config *c,
		 const struct proto_traj_step *q, const struct traj_env_view *v, uint64_t now_us,
		 struct proto_traj_decision *ret)
{
	struct traj *x;

	if (!q->trajectory[0] || !q->env[0])
		return -EINVAL;
	x = traj_get(t, q->trajectory, now_us);
	x->seen_us = now_us;
	/* A trajectory moved to another environment: what it left unprotected is that one's. */
	if (strcmp(x->env, q->env) != 0) {
		snprintf(x->env, sizeof(x->env), "%s", q->env);
		policy_traj_init(&x->policy, now_us);
	}
	*ret = (struct proto_traj_decision){.ev = q->ev};
	snprintf(ret->trajectory, sizeof(ret->trajectory), "%s", q->trajectory);
	snprintf(ret->env, sizeof(ret->env), "%s", q->env);
	snprintf(ret->why, sizeof(ret->why), "%s", "step-begin");
	if (q->ev == TRAJ_STEP_BEGIN)
		step_begin(t, x, q, now_us);
	else
		step_end(t, c, x, q, v, now_us, ret);
	return 0;
}

int traj_checkpoint_done(struct traj_tracker *t, const char *trajectory, const char *env,
			 const struct cost_sample *s, uint64_t now_us)
{
	return traj_checkpoint_done_at(t, trajectory, env, s, now_us, now_us);
}

int traj_checkpoint_done_at(struct traj_tracker *t, const char *trajectory, const char *env,
			    const struct cost_sample *s, uint64_t as_of_us, uint64_t now_us)
{
	struct traj *x = traj_find(t, trajectory);
	struct env_cost *e = env_get(t, env, now_us);
	uint32_t later = 0;

	cost_observe(&e->cost, s, x ? x->cost_pred_s : -1);
	if (!x)
		return -ENOENT;
	/* Turns that ended after as_of (while the checkpoint ran) stay unprotected. */
	for (uint32_t i = 0; i < PREDICT_HISTORY && i < x->policy.unprotected_turns; i++) {
		uint32_t k = (x->next_turn_end + PREDICT_HISTORY - 1 - i) % PREDICT_HISTORY;

		if (x->turn_end_us[k] <= as_of_us)
			break;
		later++;
	}
	policy_checkpoint_done(&x->policy, as_of_us < now_us ? as_of_us : now_us);
	x->policy.unprotected_turns = later;
	x->cost_pred_s = -1;
	x->ckpt_done++;
	return 0;
}

const struct bubble_predictor *traj_bubble(const struct traj_tracker *t, const char *trajectory)
{
	const struct traj *x = traj_find(t, trajectory);

	return x ? &x->bubble : NULL;
}

const struct cost_predictor *traj_env_cost(const struct traj_tracker *t, const char *env)
{
	const struct env_cost *e = env_find(t, env);

	return e ? &e->cost : NULL;
}

int traj_checkpoint_aborted(struct traj_tracker *t, const char *trajectory)
{
	struct traj *x = traj_find(t, trajectory);

	if (!x)
		return -ENOENT;
	x->ckpt_aborted++;
	return 0;
}

int traj_foreach(const struct traj_tracker *t, const char *only,
		 int (*on_traj)(const struct traj_view *v, void *userdata),
		 int (*on_env)(const char *env, const struct cost_predictor *p, void *userdata),
		 void *userdata)
{
	int r;

	for (uint32_t i = 0; t && on_traj && i < t->max; i++) {
		const struct traj *x = &t->trajs[i];

		if (!x->id[0] || (only && only[0] && strcmp(x->id, only) != 0))
			continue;
		r = on_traj(
			&(const struct traj_view){
				.id = x->id,
				.env = x->env,
				.policy = &x->policy,
				.bubble = &x->bubble,
				.bubble_pred_s = x->bubble_pred_s,
				.tps = x->tps,
				.ckpt_done = x->ckpt_done,
				.ckpt_aborted = x->ckpt_aborted,
			},
			userdata);
		if (r < 0)
			return r;
	}
	for (uint32_t i = 0; t && on_env && i < t->max; i++) {
		const struct env_cost *e = &t->envs[i];

		if (!e->id[0])
			continue;
		/* one trajectory asked: its environment only */
		if (only && only[0]) {
			const struct traj *x = traj_find(t, only);

			if (!x || strcmp(x->env, e->id) != 0)
				continue;
		}
		r = on_env(e->id, &e->cost, userdata);
		if (r < 0)
			return r;
	}
	return 0;
}
