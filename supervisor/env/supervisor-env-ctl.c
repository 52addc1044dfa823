/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "supervisor-client.h"
#include "supervisor-criu.h"
#include "supervisor-dirty.h"
#include "supervisor-env-ctl.h"
#include "supervisor-env-exec.h"
#include "supervisor-env-fs.h"
#include "supervisor-env-handover.h"
#include "supervisor-env-sandbox.h"
#include "supervisor-env-slots.h"
#include "supervisor-env.h"
#include "supervisor-envtrace.h"
#include "supervisor-events.h"
#include "supervisor-env-net.h"
#include "supervisor-offload.h"
#include "supervisor-sidelog.h"

/* Paths and ids are copied into the protocol's 255-byte strings and PATH_MAX buffers: a longer
 * one is cut in a reply (never used to open anything); env_prepare() bounds the others. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* A create's limit: the request's (ENV_LIMIT_NONE: none), else the configured one. */
static uint64_t limit_or(uint64_t asked, uint64_t configured)
{
	return asked == ENV_LIMIT_NONE ? 0 : asked ? asked : configured;
}
static uint64_t mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

struct env_slot *env_slot_find(struct sv_envs *es, const char *id)
{
	for (struct env_slot *sl = es ? es->slots : NULL; sl; sl = sl->next)
		if (strcmp(sl->id, id) == 0)
			return sl;
	return NULL;
}

static struct env_slot *slot_by_trace(struct sv_envs *es, uint32_t trace_id)
{
	for (struct env_slot *sl = es ? es->slots : NULL; sl; sl = sl->next)
		if (sl->trace_id == trace_id)
			return sl;
	return NULL;
}

static void slot_unwatch(struct sv_envs *es, struct env_slot *sl)
{
	if (sl->trace_id && es->et)
		(void)envtrace_watch_remove(es->et, sl->trace_id);
	sl->trace_id = 0;
	dirty_destroy(sl->dirty);
	sl->dirty = NULL;
	sl->full_diff_of_dump = false;
	sidelog_close(sl->log);
	sl->log = NULL;
}

static void slot_remove(struct sv_envs *es, struct env_slot *sl)
{
	for (struct env_slot **pp = &es->slots; *pp; pp = &(*pp)->next)
		if (*pp == sl) {
			*pp = sl->next;
			break;
		}
	slot_unwatch(es, sl);
	free(sl);
}

static void tracer_load(struct supervisor *s)
{
	struct sv_envs *es = s->envs;
	struct envtrace_options o = {.pin_dir = s->config.env_pin_dir,
				     .state_dir = s->config.state_dir,
				     .no_activity = !s->config.env_activity};
	int r;

	if (es->et_tried || !s->config.env_trace)
		return;
	es->et_tried = true;
	r = envtrace_setup_fs();
	if (r >= 0)
		r = envtrace_create(&o, &es->et);
	if (r >= 0 && es->watch_fd)
		r = es->watch_fd(s, envtrace_fd(es->et));
	if (r < 0) {
		log_warning_errno(r, "BPF unavailable (%m): environments run without side-effect "
				     "tracing.");
		envtrace_destroy(es->et);
		es->et = NULL;
		return;
	}
	log_info("Environment tracing on (maps and programs pinned under %s)%s.",
		 envtrace_pin_dir(es->et),
		 envtrace_activity(es->et)
			 ? ""
			 : "; process activity not counted ([env] activity = no): "
			   "every checkpoint of an environment with processes dumps them");
}

/* Starts tracing the slot's cgroup (no-op without the tracer). */
static int slot_watch(struct supervisor *s, struct env_slot *sl)
{
	struct sv_envs *es = s->envs;
	uint32_t id;
	int r;

	tracer_load(s);
	if (!es->et)
		return 0;
	for (id = es->next_trace_id; slot_by_trace(es, id) || id == 0;)
		id = id % (ENVTRACE_MAX_ENVS - 1) + 1;
	es->next_trace_id = id % (ENVTRACE_MAX_ENVS - 1) + 1;
	r = dirty_create(&sl->dirty);
	if (r >= 0)
		r = sidelog_open(sl->log_path, &sl->log);
	if (r >= 0)
		r = envtrace_watch_add(es->et, sl->cgroup, sl->root[0] ? sl->root : NULL, id);
	if (r < 0) {
		slot_unwatch(es, sl);
		return log_warning_errno(r, "Failed to trace %s: %m, ignoring.", sl->cgroup);
	}
	sl->trace_id = id;
	sl->vouched = false; /* what ran before the watch is unknown */
	(void)dirty_rescan_writers(sl->dirty, sl->cgroup, sl->root[0] ? sl->root : NULL);
	return 0;
}

/* --- tracer on the loop ------------------------------------------------------------------ */

static void send_item(struct supervisor *s, struct sv_client *c, const char *kind, uint32_t pid,
		      uint64_t ts, const char *path, const char *path2, const char *text)
{
	struct proto_msg m = {.type = PROTO_ENV_ITEM};

	snprintf(m.env_item.kind, sizeof(m.env_item.kind), "%s", kind);
	m.env_item.pid = pid;
	m.env_item.ts_ns = ts;
	snprintf(m.env_item.path, sizeof(m.env_item.path), "%s", path ? path : "");
	snprintf(m.env_item.path2, sizeof(m.env_item.path2), "%s", path2 ? path2 : "");
	snprintf(m.env_item.text, sizeof(m.env_item.text), "%s", text ? text : "");
	(void)client_send(s, c, &m);
}

static void argv_join(const char *argv, size_t len, char *out, size_t cap)
{
	size_t o = 0;

	for (size_t i = 0; i < len && o + 1 < cap; i++)
		out[o++] = argv[i] ? argv[i] : ' ';
	while (o > 0 && out[o - 1] == ' ')
		o--;
	out[o] = '\0';
}

static int on_record(const struct envtrace_record *rec, void *userdata)
{
	struct supervisor *s = userdata;
	struct env_slot *sl = slot_by_trace(s->envs, rec->env_id);

	if (!sl)
		return 0;
	if (sl->dirty)
		(void)dirty_apply(sl->dirty, rec);
	if (sl->log)
		(void)sidelog_append(sl->log, rec);
	for (size_t i = 0; i < MAX_FOLLOWERS; i++) {
		struct sv_client *c =
			sl->followers[i] ? client_by_serial(s, sl->followers[i]) : NULL;
		char text[PROTO_MAX_STR + 1] = "";

		if (!c) {
			sl->followers[i] = 0;
			continue;
		}
		if (rec->type == ENVTRACE_EV_EXEC) {
			argv_join(rec->argv, rec->argv_len, text, sizeof(text));
			send_item(s, c, "exec", (uint32_t)rec->pid, rec->ts_ns, rec->exe, NULL,
				  text);
		} else if (rec->npaths) {
			send_item(s, c, "file", (uint32_t)rec->pid, rec->ts_ns, rec->path[0],
				  rec->npaths > 1 ? rec->path[1] : NULL,
				  envtrace_op_to_string(rec->op));
		}
	}
	return 0;
}

