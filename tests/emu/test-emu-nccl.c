/* SPDX-License-Identifier: MIT */
/*
 * The emulated libnccl.so.2, exercised the way its consumers use it: every rank is a real
 * process (fork) that loads libcuda.so.1 and libnccl.so.2 with dlopen/dlsym, as vLLM's ctypes
 * binding and the CUDA runtime do, and the unique id travels to the other ranks through a
 * pipe before ncclCommInitRank. The parent never loads either library; it injects faults and
 * hangs through the run's shared state (emu-state) and judges the children's exit status.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cudaTypedefs.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "emu-state.h"
#include "test-util.h"
#include "util.h"

#define MAX_RANKS	 8
#define NDEVICES	 4
#define CHILD_TIMEOUT_MS 60000

static char *run_dir;

/* ---- in the children: the libraries, loaded as consumers load them ---- */

static struct {
	PFN_cuInit_v2000 cuInit;
	PFN_cuDeviceGet_v2000 cuDeviceGet;
	PFN_cuDevicePrimaryCtxRetain_v7000 cuDevicePrimaryCtxRetain;
	PFN_cuCtxSetCurrent_v4000 cuCtxSetCurrent;
	PFN_cuMemAlloc_v3020 cuMemAlloc;
	PFN_cuMemFree_v3020 cuMemFree;
	PFN_cuMemcpyHtoD_v3020 cuMemcpyHtoD;
	PFN_cuMemcpyDtoH_v3020 cuMemcpyDtoH;
	int64_t (*live_allocations)(int dev, uint64_t *ret_bytes);

	ncclResult_t (*GetVersion)(int *);
	ncclResult_t (*GetUniqueId)(ncclUniqueId *);
	ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
	ncclResult_t (*CommInitRankConfig)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
	ncclResult_t (*CommInitAll)(ncclComm_t *, int, const int *);
	ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
	ncclResult_t (*CommDestroy)(ncclComm_t);
	ncclResult_t (*CommAbort)(ncclComm_t);
	ncclResult_t (*CommFinalize)(ncclComm_t);
	ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
	ncclResult_t (*CommCount)(const ncclComm_t, int *);
	ncclResult_t (*CommUserRank)(const ncclComm_t, int *);
	ncclResult_t (*CommCuDevice)(const ncclComm_t, int *);
	const char *(*GetErrorString)(ncclResult_t);
	const char *(*GetLastError)(ncclComm_t);
	ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
				  ncclComm_t, cudaStream_t);
	ncclResult_t (*pAllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
				   ncclComm_t, cudaStream_t);
	ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
				  cudaStream_t);
	ncclResult_t (*Bcast)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*Reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
			       ncclComm_t, cudaStream_t);
	ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
				  cudaStream_t);
	ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
				      ncclComm_t, cudaStream_t);
	ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*GroupStart)(void);
	ncclResult_t (*GroupEnd)(void);
	ncclResult_t (*MemAlloc)(void **, size_t);
	ncclResult_t (*MemFree)(void *);
	ncclResult_t (*CommRegister)(const ncclComm_t, void *, size_t, void **);
	ncclResult_t (*CommDeregister)(const ncclComm_t, void *);
} api;

#define CHECK(cond)                                                                         \
	do {                                                                                \
		if (!(cond)) {                                                              \
			fprintf(stderr, "pid %d: %s:%d: check failed: %s\n", (int)getpid(), \
				__FILE__, __LINE__, #cond);                                 \
			_exit(1);                                                           \
		}                                                                           \
	} while (0)

#define NCCL_OK(call)                                                                             \
	do {                                                                                      \
		ncclResult_t r_ = (call);                                                         \
		if (r_ != ncclSuccess) {                                                          \
			fprintf(stderr, "pid %d: %s:%d: %s = %d (%s)\n", (int)getpid(), __FILE__, \
				__LINE__, #call, (int)r_, api.GetLastError(NULL));                \
			_exit(1);                                                                 \
		}                                                                                 \
	} while (0)

#define CU_OK(call) CHECK((call) == CUDA_SUCCESS)

static void *must_sym(void *lib, const char *name)
{
	void *p = dlsym(lib, name);

	if (!p) {
		fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
		_exit(1);
	}
	return p;
}

/* The CUDA runtime's way in: cuGetProcAddress_v2 by name and the ABI version we typed. */
static void *driver_sym(PFN_cuGetProcAddress_v12000 gpa, const char *name, int version)
{
	CUdriverProcAddressQueryResult status;
	void *p = NULL;

	CHECK(gpa(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS);
	CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS && p);
	return p;
}

#define NCCL_SYM(lib, field, name) api.field = (__typeof__(api.field))must_sym(lib, name)

static void child_load(void)
{
	void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	void *nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
	PFN_cuGetProcAddress_v12000 gpa;

	if (!cuda || !nccl) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		_exit(1);
	}
	gpa = (PFN_cuGetProcAddress_v12000)must_sym(cuda, "cuGetProcAddress_v2");
	api.cuInit = driver_sym(gpa, "cuInit", 2000);
	api.cuDeviceGet = driver_sym(gpa, "cuDeviceGet", 2000);
	api.cuDevicePrimaryCtxRetain = driver_sym(gpa, "cuDevicePrimaryCtxRetain", 7000);
	api.cuCtxSetCurrent = driver_sym(gpa, "cuCtxSetCurrent", 4000);
	api.cuMemAlloc = driver_sym(gpa, "cuMemAlloc", 3020);
	api.cuMemFree = driver_sym(gpa, "cuMemFree", 3020);
	api.cuMemcpyHtoD = driver_sym(gpa, "cuMemcpyHtoD", 3020);
	api.cuMemcpyDtoH = driver_sym(gpa, "cuMemcpyDtoH", 3020);
	api.live_allocations = must_sym(cuda, "belayer_emu_live_allocations");

	NCCL_SYM(nccl, GetVersion, "ncclGetVersion");
	NCCL_SYM(nccl, GetUniqueId, "ncclGetUniqueId");
	NCCL_SYM(nccl, CommInitRank, "ncclCommInitRank");
	NCCL_SYM(nccl, CommInitRankConfig, "ncclCommInitRankConfig");
	NCCL_SYM(nccl, CommInitAll, "ncclCommInitAll");
	NCCL_SYM(nccl, CommSplit, "ncclCommSplit");
	NCCL_SYM(nccl, CommDestroy, "ncclCommDestroy");
	NCCL_SYM(nccl, CommAbort, "ncclCommAbort");
	NCCL_SYM(nccl, CommFinalize, "ncclCommFinalize");
	NCCL_SYM(nccl, CommGetAsyncError, "ncclCommGetAsyncError");
	NCCL_SYM(nccl, CommCount, "ncclCommCount");
	NCCL_SYM(nccl, CommUserRank, "ncclCommUserRank");
	NCCL_SYM(nccl, CommCuDevice, "ncclCommCuDevice");
	NCCL_SYM(nccl, GetErrorString, "ncclGetErrorString");
	NCCL_SYM(nccl, GetLastError, "ncclGetLastError");
	NCCL_SYM(nccl, AllReduce, "ncclAllReduce");
	NCCL_SYM(nccl, pAllReduce, "pncclAllReduce");
	NCCL_SYM(nccl, Broadcast, "ncclBroadcast");
	NCCL_SYM(nccl, Bcast, "ncclBcast");
	NCCL_SYM(nccl, Reduce, "ncclReduce");
	NCCL_SYM(nccl, AllGather, "ncclAllGather");
	NCCL_SYM(nccl, ReduceScatter, "ncclReduceScatter");
	NCCL_SYM(nccl, Send, "ncclSend");
	NCCL_SYM(nccl, Recv, "ncclRecv");
	NCCL_SYM(nccl, GroupStart, "ncclGroupStart");
	NCCL_SYM(nccl, GroupEnd, "ncclGroupEnd");
	NCCL_SYM(nccl, MemAlloc, "ncclMemAlloc");
	NCCL_SYM(nccl, MemFree, "ncclMemFree");
	NCCL_SYM(nccl, CommRegister, "ncclCommRegister");
	NCCL_SYM(nccl, CommDeregister, "ncclCommDeregister");
	CU_OK(api.cuInit(0));
}

/* cudaSetDevice(dev), in driver terms: its primary context becomes current. */
static void use_device(int dev)
{
	CUcontext ctx;
	CUdevice d;

	CU_OK(api.cuDeviceGet(&d, dev));
	CU_OK(api.cuDevicePrimaryCtxRetain(&ctx, d));
	CU_OK(api.cuCtxSetCurrent(ctx));
}

static void *dev_alloc(size_t bytes)
{
	CUdeviceptr p = 0;

	CU_OK(api.cuMemAlloc(&p, bytes));
	return (void *)(uintptr_t)p;
}

static void dev_free(void *p)
{
	CU_OK(api.cuMemFree((CUdeviceptr)(uintptr_t)p));
}

static void to_dev(void *dst, const void *src, size_t bytes)
{
	CU_OK(api.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, bytes));
}

