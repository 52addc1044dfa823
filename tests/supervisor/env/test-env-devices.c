/* SPDX-License-Identifier: MIT */
/*
 * Each half of an environment's device allow-list alone (supervisor-env-devices.h): the cgroup
 * v2 program (bpf/envdev.bpf.c) on one of two sibling v2 cgroups, and the v1 devices
 * controller's rules on a v1 cgroup; a child moved into each opens and makes device nodes the
 * test made in a directory of its own. The program's child is in the v1 root and the v1 rules'
 * child in the test's v2 cgroup, so each time one mechanism alone refuses; the v2 sibling
 * without the program is the control that shows the same nodes open and made there. Suite
 * sandbox runs both together, from inside an environment.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "supervisor-env-devices.h"
#include "supervisor-env.h"
#include "test-util.h"

static char dir[PATH_MAX], top[PATH_MAX], plain[PATH_MAX], listed[PATH_MAX], v1[PATH_MAX];

/* The cgroup v2 mount: hybrid hosts' /sys/fs/cgroup/unified, else /sys/fs/cgroup. */
static const char *v2_mount(void)
{
	static const char *const where[] = {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"};
	struct statfs sf;

	for (size_t i = 0; i < sizeof(where) / sizeof(where[0]); i++)
		if (statfs(where[i], &sf) == 0 && sf.f_type == CGROUP2_SUPER_MAGIC)
			return where[i];
	return NULL;
}

/* The v1 devices hierarchy's mount point, from our mount table ("" when there is none). */
static void v1_devices_mount(char *ret, size_t cap)
{
	char line[4096], mp[PATH_MAX];
	FILE *f = fopen("/proc/self/mountinfo", "re");

	ret[0] = 0;
	while (f && !ret[0] && fgets(line, sizeof(line), f)) {
		char *dash = strstr(line, " - ");

		if (dash && strncmp(dash + 3, "cgroup ", 7) == 0 && strstr(dash, "devices") &&
		    sscanf(line, "%*s %*s %*s %*s %4095s", mp) == 1)
			snprintf(ret, cap, "%s", mp);
	}
	if (f)
		fclose(f);
}

/* A block device this machine has (its first in /sys/dev/block), 0 if none. */
static dev_t some_block_device(void)
{
	DIR *d = opendir("/sys/dev/block");
	struct dirent *de;
	unsigned maj, min;
	dev_t found = 0;

	while (d && !found && (de = readdir(d)))
		if (sscanf(de->d_name, "%u:%u", &maj, &min) == 2)
			found = makedev(maj, min);
	if (d)
		closedir(d);
	return found;
}

/* In a child moved into cgroup: opens path (flags; O_CREAT: mknod it as a character device
 * 1:minor instead). 0 or the errno, -1 when the child could not get there. */
static int try_in(const char *cgroup, const char *path, int flags, unsigned minor)
{
	char procs[PATH_MAX];
	int st;
	pid_t pid;

	snprintf(procs, sizeof(procs), "%s/cgroup.procs", cgroup);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int fd;

		if (env_write_file(procs, "0") < 0)
			_exit(255);
		if (flags & O_CREAT) {
			(void)unlink(path);
			_exit(mknod(path, S_IFCHR | 0600, makedev(1, minor)) < 0 ? errno : 0);
		}
		fd = open(path, flags | O_CLOEXEC | O_NOCTTY);
		_exit(fd < 0 ? errno : 0);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st) == 255 ? -1 : WEXITSTATUS(st);
}

