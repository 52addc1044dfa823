/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "util.h"
#include "supervisor-env-fs.h"

#define OVL_OPAQUE_XATTR "trusted.overlay.opaque"
#define WALK_DEPTH_MAX	 256
/* The kernel's bound on a listxattr answer (XATTR_LIST_MAX). */
#define XATTR_LIST_BYTES 65536

static int openat_beneath(int dirfd, const char *path, int flags, mode_t mode)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_CLOEXEC),
		.mode = (flags & O_CREAT) ? mode : 0,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
			   RESOLVE_NO_XDEV,
	};
	long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));

	return fd < 0 ? -errno : (int)fd;
}

static uint64_t ts_ns(const struct timespec *t)
{
	return (uint64_t)t->tv_sec * 1000000000ull + (uint64_t)t->tv_nsec;
}

/* --- extended attributes ---------------------------------------------------------------- */

/*
 * Every xattr of an inode is its state (issue 16 item 9): user.*, security.capability (a
 * chown or a write drops it, so it is set after both), ACLs (system.posix_acl_*), and
 * overlay's own trusted.overlay.*: opaque (a directory hiding the lower one), redirect (a
 * renamed directory's lower path), origin (the lower inode a copy-up came from: st_ino as the
 * environment sees it), metacopy (data still in the lower file), impure, nlink. An upper layer
 * rebuilt without any one of them is not the overlay it was; kept with all of them it is.
 *
 * The object is reached through an fd of its own (O_PATH for what cannot be opened, a symlink
 * or a socket), by /proc/self/fd/N: that names the object itself, never what a symlink points
 * to, and no path in the upper layer is resolved again.
 */
static void fd_proc_path(int fd, char buf[static 32])
{
	snprintf(buf, 32, "/proc/self/fd/%d", fd);
}

/* The names of path's xattrs (NUL-separated) into a malloc'd *ret (NULL when none). */
static ssize_t xattrs_list(const char *path, char **ret)
{
	*ret = NULL;
	for (;;) {
		ssize_t n = listxattr(path, NULL, 0);
		char *buf;

		if (n < 0 && (errno == ENOTSUP || errno == EOPNOTSUPP))
			return 0;
		if (n <= 0)
			return n < 0 ? -errno : 0;
		if (n > XATTR_LIST_BYTES)
			return -E2BIG;
		buf = malloc((size_t)n);
		if (!buf)
			return -ENOMEM;
		n = listxattr(path, buf, (size_t)n);
		if (n >= 0) {
			*ret = buf;
			return n;
		}
		free(buf);
		if (errno != ERANGE) /* ERANGE: one was added meanwhile */
			return -errno;
	}
}

static int xattr_get(const char *path, struct env_xattr *x)
{
	for (;;) {
		ssize_t n = getxattr(path, x->name, NULL, 0);

		if (n < 0)
			return -errno;
		if (n > ENV_XATTR_VALUE_MAX)
			return -E2BIG;
		free(x->value);
		x->value = malloc(n ? (size_t)n : 1);
		if (!x->value)
			return -ENOMEM;
		n = getxattr(path, x->name, x->value, (size_t)n);
		if (n >= 0) {
			x->len = (uint32_t)n;
			return 0;
		}
		if (errno != ERANGE)
			return -errno;
	}
}

/* fd's xattrs into e->xattrs (the caller frees them); -E2BIG past the manifest's bounds. */
static int xattrs_read(int fd, struct env_entry *e)
{
	_cleanup_free_ char *names = NULL;
	char path[32];
	ssize_t len;
	int r = 0;

	e->xattrs = NULL;
	e->n_xattrs = 0;
	fd_proc_path(fd, path);
	len = xattrs_list(path, &names);
	if (len <= 0)
		return (int)len;
	for (ssize_t off = 0; off < len && r >= 0; off += (ssize_t)strlen(names + off) + 1) {
		struct env_xattr *x;

		if (e->n_xattrs == ENV_XATTRS_MAX)
			return -E2BIG;
		if (!e->xattrs) {
			e->xattrs = calloc(ENV_XATTRS_MAX, sizeof(*e->xattrs));
			if (!e->xattrs)
				return -ENOMEM;
		}
		x = &e->xattrs[e->n_xattrs];
		x->name = strdup(names + off);
		if (!x->name)
			return -ENOMEM;
		e->n_xattrs++;
		r = xattr_get(path, x);
		if (r == -ENODATA) { /* removed between the list and the get */
			free(x->name);
			free(x->value);
			*x = (struct env_xattr){0};
			e->n_xattrs--;
			r = 0;
		}
	}
	return r;
}

/* Makes pfd/name's xattrs exactly e's: the others removed (inherited from a default ACL, or
 * the state the rollback leaves), e's set. */
static int xattrs_apply(int pfd, const char *name, const struct env_entry *e)
{
	_cleanup_close_ int fd = -1;
	_cleanup_free_ char *names = NULL;
	char path[32];
	ssize_t len;

	fd = openat(pfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	fd_proc_path(fd, path);
	len = xattrs_list(path, &names);
	if (len < 0)
		return (int)len;
	for (ssize_t off = 0; off < len; off += (ssize_t)strlen(names + off) + 1)
		if (!env_entry_xattr(e, names + off) && removexattr(path, names + off) < 0 &&
		    errno != ENODATA)
			return -errno;
	for (uint32_t i = 0; i < e->n_xattrs; i++)
		if (setxattr(path, e->xattrs[i].name, e->xattrs[i].value, e->xattrs[i].len, 0) < 0)
			return -errno;
	return 0;
}

/* --- scan ------------------------------------------------------------------------------ */

struct ino_seen {
	dev_t dev;
	ino_t ino;
	const char *path; /* the entry's (owned by the manifest: index, not pointer) */
	size_t index;
};

struct scan {
	const struct env_manifest *base;
	const struct env_entry **base_sorted;
	env_fs_force_cb force;
	void *userdata;
	const atomic_bool *cancel;
	int data_fd;
	struct env_manifest *out;
	struct env_fs_stats stats;
	uint64_t next_key;
	struct ino_seen *inos;
	size_t n_inos, cap_inos;
	/* The dirty-set delta: a regular file of more than one name ends it (-EMLINK), the
	 * walk takes over (its names elsewhere are not in the delta). */
	bool no_links;
	char path[ENV_PATH_MAX + 2];
	/* A pre-copy's (supervisor-env-precopy.h): the environment runs, a name can vanish or
	 * be replaced between its stat and its copy; such an entry is left out (the tracer saw
	 * the change, after the set was taken: the frozen phase looks at it again). */
	bool running;
};

/* r is what a name changed under a running scan gives. */
static bool raced(const struct scan *sc, int r)
{
	return sc->running && (r == -ENOENT || r == -ESTALE || r == -ENOTDIR);
}

static int cmp_entry_ptr(const void *a, const void *b)
{
	return strcmp((*(const struct env_entry *const *)a)->path,
		      (*(const struct env_entry *const *)b)->path);
}

static const struct env_entry *base_find(const struct scan *sc, const char *path)
{
	struct env_entry key = {.path = (char *)path};
	const struct env_entry *kp = &key, **hit;

	if (!sc->base_sorted)
		return NULL;
	hit = bsearch(&kp, sc->base_sorted, sc->base->n_entries, sizeof(*sc->base_sorted),
		      cmp_entry_ptr);
	return hit ? *hit : NULL;
}

static bool cancelled(const atomic_bool *cancel)
{
	return cancel && atomic_load_explicit(cancel, memory_order_relaxed);
}

/* Copies len bytes at *off of in to the same offset of out (advancing *off); cancellable
 * (cancel non-NULL): in ENV_FS_COPY_CHUNK pieces, cancel read before each. One copy_file_range
 * of the whole range otherwise (a reflink where the file system has them). 1 when in ended
 * before (it shrank: what was there is what we keep), else 0 or -errno. */
static int copy_range(int in, int out, off_t *off, uint64_t len, const atomic_bool *cancel)
{
	uint64_t done = 0;

	while (done < len) {
		size_t want = (size_t)(len - done);
		off_t at_in = *off, at_out = *off;
		ssize_t n;

		if (cancelled(cancel))
			return -ECANCELED;
		if (cancel && want > ENV_FS_COPY_CHUNK)
			want = ENV_FS_COPY_CHUNK;
		n = copy_file_range(in, &at_in, out, &at_out, want, 0);
		if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS)) {
			char buf[65536];

			n = pread(in, buf, want < sizeof(buf) ? want : sizeof(buf), *off);
			if (n > 0 && pwrite(out, buf, (size_t)n, *off) != n)
				return -EIO;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return 1;
		*off += n;
		done += (uint64_t)n;
	}
	return 0;
}

