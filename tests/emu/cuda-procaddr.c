/* SPDX-License-Identifier: MIT */
/*
 * cuGetProcAddress: one table, { base name, CUDA version from which the base name resolves to
 * the entry, stream variant, function }. Every entry is checked at compile time against its
 * cudaTypedefs.h PFN_<name>_v<ver> typedef, so a function listed under the wrong variant does
 * not build.
 *
 * The typedef's version is when the variant appeared, which is usually also when the base name
 * started to resolve to it (cuda.h's "#define cuMemAlloc cuMemAlloc_v2"). Not always: some
 * variants were added as APIs of their own, under their versioned name, and only cuda.h 13.0
 * made the base name mean them (R below); others are still APIs of their own, which the base
 * name never resolves to (cuCtxGetDevice_v2, cuCtxSynchronize_v2: cuda.h 13.0 has no define
 * for them), or stopped being public (cuCtxCreate_v3). A caller asking for the base name at a
 * version gets the function its own cuda.h of that version would have called by that name.
 */
#include <string.h>

#include <cudaTypedefs.h>

#include "cuda-internal.h"

#define EMU_DRIVER_VERSION 13000

enum variant {
	ANY, /* the only implementation: legacy and per-thread streams alike */
	PT,  /* the per-thread default stream variant (_ptds/_ptsz) */
};

struct entry {
	const char *name;
	int version;
	enum variant variant;
	void *fn;
};

#define CHECK(pfn, fn) (void *)(1 ? (fn) : (pfn)0)
#define E(name, ver, fn)                                        \
	{                                                       \
#name, ver, ANY, CHECK(PFN_##name##_v##ver, fn) \
	}
/* A variant the base name resolves to only from CUDA version `from`, later than the typedef's. */
#define R(name, ver, from, fn)                                   \
	{                                                        \
#name, from, ANY, CHECK(PFN_##name##_v##ver, fn) \
	}
#define PTDS(name, ver, fn)                                           \
	{                                                             \
#name, ver, PT, CHECK(PFN_##name##_v##ver##_ptds, fn) \
	}
#define PTSZ(name, ver, fn)                                           \
	{                                                             \
#name, ver, PT, CHECK(PFN_##name##_v##ver##_ptsz, fn) \
	}

