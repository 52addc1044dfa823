/* SPDX-License-Identifier: MIT */
/*
 * PROTO_TRAJ_STEP on the supervisor's socket (issue 11): each step event goes through the
 * trajectory tracker (supervisor-traj.h) with the [policy] configuration and is answered with
 * PROTO_TRAJ_DECISION. This first cut is advisory: the supervisor decides and reports, the
 * framework acts on it (e.g. `env checkpoint` of the environment); the environment is taken as
 * dirty with unknown sizes (the cost predictor's priors) until the daemon passes its dirty set
 * and memory, runs the checkpoint itself and holds step-begin replies (see issue 11).
 */
#pragma once

#include "proto.h"
#include "supervisor.h"

int traj_ctl_on_step(struct supervisor *s, struct sv_client *c, const struct proto_traj_step *q);
/* At exit. */
void traj_ctl_free(struct supervisor *s);
