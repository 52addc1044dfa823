/* SPDX-License-Identifier: MIT */
/*
 * cuMemAlloc memory: copies, memsets, queries, streams and events, legacy IPC between
 * processes, and device pointers that host code cannot dereference.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test-emu-cuda-util.h"
#include "test-util.h"

#define CU_OK(call) assert_int_equal((call), CUDA_SUCCESS)

static int group_setup(void **state)
{
	return cu_setup(NULL);
}

static int group_teardown(void **state)
{
	return cu_teardown();
}

static int setup(void **state)
{
	return cu_use_device(0) == CUDA_SUCCESS ? 0 : -1;
}

static void test_alloc_copy_memset(void **state)
{
	CUdeviceptr a, b, base;
	char in[1000], out[1000];
	uint32_t words[4];
	size_t size;
	int64_t live0 = cu.live_allocations(0, NULL);

	for (size_t i = 0; i < sizeof(in); i++)
		in[i] = (char)(i * 7);
	assert_int_equal(cu.cuMemAlloc(&a, 0), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.cuMemAlloc(&a, sizeof(in)));
	CU_OK(cu.cuMemAlloc(&b, sizeof(in)));
	assert_int_equal(a % 256, 0);
	assert_int_equal(cu.live_allocations(0, NULL), live0 + 2);

	CU_OK(cu.cuMemcpyHtoD(a, in, sizeof(in)));
	CU_OK(cu.cuMemcpyDtoD(b, a, sizeof(in)));
	CU_OK(cu.cuMemcpyDtoH(out, b, sizeof(out)));
	assert_memory_equal(in, out, sizeof(in));
	/* unified addressing: cuMemcpy tells host from device pointers */
	memset(out, 0, sizeof(out));
	CU_OK(cu.cuMemcpy((CUdeviceptr)(uintptr_t)out, a, sizeof(out)));
	assert_memory_equal(in, out, sizeof(in));

	CU_OK(cu.cuMemsetD8(a + 1, 0xab, 3));
	CU_OK(cu.cuMemsetD32(a + 4, 0xdeadbeef, 3));
	CU_OK(cu.cuMemcpyDtoH(words, a, sizeof(words)));
	assert_int_equal(words[0] & 0xffffff00u, 0xababab00u);
	assert_int_equal(words[1], 0xdeadbeef);
	assert_int_equal(words[3], 0xdeadbeef);
	assert_int_equal(cu.cuMemsetD32(a + 2, 0, 1), CUDA_ERROR_INVALID_VALUE);
	/* past the end of the memory behind a */
	assert_int_not_equal(cu.cuMemcpyHtoD(a, in, 1 << 20), CUDA_SUCCESS);

	CU_OK(cu.cuMemGetAddressRange(&base, &size, a + 10));
	assert_true(base == a);
	assert_int_equal(size, sizeof(in));
	unsigned int type = 0;
	int ordinal = -1;
	CU_OK(cu.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a));
	assert_int_equal(type, CU_MEMORYTYPE_DEVICE);
	CU_OK(cu.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a));
	assert_int_equal(ordinal, 0);
	assert_int_equal(cu.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
						  (CUdeviceptr)(uintptr_t)in),
			 CUDA_ERROR_INVALID_VALUE);

	CU_OK(cu.cuMemFree(a));
	assert_int_equal(cu.cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
	assert_int_equal(cu.cuMemFree(b + 8), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.cuMemFree(b));
	assert_int_equal(cu.live_allocations(0, NULL), live0);
}

static void test_mem_get_info(void **state)
{
	size_t free0, free1, total;
	CUdeviceptr p;

	CU_OK(cu.cuMemGetInfo(&free0, &total));
	assert_int_equal(total, 8ull << 30);
	CU_OK(cu.cuMemAlloc(&p, 3u << 20));
	CU_OK(cu.cuMemGetInfo(&free1, &total));
	assert_int_equal(free0 - free1, 3u << 20);
	CU_OK(cu.cuMemFree(p));
	CU_OK(cu.cuMemGetInfo(&free1, &total));
	assert_int_equal(free1, free0);
}

