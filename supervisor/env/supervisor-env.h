/* SPDX-License-Identifier: MIT */
/*
 * Agent environments (DESIGN §2, issue 10): a process tree in its own cgroup v2 and
 * pid/mount/uts/ipc namespaces whose root is an overlay (lower: a read-only base directory,
 * upper: the environment's writable layer under the state directory), checkpointed as
 * FS delta + CRIU dump and restored as both together.
 *
 * Layout under <state_dir>/envs/<id>/ (0700): uuid (the environment's identity), upper/,
 * work/, root/ (the overlay mount), head (the latest checkpoint's id), ckpt/<id>/ (0700:
 * manifest.mpk, data/, criu/) and ckpt/.tmp-* (a checkpoint being written: never visible as
 * a checkpoint, removed at the next one).
 *
 * Its network: a namespace of its own with loopback only, with slirp4netns egress, or the
 * host's (supervisor-env-net.h, supervisor-criu.h).
 * Not thread-safe: one caller per environment at a time (the supervisor runs an
 * environment's checkpoint and restore on its offload thread, one job at a time).
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <limits.h>
#include <sys/types.h>

#include "proto.h"
#include "supervisor-env-activity.h"
#include "supervisor-env-limits.h"
#include "supervisor-env-manifest.h"

struct env_fs_dirty;

#define ENV_CMD_MAX	 4096
#define ENV_KEEP_DEFAULT 8
#define ENV_ERROR_MAX	 256
/* CRIU's ghost limit when none is configured: the largest deleted-but-open file a dump copies
 * into its images. CRIU's own 1 MiB fails on what real tools hold: pytest's output capture is
 * a TemporaryFile per captured stream that grows with a test's output (a few MiB for a chatty
 * test suite); an unlinked scratch file of a build or a download is likewise tens of MiB.
 * 64 MiB covers those and still bounds what one file adds to a checkpoint (its copy is made
 * while the environment is frozen: about 60 ms at 1 GB/s). */
#define ENV_GHOST_LIMIT_DEFAULT (64u << 20)

struct env_params {
	const char *id;		   /* env_id_valid() */
	const char *base;	   /* the read-only lower directory */
	const char *cmd;	   /* run by /bin/sh -c as the environment's init; NULL: sleep */
	const char *state_dir;	   /* <state_dir>/envs/<id> is the environment's */
	const char *cgroup_parent; /* a cgroup v2 directory; the environment's is <parent>/<id> */
	const char *criu;	   /* CRIU >= 4 binary (sv_criu_binary()) */
	unsigned keep;		   /* checkpoints kept (0: ENV_KEEP_DEFAULT) */
	uint32_t ghost_limit;	   /* bytes (0: ENV_GHOST_LIMIT_DEFAULT) */
	struct env_limits limits;  /* processes, memory, CPU (0: none) */
	enum env_net net;	   /* ENV_NET_DEFAULT: ENV_NET_NONE */
	const char *slirp4netns;   /* the helper for ENV_NET_SLIRP (a name: on PATH) */
	/* Issue 20 (supervisor-env-image.h): an image (a stored one's name or id, or
	 * oci:DIR[:TAG] / docker-archive:FILE[:REF]) as the root instead of base; NULL: base. */
	const char *image;
	char *error; /* NULL or where a failed create says why beyond its errno */
	size_t error_cap;
	uint32_t userns_base; /* [env] userns: root's host uid/gid (0: no user namespace) */
	/* env_fork (issue 23 item 2): NULL, or called with restore_watch_data and the new
	 * environment once its fresh cgroup is made, before CRIU restores the tasks into it:
	 * the caller starts the tracer's watch there (env_restore_params' cgroup_ready). */
	void (*restore_watch)(void *userdata, const struct sv_env *e);
	void *restore_watch_data;
};

#define ENV_VERIFIED_MAX 16

