/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "supervisor-client.h"
#include "supervisor-gateway-traj.h"
#include "supervisor-traj-ctl.h"
#include "supervisor-traj.h"

/* Trajectories (and environments) whose history is kept; the least recently seen goes. */
#define TRAJ_CTL_MAX   4096
#define TRAJ_CTL_ALPHA 0.2

static uint64_t mono_now_us(void)
{
	struct timespec ts;

	(void)clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static void policy_of_config(const struct sv_config *cf, struct policy_config *ret)
{
	*ret = (struct policy_config){
		.mode = cf->policy_mode,
		.confidence = cf->policy_confidence_pct / 100.0,
		.max_delay_us = cf->policy_max_delay_ms * 1000,
		.max_turns = cf->policy_max_turns,
		.max_unprotected_us = cf->policy_max_unprotected_ms * 1000,
	};
}

/* gateway-traj: what the framework did not send, from the gateway's view of the trajectory's
 * requests (X-Belayer-Trajectory): a step-end without plen/gen/mtps gets the pending request's,
 * a step-begin without out the last completed request's output tokens. */
static const struct proto_traj_step *gateway_fill(struct supervisor *s,
						  const struct proto_traj_step *q,
						  struct proto_traj_step *buf)
{
	struct gateway_traj_pending p;
	uint64_t out;

	if (q->ev == TRAJ_STEP_END && !q->prompt_tokens && !q->generated_tokens &&
	    !q->decode_mtps && gateway_traj_pending(s, q->trajectory, &p) == 0) {
		*buf = *q;
		buf->prompt_tokens = p.prompt_tokens;
		buf->generated_tokens = p.generated_tokens;
		buf->decode_mtps = p.decode_mtps;
		return buf;
	}
	if (q->ev == TRAJ_STEP_BEGIN && !q->output_tokens &&
	    gateway_traj_last_output(s, q->trajectory, &out) == 0) {
		*buf = *q;
		buf->output_tokens = out;
		return buf;
	}
	return q;
}

int traj_ctl_on_step(struct supervisor *s, struct sv_client *c, const struct proto_traj_step *q)
{
	struct proto_traj_step filled; /* gateway-traj */
	const struct traj_env_view v = {.dirty = true};
	struct policy_config pc;
	struct proto_msg m = {.type = PROTO_TRAJ_DECISION};
	int r;

	if (!s->trajs) {
		s->trajs = traj_tracker_new(TRAJ_CTL_MAX, TRAJ_CTL_ALPHA);
		if (!s->trajs)
			return client_send_error(s, c, ENOMEM, PROTO_TRAJ_STEP, "out of memory");
	}
	policy_of_config(&s->config, &pc);
	q = gateway_fill(s, q, &filled); /* gateway-traj */
	r = traj_on_step(s->trajs, &pc, q, &v, mono_now_us(), &m.traj_decision);
	if (r < 0)
		return client_send_error(s, c, -r, PROTO_TRAJ_STEP,
					 "a step needs a trajectory and an environment id");
	log_debug("Trajectory %s (env %s): %s -> %s (%s)", q->trajectory, q->env,
		  traj_event_to_string(q->ev), traj_action_to_string(m.traj_decision.act),
		  m.traj_decision.why);
	return client_send(s, c, &m);
}

void traj_ctl_free(struct supervisor *s)
{
	traj_tracker_free(s->trajs);
	s->trajs = NULL;
}
