/* SPDX-License-Identifier: MIT */
/*
 * The one list of every symbol libbelayer.so hooks. Everything else the shim knows about a
 * hooked symbol (its exported wrapper, its slot in the table of real functions, how
 * cuGetProcAddress and dlsym map to it, the version script, the symbol-table test) is derived
 * from these lists.
 *
 * CUDA entries: X(sym, proc, version, ptds, pfn)
 *   sym      the driver's exported name, which our wrapper also has
 *   proc     the name cuGetProcAddress is asked for ("cuMemAlloc" for cuMemAlloc_v2)
 *   version  the first CUDA version (cuGetProcAddress's cudaVersion) that resolves proc to sym:
 *            the version whose cuda.h #defines proc to sym, which may be later than the one
 *            in pfn's name (cuCtxCreate_v4 appeared in 12.5, cuda.h maps cuCtxCreate to it
 *            from 13.0); BELAYER_PROC_NEVER for a variant proc never resolves to
 *            (cuCtxCreate_v3). The wrappers trust the pointer the driver returned first, this
 *            only when the driver's own pointers are unknown (hooks-cuda.c).
 *   ptds     1 for the per-thread-default-stream variant (_ptds/_ptsz), 0 otherwise
 *   pfn      the cudaTypedefs.h type of sym: each wrapper is declared with it, so a wrapper
 *            that disagrees with cuda.h does not compile
 * Entries with the same proc are listed in increasing version order.
 *
 * NCCL entries: X(sym, ret, params, args) with the prototype spelled out; nccl.h's own
 * declaration of sym must agree with it or hooks-nccl.c does not compile.
 */
#pragma once

/* A version no driver reaches: the variant is never what cuGetProcAddress answers. */
#define BELAYER_PROC_NEVER 999999

