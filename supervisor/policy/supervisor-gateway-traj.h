/* SPDX-License-Identifier: MIT */
/*
 * The gateway's view of trajectories (issue 11): a generation request that carries
 * `X-Belayer-Trajectory: ID` is its trajectory's pending request. Per trajectory the table
 * keeps that request's prompt tokens, the tokens generated so far and its decode rate, and the
 * output tokens of the trajectory's last completed request, so that a step event the framework
 * sent without them (PROTO_TRAJ_STEP with plen/gen/mtps or out 0) still feeds the bubble
 * predictor.
 *
 * The decode rate is per request: tokens per second over its recent streamed tokens (a window
 * of the last 0.5 to 1 s of token events, the time to its first token excluded; restarted when
 * a resumed attempt begins, so a recovery's gap does not count). Between requests the
 * trajectory keeps the rate its last request ended with; a request that has streamed a single
 * token event has no rate of its own yet and reports that one too.
 *
 * Only token-in/token-out requests (the ones the gateway journals) are tracked; a tagged
 * request the gateway proxies unchanged is validated and passed on, not counted. When several
 * requests of one trajectory are in flight, the latest is the pending one. Loop-free (no
 * libevent) so the socket handler and the tests use it directly; the clock is the caller's
 * (CLOCK_MONOTONIC µs).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "proto.h"
#include "sv-policy.h"

struct supervisor;

/* What the gateway knows of a trajectory's pending (in flight) request. */
struct gateway_traj_pending {
	uint64_t prompt_tokens, generated_tokens;
	uint64_t decode_mtps; /* tokens/s x 1000; 0: not measured yet */
	bool active;	      /* a request is in flight (else: the counts are 0, the rate the
				 last request's) */
};

/* -ENOENT: the gateway has seen no tagged request of that trajectory (or there is no gateway). */
int gateway_traj_pending(struct supervisor *s, const char *trajectory,
			 struct gateway_traj_pending *ret);
/* Output tokens of the trajectory's last completed request. -ENOENT: none completed. */
int gateway_traj_last_output(struct supervisor *s, const char *trajectory, uint64_t *ret);

/* Lookups: -ENOENT when the id is unknown (or, for last_output, none completed). */
int gateway_trajs_get(const struct gateway_trajs *t, const char *id,
		      struct gateway_traj_pending *ret);
int gateway_trajs_last_output(const struct gateway_trajs *t, const char *id, uint64_t *ret);
/* Calls cb for every trajectory known, in no order; stops at the first cb < 0 and returns it. */
int gateway_trajs_foreach(const struct gateway_trajs *t,
			  int (*cb)(const char *id, const struct gateway_traj_pending *p,
				    void *userdata),
			  void *userdata);
