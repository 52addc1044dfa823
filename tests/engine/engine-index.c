/* SPDX-License-Identifier: MIT */
/*
 * --index-tables: the block table and the slot mapping as large allocations of their own,
 * right after the KV cache, as vLLM's (a CpuGpuBuffer of max_num_reqs x max_num_blocks_per_req
 * int32: 8 MiB at 1024 sequences x 32k tokens / 16) and SGLang's (req_to_token, the free-slot
 * list next to the KV buffers). Each step copies its tables there from the step buffer and the
 * kernels read them there; after the step the engine reads them back and fails the step if
 * they no longer hold what it wrote. A real engine reading a clobbered table faults or
 * computes garbage (an illegal address, a block of another sequence); the stand-in's kernels
 * wrap block ids modulo the arena, so the check is what makes it visible (review finding 2).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "engine-alloc.h"
#include "engine-gpu.h"
#include "engine-model.h"
#include "log.h"
#include "util.h"

/* Each request above PyTorch's kSmallSize (1 MiB) comes from the large pool: both tables share
 * one 20 MiB segment, as vLLM's few-MiB tables do. */
#define INDEX_MIN_BYTES (3ull << 20)

int model_alloc_index(struct model *m, uint32_t max_tokens, uint32_t max_rows, uint32_t block_size)
{
	uint64_t max_blocks = (m->c.max_pos + block_size - 1) / block_size;
	int r;

	m->bt_bytes = MAX(4ull * max_rows * max_blocks, INDEX_MIN_BYTES);
	m->slot_bytes = MAX(4ull * max_tokens, INDEX_MIN_BYTES);
	r = dev_alloc(DEV_POOL_DEFAULT, &m->bt, m->bt_bytes);
	r = r ?: dev_alloc(DEV_POOL_DEFAULT, &m->slot_map, m->slot_bytes);
	if (r < 0)
		return log_error_errno(r, "Allocating the index tables: %m");
	return 0;
}

static int d2d(CUdeviceptr dst, CUdeviceptr src, uint64_t bytes)
{
	CUresult cr = gpu.cuMemcpyDtoD(dst, src, bytes);

	if (cr != CUDA_SUCCESS)
		return log_error_errno(gpu_errno(cr), "D2D of an index table failed: %s",
				       gpu_strerror(cr));
	return 0;
}

int model_stage_index(struct model *m, uint32_t ntok, uint32_t nrows, uint32_t nsample)
{
	struct step_layout sl;
	int r;

	if (!m->bt)
		return 0;
	step_layout(m, ntok, nrows, nsample, &sl);
	/* the step buffer was written on the engine's stream (H2D, or a follower's broadcast) */
	r = gpu_sync();
	r = r ?: d2d(m->slot_map, m->step + sl.slots, 4ull * ntok);
	r = r ?: d2d(m->bt, m->step + sl.block_tables, 4ull * nrows * m->max_blocks);
	return r;
}

static int same(CUdeviceptr table, CUdeviceptr want, uint64_t bytes, const char *what)
{
	_cleanup_free_ uint8_t *a = malloc(bytes), *b = malloc(bytes);
	CUresult cr;

	if (!a || !b)
		return -ENOMEM;
	cr = gpu.cuMemcpyDtoH(a, table, bytes);
	if (cr == CUDA_SUCCESS)
		cr = gpu.cuMemcpyDtoH(b, want, bytes);
	if (cr != CUDA_SUCCESS)
		return log_error_errno(gpu_errno(cr), "D2H of the %s failed: %s", what,
				       gpu_strerror(cr));
	if (memcmp(a, b, bytes) != 0)
		return log_error_errno(-EIO,
				       "The %s at 0x%llx no longer holds what the step wrote there "
				       "(device memory aliased?)",
				       what, (unsigned long long)table);
	return 0;
}

int model_check_index(struct model *m, uint32_t ntok, uint32_t nrows, uint32_t nsample)
{
	struct step_layout sl;
	int r;

	if (!m->bt)
		return 0;
	step_layout(m, ntok, nrows, nsample, &sl);
	r = same(m->slot_map, m->step + sl.slots, 4ull * ntok, "slot mapping");
	r = r
		    ?: same(m->bt, m->step + sl.block_tables, 4ull * nrows * m->max_blocks,
			    "block table");
	return r;
}
