/* SPDX-License-Identifier: MIT */
/*
 * gpu-exp-remap (experiment E3 of the shim review, tests/gpu/README.md): the promotion
 * premise. A shadow's CUDA graphs were captured over scratch-backed addresses; promotion
 * unmaps them and maps the dead primary's memory at the same addresses. Does a replay of the
 * captured graph then read the new memory, and does a second mapping of the old memory (a
 * peer's IPC mapping, NCCL's registration) keep seeing the old bytes?
 *
 * A (VMM, pattern 1) is mapped at va and also at va2 (the second mapping). A graph captured
 * on a non-blocking stream (global capture mode, PyTorch's default) copies va -> out; replay
 * 1 must give pattern 1. Then cuCtxSynchronize, cuMemUnmap(va), cuMemMap(va, B) (pattern 2),
 * cuMemSetAccess; replay 2 must give pattern 2 (cuda.h, cuGraphLaunch: the graph's nodes use
 * the addresses captured; what is mapped there at launch is what they reach), and va2 must
 * still show pattern 1 (cuMemRelease: memory is freed only when "all outstanding mappings to
 * the memory are unmapped"). The verdict says which held.
 *
 * Usage: gpu-exp-remap [--size N[KMG]] [--device N]
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu-check.h"

#define SEED_A 0x5eed0000000000a1ull
#define SEED_B 0x5eed0000000000b2ull

static int check(CUdeviceptr va, uint64_t size, uint64_t seed, const char *what)
{
	uint64_t bad = 0, first = 0;
	CUresult r = gpu_pattern_check(va, size, seed, &bad, &first);

	if (r != CUDA_SUCCESS) {
		printf("%s: reading back failed: %s\n", what, gpu_cu_name(r));
		return -1;
	}
	printf("%s: %" PRIu64 " of %" PRIu64 " words differ from the expected pattern\n", what, bad,
	       size / 8);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE},
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemGenericAllocationHandle ha, hb, ho;
	CUdeviceptr va, va2, vb, out;
	uint64_t size = 64u << 20;
	CUgraphExec exec = NULL;
	CUgraph graph = NULL;
	CUstream s = NULL;
	int dev = 0, replay1, replay2, old;
	double t0, t_swap;
	CUresult r;

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int a = 1; a < argc; a += 2) {
		if (a + 1 >= argc)
			goto usage;
		if (strcmp(argv[a], "--size") == 0) {
			if (gpu_parse_size(argv[a + 1], &size) < 0 || !size || size % (2u << 20))
				goto usage;
		} else if (strcmp(argv[a], "--device") == 0)
			dev = atoi(argv[a + 1]);
		else
			goto usage;
	}
	if (gpu_cu_open(dev) < 0)
		return 1;
	acc.location.id = dev;

#define TRY(call, what)                                                    \
	do {                                                               \
		r = (call);                                                \
		if (r != CUDA_SUCCESS) {                                   \
			printf("summary: %s: %s\n", what, gpu_cu_name(r)); \
			return 1;                                          \
		}                                                          \
	} while (0)
	TRY(gpu_vmm_alloc(dev, size, &ha, &va), "allocating A");
	TRY(gpu_vmm_map(ha, size, dev, &va2), "a second mapping of A");
	TRY(gpu_vmm_alloc(dev, size, &hb, &vb), "allocating B");
	TRY(gpu_vmm_alloc(dev, size, &ho, &out), "allocating the output");
	TRY(gpu_pattern_fill(va, size, SEED_A), "filling A");
	TRY(gpu_pattern_fill(vb, size, SEED_B), "filling B");

	TRY(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
	TRY(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
	TRY(cu.cuMemcpyDtoDAsync(out, va, size, s), "capturing cuMemcpyDtoDAsync");
	TRY(cu.cuStreamEndCapture(s, &graph), "cuStreamEndCapture");
	TRY(cu.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiateWithFlags");
	printf("captured a graph copying %" PRIu64 " MiB from A's address 0x%llx; A also mapped "
	       "at 0x%llx\n",
	       size >> 20, (unsigned long long)va, (unsigned long long)va2);

	TRY(cu.cuGraphLaunch(exec, s), "replay 1");
	TRY(cu.cuStreamSynchronize(s), "replay 1 (synchronize)");
	replay1 = check(out, size, SEED_A, "replay 1 (A mapped): output vs A's pattern");

	/* the swap, as promotion does it: synchronize, unmap, map the other memory, access */
	t0 = gpu_now();
	TRY(cu.cuCtxSynchronize(), "cuCtxSynchronize before the swap");
	TRY(cu.cuMemUnmap(va, size), "cuMemUnmap of A at its address");
	TRY(cu.cuMemMap(va, size, 0, hb, 0), "cuMemMap of B at A's address");
	TRY(cu.cuMemSetAccess(va, size, &acc, 1), "cuMemSetAccess after the swap");
	t_swap = gpu_now() - t0;
	printf("swapped B in at A's address in %.3f ms\n", t_swap * 1e3);

	/* another pattern in the output, which replay 2 must overwrite */
	TRY(gpu_pattern_fill(out, size, 0), "clearing the output");
	TRY(cu.cuGraphLaunch(exec, s), "replay 2");
	TRY(cu.cuStreamSynchronize(s), "replay 2 (synchronize)");
	replay2 = check(out, size, SEED_B, "replay 2 (B mapped at A's address): output vs B's");
	old = check(va2, size, SEED_A, "second mapping of A after the swap: vs A's pattern");

	(void)cu.cuGraphExecDestroy(exec);
	(void)cu.cuGraphDestroy(graph);
	(void)cu.cuStreamDestroy(s);
	if (replay1 < 0 || replay2 < 0 || old < 0) {
		printf("summary: reading the results failed (above)\n");
		return 1;
	}
	printf("summary: replay %s the new mapping; the second mapping %s the old backing%s\n",
	       replay2 ? "does NOT follow" : "follows",
	       old ? "does NOT keep" : "keeps (a peer or NCCL would keep using it)",
	       replay1 ? "; but replay 1 was already wrong" : "");
	return replay1 || replay2 || old ? 1 : 0;
usage:
	fprintf(stderr, "usage: gpu-exp-remap [--size N[KMG]] [--device N]\n");
	return 2;
}
