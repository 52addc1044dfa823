/* SPDX-License-Identifier: MIT */
/*
 * Recovery of an engine whose primary died or hung (DESIGN §1.2): the promotion state machine
 *   detect -> owner (surviving ranks SIGKILLed, their pidfds waited for) -> health (NVML)
 *   -> content (weights checksums against those recorded while the owner lived)
 *   -> layout (per rank: shadow's parked layout == primary's) -> remap (MAPs + COMMIT to every
 *   shadow rank, all DONE ok) -> canary (the promoted group answers the canary prompt as the
 *   primary did at the same weights version; supervisor-canary.h) -> ready: the shadow group is the primary, the dead primary's
 *   regions are released, a new shadow starts in the background.
 * Any failure or doubt at any step -> cold restart: every process of the engine is stopped,
 * the dead primaries' memory released, the cold command started; ready when its probe answers.
 * Every recovery's phase durations go to the event stream and `belayerctl status --json`.
 */
#pragma once

#include "supervisor-engines.h"

/* Starts a recovery of e (no-op when one runs). trigger: "exit", "liveness", "manual",
 * "adopt" (supervisor-engines.c: an adopted group that is not whole). */
void promote_start(struct supervisor *s, struct sv_engine *e, const char *trigger, pid_t dead_pid,
		   uint64_t detect_ns);
/* A shadow rank's PROTO_PROMOTE_DONE. */
void promote_on_done(struct supervisor *s, struct sv_worker *w, const struct proto_promote_done *d);
/* The canary's verdict on recovery seq (supervisor-canary.c): promoted, or cold with why. */
void promote_canary_done(struct supervisor *s, struct sv_engine *e, uint64_t seq, bool ok,
			 const char *why);
/* Timeouts and the cold restart's readiness; called by engines_tick(). */
void promote_tick(struct supervisor *s, struct sv_engine *e);
/* The engine's primary probe answered (cold restart ready). */
void promote_primary_ready(struct supervisor *s, struct sv_engine *e);
/* A worker of e died while a recovery runs. */
void promote_worker_died(struct supervisor *s, struct sv_engine *e, struct sv_worker *w);
/* Records live checksums of settled weights regions of e's primaries (off the loop). */
void promote_record_checksums(struct supervisor *s, struct sv_engine *e);
void promote_free(struct sv_engine *e);
/* Whether a failure of e's primary now would be promoted (as far as the supervisor can tell
 * before the GPU and content checks run): serving, shadow group complete and parked, layouts
 * equal, and every weights region's checksum recorded at its current version. */
bool promote_armed(struct supervisor *s, const struct sv_engine *e);
const char *rec_phase_to_string(enum rec_phase p);
/* "none", "running", "promoted", "cold_restart" or "failed": e's last recovery. */
const char *promote_outcome(const struct sv_engine *e);
/* For CTL_STATUS: per engine with a recovery, its summary as a PROTO_EVENT ("engine=NAME
 * seq=N outcome=O trigger=T detect_us=... total_us=...") and, after a fallback, its reason
 * ("engine=NAME reason=TEXT"). Adds the count sent to *ret_n. */
int promote_status_events(struct supervisor *s, struct sv_client *c, uint32_t *ret_n);
