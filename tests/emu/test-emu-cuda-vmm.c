/* SPDX-License-Identifier: MIT */
/*
 * The emulated driver's virtual memory management: every documented rule, fds crossing
 * process boundaries, memory outliving its creator, capacity shared by the processes of a
 * run. Device 0 for rule tests, device 1 (capacity 64 MiB) for capacity tests.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test-emu-cuda-util.h"
#include "test-util.h"

#define GRAN	    (2u << 20)
#define CAPACITY    (64u << 20)
#define CU_OK(call) assert_int_equal((call), CUDA_SUCCESS)

static int group_setup(void **state)
{
	return cu_setup("64M");
}

static int group_teardown(void **state)
{
	return cu_teardown();
}

static int setup(void **state)
{
	return cu_use_device(0) == CUDA_SUCCESS ? 0 : -1;
}

static int64_t live(int dev, uint64_t *bytes)
{
	int64_t n = cu.live_allocations(dev, bytes);
	assert_true(n >= 0);
	return n;
}

static void test_granularity(void **state)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
	};
	size_t g = 0;
	int v = 0;

	CU_OK(cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	assert_int_equal(g, GRAN);
	CU_OK(cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
	assert_int_equal(g, GRAN);
	CU_OK(cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
				      0));
	assert_int_equal(v, 1);
	CU_OK(cu.cuDeviceGetAttribute(
		&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
	assert_int_equal(v, 1);
}

static void test_create_size_must_be_granular(void **state)
{
	CUmemGenericAllocationHandle h;

	assert_int_equal(cu_vmm_create(0, GRAN / 2, false, &h), CUDA_ERROR_INVALID_VALUE);
	assert_int_equal(cu_vmm_create(0, GRAN + 4096, false, &h), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu_vmm_create(0, GRAN, false, &h));
	CU_OK(cu.cuMemRelease(h));
}

static void test_map_offset_nonzero_rejected(void **state)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr p;

	CU_OK(cu_vmm_create(0, 2 * GRAN, false, &h));
	CU_OK(cu.cuMemAddressReserve(&p, 2 * GRAN, 0, 0, 0));
	assert_int_equal(cu.cuMemMap(p, GRAN, GRAN, h, 0), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.cuMemMap(p, GRAN, 0, h, 0));
	CU_OK(cu.cuMemUnmap(p, GRAN));
	CU_OK(cu.cuMemAddressFree(p, 2 * GRAN));
	CU_OK(cu.cuMemRelease(h));
}

static void test_map_unaligned_rejected(void **state)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr p;

	CU_OK(cu_vmm_create(0, 2 * GRAN, false, &h));
	CU_OK(cu.cuMemAddressReserve(&p, 4 * GRAN, 0, 0, 0));
	assert_int_equal(p % GRAN, 0);
	/* address not a multiple of the granularity */
	assert_int_equal(cu.cuMemMap(p + 4096, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	/* size not a multiple of the granularity */
	assert_int_equal(cu.cuMemMap(p, GRAN / 2, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	/* larger than the allocation */
	assert_int_equal(cu.cuMemMap(p, 3 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	/* flags must be zero */
	assert_int_equal(cu.cuMemMap(p, GRAN, 0, h, 1), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.cuMemAddressFree(p, 4 * GRAN));
	CU_OK(cu.cuMemRelease(h));
}

static void test_map_onto_mapped_rejected(void **state)
{
	CUmemGenericAllocationHandle a, b;
	CUdeviceptr p;

	CU_OK(cu_vmm_create(0, 2 * GRAN, false, &a));
	CU_OK(cu_vmm_create(0, 2 * GRAN, false, &b));
	CU_OK(cu.cuMemAddressReserve(&p, 4 * GRAN, 0, 0, 0));
	CU_OK(cu.cuMemMap(p, 2 * GRAN, 0, a, 0));
	assert_int_equal(cu.cuMemMap(p, 2 * GRAN, 0, b, 0), CUDA_ERROR_INVALID_VALUE);
	/* overlapping the second half of the existing mapping */
	assert_int_equal(cu.cuMemMap(p + GRAN, 2 * GRAN, 0, b, 0), CUDA_ERROR_INVALID_VALUE);
	/* the unmapped rest of the reservation is fine */
	CU_OK(cu.cuMemMap(p + 2 * GRAN, 2 * GRAN, 0, b, 0));
	/* cuMemUnmap cannot unmap a sub-range of a mapping */
	assert_int_equal(cu.cuMemUnmap(p, GRAN), CUDA_ERROR_INVALID_VALUE);
	/* and cuMemAddressFree refuses a still-mapped reservation */
	assert_int_equal(cu.cuMemAddressFree(p, 4 * GRAN), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.cuMemUnmap(p, 4 * GRAN)); /* both mappings, wholly inside the range */
	CU_OK(cu.cuMemAddressFree(p, 4 * GRAN));
	CU_OK(cu.cuMemRelease(a));
	CU_OK(cu.cuMemRelease(b));
}

static void test_map_outside_reservation_rejected(void **state)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr p, d;

	CU_OK(cu_vmm_create(0, 2 * GRAN, false, &h));
	CU_OK(cu.cuMemAddressReserve(&p, GRAN, 0, 0, 0));
	/* runs past the end of the reservation */
	assert_int_equal(cu.cuMemMap(p, 2 * GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	/* right after it: not reserved */
	assert_int_equal(cu.cuMemMap(p + GRAN, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.cuMemAddressFree(p, GRAN));
	/* a freed reservation is no reservation */
	assert_int_equal(cu.cuMemMap(p, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	/* nor is cuMemAlloc memory */
	CU_OK(cu.cuMemAlloc(&d, 2 * GRAN));
	assert_int_equal(cu.cuMemMap(d - d % GRAN, GRAN, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.cuMemFree(d));
	CU_OK(cu.cuMemRelease(h));
}

static void test_no_access_before_set_access(void **state)
{
	CUmemAccessDesc rw = {
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};
	CUmemGenericAllocationHandle h;
	CUdeviceptr p;
	uint32_t v = 0x12345678, out = 0;

	CU_OK(cu_vmm_create(0, GRAN, false, &h));
	CU_OK(cu.cuMemAddressReserve(&p, GRAN, 0, 0, 0));
	CU_OK(cu.cuMemMap(p, GRAN, 0, h, 0));
	assert_null(cu.translate(p, sizeof(v)));
	assert_int_not_equal(cu.cuMemcpyHtoD(p, &v, sizeof(v)), CUDA_SUCCESS);
	assert_int_not_equal(cu.cuMemcpyDtoH(&out, p, sizeof(v)), CUDA_SUCCESS);
	/* access must cover whole mappings */
	assert_int_equal(cu.cuMemSetAccess(p, GRAN / 2, &rw, 1), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.cuMemSetAccess(p, GRAN, &rw, 1));
	assert_non_null(cu.translate(p, sizeof(v)));
	CU_OK(cu.cuMemcpyHtoD(p, &v, sizeof(v)));
	CU_OK(cu.cuMemcpyDtoH(&out, p, sizeof(v)));
	assert_int_equal(out, v);
	/* a new mapping at the same place starts without access again */
	CU_OK(cu.cuMemUnmap(p, GRAN));
	CU_OK(cu.cuMemMap(p, GRAN, 0, h, 0));
	assert_null(cu.translate(p, sizeof(v)));
	CU_OK(cu.cuMemUnmap(p, GRAN));
	CU_OK(cu.cuMemAddressFree(p, GRAN));
	CU_OK(cu.cuMemRelease(h));
}

static void test_same_handle_two_vas(void **state)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr p1, p2;
	char in[64] = "written through the first mapping", out[64] = "";

	CU_OK(cu_vmm_create(0, GRAN, false, &h));
	CU_OK(cu_vmm_map(h, GRAN, 0, &p1));
	CU_OK(cu_vmm_map(h, GRAN, 0, &p2));
	assert_true(p1 != p2);
	CU_OK(cu.cuMemcpyHtoD(p1 + 100, in, sizeof(in)));
	CU_OK(cu.cuMemcpyDtoH(out, p2 + 100, sizeof(out)));
	assert_string_equal(out, in);
	cu_vmm_unmap(p1, GRAN);
	cu_vmm_unmap(p2, GRAN);
	CU_OK(cu.cuMemRelease(h));
}

static void test_adjacent_mappings_contiguous(void **state)
{
	CUmemAccessDesc rw = {
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};
	CUmemGenericAllocationHandle a, b;
	CUdeviceptr p;
	uint64_t v = 0x0102030405060708ull, out = 0;

	CU_OK(cu_vmm_create(0, GRAN, false, &a));
	CU_OK(cu_vmm_create(0, GRAN, false, &b));
	CU_OK(cu.cuMemAddressReserve(&p, 2 * GRAN, 0, 0, 0));
	CU_OK(cu.cuMemMap(p, GRAN, 0, a, 0));
	CU_OK(cu.cuMemMap(p + GRAN, GRAN, 0, b, 0));
	CU_OK(cu.cuMemSetAccess(p, 2 * GRAN, &rw, 1));
	/* a copy straddling two allocations, as one contiguous VA range */
	CU_OK(cu.cuMemcpyHtoD(p + GRAN - 4, &v, sizeof(v)));
	CU_OK(cu.cuMemcpyDtoH(&out, p + GRAN - 4, sizeof(out)));
	assert_true(out == v);
	CU_OK(cu.cuMemUnmap(p, 2 * GRAN));
	CU_OK(cu.cuMemAddressFree(p, 2 * GRAN));
	CU_OK(cu.cuMemRelease(a));
	CU_OK(cu.cuMemRelease(b));
}

static void test_address_is_only_a_hint(void **state)
{
	CUdeviceptr a, b, c;

	CU_OK(cu.cuMemAddressReserve(&a, GRAN, 0, 0, 0));
	/* the hinted range is taken: the driver places the reservation elsewhere */
	CU_OK(cu.cuMemAddressReserve(&b, GRAN, 0, a, 0));
	assert_true(b != a);
	CU_OK(cu.cuMemAddressFree(a, GRAN));
	/* free again: the hint may be (and here is) honored */
	CU_OK(cu.cuMemAddressReserve(&c, GRAN, 0, a, 0));
	assert_true(c == a);
	CU_OK(cu.cuMemAddressFree(b, GRAN));
	CU_OK(cu.cuMemAddressFree(c, GRAN));
	/* size must be a multiple of the page size, alignment a power of two */
	assert_int_equal(cu.cuMemAddressReserve(&a, 100, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
	assert_int_equal(cu.cuMemAddressReserve(&a, GRAN, 3 * GRAN, 0, 0),
			 CUDA_ERROR_INVALID_VALUE);
	/* and cuMemAddressFree wants the exact range */
	CU_OK(cu.cuMemAddressReserve(&a, 2 * GRAN, 0, 0, 0));
	assert_int_equal(cu.cuMemAddressFree(a, GRAN), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cu.cuMemAddressFree(a, 2 * GRAN));
}

static void test_release_while_mapped_keeps_memory(void **state)
{
	CUmemGenericAllocationHandle h, r;
	CUmemAllocationProp prop;
	CUdeviceptr p;
	int64_t base = live(0, NULL);
	uint32_t v = 0xfeedf00d, out = 0;

	CU_OK(cu_vmm_create(0, GRAN, true, &h));
	CU_OK(cu_vmm_map(h, GRAN, 0, &p));
	CU_OK(cu.cuMemcpyHtoD(p, &v, sizeof(v)));
	CU_OK(cu.cuMemRelease(h));
	/* the mapping keeps the allocation */
	assert_int_equal(live(0, NULL), base + 1);
	CU_OK(cu.cuMemcpyDtoH(&out, p, sizeof(out)));
	assert_int_equal(out, v);
	/* and the handle can be had back from the address, any address in the mapping */
	CU_OK(cu.cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)(p + 12345)));
	assert_true(r == h);
	CU_OK(cu.cuMemGetAllocationPropertiesFromHandle(&prop, r));
	assert_int_equal(prop.location.id, 0);
	assert_int_equal(prop.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CU_OK(cu.cuMemRelease(r));
	assert_int_equal(live(0, NULL), base + 1);
	cu_vmm_unmap(p, GRAN);
	/* last mapping and last handle gone: freed */
	assert_int_equal(live(0, NULL), base);
	assert_int_not_equal(cu.cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)p),
			     CUDA_SUCCESS);
}

static void test_export_requires_requested_type(void **state)
{
	CUmemGenericAllocationHandle h;
	int fd = -1, p[2];

	CU_OK(cu_vmm_create(0, GRAN, false, &h));
	assert_int_equal(cu.cuMemExportToShareableHandle(
				 &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
			 CUDA_ERROR_INVALID_VALUE);
	assert_int_equal(fd, -1);
	CU_OK(cu.cuMemRelease(h));
	CU_OK(cu_vmm_create(0, GRAN, true, &h));
	CU_OK(cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	assert_true(fd >= 0);
	close(fd);
	CU_OK(cu.cuMemRelease(h));
	/* only this driver's memory can be imported */
	assert_int_equal(pipe(p), 0);
	assert_int_equal(
		cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)p[0],
						  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		CUDA_ERROR_INVALID_VALUE);
	close(p[0]);
	close(p[1]);
}

/* cuda.h says of a handle the driver never gave out, or one released: "If handle is not a
 * valid handle the behavior is undefined" (cuMemRelease; cuMemMap, cuMemExportToShareableHandle
 * and cuMemGetAllocationPropertiesFromHandle take "handle - ... handle" of cuMemCreate or
 * cuMemImportFromShareableHandle). The emulator picks the strictest answer the documentation
 * allows: CUDA_ERROR_INVALID_VALUE, nothing touched, so that a shim passing a made-up handle to
 * the driver fails in the tests instead of working by luck. */
static void test_unknown_handle_refused(void **state)
{
	CUmemGenericAllocationHandle h, fake = 0xb1a7000000000001ull;
	CUmemAllocationProp prop;
	CUdeviceptr p;
	int fd = -1;

	CU_OK(cu_vmm_create(0, GRAN, true, &h));
	CU_OK(cu.cuMemRelease(h));
	for (int i = 0; i < 2; i++) {
		CUmemGenericAllocationHandle bad = i == 0 ? fake : h; /* made up, released */

		assert_int_equal(cu.cuMemExportToShareableHandle(
					 &fd, bad, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
				 CUDA_ERROR_INVALID_VALUE);
		assert_int_equal(fd, -1);
		assert_int_equal(cu.cuMemGetAllocationPropertiesFromHandle(&prop, bad),
				 CUDA_ERROR_INVALID_VALUE);
		assert_int_equal(cu.cuMemRelease(bad), CUDA_ERROR_INVALID_VALUE);
		CU_OK(cu.cuMemAddressReserve(&p, GRAN, 0, 0, 0));
		assert_int_equal(cu.cuMemMap(p, GRAN, 0, bad, 0), CUDA_ERROR_INVALID_VALUE);
		CU_OK(cu.cuMemAddressFree(p, GRAN));
	}
}

/* cuda.h 13.0, Multicast Object Management: support is the device attribute
 * CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED; a device without it answers CUDA_ERROR_NOT_SUPPORTED.
 * The entry points resolve (cuGetProcAddress found them: cu_api loads every entry by name). */
static void test_multicast_not_supported(void **state)
{
	CUmulticastObjectProp mp = {.numDevices = 1,
				    .size = GRAN,
				    .handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR};
	CUmemGenericAllocationHandle mc = 0, h;
	int v = -1;

	(void)state;
	CU_OK(cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0));
	assert_int_equal(v, 0);
	assert_int_equal(cu.cuMulticastCreate(&mc, &mp), CUDA_ERROR_NOT_SUPPORTED);
	CU_OK(cu_vmm_create(0, GRAN, true, &h));
	assert_int_equal(cu.cuMulticastBindMem(mc, 0, h, 0, GRAN, 0), CUDA_ERROR_NOT_SUPPORTED);
	CU_OK(cu.cuMemRelease(h));
}

static void test_mapping_alone_keeps_memory(void **state)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr d;
	int64_t base = live(0, NULL);
	uint32_t *m;
	int fd;

	CU_OK(cu_vmm_create(0, GRAN, true, &h));
	CU_OK(cu_vmm_map(h, GRAN, 0, &d));
	CU_OK(cu.cuMemsetD32(d, 0x5a5a5a5a, GRAN / 4));
	CU_OK(cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	/* whoever maps the exported fd holds the memory, even after closing the fd */
	m = mmap(NULL, GRAN, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(m != MAP_FAILED);
	close(fd);
	cu_vmm_unmap(d, GRAN);
	CU_OK(cu.cuMemRelease(h));
	assert_int_equal(live(0, NULL), base + 1);
	assert_int_equal(m[1000], 0x5a5a5a5a);
	assert_int_equal(munmap(m, GRAN), 0);
	assert_int_equal(live(0, NULL), base);
}

/* ---- across processes ---- */

struct peer {
	int sock;
};

/* Receives an fd, imports and maps it, checks the pattern the parent wrote, writes another
 * one, then waits for the parent's word to exit. */
static int import_child(void *arg)
{
	struct peer *p = arg;
	CUmemGenericAllocationHandle h;
	CUdeviceptr d;
	uint64_t size, word;
	char buf[32] = "";
	int fd;

	fd = test_recv_fd(p->sock, &size);
	CHILD_CHECK(fd >= 0);
	CHILD_CU(cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
						   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	close(fd); /* the handle holds its own reference */
	CHILD_CU(cu_vmm_map(h, size, 0, &d));
	CHILD_CU(cu.cuMemcpyDtoH(buf, d + 4096, sizeof(buf)));
	CHILD_CHECK(strcmp(buf, "from the exporter") == 0);
	CHILD_CU(cu.cuMemcpyHtoD(d + 8192, "from the importer", 18));
	CHILD_CHECK(test_send_u64(p->sock, 1) == 0);
	CHILD_CHECK(test_recv_u64(p->sock, &word) == 0);
	cu_vmm_unmap(d, size);
	CHILD_CU(cu.cuMemRelease(h));
	return 0;
}

static void test_exported_fd_maps_same_bytes(void **state)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr d;
	struct peer peer;
	int sv[2], fd;
	uint64_t word;
	char buf[32] = "";
	pid_t pid;

	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	CU_OK(cu_vmm_create(0, GRAN, true, &h));
	CU_OK(cu_vmm_map(h, GRAN, 0, &d));
	CU_OK(cu.cuMemcpyHtoD(d + 4096, "from the exporter", 18));
	peer.sock = sv[1];
	pid = test_fork(import_child, &peer);
	assert_true(pid > 0);
	close(sv[1]);
	CU_OK(cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	assert_int_equal(test_send_fd(sv[0], fd, GRAN), 0);
	close(fd);
	assert_int_equal(test_recv_u64(sv[0], &word), 0);
	CU_OK(cu.cuMemcpyDtoH(buf, d + 8192, sizeof(buf)));
	assert_string_equal(buf, "from the importer");
	assert_int_equal(test_send_u64(sv[0], 0), 0);
	assert_int_equal(test_wait_exit(pid, 10000), 0);
	close(sv[0]);
	cu_vmm_unmap(d, GRAN);
	CU_OK(cu.cuMemRelease(h));
}

/* Creates and fills an allocation, exports it to the parent, then waits to be killed. */
static int exporter_child(void *arg)
{
	struct peer *p = arg;
	CUmemGenericAllocationHandle h;
	CUdeviceptr d;
	uint64_t word;
	int fd;

	CHILD_CU(cu_vmm_create(0, 4 * GRAN, true, &h));
	CHILD_CU(cu_vmm_map(h, 4 * GRAN, 0, &d));
	CHILD_CU(cu.cuMemsetD32(d, 0xc0ffee00, 4 * GRAN / 4));
	CHILD_CU(cu.cuMemcpyHtoD(d + 4096, "from the exporter", 18));
	CHILD_CU(cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
						 0));
	CHILD_CHECK(test_send_fd(p->sock, fd, 4 * GRAN) == 0);
	/* blocks until killed */
	(void)test_recv_u64(p->sock, &word);
	return 0;
}

static void test_memory_survives_exporter_sigkill(void **state)
{
	struct peer peer;
	uint64_t base_bytes, bytes, size, word;
	int64_t base = live(0, &base_bytes);
	size_t free0, total, free1;
	int sv[2], fd;
	pid_t exporter, importer;

	CU_OK(cu.cuMemGetInfo(&free0, &total));
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	peer.sock = sv[1];
	exporter = test_fork(exporter_child, &peer);
	assert_true(exporter > 0);
	fd = test_recv_fd(sv[0], &size);
	assert_true(fd >= 0);
	assert_int_equal(size, 4 * GRAN);
	assert_int_equal(live(0, NULL), base + 1);

	/* The creator dies without releasing anything. */
	assert_int_equal(kill(exporter, SIGKILL), 0);
	assert_int_equal(test_wait_exit(exporter, 10000), 1000 + SIGKILL);
	assert_int_equal(live(0, &bytes), base + 1);
	assert_int_equal(bytes, base_bytes + 4 * GRAN);
	CU_OK(cu.cuMemGetInfo(&free1, &total));
	assert_int_equal(free1, free0 - 4 * GRAN);

	/* Another process maps it from the fd: the bytes are still there. */
	importer = test_fork(import_child, &peer);
	assert_true(importer > 0);
	close(sv[1]);
	assert_int_equal(test_send_fd(sv[0], fd, size), 0);
	close(fd); /* now only the importer holds it */
	assert_int_equal(test_recv_u64(sv[0], &word), 0);
	assert_int_equal(live(0, NULL), base + 1);
	assert_int_equal(test_send_u64(sv[0], 0), 0);
	assert_int_equal(test_wait_exit(importer, 10000), 0);
	close(sv[0]);

	/* The last reference went with the importer's cuMemRelease and exit: freed. */
	assert_int_equal(live(0, &bytes), base);
	assert_int_equal(bytes, base_bytes);
	CU_OK(cu.cuMemGetInfo(&free1, &total));
	assert_int_equal(free1, free0);
}

/* ---- capacity (device 1, 64 MiB) ---- */

static void test_oom_at_capacity(void **state)
{
	CUmemGenericAllocationHandle h[CAPACITY / GRAN + 1];
	CUmemGenericAllocationHandle extra;
	CUdeviceptr d;
	size_t free, total;
	unsigned n = 0;

	CU_OK(cu_use_device(1));
	CU_OK(cu.cuMemGetInfo(&free, &total));
	assert_int_equal(total, CAPACITY);
	assert_int_equal(free, CAPACITY);
	while (n < sizeof(h) / sizeof(h[0]) && cu_vmm_create(1, GRAN, false, &h[n]) == CUDA_SUCCESS)
		n++;
	assert_int_equal(n, CAPACITY / GRAN);
	assert_int_equal(cu_vmm_create(1, GRAN, false, &extra), CUDA_ERROR_OUT_OF_MEMORY);
	assert_int_equal(cu.cuMemAlloc(&d, 4096), CUDA_ERROR_OUT_OF_MEMORY);
	CU_OK(cu.cuMemGetInfo(&free, &total));
	assert_int_equal(free, 0);
	/* capacity comes back when memory is released */
	CU_OK(cu.cuMemRelease(h[--n]));
	CU_OK(cu_vmm_create(1, GRAN, false, &extra));
	assert_int_equal(cu_vmm_create(1, GRAN, false, &h[n]), CUDA_ERROR_OUT_OF_MEMORY);
	CU_OK(cu.cuMemRelease(extra));
	while (n)
		CU_OK(cu.cuMemRelease(h[--n]));
	CU_OK(cu.cuMemGetInfo(&free, &total));
	assert_int_equal(free, CAPACITY);
	CU_OK(cu.cuMemAlloc(&d, CAPACITY));
	CU_OK(cu.cuMemFree(d));
	assert_int_equal(cu.cuMemAlloc(&d, CAPACITY + 1), CUDA_ERROR_OUT_OF_MEMORY);
	CU_OK(cu_use_device(0));
}

/* Holds half the capacity of device 1 until told to exit. */
static int hog_child(void *arg)
{
	struct peer *p = arg;
	CUmemGenericAllocationHandle h;
	uint64_t word;

	CHILD_CU(cu_use_device(1));
	CHILD_CU(cu_vmm_create(1, CAPACITY / 2, false, &h));
	CHILD_CHECK(test_send_u64(p->sock, 1) == 0);
	(void)test_recv_u64(p->sock, &word);
	return 0;
}

static void test_capacity_shared_across_processes(void **state)
{
	CUmemGenericAllocationHandle h;
	struct peer peer;
	uint64_t word;
	size_t free, total;
	int sv[2];
	pid_t pid;

	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	peer.sock = sv[1];
	pid = test_fork(hog_child, &peer);
	assert_true(pid > 0);
	close(sv[1]);
	assert_int_equal(test_recv_u64(sv[0], &word), 0);
	CU_OK(cu_use_device(1));
	CU_OK(cu.cuMemGetInfo(&free, &total));
	assert_int_equal(free, CAPACITY / 2);
	assert_int_equal(cu_vmm_create(1, CAPACITY / 2 + GRAN, false, &h),
			 CUDA_ERROR_OUT_OF_MEMORY);
	/* the holder dies without releasing: its memory comes back */
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(test_wait_exit(pid, 10000), 1000 + SIGKILL);
	close(sv[0]);
	CU_OK(cu_vmm_create(1, CAPACITY, false, &h));
	CU_OK(cu.cuMemRelease(h));
	CU_OK(cu_use_device(0));
}

/* Allocates on device 1 until out of memory, reports how many, holds them until told. */
static int greedy_child(void *arg)
{
	struct peer *p = arg;
	CUmemGenericAllocationHandle h;
	uint64_t n = 0, word;

	CHILD_CU(cu_use_device(1));
	while (cu_vmm_create(1, GRAN, false, &h) == CUDA_SUCCESS)
		n++;
	CHILD_CHECK(test_send_u64(p->sock, n) == 0);
	(void)test_recv_u64(p->sock, &word);
	return 0;
}

static void test_concurrent_charges_never_exceed_capacity(void **state)
{
	enum {
		N = 4
	};
	struct peer peer[N];
	int sv[N][2];
	pid_t pid[N];
	uint64_t total = 0, n;
	size_t free, size;

	for (int i = 0; i < N; i++) {
		assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv[i]), 0);
		peer[i].sock = sv[i][1];
		pid[i] = test_fork(greedy_child, &peer[i]);
		assert_true(pid[i] > 0);
		close(sv[i][1]);
	}
	for (int i = 0; i < N; i++) {
		assert_int_equal(test_recv_u64(sv[i][0], &n), 0);
		total += n;
	}
	/* racing processes got exactly the capacity between them */
	assert_int_equal(total, CAPACITY / GRAN);
	for (int i = 0; i < N; i++) {
		assert_int_equal(test_send_u64(sv[i][0], 0), 0);
		assert_int_equal(test_wait_exit(pid[i], 10000), 0);
		close(sv[i][0]);
	}
	CU_OK(cu_use_device(1));
	CU_OK(cu.cuMemGetInfo(&free, &size));
	assert_int_equal(free, CAPACITY);
	CU_OK(cu_use_device(0));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_granularity, setup),
		cmocka_unit_test_setup(test_create_size_must_be_granular, setup),
		cmocka_unit_test_setup(test_map_offset_nonzero_rejected, setup),
		cmocka_unit_test_setup(test_map_unaligned_rejected, setup),
		cmocka_unit_test_setup(test_map_onto_mapped_rejected, setup),
		cmocka_unit_test_setup(test_map_outside_reservation_rejected, setup),
		cmocka_unit_test_setup(test_no_access_before_set_access, setup),
		cmocka_unit_test_setup(test_same_handle_two_vas, setup),
		cmocka_unit_test_setup(test_adjacent_mappings_contiguous, setup),
		cmocka_unit_test_setup(test_address_is_only_a_hint, setup),
		cmocka_unit_test_setup(test_release_while_mapped_keeps_memory, setup),
		cmocka_unit_test_setup(test_export_requires_requested_type, setup),
		cmocka_unit_test_setup(test_unknown_handle_refused, setup),
		cmocka_unit_test_setup(test_multicast_not_supported, setup),
		cmocka_unit_test_setup(test_mapping_alone_keeps_memory, setup),
		cmocka_unit_test_setup(test_exported_fd_maps_same_bytes, setup),
		cmocka_unit_test_setup(test_memory_survives_exporter_sigkill, setup),
		cmocka_unit_test_setup(test_oom_at_capacity, setup),
		cmocka_unit_test_setup(test_capacity_shared_across_processes, setup),
		cmocka_unit_test_setup(test_concurrent_charges_never_exceed_capacity, setup),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
