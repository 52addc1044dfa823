/* SPDX-License-Identifier: MIT */
/*
 * Forks (issue 20 item 4), on real environments with real CRIU (>= 4.2): K environments from
 * one checkpoint of a source whose servers (TCP on a fixed port, a unix socket) hold state in
 * memory and whose limits put it in v1 cgroups of its own on a hybrid host.
 *
 * - Every fork serves the checkpoint's state on the same port, each in its own network
 *   namespace; its processes are in its own cgroups (v2 and every v1 one of its limits), not
 *   the source's; the source runs on untouched.
 * - The forks' file systems are copies: a file written in one is in neither the source nor
 *   another fork; the source's later changes are in no fork.
 * - A fork's first checkpoint names its source ("from"); a fork checkpoints, restores and
 *   forks on its own, and keeps working once the source is destroyed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "envckpt-fixture.h"
#include "envckpt-test.h"
#include "supervisor-criu.h"
#include "supervisor-env.h"
#include "test-util.h"
#include "util.h"

#define WAIT_MS 10000
#define FORKS	3

static const char script[] = "cd /work; /work/server %s & /work/server /work/server.sock & "
			     "touch /work/ready; exec sleep infinity";

struct fork_fx {
	struct envckpt_fx f;
	struct sv_env *forks[FORKS + 1];
	struct env_params p;
	char port[16];
};

static int setup(void **state)
{
	struct fork_fx *x = calloc(1, sizeof(*x));

	*state = x;
	return x ? 0 : -1;
}

static int teardown(void **state)
{
	struct fork_fx *x = *state;

	for (size_t i = 0; i < ARRAY_SIZE(x->forks); i++)
		env_destroy(x->forks[i]);
	env_destroy(x->f.env);
	if (x->f.cgparent[0])
		(void)rmdir(x->f.cgparent);
	if (x->f.dir && !getenv("ENVCKPT_KEEP"))
		(void)test_rmtree(x->f.dir);
	free(x->f.dir);
	free(x);
	return 0;
}

static void start(struct fork_fx *x)
{
	char cmd[512], ans[256], ready[PATH_MAX];
	uint16_t port;

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	envckpt_fx_prepare(&x->f, "belayer-envfork");
	assert_int_equal(fixture_free_port(&port), 0);
	snprintf(x->port, sizeof(x->port), "%u", (unsigned)port);
	snprintf(cmd, sizeof(cmd), script, x->port);
	/* limits: on this hybrid host they are v1 cgroups the forks must not share */
	x->p = (struct env_params){.id = "src",
				   .base = x->f.base,
				   .cmd = cmd,
				   .state_dir = x->f.state,
				   .cgroup_parent = x->f.cgparent,
				   .criu = sv_criu_binary(NULL),
				   .limits = {.pids = 256, .memory = 512u << 20}};
	assert_int_equal(env_create(&x->p, &x->f.env), 0);
	snprintf(ready, sizeof(ready), "%s/work/ready", x->f.env->root);
	assert_int_equal(fixture_wait_file(ready, WAIT_MS), 0);
	snprintf(x->f.sock, sizeof(x->f.sock), "%s/work/server.sock", x->f.env->root);
	assert_int_equal(fixture_ask_in(x->f.env->cgroup, x->port, "set forked-state", ans,
					sizeof(ans), WAIT_MS),
			 0);
}

static void checkpoint(struct sv_env *e, char *ret_id, size_t cap)
{
	struct env_ckpt_params p = {.turn = 7, .prefix_tokens = 70, .prefix_hash = 0x77};
	struct env_manifest m;

	assert_int_equal(env_checkpoint(e, &p, &m), 0);
	snprintf(ret_id, cap, "%s", m.id);
	env_manifest_finish(&m);
}

static struct sv_env *fork_one(struct fork_fx *x, struct sv_env *src, const char *ckpt,
			       const char *id, struct env_manifest *ret_m)
{
	struct env_params p = x->p;
	struct sv_env *e = NULL;
	int r;

	p.id = id;
	r = env_fork(src, ckpt, &p, &e, ret_m, NULL, 0);
	if (r < 0)
		fprintf(stderr, "env_fork %s -> %s: %s\n", src->id, id, strerror(-r));
	assert_int_equal(r, 0);
	return e;
}

/* What the server of e answers to req, "" when it does not. */
static void ask(const struct sv_env *e, const char *port, const char *req, char *ans, size_t cap)
{
	if (fixture_ask_in(e->cgroup, port, req, ans, cap, WAIT_MS) < 0)
		ans[0] = '\0';
}

/* Every process of e's v2 cgroup is in cgroups named for e in every hierarchy it is in that
 * names an environment, never in src's. */
static void in_own_cgroups(const struct sv_env *e, const char *src_id)
{
	char path[PATH_MAX], line[512], own[80], other[80];
	FILE *procs, *cg;
	int pid, n = 0;

	snprintf(own, sizeof(own), "/%s\n", e->id);
	snprintf(other, sizeof(other), "/%s\n", src_id);
	snprintf(path, sizeof(path), "%s/cgroup.procs", e->cgroup);
	procs = fopen(path, "re");
	assert_non_null(procs);
	while (fscanf(procs, "%d", &pid) == 1) {
		unsigned hierarchies = 0;

		snprintf(path, sizeof(path), "/proc/%d/cgroup", pid);
		cg = fopen(path, "re");
		assert_non_null(cg);
		while (fgets(line, sizeof(line), cg)) {
			size_t len = strlen(line);

			if (len > strlen(other) && strcmp(line + len - strlen(other), other) == 0)
				fail_msg("pid %d of %s is in %s's cgroup: %s", pid, e->id, src_id,
					 line);
			if (len > strlen(own) && strcmp(line + len - strlen(own), own) == 0)
				hierarchies++;
		}
		fclose(cg);
		/* v2, pids and memory */
		assert_true(hierarchies >= 3);
		n++;
	}
	fclose(procs);
	assert_true(n >= 3); /* sleep, two servers */
}

