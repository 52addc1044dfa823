/* SPDX-License-Identifier: MIT */
/*
 * What the shim tests run under LD_PRELOAD=libbelayer.so: engine-like sequences of driver
 * calls. It reaches the driver the way the CUDA runtime does (dlopen("libcuda.so.1"), dlsym of
 * cuGetProcAddress_v2, every entry point resolved by name at a CUDA version) and NCCL the way
 * vLLM does (dlopen + dlsym). Never linked against either.
 *
 * Each scenario prints "ok ..." lines, then holds: it reads stdin line by line ("free" frees
 * what it holds, where the scenario has something to free) and exits 0 at EOF, so the test
 * decides when the process may go, after the receiver has what it waits for. Exits 1 with a
 * message on any unexpected driver result.
 *
 * Usage: shim-workload runtime|engine|engine-reprobe|engine-index|nccl|storm THREADS COUNT|fork|exec|
 *                     small|procaddr|ipc-export|ipc-open HANDLE OFFSET|vmm-import PID FD|
 *                     tags TMS_LIBRARY|tags-positive tag|env|call|
 *                     nccl-second-copy LIBNCCL_COPY|memset|capture
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <nccl.h>

#include "hooks-table.h"
#include "workload-driver.h"

#define MIB ((size_t)1 << 20)

static struct {
	CUresult (*alloc)(CUdeviceptr *, size_t);
	CUresult (*free)(CUdeviceptr);
	CUresult (*range)(CUdeviceptr *, size_t *, CUdeviceptr);
	CUresult (*htod)(CUdeviceptr, const void *, size_t);
	CUresult (*dtoh)(void *, CUdeviceptr, size_t);
	CUresult (*mem_info)(size_t *, size_t *);
	CUresult (*ptr_attr)(void *, CUpointer_attribute, CUdeviceptr);
} d;

static CUcontext ctx;

/* As libcudart does it. */
static void driver_open(void)
{
	wl_driver_open();
	d.alloc = wl_resolve("cuMemAlloc", 3020);
	d.free = wl_resolve("cuMemFree", 3020);
	d.range = wl_resolve("cuMemGetAddressRange", 3020);
	d.htod = wl_resolve("cuMemcpyHtoD", 3020);
	d.dtoh = wl_resolve("cuMemcpyDtoH", 3020);
	d.mem_info = wl_resolve("cuMemGetInfo", 3020);
	d.ptr_attr = wl_resolve("cuPointerGetAttribute", 4000);

	ctx = wl_ctx_init();
}

/* Waits for the test: returns true on a "free" line, false at EOF. */
static bool hold(void)
{
	char line[64];

	fflush(stdout);
	while (fgets(line, sizeof(line), stdin))
		if (strncmp(line, "free", 4) == 0)
			return true;
	return false;
}

static CUdeviceptr alloc(size_t size)
{
	CUdeviceptr p;

	CHECK(d.alloc(&p, size));
	return p;
}

static void fill(CUdeviceptr p, unsigned char seed)
{
	unsigned char buf[16];

	for (int i = 0; i < 16; i++)
		buf[i] = (unsigned char)(seed + i);
	CHECK(d.htod(p, buf, sizeof(buf)));
}

static int run_runtime(void)
{
	CUdeviceptr a, b, c, s, base;
	unsigned char back[16];
	size_t size;

	driver_open();
	a = alloc(8 * MIB);
	b = alloc(8 * MIB);
	c = alloc(3 * MIB);
	s = alloc(64 << 10);

	/* Converted memory answers like cudaMalloc memory. */
	CHECK(d.range(&base, &size, a + 4096));
	if (base != a || size != 8 * MIB)
		wl_die("cuMemGetAddressRange: base %llx size %zu", (unsigned long long)base, size);
	if (d.free(a + 4096) != CUDA_ERROR_INVALID_VALUE)
		wl_die("cuMemFree of an interior pointer was not rejected");
	/* The 3 MiB one is mapped as 4 MiB of VMM memory, which must not show. */
	{
		unsigned long long types = 7;
		CUdeviceptr start = 0;
		int ipc = 0, rdma = -1, native_rdma = -1;

		CHECK(d.range(&base, &size, c + MIB));
		if (base != c || size != 3 * MIB)
			wl_die("cuMemGetAddressRange of 3 MiB: base %llx size %zu",
			       (unsigned long long)base, size);
		CHECK(d.ptr_attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, c + MIB));
		CHECK(d.ptr_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, c + MIB));
		CHECK(d.ptr_attr(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, c));
		CHECK(d.ptr_attr(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, c));
		if (size != 3 * MIB || start != c || ipc != 1)
			wl_die("pointer attributes of converted memory: size %zu start %llx ipc %d",
			       size, (unsigned long long)start, ipc);
		/* What NIXL/UCX and NCCL's registration look at (review finding 9): the test
		 * compares them with the driver's own cuMemAlloc memory (s, under the threshold). */
		CHECK(d.ptr_attr(&rdma, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, c));
		CHECK(d.ptr_attr(&native_rdma, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, s));
		printf("attrs types=%llu rdma=%d native_rdma=%d\n", types, rdma, native_rdma);
	}
	fill(b, 0x30);
	CHECK(d.dtoh(back, b, sizeof(back)));
	if (back[0] != 0x30 || back[15] != 0x3f)
		wl_die("copy round trip");
	CHECK(d.free(c));
	CHECK(d.free(s));
	printf("ok runtime\n");
	hold();
	return 0;
}

