/* SPDX-License-Identifier: MIT */
/*
 * Shadow promotion end to end: the real supervisor launches the engine stand-in (TP=2, under
 * libbelayer.so, on the emulated GPU) as primary and as shadow from [engine.t] settings, and
 * every failure here must end in a serving engine whose greedy tokens equal those of a
 * failure-free engine with the same weights, promoted or cold-restarted with the reason
 * stated; and no GPU memory may be left behind once everything is stopped.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "belayer-emu.h"
#include "proto.h"
#include "sv-engine.h"
#include "sv-test.h"
#include "test-util.h"
#include "util.h"

static struct sv sv;
static char weights[PATH_MAX];
static uint32_t baseline[ENGINE_TOKENS]; /* greedy tokens of a failure-free engine */
static uint32_t expected[ENGINE_TOKENS]; /* what the engine must answer now (baseline by default) */
static uint16_t port_a, port_b;

/* Sends a request (method path body) and returns the connection without reading the reply:
 * a request in flight when a worker dies. -errno when nothing listens. */
static int send_request(uint16_t port, const char *method, const char *path, const char *body)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons(port)};
	char req[PATH_MAX + 512];
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	snprintf(req, sizeof(req),
		 "%s %s HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\n"
		 "Content-Length: %zu\r\n\r\n%s",
		 method, path, strlen(body), body);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
		close(fd);
		return -ECONNREFUSED;
	}
	return fd;
}

/* The HTTP status of the reply on fd (read to the end, bounded). */
static int reply_status(int fd)
{
	char buf[4096];
	size_t n = 0;
	ssize_t k;

	for (;;) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};

		if (poll(&pf, 1, 30000) != 1)
			break;
		k = read(fd, buf + n, sizeof(buf) - 1 - n);
		if (k <= 0 || n + (size_t)k >= sizeof(buf) - 1)
			break;
		n += (size_t)k;
	}
	close(fd);
	buf[n] = '\0';
	return n > 12 ? atoi(buf + 9) : -1;
}

static bool shadows_parked(void)
{
	struct proto_msg m[32];
	int n = ctl_collect(&sv, CTL_WORKERS, 0, CTL_ACT_NONE, -1, m, ARRAY_SIZE(m)), parked = 0;

	for (int i = 0; i < n; i++)
		parked += m[i].type == PROTO_WORKER_INFO &&
			  m[i].worker_info.state == WORKER_ALIVE &&
			  m[i].worker_info.role == ROLE_SHADOW && m[i].worker_info.parked;
	return parked == 2;
}

static void wait_parked(void)
{
	uint64_t deadline = mono_ms() + ENGINE_READY_MS;

	while (!shadows_parked()) {
		if (mono_ms() > deadline)
			fail_msg("the shadow group did not park within %d ms", ENGINE_READY_MS);
		(void)poll(NULL, 0, 20);
	}
}

/* The reason of the last fallback, from `belayerctl status --json`. */
static void status_reason(char *buf, size_t cap)
{
	const char *argv[] = {BELAYERCTL_PATH, "status", "--json", NULL};
	char *out = NULL, *p, *q;

	assert_int_equal(run_tool(&sv, argv, &out), 0);
	buf[0] = '\0';
	p = out ? strstr(out, "\"recoveries\"") : NULL;
	p = p ? strstr(p, "\"reason\"") : NULL;
	if (p && (p = strchr(p + 8, '"')) && (q = strchr(p + 1, '"')))
		snprintf(buf, cap, "%.*s", (int)(q - p - 1), p + 1);
	free(out);
}

static void assert_reason(const char *want)
{
	char reason[512];

	status_reason(reason, sizeof(reason));
	if (!strstr(reason, want))
		fail_msg("fallback reason \"%s\" does not mention \"%s\"", reason, want);
}

static void start(const char *shadow_extra, const char *const *more)
{
	port_a = sv_free_port();
	port_b = sv_free_port();
	engine_start(&sv, weights, port_a, port_b, shadow_extra, more);
}

