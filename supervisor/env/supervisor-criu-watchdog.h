/* SPDX-License-Identifier: MIT */
/*
 * A CRIU dump whose environment dies under it can hang for good: the environment's pid-1, killed
 * while CRIU has it seized (its parasite running), exits and waits in zap_pid_ns_processes()
 * for its children, one of them a zombie that CRIU, as its tracer, holds; CRIU waits for the
 * pid-1 to stop. Neither moves (seen here: a failure injected while the policy's checkpoint
 * dumped; 1 bench run in 4). The watchdog, for the length of one dump, looks at the
 * environment's cgroup every 50 ms: once it stays unpopulated (every task exiting or gone), it
 * kills the dump's CRIU, the tracer of the dumped pid when that is a child of this process.
 * The tracees are released with it and finish dying; the dump fails, as it would have.
 */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

struct sv_criu_watchdog;

/* Starts watching cgroup (a cgroup v2 directory) for the dump of pid. NULL: not started
 * (out of memory or threads; logged): the dump runs unwatched. */
struct sv_criu_watchdog *sv_criu_watchdog_start(pid_t pid, const char *cgroup);
/* Stops and frees it (NULL is fine). Returns whether it killed CRIU. */
bool sv_criu_watchdog_stop(struct sv_criu_watchdog *w);