#define BELAYER_CUDA_HOOKS(X)                                                                      \
	X(cuInit, "cuInit", 2000, 0, PFN_cuInit_v2000)                                             \
	X(cuGetProcAddress, "cuGetProcAddress", 11030, 0, PFN_cuGetProcAddress_v11030)             \
	X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0, PFN_cuGetProcAddress_v12000)          \
	X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0,                           \
	  PFN_cuDevicePrimaryCtxRetain_v7000)                                                      \
	X(cuCtxCreate_v2, "cuCtxCreate", 3020, 0, PFN_cuCtxCreate_v3020)                           \
	X(cuCtxCreate_v3, "cuCtxCreate", BELAYER_PROC_NEVER, 0, PFN_cuCtxCreate_v11040)            \
	X(cuCtxCreate_v4, "cuCtxCreate", 13000, 0, PFN_cuCtxCreate_v12050)                         \
	X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0, PFN_cuMemGetInfo_v3020)                        \
	X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0, PFN_cuMemAlloc_v3020)                              \
	X(cuMemFree_v2, "cuMemFree", 3020, 0, PFN_cuMemFree_v3020)                                 \
	X(cuMemGetAddressRange_v2, "cuMemGetAddressRange", 3020, 0,                                \
	  PFN_cuMemGetAddressRange_v3020)                                                          \
	X(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0, PFN_cuMemAllocAsync_v11020)                \
	X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1, PFN_cuMemAllocAsync_v11020_ptsz)      \
	X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0,                            \
	  PFN_cuMemAllocFromPoolAsync_v11020)                                                      \
	X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1,                       \
	  PFN_cuMemAllocFromPoolAsync_v11020_ptsz)                                                 \
	X(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0, PFN_cuMemFreeAsync_v11020)                   \
	X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1, PFN_cuMemFreeAsync_v11020_ptsz)         \
	X(cuMemCreate, "cuMemCreate", 10020, 0, PFN_cuMemCreate_v10020)                            \
	X(cuMemRelease, "cuMemRelease", 10020, 0, PFN_cuMemRelease_v10020)                         \
	X(cuMemMap, "cuMemMap", 10020, 0, PFN_cuMemMap_v10020)                                     \
	X(cuMemUnmap, "cuMemUnmap", 10020, 0, PFN_cuMemUnmap_v10020)                               \
	X(cuMemAddressReserve, "cuMemAddressReserve", 10020, 0, PFN_cuMemAddressReserve_v10020)    \
	X(cuMemAddressFree, "cuMemAddressFree", 10020, 0, PFN_cuMemAddressFree_v10020)             \
	X(cuMemSetAccess, "cuMemSetAccess", 10020, 0, PFN_cuMemSetAccess_v10020)                   \
	X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020, 0,                  \
	  PFN_cuMemExportToShareableHandle_v10020)                                                 \
	X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 11000, 0,                    \
	  PFN_cuMemRetainAllocationHandle_v11000)                                                  \
	X(cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle", 10020, \
	  0, PFN_cuMemGetAllocationPropertiesFromHandle_v10020)                                    \
	X(cuMulticastBindMem, "cuMulticastBindMem", 12010, 0, PFN_cuMulticastBindMem_v12010)       \
	X(cuMulticastBindAddr, "cuMulticastBindAddr", 12010, 0, PFN_cuMulticastBindAddr_v12010)    \
	X(cuPointerGetAttribute, "cuPointerGetAttribute", 4000, 0,                                 \
	  PFN_cuPointerGetAttribute_v4000)                                                         \
	X(cuPointerGetAttributes, "cuPointerGetAttributes", 7000, 0,                               \
	  PFN_cuPointerGetAttributes_v7000)                                                        \
	X(cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010, 0, PFN_cuIpcGetMemHandle_v4010)            \
	X(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", 11000, 0, PFN_cuIpcOpenMemHandle_v11000)    \
	X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 4010, 0, PFN_cuIpcCloseMemHandle_v4010)      \
	X(cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020, 0, PFN_cuMemcpyHtoD_v3020)                        \
	X(cuMemcpyHtoD_v2_ptds, "cuMemcpyHtoD", 7000, 1, PFN_cuMemcpyHtoD_v7000_ptds)              \
	X(cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync", 3020, 0, PFN_cuMemcpyHtoDAsync_v3020)         \
	X(cuMemcpyHtoDAsync_v2_ptsz, "cuMemcpyHtoDAsync", 7000, 1,                                 \
	  PFN_cuMemcpyHtoDAsync_v7000_ptsz)                                                        \
	X(cuMemcpyDtoD_v2, "cuMemcpyDtoD", 3020, 0, PFN_cuMemcpyDtoD_v3020)                        \
	X(cuMemcpyDtoD_v2_ptds, "cuMemcpyDtoD", 7000, 1, PFN_cuMemcpyDtoD_v7000_ptds)              \
	X(cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync", 3020, 0, PFN_cuMemcpyDtoDAsync_v3020)         \
	X(cuMemcpyDtoDAsync_v2_ptsz, "cuMemcpyDtoDAsync", 7000, 1,                                 \
	  PFN_cuMemcpyDtoDAsync_v7000_ptsz)                                                        \
	X(cuMemcpy, "cuMemcpy", 4000, 0, PFN_cuMemcpy_v4000)                                       \
	X(cuMemcpy_ptds, "cuMemcpy", 7000, 1, PFN_cuMemcpy_v7000_ptds)                             \
	X(cuMemcpyAsync, "cuMemcpyAsync", 4000, 0, PFN_cuMemcpyAsync_v4000)                        \
	X(cuMemcpyAsync_ptsz, "cuMemcpyAsync", 7000, 1, PFN_cuMemcpyAsync_v7000_ptsz)              \
	X(cuMemsetD8_v2, "cuMemsetD8", 3020, 0, PFN_cuMemsetD8_v3020)                              \
	X(cuMemsetD8_v2_ptds, "cuMemsetD8", 7000, 1, PFN_cuMemsetD8_v7000_ptds)                    \
	X(cuMemsetD8Async, "cuMemsetD8Async", 3020, 0, PFN_cuMemsetD8Async_v3020)                  \
	X(cuMemsetD8Async_ptsz, "cuMemsetD8Async", 7000, 1, PFN_cuMemsetD8Async_v7000_ptsz)        \
	X(cuMemsetD16_v2, "cuMemsetD16", 3020, 0, PFN_cuMemsetD16_v3020)                           \
	X(cuMemsetD16_v2_ptds, "cuMemsetD16", 7000, 1, PFN_cuMemsetD16_v7000_ptds)                 \
	X(cuMemsetD16Async, "cuMemsetD16Async", 3020, 0, PFN_cuMemsetD16Async_v3020)               \
	X(cuMemsetD16Async_ptsz, "cuMemsetD16Async", 7000, 1, PFN_cuMemsetD16Async_v7000_ptsz)     \
	X(cuMemsetD32_v2, "cuMemsetD32", 3020, 0, PFN_cuMemsetD32_v3020)                           \
	X(cuMemsetD32_v2_ptds, "cuMemsetD32", 7000, 1, PFN_cuMemsetD32_v7000_ptds)                 \
	X(cuMemsetD32Async, "cuMemsetD32Async", 3020, 0, PFN_cuMemsetD32Async_v3020)               \
	X(cuMemsetD32Async_ptsz, "cuMemsetD32Async", 7000, 1, PFN_cuMemsetD32Async_v7000_ptsz)