static int run_small(void)
{
	driver_open();
	fill(alloc(4 * MIB), 0x50);
	printf("ok small pid=%d\n", getpid());
	hold();
	return 0;
}

/* vLLM-like: memory query, weights load, KV probe, KV arena, then the rest and an RL update;
 * with reprobe, another memory query and a large allocation after the KV cache; with index,
 * an index table right after the KV tensors. */
static int run_engine(bool reprobe, bool index)
{
	CUdeviceptr w1, w2;
	size_t fr, tot;

	driver_open();
	CHECK(d.mem_info(&fr, &tot)); /* before any weights: not the probe */
	w1 = alloc(8 * MIB);
	w2 = alloc(8 * MIB);
	fill(w1, 1);
	fill(w2, 2);
	CHECK(d.mem_info(&fr, &tot)); /* the KV-sizing probe */
	alloc(16 * MIB);
	alloc(16 * MIB);
	/* index tables right after the KV tensors (vLLM's block table and slot mapping, SGLang's
	 * free-slot list): large, but of another size, so not KV */
	if (index)
		alloc(20 * MIB);
	alloc(2 * MIB); /* tracked, small: closes the KV window */
	alloc(16 * MIB);
	if (reprobe) {
		/* vLLM's capture_model: empty_cache() and mem_get_info() right before
		 * capturing, then the graph pool's first segment: activations, not KV. */
		CHECK(d.mem_info(&fr, &tot));
		alloc(16 * MIB);
	}
	fill(w2, 3); /* a weight update after load */
	printf("ok engine w1=0x%llx w2=0x%llx\n", (unsigned long long)w1, (unsigned long long)w2);
	hold();
	return 0;
}

static int run_nccl(void)
{
	ncclResult_t (*get_id)(ncclUniqueId *);
	ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
	ncclResult_t (*bcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
			      cudaStream_t);
	ncclUniqueId id;
	ncclComm_t comm;
	CUdeviceptr w;
	size_t fr, tot;
	void *lib;

	driver_open();
	lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL); /* as ctypes.CDLL does */
	if (!lib)
		wl_die("dlopen libnccl.so.2: %s", dlerror());
	get_id = (__typeof__(get_id))dlsym(lib, "ncclGetUniqueId");
	init_rank = (__typeof__(init_rank))dlsym(lib, "ncclCommInitRank");
	bcast = (__typeof__(bcast))dlsym(lib, "ncclBroadcast");
	if (!get_id || !init_rank || !bcast)
		wl_die("libnccl.so.2 lacks symbols");
	if (get_id(&id) != ncclSuccess || init_rank(&comm, 1, id, 0) != ncclSuccess)
		wl_die("ncclCommInitRank failed");
	w = alloc(8 * MIB);
	fill(w, 7);
	CHECK(d.mem_info(&fr, &tot));
	alloc(16 * MIB);
	/* The RL weight sync: a broadcast into the weights. */
	if (bcast((void *)w, (void *)w, 1024, ncclFloat32, 0, comm, NULL) != ncclSuccess)
		wl_die("ncclBroadcast failed");
	printf("ok nccl w=0x%llx\n", (unsigned long long)w);
	hold();
	return 0;
}

/* Weights written by memsets after load, as the caller resolves them through cuGetProcAddress
 * (legacy and per-thread variants, sync and async). */
