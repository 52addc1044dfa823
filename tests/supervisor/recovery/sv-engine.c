/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "belayer-emu.h"
#include "sv-engine.h"
#include "test-util.h"
#include "util.h"

static const char *const prompt = "[5,17,3,99,42]";

int engine_generate_send(uint16_t port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons(port)};
	char body[256], req[512];
	int fd;

	snprintf(body, sizeof(body),
		 "{\"input_ids\":%s,\"sampling_params\":{\"max_new_tokens\":%d,"
		 "\"temperature\":0}}",
		 prompt, ENGINE_TOKENS);
	snprintf(req, sizeof(req),
		 "POST /generate HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\n"
		 "Content-Length: %zu\r\n\r\n%s",
		 strlen(body), body);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
		close(fd);
		return -ECONNREFUSED;
	}
	return fd;
}

int engine_generate_read(int fd, int timeout_ms, uint32_t out[ENGINE_TOKENS])
{
	char resp[8192], *p;
	size_t n = 0;
	ssize_t k;
	int r = 0;

	/* Bounded: a hung engine must fail the read, not the test run. */
	for (;;) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};

		if (poll(&pf, 1, timeout_ms) != 1) {
			r = -ETIMEDOUT;
			break;
		}
		k = read(fd, resp + n, sizeof(resp) - 1 - n);
		if (k <= 0)
			break;
		n += (size_t)k;
	}
	close(fd);
	resp[n] = '\0';
	if (r < 0)
		return r;
	if (strncmp(resp, "HTTP/1.1 200", 12) != 0 && strncmp(resp, "HTTP/1.0 200", 12) != 0)
		return -EIO;
	p = strstr(resp, "\"output_ids\":[");
	if (!p)
		return -EBADMSG;
	p += strlen("\"output_ids\":[");
	for (int i = 0; i < ENGINE_TOKENS; i++) {
		out[i] = (uint32_t)strtoul(p, &p, 10);
		if (*p == ',')
			p++;
	}
	return 0;
}

/* The child of engine_occupy: the driver reached as the CUDA runtime does (dlopen,
 * cuGetProcAddress_v2), the memory allocated, a byte written to fd, then it waits. */
