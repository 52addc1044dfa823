/* SPDX-License-Identifier: MIT */
/* The logic behind the CUDA memory wrappers (shim-alloc.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include <cuda.h>

CUresult shim_mem_alloc(CUdeviceptr *dptr, size_t bytesize, const void *caller);
CUresult shim_mem_free(CUdeviceptr dptr);
CUresult shim_mem_free_async(CUdeviceptr dptr, CUstream stream, bool ptsz);
CUresult shim_mem_get_address_range(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);
CUresult shim_mem_create(CUmemGenericAllocationHandle *handle, size_t size,
			 const CUmemAllocationProp *prop, unsigned long long flags,
			 const void *caller);
CUresult shim_mem_release(CUmemGenericAllocationHandle handle);
CUresult shim_mem_map(CUdeviceptr ptr, size_t size, size_t offset,
		      CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult shim_mem_unmap(CUdeviceptr ptr, size_t size);
CUresult shim_mem_address_free(CUdeviceptr ptr, size_t size);
CUresult shim_pointer_get_attribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr);
CUresult shim_pointer_get_attributes(unsigned int n, CUpointer_attribute *attrs, void **data,
				     CUdeviceptr ptr);
CUresult shim_mem_get_info(size_t *free_bytes, size_t *total_bytes);
void shim_note_write(CUdeviceptr dst, size_t len);