static int setup(void **state)
{
	engine_setup(&sv, weights, sizeof(weights), baseline);
	memcpy(expected, baseline, sizeof(expected));
	return 0;
}

static pid_t occupier; /* a process holding device memory, killed at the end of its test */

static int teardown(void **state)
{
	if (occupier > 0) {
		(void)kill(occupier, SIGKILL);
		(void)waitpid(occupier, NULL, 0);
		occupier = 0;
	}
	return engine_teardown(&sv);
}

static void kill_primary_rank(int rank)
{
	pid_t pid = engine_worker_pid(&sv, ROLE_PRIMARY, rank);

	assert_true(pid > 0);
	assert_int_equal(kill(pid, SIGKILL), 0);
}

/* Each rank killed while serving: the shadow group takes over (twice: the new shadow too). */
static void promotes_on_each_rank_kill(void **state)
{
	unsigned seed = (unsigned)time(NULL);
	int first = (int)(rand_r(&seed) % 2);

	print_message("killing rank %d first (seed %u)\n", first, seed);
	int busy;

	start(NULL, NULL);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	/* A long request in flight dies with the primary (resubmitting it is the gateway's job). */
	busy = send_request(port_a, "POST", "/generate",
			    "{\"input_ids\":[1,2,3],\"sampling_params\":{\"max_new_tokens\":400,"
			    "\"temperature\":0}}");
	assert_true(busy >= 0);
	kill_primary_rank(first);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	close(busy);
	engine_wait_serving(&sv, expected);
	/* The port moved to the former shadow's. */
	assert_int_equal(engine_metric(&sv, "belayer_engine_port", NULL), port_b);
	assert_true(engine_metric(&sv, "belayer_recovery_last_phase_seconds", "phase=\"remap\"") >
		    0);

	engine_wait_promotable(&sv);
	kill_primary_rank(1 - first);
	assert_int_equal(engine_wait_recovery(&sv, 2), 2);
	engine_wait_serving(&sv, expected);
	assert_int_equal(engine_metric(&sv, "belayer_engine_port", NULL), port_a);
	assert_int_equal(metric(&sv, "belayer_recoveries_total", "outcome=\"promoted\""), 2);
}

/* vLLM's and SGLang's workers get their rank as an argument, never as RANK/LOCAL_RANK (issue
 * 22, review finding 7): the supervisor still tells rank 0 from rank 1 in both groups, from
 * the TP communicator their shims announce, and a death of rank 1 is promoted. */
static void ranks_from_communicator(void **state)
{
	static char primary[PATH_MAX * 2 + 256];
	const char *const more[] = {primary, NULL};
	uint64_t deadline;

	(void)unsetenv("RANK");
	(void)unsetenv("LOCAL_RANK");
	(void)unsetenv("BELAYER_RANK");
	snprintf(primary, sizeof(primary),
		 "engine.t.primary=%s --model %s --port {port} --tp 2 --kv-cache-bytes 16M "
		 "--no-rank-env",
		 ENGINE_PATH, weights);
	start("--kv-cache-bytes 16M --no-rank-env", more);
	engine_wait_serving(&sv, expected);
	deadline = mono_ms() + 10000;
	for (;;) {
		pid_t p0 = engine_worker_pid(&sv, ROLE_PRIMARY, 0),
		      p1 = engine_worker_pid(&sv, ROLE_PRIMARY, 1),
		      s0 = engine_worker_pid(&sv, ROLE_SHADOW, 0),
		      s1 = engine_worker_pid(&sv, ROLE_SHADOW, 1);

		if (p0 > 0 && p1 > 0 && s0 > 0 && s1 > 0) {
			assert_int_not_equal(p0, p1);
			assert_int_not_equal(s0, s1);
			break;
		}
		if (mono_ms() > deadline)
			fail_msg("ranks known: primary 0:%d 1:%d, shadow 0:%d 1:%d", p0, p1, s0,
				 s1);
		(void)poll(NULL, 0, 20);
	}
	engine_wait_promotable(&sv);
	kill_primary_rank(1);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	engine_wait_serving(&sv, expected);
}

