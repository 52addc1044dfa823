/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "supervisor-env-net.h"
#include "supervisor-env.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* How long slirp4netns may take to make and configure its tap device (a few ms when idle;
 * the build machines run five test suites on two cores). */
#define SLIRP_READY_MS 15000

/* The reaper thread's stack: it only formats a line, but glibc's pthread_create refuses a stack
 * that the process's static TLS and guard page leave too little of (EINVAL): 64 KiB failed
 * every slirp create once the supervisor linked a few more libraries. */
#define REAPER_STACK (256u << 10)

/* The fds slirp4netns gets, in this order from 3 on: --ready-fd, --exit-fd, the namespace. */
enum {
	FD_READY = 3,
	FD_EXIT,
	FD_NETNS,
	_FD_END
};

struct env_net_helper {
	pid_t pid;
	int pidfd;
	int exit_w; /* the write end of its --exit-fd: closing it stops the helper */
	pthread_t reaper;
	atomic_bool stopping;
	char env[ENV_ID_MAX + 1];
};

/* Waits for the helper's exit (and reaps it): one line when nobody asked for it. */
static void *reaper_main(void *userdata)
{
	struct env_net_helper *h = userdata;
	siginfo_t si = {0};

	while (waitid((idtype_t)P_PIDFD, (id_t)h->pidfd, &si, WEXITED) < 0 && errno == EINTR)
		;
	if (atomic_load(&h->stopping))
		return NULL;
	if (si.si_code == CLD_EXITED)
		log_warning("slirp4netns (pid %d) of environment %s exited with status %d: it has "
			    "no egress until it is restored or rebuilt.",
			    (int)h->pid, h->env, si.si_status);
	else
		log_warning(
			"slirp4netns (pid %d) of environment %s was killed by signal %d: it has "
			"no egress until it is restored or rebuilt.",
			(int)h->pid, h->env, si.si_status);
	return NULL;
}

void env_net_stop(struct sv_env *e)
{
	struct env_net_helper *h = e->net_helper;

	if (!h)
		return;
	atomic_store(&h->stopping, true);
	/* A pidfd names the process even once it is reaped: no stray kill of a reused pid. */
	(void)syscall(SYS_pidfd_send_signal, h->pidfd, SIGKILL, NULL, 0);
	(void)pthread_join(h->reaper, NULL);
	(void)close(h->pidfd);
	(void)close(h->exit_w);
	free(h);
	e->net_helper = NULL;
}

/* path: the absolute path of name, searched on PATH when it has no '/'. */
static int find_binary(const char *name, char *path, size_t cap)
{
	const char *dirs = getenv("PATH");

	if (strchr(name, '/')) {
		snprintf(path, cap, "%s", name);
		return access(path, X_OK) < 0 ? -errno : 0;
	}
	for (const char *d = dirs ? dirs : "/usr/local/bin:/usr/bin:/bin"; *d;) {
		size_t n = strcspn(d, ":");

		if (n > 0 && n < cap - strlen(name) - 2) {
			snprintf(path, cap, "%.*s/%s", (int)n, d, name);
			if (access(path, X_OK) == 0)
				return 0;
		}
		d += n;
		if (*d == ':')
			d++;
	}
	return -ENOENT;
}

int env_net_slirp_available(const char *slirp4netns)
{
	char path[PATH_MAX];

	return find_binary(slirp4netns && *slirp4netns ? slirp4netns : "slirp4netns", path,
			   sizeof(path));
}

/* In the forked child of a threaded process: system calls only. fds[i] becomes 3 + i. */
static _Noreturn void helper_exec(const char *path, char *const argv[], int log_fd,
				  const int fds[_FD_END - FD_READY])
{
	sigset_t none;

	/* Every fd given is >= _FD_END (F_DUPFD_CLOEXEC), so no dup2 here clobbers another one
	 * still to move, and each target loses its close-on-exec flag. */
	if (dup2(log_fd, 1) < 0 || dup2(log_fd, 2) < 0)
		_exit(127);
	for (int i = 0; i < _FD_END - FD_READY; i++)
		if (dup2(fds[i], FD_READY + i) < 0)
			_exit(127);
	(void)syscall(SYS_close_range, (unsigned)_FD_END, ~0U, CLOSE_RANGE_CLOEXEC);
	sigemptyset(&none);
	(void)sigprocmask(SIG_SETMASK, &none, NULL);
	(void)setsid();
	execv(path, argv);
	_exit(127);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Reads the "1" slirp4netns writes to --ready-fd once tap0 is configured (bounded). */
static int wait_ready(int fd)
{
	uint64_t deadline = now_ms() + SLIRP_READY_MS;
	char c;

	for (;;) {
		uint64_t now = now_ms();
		ssize_t n;
		int k;

		if (now >= deadline)
			return -ETIMEDOUT;
		k = poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, (int)(deadline - now));
		if (k < 0 && errno != EINTR)
			return -errno;
		if (k <= 0)
			continue;
		n = read(fd, &c, 1);
		if (n == 1)
			return c == '1' ? 0 : -EPROTO;
		if (n == 0)
			return -ECHILD; /* it exited before it was ready */
		if (errno != EINTR && errno != EAGAIN)
			return -errno;
	}
}