static int run_memset(void)
{
	CUresult (*d8)(CUdeviceptr, unsigned char, size_t);
	CUresult (*d16a)(CUdeviceptr, unsigned short, size_t, CUstream);
	CUresult (*d32)(CUdeviceptr, unsigned int, size_t);
	CUdeviceptr w;
	size_t fr, tot;

	driver_open();
	w = alloc(8 * MIB);
	fill(w, 1);
	CHECK(d.mem_info(&fr, &tot)); /* the KV-sizing probe */
	alloc(16 * MIB);
	d8 = wl_resolve("cuMemsetD8", 3020);
	d16a = wl_resolve("cuMemsetD16Async", 7000); /* its per-thread-stream variant at 7000 */
	d32 = wl_resolve("cuMemsetD32", 3020);
	CHECK(d8(w, 0, 4096));
	CHECK(d16a(w + 4096, 7, 16, NULL));
	CHECK(d32(w + 8192, 0xffffffffu, 1));
	printf("ok memset w=0x%llx\n", (unsigned long long)w);
	hold();
	return 0;
}

/* What vLLM and SGLang do at startup: eager steps with all-reduces, then CUDA-graph capture in
 * the default GLOBAL mode (torch.cuda.graph's capture_error_mode) while the all-reduces'
 * completions may still be pending on the GPU (BELAYER_EMU_EVENT_DELAY_MS). Prints the
 * capture's cuStreamEndCapture result. */
static int run_capture(void)
{
	ncclResult_t (*get_id)(ncclUniqueId *);
	ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
	ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
				   ncclComm_t, cudaStream_t);
	PFN_cuStreamCreate_v2000 stream_create;
	PFN_cuStreamBeginCapture_v10010 begin;
	PFN_cuStreamEndCapture_v10000 end;
	PFN_cuMemsetD32Async_v3020 memset_async;
	CUstream side, cap;
	CUgraph g = NULL;
	ncclUniqueId id;
	ncclComm_t comm;
	CUdeviceptr buf;
	CUresult r;
	void *lib;

	driver_open();
	stream_create = wl_resolve("cuStreamCreate", 2000);
	begin = wl_resolve("cuStreamBeginCapture", 10010);
	end = wl_resolve("cuStreamEndCapture", 10000);
	memset_async = wl_resolve("cuMemsetD32Async", 3020);
	lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		wl_die("dlopen libnccl.so.2: %s", dlerror());
	get_id = (__typeof__(get_id))dlsym(lib, "ncclGetUniqueId");
	init_rank = (__typeof__(init_rank))dlsym(lib, "ncclCommInitRank");
	all_reduce = (__typeof__(all_reduce))dlsym(lib, "ncclAllReduce");
	if (!get_id || !init_rank || !all_reduce)
		wl_die("libnccl.so.2 lacks symbols");
	if (get_id(&id) != ncclSuccess || init_rank(&comm, 1, id, 0) != ncclSuccess)
		wl_die("ncclCommInitRank failed");
	CHECK(stream_create(&side, CU_STREAM_NON_BLOCKING));
	CHECK(stream_create(&cap, CU_STREAM_NON_BLOCKING));
	buf = alloc(8 * MIB);
	if (all_reduce((void *)buf, (void *)buf, 1024, ncclFloat32, ncclSum, comm,
		       (cudaStream_t)side) != ncclSuccess)
		wl_die("ncclAllReduce failed");
	CHECK(begin(cap, CU_STREAM_CAPTURE_MODE_GLOBAL));
	/* Capturing a model's decode step takes milliseconds (hundreds of kernels): the capture
	 * stays open that long, while the all-reduce above is still pending. */
	for (unsigned i = 0; i < 20; i++) {
		struct timespec ts = {.tv_nsec = 1000000};

		/* An invalidated capture refuses further work: cuStreamEndCapture says so. */
		if (memset_async(buf, i, 1, cap) != CUDA_SUCCESS)
			break;
		(void)nanosleep(&ts, NULL);
	}
	r = end(cap, &g);
	printf("ok capture end=%d\n", (int)r);
	hold();
	return 0;
}

/* vLLM's pynccl with VLLM_NCCL_SO_PATH: a second copy of libnccl.so.2, loaded by path beside
 * the one the process already uses (PyTorch's), and driven entirely through dlsym on its
 * handle, unhooked calls (ncclCommCount) included. */