static void from_dev(void *dst, const void *src, size_t bytes)
{
	CU_OK(api.cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, bytes));
}

static void *xmalloc(size_t bytes)
{
	void *p = malloc(bytes ? bytes : 1);

	CHECK(p);
	return p;
}

static ncclComm_t comm_init(int nranks, const ncclUniqueId *id, int rank)
{
	ncclComm_t comm = NULL;
	int v;

	NCCL_OK(api.CommInitRank(&comm, nranks, *id, rank));
	NCCL_OK(api.CommCount(comm, &v));
	CHECK(v == nranks);
	NCCL_OK(api.CommUserRank(comm, &v));
	CHECK(v == rank);
	return comm;
}

/* ---- in the parent: ranks as processes ---- */

typedef void (*rank_fn)(int rank, int nranks, const ncclUniqueId *id, void *arg);

struct ranks {
	int n;
	pid_t pid[MAX_RANKS];
};

/* Rank 0 makes the id and hands it to the others through a pipe, as torch.distributed hands
 * it through its store; each rank runs on device == rank. */
static void ranks_spawn(struct ranks *rk, int n, rank_fn fn, void *arg)
{
	int p[2];

	assert_true(n <= MAX_RANKS);
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	rk->n = n;
	for (int r = 0; r < n; r++) {
		pid_t pid = fork();

		assert_true(pid >= 0);
		if (pid == 0) {
			ncclUniqueId id;

			/* A rank outliving a killed test would hang forever in its collective. */
			(void)prctl(PR_SET_PDEATHSIG, SIGKILL);
			child_load();
			use_device(r % NDEVICES);
			if (r == 0) {
				NCCL_OK(api.GetUniqueId(&id));
				for (int i = 1; i < n; i++)
					CHECK(write(p[1], &id, sizeof(id)) == (ssize_t)sizeof(id));
			} else {
				CHECK(read(p[0], &id, sizeof(id)) == (ssize_t)sizeof(id));
			}
			fn(r, n, &id, arg);
			_exit(0);
		}
		rk->pid[r] = pid;
	}
	close(p[0]);
	close(p[1]);
}

/* Waits for pid within timeout_ms (a pidfd, so the wait is bounded); kills it on timeout.
 * Returns the wait status, or -1 on timeout. */
static int child_wait(pid_t pid, int timeout_ms)
{
	int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	struct pollfd pfd = {.fd = pidfd, .events = POLLIN};
	int status = 0, ready;

	assert_true(pidfd >= 0);
	ready = poll(&pfd, 1, timeout_ms);
	close(pidfd);
	if (ready != 1) {
		(void)kill(pid, SIGKILL);
		(void)waitpid(pid, &status, 0);
		return -1;
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	return status;
}

static void ranks_expect_success(struct ranks *rk)
{
	int failed = 0;

	for (int r = 0; r < rk->n; r++) {
		int status;

		if (rk->pid[r] <= 0)
			continue;
		status = child_wait(rk->pid[r], CHILD_TIMEOUT_MS);
		if (status == -1)
			print_error("rank %d (pid %d) timed out\n", r, (int)rk->pid[r]);
		else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
			print_error("rank %d (pid %d) failed: status 0x%x\n", r, (int)rk->pid[r],
				    status);
		failed += status != 0;
		rk->pid[r] = 0;
	}
	assert_int_equal(failed, 0);
}

static void run_ranks(int n, rank_fn fn, void *arg)
{
	struct ranks rk;

	ranks_spawn(&rk, n, fn, arg);
	ranks_expect_success(&rk);
}

/* A single process, for tests that need no peers. */
static void run_single(void (*fn)(void))
{
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		(void)prctl(PR_SET_PDEATHSIG, SIGKILL);
		child_load();
		use_device(0);
		fn();
		_exit(0);
	}
	assert_int_equal(child_wait(pid, CHILD_TIMEOUT_MS), 0);
}

/* ---- all-reduce ---- */

#define BIG_COUNT ((1u << 20) + 7) /* 4 MiB of floats: several slot steps and a short tail */

