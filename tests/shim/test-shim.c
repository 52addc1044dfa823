/* SPDX-License-Identifier: MIT */
/*
 * libbelayer.so end to end on the emulated driver: real processes run under
 * LD_PRELOAD=libbelayer.so with the emulated libcuda.so.1/libnccl.so.2 on LD_LIBRARY_PATH,
 * talking to shim-receiver (a stand-in for the supervisor's socket) whose output the tests
 * read. Every wait is on a real condition (a line from a process, a count of received
 * messages, a process exit) with a bounded timeout.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hooks-table.h"
#include "test-util.h"

#define TIMEOUT_MS 20000
#define MAX(a, b)  ((a) > (b) ? (a) : (b))

struct proc {
	pid_t pid;
	int in;	 /* its stdin */
	int out; /* its stdout */
	int err; /* its stderr, when captured */
};

struct fixture {
	char *dir;
	char sock[256];
	char out[256];
	struct proc receiver;
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Starts argv with extra environment entries ("NAME=value"); preload adds the shim. */
static void spawn(struct proc *p, const char *const argv[], const char *const env[], bool preload,
		  bool capture_err)
{
	int in[2], out[2], err[2] = {-1, -1};

	assert_int_equal(pipe2(in, O_CLOEXEC), 0);
	assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	if (capture_err)
		assert_int_equal(pipe2(err, O_CLOEXEC), 0);
	p->pid = fork();
	assert_true(p->pid >= 0);
	if (p->pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		if (capture_err)
			dup2(err[1], 2);
		setenv("LD_LIBRARY_PATH", EMU_LIB_DIR, 1);
		if (preload)
			setenv("LD_PRELOAD", SHIM_PATH, 1);
		for (size_t i = 0; env && env[i]; i++)
			putenv((char *)env[i]);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	if (capture_err)
		close(err[1]);
	p->in = in[1];
	p->out = out[0];
	p->err = err[0];
}

/* Reads one line of a process's stdout (or stderr) within the timeout. */
static bool read_line(int fd, char *buf, size_t cap)
{
	size_t n = 0;
	uint64_t deadline = now_ms() + TIMEOUT_MS;

	while (n + 1 < cap) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		int left = (int)(deadline - now_ms());

		if (left <= 0 || poll(&pfd, 1, left) <= 0)
			return false;
		if (read(fd, &buf[n], 1) != 1)
			return false;
		if (buf[n] == '\n')
			break;
		n++;
	}
	buf[n] = '\0';
	return true;
}

/* Reads lines until one starts with prefix. */
static bool expect_line(int fd, const char *prefix, char *buf, size_t cap)
{
	while (read_line(fd, buf, cap))
		if (strncmp(buf, prefix, strlen(prefix)) == 0)
			return true;
	return false;
}

static int wait_exit(pid_t pid)
{
	uint64_t deadline = now_ms() + TIMEOUT_MS;
	int status;

	while (now_ms() < deadline) {
		pid_t r = waitpid(pid, &status, WNOHANG);

		if (r == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		poll(NULL, 0, 10);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	return -1;
}

static void proc_close(struct proc *p)
{
	if (p->in >= 0)
		close(p->in);
	if (p->out >= 0)
		close(p->out);
	if (p->err >= 0)
		close(p->err);
	p->in = p->out = p->err = -1;
}

/* Counts the receiver's lines containing every one of the NULL-terminated substrings. */
static int count_lines(const struct fixture *f, ...)
{
	char line[512];
	int n = 0;
	FILE *in = fopen(f->out, "re");

	if (!in)
		return 0;
	while (fgets(line, sizeof(line), in)) {
		va_list ap;
		const char *s;
		bool all = true;

		va_start(ap, f);
		while ((s = va_arg(ap, const char *)))
			if (!strstr(line, s))
				all = false;
		va_end(ap);
		n += all;
	}
	fclose(in);
	return n;
}

#define COUNT(f, ...) count_lines((f), __VA_ARGS__, (const char *)NULL)

/* Waits until at least n receiver lines contain all the substrings. */
#define WAIT_COUNT(f, n, ...)                                                 \
	do {                                                                  \
		uint64_t deadline_ = now_ms() + TIMEOUT_MS;                   \
		while (COUNT((f), __VA_ARGS__) < (n) && now_ms() < deadline_) \
			poll(NULL, 0, 10);                                    \
		assert_true(COUNT((f), __VA_ARGS__) >= (n));                  \
	} while (0)

static void start_receiver(struct fixture *f, bool map)
{
	char line[64];
	const char *argv[] = {RECEIVER_PATH, map ? "--map" : f->sock, map ? f->sock : f->out,
			      map ? f->out : NULL, NULL};
	char envdir[300];
	const char *env[] = {envdir, NULL};

	snprintf(envdir, sizeof(envdir), "BELAYER_EMU_DIR=%s", f->dir);
	spawn(&f->receiver, argv, env, false, false);
	assert_true(read_line(f->receiver.out, line, sizeof(line)));
	assert_string_equal(line, "ready");
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	f->dir = test_mkdtemp("belayer-shim");
	if (!f->dir)
		return -1;
	snprintf(f->sock, sizeof(f->sock), "%s/supervisor.sock", f->dir);
	snprintf(f->out, sizeof(f->out), "%s/received.txt", f->dir);
	f->receiver.pid = -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	if (f->receiver.pid > 0) {
		kill(f->receiver.pid, SIGTERM);
		waitpid(f->receiver.pid, NULL, 0);
		proc_close(&f->receiver);
	}
	test_rmtree(f->dir);
	free(f->dir);
	free(f);
	return 0;
}

/* Environment of a workload: the fixture's socket and emulator run directory. */
struct wenv {
	char sock[300];
	char dir[300];
	const char *v[8];
};

static const char *const *workload_env(struct wenv *e, const struct fixture *f, const char *a,
				       const char *b)
{
	size_t n = 0;

	snprintf(e->sock, sizeof(e->sock), "BELAYER_SOCKET=%s", f->sock);
	snprintf(e->dir, sizeof(e->dir), "BELAYER_EMU_DIR=%s", f->dir);
	e->v[n++] = e->sock;
	e->v[n++] = e->dir;
	if (a)
		e->v[n++] = a;
	if (b)
		e->v[n++] = b;
	e->v[n] = NULL;
	return e->v;
}

/* Ends a held workload and waits until the receiver saw its connection close. */
static void finish(struct fixture *f, struct proc *w)
{
	char eof[64];

	close(w->in);
	w->in = -1;
	assert_int_equal(wait_exit(w->pid), 0);
	snprintf(eof, sizeof(eof), "eof pid=%d\n", w->pid);
	WAIT_COUNT(f, 1, eof);
	proc_close(w);
}

static void test_runtime_loader_tracked(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "runtime", NULL};
	struct wenv e;
	struct proc w;
	char line[256], pid[32];

	start_receiver(f, false);
	spawn(&w, argv, workload_env(&e, f, "BELAYER_ENGINE_ID=eng-7", "BELAYER_RANK=3"), true,
	      false);
	/* Converted memory says what it is: POSIX-fd exportable, and GPUDirect-RDMA capable
	 * like the driver's cuMemAlloc memory (review finding 9). */
	assert_true(expect_line(w.out, "attrs ", line, sizeof(line)));
	assert_string_equal(line, "attrs types=1 rdma=1 native_rdma=1");
	assert_true(expect_line(w.out, "ok runtime", line, sizeof(line)));
	snprintf(pid, sizeof(pid), "pid=%d ", w.pid);
	WAIT_COUNT(f, 2, "announce", pid, "size=8388608", "class=weights", "fd=ok");
	finish(f, &w);

	assert_int_equal(COUNT(f, "hello", pid, "engine=eng-7", "role=primary", "rank=3"), 1);
	/* Regions carry the UUID of the device they live on, as the hello lists it. */
	{
		char uuid[64] = "", *p, dev[80];
		FILE *in = fopen(f->out, "re");

		assert_non_null(in);
		while (fgets(line, sizeof(line), in))
			if (strncmp(line, "hello", 5) == 0 && (p = strstr(line, "dev0=")))
				sscanf(p + 5, "%63s", uuid);
		fclose(in);
		assert_int_equal(strlen(uuid), 32);
		assert_string_not_equal(uuid, "00000000000000000000000000000000");
		snprintf(dev, sizeof(dev), "dev=%s ", uuid);
		assert_int_equal(COUNT(f, "announce", dev), COUNT(f, "announce"));
	}
	assert_int_equal(COUNT(f, "announce", "size=8388608"), 2);
	/* The 3 MiB one (4 MiB mapped) was freed at once: announced and released, or neither. */
	assert_int_equal(COUNT(f, "announce", "size=4194304"), COUNT(f, "release"));
	assert_true(COUNT(f, "release") <= 1);
	/* The 64 KiB one stays the driver's. */
	assert_int_equal(COUNT(f, "announce", "size=65536"), 0);
	assert_int_equal(COUNT(f, "announce", "size=2097152"), 0);
}

/* BELAYER_ALLOC_POLICY=passthrough leaves cuMemAlloc to the driver: nothing to announce. */
static void test_alloc_policy_passthrough(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "runtime", NULL};
	struct wenv e;
	struct proc w;
	char line[256], pid[32];

	start_receiver(f, false);
	spawn(&w, argv, workload_env(&e, f, "BELAYER_ALLOC_POLICY=passthrough", NULL), true, false);
	assert_true(expect_line(w.out, "attrs ", line, sizeof(line)));
	assert_string_equal(line, "attrs types=0 rdma=1 native_rdma=1");
	assert_true(expect_line(w.out, "ok runtime", line, sizeof(line)));
	snprintf(pid, sizeof(pid), "pid=%d ", w.pid);
	WAIT_COUNT(f, 1, "hello", pid);
	finish(f, &w);
	assert_int_equal(COUNT(f, "announce"), 0);
}

static void test_runtime_fd_maps_same_bytes(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "runtime", NULL};
	struct wenv e;
	struct proc w;
	char line[256];

