/* SPDX-License-Identifier: MIT */
/*
 * A checkpoint's manifest (DESIGN §2), one msgpack map in <checkpoint>/manifest.mpk:
 *   "v": 1, "id", "parent" ("" for the first of a chain), "env", "uuid" (bin[16]: the
 *   environment's identity; a checkpoint is restored only into the environment whose uuid it
 *   carries), "traj", "turn", "plen" (token-prefix length), "phash" (its hash), "ts" (µs,
 *   realtime), "full" (the FS delta came from a full diff), "why" (why a full diff),
 *   sizes: "fsb" (bytes copied), "fsn" (files copied), "fsrm" (paths removed since the parent),
 *   "criub" (CRIU image bytes), "nproc" (processes dumped), timings (µs): "frz" (frozen),
 *   "dump" (CRIU), "fs" (delta copy), "commit" (fsync + rename), "from" (optional: a fork's
 *   first checkpoint, "ENV/CHECKPOINT" it was forked from; issue 20 item 4), "kind" (optional:
 *   "full" or "fs-only", issue 23 item 3) and "img" (optional: the checkpoint whose CRIU dump
 *   the images are), "pcr", "pcb", "pcfb" (optional, present when the delta was pre-copied:
 *   issue 23 item 2, supervisor-env-precopy.h: the rounds run before the freeze, the bytes they
 *   copied, the bytes copied again frozen),
 *   "fs_index": array of the upper layer's entries at this checkpoint, in walk order (a
 *   directory before what it holds), each a map: "p" path (relative, no "."/".." or empty
 *   components), "k" kind (enum env_entry_kind), "m" mode, "u" uid, "g" gid, "s" size,
 *   "mt" mtime ns, "ct" ctime ns, "ino", "tgt" (symlink target), "hl" (an earlier path of
 *   the same inode: a hard link), "src" (id of the checkpoint holding the data), "dk" (data
 *   key: <src>/data/<dk>), "opq" (overlay opaque directory: its trusted.overlay.opaque, also
 *   in "xa"; an older writer's "opq" alone still restores it), "xa" (the inode's extended
 *   attributes, every namespace, overlay's own trusted.overlay.* included: a map of name to
 *   bin value; absent when none, and on hard links: the inode's are on its first name).
 * The decoder is bounded (file size, entry count, string lengths, xattrs per entry and in
 * all), type- and range-checks every field and refuses anything else with -EBADMSG; it is
 * fuzzed (tests/fuzz).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ENV_MANIFEST_VERSION	 1
#define ENV_MANIFEST_MAX_BYTES	 (64u << 20)
#define ENV_MANIFEST_MAX_ENTRIES 1000000u
#define ENV_ID_MAX		 63
#define ENV_PATH_MAX		 4095
#define ENV_STR_MAX		 255
/* Extended attributes: the kernel's own limits for a name and a value (XATTR_NAME_MAX,
 * XATTR_SIZE_MAX); per entry at most ENV_XATTRS_MAX of them and ENV_XATTR_ENTRY_BYTES of names
 * and values, per manifest ENV_XATTR_TOTAL_BYTES (a scan that meets more fails with -E2BIG
 * rather than drop any). */
#define ENV_XATTR_NAME_MAX    255
#define ENV_XATTR_VALUE_MAX   65536
#define ENV_XATTRS_MAX	      64
#define ENV_XATTR_ENTRY_BYTES (256u << 10)
#define ENV_XATTR_TOTAL_BYTES (16u << 20)

enum env_entry_kind {
	ENV_ENTRY_DIR = 0,
	ENV_ENTRY_REG = 1,
	ENV_ENTRY_SYMLINK = 2,
	ENV_ENTRY_WHITEOUT = 3, /* overlay: a lower file deleted (char device 0:0) */
	ENV_ENTRY_FIFO = 4,
	ENV_ENTRY_HARDLINK = 5, /* a regular file's further name ("hl") */
	ENV_ENTRY_SOCKET = 6,	/* a unix socket's inode (its server's state is CRIU's) */
	_ENV_ENTRY_KIND_MAX,
};

struct env_xattr {
	char *name;
	void *value;
	uint32_t len;
};

struct env_entry {
	char *path;
	enum env_entry_kind kind;
	uint32_t mode, uid, gid;
	uint64_t size, mtime_ns, ctime_ns, ino;
	char *target;		  /* symlink */
	char *hardlink;		  /* hardlink */
	char src[ENV_ID_MAX + 1]; /* reg */
	uint64_t data_key;	  /* reg */
	bool opaque;		  /* dir */
	struct env_xattr *xattrs; /* any kind but hardlink */
	uint32_t n_xattrs;
};

/* A checkpoint's kind (issue 23 item 3, supervisor-env-activity.h): "full" (FS delta and CRIU
 * dump), "fs-only" (FS delta; the processes' images those of checkpoint "img", hard-linked);
 * "skipped" is never stored: it is a reply's (no checkpoint taken). */
#define ENV_KIND_MAX	 15
#define ENV_KIND_FULL	 "full"
#define ENV_KIND_FS_ONLY "fs-only"
#define ENV_KIND_SKIPPED "skipped"

