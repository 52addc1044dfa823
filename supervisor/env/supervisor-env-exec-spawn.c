/* SPDX-License-Identifier: MIT */
/*
 * The command of an `env exec` into its environment (see supervisor-env-exec.h for the how
 * and why). Called on the loop thread of a threaded process: everything is allocated before
 * the fork; the helper and the command call only system calls until execve.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "supervisor-env-devices.h"
#include "supervisor-env-exec-spawn.h"
#include "supervisor-env-limits.h"
#include "supervisor-env-sandbox.h"
#include "supervisor-env.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

static const char *const step_names[] = {
	[EXEC_STEP_SETNS] = "joining the environment's namespaces",
	[EXEC_STEP_CLONE] = "starting the command in the environment's cgroup",
	[EXEC_STEP_GO] = "waiting for the cgroups",
	[EXEC_STEP_CGROUPNS] = "joining the cgroup namespace",
	[EXEC_STEP_STDIO] = "setting up stdio",
	[EXEC_STEP_CWD] = "changing to the working directory",
	[EXEC_STEP_SANDBOX] = "entering the sandbox",
	[EXEC_STEP_USER] = "switching user",
	[EXEC_STEP_EXEC] = "executing the command",
};

const char *exec_step_to_string(int step)
{
	return step >= 0 && (size_t)step < ARRAY_SIZE(step_names) && step_names[step]
		       ? step_names[step]
		       : "?";
}

static _Noreturn void fail(int fd, int step)
{
	int msg[2] = {errno, step};

	(void)!write(fd, msg, sizeof(msg));
	_exit(127);
}

/* execvpe's search with system calls only: argv[0] as a path, or each directory of path. */
static void exec_search(const struct exec_spawn *sp)
{
	const char *cmd = sp->argv[0], *dir = sp->path;
	char buf[PATH_MAX];
	int err = ENOENT;

	if (strchr(cmd, '/')) {
		execve(cmd, sp->argv, sp->envp);
		return;
	}
	while (dir && *dir) {
		const char *end = strchr(dir, ':');
		size_t dl = end ? (size_t)(end - dir) : strlen(dir), cl = strlen(cmd);

		if (dl + cl + 2 <= sizeof(buf)) {
			memcpy(buf, dir, dl);
			buf[dl] = '/';
			memcpy(buf + dl + 1, cmd, cl + 1);
			execve(dl ? buf : cmd, sp->argv, sp->envp);
			if (errno != ENOENT && errno != ENOTDIR)
				err = errno; /* EACCES: keep looking, report it */
		}
		dir = end ? end + 1 : NULL;
	}
	errno = err;
}

static _Noreturn void command_main(const struct exec_spawn *sp, int go_fd, int err_fd)
{
	char go;

	if (read(go_fd, &go, 1) != 1)
		fail(err_fd, EXEC_STEP_GO);
	/* After the v1 cgroups: every hierarchy's root is then the environment's cgroup, as it
	 * is for its init (supervisor-env-launch.c). */
	if (sp->ns_flags & CLONE_NEWCGROUP && setns(sp->init_pidfd, CLONE_NEWCGROUP) < 0)
		fail(err_fd, EXEC_STEP_CGROUPNS);
	if (setsid() < 0)
		fail(err_fd, EXEC_STEP_STDIO);
	if (dup2(sp->stdin_fd, 0) < 0 || dup2(sp->out_fd, 1) < 0 || dup2(sp->err_fd, 2) < 0)
		fail(err_fd, EXEC_STEP_STDIO);
	if (chdir(sp->cwd) < 0)
		fail(err_fd, EXEC_STEP_CWD);
	{
		struct sigaction dfl = {.sa_handler = SIG_DFL};
		sigset_t none;

		/* The supervisor ignores SIGPIPE; a command (`yes | head`) must not. */
		for (int sig = 1; sig < _NSIG; sig++)
			(void)sigaction(sig, &dfl, NULL);
		sigemptyset(&none);
		(void)sigprocmask(SIG_SETMASK, &none, NULL);
	}
	if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
		fail(err_fd, EXEC_STEP_STDIO);
	if (env_sandbox_enter(sp->filter) < 0)
		fail(err_fd, EXEC_STEP_SANDBOX);
	/* After the capabilities are cut (CAP_SETUID, CAP_SETGID are kept): a user other than
	 * root ends with none, as under Docker. Root too sets its ids: the supervisor's groups go,
	 * and in an environment with a user namespace the ids become the namespace's own. An
	 * image's user has its groups of the image's /etc/group, as its init has. */
	if (setgroups(sp->n_groups, sp->n_groups ? sp->groups : NULL) < 0 ||
	    setresgid(sp->gid, sp->gid, sp->gid) < 0 || setresuid(sp->uid, sp->uid, sp->uid) < 0)
		fail(err_fd, EXEC_STEP_USER);
	exec_search(sp);
	fail(err_fd, EXEC_STEP_EXEC);
}