	start_receiver(f, true);
	spawn(&w, argv, workload_env(&e, f, NULL, NULL), true, false);
	assert_true(expect_line(w.out, "ok runtime", line, sizeof(line)));
	WAIT_COUNT(f, 2, "announce", "size=8388608");
	finish(f, &w);
	/* Buffer b holds 0x30..0x3f; the receiver mapped it after the owner exited. */
	WAIT_COUNT(f, 1, "bytes", "hex=303132333435363738393a3b3c3d3e3f");
}

static void test_vmm_create_made_exportable(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {LINKED_PATH, NULL};
	struct wenv e;
	struct proc w;
	char line[256];

	/* The driver alone refuses to export a handle created without handle types... */
	spawn(&w, argv, workload_env(&e, f, NULL, NULL), false, false);
	assert_true(expect_line(w.out, "exportable=", line, sizeof(line)));
	assert_string_equal(line, "exportable=0");
	close(w.in);
	w.in = -1;
	assert_int_equal(wait_exit(w.pid), 0);
	proc_close(&w);

	/* ...and under the shim the same program gets exportable memory, announced. */
	start_receiver(f, true);
	spawn(&w, argv, workload_env(&e, f, NULL, NULL), true, false);
	assert_true(expect_line(w.out, "exportable=", line, sizeof(line)));
	assert_string_equal(line, "exportable=1");
	WAIT_COUNT(f, 1, "announce", "fd=ok");
	finish(f, &w);
	WAIT_COUNT(f, 1, "bytes", "hex=a0a1a2a3a4a5a6a7a8a9aaabacadaeaf");
}

