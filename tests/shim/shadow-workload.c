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
 *   sleep  as vLLM's CuMemAllocator.sleep(level=1) (vllm/device_allocator/cumem.py): the
 *          program-owned weights mapping is copied to host memory, then both program-owned
 *          mappings (weights and kv) are unmapped and their handles released; the address
 *          reservations stay. Prints "slept".
 *   wake   as CuMemAllocator.wake_up(): cuMemCreate + cuMemMap + cuMemSetAccess at the same
 *          addresses, the weights copied back, the kv refilled from SEED (the engine rebuilds
 *          its KV). Prints "woke".
 * and exits 0 at EOF. Any unexpected driver result exits 1 with a message.
 *
 * With "ipc" after the sizes, first of all (before the weights, as vLLM's custom all-reduce
 * sets up its buffers before the KV probe): an 8 MiB cuMemAlloc filled with bytes 0xa5 ^ i (i
 * the offset, mod 256) and exported with cuIpcGetMemHandle, printed as "ipc HEX" before
 * "ready"; a peer opens it.
 *
 * With "symm" instead, first of all: an 8 MiB buffer as PyTorch's symmetric memory allocates
 * one (CUDASymmetricMemoryAllocator::alloc: cuMemCreate with requestedHandleTypes = POSIX_FD,
 * reserve, map, set access), its first 4 MiB filled with bytes 0x5a ^ i, exported with
 * cuMemExportToShareableHandle and printed as "symm PID FD" before "ready" (a peer takes the fd
 * with pidfd_getfd and imports it). Before that it checks what the driver documents of the
 * handle: cuMemRetainAllocationHandle at an address inside the mapping gives "the same handle
 * value used to map the memory" (cuda.h), which cuMemRelease then drops, and
 * cuMemGetAllocationPropertiesFromHandle gives back the device and handle types asked for.
 *
 * Usage: shadow-workload SEED WEIGHTS_BYTES KV_BYTES [ipc|symm]   (sizes multiples of 8 MiB)
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
	PFN_cuMemUnmap_v10020 unmap;
	PFN_cuMemRelease_v10020 release;
} d;

static struct {
	CUdeviceptr va;
	size_t size;
} regs[MAX_REGS];
static size_t n_regs;
static unsigned char buf[CHUNK];
/* The program-owned (cuMemCreate) mappings among regs: weights, then kv; what sleep frees. */
static size_t vmm_idx[2];
static CUmemGenericAllocationHandle vmm_handle[2]; /* kept, as cumem_allocator.cpp keeps them */
static unsigned char *backup;			   /* sleep: the weights mapping's bytes */

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
	d.unmap = wl_resolve("cuMemUnmap", 10020);
	d.release = wl_resolve("cuMemRelease", 10020);

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

/* As vLLM's CuMemAllocator (csrc/cumem_allocator.cpp, create_and_map): the program's own
 * handle, mapped at va and made accessible. */
