/* SPDX-License-Identifier: MIT */
/*
 * Pre-copy (issue 23 item 2): the dirty set's files copied while the environment runs, so that
 * the frozen FS phase re-copies only what was dirtied during that copy.
 *
 * Round 0 copies the dirty set the checkpoint's job snapshotted (everything since the parent
 * checkpoint, up to the snapshot); each further round takes what the tracer saw dirtied since
 * the previous round's set was taken (the slot's set, restarted then) and copies it again, as
 * long as that set shrinks (at most ENV_PRECOPY_ROUNDS rounds). The frozen phase then takes the
 * paths dirtied since the last round's set was taken, up to the freeze, and copies them once
 * more: a path's last copy is the frozen one whenever it changed after its pre-copy began, so
 * the checkpoint is exactly the dump's instant (the tracer has no false negatives, and a file
 * still open for writing when a set is taken is dirty again in the next one). Each round's
 * result replaces the previous rounds' entries for what it looked at (env_precopy_merge);
 * their superseded copies are removed from the data directory.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "supervisor-env-fs.h"

#define ENV_PRECOPY_ROUNDS 4
/* A re-dirtied set this small is left to the frozen phase: another round costs more than it
 * saves. */
#define ENV_PRECOPY_SMALL 64

struct env_ckpt_params;

struct env_precopy {
	bool done;		   /* delta, gone, stats hold the pre-copy's result */
	struct env_manifest delta; /* partial index relative to the parent (env_fs_scan_dirty) */
	struct env_fs_gone gone;
	struct env_fs_stats st;
	uint64_t next_key; /* the data directory's next free key */
	unsigned rounds;
	uint64_t us;	     /* time spent, the environment running */
	size_t last_n;	     /* paths of the last round */
	uint64_t last_files; /* entries the last round copied or recorded */
};

void env_precopy_finish(struct env_precopy *pc);

/* Environment running: the rounds, into data_fd, pc->delta's id set to id. base: the parent's
 * index (env_manifest_index built). 0 with pc->done false when the tracer cannot vouch or the
 * dirty set is one env_fs_scan_dirty refuses (data_fd emptied: the frozen phase decides);
 * -ECANCELED when p->cancel was seen set. */
int env_precopy_run(const struct env_ckpt_params *p, const struct env_manifest *base, int upper_fd,
		    int data_fd, const char *id, struct env_precopy *pc);

/* late (what a later pass found for its paths, late_gone the paths it looked at) takes pc's
 * entries for everything it did not look at; pc's gone paths are appended to late_gone. The
 * copies of pc's entries dropped are unlinked from data_fd. pc is emptied. */
int env_precopy_merge(struct env_precopy *pc, struct env_manifest *late,
		      struct env_fs_gone *late_gone, int data_fd);