/* Review B4 with the engine stand-in: its TP communicator nonblocking (--nccl-nonblocking, as
 * PyTorch's with TORCH_NCCL_USE_COMM_NONBLOCKING=1: init and every all-reduce return
 * ncclInProgress and the rank polls ncclCommGetAsyncError), ranks known from the communicator
 * only (--no-rank-env): the shims announce the communicators once their init completed, the
 * supervisor tells the ranks apart, and a death of rank 1 is promoted. */
static void promotes_with_nonblocking_nccl(void **state)
{
	static char primary[PATH_MAX * 2 + 256];
	const char *const more[] = {primary, NULL};

	(void)unsetenv("RANK");
	(void)unsetenv("LOCAL_RANK");
	(void)unsetenv("BELAYER_RANK");
	snprintf(primary, sizeof(primary),
		 "engine.t.primary=%s --model %s --port {port} --tp 2 --kv-cache-bytes 16M "
		 "--no-rank-env --nccl-nonblocking",
		 ENGINE_PATH, weights);
	start("--kv-cache-bytes 16M --no-rank-env --nccl-nonblocking", more);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	assert_true(engine_worker_pid(&sv, ROLE_PRIMARY, 1) > 0);
	kill_primary_rank(1);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	engine_wait_serving(&sv, expected);
	assert_int_equal(metric(&sv, "belayer_recoveries_total", "outcome=\"promoted\""), 1);
}

/* Primary and shadow started with flags (their KV cache sized from free memory); once the
 * shadow group parked, primary rank kill_rank is killed: promoted, the engine serves. */
static void sized_by_free_memory(const char *flags, int kill_rank)
{
	static char primary[PATH_MAX * 2 + 256];
	const char *const more[] = {primary, NULL};

	snprintf(primary, sizeof(primary), "engine.t.primary=%s --model %s --port {port} --tp 2 %s",
		 ENGINE_PATH, weights, flags);
	start(flags, more);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	kill_primary_rank(kill_rank);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	engine_wait_serving(&sv, expected);
	assert_int_equal(metric(&sv, "belayer_recoveries_total", "outcome=\"promoted\""), 1);
}

/* Review finding 6: both groups size their KV cache from free memory, as vLLM's
 * determine_available_memory does (--gpu-memory-utilization). The shadow group starts once
 * the primary serves, on devices the primary holds: on its own figures it finds no room for
 * a KV cache. The supervisor gives it the primary's recorded cuMemGetInfo answers, so it
 * sizes itself like the primary, parks with the primary's layout, and a death is promoted. */
static void shadow_sized_by_free_memory(void **state)
{
	sized_by_free_memory("--gpu-memory-utilization 0.05", 0);
}

/* Issue 22: as under Ray, each rank sees only its own device, as device 0 (the stand-in's
 * --one-visible-device sets CUDA_VISIBLE_DEVICES per rank), and the ranks' devices differ:
 * another process holds 64 MiB of rank 1's. The ranks' answers differ, their devices'
 * ordinals do not; the ranks agree on the smaller KV cache (vLLM and SGLang take the minimum).
 * Each shadow rank must get its own primary rank's answers, known by rank and device UUID: a
 * shadow group given one rank's answers for both computes that rank's size, and with rank 0's
 * (the larger) its layout is not the primary's. Promoted, it serves. */
static void shadow_sized_per_rank_one_visible_device(void **state)
{
	occupier = engine_occupy(1, 64u << 20);
	sized_by_free_memory("--gpu-memory-utilization 0.05 --one-visible-device", 1);
}

/* The same with ranks started without RANK (vLLM's and SGLang's workers): a shadow's shim does
 * not know its rank when its engine asks cuMemGetInfo, and takes the answers of the one
 * primary rank recorded on its device's UUID. */
