/* SPDX-License-Identifier: MIT */
/*
 * NCCL communicators (DESIGN §1.4, issue 12): every communicator a shim announces
 * (PROTO_NCCL_COMM), with its progress counters mapped read-only, grouped by communicator
 * hash; process groups inferred from shared communicators; and the hang detector.
 *
 * A communicator group is declared hung when some rank has a collective in flight
 * (issued, not completed) and
 *   - a rank of the group is dead (at once: the others can never complete), or
 *   - nothing in the group progressed for [nccl] hang_timeout and a rank that has not caught
 *     up with the others is stopped (SIGSTOP, a debugger) or is itself blocked in a
 *     collective of another communicator, or
 *   - every rank has been inside the same collective for [nccl] stall_timeout with none
 *     completing (a hang in the library, the device or the fabric).
 * A rank that is merely behind but alive and not inside NCCL (an engine's scheduler between
 * steps, a slow rank that still progresses) is not a hang: the others wait for it by design.
 *
 * Then the diagnosis (communicator, rank, pid, collective sequence, how long) goes to the
 * event stream (EVENT_NCCL) and `belayerctl status`, and the group is stopped: a configured
 * engine's primaries through the recovery path (supervisor-promote.h: survivors SIGKILLed,
 * shadow promoted or cold restart), other processes of the inferred group by SIGKILL.
 */
#pragma once

#include "supervisor.h"

struct sv_client;

int nccl_on_comm(struct supervisor *s, struct sv_client *c, struct proto_nccl_comm *m);
int nccl_on_comm_end(struct supervisor *s, struct sv_client *c,
		     const struct proto_nccl_comm_end *m);
/* A worker died: its communicators keep their counters (where it stopped) for the diagnosis,
 * and peers outside any configured engine are stopped. Called before the engine path. */
void nccl_worker_died(struct supervisor *s, struct sv_worker *w);
/* The registry drops w: its live communicators go with it. */
void nccl_worker_removed(struct sv_worker *w);
/* The detector; the loop calls it every [nccl] poll_interval. */
void nccl_tick(struct supervisor *s);
/* For CTL_STATUS, once any communicator was announced: a summary and the last diagnosis as
 * PROTO_EVENT (kind EVENT_NCCL); adds the count sent to *ret_n. */
int nccl_status_events(struct supervisor *s, struct sv_client *c, uint32_t *ret_n);
/* Frees everything (the supervisor's end). */
void nccl_finish(void);