/* Copies in's data (size bytes) into the empty out: its data extents only, at their offsets,
 * then out's size set to size, so that a hole stays a hole (issue 16 item 10: a 1 GiB sparse
 * file with 2 bytes written is 4 KiB to copy, not 1 GiB). A file system without SEEK_DATA
 * reports the whole file as one extent. ret_copied: the bytes copied. */
static int copy_fd(int in, int out, uint64_t size, const atomic_bool *cancel, uint64_t *ret_copied)
{
	uint64_t copied = 0;
	off_t pos = 0;
	int r;

	while ((uint64_t)pos < size) {
		off_t data = lseek(in, pos, SEEK_DATA), hole;

		if (data < 0 && errno == ENXIO)
			break; /* nothing but a hole to the end */
		if (data < 0)
			return -errno;
		if ((uint64_t)data >= size)
			break;
		hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0)
			return -errno;
		if ((uint64_t)hole > size)
			hole = (off_t)size;
		pos = data;
		r = copy_range(in, out, &pos, (uint64_t)(hole - data), cancel);
		if (r < 0)
			return r;
		copied += (uint64_t)(pos - data);
		if (r > 0) {
			size = (uint64_t)pos; /* it shrank */
			break;
		}
	}
	if (ftruncate(out, (off_t)size) < 0)
		return -errno;
	if (ret_copied)
		*ret_copied = copied;
	return 0;
}

static int copy_data(struct scan *sc, int dirfd, const char *name, const struct stat *st,
		     struct env_entry *e)
{
	_cleanup_close_ int in = -1, out = -1;
	char key[32];
	struct stat st2;
	uint64_t copied = 0;
	int r;

	in = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (in < 0)
		return -errno;
	/* The name may have been swapped since the walk's stat: copy only the file walked. */
	if (fstat(in, &st2) < 0)
		return -errno;
	if (!S_ISREG(st2.st_mode) || st2.st_ino != st->st_ino || st2.st_dev != st->st_dev)
		return -ESTALE;
	e->data_key = sc->next_key++;
	snprintf(key, sizeof(key), "%" PRIu64, e->data_key);
	out = openat(sc->data_fd, key, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (out < 0)
		return -errno;
	r = copy_fd(in, out, (uint64_t)st2.st_size, sc->cancel, &copied);
	if (r < 0)
		return r;
	snprintf(e->src, sizeof(e->src), "%s", sc->out->id);
	sc->stats.bytes += copied;
	sc->stats.files++;
	return 0;
}

static int note_ino(struct scan *sc, const struct stat *st, size_t index)
{
	if (sc->n_inos == sc->cap_inos) {
		size_t cap = sc->cap_inos ? sc->cap_inos * 2 : 16;
		struct ino_seen *a = reallocarray(sc->inos, cap, sizeof(*a));

		if (!a)
			return -ENOMEM;
		sc->inos = a;
		sc->cap_inos = cap;
	}
	sc->inos[sc->n_inos++] =
		(struct ino_seen){.dev = st->st_dev, .ino = st->st_ino, .index = index};
	return 0;
}

static const struct ino_seen *find_ino(const struct scan *sc, const struct stat *st)
{
	for (size_t i = 0; i < sc->n_inos; i++)
		if (sc->inos[i].ino == st->st_ino && sc->inos[i].dev == st->st_dev)
			return &sc->inos[i];
	return NULL;
}

/* e's xattrs: base's when base holds the same inode unchanged since (an xattr's change is a
 * change of its ctime), else read from the object walked (dirfd/name, or dirfd itself for a
 * directory). *ret_owned: e->xattrs is the caller's to free. */
static int scan_xattrs(int dirfd, const char *name, const struct stat *st,
		       const struct env_entry *b, struct env_entry *e, bool *ret_owned)
{
	_cleanup_close_ int fd = -1;
	struct stat st2;

	*ret_owned = false;
	if (b && b->kind == e->kind && b->ino == e->ino && b->ctime_ns == e->ctime_ns) {
		e->xattrs = b->xattrs;
		e->n_xattrs = b->n_xattrs;
		return 0;
	}
	if (e->kind != ENV_ENTRY_DIR) {
		fd = openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			return -errno;
		/* The name may have been swapped since the walk's stat: the object walked only. */
		if (fstat(fd, &st2) < 0)
			return -errno;
		if (st2.st_ino != st->st_ino || st2.st_dev != st->st_dev)
			return -ESTALE;
	}
	*ret_owned = true;
	return xattrs_read(fd >= 0 ? fd : dirfd, e);
}

static int scan_entry(struct scan *sc, int dirfd, const char *name, const struct stat *st)
{
	struct env_entry e = {
		.path = sc->path,
		.mode = st->st_mode & 07777,
		.uid = st->st_uid,
		.gid = st->st_gid,
		.size = (uint64_t)st->st_size,
		.mtime_ns = ts_ns(&st->st_mtim),
		.ctime_ns = ts_ns(&st->st_ctim),
		.ino = st->st_ino,
	};
	const struct env_entry *b = base_find(sc, sc->path);
	char target[ENV_PATH_MAX + 1];
	bool owned = false;
	int r;

	if (S_ISDIR(st->st_mode)) {
		e.kind = ENV_ENTRY_DIR;
		e.size = 0;
	} else if (S_ISREG(st->st_mode)) {
		const struct ino_seen *seen;

		if (sc->no_links && st->st_nlink > 1)
			return -EMLINK;
		seen = st->st_nlink > 1 ? find_ino(sc, st) : NULL;

		if (seen) {
			e.kind = ENV_ENTRY_HARDLINK;
			e.hardlink = sc->out->entries[seen->index].path;
		} else {
			e.kind = ENV_ENTRY_REG;
			if (b && b->kind == ENV_ENTRY_REG && b->ino == e.ino && b->size == e.size &&
			    b->mode == e.mode && b->mtime_ns == e.mtime_ns &&
			    b->ctime_ns == e.ctime_ns &&
			    !(sc->force && sc->force(sc->path, sc->userdata))) {
				snprintf(e.src, sizeof(e.src), "%s", b->src);
				e.data_key = b->data_key;
			} else {
				r = copy_data(sc, dirfd, name, st, &e);
				if (r < 0)
					return r;
			}
			if (st->st_nlink > 1) {
				r = note_ino(sc, st, sc->out->n_entries);
				if (r < 0)
					return r;
			}
		}
	} else if (S_ISLNK(st->st_mode)) {
		ssize_t n = readlinkat(dirfd, name, target, sizeof(target) - 1);

		if (n < 0)
			return -errno;
		target[n] = '\0';
		e.kind = ENV_ENTRY_SYMLINK;
		e.target = target;
	} else if (S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0)) {
		e.kind = ENV_ENTRY_WHITEOUT;
	} else if (S_ISFIFO(st->st_mode)) {
		e.kind = ENV_ENTRY_FIFO;
	} else if (S_ISSOCK(st->st_mode)) {
		/* A socket's inode is file-system state (a stale one stays after its server is
		 * gone, issue 16 item 11); a listening socket's other half is CRIU's. */
		e.kind = ENV_ENTRY_SOCKET;
	} else {
		/* Device nodes are not file-system state an environment can own (its /dev is its
		 * own tmpfs, and it has no CAP_MKNOD). */
		return 0;
	}
	/* A hard link's xattrs are its inode's, on its first name. */
	r = e.kind == ENV_ENTRY_HARDLINK ? 0 : scan_xattrs(dirfd, name, st, b, &e, &owned);
	if (r >= 0 && e.kind == ENV_ENTRY_DIR) {
		const struct env_xattr *opq = env_entry_xattr(&e, OVL_OPAQUE_XATTR);

		e.opaque = opq && opq->len > 0 && ((const char *)opq->value)[0] == 'y';
	}
	if (r >= 0)
		r = env_manifest_add(sc->out, &e);
	if (r < 0 && raced(sc, r) && e.kind == ENV_ENTRY_REG && strcmp(e.src, sc->out->id) == 0) {
		/* left out: its copy too */
		char key[32];

		snprintf(key, sizeof(key), "%" PRIu64, e.data_key);
		(void)unlinkat(sc->data_fd, key, 0);
	}
	if (owned)
		env_xattrs_free(e.xattrs, e.n_xattrs);
	return r;
}