static void test_nccl_allocations_classed_nccl(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "nccl", NULL};
	struct wenv e;
	struct proc w;
	char line[256], wva[64];

	start_receiver(f, false);
	spawn(&w, argv, workload_env(&e, f, NULL, NULL), true, false);
	assert_true(expect_line(w.out, "ok nccl", line, sizeof(line)));
	snprintf(wva, sizeof(wva), "va=%s ", strstr(line, "w=") + 2);
	WAIT_COUNT(f, 1, "announce", "class=nccl");
	/* The broadcast into the weights after load is a weight update. */
	WAIT_COUNT(f, 1, "announce", wva, "class=weights", "version=1");
	finish(f, &w);
	/* Its first announce may already carry version 1 when the update beat it to the
	 * queue; either way it is the weights region, created first after NCCL's buffer. */
	assert_true(COUNT(f, "announce", wva, "class=weights", "order=1 ") >= 1);
	assert_int_equal(COUNT(f, "announce", "class=kv"), 1);
}

/* Copies src to dst (a library copy: another file, so the loader maps it a second time). */
static void copy_file(const char *src, const char *dst)
{
	char buf[65536];
	int in = open(src, O_RDONLY | O_CLOEXEC), out;
	ssize_t n;

	assert_true(in >= 0);
	out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
	assert_true(out >= 0);
	while ((n = read(in, buf, sizeof(buf))) > 0)
		assert_int_equal(write(out, buf, (size_t)n), n);
	assert_int_equal(n, 0);
	close(in);
	close(out);
}

