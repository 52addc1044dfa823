/* SPDX-License-Identifier: MIT */
/*
 * NCCL communicator tracking and hang detection end to end (suite 'nccl'): the real
 * supervisor, rank processes (nccl-rank: CUDA and NCCL through dlopen + dlsym only) under
 * LD_PRELOAD=libbelayer.so on the emulated GPU, whose NCCL hangs the peers of a dead or
 * stopped rank as real NCCL does. Faults: a dead rank, a stopped rank, a slow rank (no false
 * positive), a split communicator; the same with nonblocking communicators (review B4).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nccl.h>

#include "sv-test.h"
#include "test-util.h"

#define HANG_MS 1000

struct rank {
	pid_t pid;
	int in, out;
	int status;
	bool reaped;
};

static const char *const settings[] = {
	"nccl.hang_timeout=1s",
	"nccl.stall_timeout=3s",
	"nccl.poll_interval=50ms",
	NULL,
};

static int setup(void **state)
{
	struct sv *sv = calloc(1, sizeof(*sv));

	/* Four emulated devices: one per rank, as NCCL wants. */
	setenv("BELAYER_EMU_DEVICES", "4", 1);
	sv_setup(sv);
	sv_start(sv, settings);
	*state = sv;
	return 0;
}

static int teardown(void **state)
{
	struct sv *sv = *state;

	sv_teardown(sv);
	free(sv);
	return 0;
}

static void new_id(char *hex, size_t cap)
{
	void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
	ncclResult_t (*get)(ncclUniqueId *);
	ncclUniqueId id;

	assert_non_null(h);
	get = (__typeof__(get))dlsym(h, "ncclGetUniqueId");
	assert_non_null(get);
	assert_int_equal(get(&id), ncclSuccess);
	assert_true(cap > 2 * sizeof(id.internal));
	for (size_t i = 0; i < sizeof(id.internal); i++)
		snprintf(hex + 2 * i, 3, "%02x", (uint8_t)id.internal[i]);
}

/* Reads one line from fd within timeout_ms; true when it starts with want. */
static bool read_line(int fd, const char *want, int timeout_ms)
{
	char buf[128];
	size_t n = 0;
	uint64_t deadline = mono_ms() + (uint64_t)timeout_ms;

	while (n < sizeof(buf) - 1 && mono_ms() < deadline) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		ssize_t r;

		if (poll(&p, 1, (int)(deadline - mono_ms())) <= 0)
			continue;
		r = read(fd, buf + n, 1);
		if (r <= 0)
			return false;
		if (buf[n] == '\n') {
			buf[n] = 0;
			return strncmp(buf, want, strlen(want)) == 0;
		}
		n++;
	}
	return false;
}

/* flags: nccl-rank's FLAGS ("split", "nonblock", "split,nonblock") or NULL. */
static void start_ranks(struct rank *rk, int n, int iters, int bad, const char *mode, int arg,
			const char *flags)
{
	char id[2 * NCCL_UNIQUE_ID_BYTES + 1];

	new_id(id, sizeof(id));
	for (int i = 0; i < n; i++) {
		int in[2], out[2];
		char r[16], nr[16], it[16], a[16];

		assert_int_equal(pipe2(in, O_CLOEXEC), 0);
		assert_int_equal(pipe2(out, O_CLOEXEC), 0);
		snprintf(r, sizeof(r), "%d", i);
		snprintf(nr, sizeof(nr), "%d", n);
		snprintf(it, sizeof(it), "%d", iters);
		snprintf(a, sizeof(a), "%d", arg);
		rk[i] = (struct rank){.pid = fork()};
		assert_true(rk[i].pid >= 0);
		if (rk[i].pid == 0) {
			dup2(in[0], 0);
			dup2(out[1], 1);
			setenv("LD_PRELOAD", SHIM_PATH, 1);
			setenv("BELAYER_ENGINE_ID", "nccl-test", 1);
			setenv("BELAYER_RANK", r, 1);
			execl(RANK_PATH, RANK_PATH, r, nr, id, it, i == bad ? mode : "none", a,
			      flags, NULL);
			_exit(127);
		}
		close(in[0]);
		close(out[1]);
		rk[i].in = in[1];
		rk[i].out = out[0];
	}
	for (int i = 0; i < n; i++)
		assert_true(read_line(rk[i].out, "ok", SV_WAIT_MS));
}

