/* SPDX-License-Identifier: MIT */
/*
 * Full checkpoint and full restore of an environment (issue 10 items 2 and 3).
 *
 * Checkpoint: freeze the cgroup; copy the FS delta (supervisor-env-fs.h); CRIU dump with
 * leave-running; thaw. The freeze spans both so that the files and the processes are of the
 * same instant. Everything is written into ckpt/.tmp-<id>, synced (syncfs), then renamed to
 * ckpt/<id> and the directory fsynced: a checkpoint is either all there or not there at all
 * (a supervisor killed midway leaves a .tmp-* that is never read and is removed later).
 *
 * Cancellation (issue 11): a checkpoint the policy runs inside an inference bubble must give
 * the environment back when the bubble ends. The caller's flag is read at safe points: on
 * entry and before freezing (nothing frozen yet), while waiting for the freeze to complete,
 * before every entry of the FS delta and between chunks of a file's copy, before the CRIU
 * dump, and when the dump returns (before the thaw: a cancel that comes after the thaw is too
 * late to matter and the checkpoint commits). The dump itself is not interrupted: CRIU has
 * no cancellation, and killing it while its parasite code runs inside the environment's
 * tasks can leave them dead or half-restored; its images are discarded once it returns. A
 * cancelled call thaws, tells the caller (thawed), and only then removes the partial .tmp-*
 * (unlinking hundreds of MiB is not the environment's wait). The thaw is reported the same
 * way on success, before the commit's syncfs, and on every failure after the freeze was
 * asked for; a call cancelled before it (in the pre-copy: the environment never stopped)
 * reports "thawed" too, before its cleanup.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "supervisor-criu.h"
#include "supervisor-criu-remap.h"
#include "supervisor-env-fs.h"
#include "supervisor-env-net.h"
#include "supervisor-env-precopy.h"
#include "supervisor-env-sandbox.h"
#include "supervisor-env-userns.h"
#include "supervisor-env.h"

#define FREEZE_WAIT_MS 5000
/* How often a cancellable freeze that has not completed looks at the flag. */
#define FREEZE_CANCEL_POLL_MS 5
#define CHAIN_MAX	      100000
/* Refreezes when a vfork child was caught before its exec, and the thaw between them. */
#define VFORK_RETRIES 100
#define VFORK_THAW_MS 1
#define GC_KEY_BASE   (1ull << 40)

static uint64_t mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static uint64_t real_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

int env_ckpts_open(const struct sv_env *e)
{
	char path[PATH_MAX];
	int fd;

	snprintf(path, sizeof(path), "%s/ckpt", e->dir);
	fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/* cgroup v2 freezer: write, then wait (bounded) for "frozen 1"/"frozen 0". cancel (NULL: none)
 * ends the wait with -ECANCELED: a task that takes long to reach a freezable point (one in
 * uninterruptible I/O) must not hold a cancelled checkpoint for the whole bound. */
static int set_frozen(const struct sv_env *e, bool frozen, const atomic_bool *cancel)
{
	char path[PATH_MAX], buf[256];
	_cleanup_close_ int fd = -1;
	uint64_t deadline;
	int r;

	snprintf(path, sizeof(path), "%s/cgroup.freeze", e->cgroup);
	r = env_write_file(path, frozen ? "1" : "0");
	if (r < 0)
		return r;
	snprintf(path, sizeof(path), "%s/cgroup.events", e->cgroup);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	deadline = mono_us() / 1000 + FREEZE_WAIT_MS;
	for (;;) {
		ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
		uint64_t now = mono_us() / 1000;

		if (n < 0)
			return -errno;
		buf[n] = '\0';
		if (strstr(buf, frozen ? "frozen 1" : "frozen 0"))
			return 0;
		if (now >= deadline)
			return -ETIMEDOUT;
		if (cancel && atomic_load_explicit(cancel, memory_order_relaxed))
			return -ECANCELED;
		(void)poll(&(struct pollfd){.fd = fd, .events = POLLPRI}, 1,
			   cancel ? FREEZE_CANCEL_POLL_MS : 50);
	}
}

static bool cancelled(const struct env_ckpt_params *p)
{
	return p->cancel && atomic_load_explicit(p->cancel, memory_order_relaxed);
}

/* Freezes the environment at an instant CRIU can dump: none of its processes is a vfork child
 * between its vfork and its exec (the freezer can stop one there, and its parent cannot be
 * seized then). Such an instant comes within microseconds of a thaw; the freeze is tried again
 * after a short thaw, at most VFORK_RETRIES times, cancellable between tries. */
static int freeze_quiescent(struct sv_env *e, const struct env_ckpt_params *p)
{
	int r;

	for (unsigned i = 0;; i++) {
		r = set_frozen(e, true, p->cancel);
		if (r < 0) {
			if (r != -ECANCELED)
				log_debug_errno(r, "Failed to freeze %s: %m", e->cgroup);
			return r;
		}
		r = env_vfork_pending(e, e->error, sizeof(e->error));
		if (r != -EBUSY)
			break;
		if (i == VFORK_RETRIES) {
			log_debug("Checkpoint of %s refused after %u freezes: %s", e->id, i + 1,
				  e->error);
			return r;
		}
		r = set_frozen(e, false, NULL);
		if (r < 0)
			return r;
		if (cancelled(p))
			return -ECANCELED;
		(void)poll(NULL, 0, VFORK_THAW_MS);
	}
	if (r < 0)
		return r;
	e->error[0] = '\0';
	return 0;
}

/* Thaws and reports it (once: *frozen is cleared), whatever the thaw's result: the caller
 * waiting for the environment must not wait forever on a freezer that misbehaves. */
static int thaw(const struct sv_env *e, const struct env_ckpt_params *p, bool *frozen)
{
	int r = set_frozen(e, false, NULL);

	*frozen = false;
	if (r < 0)
		log_debug_errno(r, "Failed to thaw %s: %m", e->cgroup);
	if (p->thawed)
		p->thawed(p->userdata);
	return r;
}

static int write_atomic(const char *dir, const char *name, const char *text)
{
	char tmp[PATH_MAX], path[PATH_MAX];
	_cleanup_close_ int fd = -1, dfd = -1;
	size_t n = strlen(text);

	snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, name);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (write(fd, text, n) != (ssize_t)n || fsync(fd) < 0)
		return -EIO;
	if (rename(tmp, path) < 0)
		return -errno;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0)
		(void)fsync(dfd);
	return 0;
}

static uint64_t dir_bytes(int dirfd)
{
	uint64_t total = 0;
	int fd = dup(dirfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *de;

	if (!d) {
		if (fd >= 0)
			(void)close(fd);
		return 0;
	}
	while ((de = readdir(d))) {
		struct stat st;

		if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISREG(st.st_mode))
			total += (uint64_t)st.st_size;
	}
	closedir(d);
	return total;
}