struct sv_env {
	struct sv_env *next;
	char id[ENV_ID_MAX + 1];
	uint8_t uuid[16];
	uint32_t trace_id; /* envtrace's id, 0: not watched */
	char dir[PATH_MAX], base[PATH_MAX], root[PATH_MAX], upper[PATH_MAX], work[PATH_MAX];
	char cgroup[PATH_MAX];
	char cmd[ENV_CMD_MAX];
	char criu[PATH_MAX];
	unsigned keep;
	uint32_t ghost_limit;
	struct env_limits limits;
	pid_t pid; /* the environment's init as the supervisor sees it; 0: none */
	bool adopted;
	char head[ENV_ID_MAX + 1];
	struct env_manifest head_index; /* the head's index, inode/ctime as on disk now */
	bool head_valid;
	/* Why the last env_checkpoint or env_restore failed, beyond its errno (CRIU's own first
	 * error line, the process that joined from outside, how the fallback to the head went);
	 * empty: nothing more to say. Cleared when either starts. */
	char error[ENV_ERROR_MAX];
	enum env_net net; /* never ENV_NET_DEFAULT; kept in <dir>/net */
	char slirp4netns[PATH_MAX];
	struct env_net_helper *net_helper; /* slirp4netns while it runs (supervisor-env-net.h) */
	/* The image's id ("sha256:<hex>") when the root is a container image's layers, else "". */
	char image[72];
	uint32_t userns_base; /* env_params' */
	/* The last env_restore's file-system rollback (or rebuild) of the upper layer, in µs:
	 * its share of the restore's time (belayer-bench env-scaling). */
	uint64_t rollback_us;
	/* Issue 23 item 3: the tasks as of the last CRIU dump (supervisor-env-activity.h). */
	struct env_activity act;
	/* How that rollback went: "dirty-set" (the paths changed since the head), "walk" (the
	 * whole upper layer against the head's index), "rebuild" (from nothing). */
	const char *rollback_path;
	/* Ancestors whose manifest header this process validated, by the file's identity (a
	 * restore's chain validation reads each one once, not at every restore). */
	struct env_verified {
		char id[ENV_ID_MAX + 1], parent[ENV_ID_MAX + 1];
		uint64_t ino, size, mtime_ns;
	} verified[ENV_VERIFIED_MAX];
	unsigned n_verified; /* entries filled in turn, the oldest replaced */
};

struct env_ckpt_params {
	const char *trajectory;
	uint64_t turn, prefix_tokens, prefix_hash;
	/* The eBPF dirty set's view (NULL: none): paths always copied; a full-diff reason. */
	bool (*force)(const char *path, void *userdata);
	void *userdata;
	const char *full_diff_reason;
	/* Cancellation (issue 11: a checkpoint run inside an inference bubble must give the
	 * environment back when the bubble ends). NULL: not cancellable. Once *cancel is seen set
	 * at a safe point env_checkpoint returns -ECANCELED with the environment thawed, the
	 * partial checkpoint (ckpt/.tmp-*) removed and the head unchanged. Safe points: before
	 * freezing (and while waiting for the freeze to complete), between files of the FS delta
	 * and between chunks of a large file's copy, before the CRIU dump, and right after it
	 * (before the thaw; a cancel set after the thaw is too late to matter: the checkpoint
	 * commits). A CRIU dump already running is not interrupted: CRIU has no cancellation,
	 * and killing it while its parasite code runs in the environment's tasks can kill them;
	 * its images are discarded when it returns. So a cancel waits at most one FS entry or one
	 * ENV_FS_COPY_CHUNK (supervisor-env-fs.h) copy, or the rest of a running dump. Read with
	 * relaxed ordering: it is a request, it guards no data. */
	const atomic_bool *cancel;
	/* NULL or set true (relaxed) while the CRIU dump runs, past the last safe point before
	 * it, and false once it returned: a cancel seen set meanwhile waits for the dump (the
	 * policy counts such a hold as past its bound, a load-delayed cancel it does not). */
	atomic_bool *dumping;
	/* NULL or called (on the caller's thread, with userdata) the moment the environment runs
	 * again: thawed after the dump (before the commit's syncfs and rename: the environment
	 * runs while its checkpoint is written out), or after a cancel or failure (before the
	 * partial checkpoint is removed). Called exactly once per env_checkpoint call that asked
	 * the cgroup to freeze, even when the thaw itself failed (its error is the call's), and
	 * once per call cancelled after it made its partial checkpoint but before freezing (in
	 * the pre-copy: the environment runs and will not be stopped; before the partial is
	 * removed, which can take long after a large copy); always before env_checkpoint
	 * returns; never when the call failed before freezing or was cancelled at its start. */
	void (*thawed)(void *userdata);
	/* Issue 23 item 3: the tracer's activity counter (NULL: none, every checkpoint dumps the
	 * processes); with userdata. */
	env_activity_fn activity;
	/* NULL, or called once the environment is frozen, before the FS phase (issue 23 item 1):
	 * the tracer's paths changed since the parent checkpoint, up to this instant (changes
	 * made between the caller's snapshot of its dirty set and the freeze included). 0: the
	 * tracer vouches for the interval, *ret_dirty/ret_n (the caller's, valid until
	 * env_checkpoint returns) are the whole delta; else *ret_why says why the upper layer is
	 * walked instead (tracer off, records lost, watch started after the head). */
	int (*frozen)(void *userdata, const struct env_fs_dirty **ret_dirty, size_t *ret_n,
		      const char **ret_why);
	/* NULL (no pre-copy), or called before the freeze, the environment running (issue 23
	 * item 2, supervisor-env-precopy.h): round 0, the dirty set the caller snapshotted;
	 * round k > 0, the paths the tracer saw dirtied since round k - 1's set was taken (its
	 * set restarted from now). 0 and the set (the caller's until env_checkpoint returns), or
	 * 1 with *ret_why when the tracer cannot vouch (no pre-copy then). */
	int (*precopy)(void *userdata, unsigned round, const struct env_fs_dirty **ret_dirty,
		       size_t *ret_n, const char **ret_why);
	/* With precopy: after frozen returned 0, the paths dirtied since the last pre-copy round's
	 * set was taken, up to the freeze (valid until env_checkpoint returns). */
	void (*late)(void *userdata, const struct env_fs_dirty **ret_dirty, size_t *ret_n);
};