static void rank_allreduce_f32(int rank, int n, const ncclUniqueId *id, void *arg)
{
	size_t count = BIG_COUNT;
	ncclComm_t comm = comm_init(n, id, rank);
	float *h = xmalloc(count * sizeof(float));
	void *send = dev_alloc(count * sizeof(float)), *recv = dev_alloc(count * sizeof(float));
	float base = (float)(n * (n - 1) / 2);

	for (size_t i = 0; i < count; i++)
		h[i] = (float)rank + (float)(i % 1000);
	to_dev(send, h, count * sizeof(float));
	NCCL_OK(api.AllReduce(send, recv, count, ncclFloat32, ncclSum, comm, NULL));
	from_dev(h, recv, count * sizeof(float));
	for (size_t i = 0; i < count; i++)
		CHECK(h[i] == base + (float)n * (float)(i % 1000));

	/* In place, through the profiling name (same entry point). */
	NCCL_OK(api.pAllReduce(recv, recv, count, ncclFloat32, ncclMax, comm, NULL));
	from_dev(h, recv, count * sizeof(float));
	for (size_t i = 0; i < count; i++)
		CHECK(h[i] == base + (float)n * (float)(i % 1000));
	dev_free(send);
	dev_free(recv);
	free(h);
	NCCL_OK(api.CommDestroy(comm));
}

static void test_allreduce_2_processes(void **state)
{
	run_ranks(2, rank_allreduce_f32, NULL);
}

/* ---- ranks join in any order ---- */

struct gates {
	int go[MAX_RANKS][2];
};

static void rank_gated(int rank, int n, const ncclUniqueId *id, void *arg)
{
	struct gates *g = arg;
	ncclComm_t comm;
	int32_t v = rank, *buf = dev_alloc(sizeof(v));
	char c;

	CHECK(read(g->go[rank][0], &c, 1) == 1);
	comm = comm_init(n, id, rank);
	to_dev(buf, &v, sizeof(v));
	NCCL_OK(api.AllReduce(buf, buf, 1, ncclInt32, ncclSum, comm, NULL));
	from_dev(&v, buf, sizeof(v));
	CHECK(v == n * (n - 1) / 2);
	NCCL_OK(api.CommDestroy(comm));
}

/* Waits (bounded, on inotify) until a rendezvous file appears in the run directory. */
static void wait_rendezvous_created(int ifd)
{
	struct pollfd pfd = {.fd = ifd, .events = POLLIN};
	char events[4096] __attribute__((aligned(__alignof__(struct inotify_event))));

	for (;;) {
		ssize_t len;

		assert_int_equal(poll(&pfd, 1, CHILD_TIMEOUT_MS), 1);
		len = read(ifd, events, sizeof(events));
		assert_true(len > 0);
		for (char *p = events; p < events + len;) {
			struct inotify_event *ev = (struct inotify_event *)p;

			if (ev->len > 0 && strncmp(ev->name, "nccl-", 5) == 0)
				return;
			p += sizeof(*ev) + ev->len;
		}
	}
}

static int count_rendezvous_files(void)
{
	DIR *d = opendir(run_dir);
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)))
		n += strncmp(de->d_name, "nccl-", 5) == 0;
	closedir(d);
	return n;
}

/* The last rank creates the rendezvous and waits there; ranks 0 (which made the id) and 1
 * join it afterwards: nothing depends on rank 0 arriving first. */
static void test_ranks_join_in_any_order(void **state)
{
	struct gates g;
	struct ranks rk;
	int ifd = inotify_init1(IN_CLOEXEC);

	assert_true(ifd >= 0);
	assert_true(inotify_add_watch(ifd, run_dir, IN_CREATE) >= 0);
	for (int r = 0; r < 3; r++)
		assert_int_equal(pipe2(g.go[r], O_CLOEXEC), 0);
	ranks_spawn(&rk, 3, rank_gated, &g);
	assert_int_equal(write(g.go[2][1], "g", 1), 1);
	wait_rendezvous_created(ifd);
	assert_int_equal(write(g.go[0][1], "g", 1), 1);
	assert_int_equal(write(g.go[1][1], "g", 1), 1);
	ranks_expect_success(&rk);
	/* The name served its purpose once everyone joined: nothing is left behind. */
	assert_int_equal(count_rendezvous_files(), 0);
	for (int r = 0; r < 3; r++) {
		close(g.go[r][0]);
		close(g.go[r][1]);
	}
	close(ifd);
}

/* Exact in every type: small integers. Halves by hand (clang has no _Float16 on x86): normal
 * numbers whose mantissa fits 10 bits, which is all this test uses. */
static uint16_t half_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	CHECK(f >= 1.0f && f < 65504.0f && (u & 0x1fff) == 0);
	return (uint16_t)((((u >> 23) & 0xff) - 127 + 15) << 10 | ((u >> 13) & 0x3ff));
}

static float half_value(uint16_t h)
{
	uint32_t exp = (h >> 10) & 0x1f, u;
	float f;

	if (exp == 0 || exp == 0x1f || (h & 0x8000))
		return -1.0f; /* never produced by a correct sum of the values used */
	u = ((exp - 15 + 127) << 23) | ((uint32_t)(h & 0x3ff) << 13);
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t bf16_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return (uint16_t)(u >> 16); /* exact for the small integers used here */
}