static void shadow_sized_per_device_no_rank_env(void **state)
{
	occupier = engine_occupy(1, 64u << 20);
	sized_by_free_memory("--gpu-memory-utilization 0.05 --one-visible-device --no-rank-env", 1);
}

/* Killed during load (before it serves, before the shadow parks): cold restart. */
static void kill_during_load_cold_restarts(void **state)
{
	uint64_t deadline;
	pid_t pid;

	start(NULL, NULL);
	deadline = mono_ms() + ENGINE_READY_MS;
	while (!(pid = engine_worker_pid(&sv, ROLE_PRIMARY, 1))) {
		assert_true(mono_ms() < deadline);
		(void)poll(NULL, 0, 2);
	}
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(engine_wait_recovery(&sv, 1), 3);
	engine_wait_serving(&sv, expected);
	assert_int_equal(metric(&sv, "belayer_recoveries_total", "outcome=\"cold_restart\""), 1);
}

/* Regions of class cls of engine t's live primaries, as the supervisor lists them. */
static uint64_t primary_regions(enum region_class cls)
{
	static struct proto_msg m[1024];
	pid_t p0 = engine_worker_pid(&sv, ROLE_PRIMARY, 0),
	      p1 = engine_worker_pid(&sv, ROLE_PRIMARY, 1);
	int n = ctl_collect(&sv, CTL_REGIONS, 0, CTL_ACT_NONE, -1, m, ARRAY_SIZE(m));
	uint64_t count = 0;

	assert_true(n >= 0 && p0 > 0 && p1 > 0);
	for (int i = 0; i < n; i++)
		count += m[i].type == PROTO_REGION_INFO && m[i].region_info.cls == cls &&
			 (m[i].region_info.pid == (uint32_t)p0 ||
			  m[i].region_info.pid == (uint32_t)p1);
	return count;
}

static uint64_t primary_weights_regions(void)
{
	uint64_t count = primary_regions(REGION_WEIGHTS);

	assert_true(count > 0);
	return count;
}

/* A shadow whose KV size differs has another layout: refused, cold restart. */
static void mismatched_layout_refused(void **state)
{
	uint64_t deadline;

	start("--kv-cache-bytes 12M", NULL);
	engine_wait_serving(&sv, expected);
	wait_parked();
	/* Checksums recorded for every weights region: the layout is what fails. */
	deadline = mono_ms() + ENGINE_READY_MS;
	while (metric(&sv, "belayer_weights_checksums_total", "") < primary_weights_regions()) {
		assert_true(mono_ms() < deadline);
		(void)poll(NULL, 0, 20);
	}
	kill_primary_rank(0);
	assert_int_equal(engine_wait_recovery(&sv, 1), 3);
	assert_reason("layout");
	engine_wait_serving(&sv, expected);
}

/* XID 79 (fallen off the bus) since the last good check: the memory is not trusted. */
static void xid_forces_cold_path(void **state)
{
	const char *argv[] = {EMU_CTL_PATH, "xid", "0", "79", NULL};

	start(NULL, NULL);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	assert_int_equal(run_tool(&sv, argv, NULL), 0);
	kill_primary_rank(1);
	assert_int_equal(engine_wait_recovery(&sv, 1), 3);
	assert_reason("GPU");
	engine_wait_serving(&sv, expected);
}

/* The emulator allocation id of pid's 20 MiB device allocation: the weights' large-pool segment
 * (kLargeBuffer) holding the per-layer embedding tables, the one segment of that size here.
 * From its mappings ("/memfd:belayer-emu:<run>:d<dev>:<id>:<bytes> (deleted)"): the process
 * need not keep the fd open. */
static uint64_t weights_alloc_id(pid_t pid)
{
	char path[64], line[PATH_MAX + 128];
	uint64_t id = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "re");
	assert_non_null(f);
	while (!id && fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "belayer-emu:"), *end;

		if (!p || !(end = strstr(p, ":20971520")))
			continue;
		*end = '\0';
		id = strtoull(strrchr(p, ':') + 1, NULL, 10);
	}
	fclose(f);
	assert_true(id > 0);
	return id;
}