/* vLLM's pynccl with VLLM_NCCL_SO_PATH beside PyTorch's NCCL (review B5): dlsym on the second
 * copy's handle must give that copy's functions, not wrappers that call the first copy, which
 * does not know the second's communicators (ncclCommCount, unhooked, answered "invalid
 * argument" for a communicator the wrapper had made in the first). */
static void test_second_nccl_copy_passes_through(void **state)
{
	struct fixture *f = *state;
	char copy[512], line[512];
	const char *argv[] = {WORKLOAD_PATH, "nccl-second-copy", copy, NULL};
	struct wenv e;
	struct proc w;
	bool logged = false;

	snprintf(copy, sizeof(copy), "%s/libnccl-copy.so.2", f->dir);
	copy_file(EMU_LIB_DIR "/libnccl.so.2", copy);
	start_receiver(f, false);
	for (int preload = 0; preload <= 1; preload++) {
		spawn(&w, argv, workload_env(&e, f, NULL, NULL), preload, true);
		assert_true(expect_line(w.out, "ok nccl-second-copy", line, sizeof(line)));
		assert_int_equal(wait_exit(w.pid), 0);
		while (read_line(w.err, line, sizeof(line)))
			logged = logged ||
				 (strstr(line, "libnccl-copy.so.2") && strstr(line, "untracked"));
		assert_true(logged == (preload == 1));
		proc_close(&w);
	}
}

/* Memsets into weights after load are weight writes: each bumps the version (review B3). */
static void test_memset_bumps_weights_version(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "memset", NULL};
	struct wenv e;
	struct proc w;
	char line[256], wva[64];
	unsigned long long a;

	start_receiver(f, false);
	spawn(&w, argv, workload_env(&e, f, NULL, NULL), true, false);
	assert_true(expect_line(w.out, "ok memset", line, sizeof(line)));
	assert_int_equal(sscanf(line, "ok memset w=0x%llx", &a), 1);
	snprintf(wva, sizeof(wva), "va=0x%llx ", a);
	WAIT_COUNT(f, 1, "announce", wva, "class=weights", "version=3");
	finish(f, &w);
	/* The load's fill came before the KV probe: not an update. */
	assert_int_equal(COUNT(f, "announce", wva, "version=4"), 0);
}

/* Review finding 3: the shim's NCCL poller queries the pending all-reduce's event every
 * 500 us; in the default GLOBAL capture mode that is a prohibited call while the engine's
 * main thread captures a CUDA graph, and it invalidates the capture (PyTorch's watchdog bug,
 * pytorch PR #104487). The shim's own threads must not disturb the engine's capture. */
static void test_capture_beside_pending_collective(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "capture", NULL};
	struct wenv e;
	struct proc w;
	char line[256];

	start_receiver(f, false);
	spawn(&w, argv, workload_env(&e, f, "BELAYER_EMU_EVENT_DELAY_MS=300", NULL), true, false);
	assert_true(expect_line(w.out, "ok capture", line, sizeof(line)));
	/* CUDA_SUCCESS, not CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901). */
	assert_string_equal(line, "ok capture end=0");
	finish(f, &w);
}

