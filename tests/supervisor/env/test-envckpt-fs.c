/* SPDX-License-Identifier: MIT */
/*
 * File-system state through a checkpoint and a restore of a real environment (issue 16 items
 * 9-11): extended attributes (user.*, security.capability, overlay's own), sparse files (data
 * extents only, holes kept), socket inodes. Real namespaces, overlay, cgroup v2 and CRIU; root
 * only, skips through TEST_REQUIRE otherwise (a failure under BELAYER_TEST_NO_SKIP=1).
 *
 * The environment's changes are made through its overlay root (f->env->root): what a process
 * inside does goes through the same overlay and leaves the same upper layer, and needs no tool
 * (setfattr, setcap) the environment may lack.
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
#include <limits.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "envckpt-fixture.h"
#include "envckpt-test.h"
#include "supervisor-env-fs.h"
#include "supervisor-env.h"
#include "test-util.h"
#include "util.h"

#define env_exec(f, ...) \
	assert_int_equal(fixture_env_exec((f)->env->cgroup, (f)->env->pid, __VA_ARGS__), 0)

static const char env_cmd[] = "cd /work; touch /work/ready; exec sleep infinity";

/* A path in the environment's root (the overlay: what its processes see). */
static const char *in_root(struct envckpt_fx *f, const char *rel)
{
	static char buf[4][PATH_MAX];
	static unsigned next;
	char *p = buf[next++ % 4];

	snprintf(p, PATH_MAX, "%s/%s", f->env->root, rel);
	return p;
}

static void write_file(const char *path, const char *s, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, s, strlen(s)), (ssize_t)strlen(s));
	close(fd);
}

static void content_is(const char *path, const char *want)
{
	char got[256];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	assert_true(fd >= 0);
	n = read(fd, got, sizeof(got) - 1);
	close(fd);
	assert_true(n >= 0);
	got[n] = '\0';
	assert_string_equal(got, want);
}

static void checkpoint(struct envckpt_fx *f, uint64_t turn, struct env_manifest *m)
{
	struct env_ckpt_params p = {.trajectory = "traj-fs", .turn = turn};
	int r = env_checkpoint(f->env, &p, m);

	if (r < 0)
		print_message("checkpoint failed: %s (CRIU log in %s/ckpt/.tmp-*/criu)\n",
			      strerror(-r), f->env->dir);
	assert_int_equal(r, 0);
}

static void restore(struct envckpt_fx *f, const char *id)
{
	struct env_manifest back = {0};

	assert_int_equal(env_restore(f->env, id, &back), 0);
	env_manifest_finish(&back);
}

/* The value of xattr name on path (not following a symlink) equals want (len bytes). */
static void xattr_is(const char *path, const char *name, const void *want, size_t len)
{
	char got[256];
	ssize_t n = lgetxattr(path, name, got, sizeof(got));

	if (n < 0)
		print_message("%s: %s: %s\n", path, name, strerror(errno));
	assert_int_equal(n, (ssize_t)len);
	assert_memory_equal(got, want, len);
}

static void no_xattr(const char *path, const char *name)
{
	char got[256];

	assert_int_equal(lgetxattr(path, name, got, sizeof(got)), -1);
	assert_int_equal(errno, ENODATA);
}

/* A file capability: cap_net_raw permitted and effective (what `setcap cap_net_raw+ep` sets). */
static void file_cap(struct vfs_cap_data *c)
{
	memset(c, 0, sizeof(*c));
	c->magic_etc = VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE;
	c->data[CAP_NET_RAW / 32].permitted = 1u << (CAP_NET_RAW % 32);
}

/* Every xattr comes back: user.* on a new file, on a base file copied up by setting it, on a
 * directory; security.capability on a new file and on one the restore keeps in place (a chown
 * of it would drop the capability); overlay's opaque directory. Changed, added or removed
 * after the checkpoint, each is what it was; a checkpoint of the restored state keeps them. */
static void test_xattrs(void **state)
{
	struct envckpt_fx *f = *state;
	struct env_manifest m1 = {0}, m2 = {0};
	struct vfs_cap_data cap;
	char path[PATH_MAX];

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	envckpt_fx_prepare(f, "belayer-envckpt-fs");
	snprintf(path, sizeof(path), "%s/work/basefile", f->base);
	write_file(path, "base\n", 0644);
	snprintf(path, sizeof(path), "%s/work/basedir", f->base);
	assert_int_equal(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/work/basedir/inner", f->base);
	write_file(path, "inner\n", 0644);
	envckpt_fx_create(f, "xattr", env_cmd, 0);

	file_cap(&cap);
	write_file(in_root(f, "work/new"), "new\n", 0644);
	assert_int_equal(setxattr(in_root(f, "work/new"), "user.x", "new-x", 5, 0), 0);
	assert_int_equal(setxattr(in_root(f, "work/new"), "user.y", "2", 1, 0), 0);
	assert_int_equal(setxattr(in_root(f, "work/basefile"), "user.x", "base-x", 6, 0), 0);
	assert_int_equal(mkdir(in_root(f, "work/xdir"), 0755), 0);
	assert_int_equal(setxattr(in_root(f, "work/xdir"), "user.d", "dir", 3, 0), 0);
	write_file(in_root(f, "work/cap"), "#!/bin/sh\n", 0755);
	assert_int_equal(
		setxattr(in_root(f, "work/cap"), "security.capability", &cap, sizeof(cap), 0), 0);
	write_file(in_root(f, "work/capkept"), "#!/bin/sh\n", 0755);
	assert_int_equal(
		setxattr(in_root(f, "work/capkept"), "security.capability", &cap, sizeof(cap), 0),
		0);
	env_exec(f, "rm -rf /work/basedir && mkdir /work/basedir"); /* opaque: inner is gone */
	checkpoint(f, 1, &m1);

	/* Changed, removed, added after the checkpoint. */
	assert_int_equal(removexattr(in_root(f, "work/new"), "user.x"), 0);
	assert_int_equal(setxattr(in_root(f, "work/new"), "user.z", "later", 5, 0), 0);
	assert_int_equal(setxattr(in_root(f, "work/basefile"), "user.x", "changed", 7, 0), 0);
	assert_int_equal(removexattr(in_root(f, "work/xdir"), "user.d"), 0);
	assert_int_equal(setxattr(in_root(f, "work/xdir"), "user.e", "e", 1, 0), 0);
	assert_int_equal(removexattr(in_root(f, "work/cap"), "security.capability"), 0);

	restore(f, m1.id);
	xattr_is(in_root(f, "work/new"), "user.x", "new-x", 5);
	xattr_is(in_root(f, "work/new"), "user.y", "2", 1);
	no_xattr(in_root(f, "work/new"), "user.z");
	xattr_is(in_root(f, "work/basefile"), "user.x", "base-x", 6);
	xattr_is(in_root(f, "work/xdir"), "user.d", "dir", 3);
	no_xattr(in_root(f, "work/xdir"), "user.e");
	xattr_is(in_root(f, "work/cap"), "security.capability", &cap, sizeof(cap));
	xattr_is(in_root(f, "work/capkept"), "security.capability", &cap, sizeof(cap));
	assert_int_equal(access(in_root(f, "work/basedir/inner"), F_OK), -1);
	content_is(in_root(f, "work/basefile"), "base\n");

	/* A checkpoint of the restored state (nothing changed: each entry's xattrs as the last
	 * index had them), then everything dropped, and back. */
	checkpoint(f, 2, &m2);
	assert_int_equal(removexattr(in_root(f, "work/new"), "user.y"), 0);
	assert_int_equal(removexattr(in_root(f, "work/capkept"), "security.capability"), 0);
	assert_int_equal(removexattr(in_root(f, "work/xdir"), "user.d"), 0);
	restore(f, m2.id);
	xattr_is(in_root(f, "work/new"), "user.y", "2", 1);
	xattr_is(in_root(f, "work/capkept"), "security.capability", &cap, sizeof(cap));
	xattr_is(in_root(f, "work/xdir"), "user.d", "dir", 3);
	xattr_is(in_root(f, "work/basefile"), "user.x", "base-x", 6);
	env_manifest_finish(&m1);
	env_manifest_finish(&m2);
}

/* Bytes allocated under path (st_blocks, what du counts), never following a symlink. */
static uint64_t du(int at, const char *name)
{
	struct stat st;
	uint64_t sum;
	DIR *d;
	struct dirent *de;
	int fd;

	assert_int_equal(fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW), 0);
	sum = (uint64_t)st.st_blocks * 512;
	if (!S_ISDIR(st.st_mode))
		return sum;
	fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	assert_true(fd >= 0);
	d = fdopendir(fd);
	assert_non_null(d);
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
			sum += du(dirfd(d), de->d_name);
	closedir(d);
	return sum;
}

