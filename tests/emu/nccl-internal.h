/* SPDX-License-Identifier: MIT */
/*
 * The emulated libnccl.so.2: what its files share. A communicator is one shared-memory segment
 * (nccl-shm.c) that every rank maps, a modest device buffer allocated through the driver like
 * NCCL's own (nccl-cuda.c), and operations progressed by one engine (nccl-coll.c) that waits
 * on the segment's futex in short, abortable slices. Test-only.
 */
#pragma once

#include <nccl.h>
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* Byte layout of ncclUniqueId.internal: a magic and a random nonce naming the rendezvous. */
#define NCCL_EMU_ID_MAGIC    "belayer-nccl-id"
#define NCCL_EMU_NONCE_BYTES 16

#define NCCL_EMU_MAX_RANKS 64

/* One rank's state in the segment. Counters only grow; a peer that dies stops them, so its
 * peers wait (hang) exactly as they would on a real GPU. */
struct nccl_shm_rank {
	_Atomic uint32_t joined;
	int32_t pid;
	int32_t bus; /* the device's PCI location (nccl_cuda_bus_id), what NCCL compares */
	uint32_t reserved;
	_Atomic uint64_t posted;   /* collective steps whose slot data is written */
	_Atomic uint64_t consumed; /* collective steps whose peers' slots this rank has read */
	_Atomic uint64_t colls;	   /* operations entered, for observers */
	char pad[24];
};

/* One ordered (sender, receiver) byte stream for ncclSend/ncclRecv. */
struct nccl_shm_chan {
	_Atomic uint64_t head; /* bytes written by the sender */
	_Atomic uint64_t tail; /* bytes read by the receiver */
	char pad[48];
};

struct nccl_shm_hdr {
	char magic[16];
	uint32_t nranks;
	uint32_t chan_bytes;
	uint64_t slot_bytes;
	uint64_t size;
	_Atomic uint32_t doorbell; /* futex word: bumped on every state change */
	_Atomic uint32_t waiters;
	_Atomic uint32_t njoined;
	uint32_t reserved;
	/* followed by: ranks[nranks], chans[nranks * nranks], slots, channel data */
};

struct nccl_shm {
	struct nccl_shm_hdr *hdr;
	size_t size;
	struct nccl_shm_rank *ranks;
	struct nccl_shm_chan *chans;
	uint8_t *slots;
	uint8_t *chan_data;
};

/* Device memory NCCL allocates itself: reserve + create + map + set access. */
struct nccl_vmm {
	CUdeviceptr va;
	size_t size;
	CUmemGenericAllocationHandle handle;
};

#define NCCL_COMM_MAGIC 0x6e63636c636f6d6dULL /* live communicator */
#define NCCL_COMM_DEAD	0x6e63636c64656164ULL /* destroyed or aborted: kept as a tombstone */

struct ncclComm {
	_Atomic uint64_t magic;
	int nranks;
	int rank;
	int dev;
	uint8_t nonce[NCCL_EMU_NONCE_BYTES];
	ncclConfig_t config;
	bool initialized; /* rendezvous complete */
	bool finalized;
	struct nccl_shm shm;
	uint64_t step;	  /* collective steps this rank has posted */
	uint64_t nsplits; /* ncclCommSplit calls, equal on every rank */
	/* The driver-allocated internal buffer (see nccl-cuda.c). */
	struct nccl_vmm buf;
	/* Abort: set by ncclCommAbort, read by every wait; inflight counts threads inside the
	 * communicator so that abort frees nothing they still use. */
	_Atomic int aborted;
	_Atomic int inflight;
	_Atomic int async_error;
	pthread_mutex_t lock; /* destroy/abort against each other */
	/* The library instance that made it: a second copy of libnccl.so.2 loaded by path in
	 * the same process (vLLM's VLLM_NCCL_SO_PATH) has its own state and does not know this
	 * communicator; nccl.h's handle is opaque to every other library. */
	const void *owner;
};

/* nccl-shm.c */
size_t nccl_shm_size(int nranks, uint64_t *ret_slot_bytes, uint32_t *ret_chan_bytes);
/* Joins (creating it if first) the rendezvous segment named by nonce as rank, without waiting
 * for the others. 0, -EINVAL (nranks differs from the segment's), -EADDRINUSE (rank taken). */
int nccl_shm_join(struct nccl_shm *shm, const uint8_t nonce[NCCL_EMU_NONCE_BYTES], int nranks,
		  int rank, int bus);
bool nccl_shm_all_joined(const struct nccl_shm *shm);
void nccl_shm_unmap(struct nccl_shm *shm);
void nccl_shm_wake(struct nccl_shm *shm);
/* Sleeps until the doorbell moves from seen or timeout_ms passes; call with the value read
 * before the condition was checked. */
