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
};

/* [pool][0: small, 1: large] */
static struct segment *segments[DEV_POOL_MAX][2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

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

static int segment_create(struct segment **list, uint64_t size)
{
	struct segment *s = calloc(1, sizeof(*s));
	struct block *b = calloc(1, sizeof(*b));
	CUresult r;

	if (!s || !b) {
		free(s);
		free(b);
		return -ENOMEM;
	}
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

				if (s->first->used || s->first->next) {
					sp = &s->next;
					continue;
				}
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
		r = segment_create(list, segment_size(size));
		/* as PyTorch: on out of memory, give the cached segments back and retry once */
		if (r == -ENOMEM) {
			empty_cache_locked();
			r = segment_create(list, segment_size(size));
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