void envs_drain(struct supervisor *s)
{
	if (s->envs && s->envs->et)
		while (envtrace_consume(s->envs->et, on_record, s) > 0)
			;
}

/* Environments of an earlier run of the supervisor: their processes and checkpoints
 * outlived it; take them back so that they can be checkpointed and restored again. */
static void reopen_all(struct supervisor *s)
{
	char dir[PATH_MAX];
	struct dirent *de;
	DIR *d;

	snprintf(dir, sizeof(dir), "%s/envs", s->config.state_dir);
	d = opendir(dir);
	while (d && (de = readdir(d))) {
		struct env_params p = {
			.id = de->d_name,
			.state_dir = s->config.state_dir,
			.cgroup_parent = s->config.env_cgroup,
			.criu = sv_criu_binary(s->config.env_criu) ?: "criu",
			.keep = s->config.env_keep,
			.slirp4netns = s->config.env_slirp4netns,
		};
		struct env_slot *sl;
		struct sv_env *e;

		if (!env_id_valid(de->d_name) || env_reopen(&p, &e) < 0)
			continue;
		sl = calloc(1, sizeof(*sl));
		if (!sl) {
			free(e);
			break;
		}
		snprintf(sl->id, sizeof(sl->id), "%s", e->id);
		snprintf(sl->root, sizeof(sl->root), "%s", e->root);
		snprintf(sl->cgroup, sizeof(sl->cgroup), "%s", e->cgroup);
		snprintf(sl->log_path, sizeof(sl->log_path), "%s/sidelog.mpk", e->dir);
		sl->env = e;
		sl->next = s->envs->slots;
		s->envs->slots = sl;
		if (e->pid > 0)
			(void)slot_watch(s, sl);
		log_info("Environment %s taken back: %s, latest checkpoint %s.", e->id,
			 e->pid > 0 ? "running" : "not running (restore it)",
			 e->head[0] ? e->head : "none");
	}
	if (d)
		closedir(d);
}

int envs_start(struct supervisor *s, int (*watch_fd)(struct supervisor *s, int fd))
{
	s->envs = calloc(1, sizeof(*s->envs));
	if (!s->envs)
		return -ENOMEM;
	s->envs->next_trace_id = 1;
	s->envs->watch_fd = watch_fd;
	if (env_handover_start(s) < 0)
		log_warning("No freeze handover: checkpoints walk the upper layer, ignoring.");
	if (s->config.env_trace_preload)
		tracer_load(s);
	reopen_all(s);
	return 0;
}

void envs_stop(struct supervisor *s)
{
	struct sv_envs *es = s->envs;

	if (!es)
		return;
	env_handover_stop(s);
	env_exec_stop(s);
	while (es->slots) {
		struct env_slot *sl = es->slots;

		es->slots = sl->next;
		slot_unwatch(es, sl);
		if (sl->env) {
			/* It would exit with us anyway (its --exit-fd): stopped, its reaper joined. */
			env_net_stop(sl->env);
			env_manifest_finish(&sl->env->head_index);
			free(sl->env);
		}
		free(sl);
	}
	envtrace_destroy(es->et);
	free(es);
	s->envs = NULL;
}

/* --- replies ----------------------------------------------------------------------------- */

static void info_of_env(const struct env_slot *sl, struct proto_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->type = PROTO_ENV_INFO;
	snprintf(m->env_info.env, sizeof(m->env_info.env), "%s", sl->id);
	snprintf(m->env_info.root, sizeof(m->env_info.root), "%s", sl->root);
	snprintf(m->env_info.cgroup, sizeof(m->env_info.cgroup), "%s", sl->cgroup);
	if (sl->env) {
		int n = sl->busy ? 0 : env_count_procs(sl->env);

		snprintf(m->env_info.ckpt, sizeof(m->env_info.ckpt), "%s", sl->env->head);
		m->env_info.pid = (uint32_t)(sl->env->pid > 0 ? sl->env->pid : 0);
		m->env_info.nproc = n > 0 ? (uint32_t)n : 0;
		m->env_info.net = sl->env->net;
		snprintf(m->env_info.mem, sizeof(m->env_info.mem), "%s", env_mem_mode());
		m->env_info.soft_dirty = env_mem_dirty_track();
	}
}

static void info_of_manifest(const char *env, const struct env_manifest *mf, uint64_t total_us,
			     struct proto_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->type = PROTO_ENV_INFO;
	snprintf(m->env_info.env, sizeof(m->env_info.env), "%s", env);
	snprintf(m->env_info.ckpt, sizeof(m->env_info.ckpt), "%s", mf->id);
	snprintf(m->env_info.parent, sizeof(m->env_info.parent), "%s", mf->parent);
	snprintf(m->env_info.trajectory, sizeof(m->env_info.trajectory), "%s", mf->trajectory);
	m->env_info.turn = mf->turn;
	m->env_info.prefix_tokens = mf->prefix_tokens;
	m->env_info.prefix_hash = mf->prefix_hash;
	m->env_info.nproc = (uint32_t)mf->nproc;
	m->env_info.fs_bytes = mf->fs_bytes;
	m->env_info.fs_files = mf->fs_files;
	m->env_info.criu_bytes = mf->criu_bytes;
	m->env_info.freeze_us = mf->freeze_us;
	m->env_info.dump_us = mf->dump_us;
	m->env_info.fs_us = mf->fs_us;
	m->env_info.total_us = total_us;
	m->env_info.full_diff = mf->full_diff;
	m->env_info.commit_us = mf->commit_us;
	snprintf(m->env_info.path, sizeof(m->env_info.path), "%s", mf->delta_path);
	snprintf(m->env_info.kind, sizeof(m->env_info.kind), "%s",
		 mf->kind[0] ? mf->kind : ENV_KIND_FULL);
	snprintf(m->env_info.why, sizeof(m->env_info.why), "%s", mf->full_diff_reason);
	m->env_info.precopy_rounds = mf->precopy_rounds;
	m->env_info.precopy_bytes = mf->precopy_bytes;
	m->env_info.precopy_frozen_bytes = mf->precopy_frozen_bytes;
}

static int send_end(struct supervisor *s, struct sv_client *c, uint32_t n)
{
	struct proto_msg m = {.type = PROTO_END};

	m.end.in_reply_to = PROTO_ENV_REQUEST;
	m.end.count = n;
	return client_send(s, c, &m);
}

/* --- jobs -------------------------------------------------------------------------------- */

static int cmp_str_ptr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool dirty_path_subtree(const char *p)
{
	return p[strlen(p) + 1] == '1';
}

/* The dirty set as the checkpoint sees it ("/"-rooted in the tracer, relative in the
 * manifest), dirty_covers()'s rule: the path itself, or an ancestor dirty with its subtree (a
 * renamed directory). A directory dirty for itself only (it gained or lost an entry) does not
 * cover what it holds: one new file in a directory of 100,000 is one file to copy (issue 16
 * item 12). */
