/* SPDX-License-Identifier: MIT */
/*
 * The logic behind the memory wrappers: making allocations exportable and keeping the region
 * records. Whatever the shim cannot do, it leaves to the driver: a conversion that fails for
 * any reason falls back to the real cuMemAlloc_v2, and a cuMemCreate that the driver refuses
 * with our extra handle type is retried exactly as the program asked.
 */
#include <pthread.h>
#include <string.h>

#include "log.h"
#include "shim-alloc.h"
#include "shim-classify.h"
#include "shim-meminfo.h"
#include "shim-config.h"
#include "shim-conn.h"
#include "shim-device.h"
#include "shim-real.h"
#include "shim-regions.h"
#include "shim-shadow-scratch.h"
#include "util.h"

/* Serves a cuMemAlloc_v2 with reserve + create (exportable) + map + set access. */
static CUresult convert(CUdeviceptr *dptr, size_t bytesize, const void *caller)
{
	const struct real_extra *x = real_extra();
	PFN_cuMemAddressReserve_v10020 reserve = REAL(cuMemAddressReserve);
	PFN_cuMemAddressFree_v10020 addr_free = REAL(cuMemAddressFree);
	PFN_cuMemCreate_v10020 create = REAL(cuMemCreate);
	PFN_cuMemRelease_v10020 release = REAL(cuMemRelease);
	PFN_cuMemMap_v10020 map = REAL(cuMemMap);
	PFN_cuMemUnmap_v10020 unmap = REAL(cuMemUnmap);
	const struct dev_info *d;
	CUmemGenericAllocationHandle h;
	enum region_class cls;
	CUdeviceptr va = 0;
	CUdevice dev;
	size_t size;
	CUresult r;

	if (!x->cuCtxGetDevice || !reserve || !addr_free || !create || !release || !map || !unmap ||
	    !REAL(cuMemSetAccess))
		return CUDA_ERROR_NOT_SUPPORTED;
	r = x->cuCtxGetDevice(&dev);
	if (r != CUDA_SUCCESS)
		return r;
	d = shim_device_info(dev);
	if (!d || !d->posix_fd || d->granularity == 0)
		return CUDA_ERROR_NOT_SUPPORTED;
	size = (bytesize + d->granularity - 1) / d->granularity * d->granularity;

	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
		/* cudaMalloc memory is GPUDirect-RDMA capable; VMM memory only with this flag
		 * (NIXL/UCX, NCCL-IB registration of KV and activations: review finding 9). */
		.allocFlags.gpuDirectRDMACapable = d->rdma_vmm,
	};
	r = reserve(&va, size, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		return r;
	cls = classify_region(caller, bytesize);
	if (shadow_wants_scratch(cls) && size > shim_config()->private_max) {
		/* Same reservation and size as a primary's, so the layouts match; scratch inside. */
		r = shadow_scratch_map(dev, va, size);
		if (r != CUDA_SUCCESS)
			goto fail_reserve;
		if (regions_add_converted(0, dev, va, size, bytesize, cls, false, true, false) <
		    0) {
			(void)shadow_scratch_unmap(dev, va, size);
			r = CUDA_ERROR_OUT_OF_MEMORY;
			goto fail_reserve;
		}
		*dptr = va;
		return CUDA_SUCCESS;
	}
	r = create(&h, size, &prop, 0);
	if (r != CUDA_SUCCESS)
		goto fail_reserve;
	r = map(va, size, 0, h, 0);
	if (r != CUDA_SUCCESS)
		goto fail_create;
	r = shim_set_access(va, size, dev);
	if (r != CUDA_SUCCESS)
		goto fail_map;
	/* A small shadow weights/kv region gets memory of its own: engines keep index buffers
	 * (token ids, positions, block tables) in such allocations made before the KV probe,
	 * and a shadow computing on aliased indices would fault before it ever parks. It is
	 * still a layout entry and is swapped for the primary's memory at promotion. */
	if (regions_add_converted(h, dev, va, size, bytesize, cls, !shadow_wants_scratch(cls),
				  shadow_wants_scratch(cls), shadow_wants_scratch(cls)) < 0) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail_map;
	}
	*dptr = va;
	return CUDA_SUCCESS;

