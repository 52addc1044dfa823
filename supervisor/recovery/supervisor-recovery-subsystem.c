/* SPDX-License-Identifier: MIT */
/* Worker recovery as a subsystem of the core: its messages, commands and life cycle. */
#include <errno.h>
#include <string.h>

#include "log.h"
#include "supervisor-checks.h"
#include "supervisor-client.h"
#include "supervisor-engines.h"
#include "supervisor-fdstore.h"
#include "supervisor-health.h"
#include "supervisor-nccl.h"
#include "supervisor-promote.h"
#include "supervisor-recovery-ctl.h"
#include "supervisor-regions.h"
#include "supervisor-shadow.h"
#include "supervisor-subsystem.h"
#include "supervisor-workers.h"
#include "sv-recovery.h"

static int on_hello(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	int r;

	/* A promoted shadow's shim says hello again, as the primary it now is. */
	if (c->worker && c->worker->promoted && m->hello.role == ROLE_PRIMARY) {
		c->worker->promoted = false;
		c->worker = NULL;
	}
	if (c->worker)
		return client_refuse(s, c, REJECT_BAD_MESSAGE, EALREADY, PROTO_HELLO,
				     "hello twice");
	r = workers_hello(s, c, &m->hello);
	if (r < 0)
		return client_send_error(s, c, -r, PROTO_HELLO, "hello refused: %s", strerror(-r));
	return 0;
}

static int on_shadow_region(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	return shadow_on_region(s, c, &m->shadow_region);
}

static int on_shadow_parked(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	return shadow_on_parked(s, c, &m->shadow_parked);
}

static int on_promote_done(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	if (!c->worker)
		return client_refuse(s, c, REJECT_NO_HELLO, EPROTO, PROTO_PROMOTE_DONE,
				     "hello first");
	promote_on_done(s, c->worker, &m->promote_done);
	return 0;
}

static int on_nccl_comm(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	return nccl_on_comm(s, c, &m->nccl_comm);
}

static int on_nccl_comm_end(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	return nccl_on_comm_end(s, c, &m->nccl_comm_end);
}

static int on_mem_info(struct supervisor *s, struct sv_client *c, struct proto_msg *m)
{
	return meminfo_on_message(s, c, &m->mem_info);
}

static const struct sv_message_handler messages[] = {
	{PROTO_HELLO, on_hello},
	{PROTO_REGION_ANNOUNCE, regions_on_message},
	{PROTO_REGION_RELEASE, regions_on_message},
	{PROTO_REGION_FETCH, regions_on_message},
	{PROTO_SHADOW_REGION, on_shadow_region},
	{PROTO_SHADOW_PARKED, on_shadow_parked},
	{PROTO_PROMOTE_DONE, on_promote_done},
	{PROTO_NCCL_COMM, on_nccl_comm},
	{PROTO_NCCL_COMM_END, on_nccl_comm_end},
	{PROTO_MEM_INFO, on_mem_info},
	{},
};

static void recovery_init(struct supervisor *s)
{
	s->reg.worker_removed = nccl_worker_removed;
}

static int restore_record(struct supervisor *s, const struct journal_record *rec)
{
	return workers_restore_record(s, rec);
}

static void journal_replayed(struct supervisor *s)
{
	(void)fdstore_restore(s);
	workers_restore_finish(s);
}

static int every_ms(struct supervisor *s, uint64_t ms, void (*cb)(struct supervisor *s))
{
	if (!s->hooks || !s->hooks->every)
		return -EOPNOTSUPP;
	return s->hooks->every(s, ms * 1000, cb);
}

static int recovery_start(struct supervisor *s, struct event_base *base)
{
	int r;

	(void)base;
	/* The first GPU check opens NVML, whose XID events count from then on. */
	checks_gpu_periodic(s);
	if (s->config.health_interval) {
		r = every_ms(s, s->config.health_interval * 1000, checks_gpu_periodic);
		if (r < 0)
			return r;
	}
	/* NCCL hang detection: reads the communicators' counters. */
	r = every_ms(s, MAX(s->config.nccl_poll_ms, (uint64_t)10), nccl_tick);
	if (r < 0)
		return r;
	/* Engines last: their shims connect to the socket that now listens. */
	if (!s->config.n_engines)
		return 0;
	r = engines_start(s);
	if (r < 0)
		return r;
	return every_ms(s, ENGINES_TICK_MS, engines_tick);
}

static int recovery_status(struct supervisor *s, struct sv_client *c, uint32_t *n)
{
	if (promote_status_events(s, c, n) < 0)
		return -ECONNRESET;
	return nccl_status_events(s, c, n);
}

static void recovery_finish(struct supervisor *s)
{
	engines_stop(s);
	for (struct sv_worker *w = s->reg.workers; w; w = w->next)
		if (s->hooks && s->hooks->unwatch_worker)
			s->hooks->unwatch_worker(s, w);
	registry_finish(&s->reg);
	nccl_finish();
	health_gpu_free(s->gpu);
	s->gpu = NULL;
}

const struct sv_subsystem recovery_subsystem = {
	.name = "recovery",
	.messages = messages,
	.ctl = recovery_ctl_handlers,
	.init = recovery_init,
	.journal_record = restore_record,
	.journal_replayed = journal_replayed,
	.start = recovery_start,
	.tick = workers_tick,
	.worker_died = supervisor_worker_died,
	.collect_metrics = engines_collect_metrics,
	.status = recovery_status,
	.finish = recovery_finish,
};