static bool job_force(const char *path, void *userdata)
{
	struct env_job *j = userdata;
	char buf[ENV_PATH_MAX + 2];
	char *key = buf, **hit;
	bool self = true;

	snprintf(buf, sizeof(buf), "/%s", path);
	for (;;) {
		hit = bsearch(&key, j->dirty_paths, j->n_dirty, sizeof(*j->dirty_paths),
			      cmp_str_ptr);
		if (hit && (self || dirty_path_subtree(*hit)))
			return true;
		char *slash = strrchr(buf, '/');

		if (!slash || slash == buf)
			return false;
		*slash = '\0';
		self = false;
	}
}

static void job_free(struct sv_job *jb)
{
	struct env_job *j = (struct env_job *)jb;

	for (size_t i = 0; i < j->n_dirty; i++)
		free(j->dirty_paths[i]);
	free(j->dirty_paths);
	free(j->fs_dirty);
	free(j->late_fs);
	if (j->have_manifest)
		env_manifest_finish(&j->m);
	free(j);
}

/* Offload thread, from env_checkpoint: the environment runs again. */
static void job_thawed(void *userdata)
{
	struct env_job *j = userdata;

	j->thaw_at_us = mono_us();
	if (!j->policy)
		return;
	j->policy->thaw_us = j->thaw_at_us - j->run_start_us;
	atomic_store(&j->policy->thawed, true);
	if (j->policy->on_thawed)
		j->policy->on_thawed(j->policy);
}

/* Offload thread, env_checkpoint's frozen callback (and a restore's, once the environment is
 * stopped): the dirty set up to the freeze, from the loop (supervisor-env-handover.h). */
static int job_frozen(void *userdata, const struct env_fs_dirty **ret, size_t *ret_n,
		      const char **ret_why)
{
	struct env_job *j = userdata;
	int r;

	if (!j->traced) {
		*ret_why = "no tracer";
		return 1;
	}
	if (!j->full_reason[0] && !j->vouched) {
		*ret_why = "the tracer started after the last checkpoint (a creation, a supervisor "
			   "restart, or a restore or fork not watched from its start)";
		return 1;
	}
	if (!j->full_reason[0]) {
		r = env_handover_wait(j->sv, j);
		if (r < 0) {
			log_debug_errno(r, "No dirty set at the freeze of %s: %m", j->q.env);
			*ret_why = "the tracer's handover at the freeze failed";
			return 1;
		}
	}
	if (j->full_reason[0]) {
		*ret_why = j->full_reason;
		return 1;
	}
	*ret = j->fs_dirty;
	*ret_n = j->n_fs_dirty;
	return 0;
}

/* Offload thread, before the freeze (supervisor-env-precopy.h): round 0 the snapshot, then
 * what the loop's set gained since the previous round (the slot's set restarted). */
static int job_precopy(void *userdata, unsigned round, const struct env_fs_dirty **ret,
		       size_t *ret_n, const char **ret_why)
{
	struct env_job *j = userdata;
	int r;

	if (!j->traced || j->full_reason[0] || !j->vouched) {
		*ret_why = j->full_reason[0] ? j->full_reason : "the tracer cannot vouch";
		return 1;
	}
	/* every round asked before this one was copied */
	j->n_late = 0;
	if (round == 0) {
		*ret = j->fs_dirty;
		*ret_n = j->n_fs_dirty;
		return 0;
	}
	j->ho_reset = true;
	r = env_handover_wait(j->sv, j);
	j->ho_reset = false;
	if (r < 0) {
		log_debug_errno(r, "No dirty set for the pre-copy of %s: %m", j->q.env);
		*ret_why = "the tracer's handover failed";
		return 1;
	}
	if (j->full_reason[0]) {
		*ret_why = j->full_reason;
		return 1;
	}
	*ret = j->late_fs;
	*ret_n = j->n_late;
	return 0;
}

/* Offload thread, a restore's: the fresh cgroup watched by the loop before CRIU restores into
 * it (env_job_take_late's other task). */
static void job_cgroup_ready(void *userdata)
{
	struct env_job *j = userdata;
	int r;

	j->ho_rewatch = true;
	r = env_handover_wait(j->sv, j);
	j->ho_rewatch = false;
	if (r < 0)
		log_debug_errno(r, "%s's fresh cgroup not watched before its restore: %m",
				j->q.env);
}

/* Offload thread, a fork's (env_params' restore_watch): the same for the new environment. */
static void job_fork_watch(void *userdata, const struct sv_env *e)
{
	struct env_job *j = userdata;
	int r;

	j->ho_fork = e;
	r = env_handover_wait(j->sv, j);
	j->ho_fork = NULL;
	if (r < 0)
		log_debug_errno(r, "Fork %s not watched before its restore: %m", e->id);
}

static void job_late(void *userdata, const struct env_fs_dirty **ret, size_t *ret_n)
{
	struct env_job *j = userdata;

	*ret = j->late_fs;
	*ret_n = j->n_late;
}

/* Offload thread: the slot's env is the job's alone while busy. */
static void job_run(struct supervisor *s, struct sv_job *jb)
{
	struct env_job *j = (struct env_job *)jb;
	struct sv_env *e = j->slot->env;
	uint64_t t0 = mono_us();

	(void)s;
	j->run_start_us = t0;
	if (j->policy) {
		/* Paired with the fence in the canceller (supervisor-traj-ctl.c): either it sees
		 * the job started (and waits for the thaw or the end), or env_checkpoint's first
		 * look at cancel, before freezing, sees it set. */
		atomic_store(&j->policy->started, true);
		atomic_thread_fence(memory_order_seq_cst);
	}
	switch (j->q.op) {
	case ENV_OP_CREATE:
		j->r = env_create(&j->p, &j->created);
		break;
	case ENV_OP_ADOPT:
		j->r = env_adopt(&j->p, j->q.cgroup, j->q.root, (pid_t)j->q.pid, &j->created);
		if (j->r >= 0) {
			char lacks[512];

			/* its runtime's isolation, not Belayer's: said once, not fixed */
			env_sandbox_report((pid_t)j->q.pid, lacks, sizeof(lacks));
			if (lacks[0])
				log_warning("Environment %s adopted without a sandbox: %s.",
					    j->q.env, lacks);
		}
		break;
	case ENV_OP_CHECKPOINT: {
		struct env_ckpt_params cp = {
			.trajectory = j->q.trajectory,
			.turn = j->q.turn,
			.prefix_tokens = j->q.prefix_tokens,
			.prefix_hash = j->q.prefix_hash,
			.force = j->traced ? job_force : NULL,
			.userdata = j,
			.full_diff_reason = j->full_reason[0] ? j->full_reason : NULL,
			.cancel = j->policy ? &j->policy->cancel : NULL,
			.dumping = j->policy ? &j->policy->dumping : NULL,
			.thawed = job_thawed,
			.activity = env_job_activity,
			.frozen = job_frozen,
			.precopy = job_precopy,
			.late = job_late,
		};

		j->r = env_checkpoint(e, &cp, &j->m);
		j->have_manifest = j->r >= 0;
		break;
	}
	case ENV_OP_RESTORE:
		j->r = env_restore_traced(
			e, j->q.ckpt[0] ? j->q.ckpt : NULL,
			&(struct env_restore_params){.killed = job_frozen,
						     .userdata = j,
						     .cgroup_ready = job_cgroup_ready},
			&j->m);
		j->have_manifest = j->r >= 0;
		break;
	case ENV_OP_REBUILD:
		j->r = env_rebuild(e);
		break;
	case ENV_OP_DESTROY:
		env_destroy(e);
		j->slot->env = NULL;
		j->r = 0;
		break;
	case ENV_OP_FORK:
		j->r = 0;
		for (size_t i = 0; i < j->n_forks && j->r >= 0; i++) {
			struct env_params p = j->p;
			struct env_manifest fm;

			p.id = j->fork_slots[i]->id;
			p.restore_watch = job_fork_watch;
			p.restore_watch_data = j;
			j->r = env_fork(e, j->q.ckpt, &p, &j->forks[i], &fm, j->why,
					sizeof(j->why));
			if (j->r >= 0)
				env_manifest_finish(&fm);
		}
		/* all or none: a group of K rollouts is of no use with K - 1 */
		for (size_t i = 0; j->r < 0 && i < j->n_forks; i++) {
			env_destroy(j->forks[i]);
			j->forks[i] = NULL;
		}
		break;
	default:
		j->r = -EOPNOTSUPP;
	}
	j->us = mono_us() - t0;
}

