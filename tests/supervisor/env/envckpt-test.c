/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "envckpt-fixture.h"
#include "envckpt-test.h"
#include "supervisor-criu.h"
#include "test-util.h"

#define READY_MS 10000

int envckpt_fx_setup(void **state)
{
	struct envckpt_fx *f = calloc(1, sizeof(*f));

	*state = f;
	return f ? 0 : -1;
}

/* Removes dir and the cgroups right below it (the environments' v1 mirrors: those a test made
 * besides f->env, and ones whose processes had not left yet when it destroyed them). */
static void rmdir_tree1(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char path[PATH_MAX];

	while (d && (de = readdir(d)))
		if (de->d_type == DT_DIR && de->d_name[0] != '.') {
			snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
			(void)rmdir(path);
		}
	if (d)
		closedir(d);
	(void)rmdir(dir);
}

int envckpt_fx_teardown(void **state)
{
	struct envckpt_fx *f = *state;
	char v1[PATH_MAX] = "";

	/* the device rules' v1 mirror of cgparent, which env_destroy leaves (others may share
	 * it in a supervisor) */
	if (f->env && env_limits_v1_dir(f->env, "devices", v1, sizeof(v1)) >= 0)
		*strrchr(v1, '/') = '\0';
	if (f->env)
		env_destroy(f->env);
	if (f->cgparent[0])
		(void)rmdir(f->cgparent);
	if (v1[0])
		rmdir_tree1(v1);
	if (f->dir && !getenv("ENVCKPT_KEEP"))
		(void)test_rmtree(f->dir);
	free(f->dir);
	free(f);
	return 0;
}

void envckpt_fx_prepare(struct envckpt_fx *f, const char *prefix)
{
	f->dir = test_mkdtemp(prefix);
	assert_non_null(f->dir);
	snprintf(f->base, sizeof(f->base), "%s/base", f->dir);
	snprintf(f->state, sizeof(f->state), "%s/state", f->dir);
	snprintf(f->cgparent, sizeof(f->cgparent), FIXTURE_CGROUP_V2 "/belayer-test-%d",
		 (int)getpid());
	assert_int_equal(fixture_make_base(f->base, ENVCKPT_SERVER), 0);
	/* before the test starts any thread: it sets CRIU_CONFIG_FILE */
	assert_int_equal(sv_criu_config_init(f->state), 0);
}

void envckpt_fx_create(struct envckpt_fx *f, const char *id, const char *cmd, unsigned keep)
{
	struct env_params p = {.id = id,
			       .base = f->base,
			       .cmd = cmd,
			       .state_dir = f->state,
			       .cgroup_parent = f->cgparent,
			       .criu = sv_criu_binary(NULL),
			       .keep = keep};
	char ready[PATH_MAX];

	assert_int_equal(env_create(&p, &f->env), 0);
	snprintf(f->sock, sizeof(f->sock), "%s/work/server.sock", f->env->root);
	snprintf(ready, sizeof(ready), "%s/work/ready", f->env->root);
	assert_int_equal(fixture_wait_file(ready, READY_MS), 0);
}
