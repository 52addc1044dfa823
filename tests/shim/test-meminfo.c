/* SPDX-License-Identifier: MIT */
/*
 * shim-meminfo.c alone (suite shim, unit): BELAYER_SHADOW_MEM_INFO's parser is bounded and
 * refuses what is not RANK:GPU-UUID:FREE:TOTAL[,…]; a shadow answers each device's n-th call
 * with the n-th entry of its rank on that device's UUID (whatever its ordinal), of the one
 * rank recorded on that UUID when it does not know its rank, and passes through beyond them;
 * what the engine was told is recorded and queued for the supervisor. The session, the role,
 * the configuration (rank) and the devices' UUIDs are stubbed.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu-uuid.h"
#include "shim-config.h"
#include "shim-conn-queue.h"
#include "shim-device.h"
#include "shim-meminfo.h"
#include "shim-regions.h"
#include "shim-role.h"

static enum worker_role role = ROLE_PRIMARY;
static struct shim_config config = {.rank = -1};
/* the UUID of each ordinal of this process: byte 0 says which GPU */
static uint8_t dev_gpu[PROTO_MAX_DEVICES] = {0xa0, 0xa1};

#define GPU_A0 "GPU-a0000000-0000-4000-8000-000000000000"
#define GPU_A1 "GPU-a1000000-0000-4000-8000-000000000000"

const struct shim_config *shim_config(void)
{
	return &config;
}

void shim_device_uuid(CUdevice dev, uint8_t uuid[PROTO_UUID_LEN])
{
	char s[GPU_UUID_STR_LEN + 1];

	snprintf(s, sizeof(s), "GPU-%02x000000-0000-4000-8000-000000000000", dev_gpu[dev]);
	assert_int_equal(gpu_uuid_parse(s, uuid), 0);
}
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
		",",
		"0:" GPU_A0 ":1",
		"0:" GPU_A0 ":1:2,",
		"0:" GPU_A0 ":1:2,,0:" GPU_A0 ":1:2",
		"x:" GPU_A0 ":1:2",
		"-1:" GPU_A0 ":1:2",
		"2147483648:" GPU_A0 ":1:2",
		"0:1:2",
		"0:1:1:2",
		"0:GPU-a0000000:1:2",
		"0:GPU-a0000000-0000-4000-8000-00000000000:1:2",
		"0:GPU-a0000000-0000-4000-8000-0000000000000:1:2",
		"0:GPU-a0000000-0000-4000-8000_000000000000:1:2",
		"0:GPU-g0000000-0000-4000-8000-000000000000:1:2",
		"0:" GPU_A0 ":-1:2",
		"0:" GPU_A0 ": 1:2",
		"0:" GPU_A0 ":3:2",
		"0:" GPU_A0 ":1:2;1:" GPU_A0 ":1:2",
		"0:" GPU_A0 ":1:2:3",
		"0:" GPU_A0 ":1:2 ",
		"+0:" GPU_A0 ":1:2",
		"0:" GPU_A0 ":1:99999999999999999999999",
	};
	struct meminfo_given out[4];
	size_t n;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (meminfo_parse(bad[i], out, 4, &n) == 0)
			fail_msg("accepted \"%s\"", bad[i]);
	assert_int_equal(meminfo_parse("", out, 4, &n), 0); /* nothing given */
	assert_int_equal(n, 0);
	assert_int_equal(meminfo_parse(NULL, out, 4, &n), -EINVAL);
	/* bounded: more entries than the caller holds, more calls than a device records */
	{
		char five[5 * 64] = "";

		for (int i = 0; i < 5; i++)
			strcat(five, i ? ",0:" GPU_A0 ":1:2" : "0:" GPU_A0 ":1:2");
		assert_int_equal(meminfo_parse(five, out, 4, &n), -EINVAL);
	}
	{
		char many[64 * (PROTO_MAX_MEM_INFO + 1) + 16] = "";
		struct meminfo_given big[PROTO_MAX_MEM_INFO + 1];

		for (int i = 0; i <= PROTO_MAX_MEM_INFO; i++)
			strcat(many, i ? ",0:" GPU_A0 ":1:2" : "0:" GPU_A0 ":1:2");
		assert_int_equal(meminfo_parse(many, big, PROTO_MAX_MEM_INFO + 1, &n), -EINVAL);
	}
}

