/* SPDX-License-Identifier: MIT */
/*
 * Layer unpacking (see supervisor-image-unpack.h). Two libarchive readers in a chain: the
 * outer one ("raw" format, gzip/zstd/no filter) turns the blob into the uncompressed tar and
 * hashes the blob as it reads it; the inner one (tar) reads that stream and hashes it again
 * (the diff_id). Both are drained to their ends before the digests are compared, so that
 * bytes after the tar's end-of-archive blocks are verified too.
 *
 * Entries are created with *at() calls relative to directory fds opened component by
 * component with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS): nothing a layer holds (a
 * symlink to /, then a file "through" it) can make a write land outside the layer. Whiteouts
 * become what overlayfs reads in a lower layer: ".wh.NAME" a 0/0 character device NAME,
 * ".wh..wh..opq" the xattr trusted.overlay.opaque=y on its directory.
 */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/openat2.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "supervisor-image.h"
#include "supervisor-image-unpack.h"

#define BLOCK (128u << 10)

struct unpack {
	image_read_fn rd;
	void *userdata;
	EVP_MD_CTX *blob_md, *tar_md;
	uint64_t blob_bytes;
	struct archive *outer, *inner;
	char *buf_outer, *buf_inner;
	int root_fd;
	/* the last parent directory opened, by its path relative to the layer */
	char parent[4096];
	int parent_fd;
	const char *label;
	char *why;
	size_t cap;
	int read_error;
};

_printf_(3, 4) static int fail(struct unpack *u, int r, const char *fmt, ...)
{
	char what[IMAGE_ERROR_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (u->why && u->cap && !u->why[0])
		snprintf(u->why, u->cap, "%s: %s", u->label, what);
	return r;
}

static la_ssize_t outer_read(struct archive *a, void *ud, const void **buf)
{
	struct unpack *u = ud;
	ssize_t n = u->rd(u->userdata, u->buf_outer, BLOCK);

	if (n < 0) {
		u->read_error = (int)n;
		archive_set_error(a, (int)-n, "reading the blob failed");
		return -1;
	}
	EVP_DigestUpdate(u->blob_md, u->buf_outer, (size_t)n);
	u->blob_bytes += (uint64_t)n;
	*buf = u->buf_outer;
	return n;
}

static la_ssize_t inner_read(struct archive *a, void *ud, const void **buf)
{
	struct unpack *u = ud;
	la_ssize_t n = archive_read_data(u->outer, u->buf_inner, BLOCK);

	if (n < 0) {
		archive_set_error(a, EIO, "%s", archive_error_string(u->outer));
		return -1;
	}
	EVP_DigestUpdate(u->tar_md, u->buf_inner, (size_t)n);
	*buf = u->buf_inner;
	return n;
}

/* A tar member's path made relative and plain: "./a//b/" -> "a/b", "./" -> "". Absolute
 * paths and ".." components are refused, not cleaned: a layer that holds one is hostile. */
static int clean_path(const char *in, char *out, size_t cap)
{
	size_t o = 0;

	if (!in || in[0] == '/')
		return -EPERM;
	while (*in) {
		size_t n = strcspn(in, "/");

		if (n == 2 && in[0] == '.' && in[1] == '.')
			return -EPERM;
		if (n && !(n == 1 && in[0] == '.')) {
			if (o + n + 2 > cap)
				return -ENAMETOOLONG;
			if (o)
				out[o++] = '/';
			memcpy(out + o, in, n);
			o += n;
		}
		in += n;
		while (*in == '/')
			in++;
	}
	out[o] = '\0';
	return 0;
}

static int open_beneath(int dir_fd, const char *path, int flags)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_CLOEXEC | O_NOFOLLOW),
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	int fd = (int)syscall(SYS_openat2, dir_fd, path, &how, sizeof(how));

	return fd < 0 ? -errno : fd;
}

/* The directory dir (relative to the layer, "" its root) as an O_PATH fd, made (0755, root's)
 * where missing: tar streams need not list a file's parents. */
