/* SPDX-License-Identifier: MIT */
/*
 * A worker's regions over the socket: PROTO_REGION_ANNOUNCE (the fd is kept and journaled),
 * PROTO_REGION_RELEASE, PROTO_REGION_FETCH (the fd handed to a permitted peer of the same
 * engine group).
 */
#pragma once

#include "supervisor.h"

/* One of the three messages; takes ownership of its fds. */
int regions_on_message(struct supervisor *s, struct sv_client *c, struct proto_msg *m);
