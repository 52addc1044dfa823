/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench shim-overhead: what libbelayer.so adds to a driver call. The bench runs its
 * measuring child (itself, re-executed) alternately without and with LD_PRELOAD of the shim,
 * three times each, on the same driver, and reports the median over all rounds per call:
 *   - an unhooked call resolved through cuGetProcAddress (cuCtxGetDevice): the shim hands
 *     back the driver's own pointer, so this should be the same number;
 *   - a small cuMemAlloc + cuMemFree pair (4 KiB, below the conversion threshold), with 64
 *     tracked regions alive so the free path really searches the region table;
 *   - a tracked large cuMemAlloc + cuMemFree pair (64 MiB): converted to exportable VMM memory
 *     and announced, with the bench itself listening as the supervisor.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "bench-measure.h"
#include "bench.h"
#include "log.h"
#include "proto.h"
#include "util.h"

#define ROUNDS_PER_RUN 5
#define RUNS	       3
#define MAX_ROUNDS     (ROUNDS_PER_RUN * RUNS)
#define ROUND_NS       100e6

enum measure {
	M_PASSTHROUGH,
	M_SMALL,
	M_LARGE,
	_M_MAX,
};

static const char *const measure_names[_M_MAX] = {
	[M_PASSTHROUGH] = "cuCtxGetDevice via cuGetProcAddress (pass-through)",
	[M_SMALL] = "cuMemAlloc+cuMemFree 4 KiB (untracked)",
	[M_LARGE] = "cuMemAlloc+cuMemFree 64 MiB (tracked: convert+export+announce)",
};

static const char *const measure_keys[_M_MAX] = {
	[M_PASSTHROUGH] = "passthrough",
	[M_SMALL] = "small_alloc_free",
	[M_LARGE] = "tracked_large_alloc_free",
};

/* ---- the measuring child ---- */

static void *resolve(PFN_cuGetProcAddress_v12000 gpa, const char *name, int version)
{
	void *fn = NULL;

	if (gpa(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, NULL) != CUDA_SUCCESS)
		return NULL;
	return fn;
}

int bench_shim_overhead_child(int argc, char **argv)
{
	PFN_cuGetProcAddress_v12000 gpa;
	PFN_cuInit_v2000 init;
	PFN_cuDeviceGet_v2000 device_get;
	PFN_cuDevicePrimaryCtxRetain_v7000 retain;
	PFN_cuCtxSetCurrent_v4000 ctx_set;
	PFN_cuCtxGetDevice_v2000 ctx_get_device;
	PFN_cuMemAlloc_v3020 alloc;
	PFN_cuMemFree_v3020 free_;
	CUdeviceptr held[64], p;
	CUcontext ctx;
	CUdevice dev;
	void *lib;

	(void)argc;
	(void)argv;
	/* As libcudart reaches the driver. */
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return log_error_errno(-ENOENT, "Failed to load libcuda.so.1: %s", dlerror()), 1;
	gpa = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
	if (!gpa)
		return 1;
	init = resolve(gpa, "cuInit", 2000);
	device_get = resolve(gpa, "cuDeviceGet", 2000);
	retain = resolve(gpa, "cuDevicePrimaryCtxRetain", 7000);
	ctx_set = resolve(gpa, "cuCtxSetCurrent", 4000);
	ctx_get_device = resolve(gpa, "cuCtxGetDevice", 12000);
	alloc = resolve(gpa, "cuMemAlloc", 3020);
	free_ = resolve(gpa, "cuMemFree", 3020);
	if (!init || !device_get || !retain || !ctx_set || !ctx_get_device || !alloc || !free_ ||
	    init(0) != CUDA_SUCCESS || device_get(&dev, 0) != CUDA_SUCCESS ||
	    retain(&ctx, dev) != CUDA_SUCCESS || ctx_set(ctx) != CUDA_SUCCESS)
		return log_error_errno(-EIO, "Failed to initialize the driver."), 1;

	for (size_t i = 0; i < ARRAY_SIZE(held); i++)
		if (alloc(&held[i], 2 << 20) != CUDA_SUCCESS)
			return log_error_errno(-ENOMEM, "Failed to allocate."), 1;

	/* Iteration counts are calibrated in the warm-up round (round -1) so that each
	 * measurement of a round takes about ROUND_NS (BELAYER_BENCH_ROUND_NS for a quick
	 * smoke run), whatever the driver's speed. */
	const char *e = getenv("BELAYER_BENCH_ROUND_NS");
	double round_ns = e ? strtod(e, NULL) : ROUND_NS;

	long iters[_M_MAX] = {1000, 10, 2};
	for (int round = -1; round < ROUNDS_PER_RUN; round++) {
		double per[_M_MAX];

		for (int m = 0; m < _M_MAX; m++) {
			uint64_t t0 = bench_now_ns();
			CUdevice d;

			for (long i = 0; i < iters[m]; i++) {
				if (m == M_PASSTHROUGH)
					(void)ctx_get_device(&d);
				else if (alloc(&p, m == M_SMALL ? 4096 : 64 << 20) !=
						 CUDA_SUCCESS ||
					 free_(p) != CUDA_SUCCESS)
					return 1;
			}
			per[m] = (double)(bench_now_ns() - t0) / (double)iters[m];
			if (round < 0)
				iters[m] = MAX(1L, (long)(round_ns / MAX(per[m], 1.0)));
		}
		if (round >= 0)
			for (int m = 0; m < _M_MAX; m++)
				printf("%d %.3f\n", m, per[m]);
	}
	for (size_t i = 0; i < ARRAY_SIZE(held); i++)
		(void)free_(held[i]);
	return 0;
}

