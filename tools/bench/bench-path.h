/* SPDX-License-Identifier: MIT */
/* Paths the benches build (bench-path.c), never from an empty or unchecked component. */
#pragma once

#include <stddef.h>

/* dir/name into buf: 0, -EINVAL when dir is empty, relative or "/" or name is empty (the path
 * would be at the host's root: "" + "/cgroup.kill"), -ENAMETOOLONG when it does not fit. */
int bench_path_join(char *buf, size_t cap, const char *dir, const char *name);
/* The same for a file of a cgroup, which must be a cgroup v2 directory now (-ENOTDIR: it is
 * not; -errno: it does not exist). */
int bench_cgroup_file(char *buf, size_t cap, const char *cgroup, const char *name);