/* A checkpoint that did not commit: what its snapshot took out of the dirty set is dirty
 * still (the policy must not see the environment clean), each as it was. */
static void dirty_restore(struct env_slot *sl, const struct env_job *j)
{
	if (!j->traced || !sl->dirty)
		return;
	for (size_t i = 0; i < j->n_dirty; i++) {
		const char *p = j->dirty_paths[i];
		int r = dirty_path_subtree(p) ? dirty_add(sl->dirty, p)
					      : dirty_add_self(sl->dirty, p);

		if (r < 0)
			dirty_require_full_diff(sl->dirty, "out of memory");
	}
	if (j->full_reason[0])
		dirty_require_full_diff(sl->dirty, j->full_reason);
}

/* A checkpoint's end, for the trajectory tracker: the policy's own (completed or not), or a
 * client's that named a trajectory and completed. */
static void job_report_checkpoint(struct supervisor *s, struct env_job *j)
{
	struct envs_ckpt_result res = {
		.r = j->r,
		.committed = j->have_manifest,
		.run_us = j->us,
		.thaw_us = j->thaw_at_us ? j->thaw_at_us - j->run_start_us : 0,
	};

	if (j->have_manifest) {
		snprintf(res.id, sizeof(res.id), "%s", j->m.id);
		res.fs_bytes = j->m.fs_bytes;
		res.criu_bytes = j->m.criu_bytes;
		res.fs_us = j->m.fs_us;
		res.dump_us = j->m.dump_us;
	}
	if (j->policy)
		j->policy->on_done(s, j->policy, &res);
	else if (j->r >= 0 && j->have_manifest && j->q.trajectory[0])
		traj_ctl_env_checkpointed(s, j->q.env, j->q.trajectory, &res);
}

/* The reply, the log and (for a checkpoint or restore) the event say why: the errno and, when
 * the environment knows more (CRIU's own error line, a process that joined from outside,
 * the fallback to the head), that too. */
static void job_report_failure(struct supervisor *s, struct sv_client *c, const struct env_job *j)
{
	const char *op = env_op_to_string(j->q.op);
	const struct sv_env *e = j->slot->env;
	bool ckpt_or_restore = j->q.op == ENV_OP_CHECKPOINT || j->q.op == ENV_OP_RESTORE;
	const char *why = j->q.op == ENV_OP_FORK		? (j->why[0] ? j->why : NULL)
			  : ckpt_or_restore && e && e->error[0] ? e->error
								: NULL;

	if (!why && j->q.op == ENV_OP_CREATE && j->why[0])
		why = j->why; /* the image store's reason, or the image's missing command */

	if (c)
		(void)client_send_error(s, c, -j->r, PROTO_ENV_REQUEST, "env %s %s failed: %s%s%s",
					j->q.env, op, strerror(-j->r), why ? ": " : "", why ?: "");
	if (j->r == -ECANCELED) {
		log_info("Environment %s: %s aborted after %" PRIu64 " ms (thawed).", j->q.env, op,
			 j->us / 1000);
		return;
	}
	log_warning_errno(j->r, "Environment %s: %s failed: %m%s%s", j->q.env, op, why ? ": " : "",
			  why ?: "");
	if (ckpt_or_restore)
		supervisor_emit(s, EVENT_ENV, e && e->pid > 0 ? (uint32_t)e->pid : 0, 0,
				"%s %s failed: %s%s%s", j->q.env, op, strerror(-j->r),
				why ? ": " : "", why ?: "");
}

/* The new environments join their slots (or the slots go), one reply item each. */
static void forks_done(struct supervisor *s, struct sv_client *c, struct env_job *j)
{
	struct proto_msg m;

	for (size_t i = 0; i < j->n_forks; i++) {
		struct env_slot *sl = j->fork_slots[i];

		sl->busy = false;
		if (j->r < 0) {
			slot_remove(s->envs, sl);
			continue;
		}
		sl->env = j->forks[i];
		snprintf(sl->root, sizeof(sl->root), "%s", sl->env->root);
		snprintf(sl->cgroup, sizeof(sl->cgroup), "%s", sl->env->cgroup);
		snprintf(sl->log_path, sizeof(sl->log_path), "%s/sidelog.mpk", sl->env->dir);
		if (sl->trace_id)
			/* watched since before CRIU restored its tasks (job_fork_watch): the
			 * tracer vouches from its first checkpoint, the copied one, on */
			sl->vouched = true;
		else
			(void)slot_watch(s, sl);
	}
	if (j->r < 0) {
		job_report_failure(s, c, j);
		return;
	}
	log_info("Environment %s: %zu fork%s done in %" PRIu64 " ms.", j->q.env, j->n_forks,
		 j->n_forks == 1 ? "" : "s", j->us / 1000);
	supervisor_emit(s, EVENT_ENV, 0, 0, "%s forked into %zu environment%s", j->q.env,
			j->n_forks, j->n_forks == 1 ? "" : "s");
	if (!c)
		return;
	for (size_t i = 0; i < j->n_forks; i++) {
		info_of_env(j->fork_slots[i], &m);
		(void)client_send(s, c, &m);
	}
	(void)send_end(s, c, (uint32_t)j->n_forks);
}

