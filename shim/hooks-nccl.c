/* SPDX-License-Identifier: MIT */
/*
 * The exported NCCL wrappers. Communicator lifecycle calls create and end the shim's records
 * (shim-nccl.c); every operation is counted issued before the real call and its completion
 * tracked after it; operations that write into a buffer (broadcast, recv) also bump the
 * weights version of the regions they write, so that an RL weight sync is seen. Reached by
 * programs linked against libnccl.so.2 and, through the dlsym hook, by ctypes users such as
 * vLLM's pynccl.
 */
#include <nccl.h>

#include "nccl-counters.h"
#include "hooks.h"
#include "shim-alloc.h"
#include "shim-conn.h"
#include "shim-nccl.h"
#include "shim-real.h"
#include "util.h"

/* Declared with the table's prototype: nccl.h's declaration must agree. */
#define X(sym, ret, params, args) _public_ ret sym params;
BELAYER_NCCL_HOOKS(X)
#undef X

static size_t nccl_type_size(ncclDataType_t t)
{
	switch (t) {
	case ncclInt8:
	case ncclUint8:
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
	case ncclFloat8e4m3:
	case ncclFloat8e5m2:
#endif
		return 1;
	case ncclFloat16:
	case ncclBfloat16:
		return 2;
	case ncclInt32:
	case ncclUint32:
	case ncclFloat32:
		return 4;
	case ncclInt64:
	case ncclUint64:
	case ncclFloat64:
		return 8;
	default:
		return 1; /* unknown: at least the first byte is written */
	}
}

