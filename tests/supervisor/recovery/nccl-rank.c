/* SPDX-License-Identifier: MIT */
/*
 * One rank of the NCCL tests, run under LD_PRELOAD=libbelayer.so on the emulated GPU. It
 * reaches CUDA and NCCL the way ctypes users (vLLM's pynccl) do: dlopen + dlsym only, never
 * linked, so the shim sees it through its dlsym hook alone.
 *
 *   nccl-rank RANK NRANKS ID_HEX ITERS MODE ARG [FLAGS]
 * MODE: none; die (exit before collective ARG); stop (SIGSTOP itself before collective ARG);
 *       slow (sleep ARG ms before every collective); pause (after collective ARG returned,
 *       print "issued" and wait for a line on stdin before waiting for it).
 * FLAGS, comma-separated: split: the loop runs on ncclCommSplit(color = rank % 2, key = rank)
 * instead of the world; nonblock: the communicators are nonblocking (config.blocking = 0),
 * and after every call that returns ncclInProgress the rank polls ncclCommGetAsyncError until
 * it leaves ncclInProgress, as NCCL requires (and as PyTorch does with
 * TORCH_NCCL_USE_COMM_NONBLOCKING=1): a collective a peer never joins keeps it polling.
 * Prints "ok" once its communicators exist, then waits for a line on stdin; prints "done"
 * after ITERS all-reduces, destroys its communicators at the next line (or end of stdin).
 */
#include <cuda.h>
#include <dlfcn.h>
#include <nccl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SYM(h, name)                                                     \
	__typeof__(&name) p_##name = (__typeof__(&name))dlsym(h, #name); \
	if (!p_##name) {                                                 \
		fprintf(stderr, "no %s\n", #name);                       \
		return 2;                                                \
	}

/* The state of comm once it leaves ncclInProgress (polled every millisecond, unbounded: a
 * collective whose peer is gone never leaves it, as a real rank would wait). */
static ncclResult_t settle(ncclResult_t (*get)(ncclComm_t, ncclResult_t *), ncclComm_t comm)
{
	ncclResult_t st = ncclInProgress;

	for (;;) {
		if (get(comm, &st) != ncclSuccess)
			return ncclInternalError;
		if (st != ncclInProgress)
			return st;
		(void)poll(NULL, 0, 1);
	}
}

static int unhex(const char *s, uint8_t *out, size_t n)
{
	if (strlen(s) != 2 * n)
		return -1;
	for (size_t i = 0; i < n; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = (uint8_t)v;
	}
	return 0;
}

int main(int argc, char **argv)
{
	void *cu, *nc;
	ncclUniqueId id;
	ncclComm_t world, comm, child = NULL;
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr buf;
	int rank, nranks, iters, arg, ndev = 0;
	const char *mode, *flags;
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
	bool nonblock;
	ncclResult_t res;
	char line[64];

	if (argc < 7) {
		fprintf(stderr, "usage: nccl-rank RANK NRANKS ID ITERS MODE ARG [FLAGS]\n");
		return 2;
	}
	rank = atoi(argv[1]);
	nranks = atoi(argv[2]);
	iters = atoi(argv[4]);
	mode = argv[5];
	arg = atoi(argv[6]);
	flags = argc > 7 ? argv[7] : "";
	nonblock = strstr(flags, "nonblock") != NULL;
	config.blocking = nonblock ? 0 : 1;
	if (unhex(argv[3], (uint8_t *)id.internal, sizeof(id.internal)) < 0)
		return 2;
	cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	nc = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
	if (!cu || !nc) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 2;
	}
	SYM(cu, cuInit);
	SYM(cu, cuDeviceGetCount);
	SYM(cu, cuDeviceGet);
	SYM(cu, cuDevicePrimaryCtxRetain);
	SYM(cu, cuCtxSetCurrent);
	SYM(cu, cuMemAlloc_v2);
	SYM(cu, cuStreamSynchronize);
	SYM(nc, ncclCommInitRankConfig);
	SYM(nc, ncclCommGetAsyncError);
	SYM(nc, ncclCommSplit);
	SYM(nc, ncclAllReduce);
	SYM(nc, ncclCommDestroy);
	if (p_cuInit(0) != CUDA_SUCCESS || p_cuDeviceGetCount(&ndev) != CUDA_SUCCESS || ndev < 1 ||
	    p_cuDeviceGet(&dev, rank % ndev) != CUDA_SUCCESS ||
	    p_cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
	    p_cuCtxSetCurrent(ctx) != CUDA_SUCCESS || p_cuMemAlloc_v2(&buf, 4096) != CUDA_SUCCESS) {
		fprintf(stderr, "CUDA setup failed\n");
		return 2;
	}
	res = p_ncclCommInitRankConfig(&world, nranks, id, rank, &config);
	if (res == ncclInProgress)
		res = settle(p_ncclCommGetAsyncError, world);
	if (res != ncclSuccess) {
		fprintf(stderr, "ncclCommInitRankConfig failed: %d\n", (int)res);
		return 2;
	}
	comm = world;
	if (strstr(flags, "split")) {
		/* Nonblocking: the child is stored when the parent leaves ncclInProgress. */
		res = p_ncclCommSplit(world, rank % 2, rank, &child, NULL);
		if (res == ncclInProgress)
			res = settle(p_ncclCommGetAsyncError, world);
		if (res == ncclSuccess && child && nonblock)
			res = settle(p_ncclCommGetAsyncError, child);
		if (res != ncclSuccess || !child) {
			fprintf(stderr, "ncclCommSplit failed: %d\n", (int)res);
			return 2;
		}
		comm = child;
	}
	printf("ok\n");
	fflush(stdout);
	/* The test starts every rank's loop once the supervisor knows all communicators. */
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	for (int i = 1; i <= iters; i++) {
		if (strcmp(mode, "die") == 0 && i == arg)
			_exit(3);
		if (strcmp(mode, "stop") == 0 && i == arg)
			(void)raise(SIGSTOP);
		if (strcmp(mode, "slow") == 0)
			(void)poll(NULL, 0, arg);
		res = p_ncclAllReduce((void *)buf, (void *)buf, 256, ncclFloat, ncclSum, comm,
				      NULL);
		if (res == ncclInProgress && strcmp(mode, "pause") == 0 && i == arg) {
			printf("issued\n");
			fflush(stdout);
			if (!fgets(line, sizeof(line), stdin))
				return 1;
		}
		/* "Before the state becomes ncclSuccess, do not issue CUDA kernels on streams
		 * used by NCCL" (NCCL's nonblocking contract). */
		if (res == ncclInProgress)
			res = settle(p_ncclCommGetAsyncError, comm);
		if (res != ncclSuccess || p_cuStreamSynchronize(NULL) != CUDA_SUCCESS) {
			fprintf(stderr, "all-reduce %d failed\n", i);
			return 1;
		}
		/* Pace the healthy loop a little, so a fault lands mid-run. */
		(void)poll(NULL, 0, 5);
	}
	printf("done\n");
	fflush(stdout);
	/* Communicators are destroyed when the test says so (or closes our stdin). */
	(void)fgets(line, sizeof(line), stdin);
	if (child)
		(void)p_ncclCommDestroy(child);
	(void)p_ncclCommDestroy(world);
	return 0;
}
