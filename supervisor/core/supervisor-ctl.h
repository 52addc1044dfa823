/* SPDX-License-Identifier: MIT */
/*
 * Control requests (PROTO_CTL) from belayerctl. The core serves status (metrics, then each
 * subsystem's status events), config and events (subscribe); every other command goes to the
 * subsystem that registered it (supervisor-subsystem.h). Queries are open to every connected
 * peer (the socket's permissions already decide who connects).
 */
#pragma once

#include "supervisor.h"

int ctl_dispatch(struct supervisor *s, struct sv_client *c, const struct proto_ctl *ctl);
/* PROTO_END in reply to PROTO_CTL, after count replies. */
int ctl_send_end(struct supervisor *s, struct sv_client *c, uint32_t count);
