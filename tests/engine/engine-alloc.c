/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "engine-alloc.h"
#include "engine-gpu.h"

/* c10/cuda/CUDACachingAllocator.cpp's constants */
#define MIN_BLOCK   512ull	  /* kMinBlockSize */
#define SMALL_SIZE  (1ull << 20)  /* kSmallSize: largest request of the small pool */
#define SMALL_SEG   (2ull << 20)  /* kSmallBuffer */
#define LARGE_SEG   (20ull << 20) /* kLargeBuffer */
#define MIN_LARGE   (10ull << 20) /* kMinLargeAlloc */
#define ROUND_LARGE (2ull << 20)  /* kRoundLarge */

struct block {
	CUdeviceptr ptr;
	uint64_t size;
	bool used;
	struct block *prev, *next; /* neighbours in the segment, by address */
};

struct segment {
	struct block *first;
	uint64_t size;
	struct segment *next;
	/* sleep mode: made by create_and_map; while asleep unmapped and released (reserved) */
	bool cumem, asleep;
	CUmemGenericAllocationHandle handle;
	void *backup; /* asleep at level 1: the weights' bytes */
};

/* [pool][0: small, 1: large] */
static struct segment *segments[DEV_POOL_MAX][2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool use_cumem;
static int cumem_dev;

void dev_alloc_use_cumem(int dev)
{
	use_cumem = true;
	cumem_dev = dev;
}

/* csrc/cumem_allocator.cpp's create_and_map: the program's own handle on the rank's device,
 * mapped at va, read-write for that device. */
static CUresult create_and_map(CUdeviceptr va, uint64_t size, CUmemGenericAllocationHandle *ret)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = cumem_dev}};
	CUmemAccessDesc acc = {.location = prop.location,
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUresult r;

	r = gpu.cuMemCreate(ret, size, &prop, 0);
	if (r != CUDA_SUCCESS)
		return r;
	r = gpu.cuMemMap(va, size, 0, *ret, 0);
	if (r == CUDA_SUCCESS) {
		r = gpu.cuMemSetAccess(va, size, &acc, 1);
		if (r != CUDA_SUCCESS)
			(void)gpu.cuMemUnmap(va, size);
	}
	if (r != CUDA_SUCCESS)
		(void)gpu.cuMemRelease(*ret);
	return r;
}

/* unmap_and_release: the reservation stays. */
static void unmap_and_release(struct segment *s)
{
	(void)gpu.cuMemUnmap(s->first->ptr, s->size);
	(void)gpu.cuMemRelease(s->handle);
	s->handle = 0;
}