/* The supervisor's NCCL summary and last diagnosis (CTL_STATUS, EVENT_NCCL). */
static void nccl_status(const struct sv *sv, char *summary, char *diag, size_t cap)
{
	struct proto_msg m[256];
	int n = ctl_collect(sv, CTL_STATUS, 0, CTL_ACT_NONE, -1, m, 256);

	assert_true(n > 0);
	summary[0] = diag[0] = 0;
	for (int i = 0; i < n; i++) {
		if (m[i].type != PROTO_EVENT || m[i].event.kind != EVENT_NCCL)
			continue;
		if (strncmp(m[i].event.message, "nccl communicators=", 19) == 0)
			snprintf(summary, cap, "%s", m[i].event.message);
		else
			snprintf(diag, cap, "%s", m[i].event.message);
	}
}

static uint64_t field(const char *s, const char *key)
{
	char k[64];
	const char *p;

	snprintf(k, sizeof(k), " %s=", key);
	p = strstr(s, k);
	return p ? strtoull(p + strlen(k), NULL, 0) : UINT64_MAX;
}

static bool wait_comms(const struct sv *sv, uint64_t want)
{
	char sum[512], diag[512];
	uint64_t deadline = mono_ms() + SV_WAIT_MS;

	do {
		nccl_status(sv, sum, diag, sizeof(sum));
		if (field(sum, "communicators") == want)
			return true;
		(void)poll(NULL, 0, 20);
	} while (mono_ms() < deadline);
	return false;
}

static void go(struct rank *rk, int n)
{
	for (int i = 0; i < n; i++)
		assert_int_equal(write(rk[i].in, "go\n", 3), 3);
}

/* Waits for rank i to exit within timeout_ms; its wait status in rk[i].status. */
static bool reap(struct rank *rk, int i, int timeout_ms)
{
	uint64_t deadline = mono_ms() + (uint64_t)timeout_ms;

	while (!rk[i].reaped) {
		pid_t r = waitpid(rk[i].pid, &rk[i].status, WNOHANG);

		if (r == rk[i].pid)
			rk[i].reaped = true;
		else if (mono_ms() >= deadline)
			return false;
		else
			(void)poll(NULL, 0, 10);
	}
	return true;
}

static void cleanup(struct rank *rk, int n)
{
	for (int i = 0; i < n; i++) {
		if (!rk[i].reaped) {
			kill(rk[i].pid, SIGKILL);
			(void)reap(rk, i, 5000);
		}
		close(rk[i].in);
		close(rk[i].out);
	}
}

/* A failed check leaves no rank behind (the next test counts communicators): the ranks are
 * killed, the supervisor's view printed, and the test fails with msg. */