static float bf16_value(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* Element i of rank r; every type below holds it exactly. */
static int64_t val(int r, size_t i)
{
	return (int64_t)((i * 7 + (size_t)r * 3) % 50) + 1;
}

static void allreduce_check(ncclComm_t comm, int rank, int n, ncclDataType_t type, ncclRedOp_t op,
			    size_t count, bool in_place)
{
	size_t es = type == ncclFloat64 || type == ncclInt64	  ? 8
		    : type == ncclFloat16 || type == ncclBfloat16 ? 2
		    : type == ncclUint8				  ? 1
								  : 4;
	uint8_t *h = xmalloc(count * es);
	void *send = dev_alloc(count * es), *recv = in_place ? send : dev_alloc(count * es);

	for (size_t i = 0; i < count; i++) {
		int64_t v = val(rank, i);
		uint8_t *p = h + i * es;

		switch (type) {
		case ncclFloat32:
			*(float *)p = (float)v;
			break;
		case ncclFloat64:
			*(double *)p = (double)v;
			break;
		case ncclInt32:
			*(int32_t *)p = (int32_t)v;
			break;
		case ncclInt64:
			*(int64_t *)p = v;
			break;
		case ncclUint8:
			*p = (uint8_t)v;
			break;
		case ncclFloat16:
			*(uint16_t *)p = half_bits((float)v);
			break;
		case ncclBfloat16:
			*(uint16_t *)p = bf16_bits((float)v);
			break;
		default:
			CHECK(false);
		}
	}
	to_dev(send, h, count * es);
	NCCL_OK(api.AllReduce(send, recv, count, type, op, comm, NULL));
	from_dev(h, recv, count * es);
	for (size_t i = 0; i < count; i++) {
		int64_t want = val(0, i);
		double got;
		uint8_t *p = h + i * es;

		for (int r = 1; r < n; r++) {
			int64_t v = val(r, i);
			want = op == ncclSum || op == ncclAvg ? want + v
			       : op == ncclProd		      ? want * v
			       : op == ncclMax		      ? MAX(want, v)
							      : MIN(want, v);
		}
		switch (type) {
		case ncclFloat32:
			got = *(float *)p;
			break;
		case ncclFloat64:
			got = *(double *)p;
			break;
		case ncclInt32:
			got = *(int32_t *)p;
			break;
		case ncclInt64:
			got = (double)*(int64_t *)p;
			break;
		case ncclUint8:
			got = *p;
			want = (uint8_t)want;
			break;
		case ncclFloat16:
			got = half_value(*(uint16_t *)p);
			break;
		case ncclBfloat16:
			got = bf16_value(*(uint16_t *)p);
			break;
		default:
			got = -1;
		}
		if (op == ncclAvg)
			CHECK(got == (double)want / n);
		else
			CHECK(got == (double)want);
	}
	if (!in_place)
		dev_free(recv);
	dev_free(send);
	free(h);
}

static void rank_allreduce_types(int rank, int n, const ncclUniqueId *id, void *arg)
{
	ncclComm_t comm = comm_init(n, id, rank);

	allreduce_check(comm, rank, n, ncclFloat32, ncclSum, 300000, false);
	allreduce_check(comm, rank, n, ncclFloat64, ncclAvg, 1000, false); /* sums are 4k: exact */
	allreduce_check(comm, rank, n, ncclInt32, ncclProd, 1000, true);
	allreduce_check(comm, rank, n, ncclInt64, ncclMax, 200000, false);
	allreduce_check(comm, rank, n, ncclUint8, ncclMin, 5000, true);
	allreduce_check(comm, rank, n, ncclFloat16, ncclSum, 4096, false);
	allreduce_check(comm, rank, n, ncclBfloat16, ncclMax, 4096, false);
	NCCL_OK(api.CommDestroy(comm));
}

static void test_allreduce_4_processes_types_ops(void **state)
{
	run_ranks(4, rank_allreduce_types, NULL);
}

/* ---- the other collectives ---- */

static void fill_i32(int32_t *h, size_t count, int rank)
{
	for (size_t i = 0; i < count; i++)
		h[i] = (int32_t)(rank * 1000003 + (int)i);
}

static void rank_collectives(int rank, int n, const ncclUniqueId *id, void *arg)
{
	ncclComm_t comm = comm_init(n, id, rank);
	size_t count = 300001, bytes = count * 4;
	int32_t *h = xmalloc(bytes * n), *want = xmalloc(bytes * n);
	void *send = dev_alloc(bytes * n), *recv = dev_alloc(bytes * n);

	/* Broadcast from root 1, then the deprecated in-place ncclBcast from root 0. */
	fill_i32(h, count, rank);
	to_dev(send, h, bytes);
	NCCL_OK(api.Broadcast(send, recv, count, ncclInt32, 1, comm, NULL));
	from_dev(h, recv, bytes);
	fill_i32(want, count, 1);
	CHECK(memcmp(h, want, bytes) == 0);
	NCCL_OK(api.Bcast(send, count, ncclInt32, 0, comm, NULL));
	from_dev(h, send, bytes);
	fill_i32(want, count, 0);
	CHECK(memcmp(h, want, bytes) == 0);

	/* Reduce to root 2; recvbuff may be NULL elsewhere (nccl.h). */
	fill_i32(h, count, rank);
	to_dev(send, h, bytes);
	NCCL_OK(api.Reduce(send, rank == 2 ? recv : NULL, count, ncclInt32, ncclSum, 2, comm,
			   NULL));
	if (rank == 2) {
		from_dev(h, recv, bytes);
		for (size_t i = 0; i < count; i++) {
			int64_t s = 0;
			for (int r = 0; r < n; r++)
				s += r * 1000003 + (int64_t)i;
			CHECK(h[i] == (int32_t)s);
		}
	}

	/* All-gather: rank r's block lands at r * count; then in place. */
	fill_i32(h, count, rank);
	to_dev(send, h, bytes);
	NCCL_OK(api.AllGather(send, recv, count, ncclInt32, comm, NULL));
	from_dev(h, recv, bytes * n);
	for (int r = 0; r < n; r++) {
		fill_i32(want + (size_t)r * count, count, r);
	}
	CHECK(memcmp(h, want, bytes * n) == 0);
	fill_i32(h, count, rank);
	to_dev((uint8_t *)recv + (size_t)rank * bytes, h, bytes);
	NCCL_OK(api.AllGather((uint8_t *)recv + (size_t)rank * bytes, recv, count, ncclInt32, comm,
			      NULL));
	from_dev(h, recv, bytes * n);
	CHECK(memcmp(h, want, bytes * n) == 0);

	/* Reduce-scatter: block b of the sum lands on rank b. Element j of block b on rank r is
	 * r + b + j, so the sum is n(n-1)/2 + n(b + j). */
	for (int b = 0; b < n; b++)
		for (size_t j = 0; j < count; j++)
			h[(size_t)b * count + j] = rank + b + (int32_t)j;
	to_dev(send, h, bytes * n);
	NCCL_OK(api.ReduceScatter(send, recv, count, ncclInt32, ncclSum, comm, NULL));
	from_dev(h, recv, bytes);
	for (size_t j = 0; j < count; j++)
		CHECK(h[j] == n * (n - 1) / 2 + n * (rank + (int32_t)j));

	dev_free(send);
	dev_free(recv);
	free(h);
	free(want);
	NCCL_OK(api.CommDestroy(comm));
}

static void test_broadcast_reduce_allgather_reducescatter(void **state)
{
	run_ranks(3, rank_collectives, NULL);
}

/* ---- send/recv ---- */

static uint8_t pattern(int from, size_t i)
{
	return (uint8_t)(from * 37 + i * 13 + (i >> 9));
}

/* Every rank sends to the next and receives from the previous, more bytes than a pair's ring
 * holds: only concurrent progress inside the group lets this finish. */
static void rank_sendrecv(int rank, int n, const ncclUniqueId *id, void *arg)
{
	ncclComm_t comm = comm_init(n, id, rank);
	size_t bytes = (3u << 20) + 5;
	int next = (rank + 1) % n, prev = (rank + n - 1) % n;
	uint8_t *h = xmalloc(bytes);
	void *send = dev_alloc(bytes), *recv = dev_alloc(bytes);
	int32_t token = 0;

	for (size_t i = 0; i < bytes; i++)
		h[i] = pattern(rank, i);
	to_dev(send, h, bytes);
	NCCL_OK(api.GroupStart());
	NCCL_OK(api.Send(send, bytes, ncclUint8, next, comm, NULL));
	NCCL_OK(api.Recv(recv, bytes, ncclUint8, prev, comm, NULL));
	NCCL_OK(api.GroupEnd());
	from_dev(h, recv, bytes);
	for (size_t i = 0; i < bytes; i++)
		CHECK(h[i] == pattern(prev, i));

	/* Outside a group, a small message that fits the ring: rank 0 sends, rank 1 receives. */
	if (rank == 0) {
		token = 4242;
		to_dev(send, &token, sizeof(token));
		NCCL_OK(api.Send(send, 1, ncclInt32, 1, comm, NULL));
	} else if (rank == 1) {
		NCCL_OK(api.Recv(recv, 1, ncclInt32, 0, comm, NULL));
		from_dev(&token, recv, sizeof(token));
		CHECK(token == 4242);
	}
	dev_free(send);
	dev_free(recv);
	free(h);
	NCCL_OK(api.CommDestroy(comm));
}

static void test_send_recv_ring(void **state)
{
	run_ranks(4, rank_sendrecv, NULL);
}

/* ---- ncclCommInitAll: one process, one communicator per device ---- */

struct thread_rank {
	ncclComm_t comm;
	int dev;
	size_t count;
	void *buf;
	ncclResult_t res;
};

static void *thread_allreduce(void *p)
{
	struct thread_rank *t = p;

	t->res = api.AllReduce(t->buf, t->buf, t->count, ncclFloat32, ncclSum, t->comm, NULL);
	return NULL;
}

static void initall_body(void)
{
	enum {
		N = 3
	};
	ncclComm_t comms[N];
	struct thread_rank t[N];
	pthread_t th[N];
	size_t count = 400000;
	float *h = xmalloc(count * sizeof(float));

	NCCL_OK(api.CommInitAll(comms, N, NULL));
	for (int i = 0; i < N; i++) {
		int v;

		NCCL_OK(api.CommCount(comms[i], &v));
		CHECK(v == N);
		NCCL_OK(api.CommUserRank(comms[i], &v));
		CHECK(v == i);
		NCCL_OK(api.CommCuDevice(comms[i], &v));
		CHECK(v == i);
		use_device(i);
		t[i] = (struct thread_rank){.comm = comms[i], .dev = i, .count = count};
		t[i].buf = dev_alloc(count * sizeof(float));
		for (size_t j = 0; j < count; j++)
			h[j] = (float)(i + 1);
		to_dev(t[i].buf, h, count * sizeof(float));
	}

	/* One thread drives every rank: a group (nccl.h's single-thread, multi-GPU use). */
	NCCL_OK(api.GroupStart());
	for (int i = 0; i < N; i++)
		NCCL_OK(api.AllReduce(t[i].buf, t[i].buf, count, ncclFloat32, ncclSum, comms[i],
				      NULL));
	NCCL_OK(api.GroupEnd());
	for (int i = 0; i < N; i++) {
		from_dev(h, t[i].buf, count * sizeof(float));
		for (size_t j = 0; j < count; j++)
			CHECK(h[j] == 6.0f);
	}

	/* One thread per rank. */
	for (int i = 0; i < N; i++)
		CHECK(pthread_create(&th[i], NULL, thread_allreduce, &t[i]) == 0);
	for (int i = 0; i < N; i++) {
		CHECK(pthread_join(th[i], NULL) == 0);
		CHECK(t[i].res == ncclSuccess);
		from_dev(h, t[i].buf, count * sizeof(float));
		for (size_t j = 0; j < count; j++)
			CHECK(h[j] == 18.0f);
	}
	for (int i = 0; i < N; i++) {
		dev_free(t[i].buf);
		NCCL_OK(api.CommDestroy(comms[i]));
	}
	free(h);
}

static void test_comm_init_all_threads(void **state)
{
	run_single(initall_body);
}

/* ---- ncclCommSplit ---- */

static void rank_split(int rank, int n, const ncclUniqueId *id, void *arg)
{
	ncclComm_t comm = comm_init(n, id, rank), sub = NULL;
	/* ranks 0 and 2: color 0, keyed in reverse; rank 1: alone; rank 3: no color */
	int color = rank == 3 ? NCCL_SPLIT_NOCOLOR : rank % 2, key = -rank;
	int32_t v = rank + 1, *buf = dev_alloc(sizeof(v));
	int count, urank, dev;

	NCCL_OK(api.CommSplit(comm, color, key, &sub, NULL));
	if (rank == 3) {
		CHECK(sub == NULL);
	} else {
		NCCL_OK(api.CommCount(sub, &count));
		NCCL_OK(api.CommUserRank(sub, &urank));
		NCCL_OK(api.CommCuDevice(sub, &dev));
		CHECK(dev == rank % NDEVICES);
		if (rank == 1) {
			CHECK(count == 1 && urank == 0);
		} else {
			CHECK(count == 2 && urank == (rank == 2 ? 0 : 1));
		}
		to_dev(buf, &v, sizeof(v));
		NCCL_OK(api.AllReduce(buf, buf, 1, ncclInt32, ncclSum, sub, NULL));
		from_dev(&v, buf, sizeof(v));
		CHECK(v == (rank == 1 ? 2 : 1 + 3));
		NCCL_OK(api.CommDestroy(sub));
	}
	/* The parent is intact. */
	v = 1;
	to_dev(buf, &v, sizeof(v));
	NCCL_OK(api.AllReduce(buf, buf, 1, ncclInt32, ncclSum, comm, NULL));
	from_dev(&v, buf, sizeof(v));
	CHECK(v == n);
	dev_free(buf);
	NCCL_OK(api.CommDestroy(comm));
}

static void test_comm_split(void **state)
{
	run_ranks(4, rank_split, NULL);
}

/* ---- a dead peer hangs the others until ncclCommAbort ---- */

struct blocked {
	ncclComm_t comm;
	void *buf;
	int efd;
	ncclResult_t res;
};

static void *blocked_allreduce(void *p)
{
	struct blocked *b = p;
	uint64_t one = 1;

	b->res = api.AllReduce(b->buf, b->buf, 1024, ncclFloat32, ncclSum, b->comm, NULL);
	CHECK(write(b->efd, &one, sizeof(one)) == sizeof(one));
	return NULL;
}

/* Starts an all-reduce in a thread, shows that it does not return within 500 ms (the wait
 * ends only on its return: a condition, not a sleep), aborts the communicator from this
 * thread and requires the all-reduce to return an error, bounded. */
static void expect_hang_until_abort(ncclComm_t comm, void *buf)
{
	struct blocked b = {.comm = comm, .buf = buf, .res = ncclSuccess};
	struct pollfd pfd;
	ncclResult_t async = ncclInProgress;
	pthread_t th;

	b.efd = eventfd(0, EFD_CLOEXEC);
	CHECK(b.efd >= 0);
	pfd = (struct pollfd){.fd = b.efd, .events = POLLIN};
	CHECK(pthread_create(&th, NULL, blocked_allreduce, &b) == 0);
	CHECK(poll(&pfd, 1, 500) == 0); /* still inside the collective */
	/* A peer lost inside a node is no asynchronous error for NCCL: it just waits. */
	NCCL_OK(api.CommGetAsyncError(comm, &async));
	CHECK(async == ncclSuccess);
	NCCL_OK(api.CommAbort(comm));
	CHECK(poll(&pfd, 1, 10000) == 1);
	CHECK(pthread_join(th, NULL) == 0);
	CHECK(b.res != ncclSuccess);
	NCCL_OK(api.CommGetAsyncError(comm, &async));
	CHECK(async != ncclSuccess);
	close(b.efd);
}

struct sync_pipes {
	int ready[2]; /* children -> parent: one byte each, after a good collective */
	int go[2];    /* parent -> children */
};

static void rank_then_wait_go(int rank, int n, const ncclUniqueId *id, void *arg)
{
	struct sync_pipes *sp = arg;
	ncclComm_t comm = comm_init(n, id, rank);
	float one = 1.0f, got = 0;
	void *buf = dev_alloc(1024 * sizeof(float));
	char c = 'r';

	to_dev(buf, &one, sizeof(one));
	NCCL_OK(api.AllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, NULL));
	from_dev(&got, buf, sizeof(got));
	CHECK(got == (float)n);
	CHECK(write(sp->ready[1], &c, 1) == 1);
	CHECK(read(sp->go[0], &c, 1) == 1);
	expect_hang_until_abort(comm, buf);
	/* The handle is invalid after abort: the emulator says so instead of crashing. */
	CHECK(api.AllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, NULL) == ncclInvalidArgument);
}