/* A DIR of its own on a dup of dirfd (closedir leaves dirfd open); NULL with errno set. */
static DIR *dir_reopen(int dirfd)
{
	int fd = dup(dirfd);
	DIR *d;

	if (fd < 0)
		return NULL;
	d = fdopendir(fd);
	if (!d)
		(void)close(fd);
	return d;
}

/* Appends name (n bytes) to the walk's path of plen bytes ("" at the top) with a '/' between;
 * path holds ENV_PATH_MAX + 1 bytes at least. 0, or -ENAMETOOLONG and path unchanged. */
static int path_append(char *path, size_t plen, const char *name, size_t n)
{
	if (plen + !!plen + n > ENV_PATH_MAX)
		return -ENAMETOOLONG;
	if (plen)
		path[plen] = '/';
	memcpy(path + plen + !!plen, name, n + 1);
	return 0;
}

static int scan_dir(struct scan *sc, int dirfd, size_t plen, unsigned depth)
{
	DIR *d;
	struct dirent *de;
	int r = 0;

	if (depth > WALK_DEPTH_MAX)
		return -ELOOP;
	d = dir_reopen(dirfd);
	if (!d)
		return -errno;
	while (r >= 0 && (errno = 0, de = readdir(d))) {
		size_t n = strlen(de->d_name);
		struct stat st;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (cancelled(sc->cancel)) {
			r = -ECANCELED;
			break;
		}
		if (path_append(sc->path, plen, de->d_name, n) < 0) {
			r = -ENAMETOOLONG;
			break;
		}
		if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			r = -errno;
			if (raced(sc, r)) {
				r = 0;
				sc->path[plen] = '\0';
				continue;
			}
			break;
		}
		if (S_ISDIR(st.st_mode)) {
			_cleanup_close_ int sub = openat(
				dirfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (sub < 0) {
				r = -errno;
				if (raced(sc, r)) {
					r = 0;
					sc->path[plen] = '\0';
					continue;
				}
				break;
			}
			r = scan_entry(sc, sub, de->d_name, &st);
			if (r >= 0)
				r = scan_dir(sc, sub, plen + !!plen + n, depth + 1);
			/* a directory removed or moved while read: the tracer has it with its
			 * subtree; the rest of this one is still read */
			if (raced(sc, r))
				r = 0;
		} else {
			r = scan_entry(sc, dirfd, de->d_name, &st);
			if (raced(sc, r))
				r = 0;
		}
		sc->path[plen] = '\0';
	}
	if (r >= 0 && errno)
		r = -errno;
	closedir(d);
	return r;
}

int env_fs_scan(int upper_fd, const struct env_manifest *base, env_fs_force_cb force,
		void *userdata, const atomic_bool *cancel, int data_fd, struct env_manifest *out,
		struct env_fs_stats *ret_stats)
{
	struct scan sc = {
		.base = base,
		.force = force,
		.userdata = userdata,
		.cancel = cancel,
		.data_fd = data_fd,
		.out = out,
	};
	int r;

