/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "supervisor-env-limits.h"
#include "supervisor-env.h"
#include "util.h"

#define CPU_PERIOD_US 100000

static const char *const controller[_ENV_LIMIT_MAX] = {
	[ENV_LIMIT_PIDS] = "pids",
	[ENV_LIMIT_MEMORY] = "memory",
	[ENV_LIMIT_CPU] = "cpu",
};

/* Whether word is one of the comma- or space-separated words of list. */
static bool has_word(const char *list, const char *word, const char *seps)
{
	size_t n = strlen(word);

	for (const char *p = list; *p; p += strcspn(p, seps), p += strspn(p, seps))
		if (strncmp(p, word, n) == 0 && (p[n] == 0 || strchr(seps, p[n])))
			return true;
	return false;
}

/* The v2 controller is available to e's cgroup: its parent lists it in cgroup.controllers
 * (enabled in the parent's subtree_control by v2_enable). */
static bool v2_has(const struct sv_env *e, const char *ctl)
{
	char path[PATH_MAX], buf[512] = "";
	_cleanup_close_ int fd = -1;
	ssize_t n;

	snprintf(path, sizeof(path), "%s/../cgroup.controllers", e->cgroup);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
	if (n <= 0)
		return false;
	buf[n] = 0;
	return has_word(buf, ctl, " \n");
}

/* The v1 hierarchy holding ctl: its mount point and the supervisor's cgroup in it, from
 * /proc/self/mountinfo and /proc/self/cgroup. -ENOENT: none. */
static int v1_find_named(const char *ctl, char *mnt, size_t mcap, char *own, size_t ocap,
			 char *name, size_t ncap)
{
	char line[4096], mp[PATH_MAX], *f;
	FILE *mi, *cg;
	bool found = false;

	mi = fopen("/proc/self/mountinfo", "re");
	if (!mi)
		return -errno;
	while (!found && fgets(line, sizeof(line), mi)) {
		/* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER */
		char *dash = strstr(line, " - ");

		if (!dash || strncmp(dash + 3, "cgroup ", 7) != 0)
			continue;
		f = strrchr(dash, ' ');
		if (!f || !has_word(f + 1, ctl, ",\n"))
			continue;
		if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) == 1 && strlen(mp) < mcap) {
			snprintf(mnt, mcap, "%s", mp);
			found = true;
		}
	}
	fclose(mi);
	if (!found)
		return -ENOENT;
	cg = fopen("/proc/self/cgroup", "re");
	if (!cg)
		return -errno;
	found = false;
	while (!found && fgets(line, sizeof(line), cg)) {
		/* N:CONTROLLERS:PATH */
		char *c = strchr(line, ':'), *p = c ? strchr(c + 1, ':') : NULL;

		if (!p)
			continue;
		*p++ = 0;
		p[strcspn(p, "\n")] = 0;
		if (has_word(c + 1, ctl, ",") && strlen(p) < ocap) {
			snprintf(own, ocap, "%s", strcmp(p, "/") == 0 ? "" : p);
			if (name)
				snprintf(name, ncap, "%s", c + 1);
			found = true;
		}
	}
	fclose(cg);
	return found ? 0 : -ENOENT;
}

static int v1_find(const char *ctl, char *mnt, size_t mcap, char *own, size_t ocap)
{
	return v1_find_named(ctl, mnt, mcap, own, ocap, NULL, 0);
}

/* e's cgroup in ctl's v1 hierarchy: its mount point (NULL: not wanted) and its path below it.
 * -ENOENT: no such hierarchy. */
static int v1_where(const struct sv_env *e, const char *ctl, char *ret_mnt, size_t mcap,
		    char *ret_rel, size_t cap)
{
	char mnt[PATH_MAX], own[PATH_MAX], parent[PATH_MAX];
	const char *slash;
	int r = v1_find(ctl, mnt, sizeof(mnt), own, sizeof(own));

	if (r < 0)
		return r;
	snprintf(parent, sizeof(parent), "%s", e->cgroup);
	parent[strlen(parent) - strlen(e->id) - 1] = 0;
	slash = strrchr(parent, '/');
	if (snprintf(ret_rel, cap, "%s/%s/%s", own, slash ? slash + 1 : parent, e->id) >= (int)cap)
		return -ENAMETOOLONG;
	if (ret_mnt)
		snprintf(ret_mnt, mcap, "%s", mnt);
	return 0;
}

