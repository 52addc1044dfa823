/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <bpf/libbpf.h>

#include "envtrace-fixture.h"
#include "test-util.h"

#define EXIT_BUDGET_MS 10000

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *fixture_cgroup2_root(void)
{
	static char root[256];
	char line[1024];
	FILE *f = fopen("/proc/self/mounts", "re");

	if (!f)
		return NULL;
	root[0] = 0;
	while (fgets(line, sizeof(line), f)) {
		char dev[128], mnt[256], type[64];

		if (sscanf(line, "%127s %255s %63s", dev, mnt, type) == 3 &&
		    strcmp(type, "cgroup2") == 0) {
			snprintf(root, sizeof(root), "%s", mnt);
			break;
		}
	}
	fclose(f);
	return root[0] ? root : NULL;
}

static int quiet_print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	if (level == LIBBPF_DEBUG)
		return 0;
	return vfprintf(stderr, fmt, ap);
}

/* One tracer for the whole executable: attaching the ~90 tracepoints takes seconds on a small
 * VM (each enables a syscall event), so the tests share it, each with its own cgroup and env
 * id. Tests that need another configuration (a tiny ring buffer) load their own. */
static struct sv_envtrace *shared;
static char shared_pins[256];
static int shared_error;

int fixture_group_setup(void **state)
{
	struct envtrace_options opts = {.pin_dir = shared_pins};

	if (geteuid() != 0) {
		shared_error = -EPERM;
		return 0;
	}
	libbpf_set_print(quiet_print);
	snprintf(shared_pins, sizeof(shared_pins), "/sys/fs/bpf/belayer/envtrace-test-%d",
		 getpid());
	shared_error = envtrace_create(&opts, &shared);
	if (shared_error < 0)
		fprintf(stderr, "envtrace_create: %s\n", strerror(-shared_error));
	return 0;
}

int fixture_group_teardown(void **state)
{
	char cmd[300];

	envtrace_destroy(shared);
	shared = NULL;
	if (shared_pins[0]) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", shared_pins);
		(void)!system(cmd);
	}
	return 0;
}

int fixture_setup(struct fixture *fx, size_t ringbuf_bytes, const char **why)
{
	static unsigned int seq;
	const char *cg2 = fixture_cgroup2_root();
	int r;

	memset(fx, 0, sizeof(*fx));
	fx->env_id = 1 + seq % (ENVTRACE_MAX_ENVS - 1);
	if (geteuid() != 0) {
		*why = "tracing with BPF and creating cgroups needs root";
		return -EPERM;
	}
	if (!cg2) {
		*why = "no cgroup2 file system mounted";
		return -ENOENT;
	}
	snprintf(fx->cgroup, sizeof(fx->cgroup), "%s/belayer-envtrace-test-%d-%u", cg2, getpid(),
		 seq++);
	if (mkdir(fx->cgroup, 0755) < 0) {
		fx->cgroup[0] = 0;
		*why = "cannot create a cgroup v2 directory";
		return -errno;
	}
	if (ringbuf_bytes == 0) {
		if (!shared) {
			*why = "the envtrace BPF programs do not load/attach (root, tracefs, BTF?)";
			return shared_error < 0 ? shared_error : -ENOENT;
		}
		fx->et = shared;
		snprintf(fx->pin_dir, sizeof(fx->pin_dir), "%s", shared_pins);
	} else {
		struct envtrace_options opts = {.ringbuf_bytes = ringbuf_bytes, .pin_dir = ""};

		r = envtrace_create(&opts, &fx->et);
		if (r < 0) {
			*why = "the envtrace BPF programs do not load/attach (root, tracefs, BTF?)";
			fprintf(stderr, "envtrace_create: %s\n", strerror(-r));
			return r;
		}
		fx->own_et = true;
	}
	fx->tmp = test_mkdtemp("belayer-envtrace");
	if (!fx->tmp)
		return -errno;
	r = envtrace_watch_add(fx->et, fx->cgroup, NULL, fx->env_id);
	if (r < 0) {
		*why = "cannot watch the cgroup";
		return r;
	}
	fx->watching = true;
	r = dirty_create(&fx->dirty);
	if (r < 0)
		return r;
	snprintf(fx->log_path, sizeof(fx->log_path), "%s/sidelog.msgpack", fx->tmp);
	return sidelog_open(fx->log_path, &fx->log);
}

