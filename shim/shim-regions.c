/* SPDX-License-Identifier: MIT */
/*
 * The process's tracked regions: one record per exportable physical allocation (a converted
 * cuMemAlloc_v2, or a program's cuMemCreate handle), indexed by id (ids only grow, so the
 * array is sorted by appending) and, while mapped, by address range for the hot lookups
 * (cuMemFree_v2, copies). One reader-writer lock: lookups on the free and copy paths take it
 * shared.
 *
 * Announcements are queued as ids, not messages: the connection thread builds each message
 * when it sends it, so a region announced late carries its current version, and a region
 * freed before its announcement left the queue is never announced at all. A region has at
 * most one announcement queued (announce_queued), which bounds what version bumps queue.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "shim-conn-queue.h"
#include "shim-device.h"
#include "shim-real.h"
#include "shim-regions.h"
#include "util.h"

struct range {
	uint64_t va;
	uint64_t end;
	struct region *r;
};

static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static struct region **by_id;
static size_t n_regions, cap_regions;
static struct range *ranges;
static size_t n_ranges, cap_ranges;
struct ghost {
	uint64_t va, size, order;
	enum region_class cls;
	bool scratch;
};
static struct ghost *ghosts;
static size_t n_ghosts, cap_ghosts;
static uint64_t next_id = 1, next_order;
static uint64_t weights_version;
static size_t n_weights_mapped; /* read without the lock as a hint only */
/* When a tracked allocation or a scratch region last appeared or went (ms), and the scratch
 * layout's generation: what a shadow waits on before it parks (shim-shadow.c). */
static uint64_t last_alloc_ms;
static uint64_t layout_gen;

void regions_lock(void)
{
	(void)pthread_rwlock_wrlock(&lock);
}

void regions_unlock(void)
{
	(void)pthread_rwlock_unlock(&lock);
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
	size_t ncap;
	void *p;

	if (need <= *cap)
		return 0;
	ncap = *cap ? *cap * 2 : 64;
	while (ncap < need)
		ncap *= 2;
	p = realloc(*arr, ncap * elem);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = ncap;
	return 0;
}

