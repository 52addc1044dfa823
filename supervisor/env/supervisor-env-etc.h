/* SPDX-License-Identifier: MIT */
/*
 * What an environment sees of the host's /etc (issue 19): the host's /etc, read-only, less
 * everything an unprivileged host user could not read there. The rule is the Unix one, taken
 * from the modes: a file (anything but a directory or a symlink) without the others-read bit is
 * masked by the environment's /dev/null bind-mounted over it; a directory without others-read
 * or others-execute by an empty read-only tmpfs, and nothing below it is looked at. Symlinks
 * are never followed (their targets are objects of their own, or outside the environment).
 *
 * The supervisor scans once per launch, before clone3 (the child of clone3 in a threaded
 * process must not allocate): env_etc_scan gives a prepared array, the child only reads it
 * (env_etc_mask, in the environment's mount namespace before pivot_root). The scan is bounded
 * (depth, entries walked, masks) and fails closed: an /etc it cannot vouch for starts no
 * environment.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/* Debian 12's /etc: depth 5, ~1400 entries, 11 masks (a build machine with PostgreSQL). */
#define ENV_ETC_DEPTH_MAX   16
#define ENV_ETC_ENTRIES_MAX 65536
#define ENV_ETC_MASKS_MAX   1024
/* A masked path, relative to /etc: short enough to join under an environment's root (whose
 * length env_prepare bounds to PATH_MAX - 128) and "/etc/". */
#define ENV_ETC_PATH_MAX 3072

struct env_etc_mask {
	bool dir;   /* an empty tmpfs; else /dev/null */
	char *path; /* relative to etc, "" for etc itself */
};

struct env_etc_masks {
	size_t n;
	size_t entries; /* entries walked (for the bounds and the measure) */
	struct env_etc_mask *v;
};

/* Walks etc (an absolute directory: "/etc", a test's tree) and lists what to mask. -E2BIG:
 * more than ENV_ETC_ENTRIES_MAX entries or ENV_ETC_MASKS_MAX masks; -ELOOP: a directory deeper
 * than ENV_ETC_DEPTH_MAX that would be walked; -ENAMETOOLONG: a path over ENV_ETC_PATH_MAX. */
int env_etc_scan(const char *etc, struct env_etc_masks *ret);
void env_etc_masks_finish(struct env_etc_masks *m);

/* In the launched child, no allocation: masks the host's /etc bind-mounted at <root>/etc with
 * <root>/dev/null and empty tmpfs mounts. An entry gone since the scan is skipped; any other
 * failure (an entry that changed type) is -1 with errno. */
int env_etc_mask(const char *root, const struct env_etc_masks *m);
