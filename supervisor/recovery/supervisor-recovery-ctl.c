/* SPDX-License-Identifier: MIT */
/* The control commands about workers: workers, regions, inject, health, promote. */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "supervisor-checks.h"
#include "supervisor-client.h"
#include "supervisor-ctl.h"
#include "supervisor-engines.h"
#include "supervisor-events.h"
#include "supervisor-promote.h"
#include "supervisor-recovery-ctl.h"
#include "supervisor-footprint.h"
#include "supervisor-shadow.h"

static int ctl_workers(struct supervisor *s, struct sv_client *c)
{
	uint64_t now = now_ms();
	struct proto_msg m;
	uint32_t n = 0;

	for (struct sv_worker *w = s->reg.workers; w; w = w->next, n++) {
		worker_to_info(w, now, &m);
		shadow_worker_info(s, w, &m);
		footprint_worker_info(w, &m);
		if (client_send(s, c, &m) < 0)
			return -ECONNRESET;
	}
	return ctl_send_end(s, c, n);
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
	return ctl_send_end(s, c, n);
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
	return ctl_send_end(s, c, 1);
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
	return ctl_send_end(s, c, 1);
}

static int ctl_workers_cmd(struct supervisor *s, struct sv_client *c, const struct proto_ctl *ctl)
{
	(void)ctl;
	return ctl_workers(s, c);
}

static int ctl_regions_cmd(struct supervisor *s, struct sv_client *c, const struct proto_ctl *ctl)
{
	return ctl_regions(s, c, (pid_t)ctl->pid);
}

static int ctl_health(struct supervisor *s, struct sv_client *c, const struct proto_ctl *ctl)
{
	int r = checks_request(s, c, (pid_t)ctl->pid, ctl->dev);

	if (r < 0)
		return client_refuse(s, c, REJECT_NOT_FOUND, -r, PROTO_CTL, "no worker with pid %u",
				     ctl->pid);
	return 0;
}

const struct sv_ctl_handler recovery_ctl_handlers[] = {
	{CTL_WORKERS, ctl_workers_cmd}, {CTL_REGIONS, ctl_regions_cmd}, {CTL_INJECT, ctl_inject},
	{CTL_HEALTH, ctl_health},	{CTL_PROMOTE, ctl_promote},	{},
};
