/* SPDX-License-Identifier: MIT */
/*
 * The daemon runs the policy's checkpoints (issue 11): step events through the real
 * belayer-supervisor's socket on real environments (overlay, cgroup v2, eBPF dirty set, CRIU).
 * An adaptive decision checkpoints inside the bubble and the next step-begin reports it; a
 * clean environment is skipped; every-turn holds the step-begin until the environment runs
 * again; a checkpoint still copying a large FS delta when the step-begin arrives is aborted at
 * max_delay, the environment runs, nothing is committed, and the unprotected-turn rule forces a
 * later one. Root, cgroup v2 and CRIU >= 4.2; skips (explicitly) otherwise.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "envckpt-fixture.h"
#include "proto.h"
#include "supervisor-criu.h"
#include "sv-test.h"
#include "test-util.h"
#include "util.h"

#define WAIT_MS 20000
/* Runs a shell command inside the environment; fails the test unless it exits 0. */
#define env_exec(f, cmd) assert_int_equal(fixture_env_exec((f)->env_cg, (f)->env_pid, "%s", cmd), 0)
/* What the bound test allows past max_delay: the cancel's own latency (one 4 MiB chunk copy,
 * the thaw, the loop's wakeup) on a loaded CI machine. */
#define BOUND_SLACK_US 200000

struct fx {
	struct sv sv;
	char base[PATH_MAX], cg[PATH_MAX], setting_cg[PATH_MAX + 16];
	char env_cg[PATH_MAX];
	pid_t env_pid;
	int fd; /* the framework's connection */
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	f->fd = -1;
	*state = f;
	return 0;
}

/* An environment request on its own connection: its ENV_INFO replies into ret[0..max), their
 * number, or -code of an ERROR reply. */
static int env_call(struct fx *f, const struct proto_env_request *q, struct proto_msg *ret,
		    size_t max)
{
	struct proto_msg m = {.type = PROTO_ENV_REQUEST}, a;
	int fd = client_connect(&f->sv), n = 0;

	assert_true(fd >= 0);
	m.env_request = *q;
	assert_int_equal(proto_send(fd, &m, 0), 0);
	for (;;) {
		assert_int_equal(client_recv(fd, &a, WAIT_MS), 0);
		if (a.type == PROTO_ERROR) {
			n = -a.error.code;
			break;
		}
		if (a.type == PROTO_END)
			break;
		if (a.type == PROTO_ENV_INFO && (size_t)n < max)
			ret[n] = a;
		n++;
	}
	close(fd);
	return n;
}

/* Destroys e1 through the daemon (once no job of it runs); whatever is left after a failed
 * test goes the hard way (cgroup.kill, a lazy unmount). */
static void teardown_env(struct fx *f)
{
	struct proto_env_request q = {.op = ENV_OP_DESTROY};
	uint64_t deadline = fixture_now_us() + (uint64_t)WAIT_MS * 1000;
	char path[PATH_MAX + 32];
	struct proto_msg m;
	FILE *fp;

	snprintf(q.env, sizeof(q.env), "e1");
	while (env_call(f, &q, &m, 1) == -EBUSY && fixture_now_us() < deadline)
		(void)usleep(10000);
	if (!f->env_cg[0] || access(f->env_cg, F_OK) < 0)
		return;
	snprintf(path, sizeof(path), "%s/cgroup.kill", f->env_cg);
	fp = fopen(path, "we");
	if (fp) {
		fputs("1", fp);
		fclose(fp);
	}
	snprintf(path, sizeof(path), "%s/envs/e1/root", f->sv.state);
	(void)umount2(path, MNT_DETACH);
	for (int i = 0; i < 100 && rmdir(f->env_cg) < 0 && errno == EBUSY; i++)
		(void)usleep(20000);
}

static int teardown(void **state)
{
	struct fx *f = *state;

	if (f->fd >= 0)
		close(f->fd);
	if (f->sv.pid > 0) {
		teardown_env(f);
		(void)sv_kill(&f->sv, SIGTERM);
	}
	if (f->cg[0])
		(void)rmdir(f->cg);
	sv_teardown(&f->sv);
	free(f);
	return 0;
}