static int run_nccl_second_copy(const char *copy)
{
	ncclResult_t (*get_id)(ncclUniqueId *), (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
	ncclResult_t (*count)(ncclComm_t, int *), (*destroy)(ncclComm_t);
	ncclResult_t (*reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
			       ncclComm_t, cudaStream_t);
	ncclUniqueId id;
	ncclComm_t comm;
	CUdeviceptr w;
	void *first, *second;
	int n = 0;

	driver_open();
	first = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
	if (!first)
		wl_die("dlopen libnccl.so.2: %s", dlerror());
	/* PyTorch's NCCL in use first: a communicator through the hooked path. */
	get_id = (__typeof__(get_id))dlsym(first, "ncclGetUniqueId");
	init_rank = (__typeof__(init_rank))dlsym(first, "ncclCommInitRank");
	if (!get_id || !init_rank || get_id(&id) != ncclSuccess ||
	    init_rank(&comm, 1, id, 0) != ncclSuccess)
		wl_die("the first libnccl.so.2 failed");
	second = dlopen(copy, RTLD_NOW | RTLD_LOCAL);
	if (!second || second == first)
		wl_die("dlopen %s: %s", copy, second ? "the same library" : dlerror());
	get_id = (__typeof__(get_id))dlsym(second, "ncclGetUniqueId");
	init_rank = (__typeof__(init_rank))dlsym(second, "ncclCommInitRank");
	count = (__typeof__(count))dlsym(second, "ncclCommCount");
	reduce = (__typeof__(reduce))dlsym(second, "ncclAllReduce");
	destroy = (__typeof__(destroy))dlsym(second, "ncclCommDestroy");
	if (!get_id || !init_rank || !count || !reduce || !destroy)
		wl_die("%s lacks symbols", copy);
	if (get_id(&id) != ncclSuccess || init_rank(&comm, 1, id, 0) != ncclSuccess)
		wl_die("ncclCommInitRank of the second copy failed");
	if (count(comm, &n) != ncclSuccess || n != 1)
		wl_die("ncclCommCount of the second copy's communicator failed (%d ranks)", n);
	w = alloc(2 * MIB);
	if (reduce((void *)w, (void *)w, 1024, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess)
		wl_die("ncclAllReduce of the second copy failed");
	if (destroy(comm) != ncclSuccess)
		wl_die("ncclCommDestroy of the second copy failed");
	printf("ok nccl-second-copy\n");
	return 0;
}

struct storm {
	int count;
	CUdeviceptr *ptrs;
};

static void *storm_thread(void *arg)
{
	struct storm *s = arg;

	CHECK(wl.ctx_set(ctx));
	for (int i = 0; i < s->count; i++)
		s->ptrs[i] = alloc(2 * MIB);
	return NULL;
}

static void *storm_free_thread(void *arg)
{
	struct storm *s = arg;

	CHECK(wl.ctx_set(ctx));
	for (int i = 0; i < s->count; i++)
		CHECK(d.free(s->ptrs[i]));
	return NULL;
}

static int run_storm(int nthreads, int count)
{
	pthread_t t[64];
	struct storm s[64];

	if (nthreads < 1 || nthreads > 64 || count < 1)
		wl_die("bad storm size");
	driver_open();
	for (int i = 0; i < nthreads; i++) {
		s[i] = (struct storm){.count = count, .ptrs = calloc(count, sizeof(CUdeviceptr))};
		pthread_create(&t[i], NULL, storm_thread, &s[i]);
	}
	for (int i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
	printf("ok allocated %d\n", nthreads * count);
	if (!hold())
		return 0;
	for (int i = 0; i < nthreads; i++)
		pthread_create(&t[i], NULL, storm_free_thread, &s[i]);
	for (int i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
	printf("ok freed %d\n", nthreads * count);
	hold();
	return 0;
}

static int run_fork(void)
{
	pid_t child;
	int status;

	driver_open();
	fill(alloc(4 * MIB), 0x10);
	fflush(stdout);
	child = fork();
	if (child < 0)
		wl_die("fork");
	if (child == 0) {
		/* CUDA does not survive fork: the child starts over, as a forked worker would. */
		driver_open();
		fill(alloc(4 * MIB), 0x20);
		printf("ok child pid=%d\n", getpid());
		hold();
		_exit(0);
	}
	printf("ok parent pid=%d child=%d\n", getpid(), child);
	hold();
	if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		wl_die("child failed");
	return 0;
}

static int run_exec(const char *self)
{
	pid_t child;
	int status;

	fflush(stdout);
	child = fork();
	if (child < 0)
		wl_die("fork");
	if (child == 0) {
		execl(self, self, "small", (char *)NULL);
		_exit(127);
	}
	if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		wl_die("exec'd child failed");
	printf("ok exec child=%d\n", child);
	return 0;
}

static void print_hex(const char *label, const void *p, size_t n)
{
	printf("%s ", label);
	for (size_t i = 0; i < n; i++)
		printf("%02x", ((const unsigned char *)p)[i]);
	printf("\n");
}

/* Exports a converted allocation (and, for contrast, a small driver one) with legacy IPC. */
static int run_ipc_export(void)
{
	CUresult (*get)(CUipcMemHandle *, CUdeviceptr);
	CUipcMemHandle h;
	CUdeviceptr a, s;

	driver_open();
	get = wl_resolve("cuIpcGetMemHandle", 4010);
	a = alloc(8 * MIB);
	s = alloc(64 << 10);
	fill(a + MIB, 0x40);
	fill(s, 0x60);
	CHECK(get(&h, a));
	print_hex("handle", &h, sizeof(h));
	CHECK(get(&h, s));
	print_hex("native", &h, sizeof(h));
	hold();
	return 0;
}

static int run_ipc_open(const char *hex, size_t offset)
{
	CUresult (*open_)(CUdeviceptr *, CUipcMemHandle, unsigned);
	CUresult (*close_)(CUdeviceptr);
	CUipcMemHandle h;
	CUdeviceptr p, q;
	unsigned char buf[16];

	driver_open();
	open_ = wl_resolve("cuIpcOpenMemHandle", 11000);
	close_ = wl_resolve("cuIpcCloseMemHandle", 4010);
	if (strlen(hex) != 2 * sizeof(h))
		wl_die("bad handle");
	for (size_t i = 0; i < sizeof(h); i++)
		sscanf(hex + 2 * i, "%2hhx", (unsigned char *)&h.reserved[i]);
	CHECK(open_(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
	CHECK(open_(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
	if (p != q)
		wl_die("opening a handle twice gave two addresses");
	CHECK(d.dtoh(buf, p + offset, sizeof(buf)));
	print_hex("bytes", buf, sizeof(buf));
	CHECK(close_(q));
	CHECK(close_(p));
	return 0;
}

/* A symmetric-memory peer (PyTorch's CUDASymmetricMemory: the exporter's POSIX fd imported
 * with cuMemImportFromShareableHandle, then mapped): takes fd FD of process PID with
 * pidfd_getfd, maps its first granule and prints its first 16 bytes as "bytes HEX". */
static int run_vmm_import(pid_t pid, int fd)
{
	PFN_cuMemImportFromShareableHandle_v10020 import_;
	PFN_cuMemGetAllocationGranularity_v10020 gran_;
	PFN_cuMemAddressReserve_v10020 reserve;
	PFN_cuMemMap_v10020 map;
	PFN_cuMemSetAccess_v10020 set_access;
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
				    .requestedHandleTypes =
					    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
				    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
	CUmemAccessDesc acc = {.location = prop.location,
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemGenericAllocationHandle h;
	unsigned char buf[16];
	CUdeviceptr va;
	size_t gran;
	int pidfd, local;

	driver_open();
	import_ = wl_resolve("cuMemImportFromShareableHandle", 10020);
	gran_ = wl_resolve("cuMemGetAllocationGranularity", 10020);
	reserve = wl_resolve("cuMemAddressReserve", 10020);
	map = wl_resolve("cuMemMap", 10020);
	set_access = wl_resolve("cuMemSetAccess", 10020);
	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0)
		wl_die("pidfd_open %d: %s", (int)pid, strerror(errno));
	local = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
	if (local < 0)
		wl_die("pidfd_getfd %d: %s", fd, strerror(errno));
	CHECK(import_(&h, (void *)(uintptr_t)local, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	CHECK(gran_(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	CHECK(reserve(&va, gran, 0, 0, 0));
	CHECK(map(va, gran, 0, h, 0));
	CHECK(set_access(va, gran, &acc, 1));
	CHECK(d.dtoh(buf, va, sizeof(buf)));
	print_hex("bytes", buf, sizeof(buf));
	close(local);
	close(pidfd);
	return 0;
}

/* Classification by explicit tag (belayer_set_tag) and by torch_memory_saver's tag. */
static int run_tags(const char *tms_path)
{
	int (*set_tag)(const char *) = (__typeof__(set_tag))dlsym(RTLD_DEFAULT, "belayer_set_tag");
	void (*clear_tag)(void) = (__typeof__(clear_tag))dlsym(RTLD_DEFAULT, "belayer_clear_tag");
	void (*tms_tag)(const char *), (*tms_region)(bool);
	const char *(*last_tag)(void);
	CUdeviceptr a, b, c, dd;
	void *tms;

	if (!set_tag || !clear_tag)
		wl_die("belayer_set_tag is not exported");
	tms = dlopen(tms_path, RTLD_NOW | RTLD_LOCAL);
	if (!tms)
		wl_die("dlopen %s: %s", tms_path, dlerror());
	tms_tag = (__typeof__(tms_tag))dlsym(tms, "tms_set_current_tag");
	tms_region = (__typeof__(tms_region))dlsym(tms, "tms_set_interesting_region");
	last_tag = (__typeof__(last_tag))dlsym(tms, "tms_standin_last_tag");
	if (!tms_tag || !tms_region || !last_tag)
		wl_die("tms stand-in lacks symbols");

	driver_open();
	b = alloc(8 * MIB); /* untagged, during load: weights */
	if (set_tag("no-such-class") != -EINVAL || set_tag("kv") != 0)
		wl_die("belayer_set_tag");
	a = alloc(8 * MIB);
	clear_tag();
	tms_region(true);
	tms_tag("kv_cache");
	c = alloc(8 * MIB);
	tms_tag("default"); /* says nothing: the next rule decides (after KV: other) */
	dd = alloc(8 * MIB);
	tms_region(false);
	printf("ok tags a=0x%llx b=0x%llx c=0x%llx d=0x%llx forwarded=%s\n", (unsigned long long)a,
	       (unsigned long long)b, (unsigned long long)c, (unsigned long long)dd, last_tag());
	hold();
	return 0;
}

/*
 * Positive classification (review finding 2): an engine whose weights and KV allocations are
 * tagged, with large untagged buffers around them where the phase heuristic misclasses them:
 * block tables before any probe (weights by phase), a buffer first after the probe and of
 * the KV tensors' size (KV by phase), an index table after the KV. MODE says how positive
 * mode starts: "tag" by the weights tag itself (block tables after it), "env" by
 * BELAYER_CLASSIFY=tags and "call" by belayer_tags_only() (block tables before any tag).
 */
static int run_tags_positive(const char *mode)
{
	int (*set_tag)(const char *) = (__typeof__(set_tag))dlsym(RTLD_DEFAULT, "belayer_set_tag");
	void (*clear_tag)(void) = (__typeof__(clear_tag))dlsym(RTLD_DEFAULT, "belayer_clear_tag");
	bool early = strcmp(mode, "tag") != 0;
	CUdeviceptr bt = 0, w, s, k1, k2, it;
	size_t fr, tot;

	if (!set_tag || !clear_tag)
		wl_die("belayer_set_tag is not exported");
	driver_open();
	if (strcmp(mode, "call") == 0) {
		void (*tags_only)(void) =
			(__typeof__(tags_only))dlsym(RTLD_DEFAULT, "belayer_tags_only");

		if (!tags_only)
			wl_die("belayer_tags_only is not exported");
		tags_only();
	}
	CHECK(d.mem_info(&fr, &tot)); /* vLLM and SGLang query memory before loading */
	if (early)
		bt = alloc(20 * MIB); /* block tables at runner init, before any tag */
	set_tag("weights");
	w = alloc(8 * MIB);
	clear_tag();
	if (!early)
		bt = alloc(20 * MIB); /* after a tag, before the probe */
	fill(w, 1);
	CHECK(d.mem_info(&fr, &tot)); /* the KV-sizing probe */
	s = alloc(16 * MIB);	      /* first after the probe, a KV tensor's size, untagged */
	set_tag("kv");
	k1 = alloc(16 * MIB);
	k2 = alloc(16 * MIB);
	clear_tag();
	it = alloc(20 * MIB); /* an index table next to the KV */
	printf("ok positive bt=0x%llx w=0x%llx s=0x%llx k1=0x%llx k2=0x%llx it=0x%llx\n",
	       (unsigned long long)bt, (unsigned long long)w, (unsigned long long)s,
	       (unsigned long long)k1, (unsigned long long)k2, (unsigned long long)it);
	hold();
	return 0;
}

static bool in_shim(const void *fn)
{
	Dl_info info;

	return fn && dladdr(fn, &info) && info.dli_fname && strstr(info.dli_fname, "libbelayer");
}

/* The exported name fn is the entry point of (the driver's, or our wrapper of the same name). */
static const char *symbol_name(const void *fn)
{
	Dl_info info;

	return fn && dladdr(fn, &info) && info.dli_sname ? info.dli_sname : "?";
}

/* Every hooked base name at the versions callers ask for: whatever variant the driver itself
 * returns, the shim must answer with its wrapper of that same variant (cuCtxCreate at 12090 is
 * cuCtxCreate_v2, not _v3 or _v4), or with the driver's pointer when it hooks no such variant.
 * The driver's own answer comes from its cuGetProcAddress_v2 found with glibc's own dlsym
 * (taken with dlvsym from libc, which the shim does not hook), not the shim's. */
static void check_variants(void)
{
	static const int versions[] = {3020,  7000,  10020, 11030, 11040,
				       12000, 12050, 12080, 12090, 13000};
	static const cuuint64_t flags[] = {CU_GET_PROC_ADDRESS_LEGACY_STREAM,
					   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};
	static const char *const procs[] = {
#define X(sym, proc, version, ptds, pfn) proc,
		BELAYER_CUDA_HOOKS(X)
#undef X
	};
	static const char *const syms[] = {
#define X(sym, proc, version, ptds, pfn) #sym,
		BELAYER_CUDA_HOOKS(X)
#undef X
	};
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
	void *(*glibc_dlsym)(void *, const char *) = NULL;
	PFN_cuGetProcAddress_v12000 raw = NULL;
	int checked = 0;

	if (libc)
		glibc_dlsym = (__typeof__(glibc_dlsym))dlvsym(libc, "dlsym", "GLIBC_2.34");
	if (libc && !glibc_dlsym)
		glibc_dlsym = (__typeof__(glibc_dlsym))dlvsym(libc, "dlsym", "GLIBC_2.2.5");
	if (lib && glibc_dlsym)
		raw = (PFN_cuGetProcAddress_v12000)glibc_dlsym(lib, "cuGetProcAddress_v2");

	if (!raw || in_shim((void *)raw)) {
		printf("cannot reach the driver's own cuGetProcAddress_v2\n");
		return;
	}
	for (size_t i = 0; i < sizeof(procs) / sizeof(procs[0]); i++)
		for (size_t v = 0; v < sizeof(versions) / sizeof(versions[0]); v++)
			for (size_t f = 0; f < sizeof(flags) / sizeof(flags[0]); f++) {
				void *want = NULL, *got = NULL;
				const char *name;
				bool hooked = false;

				if (raw(procs[i], &want, versions[v], flags[f], NULL) !=
					    CUDA_SUCCESS ||
				    wl.gpa(procs[i], &got, versions[v], flags[f], NULL) !=
					    CUDA_SUCCESS) {
					printf("%s at %d: cuGetProcAddress failed\n", procs[i],
					       versions[v]);
					continue;
				}
				if (!want) {
					if (got)
						printf("%s at %d: the shim invented %s\n", procs[i],
						       versions[v], symbol_name(got));
					continue;
				}
				name = symbol_name(want);
				for (size_t k = 0; k < sizeof(syms) / sizeof(syms[0]); k++)
					hooked |= strcmp(syms[k], name) == 0;
				if (hooked ? !in_shim(got) || strcmp(symbol_name(got), name) != 0
					   : got != want)
					printf("%s at %d flags %llu: driver %s, shim %s%s\n",
					       procs[i], versions[v], (unsigned long long)flags[f],
					       name, in_shim(got) ? "wrapper " : "",
					       symbol_name(got));
				checked++;
			}
	if (checked < 300)
		printf("only %d variants checked\n", checked);
	if (lib)
		(void)dlclose(lib);
	if (libc)
		(void)dlclose(libc);
}

/* Prints one line per mismatch, then "done". */
static int run_procaddr(void)
{
	static const struct {
		const char *proc;
		int version;
		int ptds;
	} hooks[] = {
#define X(sym, proc, version, ptds, pfn) {proc, version, ptds},
		BELAYER_CUDA_HOOKS(X)
#undef X
	};
	void *lib, *fn;
	int resolved = 0;

	driver_open();
	for (size_t i = 0; i < sizeof(hooks) / sizeof(hooks[0]); i++) {
		CUdriverProcAddressQueryResult status;

		fn = NULL;
		if (wl.gpa(hooks[i].proc, &fn, hooks[i].version,
			   hooks[i].ptds ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
					 : CU_GET_PROC_ADDRESS_LEGACY_STREAM,
			   &status) != CUDA_SUCCESS ||
		    !fn)
			continue; /* not in this driver: nothing to hook */
		resolved++;
		if (!in_shim(fn))
			printf("%s at %d (ptds %d) is not the shim's wrapper\n", hooks[i].proc,
			       hooks[i].version, hooks[i].ptds);
	}
	if (resolved < 30)
		printf("only %d hooked entry points resolved\n", resolved);
	check_variants();
	/* The old 32-bit cuMemAlloc and unhooked functions are the driver's own. */
	if (wl.gpa("cuMemAlloc", &fn, 2000, 0, NULL) == CUDA_SUCCESS && in_shim(fn))
		printf("cuMemAlloc at 2000 was wrapped\n");
	if (wl.gpa("cuCtxGetDevice", &fn, 12000, 0, NULL) != CUDA_SUCCESS || in_shim(fn))
		printf("cuCtxGetDevice was not passed through\n");
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!lib || !in_shim(dlsym(lib, "cuMemAlloc_v2")) || in_shim(dlsym(lib, "cuMemAlloc")) ||
	    in_shim(dlsym(lib, "cuCtxGetDevice")))
		printf("dlsym on the driver's handle is wrong\n");
	/* RTLD_NEXT is relative to the caller (this program), so the first dlsym after it is the
	 * preloaded shim's; relative to the shim it would be glibc's. */
	if (!in_shim(dlsym(RTLD_NEXT, "dlsym")))
		printf("dlsym(RTLD_NEXT) is not relative to its caller\n");
	/* Another interposer preloaded after the shim (when the test adds one). */
	{
		void *(*check)(void) = (__typeof__(check))dlsym(RTLD_DEFAULT, "next_probe_check");

		if (check && check() != NULL)
			printf("dlsym(RTLD_NEXT) from a later preload found the caller itself\n");
		if (check)
			printf("checked later preload\n");
	}
	printf("done\n");
	hold();
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2)
		wl_die("usage: shim-workload SCENARIO");
	if (strcmp(argv[1], "runtime") == 0)
		return run_runtime();
	if (strcmp(argv[1], "small") == 0)
		return run_small();
	if (strcmp(argv[1], "engine") == 0)
		return run_engine(false, false);
	if (strcmp(argv[1], "engine-reprobe") == 0)
		return run_engine(true, false);
	if (strcmp(argv[1], "engine-index") == 0)
		return run_engine(true, true);
	if (strcmp(argv[1], "nccl") == 0)
		return run_nccl();
	if (strcmp(argv[1], "memset") == 0)
		return run_memset();
	if (strcmp(argv[1], "nccl-second-copy") == 0 && argc == 3)
		return run_nccl_second_copy(argv[2]);
	if (strcmp(argv[1], "capture") == 0)
		return run_capture();
	if (strcmp(argv[1], "storm") == 0 && argc == 4)
		return run_storm(atoi(argv[2]), atoi(argv[3]));
	if (strcmp(argv[1], "fork") == 0)
		return run_fork();
	if (strcmp(argv[1], "exec") == 0)
		return run_exec(argv[0]);
	if (strcmp(argv[1], "procaddr") == 0)
		return run_procaddr();
	if (strcmp(argv[1], "tags") == 0 && argc == 3)
		return run_tags(argv[2]);
	if (strcmp(argv[1], "tags-positive") == 0 && argc == 3)
		return run_tags_positive(argv[2]);
	if (strcmp(argv[1], "ipc-export") == 0)
		return run_ipc_export();
	if (strcmp(argv[1], "ipc-open") == 0 && argc == 4)
		return run_ipc_open(argv[2], (size_t)strtoul(argv[3], NULL, 0));
	if (strcmp(argv[1], "vmm-import") == 0 && argc == 4)
		return run_vmm_import((pid_t)strtol(argv[2], NULL, 10),
				      (int)strtol(argv[3], NULL, 10));
	wl_die("unknown scenario %s", argv[1]);
	return 1;
}