#define CHECK_RANKS(cond, sv, rk, n, msg)                                        \
	do {                                                                     \
		if (!(cond)) {                                                   \
			char sum_[512], diag_[512];                              \
			nccl_status((sv), sum_, diag_, sizeof(sum_));            \
			cleanup((rk), (n));                                      \
			fail_msg("%s (%s): %s | %s", (msg), #cond, sum_, diag_); \
		}                                                                \
	} while (0)

static bool killed(const struct rank *r)
{
	return WIFSIGNALED(r->status) && WTERMSIG(r->status) == SIGKILL;
}

/* The program found NCCL through dlsym alone: its communicators are announced, their
 * collectives counted and completed, and destroying them is seen. */
static void dlsym_only_program_is_tracked(void **state)
{
	struct sv *sv = *state;
	struct rank rk[2];
	char sum[512], diag[512];

	start_ranks(rk, 2, 20, -1, "none", 0, NULL);
	assert_true(wait_comms(sv, 2));
	go(rk, 2);
	for (int i = 0; i < 2; i++)
		assert_true(read_line(rk[i].out, "done", SV_WAIT_MS));
	/* Completion is observed by the shims' pollers: it catches up within a few polls. */
	for (uint64_t deadline = mono_ms() + SV_WAIT_MS;;) {
		nccl_status(sv, sum, diag, sizeof(sum));
		if (field(sum, "completed") == 40 || mono_ms() > deadline)
			break;
		(void)poll(NULL, 0, 20);
	}
	assert_int_equal(field(sum, "enqueued"), 40);
	assert_int_equal(field(sum, "completed"), 40);
	go(rk, 2); /* destroy */
	for (int i = 0; i < 2; i++) {
		assert_true(reap(rk, i, SV_WAIT_MS));
		assert_true(WIFEXITED(rk[i].status) && WEXITSTATUS(rk[i].status) == 0);
	}
	assert_true(wait_comms(sv, 0));
	assert_int_equal(field(sum, "hangs"), 0);
	cleanup(rk, 2);
}

/* A rank dies before a collective: its peer blocks in it (as with real NCCL) until the
 * supervisor, told of the death by the pidfd, stops it — long before any hang bound. */
static void dead_rank(void **state)
{
	struct sv *sv = *state;
	struct rank rk[2];
	char sum[512], diag[512];
	uint64_t t0, hangs;

	nccl_status(sv, sum, diag, sizeof(sum));
	hangs = field(sum, "hangs");
	start_ranks(rk, 2, 1000, 1, "die", 5, NULL);
	assert_true(wait_comms(sv, 2));
	go(rk, 2);
	assert_true(reap(rk, 1, SV_WAIT_MS));
	assert_int_equal(WEXITSTATUS(rk[1].status), 3);
	/* from the death on (the collectives before it are not the supervisor's time): a hang
	 * bound would stop the peer no sooner than HANG_MS after the dead rank's last progress */
	t0 = mono_ms();
	assert_true(reap(rk, 0, SV_WAIT_MS));
	assert_true(killed(&rk[0]));
	assert_true(mono_ms() - t0 < HANG_MS);
	nccl_status(sv, sum, diag, sizeof(sum));
	assert_int_equal(field(sum, "hangs"), hangs + 1);
	assert_non_null(strstr(diag, "cause=dead"));
	assert_int_equal(field(diag, "rank"), 1);
	assert_int_equal(field(diag, "pid"), (uint64_t)rk[1].pid);
	/* It died before its 5th collective, which its peer had entered. */
	assert_int_equal(field(diag, "coll"), 4);
	assert_int_equal(field(diag, "peer_coll"), 5);
	cleanup(rk, 2);
}

/* A rank stops (SIGSTOP) before a collective: after hang_timeout without progress the group
 * is declared hung, the stopped rank named, and both processes are stopped. */
static void stopped_rank_with(struct sv *sv, const char *flags)
{
	struct rank rk[2];
	char sum[512], diag[512];
	uint64_t t0, dt;

	start_ranks(rk, 2, 1000, 1, "stop", 5, flags);
	CHECK_RANKS(wait_comms(sv, 2), sv, rk, 2, "the two communicators are not announced");
	t0 = mono_ms();
	go(rk, 2);
	for (int i = 0; i < 2; i++) {
		CHECK_RANKS(reap(rk, i, SV_WAIT_MS), sv, rk, 2,
			    "no hang declared, ranks not stopped");
		assert_true(killed(&rk[i]));
	}
	dt = mono_ms() - t0;
	assert_true(dt >= HANG_MS);
	assert_true(dt < 10 * HANG_MS);
	nccl_status(sv, sum, diag, sizeof(sum));
	assert_non_null(strstr(diag, "cause=stopped"));
	assert_int_equal(field(diag, "rank"), 1);
	assert_int_equal(field(diag, "pid"), (uint64_t)rk[1].pid);
	assert_int_equal(field(diag, "coll"), 4);
	assert_int_equal(field(diag, "peer_coll"), 5);
	assert_true(field(diag, "waited_ms") >= HANG_MS);
	/* belayerctl status shows the diagnosis. */
	{
		const char *argv[] = {BELAYERCTL_PATH, "status", "--json", NULL};
		char *out = NULL;

		assert_int_equal(run_tool(sv, argv, &out), 0);
		assert_non_null(strstr(out, "\"last_hang\""));
		assert_non_null(strstr(out, "\"cause\": \"stopped\""));
		free(out);
	}
	cleanup(rk, 2);
}

static void stopped_rank(void **state)
{
	stopped_rank_with(*state, NULL);
}

/* The same with nonblocking communicators (review B4): the peer's 5th all-reduce returns
 * ncclInProgress and is never enqueued, since its peer never comes; the shim must count it
 * pending (not complete at the call's return), so the hang is seen. */
static void stopped_rank_nonblocking(void **state)
{
	stopped_rank_with(*state, "nonblock");
}

/* Nonblocking: a collective that NCCL has not yet enqueued when the call returns
 * ncclInProgress is not complete. Every job of the emulated NCCL is held back 1.5 s
 * (BELAYER_EMU_NCCL_ASYNC_MS), so nothing can complete before that; rank 1 says "issued" once
 * its first all-reduce returned and waits, and the supervisor, asked right then, must see no
 * completion. Afterwards all complete, and no hang is declared (the wait is no hang). */
static void nonblocking_completion_waits_for_enqueue(void **state)
{
	struct sv *sv = *state;
	struct rank rk[2];
	char sum[512], diag[512];
	uint64_t hangs, enq, cpl;

	nccl_status(sv, sum, diag, sizeof(sum));
	hangs = field(sum, "hangs");
	assert_int_equal(setenv("BELAYER_EMU_NCCL_ASYNC_MS", "1500", 1), 0);
	start_ranks(rk, 2, 3, 1, "pause", 1, "nonblock");
	assert_int_equal(unsetenv("BELAYER_EMU_NCCL_ASYNC_MS"), 0);
	CHECK_RANKS(wait_comms(sv, 2), sv, rk, 2, "the two communicators are not announced");
	go(rk, 2);
	CHECK_RANKS(read_line(rk[1].out, "issued", SV_WAIT_MS), sv, rk, 2, "rank 1 did not issue");
	nccl_status(sv, sum, diag, sizeof(sum));
	enq = field(sum, "enqueued");
	cpl = field(sum, "completed");
	CHECK_RANKS(enq >= 1 && cpl == 0, sv, rk, 2,
		    "a collective NCCL has not enqueued yet counts as completed");
	assert_int_equal(write(rk[1].in, "go\n", 3), 3);
	for (int i = 0; i < 2; i++)
		assert_true(read_line(rk[i].out, "done", SV_WAIT_MS + 10000));
	for (uint64_t deadline = mono_ms() + SV_WAIT_MS;;) {
		nccl_status(sv, sum, diag, sizeof(sum));
		if (field(sum, "completed") == 6 || mono_ms() > deadline)
			break;
		(void)poll(NULL, 0, 20);
	}
	assert_int_equal(field(sum, "enqueued"), 6);
	assert_int_equal(field(sum, "completed"), 6);
	assert_int_equal(field(sum, "hangs"), hangs);
	go(rk, 2);
	for (int i = 0; i < 2; i++) {
		assert_true(reap(rk, i, SV_WAIT_MS));
		assert_true(WIFEXITED(rk[i].status) && WEXITSTATUS(rk[i].status) == 0);
	}
	assert_true(wait_comms(sv, 0));
	cleanup(rk, 2);
}

/* Slow but alive: a rank that takes 300 ms per step (the peer waits inside each collective,
 * but it completes) and one that takes longer than the bound between steps while outside
 * NCCL (an idle scheduler): neither is a hang. */
static void slow_rank_is_no_hang(void **state)
{
	struct sv *sv = *state;
	static const int slow_ms[2] = {300, 3 * HANG_MS / 2};
	static const int iters[2] = {8, 3};
	char sum[512], diag[512];
	uint64_t hangs;

	nccl_status(sv, sum, diag, sizeof(sum));
	hangs = field(sum, "hangs");
	for (int k = 0; k < 2; k++) {
		struct rank rk[2];

		start_ranks(rk, 2, iters[k], 1, "slow", slow_ms[k], NULL);
		assert_true(wait_comms(sv, 2));
		go(rk, 2);
		for (int i = 0; i < 2; i++)
			assert_true(read_line(rk[i].out, "done", SV_WAIT_MS));
		go(rk, 2);
		for (int i = 0; i < 2; i++) {
			assert_true(reap(rk, i, SV_WAIT_MS));
			assert_true(WIFEXITED(rk[i].status) && WEXITSTATUS(rk[i].status) == 0);
		}
		cleanup(rk, 2);
		assert_true(wait_comms(sv, 0));
	}
	nccl_status(sv, sum, diag, sizeof(sum));
	assert_int_equal(field(sum, "hangs"), hangs);
}

/* Four ranks split by color (rank % 2) into two communicators of two; rank 2 (rank 1 of the
 * even child) stops. The children are announced with their own hashes (four parent records,
 * four child records), the diagnosis names the child rank, the stuck ranks (the even child)
 * are stopped, and the odd child, which shares only the parent with them and still
 * progresses, is left to finish. */
static void split_with(struct sv *sv, const char *flags)
{
	struct rank rk[4];
	char sum[512], diag[512];

	start_ranks(rk, 4, 200, 2, "stop", 5, flags);
	CHECK_RANKS(wait_comms(sv, 8), sv, rk, 4, "not every parent and child is announced");
	go(rk, 4);
	for (int i = 0; i < 4; i += 2) {
		CHECK_RANKS(reap(rk, i, SV_WAIT_MS), sv, rk, 4, "the even child is not stopped");
		CHECK_RANKS(killed(&rk[i]), sv, rk, 4, "an even rank was not killed");
	}
	for (int i = 1; i < 4; i += 2)
		CHECK_RANKS(read_line(rk[i].out, "done", SV_WAIT_MS), sv, rk, 4,
			    "the odd child did not finish");
	nccl_status(sv, sum, diag, sizeof(sum));
	CHECK_RANKS(strstr(diag, "cause=stopped") && field(diag, "nranks") == 2 &&
			    field(diag, "rank") == 1 && field(diag, "pid") == (uint64_t)rk[2].pid &&
			    strstr(diag, "action=killed:2,spared:2"),
		    sv, rk, 4, "wrong diagnosis");
	for (int i = 1; i < 4; i += 2) {
		assert_int_equal(write(rk[i].in, "end\n", 4), 4);
		assert_true(reap(rk, i, SV_WAIT_MS));
		assert_true(WIFEXITED(rk[i].status) && WEXITSTATUS(rk[i].status) == 0);
	}
	cleanup(rk, 4);
}

static void split_communicator(void **state)
{
	split_with(*state, "split");
}

/* The same with nonblocking communicators (review B4): ncclCommSplit returns ncclInProgress
 * with *newcomm NULL, and NCCL stores the child once the parent leaves ncclInProgress; the
 * child must still be announced, with its true rank and size (not 0 of 1), so that the
 * diagnosis above holds unchanged. */
static void split_communicator_nonblocking(void **state)
{
	split_with(*state, "split,nonblock");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(dlsym_only_program_is_tracked),
		cmocka_unit_test(dead_rank),
		cmocka_unit_test(stopped_rank),
		cmocka_unit_test(stopped_rank_nonblocking),
		cmocka_unit_test(nonblocking_completion_waits_for_enqueue),
		cmocka_unit_test(slow_rank_is_no_hang),
		cmocka_unit_test(split_communicator),
		cmocka_unit_test(split_communicator_nonblocking),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
