/* SPDX-License-Identifier: MIT */
/*
 * Forks (issue 20 item 4): K environments from one checkpoint, for GRPO-style group sampling
 * and tree search. A fork is a new environment (its own identity, cgroup, network namespace,
 * upper layer) whose first checkpoint is a copy of the source's: the manifest rewritten as the
 * root of a chain of the fork's own, the data and CRIU images hard-linked (checkpoints are
 * never written once committed, GC's rebase links them too). Then an ordinary restore brings
 * it up: the upper layer rebuilt from that index over the same base, CRIU's tree restored
 * into the fork's cgroups (CRIU's cgroup roots, supervisor-env-limits.h) and a fresh network
 * namespace. The source is only read.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "supervisor-env.h"

#define TMP_NAME ".tmp-fork"

static int rmtree_at(int parent, const char *name)
{
	_cleanup_close_ int fd =
		openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d;
	struct dirent *de;

	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	d = fdopendir(fd);
	if (!d)
		return -errno;
	fd = -1;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
		    unlinkat(dirfd(d), de->d_name, 0) < 0 && errno == EISDIR)
			(void)rmtree_at(dirfd(d), de->d_name);
	closedir(d);
	return unlinkat(parent, name, AT_REMOVEDIR) < 0 ? -errno : 0;
}

static int copy_symlink(int src_fd, int dst_fd, const char *name)
{
	char target[PATH_MAX];
	ssize_t n = readlinkat(src_fd, name, target, sizeof(target) - 1);

	if (n < 0)
		return -errno;
	target[n] = '\0';
	return symlinkat(target, dst_fd, name) < 0 ? -errno : 0;
}

static int link_pre_dump(int src_fd, int dst_fd)
{
	_cleanup_close_ int s = -1, d = -1;

	if (mkdirat(dst_fd, ENV_CRIU_PRE_DIR, 0700) < 0)
		return -errno;
	s = openat(src_fd, ENV_CRIU_PRE_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	d = openat(dst_fd, ENV_CRIU_PRE_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (s < 0 || d < 0)
		return -errno;
	return env_link_images(s, d); /* files only: a pre-dump has no parent of its own */
}

int env_link_images(int src_fd, int dst_fd)
{
	_cleanup_close_ int fd = dup(src_fd);
	struct dirent *de;
	DIR *d;
	int r = 0;

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d)
		return -errno;
	fd = -1;
	while (r >= 0 && (de = readdir(d))) {
		size_t n = strlen(de->d_name);

		/* a pre-dump's images and the dump's "parent" symlink to them (issue 23 item 3) */
		if (de->d_type == DT_DIR && strcmp(de->d_name, ENV_CRIU_PRE_DIR) == 0) {
			r = link_pre_dump(src_fd, dst_fd);
			continue;
		}
		if (de->d_type == DT_LNK && strcmp(de->d_name, "parent") == 0) {
			r = copy_symlink(src_fd, dst_fd, de->d_name);
			continue;
		}
		if (de->d_type != DT_REG || (n > 4 && strcmp(de->d_name + n - 4, ".log") == 0))
			continue;
		if (linkat(src_fd, de->d_name, dst_fd, de->d_name, 0) < 0)
			r = -errno;
	}
	closedir(d);
	return r;
}

