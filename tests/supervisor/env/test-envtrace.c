/* SPDX-License-Identifier: MIT */
/*
 * Environment side-effect tracing against the truth: real BPF programs, real processes in a
 * real cgroup v2 directory, and a full tree diff as the oracle (presence, type, content,
 * mode, owner, xattrs, mtime). Needs root; skips through TEST_REQUIRE otherwise (a failure
 * under BELAYER_TEST_NO_SKIP=1, as CI runs it).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/io_uring.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <bpf/bpf.h>

#include "envtrace-fixture.h"
#include "test-util.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif
/* Linux 6.13; the build machine's headers may predate them. */
#ifndef SYS_setxattrat
#define SYS_setxattrat 463
#endif
#ifndef SYS_removexattrat
#define SYS_removexattrat 466
#endif
struct xattr_args_compat {
	uint64_t value;
	uint32_t size;
	uint32_t flags;
};

/* ---- the oracle: a full snapshot of a tree, and its diff ---- */

struct node {
	char *path;
	mode_t mode;
	uid_t uid;
	gid_t gid;
	off_t size;
	struct timespec mtime;
	uint64_t content; /* hash of the data, or of the symlink's target */
	uint64_t xattrs;  /* hash of names and values */
};

struct snapshot {
	struct node *v;
	size_t n, cap;
};

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *c = p;

	for (size_t i = 0; i < n; i++) {
		h ^= c[i];
		h *= 1099511628211ULL;
	}
	return h;
}

static uint64_t hash_xattrs(const char *path)
{
	char names[4096], value[4096];
	ssize_t n = llistxattr(path, names, sizeof(names));
	uint64_t h = 1469598103934665603ULL;

	assert_true(n >= 0);
	/* The kernel lists them in a stable order for one inode. */
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(names + i) + 1) {
		ssize_t vl = lgetxattr(path, names + i, value, sizeof(value));

		h = fnv(h, names + i, strlen(names + i) + 1);
		if (vl > 0)
			h = fnv(h, value, (size_t)vl);
	}
	return h;
}

static uint64_t hash_content(const char *path, const struct stat *st)
{
	uint64_t h = 1469598103934665603ULL;
	char buf[8192];
	ssize_t n;
	int fd;

	if (S_ISLNK(st->st_mode)) {
		n = readlink(path, buf, sizeof(buf));
		assert_true(n >= 0);
		return fnv(h, buf, (size_t)n);
	}
	if (!S_ISREG(st->st_mode))
		return 0;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	assert_true(fd >= 0);
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		h = fnv(h, buf, (size_t)n);
	close(fd);
	return h;
}

static void snap_walk(struct snapshot *s, const char *path)
{
	struct stat st;
	struct node *nd;
	DIR *d;
	struct dirent *de;

	assert_int_equal(lstat(path, &st), 0);
	if (s->n == s->cap) {
		s->cap = s->cap ? 2 * s->cap : 256;
		s->v = realloc(s->v, s->cap * sizeof(*s->v));
		assert_non_null(s->v);
	}
	nd = &s->v[s->n++];
	nd->path = strdup(path);
	nd->mode = st.st_mode;
	nd->uid = st.st_uid;
	nd->gid = st.st_gid;
	nd->size = S_ISDIR(st.st_mode) ? 0 : st.st_size;
	nd->mtime = st.st_mtim;
	nd->content = hash_content(path, &st);
	nd->xattrs = S_ISLNK(st.st_mode) ? 0 : hash_xattrs(path);
	if (!S_ISDIR(st.st_mode))
		return;
	d = opendir(path);
	assert_non_null(d);
	while ((de = readdir(d))) {
		char child[PATH_MAX];

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		snprintf(child, sizeof(child), "%s/%s", path, de->d_name);
		snap_walk(s, child);
	}
	closedir(d);
}

static int cmp_node(const void *a, const void *b)
{
	return strcmp(((const struct node *)a)->path, ((const struct node *)b)->path);
}

static void snapshot_take(struct snapshot *s, const char *root)
{
	memset(s, 0, sizeof(*s));
	snap_walk(s, root);
	qsort(s->v, s->n, sizeof(*s->v), cmp_node);
}

static void snapshot_free(struct snapshot *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i].path);
	free(s->v);
}

static bool node_differs(const struct node *a, const struct node *b)
{
	return a->mode != b->mode || a->uid != b->uid || a->gid != b->gid || a->size != b->size ||
	       a->mtime.tv_sec != b->mtime.tv_sec || a->mtime.tv_nsec != b->mtime.tv_nsec ||
	       a->content != b->content || a->xattrs != b->xattrs;
}

/* Every path the diff reports must be covered by the dirty set; returns how many are not
 * (printed), and how many changed in *ret_changed. */
static size_t oracle_missing(const struct snapshot *before, const struct snapshot *after,
			     const struct sv_dirty *d, size_t *ret_changed)
{
	size_t i = 0, j = 0, missing = 0, changed = 0;

	while (i < before->n || j < after->n) {
		const char *p;
		int c;

		if (i == before->n)
			c = 1;
		else if (j == after->n)
			c = -1;
		else
			c = strcmp(before->v[i].path, after->v[j].path);
		if (c < 0) {
			p = before->v[i++].path; /* removed */
		} else if (c > 0) {
			p = after->v[j++].path; /* added */
		} else {
			bool diff = node_differs(&before->v[i], &after->v[j]);

			p = before->v[i].path;
			i++;
			j++;
			if (!diff)
				continue;
		}
		changed++;
		if (!dirty_covers(d, p)) {
			fprintf(stderr, "not in the dirty set: %s\n", p);
			missing++;
		}
	}
	*ret_changed = changed;
	return missing;
}

