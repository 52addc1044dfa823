/* SPDX-License-Identifier: MIT */
/*
 * Shared by the real-GPU check programs (tests/gpu/README.md). They are built on the GPU
 * machine with nothing but a C compiler, the CUDA toolkit's headers and -ldl, so they use no
 * project library: this file and gpu-check.c are all they share.
 *
 * The driver is reached as the CUDA runtime reaches it: dlopen("libcuda.so.1"),
 * dlsym("cuGetProcAddress_v2"), then every entry point by name at the CUDA version of its
 * cudaTypedefs.h prototype.
 *
 * Output convention (run.sh reads it): detail lines on stdout, one line "summary: TEXT" that
 * run.sh puts on the check's PASS/FAIL line; exit 0 = PASS, GPU_EXIT_NA = not applicable
 * (the summary says why), anything else = FAIL.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#define GPU_EXIT_NA 77

/* Entry points the checks use, with the CUDA version of the cudaTypedefs.h prototype. */
#define GPU_CU_FUNCS(X)                                  \
	X(cuInit, 2000)                                  \
	X(cuDriverGetVersion, 2020)                      \
	X(cuGetErrorName, 6000)                          \
	X(cuDeviceGet, 2000)                             \
	X(cuDeviceGetCount, 2000)                        \
	X(cuDeviceGetName, 2000)                         \
	X(cuDeviceGetUuid, 11040)                        \
	X(cuDeviceGetAttribute, 2000)                    \
	X(cuDevicePrimaryCtxRetain, 7000)                \
	X(cuCtxSetCurrent, 4000)                         \
	X(cuCtxSynchronize, 2000)                        \
	X(cuMemcpyHtoD, 3020)                            \
	X(cuMemcpyDtoH, 3020)                            \
	X(cuMemGetAllocationGranularity, 10020)          \
	X(cuMemCreate, 10020)                            \
	X(cuMemRelease, 10020)                           \
	X(cuMemAddressReserve, 10020)                    \
	X(cuMemAddressFree, 10020)                       \
	X(cuMemMap, 10020)                               \
	X(cuMemUnmap, 10020)                             \
	X(cuMemSetAccess, 10020)                         \
	X(cuMemExportToShareableHandle, 10020)           \
	X(cuMemImportFromShareableHandle, 10020)         \
	X(cuMemRetainAllocationHandle, 11000)            \
	X(cuMemGetAllocationPropertiesFromHandle, 10020) \
	X(cuMemcpyDtoDAsync, 3020)                       \
	X(cuStreamCreate, 2000)                          \
	X(cuStreamDestroy, 4000)                         \
	X(cuStreamSynchronize, 2000)                     \
	X(cuStreamBeginCapture, 10010)                   \
	X(cuStreamEndCapture, 10000)                     \
	X(cuGraphInstantiateWithFlags, 11040)            \
	X(cuGraphLaunch, 10000)                          \
	X(cuGraphExecDestroy, 10000)                     \
	X(cuGraphDestroy, 10000)                         \
	X(cuModuleLoadData, 2000)                        \
	X(cuModuleGetFunction, 2000)                     \
	X(cuLaunchKernel, 4000)

#define GPU_CU_FIELD(name, ver) PFN_##name##_v##ver name;
struct gpu_cu {
	void *lib;
	GPU_CU_FUNCS(GPU_CU_FIELD)
};
#undef GPU_CU_FIELD

extern struct gpu_cu cu;

/* Loads libcuda.so.1, resolves GPU_CU_FUNCS, calls cuInit and makes device dev's primary
 * context current. Returns 0 or -1 after printing what failed. */
int gpu_cu_open(int dev);

/* "CUDA_ERROR_..." for r (the driver's name when it has one). */
const char *gpu_cu_name(CUresult r);

/* A VMM allocation of size bytes (a multiple of the granularity) on dev, created with
 * CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested, mapped and readable/writable by dev. */
CUresult gpu_vmm_alloc(int dev, size_t size, CUmemGenericAllocationHandle *ret_handle,
		       CUdeviceptr *ret_va);
/* Reserves, maps handle h (size bytes) and grants dev access; *ret_va is the mapping. */
CUresult gpu_vmm_map(CUmemGenericAllocationHandle h, size_t size, int dev, CUdeviceptr *ret_va);

/* The test pattern: 64-bit word i of the buffer is gpu_pattern_word(seed, i). */
static inline uint64_t gpu_pattern_word(uint64_t seed, uint64_t i)
{
	uint64_t x = seed ^ (i * 0x9e3779b97f4a7c15ull);

	x ^= x >> 31;
	x *= 0xbf58476d1ce4e5b9ull;
	return x ^ (x >> 29);
}

/* Fills [va, va + size) with the pattern through HtoD copies. */
CUresult gpu_pattern_fill(CUdeviceptr va, size_t size, uint64_t seed);
/* Reads [va, va + size) back with DtoH copies and compares: *ret_bad is the number of 8-byte
 * words that differ, *ret_first_bad the byte offset of the first (or size). */
CUresult gpu_pattern_check(CUdeviceptr va, size_t size, uint64_t seed, uint64_t *ret_bad,
			   uint64_t *ret_first_bad);

/* One fd and an 8-byte value over a Unix socket (SCM_RIGHTS); fd < 0 sends the value alone. */
int gpu_send(int sock, int fd, uint64_t value);
/* Waits at most timeout_ms; returns the fd received (or -1 if none came with the value) in
 * *ret_fd. Returns 0 or -errno (-ETIMEDOUT, -ECONNRESET at EOF). */
int gpu_recv(int sock, int timeout_ms, int *ret_fd, uint64_t *ret_value);

/* Runs fn(arg) in a child process; the child exits with fn's return value. */
pid_t gpu_fork(int (*fn)(void *arg), void *arg);
/* Waits for pid at most timeout_ms: its waitpid() status, or -ETIMEDOUT (then pid is killed
 * and reaped). */
int gpu_wait(pid_t pid, int timeout_ms);

/* Seconds on the monotonic clock. */
double gpu_now(void);

/* Parses N with an optional K/M/G suffix (powers of 1024). */
int gpu_parse_size(const char *s, uint64_t *ret);
