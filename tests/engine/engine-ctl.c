/* SPDX-License-Identifier: MIT */
/*
 * The control plane of a tensor-parallel group: rank 0 broadcasts each operation (a step's
 * batch, a weight update) over the group's NCCL communicator, and every rank executes it,
 * so all ranks run the same kernels and collectives in the same order. vLLM's workers get the
 * scheduler's output from the driver process the same way, once per step.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <stdlib.h>

#include "engine.h"
#include "engine-alloc.h"
#include "engine-gpu.h"
#include "log.h"
#include "util.h"

static CUdeviceptr dctl;

int ctl_init(struct engine *e)
{
	if (e->o.tp == 1)
		return 0;
	return dev_alloc(DEV_POOL_DEFAULT, &dctl, sizeof(struct ctl));
}

static int bcast(struct engine *e, CUdeviceptr buf, uint64_t bytes)
{
	ncclResult_t nr = gpu.ncclBroadcast((const void *)buf, (void *)buf, bytes, ncclUint8, 0,
					    e->m.comm, gpu_stream());

	nr = gpu_nccl_wait(e->m.comm, nr);
	if (nr != ncclSuccess)
		return log_error_errno(-EIO, "ncclBroadcast failed: %s",
				       gpu.ncclGetErrorString(nr));
	return gpu_sync();
}

static int h2d(CUdeviceptr dst, const void *src, uint64_t bytes)
{
	CUresult r = gpu.cuMemcpyHtoD(dst, src, bytes);

	if (r != CUDA_SUCCESS)
		return log_error_errno(gpu_errno(r), "H2D failed: %s", gpu_strerror(r));
	return 0;
}

/* Receives the trainer's broadcast of each listed tensor (the trainer is rank 0 of the update
 * group, this rank is rank_offset + rank) into the existing weight tensors: directly when the
 * tensor is not sharded, else into a staging buffer whose slice this rank owns is copied. */
static int update_dist(struct engine *e, const struct ctl *c)
{
	struct model *m = &e->m;

	if (!e->update_comm)
		return log_error_errno(-ENOTCONN, "No weight update group");
	for (uint32_t i = 0; i < c->count; i++) {
		const struct weight *w = &m->w[c->idx[i]];
		uint64_t full = w->d.rows * w->d.cols * sizeof(float);
		CUdeviceptr dst = w->ptr;
		ncclResult_t nr;
		CUresult cr;

		if (w->bytes != full) {
			if (e->staging_bytes < full) {
				int r;

				if (e->staging)
					(void)dev_free(e->staging);
				e->staging = 0;
				e->staging_bytes = 0;
				r = dev_alloc(DEV_POOL_DEFAULT, &e->staging, full);
				if (r < 0)
					return log_error_errno(r, "Staging buffer: %m");
				e->staging_bytes = full;
			}
			dst = e->staging;
		}
		nr = gpu.ncclBroadcast((const void *)dst, (void *)dst, full / sizeof(float),
				       ncclFloat, 0, e->update_comm, gpu_stream());
		if (nr != ncclSuccess)
			return log_error_errno(-EIO, "Broadcast of %s failed: %s", w->d.name,
					       gpu.ncclGetErrorString(nr));
		if (gpu_sync() < 0)
			return -EIO;
		if (dst != w->ptr) {
			cr = gpu.cuMemcpyDtoD(
				w->ptr, dst + w->row_begin * w->d.cols * sizeof(float), w->bytes);
			if (cr != CUDA_SUCCESS)
				return log_error_errno(gpu_errno(cr), "D2D of %s: %s", w->d.name,
						       gpu_strerror(cr));
		}
	}
	m->weights_version++;
	return 0;
}

static int execute(struct engine *e, struct ctl *c)
{
	ncclUniqueId id;
	ncclResult_t nr;
	int r;

	switch (c->op) {
	case CTL_STEP:
		return model_forward(&e->m, c->ntok, c->nrows, c->nsample, e->logits);
	case CTL_LOAD_FILE:
		r = model_load_file(&e->m, c->path);
		if (r == 0)
			e->m.weights_version++;
		return r;
	case CTL_GROUP_INIT:
		if (e->update_comm) {
			(void)gpu.ncclCommDestroy(e->update_comm);
			e->update_comm = NULL;
		}
		memcpy(id.internal, c->nccl_id, sizeof(id.internal));
		nr = gpu.ncclCommInitRank(&e->update_comm, (int)c->world, id,
					  (int)(c->rank_offset + e->o.rank));
		if (nr != ncclSuccess) {
			e->update_comm = NULL;
			return log_error_errno(-EIO, "Joining the weight update group failed: %s",
					       gpu.ncclGetErrorString(nr));
		}
		return 0;
	case CTL_SLEEP:
		/* nothing may still run on what is unmapped */
		r = gpu_sync();
		return r ?: dev_sleep((int)c->count);
	case CTL_WAKE:
		return dev_wake_up(c->count);
	case CTL_UPDATE_DIST:
		return update_dist(e, c);
	case CTL_EXIT:
		return 0;
	default:
		return log_error_errno(-EBADMSG, "Unknown control op %" PRIu32, c->op);
	}
}

int ctl_run(struct engine *e, struct ctl *c)
{
	struct step_layout sl;
	int r;

	if (c->op == CTL_STEP) {
		step_layout(&e->m, c->ntok, c->nrows, c->nsample, &sl);
		r = h2d(e->m.step, e->step_host, sl.total);
		if (r < 0)
			return r;
	}
	if (e->o.tp > 1) {
		r = h2d(dctl, c, sizeof(*c));
		r = r ?: bcast(e, dctl, sizeof(*c));
		if (r == 0 && c->op == CTL_STEP)
			r = bcast(e, e->m.step, sl.total);
		if (r < 0)
			return r;
	}
	return execute(e, c);
}

int ctl_follow(struct engine *e)
{
	struct ctl c;
	int r;

	for (;;) {
		struct step_layout sl;
		CUresult cr;

		r = bcast(e, dctl, sizeof(c));
		if (r < 0)
			return r;
		cr = gpu.cuMemcpyDtoH(&c, dctl, sizeof(c));
		if (cr != CUDA_SUCCESS)
			return gpu_errno(cr);
		c.path[sizeof(c.path) - 1] = '\0';
		if (c.op == CTL_STEP) {
			if (c.ntok > e->m.max_tokens || c.nrows > e->m.max_rows ||
			    c.nsample > e->m.max_rows)
				return log_error_errno(-EBADMSG, "Step larger than the buffers");
			step_layout(&e->m, c.ntok, c.nrows, c.nsample, &sl);
			r = bcast(e, e->m.step, sl.total);
			if (r < 0)
				return r;
		}
		if (c.op == CTL_UPDATE_DIST && c.count > CTL_MAX_TENSORS)
			return -EBADMSG;
		for (uint32_t i = 0; c.op == CTL_UPDATE_DIST && i < c.count; i++)
			if (c.idx[i] >= e->m.nw)
				return -EBADMSG;
		r = execute(e, &c);
		if (r < 0)
			log_warning_errno(r, "Rank %" PRIu32 ": control op %" PRIu32 " failed: %m",
					  e->o.rank, c.op);
		if (c.op == CTL_EXIT)
			return 0;
	}
}