/* ---- the scripted operations ---- */

static void make_file(const char *root, const char *rel, const char *content)
{
	char path[PATH_MAX];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, content, strlen(content)), (ssize_t)strlen(content));
	close(fd);
}

static void make_dir(const char *root, const char *rel)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	assert_int_equal(mkdir(path, 0755), 0);
}

/* The tree as it is at the checkpoint, made outside the watched cgroup. */
static void populate(const char *t)
{
	static const char *const files[] = {
		"pre/a.txt",	   "pre/b.txt",	     "pre/c.txt",	  "pre/d.txt",
		"pre/e.txt",	   "pre/dir1/f.txt", "pre/g.txt",	  "pre/dir1/h.txt",
		"pre/x1",	   "pre/x2",	     "pre/i.txt",	  "pre/dir1/j.txt",
		"pre/k.txt",	   "pre/l.txt",	     "pre/dir1/m.txt",	  "pre/n.txt",
		"pre/o.txt",	   "pre/p.txt",	     "pre/dir1/q.txt",	  "pre/r.txt",
		"pre/s.txt",	   "pre/t.txt",	     "pre/dir1/u.txt",	  "pre/v.txt",
		"pre/w.txt",	   "pre/x.txt",	     "pre/y.txt",	  "pre/z.txt",
		"pre/lk.txt",	   "pre/tree/one",   "pre/tree/deep/two", "pre/dir2/sub/keep",
		"pre/untouched",   "pre/tgt-chmod",  "pre/tgt-xattr",	  "pre/lx.txt",
		"pre/dir1/xa.txt", "pre/xr.txt",     "pre/ut.txt"};
	char path[PATH_MAX];

	make_dir(t, "pre");
	make_dir(t, "pre/dir1");
	make_dir(t, "pre/dir2");
	make_dir(t, "pre/dir2/sub");
	make_dir(t, "pre/tree");
	make_dir(t, "pre/tree/deep");
	make_dir(t, "pre/emptydir");
	make_dir(t, "pre/rmme");
	for (size_t i = 0; i < ARRAY_SIZE(files); i++)
		make_file(t, files[i], files[i]);
	snprintf(path, sizeof(path), "%s/pre/x.txt", t);
	assert_int_equal(setxattr(path, "user.old", "1", 1, 0), 0);
	snprintf(path, sizeof(path), "%s/pre/y.txt", t);
	assert_int_equal(setxattr(path, "user.old", "1", 1, 0), 0);
	snprintf(path, sizeof(path), "%s/pre/lx.txt", t);
	assert_int_equal(setxattr(path, "user.old", "1", 1, 0), 0);
	snprintf(path, sizeof(path), "%s/pre/xr.txt", t);
	assert_int_equal(setxattr(path, "user.old", "1", 1, 0), 0);
	/* Symlinks the script goes through: to a file, to a directory. */
	snprintf(path, sizeof(path), "%s/pre/link-chmod", t);
	assert_int_equal(symlink("tgt-chmod", path), 0);
	snprintf(path, sizeof(path), "%s/pre/link-xattr", t);
	assert_int_equal(symlink("tgt-xattr", path), 0);
	snprintf(path, sizeof(path), "%s/pre/lnk", t);
	assert_int_equal(symlink("lk.txt", path), 0);
	snprintf(path, sizeof(path), "%s/pre/linkdir", t);
	assert_int_equal(symlink("dir2/sub", path), 0);
}

