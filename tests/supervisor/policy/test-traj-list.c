/* SPDX-License-Identifier: MIT */
/* PROTO_TRAJ_LIST and `belayerctl traj` through the real belayer-supervisor: what step events
 * taught the tracker is listed per trajectory and per environment, a filter lists one, an
 * empty tracker lists nothing, and a client that is not root may list. */
#include <errno.h>
#include <json-c/json.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto.h"
#include "sv-test.h"
#include "util.h"

static void step(int fd, enum traj_event ev, const char *traj, const char *env, uint64_t out,
		 uint64_t mtps)
{
	struct proto_msg q = {.type = PROTO_TRAJ_STEP}, a;

	q.traj_step.ev = ev;
	snprintf(q.traj_step.trajectory, sizeof(q.traj_step.trajectory), "%s", traj);
	snprintf(q.traj_step.env, sizeof(q.traj_step.env), "%s", env);
	q.traj_step.output_tokens = out;
	q.traj_step.decode_mtps = mtps;
	assert_int_equal(proto_send(fd, &q, 0), 0);
	assert_int_equal(client_recv(fd, &a, SV_WAIT_MS), 0);
	assert_int_equal(a.type, PROTO_TRAJ_DECISION);
}

/* Lists over fd into ret[0..max); returns the number of items (END's count checked). */
static int list(int fd, const char *only, struct proto_traj_info *ret, int max)
{
	struct proto_msg q = {.type = PROTO_TRAJ_LIST}, a;
	int n = 0;

	snprintf(q.traj_list.trajectory, sizeof(q.traj_list.trajectory), "%s", only);
	assert_int_equal(proto_send(fd, &q, 0), 0);
	for (;;) {
		assert_int_equal(client_recv(fd, &a, SV_WAIT_MS), 0);
		if (a.type == PROTO_END) {
			assert_int_equal(a.end.in_reply_to, PROTO_TRAJ_LIST);
			assert_int_equal(a.end.count, n);
			return n;
		}
		assert_int_equal(a.type, PROTO_TRAJ_INFO);
		assert_true(n < max);
		ret[n++] = a.traj_info;
	}
}

static const struct proto_traj_info *find(const struct proto_traj_info *v, int n,
					  enum traj_info_kind kind, const char *id)
{
	for (int i = 0; i < n; i++)
		if (v[i].kind == kind &&
		    strcmp(kind == TRAJ_INFO_ENV ? v[i].env : v[i].trajectory, id) == 0)
			return &v[i];
	return NULL;
}

static void listed_over_the_socket(void **state)
{
	static const char *const settings[] = {"policy.mode=adaptive", "policy.max_turns=8", NULL};
	struct proto_traj_info v[8];
	const struct proto_traj_info *a, *e;
	struct sv sv;
	int fd, n;

	(void)state;
	sv_setup(&sv);
	sv_start(&sv, settings);
	fd = client_connect(&sv);
	assert_true(fd >= 0);
	/* Nothing seen yet: an empty list. */
	assert_int_equal(list(fd, "", v, 8), 0);
	/* traj-a: two dirty turns, 500 tokens learnt, a 5 s bubble predicted at 100 tokens/s. */
	step(fd, TRAJ_STEP_END, "traj-a", "env-1", 0, 100000);
	step(fd, TRAJ_STEP_BEGIN, "traj-a", "env-1", 500, 0);
	step(fd, TRAJ_STEP_END, "traj-a", "env-1", 0, 100000);
	step(fd, TRAJ_STEP_END, "traj-b", "env-2", 0, 0);
	n = list(fd, "", v, 8);
	assert_int_equal(n, 4); /* two trajectories, two environments */
	a = find(v, n, TRAJ_INFO_TRAJECTORY, "traj-a");
	assert_non_null(a);
	assert_string_equal(a->env, "env-1");
	assert_int_equal(a->unprotected_turns, 2);
	assert_true(a->unprotected_us > 0 && a->unprotected_us < 60000000);
	assert_int_equal(a->bubble_us, 5000000);
	assert_int_equal(a->bubble_err_pm, 1000);
	assert_int_equal(a->n_lengths, 1);
	assert_true(a->decode_mtps > 0); /* learnt from the first bubble */
	assert_int_equal(a->pending, 0); /* no gateway */
	assert_int_equal(a->ckpt_done, 0);
	assert_int_equal(a->ckpt_aborted, 0);
	e = find(v, n, TRAJ_INFO_ENV, "env-1");
	assert_non_null(e);
	assert_string_equal(e->trajectory, "");
	assert_int_equal(e->cost_us, 20000); /* the prior: 20 ms fixed, 500 MB/s */
	assert_int_equal(e->fs_bps, 500000000);
	assert_int_equal(e->dump_bps, 500000000);
	assert_int_equal(e->cost_err_pm, 1000);
	assert_int_equal(e->cost_n, 0);
	assert_non_null(find(v, n, TRAJ_INFO_TRAJECTORY, "traj-b"));
	assert_non_null(find(v, n, TRAJ_INFO_ENV, "env-2"));
	/* One trajectory: it and its environment only; an unknown one: nothing. */
	n = list(fd, "traj-b", v, 8);
	assert_int_equal(n, 2);
	assert_non_null(find(v, n, TRAJ_INFO_TRAJECTORY, "traj-b"));
	assert_non_null(find(v, n, TRAJ_INFO_ENV, "env-2"));
	assert_int_equal(list(fd, "traj-zzz", v, 8), 0);
	close(fd);
	/* Readable by any client the socket lets in, root or not. */
	if (getuid() == 0) {
		char run[sizeof(sv.sock)];
		pid_t pid;
		int st;

		/* the socket reachable by uid 65534: the test's directories opened up */
		snprintf(run, sizeof(run), "%s/run", sv.dir);
		assert_int_equal(chmod(sv.dir, 0755), 0);
		assert_int_equal(chmod(run, 0755), 0);
		assert_int_equal(chmod(sv.sock, 0777), 0);
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			int cfd;

			if (setgid(65534) < 0 || setuid(65534) < 0)
				_exit(2);
			cfd = client_connect(&sv);
			_exit(cfd >= 0 && list(cfd, "", v, 8) == 4 ? 0 : 1);
		}
		assert_int_equal(waitpid(pid, &st, 0), pid);
		assert_true(WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 0);
	}
	assert_int_equal(sv_kill(&sv, SIGTERM), 0);
	sv_teardown(&sv);
}