/* A bit flipped in the weights after their checksum was recorded: verify=full sees it, and
 * so does verify=sampled when the flip lands in a sampled page (the first 64 KiB). */
static void bit_flip(const char *verify, const char *reason)
{
	const char *const more[] = {verify, NULL};
	char id[32];
	const char *argv[] = {EMU_CTL_PATH, "flip", id, "4096", "16", NULL};
	pid_t pid;

	start(NULL, more);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	/* Promotable: the live checksums are recorded, the flip comes after. */
	pid = engine_worker_pid(&sv, ROLE_PRIMARY, 1);
	snprintf(id, sizeof(id), "%" PRIu64, weights_alloc_id(pid));
	assert_int_equal(run_tool(&sv, argv, NULL), 0);
	kill_primary_rank(0);
	assert_int_equal(engine_wait_recovery(&sv, 1), 3);
	assert_reason(reason); /* a checksum that differs, not a missing one */
	engine_wait_serving(&sv, expected);
}

static void bit_flip_forces_cold_path(void **state)
{
	bit_flip("engine.t.verify=full", "content (full)");
}

static void bit_flip_in_a_sampled_page(void **state)
{
	bit_flip("engine.t.verify=sampled", "content (sampled)");
}

/* Killed right after an RL weight update, before the new weights' checksum was recorded:
 * the memory holds a version nothing vouches for, so the content check refuses it and the
 * engine is cold-restarted (from its model file: the update must be pushed again). */
static void kill_during_weight_update(void **state)
{
	char w2[PATH_MAX], body[PATH_MAX + 32];
	const char *argv[] = {GEN_PATH, "--out", w2, "--size", "24M", "--seed", "2", NULL};
	const char *const more[] = {"engine.t.checksum_settle=30s", NULL};
	int fd;

	snprintf(w2, sizeof(w2), "%s/w2.safetensors", sv.dir);
	assert_int_equal(run_tool(&sv, argv, NULL), 0);
	start(NULL, more);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	snprintf(body, sizeof(body), "{\"model_path\":\"%s\"}", w2);
	fd = send_request(port_a, "POST", "/update_weights_from_disk", body);
	assert_true(fd >= 0);
	assert_int_equal(reply_status(fd), 200);
	kill_primary_rank(1);
	assert_int_equal(engine_wait_recovery(&sv, 1), 3);
	assert_reason("content");
	engine_wait_serving(&sv, expected);
}

/* The trainer's new weights (w2, seed 2) pushed into the primary from disk: expected becomes
 * a failure-free engine's tokens on them, and the engine serves them. */
static void update_weights_to_w2(char w2[PATH_MAX])
{
	char body[PATH_MAX + 32];
	const char *argv[] = {GEN_PATH, "--out", w2, "--size", "24M", "--seed", "2", NULL};
	int fd;

	snprintf(w2, PATH_MAX, "%s/w2.safetensors", sv.dir);
	assert_int_equal(run_tool(&sv, argv, NULL), 0);
	snprintf(body, sizeof(body), "{\"model_path\":\"%s\"}", w2);
	fd = send_request(port_a, "POST", "/update_weights_from_disk", body);
	assert_true(fd >= 0);
	assert_int_equal(reply_status(fd), 200);
	engine_failure_free_tokens(w2, expected);
	assert_memory_not_equal(expected, baseline, sizeof(expected));
	engine_wait_serving(&sv, expected);
}

/* The headline: an RL weight update lands, its checksums are recorded, then a rank dies. The
 * promoted engine holds the *updated* weights (a cold start would reload the old file): its
 * tokens are those of a failure-free engine started on the new weights. */
