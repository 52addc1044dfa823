/* SPDX-License-Identifier: MIT */
/*
 * One rank of the NCCL tests, run under LD_PRELOAD=libbelayer.so on the emulated GPU. It
 * reaches CUDA and NCCL the way ctypes users (vLLM's pynccl) do: dlopen + dlsym only, never
 * linked, so the shim sees it through its dlsym hook alone.
 *
 *   nccl-rank RANK NRANKS ID_HEX ITERS MODE ARG [split]
 * MODE: none; die (exit before collective ARG); stop (SIGSTOP itself before collective ARG);
 *       slow (sleep ARG ms before every collective).
 * split: the loop runs on ncclCommSplit(color = rank % 2, key = rank) instead of the world.
 * Prints "ok" once its communicators exist, then waits for a line on stdin; prints "done"
 * after ITERS all-reduces, destroys its communicators at the next line (or end of stdin).
 */
#include <cuda.h>
#include <dlfcn.h>
#include <nccl.h>
#include <poll.h>
#include <signal.h>
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
	const char *mode;
	char line[64];

	if (argc < 7) {
		fprintf(stderr, "usage: nccl-rank RANK NRANKS ID ITERS MODE ARG [split]\n");
		return 2;
	}
	rank = atoi(argv[1]);
	nranks = atoi(argv[2]);
	iters = atoi(argv[4]);
	mode = argv[5];
	arg = atoi(argv[6]);
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
	SYM(nc, ncclCommInitRank);
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
	if (p_ncclCommInitRank(&world, nranks, id, rank) != ncclSuccess) {
		fprintf(stderr, "ncclCommInitRank failed\n");
		return 2;
	}
	comm = world;
	if (argc > 7 && strcmp(argv[7], "split") == 0) {
		if (p_ncclCommSplit(world, rank % 2, rank, &child, NULL) != ncclSuccess || !child) {
			fprintf(stderr, "ncclCommSplit failed\n");
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
		if (p_ncclAllReduce((void *)buf, (void *)buf, 256, ncclFloat, ncclSum, comm,
				    NULL) != ncclSuccess ||
		    p_cuStreamSynchronize(NULL) != CUDA_SUCCESS) {
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