/* One operation: counted, forwarded, tracked; a write of len bytes at wbuf on success. */
#define NCCL_OP(sym, opk, p2p, bytes, comm, stream, wbuf, wlen, ...)             \
	do {                                                                     \
		__typeof__(&sym) real_ = REAL_NCCL(sym);                         \
		struct nccl_op_ticket t_;                                        \
		ncclResult_t r_;                                                 \
		if (!real_)                                                      \
			return ncclSystemError;                                  \
		nccl_op_begin((comm), (opk), (bytes), (p2p), &t_);               \
		r_ = real_(__VA_ARGS__);                                         \
		nccl_op_end(&t_, (stream), r_);                                  \
		if ((r_ == ncclSuccess || r_ == ncclInProgress) && (wbuf))       \
			shim_note_write((CUdeviceptr)(uintptr_t)(wbuf), (wlen)); \
		return r_;                                                       \
	} while (0)

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
			   ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
	size_t n = count * nccl_type_size(datatype);

	NCCL_OP(ncclBroadcast, NCCL_OP_BROADCAST, false, n, comm, stream, recvbuff, n, sendbuff,
		recvbuff, count, datatype, root, comm, stream);
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
		       cudaStream_t stream)
{
	size_t n = count * nccl_type_size(datatype);

	NCCL_OP(ncclBcast, NCCL_OP_BROADCAST, false, n, comm, stream, buff, n, buff, count,
		datatype, root, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
		      ncclComm_t comm, cudaStream_t stream)
{
	size_t n = count * nccl_type_size(datatype);

	NCCL_OP(ncclRecv, NCCL_OP_RECV, true, n, comm, stream, recvbuff, n, recvbuff, count,
		datatype, peer, comm, stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
		      ncclComm_t comm, cudaStream_t stream)
{
	size_t n = count * nccl_type_size(datatype);

	NCCL_OP(ncclSend, NCCL_OP_SEND, true, n, comm, stream, NULL, 0, sendbuff, count, datatype,
		peer, comm, stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
			   ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
			   cudaStream_t stream)
{
	NCCL_OP(ncclAllReduce, NCCL_OP_ALL_REDUCE, false, count * nccl_type_size(datatype), comm,
		stream, NULL, 0, sendbuff, recvbuff, count, datatype, op, comm, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
			ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
	NCCL_OP(ncclReduce, NCCL_OP_REDUCE, false, count * nccl_type_size(datatype), comm, stream,
		NULL, 0, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
			   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
	NCCL_OP(ncclAllGather, NCCL_OP_ALL_GATHER, false, sendcount * nccl_type_size(datatype),
		comm, stream, NULL, 0, sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
			       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
			       cudaStream_t stream)
{
	NCCL_OP(ncclReduceScatter, NCCL_OP_REDUCE_SCATTER, false,
		recvcount * nccl_type_size(datatype), comm, stream, NULL, 0, sendbuff, recvbuff,
		recvcount, datatype, op, comm, stream);
}

/* Group sections: operations inside are launched by the outermost ncclGroupEnd, so their
 * completion events are recorded after it. */
ncclResult_t ncclGroupStart(void)
{
	__typeof__(&ncclGroupStart) real = REAL_NCCL(ncclGroupStart);
	ncclResult_t r;

	if (!real)
		return ncclSystemError;
	r = real();
	if (r == ncclSuccess)
		nccl_group_start();
	return r;
}

ncclResult_t ncclGroupEnd(void)
{
	__typeof__(&ncclGroupEnd) real = REAL_NCCL(ncclGroupEnd);
	ncclResult_t r;

	if (!real)
		return ncclSystemError;
	r = real();
	nccl_group_end(r);
	return r;
}

/* ---- communicator lifecycle ---- */

static bool created(ncclResult_t r)
{
	return r == ncclSuccess || r == ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
	__typeof__(&ncclCommInitRank) real = REAL_NCCL(ncclCommInitRank);
	ncclResult_t r;

	if (!real)
		return ncclSystemError;
	r = real(comm, nranks, commId, rank);
	if (created(r) && comm &&
	    nccl_comm_created(*comm, &commId, NCCL_ORIGIN_INIT_RANK, NULL, 0, rank, nranks,
			      r == ncclInProgress))
		conn_start();
	return r;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
				    ncclConfig_t *config)
{
	__typeof__(&ncclCommInitRankConfig) real = REAL_NCCL(ncclCommInitRankConfig);
	ncclResult_t r;

	if (!real)
		return ncclSystemError;
	r = real(comm, nranks, commId, rank, config);
	/* Nonblocking (config->blocking = 0): the handle is returned at once, ncclInProgress,
	 * and NCCL refuses to say its rank or size until its init is done. */
	if (created(r) && comm &&
	    nccl_comm_created(*comm, &commId, NCCL_ORIGIN_INIT_RANK_CONFIG, NULL, 0, rank, nranks,
			      r == ncclInProgress))
		conn_start();
	return r;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
	__typeof__(&ncclCommInitAll) real = REAL_NCCL(ncclCommInitAll);
	ncclResult_t r;

	if (!real)
		return ncclSystemError;
	r = real(comm, ndev, devlist);
	/* One clique: every rank must get the same hash, so the call is counted once. */
	if (created(r) && comm && nccl_initall_created(comm, ndev))
		conn_start();
	return r;
}

/* After a split/shrink returned r. A nonblocking parent's returns ncclInProgress with
 * *newcomm NULL: "*newcomm should be NCCL_COMM_NULL until comm split fully complete"
 * (NCCL's init.cc); the child is taken when the parent says ncclSuccess (ncclCommGetAsyncError
 * below). */
static void split_made(ncclResult_t r, ncclComm_t parent, ncclComm_t *newcomm,
		       enum nccl_origin origin, uint64_t salt)
{
	if (!created(r) || !newcomm)
		return;
	if (*newcomm) {
		if (nccl_comm_created(*newcomm, NULL, origin, parent, salt, -1, -1,
				      r == ncclInProgress))
			conn_start();
	} else if (r == ncclInProgress) {
		nccl_split_pending(parent, newcomm, origin, salt);
	}
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
			   ncclConfig_t *config)
{
	__typeof__(&ncclCommSplit) real = REAL_NCCL(ncclCommSplit);
	uint64_t ord;
	ncclResult_t r;

	if (!real)
		return ncclSystemError;
	/* Every rank of the parent takes part, in the same order: the ordinal is common. */
	ord = nccl_comm_next_split(comm);
	r = real(comm, color, key, newcomm, config);
	split_made(r, comm, newcomm, NCCL_ORIGIN_SPLIT, (ord << 32) ^ (uint64_t)(uint32_t)color);
	return r;
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
			    ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
	__typeof__(&ncclCommShrink) real = REAL_NCCL(ncclCommShrink);
	uint64_t ord, salt;
	ncclResult_t r;

	if (!real)
		return ncclInvalidUsage; /* a library before 2.27 has no shrink */
	ord = nccl_comm_next_split(comm);
	r = real(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags);
	salt = ord << 32;
	for (int i = 0; excludeRanksList && i < excludeRanksCount; i++)
		salt = salt * 31 + (uint64_t)(uint32_t)excludeRanksList[i] + 1;
	split_made(r, comm, newcomm, NCCL_ORIGIN_SHRINK, salt);
	return r;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
	__typeof__(&ncclCommFinalize) real = REAL_NCCL(ncclCommFinalize);

	if (!real)
		return ncclSystemError;
	nccl_comm_ending(comm, NCCL_END_FINALIZE);
	return real(comm);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	__typeof__(&ncclCommDestroy) real = REAL_NCCL(ncclCommDestroy);
	ncclResult_t r;

	if (!real)
		return ncclSystemError;
	nccl_comm_ending(comm, NCCL_END_DESTROY);
	r = real(comm);
	nccl_comm_gone(comm, NCCL_END_DESTROY);
	return r;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	__typeof__(&ncclCommAbort) real = REAL_NCCL(ncclCommAbort);
	ncclResult_t r;

	if (!real)
		return ncclSystemError;
	nccl_comm_ending(comm, NCCL_END_ABORT);
	r = real(comm);
	nccl_comm_gone(comm, NCCL_END_ABORT);
	return r;
}

/* The caller polls a nonblocking communicator (NCCL requires it after ncclInProgress): when a
 * parent says ncclSuccess, the children of its splits are in the caller's *newcomm. The
 * shim's own calls (shim_busy) pass straight through. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
	__typeof__(&ncclCommGetAsyncError) real = REAL_NCCL(ncclCommGetAsyncError);
	ncclResult_t r;

	if (!real)
		return ncclSystemError;
	r = real(comm, asyncError);
	if (r == ncclSuccess && asyncError && !shim_busy && nccl_comm_polled(comm, *asyncError))
		conn_start();
	return r;
}

const struct hook_info nccl_hooks[_NCCL_HOOK_MAX] = {
#define X(sym, ret, params, args) [NCCL_HOOK_##sym] = {.name = #sym, .wrapper = (void *)sym},
	BELAYER_NCCL_HOOKS(X)
#undef X
};
