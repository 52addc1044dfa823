/* SPDX-License-Identifier: MIT */
/*
 * Configured engines ([engine.NAME] sections): the supervisor launches each engine's primary
 * group (unless "external") and keeps one shadow group behind it, probes the primary's
 * health URL (readiness after a start, liveness while serving), and hands a primary death or
 * hang to the recovery state machine (supervisor-promote.h).
 *
 * A launched command runs in a process group of its own (its TP ranks, spawned by rank 0,
 * stay in it), so a group is stopped as a whole. Workers are matched to an engine by the
 * engine id of their hello and to a group by role; a worker that does not say its rank is
 * rank 0. The loop calls engines_tick() every ENGINES_TICK_MS.
 *
 * Adoption: each group's leader (pid + start time) and port are journaled (JOURNAL_ENGINE). A
 * restarted supervisor whose journal names a group that still runs adopts it instead of
 * launching another: it watches the leader through a pidfd (not its child any more: it cannot
 * be waited for, its new parent reaps it), its workers through theirs (restored from the
 * journal), and launches only what is missing. The adopted ranks must say hello again within
 * [retention] resync_grace; a primary group that did not is recovered as if it had died, a
 * shadow group that did not is replaced.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "supervisor-canary.h"
#include "supervisor-meminfo.h"
#include "supervisor.h"

#define ENGINES_TICK_MS 20

enum rec_phase {
	PHASE_DETECT,  /* death (or kill) -> the supervisor sees it */
	PHASE_OWNER,   /* surviving ranks stopped, owners proven gone */
	PHASE_HEALTH,  /* NVML verdict */
	PHASE_CONTENT, /* weights checksums */
	PHASE_LAYOUT,  /* shadow layout == primary layout, per rank */
	PHASE_REMAP,   /* MAPs + COMMIT to every shadow rank, all DONE */
	PHASE_CANARY,  /* the promoted group's answer == the primary's (supervisor-canary.h) */
	PHASE_READY,   /* serving: promoted (DONE) or cold-restarted (probe answers) */
	_PHASE_MAX,
};

/* One launched process group (a primary, a shadow or a cold restart). */
struct eng_proc {
	pid_t pid;	    /* the group leader (rank 0); 0: none */
	int pidfd;	    /* ours, to reap it (adopted: only to watch and signal it) */
	uint64_t starttime; /* the leader's, as journaled */
	uint32_t port;
	enum worker_role role;
	uint64_t started_ms;
	bool adopted; /* launched by a previous supervisor: not our child */
};

/* A group as the journal says (JOURNAL_ENGINE); pid 0: none. */
struct eng_journaled {
	pid_t pid;
	uint64_t starttime;
	uint32_t port;
};

/* An HTTP GET in flight, driven by the tick without blocking. */
struct eng_probe {
	int fd;
	uint64_t started_ms;
	bool sent;
	char buf[32];
	size_t n;
};

/* The last recovery's record, for events, status and the bench. */
struct recovery_record {
	uint64_t seq;		       /* 1, 2, ...; 0: none yet */
	uint64_t started_us;	       /* CLOCK_REALTIME of the detection */
	uint64_t phase_us[_PHASE_MAX]; /* duration of each phase (0: not run) */
	uint64_t total_us;
	bool promoted;
	bool finished;
	pid_t dead_pid;
	char trigger[64]; /* "exit", "liveness", "manual" */
	char reason[PROTO_MAX_STR + 1];
};

struct sv_recovery;
struct journal_record;

