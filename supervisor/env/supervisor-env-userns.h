/* SPDX-License-Identifier: MIT */
/*
 * [env] userns (issue 19): an environment's processes in a user namespace of their own, whose
 * root is an unprivileged host uid and gid (base, ENV_USERNS_IDS of them from there), so that
 * what escapes the other namespaces is nobody on the host.
 *
 * The init enters it last, before its stdio and its sandbox: real root makes its mount
 * namespace first (overlay root, /usr, /etc, /dev, /proc and its masks); then the init
 * unshares the user namespace, the supervisor writes the maps, and the init makes new mount,
 * uts, ipc, network and cgroup namespaces from inside it, because CRIU dumps a tree in a user
 * namespace only when those belong to it. The copied mounts are locked together; the pid
 * namespace stays the host's user namespace's. What root in the environment could do in its
 * own namespaces the sandbox takes away as before (no CAP_SYS_ADMIN, CAP_NET_ADMIN; seccomp).
 */
#pragma once

#include <stdint.h>
#include <sys/types.h>

/* The ids each environment's namespace maps: 0..65535 inside, base..base+65535 outside. */
#define ENV_USERNS_IDS 65536u

/* From the supervisor: writes pid's uid_map and gid_map ("0 base 65536"). 0 or -errno. */
int env_userns_map(pid_t pid, uint32_t base);
/* In the child, only system calls: unshare(CLONE_NEWUSER), asks the parent for its maps
 * through ask_fd (an int pair {0, 0}), waits for a byte on go_fd, then becomes root of the
 * namespace (uid, gid, no supplementary groups). 0 or -1 with errno. */
int env_userns_enter(int ask_fd, int go_fd);

/* In a checkpoint's CRIU directory: its tree was in a user namespace whose root is host uid
 * base (its /dev nodes bind mounts of the host's). 0 or -errno. */
int env_userns_mark(int criufd, uint32_t base);
/* The base a checkpoint's mark names; 0: none (no user namespace). */
uint32_t env_userns_marked(int criufd);

/* A detached mount of dir (recursive) idmapped with the environment's map: files the host sees
 * as uid N the environment sees as N too (a base image's root-owned files are its root's, not
 * nobody's). An O_PATH-like fd of it for overlayfs's lowerdir, or -errno. */
int env_userns_idmapped(const char *dir, uint32_t base);
/* The two steps of env_userns_idmapped, for many directories with one map (an image's
 * layers): a user namespace fd with the environment's map, or -errno; dir's idmapped detached
 * mount with ns's map, or -errno. */
int env_userns_ns(uint32_t base);
int env_userns_idmap(const char *dir, int ns);
