/* SPDX-License-Identifier: MIT */
/*
 * Environment side-effect tracing, user-space side (DESIGN §2): loads and attaches
 * bpf/envtrace.bpf.c, pins its maps and programs, maintains the watched cgroups and decodes
 * the ring buffer into records with user-space paths.
 *
 * Integration into the supervisor (the daemon's event loop is not touched here):
 *   at start:   r = envtrace_create(&opts, &et);
 *               on error: log once ("BPF unavailable: ...") and run without tracing.
 *               event_add() a persistent EV_READ on envtrace_fd(et), and a persistent timer of
 *               ENVTRACE_DRAIN_INTERVAL_MS (records below the wakeup threshold wake nobody),
 *               both calling envtrace_consume(et, on_record, sv) until it returns 0.
 *   env watch:  envtrace_watch_add(et, cgroup_path, root_path, env_id) with a fresh env id
 *               (1..ENVTRACE_MAX_ENVS-1), dirty_create() and sidelog_open() for the env,
 *               then dirty_rescan_writers() (fds opened for writing before the watch);
 *               on_record() looks the env up by rec->env_id and calls dirty_apply() and
 *               sidelog_append().
 *   checkpoint: envtrace_consume() until 0 (drain), envtrace_env_stats() ->
 *               dirty_note_drops(d, stats.drops), read the dirty set (dirty_list(),
 *               dirty_needs_full_diff()), then dirty_reset() and dirty_rescan_writers().
 *   env remove: envtrace_watch_remove(et, env_id).
 *   belayerctl bpf: envtrace_pin_dir(et) names the directory whose maps and progs/ bpftool
 *               shows (`bpftool map dump pinned DIR/watched`, `bpftool prog show pinned ...`);
 *               "" when nothing is pinned.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "envtrace.h"

struct sv_envtrace;

/* Pins belong to one tracer: it holds an exclusive flock() on its pin directory while it lives
 * (another tracer given the same directory is refused with -EBUSY, its pins untouched), replaces
 * only a dead holder's pins of the names it pins itself, and removes only the pins it made. */
struct envtrace_options {
	/* NULL or "": pin_dir_for_state(state_dir) (common/pin-dir.h) when state_dir is set,
	 * else nothing is pinned */
	const char *pin_dir;
	const char *state_dir;
	size_t ringbuf_bytes;  /* 0: the program's default (8 MiB); a power of 2 >= page size */
	unsigned int argv_max; /* 0: ENVTRACE_ARGV_MAX */
	/* Wake the reader of envtrace_fd() only once this many bytes wait (0: min(256 KiB, a
	 * quarter of the ring); -1: for every record). Waking is costly in the traced process
	 * (a self-IPI, a VM exit on virtual machines); the reader must then also drain on a
	 * timer (ENVTRACE_DRAIN_INTERVAL_MS). */
	int64_t wakeup_bytes;
	/* No process-activity counting (the programs on every syscall are not loaded):
	 * envtrace_activity() says so and the stats' activity never moves. */
	bool no_activity;
};

#define ENVTRACE_DRAIN_INTERVAL_MS 100

/* One decoded event; pointers are valid during the callback only. */
struct envtrace_record {
	enum envtrace_type type;
	unsigned int op; /* enum envtrace_op, or the full-diff reason */
	uint32_t env_id;
	pid_t pid, tid;
	uint32_t flags;
	uint64_t ts_ns, cgroup_id;
	int64_t ret, aux;
	unsigned int npaths;
	/* Absolute, normalized, as the process saw it (relative to its root). */
	const char *path[2];
	/* Other names of the same object, when they differ from path: the path with its parent's
	 * symlinks resolved, and with the last component's symlink resolved too. */
	const char *alias[2][2];
	/* A path could not be named (walk cut, string too long, detached file): whoever keeps
	 * the dirty set must force a full diff. */
	bool unresolved;
	const char *exe;  /* ENVTRACE_EV_EXEC */
	const char *argv; /* NUL-separated, argv_len bytes */
	size_t argv_len;
};

/* Returns 0 to continue, <0 to stop consuming (returned by envtrace_consume). */
typedef int (*envtrace_record_cb)(const struct envtrace_record *rec, void *userdata);

/* Mounts bpffs at /sys/fs/bpf and tracefs at /sys/kernel/tracing when they are not. */
int envtrace_setup_fs(void);

int envtrace_create(const struct envtrace_options *opts, struct sv_envtrace **ret);
void envtrace_destroy(struct sv_envtrace *et);

/* Readable (epoll fd) when records wait; then call envtrace_consume. */
int envtrace_fd(struct sv_envtrace *et);
/* Decodes every waiting record; returns how many, or the callback's negative result. */
int envtrace_consume(struct sv_envtrace *et, envtrace_record_cb cb, void *userdata);

/* cgroup v2 id of a cgroup directory (its inode number). */
int envtrace_cgroup_id(const char *cgroup_path, uint64_t *ret);

/* Watches the cgroup and every cgroup below it, also ones created later. root_path is the
 * environment's root as the supervisor sees it (NULL: "/"); paths are resolved within it. */
int envtrace_watch_add(struct sv_envtrace *et, const char *cgroup_path, const char *root_path,
		       uint32_t env_id);
int envtrace_watch_remove(struct sv_envtrace *et, uint32_t env_id);

/* Summed over CPUs. */
int envtrace_env_stats(struct sv_envtrace *et, uint32_t env_id, struct envtrace_env_stats *ret);
/* Whether the stats' activity counter is kept (envtrace_options.no_activity unset). */
bool envtrace_activity(const struct sv_envtrace *et);
/* Ring-buffer drops: per CPU into per_cpu[0..n) (may be NULL), total in *ret_total. */
int envtrace_drops(struct sv_envtrace *et, uint64_t *per_cpu, size_t n, uint64_t *ret_total);
int envtrace_ncpus(struct sv_envtrace *et);
/* Time spent in the programs and how often they ran, summed over all of them: counted by the
 * kernel only while BPF run-time statistics are enabled (kernel.bpf_stats_enabled, or an fd
 * from bpf_enable_stats(BPF_STATS_RUN_TIME) held open). */
int envtrace_prog_runtime(struct sv_envtrace *et, uint64_t *ret_ns, uint64_t *ret_count);
const char *envtrace_pin_dir(struct sv_envtrace *et);

const char *envtrace_op_to_string(unsigned int op);
const char *envtrace_full_diff_reason_to_string(unsigned int reason);
