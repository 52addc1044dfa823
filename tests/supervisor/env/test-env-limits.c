/* SPDX-License-Identifier: MIT */
/*
 * The cgroup v2 path of an environment's limits (supervisor-env-limits.h), on a tree that looks
 * like a pure v2 host's: the build machines are hybrid (their v2 hierarchy has no
 * controllers), so the real-cgroup tests (suite sandbox) exercise v1 there. Plain files stand
 * in for the interface files: the test reads back what would reach the kernel.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "supervisor-env.h"
#include "test-util.h"

static char *get(const char *dir, const char *name)
{
	static char buf[128];
	char path[PATH_MAX];
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "re");
	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return buf;
}

/* A parent with pids, memory and cpu in its cgroup.controllers, the environment's cgroup below
 * with the files the controllers give it. */
static void v2_tree(struct sv_env *e, char *parent, size_t cap)
{
	static const char *const files[] = {"pids.max", "memory.max", "memory.swap.max", "cpu.max",
					    "cgroup.procs"};
	char *dir = test_mkdtemp("belayer-limits");

	assert_non_null(dir);
	snprintf(parent, cap, "%s/envs", dir);
	assert_int_equal(mkdir(parent, 0755), 0);
	test_put_file(parent, "cgroup.controllers", "cpuset cpu io memory pids\n");
	test_put_file(parent, "cgroup.subtree_control", "");
	snprintf(e->id, sizeof(e->id), "e1");
	snprintf(e->cgroup, sizeof(e->cgroup), "%s/e1", parent);
	assert_int_equal(mkdir(e->cgroup, 0755), 0);
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
		test_put_file(e->cgroup, files[i], "");
	free(dir);
}

static void v2_limits_written(void **state)
{
	struct sv_env e = {.limits = {.pids = 200, .memory = 128 << 20, .cpu_millis = 1500}};
	char parent[PATH_MAX];

	(void)state;
	v2_tree(&e, parent, sizeof(parent));
	for (int k = 0; k < _ENV_LIMIT_MAX; k++)
		assert_string_equal(env_limits_where(&e, k), "v2");
	assert_int_equal(env_limits_setup(&e), 0);
	assert_string_equal(get(e.cgroup, "pids.max"), "200");
	assert_string_equal(get(e.cgroup, "memory.max"), "134217728");
	assert_string_equal(get(e.cgroup, "memory.swap.max"), "0");
	assert_string_equal(get(e.cgroup, "cpu.max"), "150000 100000");
	/* each controller handed down by the parent: "+pids", "+memory", "+cpu" written in turn
	 * at the start of a plain file (the kernel's takes each write whole) */
	assert_string_equal(get(parent, "cgroup.subtree_control"), "+cpuory");
	/* v2: clone3 placed the init; nothing to join */
	assert_int_equal(env_limits_join(&e, 1), 0);
	assert_string_equal(get(e.cgroup, "cgroup.procs"), "");
}

static void v2_no_limit_is_max(void **state)
{
	struct sv_env e = {0};
	char parent[PATH_MAX];

	(void)state;
	v2_tree(&e, parent, sizeof(parent));
	assert_int_equal(env_limits_setup(&e), 0);
	assert_string_equal(get(e.cgroup, "pids.max"), "max");
	assert_string_equal(get(e.cgroup, "memory.max"), "max");
	assert_string_equal(get(e.cgroup, "memory.swap.max"), "max");
	assert_string_equal(get(e.cgroup, "cpu.max"), "max 100000");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(v2_limits_written),
		cmocka_unit_test(v2_no_limit_is_max),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
