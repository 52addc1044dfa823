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
#include <sys/xattr.h>
#include <unistd.h>

#include "envckpt-fixture.h"
#include "envckpt-test.h"
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_xattrs, envckpt_fx_setup, envckpt_fx_teardown),
		cmocka_unit_test_setup_teardown(test_sparse, envckpt_fx_setup, envckpt_fx_teardown),
		cmocka_unit_test_setup_teardown(test_stale_socket, envckpt_fx_setup,
						envckpt_fx_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