/* dst's copy of src's checkpoint m (verified): dst's ckpt/<id>, a chain root. */
static int copy_checkpoint(const struct sv_env *src, int src_ckfd, struct env_manifest *m,
			   const struct sv_env *dst, const char *id)
{
	_cleanup_close_ int ckfd = env_ckpts_open(dst), tmpfd = -1, datafd = -1, criufd = -1,
			    src_criu = -1;
	char from[ENV_ID_MAX + 48];
	uint64_t key = 1;
	int r;

	if (ckfd < 0)
		return ckfd;
	(void)rmtree_at(ckfd, TMP_NAME);
	if (mkdirat(ckfd, TMP_NAME, 0700) < 0)
		return -errno;
	tmpfd = openat(ckfd, TMP_NAME, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (tmpfd < 0 || mkdirat(tmpfd, "data", 0700) < 0 || mkdirat(tmpfd, "criu", 0700) < 0) {
		r = -errno;
		goto out;
	}
	datafd = openat(tmpfd, "data", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	criufd = openat(tmpfd, "criu", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	snprintf(from, sizeof(from), "%s/criu", m->id);
	src_criu = openat(src_ckfd, from, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (datafd < 0 || criufd < 0 || src_criu < 0) {
		r = -errno;
		goto out;
	}
	r = env_link_images(src_criu, criufd);
	/* Every regular file's data, wherever in the chain it was, under one key of the copy. */
	for (size_t i = 0; r >= 0 && i < m->n_entries; i++) {
		struct env_entry *en = &m->entries[i];
		char to[32];

		if (en->kind != ENV_ENTRY_REG)
			continue;
		snprintf(from, sizeof(from), "%s/data/%" PRIu64, en->src, en->data_key);
		snprintf(to, sizeof(to), "%" PRIu64, key);
		if (linkat(src_ckfd, from, datafd, to, 0) < 0) {
			r = log_debug_errno(-errno, "Fork of %s: linking %s failed: %m", src->id,
					    from);
			break;
		}
		snprintf(en->src, sizeof(en->src), "%s", id);
		en->data_key = key++;
	}
	if (r < 0)
		goto out;
	snprintf(m->from, sizeof(m->from), "%s/%s", src->id, m->id);
	snprintf(m->id, sizeof(m->id), "%s", id);
	snprintf(m->env, sizeof(m->env), "%s", dst->id);
	memcpy(m->uuid, dst->uuid, sizeof(m->uuid));
	m->parent[0] = '\0';
	m->images[0] = '\0'; /* src's checkpoint's (from) dump: no id of dst's */
	r = env_manifest_store(tmpfd, "manifest.mpk", m);
	if (r >= 0 &&
	    (syncfs(tmpfd) < 0 || renameat(ckfd, TMP_NAME, ckfd, id) < 0 || fsync(ckfd) < 0))
		r = -errno;
out:
	if (r < 0)
		(void)rmtree_at(ckfd, TMP_NAME);
	return r;
}

struct fork_watch {
	const struct env_params *p;
	const struct sv_env *dst;
};

static void fork_cgroup_ready(void *userdata)
{
	const struct fork_watch *w = userdata;

	w->p->restore_watch(w->p->restore_watch_data, w->dst);
}

int env_fork(const struct sv_env *src, const char *ckpt, const struct env_params *p,
	     struct sv_env **ret, struct env_manifest *ret_m, char *why, size_t cap)
{
	_cleanup_close_ int src_ckfd = -1;
	struct env_params q = *p;
	struct env_manifest m = {0};
	struct sv_env *dst = NULL;
	char want[ENV_ID_MAX + 1], id[ENV_ID_MAX + 1];
	int r;

	if (why && cap)
		why[0] = '\0';
	if (!p->id || strcmp(p->id, src->id) == 0)
		return -EINVAL;
	if (src->adopted)
		return -EOPNOTSUPP;
	snprintf(want, sizeof(want), "%s", ckpt && *ckpt ? ckpt : src->head);
	if (!want[0])
		return -ENOENT; /* nothing to fork from: checkpoint the source first */
	src_ckfd = env_ckpts_open(src);
	if (src_ckfd < 0)
		return src_ckfd;
	r = env_ckpt_load_verified(src, src_ckfd, want, &m);
	if (r < 0)
		return log_debug_errno(r, "Fork of %s: checkpoint %s refused: %m", src->id, want);
	q.base = src->base;
	/* an image's environment: its forks record the image too (the layers stay in use) */
	q.image = src->image[0] ? src->image : NULL;
	if (q.image)
		q.base = NULL;
	q.cmd = src->cmd;
	/* a group of forks is one environment's copies: its limits and network mode */
	q.limits = src->limits;
	q.net = src->net;
	q.slirp4netns = src->slirp4netns;
	/* and its user namespace's map: the checkpoint's tree and layers were made for it */
	q.userns_base = src->userns_base;
	r = env_create_stopped(&q, &dst);
	if (r < 0)
		goto out;
	r = env_ckpt_next_id(dst, id, sizeof(id));
	if (r >= 0)
		r = copy_checkpoint(src, src_ckfd, &m, dst, id);
	if (r < 0) {
		log_debug_errno(r, "Fork of %s into %s: copying checkpoint %s failed: %m", src->id,
				dst->id, want);
		goto fail;
	}
	env_write_identity(dst);
	env_manifest_finish(&m);
	{
		struct fork_watch w = {.p = p, .dst = dst};
		struct env_restore_params rp = {.userdata = &w, .cgroup_ready = fork_cgroup_ready};

		/* watched from before its tasks run: its first checkpoint by the dirty set */
		r = env_restore_traced(dst, id, p->restore_watch ? &rp : NULL, &m);
	}
	if (r < 0) {
		log_debug_errno(r, "Fork of %s into %s: restore failed: %m (%s)", src->id, dst->id,
				dst->error);
		if (why)
			snprintf(why, cap, "%s", dst->error);
		goto fail;
	}
	*ret = dst;
	*ret_m = m;
	return 0;
fail:
	/* Gone as a destroyed environment is: its identity too; the copy stays as foreign. */
	env_destroy(dst);
out:
	env_manifest_finish(&m);
	return r;
}
