/* SPDX-License-Identifier: MIT */
/*
 * Reaching the driver as the CUDA runtime does: cuGetProcAddress by name, version and stream
 * flags; then devices, contexts and error strings through what it returns.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
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

/* What cuGetProcAddress_v2 returns for (symbol, version, flags), with its status. */
static void *lookup(const char *symbol, int version, cuuint64_t flags,
		    CUdriverProcAddressQueryResult *ret_status)
{
	void *fn = (void *)1;

	CU_OK(cu.getProcAddress(symbol, &fn, version, flags, ret_status));
	return fn;
}

static void expect(const char *symbol, int version, cuuint64_t flags, const char *exported)
{
	CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	void *want = dlsym(cu.lib, exported);
	void *got = lookup(symbol, version, flags, &status);

	assert_non_null(want);
	if (got != want)
		fail_msg("%s at %d flags %llu: not %s", symbol, version, (unsigned long long)flags,
			 exported);
	assert_int_equal(status, CU_GET_PROC_ADDRESS_SUCCESS);
}

static void test_versions(void **state)
{
	expect("cuMemAlloc", 13000, 0, "cuMemAlloc_v2");
	expect("cuMemAlloc", 3020, 0, "cuMemAlloc_v2");
	expect("cuMemAlloc", 3010, 0, "cuMemAlloc");
	expect("cuMemFree", 12000, 0, "cuMemFree_v2");
	expect("cuMemGetInfo", 12000, 0, "cuMemGetInfo_v2");
	/* The base name means what cuda.h of the caller's version #defines it to (the CUDA
	 * 11.4-12.9 headers: cuCtxCreate_v2, with _v3 and _v4 as APIs of their own; 13.0:
	 * _v4), not the newest variant that existed then. */
	expect("cuCtxCreate", 13000, 0, "cuCtxCreate_v4");
	expect("cuCtxCreate", 12090, 0, "cuCtxCreate_v2");
	expect("cuCtxCreate", 12050, 0, "cuCtxCreate_v2");
	expect("cuCtxCreate", 12040, 0, "cuCtxCreate_v2");
	expect("cuCtxCreate", 11040, 0, "cuCtxCreate_v2");
	expect("cuCtxCreate", 11030, 0, "cuCtxCreate_v2");
	expect("cuCtxCreate", 3020, 0, "cuCtxCreate_v2");
	expect("cuCtxCreate", 2000, 0, "cuCtxCreate");
	expect("cuCtxDestroy", 12000, 0, "cuCtxDestroy_v2");
	expect("cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2");
	expect("cuDevicePrimaryCtxRelease", 10020, 0, "cuDevicePrimaryCtxRelease");
	expect("cuDeviceGetUuid", 13000, 0, "cuDeviceGetUuid_v2");
	expect("cuDeviceGetUuid", 12090, 0, "cuDeviceGetUuid");
	expect("cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid");
	expect("cuIpcOpenMemHandle", 12000, 0, "cuIpcOpenMemHandle_v2");
	expect("cuEventElapsedTime", 13000, 0, "cuEventElapsedTime_v2");
	expect("cuEventElapsedTime", 12090, 0, "cuEventElapsedTime");
	expect("cuEventElapsedTime", 12080, 0, "cuEventElapsedTime");
	/* cuda.h 13.0 declares cuCtxGetDevice_v2 and cuCtxSynchronize_v2 (they take a context)
	 * without remapping the base names. */
	expect("cuCtxGetDevice", 13000, 0, "cuCtxGetDevice");
	expect("cuCtxGetDevice", 12090, 0, "cuCtxGetDevice");
	expect("cuCtxSynchronize", 13000, 0, "cuCtxSynchronize");
	expect("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2");
	expect("cuGetProcAddress", 11030, 0, "cuGetProcAddress");
}