static uint64_t round_size(uint64_t bytes)
{
	return bytes < MIN_BLOCK ? MIN_BLOCK : (bytes + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

static uint64_t segment_size(uint64_t rounded)
{
	if (rounded <= SMALL_SIZE)
		return SMALL_SEG;
	if (rounded < MIN_LARGE)
		return LARGE_SEG;
	return (rounded + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

/* Best fit: the smallest free block that holds size, the lowest address among equals. */
static struct block *find_free(struct segment *list, uint64_t size)
{
	struct block *best = NULL;

	for (struct segment *s = list; s; s = s->next)
		for (struct block *b = s->first; b; b = b->next)
			if (!b->used && b->size >= size &&
			    (!best || b->size < best->size ||
			     (b->size == best->size && b->ptr < best->ptr)))
				best = b;
	return best;
}

static int segment_create(enum dev_pool pool, struct segment **list, uint64_t size)
{
	struct segment *s = calloc(1, sizeof(*s));
	struct block *b = calloc(1, sizeof(*b));
	CUresult r;

	if (!s || !b) {
		free(s);
		free(b);
		return -ENOMEM;
	}
	s->cumem = use_cumem && pool != DEV_POOL_DEFAULT;
	if (s->cumem) {
		/* my_malloc: the range first, then the memory */
		r = gpu.cuMemAddressReserve(&b->ptr, size, 0, 0, 0);
		if (r == CUDA_SUCCESS) {
			r = create_and_map(b->ptr, size, &s->handle);
			if (r != CUDA_SUCCESS)
				(void)gpu.cuMemAddressFree(b->ptr, size);
		}
	} else
		r = gpu.cuMemAlloc(&b->ptr, size);
	if (r != CUDA_SUCCESS) {
		free(s);
		free(b);
		return gpu_errno(r);
	}
	b->size = size;
	s->first = b;
	s->size = size;
	s->next = *list;
	*list = s;
	return 0;
}

static void empty_cache_locked(void)
{
	for (int p = 0; p < DEV_POOL_MAX; p++)
		for (int k = 0; k < 2; k++)
			for (struct segment **sp = &segments[p][k]; *sp;) {
				struct segment *s = *sp;

				if (s->first->used || s->first->next || s->asleep) {
					sp = &s->next;
					continue;
				}
				if (s->cumem) {
					/* my_free */
					unmap_and_release(s);
					(void)gpu.cuMemAddressFree(s->first->ptr, s->size);
				} else
					(void)gpu.cuMemFree(s->first->ptr);
				*sp = s->next;
				free(s->first);
				free(s);
			}
}

int dev_alloc(enum dev_pool pool, CUdeviceptr *ret, uint64_t bytes)
{
	uint64_t size = round_size(bytes);
	bool small = size <= SMALL_SIZE;
	struct segment **list;
	struct block *b;
	int r = 0;

	if (pool < 0 || pool >= DEV_POOL_MAX)
		return -EINVAL;
	list = &segments[pool][small ? 0 : 1];
	pthread_mutex_lock(&lock);
	b = find_free(*list, size);
	if (!b) {
		r = segment_create(pool, list, segment_size(size));
		/* as PyTorch: on out of memory, give the cached segments back and retry once */
		if (r == -ENOMEM) {
			empty_cache_locked();
			r = segment_create(pool, list, segment_size(size));
		}
		if (r < 0)
			goto out;
		b = (*list)->first;
	}
	/* split unless the rest is too small to be worth a block of its own */
	if (b->size - size >= (small ? MIN_BLOCK : SMALL_SIZE + 1)) {
		struct block *rest = calloc(1, sizeof(*rest));

		if (!rest) {
			r = -ENOMEM;
			goto out;
		}
		rest->ptr = b->ptr + size;
		rest->size = b->size - size;
		rest->prev = b;
		rest->next = b->next;
		if (b->next)
			b->next->prev = rest;
		b->next = rest;
		b->size = size;
	}
	b->used = true;
	*ret = b->ptr;
out:
	pthread_mutex_unlock(&lock);
	return r;
}

static void merge_next(struct block *b)
{
	struct block *n = b->next;

	b->size += n->size;
	b->next = n->next;
	if (n->next)
		n->next->prev = b;
	free(n);
}

int dev_free(CUdeviceptr p)
{
	int r = -EINVAL;

	pthread_mutex_lock(&lock);
	for (int pool = 0; pool < DEV_POOL_MAX; pool++)
		for (int k = 0; k < 2; k++)
			for (struct segment *s = segments[pool][k]; s; s = s->next) {
				if (p < s->first->ptr || p >= s->first->ptr + s->size)
					continue;
				for (struct block *b = s->first; b; b = b->next) {
					if (b->ptr != p || !b->used)
						continue;
					b->used = false;
					if (b->next && !b->next->used)
						merge_next(b);
					if (b->prev && !b->prev->used)
						merge_next(b->prev);
					r = 0;
					goto out;
				}
				goto out;
			}
out:
	pthread_mutex_unlock(&lock);
	return r;
}

static bool dev_asleep_locked(unsigned mask)
{
	for (int p = 0; p < DEV_POOL_MAX; p++)
		for (int k = 0; k < 2 && (mask & (1u << p)); k++)
			for (struct segment *s = segments[p][k]; s; s = s->next)
				if (s->asleep)
					return true;
	return false;
}

bool dev_asleep(unsigned mask)
{
	bool r;

	pthread_mutex_lock(&lock);
	r = dev_asleep_locked(mask);
	pthread_mutex_unlock(&lock);
	return r;
}

int dev_sleep(int level)
{
	int r = 0;

	if (level < 1 || level > 2)
		return -EINVAL;
	pthread_mutex_lock(&lock);
	if (!use_cumem || dev_asleep_locked(~0u)) {
		r = -EINVAL;
		goto out;
	}
	/* offload: level 1 keeps the weights in host memory */
	for (int k = 0; k < 2 && level == 1; k++)
		for (struct segment *s = segments[DEV_POOL_WEIGHTS][k]; s; s = s->next) {
			CUresult cr;

			s->backup = malloc(s->size);
			if (!s->backup) {
				r = -ENOMEM;
				goto out;
			}
			cr = gpu.cuMemcpyDtoH(s->backup, s->first->ptr, s->size);
			if (cr != CUDA_SUCCESS) {
				r = gpu_errno(cr);
				goto out;
			}
		}
	for (int p = DEV_POOL_WEIGHTS; p <= DEV_POOL_KV; p++)
		for (int k = 0; k < 2; k++)
			for (struct segment *s = segments[p][k]; s; s = s->next) {
				unmap_and_release(s);
				s->asleep = true;
			}
out:
	if (r < 0)
		for (int k = 0; k < 2; k++)
			for (struct segment *s = segments[DEV_POOL_WEIGHTS][k]; s; s = s->next) {
				free(s->backup);
				s->backup = NULL;
			}
	pthread_mutex_unlock(&lock);
	return r;
}

int dev_wake_up(unsigned mask)
{
	int r = 0;

	pthread_mutex_lock(&lock);
	for (int p = DEV_POOL_WEIGHTS; p <= DEV_POOL_KV; p++)
		for (int k = 0; k < 2 && (mask & (1u << p)); k++)
			for (struct segment *s = segments[p][k]; s; s = s->next) {
				CUresult cr;

				if (!s->asleep)
					continue;
				cr = create_and_map(s->first->ptr, s->size, &s->handle);
				if (cr == CUDA_SUCCESS && s->backup)
					cr = gpu.cuMemcpyHtoD(s->first->ptr, s->backup, s->size);
				if (cr != CUDA_SUCCESS) {
					r = gpu_errno(cr);
					goto out;
				}
				free(s->backup);
				s->backup = NULL;
				s->asleep = false;
			}
out:
	pthread_mutex_unlock(&lock);
	return r;
}