static void job_done(struct supervisor *s, struct sv_job *jb)
{
	struct env_job *j = (struct env_job *)jb;
	struct sv_client *c = j->client ? client_by_serial(s, j->client) : NULL;
	struct env_slot *sl = j->slot;
	struct proto_msg m;

	sl->busy = false;
	if (j->q.op == ENV_OP_CHECKPOINT && j->r >= 0 && sl->dirty) {
		envs_drain(s);
		sl->full_diff_of_dump =
			dirty_needs_full_diff(sl->dirty, NULL) && dirty_count(sl->dirty) == 0;
		/* the set since its snapshot, before the freeze, is the next one's whole delta */
		sl->vouched = j->traced;
	}
	if (j->q.op == ENV_OP_RESTORE || j->q.op == ENV_OP_REBUILD)
		sl->vouched = false; /* a new tree, watched anew (or not at all) */
	/* a restore watched before CRIU put its tasks in: the tracer saw everything since the
	 * restored checkpoint (issue 23 item 2) */
	if (j->q.op == ENV_OP_RESTORE && j->r >= 0 && j->rewatched)
		sl->vouched = true;
	if (j->q.op == ENV_OP_CHECKPOINT)
		job_report_checkpoint(s, j);
	if (j->q.op == ENV_OP_CHECKPOINT && j->r >= 0 && j->have_manifest)
		envs_count_kind(s->envs, j->m.kind);
	if (j->created) {
		sl->env = j->created;
		snprintf(sl->root, sizeof(sl->root), "%s", sl->env->root);
		snprintf(sl->cgroup, sizeof(sl->cgroup), "%s", sl->env->cgroup);
		snprintf(sl->log_path, sizeof(sl->log_path), "%s/sidelog.mpk", sl->env->dir);
		(void)slot_watch(s, sl);
	}
	if (j->q.op == ENV_OP_FORK) {
		forks_done(s, c, j);
		return;
	}
	if (j->r < 0) {
		if (!sl->env && (j->q.op == ENV_OP_CREATE || j->q.op == ENV_OP_ADOPT))
			slot_remove(s->envs, sl);
		if (j->q.op == ENV_OP_CHECKPOINT)
			dirty_restore(sl, j);
		if (j->q.op == ENV_OP_REBUILD && sl->env && !sl->trace_id)
			(void)slot_watch(s, sl);
		if (j->q.op == ENV_OP_RESTORE && j->rewatched && sl->env) {
			/* going back to the head made yet another cgroup */
			slot_unwatch(s->envs, sl);
			(void)slot_watch(s, sl);
		}
		job_report_failure(s, c, j);
		return;
	}
	switch (j->q.op) {
	case ENV_OP_DESTROY:
		slot_remove(s->envs, sl);
		sl = NULL;
		break;
	case ENV_OP_RESTORE:
	case ENV_OP_REBUILD:
		if (j->q.op == ENV_OP_RESTORE && j->rewatched)
			break; /* watched since its fresh cgroup was made */
		/* The tree is new: the tracer's view restarts with it (the cgroup is new too). */
		slot_unwatch(s->envs, sl);
		(void)slot_watch(s, sl);
		break;
	default:
		break;
	}
	log_info("Environment %s: %s done in %" PRIu64 " ms.", j->q.env, env_op_to_string(j->q.op),
		 j->us / 1000);
	if (!c)
		return;
	if (j->have_manifest)
		info_of_manifest(j->q.env, &j->m, j->us, &m);
	else if (sl)
		info_of_env(sl, &m);
	if (j->have_manifest || sl)
		(void)client_send(s, c, &m);
	(void)send_end(s, c, j->have_manifest || sl ? 1 : 0);
}

struct env_job *env_job_new(struct supervisor *s, struct sv_client *c, struct env_slot *sl,
			    const struct proto_env_request *q)
{
	struct env_job *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	j->job.lane = OFFLOAD_ENV;
	j->job.run = job_run;
	j->job.done = job_done;
	j->job.free = job_free;
	j->client = c ? c->serial : 0; /* 0: the policy's, nobody to answer */
	j->slot = sl;
	j->sv = s;
	j->q = *q;
	snprintf(j->state_dir, sizeof(j->state_dir), "%s", s->config.state_dir);
	snprintf(j->cgroup_parent, sizeof(j->cgroup_parent), "%s", s->config.env_cgroup);
	snprintf(j->criu, sizeof(j->criu), "%s", sv_criu_binary(s->config.env_criu) ?: "criu");
	j->p = (struct env_params){
		.id = j->q.env,
		.base = j->q.root[0] ? j->q.root : NULL,
		.image = j->q.op == ENV_OP_CREATE && j->q.image[0] ? j->q.image : NULL,
		.error = j->why,
		.error_cap = sizeof(j->why),
		.cmd = j->q.cmd,
		.state_dir = j->state_dir,
		.cgroup_parent = j->cgroup_parent,
		.criu = j->criu,
		.keep = s->config.env_keep,
		.ghost_limit = (uint32_t)s->config.env_ghost_limit,
		.limits = {.pids = limit_or(j->q.pids, s->config.env_pids_max),
			   .memory = limit_or(j->q.memory, s->config.env_memory_max),
			   .cpu_millis = (uint32_t)limit_or(j->q.cpu_millis, s->config.env_cpu_max),
			   .disk = limit_or(j->q.disk, s->config.env_disk_max)},
		.net = j->q.net ? (enum env_net)j->q.net : (enum env_net)s->config.env_net,
		.slirp4netns = s->config.env_slirp4netns,
		.userns_base = s->config.env_userns ? s->config.env_userns_base : 0,
	};
	j->et = s->envs->et;
	j->watch = sl->trace_id;
	sl->busy = true;
	return j;
}

/* j->dirty_paths as the FS phase takes them. */
static int job_fs_dirty(struct env_job *j)
{
	struct env_fs_dirty *a = reallocarray(j->fs_dirty, j->n_dirty + 1, sizeof(*a));

	if (!a)
		return -ENOMEM;
	for (size_t i = 0; i < j->n_dirty; i++)
		a[i] = (struct env_fs_dirty){.path = j->dirty_paths[i],
					     .subtree = dirty_path_subtree(j->dirty_paths[i])};
	j->fs_dirty = a;
	j->n_fs_dirty = j->n_dirty;
	return 0;
}

