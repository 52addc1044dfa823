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
 * own at the same address, its current bytes copied over. */
static CUresult materialize(struct region *r)
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

	cr = CALL_REAL(cuMemCreate, &h, r->size, &prop, 0);
	if (cr != CUDA_SUCCESS)
		return cr;
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
	r->handle = h;
	return CUDA_SUCCESS;

fail_reserve:
	(void)CALL_REAL(cuMemAddressFree, tmp, r->size);
fail_create:
	(void)CALL_REAL(cuMemRelease, h);
	return cr;
}

int share_converted(uint64_t id)
{
	struct region *r;
	CUresult cr = CUDA_SUCCESS;
	int ret = 0;

	regions_lock();
	r = regions_get_locked(id);
	if (!r || r->kind != REGION_KIND_CONVERTED) {
		ret = -ENOENT;
		goto out;
	}
	if (r->scratch) {
		if (!r->priv) {
			shim_busy++;
			cr = materialize(r);
			shim_busy--;
		}
		if (cr != CUDA_SUCCESS) {
			log_debug("Region %" PRIu64 " stays on scratch (CUresult %d).", id,
				  (int)cr);
			ret = -EIO;
			goto out;
		}
		regions_unscratch_locked(r);
	}
	if (layout_class_counts(r->cls)) {
		r->cls = REGION_OTHER;
		regions_reannounce_locked(r);
	}
out:
	regions_unlock();
	return ret;
}
