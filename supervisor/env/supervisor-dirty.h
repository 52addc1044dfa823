/* SPDX-License-Identifier: MIT */
/*
 * The paths an environment changed since its last checkpoint (DESIGN §2). No false
 * negatives: every changed path is covered; false positives are allowed.
 *
 * An entry covers the path and everything below it: a renamed or removed directory takes
 * its whole subtree with it, so the directory's entry stands for all of it. The directory
 * that gained or lost an entry is in the set too, for itself only (its mtime changed). When some change
 * cannot be named (io_uring, a writable shared mapping of a file, a lost ring-buffer record,
 * an unresolvable path), the set says "needs full diff" instead, until the next reset.
 *
 * Hard links made before the checkpoint are the caller's to handle: a change through one name
 * is recorded under that name only (links made after it are traced, and both names are in the
 * set). Whoever copies the dirty paths should treat a regular file with st_nlink > 1 by inode.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "supervisor-envtrace.h"

struct sv_dirty;

int dirty_create(struct sv_dirty **ret);
void dirty_destroy(struct sv_dirty *d);

struct dirty_item {
	const char *path;
	bool subtree; /* false: only the object itself (a directory's own mtime, size) */
};

/* path: absolute. dirty_add covers the path and its subtree; dirty_add_self only the object
 * (a directory whose entries changed). */
int dirty_add(struct sv_dirty *d, const char *path);
int dirty_add_self(struct sv_dirty *d, const char *path);
/* True when path is in the set, or one of its ancestors with its subtree. */
bool dirty_covers(const struct sv_dirty *d, const char *path);
size_t dirty_count(const struct sv_dirty *d);
/* The entries, sorted by path; free() the array only (paths valid until the next change). */
int dirty_list(const struct sv_dirty *d, struct dirty_item **ret, size_t *ret_n);

void dirty_require_full_diff(struct sv_dirty *d, const char *reason);
/* reason: the first reason since the reset (static or owned by d). */
bool dirty_needs_full_diff(const struct sv_dirty *d, const char **ret_reason);

/* Applies a record of this environment: file changes, full-diff triggers. */
int dirty_apply(struct sv_dirty *d, const struct envtrace_record *rec);
/* drops: the environment's ring-buffer drop count (envtrace_env_stats). A count that grew
 * since the last reset means lost records: full diff. */
void dirty_note_drops(struct sv_dirty *d, uint64_t drops);

/* At a checkpoint: empties the set and clears the full-diff flag (drop count kept). */
void dirty_reset(struct sv_dirty *d);
/*
 * After dirty_reset: files the environment's processes (every process in cgroup_path and the
 * cgroups below it) hold open for writing, or mapped shared and writable, can change without
 * another syscall we trace: they are dirty again from the start. Paths are read through
 * /proc (the supervisor's view); root_path (NULL: "/") is stripped from them.
 */
int dirty_rescan_writers(struct sv_dirty *d, const char *cgroup_path, const char *root_path);