static void sync_pipes_open(struct sync_pipes *sp)
{
	assert_int_equal(pipe2(sp->ready, O_CLOEXEC), 0);
	assert_int_equal(pipe2(sp->go, O_CLOEXEC), 0);
}

static void sync_pipes_close(struct sync_pipes *sp)
{
	close(sp->ready[0]);
	close(sp->ready[1]);
	close(sp->go[0]);
	close(sp->go[1]);
}

static void wait_ready(struct sync_pipes *sp, int n)
{
	struct pollfd pfd = {.fd = sp->ready[0], .events = POLLIN};
	char c;

	for (int i = 0; i < n; i++) {
		assert_int_equal(poll(&pfd, 1, CHILD_TIMEOUT_MS), 1);
		assert_int_equal(read(sp->ready[0], &c, 1), 1);
	}
}

static void test_killed_rank_hangs_peers_until_abort(void **state)
{
	struct sync_pipes sp;
	struct ranks rk;
	char go[2] = {'g', 'g'};
	int status;

	sync_pipes_open(&sp);
	ranks_spawn(&rk, 3, rank_then_wait_go, &sp);
	wait_ready(&sp, 3);
	/* Rank 2 dies between collectives; the survivors then enter the next one. */
	assert_int_equal(kill(rk.pid[2], SIGKILL), 0);
	status = child_wait(rk.pid[2], CHILD_TIMEOUT_MS);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	rk.pid[2] = 0;
	assert_int_equal(write(sp.go[1], go, 2), 2);
	ranks_expect_success(&rk);
	sync_pipes_close(&sp);
}

