/* SPDX-License-Identifier: MIT */
/*
 * The canary before traffic (issue 22 item 3): the supervisor records the primary's greedy
 * answer to the canary prompt at each weights version, and a promoted group must give the same
 * answer before it is marked primary and the gateway routes to it. The real supervisor runs the
 * engine stand-in (TP=2, under libbelayer.so, on the emulated GPU) with a gateway in front.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto.h"
#include "sv-engine.h"
#include "sv-test.h"
#include "test-util.h"
#include "util.h"

static struct sv sv;
static char weights[PATH_MAX];
static uint32_t baseline[ENGINE_TOKENS]; /* greedy tokens of a failure-free engine */
static uint16_t port_a, port_b, port_gw;
static char listen_setting[64];

static int setup(void **state)
{
	engine_setup(&sv, weights, sizeof(weights), baseline);
	return 0;
}

static int teardown(void **state)
{
	return engine_teardown(&sv);
}

/* Engine t with a gateway; shadow_extra: the shadow's extra arguments (NULL: the default). */
static void start(const char *shadow_extra, const char *const *extra)
{
	const char *more[8] = {listen_setting};
	size_t n = 1;

	port_a = sv_free_port();
	port_b = sv_free_port();
	port_gw = sv_free_port();
	snprintf(listen_setting, sizeof(listen_setting), "engine.t.gateway_listen=127.0.0.1:%u",
		 port_gw);
	for (size_t i = 0; extra && extra[i] && n < ARRAY_SIZE(more) - 1; i++)
		more[n++] = extra[i];
	more[n] = NULL;
	engine_start(&sv, weights, port_a, port_b, shadow_extra, more);
	engine_wait_serving(&sv, baseline);
	engine_wait_promotable(&sv);
}

static void kill_primary_rank(int rank)
{
	pid_t pid = engine_worker_pid(&sv, ROLE_PRIMARY, rank);

	assert_true(pid > 0);
	assert_int_equal(kill(pid, SIGKILL), 0);
}

/* The reason of the last fallback, from `belayerctl status --json`. */
static void assert_reason(const char *want)
{
	const char *argv[] = {BELAYERCTL_PATH, "status", "--json", NULL};
	char *out = NULL, *p;

	assert_int_equal(run_tool(&sv, argv, &out), 0);
	p = out ? strstr(out, "\"recoveries\"") : NULL;
	p = p ? strstr(p, "\"reason\"") : NULL;
	if (!p || !strstr(p, want))
		fail_msg("no fallback reason mentioning \"%s\" in %s", want, out ? out : "");
	free(out);
}

/* Through the gateway: the answer must be the failure-free engine's. */
static void assert_gateway_answers_baseline(void)
{
	uint32_t got[ENGINE_TOKENS];

	assert_int_equal(engine_generate(port_gw, got), 0);
	assert_memory_equal(got, baseline, sizeof(got));
}

/* A promotion onto a sound shadow passes the canary, which is a phase of its own. */
static void promotion_passes_canary(void **state)
{
	start(NULL, NULL);
	assert_int_equal(engine_metric(&sv, "belayer_canary_recorded", NULL), 1);
	assert_true(engine_metric(&sv, "belayer_canary_recordings_total", NULL) >= 1);
	kill_primary_rank(0);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	assert_int_equal(engine_metric(&sv, "belayer_canary_total", "outcome=\"pass\""), 1);
	assert_int_equal(engine_metric(&sv, "belayer_canary_total", "outcome=\"mismatch\""), 0);
	assert_true(engine_metric(&sv, "belayer_recovery_last_phase_seconds", "phase=\"canary\"") >
		    0);
	assert_int_equal(engine_metric(&sv, "belayer_engine_port", NULL), port_b);
	assert_gateway_answers_baseline();
	/* The promoted group is the primary now: the record carries over (same weights), and a
	 * second failure is promoted through the canary too. */
	engine_wait_promotable(&sv);
	kill_primary_rank(1);
	assert_int_equal(engine_wait_recovery(&sv, 2), 2);
	assert_int_equal(engine_metric(&sv, "belayer_canary_total", "outcome=\"pass\""), 2);
	assert_gateway_answers_baseline();
}

/* The emulator's ids of pid's 2 MiB device allocations made before its 20 MiB one (the weights
 * pool's large segment, of the per-layer tables): the weights' small-pool segment (norms,
 * embeddings, projections) and whatever the engine allocated before its weights (memory that
 * dies with the primary). The emulator's device addresses are not the host mappings', so they
 * are found by name and size in /proc/PID/maps ("/memfd:belayer-emu:<run>:d<dev>:<id>:<bytes>
 * (deleted)"), ids growing in creation order. Returns how many, at most cap. */