static int parent_dir(struct unpack *u, const char *dir)
{
	char path[4096];
	int fd, r;

	if (u->parent_fd >= 0 && strcmp(u->parent, dir) == 0)
		return u->parent_fd;
	u->parent_fd = safe_close(u->parent_fd);
	if (!dir[0]) {
		fd = open_beneath(u->root_fd, ".", O_PATH | O_DIRECTORY);
	} else {
		fd = open_beneath(u->root_fd, dir, O_PATH | O_DIRECTORY);
		if (fd == -ENOENT) {
			/* make the missing components, one by one, beneath the root */
			snprintf(path, sizeof(path), "%s", dir);
			for (char *s = path;; s++) {
				if (*s != '/' && *s != '\0')
					continue;
				char c = *s;

				*s = '\0';
				if (mkdirat(u->root_fd, path, 0755) < 0 && errno != EEXIST) {
					/* mkdirat resolves the prefix: check it the safe way */
					r = -errno;
					fd = open_beneath(u->root_fd, path, O_PATH | O_DIRECTORY);
					if (fd < 0)
						return fd;
					(void)close(fd);
					return r;
				}
				fd = open_beneath(u->root_fd, path, O_PATH | O_DIRECTORY);
				if (fd < 0)
					return fd;
				(void)close(fd);
				*s = c;
				if (!c)
					break;
			}
			fd = open_beneath(u->root_fd, dir, O_PATH | O_DIRECTORY);
		}
	}
	if (fd < 0)
		return fd;
	snprintf(u->parent, sizeof(u->parent), "%s", dir);
	u->parent_fd = fd;
	return fd;
}

static bool xattr_allowed(const char *name)
{
	return strncmp(name, "user.", 5) == 0 || strcmp(name, "security.capability") == 0;
}

/* Ownership, mode, xattrs and times on fd, a file or directory just made. */
static int apply_meta(struct unpack *u, struct archive_entry *ent, int fd, const char *path)
{
	const char *name;
	const void *value;
	size_t size;

	if (fchown(fd, (uid_t)archive_entry_uid(ent), (gid_t)archive_entry_gid(ent)) < 0)
		return fail(u, -errno, "entry \"%s\": chown: %m", path);
	archive_entry_xattr_reset(ent);
	while (archive_entry_xattr_next(ent, &name, &value, &size) == ARCHIVE_OK) {
		/* overlayfs reads trusted.overlay.* of a lower layer as its own metadata
		 * (redirect, metacopy, origin): a layer that carries one is hostile */
		if (strncmp(name, "trusted.overlay.", 16) == 0)
			return fail(u, -EPERM, "entry \"%s\": xattr %s", path, name);
		if (!xattr_allowed(name))
			continue;
		if (fsetxattr(fd, name, value, size, 0) < 0)
			return fail(u, -errno, "entry \"%s\": xattr %s: %m", path, name);
	}
	/* after chown, which clears set-id bits */
	if (fchmod(fd, archive_entry_perm(ent) & 07777) < 0)
		return fail(u, -errno, "entry \"%s\": chmod: %m", path);
	if (archive_entry_mtime_is_set(ent)) {
		struct timespec ts[2] = {
			{.tv_sec = archive_entry_mtime(ent),
			 .tv_nsec = archive_entry_mtime_nsec(ent)},
			{.tv_sec = archive_entry_mtime(ent),
			 .tv_nsec = archive_entry_mtime_nsec(ent)},
		};

		(void)futimens(fd, ts);
	}
	return 0;
}

/* Makes room for name in dir: what an earlier entry of this layer put there goes (a tar may
 * list a path twice: the last one wins), unless both are directories. */
static int make_room(int dir, const char *name, bool keep_dir)
{
	struct stat st;

	if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (S_ISDIR(st.st_mode)) {
		if (keep_dir)
			return 1;
		return image_remove_tree(dir, name);
	}
	return unlinkat(dir, name, 0) < 0 ? -errno : 0;
}

static int write_data(struct unpack *u, int fd, const char *path, int64_t size)
{
	const void *buf;
	size_t len;
	la_int64_t off;
	int r;

	while ((r = archive_read_data_block(u->inner, &buf, &len, &off)) == ARCHIVE_OK) {
		const char *p = buf;

		while (len) {
			ssize_t n = pwrite(fd, p, len, off);

			if (n <= 0)
				return fail(u, n < 0 ? -errno : -EIO, "entry \"%s\": write: %m",
					    path);
			p += n;
			len -= (size_t)n;
			off += n;
		}
	}
	if (r != ARCHIVE_EOF)
		return fail(u, -EBADMSG, "entry \"%s\": %s", path,
			    archive_error_string(u->inner) ?: "truncated");
	if (ftruncate(fd, size) < 0)
		return fail(u, -errno, "entry \"%s\": %m", path);
	return 0;
}