static int v1_dir(const struct sv_env *e, const char *ctl, char *ret, size_t cap)
{
	char mnt[PATH_MAX], rel[PATH_MAX];
	int r = v1_where(e, ctl, mnt, sizeof(mnt), rel, sizeof(rel));

	if (r < 0)
		return r;
	if (snprintf(ret, cap, "%s%s", mnt, rel) >= (int)cap)
		return -ENAMETOOLONG;
	return 0;
}

/* The cgroup v2 mount that holds path (the longest one that is its prefix): its length. */
static size_t v2_mount_len(const char *path)
{
	char line[4096], mp[PATH_MAX];
	size_t best = 0;
	FILE *mi = fopen("/proc/self/mountinfo", "re");

	while (mi && fgets(line, sizeof(line), mi)) {
		char *dash = strstr(line, " - ");
		size_t n;

		if (!dash || strncmp(dash + 3, "cgroup2 ", 8) != 0 ||
		    sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1)
			continue;
		n = strcmp(mp, "/") == 0 ? 0 : strlen(mp);
		if (strncmp(path, mp, n) == 0 && path[n] == '/' && n > best)
			best = n;
	}
	if (mi)
		fclose(mi);
	return best;
}

static int write_value(const char *dir, const char *file, const char *value)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	return env_write_file(path, value);
}

static uint64_t limit_of(const struct sv_env *e, enum env_limit_kind kind)
{
	return kind == ENV_LIMIT_PIDS	  ? e->limits.pids
	       : kind == ENV_LIMIT_MEMORY ? e->limits.memory
					  : e->limits.cpu_millis;
}

/* Where kind is enforced: in e's v2 cgroup (ret_dir e->cgroup), a v1 one (ret_dir), or not at
 * all (-ENOENT: no controller; -ENODATA: no limit, so no v1 cgroup either: an environment
 * without limits is in its v2 cgroup alone). */
static int limit_dir(const struct sv_env *e, enum env_limit_kind kind, char *ret_dir, size_t cap,
		     bool *ret_v2)
{
	*ret_v2 = v2_has(e, controller[kind]);
	if (*ret_v2) {
		snprintf(ret_dir, cap, "%s", e->cgroup);
		return 0;
	}
	if (!limit_of(e, kind))
		return -ENODATA;
	return v1_dir(e, controller[kind], ret_dir, cap);
}

const char *env_limits_where(const struct sv_env *e, enum env_limit_kind kind)
{
	char dir[PATH_MAX];
	bool v2;
	int r = limit_dir(e, kind, dir, sizeof(dir), &v2);

	return r == -ENODATA ? "unlimited" : r < 0 ? "none" : v2 ? "v2" : "v1";
}

/* Enables ctl for e's cgroup in its parent's subtree_control (the parent has no processes of
 * its own: the v2 rule that lets it hand controllers down). */
static void v2_enable(const struct sv_env *e, const char *ctl)
{
	char path[PATH_MAX], plus[32];

	snprintf(path, sizeof(path), "%s/../cgroup.subtree_control", e->cgroup);
	snprintf(plus, sizeof(plus), "+%s", ctl);
	(void)env_write_file(path, plus);
}

static int apply(const char *dir, enum env_limit_kind kind, bool v2, const struct env_limits *l)
{
	char v[64];

	switch (kind) {
	case ENV_LIMIT_PIDS:
		snprintf(v, sizeof(v), l->pids ? "%" PRIu64 : "max", l->pids);
		return write_value(dir, "pids.max", v);
	case ENV_LIMIT_MEMORY:
		if (v2) {
			snprintf(v, sizeof(v), l->memory ? "%" PRIu64 : "max", l->memory);
			/* swap counted apart in v2: none, so that the limit is the memory's */
			(void)write_value(dir, "memory.swap.max", l->memory ? "0" : "max");
			return write_value(dir, "memory.max", v);
		}
		snprintf(v, sizeof(v), "%" PRId64, l->memory ? (int64_t)l->memory : (int64_t)-1);
		{
			int r = write_value(dir, "memory.limit_in_bytes", v);

			/* with swap accounting, memory + swap too (absent without it) */
			if (r >= 0)
				(void)write_value(dir, "memory.memsw.limit_in_bytes", v);
			return r;
		}
	case ENV_LIMIT_CPU:
		if (v2) {
			if (l->cpu_millis)
				snprintf(v, sizeof(v), "%" PRIu64 " %d",
					 (uint64_t)l->cpu_millis * CPU_PERIOD_US / 1000,
					 CPU_PERIOD_US);
			else
				snprintf(v, sizeof(v), "max %d", CPU_PERIOD_US);
			return write_value(dir, "cpu.max", v);
		}
		snprintf(v, sizeof(v), "%d", CPU_PERIOD_US);
		(void)write_value(dir, "cpu.cfs_period_us", v);
		snprintf(v, sizeof(v), "%" PRId64,
			 l->cpu_millis ? (int64_t)l->cpu_millis * CPU_PERIOD_US / 1000
				       : (int64_t)-1);
		return write_value(dir, "cpu.cfs_quota_us", v);
	default:
		return -EINVAL;
	}
}