static int rmtree_at(int dirfd, const char *name)
{
	_cleanup_close_ int fd =
		openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	int r;

	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	r = env_fs_wipe(fd);
	if (r < 0)
		return r;
	return unlinkat(dirfd, name, AT_REMOVEDIR) < 0 ? -errno : 0;
}

/* Leftovers of a checkpoint or GC that did not finish: never visible, removed here. */
static void remove_partial(int ckfd)
{
	int fd = dup(ckfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *de;

	if (!d) {
		if (fd >= 0)
			(void)close(fd);
		return;
	}
	while ((de = readdir(d)))
		if (strncmp(de->d_name, ".tmp-", 5) == 0 || strncmp(de->d_name, ".del-", 5) == 0)
			(void)rmtree_at(ckfd, de->d_name);
	closedir(d);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int env_checkpoints(const struct sv_env *e, char ***ret, size_t *ret_n)
{
	_cleanup_close_ int ckfd = env_ckpts_open(e);
	char **ids = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	DIR *d;
	int fd;

	if (ckfd < 0)
		return ckfd;
	fd = dup(ckfd);
	d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			(void)close(fd);
		return -errno;
	}
	while ((de = readdir(d))) {
		if (!env_id_valid(de->d_name))
			continue;
		if (n == cap) {
			char **a = reallocarray(ids, cap ? cap * 2 : 16, sizeof(*a));

			if (!a)
				break;
			ids = a;
			cap = cap ? cap * 2 : 16;
		}
		ids[n] = strdup(de->d_name);
		if (ids[n])
			n++;
	}
	closedir(d);
	/* Ids are c<seq, zero-padded>: name order is creation order. */
	if (n)
		qsort(ids, n, sizeof(*ids), cmp_str);
	*ret = ids;
	*ret_n = n;
	return 0;
}

static void free_ids(char **ids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(ids[i]);
	free(ids);
}

int env_ckpt_next_id(const struct sv_env *e, char *buf, size_t cap)
{
	char **ids;
	size_t n;
	uint64_t seq = 0;
	int r = env_checkpoints(e, &ids, &n);

	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++) {
		uint64_t s;

		if (sscanf(ids[i], "c%" SCNu64, &s) == 1 && s > seq)
			seq = s;
	}
	free_ids(ids, n);
	snprintf(buf, cap, "c%08" PRIu64, seq + 1);
	return 0;
}

/* A checkpoint's commit phase cannot be in its own manifest (the manifest's write is part of
 * it): it is kept beside it, in <id>/commit (decimal µs), written after the rename and not
 * synced (a statistic: lost in a crash, it reads as 0). */
#define COMMIT_FILE "commit"