static const struct entry table[] = {
	E(cuInit, 2000, cuInit),
	E(cuDriverGetVersion, 2020, cuDriverGetVersion),
	E(cuGetErrorName, 6000, cuGetErrorName),
	E(cuGetErrorString, 6000, cuGetErrorString),
	E(cuGetProcAddress, 11030, cuGetProcAddress),
	E(cuGetProcAddress, 12000, cuGetProcAddress_v2),
	E(cuGetExportTable, 3000, cuGetExportTable),

	E(cuDeviceGet, 2000, cuDeviceGet),
	E(cuDeviceGetCount, 2000, cuDeviceGetCount),
	E(cuDeviceGetName, 2000, cuDeviceGetName),
	E(cuDeviceGetUuid, 9020, cuDeviceGetUuid),
	/* cuda.h 11.4-12.9: "#define cuDeviceGetUuid_v2 cuDeviceGetUuid_v2"; 13.0 remaps the
	 * base name. */
	R(cuDeviceGetUuid, 11040, 13000, cuDeviceGetUuid_v2),
	E(cuDeviceTotalMem, 2000, cuDeviceTotalMem),
	E(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2),
	E(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute),
	E(cuDeviceGetPCIBusId, 4010, cuDeviceGetPCIBusId),
	E(cuDeviceGetByPCIBusId, 4010, cuDeviceGetByPCIBusId),
	E(cuDeviceGetDefaultMemPool, 11020, cuDeviceGetDefaultMemPool),
	E(cuDeviceGetMemPool, 11020, cuDeviceGetMemPool),

	E(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain),
	E(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease),
	E(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2),
	E(cuDevicePrimaryCtxReset, 7000, cuDevicePrimaryCtxReset),
	E(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2),
	E(cuDevicePrimaryCtxSetFlags, 7000, cuDevicePrimaryCtxSetFlags),
	E(cuDevicePrimaryCtxSetFlags, 11000, cuDevicePrimaryCtxSetFlags_v2),
	E(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState),

	E(cuCtxCreate, 2000, cuCtxCreate),
	E(cuCtxCreate, 3020, cuCtxCreate_v2),
	/* cuda.h up to 12.9: "#define cuCtxCreate cuCtxCreate_v2", with _v3 (11.4) and _v4 (12.5)
	 * as APIs of their own; 13.0: "#define cuCtxCreate cuCtxCreate_v4", _v3 gone. */
	R(cuCtxCreate, 12050, 13000, cuCtxCreate_v4),
	E(cuCtxDestroy, 2000, cuCtxDestroy),
	E(cuCtxDestroy, 4000, cuCtxDestroy_v2),
	E(cuCtxPushCurrent, 2000, cuCtxPushCurrent),
	E(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2),
	E(cuCtxPopCurrent, 2000, cuCtxPopCurrent),
	E(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2),
	E(cuCtxSetCurrent, 4000, cuCtxSetCurrent),
	E(cuCtxGetCurrent, 4000, cuCtxGetCurrent),
	E(cuCtxGetDevice, 2000, cuCtxGetDevice),
	E(cuCtxGetFlags, 7000, cuCtxGetFlags),
	E(cuCtxGetApiVersion, 3020, cuCtxGetApiVersion),
	E(cuCtxSynchronize, 2000, cuCtxSynchronize),
	E(cuCtxGetStreamPriorityRange, 5050, cuCtxGetStreamPriorityRange),

	E(cuMemAlloc, 2000, cuMemAlloc),
	E(cuMemAlloc, 3020, cuMemAlloc_v2),
	E(cuMemFree, 2000, cuMemFree),
	E(cuMemFree, 3020, cuMemFree_v2),
	E(cuMemGetInfo, 2000, cuMemGetInfo),
	E(cuMemGetInfo, 3020, cuMemGetInfo_v2),
	E(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2),
	E(cuMemAllocAsync, 11020, cuMemAllocAsync),
	PTSZ(cuMemAllocAsync, 11020, cuMemAllocAsync_ptsz),
	E(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync),
	PTSZ(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync_ptsz),
	E(cuMemFreeAsync, 11020, cuMemFreeAsync),
	PTSZ(cuMemFreeAsync, 11020, cuMemFreeAsync_ptsz),
	E(cuPointerGetAttribute, 4000, cuPointerGetAttribute),
	E(cuPointerGetAttributes, 7000, cuPointerGetAttributes),

	E(cuMemcpy, 4000, cuMemcpy),
	PTDS(cuMemcpy, 7000, cuMemcpy_ptds),
	E(cuMemcpyAsync, 4000, cuMemcpyAsync),
	PTSZ(cuMemcpyAsync, 7000, cuMemcpyAsync_ptsz),
	E(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2),
	PTDS(cuMemcpyHtoD, 7000, cuMemcpyHtoD_v2_ptds),
	E(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2),
	PTDS(cuMemcpyDtoH, 7000, cuMemcpyDtoH_v2_ptds),
	E(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2),
	PTDS(cuMemcpyDtoD, 7000, cuMemcpyDtoD_v2_ptds),
	E(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2),
	PTSZ(cuMemcpyHtoDAsync, 7000, cuMemcpyHtoDAsync_v2_ptsz),
	E(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2),
	PTSZ(cuMemcpyDtoHAsync, 7000, cuMemcpyDtoHAsync_v2_ptsz),
	E(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2),
	PTSZ(cuMemcpyDtoDAsync, 7000, cuMemcpyDtoDAsync_v2_ptsz),
	E(cuMemsetD8, 3020, cuMemsetD8_v2),
	PTDS(cuMemsetD8, 7000, cuMemsetD8_v2_ptds),
	E(cuMemsetD16, 3020, cuMemsetD16_v2),
	PTDS(cuMemsetD16, 7000, cuMemsetD16_v2_ptds),
	E(cuMemsetD32, 3020, cuMemsetD32_v2),
	PTDS(cuMemsetD32, 7000, cuMemsetD32_v2_ptds),
	E(cuMemsetD8Async, 3020, cuMemsetD8Async),
	PTSZ(cuMemsetD8Async, 7000, cuMemsetD8Async_ptsz),
	E(cuMemsetD16Async, 3020, cuMemsetD16Async),
	PTSZ(cuMemsetD16Async, 7000, cuMemsetD16Async_ptsz),
	E(cuMemsetD32Async, 3020, cuMemsetD32Async),
	PTSZ(cuMemsetD32Async, 7000, cuMemsetD32Async_ptsz),

	E(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity),
	E(cuMemCreate, 10020, cuMemCreate),
	E(cuMemRelease, 10020, cuMemRelease),
	E(cuMemAddressReserve, 10020, cuMemAddressReserve),
	E(cuMemAddressFree, 10020, cuMemAddressFree),
	E(cuMemMap, 10020, cuMemMap),
	E(cuMemUnmap, 10020, cuMemUnmap),
	E(cuMemSetAccess, 10020, cuMemSetAccess),
	E(cuMemGetAccess, 10020, cuMemGetAccess),
	E(cuMemExportToShareableHandle, 10020, cuMemExportToShareableHandle),
	E(cuMemImportFromShareableHandle, 10020, cuMemImportFromShareableHandle),
	E(cuMemGetAllocationPropertiesFromHandle, 10020, cuMemGetAllocationPropertiesFromHandle),
	E(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle),

	E(cuMulticastCreate, 12010, cuMulticastCreate),
	E(cuMulticastAddDevice, 12010, cuMulticastAddDevice),
	E(cuMulticastBindMem, 12010, cuMulticastBindMem),
	E(cuMulticastBindAddr, 12010, cuMulticastBindAddr),
	E(cuMulticastUnbind, 12010, cuMulticastUnbind),
	E(cuMulticastGetGranularity, 12010, cuMulticastGetGranularity),

	E(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle),
	E(cuIpcOpenMemHandle, 4010, cuIpcOpenMemHandle),
	E(cuIpcOpenMemHandle, 11000, cuIpcOpenMemHandle_v2),
	E(cuIpcCloseMemHandle, 4010, cuIpcCloseMemHandle),

	E(cuStreamCreate, 2000, cuStreamCreate),
	E(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority),
	E(cuStreamDestroy, 2000, cuStreamDestroy),
	E(cuStreamDestroy, 4000, cuStreamDestroy_v2),
	E(cuStreamSynchronize, 2000, cuStreamSynchronize),
	PTSZ(cuStreamSynchronize, 7000, cuStreamSynchronize_ptsz),
	E(cuStreamQuery, 2000, cuStreamQuery),
	PTSZ(cuStreamQuery, 7000, cuStreamQuery_ptsz),
	E(cuStreamWaitEvent, 3020, cuStreamWaitEvent),
	PTSZ(cuStreamWaitEvent, 7000, cuStreamWaitEvent_ptsz),
	E(cuStreamGetFlags, 5050, cuStreamGetFlags),
	PTSZ(cuStreamGetFlags, 7000, cuStreamGetFlags_ptsz),
	E(cuStreamGetId, 12000, cuStreamGetId),
	PTSZ(cuStreamGetId, 12000, cuStreamGetId_ptsz),
	/* The one-argument cuStreamBeginCapture of CUDA 10.0 is not emulated. */
	E(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2),
	PTSZ(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2_ptsz),
	E(cuStreamEndCapture, 10000, cuStreamEndCapture),
	PTSZ(cuStreamEndCapture, 10000, cuStreamEndCapture_ptsz),
	E(cuStreamIsCapturing, 10000, cuStreamIsCapturing),
	PTSZ(cuStreamIsCapturing, 10000, cuStreamIsCapturing_ptsz),
	/* Only the CUDA 12.3 form (with edge data); older callers get VERSION_NOT_SUFFICIENT. */
	E(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3),
	PTSZ(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3_ptsz),
	E(cuThreadExchangeStreamCaptureMode, 10010, cuThreadExchangeStreamCaptureMode),
	E(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags),
	E(cuGraphLaunch, 10000, cuGraphLaunch),
	PTSZ(cuGraphLaunch, 10000, cuGraphLaunch_ptsz),
	E(cuGraphExecDestroy, 10000, cuGraphExecDestroy),
	E(cuGraphDestroy, 10000, cuGraphDestroy),
	E(cuLaunchHostFunc, 10000, cuLaunchHostFunc),
	PTSZ(cuLaunchHostFunc, 10000, cuLaunchHostFunc_ptsz),
	E(cuEventCreate, 2000, cuEventCreate),
	E(cuEventRecord, 2000, cuEventRecord),
	PTSZ(cuEventRecord, 7000, cuEventRecord_ptsz),
	E(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags),
	PTSZ(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags_ptsz),
	E(cuEventQuery, 2000, cuEventQuery),
	E(cuEventSynchronize, 2000, cuEventSynchronize),
	E(cuEventDestroy, 2000, cuEventDestroy),
	E(cuEventDestroy, 4000, cuEventDestroy_v2),
	E(cuEventElapsedTime, 2000, cuEventElapsedTime),
	/* _v2 appeared in 12.8 as an API of its own; 13.0 remaps the base name. */
	R(cuEventElapsedTime, 12080, 13000, cuEventElapsedTime_v2),

	E(cuModuleLoadData, 2000, cuModuleLoadData),
	E(cuModuleLoadDataEx, 2010, cuModuleLoadDataEx),
	E(cuModuleUnload, 2000, cuModuleUnload),
	E(cuModuleGetFunction, 2000, cuModuleGetFunction),
	E(cuLibraryLoadData, 12000, cuLibraryLoadData),
	E(cuLibraryUnload, 12000, cuLibraryUnload),
	E(cuLibraryGetKernel, 12000, cuLibraryGetKernel),
	E(cuKernelGetFunction, 12000, cuKernelGetFunction),
	E(cuFuncGetAttribute, 2020, cuFuncGetAttribute),
	E(cuLaunchKernel, 4000, cuLaunchKernel),
	PTSZ(cuLaunchKernel, 7000, cuLaunchKernel_ptsz),
};

