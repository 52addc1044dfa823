/* SPDX-License-Identifier: MIT */
#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <time.h>

#include "engine-gpu.h"
#include "engine-kernels.h"
#include "log.h"
#include "util.h"

/* PTX text of engine-kernels.cu, embedded at build time (embed-ptx.sh). */
extern const char engine_ptx[];

struct gpu_api gpu;

static CUmodule module;
static CUstream stream;

#define KERNEL_NAME(name, type) #name,
static const char *const kernel_names[] = {ENGINE_KERNELS(KERNEL_NAME)};
static CUfunction kernel_funcs[ARRAY_SIZE(kernel_names)];

const char *gpu_strerror(CUresult r)
{
	const char *s = NULL;

	if (gpu.cuGetErrorName && gpu.cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
		return s;
	return "CUDA_ERROR_UNKNOWN";
}

int gpu_errno(CUresult r)
{
	if (r == CUDA_SUCCESS)
		return 0;
	return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
}

int gpu_cuda_init(int dev)
{
	CUdriverProcAddressQueryResult status;
	PFN_cuGetProcAddress_v12000 get_proc;
	CUdevice device;
	CUcontext ctx;
	CUresult r;
	int count = 0;

	gpu.cuda_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!gpu.cuda_lib)
		return log_error_errno(-ENOENT, "Failed to load libcuda.so.1: %s", dlerror());
	get_proc = (PFN_cuGetProcAddress_v12000)dlsym(gpu.cuda_lib, "cuGetProcAddress_v2");
	if (!get_proc)
		return log_error_errno(-ENOENT, "libcuda.so.1 has no cuGetProcAddress_v2");
#define CU_RESOLVE(name, ver)                                                                   \
	r = get_proc(#name, (void **)&gpu.name, ver, CU_GET_PROC_ADDRESS_DEFAULT, &status);     \
	if (r != CUDA_SUCCESS || !gpu.name)                                                     \
		return log_error_errno(-ENOENT, "Failed to resolve %s (version %d): %d", #name, \
				       ver, (int)r);
	ENGINE_CU_FUNCS(CU_RESOLVE)
#undef CU_RESOLVE
	gpu.emu_alloc_id = (int (*)(CUdeviceptr, uint64_t *, uint64_t *))dlsym(
		gpu.cuda_lib, "belayer_emu_alloc_id");

	r = gpu.cuInit(0);
	if (r != CUDA_SUCCESS)
		return log_error_errno(gpu_errno(r), "cuInit failed: %s", gpu_strerror(r));
	r = gpu.cuDeviceGetCount(&count);
	if (r != CUDA_SUCCESS || dev >= count)
		return log_error_errno(-ENODEV, "Device %d not present (%d devices)", dev, count);
	r = gpu.cuDeviceGet(&device, dev);
	if (r == CUDA_SUCCESS)
		r = gpu.cuDevicePrimaryCtxRetain(&ctx, device);
	if (r == CUDA_SUCCESS)
		r = gpu.cuCtxSetCurrent(ctx);
	if (r == CUDA_SUCCESS)
		r = gpu.cuStreamCreate(&stream, CU_STREAM_DEFAULT);
	if (r != CUDA_SUCCESS)
		return log_error_errno(gpu_errno(r), "Failed to set up device %d: %s", dev,
				       gpu_strerror(r));
	return 0;
}

int gpu_nccl_load(void)
{
	gpu.nccl_lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
	if (!gpu.nccl_lib)
		return log_error_errno(-ENOENT, "Failed to load libnccl.so.2: %s", dlerror());
#define NCCL_RESOLVE(name)                                           \
	gpu.name = (__typeof__(gpu.name))dlsym(gpu.nccl_lib, #name); \
	if (!gpu.name)                                               \
		return log_error_errno(-ENOENT, "libnccl.so.2 has no %s", #name);
	ENGINE_NCCL_FUNCS(NCCL_RESOLVE)
#undef NCCL_RESOLVE
	return 0;
}

ncclResult_t gpu_nccl_wait(ncclComm_t comm, ncclResult_t nr)
{
	while (nr == ncclInProgress) {
		struct timespec ts = {.tv_nsec = 50000};

		if (gpu.ncclCommGetAsyncError(comm, &nr) != ncclSuccess)
			return ncclInternalError;
		if (nr == ncclInProgress)
			(void)nanosleep(&ts, NULL);
	}
	return nr;
}

int gpu_kernels_load(void)
{
	CUresult r;

	r = gpu.cuModuleLoadData(&module, engine_ptx);
	if (r != CUDA_SUCCESS)
		return log_error_errno(gpu_errno(r), "Failed to load the kernels' PTX: %s",
				       gpu_strerror(r));
	for (size_t i = 0; i < ARRAY_SIZE(kernel_names); i++) {
		r = gpu.cuModuleGetFunction(&kernel_funcs[i], module, kernel_names[i]);
		if (r != CUDA_SUCCESS)
			return log_error_errno(gpu_errno(r), "Kernel %s not in the module: %s",
					       kernel_names[i], gpu_strerror(r));
	}
	return 0;
}

int gpu_launch(const char *kernel, uint64_t n, void *args)
{
	void *params[] = {args};
	uint64_t blocks = (n + KERNEL_THREADS - 1) / KERNEL_THREADS;
	CUresult r;

	if (n == 0)
		return 0;
	if (blocks > INT32_MAX)
		return -E2BIG;
	for (size_t i = 0; i < ARRAY_SIZE(kernel_names); i++) {
		if (strcmp(kernel_names[i], kernel) != 0)
			continue;
		r = gpu.cuLaunchKernel(kernel_funcs[i], (unsigned)blocks, 1, 1, KERNEL_THREADS, 1,
				       1, 0, stream, params, NULL);
		if (r != CUDA_SUCCESS)
			return log_error_errno(gpu_errno(r), "Launch of %s failed: %s", kernel,
					       gpu_strerror(r));
		return 0;
	}
	return -ENOENT;
}

int gpu_sync(void)
{
	CUresult r = gpu.cuStreamSynchronize(stream);

	if (r != CUDA_SUCCESS)
		return log_error_errno(gpu_errno(r), "Stream synchronize failed: %s",
				       gpu_strerror(r));
	return 0;
}

CUstream gpu_stream(void)
{
	return stream;
}