/* Index of the first range whose end is above va. */
static size_t range_lower(uint64_t va)
{
	size_t lo = 0, hi = n_ranges;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (ranges[mid].end <= va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static struct range *range_find(uint64_t va)
{
	size_t i = range_lower(va);

	if (i < n_ranges && ranges[i].va <= va)
		return &ranges[i];
	return NULL;
}

static int range_insert(struct region *r)
{
	size_t i;

	if (grow((void **)&ranges, &cap_ranges, n_ranges + 1, sizeof(*ranges)) < 0)
		return -ENOMEM;
	i = range_lower(r->va);
	memmove(&ranges[i + 1], &ranges[i], (n_ranges - i) * sizeof(*ranges));
	ranges[i] = (struct range){.va = r->va, .end = r->va + r->size, .r = r};
	n_ranges++;
	if (r->cls == REGION_WEIGHTS)
		__atomic_add_fetch(&n_weights_mapped, 1, __ATOMIC_RELAXED);
	return 0;
}

static void range_remove(struct range *rg)
{
	size_t i = (size_t)(rg - ranges);

	if (rg->r->cls == REGION_WEIGHTS)
		__atomic_sub_fetch(&n_weights_mapped, 1, __ATOMIC_RELAXED);
	memmove(&ranges[i], &ranges[i + 1], (n_ranges - i - 1) * sizeof(*ranges));
	n_ranges--;
}

static size_t id_index(uint64_t id)
{
	size_t lo = 0, hi = n_regions;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (by_id[mid]->id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static struct region *region_by_id(uint64_t id)
{
	size_t i = id_index(id);

	return i < n_regions && by_id[i]->id == id ? by_id[i] : NULL;
}

static struct region *region_by_handle(CUmemGenericAllocationHandle h)
{
	/* Newest first: a handle value may be reused after release. */
	for (size_t i = n_regions; i > 0; i--)
		if (by_id[i - 1]->kind == REGION_KIND_USER && by_id[i - 1]->handle == h)
			return by_id[i - 1];
	return NULL;
}

/* Index of the first ghost at or above va (ghosts are sorted by address: an engine that
 * sleeps re-creates thousands of mappings, each looks its ghost up). */
static size_t ghost_lower(uint64_t va)
{
	size_t lo = 0, hi = n_ghosts;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (ghosts[mid].va < va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* With the lock held: r was unmapped from va; remembered until inherited or freed. */
static void ghost_add(const struct region *r, uint64_t va)
{
	size_t i = ghost_lower(va);

	if (i == n_ghosts || ghosts[i].va != va) {
		if (grow((void **)&ghosts, &cap_ghosts, n_ghosts + 1, sizeof(*ghosts)) < 0)
			return; /* nothing inherited: the phase rule decides, as before */
		memmove(&ghosts[i + 1], &ghosts[i], (n_ghosts - i) * sizeof(*ghosts));
		n_ghosts++;
	}
	ghosts[i] = (struct ghost){
		.va = va, .size = r->size, .order = r->order, .cls = r->cls, .scratch = r->scratch};
}

/* With the lock held: takes the ghost at va of this size and backing kind, if any. */
static bool ghost_take(uint64_t va, uint64_t size, bool scratch, struct ghost *ret)
{
	size_t i = ghost_lower(va);

	if (i == n_ghosts || ghosts[i].va != va || ghosts[i].size != size ||
	    ghosts[i].scratch != scratch)
		return false;
	*ret = ghosts[i];
	memmove(&ghosts[i], &ghosts[i + 1], (n_ghosts - i - 1) * sizeof(*ghosts));
	n_ghosts--;
	return true;
}

void regions_forget_va(uint64_t va, uint64_t size)
{
	size_t i, j;

	regions_lock();
	if (n_ghosts == 0) {
		regions_unlock();
		return;
	}
	i = ghost_lower(va);
	for (j = i; j < n_ghosts && ghosts[j].va - va < size; j++)
		;
	memmove(&ghosts[i], &ghosts[j], (n_ghosts - j) * sizeof(*ghosts));
	n_ghosts -= j - i;
	regions_unlock();
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) / 1000000u;
}

/* A tracked allocation or a scratch region appeared or went: restarts the quiet period
 * and, when the scratch layout changed, its generation. */
static void note_change_locked(bool layout_changed)
{
	last_alloc_ms = now_ms();
	if (layout_changed)
		layout_gen++;
}

void regions_last_change_locked(uint64_t *ret_ms, uint64_t *ret_layout_gen)
{
	*ret_ms = last_alloc_ms;
	*ret_layout_gen = layout_gen;
}

void regions_drop_pending_locked(struct region *r)
{
	if (!r->has_pending)
		return;
	shim_busy++;
	(void)CALL_REAL(cuMemRelease, r->pending);
	shim_busy--;
	r->has_pending = false;
	r->pending = 0;
}

static struct region *region_new(enum region_kind kind, CUmemGenericAllocationHandle h, int dev,
				 uint64_t size, enum region_class cls, bool exportable)
{
	struct region *r;

	if (grow((void **)&by_id, &cap_regions, n_regions + 1, sizeof(*by_id)) < 0)
		return NULL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	*r = (struct region){
		.id = next_id++,
		.order = next_order++,
		.kind = kind,
		.cls = cls,
		.handle = h,
		.dev = dev,
		.size = size,
		.req_size = size,
		.exportable = exportable,
	};
	by_id[n_regions++] = r;
	return r;
}

static void region_delete(struct region *r)
{
	size_t i = id_index(r->id);

	regions_drop_pending_locked(r);
	memmove(&by_id[i], &by_id[i + 1], (n_regions - i - 1) * sizeof(*by_id));
	n_regions--;
	free(r);
}

static void announce_locked(struct region *r)
{
	if (!r->exportable || r->announce_queued || !conn_active_locked())
		return;
	r->announce_queued = true;
	conn_enqueue_locked(CONN_ANNOUNCE, r->id);
}

/* Only what the supervisor was told about is released: a region freed before its announce
 * left the queue is never mentioned at all. */
static void release_locked(struct region *r)
{
	if (r->announced && conn_active_locked())
		conn_enqueue_locked(CONN_RELEASE, r->id);
	r->announced = false;
	r->announce_queued = false;
	if (r->scratch)
		note_change_locked(true);
}

/* A scratch region the supervisor should learn about (a shadow's layout entry). */
static void shadow_region_locked(struct region *r)
{
	note_change_locked(true);
	if (conn_active_locked())
		conn_enqueue_locked(CONN_SHADOW_REGION, r->id);
}

struct region *const *regions_all_locked(size_t *ret_n)
{
	*ret_n = n_regions;
	return by_id;
}

struct region *regions_get_locked(uint64_t id)
{
	return region_by_id(id);
}

struct region *regions_at_locked(uint64_t va)
{
	struct range *rg = range_find(va);

	return rg ? rg->r : NULL;
}

struct region *regions_by_handle_locked(CUmemGenericAllocationHandle h)
{
	return region_by_handle(h);
}

void regions_set_class_locked(struct region *r, enum region_class cls)
{
	/* n_weights_mapped counts mapped weights regions (range_insert/range_remove) */
	if (r->va != 0 && r->cls == REGION_WEIGHTS && cls != REGION_WEIGHTS)
		__atomic_sub_fetch(&n_weights_mapped, 1, __ATOMIC_RELAXED);
	else if (r->va != 0 && r->cls != REGION_WEIGHTS && cls == REGION_WEIGHTS)
		__atomic_add_fetch(&n_weights_mapped, 1, __ATOMIC_RELAXED);
	r->cls = cls;
}

int regions_add_converted(CUmemGenericAllocationHandle h, int dev, uint64_t va, uint64_t size,
			  uint64_t req_size, enum region_class cls, bool exportable, bool scratch,
			  bool priv)
{
	struct region *r;
	int ret = 0;

	regions_lock();
	r = region_new(REGION_KIND_CONVERTED, h, dev, size, cls, exportable);
	if (!r) {
		ret = -ENOMEM;
		goto out;
	}
	r->va = va;
	r->req_size = req_size;
	r->scratch = scratch;
	r->priv = priv;
	if (range_insert(r) < 0) {
		region_delete(r);
		ret = -ENOMEM;
		goto out;
	}
	note_change_locked(false);
	if (scratch)
		shadow_region_locked(r);
	else
		announce_locked(r);
out:
	regions_unlock();
	return ret;
}

int regions_remove_converted(uint64_t va, struct region *ret)
{
	struct range *rg;
	struct region *r;

	regions_lock();
	rg = range_find(va);
	if (!rg || rg->r->kind != REGION_KIND_CONVERTED) {
		regions_unlock();
		return -ENOENT;
	}
	r = rg->r;
	if (r->va != va) {
		regions_unlock();
		return -EINVAL;
	}
	range_remove(rg);
	release_locked(r);
	*ret = *r;
	region_delete(r);
	regions_unlock();
	return 0;
}

bool regions_is_converted(uint64_t va)
{
	struct range *rg;
	bool ours;

	/* Nothing converted, nothing to look up: the common small-free path. */
	if (__atomic_load_n(&n_ranges, __ATOMIC_RELAXED) == 0)
		return false;
	(void)pthread_rwlock_rdlock(&lock);
	rg = range_find(va);
	ours = rg && rg->r->kind == REGION_KIND_CONVERTED;
	(void)pthread_rwlock_unlock(&lock);
	return ours;
}

int regions_converted_range(uint64_t va, uint64_t *ret_base, uint64_t *ret_size)
{
	struct range *rg;
	int ret = -ENOENT;

	if (__atomic_load_n(&n_ranges, __ATOMIC_RELAXED) == 0)
		return -ENOENT;
	(void)pthread_rwlock_rdlock(&lock);
	rg = range_find(va);
	/* The caller asked for req_size bytes: the rounding up to the granularity is ours, and
	 * the driver would not report it. */
	if (rg && rg->r->kind == REGION_KIND_CONVERTED && va < rg->r->va + rg->r->req_size) {
		*ret_base = rg->r->va;
		*ret_size = rg->r->req_size;
		ret = 0;
	}
	(void)pthread_rwlock_unlock(&lock);
	return ret;
}

int regions_converted_info(uint64_t va, uint64_t *ret_base, uint64_t *ret_id, uint64_t *ret_size)
{
	struct range *rg;
	int ret = -ENOENT;

	if (__atomic_load_n(&n_ranges, __ATOMIC_RELAXED) == 0)
		return -ENOENT;
	(void)pthread_rwlock_rdlock(&lock);
	rg = range_find(va);
	if (rg && rg->r->kind == REGION_KIND_CONVERTED) {
		*ret_base = rg->r->va;
		*ret_id = rg->r->id;
		*ret_size = rg->r->size;
		ret = 0;
	}
	(void)pthread_rwlock_unlock(&lock);
	return ret;
}

int regions_export_fd(uint64_t id, uint64_t *ret_size)
{
	PFN_cuMemExportToShareableHandle_v10020 export_fn = REAL(cuMemExportToShareableHandle);
	struct region *r;
	int fd = -1, ret = -ENOENT;

	regions_lock();
	r = region_by_id(id);
	if (r && r->kind == REGION_KIND_CONVERTED && export_fn) {
		shim_busy++;
		if (export_fn(&fd, r->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
		    CUDA_SUCCESS) {
			*ret_size = r->size;
			ret = fd;
		} else
			ret = -EIO;
		shim_busy--;
	}
	regions_unlock();
	return ret;
}

int regions_add_user(CUmemGenericAllocationHandle h, int dev, uint64_t size, enum region_class cls,
		     bool exportable, bool scratch, const CUmemAllocationProp *prop)
{
	struct region *r;

	regions_lock();
	r = region_new(REGION_KIND_USER, h, dev, size, cls, exportable);
	if (r) {
		r->scratch = scratch;
		if (prop)
			r->prop = *prop;
		note_change_locked(false);
	}
	regions_unlock();
	return r ? 0 : -ENOMEM;
}

bool regions_user_scratch_at(uint64_t va, int *ret_dev)
{
	struct range *rg;
	bool hit;

	(void)pthread_rwlock_rdlock(&lock);
	rg = range_find(va);
	hit = rg && rg->r->va == va && rg->r->kind == REGION_KIND_USER && rg->r->scratch;
	if (hit)
		*ret_dev = rg->r->dev;
	(void)pthread_rwlock_unlock(&lock);
	return hit;
}

CUmemGenericAllocationHandle regions_user_backing(CUmemGenericAllocationHandle h)
{
	CUmemGenericAllocationHandle b = 0;
	struct region *r;

	(void)pthread_rwlock_rdlock(&lock);
	r = region_by_handle(h);
	if (r && !r->scratch)
		b = r->backing;
	(void)pthread_rwlock_unlock(&lock);
	return b;
}

int regions_user_device(CUmemGenericAllocationHandle h, int fallback)
{
	struct region *r;
	int dev = fallback;

	(void)pthread_rwlock_rdlock(&lock);
	r = region_by_handle(h);
	if (r)
		dev = r->dev;
	(void)pthread_rwlock_unlock(&lock);
	return dev;
}

bool regions_user_is_scratch(CUmemGenericAllocationHandle h)
{
	struct region *r;
	bool hit;

	(void)pthread_rwlock_rdlock(&lock);
	r = region_by_handle(h);
	hit = r && r->scratch;
	(void)pthread_rwlock_unlock(&lock);
	return hit;
}

void regions_user_mapped(CUmemGenericAllocationHandle h, uint64_t va)
{
	struct region *r;

	regions_lock();
	r = region_by_handle(h);
	/* Only the first mapping of a handle is its region's address; a handle mapped again
	 * elsewhere is the same memory. */
	if (r && r->va == 0) {
		struct ghost g;

		if (ghost_take(va, r->size, r->scratch, &g)) {
			r->cls = g.cls;
			r->order = g.order;
		}
		r->va = va;
		if (range_insert(r) < 0)
			r->va = 0;
		else if (r->scratch)
			shadow_region_locked(r);
		else
			announce_locked(r);
	}
	regions_unlock();
}

void regions_user_unmapped(uint64_t va, uint64_t size)
{
	regions_lock();
	for (size_t i = range_lower(va); i < n_ranges && ranges[i].va < va + size;) {
		struct region *r = ranges[i].r;

		if (r->kind != REGION_KIND_USER) {
			i++;
			continue;
		}
		range_remove(&ranges[i]);
		release_locked(r);
		ghost_add(r, r->va);
		r->va = 0;
		if (r->released)
			region_delete(r);
	}
	regions_unlock();
}

bool regions_user_unretain(CUmemGenericAllocationHandle h)
{
	struct region *r;
	bool hit = false;

	regions_lock();
	r = region_by_handle(h);
	if (r && r->retains > 0) {
		r->retains--;
		hit = true;
	}
	regions_unlock();
	return hit;
}

void regions_user_released(CUmemGenericAllocationHandle h)
{
	struct region *r;

	regions_lock();
	r = region_by_handle(h);
	if (r && !r->released) {
		/* The driver keeps mapped memory alive until it is unmapped, and so do we. */
		if (r->va == 0)
			region_delete(r);
		else
			r->released = true;
	}
	regions_unlock();
}

bool regions_have_weights(void)
{
	return __atomic_load_n(&n_weights_mapped, __ATOMIC_RELAXED) != 0;
}

/* Looks with the lock shared first: most copies after load go elsewhere (KV, activations). */
static bool touches_weights(uint64_t va, uint64_t len)
{
	bool hit = false;

	(void)pthread_rwlock_rdlock(&lock);
	for (size_t i = range_lower(va); i < n_ranges && ranges[i].va < va + len && !hit; i++)
		hit = ranges[i].r->cls == REGION_WEIGHTS;
	(void)pthread_rwlock_unlock(&lock);
	return hit;
}

void regions_note_write(uint64_t va, uint64_t len)
{
	if (len == 0 || va + len < va || !touches_weights(va, len))
		return;
	regions_lock();
	for (size_t i = range_lower(va); i < n_ranges && ranges[i].va < va + len; i++) {
		struct region *r = ranges[i].r;

		if (r->cls != REGION_WEIGHTS)
			continue;
		r->weights_version = ++weights_version;
		announce_locked(r);
	}
	regions_unlock();
}

bool regions_build_announce(uint64_t id, struct proto_msg *ret)
{
	PFN_cuMemExportToShareableHandle_v10020 export_fn = REAL(cuMemExportToShareableHandle);
	struct region *r;
	int fd = -1;
	bool ok = false;

	regions_lock();
	r = region_by_id(id);
	if (!r || r->va == 0 || !export_fn)
		goto out;
	r->announce_queued = false;
	if (!r->exportable || r->scratch)
		goto out;
	shim_busy++;
	/* A promoted user region: the program's handle is a fake one, the memory is backing. */
	if (export_fn(&fd, r->backing ? r->backing : r->handle,
		      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != CUDA_SUCCESS)
		fd = -1;
	shim_busy--;
	if (fd < 0) {
		log_debug("Failed to export region %" PRIu64 ", not announcing it.", id);
		goto out;
	}
	*ret = (struct proto_msg){.type = PROTO_REGION_ANNOUNCE};
	ret->region = (struct proto_region){
		.id = r->id,
		.va = r->va,
		.size = r->size,
		.cls = r->cls,
		.order = r->order,
		.weights_version = r->weights_version,
		.fd = fd,
	};
	shim_device_uuid(r->dev, ret->region.device_uuid);
	r->announced = true;
	ok = true;
out:
	regions_unlock();
	return ok;
}

bool regions_build_shadow_region(uint64_t id, struct proto_msg *ret)
{
	struct region *r;
	bool ok = false;

	regions_lock();
	r = region_by_id(id);
	if (r && r->scratch && r->va != 0) {
		*ret = (struct proto_msg){.type = PROTO_SHADOW_REGION};
		ret->shadow_region = (struct proto_shadow_region){
			.id = r->id,
			.va = r->va,
			.size = r->size,
			.cls = r->cls,
			.order = r->order,
		};
		shim_device_uuid(r->dev, ret->shadow_region.device_uuid);
		r->announced = true; /* its release is worth telling */
		ok = true;
	}
	regions_unlock();
	return ok;
}

int regions_snapshot(void (*under_lock)(void), uint64_t **ret_ids, size_t *ret_n,
		     uint64_t **ret_shadow_ids, size_t *ret_shadow_n)
{
	uint64_t *ids = NULL, *sids = NULL;
	size_t n = 0, ns = 0;

	regions_lock();
	under_lock();
	if (n_regions > 0) {
		ids = malloc(n_regions * sizeof(*ids));
		sids = malloc(n_regions * sizeof(*sids));
		if (!ids || !sids) {
			regions_unlock();
			free(ids);
			free(sids);
			return -ENOMEM;
		}
	}
	for (size_t i = 0; i < n_regions; i++) {
		struct region *r = by_id[i];

		if (r->scratch && r->va != 0) {
			r->announced = false;
			sids[ns++] = r->id;
			continue;
		}
		if (!r->exportable || r->va == 0)
			continue;
		/* Announced from this list, in a new session: an update queued later would repeat
		 * it, and a release before then concerns nothing the supervisor knows. */
		r->announce_queued = true;
		r->announced = false;
		ids[n++] = r->id;
	}
	regions_unlock();
	*ret_ids = ids;
	*ret_n = n;
	*ret_shadow_ids = sids;
	*ret_shadow_n = ns;
	return 0;
}

void regions_reset_after_fork(void)
{
	/* The regions are the parent's: the child owns none of them. Called in the child with
	 * the lock held by the fork handler. */
	for (size_t i = 0; i < n_regions; i++)
		free(by_id[i]);
	n_regions = 0;
	n_ranges = 0;
	n_ghosts = 0;
	__atomic_store_n(&n_weights_mapped, 0, __ATOMIC_RELAXED);
	next_id = 1;
	next_order = 0;
	weights_version = 0;
	layout_gen = 0;
	pthread_rwlock_init(&lock, NULL);
}

void regions_reannounce_locked(struct region *r)
{
	r->announce_queued = false; /* an announce still queued is built with the new class */
	announce_locked(r);
}

void regions_unscratch_locked(struct region *r)
{
	release_locked(r); /* while still scratch: the layout generation moves, it parks anew */
	r->scratch = false;
	r->priv = false;
	r->exportable = true;
	announce_locked(r);
}
