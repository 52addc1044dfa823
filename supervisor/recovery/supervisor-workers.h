/* SPDX-License-Identifier: MIT */
/*
 * Worker lifecycle: hello (or re-hello after a reconnect or our restart), death seen through
 * the pidfd, retention of a dead worker's regions until the timeout or the memory budget
 * releases them, the resync grace after a reconnect, and the journal that carries all of it
 * across a supervisor restart.
 */
#pragma once

#include "supervisor-journal.h"
#include "supervisor.h"

int workers_hello(struct supervisor *s, struct sv_client *c, const struct proto_hello *h);
/* The worker's pidfd fired (or the process is otherwise known gone). */
void supervisor_worker_died(struct supervisor *s, struct sv_worker *w);
/* Periodic work: retention timeouts, memory budget, resync grace, journal compaction. */
void workers_tick(struct supervisor *s);
/* vLLM and SGLang give a worker its rank as an argument, not as RANK/LOCAL_RANK: the first
 * communicator of the engine's TP size (tp; any multi-rank one when 0) that the worker's shim
 * announces sets its rank, over what its hello said. */
void workers_rank_from_comm(struct supervisor *s, struct sv_worker *w, int32_t rank,
			    uint32_t nranks, uint32_t tp);
/* Drops a region (released, expired): journals it. */
void workers_region_drop(struct supervisor *s, struct sv_region *rg);
/* Drops a worker and its regions: journals it. */
void workers_forget(struct supervisor *s, struct sv_worker *w);

/* Journal glue. */
void workers_journal_region(struct supervisor *s, const struct sv_region *rg);
/* The journal replay callback (userdata: the supervisor). */
int workers_restore_record(void *userdata, const struct journal_record *rec);
/* After replay: which journaled workers still live (same pid and start time). The rest's
 * regions are lost (their memory went with our fds); the live ones wait for their shim. */
void workers_restore_finish(struct supervisor *s);
/* Writes the current state as a fresh journal. */
int workers_journal_compact(struct supervisor *s);

/* /proc/PID/stat start time (clock ticks after boot); 0 when the process is gone. */
uint64_t process_starttime(pid_t pid);