/* emu-ctl's "make a collective hang" (emu_hang_set): every rank is alive, yet the collective
 * blocks until abort. */
static void test_injected_hang_until_abort(void **state)
{
	struct sync_pipes sp;
	struct ranks rk;
	char go[2] = {'g', 'g'};

	sync_pipes_open(&sp);
	ranks_spawn(&rk, 2, rank_then_wait_go, &sp);
	wait_ready(&sp, 2);
	assert_int_equal(emu_hang_set(true), 0);
	assert_int_equal(write(sp.go[1], go, 2), 2);
	ranks_expect_success(&rk);
	assert_int_equal(emu_hang_set(false), 0);
	sync_pipes_close(&sp);
}

/* ---- fault injection, arguments, resources ---- */

static ncclComm_t solo_comm(void)
{
	ncclUniqueId id;

	NCCL_OK(api.GetUniqueId(&id));
	return comm_init(1, &id, 0);
}

/* ---- nonblocking communicators (config.blocking = 0) ---- */

/* Polls ncclCommGetAsyncError until it leaves ncclInProgress, as NCCL asks ("users must query
 * the communicator state until it becomes ncclSuccess before calling another NCCL
 * function"); bounded. Returns the state. */
static ncclResult_t nb_wait(ncclComm_t comm)
{
	ncclResult_t st = ncclInProgress;

	for (int i = 0; i < 20000 && st == ncclInProgress; i++) {
		NCCL_OK(api.CommGetAsyncError(comm, &st));
		if (st == ncclInProgress)
			(void)poll(NULL, 0, 1);
	}
	return st;
}

static ncclResult_t nb_state(ncclComm_t comm)
{
	ncclResult_t st = ncclSuccess;

	NCCL_OK(api.CommGetAsyncError(comm, &st));
	return st;
}

/* Rank 0 checks each state while rank 1 holds back (a gate), so "still in progress" is a
 * fact, not a race: nothing can complete before rank 1 takes part. */
