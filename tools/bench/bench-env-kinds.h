/* SPDX-License-Identifier: MIT */
/* belayer-bench env-scaling's checkpoint-kind rows (issue 23 item 3), bench-env-kinds.c. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "supervisor-env.h"

struct sv_envtrace;

#define BENCH_KINDS_REPS_MAX 3
/* The tracer's watch id of the environment the kinds (and memory) rows measure. */
#define BENCH_KINDS_WATCH 1

struct kinds_row {
	char kind[ENV_KIND_MAX + 1]; /* the manifest's, or "skipped" / "changed" for the decision */
	uint64_t freeze_us, fs_us, dump_us, commit_us, total_us, criu_bytes, fs_bytes;
};

struct bench_kinds {
	unsigned files;
	struct kinds_row full, fs_only, unchanged;
};

/* An environment of files files (fill), the tracer watching it; reps of: a process ran (run)
 * then a checkpoint; a file written from outside then a checkpoint; nothing, the decision. */
int bench_env_kinds(const struct env_params *p, unsigned files, unsigned reps,
		    int (*run)(const struct sv_env *e, const char *action),
		    int (*fill)(const struct sv_env *e, const char *dir, unsigned n),
		    struct bench_kinds *ret);

/* env_activity_fn: the tracer's activity counter of watch BENCH_KINDS_WATCH; userdata a
 * pointer to the struct sv_envtrace * that watches it. */
int bench_kinds_activity(void *userdata, uint32_t *ret_watch, uint64_t *ret_count);
/* One checkpoint of e into row (its id into ret_id when not NULL); t (NULL or *t NULL: none)
 * the tracer whose activity counter decides its kind (BENCH_KINDS_WATCH). */
int bench_kinds_checkpoint(struct sv_env *e, const char *trajectory, unsigned turn,
			   struct sv_envtrace **t, struct kinds_row *row, char *ret_id, size_t cap);
/* A 16-byte file /work/<name> written into the overlay from outside, as `env write` does: no
 * process of the environment runs. */
int bench_kinds_write(const struct sv_env *e, const char *name, unsigned salt);
