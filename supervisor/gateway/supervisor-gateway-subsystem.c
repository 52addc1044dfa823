/* SPDX-License-Identifier: MIT */
/* The engines' gateways as a subsystem of the core: listeners in the loop, started once the
 * engines are. */
#include "supervisor-gateway-stats.h"
#include "supervisor-gateway.h"
#include "supervisor-subsystem.h"
#include "supervisor.h"
#include "sv-gateway.h"

static int gateway_subsystem_start(struct supervisor *s, struct event_base *base)
{
	if (!s->config.n_engines)
		return 0;
	return gateway_start(s, base);
}

const struct sv_subsystem gateway_subsystem = {
	.name = "gateway",
	.start = gateway_subsystem_start,
	.collect_metrics = gateway_collect_metrics,
	.finish = gateway_stop,
};