	if (base && base->by_path) {
		sc.base_sorted = base->by_path; /* env_manifest_index's, built before the freeze */
	} else if (base && base->n_entries) {
		const struct env_entry **a = calloc(base->n_entries, sizeof(*a));

		if (!a)
			return -ENOMEM;
		for (size_t i = 0; i < base->n_entries; i++)
			a[i] = &base->entries[i];
		qsort(a, base->n_entries, sizeof(*a), cmp_entry_ptr);
		sc.base_sorted = a;
	}
	r = scan_dir(&sc, upper_fd, 0, 0);
	if (r >= 0 && base && base->n_entries) {
		/* Deletions since the parent: its paths no longer here. */
		const struct env_entry **now = calloc(out->n_entries + 1, sizeof(*now));

		if (!now)
			r = -ENOMEM;
		for (size_t i = 0; now && i < out->n_entries; i++)
			now[i] = &out->entries[i];
		if (now)
			qsort(now, out->n_entries, sizeof(*now), cmp_entry_ptr);
		for (size_t i = 0; now && i < base->n_entries; i++) {
			const struct env_entry *kp = &base->entries[i];

			sc.stats.removed +=
				!bsearch(&kp, now, out->n_entries, sizeof(*now), cmp_entry_ptr);
		}
		free(now);
	}
	if (!(base && base->by_path))
		free((void *)sc.base_sorted);
	free(sc.inos);
	if (r >= 0 && ret_stats)
		*ret_stats = sc.stats;
	return r;
}

/* --- wipe ------------------------------------------------------------------------------ */

static int wipe_dir(int dirfd, unsigned depth)
{
	DIR *d;
	struct dirent *de;
	int r = 0;

	if (depth > WALK_DEPTH_MAX)
		return -ELOOP;
	d = dir_reopen(dirfd);
	if (!d)
		return -errno;
	while (r >= 0 && (de = readdir(d))) {
		struct stat st;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			r = -errno;
			break;
		}
		if (S_ISDIR(st.st_mode)) {
			_cleanup_close_ int sub = openat(
				dirfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (sub < 0) {
				r = -errno;
				break;
			}
			r = wipe_dir(sub, depth + 1);
			if (r >= 0 && unlinkat(dirfd, de->d_name, AT_REMOVEDIR) < 0)
				r = -errno;
		} else if (unlinkat(dirfd, de->d_name, 0) < 0) {
			r = -errno;
		}
	}
	closedir(d);
	return r;
}

int env_fs_wipe(int dir_fd)
{
	return wipe_dir(dir_fd, 0);
}

/* --- rebuild --------------------------------------------------------------------------- */

/* Splits path into its parent's fd (opened beneath upper_fd) and the last component. */
static int open_parent(int upper_fd, const char *path, const char **ret_name)
{
	const char *slash = strrchr(path, '/');
	char parent[ENV_PATH_MAX + 1];

	if (!slash) {
		int fd = fcntl(upper_fd, F_DUPFD_CLOEXEC, 3);

		*ret_name = path;
		return fd < 0 ? -errno : fd;
	}
	memcpy(parent, path, (size_t)(slash - path));
	parent[slash - path] = '\0';
	*ret_name = slash + 1;
	return openat_beneath(upper_fd, parent, O_RDONLY | O_DIRECTORY, 0);
}

static int set_times(int dirfd, const char *name, const struct env_entry *e, int flags)
{
	struct timespec ts[2] = {
		{.tv_sec = (time_t)(e->mtime_ns / 1000000000ull),
		 .tv_nsec = (long)(e->mtime_ns % 1000000000ull)},
	};

	ts[1] = ts[0];
	return utimensat(dirfd, name, ts, flags) < 0 ? -errno : 0;
}

/* Owner, xattrs, mode, times, in that order: a chown drops security.capability (and the
 * set-id bits); setting an ACL sets the mode's group bits, the chmod after it the ACL's mask,
 * to what they both were. */
