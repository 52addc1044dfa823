/* SPDX-License-Identifier: MIT */
/*
 * The process's role: the configured one (BELAYER_ROLE) until a promotion commits, which makes
 * a shadow a primary for the rest of its life (a forked child keeps the parent's current role).
 */

#include "shim-config.h"
#include "shim-role.h"

static int role_now = -1; /* -1: as configured */

enum worker_role shim_role(void)
{
	int r = __atomic_load_n(&role_now, __ATOMIC_ACQUIRE);

	return r < 0 ? shim_config()->role : (enum worker_role)r;
}

void shim_role_promoted(void)
{
	__atomic_store_n(&role_now, (int)ROLE_PRIMARY, __ATOMIC_RELEASE);
}
