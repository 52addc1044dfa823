/* SPDX-License-Identifier: MIT */
/*
 * Memory shared with other processes is not the engine's weights or KV, whatever the phase
 * heuristic said: vLLM's custom all-reduce allocates its IPC buffers (cudaMalloc +
 * cudaIpcGetMemHandle) before the KV probe, so they come out as `weights` (review finding 1).
 * In a shadow such a region sat on scratch: the peers' cudaIpcOpenMemHandle failed (scratch has
 * no handle to export), or they would have shared the one aliased granule. At promotion it
 * would have been swapped for the dead primary's memory while the peers kept mapping the old
 * backing (finding 4). So, positively: the first export makes it `other` in every role — out
 * of the layout, never swapped, announced like any other region — and a shadow first gives it
 * real memory of its own, keeping what the program wrote so far.
 *
 * The same holds for the program's own cuMemCreate memory that it exports
 * (cuMemExportToShareableHandle: PyTorch's symmetric memory exports every buffer to its peers),
 * retains (cuMemRetainAllocationHandle: NCCL's buffer registration) or binds to a multicast
 * object (cuMulticastBindMem/Addr: NVLS). In a shadow such a weights/kv handle is a fake one
 * standing for scratch (shim-alloc.c); the driver must never see it (cuda.h documents only "If
 * handle is not a valid handle the behavior is undefined"): the first such call gives the
 * region real memory, and the fake handle stands for that memory from then on (backing), as
 * after a promotion. What the driver answers for the real memory is what the program gets,
 * except that a retain gives back the program's own (fake) handle value, as cuda.h promises
 * ("the same handle value used to map the memory").
 */
#include <errno.h>
#include <inttypes.h>

#include "layout.h"
#include "log.h"
#include "shim-device.h"
#include "shim-real.h"
#include "shim-regions.h"
#include "shim-share.h"
#include "shim-shadow-scratch.h"

/* With the regions lock and shim_busy held: replaces r's scratch with an allocation of its
 * own at the same address, its current bytes copied over (a user region not mapped yet only
 * gets the allocation). The new handle in *ret. */
static CUresult materialize(struct region *r, CUmemGenericAllocationHandle *ret)
{
	const struct dev_info *d = shim_device_info(r->dev);
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = r->dev},
		.allocFlags.gpuDirectRDMACapable = d && d->rdma_vmm, /* as convert() makes it */
	};
	CUmemGenericAllocationHandle h;
	CUdeviceptr tmp = 0;
	CUresult cr;

	if (r->kind == REGION_KIND_USER) {
		/* What the program asked for, exportable as any program allocation is made. */
		prop = r->prop;
		if (d && d->posix_fd)
			prop.requestedHandleTypes |= CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	}
	cr = CALL_REAL(cuMemCreate, &h, r->size, &prop, 0);
	if (cr != CUDA_SUCCESS && prop.requestedHandleTypes != r->prop.requestedHandleTypes &&
	    r->kind == REGION_KIND_USER)
		cr = CALL_REAL(cuMemCreate, &h, r->size, &r->prop, 0);
	if (cr != CUDA_SUCCESS)
		return cr;
	if (r->va == 0) {
		*ret = h;
		return CUDA_SUCCESS;
	}
	/* The bytes first, through a second mapping of the new memory. */
	cr = CALL_REAL(cuMemAddressReserve, &tmp, r->size, 0, 0, 0);
	if (cr != CUDA_SUCCESS)
		goto fail_create;
	cr = CALL_REAL(cuMemMap, tmp, r->size, 0, h, 0);
	if (cr != CUDA_SUCCESS)
		goto fail_reserve;
	cr = shim_set_access(tmp, r->size, r->dev);
	if (cr == CUDA_SUCCESS)
		cr = CALL_REAL(cuMemcpyDtoD_v2, tmp, r->va, r->size);
	(void)CALL_REAL(cuMemUnmap, tmp, r->size);
	(void)CALL_REAL(cuMemAddressFree, tmp, r->size);
	if (cr != CUDA_SUCCESS)
		goto fail_create;

	cr = shadow_scratch_unmap(r->dev, r->va, r->size);
	if (cr == CUDA_SUCCESS)
		cr = CALL_REAL(cuMemMap, r->va, r->size, 0, h, 0);
	if (cr == CUDA_SUCCESS)
		cr = shim_set_access(r->va, r->size, r->dev);
	if (cr != CUDA_SUCCESS) {
		/* Scratch back, so the program's address stays valid. */
		(void)CALL_REAL(cuMemUnmap, r->va, r->size);
		(void)shadow_scratch_map(r->dev, r->va, r->size);
		goto fail_create;
	}
	*ret = h;
	return CUDA_SUCCESS;

fail_reserve:
	(void)CALL_REAL(cuMemAddressFree, tmp, r->size);
fail_create:
	(void)CALL_REAL(cuMemRelease, h);
	return cr;
}

/* With the regions lock held: r is shared from now on. */
static int share_locked(struct region *r)
{
	CUmemGenericAllocationHandle h = 0;
	CUresult cr = CUDA_SUCCESS;

	if (r->scratch) {
		if (!r->priv) {
			shim_busy++;
			cr = materialize(r, &h);
			shim_busy--;
		}
		if (cr != CUDA_SUCCESS) {
			log_debug("Region %" PRIu64 " stays on scratch (CUresult %d).", r->id,
				  (int)cr);
			return -EIO;
		}
		if (h && r->kind == REGION_KIND_CONVERTED)
			r->handle = h;
		else if (h)
			r->backing = h; /* the program keeps its fake handle */
		regions_unscratch_locked(r);
	}
	if (layout_class_counts(r->cls)) {
		regions_set_class_locked(r, REGION_OTHER);
		regions_reannounce_locked(r);
	}
	return 0;
}