static void rank_nonblocking(int rank, int n, const ncclUniqueId *id, void *arg)
{
	struct sync_pipes *sp = arg;
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
	ncclComm_t comm = NULL, solo = NULL, sub = (ncclComm_t)1;
	int32_t v = rank + 1, *buf = dev_alloc(sizeof(v));
	int count = -1, urank = -1, dev = -1;
	char c = 'g';

	config.blocking = 0;
	if (rank == 1)
		CHECK(read(sp->go[0], &c, 1) == 1);
	CHECK(api.CommInitRankConfig(&comm, n, *id, rank, &config) == ncclInProgress);
	CHECK(comm != NULL);
	if (rank == 0) {
		/* Init waits for rank 1: every query is refused meanwhile (ncclCommEnsureReady). */
		CHECK(nb_state(comm) == ncclInProgress);
		CHECK(api.CommCount(comm, &count) == ncclInvalidArgument);
		CHECK(api.CommUserRank(comm, &urank) == ncclInvalidArgument);
		CHECK(api.CommCuDevice(comm, &dev) == ncclInvalidArgument);
		CHECK(write(sp->go[1], &c, 1) == 1);
	}
	CHECK(nb_wait(comm) == ncclSuccess);
	NCCL_OK(api.CommCount(comm, &count));
	NCCL_OK(api.CommUserRank(comm, &urank));
	NCCL_OK(api.CommCuDevice(comm, &dev));
	CHECK(count == n && urank == rank && dev == rank % NDEVICES);

	/* A collective returns ncclInProgress and runs later; the next call before the state
	 * is ncclSuccess is refused. */
	to_dev(buf, &v, sizeof(v));
	if (rank == 1)
		CHECK(read(sp->go[0], &c, 1) == 1);
	CHECK(api.AllReduce(buf, buf, 1, ncclInt32, ncclSum, comm, NULL) == ncclInProgress);
	if (rank == 0) {
		CHECK(nb_state(comm) == ncclInProgress);
		CHECK(api.AllReduce(buf, buf, 1, ncclInt32, ncclSum, comm, NULL) ==
		      ncclInvalidArgument);
		CHECK(api.CommCount(comm, &count) == ncclInvalidArgument);
		CHECK(write(sp->go[1], &c, 1) == 1);
	}
	CHECK(nb_wait(comm) == ncclSuccess);
	from_dev(&v, buf, sizeof(v));
	CHECK(v == 3);

	/* A group of nonblocking communicators: ncclGroupEnd returns ncclInProgress. */
	NCCL_OK(api.GroupStart());
	NCCL_OK(api.AllReduce(buf, buf, 1, ncclInt32, ncclSum, comm, NULL));
	CHECK(api.GroupEnd() == ncclInProgress);
	CHECK(nb_wait(comm) == ncclSuccess);
	from_dev(&v, buf, sizeof(v));
	CHECK(v == 6);
	/* ...and may not mix with blocking ones. */
	solo = solo_comm();
	NCCL_OK(api.GroupStart());
	NCCL_OK(api.AllReduce(buf, buf, 1, ncclInt32, ncclSum, solo, NULL));
	CHECK(api.AllReduce(buf, buf, 1, ncclInt32, ncclSum, comm, NULL) == ncclInvalidArgument);
	CHECK(api.GroupEnd() == ncclInvalidArgument);
	NCCL_OK(api.CommDestroy(solo));

	/* Split of a nonblocking parent: *newcomm stays NULL and the parent in progress until
	 * the child exists. Color 0 for both, keyed in reverse. */
	if (rank == 1)
		CHECK(read(sp->go[0], &c, 1) == 1);
	CHECK(api.CommSplit(comm, 0, -rank, &sub, NULL) == ncclInProgress);
	if (rank == 0) {
		CHECK(sub == NULL);
		CHECK(nb_state(comm) == ncclInProgress);
		CHECK(write(sp->go[1], &c, 1) == 1);
	}
	CHECK(nb_wait(comm) == ncclSuccess);
	CHECK(sub != NULL);
	CHECK(nb_wait(sub) == ncclSuccess);
	NCCL_OK(api.CommCount(sub, &count));
	NCCL_OK(api.CommUserRank(sub, &urank));
	CHECK(count == 2 && urank == 1 - rank);
	v = 1;
	to_dev(buf, &v, sizeof(v));
	CHECK(api.AllReduce(buf, buf, 1, ncclInt32, ncclSum, sub, NULL) == ncclInProgress);
	CHECK(nb_wait(sub) == ncclSuccess);
	from_dev(&v, buf, sizeof(v));
	CHECK(v == 2);
	NCCL_OK(api.CommDestroy(sub));

	/* A collective its peer never joins stays in progress until ncclCommAbort, which
	 * leaves the communicator in error. */
	if (rank == 0) {
		struct pollfd pfd = {.fd = sp->ready[0], .events = POLLIN};

		CHECK(api.AllReduce(buf, buf, 1, ncclInt32, ncclSum, comm, NULL) == ncclInProgress);
		CHECK(poll(&pfd, 1, 300) == 0); /* 300 ms in which nothing can finish it */
		CHECK(nb_state(comm) == ncclInProgress);
		NCCL_OK(api.CommAbort(comm));
		CHECK(nb_state(comm) != ncclSuccess && nb_state(comm) != ncclInProgress);
	} else {
		NCCL_OK(api.CommDestroy(comm));
	}
	dev_free(buf);
}

static void test_nonblocking_communicators(void **state)
{
	struct sync_pipes sp;

	sync_pipes_open(&sp);
	run_ranks(2, rank_nonblocking, &sp);
	sync_pipes_close(&sp);
}

/* BELAYER_EMU_NCCL_ASYNC_MS holds every nonblocking job back: a lone rank's collective, which
 * nothing else delays, is still in progress just after the call and done after the delay. */