static void parse_numbers_each_rank_and_device_in_order(void **state)
{
	struct meminfo_given out[4];
	size_t n;

	(void)state;
	assert_int_equal(meminfo_parse("1:" GPU_A1 ":5:9,0:" GPU_A0 ":7:9,1:" GPU_A1
				       ":3:9,0:" GPU_A1 ":4:9",
				       out, 4, &n),
			 0);
	assert_int_equal(n, 4);
	assert_true(out[0].rank == 1 && out[0].seq == 0 && out[0].device_uuid[0] == 0xa1);
	assert_true(out[1].rank == 0 && out[1].seq == 0 && out[1].device_uuid[0] == 0xa0);
	assert_true(out[2].rank == 1 && out[2].seq == 1 && out[2].free == 3 && out[2].total == 9);
	assert_true(out[3].rank == 0 && out[3].seq == 0 && out[3].device_uuid[0] == 0xa1);
}

/* The answers a shadow process takes, given its rank and its one device (ordinal 0, as Ray
 * gives every worker its own CUDA_VISIBLE_DEVICES), in a child: the shim reads the
 * environment once per process. */
static size_t shadow_first_answer(int32_t rank, uint8_t gpu, const char *env)
{
	int fds[2], status;
	size_t fr = 1, tot = 1000;
	pid_t pid;

	assert_int_equal(pipe(fds), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		role = ROLE_SHADOW;
		config.rank = rank;
		dev_gpu[0] = gpu;
		setenv("BELAYER_SHADOW_MEM_INFO", env, 1);
		meminfo_answer(0, &fr, &tot);
		_exit(write(fds[1], &fr, sizeof(fr)) == (ssize_t)sizeof(fr) ? 0 : 1);
	}
	close(fds[1]);
	assert_int_equal(read(fds[0], &fr, sizeof(fr)), (ssize_t)sizeof(fr));
	close(fds[0]);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	return fr;
}

/* Issue 22: every rank's device is its 0 under Ray; rank r's shadow gets primary rank r's
 * answers, known by the rank and the UUID, not the ordinal. */
static void shadow_takes_its_ranks_answers(void **state)
{
	const char *env = "0:" GPU_A0 ":700:1000,1:" GPU_A1 ":300:1000";

	(void)state;
	assert_int_equal(shadow_first_answer(0, 0xa0, env), 700);
	assert_int_equal(shadow_first_answer(1, 0xa1, env), 300);
	/* its rank unknown (no RANK): the one rank recorded on its device */
	assert_int_equal(shadow_first_answer(-1, 0xa1, env), 300);
	assert_int_equal(shadow_first_answer(-1, 0xa0, env), 700);
	/* two ranks recorded on its device and its rank unknown: which is its own cannot be
	 * said, so its own figures */
	assert_int_equal(
		shadow_first_answer(-1, 0xa0, "0:" GPU_A0 ":700:1000,1:" GPU_A0 ":300:1000"), 1);
	/* its rank on another device: still its rank's (pairing is by rank), */
	assert_int_equal(shadow_first_answer(1, 0xa0, env), 300);
	/* a rank no primary rank had (RANK a global rank): the one rank recorded on its device */
	assert_int_equal(shadow_first_answer(5, 0xa1, env), 300);
	/* neither its rank nor its device recorded: its own figures */
	assert_int_equal(shadow_first_answer(2, 0xa2, env), 1);
}

static void shadow_replays_then_passes_through(void **state)
{
	size_t fr, tot;
	struct proto_msg m;

	(void)state;
	role = ROLE_SHADOW;
	config.rank = 0;
	setenv("BELAYER_SHADOW_MEM_INFO",
	       "0:" GPU_A0 ":700:1000,0:" GPU_A1 ":600:1000,0:" GPU_A0 ":500:1000", 1);
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
	assert_int_equal(m.mem_info.device_uuid[0], 0xa0); /* the report says which GPU */
	assert_true(meminfo_build(queued[3], &m));
	assert_int_equal(m.mem_info.device_uuid[0], 0xa1);
	assert_false(meminfo_build((uint64_t)1 << 32 | 1, &m)); /* never called */
	assert_false(meminfo_build((uint64_t)PROTO_MAX_DEVICES << 32, &m));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(parse_refuses_what_is_not_a_list),
		cmocka_unit_test(parse_numbers_each_rank_and_device_in_order),
		cmocka_unit_test(shadow_takes_its_ranks_answers),
		cmocka_unit_test(shadow_replays_then_passes_through),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