static CUmemGenericAllocationHandle create_and_map(CUdeviceptr va, size_t size,
						   unsigned handle_types)
{
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				    .requestedHandleTypes = handle_types,
				    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
	CUmemAccessDesc acc = {.location = prop.location,
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemGenericAllocationHandle h;

	CHECK(d.create(&h, size, &prop, 0));
	CHECK(d.map(va, size, 0, h, 0));
	CHECK(d.set_access(va, size, &acc, 1));
	return h;
}

/* The handle and the reservation stay the program's. */
static CUdeviceptr vmm(size_t size, CUmemGenericAllocationHandle *ret)
{
	CUdeviceptr va;

	CHECK(d.reserve(&va, size, 0, 0, 0));
	*ret = create_and_map(va, size, 0);
	return va;
}

/* CuMemAllocator.sleep(level=1): weights backed up to host, every mapping unmapped and its
 * handle released (unmap_and_release); the reservations are kept for wake_up. */
static void sleep_(void)
{
	const size_t w = vmm_idx[0];

	backup = malloc(regs[w].size);
	if (!backup)
		wl_die("out of host memory");
	CHECK(d.dtoh(backup, regs[w].va, regs[w].size));
	for (size_t i = 0; i < 2; i++) {
		CHECK(d.unmap(regs[vmm_idx[i]].va, regs[vmm_idx[i]].size));
		CHECK(d.release(vmm_handle[i]));
	}
}

/* CuMemAllocator.wake_up(): the same addresses, new memory, the weights copied back. */
static void wake(void)
{
	const size_t w = vmm_idx[0];

	for (size_t i = 0; i < 2; i++)
		vmm_handle[i] = create_and_map(regs[vmm_idx[i]].va, regs[vmm_idx[i]].size, 0);
	CHECK(d.htod(regs[w].va, backup, regs[w].size));
	free(backup);
	backup = NULL;
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

/* A symmetric-memory buffer (PyTorch's CUDASymmetricMemoryAllocator::alloc), exported. */
static void symm_buffer(void)
{
	CUresult (*export_)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
			    unsigned long long) = wl_resolve("cuMemExportToShareableHandle", 10020);
	CUresult (*retain)(CUmemGenericAllocationHandle *, void *) =
		wl_resolve("cuMemRetainAllocationHandle", 11000);
	CUresult (*props)(CUmemAllocationProp *, CUmemGenericAllocationHandle) =
		wl_resolve("cuMemGetAllocationPropertiesFromHandle", 10020);
	CUmemGenericAllocationHandle h, again;
	CUmemAllocationProp prop;
	CUdeviceptr va;
	int fd;

	CHECK(d.reserve(&va, 8 * MIB, 0, 0, 0));
	h = create_and_map(va, 8 * MIB, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	for (size_t i = 0; i < CHUNK; i++)
		buf[i] = (unsigned char)(0x5a ^ i);
	CHECK(d.htod(va, buf, CHUNK));
	CHECK(retain(&again, (void *)(uintptr_t)(va + 12345)));
	if (again != h)
		wl_die("cuMemRetainAllocationHandle gave %llx, the mapping's handle is %llx",
		       (unsigned long long)again, (unsigned long long)h);
	CHECK(d.release(again));
	CHECK(props(&prop, h));
	if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != 0 ||
	    !(prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
		wl_die("cuMemGetAllocationPropertiesFromHandle: not what was asked for");
	CHECK(export_(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	printf("symm %d %d\n", (int)getpid(), fd);
}

int main(int argc, char **argv)
{
	unsigned long long w, kv;
	char line[64];
	size_t free_b, total_b;
	unsigned seed;

	if (argc != 4 &&
	    !(argc == 5 && (strcmp(argv[4], "ipc") == 0 || strcmp(argv[4], "symm") == 0)))
		wl_die("usage: shadow-workload SEED WEIGHTS_BYTES KV_BYTES [ipc|symm]");
	seed = (unsigned)strtoul(argv[1], NULL, 10);
	w = strtoull(argv[2], NULL, 10);
	kv = strtoull(argv[3], NULL, 10);
	if (w == 0 || kv == 0 || w % (8 * MIB) || kv % (8 * MIB))
		wl_die("sizes must be positive multiples of 8 MiB");

	driver_open();
	if (argc == 5 && strcmp(argv[4], "ipc") == 0)
		ipc_buffer();
	else if (argc == 5)
		symm_buffer();
	add(alloc(w / 2), w / 2);
	vmm_idx[0] = n_regs;
	add(vmm(w / 4, &vmm_handle[0]), w / 4);
	add(alloc(w / 4), w / 4);
	CHECK(d.mem_info(&free_b, &total_b)); /* the KV-sizing probe */
	add(alloc(kv / 2), kv / 2);
	vmm_idx[1] = n_regs;
	add(vmm(kv / 2, &vmm_handle[1]), kv / 2);
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
		} else if (strncmp(line, "sleep", 5) == 0) {
			sleep_();
			printf("slept\n");
		} else if (strncmp(line, "wake", 4) == 0) {
			wake();
			fill(vmm_idx[1], seed);
			printf("woke\n");
		}
		fflush(stdout);
	}
	return 0;
}
