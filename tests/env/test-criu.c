/* SPDX-License-Identifier: MIT */
/*
 * The CRIU environment is real: a CRIU >= 4 binary (BELAYER_CRIU, else `criu` on PATH),
 * driven through libcriu as Belayer will drive it, dumps a small running process and
 * restores it, and the restored process continues from its saved state.
 *
 * DESIGN.md §6: the restored PIDs must be free (the dumped process is reaped before
 * restoring), and the dumped process must hold no fd inherited from its launcher.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criu/criu.h>

#include "test-util.h"

#define WAIT_BUDGET_MS 10000

struct report {
	uint64_t token;
	uint64_t counter;
	pid_t pid;
};

/* --- the process that gets dumped ---------------------------------------------------- */

static volatile sig_atomic_t report_requested;

static void on_sigusr1(int sig)
{
	(void)sig;
	report_requested = 1;
}

/* Writes "token counter pid" to dir/report atomically (write + rename), so the test never
 * reads a half-written report. */
static void child_write_report(const char *dir, uint64_t token, uint64_t counter)
{
	char tmp[PATH_MAX], path[PATH_MAX], line[128];
	int fd, n;

	snprintf(tmp, sizeof(tmp), "%s/report.tmp", dir);
	snprintf(path, sizeof(path), "%s/report", dir);
	n = snprintf(line, sizeof(line), "%" PRIu64 " %" PRIu64 " %d\n", token, counter,
		     (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (write(fd, line, n) == n)
		(void)rename(tmp, path);
	close(fd);
}

/* Counts forever; reports on SIGUSR1. Its whole state is in memory: the token it was given
 * and the counter. */
static _Noreturn void child_main(const char *dir, uint64_t token)
{
	struct sigaction sa = {.sa_handler = on_sigusr1};
	const struct timespec tick = {.tv_nsec = 1000000};
	uint64_t counter = 0;
	int null;

	/* Own session, stdio on /dev/null, no other fd: CRIU refuses fds that point to the
	 * launcher's world (the test runner's pipes). */
	if (setsid() < 0)
		_exit(120);
	null = open("/dev/null", O_RDWR);
	if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
		_exit(121);
	if (syscall(SYS_close_range, 3U, ~0U, 0U) < 0)
		_exit(122);
	if (chdir("/") < 0)
		_exit(123);
	/* SIGUSR1 arrives blocked from the parent (a report request sent before this point
	 * must wait for the handler, not kill us); unblock it once the handler is in place. */
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGUSR1, &sa, NULL) < 0)
		_exit(124);
	sigaddset(&sa.sa_mask, SIGUSR1);
	if (sigprocmask(SIG_UNBLOCK, &sa.sa_mask, NULL) < 0)
		_exit(125);

	for (;;) {
		counter++;
		if (report_requested) {
			report_requested = 0;
			child_write_report(dir, token, counter);
		}
		(void)nanosleep(&tick, NULL);
	}
}

/* --- helpers for the test side ------------------------------------------------------- */

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Whether pid still runs: a child that died stays a zombie until reaped, so look without
 * reaping; for a process that is not our child, kill(0) tells. */
static bool is_alive(pid_t pid)
{
	siginfo_t si = {0};

	if (waitid(P_PID, pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0)
		return si.si_pid == 0;
	return kill(pid, 0) == 0;
}

/* Asks pid for a report and waits (bounded) until it is there. */
static int request_report(const char *dir, pid_t pid, struct report *ret)
{
	const struct timespec step = {.tv_nsec = 5000000};
	char path[PATH_MAX];
	int64_t deadline;
	FILE *f;
	int n;

	snprintf(path, sizeof(path), "%s/report", dir);
	if (unlink(path) < 0 && errno != ENOENT)
		return -errno;
	if (kill(pid, SIGUSR1) < 0)
		return -errno;
	/* The report appears by rename; the pid's liveness is checked each step so a dead
	 * process fails fast instead of at the deadline. */
	for (deadline = now_ms() + WAIT_BUDGET_MS; now_ms() < deadline; nanosleep(&step, NULL)) {
		f = fopen(path, "re");
		if (!f) {
			if (!is_alive(pid))
				return -ESRCH;
			continue;
		}
		n = fscanf(f, "%" SCNu64 " %" SCNu64 " %d", &ret->token, &ret->counter, &ret->pid);
		fclose(f);
		return n == 3 ? 0 : -EBADMSG;
	}
	return -ETIMEDOUT;
}

/* Waits (bounded) for pid to end, via its pidfd: works whether or not it is our child. */
static int wait_gone(pid_t pid)
{
	int fd, r;

	fd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (fd < 0)
		return errno == ESRCH ? 0 : -errno;
	r = poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, WAIT_BUDGET_MS);
	close(fd);
	return r == 1 ? 0 : r == 0 ? -ETIMEDOUT : -errno;
}

static void print_log(const char *dir, const char *name)
{
	char path[PATH_MAX], line[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "re");
	if (!f)
		return;
	print_message("--- %s (tail) ---\n", path);
	/* CRIU's logs are long; the reason for a failure is at the end. */
	if (fseek(f, -4096, SEEK_END) < 0)
		rewind(f);
	while (fgets(line, sizeof(line), f))
		print_message("%s", line);
	fclose(f);
}