/* A supervisor with the tracer and [policy] settings, an environment e1 running cmd in it. */
static void start_cmd(struct fx *f, const char *const *policy, const char *cmd)
{
	const char *settings[16] = {f->setting_cg, "env.trace_preload=yes"};
	struct proto_env_request q = {.op = ENV_OP_CREATE};
	struct proto_msg info;
	size_t n = 2;

	sv_setup(&f->sv);
	snprintf(f->base, sizeof(f->base), "%s/base", f->sv.dir);
	snprintf(f->cg, sizeof(f->cg), FIXTURE_CGROUP_V2 "/belayer-policy-%d", (int)getpid());
	snprintf(f->setting_cg, sizeof(f->setting_cg), "env.cgroup=%s", f->cg);
	assert_int_equal(fixture_make_base(f->base, NULL), 0);
	for (size_t i = 0; policy[i]; i++)
		settings[n++] = policy[i];
	settings[n] = NULL;
	sv_start(&f->sv, settings);
	snprintf(q.env, sizeof(q.env), "e1");
	snprintf(q.root, sizeof(q.root), "%s", f->base);
	snprintf(q.cmd, sizeof(q.cmd), "%s", cmd);
	assert_int_equal(env_call(f, &q, &info, 1), 1);
	assert_true(info.env_info.pid > 0);
	f->env_pid = (pid_t)info.env_info.pid;
	snprintf(f->env_cg, sizeof(f->env_cg), "%s", info.env_info.cgroup);
	f->fd = client_connect(&f->sv);
	assert_true(f->fd >= 0);
}

/* e1 idling. */
static void start(struct fx *f, const char *const *policy)
{
	start_cmd(f, policy, "cd /work; exec sleep infinity");
}

struct step {
	enum traj_event ev;
	uint64_t turn, out, mtps;
	const char *env; /* NULL: e1 */
};

/* One step event; the decision, and the wall time its reply took (µs) in *ret_wall_us. */
static struct proto_traj_decision step(struct fx *f, const char *traj, struct step st,
				       uint64_t *ret_wall_us)
{
	struct proto_msg q = {.type = PROTO_TRAJ_STEP}, a;
	uint64_t t0 = fixture_now_us();

	q.traj_step.ev = st.ev;
	snprintf(q.traj_step.trajectory, sizeof(q.traj_step.trajectory), "%s", traj);
	snprintf(q.traj_step.env, sizeof(q.traj_step.env), "%s", st.env ? st.env : "e1");
	q.traj_step.turn = st.turn;
	q.traj_step.output_tokens = st.out;
	q.traj_step.decode_mtps = st.mtps;
	assert_int_equal(proto_send(f->fd, &q, 0), 0);
	assert_int_equal(client_recv(f->fd, &a, WAIT_MS), 0);
	if (a.type != PROTO_TRAJ_DECISION)
		fail_msg("reply %s: %s", proto_type_to_string(a.type),
			 a.type == PROTO_ERROR ? a.error.message : "");
	if (ret_wall_us)
		*ret_wall_us = fixture_now_us() - t0;
	assert_int_equal(a.traj_decision.ev, st.ev);
	assert_string_equal(a.traj_decision.trajectory, traj);
	return a.traj_decision;
}

static struct proto_traj_decision end_step(struct fx *f, const char *traj, uint64_t turn)
{
	/* 1000 tokens/s: with a history of 1000-token outputs, a 1 s bubble. */
	return step(f, traj, (struct step){.ev = TRAJ_STEP_END, .turn = turn, .mtps = 1000000},
		    NULL);
}

static struct proto_traj_decision begin_step(struct fx *f, const char *traj, uint64_t *ret_wall_us)
{
	return step(f, traj, (struct step){.ev = TRAJ_STEP_BEGIN, .out = 1000}, ret_wall_us);
}

/* e1's checkpoints, oldest first, once no job of it runs (a listing is refused meanwhile). */
static int checkpoints(struct fx *f, struct proto_msg *ret, size_t max)
{
	struct proto_env_request q = {.op = ENV_OP_LIST};
	uint64_t deadline = fixture_now_us() + (uint64_t)WAIT_MS * 1000;
	int n;

	snprintf(q.env, sizeof(q.env), "e1");
	while ((n = env_call(f, &q, ret, max)) == -EBUSY && fixture_now_us() < deadline)
		(void)usleep(10000);
	assert_true(n >= 0);
	return n;
}

