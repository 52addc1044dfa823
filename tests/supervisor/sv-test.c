/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sv-test.h"
#include "test-util.h"
#include "util.h"

uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint16_t sv_free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

static void pause_ms(int ms)
{
	(void)poll(NULL, 0, ms);
}

void sv_setup(struct sv *sv)
{
	memset(sv, 0, sizeof(*sv));
	sv->dir = test_mkdtemp("belayer-sv");
	assert_non_null(sv->dir);
	snprintf(sv->sock, sizeof(sv->sock), "%s/run/supervisor.sock", sv->dir);
	snprintf(sv->state, sizeof(sv->state), "%s/state", sv->dir);
	snprintf(sv->emu_dir, sizeof(sv->emu_dir), "%s/emu", sv->dir);
	assert_int_equal(mkdir(sv->emu_dir, 0755), 0);
	/* This process, the supervisor and the workers share one emulated-GPU run. */
	setenv("BELAYER_EMU_DIR", sv->emu_dir, 1);
	setenv("LD_LIBRARY_PATH", EMU_LIB_DIR, 1);
	setenv("BELAYER_SOCKET", sv->sock, 1);
}

void sv_teardown(struct sv *sv)
{
	if (sv->pid > 0)
		(void)sv_kill(sv, SIGKILL);
	if (sv->dir) {
		(void)test_rmtree(sv->dir);
		free(sv->dir);
	}
	sv->dir = NULL;
}

static bool answers(const struct sv *sv)
{
	struct proto_msg m[4];

	return ctl_collect(sv, CTL_CONFIG, 0, CTL_ACT_NONE, -1, m, 0) >= 0;
}

/* In the child: fds[i] becomes fd 3 + i, announced as systemd does (LISTEN_FDS, LISTEN_PID,
 * LISTEN_FDNAMES). */
static void pass_fds(const int *fds, const char *const *names, size_t n)
{
	char buf[64], all[8192] = "";
	int high[256];

	if (n == 0 || n > ARRAY_SIZE(high))
		return;
	/* Out of the way first: a stored fd may already sit where another one must go. */
	for (size_t i = 0; i < n; i++)
		high[i] = fcntl(fds[i], F_DUPFD, 1000);
	for (size_t i = 0; i < n; i++) {
		dup2(high[i], 3 + (int)i);
		close(high[i]);
		if (i)
			strncat(all, ":", sizeof(all) - strlen(all) - 1);
		strncat(all, names[i], sizeof(all) - strlen(all) - 1);
	}
	snprintf(buf, sizeof(buf), "%zu", n);
	setenv("LISTEN_FDS", buf, 1);
	snprintf(buf, sizeof(buf), "%d", getpid());
	setenv("LISTEN_PID", buf, 1);
	setenv("LISTEN_FDNAMES", all, 1);
}

void sv_start(struct sv *sv, const char *const *settings)
{
	sv_start_with_fds(sv, settings, NULL, NULL, 0);
}

void sv_start_with_fds(struct sv *sv, const char *const *settings, const int *fds,
		       const char *const *names, size_t n_fds)
{
	const char *argv[64] = {SUPERVISOR_PATH, "--config", "/dev/null",
				"--socket",	 sv->sock,   "--state-dir",
				sv->state,	 "-o",	     "health.interval=0"};
	size_t n = 9;
	uint64_t deadline;
	int status;

	for (size_t i = 0; settings && settings[i]; i++) {
		assert_true(n + 3 < ARRAY_SIZE(argv));
		argv[n++] = "-o";
		argv[n++] = settings[i];
	}
	argv[n] = NULL;
	sv->pid = fork();
	assert_true(sv->pid >= 0);
	if (sv->pid == 0) {
		pass_fds(fds, names, n_fds);
		execv(argv[0], (char **)argv);
		_exit(127);
	}
	deadline = mono_ms() + SV_WAIT_MS;
	while (!answers(sv)) {
		if (waitpid(sv->pid, &status, WNOHANG) == sv->pid) {
			sv->pid = 0;
			fail_msg("the supervisor exited during startup (status %d)", status);
		}
		if (mono_ms() > deadline)
			fail_msg("the supervisor did not answer within %d ms", SV_WAIT_MS);
		pause_ms(10);
	}
	/* Startup's GPU check (NVML loading) runs off the loop; a health request queues behind it,
	 * so once it is answered the daemon has settled (its fds, for one). */
	{
		struct proto_msg m[8];

		assert_true(ctl_collect(sv, CTL_HEALTH, 0, CTL_ACT_NONE, -1, m, 8) > 0);
	}
}

