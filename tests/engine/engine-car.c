/* SPDX-License-Identifier: MIT */
/*
 * --custom-all-reduce: vLLM's custom all-reduce setup (vllm/distributed/device_communicators/
 * custom_all_reduce.py, csrc/custom_all_reduce.cuh), as Belayer sees it. After the weights and
 * before the KV probe (vLLM: finalize_p2p(), "called collectively before
 * determine_available_memory()"), every rank allocates its buffer with cudaMalloc
 * (allocate_shared_buffer_and_handle: not the caching allocator), zeroes it, exports it with
 * cudaIpcGetMemHandle, the ranks exchange the handles, and each opens every peer's with
 * cudaIpcOpenMemHandle and keeps it open. A rank that cannot open a peer's buffer fails its
 * startup, as vLLM's worker does.
 *
 * Each rank then writes a mark into its own buffer and, after a collective, reads every
 * peer's mark through the peer's mapping: the buffers are really shared.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "engine.h"
#include "engine-gpu.h"
#include "log.h"

#define CAR_BUFFER_BYTES (8u << 20) /* a signal/meta buffer plus the data buffer of vLLM */
#define CAR_MAX_RANKS	 8

static uint32_t mark(uint32_t rank)
{
	return 0xca000000u | (rank + 1);
}

/* Every rank's handle in every rank: each writes its own slot of a zeroed buffer, a sum
 * all-reduce fills the others (vLLM exchanges them over its CPU group). */
static int exchange(struct engine *e, const CUipcMemHandle *mine, CUipcMemHandle *all)
{
	size_t bytes = (size_t)e->o.tp * sizeof(CUipcMemHandle);
	CUdeviceptr d = 0;
	ncclResult_t nr;
	CUresult cr;
	int r = -EIO;

	memset(all, 0, bytes);
	all[e->o.rank] = *mine;
	cr = gpu.cuMemAlloc(&d, bytes);
	if (cr != CUDA_SUCCESS)
		return log_error_errno(gpu_errno(cr), "custom all-reduce: %s", gpu_strerror(cr));
	if (gpu.cuMemcpyHtoD(d, all, bytes) == CUDA_SUCCESS) {
		nr = gpu.ncclAllReduce((void *)d, (void *)d, bytes, ncclUint8, ncclSum, e->m.comm,
				       gpu_stream());
		nr = gpu_nccl_wait(e->m.comm, nr);
		if (nr == ncclSuccess && gpu_sync() == 0 &&
		    gpu.cuMemcpyDtoH(all, d, bytes) == CUDA_SUCCESS)
			r = 0;
	}
	(void)gpu.cuMemFree(d);
	return r < 0 ? log_error_errno(r, "custom all-reduce: exchanging the IPC handles failed")
		     : 0;
}

int car_init(struct engine *e)
{
	CUipcMemHandle mine, all[CAR_MAX_RANKS];
	CUdeviceptr buf, peer[CAR_MAX_RANKS] = {0};
	uint32_t m = mark(e->o.rank);
	CUresult cr;
	int r;

	if (!e->o.custom_all_reduce || e->o.tp < 2)
		return 0;
	if (e->o.tp > CAR_MAX_RANKS)
		return log_error_errno(-EINVAL, "custom all-reduce: at most %d ranks",
				       CAR_MAX_RANKS);
	cr = gpu.cuMemAlloc(&buf, CAR_BUFFER_BYTES);
	if (cr == CUDA_SUCCESS)
		cr = gpu.cuMemsetD8(buf, 0, CAR_BUFFER_BYTES);
	if (cr == CUDA_SUCCESS)
		cr = gpu.cuIpcGetMemHandle(&mine, buf);
	if (cr != CUDA_SUCCESS)
		return log_error_errno(gpu_errno(cr), "custom all-reduce: buffer: %s",
				       gpu_strerror(cr));
	r = exchange(e, &mine, all);
	if (r < 0)
		return r;
	for (uint32_t i = 0; i < e->o.tp; i++) {
		if (i == e->o.rank)
			continue;
		cr = gpu.cuIpcOpenMemHandle(&peer[i], all[i], CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
		if (cr != CUDA_SUCCESS)
			return log_error_errno(gpu_errno(cr),
					       "custom all-reduce: opening rank %u's buffer: %s", i,
					       gpu_strerror(cr));
	}
	/* Marks: own buffer, a collective as the barrier, then every peer's through its
	 * mapping. */
	r = exchange(e, &mine, all);
	if (r < 0)
		return r;
	cr = gpu.cuMemcpyHtoD(buf, &m, sizeof(m));
	if (cr != CUDA_SUCCESS)
		return log_error_errno(gpu_errno(cr), "custom all-reduce: %s", gpu_strerror(cr));
	r = exchange(e, &mine, all);
	if (r < 0)
		return r;
	for (uint32_t i = 0; i < e->o.tp; i++) {
		uint32_t got = 0;

		if (i == e->o.rank)
			continue;
		cr = gpu.cuMemcpyDtoH(&got, peer[i], sizeof(got));
		if (cr != CUDA_SUCCESS || got != mark(i))
			return log_error_errno(
				-EIO,
				"custom all-reduce: rank %u's buffer reads %08" PRIx32
				", not %08" PRIx32 " (%s)",
				i, got, mark(i), gpu_strerror(cr));
	}
	log_info("Custom all-reduce: %u buffers of %u bytes shared over IPC", e->o.tp,
		 CAR_BUFFER_BYTES);
	return 0;
}