/* cgroup.events' "frozen" of e1. */
static int frozen(struct fx *f)
{
	char path[PATH_MAX + 16], key[64];
	int v = -1, x;
	FILE *fp;

	snprintf(path, sizeof(path), "%s/cgroup.events", f->env_cg);
	fp = fopen(path, "re");
	assert_non_null(fp);
	while (fscanf(fp, "%63s %d", key, &x) == 2)
		if (strcmp(key, "frozen") == 0)
			v = x;
	fclose(fp);
	return v;
}

/* Checkpoint id of e1 is copying its FS delta: a data file of its .tmp-* has bytes. */
static bool wait_copying(struct fx *f, const char *id)
{
	uint64_t deadline = fixture_now_us() + (uint64_t)WAIT_MS * 1000;
	char path[PATH_MAX + 64];

	snprintf(path, sizeof(path), "%s/envs/e1/ckpt/.tmp-%s/data", f->sv.state, id);
	while (fixture_now_us() < deadline) {
		DIR *d = opendir(path);
		struct dirent *de;
		bool bytes = false;

		while (d && !bytes && (de = readdir(d))) {
			struct stat st;

			bytes = de->d_name[0] != '.' &&
				fstatat(dirfd(d), de->d_name, &st, 0) == 0 && st.st_size > 0;
		}
		if (d)
			closedir(d);
		if (bytes)
			return true;
		(void)usleep(1000);
	}
	return false;
}

/* The environment's dirty set lists path. */
static bool dirty_has(struct fx *f, const char *path)
{
	struct proto_msg m = {.type = PROTO_ENV_REQUEST}, a;
	int fd = client_connect(&f->sv);
	bool found = false;

	assert_true(fd >= 0);
	m.env_request.op = ENV_OP_DIRTY;
	snprintf(m.env_request.env, sizeof(m.env_request.env), "e1");
	assert_int_equal(proto_send(fd, &m, 0), 0);
	for (;;) {
		assert_int_equal(client_recv(fd, &a, WAIT_MS), 0);
		assert_int_not_equal(a.type, PROTO_ERROR);
		if (a.type == PROTO_END)
			break;
		if (a.type == PROTO_ENV_ITEM && strcmp(a.env_item.path, path) == 0)
			found = true;
	}
	close(fd);
	return found;
}

static uint64_t outcome(struct fx *f, const char *o)
{
	char labels[64];

	snprintf(labels, sizeof(labels), "outcome=\"%s\"", o);
	return metric(&f->sv, "belayer_policy_checkpoints_total", labels);
}

/* A bubble the predictors say hides the checkpoint: the daemon takes it, with the step's
 * trajectory and turn, and the next step-begin names it; then, nothing changed, the next step
 * end skips the clean environment (and the cost model has learnt from the checkpoint). */
static void adaptive_checkpoint_in_the_bubble(void **state)
{
	static const char *const policy[] = {"policy.mode=adaptive", "policy.confidence=0",
					     "policy.max_turns=0", "policy.max_unprotected=0",
					     NULL};
	struct fx *f = *state;
	struct proto_traj_decision d;
	struct proto_msg ck[4];

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	start(f, policy);
	env_exec(f, "echo one >/work/a");
	/* No history: no bet, no checkpoint. */
	d = end_step(f, "t1", 1);
	assert_int_equal(d.act, TRAJ_ACT_NONE);
	assert_string_equal(d.why, "no-fit");
	d = begin_step(f, "t1", NULL);
	assert_int_equal(d.held_us, 0);
	assert_string_equal(d.ckpt, "");
	assert_int_equal(d.ckpt_us, 0);
	assert_int_equal(checkpoints(f, ck, 4), 0);

	/* 1000 tokens at 1000 tokens/s against a small environment's checkpoint: it fits. */
	env_exec(f, "echo two >/work/b");
	d = end_step(f, "t1", 2);
	assert_int_equal(d.act, TRAJ_ACT_CHECKPOINT);
	assert_string_equal(d.why, "fits");
	assert_int_equal(d.bubble_us, 1000000);
	assert_int_equal(checkpoints(f, ck, 4), 1);
	assert_string_equal(ck[0].env_info.trajectory, "t1");
	assert_int_equal(ck[0].env_info.turn, 2);
	d = begin_step(f, "t1", NULL);
	assert_int_equal(d.held_us, 0); /* it was done: nothing to wait for */
	assert_string_equal(d.ckpt, ck[0].env_info.ckpt);
	assert_true(d.ckpt_us > 0);
	assert_int_equal(d.aborted, 0);
	printf("# adaptive: checkpoint %s ran %" PRIu64 " us inside the bubble\n", d.ckpt,
	       d.ckpt_us);
	assert_int_equal(metric(&f->sv, "belayer_policy_checkpoints_started_total", ""), 1);
	assert_int_equal(outcome(f, "completed"), 1);

	/* Nothing written since: clean, skipped, and the trajectory counts as protected. */
	d = end_step(f, "t1", 3);
	assert_int_equal(d.act, TRAJ_ACT_NONE);
	assert_string_equal(d.why, "clean");
	assert_int_not_equal(d.cost_err_pm, 1000); /* the cost model saw a checkpoint */
	d = begin_step(f, "t1", NULL);
	assert_string_equal(d.ckpt, "");
	assert_int_equal(checkpoints(f, ck, 4), 1);
	/* A write makes it dirty again. */
	env_exec(f, "echo three >>/work/a");
	d = end_step(f, "t1", 4);
	assert_int_equal(d.act, TRAJ_ACT_CHECKPOINT);
	assert_int_equal(checkpoints(f, ck, 4), 2);
	assert_int_equal(ck[1].env_info.turn, 4);
}