struct sv_engine {
	const struct sv_engine_config *cfg;
	struct eng_proc primary, shadow;
	uint32_t primary_port; /* the port the primary serves on now */
	bool primary_ready;    /* its probe answered since it started */
	uint64_t ready_ms;     /* when it became ready (its weights are loaded by then) */
	uint64_t probe_ok_ms;  /* last good probe of the primary, monotonic */
	uint64_t probe_fail_since_ms;
	uint64_t next_probe_ms;
	struct eng_probe probe;
	struct sv_recovery *rec; /* in progress */
	struct recovery_record last;
	uint64_t n_recoveries;
	uint64_t kill_hint_ns; /* monotonic ns of a kill the supervisor did or was asked to do */
	uint64_t shadow_backoff_ms; /* a shadow dying before this is not restarted */
	/* [0] primary, [1] shadow: replayed from the journal at start, then what was last
	 * journaled. */
	struct eng_journaled journaled[2];
	uint64_t adopt_deadline_ms; /* adopted ranks must have said hello by then; 0: none */
	bool adopt_broken;	    /* the adopted primary group lacks a rank: recover it now */
	uint64_t n_launches;	    /* groups this supervisor started */
	struct eng_canary canary;   /* the primary's recorded answer, the canaries' outcomes */
	/* The primary's cuMemGetInfo answers, for its shadows (supervisor-meminfo.h); a shadow
	 * group waits for the primary to be ready, so that it gets all of them. */
	struct eng_mem_info mem_info;
	bool shadow_deferred; /* launch the shadow group once the primary is ready */
};

struct sv_engines {
	size_t n;
	struct sv_engine e[CONFIG_ENGINES_MAX];
};

/* Launches every configured engine's primary and shadow, or adopts those the journal names
 * that still run. */
int engines_start(struct supervisor *s);
/* Journal replay (before engines_start) and compaction: the engines' JOURNAL_ENGINE records
 * and their primaries' cuMemGetInfo answers (JOURNAL_MEM_INFO, _GONE); engines_journal_count
 * bounds how many engines_journal_records writes. */
int engines_restore_record(struct supervisor *s, const struct journal_record *rec);
size_t engines_journal_records(struct supervisor *s, struct journal_record *recs, size_t max);
size_t engines_journal_count(const struct supervisor *s);
/* Groups of e launched by a previous supervisor and adopted (0..2). */
unsigned engines_adopted(const struct sv_engine *e);
/* Stops every group the supervisor launched or adopted (SIGKILL to the process groups) and
 * reaps those it launched; unless systemd is restarting the service (its unit's job is a
 * restart): then they are left running for the next supervisor to adopt. */
void engines_stop(struct supervisor *s);
void engines_tick(struct supervisor *s);
struct sv_engine *engines_find(struct supervisor *s, const char *name);

/* Registry hooks (supervisor-workers.c). */
void engines_worker_hello(struct supervisor *s, struct sv_worker *w);
void engines_worker_died(struct supervisor *s, struct sv_worker *w);
/* A kill the supervisor was asked for (belayerctl inject): the detect phase starts there. */
void engines_note_kill(struct supervisor *s, struct sv_worker *w);
/* Whether w's engine is being recovered now. */
bool engines_recovering(struct supervisor *s, const struct sv_worker *w);

/* Starts a process group: cmd through /bin/sh -c with {port}, the engine's env and role. */
int engines_launch(struct supervisor *s, struct sv_engine *e, const char *cmd,
		   enum worker_role role, uint32_t port, struct eng_proc *ret);
/* SIGKILLs p's process group and reaps the leader (bounded wait). */
void engines_kill_proc(struct eng_proc *p);
/* Drops the probe in flight (the primary moved). */
void engines_probe_reset(struct sv_engine *e);
/* Workers of engine e (alive, given role), rank-indexed into ret[0..tp); returns how many. */
size_t engines_workers(struct supervisor *s, const struct sv_engine *e, enum worker_role role,
		       struct sv_worker **ret, size_t max);
int32_t worker_rank(const struct sv_worker *w);

uint64_t now_ns(void);

/* The engines' metrics: readiness and the last recovery's phases (the bench reads these). */
struct metrics_collector;
void engines_collect_metrics(struct supervisor *s, struct metrics_collector *col);