/* The entry for symbol at cudaVersion: the newest one introduced at or before it, of the
 * per-thread variant when asked for and one exists, else the legacy one. */
static CUresult lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
		       CUdriverProcAddressQueryResult *symbolStatus)
{
	const struct entry *best = NULL, *best_pt = NULL;
	bool known = false;
	bool per_thread;

	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	/* "If the specified CUDA version is greater than the driver version, the API will
	 * return CUDA_ERROR_INVALID_VALUE." */
	if (cudaVersion > EMU_DRIVER_VERSION)
		return CUDA_ERROR_INVALID_VALUE;
	if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
				  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
		return CUDA_ERROR_INVALID_VALUE;
	/* DEFAULT means legacy unless the caller was built for per-thread streams, which
	 * cuda.h expresses by passing PER_THREAD_DEFAULT_STREAM itself (cuGetProcAddress_v2_ptsz
	 * there); LEGACY wins when both are set. */
	per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) &&
		     !(flags & CU_GET_PROC_ADDRESS_LEGACY_STREAM);

	for (size_t i = 0; i < ARRAY_SIZE(table); i++) {
		const struct entry *e = &table[i];
		if (strcmp(e->name, symbol) != 0)
			continue;
		known = true;
		if (e->version > cudaVersion)
			continue;
		if (e->variant == PT) {
			if (!best_pt || e->version > best_pt->version)
				best_pt = e;
		} else if (!best || e->version > best->version)
			best = e;
	}
	if (per_thread && best_pt)
		best = best_pt;
	*pfn = best ? best->fn : NULL;
	if (symbolStatus)
		*symbolStatus = best	? CU_GET_PROC_ADDRESS_SUCCESS
				: known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
					: CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	/* "The API will return CUDA_SUCCESS and set the returned pfn to NULL if the requested
	 * driver function is not supported on the platform, no ABI compatible driver function
	 * exists for the specified cudaVersion or if the driver symbol is invalid." */
	return CUDA_SUCCESS;
}

/* cuGetProcAddress before CUDA 12 (no status argument) keeps the unversioned name. */
CUAPI CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	CUresult r = emu_fault_check(__func__);

	if (r != CUDA_SUCCESS)
		return r;
	return lookup(symbol, pfn, cudaVersion, flags, NULL);
}

/* Usable before cuInit: that is how the CUDA runtime finds cuInit itself. */
CUAPI CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
				   cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
	CUresult r = emu_fault_check(__func__);

	if (r != CUDA_SUCCESS)
		return r;
	return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUAPI CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
	CUresult r = emu_fault_check(__func__);

	if (r != CUDA_SUCCESS)
		return r;
	/* The private tables libcudart asks for are undocumented; DESIGN §5. */
	if (ppExportTable)
		*ppExportTable = NULL;
	return CUDA_ERROR_NOT_SUPPORTED;
}
