/* SPDX-License-Identifier: MIT */
/*
 * Multicast objects (cuda.h 13.0, "Multicast Object Management"): the emulated device has no
 * NVLink switch, so it answers as a device without multicast support does. cuda.h: "Support
 * for multicast on a specific device can be queried using the device attribute
 * CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED" (0 here, cuda-init.c), and every entry point lists
 * CUDA_ERROR_NOT_SUPPORTED among its results. The entry points exist, as in every CUDA 12.1+
 * driver, so that cuGetProcAddress and dlsym find them (a program, or the shim's hooks, that
 * resolves them must get the driver's answer, not a missing symbol).
 */
#include "cuda-internal.h"

CUAPI CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle,
				 const CUmulticastObjectProp *prop)
{
	EMU_ENTER();
	if (!mcHandle || !prop)
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUAPI CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev)
{
	(void)mcHandle;
	(void)dev;
	EMU_ENTER();
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUAPI CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
				  CUmemGenericAllocationHandle memHandle, size_t memOffset,
				  size_t size, unsigned long long flags)
{
	(void)mcHandle, (void)mcOffset, (void)memHandle, (void)memOffset, (void)size, (void)flags;
	EMU_ENTER();
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUAPI CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
				   CUdeviceptr memptr, size_t size, unsigned long long flags)
{
	(void)mcHandle, (void)mcOffset, (void)memptr, (void)size, (void)flags;
	EMU_ENTER();
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUAPI CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
				 size_t mcOffset, size_t size)
{
	(void)mcHandle, (void)dev, (void)mcOffset, (void)size;
	EMU_ENTER();
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUAPI CUresult cuMulticastGetGranularity(size_t *granularity, const CUmulticastObjectProp *prop,
					 CUmulticastGranularity_flags option)
{
	(void)option;
	EMU_ENTER();
	if (!granularity || !prop)
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_ERROR_NOT_SUPPORTED;
}
