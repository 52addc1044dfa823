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
 *
 * --nccl adds the review's NCCL variant: the graph also holds an ncclAllReduce (world size 1,
 * libnccl.so.2 loaded as vLLM's pynccl does: dlopen + dlsym) from buffer C into A's address.
 * Before the swap A's memory is refilled through the second mapping; after replay 2 the
 * address must hold C's bytes (NCCL wrote where the address now maps) and the second mapping
 * must still hold A's (nothing, e.g. a registration NCCL made of the old memory during
 * capture, wrote the old backing). The technique of torch_memory_saver's
 * test/repro_nccl_graph_remap.py --observe-old-backing, at one rank.
 *
 * Usage: gpu-exp-remap [--size N[KMG]] [--device N] [--nccl]
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu-check.h"

#define SEED_A 0x5eed0000000000a1ull
#define SEED_B 0x5eed0000000000b2ull
#define SEED_C 0x5eed0000000000c3ull

/* nccl.h (NCCL 2.28): ncclResult_t, ncclDataType_t and ncclRedOp_t are int-sized enums,
 * ncclComm_t a pointer; ncclUint8 = 1, ncclSum = 0, ncclSuccess = 0. Declared here: GPU
 * machines have libnccl.so.2 (PyTorch's wheel) but not necessarily nccl.h. */
#define NCCL_UINT8 1
#define NCCL_SUM   0
typedef int (*nccl_init_all_fn)(void **comm, int ndev, const int *devlist);
typedef int (*nccl_all_reduce_fn)(const void *sendbuff, void *recvbuff, size_t count, int datatype,
				  int op, void *comm, CUstream stream);
typedef int (*nccl_destroy_fn)(void *comm);
typedef const char *(*nccl_error_fn)(int r);

struct nccl {
	nccl_init_all_fn init_all;
	nccl_all_reduce_fn all_reduce;
	nccl_destroy_fn destroy;
	nccl_error_fn error;
	void *comm;
};

/* A world-size-1 communicator on dev; 0, or -1 after printing why. */
static int nccl_open(struct nccl *n, int dev)
{
	void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
	int r;

	if (!lib) {
		printf("summary: --nccl: dlopen libnccl.so.2: %s\n", dlerror());
		return -1;
	}
	n->init_all = (nccl_init_all_fn)dlsym(lib, "ncclCommInitAll");
	n->all_reduce = (nccl_all_reduce_fn)dlsym(lib, "ncclAllReduce");
	n->destroy = (nccl_destroy_fn)dlsym(lib, "ncclCommDestroy");
	n->error = (nccl_error_fn)dlsym(lib, "ncclGetErrorString");
	if (!n->init_all || !n->all_reduce || !n->destroy || !n->error) {
		printf("summary: --nccl: libnccl.so.2 lacks ncclCommInitAll/AllReduce/"
		       "CommDestroy/GetErrorString\n");
		return -1;
	}
	r = n->init_all(&n->comm, 1, &dev);
	if (r != 0) {
		printf("summary: --nccl: ncclCommInitAll: %s\n", n->error(r));
		return -1;
	}
	return 0;
}

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
	CUmemGenericAllocationHandle ha, hb, ho, hc;
	CUdeviceptr va, va2, vb, out, vc = 0;
	struct nccl nccl = {0};
	bool with_nccl = false;
	int nccl_new = 0, nccl_old = 0;
	uint64_t size = 64u << 20;
	CUgraphExec exec = NULL;
	CUgraph graph = NULL;
	CUstream s = NULL;
	int dev = 0, replay1, replay2, old;
	double t0, t_swap;
	CUresult r;

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int a = 1; a < argc; a += 2) {
		if (strcmp(argv[a], "--nccl") == 0) {
			with_nccl = true;
			a--;
			continue;
		}
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
	if (with_nccl) {
		if (nccl_open(&nccl, dev) < 0)
			return 1;
		TRY(gpu_vmm_alloc(dev, size, &hc, &vc), "allocating C");
		TRY(gpu_pattern_fill(vc, size, SEED_C), "filling C");
	}

	TRY(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
	TRY(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
	TRY(cu.cuMemcpyDtoDAsync(out, va, size, s), "capturing cuMemcpyDtoDAsync");
	if (with_nccl) {
		int nr = nccl.all_reduce((void *)(uintptr_t)vc, (void *)(uintptr_t)va, size,
					 NCCL_UINT8, NCCL_SUM, nccl.comm, s);

		if (nr != 0) {
			printf("summary: capturing ncclAllReduce C -> A's address: %s\n",
			       nccl.error(nr));
			return 1;
		}
	}
	TRY(cu.cuStreamEndCapture(s, &graph), "cuStreamEndCapture");
	TRY(cu.cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiateWithFlags");
	printf("captured a graph copying %" PRIu64 " MiB from A's address 0x%llx%s; A also "
	       "mapped at 0x%llx\n",
	       size >> 20, (unsigned long long)va,
	       with_nccl ? ", then ncclAllReduce (1 rank) from C into that address" : "",
	       (unsigned long long)va2);

	TRY(cu.cuGraphLaunch(exec, s), "replay 1");
	TRY(cu.cuStreamSynchronize(s), "replay 1 (synchronize)");
	replay1 = check(out, size, SEED_A, "replay 1 (A mapped): output vs A's pattern");
	if (with_nccl) {
		if (!replay1)
			replay1 =
				check(va, size, SEED_C, "replay 1: A after the all_reduce vs C's");
		/* A's memory holds C now: A's pattern again, through the second mapping */
		TRY(gpu_pattern_fill(va2, size, SEED_A), "refilling A through its second mapping");
	}

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
	if (with_nccl) {
		nccl_new = check(va, size, SEED_C,
				 "replay 2: A's address (B mapped) after the all_reduce vs C's");
		nccl_old = old;
		(void)nccl.destroy(nccl.comm);
	}

	(void)cu.cuGraphExecDestroy(exec);
	(void)cu.cuGraphDestroy(graph);
	(void)cu.cuStreamDestroy(s);
	if (replay1 < 0 || replay2 < 0 || old < 0 || nccl_new < 0) {
		printf("summary: reading the results failed (above)\n");
		return 1;
	}
	printf("summary: replay %s the new mapping; %sthe second mapping %s the old backing%s\n",
	       replay2 ? "does NOT follow" : "follows",
	       !with_nccl ? ""
	       : nccl_new ? "the captured ncclAllReduce did NOT write the new mapping; "
			  : "the captured ncclAllReduce writes the new mapping; ",
	       old ? (nccl_old ? "does NOT keep (written after the swap)" : "does NOT keep")
		   : "keeps (a peer or NCCL would keep using it)",
	       replay1 ? "; but replay 1 was already wrong" : "");
	return replay1 || replay2 || old || nccl_new ? 1 : 0;
usage:
	fprintf(stderr, "usage: gpu-exp-remap [--size N[KMG]] [--device N]\n");
	return 2;
}
