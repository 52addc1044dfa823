/* SPDX-License-Identifier: MIT */
/*
 * An environment's file-system state, kept as its overlay upper layer (what it changed over
 * its read-only base). A checkpoint records the upper layer's index (every entry with its
 * metadata) and copies the data of regular files that changed since the parent checkpoint;
 * unchanged ones point at the checkpoint that holds their data. Restoring rebuilds the upper
 * layer from a checkpoint's index (deletions are implied: what is not in the index is gone;
 * overlay whiteouts and opaque directories are entries like any other). Every entry carries
 * its inode's extended attributes (overlay's trusted.overlay.* among them); regular files'
 * data is copied by extent, so a hole stays a hole both ways; socket inodes are entries.
 *
 * Security (issue 10 item 4): the upper layer is written by the environment; nothing here
 * follows a symlink in it: the walk opens every component with O_NOFOLLOW relative to its
 * parent's fd, files are opened O_NOFOLLOW and checked to be the regular file walked, and
 * the rebuild resolves parents with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS).
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "supervisor-env-manifest.h"

struct env_fs_stats {
	uint64_t bytes, files, removed;
};

/* Paths (relative) the caller knows changed (the eBPF dirty set): always copied, whatever
 * their metadata says. May be NULL. */
typedef bool (*env_fs_force_cb)(const char *path, void *userdata);

/*
 * Walks the upper layer (upper_fd) into out->entries. A regular file whose path, inode,
 * size, mode, mtime and ctime equal its entry in base (the parent's index, may be NULL) and
 * that force does not claim keeps base's data reference; any other is copied to
 * data_fd/<key> with out->id as its source (ret_stats->bytes: the bytes of data extents
 * copied). An entry keeps base's xattrs when base holds the same inode with the same ctime
 * (an xattr's change changes it); others' are read (-E2BIG past the manifest's bounds). A further name of an inode already seen becomes a
 * hard-link entry (copied once, by inode).
 *
 * cancel (NULL: none) is read before every entry and between ENV_FS_COPY_CHUNK pieces of a
 * file's copy: once set, -ECANCELED (what data_fd holds by then is the caller's to remove).
 * The environment is frozen during the scan, so a cancel's latency is the time of one entry or
 * one chunk: a chunk is small enough to keep that to a few milliseconds on a page-cache copy,
 * large enough that the syscalls are noise.
 */
#define ENV_FS_COPY_CHUNK (4u << 20)
int env_fs_scan(int upper_fd, const struct env_manifest *base, env_fs_force_cb force,
		void *userdata, const atomic_bool *cancel, int data_fd, struct env_manifest *out,
		struct env_fs_stats *ret_stats);

/*
 * The delta from the eBPF dirty set (issue 23 item 1), at the cost of what changed: only the
 * dirty paths, their ancestors (an overlay copy-up makes a file's directories in the upper
 * layer, unnamed by the tracer) and, for a path dirty with its subtree (created, renamed,
 * removed), what lies below it are looked at; base (the parent's index, env_manifest_index
 * built) is not walked, only looked up. What is found goes into out (a partial index: the
 * entries new or changed, every regular file among them copied as env_fs_scan copies a forced
 * one), what is gone into out_gone; env_fs_delta_apply() makes the full index of it once the
 * environment runs again. A path is gone when the upper layer no longer has it (what was below
 * it too), or when it is no longer a directory (what was below it); a path dirty with its
 * subtree takes everything base had below it, replaced by what is found there now.
 *
 * -EMLINK: a hard link is involved (a regular file of more than one name found, or a base
 * entry touched that is a hard link or the target of one): the names elsewhere are not in the
 * delta; the caller walks instead (env_fs_scan), after emptying data_fd. -ENOTRECOVERABLE: the
 * dirty set names the root itself with its subtree, or a path no index entry can have (too
 * long, not normalized): walk.
 */
struct env_fs_dirty {
	const char *path; /* as the environment sees it: "/"-rooted */
	bool subtree;
};

/* Paths whose base entries go, unless the delta has them again: the path itself and, when
 * below, everything base had under it. */
struct env_fs_gone {
	char **paths; /* relative */
	bool *below;
	size_t n, cap;
};

void env_fs_gone_finish(struct env_fs_gone *g);

int env_fs_scan_dirty(int upper_fd, const struct env_manifest *base,
		      const struct env_fs_dirty *dirty, size_t n_dirty, const atomic_bool *cancel,
		      int data_fd, struct env_manifest *out, struct env_fs_gone *out_gone,
		      struct env_fs_stats *ret_stats);
/* env_fs_scan_dirty, its copies numbered from first_key (data_fd already holds a pre-copy's,
 * supervisor-env-precopy.h). running: the environment is not frozen (a pre-copy): an entry
 * whose name vanishes or is replaced between its stat and its copy is left out (not an error),
 * its copy removed; the tracer saw that change, and the frozen phase looks at it again. */
int env_fs_scan_dirty_keyed(int upper_fd, const struct env_manifest *base,
			    const struct env_fs_dirty *dirty, size_t n_dirty,
			    const atomic_bool *cancel, int data_fd, uint64_t first_key,
			    bool running, struct env_manifest *out, struct env_fs_gone *out_gone,
			    struct env_fs_stats *ret_stats);

/* base with delta and gone applied into the empty full (delta's id and fields otherwise
 * untouched): base's order kept (a directory before what it holds, a hard link after its
 * target), an entry delta changes in its place, new ones after, parents first.
 * ret_removed: base's paths that are no longer there. */
int env_fs_delta_apply(const struct env_manifest *base, const struct env_manifest *delta,
		       const struct env_fs_gone *gone, struct env_manifest *full,
		       uint64_t *ret_removed);

/* Empties dir_fd (recursively, never following a symlink). */
int env_fs_wipe(int dir_fd);

/* Rebuilds the (empty) upper layer from m: data read from ckpts_fd/<src>/data/<key>. */
int env_fs_rebuild(int upper_fd, const struct env_manifest *m, int ckpts_fd);

/* Rolls the upper layer back (or forward) to target in place: a regular file still exactly as
 * cur (the index of the current state: the last checkpoint's or restore's, inode and ctime as
 * on disk) recorded it, whose data the target shares, stays; everything else the target does
 * not hold as it is now is removed, and what is missing is rebuilt. Same result as wiping and
 * env_fs_rebuild, at the cost of what differs. */
int env_fs_rollback(int upper_fd, const struct env_manifest *cur, const struct env_manifest *target,
		    int ckpts_fd);

/*
 * The rollback by what differs (issue 23 item 4): the upper layer, last indexed as cur (the
 * head's index, inode and ctime as on disk), made target's by the paths that changed since
 * (dirty: the tracer's since the head, "/"-rooted) and those whose entries differ between cur
 * and target (none when they are the same index): each removed and rebuilt from target (a
 * path with its subtree: all below it too), touched directories' metadata set last, deepest
 * first. target's inode and ctime are refreshed for what was rebuilt; the rest is as cur said
 * (unchanged since). -EMLINK: a hard link is among them (its other names are not): the caller
 * rolls back with env_fs_rollback, which needs nothing this left. No symlink is followed
 * (parents by openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, the rest O_NOFOLLOW).
 */
int env_fs_rollback_dirty(int upper_fd, struct env_manifest *cur, struct env_manifest *target,
			  const struct env_fs_dirty *dirty, size_t n_dirty, int ckpts_fd);

/* After a rebuild: the entries' inode and ctime as they are now, so the next scan compares
 * against the rebuilt files rather than the originals. */
int env_fs_refresh(int upper_fd, struct env_manifest *m);
