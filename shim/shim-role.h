/* SPDX-License-Identifier: MIT */
/* The process's current role (shim-role.c): the configured one until a promotion. */
#pragma once

#include "proto.h"

enum worker_role shim_role(void);
/* A promotion committed: from now on the process is a primary. */
void shim_role_promoted(void);