static void promoted_engine_keeps_updated_weights(void **state)
{
	char w2[PATH_MAX];
	uint64_t before, deadline;

	start(NULL, NULL);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	before = metric(&sv, "belayer_weights_checksums_total", "");
	update_weights_to_w2(w2);
	/* Promotable again once the new version's checksums are recorded (the update rewrote
	 * every weights region). */
	deadline = mono_ms() + ENGINE_READY_MS;
	while (metric(&sv, "belayer_weights_checksums_total", "") <
	       before + primary_weights_regions()) {
		assert_true(mono_ms() < deadline);
		(void)poll(NULL, 0, 20);
	}
	engine_wait_promotable(&sv);
	kill_primary_rank(1);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	engine_wait_serving(&sv, expected);
}

/* An RL step with vLLM's sleep mode (review finding 8): the engine's weights and KV cache are
 * its own cuMemCreate memory (CuMemAllocator), it sleeps while the trainer trains (level 1:
 * weights offloaded to host memory, everything unmapped and released), wakes up (re-created at
 * the same addresses) and gets the new weights. The re-created memory is still weights and KV
 * to the supervisor: the new weights are checksummed, the layout is the shadow's, and a rank's
 * death is promoted onto memory that holds the updated weights. */
static void sleep_wake_then_promotes(void **state)
{
	char w2[PATH_MAX];
	uint64_t weights_before, kv_before, before, deadline;

	port_a = sv_free_port();
	port_b = sv_free_port();
	engine_start_both(&sv, weights, port_a, port_b, "--enable-sleep-mode", NULL, NULL);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	weights_before = primary_weights_regions();
	kv_before = primary_regions(REGION_KV);
	assert_true(kv_before > 0);
	before = metric(&sv, "belayer_weights_checksums_total", "");

	assert_int_equal(reply_status(send_request(port_a, "POST", "/sleep?level=1", "")), 200);
	assert_int_equal(reply_status(send_request(port_a, "POST", "/wake_up", "")), 200);
	engine_wait_serving(&sv, expected); /* the offloaded weights are back */
	update_weights_to_w2(w2);

	/* The woken memory is weights and KV again, and its new weights get checksummed. */
	deadline = mono_ms() + ENGINE_READY_MS;
	while (primary_regions(REGION_WEIGHTS) != weights_before ||
	       primary_regions(REGION_KV) != kv_before) {
		if (mono_ms() > deadline)
			fail_msg("after sleep/wake the primaries have %" PRIu64
				 " weights and %" PRIu64 " kv regions, %" PRIu64 " and %" PRIu64
				 " before",
				 primary_regions(REGION_WEIGHTS), primary_regions(REGION_KV),
				 weights_before, kv_before);
		(void)poll(NULL, 0, 20);
	}
	while (metric(&sv, "belayer_weights_checksums_total", "") < before + weights_before) {
		assert_true(mono_ms() < deadline);
		(void)poll(NULL, 0, 20);
	}
	engine_wait_promotable(&sv);
	kill_primary_rank(0);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	engine_wait_serving(&sv, expected);
}

/* A SIGSTOPped primary answers nothing: after liveness_timeout its group is killed and the
 * shadow takes over. Honest scope: the probe detects a primary that stops answering HTTP
 * (stopped, deadlocked, spinning); a primary that answers /health but computes nothing is not
 * caught by it. */
static void hung_primary_recovered(void **state)
{
	const char *const more[] = {"engine.t.liveness_timeout=1s", NULL};
	pid_t pid;

	start(NULL, more);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	pid = engine_worker_pid(&sv, ROLE_PRIMARY, 0);
	assert_true(pid > 0);
	assert_int_equal(kill(pid, SIGSTOP), 0);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	engine_wait_serving(&sv, expected);
	{
		const char *argv[] = {BELAYERCTL_PATH, "status", "--json", NULL};
		char *out = NULL;

		assert_int_equal(run_tool(&sv, argv, &out), 0);
		assert_non_null(strstr(out, "\"trigger\": \"liveness\""));
		free(out);
	}
}

/* Killed while the promotion itself runs (a shadow rank right after the primary): whatever
 * the interleaving, the engine serves the right tokens in the end, and a fallback says why. */
