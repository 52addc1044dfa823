/* SPDX-License-Identifier: MIT */
/*
 * The memory pre-dump's decision and CRIU arguments (issue 23 item 3). Its real path cannot
 * run on this kernel (no CONFIG_MEM_SOFT_DIRTY: CRIU 4.2.1 refuses --track-mem with "Tracking
 * memory is not available"), so libcriu's dump calls are wrapped at the link
 * (-Wl,--wrap: CONVENTIONS, "only where the real thing cannot run"): the wrappers record
 * what sv_criu_dump and sv_criu_pre_dump asked of CRIU (the setters still run for real) and
 * the dump itself is not run. What is asked is what CRIU's documentation names: a pre-dump
 * (criu pre-dump) with --track-mem, then a dump with --track-mem and --prev-images-dir, a path
 * relative to the images directory (criu.org, "Directories" and "Iterative migration").
 */
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <criu/criu.h>

#include "supervisor-criu.h"
#include "supervisor-env-activity.h"
#include "supervisor-env.h"
#include "test-util.h"

struct asked {
	unsigned dumps, pre_dumps;
	bool track_mem, leave_running;
	int pid;
	char parent[64], log[64];
};

static struct asked now, at_call;

void __real_criu_local_set_track_mem(criu_opts *o, bool track);
int __real_criu_local_set_parent_images(criu_opts *o, const char *path);
int __real_criu_local_set_log_file(criu_opts *o, const char *name);
void __real_criu_local_set_pid(criu_opts *o, int pid);
void __real_criu_local_set_leave_running(criu_opts *o, bool leave);
void __wrap_criu_local_set_track_mem(criu_opts *o, bool track);
int __wrap_criu_local_set_parent_images(criu_opts *o, const char *path);
int __wrap_criu_local_set_log_file(criu_opts *o, const char *name);
void __wrap_criu_local_set_pid(criu_opts *o, int pid);
void __wrap_criu_local_set_leave_running(criu_opts *o, bool leave);
int __wrap_criu_local_dump(criu_opts *o);
int __wrap_criu_local_pre_dump(criu_opts *o);

void __wrap_criu_local_set_track_mem(criu_opts *o, bool track)
{
	now.track_mem = track;
	__real_criu_local_set_track_mem(o, track);
}

int __wrap_criu_local_set_parent_images(criu_opts *o, const char *path)
{
	snprintf(now.parent, sizeof(now.parent), "%s", path);
	return __real_criu_local_set_parent_images(o, path);
}

int __wrap_criu_local_set_log_file(criu_opts *o, const char *name)
{
	snprintf(now.log, sizeof(now.log), "%s", name);
	return __real_criu_local_set_log_file(o, name);
}

void __wrap_criu_local_set_pid(criu_opts *o, int pid)
{
	now.pid = pid;
	__real_criu_local_set_pid(o, pid);
}

void __wrap_criu_local_set_leave_running(criu_opts *o, bool leave)
{
	now.leave_running = leave;
	__real_criu_local_set_leave_running(o, leave);
}

int __wrap_criu_local_dump(criu_opts *o)
{
	(void)o;
	now.dumps++;
	at_call = now;
	return 0;
}

int __wrap_criu_local_pre_dump(criu_opts *o)
{
	(void)o;
	now.pre_dumps++;
	at_call = now;
	return 0;
}

static int images(void)
{
	int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* never written: no dump runs */

	assert_true(fd >= 0);
	return fd;
}

/* Pre-dump only where the kernel tracks soft-dirty pages and the processes ran. */
static void test_plan(void **state)
{
	(void)state;
	assert_int_equal(env_mem_plan(false, false), ENV_MEM_FULL);
	assert_int_equal(env_mem_plan(false, true), ENV_MEM_FULL);
	assert_int_equal(env_mem_plan(true, true), ENV_MEM_FULL);
	assert_int_equal(env_mem_plan(true, false), ENV_MEM_PRE_DUMP);
	/* the mode reported (start, env list, metric) is the kernel's capability */
	assert_string_equal(env_mem_mode(), env_mem_dirty_track() ? "pre-dump" : "full");
}

