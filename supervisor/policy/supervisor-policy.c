/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <string.h>

#include "supervisor-policy.h"

static const char *const reason_names[] = {
	[POLICY_R_MODE_NEVER] = "never",      [POLICY_R_EVERY_TURN] = "every-turn",
	[POLICY_R_CLEAN] = "clean",	      [POLICY_R_FITS] = "fits",
	[POLICY_R_NO_FIT] = "no-fit",	      [POLICY_R_FORCE_TURNS] = "force-turns",
	[POLICY_R_FORCE_TIME] = "force-time",
};

const char *policy_reason_to_string(enum policy_reason r)
{
	return (unsigned)r < _POLICY_REASON_MAX ? reason_names[r] : "?";
}

void policy_traj_init(struct policy_traj *t, uint64_t now_us)
{
	*t = (struct policy_traj){.protected_at_us = now_us};
}

static void decide(struct policy_decision *d, enum policy_action a, enum policy_reason r)
{
	*d = (struct policy_decision){.action = a, .reason = r};
}

void policy_step_end(const struct policy_config *c, struct policy_traj *t,
		     const struct policy_inputs *in, struct policy_decision *ret)
{
	if (c->mode == POLICY_NEVER)
		return decide(ret, POLICY_SKIP, POLICY_R_MODE_NEVER);
	if (!in->dirty) {
		/* Nothing to lose that the last checkpoint does not hold. */
		t->unprotected_turns = 0;
		t->protected_at_us = in->now_us;
		return decide(ret, POLICY_SKIP, POLICY_R_CLEAN);
	}
	t->unprotected_turns++;
	if (c->mode == POLICY_EVERY_TURN)
		return decide(ret, POLICY_CHECKPOINT_SYNC, POLICY_R_EVERY_TURN);

	if (c->max_turns > 0 && t->unprotected_turns > c->max_turns)
		return decide(ret, POLICY_CHECKPOINT, POLICY_R_FORCE_TURNS);
	if (c->max_unprotected_us > 0 && in->now_us > t->protected_at_us &&
	    in->now_us - t->protected_at_us > c->max_unprotected_us)
		return decide(ret, POLICY_CHECKPOINT, POLICY_R_FORCE_TIME);

	if (!in->bubble_known)
		return decide(ret, POLICY_SKIP, POLICY_R_NO_FIT);
	if (in->bubble_p >= c->confidence)
		return decide(ret, POLICY_CHECKPOINT, POLICY_R_FITS);
	return decide(ret, POLICY_SKIP, POLICY_R_NO_FIT);
}

double policy_cost_bound(double cost_s, double cost_err)
{
	return cost_s * (1.0 + (cost_err > 0 ? cost_err : 0));
}

void policy_checkpoint_done(struct policy_traj *t, uint64_t now_us)
{
	t->unprotected_turns = 0;
	t->protected_at_us = now_us;
}

uint64_t policy_action_hold_us(const struct policy_config *c)
{
	switch (c->mode) {
	case POLICY_EVERY_TURN:
		return UINT64_MAX;
	case POLICY_ADAPTIVE:
		return c->max_delay_us;
	default:
		return 0;
	}
}