static void test_engine_classification(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "engine-index", NULL};
	struct wenv e;
	struct proc w;
	char line[256], w1[64], w2[64];
	unsigned long long a, b;

	start_receiver(f, false);
	spawn(&w, argv, workload_env(&e, f, NULL, NULL), true, false);
	assert_true(expect_line(w.out, "ok engine", line, sizeof(line)));
	assert_int_equal(sscanf(line, "ok engine w1=0x%llx w2=0x%llx", &a, &b), 2);
	snprintf(w1, sizeof(w1), "va=0x%llx ", a);
	snprintf(w2, sizeof(w2), "va=0x%llx ", b);
	WAIT_COUNT(f, 1, "announce", w2, "version=1");
	finish(f, &w);

	assert_int_equal(COUNT(f, "announce", w1, "class=weights", "order=0 ", "version=0"), 1);
	assert_int_equal(COUNT(f, "announce", w1), 1); /* never written after load */
	/* w2's first announce carries version 0, or already 1 if the update came first. */
	assert_true(COUNT(f, "announce", w2, "class=weights", "order=1 ") >= 1);
	assert_int_equal(COUNT(f, "announce", w2, "version=1"), 1);
	assert_int_equal(COUNT(f, "announce", "class=kv", "size=16777216", "order=2 "), 1);
	assert_int_equal(COUNT(f, "announce", "class=kv", "size=16777216", "order=3 "), 1);
	/* an index table of another size next to the KV tensors is not KV (review finding 2) */
	assert_int_equal(COUNT(f, "announce", "class=other", "size=20971520", "order=4 "), 1);
	assert_int_equal(COUNT(f, "announce", "class=other", "size=2097152", "order=5 "), 1);
	assert_int_equal(COUNT(f, "announce", "class=other", "size=16777216", "order=6 "), 1);
	/* A probe after the KV cache exists does not make another KV cache (review finding 8):
	 * the graph pool's segment after capture_model's mem_get_info is `other`. */
	assert_int_equal(COUNT(f, "announce", "class=other", "size=16777216", "order=7 "), 1);
	assert_int_equal(COUNT(f, "announce", "class=kv"), 2);
}

static void test_no_supervisor_runs_normally(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "runtime", NULL};
	struct wenv e;
	struct proc w;
	char line[512];
	int lines = 0, shim_lines = 0;

	spawn(&w, argv, workload_env(&e, f, NULL, NULL), true, true);
	assert_true(expect_line(w.out, "ok runtime", line, sizeof(line)));
	close(w.in);
	w.in = -1;
	assert_int_equal(wait_exit(w.pid), 0);
	while (read_line(w.err, line, sizeof(line))) {
		lines++;
		shim_lines += strstr(line, "No supervisor") != NULL;
	}
	assert_int_equal(shim_lines, 1);
	assert_int_equal(lines, 1);
	proc_close(&w);
}

static void test_storm_no_lost_or_duplicated_records(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "storm", "8", "32", NULL};
	static char ids[256][32];
	struct wenv e;
	struct proc w;
	char line[512];
	FILE *in;
	int n = 0;

	start_receiver(f, false);
	spawn(&w, argv, workload_env(&e, f, NULL, NULL), true, false);
	assert_true(expect_line(w.out, "ok allocated 256", line, sizeof(line)));
	WAIT_COUNT(f, 256, "announce", "size=2097152");
	assert_int_equal(write(w.in, "free\n", 5), 5);
	assert_true(expect_line(w.out, "ok freed 256", line, sizeof(line)));
	WAIT_COUNT(f, 256, "release");
	finish(f, &w);
	assert_int_equal(COUNT(f, "announce"), 256);
	assert_int_equal(COUNT(f, "release"), 256);
	assert_int_equal(COUNT(f, "hello"), 1);

	/* Every id announced once and released once. */
	in = fopen(f->out, "re");
	assert_non_null(in);
	while (fgets(line, sizeof(line), in)) {
		char *id = strstr(line, " id=");

		if (strncmp(line, "announce", 8) != 0 || !id)
			continue;
		assert_true(n < 256);
		sscanf(id + 4, "%31s", ids[n]);
		for (int i = 0; i < n; i++)
			assert_string_not_equal(ids[i], ids[n]);
		n++;
	}
	fclose(in);
	for (int i = 0; i < n; i++) {
		char rel[64];

		snprintf(rel, sizeof(rel), "id=%.31s\n", ids[i]);
		assert_int_equal(COUNT(f, "release", rel), 1);
	}
}

static void test_fork_child_announces_with_own_pid(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "fork", NULL};
	struct wenv e;
	struct proc w;
	char line[256], ppid[32], cpid[32], hello[64];
	int parent = 0, child = 0;

	start_receiver(f, false);
	spawn(&w, argv, workload_env(&e, f, NULL, NULL), true, false);
	assert_true(expect_line(w.out, "ok parent", line, sizeof(line)));
	assert_int_equal(sscanf(line, "ok parent pid=%d child=%d", &parent, &child), 2);
	assert_int_equal(parent, w.pid);
	snprintf(ppid, sizeof(ppid), "pid=%d ", parent);
	snprintf(cpid, sizeof(cpid), "pid=%d ", child);
	WAIT_COUNT(f, 1, "announce", ppid, "size=4194304");
	WAIT_COUNT(f, 1, "announce", cpid, "size=4194304");
	finish(f, &w);
	/* Each process introduced itself on its own connection, and announced only its own. */
	snprintf(hello, sizeof(hello), "hello_pid=%d\n", parent);
	assert_int_equal(COUNT(f, "hello", ppid, hello), 1);
	snprintf(hello, sizeof(hello), "hello_pid=%d\n", child);
	assert_int_equal(COUNT(f, "hello", cpid, hello), 1);
	assert_int_equal(COUNT(f, "announce", ppid), 1);
	assert_int_equal(COUNT(f, "announce", cpid), 1);
}

