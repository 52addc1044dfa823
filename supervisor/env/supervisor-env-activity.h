/* SPDX-License-Identifier: MIT */
/*
 * What kind of checkpoint a turn needs (issue 23 item 3): "full" (the file-system delta and a
 * CRIU dump of the processes), "fs-only" (the delta alone: no task of the environment ran user
 * code since the last dump, whose images the checkpoint references by hard links), or
 * "skipped" (nothing dirty and no activity: no checkpoint at all, the head stands for it).
 *
 * The rule is exact in the direction that matters: an fs-only checkpoint is taken only when
 * the tracer's activity counter (bpf/envtrace.bpf.c: syscalls entered and completed, the
 * freezer's own restarts excepted; signals delivered; tasks created and exited) did not move
 * since the dump it reuses, every task sat in a syscall both at that dump and now (none was
 * running user code, which no counter sees), the set of tasks (tid, start time) is the same,
 * and no file that a process holds open or mapped changed in the delta (CRIU checks an open
 * file's size at restore, and the old images hold the old one). Anything it cannot vouch for
 * (no tracer, a new watch, a restore since, an unreadable /proc) makes the checkpoint full.
 *
 * The CPU-time counters (cgroup v2 cpu.stat usage_usec, v1 cpuacct.usage) cannot decide it:
 * the freeze and thaw around every checkpoint run each task in the kernel (into and out of
 * the freezer's trap), so they advance at every turn, idle or not (see env_activity_cpu_ns,
 * logged for comparison).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "supervisor-env-fs.h"
#include "supervisor-env-manifest.h"

struct sv_env;

/* The environment's tasks as of its last CRIU dump (kept in struct sv_env). */
struct env_activity {
	bool valid;		     /* the dump's tasks were all parked in syscalls */
	uint32_t watch;		     /* the tracer's watch (trace id) whose counter it is */
	uint64_t count;		     /* that counter right after the dump, still frozen */
	uint64_t tasks;		     /* hash of the tasks' (tid, start time) */
	char ckpt[ENV_ID_MAX + 1];   /* the checkpoint committed with those images */
	char images[ENV_ID_MAX + 1]; /* the checkpoint that dumped them */
};

/* The tracer's view, from env_ckpt_params: the watch and its counter (<0: none). */
typedef int (*env_activity_fn)(void *userdata, uint32_t *ret_watch, uint64_t *ret_count);

/* The environment's tasks now: whether every one sits in a syscall (none running or caught in
 * user mode: /proc/PID/task/TID/syscall), and the hash of their (tid, start time). 1: parked,
 * 0: some task was running user code, -errno. */
int env_activity_tasks(const struct sv_env *e, uint64_t *ret_hash);
/* Whether the checkpoint being taken may keep the head's process images: e->act is the head's,
 * valid, of this watch, the counter unchanged and the tasks (parked now, tasks_hash) the same.
 * Frozen. Logs why not at debug level. *ret_count: the counter now (UINT64_MAX: unread). */
bool env_activity_unchanged(const struct sv_env *e, env_activity_fn fn, void *userdata, int parked,
			    uint64_t tasks_hash, uint64_t *ret_count);
/* Whether a file a process of e holds open, mapped, as its cwd or executable is one that
 * changed between base (the head's index) and the new checkpoint's, or was deleted: the head's
 * images would not restore against it. m: the new checkpoint's index, or (gone not NULL) the
 * dirty-set delta's partial one, a path it lacks then being base's unless gone removed it.
 * Frozen. -errno counts as changed. */
bool env_activity_open_changed(const struct sv_env *e, const struct env_manifest *base,
			       const struct env_manifest *m, const struct env_fs_gone *gone);
/* Hard-links checkpoint from's images (its criu/, env_link_images) into criufd (empty). */
int env_activity_link_images(int ckfd, const char *from, int criufd);
/* Unfrozen (a skipped checkpoint's test): e->act is the head's and valid, of watch, and
 * neither the counter (read before and after the look at the tasks) nor the tasks (all
 * parked) changed: no task ran user code since the dump. A syscall ends only through its
 * sys_exit and user code starts only from one (or was running: not parked), so nothing can
 * slip between the reads. */
bool env_activity_idle_since_dump(const struct sv_env *e, env_activity_fn fn, void *userdata);
/* After a full dump, still frozen: the new baseline (committed with checkpoint id). before: the
 * counter as the freeze completed (env_activity_unchanged's): one that moved during the dump
 * means a task ran outside CRIU's hold (whatever CRIU does with the freezer meanwhile), after
 * what the images hold: no baseline then. */
void env_activity_note_dump(struct sv_env *e, env_activity_fn fn, void *userdata, int parked,
			    uint64_t tasks_hash, uint64_t before, const char *id);

/* The cgroup's CPU time in ns (v2 cpu.stat usage_usec, else v1 cpuacct.usage), for the log. */
int env_activity_cpu_ns(const struct sv_env *e, uint64_t *ret);

/* Memory checkpoint mode (issue 23 item 3): whether the kernel tracks soft-dirty pages, as
 * CRIU's own probe (kerndat_get_dirty_track: a page just written reads soft-dirty in
 * /proc/self/pagemap, bit 55), probed once; env_mem_mode() "pre-dump" where it does (a full
 * checkpoint pre-dumps the memory while the environment runs, CRIU --track-mem, and the frozen
 * dump copies only the pages dirtied since), "full" where it does not (every dump copies all
 * memory frozen; CRIU 4.2.1 refuses --track-mem there). */
bool env_mem_dirty_track(void);
const char *env_mem_mode(void);

enum env_mem_plan {
	ENV_MEM_FULL,	  /* the frozen dump copies all memory */
	ENV_MEM_PRE_DUMP, /* pre-dumped while running; frozen, what was dirtied since */
};
/* A checkpoint's plan: a pre-dump where the kernel tracks soft-dirty pages (soft_dirty) and the
 * processes ran since the last dump (idle: env_activity_idle_since_dump; such a turn is fs-only,
 * its images the last dump's, and a pre-dump would be wasted). */
enum env_mem_plan env_mem_plan(bool soft_dirty, bool idle);