#define SPARSE_SIZE (1ull << 30)
#define SPARSE_AT   (512ull << 20)

/* A 1 GiB sparse file with 2 bytes written: the checkpoint copies its data extent, not 1 GiB
 * (bytes on disk, frozen time), and the restore writes it back sparse, holes and all. */
static void test_sparse(void **state)
{
	struct envckpt_fx *f = *state;
	struct env_manifest m1 = {0};
	char path[PATH_MAX], buf[2];
	uint64_t on_disk;
	struct stat st;
	int fd;

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	envckpt_fx_prepare(f, "belayer-envckpt-fs");
	envckpt_fx_create(f, "sparse", env_cmd, 0);
	env_exec(f,
		 "truncate -s %llu /work/sparse && printf ab | "
		 "dd of=/work/sparse bs=1 seek=%llu conv=notrunc status=none",
		 SPARSE_SIZE, SPARSE_AT);
	checkpoint(f, 1, &m1);
	snprintf(path, sizeof(path), "%s/ckpt/%s", f->env->dir, m1.id);
	on_disk = du(AT_FDCWD, path);
	print_message("sparse checkpoint: frozen %" PRIu64 " us, fs copy %" PRIu64 " us, %" PRIu64
		      " bytes copied, %" PRIu64 " bytes on disk\n",
		      m1.freeze_us, m1.fs_us, m1.fs_bytes, on_disk);
	/* A checkpoint is CRIU's images (a few MiB at most here) and the file's one extent. */
	assert_true(on_disk < (64ull << 20));
	assert_true(m1.fs_bytes < (1ull << 20));

	/* Gone, then restored: the same size and bytes, holes allocated as holes. */
	assert_int_equal(unlink(in_root(f, "work/sparse")), 0);
	restore(f, m1.id);
	fd = open(in_root(f, "work/sparse"), O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &st), 0);
	print_message("sparse restored: size %" PRIu64 ", %" PRIu64 " bytes allocated\n",
		      (uint64_t)st.st_size, (uint64_t)st.st_blocks * 512);
	assert_int_equal((uint64_t)st.st_size, SPARSE_SIZE);
	assert_true((uint64_t)st.st_blocks * 512 < (1ull << 20));
	assert_int_equal(pread(fd, buf, 2, (off_t)SPARSE_AT), 2);
	assert_memory_equal(buf, "ab", 2);
	assert_int_equal(pread(fd, buf, 2, (off_t)SPARSE_AT - 2), 2);
	assert_memory_equal(buf, "\0\0", 2);
	assert_int_equal(pread(fd, buf, 2, (off_t)SPARSE_SIZE - 2), 2);
	assert_memory_equal(buf, "\0\0", 2);
	close(fd);
	env_manifest_finish(&m1);
}

/* A stale unix-socket file (its server gone, the inode left behind) is file-system state like
 * a fifo: it comes back, with its mode and owner. */