void env_job_take_late(struct supervisor *s, struct env_job *j)
{
	struct env_slot *sl = j->slot;
	struct envtrace_env_stats st;
	struct dirty_item *items = NULL;
	const char *reason = NULL;
	size_t n = 0, old = j->n_dirty;
	char **a;

	envs_drain(s);
	if (j->ho_rewatch) {
		/* a restore's fresh cgroup, before CRIU puts the tasks in: what they do from
		 * their first instruction on is seen (the old watch's cgroup is gone) */
		slot_unwatch(s->envs, sl);
		j->rewatched = slot_watch(s, sl) >= 0 && sl->trace_id;
		return;
	}
	if (j->ho_fork) {
		/* a fork's, the same: its slot watched before its tasks run (forks_done) */
		for (size_t i = 0; i < j->n_forks; i++) {
			struct env_slot *f = j->fork_slots[i];

			if (strcmp(f->id, j->ho_fork->id) != 0)
				continue;
			snprintf(f->root, sizeof(f->root), "%s", j->ho_fork->root);
			snprintf(f->cgroup, sizeof(f->cgroup), "%s", j->ho_fork->cgroup);
			snprintf(f->log_path, sizeof(f->log_path), "%s/sidelog.mpk",
				 j->ho_fork->dir);
			slot_unwatch(s->envs, f);
			(void)slot_watch(s, f);
		}
		return;
	}
	if (!sl->dirty || !s->envs->et) {
		snprintf(j->full_reason, sizeof(j->full_reason), "%s", "the tracer stopped");
		return;
	}
	if (envtrace_env_stats(s->envs->et, sl->trace_id, &st) >= 0)
		dirty_note_drops(sl->dirty, st.drops);
	if (dirty_needs_full_diff(sl->dirty, &reason)) {
		snprintf(j->full_reason, sizeof(j->full_reason), "%s", reason ? reason : "tracer");
		return;
	}
	if (dirty_list(sl->dirty, &items, &n) < 0)
		goto oom;
	a = reallocarray(j->dirty_paths, old + n + 1, sizeof(*a));
	if (!a)
		goto oom;
	j->dirty_paths = a;
	if (j->n_late + n > j->cap_late) {
		size_t cap = j->n_late + n + 16;
		struct env_fs_dirty *l = reallocarray(j->late_fs, cap, sizeof(*l));

		if (!l)
			goto oom;
		j->late_fs = l;
		j->cap_late = cap;
	}
	for (size_t i = 0; i < n; i++) {
		const char *p = items[i].path;
		char **hit = bsearch(&p, j->dirty_paths, old, sizeof(*j->dirty_paths), cmp_str_ptr);
		size_t len = strlen(p);

		if (hit) {
			if (items[i].subtree)
				(*hit)[strlen(*hit) + 1] = '1';
			/* the string stays where it is: the pre-copy's list may point at it */
			j->late_fs[j->n_late++] =
				(struct env_fs_dirty){.path = *hit, .subtree = items[i].subtree};
			continue;
		}
		j->dirty_paths[j->n_dirty] = malloc(len + 2);
		if (!j->dirty_paths[j->n_dirty])
			goto oom;
		memcpy(j->dirty_paths[j->n_dirty], p, len + 1);
		j->dirty_paths[j->n_dirty][len + 1] = items[i].subtree ? '1' : '0';
		j->late_fs[j->n_late++] = (struct env_fs_dirty){.path = j->dirty_paths[j->n_dirty],
								.subtree = items[i].subtree};
		j->n_dirty++;
	}
	free(items);
	if (j->ho_reset) {
		/* a pre-copy round: what comes from now on is the next round's (or the frozen
		 * phase's); a file still open for writing is dirty again at once */
		dirty_reset(sl->dirty);
		(void)dirty_rescan_writers(sl->dirty, sl->cgroup, sl->root[0] ? sl->root : NULL);
	}
	qsort(j->dirty_paths, j->n_dirty, sizeof(*j->dirty_paths), cmp_str_ptr);
	if (job_fs_dirty(j) < 0)
		snprintf(j->full_reason, sizeof(j->full_reason), "%s", "out of memory");
	return;
oom:
	free(items);
	snprintf(j->full_reason, sizeof(j->full_reason), "%s", "out of memory");
}

/* Snapshot the dirty set for the checkpoint, then start a new one (loop thread). */
int env_job_snapshot_dirty(struct supervisor *s, struct env_slot *sl, struct env_job *j)
{
	struct envtrace_env_stats st;
	struct dirty_item *items = NULL;
	const char *reason = NULL;
	size_t n = 0;
	int r;

	if (!sl->dirty || !s->envs->et)
		return 0;
	envs_drain(s);
	if (envtrace_env_stats(s->envs->et, sl->trace_id, &st) >= 0)
		dirty_note_drops(sl->dirty, st.drops);
	if (dirty_needs_full_diff(sl->dirty, &reason))
		snprintf(j->full_reason, sizeof(j->full_reason), "%s", reason ? reason : "tracer");
	r = dirty_list(sl->dirty, &items, &n);
	if (r < 0)
		return r;
	j->dirty_paths = calloc(n + 1, sizeof(*j->dirty_paths));
	if (!j->dirty_paths) {
		free(items);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(items[i].path);

		/* The subtree flag after the path's NUL: bsearch's strcmp sees the path only. */
		j->dirty_paths[i] = malloc(len + 2);
		if (!j->dirty_paths[i]) {
			free(items);
			return -ENOMEM;
		}
		memcpy(j->dirty_paths[i], items[i].path, len + 1);
		j->dirty_paths[i][len + 1] = items[i].subtree ? '1' : '0';
		j->n_dirty++;
	}
	free(items);
	qsort(j->dirty_paths, j->n_dirty, sizeof(*j->dirty_paths), cmp_str_ptr);
	j->traced = true;
	j->vouched = sl->vouched;
	r = job_fs_dirty(j);
	if (r < 0)
		return r;
	dirty_reset(sl->dirty);
	sl->full_diff_of_dump = false;
	(void)dirty_rescan_writers(sl->dirty, sl->cgroup, sl->root[0] ? sl->root : NULL);
	return 0;
}

/* --- requests ---------------------------------------------------------------------------- */

/* A checkpoint of an environment unchanged since its head (issue 23 item 3): none is taken;
 * the reply is the head's manifest, kind "skipped" (a trajectory named is told the head
 * protects its turn). */
static int reply_skipped(struct supervisor *s, struct sv_client *c, struct env_slot *sl,
			 const struct proto_env_request *q)
{
	const struct sv_env *e = sl->env;
	uint64_t t0 = mono_us();
	struct env_manifest mf = {0};
	const struct env_manifest *head = NULL;
	struct proto_msg m;

	if (e->head_valid && strcmp(e->head_index.id, e->head) == 0) {
		head = &e->head_index;
	} else {
		char dir[PATH_MAX];
		_cleanup_close_ int dfd = -1;

		snprintf(dir, sizeof(dir), "%s/ckpt/%s", e->dir, e->head);
		dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (dfd >= 0 && env_manifest_load(dfd, "manifest.mpk", &mf) >= 0)
			head = &mf;
	}
	if (!head)
		return client_send_error(s, c, ENOENT, PROTO_ENV_REQUEST,
					 "env %s checkpoint: its head %s is unreadable", q->env,
					 e->head);
	info_of_manifest(q->env, head, mono_us() - t0, &m);
	snprintf(m.env_info.kind, sizeof(m.env_info.kind), "%s", ENV_KIND_SKIPPED);
	/* nothing was frozen, copied or dumped by this request */
	m.env_info.freeze_us = m.env_info.dump_us = m.env_info.fs_us = m.env_info.commit_us = 0;
	m.env_info.fs_bytes = m.env_info.fs_files = m.env_info.criu_bytes = 0;
	if (q->trajectory[0]) {
		struct envs_ckpt_result res = {.committed = true, .run_us = m.env_info.total_us};

		snprintf(res.id, sizeof(res.id), "%s", e->head);
		traj_ctl_env_checkpointed(s, q->env, q->trajectory, &res);
	}
	log_info("Environment %s: checkpoint skipped (unchanged since %s).", q->env, e->head);
	envs_count_kind(s->envs, ENV_KIND_SKIPPED);
	env_manifest_finish(&mf);
	if (client_send(s, c, &m) < 0)
		return -ECONNRESET;
	return send_end(s, c, 1);
}