static int set_metadata(int pfd, const char *name, const struct env_entry *e)
{
	int r;

	if (fchownat(pfd, name, e->uid, e->gid, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	r = xattrs_apply(pfd, name, e);
	if (r < 0)
		return r;
	if (e->kind != ENV_ENTRY_SYMLINK && fchmodat(pfd, name, e->mode, 0) < 0)
		return -errno;
	return set_times(pfd, name, e, AT_SYMLINK_NOFOLLOW);
}

static int rebuild_entry(int upper_fd, const struct env_entry *e, int ckpts_fd)
{
	_cleanup_close_ int pfd = -1;
	const char *name;
	char key[ENV_ID_MAX + 48];
	int r;

	pfd = open_parent(upper_fd, e->path, &name);
	if (pfd < 0)
		return pfd;
	switch (e->kind) {
	case ENV_ENTRY_DIR:
		if (mkdirat(pfd, name, 0700) < 0)
			return -errno;
		/* Owner, xattrs, mode and times once its content is in (dirs_metadata): a default
		 * ACL set now would be inherited by what is created in it. */
		return 0;
	case ENV_ENTRY_REG: {
		_cleanup_close_ int in = -1, out = -1;
		struct stat st;

		snprintf(key, sizeof(key), "%s/data/%" PRIu64, e->src, e->data_key);
		in = openat_beneath(ckpts_fd, key, O_RDONLY, 0);
		if (in < 0)
			return in == -ENOENT ? -ENOLINK : in;
		if (fstat(in, &st) < 0)
			return -errno;
		if (!S_ISREG(st.st_mode))
			return -EBADMSG;
		out = openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (out < 0)
			return -errno;
		r = copy_fd(in, out, (uint64_t)st.st_size, NULL, NULL);
		if (r < 0)
			return r;
		break; /* written: a chown and the xattrs come after the data */
	}
	case ENV_ENTRY_HARDLINK: {
		_cleanup_close_ int tfd = -1;
		const char *tname;

		tfd = open_parent(upper_fd, e->hardlink, &tname);
		if (tfd < 0)
			return tfd;
		return linkat(tfd, tname, pfd, name, 0) < 0 ? -errno : 0;
	}
	case ENV_ENTRY_SYMLINK:
		if (symlinkat(e->target, pfd, name) < 0)
			return -errno;
		break;
	case ENV_ENTRY_WHITEOUT:
		if (mknodat(pfd, name, S_IFCHR | 0, makedev(0, 0)) < 0)
			return -errno;
		break;
	case ENV_ENTRY_FIFO:
		if (mknodat(pfd, name, S_IFIFO | (e->mode & 07777), 0) < 0)
			return -errno;
		break;
	case ENV_ENTRY_SOCKET:
		if (mknodat(pfd, name, S_IFSOCK | (e->mode & 07777), 0) < 0)
			return -errno;
		break;
	default:
		return -EBADMSG;
	}
	return set_metadata(pfd, name, e);
}

/* Directories last, deepest first: their mtime must survive their content's creation. */
static int dirs_metadata(int upper_fd, const struct env_manifest *m)
{
	int r;

	for (size_t i = m->n_entries; i-- > 0;) {
		const struct env_entry *e = &m->entries[i];
		_cleanup_close_ int pfd = -1;
		const char *name;

		if (e->kind != ENV_ENTRY_DIR)
			continue;
		pfd = open_parent(upper_fd, e->path, &name);
		if (pfd < 0)
			return pfd;
		r = set_metadata(pfd, name, e);
		if (r < 0)
			return r;
	}
	return 0;
}

int env_fs_rebuild(int upper_fd, const struct env_manifest *m, int ckpts_fd)
{
	int r;

	for (size_t i = 0; i < m->n_entries; i++) {
		r = rebuild_entry(upper_fd, &m->entries[i], ckpts_fd);
		if (r < 0)
			return r;
	}
	return dirs_metadata(upper_fd, m);
}

/* --- rollback ---------------------------------------------------------------------------- */

struct rollback {
	const struct env_manifest *cur, *target;
	const struct env_entry **cur_sorted, **tgt_sorted;
	bool *kept; /* per target entry */
	char path[ENV_PATH_MAX + 2];
};

static const struct env_entry *find_in(const struct env_entry **arr, size_t n, const char *path)
{
	struct env_entry key = {.path = (char *)path};
	const struct env_entry *kp = &key, **hit;

	if (!arr)
		return NULL;
	hit = bsearch(&kp, arr, n, sizeof(*arr), cmp_entry_ptr);
	return hit ? *hit : NULL;
}

static const struct env_entry **sorted_of(const struct env_manifest *m)
{
	const struct env_entry **a = calloc(m->n_entries + 1, sizeof(*a));

	if (!a)
		return NULL;
	for (size_t i = 0; i < m->n_entries; i++)
		a[i] = &m->entries[i];
	qsort(a, m->n_entries, sizeof(*a), cmp_entry_ptr);
	return a;
}

/* A regular file that is, byte for byte, the target's: unchanged since cur was taken (same
 * inode, ctime, mtime, size, one link) and cur and the target name the same data. */
static bool file_is_targets(const struct rollback *rb, const struct stat *st,
			    const struct env_entry *t)
{
	const struct env_entry *c = find_in(rb->cur_sorted, rb->cur->n_entries, rb->path);

	return c && c->kind == ENV_ENTRY_REG && t->kind == ENV_ENTRY_REG && st->st_nlink == 1 &&
	       c->ino == st->st_ino && c->ctime_ns == ts_ns(&st->st_ctim) &&
	       c->mtime_ns == ts_ns(&st->st_mtim) && c->size == (uint64_t)st->st_size &&
	       c->data_key == t->data_key && strcmp(c->src, t->src) == 0;
}

/* Removes from the upper layer whatever the target does not hold as it is now. */
static int prune_dir(struct rollback *rb, int dirfd, size_t plen, unsigned depth)
{
	struct dirent *de;
	int r = 0;
	DIR *d;

	if (depth > WALK_DEPTH_MAX)
		return -ELOOP;
	d = dir_reopen(dirfd);
	if (!d)
		return -errno;
	while (r >= 0 && (errno = 0, de = readdir(d))) {
		size_t n = strlen(de->d_name);
		const struct env_entry *t;
		struct stat st;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (path_append(rb->path, plen, de->d_name, n) < 0) {
			r = -ENAMETOOLONG;
			break;
		}
		if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			r = -errno;
			break;
		}
		t = find_in(rb->tgt_sorted, rb->target->n_entries, rb->path);
		if (S_ISDIR(st.st_mode)) {
			_cleanup_close_ int sub = openat(
				dirfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

			if (sub < 0) {
				r = -errno;
				break;
			}
			if (t && t->kind == ENV_ENTRY_DIR) {
				rb->kept[t - rb->target->entries] = true;
				r = prune_dir(rb, sub, plen + !!plen + n, depth + 1);
			} else {
				r = wipe_dir(sub, depth + 1);
				if (r >= 0 && unlinkat(dirfd, de->d_name, AT_REMOVEDIR) < 0)
					r = -errno;
			}
		} else if (S_ISREG(st.st_mode) && t && file_is_targets(rb, &st, t)) {
			rb->kept[t - rb->target->entries] = true;
		} else if (unlinkat(dirfd, de->d_name, 0) < 0) {
			r = -errno;
		}
		rb->path[plen] = '\0';
	}
	if (r >= 0 && errno)
		r = -errno;
	closedir(d);
	return r;
}

int env_fs_rollback(int upper_fd, const struct env_manifest *cur, const struct env_manifest *target,
		    int ckpts_fd)
{
	struct rollback rb = {.cur = cur, .target = target};
	int r = -ENOMEM;

	rb.cur_sorted = sorted_of(cur);
	rb.tgt_sorted = sorted_of(target);
	rb.kept = calloc(target->n_entries + 1, sizeof(*rb.kept));
	if (!rb.cur_sorted || !rb.tgt_sorted || !rb.kept)
		goto out;
	r = prune_dir(&rb, upper_fd, 0, 0);
	for (size_t i = 0; r >= 0 && i < target->n_entries; i++) {
		const struct env_entry *e = &target->entries[i];
		_cleanup_close_ int pfd = -1;
		const char *name;

		if (!rb.kept[i]) {
			r = rebuild_entry(upper_fd, e, ckpts_fd);
			continue;
		}
		/* A kept directory's metadata (xattrs: opaque or not) is dirs_metadata's; a kept
		 * file's xattrs are set again after its chown, which drops a capability. */
		if (e->kind == ENV_ENTRY_DIR)
			continue;
		pfd = open_parent(upper_fd, e->path, &name);
		if (pfd < 0) {
			r = pfd;
			break;
		}
		r = set_metadata(pfd, name, e);
	}
	if (r >= 0)
		r = dirs_metadata(upper_fd, target);
out:
	free(rb.cur_sorted);
	free(rb.tgt_sorted);
	free(rb.kept);
	return r;
}

int env_fs_refresh(int upper_fd, struct env_manifest *m)
{
	for (size_t i = 0; i < m->n_entries; i++) {
		struct env_entry *e = &m->entries[i];
		_cleanup_close_ int pfd = -1;
		const char *name;
		struct stat st;

		pfd = open_parent(upper_fd, e->path, &name);
		if (pfd < 0)
			return pfd;
		if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			return -errno;
		e->ino = st.st_ino;
		e->ctime_ns = ts_ns(&st.st_ctim);
	}
	return 0;
}

/* --- the delta from the dirty set -------------------------------------------------------- */

struct touch {
	char *path; /* relative */
	bool subtree;
};

static int cmp_touch(const void *a, const void *b)
{
	return strcmp(((const struct touch *)a)->path, ((const struct touch *)b)->path);
}

static bool always(const char *path, void *userdata)
{
	(void)path;
	(void)userdata;
	return true;
}

void env_fs_gone_finish(struct env_fs_gone *g)
{
	for (size_t i = 0; i < g->n; i++)
		free(g->paths[i]);
	free(g->paths);
	free(g->below);
	*g = (struct env_fs_gone){0};
}

static int gone_add(struct env_fs_gone *g, const char *path, bool below)
{
	if (g->n == g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 16;
		char **p = reallocarray(g->paths, cap, sizeof(*p));
		bool *b;

		if (!p)
			return -ENOMEM;
		g->paths = p;
		b = reallocarray(g->below, cap, sizeof(*b));
		if (!b)
			return -ENOMEM;
		g->below = b;
		g->cap = cap;
	}
	g->paths[g->n] = strdup(path);
	if (!g->paths[g->n])
		return -ENOMEM;
	g->below[g->n++] = below;
	return 0;
}

/* The first index of m->by_path whose path is >= key. */
static size_t lower_bound(const struct env_manifest *m, const char *key)
{
	size_t lo = 0, hi = m->n_entries;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(m->by_path[mid]->path, key) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Calls f for base's entry at path (when there) and, when below, every one under path/:
 * contiguous in by_path (everything that starts with "path/" sorts together). */
static int base_range(const struct env_manifest *base, const char *path, bool below,
		      int (*f)(const struct env_manifest *base, const struct env_entry *e, void *u),
		      void *u)
{
	char key[ENV_PATH_MAX + 2];
	size_t n = strlen(path), i;
	const struct env_entry *e;
	int r;

	if (!base || !base->by_path)
		return 0;
	e = env_manifest_find(base, path);
	if (e && (r = f(base, e, u)) < 0)
		return r;
	if (!below || n + 1 > ENV_PATH_MAX)
		return 0;
	memcpy(key, path, n);
	key[n] = '/';
	key[n + 1] = '\0';
	for (i = lower_bound(base, key); i < base->n_entries; i++) {
		e = base->by_path[i];
		if (strncmp(e->path, key, n + 1) != 0)
			break;
		r = f(base, e, u);
		if (r < 0)
			return r;
	}
	return 0;
}

/* A base entry that goes or changes: a hard link, or a file one names, is not ours to change
 * alone (its other names are not in the delta). */
static int check_links(const struct env_manifest *base, const struct env_entry *e, void *u)
{
	(void)u;
	if (e->kind == ENV_ENTRY_HARDLINK ||
	    (e->kind == ENV_ENTRY_REG && env_manifest_link_target(base, e->path)))
		return -EMLINK;
	return 0;
}

/* The dirty paths relative, each with its ancestors (for themselves), sorted, merged, and
 * without what lies below a path dirty with its subtree (its scan covers it). */
static int touches_of(const struct env_fs_dirty *dirty, size_t n_dirty, struct touch **ret,
		      size_t *ret_n)
{
	struct touch *t = NULL;
	size_t n = 0, cap = 0, k = 0;
	int r = 0;

	for (size_t i = 0; i < n_dirty && r >= 0; i++) {
		const char *p = dirty[i].path;
		size_t len;

		while (*p == '/')
			p++;
		len = strlen(p);
		while (len > 0 && p[len - 1] == '/')
			len--;
		if (len == 0) {
			if (dirty[i].subtree)
				r = -ENOTRECOVERABLE; /* everything: that is a walk */
			continue;
		}
		/* a name no index entry can have (too long, not normalized): the walk decides */
		if (len > ENV_PATH_MAX) {
			r = -ENOTRECOVERABLE;
			break;
		}
		/* the path, then each ancestor */
		for (bool first = true; len > 0; first = false) {
			if (n == cap) {
				size_t c = cap ? cap * 2 : 64;
				struct touch *a = reallocarray(t, c, sizeof(*a));

				if (!a) {
					r = -ENOMEM;
					break;
				}
				t = a;
				cap = c;
			}
			t[n].path = strndup(p, len);
			if (!t[n].path) {
				r = -ENOMEM;
				break;
			}
			if (first && !env_path_valid(t[n].path)) {
				free(t[n].path);
				r = -ENOTRECOVERABLE;
				break;
			}
			t[n].subtree = first && dirty[i].subtree;
			n++;
			while (len > 0 && p[len - 1] != '/')
				len--;
			if (len > 0)
				len--;
		}
	}
	if (r < 0)
		goto fail;
	if (n)
		qsort(t, n, sizeof(*t), cmp_touch);
	for (size_t i = 0; i < n; i++) {
		/* a duplicate: one entry, subtree if either was */
		if (k > 0 && strcmp(t[k - 1].path, t[i].path) == 0) {
			t[k - 1].subtree |= t[i].subtree;
			free(t[i].path);
			continue;
		}
		t[k++] = t[i];
	}
	n = k;
	k = 0;
	for (size_t i = 0; i < n; i++) {
		/* below a kept path dirty with its subtree (an ancestor: kept before it) */
		bool covered = false;
		char *c = t[i].path;

		while (!covered && (c = strchr(c, '/'))) {
			struct touch key = {.path = t[i].path}, *hit;

			*c = '\0';
			hit = bsearch(&key, t, k, sizeof(*t), cmp_touch);
			*c++ = '/';
			covered = hit && hit->subtree;
		}
		if (covered) {
			free(t[i].path);
			continue;
		}
		t[k++] = t[i];
	}
	*ret = t;
	*ret_n = k;
	return 0;
fail:
	for (size_t i = 0; i < n; i++)
		free(t[i].path);
	free(t);
	return r;
}

/* One touched path: looked up in the upper layer (never through a symlink); what it is now
 * into the delta, what went of base's into gone. */
static int scan_touch(struct scan *sc, int upper_fd, const struct touch *t, struct env_fs_gone *g)
{
	_cleanup_close_ int pfd = -1, sub = -1;
	const char *name;
	size_t plen = strlen(t->path);
	unsigned depth = 0;
	struct stat st;
	int r;

	for (const char *c = t->path; *c; c++)
		depth += *c == '/';
	memcpy(sc->path, t->path, plen + 1);
	pfd = open_parent(upper_fd, t->path, &name);
	if (pfd < 0 && pfd != -ENOENT && pfd != -ENOTDIR && pfd != -ELOOP && pfd != -EXDEV)
		return pfd;
	if (pfd < 0 || fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (pfd >= 0 && errno != ENOENT)
			return -errno;
		/* gone, with all it held */
		r = base_range(sc->base, t->path, true, check_links, NULL);
		return r < 0 ? r : gone_add(g, t->path, true);
	}
	/* base's entry (and, when rescanned or no longer a directory, what it had below) goes
	 * unless the delta has it again */
	r = base_range(sc->base, t->path, t->subtree || !S_ISDIR(st.st_mode), check_links, NULL);
	if (r >= 0)
		r = gone_add(g, t->path, t->subtree || !S_ISDIR(st.st_mode));
	if (r < 0)
		return r;
	if (!S_ISDIR(st.st_mode)) {
		r = scan_entry(sc, pfd, name, &st);
		return raced(sc, r) ? 0 : r;
	}
	sub = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sub < 0)
		return raced(sc, -errno) ? 0 : -errno;
	r = scan_entry(sc, sub, name, &st);
	if (r >= 0 && t->subtree)
		r = scan_dir(sc, sub, plen, depth + 1);
	return raced(sc, r) ? 0 : r;
}

int env_fs_scan_dirty(int upper_fd, const struct env_manifest *base,
		      const struct env_fs_dirty *dirty, size_t n_dirty, const atomic_bool *cancel,
		      int data_fd, struct env_manifest *out, struct env_fs_gone *out_gone,
		      struct env_fs_stats *ret_stats)
{
	return env_fs_scan_dirty_keyed(upper_fd, base, dirty, n_dirty, cancel, data_fd, 0, false,
				       out, out_gone, ret_stats);
}

int env_fs_scan_dirty_keyed(int upper_fd, const struct env_manifest *base,
			    const struct env_fs_dirty *dirty, size_t n_dirty,
			    const atomic_bool *cancel, int data_fd, uint64_t first_key,
			    bool running, struct env_manifest *out, struct env_fs_gone *out_gone,
			    struct env_fs_stats *ret_stats)
{
	struct scan sc = {
		.next_key = first_key,
		.running = running,
		.base = base,
		.base_sorted = base ? base->by_path : NULL,
		.force = always, /* dirty: copied, whatever its metadata says */
		.cancel = cancel,
		.data_fd = data_fd,
		.out = out,
		.no_links = true,
	};
	struct touch *t = NULL;
	size_t n = 0;
	int r;

	if (base && base->n_entries && !base->by_path)
		return -EINVAL; /* env_manifest_index first: no sort while frozen */
	r = touches_of(dirty, n_dirty, &t, &n);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n && r >= 0; i++) {
		if (cancelled(cancel))
			r = -ECANCELED;
		else
			r = scan_touch(&sc, upper_fd, &t[i], out_gone);
	}
	for (size_t i = 0; i < n; i++)
		free(t[i].path);
	free(t);
	free(sc.inos);
	if (r >= 0 && ret_stats)
		*ret_stats = sc.stats;
	return r;
}

struct apply {
	const struct env_manifest *base;
	bool *drop;
};

static int mark_drop(const struct env_manifest *base, const struct env_entry *e, void *u)
{
	struct apply *a = u;

	a->drop[e - base->entries] = true;
	return 0;
}

int env_fs_delta_apply(const struct env_manifest *base, const struct env_manifest *delta,
		       const struct env_fs_gone *gone, struct env_manifest *full,
		       uint64_t *ret_removed)
{
	const struct env_entry **ds = NULL;
	struct apply a = {.base = base};
	bool *used = NULL;
	uint64_t removed = 0;
	int r = -ENOMEM;

	ds = sorted_of(delta);
	used = calloc(delta->n_entries + 1, sizeof(*used));
	a.drop = calloc((base ? base->n_entries : 0) + 1, sizeof(*a.drop));
	if (!ds || !used || !a.drop)
		goto out;
	r = 0;
	for (size_t i = 0; base && i < gone->n && r >= 0; i++)
		r = base_range(base, gone->paths[i], gone->below[i], mark_drop, &a);
	/* base's order; a changed entry in its place */
	for (size_t i = 0; base && i < base->n_entries && r >= 0; i++) {
		const struct env_entry *e = &base->entries[i];
		const struct env_entry *d = find_in(ds, delta->n_entries, e->path);

		if (d) {
			used[d - delta->entries] = true;
			r = env_manifest_add(full, d);
		} else if (a.drop[i]) {
			removed++;
		} else {
			r = env_manifest_add(full, e);
		}
	}
	/* the new ones, by path: a directory before what it holds */
	for (size_t i = 0; i < delta->n_entries && r >= 0; i++)
		if (!used[ds[i] - delta->entries])
			r = env_manifest_add(full, ds[i]);
	if (r >= 0 && ret_removed)
		*ret_removed = removed;
out:
	free(ds);
	free(used);
	free(a.drop);
	return r;
}

/* --- the rollback by what differs --------------------------------------------------------- */

/* Overlay makes whiteouts as hard links of one shared inode (its workdir's): any whiteout
 * made or removed changes every whiteout's ctime, so theirs (and their inode) say nothing. */
static bool entry_same(const struct env_entry *a, const struct env_entry *b)
{
	bool wh = a->kind == ENV_ENTRY_WHITEOUT;

	if (a->kind != b->kind || a->mode != b->mode || a->uid != b->uid || a->gid != b->gid ||
	    a->size != b->size || a->mtime_ns != b->mtime_ns ||
	    (!wh && (a->ctime_ns != b->ctime_ns || a->ino != b->ino)) || a->opaque != b->opaque ||
	    a->n_xattrs != b->n_xattrs || a->data_key != b->data_key ||
	    strcmp(a->src, b->src) != 0 ||
	    strcmp(a->target ? a->target : "", b->target ? b->target : "") != 0 ||
	    strcmp(a->hardlink ? a->hardlink : "", b->hardlink ? b->hardlink : "") != 0)
		return false;
	for (uint32_t i = 0; i < a->n_xattrs; i++) {
		const struct env_xattr *y = env_entry_xattr(b, a->xattrs[i].name);

		if (!y || y->len != a->xattrs[i].len ||
		    memcmp(y->value, a->xattrs[i].value, y->len) != 0)
			return false;
	}
	return true;
}

struct rb_touch {
	struct env_fs_dirty *v;
	char **owned;
	size_t n, cap, n_owned;
};

static int rb_touch_add(struct rb_touch *t, const char *rel, bool subtree)
{
	char *p;

	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 64;
		struct env_fs_dirty *v = reallocarray(t->v, cap, sizeof(*v));
		char **o;

		if (!v)
			return -ENOMEM;
		t->v = v;
		o = reallocarray(t->owned, cap, sizeof(*o));
		if (!o)
			return -ENOMEM;
		t->owned = o;
		t->cap = cap;
	}
	if (asprintf(&p, "/%s", rel) < 0)
		return -ENOMEM;
	t->owned[t->n_owned++] = p;
	t->v[t->n++] = (struct env_fs_dirty){.path = p, .subtree = subtree};
	return 0;
}