static void file_in(const struct sv_env *e, const char *name, bool want)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/work/%s", e->root, name);
	assert_int_equal(access(path, F_OK) == 0, want);
}

static void forks_are_copies(void **state)
{
	struct fork_fx *x = *state;
	struct env_manifest m;
	char ckpt[ENV_ID_MAX + 1], ans[256], id[16];

	start(x);
	checkpoint(x->f.env, ckpt, sizeof(ckpt));
	for (int i = 0; i < FORKS; i++) {
		snprintf(id, sizeof(id), "fork-%d", i);
		x->forks[i] = fork_one(x, x->f.env, ckpt, id, &m);
		/* its first checkpoint: a root of its own that names where it came from */
		assert_string_equal(m.parent, "");
		assert_string_equal(m.env, id);
		assert_true(strncmp(m.from, "src/", 4) == 0 && strcmp(m.from + 4, ckpt) == 0);
		assert_int_equal(m.turn, 7);
		assert_int_equal(m.prefix_tokens, 70);
		env_manifest_finish(&m);
	}
	/* the same port in every namespace, each with the checkpoint's state, counting on its own */
	for (int i = 0; i < FORKS; i++) {
		ask(x->forks[i], x->port, "get", ans, sizeof(ans));
		assert_true(strncmp(ans, "forked-state ", 13) == 0);
		ask(x->forks[i], x->port, i == 0 ? "set fork-0-only" : "get", ans, sizeof(ans));
		in_own_cgroups(x->forks[i], "src");
	}
	ask(x->forks[1], x->port, "get", ans, sizeof(ans));
	assert_true(strncmp(ans, "forked-state ", 13) == 0);
	ask(x->f.env, x->port, "get", ans, sizeof(ans));
	assert_true(strncmp(ans, "forked-state ", 13) == 0);

	/* file systems apart: the source's and each fork's writes are their own */
	assert_int_equal(fixture_env_exec(x->forks[0]->cgroup, x->forks[0]->pid,
					  "touch /work/only-in-fork-0"),
			 0);
	assert_int_equal(
		fixture_env_exec(x->f.env->cgroup, x->f.env->pid, "touch /work/only-in-src"), 0);
	file_in(x->forks[0], "only-in-fork-0", true);
	file_in(x->forks[1], "only-in-fork-0", false);
	file_in(x->f.env, "only-in-fork-0", false);
	file_in(x->forks[0], "only-in-src", false);
	file_in(x->forks[2], "ready", true);
}

static void fork_lives_on_its_own(void **state)
{
	struct fork_fx *x = *state;
	struct env_manifest m;
	char ckpt[ENV_ID_MAX + 1], fck[ENV_ID_MAX + 1], ans[256];

	start(x);
	checkpoint(x->f.env, ckpt, sizeof(ckpt));
	x->forks[0] = fork_one(x, x->f.env, NULL, "a", &m); /* NULL: the head */
	env_manifest_finish(&m);
	/* the source goes; the fork's checkpoint does not need it */
	env_destroy(x->f.env);
	x->f.env = NULL;
	ask(x->forks[0], x->port, "set a-turn-8", ans, sizeof(ans));
	assert_int_equal(
		fixture_env_exec(x->forks[0]->cgroup, x->forks[0]->pid, "echo 8 >/work/turn"), 0);
	checkpoint(x->forks[0], fck, sizeof(fck));
	ask(x->forks[0], x->port, "set later", ans, sizeof(ans));
	assert_int_equal(env_restore(x->forks[0], fck, &m), 0);
	env_manifest_finish(&m);
	ask(x->forks[0], x->port, "get", ans, sizeof(ans));
	assert_true(strncmp(ans, "a-turn-8 ", 9) == 0);
	file_in(x->forks[0], "turn", true);
	/* a fork of the fork, from its first checkpoint (the copy) */
	x->forks[1] = fork_one(x, x->forks[0], NULL, "a-b", &m);
	assert_true(strncmp(m.from, "a/", 2) == 0);
	env_manifest_finish(&m);
	ask(x->forks[1], x->port, "get", ans, sizeof(ans));
	assert_true(strncmp(ans, "a-turn-8 ", 9) == 0);
	in_own_cgroups(x->forks[1], "a");
}

static void fork_refusals(void **state)
{
	struct fork_fx *x = *state;
	struct env_params p;
	struct env_manifest m;
	struct sv_env *e = NULL;

	start(x);
	p = x->p;
	p.id = "nothing-yet";
	/* no checkpoint to fork from */
	assert_int_equal(env_fork(x->f.env, NULL, &p, &e, &m, NULL, 0), -ENOENT);
	assert_int_equal(env_fork(x->f.env, "c99999999", &p, &e, &m, NULL, 0), -ENOENT);
	p.id = "src";
	assert_int_equal(env_fork(x->f.env, NULL, &p, &e, &m, NULL, 0), -EINVAL);
	assert_null(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(forks_are_copies, setup, teardown),
		cmocka_unit_test_setup_teardown(fork_lives_on_its_own, setup, teardown),
		cmocka_unit_test_setup_teardown(fork_refusals, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
