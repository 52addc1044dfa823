/* SPDX-License-Identifier: MIT */
/*
 * A shadow's scratch memory (shadow mode: shim-shadow.c). Its weights and kv regions cost
 * almost nothing: each is backed by one small scratch allocation per device (one allocation
 * granule), mapped over and over across the region's reserved range (cuMemMap accepts one
 * handle at many addresses). Converted cuMemAlloc_v2 memory gets this in shim-alloc.c; a
 * program's own cuMemCreate of such a class gets a fake handle that the shim recognises in
 * cuMemMap / cuMemUnmap / cuMemRelease.
 */
#include <pthread.h>
#include <string.h>

#include "layout.h"
#include "shim-config.h"
#include "shim-device.h"
#include "shim-real.h"
#include "shim-role.h"
#include "shim-shadow-scratch.h"
#include "util.h"

/* Fake handles carry this tag in their top 16 bits: no driver hands out such values
 * (real handles are small numbers or heap pointers). */
#define FAKE_TAG  UINT64_C(0xb1a7000000000000)
#define FAKE_MASK UINT64_C(0xffff000000000000)

struct scratch {
	bool made;
	CUmemGenericAllocationHandle h;
	size_t granularity;
	/* The allocation's size, a multiple of the granularity: a region is mapped unit by
	 * unit (its tail with part of it), so a larger unit costs memory once per device and
	 * saves map/unmap calls at parking and promotion (review finding 10: about 40,000 of
	 * each per 80 GB at 2 MiB). */
	size_t unit;
};

static struct scratch scratch[MAX_DEVS];
static pthread_mutex_t scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t fake_next;

bool shadow_wants_scratch(enum region_class cls)
{
	return shim_role() == ROLE_SHADOW && layout_class_counts(cls);
}

CUmemGenericAllocationHandle shadow_fake_handle(void)
{
	return FAKE_TAG | (__atomic_add_fetch(&fake_next, 1, __ATOMIC_RELAXED) & ~FAKE_MASK);
}

bool shadow_handle_is_fake(CUmemGenericAllocationHandle h)
{
	return (h & FAKE_MASK) == FAKE_TAG;
}

/* With shim_busy held. The scratch granule of dev, made on first use; never freed (it is
 * what every scratch region maps, for the life of the process). */
static CUresult scratch_get(int dev, struct scratch **ret)
{
	const struct real_extra *x = real_extra();
	struct scratch *s;
	CUresult r = CUDA_SUCCESS;

	if (dev < 0 || dev >= MAX_DEVS)
		return CUDA_ERROR_INVALID_DEVICE;
	s = &scratch[dev];
	if (__atomic_load_n(&s->made, __ATOMIC_ACQUIRE)) {
		*ret = s;
		return CUDA_SUCCESS;
	}
	pthread_mutex_lock(&scratch_lock);
	if (!s->made) {
		CUmemAllocationProp prop = {
			.type = CU_MEM_ALLOCATION_TYPE_PINNED,
			.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
		};

		if (!x->cuMemGetAllocationGranularity || !REAL(cuMemCreate))
			r = CUDA_ERROR_NOT_SUPPORTED;
		else
			r = x->cuMemGetAllocationGranularity(&s->granularity, &prop,
							     CU_MEM_ALLOC_GRANULARITY_MINIMUM);
		if (r == CUDA_SUCCESS && s->granularity == 0)
			r = CUDA_ERROR_NOT_SUPPORTED;
		if (r == CUDA_SUCCESS) {
			uint64_t u = shim_config()->scratch_unit / s->granularity;

			s->unit = (size_t)(u ? u : 1) * s->granularity;
			r = REAL(cuMemCreate)(&s->h, s->unit, &prop, 0);
		}
		if (r == CUDA_SUCCESS)
			__atomic_store_n(&s->made, true, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&scratch_lock);
	if (r == CUDA_SUCCESS)
		*ret = s;
	return r;
}

size_t shadow_granularity(int dev)
{
	struct scratch *s;
	CUresult r;

	shim_busy++;
	r = scratch_get(dev, &s);
	shim_busy--;
	return r == CUDA_SUCCESS ? s->granularity : 0;
}

CUresult shadow_scratch_map(int dev, uint64_t va, uint64_t size)
{
	PFN_cuMemMap_v10020 map = REAL(cuMemMap);
	struct scratch *s;
	uint64_t off;
	CUresult r;

	r = scratch_get(dev, &s);
	if (r != CUDA_SUCCESS)
		return r;
	if (!map || !REAL(cuMemUnmap) || !REAL(cuMemSetAccess))
		return CUDA_ERROR_NOT_SUPPORTED;
	if (size == 0 || size % s->granularity || va % s->granularity)
		return CUDA_ERROR_INVALID_VALUE;
	for (off = 0; off < size; off += MIN((uint64_t)s->unit, size - off)) {
		r = map(va + off, MIN((uint64_t)s->unit, size - off), 0, s->h, 0);
		if (r != CUDA_SUCCESS)
			break;
	}
	if (r == CUDA_SUCCESS)
		r = shim_set_access(va, size, dev);
	if (r != CUDA_SUCCESS)
		(void)shadow_scratch_unmap(dev, va, off < size ? off : size);
	return r;
}

CUresult shadow_scratch_unmap(int dev, uint64_t va, uint64_t size)
{
	PFN_cuMemUnmap_v10020 unmap = REAL(cuMemUnmap);
	CUresult first = CUDA_SUCCESS;
	struct scratch *s;
	CUresult r;

	r = scratch_get(dev, &s);
	if (r != CUDA_SUCCESS)
		return r;
	if (!unmap)
		return CUDA_ERROR_NOT_SUPPORTED;
	/* The same pieces as shadow_scratch_map made. */
	for (uint64_t off = 0; off < size; off += MIN((uint64_t)s->unit, size - off)) {
		r = unmap(va + off, MIN((uint64_t)s->unit, size - off));
		if (r != CUDA_SUCCESS && first == CUDA_SUCCESS)
			first = r;
	}
	return first;
}

void shadow_scratch_reset_after_fork(void)
{
	/* The child has none of the parent's CUDA memory: no scratch. */
	pthread_mutex_init(&scratch_lock, NULL);
	memset(scratch, 0, sizeof(scratch));
}