static int reply_list(struct supervisor *s, struct sv_client *c, const char *env)
{
	struct proto_msg m;
	uint32_t n = 0;

	if (!env[0]) {
		for (struct env_slot *sl = s->envs->slots; sl; sl = sl->next, n++) {
			info_of_env(sl, &m);
			if (client_send(s, c, &m) < 0)
				return -ECONNRESET;
		}
		return send_end(s, c, n);
	}
	{
		struct env_slot *sl = env_slot_find(s->envs, env);
		char **ids = NULL;
		size_t k = 0;
		int r;

		if (!sl || !sl->env)
			return client_send_error(s, c, ENOENT, PROTO_ENV_REQUEST,
						 "no environment %s", env);
		if (sl->busy)
			return client_send_error(s, c, EBUSY, PROTO_ENV_REQUEST, "%s is busy", env);
		r = env_checkpoints(sl->env, &ids, &k);
		if (r < 0)
			return client_send_error(s, c, -r, PROTO_ENV_REQUEST, "%s", strerror(-r));
		for (size_t i = 0; i < k; i++) {
			char dir[PATH_MAX];
			struct env_manifest mf;
			int dfd;

			snprintf(dir, sizeof(dir), "%s/ckpt/%s", sl->env->dir, ids[i]);
			dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (dfd >= 0 && env_manifest_load(dfd, "manifest.mpk", &mf) >= 0) {
				info_of_manifest(env, &mf, 0, &m);
				env_manifest_finish(&mf);
				if (client_send(s, c, &m) >= 0)
					n++;
			}
			if (dfd >= 0)
				(void)close(dfd);
			free(ids[i]);
		}
		free(ids);
		return send_end(s, c, n);
	}
}

static int reply_dirty(struct supervisor *s, struct sv_client *c, struct env_slot *sl)
{
	struct dirty_item *items = NULL;
	const char *reason = NULL;
	size_t n = 0;
	uint32_t sent = 0;
	int r;

	if (!sl->dirty)
		return client_send_error(s, c, ENODATA, PROTO_ENV_REQUEST,
					 "%s is not traced (BPF unavailable or [env] trace=no)",
					 sl->id);
	envs_drain(s);
	if (dirty_needs_full_diff(sl->dirty, &reason)) {
		send_item(s, c, "full_diff", 0, 0, NULL, NULL, reason);
		sent++;
	}
	r = dirty_list(sl->dirty, &items, &n);
	if (r < 0)
		return client_send_error(s, c, -r, PROTO_ENV_REQUEST, "%s", strerror(-r));
	for (size_t i = 0; i < n; i++, sent++)
		send_item(s, c, items[i].subtree ? "dirty" : "dirty_self", 0, 0, items[i].path,
			  NULL, NULL);
	free(items);
	return send_end(s, c, sent);
}

struct log_ctx {
	struct supervisor *s;
	struct sv_client *c;
	uint32_t n;
};

static int log_entry(const struct sidelog_entry *e, void *userdata)
{
	struct log_ctx *lc = userdata;
	char text[PROTO_MAX_STR + 1] = "";
	size_t o = 0;

	if (strcmp(e->kind, "exec") == 0)
		for (size_t i = 0; i < e->argc && o + 2 < sizeof(text); i++)
			o += (size_t)snprintf(text + o, sizeof(text) - o, "%s%s", i ? " " : "",
					      e->argv[i]);
	else if (e->op)
		snprintf(text, sizeof(text), "%s", e->op);
	else if (e->reason)
		snprintf(text, sizeof(text), "%s", e->reason);
	send_item(lc->s, lc->c, e->kind, (uint32_t)e->pid, e->ts_ns,
		  strcmp(e->kind, "exec") == 0 ? e->exe : e->path, e->path2, text);
	lc->n++;
	return 0;
}

static int reply_log(struct supervisor *s, struct sv_client *c, struct env_slot *sl, uint32_t flags)
{
	struct log_ctx lc = {.s = s, .c = c};
	int r;

	if (!sl->log)
		return client_send_error(s, c, ENODATA, PROTO_ENV_REQUEST,
					 "%s is not traced (BPF unavailable or [env] trace=no)",
					 sl->id);
	envs_drain(s);
	r = sidelog_read(sl->log_path, log_entry, &lc);
	if (r < 0 && r != -ENOENT)
		return client_send_error(s, c, -r, PROTO_ENV_REQUEST, "%s", strerror(-r));
	if (flags & ENV_FLAG_FOLLOW) {
		size_t i;

		for (i = 0;
		     i < MAX_FOLLOWERS && sl->followers[i] && client_by_serial(s, sl->followers[i]);
		     i++)
			;
		if (i == MAX_FOLLOWERS)
			return client_send_error(s, c, EUSERS, PROTO_ENV_REQUEST,
						 "%d followers already", MAX_FOLLOWERS);
		sl->followers[i] = c->serial;
	}
	return send_end(s, c, lc.n);
}

static int do_watch(struct supervisor *s, struct sv_client *c, const struct proto_env_request *q)
{
	struct sv_envs *es = s->envs;
	struct env_slot *sl;
	struct proto_msg m;
	char id[ENV_ID_MAX + 1];

	tracer_load(s);
	if (!es->et)
		return client_send_error(s, c, ENODATA, PROTO_ENV_REQUEST,
					 "tracing is off (BPF unavailable or [env] trace=no)");
	if (q->env[0])
		snprintf(id, sizeof(id), "%s", q->env);
	else
		snprintf(id, sizeof(id), "watch%u", ++es->next_watch);
	if (!env_id_valid(id) || env_slot_find(es, id))
		return client_send_error(s, c, EEXIST, PROTO_ENV_REQUEST, "%s: taken or invalid",
					 id);
	sl = calloc(1, sizeof(*sl));
	if (!sl)
		return client_send_error(s, c, ENOMEM, PROTO_ENV_REQUEST, "out of memory");
	snprintf(sl->id, sizeof(sl->id), "%s", id);
	snprintf(sl->cgroup, sizeof(sl->cgroup), "%s", q->root);
	snprintf(sl->log_path, sizeof(sl->log_path), "%s/watch-%s.sidelog.mpk", s->config.state_dir,
		 id);
	(void)unlink(sl->log_path);
	sl->next = es->slots;
	es->slots = sl;
	if (slot_watch(s, sl) < 0 || !sl->trace_id) {
		slot_remove(es, sl);
		return client_send_error(s, c, EINVAL, PROTO_ENV_REQUEST, "cannot watch %s",
					 q->root);
	}
	info_of_env(sl, &m);
	(void)client_send(s, c, &m);
	return send_end(s, c, 1);
}

/* A fork's new slots, busy (refused when a name is taken or invalid: the source's slot freed
 * again and the job dropped, the client answered). */
