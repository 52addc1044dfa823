/* SPDX-License-Identifier: MIT */
/* belayer-bench: paths built only from checked components (bench.h). */
#include <errno.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/statfs.h>

#include "bench-path.h"

int bench_path_join(char *buf, size_t cap, const char *dir, const char *name)
{
	int n;

	/* "" or "/" joined with a name is a path at the host's root, never what was meant */
	if (!dir || dir[0] != '/' || dir[1] == '\0' || !name || !name[0])
		return -EINVAL;
	n = snprintf(buf, cap, "%s/%s", dir, name);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int bench_cgroup_file(char *buf, size_t cap, const char *cgroup, const char *name)
{
	struct statfs sf;
	int r = bench_path_join(buf, cap, cgroup, name);

	if (r < 0)
		return r;
	if (statfs(cgroup, &sf) < 0)
		return -errno;
	return sf.f_type == CGROUP2_SUPER_MAGIC ? 0 : -ENOTDIR;
}
