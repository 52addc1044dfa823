/* SPDX-License-Identifier: MIT */
/*
 * An engine-like process for the shadow tests, run under LD_PRELOAD=libbelayer.so as a
 * primary or a shadow. It reaches the driver as the CUDA runtime does (dlopen + 
 * cuGetProcAddress_v2) and allocates what an engine does, in the engine's order:
 *   weights: cuMemAlloc of WEIGHTS/2, a program-owned cuMemCreate + reserve + map + set
 *            access of WEIGHTS/4 (vLLM's CuMemAllocator path), cuMemAlloc of the rest;
 *   the KV-sizing probe (cuMemGetInfo);
 *   kv:      cuMemAlloc of KV/2 and a cuMemCreate mapping of KV/2;
 *   other:   one 2 MiB cuMemAlloc after the KV cache.
 * Weights and kv are filled with bytes derived from SEED. Then it prints "ready" and serves
 * commands on stdin, one per line:
 *   sum    prints "sum I HEX" per weights/kv region (FNV-1a 64 of its bytes, read back with
 *          cuMemcpyDtoH at the address it always had), then "sum-end"
 *   info   prints "info FREE TOTAL" (cuMemGetInfo)
 * and exits 0 at EOF. Any unexpected driver result exits 1 with a message.
 *
 * With "ipc" after the sizes, first of all (before the weights, as vLLM's custom all-reduce
 * sets up its buffers before the KV probe): an 8 MiB cuMemAlloc filled with bytes 0xa5 ^ i (i
 * the offset, mod 256) and exported with cuIpcGetMemHandle, printed as "ipc HEX" before
 * "ready"; a peer opens it.
 *
 * Usage: shadow-workload SEED WEIGHTS_BYTES KV_BYTES [ipc]   (sizes multiples of 8 MiB)
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "workload-driver.h"

#define MIB	 ((size_t)1 << 20)
#define CHUNK	 (4 * MIB)
#define MAX_REGS 8

static struct {
	CUresult (*alloc)(CUdeviceptr *, size_t);
	CUresult (*htod)(CUdeviceptr, const void *, size_t);
	CUresult (*dtoh)(void *, CUdeviceptr, size_t);
	CUresult (*mem_info)(size_t *, size_t *);
	PFN_cuMemCreate_v10020 create;
	PFN_cuMemAddressReserve_v10020 reserve;
	PFN_cuMemMap_v10020 map;
	PFN_cuMemSetAccess_v10020 set_access;
} d;

static struct {
	CUdeviceptr va;
	size_t size;
} regs[MAX_REGS];
static size_t n_regs;
static unsigned char buf[CHUNK];

static void driver_open(void)
{
	wl_driver_open();
	d.alloc = wl_resolve("cuMemAlloc", 3020);
	d.htod = wl_resolve("cuMemcpyHtoD", 3020);
	d.dtoh = wl_resolve("cuMemcpyDtoH", 3020);
	d.mem_info = wl_resolve("cuMemGetInfo", 3020);
	d.create = wl_resolve("cuMemCreate", 10020);
	d.reserve = wl_resolve("cuMemAddressReserve", 10020);
	d.map = wl_resolve("cuMemMap", 10020);
	d.set_access = wl_resolve("cuMemSetAccess", 10020);

	(void)wl_ctx_init();
}

static void add(CUdeviceptr va, size_t size)
{
	if (n_regs == MAX_REGS)
		wl_die("too many regions");
	regs[n_regs].va = va;
	regs[n_regs].size = size;
	n_regs++;
}

static CUdeviceptr alloc(size_t size)
{
	CUdeviceptr p;

	CHECK(d.alloc(&p, size));
	return p;
}

/* As vLLM's CuMemAllocator: the program's own handle, reservation and mapping. */
static CUdeviceptr vmm(size_t size)
{
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
	CUmemAccessDesc acc = {.location = prop.location,
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;

	CHECK(d.create(&h, size, &prop, 0));
	CHECK(d.reserve(&va, size, 0, 0, 0));
	CHECK(d.map(va, size, 0, h, 0));
	CHECK(d.set_access(va, size, &acc, 1));
	return va;
}

static void fill(size_t idx, unsigned seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + idx + 1;

	for (size_t off = 0; off < regs[idx].size; off += CHUNK) {
		size_t n = regs[idx].size - off < CHUNK ? regs[idx].size - off : CHUNK;

		for (size_t i = 0; i < n; i += 8) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			memcpy(&buf[i], &x, 8);
		}
		CHECK(d.htod(regs[idx].va + off, buf, n));
	}
}

static uint64_t sum(size_t idx)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t off = 0; off < regs[idx].size; off += CHUNK) {
		size_t n = regs[idx].size - off < CHUNK ? regs[idx].size - off : CHUNK;

		CHECK(d.dtoh(buf, regs[idx].va + off, n));
		for (size_t i = 0; i < n; i++)
			h = (h ^ buf[i]) * 0x100000001b3ull;
	}
	return h;
}

/* A custom-all-reduce-style buffer shared with peers through legacy IPC. */
static void ipc_buffer(void)
{
	CUresult (*get)(CUipcMemHandle *, CUdeviceptr) = wl_resolve("cuIpcGetMemHandle", 4010);
	CUipcMemHandle h;
	CUdeviceptr p = alloc(8 * MIB);

	for (size_t i = 0; i < CHUNK; i++)
		buf[i] = (unsigned char)(0xa5 ^ i);
	CHECK(d.htod(p, buf, CHUNK));
	CHECK(get(&h, p));
	printf("ipc ");
	for (size_t i = 0; i < sizeof(h.reserved); i++)
		printf("%02x", (unsigned char)h.reserved[i]);
	printf("\n");
}

int main(int argc, char **argv)
{
	unsigned long long w, kv;
	char line[64];
	size_t free_b, total_b;
	unsigned seed;

	if (argc != 4 && !(argc == 5 && strcmp(argv[4], "ipc") == 0))
		wl_die("usage: shadow-workload SEED WEIGHTS_BYTES KV_BYTES [ipc]");
	seed = (unsigned)strtoul(argv[1], NULL, 10);
	w = strtoull(argv[2], NULL, 10);
	kv = strtoull(argv[3], NULL, 10);
	if (w == 0 || kv == 0 || w % (8 * MIB) || kv % (8 * MIB))
		wl_die("sizes must be positive multiples of 8 MiB");

	driver_open();
	if (argc == 5)
		ipc_buffer();
	add(alloc(w / 2), w / 2);
	add(vmm(w / 4), w / 4);
	add(alloc(w / 4), w / 4);
	CHECK(d.mem_info(&free_b, &total_b)); /* the KV-sizing probe */
	add(alloc(kv / 2), kv / 2);
	add(vmm(kv / 2), kv / 2);
	(void)alloc(2 * MIB); /* other */
	for (size_t i = 0; i < n_regs; i++)
		fill(i, seed);
	printf("ready\n");
	fflush(stdout);

	while (fgets(line, sizeof(line), stdin)) {
		if (strncmp(line, "sum", 3) == 0) {
			for (size_t i = 0; i < n_regs; i++)
				printf("sum %zu %016" PRIx64 "\n", i, sum(i));
			printf("sum-end\n");
		} else if (strncmp(line, "info", 4) == 0) {
			CHECK(d.mem_info(&free_b, &total_b));
			printf("info %zu %zu\n", free_b, total_b);
		}
		fflush(stdout);
	}
	return 0;
}
