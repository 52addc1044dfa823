/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <grp.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include "supervisor-env-sandbox.h"
#include "util.h"
#include "supervisor-env-userns.h"
#include "supervisor-env.h"

int env_userns_map(pid_t pid, uint32_t base)
{
	char path[64], map[64];
	int r;

	snprintf(map, sizeof(map), "0 %u %u\n", base, ENV_USERNS_IDS);
	snprintf(path, sizeof(path), "/proc/%d/uid_map", (int)pid);
	r = env_write_file(path, map);
	if (r < 0)
		return r;
	/* setgroups stays allowed (we write the map with CAP_SETGID): su, apt's sandbox user
	 * and the like drop their groups */
	snprintf(path, sizeof(path), "/proc/%d/gid_map", (int)pid);
	return env_write_file(path, map);
}

int env_userns_enter(int ask_fd, int go_fd)
{
	int ask[2] = {0, 0};
	char go;

	if (unshare(CLONE_NEWUSER) < 0)
		return -1;
	if (write(ask_fd, ask, sizeof(ask)) != sizeof(ask))
		return -1;
	if (read(go_fd, &go, 1) != 1) {
		errno = EPIPE;
		return -1;
	}
	if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
		return -1;
	/* CRIU dumps a tree in a user namespace only when its other namespaces belong to that
	 * one (it checks that root there can setns into each): new ones, made from here. The
	 * mount namespace is a copy of the one real root set up, its mounts locked together (no
	 * unmount reveals what is below); the network namespace a new one, loopback only. */
	if (unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWCGROUP) < 0)
		return -1;
	return env_sandbox_loopback_up();
}

#define USERNS_MARK "belayer-userns"

int env_userns_mark(int criufd, uint32_t base)
{
	char text[16];
	int fd = openat(criufd, USERNS_MARK, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	int n = snprintf(text, sizeof(text), "%u\n", base), r = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, text, (size_t)n) != n)
		r = -errno;
	if (close(fd) < 0 && r == 0)
		r = -errno;
	return r;
}

uint32_t env_userns_marked(int criufd)
{
	char text[16] = "";
	unsigned long v;
	char *end;
	ssize_t n;
	int fd = openat(criufd, USERNS_MARK, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return 0;
	n = read(fd, text, sizeof(text) - 1);
	(void)close(fd);
	if (n <= 0)
		return 0;
	text[n] = '\0';
	errno = 0;
	v = strtoul(text, &end, 10);
	if (errno || end == text || *end != '\n' || v == 0 || v > UINT32_MAX - ENV_USERNS_IDS)
		return 0;
	return (uint32_t)v;
}

int env_userns_ns(uint32_t base)
{
	struct clone_args args = {.flags = CLONE_NEWUSER, .exit_signal = SIGCHLD};
	int ns = -1, r;
	char path[64];
	pid_t pid;

	/* A user namespace with the environment's map, held by a child until we hold its fd;
	 * then the child is killed. Not a pipe's EOF: a child cloned meanwhile by another thread
	 * (another environment's create) inherits the write end, and two such children would
	 * wait for each other for ever. */
	pid = (pid_t)syscall(SYS_clone3, &args, sizeof(args));
	if (pid == 0) {
		for (;;)
			pause();
	}
	r = pid < 0 ? -errno : env_userns_map(pid, base);
	if (r >= 0) {
		snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)pid);
		ns = open(path, O_RDONLY | O_CLOEXEC);
		r = ns < 0 ? -errno : 0;
	}
	if (pid > 0) {
		(void)kill(pid, SIGKILL);
		(void)waitpid(pid, NULL, 0);
	}
	return r < 0 ? r : ns;
}

int env_userns_idmap(const char *dir, int ns)
{
	struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP, .userns_fd = (uint64_t)ns};
	int tree, r;

	/* the map is read from ns when the mount is made; ns may go after */
	tree = open_tree(AT_FDCWD, dir, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
	if (tree < 0)
		return -errno;
	if (mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof(attr)) < 0) {
		r = -errno;
		(void)close(tree);
		return r;
	}
	return tree;
}

int env_userns_idmapped(const char *dir, uint32_t base)
{
	_cleanup_close_ int ns = env_userns_ns(base);

	return ns < 0 ? ns : env_userns_idmap(dir, ns);
}