/* A full dump (this kernel's only one): no memory tracking, no parent. */
static void test_full_dump(void **state)
{
	int fd = images();

	(void)state;
	now = at_call = (struct asked){0};
	assert_int_equal(sv_criu_dump("/bin/true", 4242, NULL, fd, true, 0, 0, false, NULL, NULL),
			 0);
	assert_int_equal(at_call.dumps, 1);
	assert_int_equal(at_call.pre_dumps, 0);
	assert_false(at_call.track_mem);
	assert_string_equal(at_call.parent, "");
	assert_int_equal(at_call.pid, 4242);
	assert_true(at_call.leave_running);
	assert_string_equal(at_call.log, "dump.log");
	close(fd);
}

/* The pre-dump: --track-mem, the tree left running, its own log, no parent. */
static void test_pre_dump(void **state)
{
	int fd = images();

	(void)state;
	now = at_call = (struct asked){0};
	assert_int_equal(sv_criu_pre_dump("/bin/true", 4242, NULL, fd, 0, false, NULL), 0);
	assert_int_equal(at_call.pre_dumps, 1);
	assert_int_equal(at_call.dumps, 0);
	assert_true(at_call.track_mem);
	assert_true(at_call.leave_running);
	assert_string_equal(at_call.parent, "");
	assert_string_equal(at_call.log, "pre-dump.log");
	close(fd);
}

/* The dump after it: --track-mem and --prev-images-dir, relative to the images. */
static void test_dump_after_pre_dump(void **state)
{
	int fd = images();

	(void)state;
	now = at_call = (struct asked){0};
	assert_int_equal(sv_criu_dump("/bin/true", 4242, NULL, fd, true, 0, 0, false, NULL, "pre"),
			 0);
	assert_int_equal(at_call.dumps, 1);
	assert_true(at_call.track_mem);
	assert_string_equal(at_call.parent, "pre");
	assert_string_equal(at_call.log, "dump.log");
	close(fd);
}

static ino_t ino_of(const char *dir, const char *name)
{
	char path[PATH_MAX];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	assert_int_equal(lstat(path, &st), 0);
	return st.st_ino;
}

/* A checkpoint's images reused (an fs-only checkpoint, a fork's first): the dump's files, its
 * pre-dump's folder and the "parent" symlink to it come along, so the copy restores alone;
 * logs stay behind. */
static void test_link_images_with_pre_dump(void **state)
{
	char *tmp = test_mkdtemp("belayer-criu-predump"), src[PATH_MAX], dst[PATH_MAX],
	     pre[PATH_MAX], target[64], link[PATH_MAX];
	int sfd, dfd;
	ssize_t n;

	(void)state;
	assert_non_null(tmp);
	snprintf(src, sizeof(src), "%s/src", tmp);
	snprintf(dst, sizeof(dst), "%s/dst", tmp);
	snprintf(pre, sizeof(pre), "%s/src/" ENV_CRIU_PRE_DIR, tmp);
	assert_int_equal(mkdir(src, 0700), 0);
	assert_int_equal(mkdir(dst, 0700), 0);
	assert_int_equal(mkdir(pre, 0700), 0);
	test_put_file(src, "pages-1.img", "pages");
	test_put_file(src, "dump.log", "log");
	test_put_file(pre, "pages-1.img", "pre pages");
	test_put_file(pre, "pre-dump.log", "log");
	snprintf(link, sizeof(link), "%s/parent", src);
	assert_int_equal(symlink(ENV_CRIU_PRE_DIR, link), 0);
	sfd = open(src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	dfd = open(dst, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_int_equal(env_link_images(sfd, dfd), 0);
	assert_true(ino_of(dst, "pages-1.img") == ino_of(src, "pages-1.img"));
	assert_true(ino_of(dst, ENV_CRIU_PRE_DIR "/pages-1.img") ==
		    ino_of(src, ENV_CRIU_PRE_DIR "/pages-1.img"));
	n = readlinkat(dfd, "parent", target, sizeof(target) - 1);
	assert_true(n > 0);
	target[n] = '\0';
	assert_string_equal(target, ENV_CRIU_PRE_DIR);
	assert_int_equal(faccessat(dfd, "dump.log", F_OK, 0), -1);
	assert_int_equal(faccessat(dfd, ENV_CRIU_PRE_DIR "/pre-dump.log", F_OK, 0), -1);
	close(sfd);
	close(dfd);
	assert_int_equal(test_rmtree(tmp), 0);
	free(tmp);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plan),
		cmocka_unit_test(test_full_dump),
		cmocka_unit_test(test_pre_dump),
		cmocka_unit_test(test_dump_after_pre_dump),
		cmocka_unit_test(test_link_images_with_pre_dump),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