/* The paths whose entries differ between cur and target (both indexed): changed, only in one
 * (what cur alone has goes with its subtree). */
static int diff_indexes(const struct env_manifest *cur, const struct env_manifest *target,
			struct rb_touch *t)
{
	size_t i = 0, k = 0;
	int r = 0;

	while (r >= 0 && (i < cur->n_entries || k < target->n_entries)) {
		const struct env_entry *a = i < cur->n_entries ? cur->by_path[i] : NULL;
		const struct env_entry *b = k < target->n_entries ? target->by_path[k] : NULL;
		int c = !a ? 1 : !b ? -1 : strcmp(a->path, b->path);

		if (c < 0) {
			r = rb_touch_add(t, a->path, true);
			i++;
		} else if (c > 0) {
			r = rb_touch_add(t, b->path, false);
			k++;
		} else {
			if (!entry_same(a, b))
				r = rb_touch_add(t, a->path, a->kind != b->kind);
			i++;
			k++;
		}
	}
	return r;
}

static int rb_check_links(const struct env_manifest *m, const struct env_entry *e, void *u)
{
	(void)u;
	return check_links(m, e, NULL);
}

/* dirfd/name removed, whatever it is (a directory with all it holds). */
static int remove_at(int dirfd, const char *name)
{
	struct stat st;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (S_ISDIR(st.st_mode)) {
		_cleanup_close_ int sub =
			openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		int r;

		if (sub < 0)
			return -errno;
		r = wipe_dir(sub, 1);
		if (r < 0)
			return r;
		return unlinkat(dirfd, name, AT_REMOVEDIR) < 0 ? -errno : 0;
	}
	return unlinkat(dirfd, name, 0) < 0 ? -errno : 0;
}