/* ---- the bench's own supervisor stand-in: counts what the shim announces ---- */

struct listener {
	int fd;
	uint64_t announced;
	uint64_t released;
	int stop[2];
};

static void *listener_thread(void *arg)
{
	struct listener *l = arg;
	struct pollfd fds[2 + 16];
	size_t n = 2;

	fds[0] = (struct pollfd){.fd = l->fd, .events = POLLIN};
	fds[1] = (struct pollfd){.fd = l->stop[0], .events = POLLIN};
	for (;;) {
		if (poll(fds, n, -1) < 0 && errno != EINTR)
			break;
		if (fds[1].revents)
			break;
		if ((fds[0].revents & POLLIN) && n < ARRAY_SIZE(fds)) {
			int c = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);

			if (c >= 0)
				fds[n++] = (struct pollfd){.fd = c, .events = POLLIN};
		}
		for (size_t i = 2; i < n; i++) {
			struct proto_msg m;

			if (!fds[i].revents)
				continue;
			if (proto_recv(fds[i].fd, &m, 0) < 0) {
				close(fds[i].fd);
				fds[i--] = fds[--n];
				continue;
			}
			if (m.type == PROTO_REGION_ANNOUNCE)
				__atomic_add_fetch(&l->announced, 1, __ATOMIC_RELAXED);
			else if (m.type == PROTO_REGION_RELEASE)
				__atomic_add_fetch(&l->released, 1, __ATOMIC_RELAXED);
			proto_msg_finish(&m);
		}
	}
	for (size_t i = 2; i < n; i++)
		close(fds[i].fd);
	return NULL;
}

/* Runs the child once; appends its per-round results. */
static int run_child(const struct bench_args *a, bool preload, const char *dir, const char *sock,
		     double results[_M_MAX][MAX_ROUNDS], size_t counts[_M_MAX])
{
	int out[2];
	pid_t pid;
	FILE *f;
	int m, status;
	double ns;

	if (pipe2(out, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		const char *old = getenv("LD_LIBRARY_PATH");
		char *lib = NULL;

		dup2(out[1], STDOUT_FILENO);
		if (a->driver) {
			if (asprintf(&lib, "%s%s%s", a->driver, old ? ":" : "", old ? old : "") < 0)
				_exit(127);
			setenv("LD_LIBRARY_PATH", lib, 1);
		}
		if (preload)
			setenv("LD_PRELOAD", a->shim, 1);
		else
			unsetenv("LD_PRELOAD");
		setenv("BELAYER_SOCKET", sock, 1);
		setenv("BELAYER_EMU_DIR", dir, 1);
		setenv("BELAYER_LOG_LEVEL", "error", 1);
		execl(a->self, a->self, "--child-shim-overhead", (char *)NULL);
		_exit(127);
	}
	close(out[1]);
	f = fdopen(out[0], "r");
	if (!f)
		return -errno;
	while (fscanf(f, "%d %lf", &m, &ns) == 2)
		if (m >= 0 && m < _M_MAX && counts[m] < MAX_ROUNDS)
			results[m][counts[m]++] = ns;
	fclose(f);
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return log_error_errno(-EIO, "The measuring child failed (%s the shim).",
				       preload ? "with" : "without");
	return 0;
}

static double median(double *v, size_t n)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), bench_cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct driver_result {
	const char *label;
	const char *dir;
	double med[2][_M_MAX];
	uint64_t announced, released;
};

