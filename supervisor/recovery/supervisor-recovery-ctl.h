/* SPDX-License-Identifier: MIT */
/*
 * The control requests (PROTO_CTL) about workers: workers, regions, inject (signal a worker:
 * test and drill use), health (run checks), promote (manual failover). Inject and promote
 * need root or the worker's (the supervisor's) own uid, and [security] allow_inject.
 */
#pragma once

#include "supervisor-subsystem.h"

extern const struct sv_ctl_handler recovery_ctl_handlers[];
