/* SPDX-License-Identifier: MIT */
/*
 * What a parked shadow costs (issue 22 item 4), as `belayerctl workers` reports it per worker:
 * the device memory NVML reports for the process (on the emulator: the distinct allocations
 * it maps) and its host Rss / Pss. The real supervisor runs the engine stand-in (TP=2, under
 * libbelayer.so, on the emulated GPU) with its shadow group.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "sv-engine.h"
#include "sv-test.h"
#include "test-util.h"
#include "util.h"

static struct sv sv;
static char weights[PATH_MAX];
static uint32_t baseline[ENGINE_TOKENS];

static int setup(void **state)
{
	engine_setup(&sv, weights, sizeof(weights), baseline);
	return 0;
}

static int teardown(void **state)
{
	return engine_teardown(&sv);
}

/* The worker's info, once it has been measured (bounded wait). */
static struct proto_worker_info measured(pid_t pid)
{
	uint64_t deadline = mono_ms() + ENGINE_READY_MS;

	for (;;) {
		struct proto_msg m[32];
		int n = ctl_collect(&sv, CTL_WORKERS, 0, CTL_ACT_NONE, -1, m, ARRAY_SIZE(m));

		for (int i = 0; i < n; i++)
			if (m[i].type == PROTO_WORKER_INFO &&
			    m[i].worker_info.pid == (uint32_t)pid && m[i].worker_info.device_used &&
			    m[i].worker_info.rss)
				return m[i].worker_info;
		if (mono_ms() > deadline)
			fail_msg("pid %d not measured within %d ms", pid, ENGINE_READY_MS);
		(void)poll(NULL, 0, 50);
	}
}

/* What the emulator says pid uses: its distinct mapped allocations (/proc/PID/maps:
 * "/memfd:belayer-emu:<run>:d<dev>:<id>:<bytes> (deleted)"), each counted once. */
static uint64_t mapped_device_bytes(pid_t pid)
{
	char path[64], line[PATH_MAX + 128];
	uint64_t ids[4096], bytes = 0;
	size_t n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "re");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "belayer-emu:"), *q;
		uint64_t id, size;
		bool seen = false;

		if (!p || !(q = strrchr(p, ':')))
			continue;
		size = strtoull(q + 1, NULL, 10);
		*q = '\0';
		id = strtoull(strrchr(p, ':') + 1, NULL, 10);
		for (size_t i = 0; i < n; i++)
			seen |= ids[i] == id;
		if (seen || n == ARRAY_SIZE(ids))
			continue;
		ids[n++] = id;
		bytes += size;
	}
	fclose(f);
	return bytes;
}

/* The worker's info once its device figure is what it maps now: the supervisor measures every
 * 2 s, and a worker may still map something after it serves (its first request's buffers), so
 * the first measurement can be older than the mapping it is compared with. Bounded wait. */
static struct proto_worker_info measured_exact(pid_t pid)
{
	uint64_t deadline = mono_ms() + ENGINE_READY_MS;
	struct proto_worker_info w;

	while ((w = measured(pid)).device_used - 1 != mapped_device_bytes(pid)) {
		if (mono_ms() > deadline)
			fail_msg("pid %d reported %" PRIu64 " device bytes, maps %" PRIu64, pid,
				 w.device_used - 1, mapped_device_bytes(pid));
		(void)poll(NULL, 0, 100);
	}
	return w;
}

/* A parked shadow rank holds a fraction of its primary's device memory (one scratch granule
 * for its weights and KV, real memory for the rest), and both are reported as the emulator
 * accounts them; host Rss / Pss are the kernel's. Promoted, the former shadow maps the dead
 * primary's memory and is reported with it. */
static void costs_reported(const char *shadow_extra, const char *const *more)
{
	const char *argv[] = {BELAYERCTL_PATH, "workers", "--json", NULL};
	struct proto_worker_info p, s;
	char *out = NULL;
	pid_t pp, sp;

	engine_start(&sv, weights, sv_free_port(), sv_free_port(), shadow_extra, more);
	engine_wait_serving(&sv, baseline);
	engine_wait_promotable(&sv);
	pp = engine_worker_pid(&sv, ROLE_PRIMARY, 1);
	sp = engine_worker_pid(&sv, ROLE_SHADOW, 1);
	p = measured_exact(pp);
	s = measured_exact(sp);
	print_message("primary rank 1: device %" PRIu64 " rss %" PRIu64 " pss %" PRIu64
		      "; parked shadow rank 1: device %" PRIu64 " rss %" PRIu64 " pss %" PRIu64
		      " (shmem %" PRIu64 ")\n",
		      p.device_used - 1, p.rss, p.pss, s.device_used - 1, s.rss, s.pss,
		      s.pss_shmem);
	/* Nothing maps or unmaps while both are idle: the figures stay exact. */
	assert_int_equal(p.device_used - 1, mapped_device_bytes(pp));
	assert_int_equal(s.device_used - 1, mapped_device_bytes(sp));
	assert_true(s.device_used - 1 > 0);
	assert_true(s.device_used - 1 < (p.device_used - 1) / 2);
	assert_true(s.pss > 0 && s.pss <= s.rss && s.pss_shmem <= s.pss);
	assert_int_equal(run_tool(&sv, argv, &out), 0);
	assert_non_null(strstr(out, "\"device_bytes\""));
	assert_non_null(strstr(out, "\"pss_bytes\""));
	free(out);

	assert_int_equal(kill(pp, SIGKILL), 0);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	{
		uint64_t deadline = mono_ms() + ENGINE_READY_MS;

		/* Measured again after the promotion: the dead primary's memory is its own now. */
		while ((s = measured(sp)).device_used - 1 < p.device_used - 1) {
			if (mono_ms() > deadline)
				fail_msg("the promoted rank reports %" PRIu64 " device bytes",
					 s.device_used - 1);
			(void)poll(NULL, 0, 100);
		}
	}
}

static void parked_shadow_costs_reported(void **state)
{
	costs_reported(NULL, NULL);
}

/* Index tables as large allocations next to the KV cache, as vLLM's and SGLang's (the
 * stand-in's --index-tables): `other`, so the parked shadow holds them as real memory (one
 * 20 MiB segment more than without, review finding 2), still a fraction of its primary's. */
static void parked_shadow_costs_with_index_tables(void **state)
{
	static char primary[PATH_MAX * 2 + 256];
	const char *const more[] = {primary, NULL};

	snprintf(primary, sizeof(primary),
		 "engine.t.primary=%s --model %s --port {port} --tp 2 --kv-cache-bytes 16M "
		 "--index-tables",
		 ENGINE_PATH, weights);
	costs_reported("--kv-cache-bytes 16M --index-tables", more);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(parked_shadow_costs_reported, setup, teardown),
		cmocka_unit_test_setup_teardown(parked_shadow_costs_with_index_tables, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
