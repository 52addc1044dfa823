/* SPDX-License-Identifier: MIT */
/*
 * The exported CUDA Driver API wrappers: one line of logic each, calling into shim-alloc.c.
 * The caller's return address is taken here, in the exported function, because that is the
 * only frame that knows which library called the driver. cuGetProcAddress answers a hooked
 * name with its wrapper, from the table at the end.
 */
#include <string.h>

#include "hooks.h"
#include "shim-alloc.h"
#include "shim-conn.h"
#include "shim-ipc.h"
#include "shim-real.h"
#include "shim-share.h"

static void *proc_address(const char *symbol, void *fn, int version, cuuint64_t flags);

#define REAL_OR_FAIL(sym)                       \
	__typeof__(&sym) real_ = REAL(sym);     \
	if (__builtin_expect(real_ == NULL, 0)) \
	return CUDA_ERROR_NOT_INITIALIZED

#define PASS(sym, ...)                     \
	do {                               \
		REAL_OR_FAIL(sym);         \
		return real_(__VA_ARGS__); \
	} while (0)

/* A call that may create the first context: the supervisor connection starts after it. */
#define FIRST_USE(sym, ...)                       \
	do {                                      \
		REAL_OR_FAIL(sym);                \
		CUresult r_ = real_(__VA_ARGS__); \
		if (r_ == CUDA_SUCCESS)           \
			conn_start();             \
		return r_;                        \
	} while (0)

/* A copy into device memory: tell the weights-version tracking once it is queued. */
#define WRITE(sym, dst, len, ...)                      \
	do {                                           \
		REAL_OR_FAIL(sym);                     \
		CUresult r_ = real_(__VA_ARGS__);      \
		if (r_ == CUDA_SUCCESS)                \
			shim_note_write((dst), (len)); \
		return r_;                             \
	} while (0)

CUresult cuInit(unsigned int Flags)
{
	FIRST_USE(cuInit, Flags);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	REAL_OR_FAIL(cuGetProcAddress);
	CUresult r = real_(symbol, pfn, cudaVersion, flags);

	if (r == CUDA_SUCCESS && pfn && *pfn)
		*pfn = proc_address(symbol, *pfn, cudaVersion, flags);
	return r;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *symbolStatus)
{
	REAL_OR_FAIL(cuGetProcAddress_v2);
	CUresult r = real_(symbol, pfn, cudaVersion, flags, symbolStatus);

	if (r == CUDA_SUCCESS && pfn && *pfn)
		*pfn = proc_address(symbol, *pfn, cudaVersion, flags);
	return r;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	FIRST_USE(cuDevicePrimaryCtxRetain, pctx, dev);
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	FIRST_USE(cuCtxCreate_v2, pctx, flags, dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
			unsigned int flags, CUdevice dev)
{
	FIRST_USE(cuCtxCreate_v3, pctx, paramsArray, numParams, flags, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
			CUdevice dev)
{
	FIRST_USE(cuCtxCreate_v4, pctx, ctxCreateParams, flags, dev);
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
	return shim_mem_get_info(free, total);
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	return shim_mem_alloc(dptr, bytesize, __builtin_return_address(0));
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	return shim_mem_free(dptr);
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	return shim_mem_get_address_range(pbase, psize, dptr);
}

/* Stream-ordered pools are the driver's memory, not exportable by us: passed through. */
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	PASS(cuMemAllocAsync, dptr, bytesize, hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	PASS(cuMemAllocAsync_ptsz, dptr, bytesize, hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
				 CUstream hStream)
{
	PASS(cuMemAllocFromPoolAsync, dptr, bytesize, pool, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
				      CUstream hStream)
{
	PASS(cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, pool, hStream);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	return shim_mem_free_async(dptr, hStream, false);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	return shim_mem_free_async(dptr, hStream, true);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
		     const CUmemAllocationProp *prop, unsigned long long flags)
{
	return shim_mem_create(handle, size, prop, flags, __builtin_return_address(0));
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	return shim_mem_release(handle);
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
		  unsigned long long flags)
{
	return shim_mem_map(ptr, size, offset, handle, flags);
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	return shim_mem_unmap(ptr, size);
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
			     unsigned long long flags)
{
	PASS(cuMemAddressReserve, ptr, size, alignment, addr, flags);
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	return shim_mem_address_free(ptr, size);
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	PASS(cuMemSetAccess, ptr, size, desc, count);
}

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
				      CUmemAllocationHandleType handleType,
				      unsigned long long flags)
{
	return share_export(shareableHandle, handle, handleType, flags);
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	return share_retain(handle, addr);
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
						CUmemGenericAllocationHandle handle)
{
	return share_get_properties(prop, handle);
}

CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
			    CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
			    unsigned long long flags)
{
	return share_multicast_bind_mem(mcHandle, mcOffset, memHandle, memOffset, size, flags);
}

CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
			     CUdeviceptr memptr, size_t size, unsigned long long flags)
{
	return share_multicast_bind_addr(mcHandle, mcOffset, memptr, size, flags);
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	return shim_pointer_get_attribute(data, attribute, ptr);
}

CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
				void **data, CUdeviceptr ptr)
{
	return shim_pointer_get_attributes(numAttributes, attributes, data, ptr);
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	return shim_ipc_get_mem_handle(pHandle, dptr);
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	return shim_ipc_open_mem_handle(pdptr, handle, Flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	return shim_ipc_close_mem_handle(dptr);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	WRITE(cuMemcpyHtoD_v2, dstDevice, ByteCount, dstDevice, srcHost, ByteCount);
}

CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	WRITE(cuMemcpyHtoD_v2_ptds, dstDevice, ByteCount, dstDevice, srcHost, ByteCount);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
			      CUstream hStream)
{
	WRITE(cuMemcpyHtoDAsync_v2, dstDevice, ByteCount, dstDevice, srcHost, ByteCount, hStream);
}

CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
				   CUstream hStream)
{
	WRITE(cuMemcpyHtoDAsync_v2_ptsz, dstDevice, ByteCount, dstDevice, srcHost, ByteCount,
	      hStream);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	WRITE(cuMemcpyDtoD_v2, dstDevice, ByteCount, dstDevice, srcDevice, ByteCount);
}

CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	WRITE(cuMemcpyDtoD_v2_ptds, dstDevice, ByteCount, dstDevice, srcDevice, ByteCount);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
			      CUstream hStream)
{
	WRITE(cuMemcpyDtoDAsync_v2, dstDevice, ByteCount, dstDevice, srcDevice, ByteCount, hStream);
}

CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
				   CUstream hStream)
{
	WRITE(cuMemcpyDtoDAsync_v2_ptsz, dstDevice, ByteCount, dstDevice, srcDevice, ByteCount,
	      hStream);
}

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	WRITE(cuMemcpy, dst, ByteCount, dst, src, ByteCount);
}

CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	WRITE(cuMemcpy_ptds, dst, ByteCount, dst, src, ByteCount);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	WRITE(cuMemcpyAsync, dst, ByteCount, dst, src, ByteCount, hStream);
}

CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	WRITE(cuMemcpyAsync_ptsz, dst, ByteCount, dst, src, ByteCount, hStream);
}

/* Memsets into device memory write as copies do (PyTorch's zero_/fill_ on contiguous memory
 * may use them; the review's B3): N elements of 1, 2 or 4 bytes. */
#define MEMSET(sym, unit, ...) WRITE(sym, dstDevice, (N) * (unit), dstDevice, __VA_ARGS__)

CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	MEMSET(cuMemsetD8_v2, 1, uc, N);
}

CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	MEMSET(cuMemsetD8_v2_ptds, 1, uc, N);
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	MEMSET(cuMemsetD8Async, 1, uc, N, hStream);
}

CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	MEMSET(cuMemsetD8Async_ptsz, 1, uc, N, hStream);
}

CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N)
{
	MEMSET(cuMemsetD16_v2, 2, us, N);
}

CUresult cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N)
{
	MEMSET(cuMemsetD16_v2_ptds, 2, us, N);
}

CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream)
{
	MEMSET(cuMemsetD16Async, 2, us, N, hStream);
}

CUresult cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream)
{
	MEMSET(cuMemsetD16Async_ptsz, 2, us, N, hStream);
}

CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
	MEMSET(cuMemsetD32_v2, 4, ui, N);
}

CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
	MEMSET(cuMemsetD32_v2_ptds, 4, ui, N);
}

CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
	MEMSET(cuMemsetD32Async, 4, ui, N, hStream);
}

CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
	MEMSET(cuMemsetD32Async_ptsz, 4, ui, N, hStream);
}

const struct hook_info cuda_hooks[_HOOK_CUDA_MAX] = {
#define X(sym, proc_, version_, ptds_, pfn)  \
	[HOOK_##sym] = {.name = #sym,        \
			.proc = proc_,       \
			.version = version_, \
			.ptds = ptds_,       \
			.wrapper = (void *)(pfn)sym},
	BELAYER_CUDA_HOOKS(X)
#undef X
};

/* cuGetProcAddress post-processing: our wrapper for what the driver returned, or fn.
 *
 * Which variant a base name means at a version is the driver's business (cuCtxCreate is _v2
 * for a CUDA 12.9 caller although _v3 and _v4 existed then), so the variant is identified by
 * the pointer the driver returned: the hooked variant whose real function it is. A pointer
 * that is none of our variants' (one we do not hook) passes through. Only when some variant's
 * real function is unknown (a driver the shim cannot reach by name) does the version table
 * decide, and the shim learns fn as that variant's real function. */
static void *proc_address(const char *symbol, void *fn, int version, cuuint64_t flags)
{
	bool want_ptds = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
	int best = -1, best_score = -1;
	bool unknown = false;

	if (!symbol || symbol[0] != 'c' || symbol[1] != 'u')
		return fn;
	for (int i = 0; i < _HOOK_CUDA_MAX; i++) {
		void *real;

		if (strcmp(cuda_hooks[i].proc, symbol) != 0)
			continue;
		/* A driver whose own table binds to our exported names hands out our wrapper. */
		if (fn == cuda_hooks[i].wrapper)
			return fn;
		real = real_cuda_known((enum hook_id)i);
		if (real == fn)
			return cuda_hooks[i].wrapper;
		if (!real)
			unknown = true;
	}
	if (!unknown)
		return fn;
	for (int i = 0; i < _HOOK_CUDA_MAX; i++) {
		int score;

		if (cuda_hooks[i].version > version || strcmp(cuda_hooks[i].proc, symbol) != 0)
			continue;
		if (cuda_hooks[i].ptds && !want_ptds)
			continue;
		/* The per-thread variant when asked for, else the newest version allowed. */
		score = (cuda_hooks[i].ptds ? 1000000 : 0) + cuda_hooks[i].version;
		if (score > best_score) {
			best = i;
			best_score = score;
		}
	}
	/* The table's choice is someone else's real function: not ours to wrap. */
	if (best < 0 || real_cuda_known((enum hook_id)best))
		return fn;
	real_cuda_learn((enum hook_id)best, fn);
	return cuda_hooks[best].wrapper;
}