static void test_streams_events(void **state)
{
	CUstream s;
	CUevent e0, e1;
	CUdeviceptr p;
	uint32_t v[64];
	float ms = -1;

	CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU_OK(cu.cuEventCreate(&e0, 0));
	CU_OK(cu.cuEventCreate(&e1, 0));
	/* never recorded: complete, but no elapsed time */
	CU_OK(cu.cuEventQuery(e0));
	assert_int_equal(cu.cuEventElapsedTime(&ms, e0, e1), CUDA_ERROR_INVALID_HANDLE);
	CU_OK(cu.cuEventRecord(e0, s));
	CU_OK(cu.cuMemAllocAsync(&p, sizeof(v), s));
	CU_OK(cu.cuMemsetD32Async(p, 7, 64, s));
	CU_OK(cu.cuMemcpyDtoHAsync(v, p, sizeof(v), s));
	CU_OK(cu.cuMemFreeAsync(p, s));
	CU_OK(cu.cuEventRecord(e1, s));
	CU_OK(cu.cuStreamSynchronize(s));
	CU_OK(cu.cuEventSynchronize(e1));
	assert_int_equal(v[0], 7);
	assert_int_equal(v[63], 7);
	CU_OK(cu.cuEventElapsedTime(&ms, e0, e1));
	assert_true(ms >= 0);
	CU_OK(cu.cuEventDestroy(e0));
	CU_OK(cu.cuEventDestroy(e1));
	CU_OK(cu.cuStreamDestroy(s));
	assert_int_equal(cu.cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
	/* the legacy and per-thread default streams always exist */
	CU_OK(cu.cuStreamSynchronize(CU_STREAM_LEGACY));
	CU_OK(cu.cuStreamSynchronize(CU_STREAM_PER_THREAD));
}

/* Reads a device pointer the way a bug in host code would. */
static int deref_child(void *arg)
{
	CUdeviceptr p;
	volatile const char *host;

	CHILD_CU(cu.cuMemAlloc(&p, 4096));
	CHILD_CU(cu.cuMemsetD8(p, 42, 4096));
	/* the emulator's own view holds the bytes ... */
	CHILD_CHECK(*(const char *)cu.translate(p, 1) == 42);
	/* ... the device address does not; cmocka's SIGSEGV handler must not catch it */
	signal(SIGSEGV, SIG_DFL);
	host = (volatile const char *)(uintptr_t)p;
	return *host == 42 ? 10 : 11;
}

static void test_device_memory_not_host_dereferenceable(void **state)
{
	pid_t pid = test_fork(deref_child, NULL);

	assert_true(pid > 0);
	assert_int_equal(test_wait_exit(pid, 10000), 1000 + SIGSEGV);
}

static void test_host_access_mode(void **state)
{
	/* A second copy of the driver, initialized with BELAYER_EMU_HOST_ACCESS=1. */
	void *lib;
	PFN_cuGetProcAddress_v12000 gpa;
	PFN_cuInit_v2000 init;
	PFN_cuDevicePrimaryCtxRetain_v7000 retain;
	PFN_cuCtxSetCurrent_v4000 set_current;
	PFN_cuMemAlloc_v3020 alloc;
	PFN_cuMemsetD8_v3020 memset8;
	PFN_cuMemFree_v3020 mem_free;
	CUcontext ctx;
	CUdeviceptr p;

	setenv("BELAYER_EMU_HOST_ACCESS", "1", 1);
	lib = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	TEST_REQUIRE(lib, "dlmopen(LM_ID_NEWLM) failed: %s", dlerror());
	gpa = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
	assert_non_null(gpa);
	CU_OK(gpa("cuInit", (void **)&init, 13000, 0, NULL));
	CU_OK(gpa("cuDevicePrimaryCtxRetain", (void **)&retain, 13000, 0, NULL));
	CU_OK(gpa("cuCtxSetCurrent", (void **)&set_current, 13000, 0, NULL));
	CU_OK(gpa("cuMemAlloc", (void **)&alloc, 13000, 0, NULL));
	CU_OK(gpa("cuMemsetD8", (void **)&memset8, 13000, 0, NULL));
	CU_OK(gpa("cuMemFree", (void **)&mem_free, 13000, 0, NULL));
	CU_OK(init(0));
	unsetenv("BELAYER_EMU_HOST_ACCESS");
	CU_OK(retain(&ctx, 0));
	CU_OK(set_current(ctx));
	CU_OK(alloc(&p, 4096));
	CU_OK(memset8(p, 42, 4096));
	/* device memory is host memory in this mode */
	assert_int_equal(*(volatile char *)(uintptr_t)(p + 100), 42);
	CU_OK(mem_free(p));
	dlclose(lib);
}

/* ---- legacy IPC ---- */

struct ipc_peer {
	int sock;
};

static int send_handle(int sock, const CUipcMemHandle *h)
{
	return send(sock, h, sizeof(*h), MSG_NOSIGNAL) == (ssize_t)sizeof(*h) ? 0 : -1;
}

static int recv_handle(int sock, CUipcMemHandle *h)
{
	return recv(sock, h, sizeof(*h), 0) == (ssize_t)sizeof(*h) ? 0 : -1;
}

static int ipc_importer(void *arg)
{
	struct ipc_peer *p = arg;
	CUipcMemHandle h;
	CUdeviceptr d, d2;
	char buf[32] = "";
	uint64_t word;

	CHILD_CHECK(recv_handle(p->sock, &h) == 0);
	CHILD_CHECK(cu.cuIpcOpenMemHandle(&d, h, 0) == CUDA_ERROR_INVALID_VALUE); /* flags */
	CHILD_CU(cu.cuIpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
	CHILD_CU(cu.cuMemcpyDtoH(buf, d, sizeof(buf)));
	CHILD_CHECK(strcmp(buf, "exported") == 0);
	CHILD_CU(cu.cuMemcpyHtoD(d + 64, "imported", 9));
	/* opened again by the same context: the same pointer, one more reference */
	CHILD_CU(cu.cuIpcOpenMemHandle(&d2, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
	CHILD_CHECK(d2 == d);
	CHILD_CU(cu.cuIpcCloseMemHandle(d));
	CHILD_CU(cu.cuMemcpyDtoH(buf, d, sizeof(buf)));
	CHILD_CU(cu.cuIpcCloseMemHandle(d));
	CHILD_CHECK(cu.cuIpcCloseMemHandle(d) == CUDA_ERROR_INVALID_VALUE);
	CHILD_CHECK(test_send_u64(p->sock, 1) == 0);
	(void)test_recv_u64(p->sock, &word);
	return 0;
}

/* Opens the handle it receives and reports the CUresult. */
static int ipc_opener(void *arg)
{
	struct ipc_peer *p = arg;
	CUipcMemHandle h;
	CUdeviceptr d;

	CHILD_CHECK(recv_handle(p->sock, &h) == 0);
	return (int)cu.cuIpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) & 0xff;
}

static void test_ipc_across_processes(void **state)
{
	struct ipc_peer peer;
	CUipcMemHandle h;
	CUdeviceptr d;
	char buf[16] = "";
	uint64_t word;
	int sv[2];
	pid_t pid;

	CU_OK(cu.cuMemAlloc(&d, 1 << 20));
	CU_OK(cu.cuMemcpyHtoD(d, "exported", 9));
	CU_OK(cu.cuIpcGetMemHandle(&h, d));
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	peer.sock = sv[1];
	pid = test_fork(ipc_importer, &peer);
	assert_true(pid > 0);
	assert_int_equal(send_handle(sv[0], &h), 0);
	assert_int_equal(test_recv_u64(sv[0], &word), 0);
	CU_OK(cu.cuMemcpyDtoH(buf, d + 64, sizeof(buf)));
	assert_string_equal(buf, "imported");
	assert_int_equal(test_send_u64(sv[0], 0), 0);
	assert_int_equal(test_wait_exit(pid, 10000), 0);

	/* after cuMemFree the handle opens nothing */
	CU_OK(cu.cuMemFree(d));
	pid = test_fork(ipc_opener, &peer);
	assert_true(pid > 0);
	assert_int_equal(send_handle(sv[0], &h), 0);
	assert_int_equal(test_wait_exit(pid, 10000), CUDA_ERROR_INVALID_HANDLE & 0xff);
	close(sv[0]);
	close(sv[1]);
}

static int ipc_exporter(void *arg)
{
	struct ipc_peer *p = arg;
	CUipcMemHandle h;
	CUdeviceptr d;
	uint64_t word;

	CHILD_CU(cu.cuMemAlloc(&d, 4096));
	CHILD_CU(cu.cuIpcGetMemHandle(&h, d));
	CHILD_CHECK(send_handle(p->sock, &h) == 0);
	(void)test_recv_u64(p->sock, &word); /* until killed */
	return 0;
}

static void test_ipc_exporter_death(void **state)
{
	struct ipc_peer peer;
	CUipcMemHandle h;
	int64_t live0 = cu.live_allocations(0, NULL);
	int sv[2];
	pid_t exporter, opener;

	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	peer.sock = sv[1];
	exporter = test_fork(ipc_exporter, &peer);
	assert_true(exporter > 0);
	assert_int_equal(recv_handle(sv[0], &h), 0);
	assert_int_equal(cu.live_allocations(0, NULL), live0 + 1);
	assert_int_equal(kill(exporter, SIGKILL), 0);
	assert_int_equal(test_wait_exit(exporter, 10000), 1000 + SIGKILL);
	/* the memory went with its exporter, and the handle with it */
	assert_int_equal(cu.live_allocations(0, NULL), live0);
	opener = test_fork(ipc_opener, &peer);
	assert_true(opener > 0);
	assert_int_equal(send_handle(sv[0], &h), 0);
	assert_int_equal(test_wait_exit(opener, 10000), CUDA_ERROR_INVALID_HANDLE & 0xff);
	close(sv[0]);
	close(sv[1]);
}

/* GPUDirect RDMA and handle types: cuMemAlloc memory is RDMA-capable and has no shareable
 * handle type; VMM memory reports what its allocation properties requested. */
static void test_rdma_and_handle_type_attributes(void **state)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
	};
	CUmemGenericAllocationHandle h;
	unsigned long long types = 7;
	CUdeviceptr a, va, base;
	int v = 0, rdma = 0;
	size_t size;

	CU_OK(cu.cuDeviceGetAttribute(
		&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0));
	assert_int_equal(v, 1);
	CU_OK(cu.cuMemAlloc(&a, 4096));
	CU_OK(cu.cuPointerGetAttribute(&rdma, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, a));
	assert_int_equal(rdma, 1);
	CU_OK(cu.cuPointerGetAttribute(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, a));
	assert_true(types == CU_MEM_HANDLE_TYPE_NONE);
	CU_OK(cu.cuMemFree(a));

	for (int flag = 0; flag <= 1; flag++) {
		prop.allocFlags.gpuDirectRDMACapable = (unsigned char)flag;
		CU_OK(cu.cuMemCreate(&h, 4 << 20, &prop, 0));
		CU_OK(cu_vmm_map(h, 4 << 20, 0, &va));
		CU_OK(cu.cuPointerGetAttribute(
			&rdma, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, va + 4096));
		assert_int_equal(rdma, flag);
		CU_OK(cu.cuPointerGetAttribute(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
					       va));
		assert_true(types == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		CU_OK(cu.cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
					       va + 4096));
		CU_OK(cu.cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
					       va + 4096));
		assert_true(base == va && size == (4 << 20));
		cu_vmm_unmap(va, 4 << 20);
		CU_OK(cu.cuMemRelease(h));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_alloc_copy_memset, setup),
		cmocka_unit_test_setup(test_mem_get_info, setup),
		cmocka_unit_test_setup(test_streams_events, setup),
		cmocka_unit_test_setup(test_rdma_and_handle_type_attributes, setup),
		cmocka_unit_test_setup(test_device_memory_not_host_dereferenceable, setup),
		cmocka_unit_test_setup(test_host_access_mode, setup),
		cmocka_unit_test_setup(test_ipc_across_processes, setup),
		cmocka_unit_test_setup(test_ipc_exporter_death, setup),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
