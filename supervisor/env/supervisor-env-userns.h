/* SPDX-License-Identifier: MIT */
/*
 * [env] userns (issue 19): an environment's processes in a user namespace of their own, whose
 * root is an unprivileged host uid and gid (base, ENV_USERNS_IDS of them from there), so that
 * what escapes the other namespaces is nobody on the host.
 *
 * The namespace is the last thing the init enters, just before the rest of its sandbox: its
 * mount, network, pid, ipc, uts and cgroup namespaces are made and set up by real root first
 * and stay owned by the host's user namespace, so root in the environment holds no capability
 * over any of them (no mount, no network configuration, whatever the capability sets say).
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