static int entry(struct unpack *u, struct archive_entry *ent, struct image_unpack_stats *stats)
{
	const char *raw = archive_entry_pathname(ent), *link, *name;
	char path[4096], dir[4096], target[4096];
	mode_t type = archive_entry_filetype(ent);
	_cleanup_close_ int fd = -1;
	int pfd, r;

	r = clean_path(raw, path, sizeof(path));
	if (r == -EPERM)
		return fail(u, -EPERM, "entry \"%s\": an absolute path or one with \"..\"",
			    raw ?: "(no name)");
	if (r < 0)
		return fail(u, r, "entry \"%.200s…\": path too long", raw);
	if (!path[0]) {
		/* the layer's root itself: its metadata is the upper dir's in the end */
		return 0;
	}
	name = strrchr(path, '/');
	if (name) {
		snprintf(dir, sizeof(dir), "%.*s", (int)(name - path), path);
		name++;
	} else {
		dir[0] = '\0';
		name = path;
	}
	pfd = parent_dir(u, dir);
	if (pfd < 0)
		return fail(u, pfd == -ELOOP || pfd == -EXDEV || pfd == -ENOTDIR ? -EPERM : pfd,
			    "entry \"%s\": its directory \"%s\" is a symlink or not a directory "
			    "(%s)",
			    path, dir, strerror(-pfd));
	stats->entries++;
	/* whiteouts (OCI image-spec, layer.md) */
	if (strncmp(name, ".wh.", 4) == 0) {
		const char *victim = name + 4;

		if (strcmp(victim, ".wh..opq") == 0) {
			_cleanup_close_ int d =
				openat(pfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

			if (d < 0 || fsetxattr(d, "trusted.overlay.opaque", "y", 1, 0) < 0)
				return fail(u, -errno, "entry \"%s\": opaque marker: %m", path);
			return 0;
		}
		if (!victim[0] || strcmp(victim, ".") == 0 || strcmp(victim, "..") == 0 ||
		    strncmp(victim, ".wh.", 4) == 0)
			return fail(u, -EPERM, "entry \"%s\": a whiteout of nothing", path);
		r = make_room(pfd, victim, false);
		if (r < 0)
			return fail(u, r, "entry \"%s\": %s", path, strerror(-r));
		if (mknodat(pfd, victim, S_IFCHR | 0000, makedev(0, 0)) < 0)
			return fail(u, -errno, "entry \"%s\": whiteout: %m", path);
		return 0;
	}
	link = archive_entry_hardlink(ent);
	if (link) {
		char tdir[4096];
		const char *tname;
		_cleanup_close_ int tfd = -1;

		r = clean_path(link, target, sizeof(target));
		if (r < 0 || !target[0])
			return fail(u, -EPERM, "entry \"%s\": hard link to \"%s\" out of the layer",
				    path, link);
		tname = strrchr(target, '/');
		snprintf(tdir, sizeof(tdir), "%.*s", tname ? (int)(tname - target) : 0, target);
		tname = tname ? tname + 1 : target;
		tfd = tdir[0] ? open_beneath(u->root_fd, tdir, O_PATH | O_DIRECTORY)
			      : open_beneath(u->root_fd, ".", O_PATH | O_DIRECTORY);
		r = make_room(pfd, name, false);
		if (r < 0)
			return fail(u, r, "entry \"%s\": %s", path, strerror(-r));
		if (tfd < 0 || linkat(tfd, tname, pfd, name, 0) < 0)
			return fail(
				u, -EPERM,
				"entry \"%s\": hard link to \"%s\", which is not a file of this "
				"layer (%s)",
				path, target, strerror(tfd < 0 ? -tfd : errno));
		return 0;
	}
	switch (type) {
	case AE_IFREG:
		r = make_room(pfd, name, false);
		if (r < 0)
			return fail(u, r, "entry \"%s\": %s", path, strerror(-r));
		fd = openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0)
			return fail(u, -errno, "entry \"%s\": %m", path);
		r = write_data(u, fd, path, archive_entry_size(ent));
		if (r < 0)
			return r;
		stats->bytes += (uint64_t)archive_entry_size(ent);
		return apply_meta(u, ent, fd, path);
	case AE_IFDIR:
		r = make_room(pfd, name, true);
		if (r < 0)
			return fail(u, r, "entry \"%s\": %s", path, strerror(-r));
		if (r == 0 && mkdirat(pfd, name, 0700) < 0)
			return fail(u, -errno, "entry \"%s\": %m", path);
		fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			return fail(u, -errno, "entry \"%s\": %m", path);
		/* the cached parent may be this directory's old self */
		u->parent_fd = safe_close(u->parent_fd);
		return apply_meta(u, ent, fd, path);
	case AE_IFLNK: {
		const char *to = archive_entry_symlink(ent);

		if (!to || !to[0] || strlen(to) >= 4096)
			return fail(u, -EBADMSG, "entry \"%s\": symlink without a target", path);
		r = make_room(pfd, name, false);
		if (r < 0)
			return fail(u, r, "entry \"%s\": %s", path, strerror(-r));
		if (symlinkat(to, pfd, name) < 0 ||
		    fchownat(pfd, name, (uid_t)archive_entry_uid(ent),
			     (gid_t)archive_entry_gid(ent), AT_SYMLINK_NOFOLLOW) < 0)
			return fail(u, -errno, "entry \"%s\": %m", path);
		if (archive_entry_mtime_is_set(ent)) {
			struct timespec ts[2] = {{.tv_sec = archive_entry_mtime(ent)},
						 {.tv_sec = archive_entry_mtime(ent)}};

			(void)utimensat(pfd, name, ts, AT_SYMLINK_NOFOLLOW);
		}
		return 0;
	}
	case AE_IFIFO:
		r = make_room(pfd, name, false);
		if (r < 0)
			return fail(u, r, "entry \"%s\": %s", path, strerror(-r));
		if (mknodat(pfd, name, S_IFIFO | 0600, 0) < 0)
			return fail(u, -errno, "entry \"%s\": %m", path);
		fd = open_beneath(pfd, name, O_PATH);
		if (fd < 0 ||
		    fchownat(fd, "", (uid_t)archive_entry_uid(ent), (gid_t)archive_entry_gid(ent),
			     AT_EMPTY_PATH) < 0 ||
		    fchmodat(pfd, name, archive_entry_perm(ent) & 0777, 0) < 0)
			return fail(u, -errno, "entry \"%s\": %m", path);
		return 0;
	case AE_IFCHR:
	case AE_IFBLK:
		return fail(u, -EPERM, "entry \"%s\": a device node (%u:%u)", path,
			    (unsigned)archive_entry_rdevmajor(ent),
			    (unsigned)archive_entry_rdevminor(ent));
	default:
		return fail(u, -EPERM, "entry \"%s\": a file of type %#o", path, (unsigned)type);
	}
}