#define CHECK(x)                                                                         \
	do {                                                                             \
		if (!(x)) {                                                              \
			fprintf(stderr, "script: %s failed: %s\n", #x, strerror(errno)); \
			return 1;                                                        \
		}                                                                        \
	} while (0)

static int put(int fd, const char *s)
{
	return write(fd, s, strlen(s)) == (ssize_t)strlen(s) ? 0 : -1;
}

/* Every file-changing call envtrace traces, once or more, as an agent's tools would. */
static int script(void *arg)
{
	const char *t = arg;
	struct timespec ts[2] = {{.tv_sec = 1000000}, {.tv_sec = 1000000}};
	struct timeval tv[2] = {{.tv_sec = 2000000}, {.tv_sec = 2000000}};
	struct open_how how = {.flags = O_WRONLY | O_TRUNC | O_CLOEXEC};
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	char abs[PATH_MAX];
	int d1, d2, fd, sk;

	CHECK(chdir(t) == 0);
	CHECK((d1 = open("pre/dir1", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0);
	CHECK((d2 = open("pre/dir2", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0);

	/* open family: relative to the cwd, to a dirfd, absolute, openat2, creat, append */
	CHECK((fd = (int)syscall(SYS_open, "new1", O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) >= 0);
	CHECK(put(fd, "1") == 0 && close(fd) == 0);
	CHECK((fd = openat(d1, "new2", O_RDWR | O_CREAT | O_CLOEXEC, 0644)) >= 0);
	CHECK(put(fd, "2") == 0 && close(fd) == 0);
	snprintf(abs, sizeof(abs), "%s/pre/a.txt", t);
	CHECK((fd = (int)syscall(SYS_openat2, AT_FDCWD, abs, &how, sizeof(how))) >= 0);
	CHECK(close(fd) == 0);
	CHECK((fd = creat("pre/new3", 0600)) >= 0 && close(fd) == 0);
	CHECK((fd = open("pre/b.txt", O_WRONLY | O_APPEND | O_CLOEXEC)) >= 0);
	CHECK(put(fd, "more") == 0 && close(fd) == 0);
	/* through a symlinked directory, and ".." after it (the kernel's ".." is physical) */
	CHECK((fd = open("pre/linkdir/via-link", O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) >= 0);
	CHECK(close(fd) == 0);
	CHECK(mkdir("pre/linkdir/../mk-dotdot", 0755) == 0);
	CHECK(chdir("pre/dir1") == 0);
	CHECK((fd = open("../dir2/dotdot.txt", O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) >= 0);
	CHECK(close(fd) == 0);
	CHECK(unlink("../../pre/e.txt") == 0);
	CHECK(chdir(t) == 0);

	/* truncate */
	CHECK(truncate("pre/c.txt", 1) == 0);
	CHECK((fd = open("pre/d.txt", O_RDONLY | O_CLOEXEC)) >= 0);
	/* ftruncate needs a writable fd: reopen through /proc, as tools do */
	close(fd);
	CHECK((fd = open("pre/d.txt", O_RDWR | O_CLOEXEC)) >= 0);
	CHECK(ftruncate(fd, 0) == 0 && close(fd) == 0);

	/* unlink family */
	CHECK(unlinkat(d1, "f.txt", 0) == 0);
	CHECK(unlinkat(AT_FDCWD, "pre/emptydir", AT_REMOVEDIR) == 0);
	CHECK(syscall(SYS_rmdir, "pre/rmme") == 0);

	/* rename family, across directories, a directory with children, an exchange */
	CHECK(syscall(SYS_rename, "pre/g.txt", "pre/dir2/g-moved") == 0);
	CHECK(syscall(SYS_renameat, d1, "h.txt", d2, "h-moved") == 0);
	CHECK(syscall(SYS_renameat2, AT_FDCWD, "pre/x1", AT_FDCWD, "pre/x2", RENAME_EXCHANGE) == 0);
	CHECK(rename("pre/tree", "pre/dir2/tree-moved") == 0);

	/* mkdir family */
	CHECK(syscall(SYS_mkdir, "pre/newdir", 0755) == 0);
	CHECK(mkdirat(d1, "newdir2", 0700) == 0);

	/* link, symlink */
	CHECK(syscall(SYS_link, "pre/i.txt", "pre/dir2/i-hard") == 0);
	CHECK(linkat(d1, "j.txt", AT_FDCWD, "pre/j-hard", 0) == 0);
	CHECK(syscall(SYS_symlink, "target", "pre/sym1") == 0);
	CHECK(symlinkat("a.txt", d1, "sym2") == 0);

	/* chmod family, including through a symlink (the target changes) */
	CHECK(syscall(SYS_chmod, "pre/k.txt", 0600) == 0);
	CHECK((fd = open("pre/l.txt", O_RDONLY | O_CLOEXEC)) >= 0);
	CHECK(fchmod(fd, 0640) == 0 && close(fd) == 0);
	CHECK(syscall(SYS_fchmodat, d1, "m.txt", 0700) == 0);
	CHECK(syscall(SYS_fchmodat2, AT_FDCWD, "pre/n.txt", 0604, 0) == 0 || errno == ENOSYS);
	CHECK(chmod("pre/link-chmod", 0611) == 0);

	/* chown family */
	CHECK(syscall(SYS_chown, "pre/o.txt", 1000, 1000) == 0);
	CHECK((fd = open("pre/p.txt", O_RDONLY | O_CLOEXEC)) >= 0);
	CHECK(fchown(fd, 1001, -1) == 0 && close(fd) == 0);
	CHECK(syscall(SYS_lchown, "pre/lnk", 1002, 1002) == 0);
	CHECK(fchownat(d1, "q.txt", 1003, 1003, 0) == 0);

	/* times */
	CHECK(utimensat(AT_FDCWD, "pre/r.txt", ts, 0) == 0);
	CHECK((fd = open("pre/s.txt", O_RDONLY | O_CLOEXEC)) >= 0);
	CHECK(futimens(fd, ts) == 0 && close(fd) == 0);
	CHECK(syscall(SYS_utimes, "pre/t.txt", tv) == 0);
	CHECK(syscall(SYS_futimesat, d1, "u.txt", tv) == 0);
#ifdef SYS_utime
	{
		struct utimbuf_compat {
			long actime, modtime;
		} ub = {3000000, 3000000};

		CHECK(syscall(SYS_utime, "pre/ut.txt", &ub) == 0);
	}
#endif

	/* xattrs, including through a symlink */
	CHECK(setxattr("pre/v.txt", "user.k", "v", 1, 0) == 0);
	CHECK(lsetxattr("pre/z.txt", "user.k", "z", 1, 0) == 0);
	CHECK((fd = open("pre/w.txt", O_RDONLY | O_CLOEXEC)) >= 0);
	CHECK(fsetxattr(fd, "user.k", "w", 1, 0) == 0 && close(fd) == 0);
	CHECK(removexattr("pre/x.txt", "user.old") == 0);
	CHECK((fd = open("pre/y.txt", O_RDONLY | O_CLOEXEC)) >= 0);
	CHECK(fremovexattr(fd, "user.old") == 0 && close(fd) == 0);
	CHECK(setxattr("pre/link-xattr", "user.k", "l", 1, 0) == 0);
	CHECK(lremovexattr("pre/lx.txt", "user.old") == 0);
	{
		struct xattr_args_compat xa = {.value = (uintptr_t) "at", .size = 2};

		CHECK(syscall(SYS_setxattrat, d1, "xa.txt", 0, "user.k", &xa, sizeof(xa)) == 0 ||
		      errno == ENOSYS);
		CHECK(syscall(SYS_removexattrat, AT_FDCWD, "pre/xr.txt", 0, "user.old") == 0 ||
		      errno == ENOSYS);
	}

	/* special files */
	CHECK(syscall(SYS_mknod, "pre/fifo", S_IFIFO | 0644, 0) == 0);
	CHECK(mknodat(d1, "fifo2", S_IFIFO | 0600, 0) == 0);
	CHECK((sk = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0);
	snprintf(sun.sun_path, sizeof(sun.sun_path), "pre/sock");
	CHECK(bind(sk, (struct sockaddr *)&sun, sizeof(sun)) == 0 && close(sk) == 0);
	/* An abstract socket creates no file: the cwd must not become dirty (pre/untouched). */
	CHECK((sk = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0);
	memset(sun.sun_path, 0, sizeof(sun.sun_path));
	snprintf(sun.sun_path + 1, sizeof(sun.sun_path) - 1, "belayer-envtrace-%d", getpid());
	CHECK(bind(sk, (struct sockaddr *)&sun, sizeof(sun)) == 0 && close(sk) == 0);

	/* created and deleted after the checkpoint: no trace in the diff, still in the set */
	CHECK((fd = open("pre/tmpnew", O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) >= 0);
	CHECK(close(fd) == 0 && unlink("pre/tmpnew") == 0);

	/* failed calls: no change */
	CHECK(unlink("pre/nope-unlink") < 0);
	CHECK(mkdir("pre/dir1", 0755) < 0);
	CHECK(rename("pre/nope-from", "pre/nope-to") < 0);
	CHECK(chmod("pre/nope-chmod", 0600) < 0);
	CHECK(open("pre/nope-dir/nope-open", O_WRONLY | O_CREAT | O_CLOEXEC, 0644) < 0);

	/* read-only work changes nothing and must stay out of the set */
	CHECK((fd = open("pre/untouched", O_RDONLY | O_CLOEXEC)) >= 0 && close(fd) == 0);
	close(d1);
	close(d2);
	return 0;
}

#define FIXTURE(fx, rb)                                                     \
	do {                                                                \
		const char *why_ = NULL;                                    \
		int r_ = fixture_setup((fx), (rb), &why_);                  \
		if (r_ < 0) {                                               \
			fixture_teardown(fx);                               \
			TEST_REQUIRE(r_ == 0, "%s", why_ ? why_ : "setup"); \
		}                                                           \
	} while (0)

static void tree_path(char *buf, size_t n, const struct fixture *fx, const char *rel)
{
	snprintf(buf, n, "%s/tree/%s", fx->tmp, rel);
}

static void test_every_syscall_against_tree_diff(void **state)
{
	struct fixture fx;
	struct snapshot before, after;
	char tree[PATH_MAX], p[PATH_MAX];
	size_t changed = 0;
	const char *reason = NULL;
	static const char *const failed[] = {"pre/nope-unlink", "pre/nope-to",	"pre/nope-from",
					     "pre/nope-chmod",	"pre/nope-dir", "pre/untouched"};

	FIXTURE(&fx, 0);
	snprintf(tree, sizeof(tree), "%s/tree", fx.tmp);
	assert_int_equal(mkdir(tree, 0755), 0);
	populate(tree);
	/* The checkpoint. */
	fixture_drain(&fx);
	dirty_reset(fx.dirty);
	snapshot_take(&before, tree);

	assert_int_equal(fixture_run(&fx, NULL, script, tree, true), 0);

	snapshot_take(&after, tree);
	assert_int_equal(oracle_missing(&before, &after, fx.dirty, &changed), 0);
	/* The script changes each of these: the diff is not trivially empty. */
	assert_true(changed >= 50);
	assert_false(dirty_needs_full_diff(fx.dirty, &reason));
	/* Failed calls and reads are not changes. */
	for (size_t i = 0; i < ARRAY_SIZE(failed); i++) {
		tree_path(p, sizeof(p), &fx, failed[i]);
		if (dirty_covers(fx.dirty, p))
			fprintf(stderr, "failed call in the dirty set: %s\n", p);
		assert_false(dirty_covers(fx.dirty, p));
	}
	/* Deleted after being created after the checkpoint: still named. */
	tree_path(p, sizeof(p), &fx, "pre/tmpnew");
	assert_true(dirty_covers(fx.dirty, p));
	snapshot_free(&before);
	snapshot_free(&after);
	fixture_teardown(&fx);
}

static int touch_files(void *arg)
{
	const char *dir = arg;
	char path[PATH_MAX];

	for (int i = 0; i < 3; i++) {
		int fd;

		snprintf(path, sizeof(path), "%s/outside-%d", dir, i);
		fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		if (fd < 0)
			return 1;
		close(fd);
	}
	snprintf(path, sizeof(path), "%s/outside-0", dir);
	return chmod(path, 0600) == 0 && unlink(path) == 0 ? 0 : 1;
}

static void test_outside_cgroup_ignored(void **state)
{
	struct fixture fx;
	char p[PATH_MAX];

	FIXTURE(&fx, 0);
	fx.outsider = 1;
	assert_int_equal(fixture_run(&fx, (const char *)-1, touch_files, fx.tmp, true), 0);
	fixture_drain(&fx);
	assert_int_equal(fx.foreign_records, 0);
	snprintf(p, sizeof(p), "%s/outside-1", fx.tmp);
	assert_false(dirty_covers(fx.dirty, p));
	assert_int_equal(dirty_count(fx.dirty), 0);

	/* The same work inside the cgroup is seen: the filter, not a dead tracer. */
	fx.outsider = 0;
	assert_int_equal(fixture_run(&fx, NULL, touch_files, fx.tmp, true), 0);
	assert_true(dirty_covers(fx.dirty, p));
	fixture_teardown(&fx);
}

static void test_cgroup_created_after_watch(void **state)
{
	struct fixture fx;
	char sub[300], p[PATH_MAX];

	FIXTURE(&fx, 0);
	snprintf(sub, sizeof(sub), "%s/sub", fx.cgroup);
	assert_int_equal(mkdir(sub, 0755), 0);
	assert_int_equal(fixture_run(&fx, sub, touch_files, fx.tmp, true), 0);
	snprintf(p, sizeof(p), "%s/outside-1", fx.tmp);
	assert_true(dirty_covers(fx.dirty, p));
	snprintf(p, sizeof(p), "%s/outside-0", fx.tmp);
	assert_true(dirty_covers(fx.dirty, p));
	fixture_teardown(&fx);
}

static int run_commands(void *arg)
{
	const char *dir = arg;
	char cmd[PATH_MAX];
	pid_t pid;
	int status;

	/* A shell that runs a command with arguments and writes through a redirection. */
	snprintf(cmd, sizeof(cmd), "/bin/echo alpha 'beta gamma' > '%s/echoed'", dir);
	pid = fork();
	if (pid == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
	    WEXITSTATUS(status) != 0)
		return 1;
	execl("/bin/true", "true", "--flag", "two words", (char *)NULL);
	return 1;
}

struct log_seen {
	bool echo, true_argv, file, exit;
	char echoed[PATH_MAX];
};

static int check_entry(const struct sidelog_entry *e, void *userdata)
{
	struct log_seen *s = userdata;

	if (strcmp(e->kind, "exec") == 0 && e->exe && strcmp(e->exe, "/bin/true") == 0 &&
	    e->argc == 3 && strcmp(e->argv[0], "true") == 0 && strcmp(e->argv[1], "--flag") == 0 &&
	    strcmp(e->argv[2], "two words") == 0)
		s->true_argv = true;
	if (strcmp(e->kind, "exec") == 0 && e->argc >= 3 && strcmp(e->argv[0], "sh") == 0 &&
	    strcmp(e->argv[1], "-c") == 0 && strstr(e->argv[2], "/bin/echo alpha 'beta gamma'"))
		s->echo = true;
	if (strcmp(e->kind, "file") == 0 && e->op && strcmp(e->op, "open") == 0 && e->path &&
	    strcmp(e->path, s->echoed) == 0 && e->pid > 0)
		s->file = true;
	if (strcmp(e->kind, "exit") == 0)
		s->exit = true;
	return 0;
}

static int count_entry(const struct sidelog_entry *e, void *userdata)
{
	(*(int *)userdata)++;
	return 0;
}

static void test_exec_log_has_argv(void **state)
{
	struct fixture fx;
	struct log_seen seen = {0};
	struct envtrace_env_stats st;

	FIXTURE(&fx, 0);
	assert_int_equal(fixture_run(&fx, NULL, run_commands, fx.tmp, true), 0);
	snprintf(seen.echoed, sizeof(seen.echoed), "%s/echoed", fx.tmp);
	assert_int_equal(sidelog_read(fx.log_path, check_entry, &seen), 0);
	assert_true(seen.echo);
	assert_true(seen.true_argv);
	assert_true(seen.file);
	assert_true(seen.exit);
	assert_int_equal(envtrace_env_stats(fx.et, fx.env_id, &st), 0);
	assert_true(st.execs >= 2);
	assert_int_equal(st.drops, 0);
	fixture_teardown(&fx);
}

static int many_creates(void *arg)
{
	const char *dir = arg;
	char path[PATH_MAX];

	for (int i = 0; i < 2000; i++) {
		int fd;

		snprintf(path, sizeof(path), "%s/burst-%04d-with-a-longer-name-to-fill-the-ring",
			 dir, i);
		fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		if (fd < 0)
			return 1;
		close(fd);
	}
	return 0;
}

static void test_ringbuf_overflow_forces_full_diff(void **state)
{
	struct fixture fx;
	struct envtrace_env_stats st;
	uint64_t total = 0, per_cpu[1024] = {0};
	const char *reason = NULL;

	/* One page of ring buffer, not consumed while the child runs: it must overflow. */
	FIXTURE(&fx, (size_t)sysconf(_SC_PAGESIZE));
	assert_int_equal(fixture_run(&fx, NULL, many_creates, fx.tmp, false), 0);
	fixture_drain(&fx);
	assert_int_equal(envtrace_env_stats(fx.et, fx.env_id, &st), 0);
	assert_true(st.drops > 0);
	assert_int_equal(envtrace_drops(fx.et, per_cpu, ARRAY_SIZE(per_cpu), &total), 0);
	assert_true(total >= st.drops);
	assert_false(dirty_needs_full_diff(fx.dirty, NULL));
	dirty_note_drops(fx.dirty, st.drops);
	assert_true(dirty_needs_full_diff(fx.dirty, &reason));
	assert_non_null(strstr(reason, "overflow"));
	/* A checkpoint clears it; no new drops keep it clear. */
	dirty_reset(fx.dirty);
	dirty_note_drops(fx.dirty, st.drops);
	assert_false(dirty_needs_full_diff(fx.dirty, NULL));
	fixture_teardown(&fx);
}

static int do_io_uring(void *arg)
{
	struct io_uring_params p = {0};
	int fd = (int)syscall(SYS_io_uring_setup, 4, &p);

	(void)arg;
	if (fd < 0)
		return errno == ENOSYS || errno == EPERM ? 2 : 1;
	close(fd);
	return 0;
}

static int do_mmap(void *arg)
{
	const char *path = arg;
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	void *m;

	if (fd < 0 || ftruncate(fd, 4096) < 0)
		return 1;
	/* A private writable mapping changes nothing on disk... */
	m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	if (m == MAP_FAILED)
		return 1;
	((char *)m)[0] = 'p';
	munmap(m, 4096);
	close(fd);
	return 0;
}

static int do_mmap_shared(void *arg)
{
	const char *path = arg;
	int fd = open(path, O_RDWR | O_CLOEXEC);
	void *m;

	if (fd < 0)
		return 1;
	m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return 1;
	((char *)m)[0] = 's';
	munmap(m, 4096);
	close(fd);
	return 0;
}

/* What CRIU's parasite does in every dumped task (compel: memfd_create("CRIUMFD"), then mmap
 * of it MAP_SHARED with PROT_WRITE, by syscalls injected into the task). */
static int do_mmap_memfd(void *arg)
{
	int fd = memfd_create("CRIUMFD", MFD_CLOEXEC);
	void *m;

	(void)arg;
	if (fd < 0 || ftruncate(fd, 4096) < 0)
		return 1;
	m = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_FILE | MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return 1;
	((char *)m)[0] = 'm';
	munmap(m, 4096);
	close(fd);
	return 0;
}

static int do_open_by_handle(void *arg)
{
	const char *path = arg;
	struct {
		struct file_handle fh;
		unsigned char bytes[MAX_HANDLE_SZ];
	} h = {.fh.handle_bytes = MAX_HANDLE_SZ};
	int mount_id, mfd, fd;

	if (name_to_handle_at(AT_FDCWD, path, &h.fh, &mount_id, 0) < 0)
		return 1;
	mfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	fd = open_by_handle_at(mfd, &h.fh, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return 1;
	close(fd);
	close(mfd);
	return 0;
}

static void test_io_uring_and_shared_mmap_force_full_diff(void **state)
{
	struct fixture fx;
	char path[PATH_MAX];
	const char *reason = NULL;
	int r;

	FIXTURE(&fx, 0);
	r = fixture_run(&fx, NULL, do_io_uring, NULL, true);
	TEST_REQUIRE(r != 2, "io_uring is disabled on this kernel");
	assert_int_equal(r, 0);
	assert_true(dirty_needs_full_diff(fx.dirty, &reason));
	assert_string_equal(reason, "io_uring");

	dirty_reset(fx.dirty);
	snprintf(path, sizeof(path), "%s/mapped", fx.tmp);
	assert_int_equal(fixture_run(&fx, NULL, do_mmap, path, true), 0);
	assert_false(dirty_needs_full_diff(fx.dirty, NULL));
	assert_true(dirty_covers(fx.dirty, path));

	dirty_reset(fx.dirty);
	assert_int_equal(fixture_run(&fx, NULL, do_mmap_shared, path, true), 0);
	assert_true(dirty_needs_full_diff(fx.dirty, &reason));
	assert_string_equal(reason, "shared writable mapping");

	/* A memfd is no file of any tree (issue 23 item 1: CRIU's parasite maps one at every
	 * dump): its ftruncate and shared writable mapping change nothing a checkpoint's FS
	 * delta holds. */
	dirty_reset(fx.dirty);
	assert_int_equal(fixture_run(&fx, NULL, do_mmap_memfd, NULL, true), 0);
	assert_false(dirty_needs_full_diff(fx.dirty, &reason));
	assert_int_equal(dirty_count(fx.dirty), 0);

	/* A file handle names no path: opening one for writing forces a full diff too. */
	dirty_reset(fx.dirty);
	assert_int_equal(fixture_run(&fx, NULL, do_open_by_handle, path, true), 0);
	assert_true(dirty_needs_full_diff(fx.dirty, &reason));
	assert_string_equal(reason, "open_by_handle_at for writing");
	fixture_teardown(&fx);
}

static void test_pinned_maps_visible(void **state)
{
	struct fixture fx;
	char path[PATH_MAX], cmd[PATH_MAX + 64], line[4096], want[32];
	bool found = false;
	uint64_t id = 0;
	struct stat st;
	FILE *f;

	FIXTURE(&fx, 0);
	static const char *const maps[] = {"events", "watched", "env_stats", "drops", "bss"};
	for (size_t i = 0; i < ARRAY_SIZE(maps); i++) {
		snprintf(path, sizeof(path), "%s/%s", fx.pin_dir, maps[i]);
		assert_int_equal(stat(path, &st), 0);
	}
	snprintf(path, sizeof(path), "%s/progs/enter_openat", fx.pin_dir);
	assert_int_equal(stat(path, &st), 0);

	/* bpftool reads the pinned watched map: our cgroup's id is a key. */
	assert_int_equal(envtrace_cgroup_id(fx.cgroup, &id), 0);
	snprintf(cmd, sizeof(cmd), "bpftool -j map dump pinned '%s/watched' 2>&1", fx.pin_dir);
	f = popen(cmd, "r");
	assert_non_null(f);
	snprintf(want, sizeof(want), "%" PRIu64, id);
	while (fgets(line, sizeof(line), f))
		found |= strstr(line, want) != NULL;
	assert_int_equal(pclose(f), 0);
	assert_true(found);

	/* Another tracer given this directory while its holder lives is refused, and the
	 * holder's pins stay the same objects (issue 16 item 7: it replaced them, and its stop
	 * removed them). */
	{
		struct envtrace_options opts = {.pin_dir = fx.pin_dir};
		struct sv_envtrace *again = NULL;
		struct stat before;

		snprintf(path, sizeof(path), "%s/watched", fx.pin_dir);
		assert_int_equal(stat(path, &before), 0);
		assert_int_equal(envtrace_create(&opts, &again), -EBUSY);
		assert_null(again);
		assert_int_equal(stat(path, &st), 0);
		assert_int_equal(st.st_ino, before.st_ino);
	}
	fixture_teardown(&fx);
}

/* A map pinned at path (an array of one u32): another program's pin, or a dead tracer's. */
static void pin_dummy(const char *path)
{
	int fd = bpf_map_create(BPF_MAP_TYPE_ARRAY, "dummy", 4, 4, 1, NULL);

	assert_true(fd >= 0);
	assert_int_equal(bpf_obj_pin(fd, path), 0);
	close(fd);
}

static enum bpf_map_type pinned_type(const char *path)
{
	struct bpf_map_info info = {0};
	uint32_t len = sizeof(info);
	int fd = bpf_obj_get(path);

	assert_true(fd >= 0);
	assert_int_equal(bpf_obj_get_info_by_fd(fd, &info, &len), 0);
	close(fd);
	return info.type;
}

/* A tracer replaces a dead holder's pins of its own names (no live tracer holds the
 * directory), leaves everything else in the directory, and its stop removes only its own
 * pins. */
static void test_pins_own_only(void **state)
{
	char dir[256], path[PATH_MAX], foreign[PATH_MAX];
	struct envtrace_options opts = {.pin_dir = dir};
	struct sv_envtrace *et = NULL;
	struct stat st;
	struct fixture fx;

	FIXTURE(&fx, 0); /* the preconditions; its tracer is not the one tested */
	fixture_teardown(&fx);
	snprintf(dir, sizeof(dir), "/sys/fs/bpf/belayer/envtrace-test-%d-own", getpid());
	snprintf(path, sizeof(path), "%s/watched", dir);
	snprintf(foreign, sizeof(foreign), "%s/foreign", dir);
	assert_int_equal(mkdir(dir, 0700), 0);
	pin_dummy(path);
	pin_dummy(foreign);
	assert_int_equal(envtrace_create(&opts, &et), 0);
	assert_int_equal(pinned_type(path), BPF_MAP_TYPE_HASH); /* the tracer's watched */
	assert_int_equal(pinned_type(foreign), BPF_MAP_TYPE_ARRAY);
	envtrace_destroy(et);
	assert_int_equal(stat(path, &st), -1);
	assert_int_equal(errno, ENOENT);
	assert_int_equal(pinned_type(foreign), BPF_MAP_TYPE_ARRAY);
	assert_int_equal(unlink(foreign), 0);
	assert_int_equal(rmdir(dir), 0); /* progs/ went with the tracer's pins */
}

struct holder {
	int ready[2], done[2];
	const char *path;
};

static int hold_open(void *arg)
{
	struct holder *h = arg;
	int fd = open(h->path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	char c;

	if (fd < 0 || write(h->ready[1], "r", 1) != 1)
		return 1;
	/* Writes after the checkpoint, with no new open: only the rescan names the file. */
	if (read(h->done[0], &c, 1) != 1)
		return 1;
	return put(fd, "late") == 0 ? 0 : 1;
}

static void test_reset_keeps_open_writers(void **state)
{
	struct fixture fx;
	struct holder h;
	char path[PATH_MAX], other[PATH_MAX], c;
	pid_t pid;
	int status;

	FIXTURE(&fx, 0);
	snprintf(path, sizeof(path), "%s/held", fx.tmp);
	snprintf(other, sizeof(other), "%s/outside-1", fx.tmp);
	assert_int_equal(fixture_run(&fx, NULL, touch_files, fx.tmp, true), 0);
	assert_true(dirty_covers(fx.dirty, other));

	h.path = path;
	assert_int_equal(pipe2(h.ready, O_CLOEXEC), 0);
	assert_int_equal(pipe2(h.done, O_CLOEXEC), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		char procs[300];
		int fd;

		snprintf(procs, sizeof(procs), "%s/cgroup.procs", fx.cgroup);
		fd = open(procs, O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, "0", 1) != 1)
			_exit(100);
		close(fd);
		_exit(hold_open(&h));
	}
	/* the child's ends closed here: a child that fails before it is ready gives EOF */
	close(h.ready[1]);
	close(h.done[0]);
	assert_int_equal(read(h.ready[0], &c, 1), 1);
	fixture_drain(&fx);
	/* The checkpoint: the set empties, but the file still open for writing stays dirty. */
	dirty_reset(fx.dirty);
	assert_false(dirty_covers(fx.dirty, other));
	assert_int_equal(dirty_rescan_writers(fx.dirty, fx.cgroup, NULL), 0);
	assert_true(dirty_covers(fx.dirty, path));
	assert_false(dirty_covers(fx.dirty, other));
	assert_int_equal(write(h.done[1], "d", 1), 1);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	fixture_teardown(&fx);
}

static void test_cli_run_prints_dirty_set(void **state)
{
	struct fixture fx;
	char cmd[PATH_MAX * 2], out[65536], want[PATH_MAX];
	size_t n;
	FILE *f;

	FIXTURE(&fx, 0);
	/* The CLI loads its own copy of the programs (no pins) and watches the same cgroup. */
	snprintf(cmd, sizeof(cmd),
		 "%s --pin-dir '' --json --log '%s/cli.log' run '%s' -- /bin/sh -c "
		 "'echo x > %s/cli-file && mkdir %s/cli-dir'",
		 ENVTRACE_CLI, fx.tmp, fx.cgroup, fx.tmp, fx.tmp);
	f = popen(cmd, "r");
	assert_non_null(f);
	n = fread(out, 1, sizeof(out) - 1, f);
	out[n] = 0;
	assert_int_equal(pclose(f), 0);
	snprintf(want, sizeof(want), "{\"path\":\"%s/cli-file\",\"subtree\":true}", fx.tmp);
	assert_non_null(strstr(out, want));
	snprintf(want, sizeof(want), "{\"path\":\"%s/cli-dir\",\"subtree\":true}", fx.tmp);
	assert_non_null(strstr(out, want));
	assert_non_null(strstr(out, "\"full_diff\":false"));
	assert_non_null(strstr(out, "\"drops\":0,"));

	/* Its log reads back with the shell's command line. */
	snprintf(cmd, sizeof(cmd), "%s --json log '%s/cli.log'", ENVTRACE_CLI, fx.tmp);
	f = popen(cmd, "r");
	assert_non_null(f);
	n = fread(out, 1, sizeof(out) - 1, f);
	out[n] = 0;
	assert_int_equal(pclose(f), 0);
	assert_non_null(strstr(out, "\"argv\":[\"/bin/sh\",\"-c\","));
	fixture_teardown(&fx);
}

static void test_sidelog_rejects_malformed(void **state)
{
	char *dir = test_mkdtemp("belayer-sidelog");
	char path[PATH_MAX];
	/* A record that is not a map, then a map without its kind. */
	static const unsigned char not_map[] = {0x93, 0x01, 0x02, 0x03};
	static const unsigned char no_kind[] = {0x81, 0xa3, 'p', 'i', 'd', 0x05};
	int fd, count = 0;

	assert_non_null(dir);
	snprintf(path, sizeof(path), "%s/bad", dir);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, not_map, sizeof(not_map)), sizeof(not_map));
	close(fd);
	assert_int_equal(sidelog_read(path, count_entry, &count), -EBADMSG);
	fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, no_kind, sizeof(no_kind)), sizeof(no_kind));
	close(fd);
	assert_int_equal(sidelog_read(path, count_entry, &count), -EBADMSG);
	assert_int_equal(count, 0);
	test_rmtree(dir);
	free(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_syscall_against_tree_diff),
		cmocka_unit_test(test_outside_cgroup_ignored),
		cmocka_unit_test(test_cgroup_created_after_watch),
		cmocka_unit_test(test_exec_log_has_argv),
		cmocka_unit_test(test_ringbuf_overflow_forces_full_diff),
		cmocka_unit_test(test_io_uring_and_shared_mmap_force_full_diff),
		cmocka_unit_test(test_reset_keeps_open_writers),
		cmocka_unit_test(test_cli_run_prints_dirty_set),
		cmocka_unit_test(test_sidelog_rejects_malformed),
		/* Last: it replaces the shared tracer's pins with another load's. */
		cmocka_unit_test(test_pinned_maps_visible),
		cmocka_unit_test(test_pins_own_only),
	};

	return cmocka_run_group_tests(tests, fixture_group_setup, fixture_group_teardown);
}