/* Measures one driver: children alternate without and with the shim, RUNS times each. */
static int measure_driver(const struct bench_args *a, struct driver_result *res)
{
	static double results[2][_M_MAX][MAX_ROUNDS];
	size_t counts[2][_M_MAX] = {};
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct listener l = {.fd = -1};
	struct bench_args ca = *a;
	char dir[] = "/tmp/belayer-bench-XXXXXX";
	char sock[sizeof(dir) + 32], state[sizeof(dir) + 16];
	pthread_t t;
	int r = 0;

	ca.driver = res->dir;
	if (!mkdtemp(dir))
		return log_error_errno(-errno, "Failed to create a temporary directory: %m");
	snprintf(sock, sizeof(sock), "%s/supervisor.sock", dir);
	snprintf(state, sizeof(state), "%s/state", dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	l.fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (l.fd < 0 || bind(l.fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(l.fd, 16) < 0 || pipe2(l.stop, O_CLOEXEC) < 0)
		return log_error_errno(-errno, "Failed to listen on %s: %m", sock);
	if (pthread_create(&t, NULL, listener_thread, &l) != 0)
		return log_error_errno(-EAGAIN, "Failed to start the listener.");

	for (int run = 0; run < RUNS && r == 0; run++)
		for (int with = 0; with < 2 && r == 0; with++)
			r = run_child(&ca, with, dir, sock, results[with], counts[with]);

	if (write(l.stop[1], "x", 1) < 0)
		log_debug_errno(-errno, "Failed to stop the listener: %m");
	pthread_join(t, NULL);
	close(l.fd);
	close(l.stop[0]);
	close(l.stop[1]);
	(void)unlink(sock);
	(void)unlink(state);
	(void)rmdir(dir);
	if (r < 0)
		return r;
	for (int with = 0; with < 2; with++)
		for (int m = 0; m < _M_MAX; m++)
			res->med[with][m] = median(results[with][m], counts[with][m]);
	res->announced = l.announced;
	res->released = l.released;
	return 0;
}

int bench_shim_overhead(const struct bench_args *a, int argc, char **argv)
{
	struct driver_result res[2] = {
		{.label = a->driver ? "emulated/configured" : "system", .dir = a->driver},
		{.label = "null (the shim's own cost)", .dir = BENCH_NULL_DRIVER_DIR},
	};
	size_t n = BENCH_NULL_DRIVER_DIR[0] ? 2 : 1;
	int r;

	(void)argc;
	(void)argv;
	if (access(a->shim, R_OK) < 0)
		return log_error_errno(-errno, "Cannot read the shim %s: %m", a->shim);
	for (size_t i = 0; i < n; i++) {
		r = measure_driver(a, &res[i]);
		if (r < 0)
			return r;
	}

	if (a->json) {
		printf("{\"benchmark\":\"shim-overhead\",\"shim\":\"%s\",\"rounds\":%d,\"drivers\":"
		       "[",
		       a->shim, MAX_ROUNDS);
		for (size_t i = 0; i < n; i++) {
			printf("%s{\"driver\":\"%s\",\"dir\":\"%s\",\"announced\":%" PRIu64
			       ",\"released\":%" PRIu64 ",\"results\":[",
			       i ? "," : "", i ? "null" : "configured",
			       res[i].dir ? res[i].dir : "system", res[i].announced,
			       res[i].released);
			for (int m = 0; m < _M_MAX; m++)
				printf("%s{\"name\":\"%s\",\"without_ns\":%.2f,\"with_ns\":%.2f,"
				       "\"added_ns\":%.2f}",
				       m ? "," : "", measure_keys[m], res[i].med[0][m],
				       res[i].med[1][m], res[i].med[1][m] - res[i].med[0][m]);
			printf("]}");
		}
		printf("]}\n");
		return 0;
	}
	printf("shim-overhead: median ns per call over %d rounds (%d runs of the child without "
	       "and with LD_PRELOAD, alternating)\n",
	       MAX_ROUNDS, RUNS);
	for (size_t i = 0; i < n; i++) {
		printf("\ndriver: %s (%s)\n", res[i].label, res[i].dir ? res[i].dir : "system");
		printf("%-64s %14s %14s %12s\n", "call", "without shim", "with shim", "added");
		for (int m = 0; m < _M_MAX; m++)
			printf("%-64s %11.1f ns %11.1f ns %+9.1f ns\n", measure_names[m],
			       res[i].med[0][m], res[i].med[1][m],
			       res[i].med[1][m] - res[i].med[0][m]);
		printf("regions announced to the bench's listener: %" PRIu64 ", released: %" PRIu64
		       "\n",
		       res[i].announced, res[i].released);
	}
	return 0;
}
