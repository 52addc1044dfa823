/* SPDX-License-Identifier: MIT */
/*
 * bench_path_join() and bench_cgroup_file() (issue 16 item 8): the policy bench's failure timer
 * built "<cgroup>/cgroup.kill" from an environment's cgroup that was empty when the
 * environment was never created, which is "/cgroup.kill" at the host's root, and its actions'
 * shell wrote "/cgroup.procs" there. Every such path now comes from these, which refuse an
 * empty, relative or root component and a directory that is not a cgroup v2 one.
 */
#include <errno.h>
#include <linux/magic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/statfs.h>

#include <cmocka.h>

#include "bench-path.h"

static void join_refuses_empty_and_root(void **state)
{
	char buf[64];

	(void)state;
	assert_int_equal(bench_path_join(buf, sizeof(buf), "", "cgroup.kill"), -EINVAL);
	assert_int_equal(bench_path_join(buf, sizeof(buf), NULL, "cgroup.kill"), -EINVAL);
	assert_int_equal(bench_path_join(buf, sizeof(buf), "/", "cgroup.kill"), -EINVAL);
	assert_int_equal(bench_path_join(buf, sizeof(buf), "relative/dir", "x"), -EINVAL);
	assert_int_equal(bench_path_join(buf, sizeof(buf), "/a", ""), -EINVAL);
	assert_int_equal(bench_path_join(buf, 8, "/a/long/dir", "x"), -ENAMETOOLONG);
	assert_int_equal(bench_path_join(buf, sizeof(buf), "/a/b", "c"), 0);
	assert_string_equal(buf, "/a/b/c");
}

static void cgroup_file_wants_a_cgroup(void **state)
{
	static const char *const roots[] = {"/sys/fs/cgroup/unified", "/sys/fs/cgroup"};
	char buf[256];

	(void)state;
	assert_int_equal(bench_cgroup_file(buf, sizeof(buf), "", "cgroup.kill"), -EINVAL);
	/* a directory, but no cgroup */
	assert_int_equal(bench_cgroup_file(buf, sizeof(buf), "/tmp", "cgroup.kill"), -ENOTDIR);
	assert_int_equal(bench_cgroup_file(buf, sizeof(buf), "/nonexistent-belayer", "x"), -ENOENT);
	for (size_t i = 0; i < sizeof(roots) / sizeof(roots[0]); i++) {
		struct statfs sf;

		if (statfs(roots[i], &sf) == 0 && sf.f_type == CGROUP2_SUPER_MAGIC) {
			assert_int_equal(
				bench_cgroup_file(buf, sizeof(buf), roots[i], "cgroup.procs"), 0);
			assert_true(strncmp(buf, roots[i], strlen(roots[i])) == 0);
			return;
		}
	}
	skip(); /* no cgroup v2 mounted: the positive case cannot be shown */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(join_refuses_empty_and_root),
		cmocka_unit_test(cgroup_file_wants_a_cgroup),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
