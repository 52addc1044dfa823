/* SPDX-License-Identifier: MIT */
/*
 * The daemon's side of checkpoint kinds (issue 23 item 3, supervisor-env-activity.h): whether
 * an environment changed at all since its head (a checkpoint then is "skipped"), and the
 * tracer's activity counter for env_checkpoint's choice between "full" and "fs-only".
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "supervisor-metrics.h"
#include "supervisor-dirty.h"
#include "supervisor-env-ctl.h"
#include "supervisor-env-slots.h"
#include "supervisor-envtrace.h"

static const char *const kind_names[] = {
	[ENV_CKPT_FULL] = ENV_KIND_FULL,
	[ENV_CKPT_FS_ONLY] = ENV_KIND_FS_ONLY,
	[ENV_CKPT_SKIPPED] = ENV_KIND_SKIPPED,
};

void envs_count_kind(struct sv_envs *es, const char *kind)
{
	for (size_t i = 0; i < ARRAY_SIZE(kind_names); i++)
		if (strcmp(kind[0] ? kind : ENV_KIND_FULL, kind_names[i]) == 0)
			es->ckpt_kinds[i]++;
}

void envs_collect_metrics(struct supervisor *s, struct metrics_collector *col)
{
	if (!s->envs)
		return;
	for (size_t i = 0; i < ARRAY_SIZE(kind_names); i++)
		metrics_add(col, "belayer_env_checkpoints_total", METRIC_COUNTER,
			    s->envs->ckpt_kinds[i],
			    "Environment checkpoints committed, by kind (full: FS delta and CRIU "
			    "dump; fs-only: FS delta, the last dump's images; skipped: nothing "
			    "changed, none taken).",
			    "kind=\"%s\"", kind_names[i]);
	metrics_add(col, "belayer_env_memory_soft_dirty", METRIC_GAUGE, env_mem_dirty_track(),
		    "Whether the kernel tracks soft-dirty pages (CRIU pre-dump); memory "
		    "checkpoints are full dumps either way.",
		    "%s", "");
}

int envs_activity_of(struct sv_envtrace *et, uint32_t watch, uint64_t *ret)
{
	struct envtrace_env_stats st;
	int r;

	if (!et || !watch)
		return -ENODEV;
	if (!envtrace_activity(et))
		return -EOPNOTSUPP; /* [env] activity = no */
	r = envtrace_env_stats(et, watch, &st);
	if (r < 0)
		return r;
	*ret = st.activity;
	return 0;
}

/* Offload thread: env_activity_fn over the job's tracer and watch (read on the loop thread
 * before the job: neither changes while the slot is busy). */
int env_job_activity(void *userdata, uint32_t *ret_watch, uint64_t *ret_count)
{
	const struct env_job *j = userdata;

	*ret_watch = j->watch;
	return envs_activity_of(j->et, j->watch, ret_count);
}

struct slot_watch {
	struct sv_envtrace *et;
	uint32_t watch;
};

static int slot_activity(void *userdata, uint32_t *ret_watch, uint64_t *ret_count)
{
	const struct slot_watch *w = userdata;

	*ret_watch = w->watch;
	return envs_activity_of(w->et, w->watch, ret_count);
}

/* Unfrozen, on the loop thread (env_activity_idle_since_dump). */
bool envs_processes_unchanged(struct supervisor *s, struct env_slot *sl)
{
	struct slot_watch w = {.et = s->envs->et, .watch = sl->trace_id};

	return sl->env && env_activity_idle_since_dump(sl->env, slot_activity, &w);
}

bool envs_files_unchanged(struct supervisor *s, struct env_slot *sl)
{
	if (!sl->dirty || !s->envs->et || !sl->env || !sl->env->head[0])
		return false;
	envs_drain(s);
	/* A full diff with nothing named since the dump is the dump's own (full_diff_of_dump). */
	return dirty_count(sl->dirty) == 0 &&
	       (!dirty_needs_full_diff(sl->dirty, NULL) || sl->full_diff_of_dump);
}

bool envs_unchanged(struct supervisor *s, struct env_slot *sl)
{
	bool r = envs_files_unchanged(s, sl) && envs_processes_unchanged(s, sl);

	if (r)
		log_debug("Environment %s unchanged since %s: no checkpoint.", sl->id,
			  sl->env->head);
	return r;
}