#define BELAYER_NCCL_HOOKS(X)                                                                      \
	X(ncclBroadcast, ncclResult_t,                                                             \
	  (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,  \
	   ncclComm_t comm, cudaStream_t stream),                                                  \
	  (sendbuff, recvbuff, count, datatype, root, comm, stream))                               \
	X(ncclBcast, ncclResult_t,                                                                 \
	  (void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,           \
	   cudaStream_t stream),                                                                   \
	  (buff, count, datatype, root, comm, stream))                                             \
	X(ncclRecv, ncclResult_t,                                                                  \
	  (void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,       \
	   cudaStream_t stream),                                                                   \
	  (recvbuff, count, datatype, peer, comm, stream))                                         \
	X(ncclSend, ncclResult_t,                                                                  \
	  (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, \
	   cudaStream_t stream),                                                                   \
	  (sendbuff, count, datatype, peer, comm, stream))                                         \
	X(ncclAllReduce, ncclResult_t,                                                             \
	  (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,            \
	   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),                                  \
	  (sendbuff, recvbuff, count, datatype, op, comm, stream))                                 \
	X(ncclReduce, ncclResult_t,                                                                \
	  (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,            \
	   ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream),                        \
	  (sendbuff, recvbuff, count, datatype, op, root, comm, stream))                           \
	X(ncclAllGather, ncclResult_t,                                                             \
	  (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,        \
	   ncclComm_t comm, cudaStream_t stream),                                                  \
	  (sendbuff, recvbuff, sendcount, datatype, comm, stream))                                 \
	X(ncclReduceScatter, ncclResult_t,                                                         \
	  (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,        \
	   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),                                  \
	  (sendbuff, recvbuff, recvcount, datatype, op, comm, stream))                             \
	X(ncclGroupStart, ncclResult_t, (void), ())                                                \
	X(ncclGroupEnd, ncclResult_t, (void), ())                                                  \
	X(ncclCommInitRank, ncclResult_t,                                                          \
	  (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank),                          \
	  (comm, nranks, commId, rank))                                                            \
	X(ncclCommInitRankConfig, ncclResult_t,                                                    \
	  (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config),    \
	  (comm, nranks, commId, rank, config))                                                    \
	X(ncclCommInitAll, ncclResult_t, (ncclComm_t * comm, int ndev, const int *devlist),        \
	  (comm, ndev, devlist))                                                                   \
	X(ncclCommSplit, ncclResult_t,                                                             \
	  (ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config),        \
	  (comm, color, key, newcomm, config))                                                     \
	X(ncclCommShrink, ncclResult_t,                                                            \
	  (ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,     \
	   ncclConfig_t *config, int shrinkFlags),                                                 \
	  (comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags))               \
	X(ncclCommFinalize, ncclResult_t, (ncclComm_t comm), (comm))                               \
	X(ncclCommDestroy, ncclResult_t, (ncclComm_t comm), (comm))                                \
	X(ncclCommAbort, ncclResult_t, (ncclComm_t comm), (comm))                                  \
	X(ncclCommGetAsyncError, ncclResult_t, (ncclComm_t comm, ncclResult_t * asyncError),       \
	  (comm, asyncError))

/* Symbols exported besides the hooks: the tagging API (belayer.h) and dlsym itself. */
#define BELAYER_EXTRA_EXPORTS(X) \
	X(belayer_set_tag) X(belayer_clear_tag) X(belayer_tags_only) X(dlsym)
