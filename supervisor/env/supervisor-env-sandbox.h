/* SPDX-License-Identifier: MIT */
/*
 * What an environment's init gives up before it runs the agent's command (issue 19): a
 * network namespace with loopback only, capabilities cut to a set smaller than Docker's
 * default, no_new_privs, and a seccomp filter that allows what ordinary programs need and
 * refuses the rest, at least as strict as Docker's default profile (supervisor-env-seccomp.c).
 *
 * The filter is compiled once in the supervisor (libseccomp allocates) and installed in the
 * child with plain system calls: the child of clone3 in a threaded process must not call
 * malloc.
 */
#pragma once

#include <linux/filter.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The capabilities an environment keeps (a bit per CAP_*): Docker's default set less
 * CAP_MKNOD (no device node may be created, whatever the devices controller says) and
 * CAP_NET_RAW (no raw or packet sockets). */
uint64_t env_sandbox_caps(void);

/* The compiled seccomp filter, built at the first call. NULL with errno set on failure. */
const struct sock_fprog *env_sandbox_filter(void);

/* A new network namespace with loopback up (what a restore gives an environment whose own
 * was external to its dump): an fd of it, or -errno. Moves only the calling thread, and
 * back. */
int env_sandbox_netns_new(void);
/* The inode of pid's network namespace when it is not ours (0: ours, or unknown). */
uint64_t env_sandbox_netns_of(pid_t pid);

/* What pid lacks of an environment's sandbox (an adopted environment's runtime made it):
 * "" when nothing, else a comma-separated list ("shares the supervisor's network namespace,
 * no seccomp filter, ..."). */
void env_sandbox_report(pid_t pid, char *buf, size_t cap);

/* In the child, in its new network namespace: brings loopback up. 0 or -1 with errno. */
int env_sandbox_loopback_up(void);
/* In the child, last thing before execve: drops every capability outside env_sandbox_caps()
 * from the bounding, permitted, effective, inheritable and ambient sets, sets no_new_privs
 * and installs filter. 0 or -1 with errno; only system calls. */
int env_sandbox_enter(const struct sock_fprog *filter);
