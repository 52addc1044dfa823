/* SPDX-License-Identifier: MIT */
/*
 * An environment's device allow-list (issue 19; bpf/envdev.h lists it): the null, zero, full,
 * random, urandom and tty nodes, ptmx and its own ptys may be opened, nothing else (no block
 * device, no /dev/kmsg, /dev/mem ...), even through a node that got into its file system.
 * Enforced as runc does: a BPF_CGROUP_DEVICE program attached to the environment's v2 cgroup
 * (on any kernel with cgroup v2, with or without controllers in it), and on hybrid hosts also
 * the v1 devices controller (devices.deny "a", then one devices.allow line per entry) in a v1
 * cgroup that mirrors the v2 one like the limits' (supervisor-env-limits.h). The kernel checks
 * both: a device either refuses is refused.
 *
 * The program is attached with BPF_F_ALLOW_MULTI and no link: it stays with the cgroup until
 * the cgroup is removed, past a supervisor restart, and programs of the ancestors (systemd's
 * DevicePolicy) still run. It is loaded once per process (about 10 ms: libbpf reads the
 * kernel's BTF) and kept; an attach then costs about 0.4 ms, which a restore pays for its
 * fresh cgroup.
 */
#pragma once

#include <sys/types.h>

struct sv_env;

/* The v1 rules (where the host has a devices hierarchy) and the v2 program on e->cgroup, which
 * must exist. Run before the init starts and after a fresh cgroup (restore, rebuild). */
int env_devices_setup(const struct sv_env *e);
/* Moves pid into the environment's v1 devices cgroup (nothing without one). */
int env_devices_join(const struct sv_env *e, pid_t pid);
/* A reopened environment (env_reopen): attaches the program again if its cgroup has none. */
int env_devices_ensure(const struct sv_env *e);
/* Removes the v1 devices cgroup (once the environment's processes are gone). */
void env_devices_remove(const struct sv_env *e);

/* The v1 rules written into the v1 devices cgroup dir (which must have no child cgroup). */
int env_devices_v1_apply(const char *dir);
/* The v2 program attached to the cgroup v2 directory cgroup. 0 or -errno. */
int env_devices_attach(const char *cgroup);
/* How many device programs are attached to cgroup itself (not its ancestors), or -errno. */
int env_devices_attached(const char *cgroup);