static size_t early_small_alloc_ids(pid_t pid, uint64_t *ret, size_t cap)
{
	char path[64], line[PATH_MAX + 128];
	uint64_t ids[64], sizes[64], large = UINT64_MAX;
	size_t n = 0, k = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "re");
	assert_non_null(f);
	while (n < ARRAY_SIZE(ids) && fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "belayer-emu:"), *q;

		if (!p || !(q = strrchr(p, ':')))
			continue;
		sizes[n] = strtoull(q + 1, NULL, 10);
		*q = '\0';
		ids[n] = strtoull(strrchr(p, ':') + 1, NULL, 10);
		if (sizes[n] == 20u << 20)
			large = MIN(large, ids[n]);
		n++;
	}
	fclose(f);
	assert_true(large != UINT64_MAX);
	for (size_t i = 0; i < n && k < cap; i++)
		if (sizes[i] == 2u << 20 && ids[i] < large)
			ret[k++] = ids[i];
	assert_true(k > 0);
	return k;
}

/* Flips the exponent's top bit of the first element of positions 0..7 of the position
 * embeddings in pid's weights (see corrupted_shadow_fails_canary). */
static void corrupt_position_embeddings(pid_t pid)
{
	uint64_t ids[8];
	size_t n = early_small_alloc_ids(pid, ids, ARRAY_SIZE(ids));
	char id[32], off[32];
	const char *argv[] = {EMU_CTL_PATH, "flip", id, off, "64", NULL};

	for (size_t i = 0; i < n; i++)
		for (int pos = 0; pos < 8; pos++) {
			snprintf(id, sizeof(id), "%" PRIu64, ids[i]);
			snprintf(off, sizeof(off), "%d", (128 << 10) + pos * 64 * 4 + 3);
			assert_int_equal(run_tool(&sv, argv, NULL), 0);
		}
}

/* Weights corrupted where the content check does not look: verify=sampled reads 64 KiB at
 * 0, 16 MiB, ... and the last 64 KiB of each region, and the flips land at 128 KiB into the
 * 2 MiB small-pool segment, on the position embeddings (the first tensor after the 128 KiB
 * token embeddings), the exponent of the first element of positions 0..7, which every prompt
 * reads. The promotion gets past health, content, layout and remap; the canary sees
 * the promoted group answer differently from the primary at the same weights version, and the
 * engine is cold-restarted; the gateway never sends the corrupted group a request: a request
 * made through it during the recovery is answered by the cold primary, with the right tokens. */
static void corrupted_shadow_fails_canary(void **state)
{
	uint32_t got[ENGINE_TOKENS];
	int fd;

	start(NULL, NULL);
	corrupt_position_embeddings(engine_worker_pid(&sv, ROLE_PRIMARY, 0));
	kill_primary_rank(0);
	/* Sent while the recovery runs: the gateway holds it for the recovered engine. */
	fd = engine_generate_send(port_gw);
	assert_true(fd >= 0);
	assert_int_equal(engine_wait_recovery(&sv, 1), 3);
	assert_reason("canary");
	assert_int_equal(engine_metric(&sv, "belayer_canary_total", "outcome=\"mismatch\""), 1);
	assert_int_equal(engine_metric(&sv, "belayer_canary_total", "outcome=\"pass\""), 0);
	assert_int_equal(engine_generate_read(fd, ENGINE_READY_MS, got), 0);
	assert_memory_equal(got, baseline, sizeof(got));
	engine_wait_serving(&sv, baseline);
	assert_gateway_answers_baseline();
}

/* A promoted group that does not answer the canary (its first token request's connection is
 * shut down unanswered, as by an engine whose request path fails while /health answers) is
 * cold-restarted too: an error is no better than a wrong answer. */
static void canary_error_cold_restarts(void **state)
{
	start("--kv-cache-bytes 16M --debug-drop-requests 1", NULL);
	kill_primary_rank(1);
	assert_int_equal(engine_wait_recovery(&sv, 1), 3);
	assert_reason("canary: the promoted group on port");
	assert_int_equal(engine_metric(&sv, "belayer_canary_total", "outcome=\"error\""), 1);
	engine_wait_serving(&sv, baseline);
	assert_gateway_answers_baseline();
}

/* [recovery] canary = no: the corrupted group is promoted (what the canary prevents), the
 * phase does not run. */
static void canary_off_promotes_corrupted(void **state)
{
	const char *const more[] = {"recovery.canary=no", NULL};
	uint32_t got[ENGINE_TOKENS];

	start(NULL, more);
	corrupt_position_embeddings(engine_worker_pid(&sv, ROLE_PRIMARY, 0));
	kill_primary_rank(0);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	assert_int_equal(
		engine_metric(&sv, "belayer_recovery_last_phase_seconds", "phase=\"canary\""), 0);
	assert_int_equal(engine_generate(port_gw, got), 0);
	/* The corruption is served: the flips change the answer. */
	assert_memory_not_equal(got, baseline, sizeof(got));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(promotion_passes_canary, setup, teardown),
		cmocka_unit_test_setup_teardown(corrupted_shadow_fails_canary, setup, teardown),
		cmocka_unit_test_setup_teardown(canary_error_cold_restarts, setup, teardown),
		cmocka_unit_test_setup_teardown(canary_off_promotes_corrupted, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