static void nonblocking_delay_body(void)
{
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
	ncclComm_t comm = NULL;
	ncclUniqueId id;
	int32_t v = 7, *buf = dev_alloc(sizeof(v));
	struct timespec t0, t1;

	config.blocking = 0;
	NCCL_OK(api.GetUniqueId(&id));
	CHECK(api.CommInitRankConfig(&comm, 1, id, 0, &config) == ncclInProgress);
	CHECK(nb_wait(comm) == ncclSuccess);
	to_dev(buf, &v, sizeof(v));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CHECK(api.AllReduce(buf, buf, 1, ncclInt32, ncclSum, comm, NULL) == ncclInProgress);
	CHECK(nb_state(comm) == ncclInProgress);
	CHECK(nb_wait(comm) == ncclSuccess);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	CHECK((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 >= 200);
	from_dev(&v, buf, sizeof(v));
	CHECK(v == 7);
	NCCL_OK(api.CommDestroy(comm));
	dev_free(buf);
}

static void test_nonblocking_delay(void **state)
{
	assert_int_equal(setenv("BELAYER_EMU_NCCL_ASYNC_MS", "200", 1), 0);
	run_single(nonblocking_delay_body);
	assert_int_equal(unsetenv("BELAYER_EMU_NCCL_ASYNC_MS"), 0);
}

static void faults_body(void)
{
	ncclComm_t comm;
	ncclUniqueId id;
	int32_t v = 5;
	void *buf = dev_alloc(sizeof(v));

	/* The parent armed: 1 x ncclCommInitRank -> ncclSystemError, 2 x ncclAllReduce ->
	 * ncclRemoteError. */
	NCCL_OK(api.GetUniqueId(&id));
	CHECK(api.CommInitRank(&comm, 1, id, 0) == ncclSystemError);
	comm = comm_init(1, &id, 0);
	to_dev(buf, &v, sizeof(v));
	CHECK(api.AllReduce(buf, buf, 1, ncclInt32, ncclSum, comm, NULL) == ncclRemoteError);
	CHECK(api.pAllReduce(buf, buf, 1, ncclInt32, ncclSum, comm, NULL) == ncclRemoteError);
	NCCL_OK(api.AllReduce(buf, buf, 1, ncclInt32, ncclSum, comm, NULL));
	from_dev(&v, buf, sizeof(v));
	CHECK(v == 5);
	dev_free(buf);
	NCCL_OK(api.CommDestroy(comm));
}

static void test_fault_injection(void **state)
{
	assert_int_equal(emu_fault_add("ncclCommInitRank", 1, ncclSystemError), 0);
	assert_int_equal(emu_fault_add("ncclAllReduce", 2, ncclRemoteError), 0);
	run_single(faults_body);
}

static void arguments_body(void)
{
	ncclComm_t comm = solo_comm(), pair[2];
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER, bad = {0};
	ncclUniqueId id;
	int devs[2] = {1, 1}, version = 0;
	void *buf = dev_alloc(64);
	float host[4] = {0};

	NCCL_OK(api.GetVersion(&version));
	CHECK(version == NCCL_VERSION_CODE);
	CHECK(strcmp(api.GetErrorString(ncclInvalidArgument), "") != 0);
	CHECK(api.AllReduce(buf, buf, 4, ncclFloat8e4m3, ncclSum, comm, NULL) ==
	      ncclInvalidArgument);
	CHECK(api.AllReduce(buf, buf, 4, ncclFloat32, ncclNumOps, comm, NULL) ==
	      ncclInvalidArgument);
	/* Host memory is no device memory. */
	CHECK(api.AllReduce(host, host, 4, ncclFloat32, ncclSum, comm, NULL) ==
	      ncclInvalidArgument);
	CHECK(api.Broadcast(buf, buf, 4, ncclFloat32, 1, comm, NULL) == ncclInvalidArgument);
	CHECK(api.GroupEnd() == ncclInvalidUsage);
	NCCL_OK(api.GetUniqueId(&id));
	CHECK(api.CommInitRankConfig(&pair[0], 1, id, 0, &bad) == ncclInvalidArgument);
	config.blocking = 1;
	NCCL_OK(api.CommInitRankConfig(&pair[0], 1, id, 0, &config));
	NCCL_OK(api.CommFinalize(pair[0]));
	NCCL_OK(api.CommDestroy(pair[0]));
	/* Two ranks on one GPU: NCCL's "Duplicate GPU detected". */
	CHECK(api.CommInitAll(pair, 2, devs) == ncclInvalidUsage);
	NCCL_OK(api.CommDestroy(comm));
	CHECK(api.CommCount(comm, &version) == ncclInvalidArgument);
	dev_free(buf);
}

static void test_arguments_and_errors(void **state)
{
	run_single(arguments_body);
}

/* NCCL allocates its buffers on the device through the driver at init and frees them at
 * destroy/abort; the emulator's are visible as live allocations of the run. */
static void driver_buffer_body(void)
{
	uint64_t bytes0, bytes1, bytes2;
	int64_t n0 = api.live_allocations(0, &bytes0), n1, n2;
	ncclComm_t comm = solo_comm();

	n1 = api.live_allocations(0, &bytes1);
	CHECK(n0 >= 0 && n1 == n0 + 1 && bytes1 > bytes0);
	NCCL_OK(api.CommDestroy(comm));
	n2 = api.live_allocations(0, &bytes2);
	CHECK(n2 == n0 && bytes2 == bytes0);

	comm = solo_comm();
	CHECK(api.live_allocations(0, NULL) == n0 + 1);
	NCCL_OK(api.CommAbort(comm));
	CHECK(api.live_allocations(0, NULL) == n0);
}

static void test_device_buffer_through_driver(void **state)
{
	run_single(driver_buffer_body);
}

/* ncclMemAlloc: device memory through the driver, granularity-rounded, usable by collectives
 * and registration; ncclMemFree gives it back. */
static void mem_alloc_body(void)
{
	uint64_t bytes0, bytes1;
	int64_t n0 = api.live_allocations(0, &bytes0);
	ncclComm_t comm = solo_comm();
	int64_t with_comm = api.live_allocations(0, &bytes0);
	void *p = NULL, *q = &p, *reg = NULL;
	int32_t v = 7;
	float host[4];

	CHECK(n0 >= 0 && with_comm == n0 + 1);
	NCCL_OK(api.MemAlloc(&p, 1000));
	CHECK(p != NULL);
	CHECK(api.live_allocations(0, &bytes1) == with_comm + 1);
	CHECK(bytes1 - bytes0 == 2u << 20); /* one granule */
	to_dev(p, &v, sizeof(v));
	NCCL_OK(api.CommRegister(comm, p, 1000, &reg));
	NCCL_OK(api.AllReduce(p, p, 1, ncclInt32, ncclSum, comm, NULL));
	from_dev(&v, p, sizeof(v));
	CHECK(v == 7);
	CHECK(api.CommRegister(comm, host, sizeof(host), &reg) == ncclInvalidArgument);
	NCCL_OK(api.CommDeregister(comm, reg));
	NCCL_OK(api.MemFree(p));
	CHECK(api.live_allocations(0, NULL) == with_comm);
	CHECK(api.MemFree(p) == ncclInvalidArgument);
	NCCL_OK(api.MemAlloc(&q, 0));
	CHECK(q == NULL);
	NCCL_OK(api.CommDestroy(comm));
}

static void test_mem_alloc_and_register(void **state)
{
	run_single(mem_alloc_body);
}

static int group_setup(void **state)
{
	run_dir = test_mkdtemp("belayer-emu-nccl");
	if (!run_dir)
		return -1;
	/* The run's configuration: first process wins, so set before anything opens it. */
	setenv("BELAYER_EMU_DIR", run_dir, 1);
	setenv("BELAYER_EMU_DEVICES", "4", 1);
	return emu_state_open() == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
	if (run_dir)
		(void)test_rmtree(run_dir);
	free(run_dir);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_allreduce_2_processes),
		cmocka_unit_test(test_ranks_join_in_any_order),
		cmocka_unit_test(test_allreduce_4_processes_types_ops),
		cmocka_unit_test(test_broadcast_reduce_allgather_reducescatter),
		cmocka_unit_test(test_send_recv_ring),
		cmocka_unit_test(test_comm_init_all_threads),
		cmocka_unit_test(test_comm_split),
		cmocka_unit_test(test_killed_rank_hangs_peers_until_abort),
		cmocka_unit_test(test_injected_hang_until_abort),
		cmocka_unit_test(test_fault_injection),
		cmocka_unit_test(test_nonblocking_communicators),
		cmocka_unit_test(test_nonblocking_delay),
		cmocka_unit_test(test_arguments_and_errors),
		cmocka_unit_test(test_device_buffer_through_driver),
		cmocka_unit_test(test_mem_alloc_and_register),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
