/* SPDX-License-Identifier: MIT */
/* Starting an `env exec` command inside its environment (supervisor-env-exec.h). Private to
 * supervisor/env/. */
#pragma once

#include <linux/filter.h>
#include <stddef.h>
#include <sys/types.h>

struct sv_env;

enum exec_step {
	EXEC_STEP_SETNS,
	EXEC_STEP_CLONE,
	EXEC_STEP_GO,
	EXEC_STEP_CGROUPNS,
	EXEC_STEP_STDIO,
	EXEC_STEP_CWD,
	EXEC_STEP_SANDBOX,
	EXEC_STEP_USER,
	EXEC_STEP_EXEC,
};

/* Everything the helper and the command need, made before the fork. */
struct exec_spawn {
	char *const *argv, *const *envp;
	const char *path; /* PATH to search argv[0] in (from envp) */
	const char *cwd;
	uid_t uid;
	gid_t gid;
	int init_pidfd, cgroup_fd;
	int stdin_fd, out_fd, err_fd; /* the command's 0, 1, 2 */
	const struct sock_fprog *filter;
	int ns_flags;	     /* set by exec_spawn */
	const gid_t *groups; /* supplementary groups (an image's user's); none when n_groups 0 */
	size_t n_groups;
};

const char *exec_step_to_string(int step);

/* Starts sp's command in e: its pid (in our namespace) and a pidfd of it, our child. On
 * failure -errno and, when a step failed, its name in why. */
int exec_spawn(const struct sv_env *e, struct exec_spawn *sp, pid_t *ret_pid, int *ret_pidfd,
	       char *why, size_t cap);