static void test_stale_socket(void **state)
{
	struct envckpt_fx *f = *state;
	struct env_manifest m1 = {0};
	struct stat st;

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	envckpt_fx_prepare(f, "belayer-envckpt-fs");
	envckpt_fx_create(f, "sock", env_cmd, 0);
	assert_int_equal(mknod(in_root(f, "work/stale.sock"), S_IFSOCK | 0750, 0), 0);
	assert_int_equal(lchown(in_root(f, "work/stale.sock"), 1000, 1000), 0);
	checkpoint(f, 1, &m1);
	assert_int_equal(unlink(in_root(f, "work/stale.sock")), 0);
	restore(f, m1.id);
	assert_int_equal(lstat(in_root(f, "work/stale.sock"), &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0750);
	assert_int_equal(st.st_uid, 1000);
	env_manifest_finish(&m1);
}

/* --- the dirty-set delta against the walk (issue 23 items 1 and 6) ---------------------- */

/* The tracer's view, as a test gives it: the paths (what envtrace records for each change:
 * the path with its subtree, its directory for itself when an entry was added or removed)
 * and whether it vouches for the interval. */
struct fake_tracer {
	struct env_fs_dirty items[64];
	size_t n;
	const char *why; /* NULL: it vouches */
	unsigned calls;
};

static int fake_frozen(void *userdata, const struct env_fs_dirty **ret, size_t *ret_n,
		       const char **ret_why)
{
	struct fake_tracer *t = userdata;

	t->calls++;
	if (t->why) {
		*ret_why = t->why;
		return 1;
	}
	*ret = t->items;
	*ret_n = t->n;
	return 0;
}

static void dirty(struct fake_tracer *t, const char *path, bool subtree)
{
	assert_true(t->n < ARRAY_SIZE(t->items));
	t->items[t->n++] = (struct env_fs_dirty){.path = path, .subtree = subtree};
}

static void checkpoint_traced(struct envckpt_fx *f, uint64_t turn, struct fake_tracer *t,
			      struct env_manifest *m)
{
	struct env_ckpt_params p = {
		.trajectory = "traj-fs", .turn = turn, .frozen = fake_frozen, .userdata = t};

	assert_int_equal(env_checkpoint(f->env, &p, m), 0);
	assert_int_equal(t->calls, 1);
}

/* The bytes an entry's data reference names (ckpts/<src>/data/<key>), or, for src "walk",
 * walk_data/<key>. */
static size_t entry_data(const char *ckpts, const char *walk_data, const struct env_entry *e,
			 char *buf, size_t cap)
{
	char path[PATH_MAX];
	ssize_t n;
	int fd;

	if (strcmp(e->src, "walk") == 0)
		snprintf(path, sizeof(path), "%s/%" PRIu64, walk_data, e->data_key);
	else
		snprintf(path, sizeof(path), "%s/%s/data/%" PRIu64, ckpts, e->src, e->data_key);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		print_message("%s: %s\n", path, strerror(errno));
	assert_true(fd >= 0);
	n = read(fd, buf, cap);
	close(fd);
	assert_true(n >= 0);
	return (size_t)n;
}

static const struct env_entry *entry_of(const struct env_manifest *m, const char *path)
{
	for (size_t i = 0; i < m->n_entries; i++)
		if (strcmp(m->entries[i].path, path) == 0)
			return &m->entries[i];
	return NULL;
}

/* a and b hold the same entries: paths, kinds, metadata, xattrs, symlink targets, and the
 * same bytes behind every regular file's data reference; with_inodes: inode and ctime too (the
 * same upper layer indexed twice), else not (a rebuilt one). */
static void same_entries(const char *what, const char *ckpts, const char *walk_data,
			 const struct env_manifest *a, const struct env_manifest *b,
			 bool with_inodes)
{
	static char da[1 << 16], db[1 << 16];

	if (a->n_entries != b->n_entries) {
		for (size_t i = 0; i < a->n_entries; i++)
			if (!entry_of(b, a->entries[i].path))
				print_message("%s: only in the first: %s\n", what,
					      a->entries[i].path);
		for (size_t i = 0; i < b->n_entries; i++)
			if (!entry_of(a, b->entries[i].path))
				print_message("%s: only in the second: %s\n", what,
					      b->entries[i].path);
	}
	assert_int_equal(a->n_entries, b->n_entries);
	for (size_t i = 0; i < a->n_entries; i++) {
		const struct env_entry *x = &a->entries[i], *y = entry_of(b, x->path);
		/* The same layer indexed at the freeze and walked after the dump: the dump itself
		 * made and removed a directory in /tmp since (see fs_phase). Whiteouts are links
		 * of one inode of the overlay's (any whiteout made or removed changes their ctime):
		 * their inode and ctime say nothing. */
		bool times = !(with_inodes && strcmp(x->path, "tmp") == 0);
		bool wh = x->kind == ENV_ENTRY_WHITEOUT;

		if (!y || x->kind != y->kind || x->mode != y->mode || x->uid != y->uid ||
		    x->gid != y->gid || x->size != y->size ||
		    (times && x->mtime_ns != y->mtime_ns) || x->opaque != y->opaque ||
		    x->n_xattrs != y->n_xattrs ||
		    (with_inodes && !wh &&
		     (x->ino != y->ino || (times && x->ctime_ns != y->ctime_ns))))
			print_message("%s: %s differs: kind %d/%d mode %o/%o size %" PRIu64
				      "/%" PRIu64 " mtime %" PRIu64 "/%" PRIu64 " ctime %" PRIu64
				      "/%" PRIu64 " xattrs %u/%u\n",
				      what, x->path, x->kind, y ? (int)y->kind : -1, x->mode,
				      y ? y->mode : 0, x->size, y ? y->size : 0, x->mtime_ns,
				      y ? y->mtime_ns : 0, x->ctime_ns, y ? y->ctime_ns : 0,
				      x->n_xattrs, y ? y->n_xattrs : 0);
		assert_non_null(y);
		assert_int_equal(x->kind, y->kind);
		assert_int_equal(x->mode, y->mode);
		assert_int_equal(x->uid, y->uid);
		assert_int_equal(x->gid, y->gid);
		assert_int_equal(x->size, y->size);
		if (times)
			assert_int_equal(x->mtime_ns, y->mtime_ns);
		assert_int_equal(x->opaque, y->opaque);
		if (with_inodes && !wh) {
			assert_int_equal(x->ino, y->ino);
			if (times)
				assert_int_equal(x->ctime_ns, y->ctime_ns);
		}
		assert_int_equal(x->n_xattrs, y->n_xattrs);
		for (uint32_t k = 0; k < x->n_xattrs; k++) {
			const struct env_xattr *xy = env_entry_xattr(y, x->xattrs[k].name);

			assert_non_null(xy);
			assert_int_equal(xy->len, x->xattrs[k].len);
			assert_memory_equal(xy->value, x->xattrs[k].value, xy->len);
		}
		if (x->kind == ENV_ENTRY_SYMLINK)
			assert_string_equal(x->target, y->target);
		if (x->kind == ENV_ENTRY_HARDLINK)
			assert_string_equal(x->hardlink, y->hardlink);
		if (x->kind == ENV_ENTRY_REG && x->size <= sizeof(da)) {
			size_t na = entry_data(ckpts, walk_data, x, da, sizeof(da));
			size_t nb = entry_data(ckpts, walk_data, y, db, sizeof(db));

			assert_int_equal(na, nb);
			assert_memory_equal(da, db, na);
		}
	}
}

/* The upper layer walked now, against base (NULL: from nothing, every file copied), into
 * an index whose data is in <dir>/walk-data. */
static void walk_now(struct envckpt_fx *f, const struct env_manifest *base, struct env_manifest *w,
		     char *walk_data)
{
	int up, dfd;

	snprintf(walk_data, PATH_MAX, "%s/walk-data", f->dir);
	if (access(walk_data, F_OK) == 0) {
		dfd = open(walk_data, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		assert_int_equal(env_fs_wipe(dfd), 0);
		close(dfd);
	} else {
		assert_int_equal(mkdir(walk_data, 0700), 0);
	}
	*w = (struct env_manifest){0};
	snprintf(w->id, sizeof(w->id), "walk");
	up = open(f->env->upper, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	dfd = open(walk_data, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(up >= 0 && dfd >= 0);
	assert_int_equal(env_fs_scan(up, base, NULL, NULL, NULL, dfd, w, NULL), 0);
	close(up);
	close(dfd);
}

/* After a restore to m: the upper layer is m's (walked from nothing and compared), and the
 * head's index in memory is exactly the layer, inodes and ctimes included (the next checkpoint
 * and restore rely on them). */
static void upper_is(struct envckpt_fx *f, const struct env_manifest *m)
{
	char ckpts[PATH_MAX], walk_data[PATH_MAX];
	struct env_manifest w;

	snprintf(ckpts, sizeof(ckpts), "%s/ckpt", f->env->dir);
	walk_now(f, NULL, &w, walk_data);
	same_entries("restored", ckpts, walk_data, m, &w, false);
	assert_true(f->env->head_valid);
	assert_string_equal(f->env->head_index.id, m->id);
	same_entries("head index", ckpts, walk_data, &f->env->head_index, &w, true);
	env_manifest_finish(&w);
}

static void restore_traced(struct envckpt_fx *f, const char *id, struct fake_tracer *t)
{
	struct env_restore_params p = {.killed = fake_frozen, .userdata = t};
	struct env_manifest back = {0};

	assert_int_equal(env_restore_traced(f->env, id, &p, &back), 0);
	assert_string_equal(back.id, id);
	env_manifest_finish(&back);
}

/*
 * Every kind of change between two checkpoints, the second's delta from the dirty set alone:
 * its index equals a walk of the same upper layer entry for entry (inodes, ctimes, xattrs, the
 * bytes of every file), and restores to either checkpoint rebuild exactly its index. Changes:
 * a file created, rewritten, deleted, renamed; a directory renamed, created with content,
 * removed and replaced by a file; base files deleted (whiteouts) and a base directory removed
 * (whiteout over its subtree); a base file deep in base directories rewritten (the overlay
 * copies its directories up: not named by the tracer); a symlink made and one retargeted;
 * xattrs set on a new file and on a base file; a sparse file; a base directory's mode.
 */
static void test_dirty_kinds(void **state)
{
	struct envckpt_fx *f = *state;
	struct env_manifest m1 = {0}, m2 = {0}, w = {0};
	struct fake_tracer t = {0}, t2 = {0}, none = {0};
	char path[PATH_MAX], ckpts[PATH_MAX], walk_data[PATH_MAX];
	struct stat st;

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	envckpt_fx_prepare(f, "belayer-envckpt-fs");
	snprintf(path, sizeof(path), "%s/work/basefile", f->base);
	write_file(path, "base\n", 0644);
	snprintf(path, sizeof(path), "%s/work/xattrbase", f->base);
	write_file(path, "xb\n", 0644);
	snprintf(path, sizeof(path), "%s/work/lowdir", f->base);
	assert_int_equal(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/work/lowdir/a", f->base);
	write_file(path, "a\n", 0644);
	snprintf(path, sizeof(path), "%s/work/deep", f->base);
	assert_int_equal(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/work/deep/er", f->base);
	assert_int_equal(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/work/deep/er/file", f->base);
	write_file(path, "deep\n", 0644);
	snprintf(path, sizeof(path), "%s/work/modedir", f->base);
	assert_int_equal(mkdir(path, 0755), 0);
	envckpt_fx_create(f, "dirty", env_cmd, 0);
	snprintf(ckpts, sizeof(ckpts), "%s/ckpt", f->env->dir);

	env_exec(f, "mkdir -p /work/d1/d2 /work/mv/in && echo keep >/work/keep && "
		    "echo old >/work/old && echo f1 >/work/d1/f1 && echo f2 >/work/d1/d2/f2 && "
		    "echo x >/work/mv/in/x && echo y >/work/mv/y && ln -s keep /work/sym && "
		    "mkdir /work/gone && echo g >/work/gone/g");
	for (int i = 0; i < 50; i++) {
		snprintf(path, sizeof(path), "work/many%02d", i);
		write_file(in_root(f, path), "unchanged\n", 0644);
	}
	/* the first: no tracer (no parent either) */
	checkpoint(f, 1, &m1);
	assert_string_equal(m1.delta_path, "walk");

	/* the changes, each with what the tracer records for it */
	env_exec(f, "echo new >/work/new");
	dirty(&t, "/work/new", true), dirty(&t, "/work", false);
	env_exec(f, "echo rewritten >/work/keep");
	dirty(&t, "/work/keep", true);
	env_exec(f, "rm /work/old");
	dirty(&t, "/work/old", true);
	env_exec(f, "mv /work/d1/f1 /work/d1/f1r");
	dirty(&t, "/work/d1/f1", true), dirty(&t, "/work/d1/f1r", true);
	dirty(&t, "/work/d1", false);
	env_exec(f, "mv /work/mv /work/mv2");
	dirty(&t, "/work/mv", true), dirty(&t, "/work/mv2", true);
	env_exec(f, "mkdir -p /work/nd/ne && echo n >/work/nd/ne/n && echo m >/work/nd/m");
	dirty(&t, "/work/nd", true), dirty(&t, "/work/nd/ne", true);
	dirty(&t, "/work/nd/ne/n", true), dirty(&t, "/work/nd/m", true);
	env_exec(f, "rm -rf /work/d1/d2 && echo now-a-file >/work/d1/d2");
	dirty(&t, "/work/d1/d2", true), dirty(&t, "/work/d1/d2/f2", true);
	env_exec(f, "rm -rf /work/gone");
	dirty(&t, "/work/gone", true), dirty(&t, "/work/gone/g", true);
	env_exec(f, "rm /work/basefile && rm -rf /work/lowdir");
	dirty(&t, "/work/basefile", true), dirty(&t, "/work/lowdir", true);
	dirty(&t, "/work/lowdir/a", true);
	env_exec(f, "echo deeper >>/work/deep/er/file");
	dirty(&t, "/work/deep/er/file", true);
	env_exec(f, "ln -s new /work/sym2 && rm /work/sym && ln -s new /work/sym");
	dirty(&t, "/work/sym2", true), dirty(&t, "/work/sym", true);
	assert_int_equal(setxattr(in_root(f, "work/nd/m"), "user.t", "nd", 2, 0), 0);
	assert_int_equal(setxattr(in_root(f, "work/xattrbase"), "user.t", "xb", 2, 0), 0);
	dirty(&t, "/work/xattrbase", true);
	env_exec(f, "truncate -s 1G /work/sparse && printf ab | "
		    "dd of=/work/sparse bs=1 seek=4096 conv=notrunc status=none");
	dirty(&t, "/work/sparse", true);
	env_exec(f, "chmod 0700 /work/modedir");
	dirty(&t, "/work/modedir", true);

	checkpoint_traced(f, 2, &t, &m2);
	print_message("dirty-set delta: %zu paths, %" PRIu64 " files copied, %" PRIu64
		      " removed, FS phase %" PRIu64 " us\n",
		      t.n, m2.fs_files, m2.fs_removed, m2.fs_us);
	assert_string_equal(m2.delta_path, "dirty-set");
	assert_false(m2.full_diff);
	/* what changed only: not the 50 unchanged files, not the rest */
	assert_true(m2.fs_files <= 12);
	assert_int_equal(m2.fs_removed, 9); /* old, f1, mv, mv/in, mv/in/x, mv/y, d2/f2, gone, g */
	assert_null(entry_of(&m2, "work/old"));
	assert_non_null(entry_of(&m2, "work/many00"));
	assert_int_equal(entry_of(&m2, "work/basefile")->kind, ENV_ENTRY_WHITEOUT);
	assert_int_equal(entry_of(&m2, "work/deep/er")->kind, ENV_ENTRY_DIR);

	/* the walk of the same layer against the same parent sees the same */
	walk_now(f, &m1, &w, walk_data);
	same_entries("dirty-set vs walk", ckpts, walk_data, &m2, &w, true);
	env_manifest_finish(&w);

	/* Restores by what differs (issue 23 item 4): to the head after more changes (their
	 * dirty set), to the parent (what differs between the two indexes), and back. */
	env_exec(f, "echo after >/work/keep && rm -rf /work/nd && mkdir -p /work/z/y && "
		    "echo z >/work/z/y/z && rm /work/new && echo q >/work/d1/f1r && "
		    "rm /work/deep/er/file && mv /work/mv2 /work/mv3");
	dirty(&t2, "/work/keep", true), dirty(&t2, "/work/nd", true);
	dirty(&t2, "/work/nd/ne", true), dirty(&t2, "/work/nd/ne/n", true);
	dirty(&t2, "/work/nd/m", true), dirty(&t2, "/work/z", true);
	dirty(&t2, "/work/z/y", true), dirty(&t2, "/work/z/y/z", true);
	dirty(&t2, "/work/new", true), dirty(&t2, "/work", false);
	dirty(&t2, "/work/d1/f1r", true), dirty(&t2, "/work/deep/er/file", true);
	dirty(&t2, "/work/deep/er", false), dirty(&t2, "/work/mv2", true);
	dirty(&t2, "/work/mv3", true);
	restore_traced(f, m2.id, &t2);
	assert_string_equal(f->env->rollback_path, "dirty-set");
	upper_is(f, &m2);
	content_is(in_root(f, "work/keep"), "rewritten\n");
	content_is(in_root(f, "work/nd/ne/n"), "n\n");
	assert_int_equal(access(in_root(f, "work/z"), F_OK), -1);
	restore_traced(f, m1.id, &none);
	assert_string_equal(f->env->rollback_path, "dirty-set");
	upper_is(f, &m1);
	content_is(in_root(f, "work/keep"), "keep\n");
	content_is(in_root(f, "work/basefile"), "base\n");
	content_is(in_root(f, "work/lowdir/a"), "a\n");
	restore_traced(f, m2.id, &none);
	assert_string_equal(f->env->rollback_path, "dirty-set");
	upper_is(f, &m2);

	/* and by the walk, the same */
	restore(f, m1.id);
	assert_string_equal(f->env->rollback_path, "walk");
	upper_is(f, &m1);
	content_is(in_root(f, "work/keep"), "keep\n");
	content_is(in_root(f, "work/basefile"), "base\n");
	restore(f, m2.id);
	upper_is(f, &m2);
	content_is(in_root(f, "work/keep"), "rewritten\n");
	content_is(in_root(f, "work/deep/er/file"), "deep\ndeeper\n");
	assert_int_equal(access(in_root(f, "work/lowdir/a"), F_OK), -1);
	assert_int_equal(lstat(in_root(f, "work/sparse"), &st), 0);
	assert_true((uint64_t)st.st_blocks * 512 < (1ull << 20));
	xattr_is(in_root(f, "work/xattrbase"), "user.t", "xb", 2);
	env_manifest_finish(&m1);
	env_manifest_finish(&m2);
}

/* A hard link's inode changed through one name: its other names are not in the dirty set, so
 * the delta walks, and says why; a tracer that cannot vouch (records lost) walks too. Either
 * way the index equals the walk's and restores exactly. */
static void test_dirty_walks(void **state)
{
	struct envckpt_fx *f = *state;
	struct env_manifest m1 = {0}, m2 = {0}, m3 = {0}, w = {0};
	struct fake_tracer t = {0}, lost = {.why = "ring buffer overflow: records lost"};
	char ckpts[PATH_MAX], walk_data[PATH_MAX];

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	envckpt_fx_prepare(f, "belayer-envckpt-fs");
	envckpt_fx_create(f, "dirtylinks", env_cmd, 0);
	snprintf(ckpts, sizeof(ckpts), "%s/ckpt", f->env->dir);
	env_exec(f, "echo one >/work/h1 && ln /work/h1 /work/h2 && echo s >/work/solo");
	checkpoint(f, 1, &m1);

	env_exec(f, "echo two >>/work/h1");
	dirty(&t, "/work/h1", true);
	checkpoint_traced(f, 2, &t, &m2);
	assert_string_equal(m2.delta_path, "walk");
	assert_true(m2.full_diff);
	assert_string_equal(m2.full_diff_reason, "a hard link changed");
	walk_now(f, &m1, &w, walk_data);
	same_entries("hard link", ckpts, walk_data, &m2, &w, true);
	env_manifest_finish(&w);

	env_exec(f, "echo lost >/work/solo");
	checkpoint_traced(f, 3, &lost, &m3);
	assert_string_equal(m3.delta_path, "walk");
	assert_string_equal(m3.full_diff_reason, "ring buffer overflow: records lost");
	assert_int_equal(m3.fs_files, 1);

	restore(f, m2.id);
	upper_is(f, &m2);
	content_is(in_root(f, "work/h2"), "one\ntwo\n");
	restore(f, m3.id);
	upper_is(f, &m3);
	content_is(in_root(f, "work/solo"), "lost\n");
	env_manifest_finish(&m1);
	env_manifest_finish(&m2);
}

/* --- pre-copy (issue 23 item 2) ----------------------------------------------------------- */

/*
 * The tracer as a pre-copy sees it: round 0 the turn's dirty set; every later round and the
 * frozen phase what a writer running all along dirties (its file). The frozen callback
 * records the instant the dump sees: the rewritten file's bytes and a walk of the upper layer,
 * both read while frozen.
 */
struct precopy_tracer {
	struct fake_tracer all; /* the whole set (frozen's answer) */
	struct env_fs_dirty late[3];
	/* a tree removed while round 0 reads it (through the overlay, as the environment
	 * would; done before the next round) */
	const char *rm_path;
	pid_t rm_pid;
	unsigned precopy_calls, late_calls;
	struct envckpt_fx *f;
	const struct env_manifest *base;
	char at_start[64], at_freeze[64];
	struct env_manifest walk;
	char walk_data[PATH_MAX];
};

static void read_small(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	assert_true(fd >= 0);
	n = read(fd, buf, cap - 1);
	close(fd);
	assert_true(n >= 0);
	buf[n] = '\0';
}

/* m without the entry at path, into out. */
static void without(const struct env_manifest *m, const char *path, struct env_manifest *out)
{
	*out = (struct env_manifest){0};
	snprintf(out->id, sizeof(out->id), "%s", m->id);
	for (size_t i = 0; i < m->n_entries; i++)
		if (strcmp(m->entries[i].path, path) != 0)
			assert_int_equal(env_manifest_add(out, &m->entries[i]), 0);
}

/* The environment's cgroup frozen (or thawed), waited for. */
static void freeze(struct envckpt_fx *f, bool on)
{
	char path[PATH_MAX], ev[256];
	int fd;

	snprintf(path, sizeof(path), "%s/cgroup.freeze", f->env->cgroup);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, on ? "1" : "0", 1), 1);
	close(fd);
	snprintf(path, sizeof(path), "%s/cgroup.events", f->env->cgroup);
	for (int i = 0; i < 5000; i++) {
		read_small(path, ev, sizeof(ev));
		if (strstr(ev, on ? "frozen 1" : "frozen 0"))
			return;
		usleep(1000);
	}
	fail_msg("%s: not %s", f->env->cgroup, on ? "frozen" : "thawed");
}

/* The removal done (before the freeze's instant, as the environment's own would be). */
static void rm_wait(struct precopy_tracer *t)
{
	int status;

	if (t->rm_pid <= 0)
		return;
	assert_int_equal(waitpid(t->rm_pid, &status, 0), t->rm_pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	t->rm_pid = 0;
}

static int pc_precopy(void *userdata, unsigned round, const struct env_fs_dirty **ret,
		      size_t *ret_n, const char **ret_why)
{
	struct precopy_tracer *t = userdata;

	(void)ret_why;
	t->precopy_calls++;
	if (round == 0 && t->rm_path) {
		t->rm_pid = fork();
		assert_true(t->rm_pid >= 0);
		if (t->rm_pid == 0) {
			execlp("rm", "rm", "-rf", t->rm_path, (char *)NULL);
			_exit(127);
		}
	} else {
		rm_wait(t);
	}
	if (round == 0) {
		char path[PATH_MAX];

		snprintf(path, sizeof(path), "%s/work/loop", t->f->env->upper);
		read_small(path, t->at_start, sizeof(t->at_start));
		*ret = t->all.items;
		*ret_n = t->all.n;
		return 0;
	}
	*ret = t->late;
	*ret_n = ARRAY_SIZE(t->late);
	return 0;
}

static void pc_late(void *userdata, const struct env_fs_dirty **ret, size_t *ret_n)
{
	struct precopy_tracer *t = userdata;
	char path[PATH_MAX];

	t->late_calls++;
	assert_int_equal(t->rm_pid, 0);
	/* frozen: what the dump sees */
	snprintf(path, sizeof(path), "%s/work/loop", t->f->env->upper);
	read_small(path, t->at_freeze, sizeof(t->at_freeze));
	walk_now(t->f, t->base, &t->walk, t->walk_data);
	*ret = t->late;
	*ret_n = ARRAY_SIZE(t->late);
}

static int pc_frozen(void *userdata, const struct env_fs_dirty **ret, size_t *ret_n,
		     const char **ret_why)
{
	struct precopy_tracer *t = userdata;

	rm_wait(t); /* a pre-copy given up after round 0 asked no further round */
	return fake_frozen(&t->all, ret, ret_n, ret_why);
}

/*
 * A turn of 3,000 new files copied before the freeze while a process rewrites a file in a loop
 * the whole time, and 3,000 more removed while the pre-copy reads them: the checkpoint holds the
 * file as the dump saw it (read while frozen), not as the pre-copy read it, and its index equals
 * a walk of the upper layer at the frozen instant, entry for entry (the removed tree absent);
 * the pre-copy survived the names vanishing under it (the frozen phase was asked for what came
 * since its last round only). A restore rebuilds exactly that index.
 */
static void test_precopy_rewritten(void **state)
{
	struct envckpt_fx *f = *state;
	struct env_manifest m1 = {0}, m2 = {0};
	struct precopy_tracer t = {.f = f};
	char path[PATH_MAX], ckpts[PATH_MAX], data[64], rm_path[PATH_MAX];
	const struct env_entry *e;
	struct env_ckpt_params p = {.trajectory = "traj-fs",
				    .turn = 2,
				    .frozen = pc_frozen,
				    .precopy = pc_precopy,
				    .late = pc_late,
				    .userdata = &t};

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	envckpt_fx_prepare(f, "belayer-envckpt-fs");
	/* the writer: the environment's own process, rewriting its file in place all along (never
	 * truncated: a count of fixed width over the last) */
	envckpt_fx_create(f, "precopy",
			  "cd /work; echo 000000000 >/work/loop; touch /work/ready; i=0; "
			  "while :; do i=$((i+1)); printf %09d $i 1<>/work/loop; done",
			  0);
	snprintf(ckpts, sizeof(ckpts), "%s/ckpt", f->env->dir);
	checkpoint(f, 1, &m1);
	t.base = &m1;

	/* the turn: 3,000 files in a new directory, and the writer */
	assert_int_equal(mkdir(in_root(f, "work/bulk"), 0755), 0);
	for (int d = 0; d < 3; d++) {
		snprintf(path, sizeof(path), "work/bulk/%d", d);
		assert_int_equal(mkdir(in_root(f, path), 0755), 0);
		for (int i = 1; i <= 1000; i++) {
			snprintf(path, sizeof(path), "work/bulk/%d/%d", d, i);
			snprintf(data, sizeof(data), "file %d of %d\n", i, d);
			write_file(in_root(f, path), data, 0644);
		}
	}
	dirty(&t.all, "/work/bulk", true), dirty(&t.all, "/work", false);
	dirty(&t.all, "/work/loop", true);
	/* and 3,000 more in a tree removed while the pre-copy reads it (first, by name): names
	 * that vanish between the pre-copy's readdir, stat and copy */
	assert_int_equal(mkdir(in_root(f, "work/a-gone"), 0755), 0);
	for (int d = 0; d < 3; d++) {
		snprintf(path, sizeof(path), "work/a-gone/%d", d);
		assert_int_equal(mkdir(in_root(f, path), 0755), 0);
		for (int i = 1; i <= 1000; i++) {
			snprintf(path, sizeof(path), "work/a-gone/%d/%d", d, i);
			write_file(in_root(f, path), "gone\n", 0644);
		}
	}
	dirty(&t.all, "/work/a-gone", true);
	snprintf(rm_path, sizeof(rm_path), "%s", in_root(f, "work/a-gone"));
	t.rm_path = rm_path;
	t.late[0] = (struct env_fs_dirty){.path = "/work/loop", .subtree = true};
	t.late[1] = (struct env_fs_dirty){.path = "/work", .subtree = false};
	t.late[2] = (struct env_fs_dirty){.path = "/work/a-gone", .subtree = true};

	assert_int_equal(env_checkpoint(f->env, &p, &m2), 0);
	print_message("pre-copy: %u calls; frozen FS phase %" PRIu64 " us for %" PRIu64
		      " files; loop %s at the pre-copy's start, %s frozen\n",
		      t.precopy_calls, m2.fs_us, m2.fs_files, t.at_start, t.at_freeze);
	assert_true(t.precopy_calls >= 1);
	assert_int_equal(t.late_calls, 1);
	assert_string_equal(m2.delta_path, "dirty-set");
	assert_true(m2.precopy_rounds >= 1);	/* the manifest says it was pre-copied */
	assert_int_equal(m1.precopy_rounds, 0); /* the first one was not */
	assert_false(m2.full_diff);
	/* the writer ran during the pre-copy: its file's pre-copied bytes are stale */
	assert_string_not_equal(t.at_start, t.at_freeze);
	e = entry_of(&m2, "work/loop");
	assert_non_null(e);
	assert_string_equal(e->src, m2.id);
	snprintf(path, sizeof(path), "%s/%s/data/%" PRIu64, ckpts, e->src, e->data_key);
	read_small(path, data, sizeof(data));
	assert_string_equal(data, t.at_freeze);
	/* the whole index is the frozen instant's */
	same_entries("pre-copy vs walk frozen", ckpts, t.walk_data, &m2, &t.walk, true);
	assert_non_null(entry_of(&m2, "work/bulk/2/1000"));
	assert_null(entry_of(&m2, "work/a-gone"));
	/* nothing stale left in its data: one file per copy it references */
	{
		size_t refs = 0, files = 0;
		DIR *d;
		struct dirent *de;

		for (size_t i = 0; i < m2.n_entries; i++)
			refs += m2.entries[i].kind == ENV_ENTRY_REG &&
				strcmp(m2.entries[i].src, m2.id) == 0;
		snprintf(path, sizeof(path), "%s/%s/data", ckpts, m2.id);
		d = opendir(path);
		assert_non_null(d);
		while ((de = readdir(d)))
			files += de->d_name[0] != '.';
		closedir(d);
		assert_int_equal(files, refs);
	}

	/* The restore rebuilds exactly m2's index; its writer runs again at once: frozen, the
	 * layer is m2's but for the loop's file, which holds the frozen count or a later one. */
	restore(f, m2.id);
	freeze(f, true);
	{
		struct env_manifest a = {0}, b = {0}, w = {0};
		char walk_data[PATH_MAX];

		walk_now(f, NULL, &w, walk_data);
		without(&m2, "work/loop", &a);
		without(&w, "work/loop", &b);
		same_entries("restored", ckpts, walk_data, &a, &b, false);
		env_manifest_finish(&a);
		env_manifest_finish(&b);
		env_manifest_finish(&w);
	}
	read_small(in_root(f, "work/loop"), data, sizeof(data));
	print_message("restored: loop %s (frozen %s)\n", data, t.at_freeze);
	assert_true(strtoull(data, NULL, 10) >= strtoull(t.at_freeze, NULL, 10));
	freeze(f, false);
	env_manifest_finish(&t.walk);
	env_manifest_finish(&m1);
	env_manifest_finish(&m2);
}

/*
 * Rounds: the tracer as a turn that keeps rewriting fewer and fewer files while they are
 * copied. Round k (k = 1, 2, 3) rewrites the first ROUND_N[k] files of bulk/0 with "r<k>" and
 * names them (what was dirtied since the previous round's set); round 3's 10 are too few for a
 * round of their own: the frozen phase copies them.
 */
static const unsigned round_n[] = {0, 300, 100, 10};

struct rounds_tracer {
	struct fake_tracer all;
	char paths[300][32];
	struct env_fs_dirty set[300];
	size_t n_set;
	unsigned calls, late_calls;
	struct envckpt_fx *f;
	const struct env_manifest *base;
	struct env_manifest walk;
	char walk_data[PATH_MAX];
};

static int rounds_precopy(void *userdata, unsigned round, const struct env_fs_dirty **ret,
			  size_t *ret_n, const char **ret_why)
{
	struct rounds_tracer *t = userdata;
	char path[PATH_MAX], data[16];

	(void)ret_why;
	t->calls++;
	if (round == 0) {
		*ret = t->all.items;
		*ret_n = t->all.n;
		return 0;
	}
	assert_true(round < ARRAY_SIZE(round_n));
	snprintf(data, sizeof(data), "r%u\n", round);
	t->n_set = 0;
	for (unsigned i = 1; i <= round_n[round]; i++) {
		snprintf(path, sizeof(path), "work/bulk/0/%u", i);
		write_file(in_root(t->f, path), data, 0644);
		snprintf(t->paths[t->n_set], sizeof(t->paths[0]), "/%s", path);
		t->set[t->n_set] =
			(struct env_fs_dirty){.path = t->paths[t->n_set], .subtree = true};
		t->n_set++;
	}
	*ret = t->set;
	*ret_n = t->n_set;
	return 0;
}

static void rounds_late(void *userdata, const struct env_fs_dirty **ret, size_t *ret_n)
{
	struct rounds_tracer *t = userdata;

	t->late_calls++;
	walk_now(t->f, t->base, &t->walk, t->walk_data);
	/* the last round's set, not copied, and nothing since */
	*ret = t->set;
	*ret_n = t->n_set;
}

/* Rounds while the re-dirtied set shrinks (300, 100, then 10: frozen): every file holds its
 * last bytes, the index equals a walk at the frozen instant, and the data directory holds one
 * file per copy the index references (the superseded ones removed). */
static void test_precopy_rounds(void **state)
{
	struct envckpt_fx *f = *state;
	struct env_manifest m1 = {0}, m2 = {0};
	struct rounds_tracer t = {.f = f};
	struct env_ckpt_params p = {.trajectory = "traj-fs",
				    .turn = 2,
				    .frozen = fake_frozen,
				    .precopy = rounds_precopy,
				    .late = rounds_late,
				    .userdata = &t};
	char path[PATH_MAX], ckpts[PATH_MAX], data[64];
	size_t refs = 0, files = 0;
	struct dirent *de;
	DIR *d;

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	envckpt_fx_prepare(f, "belayer-envckpt-fs");
	envckpt_fx_create(f, "rounds", env_cmd, 0);
	snprintf(ckpts, sizeof(ckpts), "%s/ckpt", f->env->dir);
	checkpoint(f, 1, &m1);
	t.base = &m1;
	assert_int_equal(mkdir(in_root(f, "work/bulk"), 0755), 0);
	for (int dd = 0; dd < 2; dd++) {
		snprintf(path, sizeof(path), "work/bulk/%d", dd);
		assert_int_equal(mkdir(in_root(f, path), 0755), 0);
		for (int i = 1; i <= 1000; i++) {
			snprintf(path, sizeof(path), "work/bulk/%d/%d", dd, i);
			write_file(in_root(f, path), "r0\n", 0644);
		}
	}
	dirty(&t.all, "/work/bulk", true), dirty(&t.all, "/work", false);

	assert_int_equal(env_checkpoint(f->env, &p, &m2), 0);
	assert_int_equal(t.calls, 4); /* rounds 0-2 copied, round 3's set left to the freeze */
	assert_int_equal(t.late_calls, 1);
	assert_string_equal(m2.delta_path, "dirty-set");
	/* the manifest (read back from disk) says it was pre-copied: 3 rounds copied 2,000 + 300
	 * + 100 files of 3 bytes running, the last 10 were copied frozen */
	assert_int_equal(m2.precopy_rounds, 3);
	assert_int_equal(m2.precopy_bytes, (2000 + 300 + 100) * 3);
	assert_int_equal(m2.precopy_frozen_bytes, 10 * 3);
	assert_int_equal(m2.fs_bytes, m2.precopy_bytes + m2.precopy_frozen_bytes);
	same_entries("rounds vs walk frozen", ckpts, t.walk_data, &m2, &t.walk, true);
	for (unsigned i = 1; i <= 1000; i += 1) {
		const struct env_entry *e;

		snprintf(path, sizeof(path), "work/bulk/0/%u", i);
		e = entry_of(&m2, path);
		assert_non_null(e);
		snprintf(path, sizeof(path), "%s/%s/data/%" PRIu64, ckpts, e->src, e->data_key);
		read_small(path, data, sizeof(data));
		assert_string_equal(data, i <= 10    ? "r3\n"
					  : i <= 100 ? "r2\n"
					  : i <= 300 ? "r1\n"
						     : "r0\n");
	}
	for (size_t i = 0; i < m2.n_entries; i++)
		refs += m2.entries[i].kind == ENV_ENTRY_REG &&
			strcmp(m2.entries[i].src, m2.id) == 0;
	snprintf(path, sizeof(path), "%s/%s/data", ckpts, m2.id);
	d = opendir(path);
	assert_non_null(d);
	while ((de = readdir(d)))
		files += de->d_name[0] != '.';
	closedir(d);
	assert_int_equal(files, refs);
	print_message("rounds: %" PRIu64 " copies for %zu files, frozen FS phase %" PRIu64 " us\n",
		      m2.fs_files, refs, m2.fs_us);
	env_manifest_finish(&t.walk);
	env_manifest_finish(&m1);
	env_manifest_finish(&m2);
}

struct cancel_tracer {
	struct fake_tracer all;
	atomic_bool cancel;
	unsigned precopy_calls, thawed_calls, partial_at_thawed;
	const char *dir;
};

static int cancel_precopy(void *userdata, unsigned round, const struct env_fs_dirty **ret,
			  size_t *ret_n, const char **ret_why)
{
	struct cancel_tracer *t = userdata;

	(void)round, (void)ret_why;
	t->precopy_calls++;
	/* the bubble ends as the pre-copy starts */
	atomic_store(&t->cancel, true);
	*ret = t->all.items;
	*ret_n = t->all.n;
	return 0;
}

static void cancel_late(void *userdata, const struct env_fs_dirty **ret, size_t *ret_n)
{
	(void)userdata, (void)ret;
	*ret_n = 0;
	fail_msg("a cancelled pre-copy froze");
}

/* The call tells its caller that the environment runs (a step-begin held on it may go) before
 * it removes what it copied: the partial checkpoint is still there. */
static void cancel_thawed(void *userdata)
{
	struct cancel_tracer *t = userdata;
	char path[PATH_MAX];
	struct dirent *de;
	DIR *d;

	t->thawed_calls++;
	snprintf(path, sizeof(path), "%s/ckpt", t->dir);
	d = opendir(path);
	assert_non_null(d);
	while ((de = readdir(d)))
		t->partial_at_thawed += strncmp(de->d_name, ".tmp-", 5) == 0;
	closedir(d);
}

/* A checkpoint cancelled during its pre-copy (the policy's bubble ended): -ECANCELED, never
 * frozen, "thawed" reported once before the cleanup, nothing left of it (no .tmp-*, the head
 * unchanged), and the next one commits. */
static void test_precopy_cancel(void **state)
{
	struct envckpt_fx *f = *state;
	struct env_manifest m1 = {0}, m2 = {0}, m3 = {0};
	struct cancel_tracer t = {0};
	struct env_ckpt_params p = {.trajectory = "traj-fs",
				    .turn = 2,
				    .frozen = fake_frozen,
				    .precopy = cancel_precopy,
				    .late = cancel_late,
				    .thawed = cancel_thawed,
				    .cancel = &t.cancel,
				    .userdata = &t};
	char path[PATH_MAX], head[ENV_ID_MAX + 1];
	struct dirent *de;
	DIR *d;

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	envckpt_fx_prepare(f, "belayer-envckpt-fs");
	envckpt_fx_create(f, "precancel", env_cmd, 0);
	checkpoint(f, 1, &m1);
	assert_int_equal(mkdir(in_root(f, "work/bulk"), 0755), 0);
	for (int i = 0; i < 500; i++) {
		snprintf(path, sizeof(path), "work/bulk/%d", i);
		write_file(in_root(f, path), "x\n", 0644);
	}
	dirty(&t.all, "/work/bulk", true), dirty(&t.all, "/work", false);
	snprintf(head, sizeof(head), "%s", f->env->head);
	t.dir = f->env->dir;
	/* fake_frozen's userdata is the fake_tracer at t's start */
	assert_int_equal(env_checkpoint(f->env, &p, &m2), -ECANCELED);
	assert_int_equal(t.precopy_calls, 1);
	assert_int_equal(t.all.calls, 0);
	assert_int_equal(t.thawed_calls, 1);
	assert_int_equal(t.partial_at_thawed, 1);
	assert_string_equal(f->env->head, head);
	snprintf(path, sizeof(path), "%s/ckpt", f->env->dir);
	d = opendir(path);
	assert_non_null(d);
	while ((de = readdir(d)))
		assert_false(strncmp(de->d_name, ".tmp-", 5) == 0);
	closedir(d);
	checkpoint(f, 3, &m3);
	assert_non_null(entry_of(&m3, "work/bulk/499"));
	env_manifest_finish(&m1);
	env_manifest_finish(&m3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_xattrs, envckpt_fx_setup, envckpt_fx_teardown),
		cmocka_unit_test_setup_teardown(test_sparse, envckpt_fx_setup, envckpt_fx_teardown),
		cmocka_unit_test_setup_teardown(test_stale_socket, envckpt_fx_setup,
						envckpt_fx_teardown),
		cmocka_unit_test_setup_teardown(test_dirty_kinds, envckpt_fx_setup,
						envckpt_fx_teardown),
		cmocka_unit_test_setup_teardown(test_dirty_walks, envckpt_fx_setup,
						envckpt_fx_teardown),
		cmocka_unit_test_setup_teardown(test_precopy_rewritten, envckpt_fx_setup,
						envckpt_fx_teardown),
		cmocka_unit_test_setup_teardown(test_precopy_cancel, envckpt_fx_setup,
						envckpt_fx_teardown),
		cmocka_unit_test_setup_teardown(test_precopy_rounds, envckpt_fx_setup,
						envckpt_fx_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
