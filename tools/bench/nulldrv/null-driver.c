/* SPDX-License-Identifier: MIT */
/*
 * A benchmark instrument, not an emulator: a libcuda.so.1 whose every call does nothing but
 * answer, so that `belayer-bench shim-overhead` can show the shim's own cost per call, which
 * the microseconds of a real (or emulated) cuMemAlloc would otherwise hide. Device pointers are
 * numbers from a bump counter and are never dereferenced; exported "handles" are /dev/null.
 * Only the entry points the bench and the shim call exist.
 */
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#define API	    __attribute__((visibility("default")))
#define GRANULARITY ((size_t)2 << 20)

static CUdeviceptr next_va = (CUdeviceptr)1 << 40;
static CUmemGenericAllocationHandle next_handle = 1;

static CUdeviceptr bump(size_t size)
{
	size = (size + GRANULARITY - 1) / GRANULARITY * GRANULARITY;
	return __atomic_fetch_add(&next_va, size, __ATOMIC_RELAXED);
}

API CUresult cuInit(unsigned int flags)
{
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
	*dev = ordinal;
	return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

API CUresult cuDeviceGetCount(int *count)
{
	*count = 1;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	memset(uuid, 0x42, sizeof(*uuid));
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice dev)
{
	*v = attr == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED;
	return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
	*ctx = (CUcontext)(uintptr_t)0x1000;
	return CUDA_SUCCESS;
}

API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	return CUDA_SUCCESS;
}

API CUresult cuCtxGetDevice(CUdevice *dev)
{
	*dev = 0;
	return CUDA_SUCCESS;
}

API CUresult cuCtxSynchronize(void)
{
	return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
	*p = bump(size);
	return CUDA_SUCCESS;
}

API CUresult cuMemFree_v2(CUdeviceptr p)
{
	return CUDA_SUCCESS;
}

API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
					   CUmemAllocationGranularity_flags flags)
{
	*g = GRANULARITY;
	return CUDA_SUCCESS;
}

API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
				 unsigned long long flags)
{
	*p = bump(size);
	return CUDA_SUCCESS;
}

API CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
	return CUDA_SUCCESS;
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
			 const CUmemAllocationProp *prop, unsigned long long flags)
{
	*h = __atomic_fetch_add(&next_handle, 1, __ATOMIC_RELAXED);
	return CUDA_SUCCESS;
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	return CUDA_SUCCESS;
}

API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
		      unsigned long long flags)
{
	return CUDA_SUCCESS;
}

API CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
	return CUDA_SUCCESS;
}

API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	return CUDA_SUCCESS;
}

API CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
					  CUmemAllocationHandleType type, unsigned long long flags)
{
	int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*(int *)out = fd;
	return CUDA_SUCCESS;
}

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
				 CUdriverProcAddressQueryResult *status)
{
	static const struct {
		const char *name;
		void *fn;
	} table[] = {
		{"cuInit", (void *)cuInit},
		{"cuDeviceGet", (void *)cuDeviceGet},
		{"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain},
		{"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
		{"cuCtxGetDevice", (void *)cuCtxGetDevice},
		{"cuMemAlloc", (void *)cuMemAlloc_v2},
		{"cuMemFree", (void *)cuMemFree_v2},
	};

	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (strcmp(table[i].name, symbol) == 0) {
			*pfn = table[i].fn;
			if (status)
				*status = CU_GET_PROC_ADDRESS_SUCCESS;
			return CUDA_SUCCESS;
		}
	*pfn = NULL;
	if (status)
		*status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return CUDA_ERROR_NOT_FOUND;
}
