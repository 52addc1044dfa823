/* SPDX-License-Identifier: MIT */
/*
 * shim-meminfo.c alone (suite shim, unit): BELAYER_SHADOW_MEM_INFO's parser is bounded and
 * refuses what is not DEV:FREE:TOTAL[,…]; a shadow answers each device's n-th call with the
 * n-th entry for that device and passes through beyond them; what the engine was told is
 * recorded and queued for the supervisor. The session and the role are stubbed.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shim-conn-queue.h"
#include "shim-meminfo.h"
#include "shim-regions.h"
#include "shim-role.h"

static enum worker_role role = ROLE_PRIMARY;
static uint64_t queued[256];
static size_t n_queued;

enum worker_role shim_role(void)
{
	return role;
}

void regions_lock(void)
{
}

void regions_unlock(void)
{
}

bool conn_active_locked(void)
{
	return true;
}

void conn_enqueue_locked(enum conn_item item, uint64_t id)
{
	assert_int_equal(item, CONN_MEM_INFO);
	if (n_queued < sizeof(queued) / sizeof(queued[0]))
		queued[n_queued++] = id;
}

static void parse_refuses_what_is_not_a_list(void **state)
{
	static const char *const bad[] = {
		"",
		",",
		"0:1",
		"0:1:2,",
		"0:1:2,,0:1:2",
		"x:1:2",
		"0:-1:2",
		"0: 1:2",
		"0:3:2",
		"16:1:2",
		"0:1:2;1:1:2",
		"0:1:2:3",
		"0:1:2 ",
		"+0:1:2",
		"0:1:99999999999999999999999",
	};
	struct proto_mem_info out[4];
	size_t n;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (bad[i][0] && meminfo_parse(bad[i], out, 4, &n) == 0)
			fail_msg("accepted \"%s\"", bad[i]);
	assert_int_equal(meminfo_parse("", out, 4, &n), 0); /* nothing given */
	assert_int_equal(n, 0);
	assert_int_equal(meminfo_parse(NULL, out, 4, &n), -EINVAL);
	/* bounded: more entries than the caller holds, more calls than a device records */
	assert_int_equal(meminfo_parse("0:1:2,0:1:2,0:1:2,0:1:2,0:1:2", out, 4, &n), -EINVAL);
	{
		char many[64 * 8 + 16] = "";
		struct proto_mem_info big[PROTO_MAX_MEM_INFO + 1];

		for (int i = 0; i <= PROTO_MAX_MEM_INFO; i++)
			strcat(many, i ? ",0:1:2" : "0:1:2");
		assert_int_equal(meminfo_parse(many, big, PROTO_MAX_MEM_INFO + 1, &n), -EINVAL);
	}
}

static void parse_numbers_each_device_in_order(void **state)
{
	struct proto_mem_info out[4];
	size_t n;

	(void)state;
	assert_int_equal(meminfo_parse("1:5:9,0:7:9,1:3:9", out, 4, &n), 0);
	assert_int_equal(n, 3);
	assert_int_equal(out[0].device, 1);
	assert_int_equal(out[0].seq, 0);
	assert_int_equal(out[1].device, 0);
	assert_int_equal(out[1].seq, 0);
	assert_int_equal(out[2].device, 1);
	assert_int_equal(out[2].seq, 1);
	assert_true(out[2].free == 3 && out[2].total == 9);
}

static void shadow_replays_then_passes_through(void **state)
{
	size_t fr, tot;
	struct proto_msg m;

	(void)state;
	role = ROLE_SHADOW;
	setenv("BELAYER_SHADOW_MEM_INFO", "0:700:1000,1:600:1000,0:500:1000", 1);
	n_queued = 0;
	fr = 10, tot = 1000; /* the device's own: the primary holds the rest */
	meminfo_answer(0, &fr, &tot);
	assert_true(fr == 700 && tot == 1000);
	fr = 10;
	meminfo_answer(0, &fr, &tot);
	assert_true(fr == 500 && tot == 1000);
	fr = 10;
	meminfo_answer(0, &fr, &tot); /* beyond the primary's: its own */
	assert_true(fr == 10 && tot == 1000);
	fr = 20;
	meminfo_answer(1, &fr, &tot);
	assert_true(fr == 600);
	meminfo_answer(-1, &fr, &tot); /* no device: untouched, not recorded */
	assert_true(fr == 600);
	/* each answer the engine got is queued as device << 32 | call, and builds its report */
	assert_int_equal(n_queued, 4);
	assert_true(queued[3] == ((uint64_t)1 << 32 | 0));
	assert_true(meminfo_build(queued[1], &m));
	assert_int_equal(m.type, PROTO_MEM_INFO);
	assert_true(m.mem_info.device == 0 && m.mem_info.seq == 1 && m.mem_info.free == 500);
	assert_false(meminfo_build((uint64_t)1 << 32 | 1, &m)); /* never called */
	assert_false(meminfo_build((uint64_t)PROTO_MAX_DEVICES << 32, &m));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(parse_refuses_what_is_not_a_list),
		cmocka_unit_test(parse_numbers_each_device_in_order),
		cmocka_unit_test(shadow_replays_then_passes_through),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
