/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "supervisor-env-etc.h"

/* What an unprivileged host user may do with an object: list and enter a directory, read a
 * file. The others bits are what such a user gets (being neither the owner nor in the group
 * is what "unprivileged" means here: root's own files, the shadow group's). */
static bool others_may_read(const struct stat *st)
{
	if (S_ISDIR(st->st_mode))
		return (st->st_mode & (S_IROTH | S_IXOTH)) == (S_IROTH | S_IXOTH);
	return st->st_mode & S_IROTH;
}

static int add_mask(struct env_etc_masks *m, const char *path, bool dir)
{
	struct env_etc_mask *v;
	char *copy;

	if (m->n >= ENV_ETC_MASKS_MAX)
		return -E2BIG;
	v = reallocarray(m->v, m->n + 1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	m->v = v;
	copy = strdup(path);
	if (!copy)
		return -ENOMEM;
	m->v[m->n++] = (struct env_etc_mask){.dir = dir, .path = copy};
	return 0;
}

/* Walks the directory fd (whose path relative to etc is path, of length len, in a buffer of
 * ENV_ETC_PATH_MAX), depth levels below etc. Takes fd. */
static int walk(int fd, char *path, size_t len, unsigned depth, struct env_etc_masks *m)
{
	DIR *d = fdopendir(fd);
	struct dirent *de;
	int r = 0;

	if (!d) {
		r = -errno;
		(void)close(fd);
		return r;
	}
	while (r >= 0) {
		struct stat st;
		size_t n;

		errno = 0;
		de = readdir(d);
		if (!de) {
			r = errno ? -errno : 0;
			break;
		}
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (++m->entries > ENV_ETC_ENTRIES_MAX) {
			r = -E2BIG;
			break;
		}
		n = strlen(de->d_name);
		if (len + 1 + n >= ENV_ETC_PATH_MAX) {
			r = -ENAMETOOLONG;
			break;
		}
		snprintf(path + len, ENV_ETC_PATH_MAX - len, "%s%s", len ? "/" : "", de->d_name);
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			/* removed while we looked: nothing to mask */
			r = errno == ENOENT ? 0 : -errno;
		} else if (S_ISLNK(st.st_mode)) {
			r = 0;
		} else if (!others_may_read(&st)) {
			r = add_mask(m, path, S_ISDIR(st.st_mode));
		} else if (S_ISDIR(st.st_mode)) {
			int sub;

			if (depth + 1 > ENV_ETC_DEPTH_MAX) {
				r = -ELOOP;
				break;
			}
			sub = openat(dirfd(d), de->d_name,
				     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub < 0)
				/* replaced by something else, or gone, since the fstatat: an /etc
				 * that changes under us is not one we can vouch for */
				r = -errno;
			else
				r = walk(sub, path, len + (len ? 1 : 0) + n, depth + 1, m);
		}
		path[len] = '\0';
	}
	(void)closedir(d);
	return r;
}

int env_etc_scan(const char *etc, struct env_etc_masks *ret)
{
	struct env_etc_masks m = {0};
	char path[ENV_ETC_PATH_MAX] = "";
	struct stat st;
	int fd, r;

	fd = open(etc, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return log_debug_errno(-errno, "Failed to open %s: %m", etc);
	if (fstat(fd, &st) < 0) {
		r = -errno;
		(void)close(fd);
		return r;
	}
	if (!others_may_read(&st)) {
		/* all of it is out of reach */
		(void)close(fd);
		r = add_mask(&m, "", true);
	} else {
		r = walk(fd, path, 0, 0, &m);
	}
	if (r < 0) {
		env_etc_masks_finish(&m);
		return log_debug_errno(r, "Failed to scan %s (at %s): %m", etc, path);
	}
	*ret = m;
	return 0;
}

void env_etc_masks_finish(struct env_etc_masks *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->n; i++)
		free(m->v[i].path);
	free(m->v);
	*m = (struct env_etc_masks){0};
}

int env_etc_mask(const char *root, const struct env_etc_masks *m)
{
	char path[PATH_MAX], null[PATH_MAX];

	snprintf(null, sizeof(null), "%s/dev/null", root);
	for (size_t i = 0; i < m->n; i++) {
		const struct env_etc_mask *k = &m->v[i];
		int r;

		if (snprintf(path, sizeof(path), "%s/etc%s%s", root, k->path[0] ? "/" : "",
			     k->path) >= (int)sizeof(path)) {
			errno = ENAMETOOLONG;
			return -1;
		}
		/* A directory's tmpfs is read-only and empty (size=0: nothing can be put there
		 * even by a remount). A mount point of the wrong type fails (ENOTDIR, EISDIR):
		 * something changed since the scan, and the launch fails rather than leave it
		 * visible. */
		r = k->dir ? mount("tmpfs", path, "tmpfs",
				   MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0")
			   : mount(null, path, NULL, MS_BIND, NULL);
		if (r < 0 && errno != ENOENT)
			return -1;
	}
	return 0;
}