static json_object *member(json_object *o, const char *k)
{
	json_object *v = NULL;

	assert_true(json_object_object_get_ex(o, k, &v));
	return v;
}

static void belayerctl_traj(void **state)
{
	const char *json[] = {BELAYERCTL_PATH, "traj", "--json", NULL};
	const char *one[] = {BELAYERCTL_PATH, "--json", "traj", "traj-a", NULL};
	const char *table[] = {BELAYERCTL_PATH, "traj", NULL};
	const char *bad[] = {BELAYERCTL_PATH, "traj", "a", "b", NULL};
	json_object *j, *t, *e;
	char *out;
	struct sv sv;
	int fd;

	(void)state;
	sv_setup(&sv);
	sv_start(&sv, NULL);
	fd = client_connect(&sv);
	assert_true(fd >= 0);
	step(fd, TRAJ_STEP_END, "traj-a", "env-1", 0, 100000);
	step(fd, TRAJ_STEP_BEGIN, "traj-a", "env-1", 500, 0);
	step(fd, TRAJ_STEP_END, "traj-a", "env-1", 0, 100000);
	step(fd, TRAJ_STEP_END, "traj-b", "env-2", 0, 0);
	close(fd);

	assert_int_equal(run_tool(&sv, json, &out), 0);
	j = json_tokener_parse(out);
	assert_non_null(j);
	t = member(j, "trajectories");
	e = member(j, "environments");
	assert_int_equal(json_object_array_length(t), 2);
	assert_int_equal(json_object_array_length(e), 2);
	for (size_t i = 0; i < 2; i++) {
		json_object *x = json_object_array_get_idx(t, i);

		if (strcmp(json_object_get_string(member(x, "trajectory")), "traj-a") != 0)
			continue;
		assert_string_equal(json_object_get_string(member(x, "env")), "env-1");
		assert_int_equal(json_object_get_int64(member(x, "unprotected_turns")), 2);
		assert_int_equal(json_object_get_int64(member(x, "bubble_us")), 5000000);
		assert_true(json_object_get_double(member(x, "bubble_err")) == 1.0);
		assert_false(json_object_get_boolean(member(x, "pending")));
		assert_int_equal(json_object_get_int64(member(x, "checkpoints_done")), 0);
		assert_int_equal(json_object_get_int64(member(x, "checkpoints_aborted")), 0);
	}
	assert_int_equal(
		json_object_get_int64(member(json_object_array_get_idx(e, 0), "cost_fixed_us")),
		20000);
	json_object_put(j);
	free(out);

	assert_int_equal(run_tool(&sv, one, &out), 0);
	j = json_tokener_parse(out);
	assert_non_null(j);
	assert_int_equal(json_object_array_length(member(j, "trajectories")), 1);
	assert_int_equal(json_object_array_length(member(j, "environments")), 1);
	json_object_put(j);
	free(out);

	assert_int_equal(run_tool(&sv, table, &out), 0);
	assert_non_null(strstr(out, "TRAJECTORY"));
	assert_non_null(strstr(out, "traj-a"));
	assert_non_null(strstr(out, "5.000s")); /* the bubble */
	assert_non_null(strstr(out, "env-2"));
	free(out);

	assert_int_not_equal(run_tool(&sv, bad, &out), 0);
	free(out);
	assert_int_equal(sv_kill(&sv, SIGTERM), 0);
	sv_teardown(&sv);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(listed_over_the_socket),
		cmocka_unit_test(belayerctl_traj),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
