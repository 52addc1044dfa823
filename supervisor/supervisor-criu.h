/* SPDX-License-Identifier: MIT */
/*
 * CRIU, driven through libcriu (Debian 12's, pkg-config 'criu') pointed at a CRIU >= 4
 * binary with criu_set_service_binary (DESIGN §6: 3.17 fails on this kernel).
 *
 * Environments are dumped and restored the way DESIGN §6 verified: the environment's own
 * pid/mount/uts/ipc namespaces, its root an overlay mount, host /usr and /etc bind-mounted
 * read-only into it and declared external (dump: mnt[/usr]:usr, restore: mnt[usr]:/usr).
 * It shares the host's network namespace: listening sockets and loopback servers are dumped;
 * established TCP connections are not (no --tcp-established), so a checkpoint is taken
 * between requests.
 */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

/* The CRIU binary: configured (non-empty), else $BELAYER_CRIU, else /usr/local/sbin/criu,
 * else "criu" on PATH. Returns a static or the given string; NULL when none is executable. */
const char *sv_criu_binary(const char *configured);
/* The binary's version as libcriu reports it (40101 for 4.1.1), or -errno. */
int sv_criu_version(const char *binary);

/* Dumps the tree rooted at pid (leave_running: it keeps running, else CRIU kills it) into
 * images_fd. freeze_cgroup (may be NULL): the cgroup v2 the tree is in, possibly frozen by the
 * caller already; CRIU seizes the tasks through its freezer (a frozen task cannot run CRIU's
 * parasite otherwise) and leaves it as it found it. The log is "dump.log" in images_fd. */
int sv_criu_dump(const char *binary, pid_t pid, const char *freeze_cgroup, int images_fd,
		 bool leave_running);
/* Restores the tree in images_fd with root as the environment's root (the overlay mount);
 * the restored tree's root process becomes the caller's child. *ret_pid: its pid. */
int sv_criu_restore(const char *binary, int images_fd, const char *root, pid_t *ret_pid);