static void test_exec_child_under_preload(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "exec", NULL};
	struct wenv e;
	struct proc w;
	char line[256], cpid[32];
	int child = 0;

	start_receiver(f, false);
	spawn(&w, argv, workload_env(&e, f, NULL, NULL), true, false);
	assert_true(expect_line(w.out, "ok small", line, sizeof(line)));
	assert_int_equal(sscanf(line, "ok small pid=%d", &child), 1);
	snprintf(cpid, sizeof(cpid), "pid=%d ", child);
	WAIT_COUNT(f, 1, "announce", cpid, "size=4194304", "fd=ok");
	close(w.in);
	w.in = -1;
	assert_true(expect_line(w.out, "ok exec", line, sizeof(line)));
	assert_int_equal(wait_exit(w.pid), 0);
	proc_close(&w);
}

static void test_proc_address_and_dlsym(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "procaddr", NULL};
	struct wenv e;
	struct proc w;
	char line[512];

	bool later = false;

	/* With a second interposer preloaded after the shim. */
	spawn(&w, argv,
	      workload_env(&e, f, "BELAYER_LOG_LEVEL=error",
			   "LD_PRELOAD=" SHIM_PATH " " NEXT_PROBE_PATH),
	      false, false);
	while (read_line(w.out, line, sizeof(line)) && strcmp(line, "done") != 0) {
		if (strcmp(line, "checked later preload") == 0) {
			later = true;
			continue;
		}
		fail_msg("%s", line); /* the workload prints only mismatches */
	}
	assert_true(later);
	close(w.in);
	w.in = -1;
	assert_int_equal(wait_exit(w.pid), 0);
	proc_close(&w);
}

static void test_explicit_and_tms_tags(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "tags", TMS_STANDIN_PATH, NULL};
	unsigned long long a, b, c, d;
	char line[256], va[64], fwd[32];
	struct wenv e;
	struct proc w;

	start_receiver(f, false);
	spawn(&w, argv, workload_env(&e, f, NULL, NULL), true, false);
	assert_true(expect_line(w.out, "ok tags", line, sizeof(line)));
	assert_int_equal(sscanf(line, "ok tags a=0x%llx b=0x%llx c=0x%llx d=0x%llx forwarded=%31s",
				&a, &b, &c, &d, fwd),
			 5);
	/* The shim saw torch_memory_saver's setters go by and passed them on. */
	assert_string_equal(fwd, "default");
	WAIT_COUNT(f, 4, "announce", "size=8388608");
	finish(f, &w);
	snprintf(va, sizeof(va), "va=0x%llx ", a);
	assert_int_equal(COUNT(f, "announce", va, "class=kv"), 1);
	snprintf(va, sizeof(va), "va=0x%llx ", b);
	assert_int_equal(COUNT(f, "announce", va, "class=weights"), 1);
	snprintf(va, sizeof(va), "va=0x%llx ", c);
	assert_int_equal(COUNT(f, "announce", va, "class=kv"), 1);
	snprintf(va, sizeof(va), "va=0x%llx ", d);
	assert_int_equal(COUNT(f, "announce", va, "class=other"), 1);
}

