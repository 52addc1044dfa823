/* SPDX-License-Identifier: MIT */
/*
 * The engine reaches the GPU as real programs do: libcuda.so.1 dlopen()ed and every entry
 * point resolved by name and version through cuGetProcAddress_v2 (as cudart and PyTorch do);
 * libnccl.so.2 dlopen()ed and resolved with dlsym (as vLLM's ctypes wrapper does). Nothing is
 * linked at build time, so the same binary runs on the emulator and on a real driver.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <nccl.h>

#define ENGINE_CU_FUNCS(X)                    \
	X(cuInit, 2000)                       \
	X(cuGetErrorName, 6000)               \
	X(cuDeviceGet, 2000)                  \
	X(cuDeviceGetCount, 2000)             \
	X(cuDeviceGetName, 2000)              \
	X(cuDevicePrimaryCtxRetain, 7000)     \
	X(cuCtxSetCurrent, 4000)              \
	X(cuCtxSynchronize, 2000)             \
	X(cuMemAlloc, 3020)                   \
	X(cuMemFree, 3020)                    \
	X(cuMemGetInfo, 3020)                 \
	X(cuMemcpyHtoD, 3020)                 \
	X(cuMemcpyDtoH, 3020)                 \
	X(cuMemcpyDtoD, 3020)                 \
	X(cuMemsetD8, 3020)                   \
	X(cuModuleLoadData, 2000)             \
	X(cuModuleGetFunction, 2000)          \
	X(cuLaunchKernel, 4000)               \
	X(cuStreamCreate, 2000)               \
	X(cuStreamSynchronize, 2000)          \
	X(cuIpcGetMemHandle, 4010)            \
	X(cuIpcOpenMemHandle, 11000)          \
	X(cuStreamBeginCapture, 10010)        \
	X(cuStreamEndCapture, 10000)          \
	X(cuGraphInstantiateWithFlags, 11040) \
	X(cuGraphLaunch, 10000)               \
	X(cuGraphDestroy, 10000)              \
	X(cuMemAddressReserve, 10020)         \
	X(cuMemAddressFree, 10020)            \
	X(cuMemCreate, 10020)                 \
	X(cuMemRelease, 10020)                \
	X(cuMemMap, 10020)                    \
	X(cuMemUnmap, 10020)                  \
	X(cuMemSetAccess, 10020)

#define ENGINE_NCCL_FUNCS(X)      \
	X(ncclGetUniqueId)        \
	X(ncclCommInitRank)       \
	X(ncclCommInitRankConfig) \
	X(ncclCommGetAsyncError)  \
	X(ncclCommDestroy)        \
	X(ncclCommAbort)          \
	X(ncclAllReduce)          \
	X(ncclBroadcast)          \
	X(ncclGetErrorString)

#define CU_FIELD(name, ver) PFN_##name##_v##ver name;
#define NCCL_FIELD(name)    __typeof__(&name) name;
struct gpu_api {
	void *cuda_lib, *nccl_lib;
	ENGINE_CU_FUNCS(CU_FIELD)
	ENGINE_NCCL_FUNCS(NCCL_FIELD)
	/* The emulator's belayer_emu_alloc_id, NULL on a real driver (GET /debug/kv). */
	int (*emu_alloc_id)(CUdeviceptr p, uint64_t *ret_id, uint64_t *ret_offset);
};
#undef CU_FIELD
#undef NCCL_FIELD

extern struct gpu_api gpu;

/* dlopen + resolve the driver, cuInit, retain device dev's primary context: 0 or -errno. */
int gpu_cuda_init(int dev);
/* dlopen + resolve NCCL: 0 or -errno. */
int gpu_nccl_load(void);
/* nr, what an NCCL call on comm returned; ncclInProgress (a nonblocking communicator, NCCL
 * still enqueueing): waits, polling ncclCommGetAsyncError as NCCL requires before the next
 * call or stream work, and returns the state it settles in. As PyTorch's ProcessGroupNCCL does
 * with TORCH_NCCL_USE_COMM_NONBLOCKING=1. */
ncclResult_t gpu_nccl_wait(ncclComm_t comm, ncclResult_t nr);
/* Loads the embedded PTX module and its functions. */
int gpu_kernels_load(void);

/* Name of a CUresult, for messages. */
const char *gpu_strerror(CUresult r);
/* CUresult -> -errno (-EIO for anything but out of memory). */
int gpu_errno(CUresult r);

/* Launches kernel (by entry name) over n elements with args (its struct). 0 or -errno. */
int gpu_launch(const char *kernel, uint64_t n, void *args);
/* Waits for everything launched on the engine's stream. */
int gpu_sync(void);
CUstream gpu_stream(void);
