/* SPDX-License-Identifier: MIT */
/*
 * A shadow that withdraws a region before it parks: the real supervisor launches
 * shadow-withdraw (under libbelayer.so, emulated GPU) as primary and, with --withdraw, as
 * shadow. The shadow allocates an extra weights region first, then the primary's layout, parks
 * with all four (its shim described each with SHADOW_REGION), then frees the extra one: its shim
 * withdraws it (REGION_RELEASE of that id) and parks again with three. The supervisor must drop
 * the withdrawn region from the shadow's layout: the shadow then pairs with the primary (count
 * and hash), the engine is promotable, and a kill of the primary is promoted. Were the region
 * kept, the shadow's described regions would disagree with its parked layout: never
 * promotable.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto.h"
#include "sv-test.h"
#include "util.h"

#define WAIT_MS 30000

static struct sv sv;

static uint64_t engine_metric(const char *name)
{
	return metric(&sv, name, "engine=\"w\"");
}

/* Engine w's live worker of this role (TP=1). */
static bool worker(enum worker_role role, struct proto_worker_info *ret)
{
	static struct proto_msg m[32];
	int n = ctl_collect(&sv, CTL_WORKERS, 0, CTL_ACT_NONE, -1, m, ARRAY_SIZE(m));

	for (int i = 0; i < n; i++)
		if (m[i].type == PROTO_WORKER_INFO && m[i].worker_info.state == WORKER_ALIVE &&
		    m[i].worker_info.role == role && strcmp(m[i].worker_info.engine_id, "w") == 0) {
			*ret = m[i].worker_info;
			return true;
		}
	return false;
}

static int setup(void **state)
{
	(void)state;
	sv_setup(&sv);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (sv.pid > 0)
		(void)sv_kill(&sv, SIGTERM);
	sv_teardown(&sv);
	return 0;
}

static void withdrawn_region_leaves_the_layout(void **state)
{
	static char primary[4096], shadow[4096], env[4096], port[64], sport[64];
	const char *settings[] = {primary, shadow, env, port, sport, "engine.w.tp=1",
				  "engine.w.verify=none", "engine.w.probe_interval=50ms",
				  /* its minimal engine serves no tokens to ask */
				  "recovery.canary=no", NULL};
	struct proto_worker_info p, s;
	uint64_t deadline, o;

	(void)state;
	snprintf(primary, sizeof(primary), "engine.w.primary=%s --port {port} 16 8",
		 SHADOW_WITHDRAW_PATH);
	snprintf(shadow, sizeof(shadow), "engine.w.shadow=%s --port {port} --withdraw 16 8",
		 SHADOW_WITHDRAW_PATH);
	snprintf(env, sizeof(env), "engine.w.env=LD_PRELOAD=%s BELAYER_PARK_QUIET_MS=200",
		 SHIM_PATH);
	snprintf(port, sizeof(port), "engine.w.port=%u", sv_free_port());
	snprintf(sport, sizeof(sport), "engine.w.shadow_port=%u", sv_free_port());
	sv_start(&sv, settings);

	/* The supervisor's own verdict: the shadow parked with the primary's layout. */
	deadline = mono_ms() + WAIT_MS;
	while (engine_metric("belayer_engine_promotable") != 1) {
		if (mono_ms() > deadline)
			fail_msg("engine w not promotable within %d ms", WAIT_MS);
		(void)poll(NULL, 0, 20);
	}
	assert_true(worker(ROLE_PRIMARY, &p));
	assert_true(worker(ROLE_SHADOW, &s));
	assert_true(s.parked);
	/* two weights regions and the KV cache on both sides, not the withdrawn third */
	assert_int_equal(p.layout_n, 3);
	assert_int_equal(s.layout_n, 3);
	assert_true(p.layout_hash == s.layout_hash);

	/* And a failure of the primary is promoted. */
	assert_int_equal(kill((pid_t)p.pid, SIGKILL), 0);
	deadline = mono_ms() + WAIT_MS;
	while (engine_metric("belayer_recovery_last_seq") < 1 ||
	       (o = engine_metric("belayer_recovery_last_outcome")) == 1) {
		if (mono_ms() > deadline)
			fail_msg("the recovery did not end within %d ms", WAIT_MS);
		(void)poll(NULL, 0, 20);
	}
	assert_int_equal(o, 2); /* promoted */
	assert_int_equal(metric(&sv, "belayer_recoveries_total", "outcome=\"promoted\""), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(withdrawn_region_leaves_the_layout, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
