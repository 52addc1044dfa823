/* SPDX-License-Identifier: MIT */
/*
 * Shadow mode (BELAYER_ROLE=shadow, DESIGN §1.2) and its promotion to primary.
 *
 * A shadow runs the engine's whole initialization while its weights and kv regions cost
 * almost nothing: they are backed by scratch (shim-shadow-scratch.c). Every byte the shadow
 * writes there lands in the same scratch granule: the shadow computes garbage until it is
 * promoted, which is fine because it serves nothing until then.
 *
 * The supervisor learns the layout (SHADOW_REGION per region, PARKED with the layout hash
 * once the KV cache exists and no tracked allocation happened for BELAYER_PARK_QUIET_MS).
 * Promotion happens on the connection thread: PROMOTE_MAP imports the primary's fd for one
 * region and holds the handle; PROMOTE_COMMIT swaps every region from scratch to its
 * imported memory at the same address (so captured graphs stay valid), all or nothing,
 * under the regions lock (the program's CUDA calls wait at most that long, and only those
 * that touch tracked regions). After a successful commit the process is a primary.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "layout.h"
#include "log.h"
#include "shim-config.h"
#include "shim-device.h"
#include "shim-real.h"
#include "shim-regions.h"
#include "shim-role.h"
#include "shim-shadow-scratch.h"
#include "shim-shadow.h"
#include "util.h"

/* The connection thread's own. */
static bool parked_sent;
static uint64_t parked_gen;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* With the regions lock held: the live scratch regions in creation order, their layout
 * hash, and whether the KV cache is among them. ret_list may be NULL. */
static int layout_locked(struct region ***ret_list, size_t *ret_n, uint64_t *ret_hash, bool *ret_kv)
{
	struct region *const *all;
	struct region **list = NULL;
	uint64_t h = LAYOUT_HASH_INIT;
	size_t n_all, n = 0;
	bool kv = false;

	all = regions_all_locked(&n_all);
	if (ret_list && n_all > 0) {
		list = malloc(n_all * sizeof(*list));
		if (!list)
			return -ENOMEM;
	}
	/* Ids and orders are handed out together, so id order is creation order. */
	for (size_t i = 0; i < n_all; i++) {
		struct region *r = all[i];

		if (!r->scratch || r->va == 0)
			continue;
		h = layout_hash_update(h, r->cls, r->size);
		kv = kv || r->cls == REGION_KV;
		if (list)
			list[n] = r;
		n++;
	}
	if (ret_list)
		*ret_list = list;
	*ret_n = n;
	*ret_hash = h;
	if (ret_kv)
		*ret_kv = kv;
	return 0;
}

void shadow_session_reset(void)
{
	parked_sent = false;
}

long shadow_tick(int (*send)(const struct proto_msg *m))
{
	uint64_t quiet = shim_config()->park_quiet_ms, now, last, gen, hash;
	struct proto_msg m = {.type = PROTO_SHADOW_PARKED};
	size_t n;
	bool kv;
	int r;

	if (shim_role() != ROLE_SHADOW)
		return 500;
	regions_lock();
	(void)layout_locked(NULL, &n, &hash, &kv);
	regions_last_change_locked(&last, &gen);
	regions_unlock();
	if (!kv || (parked_sent && gen == parked_gen))
		return 500;
	now = now_ns() / 1000000u;
	if (now - last < quiet)
		return (long)MIN(quiet - (now - last), (uint64_t)500);

	m.shadow_parked.n_entries = (uint32_t)n;
	m.shadow_parked.hash = hash;
	r = send(&m);
	if (r < 0)
		return r;
	parked_sent = true;
	parked_gen = gen;
	log_debug("Parked: %zu layout entries, hash %016" PRIx64 ".", n, hash);
	return 500;
}

/* The promotion thread's CUDA context: the primary context of the region's device. */
static CUresult ctx_for(int dev)
{
	static __thread int current = -1;
	const struct real_extra *x = real_extra();
	CUcontext ctx;
	CUdevice d;
	CUresult r;

	if (dev == current)
		return CUDA_SUCCESS;
	if (!REAL(cuDevicePrimaryCtxRetain) || !x->cuCtxSetCurrent || !x->cuDeviceGet)
		return CUDA_ERROR_NOT_SUPPORTED;
	shim_busy++;
	r = x->cuDeviceGet(&d, dev);
	if (r == CUDA_SUCCESS)
		r = REAL(cuDevicePrimaryCtxRetain)(&ctx, d);
	if (r == CUDA_SUCCESS)
		r = x->cuCtxSetCurrent(ctx);
	shim_busy--;
	if (r == CUDA_SUCCESS)
		current = dev;
	return r;
}