/* Creates the state directory, overlay, cgroup, and starts the environment. */
int env_create(const struct env_params *p, struct sv_env **ret);
/* Takes back an environment env_create made before a supervisor restart: its state
 * directory (uuid, head, base, cmd), its cgroup (thawed: a checkpoint cut short leaves it
 * frozen) and its init if it still runs (pid 0 otherwise: restore it). -ENOENT when the
 * state directory is not one env_create wrote. */
int env_reopen(const struct env_params *p, struct sv_env **ret);
/* Registers an environment another runtime made (see README "env adopt"): root must be an
 * overlay mount whose upperdir/workdir are read from the mount table; pid its init. */
int env_adopt(const struct env_params *p, const char *cgroup, const char *root, pid_t pid,
	      struct sv_env **ret);
/* cgroup.kill, waits for the cgroup to empty (bounded), reaps the init when it is ours. */
int env_kill(struct sv_env *e);
/* The replay baseline's first half (issue 10 item 3): kill, empty the upper layer (the base
 * alone again), a fresh cgroup, launch the command again. The caller re-runs the logged
 * actions. Checkpoints are kept; the head is cleared (the next checkpoint starts a chain). */
int env_rebuild(struct sv_env *e);
/* rmdir + mkdir of the environment's cgroup once it is empty. A cgroup written "1" to
 * cgroup.kill once kills every later clone3(CLONE_INTO_CGROUP) child on this kernel (6.18):
 * a killed environment never gets its cgroup back. */
int env_fresh_cgroup(struct sv_env *e);
/* Kills, unmounts the overlay, empties its writable layer, removes the cgroup and the
 * environment's identity (its checkpoints stay on disk, foreign to any later environment of
 * the same id, which starts from its base). An adopted environment is only forgotten. Frees
 * e. */
void env_destroy(struct sv_env *e);

/* Processes in the environment's cgroup (and below), or -errno. */
int env_count_procs(const struct sv_env *e);
/* Whether every process of the environment's cgroup (and below) is in the namespaces of its
 * init (pid, mount, uts, ipc, time; cgroup and net when the init has its own): a process that
 * joined from outside without one of them (nsenter without -T) would be dumped into a
 * checkpoint CRIU cannot restore. -ENOTRECOVERABLE with the pid, its command and the
 * namespace in why otherwise. Call it with the cgroup frozen. */
int env_check_namespaces(const struct sv_env *e, char *why, size_t cap);
/* Whether a process of the environment is a vfork child that has not exec'd or exited yet
 * (it shares its parent's address space: kcmp KCMP_VM): its parent then waits in the kernel
 * for it and CRIU cannot seize that parent (it gives up after its 10 s timeout: "Unseizable
 * non-zombie ... state D"). dash, glibc's posix_spawn and Python's subprocess all vfork.
 * -EBUSY with why, 0 when none; with the cgroup frozen. */
int env_vfork_pending(const struct sv_env *e, char *why, size_t cap);
/* Whether pid (the root CRIU restored, our child) is running and in the environment's cgroup
 * (or below): 0, else -ESRCH with why. */
int env_check_root(const struct sv_env *e, pid_t pid, char *why, size_t cap);

/* Checkpoint: the new manifest (its index included) in *ret (env_manifest_finish it).
 * -ECANCELED: p->cancel was seen set (see struct env_ckpt_params). */
int env_checkpoint(struct sv_env *e, const struct env_ckpt_params *p, struct env_manifest *ret);
/* Restore id (NULL: the head): kill, roll the upper layer back, CRIU-restore into a fresh
 * cgroup, verify the restored root (env_check_root: CRIU's success is the verdict, not a
 * count the environment's own short-lived processes change); *ret: the checkpoint's manifest
 * (the caller truncates its context to the manifest's turn and prefix). -ENOLINK: the parent
 * chain is broken; -EXDEV: another environment's checkpoint; -EBADMSG: a manifest failed
 * validation (nothing touched in those three). A failure after the environment was stopped
 * restores it from its head (the last checkpoint committed or restored: the head never moves
 * to a checkpoint that failed to restore); the call still fails, e->error says why and how
 * the fallback went. */