/* Runs tags-positive MODE and checks each region's class (review finding 2). */
static void check_tags_positive(void **state, const char *mode, const char *env)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "tags-positive", mode, NULL};
	unsigned long long v[6];
	static const char *const names[] = {"bt", "w", "s", "k1", "k2", "it"};
	static const char *const want[] = {"class=other", "class=weights", "class=other",
					   "class=kv",	  "class=kv",	   "class=other"};
	char line[256], va[64], wrong[256] = "";
	struct wenv e;
	struct proc w;

	start_receiver(f, false);
	spawn(&w, argv, workload_env(&e, f, env, NULL), true, false);
	assert_true(expect_line(w.out, "ok positive", line, sizeof(line)));
	assert_int_equal(sscanf(line,
				"ok positive bt=0x%llx w=0x%llx s=0x%llx k1=0x%llx k2=0x%llx "
				"it=0x%llx",
				&v[0], &v[1], &v[2], &v[3], &v[4], &v[5]),
			 6);
	snprintf(va, sizeof(va), "va=0x%llx ", v[5]);
	WAIT_COUNT(f, 1, "announce", va);
	finish(f, &w);
	for (int i = 0; i < 6; i++) {
		snprintf(va, sizeof(va), "va=0x%llx ", v[i]);
		if (COUNT(f, "announce", va, want[i]) != 1) {
			size_t n = strlen(wrong);

			snprintf(wrong + n, sizeof(wrong) - n, " %s not %s;", names[i], want[i]);
		}
	}
	if (wrong[0])
		fail_msg("tags-positive %s:%s", mode, wrong);
}

/* Once a tag has been set, an untagged allocation is `other`: one before the probe (the
 * heuristic's weights) and one first after it (the heuristic's KV). */
static void test_tags_positive_after_first_tag(void **state)
{
	check_tags_positive(state, "tag", NULL);
}

/* BELAYER_CLASSIFY=tags and belayer_tags_only(): untagged buffers allocated before any tag
 * (vLLM's block tables at runner init) are `other` too. */
static void test_tags_positive_env(void **state)
{
	check_tags_positive(state, "env", "BELAYER_CLASSIFY=tags");
}

static void test_tags_positive_call(void **state)
{
	check_tags_positive(state, "call", NULL);
}

/* A supervisor that restarts gets every live region again, from a new hello. */
static void test_reconnect_reannounces_everything(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "runtime", NULL};
	struct wenv e;
	struct proc w;
	char line[256], pid[32];

	start_receiver(f, false);
	spawn(&w, argv, workload_env(&e, f, NULL, NULL), true, false);
	assert_true(expect_line(w.out, "ok runtime", line, sizeof(line)));
	snprintf(pid, sizeof(pid), "pid=%d ", w.pid);
	WAIT_COUNT(f, 2, "announce", pid, "size=8388608");

	kill(f->receiver.pid, SIGKILL);
	waitpid(f->receiver.pid, NULL, 0);
	proc_close(&f->receiver);
	snprintf(f->out, sizeof(f->out), "%s/received-2.txt", f->dir);
	start_receiver(f, false);

	WAIT_COUNT(f, 1, "hello", pid);
	WAIT_COUNT(f, 2, "announce", pid, "size=8388608", "fd=ok");
	finish(f, &w);
	assert_int_equal(COUNT(f, "hello"), 1);
	assert_int_equal(COUNT(f, "announce", "size=8388608"), 2);
}

/* With a queue far too small for the burst, dropped items turn into a resync: the last
 * session still ends up with every live region, each once. */
static void test_queue_overflow_resyncs(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "storm", "4", "32", NULL};
	struct wenv e;
	struct proc w;
	char line[512], conn[32];
	unsigned last = 0;
	FILE *in;

	start_receiver(f, false);
	spawn(&w, argv, workload_env(&e, f, "BELAYER_QUEUE_MAX=16", NULL), true, false);
	assert_true(expect_line(w.out, "ok allocated 128", line, sizeof(line)));
	/* Waits for the last connection to hold every region: once a session got through
	 * without an overflow nothing more is queued, so that state is final. */
	for (uint64_t deadline = now_ms() + TIMEOUT_MS; now_ms() < deadline; poll(NULL, 0, 10)) {
		last = 0;
		in = fopen(f->out, "re");
		assert_non_null(in);
		while (fgets(line, sizeof(line), in)) {
			unsigned c;

			if (sscanf(line, "hello pid=%*d conn=%u", &c) == 1)
				last = MAX(last, c);
		}
		fclose(in);
		snprintf(conn, sizeof(conn), "conn=%u ", last);
		if (last >= 1 && COUNT(f, "announce", conn) >= 128)
			break;
	}
	finish(f, &w);
	assert_int_equal(COUNT(f, "announce", conn), 128);
	assert_int_equal(COUNT(f, "hello", conn), 1);
}

/* vLLM's custom all-reduce exports caching-allocator memory (converted by the shim) with
 * legacy IPC: another process under the shim opens it and sees the same bytes, and the
 * driver's own IPC handles still work through the shim. */