static void commit_us_store(int ckfd, const char *id, uint64_t us)
{
	char name[ENV_ID_MAX + 16], text[24];
	_cleanup_close_ int fd = -1;
	int n;

	snprintf(name, sizeof(name), "%s/" COMMIT_FILE, id);
	fd = openat(ckfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	n = snprintf(text, sizeof(text), "%" PRIu64, us);
	if (fd < 0 || write(fd, text, (size_t)n) != n)
		log_debug("Could not record %s's commit time, ignoring.", id);
}

static uint64_t commit_us_load(int dfd)
{
	char text[24];
	_cleanup_close_ int fd = openat(dfd, COMMIT_FILE, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, text, sizeof(text) - 1) : -1;
	unsigned long long v;
	char *end;

	if (n <= 0)
		return 0;
	text[n] = '\0';
	errno = 0;
	v = strtoull(text, &end, 10);
	return errno || *end || end == text ? 0 : (uint64_t)v;
}

static int load_checkpoint_as(const struct sv_env *e, int ckfd, const char *id, bool header,
			      struct env_manifest *m);

static int load_checkpoint(const struct sv_env *e, int ckfd, const char *id, struct env_manifest *m)
{
	return load_checkpoint_as(e, ckfd, id, false, m);
}

/* Its header only (no index): an ancestor's validation, a restore to the head whose index is
 * in memory. */
static int load_checkpoint_header(const struct sv_env *e, int ckfd, const char *id,
				  struct env_manifest *m)
{
	return load_checkpoint_as(e, ckfd, id, true, m);
}

static int load_checkpoint_as(const struct sv_env *e, int ckfd, const char *id, bool header,
			      struct env_manifest *m)
{
	char name[ENV_ID_MAX + 32];
	int r;

	if (!env_id_valid(id))
		return -EINVAL;
	snprintf(name, sizeof(name), "%s/manifest.mpk", id);
	{
		_cleanup_close_ int dfd =
			openat(ckfd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

		if (dfd < 0)
			return -errno;
		r = header ? env_manifest_load_header(dfd, "manifest.mpk", m)
			   : env_manifest_load(dfd, "manifest.mpk", m);
		if (r >= 0 && !m->commit_us)
			m->commit_us = commit_us_load(dfd);
	}
	if (r < 0)
		return r;
	if (strcmp(m->id, id) != 0) {
		env_manifest_finish(m);
		return -EBADMSG;
	}
	if (strcmp(m->env, e->id) != 0 || memcmp(m->uuid, e->uuid, 16) != 0) {
		env_manifest_finish(m);
		return -EXDEV;
	}
	return 0;
}

/* In a checkpoint's CRIU directory: its tree's network namespace was external (ours). */
#define NETNS_MARK "belayer-netns"

static int mark_netns(int criufd)
{
	int fd = openat(criufd, NETNS_MARK, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);

	if (fd < 0)
		return -1;
	return close(fd);
}

/* CRIU failed: its own reason into e->error (a deleted-but-open file over the ghost limit
 * names the limit and the key that sets it). */
static void criu_error(struct sv_env *e, int criufd, const char *log, int r)
{
	char line[ENV_ERROR_MAX];

	if (sv_criu_log_error(criufd, log, line, sizeof(line)) < 0)
		snprintf(line, sizeof(line), "CRIU failed without an error line in its %s", log);
	/* CRIU's words name its option, not the cause: a connection open across the dump. */
	if (strstr(line, "Connected TCP socket"))
		snprintf(e->error, sizeof(e->error),
			 "an established TCP connection (to the outside, or between two of its "
			 "processes) cannot be checkpointed: close it first (CRIU: %s)",
			 line);
	else if (strstr(line, "ghost file") && strstr(line, "increase limit")) {
		char held[512];

		(void)sv_criu_ghost_holders(line, e->cgroup, held, sizeof(held));
		snprintf(e->error, sizeof(e->error),
			 "%s ([env] ghost_limit is %" PRIu32 " bytes%s%s)", line, e->ghost_limit,
			 *held ? "; held by " : "", held);
	} else
		snprintf(e->error, sizeof(e->error), "%s", line);
	log_debug_errno(r, "CRIU %s of %s failed: %s", strcmp(log, "dump.log") ? "restore" : "dump",
			e->id, e->error);
}

/* What e's dumps (and pre-dumps) are told of it: its network namespace, external (an adopted
 * one's is its runtime's: CRIU dumps whatever it holds; 0), and the cgroup hierarchies of its
 * own cgroups (an adopted one's runtime's: all, ctls NULL). */
struct dump_ctx {
	uint64_t netns;
	char names[_ENV_LIMIT_MAX + 2][64];
	const char *list[_ENV_LIMIT_MAX + 3];
	const char *const *ctls;
	bool dev_bind;
};

static void dump_ctx_init(const struct sv_env *e, struct dump_ctx *c)
{
	size_t n = e->adopted ? 0 : env_limits_cgroup_names(e, c->names, ARRAY_SIZE(c->names));

	memset(c->list, 0, sizeof(c->list));
	for (size_t i = 0; i < n; i++)
		c->list[i] = c->names[i];
	c->ctls = n ? c->list : NULL;
	c->netns = e->adopted || e->userns_base ? 0 : env_sandbox_netns_of(e->pid);
	c->dev_bind = e->userns_base && !e->adopted;
}

static uint64_t subdir_bytes(int dirfd, const char *name)
{
	_cleanup_close_ int fd =
		openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	return fd < 0 ? 0 : dir_bytes(fd);
}

/* Issue 23 item 3: the memory pre-dumped into criu/ENV_CRIU_PRE_DIR while the environment runs
 * (CRIU stops it only while it collects the pages), so that the frozen dump copies only what
 * was dirtied since. false when it failed: logged, its images removed, the dump is full. */
static bool pre_dump(const struct sv_env *e, int criufd, const struct dump_ctx *c)
{
	_cleanup_close_ int fd = -1;
	int r;

	if (mkdirat(criufd, ENV_CRIU_PRE_DIR, 0700) < 0)
		return false;
	fd = openat(criufd, ENV_CRIU_PRE_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	r = fd < 0 ? -errno
		   : sv_criu_pre_dump(e->criu, e->pid, e->cgroup, fd, c->netns, c->dev_bind,
				      c->ctls);
	if (r < 0) {
		log_warning_errno(
			r, "CRIU pre-dump of %s failed: %m, dumping all its memory frozen.", e->id);
		(void)rmtree_at(criufd, ENV_CRIU_PRE_DIR);
		return false;
	}
	return true;
}

/*
 * The FS phase, frozen (issue 23 item 1): the delta from the tracer's dirty set when it vouches
 * for the interval since the parent (its paths looked at, the parent's index looked up: the
 * cost of what changed), else a walk of the whole upper layer. The manifest says which
 * ("path") and, for a walk, why. *ret_by_dirty: out is a partial index, delta and gone for
 * env_fs_delta_apply; else m's entries are the full index.
 */
static int fs_phase(const struct env_ckpt_params *p, struct env_manifest *base, int upperfd,
		    int datafd, struct env_precopy *pc, struct env_manifest *m,
		    struct env_manifest *delta, struct env_fs_gone *gone, struct env_fs_stats *st,
		    bool *ret_by_dirty)
{
	const struct env_fs_dirty *dirty = NULL;
	const char *why = NULL;
	size_t n = 0;
	int r;

	*ret_by_dirty = false;
	if (!base)
		why = "first checkpoint";
	else if (!p->frozen)
		why = p->full_diff_reason ? p->full_diff_reason : "no tracer";
	else if (p->frozen(p->userdata, &dirty, &n, &why) != 0)
		why = why ? why : "tracer";
	if (!why && pc->done) {
		/* Pre-copied (supervisor-env-precopy.h): what was dirtied since its last round's
		 * set was taken is copied again, frozen, over it. */
		p->late(p->userdata, &dirty, &n);
	}
	if (why && pc->done) {
		/* the walk numbers its own data: the pre-copy's goes */
		env_precopy_finish(pc);
		r = env_fs_wipe(datafd);
		if (r < 0)
			return r;
	}
	if (!why) {
		/* CRIU's dump (the parent's) makes and removes a directory in the environment's
		 * /tmp, to reach its tmpfs mounts: /tmp copied up, its mtime changed, by a process
		 * the tracer does not watch. Its own entry is always looked at again. */
		_cleanup_free_ struct env_fs_dirty *all = calloc(n + 1, sizeof(*all));

		if (!all)
			return -ENOMEM;
		if (n)
			memcpy(all, dirty, n * sizeof(*all));
		all[n++] = (struct env_fs_dirty){.path = "/tmp", .subtree = false};
		/* its copies are this checkpoint's data */
		snprintf(delta->id, sizeof(delta->id), "%s", m->id);
		r = env_fs_scan_dirty_keyed(upperfd, base, all, n, p->cancel, datafd,
					    pc->done ? pc->next_key : 0, false, delta, gone, st);
		if (r >= 0) {
			*ret_by_dirty = true;
			snprintf(m->delta_path, sizeof(m->delta_path), "%s",
				 ENV_DELTA_PATH_DIRTY_SET);
			return 0;
		}
		if (r != -EMLINK && r != -ENOTRECOVERABLE)
			return r;
		why = r == -EMLINK ? "a hard link changed"
				   : "the dirty set names the whole tree or a path no entry has";
		/* what the dirty pass copied goes: the walk numbers its own data */
		env_precopy_finish(pc);
		env_manifest_finish(delta);
		env_fs_gone_finish(gone);
		*st = (struct env_fs_stats){0};
		r = env_fs_wipe(datafd);
		if (r < 0)
			return r;
	}
	m->full_diff = true;
	snprintf(m->full_diff_reason, sizeof(m->full_diff_reason), "%s", why);
	snprintf(m->delta_path, sizeof(m->delta_path), "%s", ENV_DELTA_PATH_WALK);
	return env_fs_scan(upperfd, base, p->force, p->userdata, p->cancel, datafd, m, st);
}

int env_checkpoint(struct sv_env *e, const struct env_ckpt_params *p, struct env_manifest *ret)
{
	struct env_manifest m = {0}, parent = {0}, delta = {0};
	struct env_manifest *base = NULL;
	_cleanup_close_ int ckfd = -1, tmpfd = -1, datafd = -1, criufd = -1, upperfd = -1;
	struct env_fs_stats st = {0};
	struct env_fs_gone gone = {0};
	struct env_precopy pc = {0};
	bool by_dirty = false, pre = false;
	struct dump_ctx dc;
	char tmpname[ENV_ID_MAX + 8];
	uint64_t t_freeze = 0, t_fs, t_dump, t_thaw, t_commit, netns, tasks = 0, activity;
	bool frozen = false, fs_only;
	int r, nproc, parked;

	e->error[0] = '\0';
	if (e->pid <= 0 && !e->adopted)
		return -ESRCH;
	if (cancelled(p))
		return -ECANCELED;
	ckfd = env_ckpts_open(e);
	if (ckfd < 0)
		return ckfd;
	remove_partial(ckfd);
	r = env_ckpt_next_id(e, m.id, sizeof(m.id));
	if (r < 0)
		return r;
	snprintf(m.parent, sizeof(m.parent), "%s", e->head);
	snprintf(m.env, sizeof(m.env), "%s", e->id);
	memcpy(m.uuid, e->uuid, 16);
	snprintf(m.trajectory, sizeof(m.trajectory), "%s", p->trajectory ? p->trajectory : "");
	m.turn = p->turn;
	m.prefix_tokens = p->prefix_tokens;
	m.prefix_hash = p->prefix_hash;
	m.ts_us = real_us();

	/* The parent's index: in memory after a checkpoint or restore, else from its manifest. */
	if (e->head[0] && e->head_valid && strcmp(e->head_index.id, e->head) == 0) {
		base = &e->head_index;
	} else if (e->head[0]) {
		r = load_checkpoint(e, ckfd, e->head, &parent);
		if (r < 0)
			return log_debug_errno(r, "Parent checkpoint %s of %s unusable: %m",
					       e->head, e->id);
		base = &parent;
	}
	/* The parent's entries by path, for the FS phase's look-ups: sorted now, not while
	 * frozen (kept with the index until it changes). */
	if (base && !env_manifest_index(base))
		return -ENOMEM;

	snprintf(tmpname, sizeof(tmpname), ".tmp-%s", m.id);
	if (mkdirat(ckfd, tmpname, 0700) < 0) {
		r = -errno;
		goto out;
	}
	tmpfd = openat(ckfd, tmpname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (tmpfd < 0 || mkdirat(tmpfd, "data", 0700) < 0 || mkdirat(tmpfd, "criu", 0700) < 0) {
		r = -errno;
		goto out;
	}
	datafd = openat(tmpfd, "data", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	criufd = openat(tmpfd, "criu", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	upperfd = open(e->upper, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (datafd < 0 || criufd < 0 || upperfd < 0) {
		r = -errno;
		goto out;
	}

	/* Issue 23 item 2: the dirty set copied while the environment runs (cancellable as the
	 * frozen copy is); frozen, only what it dirtied meanwhile is copied again. */
	r = env_precopy_run(p, base, upperfd, datafd, m.id, &pc);
	if (r < 0)
		goto out;
	/* Issue 23 item 3: the memory pre-dumped beside it when the kernel tracks soft-dirty
	 * pages (never here: this kernel does not) and the processes ran since the last dump
	 * (an idle turn is fs-only: its images are the last dump's). */
	dump_ctx_init(e, &dc);
	if (env_mem_plan(env_mem_dirty_track(),
			 env_mem_dirty_track() &&
				 env_activity_idle_since_dump(e, p->activity, p->userdata)) ==
		    ENV_MEM_PRE_DUMP &&
	    !cancelled(p)) {
		/* CRIU cannot be cancelled: a cancel meanwhile waits for it, as for the dump */
		if (p->dumping)
			atomic_store_explicit(p->dumping, true, memory_order_relaxed);
		pre = pre_dump(e, criufd, &dc);
		if (p->dumping)
			atomic_store_explicit(p->dumping, false, memory_order_relaxed);
	}
	if (cancelled(p)) {
		r = -ECANCELED;
		goto out;
	}
	t_freeze = mono_us();
	/* Frozen from the write on: a freeze that timed out half-way is undone (and reported). */
	frozen = true;
	r = freeze_quiescent(e, p);
	if (r < 0)
		goto out;
	/* Frozen: nobody joins or leaves until the dump is done. A checkpoint that cannot be
	 * restored is never committed. */
	r = env_check_namespaces(e, e->error, sizeof(e->error));
	if (r < 0) {
		log_debug_errno(r, "Checkpoint of %s refused: %s", e->id, e->error);
		goto out;
	}
	nproc = env_count_procs(e);
	m.nproc = nproc > 0 ? (uint64_t)nproc : 0;
	/* Issue 23 item 3: processes that did not run keep the head's images. */
	parked = env_activity_tasks(e, &tasks);
	fs_only = env_activity_unchanged(e, p->activity, p->userdata, parked, tasks, &activity);
	r = fs_phase(p, base, upperfd, datafd, &pc, &m, &delta, &gone, &st, &by_dirty);
	t_fs = mono_us();
	if (r < 0) {
		if (r != -ECANCELED)
			log_debug_errno(r, "FS delta of %s failed: %m", e->id);
		goto out;
	}
	if (cancelled(p)) {
		r = -ECANCELED;
		goto out;
	}
	if (fs_only &&
	    env_activity_open_changed(e, base, by_dirty ? &delta : &m, by_dirty ? &gone : NULL))
		fs_only = false;
	/* what the pre-copy found is merged after the thaw: looked at as it is (a superset:
	 * entries the frozen pass replaced are looked at too) */
	if (fs_only && by_dirty && pc.done &&
	    env_activity_open_changed(e, base, &pc.delta, &pc.gone))
		fs_only = false;
	snprintf(m.kind, sizeof(m.kind), "%s", fs_only ? ENV_KIND_FS_ONLY : ENV_KIND_FULL);
	snprintf(m.images, sizeof(m.images), "%s", fs_only ? e->act.images : m.id);
	if (fs_only) {
		/* a pre-dump made for a turn that turned out idle: the head's images instead */
		if (pre)
			(void)rmtree_at(criufd, ENV_CRIU_PRE_DIR);
		pre = false;
		r = env_activity_link_images(ckfd, e->head, criufd);
		t_dump = mono_us();
		if (r < 0)
			goto out;
		goto dumped;
	}
	/* An environment's own network namespace (loopback only) is external to the dump; the
	 * marker tells a restore to give it a fresh one. An adopted one's is its runtime's: CRIU
	 * dumps whatever it holds. */
	netns = dc.netns;
	if (netns && mark_netns(criufd) < 0) {
		r = -errno;
		goto out;
	}
	if (e->userns_base && !e->adopted) {
		r = env_userns_mark(criufd, e->userns_base);
		if (r < 0)
			goto out;
	}
	if (p->dumping)
		atomic_store_explicit(p->dumping, true, memory_order_relaxed);
	r = sv_criu_dump(e->criu, e->pid, e->cgroup, criufd, true, e->ghost_limit, netns,
			 dc.dev_bind, dc.ctls, pre ? ENV_CRIU_PRE_DIR : NULL);
	if (p->dumping)
		atomic_store_explicit(p->dumping, false, memory_order_relaxed);
	t_dump = mono_us();
	if (r < 0) {
		criu_error(e, criufd, "dump.log", r);
		goto out;
	}
	/* A linked remap is gone from the file system already: its images cannot restore. */
	r = sv_criu_refuse_linked_remaps(criufd, e->cgroup, e->error, sizeof(e->error));
	if (r < 0)
		goto out;
	env_activity_note_dump(e, p->activity, p->userdata, parked, tasks, activity, m.id);
dumped:
	/* Cancelled while CRIU ran: its images go (out: thaw, then remove the .tmp-*). */
	if (cancelled(p)) {
		r = -ECANCELED;
		goto out;
	}
	r = thaw(e, p, &frozen);
	t_thaw = mono_us();
	if (r < 0)
		goto out;

	/* The dirty-set delta becomes the full index here, the environment running again: from
	 * the parent's index and what the frozen phase found, both in memory, nothing of the
	 * upper layer read after the thaw. The checkpoint stays exactly the dump's instant and
	 * atomic: the manifest goes into .tmp-<id> beside the data and images, one syncfs, then
	 * the rename commits all of it (a crash before leaves nothing that is read). */
	if (by_dirty && pc.done) {
		/* the frozen pass's entries over the pre-copy's (its superseded copies go) */
		m.precopy_rounds = pc.rounds;
		m.precopy_bytes = pc.st.bytes;
		m.precopy_frozen_bytes = st.bytes;
		st.bytes += pc.st.bytes;
		st.files += pc.st.files;
		log_debug("Pre-copy of %s: %u rounds, %" PRIu64 " files in %" PRIu64
			  " us running; %zu paths copied again frozen.",
			  e->id, pc.rounds, pc.st.files, pc.us, pc.last_n);
		r = env_precopy_merge(&pc, &delta, &gone, datafd);
		if (r < 0)
			goto out;
	}
	if (by_dirty) {
		r = env_fs_delta_apply(base, &delta, &gone, &m, &st.removed);
		if (r < 0)
			goto out;
	}
	m.fs_bytes = st.bytes;
	m.fs_files = st.files;
	m.fs_removed = st.removed;
	/* written by this checkpoint (a pre-dump's images included) */
	m.criu_bytes = fs_only ? 0 : dir_bytes(criufd) + subdir_bytes(criufd, ENV_CRIU_PRE_DIR);
	m.fs_us = t_fs - t_freeze;
	m.dump_us = t_dump - t_fs;
	m.freeze_us = t_thaw - t_freeze;
	r = env_manifest_store(tmpfd, "manifest.mpk", &m);
	if (r < 0)
		goto out;
	/* One syncfs for the data, the images and the manifest, then the rename commits. */
	if (syncfs(tmpfd) < 0 || renameat(ckfd, tmpname, ckfd, m.id) < 0 || fsync(ckfd) < 0) {
		r = -errno;
		goto out;
	}
	t_commit = mono_us();
	m.commit_us = t_commit - t_thaw;
	commit_us_store(ckfd, m.id, m.commit_us);
	r = write_atomic(e->dir, "head", m.id);
	if (r < 0)
		goto out;
	snprintf(e->head, sizeof(e->head), "%s", m.id);
	if (fs_only)
		snprintf(e->act.ckpt, sizeof(e->act.ckpt), "%s", m.id);
	/* The in-memory index carries the timings too (the stored manifest has commit 0: the
	 * commit time is beside it, COMMIT_FILE). */
	env_manifest_finish(&e->head_index);
	e->head_index = m;
	e->head_valid = true;
	memset(&m, 0, sizeof(m));
	/* Its path index now, the environment running: the next checkpoint's FS phase and a
	 * restore by what differs look paths up in it. */
	(void)env_manifest_index(&e->head_index);
	r = env_gc(e, e->keep);
	if (r < 0)
		log_warning_errno(r, "GC of %s's checkpoints failed: %m, ignoring.", e->id);
	/* The caller's copy: re-read from disk (the stored one). */
	r = load_checkpoint(e, ckfd, e->head, ret);
	if (r >= 0)
		ret->commit_us = e->head_index.commit_us;
out:
	if (frozen)
		(void)thaw(e, p, &frozen);
	else if (r == -ECANCELED && !t_freeze && p->thawed)
		/* cancelled before the freeze (in the pre-copy): the environment runs and will
		 * not be stopped; the caller is told before the cleanup below, as for a thaw */
		p->thawed(p->userdata);
	if (r == -ECANCELED)
		log_debug("Checkpoint %s of %s cancelled.", m.id, e->id);
	if (r < 0 && tmpfd >= 0) {
		/* CRIU's log of a failed dump stays for the operator: <env>/dump-failed.log. */
		char log[PATH_MAX];

		snprintf(log, sizeof(log), "%s/dump-failed.log", e->dir);
		if (criufd >= 0 && r != -ECANCELED)
			(void)renameat(criufd, "dump.log", AT_FDCWD, log);
		(void)rmtree_at(ckfd, tmpname);
	}
	env_manifest_finish(&m);
	env_manifest_finish(&parent);
	env_manifest_finish(&delta);
	env_fs_gone_finish(&gone);
	env_precopy_finish(&pc);
	return r;
}

/* id's manifest as it is on disk (its identity), or -errno. */
static int manifest_ident(int ckfd, const char *id, struct env_verified *v)
{
	char name[ENV_ID_MAX + 32];
	struct stat st;

	snprintf(name, sizeof(name), "%s/manifest.mpk", id);
	if (fstatat(ckfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	snprintf(v->id, sizeof(v->id), "%s", id);
	v->ino = st.st_ino;
	v->size = (uint64_t)st.st_size;
	v->mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
	return 0;
}

/* An ancestor's parent, its header validated (load_checkpoint_header), unless this very file
 * was validated before (cache, NULL: none; n_cache counts the entries ever filled). */
static int ancestor_parent(const struct sv_env *e, int ckfd, const char *id,
			   struct env_verified *cache, unsigned *n_cache, char *ret_parent)
{
	struct env_verified v = {0};
	struct env_manifest pm;
	int r;

	if (cache) {
		r = manifest_ident(ckfd, id, &v);
		if (r < 0)
			return r;
		for (unsigned i = 0; i < ENV_VERIFIED_MAX && i < *n_cache; i++)
			if (strcmp(cache[i].id, v.id) == 0 && cache[i].ino == v.ino &&
			    cache[i].size == v.size && cache[i].mtime_ns == v.mtime_ns) {
				snprintf(ret_parent, ENV_ID_MAX + 1, "%s", cache[i].parent);
				return 0;
			}
	}
	r = load_checkpoint_header(e, ckfd, id, &pm);
	if (r < 0)
		return r;
	snprintf(ret_parent, ENV_ID_MAX + 1, "%s", pm.parent);
	env_manifest_finish(&pm);
	if (cache) {
		snprintf(v.parent, sizeof(v.parent), "%s", ret_parent);
		cache[(*n_cache)++ % ENV_VERIFIED_MAX] = v;
	}
	return 0;
}

/* The checkpoint and its ancestors: all present, all valid, all this environment's (their
 * headers: the index of an ancestor is not what is restored); every data reference of idx (m's
 * index, or the same checkpoint's in memory) inside the chain. */
static int verify_chain(const struct sv_env *e, int ckfd, const struct env_manifest *m,
			const struct env_manifest *idx, struct env_verified *cache,
			unsigned *n_cache)
{
	char(*chain)[ENV_ID_MAX + 1] = NULL;
	size_t n = 0;
	char next[ENV_ID_MAX + 1];
	int r = 0;

	chain = calloc(64, sizeof(*chain));
	if (!chain)
		return -ENOMEM;
	snprintf(chain[n++], sizeof(chain[0]), "%s", m->id);
	snprintf(next, sizeof(next), "%s", m->parent);
	while (next[0]) {
		char parent[ENV_ID_MAX + 1];

		if (n >= CHAIN_MAX) {
			r = -ELOOP;
			break;
		}
		if ((n & (n - 1)) == 0 && n >= 64) {
			void *a = reallocarray(chain, n * 2, sizeof(*chain));

			if (!a) {
				r = -ENOMEM;
				break;
			}
			chain = a;
		}
		for (size_t i = 0; i < n; i++)
			if (strcmp(chain[i], next) == 0) {
				r = -ELOOP;
				goto out;
			}
		r = ancestor_parent(e, ckfd, next, cache, n_cache, parent);
		if (r == -ENOENT) {
			r = log_error_errno(-ENOLINK,
					    "Checkpoint %s of %s: ancestor %s is missing: the "
					    "chain is broken.",
					    m->id, e->id, next);
			break;
		}
		if (r < 0) {
			log_error_errno(r, "Checkpoint %s of %s: ancestor %s is invalid: %m", m->id,
					e->id, next);
			r = r == -EXDEV ? r : -ENOLINK;
			break;
		}
		snprintf(chain[n++], sizeof(chain[0]), "%s", next);
		snprintf(next, sizeof(next), "%s", parent);
	}
	for (size_t i = 0; r >= 0 && i < idx->n_entries; i++) {
		bool found = false;

		if (idx->entries[i].kind != ENV_ENTRY_REG)
			continue;
		for (size_t j = 0; j < n && !found; j++)
			found = strcmp(chain[j], idx->entries[i].src) == 0;
		if (!found)
			r = log_error_errno(-ENOLINK,
					    "Checkpoint %s of %s: %s's data is in %s, outside its "
					    "chain.",
					    m->id, e->id, idx->entries[i].path,
					    idx->entries[i].src);
	}
out:
	free(chain);
	return r;
}

int env_ckpt_load_verified(const struct sv_env *e, int ckfd, const char *id,
			   struct env_manifest *ret)
{
	int r = load_checkpoint(e, ckfd, id, ret);

	if (r < 0)
		return r;
	r = verify_chain(e, ckfd, ret, ret, NULL, NULL);
	if (r < 0)
		env_manifest_finish(ret);
	return r;
}

/* CRIU's cgroup roots for e: its own cgroups, whichever environment dumped the images. */
struct cg_roots {
	char *v[2 * (_ENV_LIMIT_MAX + 2) + 1]; /* v2, the limits', devices */
	size_t n;
};

static void cg_roots_finish(struct cg_roots *c)
{
	for (size_t i = 0; i < c->n; i++)
		free(c->v[i]);
}

static int cg_root_add(const char *ctl, const char *path, void *userdata)
{
	struct cg_roots *c = userdata;

	if (c->n + 2 >= ARRAY_SIZE(c->v))
		return -E2BIG;
	c->v[c->n] = strdup(ctl);
	c->v[c->n + 1] = strdup(path);
	c->n += 2;
	return c->v[c->n - 2] && c->v[c->n - 1] ? 0 : -ENOMEM;
}

static int cg_roots_of(const struct sv_env *e, struct cg_roots *c)
{
	int r = env_limits_cgroup_roots(e, cg_root_add, c);

	return r < 0 ? log_debug_errno(r, "No cgroup roots for %s: %m", e->id) : 0;
}

/* The upper layer, last indexed as the head's index, made m's (the head's index becomes m's
 * when *ret_moved: m's entries are then the head index's, refreshed). By the paths changed since
 * the head when the caller knows them, else by a walk. */
static int rollback(struct sv_env *e, const struct env_restore_params *p, int upperfd,
		    struct env_manifest *m, bool header_only, int ckfd, bool *ret_moved)
{
	const struct env_fs_dirty *dirty = NULL;
	const char *why = NULL;
	size_t n = 0;
	int r;

	*ret_moved = false;
	if (p && p->killed && p->killed(p->userdata, &dirty, &n, &why) == 0) {
		/* the head's own dump touched /tmp after its FS phase, untraced (fs_phase) */
		_cleanup_free_ struct env_fs_dirty *all = calloc(n + 1, sizeof(*all));
		bool to_head = strcmp(m->id, e->head_index.id) == 0;

		if (!all)
			return -ENOMEM;
		if (n)
			memcpy(all, dirty, n * sizeof(*all));
		all[n++] = (struct env_fs_dirty){.path = "/tmp", .subtree = false};
		r = env_fs_rollback_dirty(upperfd, &e->head_index, to_head ? &e->head_index : m,
					  all, n, ckfd);
		if (r >= 0) {
			e->rollback_path = "dirty-set";
			*ret_moved = true;
			if (!to_head) {
				env_manifest_finish(&e->head_index);
				e->head_index = *m;
				*m = (struct env_manifest){0};
			}
			return 0;
		}
		log_debug_errno(r, "Rollback of %s by its dirty set failed (%m): walking it.",
				e->id);
	} else if (p && p->killed) {
		log_debug("Rollback of %s walks its upper layer: %s.", e->id, why ? why : "?");
	}
	e->rollback_path = "walk";
	/* m without its index (a restore to the head): the head's in memory is the target */
	return env_fs_rollback(upperfd, &e->head_index, header_only ? &e->head_index : m, ckfd);
}

/* The head's manifest without its index, from memory (this process wrote it, or read and
 * validated it): the file must still be there. */
static int head_header(const struct sv_env *e, int ckfd, struct env_manifest *m)
{
	struct env_verified v;
	int r = manifest_ident(ckfd, e->head_index.id, &v);

	if (r < 0)
		return r;
	*m = e->head_index;
	m->entries = NULL;
	m->n_entries = m->cap_entries = 0;
	m->xattr_bytes = 0;
	m->by_path = NULL;
	m->link_targets = NULL;
	m->n_link_targets = 0;
	return 0;
}

/* One restore of id. *stopped: the environment was killed (what ran is gone; a failure from
 * there on leaves it down and its upper layer in between). */
static int restore_at(struct sv_env *e, int ckfd, const char *id,
		      const struct env_restore_params *p, bool *stopped, struct env_manifest *ret)
{
	bool moved = false, to_head;

	_cleanup_(cg_roots_finish) struct cg_roots roots = {0};
	_cleanup_close_ int upperfd = -1, workfd = -1, criufd = -1, netfd = -1;
	struct env_manifest m = {0};
	char criu_dir[ENV_ID_MAX + 8];
	uint64_t t[6] = {0};
	uint32_t userns;
	pid_t pid;
	int r;

	/* A traced restore to the head whose index is in memory reads the manifest's header
	 * only: the index it would decode is the one in memory (issue 23 item 4). */
	to_head = p && p->killed && e->head_valid && strcmp(e->head, id) == 0 &&
		  strcmp(e->head_index.id, id) == 0;
	r = to_head ? head_header(e, ckfd, &m) : load_checkpoint(e, ckfd, id, &m);
	if (r < 0)
		return log_error_errno(r, "Checkpoint %s of %s refused: %m", id, e->id);
	r = verify_chain(e, ckfd, &m, to_head ? &e->head_index : &m, e->verified, &e->n_verified);
	if (r < 0)
		goto out;
	snprintf(criu_dir, sizeof(criu_dir), "%s/criu", id);
	criufd = openat(ckfd, criu_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (criufd < 0) {
		r = -errno;
		goto out;
	}

	t[0] = mono_us();
	*stopped = true;
	r = env_kill(e);
	if (r < 0)
		goto out;
	t[1] = mono_us();
	if (umount2(e->root, 0) < 0 && errno != EINVAL && umount2(e->root, MNT_DETACH) < 0 &&
	    errno != EINVAL) {
		r = -errno;
		goto out;
	}
	upperfd = open(e->upper, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	workfd = open(e->work, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (upperfd < 0 || workfd < 0) {
		r = -errno;
		goto out;
	}
	/* The upper layer as the head's index knows it: roll back what differs; otherwise (a
	 * supervisor restart, a rebuild, a failed restore) from nothing. */
	r = env_fs_wipe(workfd);
	t[2] = mono_us();
	if (r >= 0 && e->head_valid && strcmp(e->head_index.id, e->head) == 0) {
		r = rollback(e, p, upperfd, &m, to_head, ckfd, &moved);
	} else if (r >= 0) {
		e->rollback_path = "rebuild";
		r = env_fs_wipe(upperfd);
		if (r >= 0)
			r = env_fs_rebuild(upperfd, &m, ckfd);
	}
	t[3] = mono_us();
	e->rollback_us = t[3] - t[2];
	/* From here the layer is the target's or in between: the head's index no longer says
	 * what it holds (unless the rollback made it the target's: moved). */
	e->head_valid = false;
	if (r < 0) {
		log_error_errno(r, "Rebuilding %s's upper layer from %s failed: %m", e->id, id);
		goto out;
	}
	r = env_mount_overlay(e);
	if (r < 0)
		goto out;
	/* A fresh cgroup at the same path: CRIU puts the tree back where it was dumped. */
	r = env_fresh_cgroup(e);
	if (r < 0)
		goto out;
	if (p && p->cgroup_ready)
		p->cgroup_ready(p->userdata);
	t[4] = mono_us();
	if (faccessat(criufd, NETNS_MARK, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		netfd = env_sandbox_netns_new();
		if (netfd < 0) {
			r = log_debug_errno(netfd, "No network namespace for %s: %m", e->id);
			goto out;
		}
		/* Its egress is there before its processes run again (env_kill stopped the old
		 * helper with the old namespace). */
		r = env_net_start(e, netfd);
		if (r < 0)
			goto out;
	}
	/* CRIU's restored tasks read some of their images themselves, from inside the user
	 * namespace and before its maps are written (nobody then): the directory searchable by
	 * all (its files are 0644; the state directory above is 0700, so only this fd reaches
	 * them) */
	userns = env_userns_marked(criufd);
	if (userns && fchmod(criufd, 0755) < 0) {
		r = -errno;
		goto out;
	}
	r = cg_roots_of(e, &roots);
	if (r < 0)
		goto out;
	r = sv_criu_restore(e->criu, criufd, e->root, netfd, (const char *const *)roots.v,
			    userns != 0, &pid);
	if (r < 0) {
		criu_error(e, criufd, "restore.log", r);
		goto out;
	}
	t[5] = mono_us();
	log_debug("Restore of %s to %s: kill %" PRIu64 " µs, unmount %" PRIu64
		  " µs, roll back %" PRIu64 " µs, mount + cgroup %" PRIu64 " µs, CRIU %" PRIu64
		  " µs.",
		  e->id, id, t[1] - t[0], t[2] - t[1], t[3] - t[2], t[4] - t[3], t[5] - t[4]);
	e->pid = pid;
	/* CRIU restored the whole tree or failed; what is left to verify is its root, not a
	 * count of processes that the environment's own short-lived ones change meanwhile. */
	r = env_check_root(e, pid, e->error, sizeof(e->error));
	if (r < 0) {
		log_debug_errno(r, "Restored %s: %s", e->id, e->error);
		goto out;
	}
	snprintf(e->head, sizeof(e->head), "%s", id);
	r = write_atomic(e->dir, "head", id);
	if (r < 0)
		goto out;
	if (moved) {
		/* the rollback left the target's index in e->head_index, refreshed where it
		 * rebuilt; the caller's copy from disk when m went there */
		e->head_valid = true;
		if (!m.id[0])
			r = load_checkpoint(e, ckfd, id, &m);
		if (r >= 0) {
			*ret = m;
			memset(&m, 0, sizeof(m));
		}
		goto out;
	}
	env_manifest_finish(&e->head_index);
	r = load_checkpoint(e, ckfd, id, &e->head_index);
	if (r >= 0) {
		e->head_valid = env_fs_refresh(upperfd, &e->head_index) >= 0;
		*ret = m;
		memset(&m, 0, sizeof(m));
	}
out:
	env_manifest_finish(&m);
	return r;
}

int env_restore(struct sv_env *e, const char *id, struct env_manifest *ret)
{
	return env_restore_traced(e, id, NULL, ret);
}

int env_restore_traced(struct sv_env *e, const char *id, const struct env_restore_params *p,
		       struct env_manifest *ret)
{
	_cleanup_close_ int ckfd = -1;
	struct env_manifest back = {0};
	char want[ENV_ID_MAX + 1], head[ENV_ID_MAX + 1], why[ENV_ERROR_MAX];
	bool stopped = false;
	int r, k;

	e->error[0] = '\0';
	/* Restored processes ran (CRIU's restorer, and since): the next dump is full. */
	e->act.valid = false;
	/* Copies: e->head is rewritten by a restore. */
	snprintf(want, sizeof(want), "%s", id && *id ? id : e->head);
	snprintf(head, sizeof(head), "%s", e->head);
	if (!want[0])
		return -ENOENT;
	ckfd = env_ckpts_open(e);
	if (ckfd < 0)
		return ckfd;
	r = restore_at(e, ckfd, want, p, &stopped, ret);
	if (r >= 0 || !stopped)
		return r;

	/* The environment is down: whatever the failed restore left goes, and the head (the
	 * last checkpoint committed or restored) comes back; the head stays where it was. */
	snprintf(why, sizeof(why), "%s", e->error[0] ? e->error : strerror(-r));
	(void)env_kill(e);
	if (!head[0] || strcmp(head, want) == 0) {
		log_error_errno(r,
				"Restore of %s to %s failed (%s); no other checkpoint to go back "
				"to: it is not running.",
				e->id, want, why);
		return r;
	}
	e->error[0] = '\0';
	stopped = false;
	k = restore_at(e, ckfd, head, NULL, &stopped, &back);
	env_manifest_finish(&back);
	if (k < 0) {
		log_error_errno(k,
				"Restore of %s to %s failed (%s), and going back to its head %s "
				"failed too (%s): it is not running.",
				e->id, want, why, head, e->error[0] ? e->error : strerror(-k));
		snprintf(e->error, sizeof(e->error), "%s; going back to the head %s failed too",
			 why, head);
		if (stopped)
			(void)env_kill(e);
		return r;
	}
	log_warning_errno(r, "Restore of %s to %s failed (%s); running again from its head %s.",
			  e->id, want, why, head);
	snprintf(e->error, sizeof(e->error), "%s; running again from its head %s", why, head);
	return r;
}

/* The oldest kept checkpoint becomes a chain root: data from deleted ancestors is
 * hard-linked into its own data/, its manifest rewritten (tmp + rename) without a parent. */
static int rebase(struct sv_env *e, int ckfd, const char *id, char **drop, size_t n_drop)
{
	struct env_manifest m;
	_cleanup_close_ int dfd = -1, datafd = -1;
	uint64_t key = GC_KEY_BASE;
	bool changed = false;
	int r;

	r = load_checkpoint(e, ckfd, id, &m);
	if (r < 0)
		return r;
	/* Fresh keys above every key this checkpoint already holds (an earlier GC's included). */
	for (size_t i = 0; i < m.n_entries; i++)
		if (m.entries[i].kind == ENV_ENTRY_REG && strcmp(m.entries[i].src, id) == 0 &&
		    m.entries[i].data_key >= key)
			key = m.entries[i].data_key + 1;
	dfd = openat(ckfd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	datafd = dfd >= 0 ? openat(dfd, "data", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	if (datafd < 0) {
		r = -errno;
		goto out;
	}
	for (size_t i = 0; i < m.n_entries; i++) {
		struct env_entry *en = &m.entries[i];
		char from[ENV_ID_MAX + 48], to[32];
		bool dropped = false;

		if (en->kind != ENV_ENTRY_REG)
			continue;
		for (size_t j = 0; j < n_drop && !dropped; j++)
			dropped = strcmp(drop[j], en->src) == 0;
		if (!dropped)
			continue;
		snprintf(from, sizeof(from), "%s/data/%" PRIu64, en->src, en->data_key);
		snprintf(to, sizeof(to), "%" PRIu64, key);
		if (linkat(ckfd, from, datafd, to, 0) < 0) {
			r = -errno;
			goto out;
		}
		snprintf(en->src, sizeof(en->src), "%s", id);
		en->data_key = key++;
		changed = true;
	}
	for (size_t j = 0; j < n_drop && m.parent[0]; j++)
		if (strcmp(drop[j], m.parent) == 0) {
			m.parent[0] = '\0';
			changed = true;
		}
	if (changed) {
		(void)unlinkat(dfd, "manifest.mpk.new", 0);
		r = env_manifest_store(dfd, "manifest.mpk.new", &m);
		if (r >= 0 &&
		    (syncfs(dfd) < 0 ||
		     renameat(dfd, "manifest.mpk.new", dfd, "manifest.mpk") < 0 || fsync(dfd) < 0))
			r = -errno;
		/* written here from a validated manifest: a restore's chain validation need not
		 * read it again (e->verified) */
		if (r >= 0) {
			struct env_verified v = {0};

			if (manifest_ident(ckfd, id, &v) >= 0) {
				snprintf(v.parent, sizeof(v.parent), "%s", m.parent);
				e->verified[e->n_verified++ % ENV_VERIFIED_MAX] = v;
			}
		}
	}
out:
	env_manifest_finish(&m);
	return r;
}

int env_gc(struct sv_env *e, unsigned keep)
{
	_cleanup_close_ int ckfd = env_ckpts_open(e);
	char **ids = NULL, **drop = NULL;
	size_t n = 0, n_drop = 0, first_kept;
	int r;

	if (ckfd < 0)
		return ckfd;
	if (keep == 0)
		keep = 1;
	r = env_checkpoints(e, &ids, &n);
	if (r < 0)
		return r;
	if (n <= keep)
		goto out;
	first_kept = n - keep;
	drop = calloc(first_kept, sizeof(*drop));
	if (!drop) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < first_kept; i++)
		if (strcmp(ids[i], e->head) != 0)
			drop[n_drop++] = ids[i];
	/* Every kept checkpoint whose chain reaches a dropped one absorbs its data. Kept ones
	 * are rebased oldest first; a rebased one needs nothing older. */
	for (size_t i = 0; i < n; i++) {
		bool dropped = false;

		for (size_t j = 0; j < n_drop && !dropped; j++)
			dropped = drop[j] == ids[i];
		if (dropped)
			continue;
		r = rebase(e, ckfd, ids[i], drop, n_drop);
		if (r < 0)
			goto out;
	}
	for (size_t j = 0; j < n_drop; j++) {
		char del[ENV_ID_MAX + 8];

		snprintf(del, sizeof(del), ".del-%s", drop[j]);
		if (renameat(ckfd, drop[j], ckfd, del) < 0) {
			r = -errno;
			goto out;
		}
		(void)rmtree_at(ckfd, del);
	}
	(void)fsync(ckfd);
out:
	free(drop);
	free_ids(ids, n);
	if (e->head_valid && n_drop) {
		/* The head's data references may have moved: reload them, keep inode/ctime. */
		struct env_manifest fresh;

		e->head_valid = false;
		if (load_checkpoint(e, ckfd, e->head, &fresh) >= 0) {
			if (fresh.n_entries == e->head_index.n_entries) {
				for (size_t i = 0; i < fresh.n_entries; i++) {
					fresh.entries[i].ino = e->head_index.entries[i].ino;
					fresh.entries[i].ctime_ns =
						e->head_index.entries[i].ctime_ns;
				}
				(void)env_manifest_index_like(&fresh, &e->head_index);
				env_manifest_finish(&e->head_index);
				e->head_index = fresh;
				e->head_valid = true;
			} else {
				env_manifest_finish(&fresh);
			}
		}
	}
	return r;
}