int env_limits_setup(const struct sv_env *e)
{
	char dir[PATH_MAX], parent[PATH_MAX];
	bool v2;
	int r;

	for (int k = 0; k < _ENV_LIMIT_MAX; k++) {
		if (limit_dir(e, k, dir, sizeof(dir), &v2) < 0)
			continue;
		if (v2) {
			v2_enable(e, controller[k]);
		} else {
			snprintf(parent, sizeof(parent), "%s", dir);
			*strrchr(parent, '/') = 0;
			if ((mkdir(parent, 0755) < 0 && errno != EEXIST) ||
			    (mkdir(dir, 0755) < 0 && errno != EEXIST))
				return log_debug_errno(-errno, "Failed to create %s: %m", dir);
		}
		r = apply(dir, k, v2, &e->limits);
		if (r < 0)
			return log_debug_errno(r, "Failed to set %s's %s limit: %m", e->id,
					       controller[k]);
	}
	return 0;
}

int env_limits_join(const struct sv_env *e, pid_t pid)
{
	char dir[PATH_MAX], v[32];
	bool v2;
	int r;

	snprintf(v, sizeof(v), "%d", (int)pid);
	for (int k = 0; k < _ENV_LIMIT_MAX; k++) {
		if (limit_dir(e, k, dir, sizeof(dir), &v2) < 0 || v2)
			continue;
		r = write_value(dir, "cgroup.procs", v);
		if (r < 0)
			return log_debug_errno(r, "Failed to move %s's init into %s: %m", e->id,
					       dir);
	}
	return 0;
}

void env_limits_remove(const struct sv_env *e)
{
	char dir[PATH_MAX];
	bool v2;

	for (int k = 0; k < _ENV_LIMIT_MAX; k++)
		if (limit_dir(e, k, dir, sizeof(dir), &v2) >= 0 && !v2)
			(void)rmdir(dir);
}

int env_limits_cgroup_roots(const struct sv_env *e,
			    int (*fn)(const char *ctl, const char *path, void *userdata),
			    void *userdata)
{
	char dir[PATH_MAX], rel[PATH_MAX];
	size_t n = v2_mount_len(e->cgroup);
	bool v2;
	int r;

	if (!n)
		return -ENOENT;
	/* CRIU names the v2 hierarchy "" (its cnames in cgroup.img) */
	r = fn("", e->cgroup + n, userdata);
	for (int k = 0; r >= 0 && k < _ENV_LIMIT_MAX; k++) {
		if (limit_dir(e, k, dir, sizeof(dir), &v2) < 0 || v2)
			continue;
		r = v1_where(e, controller[k], NULL, 0, rel, sizeof(rel));
		if (r >= 0)
			r = fn(controller[k], rel, userdata);
	}
	/* and the device rules' (supervisor-env-devices.h), which every environment Belayer
	 * made has where the host has the hierarchy */
	if (r >= 0 && !e->adopted && v1_where(e, "devices", NULL, 0, rel, sizeof(rel)) >= 0)
		r = fn("devices", rel, userdata);
	return r;
}

int env_limits_v1_dir(const struct sv_env *e, const char *ctl, char *ret, size_t cap)
{
	return v1_dir(e, ctl, ret, cap);
}

/* The name /proc/PID/cgroup gives ctl's v1 hierarchy ("cpu,cpuacct"), into names[*n]. */
static void add_v1_name(const char *ctl, char (*names)[64], size_t cap, size_t *n)
{
	char mnt[PATH_MAX], own[PATH_MAX];

	if (*n < cap && v1_find_named(ctl, mnt, sizeof(mnt), own, sizeof(own), names[*n], 64) >= 0)
		(*n)++;
}

size_t env_limits_cgroup_names(const struct sv_env *e, char (*names)[64], size_t cap)
{
	char dir[PATH_MAX];
	size_t n = 0;
	bool v2;

	if (cap == 0)
		return 0;
	names[n++][0] = '\0'; /* v2: an empty name */
	for (int k = 0; k < _ENV_LIMIT_MAX; k++)
		if (limit_dir(e, k, dir, sizeof(dir), &v2) >= 0 && !v2)
			add_v1_name(controller[k], names, cap, &n);
	if (!e->adopted)
		add_v1_name("devices", names, cap, &n);
	return n;
}
