/* SPDX-License-Identifier: MIT */
/*
 * Blocking work off the event loop: one thread runs jobs in order (NVML queries, reading
 * region memory for checksums) and hands each finished job back through an eventfd, so that
 * its result is applied on the loop thread, the only one that touches the registry.
 * Without a thread (tests, fuzzing: s->offload NULL) a job runs inline.
 */
#pragma once

#include "supervisor.h"

struct sv_job {
	struct sv_job *next;
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
