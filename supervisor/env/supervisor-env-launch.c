/* SPDX-License-Identifier: MIT */
/*
 * Starts an environment's init the way DESIGN §6 verified CRIU can checkpoint it: clone3 into
 * its cgroup with new pid/mount/uts/ipc/network namespaces (the network's: loopback only, plus
 * slirp4netns's tap0 for ENV_NET_SLIRP, started before the init runs anything; none for
 * ENV_NET_HOST); inside, the overlay becomes the root
 * (pivot_root), host /usr and /etc are bind-mounted read-only (CRIU's externals; of /etc, what
 * an unprivileged host user could not read is masked: supervisor-env-etc.h), /dev is a tmpfs
 * of its own and /proc its pid namespace's; a new session; stdio on /dev/null and no
 * other fd (CRIU refuses an fd that points outside the environment); last, the sandbox of
 * supervisor-env-sandbox.h (capabilities, no_new_privs, seccomp). With [env] userns, before
 * its stdio the init enters a user namespace of its own and new namespaces made from it
 * (supervisor-env-userns.h), its /dev nodes are the host's bind-mounted and its base an
 * idmapped lower layer.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "supervisor-env-devices.h"
#include "supervisor-env-etc.h"
#include "supervisor-env-limits.h"
#include "supervisor-env-net.h"
#include "supervisor-env-sandbox.h"
#include "supervisor-env-userns.h"
#include "supervisor-env.h"
#include "supervisor-env-image.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

int env_write_file(const char *path, const char *text)
{
	_cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
	size_t n = strlen(text);

	if (fd < 0)
		return -errno;
	if (write(fd, text, n) != (ssize_t)n)
		return -errno;
	return 0;
}

int env_mount_overlay(const struct sv_env *e)
{
	_cleanup_close_ int lower = -1, upper = -1, work = -1;
	char opts[128];

	if (e->image[0])
		return env_image_mount(e);
	/* With [env] userns the base is idmapped, its ids those the environment sees */
	lower = e->userns_base ? env_userns_idmapped(e->base, e->userns_base)
			       : open(e->base, O_PATH | O_DIRECTORY | O_CLOEXEC);
	upper = open(e->upper, O_PATH | O_DIRECTORY | O_CLOEXEC);
	work = open(e->work, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (lower < 0 || upper < 0 || work < 0)
		return log_debug_errno(lower < 0 && e->userns_base ? lower : -errno,
				       "Failed to open the layers of %s: %m", e->id);
	/* Through our fds: the options an environment reads in its /proc/self/mountinfo name no
	 * host path of the supervisor's (its state directory, the base). */
	snprintf(opts, sizeof(opts),
		 "lowerdir=/proc/self/fd/%d,upperdir=/proc/self/fd/%d,workdir=/proc/self/fd/%d",
		 lower, upper, work);
	if (mount("overlay", e->root, "overlay", 0, opts) < 0)
		return log_debug_errno(-errno, "Failed to mount the overlay of %s: %m", e->id);
	/* Private: the environment's mount events stay in its namespace and ours in ours. */
	if (mount(NULL, e->root, NULL, MS_PRIVATE, NULL) < 0)
		return -errno;
	return 0;
}

/* In the child: a failure is reported through the pipe as an errno and a step. */
static _Noreturn void child_fail(int pipe_fd, int step)
{
	int msg[2] = {errno, step};

	(void)!write(pipe_fd, msg, sizeof(msg));
	_exit(127);
}

static int mkdir_in(const char *root, const char *dir, mode_t mode)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/%s", root, dir);
	if (mkdir(path, mode) < 0 && errno != EEXIST)
		return -1;
	return 0;
}

static int bind_ro(const char *root, const char *dir)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s%s", root, dir);
	if (mount(dir, path, NULL, MS_BIND, NULL) < 0)
		return -1;
	return mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
		     NULL);
}