static void test_stream_flags(void **state)
{
	const cuuint64_t legacy = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
	const cuuint64_t pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

	expect("cuMemcpyHtoD", 13000, CU_GET_PROC_ADDRESS_DEFAULT, "cuMemcpyHtoD_v2");
	expect("cuMemcpyHtoD", 13000, legacy, "cuMemcpyHtoD_v2");
	expect("cuMemcpyHtoD", 13000, pt, "cuMemcpyHtoD_v2_ptds");
	/* distinct entry points, as in the real driver */
	assert_ptr_not_equal(lookup("cuMemcpyHtoD", 13000, pt, NULL),
			     lookup("cuMemcpyHtoD", 13000, legacy, NULL));
	expect("cuMemcpyHtoDAsync", 13000, pt, "cuMemcpyHtoDAsync_v2_ptsz");
	expect("cuLaunchKernel", 13000, pt, "cuLaunchKernel_ptsz");
	expect("cuLaunchKernel", 13000, legacy, "cuLaunchKernel");
	expect("cuStreamSynchronize", 12000, pt, "cuStreamSynchronize_ptsz");
	/* before per-thread streams existed (7.0), only the legacy one */
	expect("cuMemcpyHtoD", 6050, pt, "cuMemcpyHtoD_v2");
	/* "If a per-thread version is not found, the API will return the legacy version" */
	expect("cuMemAlloc", 13000, pt, "cuMemAlloc_v2");
	/* flags outside the documented ones */
	void *fn;
	assert_int_equal(cu.getProcAddress("cuMemAlloc", &fn, 13000, 4, NULL),
			 CUDA_ERROR_INVALID_VALUE);
}

static void test_not_found(void **state)
{
	CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
	void *fn;

	/* CUDA_SUCCESS, a NULL pointer and the reason, as documented */
	assert_null(lookup("cuDoesNotExist", 13000, 0, &status));
	assert_int_equal(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
	assert_null(lookup("cuMemCreate", 10010, 0, &status));
	assert_int_equal(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
	assert_null(lookup("cuMemAlloc", 1000, 0, &status));
	assert_int_equal(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
	/* a version newer than the driver */
	assert_int_equal(cu.getProcAddress("cuMemAlloc", &fn, 13010, 0, &status),
			 CUDA_ERROR_INVALID_VALUE);
	/* the private tables libcudart wants are not emulated */
	const void *table = (void *)1;
	CUuuid id = {{0}};
	assert_int_equal(cu.cuGetExportTable(&table, &id), CUDA_ERROR_NOT_SUPPORTED);
}

static void test_old_entry_point(void **state)
{
	PFN_cuGetProcAddress_v11030 old =
		(PFN_cuGetProcAddress_v11030)dlsym(cu.lib, "cuGetProcAddress");
	void *fn = NULL;

	assert_non_null(old);
	CU_OK(old("cuMemAlloc", &fn, 11000, 0));
	assert_ptr_equal(fn, dlsym(cu.lib, "cuMemAlloc_v2"));
	CU_OK(old("cuNothing", &fn, 11000, 0));
	assert_null(fn);
}

static void test_not_initialized(void **state)
{
	/* A second, independent copy of the driver, as a fresh process would see it. */
	void *lib = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	PFN_cuGetProcAddress_v12000 gpa;
	PFN_cuDeviceGetCount_v2000 count;
	PFN_cuDriverGetVersion_v2020 version;
	int n = -1, v = 0;

	TEST_REQUIRE(lib, "dlmopen(LM_ID_NEWLM) failed: %s", dlerror());
	gpa = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
	assert_non_null(gpa);
	CU_OK(gpa("cuDeviceGetCount", (void **)&count, 13000, 0, NULL));
	CU_OK(gpa("cuDriverGetVersion", (void **)&version, 13000, 0, NULL));
	assert_int_equal(count(&n), CUDA_ERROR_NOT_INITIALIZED);
	/* cuDriverGetVersion works before cuInit */
	CU_OK(version(&v));
	assert_int_equal(v, 13000);
	dlclose(lib);
}

static int uuid_child(void *arg)
{
	CUuuid *parent = arg, u;

	CHILD_CU(cu.cuDeviceGetUuid(&u, 1));
	CHILD_CHECK(memcmp(&u, parent, sizeof(u)) == 0);
	return 0;
}

static void test_devices(void **state)
{
	CUuuid u0, u0b, u1;
	char name[64], bus[32];
	size_t total;
	int n, v;
	CUdevice d;

	CU_OK(cu.cuDeviceGetCount(&n));
	assert_int_equal(n, 2);
	CU_OK(cu.cuDeviceGet(&d, 1));
	assert_int_equal(d, 1);
	assert_int_equal(cu.cuDeviceGet(&d, 2), CUDA_ERROR_INVALID_DEVICE);
	CU_OK(cu.cuDeviceGetName(name, sizeof(name), 0));
	assert_true(strlen(name) > 0);
	CU_OK(cu.cuDeviceTotalMem(&total, 0));
	assert_int_equal(total, 8ull << 30);
	CU_OK(cu.cuDeviceGetUuid(&u0, 0));
	CU_OK(cu.cuDeviceGetUuid(&u0b, 0));
	CU_OK(cu.cuDeviceGetUuid(&u1, 1));
	assert_memory_equal(&u0, &u0b, sizeof(u0));
	assert_memory_not_equal(&u0, &u1, sizeof(u0));
	/* the same in every process of the run */
	assert_int_equal(test_wait_exit(test_fork(uuid_child, &u1), 10000), 0);
	CU_OK(cu.cuDeviceGetPCIBusId(bus, sizeof(bus), 1));
	assert_string_equal(bus, "0000:19:00.0");
	CU_OK(cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0));
	assert_int_equal(v, 1);
	assert_int_equal(cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0),
			 CUDA_ERROR_INVALID_VALUE);
	assert_int_equal(cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 7),
			 CUDA_ERROR_INVALID_DEVICE);
}