/* every-turn: the step-begin waits for the thaw however long, max_delay notwithstanding; the
 * environment runs when the reply comes; a client that leaves while held harms nothing. */
static void every_turn_holds_until_thawed(void **state)
{
	static const char *const policy[] = {"policy.mode=every-turn", "policy.max_delay=1ms",
					     NULL};
	struct fx *f = *state;
	struct proto_traj_decision d;
	struct proto_msg q = {.type = PROTO_TRAJ_STEP}, ck[4];
	uint64_t wall;
	int fd2;

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	start(f, policy);
	/* 256 MiB to copy: the checkpoint takes far longer than max_delay. */
	env_exec(f, "head -c 268435456 /dev/zero >/work/big");
	d = end_step(f, "t2", 1);
	assert_int_equal(d.act, TRAJ_ACT_CHECKPOINT_SYNC);
	d = begin_step(f, "t2", &wall);
	printf("# every-turn: held %" PRIu64 " us (reply after %" PRIu64
	       " us), checkpoint ran %" PRIu64 " us to its thaw\n",
	       d.held_us, wall, d.ckpt_us);
	assert_int_equal(frozen(f), 0); /* the reply came once it ran again */
	assert_int_equal(kill(f->env_pid, 0), 0);
	assert_int_equal(d.aborted, 0);
	assert_true(d.held_us > 20000); /* waited, unbounded by the 1 ms max_delay */
	/* It ran that long too (not compared with held: the job may start a little after the
	 * step-begin arrives, and the release waits for the loop after the thaw). */
	assert_true(d.ckpt_us > 20000);
	assert_int_equal(checkpoints(f, ck, 4), 1);
	assert_true(d.ckpt[0] == '\0' || strcmp(d.ckpt, ck[0].env_info.ckpt) == 0);
	assert_int_equal(outcome(f, "completed"), 1);
	assert_int_equal(metric(&f->sv, "belayer_policy_holds_total", ""), 1);
	/* metric() gives the wire value: microseconds (scale 10^6) for a _seconds metric */
	assert_true(metric(&f->sv, "belayer_policy_held_seconds_total", "") >= d.held_us);

	/* Held, then gone: the release finds nobody; the daemon carries on. */
	env_exec(f, "head -c 268435456 /dev/zero >/work/big2");
	d = end_step(f, "t2", 2);
	assert_int_equal(d.act, TRAJ_ACT_CHECKPOINT_SYNC);
	fd2 = client_connect(&f->sv);
	assert_true(fd2 >= 0);
	q.traj_step.ev = TRAJ_STEP_BEGIN;
	snprintf(q.traj_step.trajectory, sizeof(q.traj_step.trajectory), "t2");
	snprintf(q.traj_step.env, sizeof(q.traj_step.env), "e1");
	assert_int_equal(proto_send(fd2, &q, 0), 0);
	close(fd2);
	assert_int_equal(checkpoints(f, ck, 4), 2);
	assert_int_equal(outcome(f, "completed"), 2);
	assert_int_equal(metric(&f->sv, "belayer_policy_holds_total", ""), 2);
	d = end_step(f, "t2", 3);
	assert_string_equal(d.why, "clean");

	/* An environment the supervisor does not manage: the decision is advice, nothing runs,
	 * nothing is held. */
	d = step(f, "t5", (struct step){.ev = TRAJ_STEP_END, .env = "elsewhere"}, NULL);
	assert_int_equal(d.act, TRAJ_ACT_CHECKPOINT_SYNC);
	d = step(f, "t5", (struct step){.ev = TRAJ_STEP_BEGIN, .env = "elsewhere"}, NULL);
	assert_int_equal(d.held_us, 0);
	assert_int_equal(d.ckpt_us, 0);
	assert_int_equal(metric(&f->sv, "belayer_policy_checkpoints_started_total", ""), 2);
}