void fixture_teardown(struct fixture *fx)
{
	char path[300];

	sidelog_close(fx->log);
	dirty_destroy(fx->dirty);
	if (fx->watching)
		(void)envtrace_watch_remove(fx->et, fx->env_id);
	if (fx->own_et)
		envtrace_destroy(fx->et);
	if (fx->tmp) {
		(void)test_rmtree(fx->tmp);
		free(fx->tmp);
	}
	/* Child cgroups first (tests create at most one level below). */
	if (fx->cgroup[0]) {
		snprintf(path, sizeof(path), "%s/sub", fx->cgroup);
		(void)rmdir(path);
		(void)rmdir(fx->cgroup);
	}
	memset(fx, 0, sizeof(*fx));
}

static int on_record(const struct envtrace_record *rec, void *userdata)
{
	struct fixture *fx = userdata;

	fx->records++;
	/* BELAYER_ENVTRACE_DEBUG=1 prints each record: what a failing oracle check starts from. */
	if (getenv("BELAYER_ENVTRACE_DEBUG"))
		fprintf(stderr,
			"record type %u op %s pid %d ret %lld unresolved %d: %s %s | %s %s\n",
			rec->type, envtrace_op_to_string(rec->op), rec->pid, (long long)rec->ret,
			rec->unresolved, rec->path[0] ? rec->path[0] : "-",
			rec->alias[0][0] ? rec->alias[0][0] : "-",
			rec->path[1] ? rec->path[1] : "-",
			rec->alias[1][0] ? rec->alias[1][0] : "-");
	if (rec->env_id != fx->env_id)
		return 0;
	if (fx->outsider && rec->pid == fx->outsider)
		fx->foreign_records++;
	assert_int_equal(dirty_apply(fx->dirty, rec), 0);
	assert_int_equal(sidelog_append(fx->log, rec), 0);
	if (rec->type == ENVTRACE_EV_EXIT && rec->pid == fx->waiting_for)
		fx->exited = true;
	return 0;
}

void fixture_drain(struct fixture *fx)
{
	int r;

	do
		r = envtrace_consume(fx->et, on_record, fx);
	while (r > 0);
	assert_true(r >= 0);
}

static int move_self(const char *cgroup)
{
	char path[300];
	int fd, r = 0;

	snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (write(fd, "0", 1) != 1)
		r = -errno;
	close(fd);
	return r;
}

int fixture_run(struct fixture *fx, const char *cgroup, int (*fn)(void *), void *arg, bool consume)
{
	int status = 0, go[2];
	int64_t deadline;
	pid_t pid;
	char c = 0;

	assert_int_equal(pipe2(go, O_CLOEXEC), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(go[1]);
		if (cgroup != (const char *)-1 && move_self(cgroup ? cgroup : fx->cgroup) < 0)
			_exit(100);
		/* Start only once the parent knows which pid to wait for. */
		if (read(go[0], &c, 1) != 1)
			_exit(101);
		_exit(fn(arg));
	}
	close(go[0]);
	fx->waiting_for = pid;
	fx->exited = false;
	assert_int_equal(write(go[1], "g", 1), 1);
	close(go[1]);

	if (!consume) {
		assert_int_equal(waitpid(pid, &status, 0), pid);
		return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	}
	deadline = now_ms() + EXIT_BUDGET_MS;
	for (bool reaped = false; !(reaped && fx->exited);) {
		struct pollfd p = {.fd = envtrace_fd(fx->et), .events = POLLIN};

		assert_true(now_ms() < deadline);
		(void)poll(&p, 1, 50);
		fixture_drain(fx);
		if (!reaped && waitpid(pid, &status, WNOHANG) == pid)
			reaped = true;
		/* A child outside the watched cgroup leaves no exit record. */
		if (reaped && cgroup == (const char *)-1)
			break;
	}
	fixture_drain(fx);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