static void test_contexts(void **state)
{
	CUcontext a, b, cur, popped, primary;
	CUdevice dev;
	unsigned flags;
	int active;

	CU_OK(cu.cuCtxSetCurrent(NULL));
	CU_OK(cu.cuCtxGetCurrent(&cur));
	assert_null(cur);
	assert_int_equal(cu.cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
	assert_int_equal(cu.cuMemAlloc(&(CUdeviceptr){0}, 16), CUDA_ERROR_INVALID_CONTEXT);

	CU_OK(cu.cuCtxCreate(&a, NULL, 0, 1)); /* _v4, made current */
	CU_OK(cu.cuCtxGetCurrent(&cur));
	assert_ptr_equal(cur, a);
	CU_OK(cu.cuCtxGetDevice(&dev));
	assert_int_equal(dev, 1);
	CU_OK(cu.cuCtxCreate(&b, NULL, 0, 0));
	CU_OK(cu.cuCtxGetDevice(&dev));
	assert_int_equal(dev, 0);
	CU_OK(cu.cuCtxPopCurrent(&popped));
	assert_ptr_equal(popped, b);
	CU_OK(cu.cuCtxGetCurrent(&cur));
	assert_ptr_equal(cur, a);
	CU_OK(cu.cuCtxPushCurrent(b));
	CU_OK(cu.cuCtxSynchronize());
	/* destroying the current context pops it */
	CU_OK(cu.cuCtxDestroy(b));
	CU_OK(cu.cuCtxGetCurrent(&cur));
	assert_ptr_equal(cur, a);
	assert_int_equal(cu.cuCtxDestroy(b), CUDA_ERROR_INVALID_CONTEXT);
	CU_OK(cu.cuCtxDestroy(a));

	CU_OK(cu.cuDevicePrimaryCtxRetain(&primary, 1));
	CU_OK(cu.cuDevicePrimaryCtxGetState(1, &flags, &active));
	assert_int_equal(active, 1);
	CU_OK(cu.cuDevicePrimaryCtxRelease(1));
	CU_OK(cu.cuDevicePrimaryCtxGetState(1, &flags, &active));
	assert_int_equal(active, 0);
}

static void test_error_strings(void **state)
{
	const char *s = NULL;

	CU_OK(cu.cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
	assert_string_equal(s, "CUDA_ERROR_OUT_OF_MEMORY");
	CU_OK(cu.cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
	assert_string_equal(s, "out of memory");
	CU_OK(cu.cuGetErrorName(CUDA_ERROR_NOT_PERMITTED, &s));
	assert_string_equal(s, "CUDA_ERROR_NOT_PERMITTED");
	assert_int_equal(cu.cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
	assert_null(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_versions),	cmocka_unit_test(test_stream_flags),
		cmocka_unit_test(test_not_found),	cmocka_unit_test(test_old_entry_point),
		cmocka_unit_test(test_not_initialized), cmocka_unit_test(test_devices),
		cmocka_unit_test(test_contexts),	cmocka_unit_test(test_error_strings),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