static int hex_of(EVP_MD_CTX *md, char *out)
{
	unsigned char d[EVP_MAX_MD_SIZE];
	unsigned n = 0;

	if (EVP_DigestFinal_ex(md, d, &n) != 1 || n != 32)
		return -EIO;
	strcpy(out, "sha256:");
	for (unsigned i = 0; i < n; i++)
		sprintf(out + 7 + 2 * i, "%02x", d[i]);
	return 0;
}

int image_remove_tree(int dir_fd, const char *name)
{
	_cleanup_close_ int fd = -1;
	struct dirent *de;
	DIR *d;
	int r = 0;

	fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOTDIR || errno == ELOOP)
			return unlinkat(dir_fd, name, 0) < 0 ? -errno : 0;
		return errno == ENOENT ? 0 : -errno;
	}
	/* an opaque directory or a layer's read-only modes must not stop the removal */
	(void)fchmod(fd, 0700);
	d = fdopendir(fd);
	if (!d)
		return -errno;
	fd = -1;
	while ((de = readdir(d))) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (de->d_type == DT_DIR || de->d_type == DT_UNKNOWN) {
			int k = image_remove_tree(dirfd(d), de->d_name);

			if (k < 0 && r == 0)
				r = k;
		} else if (unlinkat(dirfd(d), de->d_name, 0) < 0 && r == 0)
			r = -errno;
	}
	closedir(d);
	if (unlinkat(dir_fd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && r == 0)
		r = -errno;
	return r;
}

int image_unpack_layer(int layers_fd, image_read_fn rd, void *userdata, const char *digest,
		       uint64_t size, const char *diff_id, const char *label,
		       struct image_unpack_stats *stats, char *why, size_t cap)
{
	struct unpack u = {.rd = rd,
			   .userdata = userdata,
			   .root_fd = -1,
			   .parent_fd = -1,
			   .label = label,
			   .why = why,
			   .cap = cap};
	struct image_unpack_stats local = {0};
	char tmp[96], got[IMAGE_DIGEST_LEN + 1];
	struct archive_entry *ent;
	int r;