int env_restore(struct sv_env *e, const char *id, struct env_manifest *ret);
/* env_restore, the upper layer rolled back by what differs (issue 23 item 4) when the caller
 * knows what changed since the head: killed (NULL: not known) is called once the environment is
 * stopped, and returns 0 with the paths changed since the head's freeze (the tracer's dirty set,
 * "/"-rooted; the caller's until env_restore_traced returns), or else why not (*ret_why):
 * then, as without it, the upper layer is walked. */
struct env_restore_params {
	int (*killed)(void *userdata, const struct env_fs_dirty **ret_dirty, size_t *ret_n,
		      const char **ret_why);
	void *userdata;
	/* NULL, or called once the fresh cgroup is made and the upper layer is the target's,
	 * before CRIU restores the tasks into it (issue 23 item 2): the caller starts the
	 * tracer's watch of the cgroup there, so that it vouches for everything the restored
	 * processes do (the next checkpoint's delta from the dirty set, not a walk). */
	void (*cgroup_ready)(void *userdata);
};
int env_restore_traced(struct sv_env *e, const char *id, const struct env_restore_params *p,
		       struct env_manifest *ret);
/* Checkpoint ids, oldest first (free each and the array). */
int env_checkpoints(const struct sv_env *e, char ***ret, size_t *ret_n);
/* Keeps the newest keep checkpoints and the head; the oldest kept one absorbs the data it
 * needs from deleted ancestors (hard links) and becomes the root of the chain. */
int env_gc(struct sv_env *e, unsigned keep);

/* A new environment dst from src's checkpoint ckpt (NULL or "": its head), issue 20 item 4:
 * p names it and gives its limits (its base and command are src's); its file system is the
 * checkpoint's (the base shared, the upper layer rebuilt) and its processes the checkpoint's,
 * restored by CRIU into its own cgroup and a network namespace of its own, so servers listen
 * on the same ports in every fork. Its first checkpoint is a copy of src's (data and CRIU
 * images hard-linked, so it costs no copy; a chain root of its own, its manifest's "from"
 * names src and the checkpoint): it restores, forks and GCs independently of src. src keeps
 * running, untouched. *ret: the fork (running), ret_m: its first checkpoint's manifest. On
 * failure nothing of the fork is left but its copy (foreign, as a destroyed environment's)
 * and why (may be NULL) says what CRIU or the restore said, when they said more. */
int env_fork(const struct sv_env *src, const char *ckpt, const struct env_params *p,
	     struct sv_env **ret, struct env_manifest *ret_m, char *why, size_t cap);

/* Internal (supervisor-env.c): env_create without the overlay and the init: the state
 * directory (a new identity unless it has one), upper/, work/, root/, the cgroup and its
 * limits; and what env_reopen reads back of it. */
int env_create_stopped(const struct env_params *p, struct sv_env **ret);
void env_write_identity(const struct sv_env *e);
/* Internal (supervisor-env-ckpt.c): the checkpoints directory (an fd), a checkpoint of e
 * loaded and its chain verified (-EXDEV: another environment's), the next free id. */
int env_ckpts_open(const struct sv_env *e);
int env_ckpt_load_verified(const struct sv_env *e, int ckfd, const char *id,
			   struct env_manifest *ret);
int env_ckpt_next_id(const struct sv_env *e, char *buf, size_t cap);
/* Internal (supervisor-env-fork.c): every regular file of a checkpoint's CRIU images (src_fd)
 * hard-linked into dst_fd (logs of earlier runs excepted: a restore writes its own). */
int env_link_images(int src_fd, int dst_fd);
/* A checkpoint's pre-dump images (issue 23 item 3), inside its criu/: the dump's "parent"
 * symlink names it, so the images of one checkpoint restore alone (GC and hard-linked copies
 * take criu/ as a whole: env_link_images links this folder's files and the symlink too). */
#define ENV_CRIU_PRE_DIR "pre"
/* Internal (supervisor-env-launch.c): starts the init in the namespaces, into the cgroup. */
int env_launch(struct sv_env *e);
int env_mount_overlay(const struct sv_env *e);
int env_write_file(const char *path, const char *text);
/* Calls fn for every process of e's cgroup and below (stops at its first negative return, and
 * returns it), else returns how many there were. */
int env_walk_procs(const struct sv_env *e, int (*fn)(pid_t pid, void *userdata), void *userdata);