fail_map:
	(void)unmap(va, size);
fail_create:
	(void)release(h);
fail_reserve:
	(void)addr_free(va, size);
	return r;
}

CUresult shim_mem_alloc(CUdeviceptr *dptr, size_t bytesize, const void *caller)
{
	PFN_cuMemAlloc_v3020 real = REAL(cuMemAlloc_v2);
	const struct shim_config *c;
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	c = shim_config();
	if (shim_busy || bytesize < c->alloc_threshold || c->policy != ALLOC_POLICY_VMM || !dptr)
		return real(dptr, bytesize);

	conn_start();
	shim_busy++;
	r = convert(dptr, bytesize, caller);
	shim_busy--;
	if (r == CUDA_SUCCESS)
		return r;
	log_debug("Could not serve a %zu-byte cuMemAlloc with VMM (error %d), passing it through.",
		  bytesize, (int)r);
	return real(dptr, bytesize);
}

/* cudaFree synchronizes; so does the shim before it unmaps memory kernels may still use. */
static CUresult free_converted(CUdeviceptr dptr, PFN_cuMemFree_v3020 real)
{
	struct region r;
	int ret;

	ret = regions_remove_converted(dptr, &r);
	if (ret == -EINVAL)
		return CUDA_ERROR_INVALID_VALUE; /* an interior pointer, as the driver says */
	if (ret < 0)
		return real(dptr);

	shim_busy++;
	if (real_extra()->cuCtxSynchronize)
		(void)real_extra()->cuCtxSynchronize();
	if (r.scratch && !r.priv)
		(void)shadow_scratch_unmap(r.dev, r.va, r.size);
	else {
		(void)CALL_REAL(cuMemUnmap, r.va, r.size);
		(void)CALL_REAL(cuMemRelease, r.handle);
	}
	(void)CALL_REAL(cuMemAddressFree, r.va, r.size);
	shim_busy--;
	classify_note_tracked_free();
	return CUDA_SUCCESS;
}

CUresult shim_mem_free(CUdeviceptr dptr)
{
	PFN_cuMemFree_v3020 real = REAL(cuMemFree_v2);

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (shim_busy || !regions_is_converted(dptr))
		return real(dptr);
	return free_converted(dptr, real);
}

CUresult shim_mem_free_async(CUdeviceptr dptr, CUstream stream, bool ptsz)
{
	const struct real_extra *x;
	PFN_cuMemFreeAsync_v11020 real = ptsz ? REAL(cuMemFreeAsync_ptsz) : REAL(cuMemFreeAsync);
	PFN_cuMemFree_v3020 real_free = REAL(cuMemFree_v2);

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (shim_busy || !real_free || !regions_is_converted(dptr))
		return real(dptr, stream);
	/* Our memory is not the pool's: wait for the stream's work, then free it now. */
	x = real_extra();
	shim_busy++;
	if (ptsz && x->cuStreamSynchronize_ptsz)
		(void)x->cuStreamSynchronize_ptsz(stream);
	else if (x->cuStreamSynchronize)
		(void)x->cuStreamSynchronize(stream);
	shim_busy--;
	return free_converted(dptr, real_free);
}

CUresult shim_mem_get_address_range(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	PFN_cuMemGetAddressRange_v3020 real = REAL(cuMemGetAddressRange_v2);
	uint64_t base, size;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!shim_busy && regions_converted_range(dptr, &base, &size) == 0) {
		if (pbase)
			*pbase = base;
		if (psize)
			*psize = size;
		return CUDA_SUCCESS;
	}
	return real(pbase, psize, dptr);
}

