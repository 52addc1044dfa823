/* SPDX-License-Identifier: MIT */
/*
 * The daemon's environments (slots: an environment, or a watch of another runtime's cgroup)
 * and the jobs it runs on them, shared by supervisor-env-ctl.c (requests, the tracer) and
 * supervisor-env-policy.c (the checkpoint policy's side). Private to supervisor/env/.
 */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "supervisor-env-manifest.h"
#include "supervisor-env.h"
#include "supervisor-offload.h"
#include "supervisor.h"
#include "sv-policy.h"

struct sv_dirty;
struct sv_envtrace;
struct sv_sidelog;

#define MAX_FOLLOWERS 8

struct env_slot {
	struct env_slot *next;
	char id[ENV_ID_MAX + 1];
	struct sv_env *env; /* NULL: a watch of another runtime's cgroup only */
	bool busy;	    /* a job owns env */
	char cgroup[PATH_MAX], root[PATH_MAX];
	uint32_t trace_id;
	struct sv_dirty *dirty;
	/* The dirty set asked for a full diff by the end of the last checkpoint, with no path:
	 * CRIU's parasite (a shared writable mapping in the dumped tasks), not the environment. */
	bool full_diff_of_dump;
	struct sv_sidelog *log;
	char log_path[PATH_MAX];
	uint64_t followers[MAX_FOLLOWERS]; /* client serials of `env log --follow` */
	/* execs and file operations running (supervisor-env-exec.h): no job meanwhile */
	uint32_t execs;
	/* The dirty set covers everything since the head: the tracer has watched the environment
	 * without a break since that checkpoint's freeze (false after a new watch: a creation,
	 * restore, rebuild, fork, supervisor restart). Else the next checkpoint walks. */
	bool vouched;
};

struct sv_envs {
	struct env_slot *slots;
	struct sv_envtrace *et;
	bool et_tried; /* loaded, or failed once (said so, never again) */
	int (*watch_fd)(struct supervisor *s, int fd);
	uint32_t next_trace_id;
	uint32_t next_watch;
	/* Checkpoints by kind since start (enum env_ckpt_kind), belayer_env_checkpoints_total. */
	uint64_t ckpt_kinds[3];
};

struct env_job {
	struct sv_job job;
	uint64_t client;
	struct env_slot *slot;
	struct proto_env_request q;
	struct env_params p;
	char state_dir[PATH_MAX], cgroup_parent[PATH_MAX], criu[PATH_MAX];
	struct sv_env *created;
	int r;
	struct env_manifest m;
	bool have_manifest;
	/* The dirty set at the checkpoint, sorted, each "path\0S" with S its subtree flag ('1':
	 * the path and all below it, '0': the object itself), and its full-diff reason. */
	char **dirty_paths;
	size_t n_dirty;
	char full_reason[ENV_STR_MAX + 1];
	bool traced;
	uint64_t us;
	/* Checkpoints: the policy's handle (NULL: a client's request), the job's start and the
	 * thaw on the offload thread's clock (thaw 0: never froze). */
	struct envs_policy_ckpt *policy;
	uint64_t run_start_us, thaw_at_us;
	/* A fork (ENV_OP_FORK): the new environments' slots (busy until done), the forks made
	 * (all or none), why one failed. */
	struct env_slot *fork_slots[ENV_FORK_MAX];
	struct sv_env *forks[ENV_FORK_MAX];
	size_t n_forks;
	char why[ENV_ERROR_MAX];
	/* The tracer and the slot's watch as the job began (issue 23 item 3: its activity). */
	struct sv_envtrace *et;
	uint32_t watch;
	/* Checkpoints: the slot vouched at the snapshot; the freeze handover's (supervisor-env-
	 * handover.h) list link and answer; dirty_paths as the FS phase takes them. */
	bool vouched;
	struct supervisor *sv;
	struct env_job *ho_next;
	bool ho_done;
	struct env_fs_dirty *fs_dirty;
	size_t n_fs_dirty;
	/* Pre-copy (supervisor-env-precopy.h): the paths gained since the last pre-copy round's
	 * set (pointing into dirty_paths), and whether the next handover restarts the slot's
	 * set (a pre-copy round's: what comes after it is the next round's). */
	struct env_fs_dirty *late_fs;
	size_t n_late, cap_late;
	bool ho_reset;
	/* Restores: the next handover watches the slot's fresh cgroup instead (before CRIU
	 * restores into it); rewatched: it did. */
	bool ho_rewatch, rewatched;
	/* A fork's: the new environment to watch instead (its slot's root, cgroup and log
	 * taken from it). */
	const struct sv_env *ho_fork;
};

struct env_slot *env_slot_find(struct sv_envs *es, const char *id);
/* A job of request q on slot sl for client c (NULL: the policy's), the slot busy from then on;
 * NULL when out of memory. */
struct env_job *env_job_new(struct supervisor *s, struct sv_client *c, struct env_slot *sl,
			    const struct proto_env_request *q);
/* The slot of an exec or file request (type) from c for env: the client may (root), the
 * environment exists, runs and has no job; NULL after an error reply (supervisor-env-exec.c). */
struct env_slot *env_slot_ready(struct supervisor *s, struct sv_client *c, const char *env,
				enum proto_type type);
/* Snapshots the dirty set for the checkpoint into j, then starts a new one (loop thread). */
int env_job_snapshot_dirty(struct supervisor *s, struct env_slot *sl, struct env_job *j);

enum env_ckpt_kind {
	ENV_CKPT_FULL,
	ENV_CKPT_FS_ONLY,
	ENV_CKPT_SKIPPED
};
/* Counts a checkpoint of kind (ENV_KIND_*) in es->ckpt_kinds. */
void envs_count_kind(struct sv_envs *es, const char *kind);
/* belayer_env_checkpoints_total{kind}, belayer_env_memory_soft_dirty (the subsystem's
 * collect_metrics). */
void envs_collect_metrics(struct supervisor *s, struct metrics_collector *col);

/* Checkpoint kinds (supervisor-env-kinds.c, issue 23 item 3), loop thread: no file dirty since
 * the head; no process ran since the head's dump; both (a checkpoint is "skipped"). */
bool envs_files_unchanged(struct supervisor *s, struct env_slot *sl);
bool envs_processes_unchanged(struct supervisor *s, struct env_slot *sl);
bool envs_unchanged(struct supervisor *s, struct env_slot *sl);
/* The tracer's activity counter of a watch (-ENODEV: none). */
int envs_activity_of(struct sv_envtrace *et, uint32_t watch, uint64_t *ret);
/* env_activity_fn of a checkpoint job (userdata: the job). */
int env_job_activity(void *userdata, uint32_t *ret_watch, uint64_t *ret_count);
/* Loop thread, the environment frozen: the tracer drained, what the slot's set gained since
 * the snapshot added to j's (left in the slot's too: dirty again at the next checkpoint, a
 * false positive at worst), a full diff it asks for into j->full_reason. */
void env_job_take_late(struct supervisor *s, struct env_job *j);