int sv_kill(struct sv *sv, int sig)
{
	int status = 0;

	if (sv->pid <= 0)
		return -1;
	(void)kill(sv->pid, sig);
	status = test_reap_within(sv->pid, SV_EXIT_MS, "the supervisor");
	sv->pid = 0;
	return status;
}

int sv_count_fds(const struct sv *sv)
{
	char path[64], link[PATH_MAX];
	struct dirent *e;
	DIR *d;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", sv->pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		ssize_t len;

		if (e->d_name[0] == '.')
			continue;
		len = readlinkat(dirfd(d), e->d_name, link, sizeof(link) - 1);
		if (len < 0)
			continue;
		link[len] = '\0';
		/* Connections come and go asynchronously (and have their own metric). */
		if (strncmp(link, "socket:", 7) != 0)
			n++;
	}
	closedir(d);
	return n;
}

bool sv_wait_fds(const struct sv *sv, int want)
{
	uint64_t deadline = mono_ms() + SV_WAIT_MS;

	while (mono_ms() < deadline) {
		if (sv_count_fds(sv) == want)
			return true;
		pause_ms(10);
	}
	/* Say which, for whoever reads the failure. */
	{
		char cmd[128];

		fprintf(stderr, "supervisor fds (want %d non-socket ones):\n", want);
		snprintf(cmd, sizeof(cmd), "ls -l /proc/%d/fd >&2", sv->pid);
		(void)!system(cmd);
	}
	return false;
}

