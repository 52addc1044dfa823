/* SPDX-License-Identifier: MIT */
/*
 * Shared by the emulator's own tests: reach libcuda.so.1 the way the CUDA runtime does
 * (dlopen, dlsym "cuGetProcAddress_v2", every entry point by name and version), run code in
 * child processes with bounded waits, pass fds between them.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "belayer-emu.h"

/* Entry points the tests use, with the CUDA version each is requested at (cudaTypedefs.h
 * PFN_<name>_v<version>). */
#define CU_FUNCS(X)                                      \
	X(cuInit, 2000)                                  \
	X(cuDriverGetVersion, 2020)                      \
	X(cuGetErrorName, 6000)                          \
	X(cuGetErrorString, 6000)                        \
	X(cuGetExportTable, 3000)                        \
	X(cuDeviceGet, 2000)                             \
	X(cuDeviceGetCount, 2000)                        \
	X(cuDeviceGetName, 2000)                         \
	X(cuDeviceGetUuid, 11040)                        \
	X(cuDeviceGetAttribute, 2000)                    \
	X(cuDeviceTotalMem, 3020)                        \
	X(cuDeviceGetPCIBusId, 4010)                     \
	X(cuDevicePrimaryCtxRetain, 7000)                \
	X(cuDevicePrimaryCtxRelease, 11000)              \
	X(cuDevicePrimaryCtxGetState, 7000)              \
	X(cuCtxCreate, 12050)                            \
	X(cuCtxDestroy, 4000)                            \
	X(cuCtxSetCurrent, 4000)                         \
	X(cuCtxGetCurrent, 4000)                         \
	X(cuCtxGetDevice, 2000)                          \
	X(cuCtxPushCurrent, 4000)                        \
	X(cuCtxPopCurrent, 4000)                         \
	X(cuCtxSynchronize, 2000)                        \
	X(cuMemAlloc, 3020)                              \
	X(cuMemFree, 3020)                               \
	X(cuMemGetInfo, 3020)                            \
	X(cuMemGetAddressRange, 3020)                    \
	X(cuMemAllocAsync, 11020)                        \
	X(cuMemFreeAsync, 11020)                         \
	X(cuPointerGetAttribute, 4000)                   \
	X(cuMemcpy, 4000)                                \
	X(cuMemcpyHtoD, 3020)                            \
	X(cuMemcpyDtoH, 3020)                            \
	X(cuMemcpyDtoD, 3020)                            \
	X(cuMemcpyHtoDAsync, 3020)                       \
	X(cuMemcpyDtoHAsync, 3020)                       \
	X(cuMemsetD8, 3020)                              \
	X(cuMemsetD32, 3020)                             \
	X(cuMemsetD32Async, 3020)                        \
	X(cuStreamCreate, 2000)                          \
	X(cuStreamDestroy, 4000)                         \
	X(cuStreamSynchronize, 2000)                     \
	X(cuEventCreate, 2000)                           \
	X(cuEventRecord, 2000)                           \
	X(cuEventSynchronize, 2000)                      \
	X(cuEventQuery, 2000)                            \
	X(cuEventElapsedTime, 12080)                     \
	X(cuEventDestroy, 4000)                          \
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
	X(cuMemGetAllocationPropertiesFromHandle, 10020) \
	X(cuMemRetainAllocationHandle, 11000)            \
	X(cuMulticastCreate, 12010)                      \
	X(cuMulticastBindMem, 12010)                     \
	X(cuIpcGetMemHandle, 4010)                       \
	X(cuIpcOpenMemHandle, 11000)                     \
	X(cuIpcCloseMemHandle, 4010)                     \
	X(cuModuleLoadData, 2000)                        \
	X(cuModuleUnload, 2000)                          \
	X(cuModuleGetFunction, 2000)                     \
	X(cuLibraryLoadData, 12000)                      \
	X(cuLibraryGetKernel, 12000)                     \
	X(cuLaunchKernel, 4000)                          \
	X(cuStreamQuery, 2000)                           \
	X(cuStreamBeginCapture, 10010)                   \
	X(cuStreamEndCapture, 10000)                     \
	X(cuStreamIsCapturing, 10000)                    \
	X(cuStreamGetCaptureInfo, 12030)                 \
	X(cuThreadExchangeStreamCaptureMode, 10010)      \
	X(cuGraphInstantiateWithFlags, 11040)            \
	X(cuGraphLaunch, 10000)                          \
	X(cuGraphExecDestroy, 10000)                     \
	X(cuGraphDestroy, 10000)                         \
	X(cuLaunchHostFunc, 10000)

#define CU_FIELD(name, ver) PFN_##name##_v##ver name;
struct cu_api {
	void *lib;
	PFN_cuGetProcAddress_v12000 getProcAddress;
	CU_FUNCS(CU_FIELD)
	/* belayer-emu.h, by dlsym */
	void *(*translate)(CUdeviceptr p, size_t len);
	int64_t (*live_allocations)(int dev, uint64_t *ret_bytes);
	int (*alloc_id)(CUdeviceptr p, uint64_t *ret_id, uint64_t *ret_offset);
};
#undef CU_FIELD

extern struct cu_api cu;

/* Points BELAYER_EMU_DIR at a fresh directory (with BELAYER_EMU_MEM=mem when not NULL), loads
 * the driver, resolves CU_FUNCS and calls cuInit. For cmocka group setup: 0 or -1. */
int cu_setup(const char *mem);
int cu_teardown(void);
/* cu_setup's second half, in the run BELAYER_EMU_DIR already names (a process exec'ed by a
 * test): cuInit's result, or -1 when the driver cannot be loaded. */
int cu_load(void);
/* Retains device dev's primary context and makes it current: 0 or a CUresult. */
int cu_use_device(int dev);

/* A VMM allocation of size bytes on dev (POSIX fd exportable when exportable). */
CUresult cu_vmm_create(int dev, size_t size, bool exportable, CUmemGenericAllocationHandle *ret);
/* Reserves, maps h and grants dev read-write access: the usual four calls. */
CUresult cu_vmm_map(CUmemGenericAllocationHandle h, size_t size, int dev, CUdeviceptr *ret);
void cu_vmm_unmap(CUdeviceptr p, size_t size);

/* Runs fn(arg) in a child process, whose exit status is fn's return value. */
pid_t test_fork(int (*fn)(void *arg), void *arg);
/* Waits for pid at most timeout_ms: its waitpid() status, or -ETIMEDOUT (pid killed). */
int test_wait(pid_t pid, int timeout_ms);
/* Exit code of a child that exited normally, else 1000 + signal, else -1. */
int test_wait_exit(pid_t pid, int timeout_ms);

/* One fd (and an 8-byte value) across a SOCK_SEQPACKET socket. */
int test_send_fd(int sock, int fd, uint64_t value);
int test_recv_fd(int sock, uint64_t *ret_value); /* the fd or -errno */
int test_send_u64(int sock, uint64_t value);
int test_recv_u64(int sock, uint64_t *ret_value);

/* Runs the emu-ctl tool ($EMU_CTL) with args; returns its exit code. */
int test_emu_ctl(const char *const *args);

/* In child processes: report and exit on failure (cmocka's asserts longjmp). */
#define CHILD_CHECK(cond)                                                                      \
	do {                                                                                   \
		if (!(cond)) {                                                                 \
			fprintf(stderr, "child %s:%d: check failed: %s\n", __FILE__, __LINE__, \
				#cond);                                                        \
			return 100;                                                            \
		}                                                                              \
	} while (0)
#define CHILD_CU(call) CHILD_CHECK((call) == CUDA_SUCCESS)