/* The CRIU binary under test: BELAYER_CRIU, else the first `criu` on PATH. */
static char *find_criu(void)
{
	const char *env = getenv("BELAYER_CRIU");
	const char *path = getenv("PATH");
	char *dirs, *dir, *save = NULL, *found = NULL;

	if (env && *env)
		return access(env, X_OK) == 0 ? strdup(env) : NULL;
	dirs = strdup(path ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin");
	if (!dirs)
		return NULL;
	for (dir = strtok_r(dirs, ":", &save); dir && !found; dir = strtok_r(NULL, ":", &save)) {
		char candidate[PATH_MAX];

		snprintf(candidate, sizeof(candidate), "%s/criu", *dir ? dir : ".");
		if (access(candidate, X_OK) == 0)
			found = strdup(candidate);
	}
	free(dirs);
	return found;
}

/* --- the test ------------------------------------------------------------------------ */

struct fixture {
	char *criu;
	char *dir;
	char images[PATH_MAX];
	criu_opts *opts;
	int images_fd;
	pid_t pid;
};

static int setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));

	if (!fx)
		return -1;
	fx->images_fd = -1;
	fx->pid = -1;
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *fx = *state;

	if (fx->pid > 0) {
		(void)kill(fx->pid, SIGKILL);
		(void)waitpid(fx->pid, NULL, 0);
		(void)wait_gone(fx->pid);
	}
	if (fx->opts)
		criu_local_free_opts(fx->opts);
	if (fx->images_fd >= 0)
		close(fx->images_fd);
	if (fx->dir)
		(void)test_rmtree(fx->dir);
	free(fx->dir);
	free(fx->criu);
	free(fx);
	return 0;
}

static void test_dump_restore_continues(void **state)
{
	struct fixture *fx = *state;
	struct report before, after, later;
	sigset_t usr1, saved_mask;
	uint64_t token;
	int version, status, r;
	pid_t restored;

	TEST_REQUIRE(test_is_root(), "CRIU dump/restore of another process needs root");
	fx->criu = find_criu();
	TEST_REQUIRE(fx->criu,
		     "no criu binary (BELAYER_CRIU or PATH); tools/dev setup installs one");

	assert_int_equal(criu_local_init_opts(&fx->opts), 0);
	assert_int_equal(criu_local_set_service_binary(fx->opts, fx->criu), 0);
	version = criu_local_get_version(fx->opts);
	TEST_REQUIRE(version >= 40000, "%s reports version %d; CRIU >= 4.0 is needed (DESIGN §6)",
		     fx->criu, version);

	fx->dir = test_mkdtemp("belayer-criu");
	assert_non_null(fx->dir);
	snprintf(fx->images, sizeof(fx->images), "%s/images", fx->dir);
	assert_int_equal(mkdir(fx->images, 0700), 0);
	fx->images_fd = open(fx->images, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(fx->images_fd >= 0);

	assert_int_equal(getrandom(&token, sizeof(token), 0), sizeof(token));
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	assert_int_equal(sigprocmask(SIG_BLOCK, &usr1, &saved_mask), 0);
	fx->pid = fork();
	if (fx->pid == 0)
		child_main(fx->dir, token);
	assert_int_equal(sigprocmask(SIG_SETMASK, &saved_mask, NULL), 0);
	assert_true(fx->pid > 0);

	r = request_report(fx->dir, fx->pid, &before);
	assert_int_equal(r, 0);
	assert_true(before.token == token);
	assert_int_equal(before.pid, fx->pid);

	/* Dump; CRIU kills the process afterwards (no leave-running). */
	criu_local_set_pid(fx->opts, fx->pid);
	criu_local_set_images_dir_fd(fx->opts, fx->images_fd);
	criu_local_set_leave_running(fx->opts, false);
	criu_local_set_log_level(fx->opts, 4);
	assert_int_equal(criu_local_set_log_file(fx->opts, "dump.log"), 0);
	r = criu_local_dump(fx->opts);
	if (r < 0)
		print_log(fx->images, "dump.log");
	assert_int_equal(r, 0);

	/* Reap it, so its PID is free for the restore. */
	assert_int_equal(waitpid(fx->pid, &status, 0), fx->pid);
	assert_true(WIFSIGNALED(status));
	fx->pid = -1;

	/* Restore as our child (libcriu's swrk mode with the tree as CRIU's sibling). */
	assert_int_equal(criu_local_set_log_file(fx->opts, "restore.log"), 0);
	criu_local_set_pid(fx->opts, 0);
	restored = criu_local_restore_child(fx->opts);
	if (restored < 0)
		print_log(fx->images, "restore.log");
	assert_true(restored > 0);
	fx->pid = restored;
	assert_int_equal(restored, before.pid);

	/* Same memory (token), the counter carried on from its saved value (a fresh process would
	 * not know the token; a reset would start below), and it keeps running. */
	r = request_report(fx->dir, restored, &after);
	assert_int_equal(r, 0);
	assert_true(after.token == token);
	assert_int_equal(after.pid, before.pid);
	assert_true(after.counter > before.counter);
	r = request_report(fx->dir, restored, &later);
	assert_int_equal(r, 0);
	assert_true(later.counter > after.counter);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_dump_restore_continues, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
