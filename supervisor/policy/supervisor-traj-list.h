/* SPDX-License-Identifier: MIT */
/*
 * PROTO_TRAJ_LIST: PROTO_TRAJ_INFO per trajectory (the tracker's, then those only the gateway
 * has seen) and per environment, closed by PROTO_END; open to every peer, like the queries.
 */
#pragma once

#include "supervisor.h"

int ctl_traj_list(struct supervisor *s, struct sv_client *c, const struct proto_traj_list *q);