static _Noreturn void helper_main(const struct exec_spawn *sp, int go_fd, int err_fd, int pid_fd)
{
	struct clone_args args = {
		.flags = CLONE_PARENT | CLONE_INTO_CGROUP,
		.cgroup = (uint64_t)sp->cgroup_fd,
	};
	int msg[3] = {0, 0, EXEC_STEP_SETNS}; /* pid, errno, step */
	pid_t pid;

	if (setns(sp->init_pidfd, sp->ns_flags & ~CLONE_NEWCGROUP) < 0) {
		msg[1] = errno;
		(void)!write(pid_fd, msg, sizeof(msg));
		_exit(1);
	}
	pid = (pid_t)syscall(SYS_clone3, &args, sizeof(args));
	if (pid == 0) {
		(void)close(pid_fd);
		command_main(sp, go_fd, err_fd);
	}
	msg[0] = pid > 0 ? pid : 0;
	msg[1] = pid > 0 ? 0 : errno;
	msg[2] = EXEC_STEP_CLONE;
	(void)!write(pid_fd, msg, sizeof(msg));
	_exit(0);
}

/* What differs from ours: setns into our own user namespace is refused (EINVAL). */
static int ns_flags_of(pid_t pid)
{
	static const struct {
		const char *name;
		int flag;
	} ns[] = {
		{"mnt", CLONE_NEWNS},	 {"pid", CLONE_NEWPID},	  {"uts", CLONE_NEWUTS},
		{"ipc", CLONE_NEWIPC},	 {"net", CLONE_NEWNET},	  {"cgroup", CLONE_NEWCGROUP},
		{"time", CLONE_NEWTIME}, {"user", CLONE_NEWUSER},
	};
	int flags = 0;

	for (size_t i = 0; i < ARRAY_SIZE(ns); i++) {
		char a[64], b[64];
		struct stat sa, sb;

		snprintf(a, sizeof(a), "/proc/%d/ns/%s", (int)pid, ns[i].name);
		snprintf(b, sizeof(b), "/proc/self/ns/%s", ns[i].name);
		if (stat(a, &sa) < 0)
			return -errno;
		if (stat(b, &sb) < 0 || sa.st_ino != sb.st_ino || sa.st_dev != sb.st_dev)
			flags |= ns[i].flag;
	}
	return flags;
}

int exec_spawn(const struct sv_env *e, struct exec_spawn *sp, pid_t *ret_pid, int *ret_pidfd,
	       char *why, size_t cap)
{
	_cleanup_close_ int pidfd = -1;
	int go[2] = {-1, -1}, er[2] = {-1, -1}, pp[2] = {-1, -1}, msg[3] = {0, 0, 0}, r;
	pid_t helper, pid = 0;
	ssize_t n;

	why[0] = '\0';
	r = ns_flags_of(e->pid);
	if (r < 0)
		return r;
	sp->ns_flags = r;
	if (pipe2(go, O_CLOEXEC) < 0 || pipe2(er, O_CLOEXEC) < 0 || pipe2(pp, O_CLOEXEC) < 0) {
		r = -errno;
		goto out;
	}
	helper = fork();
	if (helper < 0) {
		r = -errno;
		goto out;
	}
	if (helper == 0) {
		(void)close(go[1]);
		(void)close(er[0]);
		(void)close(pp[0]);
		helper_main(sp, go[0], er[1], pp[1]);
	}
	go[0] = safe_close(go[0]);
	er[1] = safe_close(er[1]);
	pp[1] = safe_close(pp[1]);
	do
		n = read(pp[0], msg, sizeof(msg));
	while (n < 0 && errno == EINTR);
	(void)waitpid(helper, NULL, 0);
	if (n != sizeof(msg) || msg[0] <= 0) {
		r = n == sizeof(msg) && msg[1] > 0 ? -msg[1] : -EIO;
		snprintf(why, cap, "%s",
			 exec_step_to_string(n == sizeof(msg) ? msg[2] : EXEC_STEP_CLONE));
		goto out;
	}
	pid = msg[0];
	/* Our child (CLONE_PARENT), not reaped by anyone else: the pid is still its. */
	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0) {
		r = -errno;
		(void)kill(pid, SIGKILL);
		(void)waitpid(pid, NULL, 0);
		goto out;
	}
	r = env_limits_join(e, pid);
	if (r >= 0)
		r = env_devices_join(e, pid);
	if (r < 0 || write(go[1], "g", 1) != 1) {
		r = r < 0 ? r : -errno;
		snprintf(why, cap, "%s", exec_step_to_string(EXEC_STEP_GO));
		(void)kill(pid, SIGKILL);
		(void)waitpid(pid, NULL, 0);
		goto out;
	}
	go[1] = safe_close(go[1]);
	/* EOF: execve happened (the pipe is close-on-exec); a message: the step that failed. */
	do
		n = read(er[0], msg, 2 * sizeof(int));
	while (n < 0 && errno == EINTR);
	if (n == 2 * sizeof(int)) {
		r = -msg[0];
		snprintf(why, cap, "%s", exec_step_to_string(msg[1]));
		(void)waitpid(pid, NULL, 0);
		goto out;
	}
	*ret_pid = pid;
	*ret_pidfd = pidfd;
	pidfd = -1;
	r = 0;
out:
	for (int i = 0; i < 2; i++) {
		(void)safe_close(go[i]);
		(void)safe_close(er[i]);
		(void)safe_close(pp[i]);
	}
	return r;
}
