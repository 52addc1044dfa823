/* SPDX-License-Identifier: MIT */
/*
 * The disk limit on an environment's writable layer (issue 19; [env] disk_max, env create
 * --disk): with a limit, the upper and work directories live on a tmpfs of that size (and an
 * inode bound) mounted at <state_dir>/envs/<id>/disk (mode 0700), so that a write past it gets
 * ENOSPC inside the environment and nothing else fills. Without one they stay on the state
 * directory's file system, as before.
 *
 * Why a tmpfs: the state directory's file system (ext4 here) has no project quota (no
 * "project"/"quota" feature, no prjquota mount option), the one per-directory limit a file
 * system can enforce on a plain directory. A tmpfs needs nothing of the host. Its pages are
 * memory: the kernel charges them to the memory cgroup of the process that writes them, so
 * what the environment writes counts against its memory_max, and what the supervisor writes
 * into it (a restore's roll-back) against the supervisor's. A reboot empties it: the layer
 * then comes back from the head checkpoint, by a restore.
 *
 * The checkpoint copies out of the upper layer with copy_file_range, which falls back to
 * read/write across file systems (supervisor-env-fs.c), and rolls back into it in place, so
 * both work on the tmpfs unchanged.
 */
#pragma once

#include <stdbool.h>

struct sv_env;

/* Sets e->upper and e->work for e->limits.disk (call once the limits are final). */
void env_disk_layout(struct sv_env *e);
/* With a disk limit: mounts the tmpfs unless it is mounted already, and makes the upper and
 * work directories in it. Nothing without one. 0 or -errno. */
int env_disk_mount(const struct sv_env *e);
/* Whether the tmpfs is mounted (in this mount namespace); true without a disk limit. */
bool env_disk_mounted(const struct sv_env *e);
/* Unmounts the tmpfs (its content goes with it) and removes its directory. */
void env_disk_unmount(const struct sv_env *e);
