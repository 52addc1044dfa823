/* SPDX-License-Identifier: MIT */
/* belayer-bench env-scaling's memory rows (issue 23 item 5), bench-env-mem.c. */
#pragma once

#include <stdint.h>

#include "bench-env-kinds.h"
#include "supervisor-env.h"

struct mem_row {
	struct kinds_row ck; /* the checkpoint (its kind the manifest's) */
	uint64_t restore_us;
};

/* One size: a turn where the process dirtied its memory (full), a turn where it did not run
 * (fs-only when the tracer's activity counter vouches for it), the same idle turn the old way
 * (no activity counter: every checkpoint full, as `[env] activity = no`). */
struct bench_mem {
	unsigned mb;
	struct mem_row dirtied, idle, idle_old;
};

/* The holder's program and its two FIFOs under <base>/memhold (before any environment of the
 * base starts). */
int bench_env_mem_prepare(const char *base);
/* An environment whose process holds mb MiB of touched anonymous memory (p: its base prepared
 * by bench_env_mem_prepare). Each row once: a 1 GiB dump takes seconds. */
int bench_env_mem(const struct env_params *p, unsigned mb, struct bench_mem *ret);