static int fork_slots(struct supervisor *s, struct sv_client *c, struct env_job *j)
{
	uint32_t n = j->q.count ? j->q.count : 1;
	int r = 0;

	for (uint32_t i = 0; i < n && r == 0; i++) {
		char id[80];
		struct env_slot *sl;

		if (n == 1)
			snprintf(id, sizeof(id), "%s", j->q.dst);
		else
			snprintf(id, sizeof(id), "%s-%" PRIu32, j->q.dst, i + 1);
		if (!env_id_valid(id))
			r = client_send_error(s, c, EINVAL, PROTO_ENV_REQUEST,
					      "fork: invalid id \"%s\"", id)
				    ?: -1;
		else if (env_slot_find(s->envs, id))
			r = client_send_error(s, c, EEXIST, PROTO_ENV_REQUEST,
					      "fork: environment %s exists", id)
				    ?: -1;
		else if (!(sl = calloc(1, sizeof(*sl))))
			r = client_send_error(s, c, ENOMEM, PROTO_ENV_REQUEST, "out of memory")
				    ?: -1;
		if (r)
			break;
		snprintf(sl->id, sizeof(sl->id), "%s", id);
		sl->busy = true;
		sl->next = s->envs->slots;
		s->envs->slots = sl;
		j->fork_slots[j->n_forks++] = sl;
	}
	if (r == 0)
		return 0;
	for (size_t i = 0; i < j->n_forks; i++)
		slot_remove(s->envs, j->fork_slots[i]);
	j->slot->busy = false;
	job_free(&j->job);
	return -1;
}

int envs_dispatch(struct supervisor *s, struct sv_client *c, const struct proto_env_request *q)
{
	struct sv_envs *es = s->envs;
	struct env_slot *sl;
	struct env_job *j;
	bool mutating = q->op != ENV_OP_LIST && q->op != ENV_OP_DIRTY && q->op != ENV_OP_LOG;

	if (!es)
		return client_send_error(s, c, ENOTSUP, PROTO_ENV_REQUEST, "environments are off");
	if (mutating && c->cred.uid != 0 && c->cred.uid != s->uid)
		return client_refuse(s, c, REJECT_UNAUTHORIZED, EPERM, PROTO_ENV_REQUEST,
				     "env %s needs root", env_op_to_string(q->op));
	if (q->env[0] && !env_id_valid(q->env))
		return client_send_error(s, c, EINVAL, PROTO_ENV_REQUEST, "invalid id \"%s\"",
					 q->env);
	switch (q->op) {
	case ENV_OP_LIST:
		return reply_list(s, c, q->env);
	case ENV_OP_WATCH:
		return do_watch(s, c, q);
	case ENV_OP_CREATE:
	case ENV_OP_ADOPT:
		if (!q->env[0] || (!q->root[0] && !(q->op == ENV_OP_CREATE && q->image[0])) ||
		    (q->op == ENV_OP_ADOPT && (!q->cgroup[0] || !q->pid)))
			return client_send_error(s, c, EINVAL, PROTO_ENV_REQUEST,
						 "create: env and root or img; adopt: env, root, "
						 "cg, pid");
		if (env_slot_find(es, q->env))
			return client_send_error(s, c, EEXIST, PROTO_ENV_REQUEST,
						 "environment %s exists", q->env);
		/* the bounds of [env] pids_max and cpu_max (memory: any byte count) */
		if ((q->pids != ENV_LIMIT_NONE && q->pids > 4194304) ||
		    (q->cpu_millis != ENV_LIMIT_NONE && q->cpu_millis > 1024000))
			return client_send_error(s, c, EINVAL, PROTO_ENV_REQUEST,
						 "pids at most 4194304, cpu at most 1024000 "
						 "thousandths");
		/* The host's network namespace only where the operator allows it. */
		if (q->op == ENV_OP_CREATE &&
		    (q->net ? q->net : s->config.env_net) == ENV_NET_HOST &&
		    !s->config.env_allow_host_net)
			return client_send_error(
				s, c, EPERM, PROTO_ENV_REQUEST,
				"env %s: the host's network is not allowed "
				"([env] allow_host_net = no); use --net none or slirp",
				q->env);
		if (q->op == ENV_OP_CREATE &&
		    (q->net ? q->net : s->config.env_net) == ENV_NET_SLIRP &&
		    env_net_slirp_available(s->config.env_slirp4netns) < 0)
			return client_send_error(
				s, c, ENOENT, PROTO_ENV_REQUEST,
				"env %s: no slirp4netns for --net slirp (\"%s\": "
				"install Debian's slirp4netns or set [env] slirp4netns)",
				q->env, s->config.env_slirp4netns);
		sl = calloc(1, sizeof(*sl));
		if (!sl)
			return client_send_error(s, c, ENOMEM, PROTO_ENV_REQUEST, "out of memory");
		snprintf(sl->id, sizeof(sl->id), "%s", q->env);
		sl->next = es->slots;
		es->slots = sl;
		j = env_job_new(s, c, sl, q);
		if (!j) {
			slot_remove(es, sl);
			return client_send_error(s, c, ENOMEM, PROTO_ENV_REQUEST, "out of memory");
		}
		offload_submit(s, &j->job);
		return 0;
	default:
		break;
	}
	sl = env_slot_find(es, q->env);
	if (!sl)
		return client_send_error(s, c, ENOENT, PROTO_ENV_REQUEST, "no environment %s",
					 q->env);
	if (q->op == ENV_OP_DIRTY)
		return reply_dirty(s, c, sl);
	if (q->op == ENV_OP_LOG)
		return reply_log(s, c, sl, q->flags);
	if (sl->busy)
		return client_send_error(s, c, EBUSY, PROTO_ENV_REQUEST,
					 "%s: another operation runs", q->env);
	/* An exec's command is the supervisor's child with the supervisor's pipes: no dump then. */
	if (sl->execs)
		return client_send_error(s, c, EBUSY, PROTO_ENV_REQUEST,
					 "%s: %u exec or file operations run", q->env, sl->execs);
	if (!sl->env) {
		if (q->op != ENV_OP_DESTROY)
			return client_send_error(s, c, EOPNOTSUPP, PROTO_ENV_REQUEST,
						 "%s is a watch only", q->env);
		slot_remove(es, sl);
		return send_end(s, c, 0);
	}
	if (q->op == ENV_OP_CHECKPOINT && !(q->flags & ENV_FLAG_NEW_CKPT) && envs_unchanged(s, sl))
		return reply_skipped(s, c, sl, q);
	j = env_job_new(s, c, sl, q);
	if (!j)
		return client_send_error(s, c, ENOMEM, PROTO_ENV_REQUEST, "out of memory");
	if (q->op == ENV_OP_FORK && fork_slots(s, c, j) < 0)
		return 0; /* answered */
	/* The tracer holds the environment's root open (O_PATH, to resolve its paths): a rebuild
	 * or a destroy unmounts it, so tracing stops first (a rebuild's restarts when done). */
	if (q->op == ENV_OP_REBUILD || q->op == ENV_OP_DESTROY)
		slot_unwatch(es, sl);
	/* A restore rolls back by the dirty set since the head, taken once the environment is
	 * stopped (job_frozen: the same handover). */
	if (q->op == ENV_OP_RESTORE && sl->dirty && s->envs->et) {
		j->traced = true;
		j->vouched = sl->vouched;
	}
	if (q->op == ENV_OP_CHECKPOINT && env_job_snapshot_dirty(s, sl, j) < 0)
		j->traced = false; /* metadata comparison alone still catches every change */
	offload_submit(s, &j->job);
	return 0;
}
