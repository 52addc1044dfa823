/* SPDX-License-Identifier: MIT */
/*
 * User-visible memory of the emulated NCCL: ncclMemAlloc/ncclMemFree (device memory NCCL
 * allocates through the driver's cuMem API on the caller's behalf) and buffer registration.
 * nccl.h: "NCCL malloc and free function for all types of NCCL optimizations (e.g. user
 * buffer registration). The actual allocated size might be larger than requested due to
 * granularity requirement."
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "emu-state.h"
#include "nccl-internal.h"

struct mem_block {
	struct mem_block *next;
	struct nccl_vmm vmm;
};

/* Few and long-lived: a list is enough. */
static struct mem_block *blocks;
static pthread_mutex_t blocks_lock = PTHREAD_MUTEX_INITIALIZER;

struct nccl_registration {
	struct ncclComm *comm;
	const void *buff;
	size_t size;
};

#define FAULT_POINT(name)                                                             \
	do {                                                                          \
		int fault_;                                                           \
		if (nccl_lib_init() == 0 && emu_fault_take(name, &fault_)) {          \
			nccl_set_last_error("%s: injected failure %d", name, fault_); \
			return (ncclResult_t)fault_;                                  \
		}                                                                     \
	} while (0)

/* On the current device, like cudaMalloc; a size of 0 gives NULL, as cudaMalloc(0) does. */
_public_ ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
	struct mem_block *b;
	int dev, r;

	FAULT_POINT("ncclMemAlloc");
	if (!ptr)
		return ncclInvalidArgument;
	*ptr = NULL;
	if (size == 0)
		return ncclSuccess;
	if (nccl_lib_init() < 0)
		return ncclSystemError;
	r = nccl_cuda_current_device(&dev);
	if (r < 0)
		return nccl_result_from_errno(r);
	b = calloc(1, sizeof(*b));
	if (!b)
		return ncclSystemError;
	r = nccl_cuda_vmm_alloc(dev, size, &b->vmm);
	if (r < 0) {
		free(b);
		nccl_set_last_error("ncclMemAlloc: %zu bytes on device %d failed", size, dev);
		return nccl_result_from_errno(r);
	}
	pthread_mutex_lock(&blocks_lock);
	b->next = blocks;
	blocks = b;
	pthread_mutex_unlock(&blocks_lock);
	*ptr = (void *)(uintptr_t)b->vmm.va;
	return ncclSuccess;
}
NCCL_ALIAS(ncclMemAlloc);

_public_ ncclResult_t ncclMemFree(void *ptr)
{
	struct mem_block **p, *b = NULL;

	FAULT_POINT("ncclMemFree");
	if (!ptr)
		return ncclSuccess;
	pthread_mutex_lock(&blocks_lock);
	for (p = &blocks; *p; p = &(*p)->next) {
		if ((void *)(uintptr_t)(*p)->vmm.va == ptr) {
			b = *p;
			*p = b->next;
			break;
		}
	}
	pthread_mutex_unlock(&blocks_lock);
	if (!b) {
		nccl_set_last_error("ncclMemFree: %p was not allocated by ncclMemAlloc", ptr);
		return ncclInvalidArgument;
	}
	nccl_cuda_vmm_free(&b->vmm);
	free(b);
	return ncclSuccess;
}
NCCL_ALIAS(ncclMemFree);

/* nccl.h: "Register CUDA buffer for zero-copy operation". The emulator copies either way, so
 * registration only checks that the range is device memory and hands out a handle. */
_public_ ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
				       void **handle)
{
	struct nccl_registration *reg;

	FAULT_POINT("ncclCommRegister");
	if (!nccl_comm_valid(comm) || !handle || !buff || size == 0)
		return ncclInvalidArgument;
	if (!nccl_cuda_translate(buff, size)) {
		nccl_set_last_error("ncclCommRegister: %p+%zu is not device memory", buff, size);
		return ncclInvalidArgument;
	}
	reg = calloc(1, sizeof(*reg));
	if (!reg)
		return ncclSystemError;
	*reg = (struct nccl_registration){.comm = comm, .buff = buff, .size = size};
	*handle = reg;
	return ncclSuccess;
}
NCCL_ALIAS(ncclCommRegister);

_public_ ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
	struct nccl_registration *reg = handle;

	FAULT_POINT("ncclCommDeregister");
	if (!nccl_comm_valid(comm) || !reg || reg->comm != comm)
		return ncclInvalidArgument;
	free(reg);
	return ncclSuccess;
}
NCCL_ALIAS(ncclCommDeregister);
