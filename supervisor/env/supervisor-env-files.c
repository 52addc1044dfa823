/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "supervisor-env-files.h"

#define RESOLVE_ENV (RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)

int env_files_root(pid_t init)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/root", (int)init);
	fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

static int open_in(int root, const char *path, uint64_t flags)
{
	struct open_how how = {.flags = flags | O_CLOEXEC, .resolve = RESOLVE_ENV};
	long fd;

	do
		fd = syscall(SYS_openat2, root, path, &how, sizeof(how));
	while (fd < 0 && errno == EAGAIN); /* a rename raced the lookup */
	return fd < 0 ? -errno : (int)fd;
}

/* Regular files of the environment's own file systems: /proc's are its processes' (and their
 * memory), not files. */
static int check_regular(int fd, struct stat *st)
{
	struct statfs sfs;

	if (fstat(fd, st) < 0 || fstatfs(fd, &sfs) < 0)
		return -errno;
	if (sfs.f_type == PROC_SUPER_MAGIC || sfs.f_type == SYSFS_MAGIC)
		return -EPERM;
	return S_ISREG(st->st_mode) ? 0 : S_ISDIR(st->st_mode) ? -EISDIR : -EINVAL;
}

/* Copies from (at offset 0, by pread: the caller's offset stays) to to, at most max bytes;
 * -EFBIG when from holds more. */
