/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "supervisor-nccl.h"
#include "supervisor-checks.h"
#include "supervisor-client.h"
#include "supervisor-ctl.h"
#include "supervisor-engines.h"
#include "supervisor-events.h"
#include "supervisor-gateway-traj.h"
#include "supervisor-promote.h"
#include "supervisor-shadow.h"
#include "supervisor-traj.h"

static int send_end(struct supervisor *s, struct sv_client *c, uint32_t count)
{
	struct proto_msg m = {.type = PROTO_END};

	m.end.in_reply_to = PROTO_CTL;
	m.end.count = count;
	return client_send(s, c, &m);
}

static int ctl_status(struct supervisor *s, struct sv_client *c)
{
	struct proto_msg m;
	uint32_t n = 0;

	for (size_t i = 0; metrics_get(s, i, &m); i++, n++)
		if (client_send(s, c, &m) < 0)
			return -ECONNRESET;
	if (promote_status_events(s, c, &n) < 0)
		return -ECONNRESET;
	if (nccl_status_events(s, c, &n) < 0)
		return -ECONNRESET;
	return send_end(s, c, n);
}

static int ctl_workers(struct supervisor *s, struct sv_client *c)
{
	uint64_t now = now_ms();
	struct proto_msg m;
	uint32_t n = 0;

	for (struct sv_worker *w = s->reg.workers; w; w = w->next, n++) {
		worker_to_info(w, now, &m);
		shadow_worker_info(s, w, &m);
		if (client_send(s, c, &m) < 0)
			return -ECONNRESET;
	}
	return send_end(s, c, n);
}

static int ctl_regions(struct supervisor *s, struct sv_client *c, pid_t pid)
{
	uint64_t now = now_ms();
	struct proto_msg m;
	uint32_t n = 0;

	for (struct sv_worker *w = s->reg.workers; w; w = w->next) {
		if (pid > 0 && w->pid != pid)
			continue;
		for (struct sv_region *rg = w->regions; rg; rg = rg->next, n++) {
			region_to_info(rg, now, &m);
			if (client_send(s, c, &m) < 0)
				return -ECONNRESET;
		}
	}
	return send_end(s, c, n);
}

static int ctl_config(struct supervisor *s, struct sv_client *c)
{
	struct proto_msg m = {.type = PROTO_CONFIG_ENTRY};
	const char *section, *key;
	char value[PROTO_MAX_STR + 1];
	uint32_t n = 0;

	for (size_t i = 0; config_entry(&s->config, i, &section, &key, value, sizeof(value), NULL);
	     i++, n++) {
		snprintf(m.config_entry.key, sizeof(m.config_entry.key), "%s.%s", section, key);
		memcpy(m.config_entry.value, value, sizeof(value));
		if (client_send(s, c, &m) < 0)
			return -ECONNRESET;
	}
	return send_end(s, c, n);
}