static int reply_error(int (*send)(const struct proto_msg *m), int code, enum proto_type re,
		       const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int reply_error(int (*send)(const struct proto_msg *m), int code, enum proto_type re,
		       const char *fmt, ...)
{
	struct proto_msg m = {.type = PROTO_ERROR};
	va_list ap;

	m.error.code = code < 0 ? -code : code;
	m.error.in_reply_to = (uint32_t)re;
	va_start(ap, fmt);
	(void)vsnprintf(m.error.message, sizeof(m.error.message), fmt, ap);
	va_end(ap);
	return send(&m);
}

static int on_map(const struct proto_promote_map *pm, int (*send)(const struct proto_msg *m))
{
	const struct real_extra *x = real_extra();
	CUmemGenericAllocationHandle h = 0;
	struct region *r;
	uint64_t size = 0;
	int dev = -1, err = 0;
	bool is_scratch = false;
	CUresult cr;

	if (shim_role() != ROLE_SHADOW)
		return reply_error(send, EINVAL, PROTO_PROMOTE_MAP, "not a shadow");
	regions_lock();
	r = regions_get_locked(pm->shadow_id);
	if (r) {
		is_scratch = r->scratch && r->va != 0;
		size = r->size;
		dev = r->dev;
	}
	regions_unlock();
	if (!is_scratch)
		return reply_error(send, ENOENT, PROTO_PROMOTE_MAP,
				   "region %" PRIu64 " is no scratch region of this shadow",
				   pm->shadow_id);
	if (pm->size != size)
		return reply_error(send, EINVAL, PROTO_PROMOTE_MAP,
				   "region %" PRIu64 ": %" PRIu64 " bytes, not %" PRIu64,
				   pm->shadow_id, size, pm->size);

	cr = ctx_for(dev);
	if (cr == CUDA_SUCCESS && !x->cuMemImportFromShareableHandle)
		cr = CUDA_ERROR_NOT_SUPPORTED;
	if (cr == CUDA_SUCCESS) {
		shim_busy++;
		cr = x->cuMemImportFromShareableHandle(&h, (void *)(intptr_t)pm->fd,
						       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		shim_busy--;
	}
	if (cr != CUDA_SUCCESS)
		err = -EIO;

	/* A later MAP replaces an earlier one, a failed one too: what is held must be what the
	 * supervisor last said. */
	regions_lock();
	r = regions_get_locked(pm->shadow_id);
	if (r && r->scratch) {
		regions_drop_pending_locked(r);
		r->pending_error = err;
		if (err == 0) {
			r->pending = h;
			r->has_pending = true;
			h = 0;
		}
	} else if (err == 0)
		err = -ENOENT;
	regions_unlock();
	if (h) {
		shim_busy++;
		(void)CALL_REAL(cuMemRelease, h);
		shim_busy--;
	}
	if (err < 0)
		return reply_error(send, err, PROTO_PROMOTE_MAP,
				   "region %" PRIu64 ": importing primary %u region %" PRIu64
				   " failed (CUresult %d)",
				   pm->shadow_id, pm->primary_pid, pm->primary_id, (int)cr);
	return 0;
}

/* With shim_busy held: puts scratch back over r, whatever state the swap left it in. */
static CUresult restore_scratch(struct region *r)
{
	CUresult cr;

	(void)CALL_REAL(cuMemUnmap, r->va, r->size); /* the imported (or private) mapping */
	if (r->priv) {
		cr = CALL_REAL(cuMemMap, r->va, r->size, 0, r->handle, 0);
		return cr == CUDA_SUCCESS ? shim_set_access(r->va, r->size, r->dev) : cr;
	}
	(void)shadow_scratch_unmap(r->dev, r->va, r->size);
	return shadow_scratch_map(r->dev, r->va, r->size);
}

/* With shim_busy held: scratch out, imported memory in, at the same address. */
static CUresult swap_in(struct region *r)
{
	CUresult cr;

	cr = r->priv ? CALL_REAL(cuMemUnmap, r->va, r->size)
		     : shadow_scratch_unmap(r->dev, r->va, r->size);
	if (cr == CUDA_SUCCESS)
		cr = CALL_REAL(cuMemMap, r->va, r->size, 0, r->pending, 0);
	if (cr == CUDA_SUCCESS)
		cr = shim_set_access(r->va, r->size, r->dev);
	return cr;
}

/* With shim_busy held: cuCtxSynchronize in the primary context of every device of list. */
static CUresult sync_devices_locked(struct region *const *list, size_t n)
{
	const struct real_extra *x = real_extra();
	uint64_t done = 0; /* devices synchronised, a bit each */
	CUresult cr = CUDA_SUCCESS;

	if (!x->cuCtxSynchronize)
		return CUDA_ERROR_NOT_SUPPORTED;
	for (size_t i = 0; i < n && cr == CUDA_SUCCESS; i++) {
		int dev = list[i]->dev;

		if (dev >= 0 && dev < 64 && (done & (UINT64_C(1) << dev)))
			continue;
		cr = ctx_for(dev);
		if (cr == CUDA_SUCCESS)
			cr = x->cuCtxSynchronize();
		if (dev >= 0 && dev < 64)
			done |= UINT64_C(1) << dev;
	}
	return cr;
}

static int commit_locked(const struct proto_promote_commit *c, struct proto_promote_done *d)
{
	_cleanup_free_ struct region **list = NULL;
	uint64_t hash;
	size_t n, done = 0;
	CUresult cr = CUDA_SUCCESS;
	int r;

	r = layout_locked(&list, &n, &hash, NULL);
	if (r < 0) {
		snprintf(d->message, sizeof(d->message), "out of memory");
		return r;
	}
	if (hash != c->hash || n != c->n_regions) {
		snprintf(d->message, sizeof(d->message),
			 "layout mismatch: shadow has %zu regions, hash %016" PRIx64
			 "; expected %u, %016" PRIx64,
			 n, hash, c->n_regions, c->hash);
		return -EXDEV;
	}
	for (size_t i = 0; i < n; i++)
		if (!list[i]->has_pending) {
			snprintf(d->message, sizeof(d->message),
				 "region %" PRIu64 " has no primary memory%s", list[i]->id,
				 list[i]->pending_error ? " (its import failed)" : "");
			return list[i]->pending_error ?: -ENOENT;
		}

	/* Nothing of the shadow may still run on the memory about to be unmapped (a warm-up,
	 * SGLang's /health generation, a graph replay): cuMemUnmap does not wait for it (PyTorch,
	 * ExpandableSegment::unmapHandles: "MemUnmap and MemRelease do not appear to synchronize
	 * in all cases"; review finding 10). Every device of the layout, once. A device that
	 * cannot synchronise (a sticky error) is no device to promote onto. */
	shim_busy++;
	cr = sync_devices_locked(list, n);
	if (cr != CUDA_SUCCESS) {
		shim_busy--;
		snprintf(d->message, sizeof(d->message),
			 "synchronising the shadow's devices failed (CUresult %d)", (int)cr);
		return -EIO;
	}
	for (; done < n; done++) {
		cr = ctx_for(list[done]->dev);
		if (cr == CUDA_SUCCESS)
			cr = swap_in(list[done]);
		if (cr != CUDA_SUCCESS)
			break;
	}
	if (cr != CUDA_SUCCESS) {
		CUresult failed = cr;

		/* All or nothing: every region touched goes back to scratch, in reverse. */
		for (size_t i = done + 1; i-- > 0;) {
			cr = restore_scratch(list[i]);
			if (cr != CUDA_SUCCESS)
				log_warning("Restoring scratch over region %" PRIu64
					    " failed (CUresult %d): this shadow is unusable.",
					    list[i]->id, (int)cr);
		}
		shim_busy--;
		snprintf(d->message, sizeof(d->message),
			 "remapping region %" PRIu64 " failed (CUresult %d), rolled back",
			 list[done]->id, (int)failed);
		return -EIO;
	}
	shim_busy--;

	for (size_t i = 0; i < n; i++) {
		struct region *reg = list[i];

		if (reg->priv) {
			/* Nothing maps the shadow's own copy any more. */
			shim_busy++;
			(void)CALL_REAL(cuMemRelease, reg->handle);
			shim_busy--;
			reg->priv = false;
		}
		if (reg->kind == REGION_KIND_CONVERTED)
			reg->handle = reg->pending;
		else
			reg->backing = reg->pending;
		reg->pending = 0;
		reg->has_pending = false;
		reg->scratch = false;
		reg->exportable = true;
		reg->announced = false;
		reg->announce_queued = false;
		reg->weights_version = c->weights_version;
	}
	d->n_regions = (uint32_t)n;
	snprintf(d->message, sizeof(d->message), "%zu regions mapped", n);
	return 0;
}

int shadow_on_message(struct proto_msg *m, int (*send)(const struct proto_msg *m))
{
	struct proto_msg reply = {.type = PROTO_PROMOTE_DONE};
	uint64_t t0;
	int r;

	switch (m->type) {
	case PROTO_PROMOTE_MAP:
		return on_map(&m->promote_map, send) < 0 ? -EIO : 0;
	case PROTO_PROMOTE_COMMIT:
		break;
	default:
		return 0; /* errors and anything newer: nothing to do */
	}

	t0 = now_ns();
	if (shim_role() != ROLE_SHADOW) {
		r = -EINVAL;
		snprintf(reply.promote_done.message, sizeof(reply.promote_done.message),
			 "not a shadow");
	} else {
		regions_lock();
		r = commit_locked(&m->promote_commit, &reply.promote_done);
		if (r == 0)
			shim_role_promoted();
		regions_unlock();
	}
	reply.promote_done.code = r < 0 ? -r : 0;
	reply.promote_done.ns = now_ns() - t0;
	if (r < 0)
		log_warning("Promotion refused: %s", reply.promote_done.message);
	else
		log_info("Promoted to primary: %s in %" PRIu64 " us.", reply.promote_done.message,
			 reply.promote_done.ns / 1000);
	if (send(&reply) < 0)
		return -EIO;
	return r == 0 ? 1 : 0;
}

void shadow_reset_after_fork(void)
{
	/* The child has no layout of its own yet (its scratch and regions are reset by their
	 * modules). */
	parked_sent = false;
	parked_gen = 0;
}