void worker_start(struct worker *w, const struct sv *sv, const char *engine, const char *scenario)
{
	int in[2], out[2];
	uint64_t deadline = mono_ms() + SV_WAIT_MS;
	size_t len = 0;

	(void)sv;
	memset(w, 0, sizeof(*w));
	assert_int_equal(pipe2(in, O_CLOEXEC), 0);
	assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	w->pid = fork();
	assert_true(w->pid >= 0);
	if (w->pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		setenv("LD_PRELOAD", SHIM_PATH, 1);
		setenv("BELAYER_ENGINE_ID", engine, 1);
		execl(WORKLOAD_PATH, WORKLOAD_PATH, scenario, (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	w->in = in[1];
	w->out = out[0];
	/* Its "ok ..." line: the allocations are made (announced or queued). */
	while (!memchr(w->line, '\n', len)) {
		struct pollfd p = {.fd = w->out, .events = POLLIN};
		ssize_t n;

		if (mono_ms() > deadline)
			fail_msg("worker %s printed nothing", scenario);
		if (poll(&p, 1, 100) <= 0)
			continue;
		n = read(w->out, w->line + len, sizeof(w->line) - 1 - len);
		if (n <= 0)
			fail_msg("worker %s exited early", scenario);
		len += (size_t)n;
		w->line[len] = '\0';
	}
	assert_true(strncmp(w->line, "ok", 2) == 0);
}

int worker_kill(struct worker *w, int sig)
{
	int status = 0;

	(void)kill(w->pid, sig);
	status = test_reap_within(w->pid, SV_EXIT_MS, "a worker");
	w->pid = 0;
	worker_end(w);
	return status;
}

void worker_end(struct worker *w)
{
	w->in = safe_close(w->in);
	w->out = safe_close(w->out);
	if (w->pid > 0) {
		(void)test_reap_within(w->pid, SV_EXIT_MS, "a worker whose pipes are closed");
		w->pid = 0;
	}
}

int client_connect(const struct sv *sv)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	memcpy(sa.sun_path, sv->sock, strlen(sv->sock));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int r = -errno;

		close(fd);
		return r;
	}
	return fd;
}

int client_hello(const struct sv *sv, const char *engine)
{
	struct proto_msg m = {.type = PROTO_HELLO};
	int fd = client_connect(sv);

	if (fd < 0)
		return fd;
	m.hello.pid = (uint32_t)getpid();
	snprintf(m.hello.engine_id, sizeof(m.hello.engine_id), "%s", engine);
	m.hello.role = ROLE_SHADOW;
	m.hello.rank = 0;
	assert_int_equal(proto_send(fd, &m, 0), 0);
	return fd;
}

int client_recv(int fd, struct proto_msg *m, int timeout_ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	int r = poll(&p, 1, timeout_ms);

	if (r == 0)
		return -ETIMEDOUT;
	if (r < 0)
		return -errno;
	return proto_recv(fd, m, 0);
}

int ctl_collect(const struct sv *sv, enum ctl_cmd cmd, uint32_t pid, enum ctl_action act,
		int32_t dev, struct proto_msg *ret, size_t max)
{
	struct proto_msg m = {.type = PROTO_CTL};
	int fd = client_connect(sv), n = 0, r;

	if (fd < 0)
		return fd;
	m.ctl.cmd = cmd;
	m.ctl.pid = pid;
	m.ctl.act = act;
	m.ctl.dev = dev;
	r = proto_send(fd, &m, 0);
	while (r == 0) {
		r = client_recv(fd, &m, SV_WAIT_MS);
		if (r < 0)
			break;
		if (m.type == PROTO_END)
			break;
		if (m.type == PROTO_ERROR) {
			r = -m.error.code;
			break;
		}
		if ((size_t)n < max)
			ret[n] = m;
		n++;
	}
	close(fd);
	return r < 0 ? r : n;
}

int count_regions(const struct sv *sv, pid_t pid, int state)
{
	static struct proto_msg m[1024];
	int n = ctl_collect(sv, CTL_REGIONS, (uint32_t)pid, CTL_ACT_NONE, -1, m, ARRAY_SIZE(m)),
	    count = 0;

	if (n < 0)
		return n;
	for (int i = 0; i < MIN(n, (int)ARRAY_SIZE(m)); i++)
		count += state < 0 || m[i].region_info.state == (enum region_state)state;
	return count;
}

uint64_t metric(const struct sv *sv, const char *name, const char *labels)
{
	static struct proto_msg m[1024];
	int n = ctl_collect(sv, CTL_STATUS, 0, CTL_ACT_NONE, -1, m, ARRAY_SIZE(m));

	assert_true(n > 0);
	for (int i = 0; i < MIN(n, (int)ARRAY_SIZE(m)); i++)
		if (strcmp(m[i].metric.name, name) == 0 && strcmp(m[i].metric.labels, labels) == 0)
			return m[i].metric.value;
	fail_msg("no metric %s{%s}", name, labels);
	return 0;
}

bool wait_regions(const struct sv *sv, pid_t pid, int state, int want)
{
	uint64_t deadline = mono_ms() + SV_WAIT_MS;

	while (mono_ms() < deadline) {
		if (count_regions(sv, pid, state) == want)
			return true;
		pause_ms(10);
	}
	return false;
}

int run_tool(const struct sv *sv, const char *const *argv, char **ret_out)
{
	int out[2], status;
	char *buf = NULL;
	size_t len = 0, cap = 0;
	pid_t pid;

	(void)sv;
	assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(out[1], 1);
		execv(argv[0], (char **)argv);
		_exit(127);
	}
	close(out[1]);
	for (uint64_t deadline = mono_ms() + TOOL_WAIT_MS;;) {
		struct pollfd pfd = {.fd = out[0], .events = POLLIN};
		ssize_t n;

		if (len + 4096 > cap) {
			cap = cap ? cap * 2 : 8192;
			buf = realloc(buf, cap);
			assert_non_null(buf);
		}
		if (poll(&pfd, 1, 100) == 0) {
			if (mono_ms() < deadline)
				continue;
			buf[len] = '\0';
			print_message("%s wrote, in %d ms:\n%s\n", argv[0], TOOL_WAIT_MS, buf);
			/* fails the test, naming where it waits */
			(void)test_reap_within(pid, 0, argv[0]);
		}
		n = read(out[0], buf + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(out[0]);
	buf = buf ? buf : malloc(1);
	buf[len] = '\0';
	status = test_reap_within(pid, SV_EXIT_MS, argv[0]);
	if (ret_out)
		*ret_out = buf;
	else
		free(buf);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