static int occupy(int dev, size_t bytes, int fd)
{
	PFN_cuGetProcAddress_v12000 gpa;
	PFN_cuInit_v2000 init;
	PFN_cuDevicePrimaryCtxRetain_v7000 retain;
	PFN_cuCtxSetCurrent_v4000 set_current;
	PFN_cuMemAlloc_v3020 alloc;
	CUdriverProcAddressQueryResult q;
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	CUcontext ctx;
	CUdeviceptr p;

	gpa = lib ? (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2") : NULL;
	if (!gpa || gpa("cuInit", (void **)&init, 2000, 0, &q) ||
	    gpa("cuDevicePrimaryCtxRetain", (void **)&retain, 7000, 0, &q) ||
	    gpa("cuCtxSetCurrent", (void **)&set_current, 4000, 0, &q) ||
	    gpa("cuMemAlloc", (void **)&alloc, 3020, 0, &q) || init(0) || retain(&ctx, dev) ||
	    set_current(ctx) || alloc(&p, bytes) || write(fd, "", 1) != 1)
		return 1;
	for (;;)
		pause();
}

pid_t engine_occupy(int dev, size_t bytes)
{
	int fds[2];
	char c;
	pid_t pid;

	assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(occupy(dev, bytes, fds[1]));
	close(fds[1]);
	assert_int_equal(read(fds[0], &c, 1), 1);
	close(fds[0]);
	return pid;
}

int engine_generate(uint16_t port, uint32_t out[ENGINE_TOKENS])
{
	int fd = engine_generate_send(port);

	return fd < 0 ? fd : engine_generate_read(fd, 10000, out);
}

uint64_t engine_metric(const struct sv *sv, const char *name, const char *more)
{
	char labels[96];

	snprintf(labels, sizeof(labels), "engine=\"t\"%s%s", more ? "," : "", more ? more : "");
	return metric(sv, name, labels);
}

pid_t engine_worker_pid(const struct sv *sv, enum worker_role role, int rank)
{
	struct proto_msg m[32];
	int n = ctl_collect(sv, CTL_WORKERS, 0, CTL_ACT_NONE, -1, m, ARRAY_SIZE(m));

	for (int i = 0; i < n; i++) {
		const struct proto_worker_info *w = &m[i].worker_info;

		if (m[i].type == PROTO_WORKER_INFO && w->state == WORKER_ALIVE && w->role == role &&
		    (w->rank < 0 ? 0 : w->rank) == rank && strcmp(w->engine_id, "t") == 0)
			return (pid_t)w->pid;
	}
	return 0;
}

void engine_wait_serving(const struct sv *sv, const uint32_t expected[ENGINE_TOKENS])
{
	uint64_t deadline = mono_ms() + ENGINE_READY_MS;
	uint32_t got[ENGINE_TOKENS];

	for (;;) {
		uint16_t port = (uint16_t)engine_metric(sv, "belayer_engine_port", NULL);

		if (engine_metric(sv, "belayer_engine_ready", NULL) == 1 &&
		    engine_metric(sv, "belayer_recovery_last_outcome", NULL) != 1 &&
		    engine_generate(port, got) == 0) {
			assert_memory_equal(got, expected, sizeof(got));
			return;
		}
		if (mono_ms() > deadline)
			fail_msg("engine t does not serve within %d ms", ENGINE_READY_MS);
		(void)poll(NULL, 0, 20);
	}
}

void engine_wait_promotable(const struct sv *sv)
{
	uint64_t deadline = mono_ms() + ENGINE_READY_MS;

	while (engine_metric(sv, "belayer_engine_promotable", NULL) != 1) {
		if (mono_ms() > deadline)
			fail_msg("engine t not promotable within %d ms", ENGINE_READY_MS);
		(void)poll(NULL, 0, 20);
	}
}

uint64_t engine_wait_recovery(const struct sv *sv, uint64_t seq)
{
	uint64_t deadline = mono_ms() + ENGINE_READY_MS, o;

	while (engine_metric(sv, "belayer_recovery_last_seq", NULL) < seq ||
	       (o = engine_metric(sv, "belayer_recovery_last_outcome", NULL)) == 1) {
		if (mono_ms() > deadline)
			fail_msg("recovery %" PRIu64 " did not end within %d ms", seq,
				 ENGINE_READY_MS);
		(void)poll(NULL, 0, 20);
	}
	assert_int_not_equal(o, 4); /* failed: nothing serves */
	return o;
}

void engine_start(struct sv *sv, const char *weights, uint16_t port_a, uint16_t port_b,
		  const char *shadow_extra, const char *const *more)
{
	engine_start_both(sv, weights, port_a, port_b, NULL, shadow_extra, more);
}

void engine_start_both(struct sv *sv, const char *weights, uint16_t port_a, uint16_t port_b,
		       const char *both_extra, const char *shadow_extra, const char *const *more)
{
	static char primary[PATH_MAX * 2 + 256], shadow[PATH_MAX * 2 + 256], env[PATH_MAX + 64],
		port[32], sport[32];
	const char *settings[32] = {primary,
				    shadow,
				    env,
				    port,
				    sport,
				    "engine.t.tp=2",
				    "engine.t.probe_interval=50ms",
				    "engine.t.checksum_settle=200ms"};
	size_t n = 8;

	snprintf(primary, sizeof(primary),
		 "engine.t.primary=%s --model %s --port {port} --tp 2 --kv-cache-bytes 16M %s",
		 ENGINE_PATH, weights, both_extra ? both_extra : "");
	/* The shadow's dummy weights come from the file's seed, so that a shadow left serving
	 * after a refused promotion answers like the file. Promoted, every weight is the dead
	 * primary's memory: the stand-in's caching allocator keeps all tensors, norms too, in
	 * tracked segments of its weights pool, and its step buffers (allocated after the KV cache)
	 * in `other` ones. */
	snprintf(shadow, sizeof(shadow),
		 "engine.t.shadow=%s --model %s --port {port} --tp 2 --load-format dummy --seed 1 "
		 "%s %s",
		 ENGINE_PATH, weights, shadow_extra ? shadow_extra : "--kv-cache-bytes 16M",
		 both_extra ? both_extra : "");
	snprintf(env, sizeof(env), "engine.t.env=LD_PRELOAD=%s BELAYER_PARK_QUIET_MS=300",
		 SHIM_PATH);
	snprintf(port, sizeof(port), "engine.t.port=%u", port_a);
	snprintf(sport, sizeof(sport), "engine.t.shadow_port=%u", port_b);
	for (size_t i = 0; more && more[i] && n < ARRAY_SIZE(settings) - 1; i++)
		settings[n++] = more[i];
	settings[n] = NULL;
	sv_start(sv, settings);
}

void engine_failure_free_tokens(const char *w, uint32_t out[ENGINE_TOKENS])
{
	char port[16];
	uint16_t p = sv_free_port();
	uint64_t deadline = mono_ms() + ENGINE_READY_MS;
	pid_t pid;
	int st;

	snprintf(port, sizeof(port), "%u", p);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		execl(ENGINE_PATH, ENGINE_PATH, "--model", w, "--port", port, "--tp", "2",
		      "--kv-cache-bytes", "16M", (char *)NULL);
		_exit(127);
	}
	while (engine_generate(p, out) != 0) {
		assert_true(mono_ms() < deadline);
		assert_int_equal(waitpid(pid, &st, WNOHANG), 0);
		(void)poll(NULL, 0, 20);
	}
	kill(pid, SIGTERM);
	waitpid(pid, &st, 0);
}

void engine_setup(struct sv *sv, char *weights, size_t cap, uint32_t baseline[ENGINE_TOKENS])
{
	static uint32_t tokens[ENGINE_TOKENS];
	static bool have_tokens;

	sv_setup(sv);
	setenv("BELAYER_EMU_KERNELS", KERNELS_PATH, 1);
	setenv("BELAYER_EMU_DEVICES", "4", 1);
	snprintf(weights, cap, "%s/w.safetensors", sv->dir);
	{
		const char *argv[] = {GEN_PATH, "--out",  weights, "--size",
				      "24M",	"--seed", "1",	   NULL};
		assert_int_equal(run_tool(sv, argv, NULL), 0);
	}
	if (!have_tokens) {
		engine_failure_free_tokens(weights, tokens);
		have_tokens = true;
	}
	memcpy(baseline, tokens, sizeof(tokens));
}

int engine_teardown(struct sv *sv)
{
	uint64_t deadline = mono_ms() + 15000, bytes = 0;
	int64_t live = -1;

	if (sv->pid > 0)
		(void)sv_kill(sv, SIGTERM);
	while (mono_ms() < deadline) {
		live = belayer_emu_live_allocations(-1, &bytes);
		if (live == 0)
			break;
		(void)poll(NULL, 0, 20);
	}
	sv_teardown(sv);
	if (live != 0)
		fail_msg("%" PRId64 " emulated allocations (%" PRIu64 " bytes) leaked", live,
			 bytes);
	return 0;
}