static void kill_during_promotion(void **state)
{
	uint64_t o;
	pid_t sh;

	start(NULL, NULL);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	sh = engine_worker_pid(&sv, ROLE_SHADOW, 1);
	assert_true(sh > 0);
	kill_primary_rank(0);
	assert_int_equal(kill(sh, SIGKILL), 0);
	o = engine_wait_recovery(&sv, 1);
	if (o == 3)
		assert_reason("shadow");
	engine_wait_serving(&sv, expected);
}

/* An externally started primary (same BELAYER_ENGINE_ID) is paired with the supervisor's
 * shadow group and promoted like a launched one. */
static void external_primary_is_paired(void **state)
{
	const char *const more[] = {"engine.t.primary=external", NULL};
	char port[16];
	pid_t pid;
	int st;

	start(NULL, more);
	snprintf(port, sizeof(port), "%u", port_a);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		setenv("LD_PRELOAD", SHIM_PATH, 1);
		setenv("BELAYER_ENGINE_ID", "t", 1);
		execl(ENGINE_PATH, ENGINE_PATH, "--model", weights, "--port", port, "--tp", "2",
		      "--kv-cache-bytes", "16M", (char *)NULL);
		_exit(127);
	}
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_int_equal(engine_wait_recovery(&sv, 1), 2);
	engine_wait_serving(&sv, expected);
	assert_int_equal(engine_metric(&sv, "belayer_engine_port", NULL), port_b);
}

/* Manual failover: belayerctl promote --wait reports the phases. */
static void manual_promote(void **state)
{
	const char *argv[] = {BELAYERCTL_PATH, "promote", "--wait", "t", NULL};
	char *out = NULL;

	start(NULL, NULL);
	engine_wait_serving(&sv, expected);
	engine_wait_promotable(&sv);
	assert_int_equal(run_tool(&sv, argv, &out), 0);
	assert_non_null(strstr(out, "outcome=promoted trigger=manual"));
	free(out);
	engine_wait_serving(&sv, expected);
	{
		const char *w[] = {BELAYERCTL_PATH, "workers", NULL};

		assert_int_equal(run_tool(&sv, w, &out), 0);
		assert_non_null(strstr(out, "ready"));
		free(out);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(promotes_on_each_rank_kill, setup, teardown),
		cmocka_unit_test_setup_teardown(kill_during_load_cold_restarts, setup, teardown),
		cmocka_unit_test_setup_teardown(mismatched_layout_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(xid_forces_cold_path, setup, teardown),
		cmocka_unit_test_setup_teardown(bit_flip_forces_cold_path, setup, teardown),
		cmocka_unit_test_setup_teardown(bit_flip_in_a_sampled_page, setup, teardown),
		cmocka_unit_test_setup_teardown(kill_during_weight_update, setup, teardown),
		cmocka_unit_test_setup_teardown(promoted_engine_keeps_updated_weights, setup,
						teardown),
		cmocka_unit_test_setup_teardown(sleep_wake_then_promotes, setup, teardown),
		cmocka_unit_test_setup_teardown(hung_primary_recovered, setup, teardown),
		cmocka_unit_test_setup_teardown(kill_during_promotion, setup, teardown),
		cmocka_unit_test_setup_teardown(manual_promote, setup, teardown),
		cmocka_unit_test_setup_teardown(ranks_from_communicator, setup, teardown),
		cmocka_unit_test_setup_teardown(promotes_with_nonblocking_nccl, setup, teardown),
		cmocka_unit_test_setup_teardown(external_primary_is_paired, setup, teardown),
		cmocka_unit_test_setup_teardown(shadow_sized_by_free_memory, setup, teardown),
		cmocka_unit_test_setup_teardown(shadow_sized_per_rank_one_visible_device, setup,
						teardown),
		cmocka_unit_test_setup_teardown(shadow_sized_per_device_no_rank_env, setup,
						teardown),
	};

	/* SV_TEST_FILTER=name runs one test (cmocka's glob). */
	if (getenv("SV_TEST_FILTER"))
		cmocka_set_test_filter(getenv("SV_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
