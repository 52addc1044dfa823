/* SPDX-License-Identifier: MIT */
/*
 * Control requests (PROTO_CTL) from belayerctl: status (metrics), workers, regions, config,
 * events (subscribe), inject (signal a worker: test and drill use), health (run checks).
 * Queries are open to every connected peer (the socket's permissions already decide who
 * connects); inject needs root or the worker's own uid, and [security] allow_inject.
 */
#pragma once

#include "supervisor.h"

int ctl_dispatch(struct supervisor *s, struct sv_client *c, const struct proto_ctl *ctl);
/* PROTO_TRAJ_LIST: PROTO_TRAJ_INFO per trajectory (the tracker's, then those only the gateway
 * has seen) and per environment, closed by PROTO_END; open to every peer, like the queries. */
int ctl_traj_list(struct supervisor *s, struct sv_client *c, const struct proto_traj_list *q);