static void test_legacy_ipc_of_converted_memory(void **state)
{
	struct fixture *f = *state;
	const char *argv[] = {WORKLOAD_PATH, "ipc-export", NULL};
	char handle[256], native[256], line[256];
	struct wenv e;
	struct proc w, o;

	spawn(&w, argv, workload_env(&e, f, "BELAYER_LOG_LEVEL=error", NULL), true, false);
	assert_true(expect_line(w.out, "handle ", handle, sizeof(handle)));
	assert_true(expect_line(w.out, "native ", native, sizeof(native)));
	{
		const char *oargv[] = {WORKLOAD_PATH, "ipc-open", handle + 7, "0x100000", NULL};

		spawn(&o, oargv, workload_env(&e, f, "BELAYER_LOG_LEVEL=error", NULL), true, false);
		assert_true(expect_line(o.out, "bytes ", line, sizeof(line)));
		assert_string_equal(line, "bytes 404142434445464748494a4b4c4d4e4f");
		close(o.in);
		o.in = -1;
		assert_int_equal(wait_exit(o.pid), 0);
		proc_close(&o);
	}
	{
		const char *oargv[] = {WORKLOAD_PATH, "ipc-open", native + 7, "0", NULL};

		spawn(&o, oargv, workload_env(&e, f, "BELAYER_LOG_LEVEL=error", NULL), true, false);
		assert_true(expect_line(o.out, "bytes ", line, sizeof(line)));
		assert_string_equal(line, "bytes 606162636465666768696a6b6c6d6e6f");
		close(o.in);
		o.in = -1;
		assert_int_equal(wait_exit(o.pid), 0);
		proc_close(&o);
	}
	close(w.in);
	w.in = -1;
	assert_int_equal(wait_exit(w.pid), 0);
	proc_close(&w);
}

/* The exports of libbelayer.so are exactly the table's hooks plus the extra exports. */
static void test_hooked_symbol_table(void **state)
{
	static const char *const table[] = {
#define X(sym, ...) #sym,
		BELAYER_CUDA_HOOKS(X) BELAYER_NCCL_HOOKS(X)
#undef X
#define X(sym) #sym,
			BELAYER_EXTRA_EXPORTS(X)
#undef X
	};
	bool seen[sizeof(table) / sizeof(table[0])] = {false};
	char line[256];
	FILE *nm;

	(void)state;
	nm = popen("nm -D --defined-only " SHIM_PATH, "r");
	TEST_REQUIRE(nm != NULL, "nm (binutils) is not available");
	while (fgets(line, sizeof(line), nm)) {
		char type, name[200];
		bool found = false;

		if (sscanf(line, "%*s %c %199s", &type, name) != 2)
			continue;
		for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
			if (strcmp(table[i], name) == 0)
				found = seen[i] = true;
		if (!found)
			fail_msg("libbelayer.so exports %s, which is not in hooks-table.h", name);
	}
	assert_int_equal(pclose(nm), 0);
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (!seen[i])
			fail_msg("%s is in hooks-table.h but not exported", table[i]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hooked_symbol_table),
		cmocka_unit_test_setup_teardown(test_proc_address_and_dlsym, setup, teardown),
		cmocka_unit_test_setup_teardown(test_runtime_loader_tracked, setup, teardown),
		cmocka_unit_test_setup_teardown(test_runtime_fd_maps_same_bytes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_alloc_policy_passthrough, setup, teardown),
		cmocka_unit_test_setup_teardown(test_vmm_create_made_exportable, setup, teardown),
		cmocka_unit_test_setup_teardown(test_nccl_allocations_classed_nccl, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_engine_classification, setup, teardown),
		cmocka_unit_test_setup_teardown(test_second_nccl_copy_passes_through, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_memset_bumps_weights_version, setup, teardown),
		cmocka_unit_test_setup_teardown(test_capture_beside_pending_collective, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_no_supervisor_runs_normally, setup, teardown),
		cmocka_unit_test_setup_teardown(test_storm_no_lost_or_duplicated_records, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_fork_child_announces_with_own_pid, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_exec_child_under_preload, setup, teardown),
		cmocka_unit_test_setup_teardown(test_legacy_ipc_of_converted_memory, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_reconnect_reannounces_everything, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_queue_overflow_resyncs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_explicit_and_tms_tags, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tags_positive_after_first_tag, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_tags_positive_env, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tags_positive_call, setup, teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