/* An entry's inode and ctime as on disk now (after its rebuild). */
static int refresh_entry(int upper_fd, const struct env_entry *e)
{
	_cleanup_close_ int pfd = -1;
	struct env_entry *w = (struct env_entry *)e; /* the caller's own index */
	const char *name;
	struct stat st;

	pfd = open_parent(upper_fd, e->path, &name);
	if (pfd < 0)
		return pfd;
	if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	w->ino = st.st_ino;
	w->ctime_ns = ts_ns(&st.st_ctim);
	return 0;
}

struct rb_dirs {
	const struct env_entry **v;
	size_t n, cap;
};

static int rb_dir_add(struct rb_dirs *d, const struct env_entry *e)
{
	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 64;
		const struct env_entry **v = reallocarray(d->v, cap, sizeof(*v));

		if (!v)
			return -ENOMEM;
		d->v = v;
		d->cap = cap;
	}
	d->v[d->n++] = e;
	return 0;
}

/* One touched path made what target says: what is there removed (kept when both are
 * directories and only the directory itself is touched), target's entry (and, for a subtree,
 * everything target has below it) rebuilt. Directories' metadata afterwards (dirs). */
static int rollback_touch(int upper_fd, const struct env_manifest *target, const struct touch *t,
			  int ckpts_fd, struct rb_dirs *dirs)
{
	const struct env_entry *te = env_manifest_find(target, t->path);
	_cleanup_close_ int pfd = -1;
	const char *name;
	struct stat st;
	bool there, sub;
	int r;

	pfd = open_parent(upper_fd, t->path, &name);
	if (pfd < 0 && pfd != -ENOENT && pfd != -ENOTDIR && pfd != -ELOOP && pfd != -EXDEV)
		return pfd;
	if (pfd < 0) {
		/* no parent: target has none either (a parent is touched first, sorted) */
		return te ? -ENOENT : 0;
	}
	there = fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
	if (!there && errno != ENOENT)
		return -errno;
	if (there && te && te->kind == ENV_ENTRY_DIR && S_ISDIR(st.st_mode) && !t->subtree)
		return rb_dir_add(dirs, te); /* kept: its metadata later */
	if (there) {
		r = remove_at(pfd, name);
		if (r < 0)
			return r;
	}
	if (!te)
		return 0;
	/* a directory made anew gets all target has below it */
	sub = t->subtree || te->kind == ENV_ENTRY_DIR;
	r = rebuild_entry(upper_fd, te, ckpts_fd);
	if (r >= 0 && te->kind == ENV_ENTRY_DIR)
		r = rb_dir_add(dirs, te);
	if (r >= 0 && te->kind != ENV_ENTRY_DIR)
		r = refresh_entry(upper_fd, te);
	if (r < 0 || te->kind != ENV_ENTRY_DIR || !sub)
		return r;
	/* everything target has below it, parents first (by path) */
	{
		size_t n = strlen(t->path);
		char key[ENV_PATH_MAX + 2];

		memcpy(key, t->path, n);
		key[n] = '/';
		key[n + 1] = '\0';
		for (size_t i = lower_bound(target, key); r >= 0 && i < target->n_entries; i++) {
			const struct env_entry *e = target->by_path[i];

			if (strncmp(e->path, key, n + 1) != 0)
				break;
			r = rebuild_entry(upper_fd, e, ckpts_fd);
			if (r >= 0)
				r = e->kind == ENV_ENTRY_DIR ? rb_dir_add(dirs, e)
							     : refresh_entry(upper_fd, e);
		}
	}
	return r;
}