int env_net_start(struct sv_env *e, int netns_fd)
{
	_cleanup_close_ int log_fd = -1, ready_r = -1, fd_ready = -1, fd_exit = -1, fd_netns = -1;
	char path[PATH_MAX], log_path[PATH_MAX + 32], netns_arg[32];
	struct env_net_helper *h;
	int rp[2], xp[2], r;
	pid_t pid;

	env_net_stop(e);
	if (e->net != ENV_NET_SLIRP)
		return 0;
	r = find_binary(e->slirp4netns, path, sizeof(path));
	if (r < 0) {
		snprintf(e->error, sizeof(e->error),
			 "no slirp4netns (\"%s\"; [env] slirp4netns) for --net slirp",
			 e->slirp4netns);
		return log_error_errno(r, "Environment %s: %s: %m", e->id, e->error);
	}
	snprintf(log_path, sizeof(log_path), "%s/slirp4netns.log", e->dir);
	log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (log_fd < 0)
		return -errno;
	if (pipe2(rp, O_CLOEXEC) < 0)
		return -errno;
	ready_r = rp[0];
	fd_ready = rp[1];
	if (pipe2(xp, O_CLOEXEC) < 0)
		return -errno;
	fd_exit = xp[0];
	h = calloc(1, sizeof(*h));
	if (!h) {
		(void)close(xp[1]);
		return -ENOMEM;
	}
	h->exit_w = xp[1];
	h->pidfd = -1;
	snprintf(h->env, sizeof(h->env), "%s", e->id);
	/* Above the fds the child moves them to (see helper_exec). */
	{
		int *fds[] = {&fd_ready, &fd_exit, &log_fd};

		for (size_t i = 0; i < ARRAY_SIZE(fds); i++) {
			int k = fcntl(*fds[i], F_DUPFD_CLOEXEC, _FD_END);

			if (k < 0) {
				r = -errno;
				goto fail;
			}
			(void)close(*fds[i]);
			*fds[i] = k;
		}
		fd_netns = fcntl(netns_fd, F_DUPFD_CLOEXEC, _FD_END);
		if (fd_netns < 0) {
			r = -errno;
			goto fail;
		}
	}
	snprintf(netns_arg, sizeof(netns_arg), "/proc/self/fd/%d", FD_NETNS);
	{
		char ready_arg[32], exit_arg[32];
		char *const argv[] = {
			"slirp4netns",
			"--configure",
			"--mtu=65520",
			"--disable-host-loopback",
			"--enable-sandbox",
			"--enable-seccomp",
			ready_arg,
			exit_arg,
			"--netns-type=path",
			netns_arg,
			"tap0",
			NULL,
		};
		const int fds[] = {fd_ready, fd_exit, fd_netns};

		snprintf(ready_arg, sizeof(ready_arg), "--ready-fd=%d", FD_READY);
		snprintf(exit_arg, sizeof(exit_arg), "--exit-fd=%d", FD_EXIT);
		pid = fork();
		if (pid == 0)
			helper_exec(path, argv, log_fd, fds);
	}
	if (pid < 0) {
		r = -errno;
		goto fail;
	}
	h->pid = pid;
	h->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (h->pidfd < 0) {
		r = -errno;
		(void)kill(pid, SIGKILL);
		(void)waitpid(pid, NULL, 0);
		goto fail;
	}
	/* Ours alone now: the write end's EOF tells us it exited before it was ready. */
	(void)close(TAKE_FD(fd_ready));
	r = wait_ready(ready_r);
	if (r < 0) {
		siginfo_t si = {0};

		(void)syscall(SYS_pidfd_send_signal, h->pidfd, SIGKILL, NULL, 0);
		(void)waitid((idtype_t)P_PIDFD, (id_t)h->pidfd, &si, WEXITED);
		(void)close(h->pidfd);
		snprintf(e->error, sizeof(e->error),
			 "slirp4netns did not configure the network (%s; see %s)",
			 r == -ECHILD ? "it exited" : strerror(-r), log_path);
		log_error_errno(r, "Environment %s: %s.", e->id, e->error);
		goto fail;
	}
	{
		pthread_attr_t attr;

		/* One per slirp environment, waiting: a small stack (it only formats a line). */
		r = -pthread_attr_init(&attr);
		if (r >= 0)
			r = -pthread_attr_setstacksize(&attr, REAPER_STACK);
		if (r >= 0)
			r = -pthread_create(&h->reaper, &attr, reaper_main, h);
		(void)pthread_attr_destroy(&attr);
	}
	if (r < 0) {
		(void)syscall(SYS_pidfd_send_signal, h->pidfd, SIGKILL, NULL, 0);
		(void)waitid((idtype_t)P_PIDFD, (id_t)h->pidfd, &(siginfo_t){0}, WEXITED);
		(void)close(h->pidfd);
		goto fail;
	}
	e->net_helper = h;
	log_debug("Environment %s: slirp4netns (pid %d) serves its network.", e->id, (int)pid);
	return 0;
fail:
	(void)close(h->exit_w);
	free(h);
	return r;
}