static int setup(void **state)
{
	const char *v2 = v2_mount();

	(void)state;
	if (!test_is_root() || !v2)
		return 0;
	snprintf(top, sizeof(top), "%s/belayer-test-devices-%d", v2, (int)getpid());
	snprintf(plain, sizeof(plain), "%s/plain", top);
	snprintf(listed, sizeof(listed), "%s/listed", top);
	assert_int_equal(mkdir(top, 0755), 0);
	assert_int_equal(mkdir(plain, 0755), 0);
	assert_int_equal(mkdir(listed, 0755), 0);
	snprintf(dir, sizeof(dir), "%s", test_mkdtemp("belayer-devices"));
	v1_devices_mount(v1, sizeof(v1));
	if (v1[0]) {
		snprintf(v1 + strlen(v1), sizeof(v1) - strlen(v1), "/belayer-test-devices-%d",
			 (int)getpid());
		assert_int_equal(mkdir(v1, 0755), 0);
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (listed[0]) {
		(void)rmdir(listed);
		(void)rmdir(plain);
		(void)rmdir(top);
	}
	if (v1[0])
		(void)rmdir(v1);
	if (dir[0])
		(void)test_rmtree(dir);
	return 0;
}

static void node(const char *name, mode_t type, dev_t dev, char *ret)
{
	snprintf(ret, PATH_MAX, "%s/%s", dir, name);
	assert_int_equal(mknod(ret, type | 0600, dev), 0);
}

static void program_alone(void **state)
{
	char kmsg[PATH_MAX], null[PATH_MAX], tty[PATH_MAX], blk[PATH_MAX], made[PATH_MAX];
	dev_t b = some_block_device();

	(void)state;
	TEST_REQUIRE(test_is_root(), "needs root (cgroups, BPF, mknod)");
	TEST_REQUIRE(listed[0], "needs a cgroup v2 hierarchy");
	TEST_REQUIRE(b != 0, "needs a block device to make a node of");
	node("kmsg", S_IFCHR, makedev(1, 11), kmsg);
	node("null", S_IFCHR, makedev(1, 3), null);
	node("tty", S_IFCHR, makedev(5, 0), tty);
	node("blk", S_IFBLK, b, blk);
	snprintf(made, sizeof(made), "%s/made", dir);

	assert_int_equal(env_devices_attach(listed), 0);
	assert_int_equal(env_devices_attached(listed), 1);
	assert_int_equal(env_devices_attached(plain), 0);

	/* The control: without the program, root opens and makes them all. */
	assert_int_equal(try_in(plain, kmsg, O_WRONLY, 0), 0);
	assert_int_equal(try_in(plain, blk, O_RDONLY, 0), 0);
	assert_int_equal(try_in(plain, made, O_CREAT, 11), 0);

	/* With it: what is listed opens, the rest is refused, open and mknod alike. */
	assert_int_equal(try_in(listed, null, O_RDWR, 0), 0);
	assert_int_equal(try_in(listed, kmsg, O_WRONLY, 0), EPERM);
	assert_int_equal(try_in(listed, blk, O_RDONLY, 0), EPERM);
	assert_int_equal(try_in(listed, made, O_CREAT, 11), EPERM);
	/* mknod only of the nodes Belayer's own /dev holds (bpf/envdev.h) */
	assert_int_equal(try_in(listed, made, O_CREAT, 3), 0);
	/* /dev/tty's node is allowed: its open fails for want of a terminal, not EPERM */
	assert_int_not_equal(try_in(listed, tty, O_RDWR, 0), EPERM);
}

static void v1_rules_alone(void **state)
{
	char kmsg[PATH_MAX], null[PATH_MAX], blk[PATH_MAX], made[PATH_MAX];
	dev_t b = some_block_device();

	(void)state;
	TEST_REQUIRE(test_is_root(), "needs root (cgroups, mknod)");
	TEST_REQUIRE(v1[0], "needs a v1 devices hierarchy (hybrid hosts)");
	TEST_REQUIRE(b != 0, "needs a block device to make a node of");
	node("kmsg1", S_IFCHR, makedev(1, 11), kmsg);
	node("null1", S_IFCHR, makedev(1, 3), null);
	node("blk1", S_IFBLK, b, blk);
	snprintf(made, sizeof(made), "%s/made1", dir);

	/* the control, in the same v1 cgroup before its rules */
	assert_int_equal(try_in(v1, kmsg, O_WRONLY, 0), 0);
	assert_int_equal(env_devices_v1_apply(v1), 0);
	assert_int_equal(try_in(v1, null, O_RDWR, 0), 0);
	assert_int_equal(try_in(v1, kmsg, O_WRONLY, 0), EPERM);
	assert_int_equal(try_in(v1, blk, O_RDONLY, 0), EPERM);
	assert_int_equal(try_in(v1, made, O_CREAT, 11), EPERM);
	assert_int_equal(try_in(v1, made, O_CREAT, 3), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(program_alone),
		cmocka_unit_test(v1_rules_alone),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