int env_file_copy_bounded(int from, int to, uint64_t max, uint64_t *ret_n)
{
	static _Thread_local char buf[1 << 16];
	uint64_t off = 0;

	for (;;) {
		ssize_t n = pread(from, buf, sizeof(buf), (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		if ((uint64_t)n > max - off)
			return -EFBIG;
		for (ssize_t w = 0; w < n;) {
			ssize_t k = write(to, buf + w, (size_t)(n - w));

			if (k < 0 && errno == EINTR)
				continue;
			if (k < 0)
				return -errno;
			w += k;
		}
		off += (uint64_t)n;
	}
	*ret_n = off;
	return 0;
}

int env_file_sealed_copy(int from, uint64_t max, uint64_t *ret_n)
{
	_cleanup_close_ int mfd = memfd_create("belayer-env", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	int r;

	if (mfd < 0)
		return -errno;
	r = env_file_copy_bounded(from, mfd, max, ret_n);
	if (r < 0)
		return r;
	if (fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0 ||
	    lseek(mfd, 0, SEEK_SET) < 0)
		return -errno;
	r = mfd;
	mfd = -1;
	return r;
}

/* The file of an O_PATH fd opened for reading: through /proc/self/fd, the same inode (no
 * new lookup of its path, which the environment could change meanwhile). */
static int reopen_read(int pfd, const struct stat *st)
{
	_cleanup_close_ int fd = -1;
	char path[64];
	struct stat now;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", pfd);
	fd = open(path, O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &now) < 0)
		return -errno;
	if (now.st_dev != st->st_dev || now.st_ino != st->st_ino || !S_ISREG(now.st_mode))
		return -ESTALE;
	return TAKE_FD(fd);
}

int env_file_read(int root, const char *path, uint64_t max, int *ret_fd, struct stat *ret_st)
{
	_cleanup_close_ int pfd = -1, fd = -1, mfd = -1;
	uint64_t n;
	int r;

	/* O_PATH first: nothing but a regular file is ever opened. A FIFO opened for reading
	 * wakes a writer waiting on it (a side effect in the environment); a device node opened
	 * by the supervisor is outside the environment's device allow-list (that is its cgroup's,
	 * not ours), and a tty one would become our controlling terminal. */
	pfd = open_in(root, path, O_PATH);
	if (pfd < 0)
		return pfd;
	r = check_regular(pfd, ret_st);
	if (r < 0)
		return r;
	if ((uint64_t)ret_st->st_size > max)
		return -EFBIG;
	fd = reopen_read(pfd, ret_st);
	if (fd < 0)
		return fd;
	mfd = env_file_sealed_copy(fd, max, &n);
	if (mfd < 0)
		return mfd;
	ret_st->st_size = (off_t)n; /* what was read, if the file changed meanwhile */
	*ret_fd = mfd;
	mfd = -1;
	return 0;
}

const char *env_file_kind(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG:
		return "a regular file";
	case S_IFDIR:
		return "a directory";
	case S_IFIFO:
		return "a FIFO";
	case S_IFCHR:
		return "a character device";
	case S_IFBLK:
		return "a block device";
	case S_IFSOCK:
		return "a socket";
	case S_IFLNK:
		return "a symbolic link";
	default:
		return "an unknown kind of file";
	}
}

/* path's last component into base (a plain name), the rest into dir ("." for none). */
static int split_path(const char *path, char *dir, size_t dcap, char *base, size_t bcap)
{
	size_t len = strlen(path);
	const char *slash;

	while (len > 1 && path[len - 1] == '/')
		len--; /* "a/b/" names b */
	for (slash = path + len; slash > path && slash[-1] != '/'; slash--)
		;
	if ((size_t)(path + len - slash) >= bcap || (size_t)(slash - path) >= dcap)
		return -ENAMETOOLONG;
	memcpy(base, slash, (size_t)(path + len - slash));
	base[path + len - slash] = '\0';
	if (!base[0] || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
		return -EINVAL;
	if (slash == path)
		snprintf(dir, dcap, ".");
	else {
		memcpy(dir, path, (size_t)(slash - path));
		dir[slash - path] = '\0';
	}
	return 0;
}

int env_file_write(int root, const char *path, int data_fd, uint64_t max, mode_t mode, uid_t uid,
		   gid_t gid, uint64_t *ret_n, char *ret_dir, size_t dir_cap)
{
	_cleanup_close_ int dfd = -1, tfd = -1;
	char dir[PATH_MAX], base[NAME_MAX + 1], tmp[64];
	uint64_t rnd = 0;
	struct stat st;
	int r;

	if (fstat(data_fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EINVAL;
	if ((uint64_t)st.st_size > max)
		return -EFBIG;
	r = split_path(path, dir, sizeof(dir), base, sizeof(base));
	if (r < 0)
		return r;
	dfd = open_in(root, dir, O_PATH | O_DIRECTORY);
	if (dfd < 0)
		return dfd;
	(void)getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK);
	snprintf(tmp, sizeof(tmp), ".belayer-write.%016llx", (unsigned long long)rnd);
	/* O_EXCL: a name that exists (a symlink planted there included) is never opened. */
	tfd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (tfd < 0)
		return -errno;
	r = env_file_copy_bounded(data_fd, tfd, max, ret_n);
	/* chown first: it clears set-id bits that fchmod then sets when asked. */
	if (r >= 0 && (fchown(tfd, uid, gid) < 0 || fchmod(tfd, mode) < 0))
		r = -errno;
	if (r >= 0 && renameat(dfd, tmp, dfd, base) < 0)
		r = -errno;
	if (r < 0)
		(void)unlinkat(dfd, tmp, 0);
	if (r >= 0 && ret_dir && dir_cap) {
		char link[32];
		ssize_t n;

		snprintf(link, sizeof(link), "/proc/self/fd/%d", dfd);
		n = readlink(link, ret_dir, dir_cap - 1);
		ret_dir[n > 0 ? n : 0] = '\0';
		if (n <= 0 || (size_t)n >= dir_cap - 1)
			ret_dir[0] = '\0';
	}
	return r;
}

/* The line of an /etc/passwd or /etc/group whose name (or id, when by_id) matches: its id
 * (field 3) and, for passwd, its group (field 4). */
static int db_find(const char *text, const char *name, bool by_id, uint32_t id, uint32_t *ret_id,
		   uint32_t *ret_gid)
{
	for (const char *line = text; line && *line;) {
		const char *end = strchr(line, '\n');
		char buf[1024], *f[4] = {0}, *p;
		size_t len = end ? (size_t)(end - line) : strlen(line);
		int k = 0;

		if (len < sizeof(buf)) {
			memcpy(buf, line, len);
			buf[len] = '\0';
			/* name:password:id:gid:... (strsep: empty fields count) */
			for (p = buf; k < 4 && (f[k] = strsep(&p, ":")); k++)
				;
			if (k >= 3) {
				char *e1;
				unsigned long v = strtoul(f[2], &e1, 10);
				bool hit = by_id ? (*f[2] && !*e1 && v == id)
						 : strcmp(f[0], name) == 0;

				if (hit && *f[2] && !*e1 && v <= UINT32_MAX) {
					*ret_id = (uint32_t)v;
					if (ret_gid) {
						unsigned long g =
							k >= 4 ? strtoul(f[3], &e1, 10) : 0;

						*ret_gid =
							k >= 4 && *f[3] && !*e1 && g <= UINT32_MAX
								? (uint32_t)g
								: 0;
					}
					return 0;
				}
			}
		}
		line = end ? end + 1 : NULL;
	}
	return -ENOENT;
}

static int read_db(int root, const char *path, char **ret)
{
	_cleanup_close_ int fd = -1;
	struct stat st;
	char *text;
	uint64_t n;
	int r;

	r = env_file_read(root, path, ENV_PASSWD_MAX, &fd, &st);
	if (r < 0)
		return r;
	text = malloc((size_t)st.st_size + 1);
	if (!text)
		return -ENOMEM;
	n = (uint64_t)pread(fd, text, (size_t)st.st_size, 0);
	if (n != (uint64_t)st.st_size) {
		free(text);
		return -EIO;
	}
	text[n] = '\0';
	*ret = text;
	return 0;
}

static bool parse_id(const char *s, uint32_t *ret)
{
	char *end;
	unsigned long v;

	if (!*s || *s < '0' || *s > '9')
		return false;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v > UINT32_MAX - 1)
		return false;
	*ret = (uint32_t)v;
	return true;
}

int env_user_lookup(int root, const char *user, uid_t *ret_uid, gid_t *ret_gid)
{
	_cleanup_free_ char *passwd = NULL, *group = NULL;
	char name[64], *colon;
	uint32_t uid = 0, gid = 0, g;
	int r;

	if (!user[0]) {
		*ret_uid = 0;
		*ret_gid = 0;
		return 0;
	}
	if (strlen(user) >= sizeof(name))
		return -EINVAL;
	snprintf(name, sizeof(name), "%s", user);
	colon = strchr(name, ':');
	if (colon)
		*colon++ = '\0';
	if (parse_id(name, &uid)) {
		/* the primary group of a numeric uid: its passwd entry's, if it has one */
		if (!colon && read_db(root, "/etc/passwd", &passwd) >= 0)
			(void)db_find(passwd, NULL, true, uid, &uid, &gid);
	} else {
		r = read_db(root, "/etc/passwd", &passwd);
		if (r < 0)
			return r == -ENOENT ? -ENOENT : r;
		r = db_find(passwd, name, false, 0, &uid, &gid);
		if (r < 0)
			return r;
	}
	if (colon) {
		if (parse_id(colon, &g))
			gid = g;
		else {
			r = read_db(root, "/etc/group", &group);
			if (r < 0)
				return r;
			r = db_find(group, colon, false, 0, &gid, NULL);
			if (r < 0)
				return r;
		}
	}
	*ret_uid = uid;
	*ret_gid = gid;
	return 0;
}

int env_id_to_host(pid_t pid, bool gid, uint32_t id, uint32_t *ret)
{
	char path[64];
	unsigned long in, out, count;
	FILE *f;
	int r = -ERANGE;

	snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, gid ? "gid_map" : "uid_map");
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fscanf(f, "%lu %lu %lu", &in, &out, &count) == 3)
		if (id >= in && id - in < count) {
			*ret = (uint32_t)(out + (id - in));
			r = 0;
			break;
		}
	fclose(f);
	return r;
}
