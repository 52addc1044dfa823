/* SPDX-License-Identifier: MIT */
/* The gateway's per-trajectory table (supervisor-gateway-traj.h) on scripted clocks: the
 * header check, the pending request's counts, the decode rate over its recent window, the last
 * completed request's output, superseded and forgotten requests. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "supervisor-gateway-traj.h"

static void ids_are_checked(void **state)
{
	char id[PROTO_MAX_STR + 2];

	(void)state;
	assert_int_equal(gateway_traj_id_check("rollout-1/traj-7"), 0);
	assert_int_equal(gateway_traj_id_check("~!{}"), 0);
	assert_int_equal(gateway_traj_id_check(""), -EINVAL);
	assert_int_equal(gateway_traj_id_check(NULL), -EINVAL);
	assert_int_equal(gateway_traj_id_check("a b"), -EINVAL);
	assert_int_equal(gateway_traj_id_check("a\tb"), -EINVAL);
	assert_int_equal(gateway_traj_id_check("a\x7f"), -EINVAL);
	assert_int_equal(gateway_traj_id_check("caf\xc3\xa9"), -EINVAL);
	memset(id, 'a', PROTO_MAX_STR);
	id[PROTO_MAX_STR] = 0;
	assert_int_equal(gateway_traj_id_check(id), 0);
	id[PROTO_MAX_STR] = 'a';
	id[PROTO_MAX_STR + 1] = 0;
	assert_int_equal(gateway_traj_id_check(id), -EINVAL);
}

static void pending_rate_and_last_output(void **state)
{
	struct gateway_trajs *t = gateway_trajs_new(8);
	struct gateway_traj_ticket k;
	struct gateway_traj_pending p;
	uint64_t out;

	(void)state;
	assert_non_null(t);
	assert_int_equal(gateway_trajs_get(t, "a", &p), -ENOENT);
	assert_int_equal(gateway_trajs_begin(t, "a b", 5, 0, &k), -EINVAL);
	assert_int_equal(k.seq, 0);
	assert_int_equal(gateway_trajs_begin(t, "a", 100, 1000000, &k), 0);
	gateway_trajs_attempt(t, &k);
	assert_int_equal(gateway_trajs_get(t, "a", &p), 0);
	assert_true(p.active);
	assert_int_equal(p.prompt_tokens, 100);
	assert_int_equal(p.generated_tokens, 0);
	assert_int_equal(p.decode_mtps, 0);
	/* First token after a 2 s prefill: no rate yet (the prefill is not decode time). */
	gateway_trajs_progress(t, &k, 1, 3000000);
	assert_int_equal(gateway_trajs_get(t, "a", &p), 0);
	assert_int_equal(p.generated_tokens, 1);
	assert_int_equal(p.decode_mtps, 0);
	/* 50 tokens/s for 2 s: one token every 20 ms. */
	for (uint64_t g = 2; g <= 101; g++)
		gateway_trajs_progress(t, &k, g, 3000000 + (g - 1) * 20000);
	assert_int_equal(gateway_trajs_get(t, "a", &p), 0);
	assert_int_equal(p.generated_tokens, 101);
	assert_int_equal(p.decode_mtps, 50000);
	/* It slows to 10 tokens/s: within a second the rate is the new one, not the average. */
	for (uint64_t g = 102; g <= 115; g++)
		gateway_trajs_progress(t, &k, g, 5000000 + (g - 101) * 100000);
	assert_int_equal(gateway_trajs_get(t, "a", &p), 0);
	assert_int_equal(p.decode_mtps, 10000);
	/* A counter that does not advance changes nothing. */
	gateway_trajs_progress(t, &k, 115, 9000000);
	assert_int_equal(gateway_trajs_get(t, "a", &p), 0);
	assert_int_equal(p.decode_mtps, 10000);
	assert_int_equal(gateway_trajs_last_output(t, "a", &out), -ENOENT);
	gateway_trajs_end(t, &k, true, 120, 7000000);
	assert_int_equal(k.seq, 0);
	assert_int_equal(gateway_trajs_get(t, "a", &p), 0);
	assert_false(p.active);
	assert_int_equal(p.generated_tokens, 0);
	assert_int_equal(p.decode_mtps, 10000); /* the last request's, until the next measures */
	assert_int_equal(gateway_trajs_last_output(t, "a", &out), 0);
	assert_int_equal(out, 120);
	/* A request that fails (no finish reason) leaves the last output as it was. */
	assert_int_equal(gateway_trajs_begin(t, "a", 10, 8000000, &k), 0);
	gateway_trajs_end(t, &k, false, 3, 8100000);
	assert_int_equal(gateway_trajs_last_output(t, "a", &out), 0);
	assert_int_equal(out, 120);
	gateway_trajs_free(t);
}

static int count(const char *id, const struct gateway_traj_pending *p, void *userdata)
{
	(void)id;
	(void)p;
	++*(int *)userdata;
	return 0;
}

static void superseded_and_forgotten(void **state)
{
	struct gateway_trajs *t = gateway_trajs_new(2);
	struct gateway_traj_ticket k1, k2, kb, kc;
	struct gateway_traj_pending p;
	uint64_t out;
	int n = 0;

	(void)state;
	assert_null(gateway_trajs_new(0));
	assert_int_equal(gateway_trajs_begin(t, "a", 10, 1, &k1), 0);
	assert_int_equal(gateway_trajs_begin(t, "a", 20, 2, &k2), 0);
	/* The older request no longer counts: the latest is the pending one. */
	gateway_trajs_progress(t, &k1, 7, 3);
	gateway_trajs_progress(t, &k2, 2, 4);
	assert_int_equal(gateway_trajs_get(t, "a", &p), 0);
	assert_int_equal(p.prompt_tokens, 20);
	assert_int_equal(p.generated_tokens, 2);
	gateway_trajs_end(t, &k1, true, 7, 5);
	assert_int_equal(gateway_trajs_last_output(t, "a", &out), -ENOENT);
	assert_true(gateway_trajs_get(t, "a", &p) == 0 && p.active);
	/* Two slots: a third trajectory forgets the least recently active one ("b"). */
	assert_int_equal(gateway_trajs_begin(t, "b", 1, 6, &kb), 0);
	gateway_trajs_progress(t, &k2, 3, 10);
	assert_int_equal(gateway_trajs_begin(t, "c", 1, 11, &kc), 0);
	assert_int_equal(gateway_trajs_get(t, "b", &p), -ENOENT);
	assert_int_equal(gateway_trajs_get(t, "a", &p), 0);
	/* b's request still runs: its updates land nowhere, not on c. */
	gateway_trajs_progress(t, &kb, 50, 12);
	gateway_trajs_end(t, &kb, true, 50, 13);
	assert_int_equal(gateway_trajs_get(t, "c", &p), 0);
	assert_true(p.active);
	assert_int_equal(p.generated_tokens, 0);
	assert_int_equal(gateway_trajs_last_output(t, "c", &out), -ENOENT);
	assert_int_equal(gateway_trajs_foreach(t, count, &n), 0);
	assert_int_equal(n, 2);
	gateway_trajs_free(t);
	/* No table (no gateway): nothing known, nothing crashes. */
	gateway_trajs_progress(NULL, &k2, 1, 1);
	gateway_trajs_end(NULL, &k2, true, 1, 1);
	assert_int_equal(gateway_trajs_get(NULL, "a", &p), -ENOENT);
	gateway_trajs_free(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(ids_are_checked),
		cmocka_unit_test(pending_rate_and_last_output),
		cmocka_unit_test(superseded_and_forgotten),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