static int cmp_entry_ptr_desc(const void *a, const void *b)
{
	return -cmp_entry_ptr(a, b);
}

int env_fs_rollback_dirty(int upper_fd, struct env_manifest *cur, struct env_manifest *target,
			  const struct env_fs_dirty *dirty, size_t n_dirty, int ckpts_fd)
{
	struct rb_touch extra = {0};
	struct rb_dirs dirs = {0};
	struct touch *t = NULL;
	size_t n = 0;
	int r;

	if (!env_manifest_index(cur) || !env_manifest_index(target))
		return -ENOMEM;
	/* the dirty paths, and what differs between the two indexes */
	for (size_t i = 0; i < n_dirty; i++) {
		r = rb_touch_add(&extra,
				 dirty[i].path[0] == '/' ? dirty[i].path + 1 : dirty[i].path,
				 dirty[i].subtree);
		if (r < 0)
			goto out;
	}
	r = cur == target ? 0 : diff_indexes(cur, target, &extra);
	if (r >= 0)
		r = touches_of(extra.v, extra.n, &t, &n);
	/* a hard link's other names are not touched: the full rollback */
	for (size_t i = 0; r >= 0 && i < n; i++) {
		r = base_range(cur, t[i].path, t[i].subtree, rb_check_links, NULL);
		if (r >= 0)
			r = base_range(target, t[i].path, t[i].subtree, rb_check_links, NULL);
	}
	for (size_t i = 0; r >= 0 && i < n; i++)
		r = rollback_touch(upper_fd, target, &t[i], ckpts_fd, &dirs);
	/* directories last, deepest first: their mtime survives what was made in them */
	if (r >= 0 && dirs.n)
		qsort(dirs.v, dirs.n, sizeof(*dirs.v), cmp_entry_ptr_desc);
	for (size_t i = 0; r >= 0 && i < dirs.n; i++) {
		_cleanup_close_ int pfd = -1;
		const char *name;

		if (i > 0 && dirs.v[i] == dirs.v[i - 1])
			continue;
		pfd = open_parent(upper_fd, dirs.v[i]->path, &name);
		if (pfd < 0) {
			r = pfd;
			break;
		}
		r = set_metadata(pfd, name, dirs.v[i]);
		if (r >= 0)
			r = refresh_entry(upper_fd, dirs.v[i]);
	}
out:
	for (size_t i = 0; i < n; i++)
		free(t[i].path);
	free(t);
	for (size_t i = 0; i < extra.n_owned; i++)
		free(extra.owned[i]);
	free(extra.owned);
	free(extra.v);
	free(dirs.v);
	return r;
}
