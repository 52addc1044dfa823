/* SPDX-License-Identifier: MIT */
/*
 * Runs the health checks (supervisor-health.h) for the daemon: the periodic GPU check, the
 * checks a peer asks for (CTL_HEALTH: replies when the offload thread is done), and the
 * content checksums recorded when a worker dies (its memory can no longer change).
 */
#pragma once

#include "supervisor.h"

void checks_gpu_periodic(struct supervisor *s);
/* pid 0: GPU only. Replies to c with HEALTH_INFO messages and END, asynchronously. */
int checks_request(struct supervisor *s, struct sv_client *c, pid_t pid, int dev);
/* Records checksums of w's weights regions that have none at their current version. */
void checks_record_content(struct supervisor *s, struct sv_worker *w);