/* What the driver says of cudaMalloc memory, where it differs from what it says of the VMM
 * memory we serve it with: the allocation's own range, legacy-IPC capable (the shim serves
 * that, shim-ipc.c). The shareable handle types are the VMM memory's own, reported as they
 * are: a POSIX fd is what an importer outside the shim can open (UCX picks its transport by
 * them). */
static void patch_attribute(CUpointer_attribute attr, void *data, uint64_t base, uint64_t size)
{
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = base;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = size;
		break;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
		*(int *)data = 1;
		break;
	default:
		break;
	}
}

CUresult shim_pointer_get_attribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr)
{
	PFN_cuPointerGetAttribute_v4000 real = REAL(cuPointerGetAttribute);
	uint64_t base, size;
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = real(data, attr, ptr);
	if (r == CUDA_SUCCESS && data && !shim_busy &&
	    regions_converted_range(ptr, &base, &size) == 0)
		patch_attribute(attr, data, base, size);
	return r;
}

CUresult shim_pointer_get_attributes(unsigned int n, CUpointer_attribute *attrs, void **data,
				     CUdeviceptr ptr)
{
	PFN_cuPointerGetAttributes_v7000 real = REAL(cuPointerGetAttributes);
	uint64_t base, size;
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = real(n, attrs, data, ptr);
	if (r == CUDA_SUCCESS && attrs && data && !shim_busy &&
	    regions_converted_range(ptr, &base, &size) == 0)
		for (unsigned int i = 0; i < n; i++)
			if (data[i])
				patch_attribute(attrs[i], data[i], base, size);
	return r;
}

CUresult shim_mem_create(CUmemGenericAllocationHandle *handle, size_t size,
			 const CUmemAllocationProp *prop, unsigned long long flags,
			 const void *caller)
{
	PFN_cuMemCreate_v10020 real = REAL(cuMemCreate);
	const struct dev_info *d;
	CUmemAllocationProp p;
	enum region_class cls;
	bool exportable;
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (shim_busy || !handle || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return real(handle, size, prop, flags);

	conn_start();
	shim_busy++;
	d = shim_device_info(prop->location.id);
	shim_busy--;
	cls = classify_region(caller, size);
	if (shadow_wants_scratch(cls)) {
		size_t g = shadow_granularity(prop->location.id);

		/* A handle of nothing: cuMemMap of it maps scratch (shim_mem_map). Sizes are
		 * checked as the driver would, so the program sees the same errors. */
		if (g == 0)
			goto real_create;
		if (size == 0 || size % g)
			return CUDA_ERROR_INVALID_VALUE;
		*handle = shadow_fake_handle();
		if (regions_add_user(*handle, prop->location.id, size, cls, false, true, prop) < 0)
			return CUDA_ERROR_OUT_OF_MEMORY;
		return CUDA_SUCCESS;
	}
real_create:
	p = *prop;
	if (d && d->posix_fd)
		p.requestedHandleTypes |= CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	exportable = p.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

	r = real(handle, size, &p, flags);
	if (r != CUDA_SUCCESS && p.requestedHandleTypes != prop->requestedHandleTypes) {
		exportable = false;
		r = real(handle, size, prop, flags);
	}
	if (r != CUDA_SUCCESS)
		return r;
	if (regions_add_user(*handle, prop->location.id, size, cls, exportable, false, NULL) < 0)
		log_debug("Out of memory tracking a cuMemCreate handle, ignoring.");
	return r;
}

CUresult shim_mem_release(CUmemGenericAllocationHandle handle)
{
	PFN_cuMemRelease_v10020 real = REAL(cuMemRelease);
	CUmemGenericAllocationHandle backing;
	bool retained;
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!shim_busy && shadow_handle_is_fake(handle)) {
		/* Promoted: the memory the fake handle stands for is released as the program
		 * asks (it stays while mapped, as any released handle). */
		backing = regions_user_backing(handle);
		if (!backing && !regions_user_is_scratch(handle))
			return CUDA_ERROR_INVALID_VALUE;
		if (backing) {
			shim_busy++;
			r = real(backing);
			shim_busy--;
			if (r != CUDA_SUCCESS)
				return r;
		}
		/* A retain's reference (shim-share.c) goes first; the creation's last. */
		if (!regions_user_unretain(handle))
			regions_user_released(handle);
		return CUDA_SUCCESS;
	}
	if (shim_busy)
		return real(handle);
	retained = regions_user_unretain(handle);
	r = real(handle);
	if (r == CUDA_SUCCESS && !retained)
		regions_user_released(handle);
	return r;
}