static int ctl_inject(struct supervisor *s, struct sv_client *c, const struct proto_ctl *ctl)
{
	static const int signals[_CTL_ACT_MAX] = {
		[CTL_ACT_KILL] = SIGKILL, [CTL_ACT_HANG] = SIGSTOP, [CTL_ACT_RESUME] = SIGCONT};
	struct sv_worker *w = NULL;

	if (!s->config.allow_inject)
		return client_refuse(s, c, REJECT_UNAUTHORIZED, EPERM, PROTO_CTL,
				     "inject is off ([security] allow_inject)");
	for (struct sv_worker *it = s->reg.workers; it; it = it->next)
		if (it->pid == (pid_t)ctl->pid && it->state != WORKER_DEAD)
			w = it;
	/* Only workers: the supervisor is not a way to signal arbitrary processes. */
	if (!w || w->pidfd < 0)
		return client_refuse(s, c, REJECT_NOT_FOUND, ESRCH, PROTO_CTL,
				     "no live worker with pid %u", ctl->pid);
	if (c->cred.uid != 0 && c->cred.uid != w->uid)
		return client_refuse(s, c, REJECT_UNAUTHORIZED, EPERM, PROTO_CTL,
				     "worker %u belongs to uid %u", ctl->pid, w->uid);
	if (ctl->act == CTL_ACT_NONE)
		return client_refuse(s, c, REJECT_BAD_MESSAGE, EINVAL, PROTO_CTL, "no action");
	/* Through the pidfd: the signal cannot reach a process that reused the pid. */
	if (syscall(SYS_pidfd_send_signal, w->pidfd, signals[ctl->act], NULL, 0) < 0)
		return client_send_error(s, c, errno, PROTO_CTL, "signal failed: %s",
					 strerror(errno));
	s->metrics.injections++;
	if (ctl->act == CTL_ACT_KILL)
		engines_note_kill(s, w);
	supervisor_emit(s, EVENT_INJECT, (uint32_t)w->pid, 0, "%s (%s) requested by pid %d uid %u",
			ctl_action_to_string(ctl->act), strsignal(signals[ctl->act]), c->cred.pid,
			c->cred.uid);
	return send_end(s, c, 1);
}

/* Manual failover: same rules as inject (it kills the engine's primaries). */
static int ctl_promote(struct supervisor *s, struct sv_client *c, const struct proto_ctl *ctl)
{
	struct sv_engine *e = engines_find(s, ctl->engine_id);

	if (!s->config.allow_inject)
		return client_refuse(s, c, REJECT_UNAUTHORIZED, EPERM, PROTO_CTL,
				     "promote is off ([security] allow_inject)");
	if (c->cred.uid != 0 && c->cred.uid != s->uid)
		return client_refuse(s, c, REJECT_UNAUTHORIZED, EPERM, PROTO_CTL,
				     "promote needs root or the supervisor's user");
	if (!e)
		return client_refuse(s, c, REJECT_NOT_FOUND, ENOENT, PROTO_CTL,
				     "no configured engine \"%s\"", ctl->engine_id);
	if (e->rec)
		return client_send_error(s, c, EBUSY, PROTO_CTL,
					 "engine \"%s\" is recovering already", ctl->engine_id);
	supervisor_emit(s, EVENT_INJECT, 0, 0,
			"promote of engine \"%s\" requested by pid %d uid %u", ctl->engine_id,
			c->cred.pid, c->cred.uid);
	promote_start(s, e, "manual", 0, now_ns());
	return send_end(s, c, 1);
}

/* ---- PROTO_TRAJ_LIST: the checkpoint policy's trajectories and environments ---- */

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

int ctl_dispatch(struct supervisor *s, struct sv_client *c, const struct proto_ctl *ctl)
{
	int r;

	switch (ctl->cmd) {
	case CTL_STATUS:
		return ctl_status(s, c);
	case CTL_WORKERS:
		return ctl_workers(s, c);
	case CTL_REGIONS:
		return ctl_regions(s, c, (pid_t)ctl->pid);
	case CTL_CONFIG:
		return ctl_config(s, c);
	case CTL_EVENTS:
		c->subscribed = true;
		return send_end(
			s, c,
			(uint32_t)events_replay(s, c, (size_t)MIN(ctl->arg, (uint64_t)SIZE_MAX)));
	case CTL_INJECT:
		return ctl_inject(s, c, ctl);
	case CTL_HEALTH:
		r = checks_request(s, c, (pid_t)ctl->pid, ctl->dev);
		if (r < 0)
			return client_refuse(s, c, REJECT_NOT_FOUND, -r, PROTO_CTL,
					     "no worker with pid %u", ctl->pid);
		return 0;
	case CTL_PROMOTE:
		return ctl_promote(s, c, ctl);
	case _CTL_CMD_MAX:
		break;
	}
	return client_refuse(s, c, REJECT_BAD_MESSAGE, EINVAL, PROTO_CTL, "unknown command");
}
