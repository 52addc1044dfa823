/* SPDX-License-Identifier: MIT */
/*
 * PROTO_TRAJ_STEP on the supervisor's socket (issue 11): each step event goes through the
 * trajectory tracker (supervisor-traj.h) with the [policy] configuration and is answered with
 * PROTO_TRAJ_DECISION.
 *
 * For an environment the supervisor manages (created, adopted or taken back through `env`),
 * a step end sees it as it is (envs_view: its eBPF dirty set, the bytes of its dirty paths,
 * its memory) and a CHECKPOINT / CHECKPOINT_SYNC decision runs the checkpoint as the
 * environment's job (trajectory and turn from the step). The step-begin that ends the bubble
 * reports that checkpoint ("ckpt", "ckus", "abrt"); arriving while it still runs, its reply is
 * held until the environment runs again (the thaw), at most policy_action_hold_us(): at the
 * bound the checkpoint is cancelled and the reply goes out at the thaw that follows (a CRIU
 * dump already running is not interrupted: that reply is late, and counted). every-turn holds
 * until the thaw, unbounded. A checkpoint that completes teaches the cost predictor (and
 * protects the trajectory's work); an aborted one leaves the turn unprotected, so the force
 * rules pick it up at a later step end. Unknown environments: the decision is advice only
 * (taken as dirty, the cost model's priors), as a framework running its own checkpoints needs.
 *
 * Loop thread only, except the wakeup the offload thread writes when a checkpoint thaws.
 */
#pragma once

#include "proto.h"
#include "supervisor.h"
#include "sv-policy.h"

int traj_ctl_on_step(struct supervisor *s, struct sv_client *c, const struct proto_traj_step *q);
/* At exit, after the offload thread stopped. */
void traj_ctl_free(struct supervisor *s);
