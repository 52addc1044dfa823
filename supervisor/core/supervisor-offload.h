/* SPDX-License-Identifier: MIT */
/*
 * Blocking work off the event loop, in lanes: the serial lane is one thread that runs jobs in
 * order (NVML queries, reading region memory for checksums: the NVML handle is that thread's
 * alone); the environment lane is [env] workers threads (checkpoints, restores, creations: the
 * caller keeps one job per environment at a time, so different environments' jobs run side by
 * side). Each finished job is handed back through one eventfd, so that its result is applied
 * on the loop thread, the only one that touches the registry.
 * Without threads (tests, fuzzing: s->offload NULL) a job runs inline.
 */
#pragma once

#include "supervisor.h"

enum offload_lane {
	OFFLOAD_SERIAL = 0, /* the default (a zeroed job) */
	OFFLOAD_ENV = 1,
	OFFLOAD_CANARY = 2, /* one thread: engines' canary requests (supervisor-canary.h) */
	_OFFLOAD_LANES,
};

struct sv_job {
	struct sv_job *next;
	enum offload_lane lane;
	void (*run)(struct supervisor *s, struct sv_job *j);  /* offload thread: no registry */
	void (*done)(struct supervisor *s, struct sv_job *j); /* loop thread */
	void (*free)(struct sv_job *j);
};

int offload_start(struct supervisor *s);
void offload_stop(struct supervisor *s);
/* The eventfd that turns readable when jobs are done; call offload_complete() then. */
int offload_fd(struct supervisor *s);
void offload_complete(struct supervisor *s);
/* Takes j. */
void offload_submit(struct supervisor *s, struct sv_job *j);
