/* SPDX-License-Identifier: MIT */
/*
 * An environment's resource limits (issue 19): processes, memory and CPU, through the cgroup
 * v2 controllers where the environment's v2 cgroup has them (pure v2 hosts), else through
 * the v1 hierarchies that hold them (hybrid hosts like the build machines: their v2 hierarchy
 * has no controllers). A v1 cgroup mirrors the environment's v2 one below the supervisor's own
 * v1 cgroup: <mount><own>/<parent's name>/<id>. A controller found in neither is not applied,
 * and says so (env_limits_where).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct sv_env;

/* 0: no limit. */
struct env_limits {
	uint64_t pids;	     /* tasks */
	uint64_t memory;     /* bytes, swap included where the controller counts it */
	uint32_t cpu_millis; /* thousandths of a CPU (1500: one and a half) */
	uint64_t disk;	     /* bytes of the writable layer (supervisor-env-disk.h) */
};

enum env_limit_kind {
	ENV_LIMIT_PIDS,
	ENV_LIMIT_MEMORY,
	ENV_LIMIT_CPU,
	_ENV_LIMIT_MAX,
};

/* Creates the environment's v1 cgroups where they are needed and writes every limit (v2 into
 * e->cgroup, which must exist). Run before the init starts and again after a fresh cgroup
 * (restore, rebuild). 0 or -errno. */
int env_limits_setup(const struct sv_env *e);
/* Moves pid into the environment's v1 cgroups (v2: clone3 put it in e->cgroup). */
int env_limits_join(const struct sv_env *e, pid_t pid);
/* Removes the v1 cgroups (once the environment's processes are gone). */
void env_limits_remove(const struct sv_env *e);
/* The environment's own cgroups, as CRIU's --cgroup-root names them: fn(controller, path below
 * the hierarchy's mount) for its v2 cgroup (CRIU's name for it: "") and each v1 cgroup of its limits
 * and of its device rules (supervisor-env-devices.h). A
 * restore puts the dumped tree's root there, whichever environment the images came from (a
 * fork restores another's). The first error fn returns, else 0. */
int env_limits_cgroup_roots(const struct sv_env *e,
			    int (*fn)(const char *ctl, const char *path, void *userdata),
			    void *userdata);
/* The hierarchies the environment has cgroups of its own in, as /proc/PID/cgroup names them
 * ("" for v2, "pids", "cpu,cpuacct"...): what a dump records (CRIU's --cgroup-dump-controller).
 * In the others the environment is where the supervisor is (on a hybrid host often a
 * hierarchy's root): CRIU would record that cgroup's whole subtree, other software's cgroups
 * included, and a restore fails when one of them goes meanwhile ("bad cgroup path"). Up to
 * cap names (64 bytes each); returns how many. */
size_t env_limits_cgroup_names(const struct sv_env *e, char (*names)[64], size_t cap);
/* How kind is enforced for e: "v2", "v1", "none" (no controller for it), or "unlimited". An
 * environment has v1 cgroups only for the limits it has. */
const char *env_limits_where(const struct sv_env *e, enum env_limit_kind kind);
/* e's cgroup in the v1 hierarchy holding controller ctl (whether or not it exists yet).
 * -ENOENT: the host has no such hierarchy. */
int env_limits_v1_dir(const struct sv_env *e, const char *ctl, char *ret, size_t cap);