/* THE BOUND: the checkpoint is copying a 1 GiB FS delta when the step-begin arrives (its
 * pre-copy, issue 23 item 2: before the freeze); the reply goes out about max_delay later, the
 * checkpoint aborted, the environment running, nothing committed, its changes still dirty; the
 * unprotected-turn rule forces the next one. */
static void checkpoint_in_fs_delta_aborted_at_the_bound(void **state)
{
	static const char *const policy[] = {"policy.mode=adaptive",	 "policy.confidence=100",
					     "policy.max_delay=50ms",	 "policy.max_turns=1",
					     "policy.max_unprotected=0", NULL};
	struct fx *f = *state;
	struct proto_env_request q = {.op = ENV_OP_CHECKPOINT};
	struct proto_traj_decision d;
	struct proto_msg ck[4];
	char tmp[PATH_MAX + 64];
	uint64_t wall;

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	start(f, policy);
	d = end_step(f, "t3", 1);
	assert_string_equal(d.why, "no-fit");
	/* The framework checkpoints on its own, naming the trajectory: that protects it. */
	snprintf(q.env, sizeof(q.env), "e1");
	snprintf(q.trajectory, sizeof(q.trajectory), "t3");
	q.turn = 1;
	assert_int_equal(env_call(f, &q, ck, 1), 1);
	d = begin_step(f, "t3", NULL);
	assert_string_equal(d.ckpt, ""); /* not the policy's */

	env_exec(f, "head -c 1073741824 /dev/zero >/work/big");
	/* One unprotected turn is allowed (the framework's checkpoint reset the count), and a
	 * 1 GiB delta does not fit a 1 s bubble. */
	d = end_step(f, "t3", 2);
	assert_int_equal(d.act, TRAJ_ACT_NONE);
	assert_string_equal(d.why, "no-fit");
	d = begin_step(f, "t3", NULL);
	d = end_step(f, "t3", 3);
	assert_int_equal(d.act, TRAJ_ACT_CHECKPOINT);
	assert_string_equal(d.why, "force-turns");
	/* The FS delta is being copied (seconds of it), the environment running. */
	assert_true(wait_copying(f, "c00000002"));
	d = begin_step(f, "t3", &wall);
	printf("# bound: max_delay 50 ms, step-begin held %" PRIu64 " us (reply after %" PRIu64
	       " us), checkpoint ran %" PRIu64 " us, aborted %u\n",
	       d.held_us, wall, d.ckpt_us, d.aborted);
	assert_true(d.held_us >= 50000);
	assert_true(d.held_us <= 50000 + BOUND_SLACK_US);
	assert_true(wall <= 50000 + BOUND_SLACK_US + 50000);
	assert_int_equal(d.aborted, 1);
	assert_string_equal(d.ckpt, "");
	assert_int_equal(frozen(f), 0);
	assert_int_equal(kill(f->env_pid, 0), 0);
	/* Nothing committed, nothing left behind, the big file still dirty. */
	assert_int_equal(checkpoints(f, ck, 4), 1);
	snprintf(tmp, sizeof(tmp), "%s/envs/e1/ckpt/.tmp-c00000002", f->sv.state);
	assert_int_equal(access(tmp, F_OK), -1);
	assert_true(dirty_has(f, "/work/big"));
	assert_int_equal(outcome(f, "aborted"), 1);
	assert_int_equal(outcome(f, "completed"), 0);
	assert_int_equal(metric(&f->sv, "belayer_policy_holds_past_bound_total", ""), 0);

	/* Still unprotected: the next step end is forced, and this time it completes. */
	d = end_step(f, "t3", 4);
	assert_int_equal(d.act, TRAJ_ACT_CHECKPOINT);
	assert_string_equal(d.why, "force-turns");
	assert_int_equal(checkpoints(f, ck, 4), 2);
	assert_int_equal(ck[1].env_info.turn, 4);
	assert_true(ck[1].env_info.fs_bytes >= 1073741824);
	d = begin_step(f, "t3", NULL);
	assert_string_equal(d.ckpt, ck[1].env_info.ckpt);
	assert_int_equal(d.aborted, 0);
	assert_int_equal(outcome(f, "completed"), 1);
}