	if (!stats)
		stats = &local;
	if (why && cap)
		why[0] = '\0';
	if (!image_digest_valid(diff_id) || (digest[0] && !image_digest_valid(digest)))
		return fail(&u, -EINVAL, "invalid digest");
	/* the thread's own: imports run side by side (under the store's shared lock) */
	snprintf(tmp, sizeof(tmp), ".tmp-%s-%d-%d", diff_id + 7, (int)getpid(), (int)gettid());
	(void)image_remove_tree(layers_fd, tmp);
	if (mkdirat(layers_fd, tmp, 0755) < 0)
		return fail(&u, -errno, "mkdir %s: %m", tmp);
	u.root_fd = openat(layers_fd, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	u.blob_md = EVP_MD_CTX_new();
	u.tar_md = EVP_MD_CTX_new();
	u.buf_outer = malloc(BLOCK);
	u.buf_inner = malloc(BLOCK);
	u.outer = archive_read_new();
	u.inner = archive_read_new();
	if (u.root_fd < 0 || !u.blob_md || !u.tar_md || !u.buf_outer || !u.buf_inner || !u.outer ||
	    !u.inner || EVP_DigestInit_ex(u.blob_md, EVP_sha256(), NULL) != 1 ||
	    EVP_DigestInit_ex(u.tar_md, EVP_sha256(), NULL) != 1) {
		r = fail(&u, -ENOMEM, "out of memory");
		goto out;
	}
	archive_read_support_filter_gzip(u.outer);
	archive_read_support_filter_zstd(u.outer);
	archive_read_support_format_raw(u.outer);
	archive_read_support_format_tar(u.inner);
	if (archive_read_open(u.outer, &u, NULL, outer_read, NULL) != ARCHIVE_OK ||
	    archive_read_next_header(u.outer, &ent) != ARCHIVE_OK) {
		r = fail(&u, u.read_error ?: -EBADMSG, "not a layer blob: %s",
			 archive_error_string(u.outer) ?: "empty");
		goto out;
	}
	if (archive_read_open(u.inner, &u, NULL, inner_read, NULL) != ARCHIVE_OK) {
		r = fail(&u, u.read_error ?: -EBADMSG, "not a tar: %s",
			 archive_error_string(u.inner) ?: "empty");
		goto out;
	}
	for (;;) {
		r = archive_read_next_header(u.inner, &ent);
		if (r == ARCHIVE_EOF)
			break;
		if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
			r = fail(&u, u.read_error ?: -EBADMSG, "malformed or truncated tar: %s",
				 archive_error_string(u.inner) ?: "?");
			goto out;
		}
		r = entry(&u, ent, stats);
		if (r < 0)
			goto out;
	}
	/* the rest of both streams: what follows the tar's end is part of what was signed */
	for (;;) {
		la_ssize_t n = archive_read_data(u.outer, u.buf_inner, BLOCK);

		if (n < 0) {
			r = fail(&u, u.read_error ?: -EBADMSG, "blob: %s",
				 archive_error_string(u.outer) ?: "?");
			goto out;
		}
		if (n == 0)
			break;
		EVP_DigestUpdate(u.tar_md, u.buf_inner, (size_t)n);
	}
	for (;;) {
		ssize_t n = rd(userdata, u.buf_outer, BLOCK);

		if (n < 0) {
			r = fail(&u, (int)n, "reading the blob failed");
			goto out;
		}
		if (n == 0)
			break;
		EVP_DigestUpdate(u.blob_md, u.buf_outer, (size_t)n);
		u.blob_bytes += (uint64_t)n;
	}
	if (size && u.blob_bytes != size) {
		r = fail(&u, -EBADMSG, "blob is %" PRIu64 " bytes, the manifest says %" PRIu64,
			 u.blob_bytes, size);
		goto out;
	}
	r = hex_of(u.blob_md, got);
	if (r >= 0 && digest[0] && strcmp(got, digest) != 0) {
		r = fail(&u, -EBADMSG, "blob digest mismatch: it is %s", got);
		goto out;
	}
	if (r >= 0)
		r = hex_of(u.tar_md, got);
	if (r >= 0 && strcmp(got, diff_id) != 0) {
		r = fail(&u, -EBADMSG, "diff_id mismatch: the tar is %s, the config says %s", got,
			 diff_id);
		goto out;
	}
	if (r < 0)
		goto out;
	(void)fchmod(u.root_fd, 0755);
	if (syncfs(u.root_fd) < 0) {
		r = fail(&u, -errno, "syncfs: %m");
		goto out;
	}
	if (renameat(layers_fd, tmp, layers_fd, diff_id + 7) < 0) {
		r = errno == EEXIST || errno == ENOTEMPTY ? 0 : fail(&u, -errno, "rename: %m");
		goto out;
	}
	tmp[0] = '\0';
	r = 0;
out:
	safe_close(u.parent_fd);
	safe_close(u.root_fd);
	if (u.inner)
		archive_read_free(u.inner);
	if (u.outer)
		archive_read_free(u.outer);
	EVP_MD_CTX_free(u.blob_md);
	EVP_MD_CTX_free(u.tar_md);
	free(u.buf_outer);
	free(u.buf_inner);
	if (tmp[0])
		(void)image_remove_tree(layers_fd, tmp);
	return r;
}