void nccl_shm_wait(struct nccl_shm *shm, uint32_t seen, int timeout_ms);
static inline uint32_t nccl_shm_doorbell(const struct nccl_shm *shm)
{
	return atomic_load(&shm->hdr->doorbell);
}
static inline uint8_t *nccl_shm_slot(const struct nccl_shm *shm, int rank)
{
	return shm->slots + (size_t)rank * shm->hdr->slot_bytes;
}
static inline struct nccl_shm_chan *nccl_shm_chan(const struct nccl_shm *shm, int from, int to)
{
	return &shm->chans[(size_t)from * shm->hdr->nranks + to];
}
static inline uint8_t *nccl_shm_chan_data(const struct nccl_shm *shm, int from, int to)
{
	return shm->chan_data +
	       ((size_t)from * shm->hdr->nranks + to) * (size_t)shm->hdr->chan_bytes;
}

/* nccl-cuda.c: the driver, reached as the real NCCL reaches it. */
int nccl_cuda_current_device(int *ret_dev);
/* The PCI location of CUDA device dev (domain, bus, device, function in one number): the same
 * GPU has the same one in every process, whatever CUDA_VISIBLE_DEVICES renumbered. */
int nccl_cuda_bus_id(int dev);
/* size is rounded up to the allocation granularity. 0 or -EIO. */
int nccl_cuda_vmm_alloc(int dev, size_t size, struct nccl_vmm *ret);
void nccl_cuda_vmm_free(struct nccl_vmm *vmm);
/* Host view of device memory [ptr, ptr + size), NULL when not mapped and accessible. */
void *nccl_cuda_translate(const void *ptr, size_t size);
/* Whether stream s is capturing (cuStreamIsCapturing), false when it cannot tell. */
bool nccl_cuda_capturing(cudaStream_t s);
/* cuLaunchHostFunc(s, fn, arg): 0 or -EIO. */
int nccl_cuda_host_func(cudaStream_t s, void (*fn)(void *), void *arg);

/* nccl-reduce.c */
size_t nccl_type_size(ncclDataType_t type); /* 0: not supported by the emulator */
bool nccl_op_valid(ncclRedOp_t op);
/* acc[i] = acc[i] op in[i] for n elements */
void nccl_reduce(void *acc, const void *in, size_t n, ncclDataType_t type, ncclRedOp_t op);
/* acc[i] /= nranks, the final step of ncclAvg */
void nccl_reduce_avg_finish(void *acc, size_t n, ncclDataType_t type, int nranks);

/* nccl-comm.c */
ncclResult_t nccl_result_from_errno(int r);
void nccl_set_last_error(const char *fmt, ...) _printf_(1, 2);
int nccl_lib_init(void);
bool nccl_comm_valid(const struct ncclComm *comm);
/* Rendezvous of an allocated communicator, in two halves so that one thread can join several
 * ranks (ncclCommInitAll, grouped ncclCommInitRank) before waiting for any. */
int nccl_comm_join(struct ncclComm *comm);
int nccl_comm_finish_init(struct ncclComm *comm);
struct ncclComm *nccl_comm_new(int nranks, int rank, int dev,
			       const uint8_t nonce[NCCL_EMU_NONCE_BYTES],
			       const ncclConfig_t *config);
void nccl_comm_release(struct ncclComm *comm);

/* nccl-async.c: nonblocking communicators. Runs run(arg) on a thread of its own, then
 * finish(arg, its result) (either may be NULL); until then comms[0..n) report ncclInProgress
 * and count as in use (inflight). 0 or -errno (nothing started). */
int nccl_async_launch(struct ncclComm *const *comms, size_t n, int (*run)(void *arg),
		      void (*finish)(void *arg, int r), void *arg);
/* ncclCommEnsureReady: -EINVAL (with the last error set) while comm's previous nonblocking
 * operation is in progress, else 0. */
int nccl_comm_ensure_ready(const struct ncclComm *comm);
static inline bool nccl_comm_blocking(const struct ncclComm *comm)
{
	return comm->config.blocking != 0; /* NCCL_CONFIG_UNDEF_INT too: blocking by default */
}

/* nccl.h declares both nccl* and pnccl* (the profiling names): one body, two exports. */
#define NCCL_ALIAS(name) \
	extern __typeof__(name) p##name __attribute__((alias(#name), visibility("default")))

/* nccl.h declares these with "()", which in C is no prototype. */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

/* nccl-coll.c */
bool nccl_in_group(void);
/* Initializes comm now (outside any group): join, wait for every rank, allocate. */
int nccl_group_run_init(struct ncclComm *comm);
/* Queues the deferred initialization of comm in the current group. */
int nccl_group_add_init(struct ncclComm *comm);
/* ncclCommSplit's exchange of (color, key) over the parent: an all-gather of host ints. */
int nccl_split_exchange(struct ncclComm *comm, const int32_t mine[2], int32_t *ret_all);