/* The environment's init's resident memory (VmRSS). */
static uint64_t rss_bytes(struct fx *f)
{
	char path[64], line[256];
	unsigned long long kb = 0;
	FILE *fp;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)f->env_pid);
	fp = fopen(path, "re");
	assert_non_null(fp);
	while (fgets(line, sizeof(line), fp))
		if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
			break;
	fclose(fp);
	return kb * 1024;
}

/* The running dump's log: CRIU has started. */
static bool wait_dump_running(struct fx *f)
{
	char path[PATH_MAX + 64];
	uint64_t deadline = fixture_now_us() + (uint64_t)WAIT_MS * 1000;

	snprintf(path, sizeof(path), "%s/envs/e1/ckpt/.tmp-c00000001/criu/dump.log", f->sv.state);
	while (fixture_now_us() < deadline) {
		if (access(path, F_OK) == 0)
			return true;
		(void)usleep(1000);
	}
	return false;
}

/* The contract's exception: a CRIU dump already running when the bound comes is not
 * interrupted (that could kill the environment's tasks); the checkpoint is aborted right after
 * it, the reply goes out at the thaw, late, and the daemon counts it. */
static void dump_running_at_the_bound_is_late_and_counted(void **state)
{
	static const char *const policy[] = {"policy.mode=adaptive",	 "policy.confidence=0",
					     "policy.max_delay=50ms",	 "policy.max_turns=1",
					     "policy.max_unprotected=0", NULL};
	struct fx *f = *state;
	struct proto_traj_decision d;
	struct proto_msg ck[2];
	uint64_t deadline;

	TEST_REQUIRE(fixture_env_preconditions(), FIXTURE_ENV_NEEDS);
	/* 1 GiB of touched anonymous memory: a dump of a second or more, next to no FS delta. */
	start_cmd(f, policy,
		  "exec python3 -c 'import time; b = bytearray(b\"x\") * (1 << 30); "
		  "time.sleep(1e9)'");
	deadline = fixture_now_us() + (uint64_t)WAIT_MS * 1000;
	while (rss_bytes(f) < (1ull << 30) && fixture_now_us() < deadline)
		(void)usleep(10000);
	assert_true(rss_bytes(f) >= (1ull << 30));
	d = end_step(f, "t4", 1);
	d = begin_step(f, "t4", NULL);
	d = end_step(f, "t4", 2);
	assert_int_equal(d.act, TRAJ_ACT_CHECKPOINT);
	assert_string_equal(d.why, "force-turns");
	/* The view counted its memory: 1 GiB at the 500 MB/s prior. */
	assert_true(d.cost_us >= 2000000);
	assert_true(wait_dump_running(f));
	d = begin_step(f, "t4", NULL);
	printf("# dump at the bound: max_delay 50 ms, step-begin held %" PRIu64 " us, aborted %u\n",
	       d.held_us, d.aborted);
	assert_int_equal(d.aborted, 1);
	assert_true(d.held_us > 50000 + 10000);
	assert_int_equal(frozen(f), 0);
	assert_int_equal(kill(f->env_pid, 0), 0);
	assert_int_equal(checkpoints(f, ck, 2), 0);
	assert_int_equal(outcome(f, "aborted"), 1);
	assert_int_equal(metric(&f->sv, "belayer_policy_holds_past_bound_total", ""), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(adaptive_checkpoint_in_the_bubble, setup, teardown),
		cmocka_unit_test_setup_teardown(every_turn_holds_until_thawed, setup, teardown),
		cmocka_unit_test_setup_teardown(checkpoint_in_fs_delta_aborted_at_the_bound, setup,
						teardown),
		cmocka_unit_test_setup_teardown(dump_running_at_the_bound_is_late_and_counted,
						setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
