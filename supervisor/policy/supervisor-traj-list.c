/* SPDX-License-Identifier: MIT */
/* PROTO_TRAJ_LIST: the checkpoint policy's trajectories and environments. */
#include <errno.h>
#include <stdio.h>
#include <time.h>

#include "supervisor-client.h"
#include "supervisor-gateway-traj.h"
#include "supervisor-traj-list.h"
#include "supervisor-traj.h"

struct traj_list {
	struct supervisor *s;
	struct sv_client *c;
	uint64_t now_us; /* the tracker's clock (CLOCK_MONOTONIC) */
	uint32_t n;
};

static uint32_t per_mille(double err)
{
	double pm = err * 1000;

	return pm >= UINT32_MAX ? UINT32_MAX : pm <= 0 ? 0 : (uint32_t)pm;
}

static void gateway_view(struct supervisor *s, const char *id, struct proto_traj_info *ret)
{
	struct gateway_traj_pending p;
	uint64_t out;

	if (gateway_traj_pending(s, id, &p) == 0) {
		ret->pending = p.active;
		ret->prompt_tokens = p.prompt_tokens;
		ret->generated_tokens = p.generated_tokens;
		if (p.decode_mtps)
			ret->decode_mtps = p.decode_mtps;
	}
	if (gateway_traj_last_output(s, id, &out) == 0)
		ret->last_output_tokens = out;
}

static int list_traj(const struct traj_view *v, void *userdata)
{
	struct traj_list *l = userdata;
	struct proto_msg m = {.type = PROTO_TRAJ_INFO};
	struct proto_traj_info *i = &m.traj_info;

	i->kind = TRAJ_INFO_TRAJECTORY;
	snprintf(i->trajectory, sizeof(i->trajectory), "%s", v->id);
	snprintf(i->env, sizeof(i->env), "%s", v->env);
	i->unprotected_turns = v->policy->unprotected_turns;
	i->unprotected_us =
		l->now_us > v->policy->protected_at_us ? l->now_us - v->policy->protected_at_us : 0;
	i->bubble_us = v->bubble_pred_s > 0 ? (uint64_t)(v->bubble_pred_s * 1e6) : 0;
	i->bubble_err_pm = per_mille(v->bubble->err.mean);
	i->n_lengths = v->bubble->n_lengths;
	i->decode_mtps = v->tps > 0 ? (uint64_t)(v->tps * 1000) : 0;
	i->ckpt_done = v->ckpt_done;
	i->ckpt_aborted = v->ckpt_aborted;
	gateway_view(l->s, v->id, i);
	l->n++;
	return client_send(l->s, l->c, &m) < 0 ? -ECONNRESET : 0;
}

static int list_env(const char *env, const struct cost_predictor *p, void *userdata)
{
	struct traj_list *l = userdata;
	struct proto_msg m = {.type = PROTO_TRAJ_INFO};
	struct proto_traj_info *i = &m.traj_info;

	i->kind = TRAJ_INFO_ENV;
	snprintf(i->env, sizeof(i->env), "%s", env);
	i->cost_us = p->fixed_s > 0 ? (uint64_t)(p->fixed_s * 1e6 + 0.5) : 0;
	i->fs_bps = p->fs_s_per_b > 0 ? (uint64_t)(1 / p->fs_s_per_b + 0.5) : 0;
	i->dump_bps = p->dump_s_per_b > 0 ? (uint64_t)(1 / p->dump_s_per_b + 0.5) : 0;
	i->cost_err_pm = per_mille(p->err.mean);
	i->cost_n = p->n;
	l->n++;
	return client_send(l->s, l->c, &m) < 0 ? -ECONNRESET : 0;
}

/* A trajectory only the gateway has seen (no step event yet). */
static int list_gateway_only(const char *id, const struct gateway_traj_pending *p, void *userdata)
{
	struct traj_list *l = userdata;
	struct proto_msg m = {.type = PROTO_TRAJ_INFO};

	(void)p;
	if (l->s->trajs && traj_bubble(l->s->trajs, id))
		return 0;
	m.traj_info.kind = TRAJ_INFO_TRAJECTORY;
	snprintf(m.traj_info.trajectory, sizeof(m.traj_info.trajectory), "%s", id);
	m.traj_info.bubble_err_pm = 1000;
	gateway_view(l->s, id, &m.traj_info);
	l->n++;
	return client_send(l->s, l->c, &m) < 0 ? -ECONNRESET : 0;
}

int ctl_traj_list(struct supervisor *s, struct sv_client *c, const struct proto_traj_list *q)
{
	struct traj_list l = {.s = s, .c = c};
	struct proto_msg m = {.type = PROTO_END};
	struct gateway_traj_pending p;
	struct timespec ts;

	(void)clock_gettime(CLOCK_MONOTONIC, &ts);
	l.now_us = (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
	if (traj_foreach(s->trajs, q->trajectory, list_traj, list_env, &l) < 0)
		return -ECONNRESET;
	if (!q->trajectory[0]) {
		if (gateway_trajs_foreach(s->gw_trajs, list_gateway_only, &l) < 0)
			return -ECONNRESET;
	} else if (gateway_traj_pending(s, q->trajectory, &p) == 0) {
		if (list_gateway_only(q->trajectory, &p, &l) < 0)
			return -ECONNRESET;
	}
	m.end.in_reply_to = PROTO_TRAJ_LIST;
	m.end.count = l.n;
	return client_send(s, c, &m);
}