int share_converted(uint64_t id)
{
	struct region *r;
	int ret;

	regions_lock();
	r = regions_get_locked(id);
	ret = r && r->kind == REGION_KIND_CONVERTED ? share_locked(r) : -ENOENT;
	regions_unlock();
	return ret;
}

int share_handle(CUmemGenericAllocationHandle h, CUmemGenericAllocationHandle *ret_real)
{
	struct region *r;
	int ret = -ENOENT;

	regions_lock();
	r = regions_by_handle_locked(h);
	if (r && !r->released)
		ret = share_locked(r);
	if (ret == 0)
		*ret_real = r->backing ? r->backing : r->handle;
	regions_unlock();
	return ret;
}

int share_address(uint64_t va, CUmemGenericAllocationHandle *ret_fake)
{
	struct region *r;
	int ret = -ENOENT;

	*ret_fake = 0;
	regions_lock();
	r = regions_at_locked(va);
	if (r)
		ret = share_locked(r);
	if (ret == 0 && r->kind == REGION_KIND_USER && shadow_handle_is_fake(r->handle)) {
		*ret_fake = r->handle;
		r->retains++; /* the caller retains; its cuMemRelease drops this */
	}
	regions_unlock();
	return ret;
}

CUresult share_export(void *shareable, CUmemGenericAllocationHandle handle,
		      CUmemAllocationHandleType type, unsigned long long flags)
{
	PFN_cuMemExportToShareableHandle_v10020 real = REAL(cuMemExportToShareableHandle);
	CUmemGenericAllocationHandle h = handle;
	int r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (shim_busy)
		return real(shareable, handle, type, flags);
	r = share_handle(handle, &h);
	if (r == -EIO)
		return CUDA_ERROR_OUT_OF_MEMORY; /* no memory for it: as cuMemCreate would say */
	if (r < 0 && shadow_handle_is_fake(handle))
		return CUDA_ERROR_INVALID_VALUE; /* released, or never ours */
	return real(shareable, r == 0 ? h : handle, type, flags);
}

CUresult share_retain(CUmemGenericAllocationHandle *handle, void *addr)
{
	PFN_cuMemRetainAllocationHandle_v11000 real = REAL(cuMemRetainAllocationHandle);
	CUmemGenericAllocationHandle fake = 0;
	CUresult cr;
	int r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (shim_busy || !handle)
		return real(handle, addr);
	/* In a shadow the driver would give the scratch allocation's handle: never. */
	r = share_address((uint64_t)(uintptr_t)addr, &fake);
	if (r == -EIO)
		return CUDA_ERROR_OUT_OF_MEMORY;
	cr = real(handle, addr);
	if (fake && cr == CUDA_SUCCESS)
		*handle =
			fake; /* the driver's reference is on the backing, which fake stands for */
	else if (fake)
		(void)regions_user_unretain(fake);
	else if (cr == CUDA_SUCCESS && r == 0) {
		regions_lock();
		struct region *reg = regions_by_handle_locked(*handle);
		if (reg)
			reg->retains++;
		regions_unlock();
	}
	return cr;
}

CUresult share_get_properties(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)
{
	PFN_cuMemGetAllocationPropertiesFromHandle_v10020 real =
		REAL(cuMemGetAllocationPropertiesFromHandle);
	CUmemGenericAllocationHandle backing = 0;
	CUresult cr = CUDA_ERROR_INVALID_VALUE;
	struct region *r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (shim_busy || !prop || !shadow_handle_is_fake(handle))
		return real(prop, handle);
	/* A query: answered for the fake handle, nothing materialised. */
	regions_lock();
	r = regions_by_handle_locked(handle);
	if (r && r->backing)
		backing = r->backing;
	else if (r) {
		*prop = r->prop;
		cr = CUDA_SUCCESS;
	}
	regions_unlock();
	return backing ? real(prop, backing) : cr;
}

CUresult share_multicast_bind_mem(CUmemGenericAllocationHandle mc, size_t mc_offset,
				  CUmemGenericAllocationHandle mem, size_t mem_offset, size_t size,
				  unsigned long long flags)
{
	PFN_cuMulticastBindMem_v12010 real = REAL(cuMulticastBindMem);
	CUmemGenericAllocationHandle h = mem;
	int r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (shim_busy)
		return real(mc, mc_offset, mem, mem_offset, size, flags);
	r = share_handle(mem, &h);
	if (r == -EIO)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (r < 0 && shadow_handle_is_fake(mem))
		return CUDA_ERROR_INVALID_VALUE;
	return real(mc, mc_offset, r == 0 ? h : mem, mem_offset, size, flags);
}

CUresult share_multicast_bind_addr(CUmemGenericAllocationHandle mc, size_t mc_offset,
				   CUdeviceptr ptr, size_t size, unsigned long long flags)
{
	PFN_cuMulticastBindAddr_v12010 real = REAL(cuMulticastBindAddr);
	CUmemGenericAllocationHandle fake;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!shim_busy && share_address(ptr, &fake) == -EIO)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (!shim_busy && fake)
		(void)regions_user_unretain(fake); /* a binding, not a retain */
	return real(mc, mc_offset, ptr, size, flags);
}