/* A node of /dev: made, or with [env] userns the host's bind-mounted on an empty file (CRIU
 * restores a tmpfs's content from inside the user namespace, where mknod is refused; a bind
 * mount is external to the dump, sv_criu_dump's dev_bind). */
static int dev_node(const char *path, const char *name, unsigned major, unsigned minor, bool bind)
{
	char host[64];
	int fd;

	if (!bind)
		return mknod(path, S_IFCHR | 0666, makedev(major, minor)) < 0 ? -1
									      : chmod(path, 0666);
	fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
	if (fd < 0)
		return -1;
	(void)close(fd);
	snprintf(host, sizeof(host), "/dev/%s", name);
	return mount(host, path, NULL, MS_BIND, NULL);
}

static int make_at(const char *root, const char *name, const char *target, mode_t mode)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/dev/%s", root, name);
	if ((target ? symlink(target, path) : mkdir(path, mode)) < 0 && errno != EEXIST)
		return -1;
	return target ? 0 : chmod(path, mode);
}

/* /dev: a tmpfs of its own; with [env] userns the overlay's own directory (so that no device
 * node is in a tmpfs CRIU dumps), its /dev/shm a tmpfs. */
static int make_dev(const char *root, bool bind)
{
	static const struct {
		const char *name;
		unsigned major, minor;
	} nodes[] = {
		{"null", 1, 3},	  {"zero", 1, 5},    {"full", 1, 7},
		{"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0},
	};
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/dev", root);
	if (!bind && mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=1m") < 0)
		return -1;
	for (size_t i = 0; i < ARRAY_SIZE(nodes); i++) {
		snprintf(path, sizeof(path), "%s/dev/%s", root, nodes[i].name);
		if (dev_node(path, nodes[i].name, nodes[i].major, nodes[i].minor, bind) < 0)
			return -1;
	}
	if (make_at(root, "fd", "/proc/self/fd", 0) < 0 || make_at(root, "shm", NULL, 01777) < 0)
		return -1;
	snprintf(path, sizeof(path), "%s/dev/shm", root);
	if (bind && mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
			  "mode=1777,size=64m") < 0)
		return -1;
	/* Terminals of its own (a private devpts instance: the host's ptys are not there), for
	 * the tools an agent runs under a pty. */
	snprintf(path, sizeof(path), "%s/dev/pts", root);
	if (make_at(root, "pts", NULL, 0755) < 0 ||
	    mount("devpts", path, "devpts", MS_NOSUID | MS_NOEXEC,
		  "newinstance,ptmxmode=0666,mode=0620") < 0)
		return -1;
	return make_at(root, "ptmx", "pts/ptmx", 0);
}

/* /proc as Docker leaves it to a container: what reaches the host's kernel state read-only
 * (a root without CAP_SYS_ADMIN may still write /proc/sys/kernel/core_pattern, a command the
 * host's kernel runs), what leaks it masked (a file by /dev/null, a directory by an empty
 * read-only tmpfs). Paths this kernel lacks are skipped. */
static int mask_proc(const char *root)
{
	static const char *const read_only[] = {"bus", "fs", "irq", "sys", "sysrq-trigger"};
	static const char *const masked[] = {"asound",	    "acpi",	     "kcore",
					     "keys",	    "latency_stats", "timer_list",
					     "timer_stats", "sched_debug",   "scsi"};
	char path[PATH_MAX], null[PATH_MAX];
	struct stat st;

	snprintf(null, sizeof(null), "%s/dev/null", root);
	for (size_t i = 0; i < ARRAY_SIZE(read_only); i++) {
		snprintf(path, sizeof(path), "%s/proc/%s", root, read_only[i]);
		if (stat(path, &st) < 0)
			continue;
		if (mount(path, path, NULL, MS_BIND | MS_REC, NULL) < 0 ||
		    mount(NULL, path, NULL,
			  MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
			  NULL) < 0)
			return -1;
	}
	for (size_t i = 0; i < ARRAY_SIZE(masked); i++) {
		snprintf(path, sizeof(path), "%s/proc/%s", root, masked[i]);
		if (stat(path, &st) < 0)
			continue;
		if (S_ISDIR(st.st_mode) ? mount("tmpfs", path, "tmpfs", MS_RDONLY, "size=0")
					: mount(null, path, NULL, MS_BIND, NULL))
			return -1;
	}
	return 0;
}

static _Noreturn void child_main(const struct sv_env *e, const struct sock_fprog *filter, int go_fd,
				 int pipe_fd, const struct env_image_run *image,
				 const struct env_etc_masks *etc)
{
	char *const envp[] = {"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/root",
			      "LANG=C.UTF-8", NULL};
	const char *cmd = e->cmd[0] ? e->cmd : "exec sleep infinity";
	char *const argv[] = {"sh", "-c", (char *)cmd, NULL};
	char path[PATH_MAX];
	int null;

	char go;

	/* The parent moves us into the v1 cgroups of the limits first; the cgroup namespace is
	 * made after, so that every hierarchy's root is the environment's own cgroup. */
	if (read(go_fd, &go, 1) != 1)
		child_fail(pipe_fd, 15);
	if (!e->userns_base)
		(void)close(go_fd);
	if (unshare(CLONE_NEWCGROUP) < 0)
		child_fail(pipe_fd, 16);
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		child_fail(pipe_fd, 1);
	if (e->net != ENV_NET_HOST && env_sandbox_loopback_up() < 0)
		child_fail(pipe_fd, 12);
	if ((!image &&
	     (mkdir_in(e->root, "usr", 0755) < 0 || mkdir_in(e->root, "etc", 0755) < 0)) ||
	    mkdir_in(e->root, "dev", 0755) < 0 || mkdir_in(e->root, "proc", 0555) < 0)
		child_fail(pipe_fd, 2);
	/* an image brings its own /usr and /etc */
	if (!image && (bind_ro(e->root, "/usr") < 0 || bind_ro(e->root, "/etc") < 0))
		child_fail(pipe_fd, 3);
	if (make_dev(e->root, e->userns_base != 0) < 0)
		child_fail(pipe_fd, 4);
	snprintf(path, sizeof(path), "%s/proc", e->root);
	if (mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
		child_fail(pipe_fd, 5);
	if (mask_proc(e->root) < 0)
		child_fail(pipe_fd, 14);
	if (!image && env_etc_mask(e->root, etc) < 0)
		child_fail(pipe_fd, 17);
	if (chdir(e->root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 ||
	    umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
		child_fail(pipe_fd, 6);
	if (sethostname(e->id, strlen(e->id)) < 0)
		child_fail(pipe_fd, 7);
	if (setsid() < 0)
		child_fail(pipe_fd, 8);
	/* before any fd of a file: its mount must be one of the namespace CRIU dumps */
	if (e->userns_base && env_userns_enter(pipe_fd, go_fd) < 0)
		child_fail(pipe_fd, 18);
	null = open("/dev/null", O_RDWR);
	if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
		child_fail(pipe_fd, 9);
	if (null > 2)
		(void)close(null);
	/* Everything else closes at exec; the pipe too, which tells the parent exec happened. */
	if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
		child_fail(pipe_fd, 10);
	{
		sigset_t all;

		sigemptyset(&all);
		(void)sigprocmask(SIG_SETMASK, &all, NULL);
	}
	if (env_sandbox_enter(filter) < 0)
		child_fail(pipe_fd, 13);
	if (image) {
		(void)env_image_exec(image);
		child_fail(pipe_fd, 17);
	}
	execve("/bin/sh", argv, envp);
	child_fail(pipe_fd, 11);
}

int env_launch(struct sv_env *e)
{
	_cleanup_close_ int cg = -1, rd = -1, go = -1;
	struct clone_args args = {
		.flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET |
			 CLONE_INTO_CGROUP,
		.exit_signal = SIGCHLD,
	};
	const struct sock_fprog *filter = env_sandbox_filter();
	_cleanup_(env_image_run_finish) struct env_image_run image = {0};
	_cleanup_(env_etc_masks_finish) struct env_etc_masks etc = {0};
	int p[2], g[2], msg[2], r;
	ssize_t n;
	pid_t pid;

	if (!filter)
		return -errno;
	/* Once per launch: a host file whose mode changed since the last one is seen (a scan of
	 * Debian's /etc takes about a millisecond; README "Sandbox"). An image's environment has
	 * its own /etc, not the host's: nothing to hide. */
	r = e->image[0] ? 0 : env_etc_scan("/etc", &etc);
	if (r < 0)
		return log_error_errno(r,
				       "Refusing to start environment %s: cannot tell what to "
				       "hide of the host's /etc: %m",
				       e->id);
	if (e->net == ENV_NET_HOST)
		args.flags &= ~(uint64_t)CLONE_NEWNET;
	/* The environment's root owns its root directory (the upper layer's) */
	if (e->userns_base && chown(e->root, e->userns_base, e->userns_base) < 0)
		return log_debug_errno(-errno, "Failed to give %s to uid %" PRIu32 ": %m", e->root,
				       e->userns_base);
	cg = open(e->cgroup, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (cg < 0)
		return log_debug_errno(-errno, "Failed to open cgroup %s: %m", e->cgroup);
	args.cgroup = (uint64_t)cg;
	if (e->image[0]) {
		r = env_image_run_prepare(e, &image);
		if (r < 0)
			return r;
	}
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	if (pipe2(g, O_CLOEXEC) < 0) {
		r = -errno;
		(void)close(p[0]);
		(void)close(p[1]);
		return r;
	}
	pid = (pid_t)syscall(SYS_clone3, &args, sizeof(args));
	if (pid == 0) {
		(void)close(p[0]);
		(void)close(g[1]);
		child_main(e, filter, g[0], p[1], e->image[0] ? &image : NULL, &etc);
	}
	(void)close(p[1]);
	(void)close(g[0]);
	rd = p[0];
	go = g[1];
	if (pid < 0)
		return log_debug_errno(-errno, "clone3 for environment %s failed: %m", e->id);
	r = env_limits_join(e, pid);
	if (r >= 0)
		r = env_devices_join(e, pid);
	/* Its egress is there before its command runs. */
	if (r >= 0 && e->net == ENV_NET_SLIRP) {
		char ns[64];
		_cleanup_close_ int netns = -1;

		snprintf(ns, sizeof(ns), "/proc/%d/ns/net", (int)pid);
		netns = open(ns, O_RDONLY | O_CLOEXEC);
		r = netns < 0 ? -errno : env_net_start(e, netns);
	}
	if (r < 0 || write(go, "g", 1) != 1) {
		r = r < 0 ? r : -errno;
		env_net_stop(e);
		(void)kill(pid, SIGKILL);
		(void)waitpid(pid, NULL, 0);
		return r;
	}
	do
		n = read(rd, msg, sizeof(msg));
	while (n < 0 && errno == EINTR);
	/* {0, 0}: the child is in its user namespace and waits for its maps */
	if (n == sizeof(msg) && msg[0] == 0 && msg[1] == 0) {
		r = env_userns_map(pid, e->userns_base);
		if (r < 0 || write(go, "m", 1) != 1) {
			r = r < 0 ? r : -errno;
			(void)kill(pid, SIGKILL);
			(void)waitpid(pid, NULL, 0);
			return log_debug_errno(r, "Failed to map the user namespace of %s: %m",
					       e->id);
		}
		do
			n = read(rd, msg, sizeof(msg));
		while (n < 0 && errno == EINTR);
	}
	if (n == sizeof(msg)) {
		env_net_stop(e);
		(void)waitpid(pid, NULL, 0);
		return log_debug_errno(-msg[0], "Environment %s failed to start (step %d): %m",
				       e->id, msg[1]);
	}
	e->pid = pid;
	return 0;
}
