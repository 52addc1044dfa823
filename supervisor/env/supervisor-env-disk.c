/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>

#include <linux/magic.h>

#include "log.h"
#include "supervisor-env-disk.h"
#include "supervisor-env.h"

/* One inode per 4 KiB page of the limit: a file with data takes a page anyway, and the bound
 * keeps empty files (whose inodes are kernel memory outside the size) proportionate. */
#define DISK_BYTES_PER_INODE 4096
#define DISK_MIN_INODES	     1024

static void disk_dir(const struct sv_env *e, char *ret, size_t cap)
{
	snprintf(ret, cap, "%s/disk", e->dir);
}

void env_disk_layout(struct sv_env *e)
{
	const char *sub = e->limits.disk ? "/disk" : "";

	snprintf(e->upper, sizeof(e->upper), "%s%s/upper", e->dir, sub);
	snprintf(e->work, sizeof(e->work), "%s%s/work", e->dir, sub);
}

bool env_disk_mounted(const struct sv_env *e)
{
	char path[PATH_MAX];
	struct stat st, up;
	struct statfs sf;

	if (!e->limits.disk)
		return true;
	disk_dir(e, path, sizeof(path));
	/* a tmpfs of its own: not the state directory's file system, nor a tmpfs it is on */
	return statfs(path, &sf) == 0 && sf.f_type == TMPFS_MAGIC && stat(path, &st) == 0 &&
	       stat(e->dir, &up) == 0 && st.st_dev != up.st_dev;
}

int env_disk_mount(const struct sv_env *e)
{
	char path[PATH_MAX], opts[128];
	uint64_t inodes;

	if (!e->limits.disk)
		return 0;
	disk_dir(e, path, sizeof(path));
	if (!env_disk_mounted(e)) {
		inodes = e->limits.disk / DISK_BYTES_PER_INODE;
		if (inodes < DISK_MIN_INODES)
			inodes = DISK_MIN_INODES;
		snprintf(opts, sizeof(opts), "size=%" PRIu64 ",nr_inodes=%" PRIu64 ",mode=0700",
			 e->limits.disk, inodes);
		if (mkdir(path, 0700) < 0 && errno != EEXIST)
			return log_debug_errno(-errno, "Failed to create %s: %m", path);
		if (mount("belayer-disk", path, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0)
			return log_debug_errno(-errno, "Failed to mount %s's disk (%s): %m", e->id,
					       opts);
		/* Private, as the overlay: nothing propagates in or out. */
		if (mount(NULL, path, NULL, MS_PRIVATE, NULL) < 0)
			return -errno;
	}
	if ((mkdir(e->upper, 0755) < 0 && errno != EEXIST) ||
	    (mkdir(e->work, 0700) < 0 && errno != EEXIST))
		return log_debug_errno(-errno, "Failed to create %s's layers: %m", e->id);
	return 0;
}

void env_disk_unmount(const struct sv_env *e)
{
	char path[PATH_MAX];

	if (!e->limits.disk)
		return;
	disk_dir(e, path, sizeof(path));
	if (env_disk_mounted(e) && umount2(path, 0) < 0)
		(void)umount2(path, MNT_DETACH);
	(void)rmdir(path);
}