/* The decoder's bound on "pcr" (supervisor-env-precopy.h runs at most ENV_PRECOPY_ROUNDS). */
#define ENV_PRECOPY_ROUNDS_MAX 255

#define ENV_DELTA_PATH_MAX	 15
#define ENV_DELTA_PATH_WALK	 "walk"
#define ENV_DELTA_PATH_DIRTY_SET "dirty-set"

struct env_manifest {
	char id[ENV_ID_MAX + 1];
	char parent[ENV_ID_MAX + 1];
	char env[ENV_ID_MAX + 1];
	uint8_t uuid[16];
	char trajectory[ENV_STR_MAX + 1];
	uint64_t turn, prefix_tokens, prefix_hash, ts_us;
	bool full_diff;
	char full_diff_reason[ENV_STR_MAX + 1];
	uint64_t fs_bytes, fs_files, fs_removed, criu_bytes, nproc;
	uint64_t freeze_us, dump_us, fs_us, commit_us;
	char from[ENV_STR_MAX + 1]; /* "" or "ENV/CHECKPOINT": the fork's source */
	struct env_entry *entries;
	size_t n_entries, cap_entries;
	size_t xattr_bytes; /* names and values of every entry's xattrs */
	/* How the file-system delta was computed (ENV_DELTA_PATH_*): "walk" (the whole upper
	 * layer) or "dirty-set" (the tracer's paths only); "" in manifests from before it. */
	char delta_path[ENV_DELTA_PATH_MAX + 1];
	/* ENV_KIND_FULL or ENV_KIND_FS_ONLY ("kind"; "" in manifests from before it: full), and
	 * the checkpoint whose CRIU dump its criu/ holds ("img": its own id for a full one). */
	char kind[ENV_KIND_MAX + 1];
	char images[ENV_ID_MAX + 1];
	/* Pre-copy ("pcr", "pcb", "pcfb"): the rounds that copied the dirty set while the
	 * environment ran (0: none, every copy was made frozen; at most ENV_PRECOPY_ROUNDS_MAX),
	 * the bytes those rounds copied, and the bytes copied again frozen (what was dirtied
	 * meanwhile, and /tmp). fs_bytes is their sum. */
	uint64_t precopy_rounds, precopy_bytes, precopy_frozen_bytes;
	/* NULL, or the entries sorted by path (env_manifest_index): a cache, never encoded,
	 * dropped by env_manifest_add and env_manifest_finish. */
	const struct env_entry **by_path;
	/* With by_path: the paths hard links name (their targets), sorted. */
	const char **link_targets;
	size_t n_link_targets;
};

/* A name usable as an environment or checkpoint id: 1..ENV_ID_MAX of [A-Za-z0-9_.-], not
 * starting with '.'. */
bool env_id_valid(const char *id);
/* A relative path inside the root: no leading '/', no empty, "." or ".." component. */
bool env_path_valid(const char *path);

void env_manifest_finish(struct env_manifest *m);
/* Appends a copy of e (strings and xattrs duplicated); -E2BIG past the entry or xattr limits,
 * -EINVAL for an xattr name that is not "<namespace>.<name>" of a namespace Linux knows. */
int env_manifest_add(struct env_manifest *m, const struct env_entry *e);
/* The entries sorted by path, built once and kept in m->by_path until m changes: the FS
 * phase looks its parent's entries up by path without sorting 100,000 of them while the
 * environment is frozen. NULL with errno set when out of memory. */
const struct env_entry **env_manifest_index(struct env_manifest *m);
/* env_manifest_index of m, taken from like's when like holds the same paths in the same order
 * (a manifest read again): O(n), no sort. */
const struct env_entry **env_manifest_index_like(struct env_manifest *m,
						 const struct env_manifest *like);
/* m's entry at path (NULL: none); by m->by_path, which must be built. */
const struct env_entry *env_manifest_find(const struct env_manifest *m, const char *path);
/* A hard link of m names path (by m->link_targets, built with by_path). */
bool env_manifest_link_target(const struct env_manifest *m, const char *path);
void env_xattrs_free(struct env_xattr *x, uint32_t n);
/* An entry's xattr (NULL: none of that name). */
const struct env_xattr *env_entry_xattr(const struct env_entry *e, const char *name);

int env_manifest_encode(const struct env_manifest *m, char **ret_buf, size_t *ret_len);
int env_manifest_decode(const void *buf, size_t len, struct env_manifest *ret);

/* Reads and validates dirfd/name (at most ENV_MANIFEST_MAX_BYTES). */
int env_manifest_load(int dirfd, const char *name, struct env_manifest *ret);
/* The same without the index ("fs_index" skipped over in the raw bytes, never unpacked; no
 * entries): what a chain's validation needs of an ancestor, at the cost of its header. */
int env_manifest_load_header(int dirfd, const char *name, struct env_manifest *ret);
int env_manifest_decode_header(const void *buf, size_t len, struct env_manifest *ret);
/* Writes dirfd/name and fsyncs it. */
int env_manifest_store(int dirfd, const char *name, const struct env_manifest *m);
