/* SPDX-License-Identifier: MIT */
/*
 * The exported NCCL wrappers: collectives that write into a buffer, so that an RL weight sync
 * (broadcast or recv into the model's weights) bumps the weights version of the regions it
 * writes. Reached by programs linked against libnccl.so.2 and, through the dlsym hook, by
 * ctypes users such as vLLM's pynccl.
 */
#include <nccl.h>

#include "shim.h"
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

#define NCCL_WRITE(sym, buf, count, type, ...)                         \
	do {                                                           \
		__typeof__(&sym) real_ = REAL_NCCL(sym);               \
		if (!real_)                                            \
			return ncclSystemError;                        \
		ncclResult_t r_ = real_(__VA_ARGS__);                  \
		if (r_ == ncclSuccess)                                 \
			shim_note_write((CUdeviceptr)(uintptr_t)(buf), \
					(count)*nccl_type_size(type)); \
		return r_;                                             \
	} while (0)

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
			   ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
	NCCL_WRITE(ncclBroadcast, recvbuff, count, datatype, sendbuff, recvbuff, count, datatype,
		   root, comm, stream);
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
		       cudaStream_t stream)
{
	NCCL_WRITE(ncclBcast, buff, count, datatype, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
		      ncclComm_t comm, cudaStream_t stream)
{
	NCCL_WRITE(ncclRecv, recvbuff, count, datatype, recvbuff, count, datatype, peer, comm,
		   stream);
}

const struct hook_info nccl_hooks[_NCCL_HOOK_MAX] = {
#define X(sym, ret, params, args) [NCCL_HOOK_##sym] = {.name = #sym, .wrapper = (void *)sym},
	BELAYER_NCCL_HOOKS(X)
#undef X
};