CUresult shim_mem_map(CUdeviceptr ptr, size_t size, size_t offset,
		      CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	PFN_cuMemMap_v10020 real = REAL(cuMemMap);
	CUmemGenericAllocationHandle backing;
	CUdevice dev;
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!shim_busy && shadow_handle_is_fake(handle)) {
		backing = regions_user_backing(handle);
		if (backing) {
			r = real(ptr, size, offset, backing, flags);
		} else if (!regions_user_is_scratch(handle)) {
			return CUDA_ERROR_INVALID_VALUE;
		} else if (offset != 0 || flags != 0) {
			return CUDA_ERROR_INVALID_VALUE;
		} else {
			/* The device of the handle's region; the current one as a fallback. */
			dev = 0;
			if (real_extra()->cuCtxGetDevice)
				(void)real_extra()->cuCtxGetDevice(&dev);
			shim_busy++;
			r = shadow_scratch_map(regions_user_device(handle, dev), ptr, size);
			shim_busy--;
		}
		if (r == CUDA_SUCCESS)
			regions_user_mapped(handle, ptr);
		return r;
	}
	r = real(ptr, size, offset, handle, flags);
	if (r == CUDA_SUCCESS && !shim_busy)
		regions_user_mapped(handle, ptr);
	return r;
}

CUresult shim_mem_unmap(CUdeviceptr ptr, size_t size)
{
	PFN_cuMemUnmap_v10020 real = REAL(cuMemUnmap);
	CUresult r;
	int dev;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!shim_busy && regions_user_scratch_at(ptr, &dev)) {
		shim_busy++;
		r = shadow_scratch_unmap(dev, ptr, size);
		shim_busy--;
		if (r == CUDA_SUCCESS)
			regions_user_unmapped(ptr, size);
		return r;
	}
	r = real(ptr, size);
	if (r == CUDA_SUCCESS && !shim_busy)
		regions_user_unmapped(ptr, size);
	return r;
}

CUresult shim_mem_address_free(CUdeviceptr ptr, size_t size)
{
	PFN_cuMemAddressFree_v10020 real = REAL(cuMemAddressFree);
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = real(ptr, size);
	/* The reservation is gone: a later one at the same address is other memory. */
	if (r == CUDA_SUCCESS && !shim_busy)
		regions_forget_va(ptr, size);
	return r;
}

CUresult shim_mem_get_info(size_t *free_bytes, size_t *total_bytes)
{
	PFN_cuMemGetInfo_v3020 real = REAL(cuMemGetInfo_v2);
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = real(free_bytes, total_bytes);
	if (r == CUDA_SUCCESS && !shim_busy) {
		const struct real_extra *x = real_extra();
		CUdevice dev = -1;

		shim_busy++;
		if (!x->cuCtxGetDevice || x->cuCtxGetDevice(&dev) != CUDA_SUCCESS)
			dev = -1;
		shim_busy--;
		meminfo_answer(dev, free_bytes, total_bytes);
		classify_note_mem_get_info();
	}
	return r;
}

void shim_note_write(CUdeviceptr dst, size_t len)
{
	if (shim_busy || !classify_load_done() || !regions_have_weights())
		return;
	regions_note_write(dst, len);
}
