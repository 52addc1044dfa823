/* SPDX-License-Identifier: MIT */
/*
 * How the emulated NCCL reaches the driver: as the real one does, by dlopen("libcuda.so.1") and
 * cuGetProcAddress_v2, never by linking it. Each communicator allocates its internal device
 * buffer with cuMemCreate/cuMemMap (NCCL's cuMem path, POSIX-FD shareable), so these calls come
 * from libnccl's own code, where the Belayer shim classifies them. The buffer holds the
 * partial results of reductions, as NCCL's device buffers do. Every driver failure is -EIO,
 * which the API reports as ncclUnhandledCudaError.
 *
 * Device pointers are reached only through belayer_emu_translate, the emulated driver's
 * host view of device memory: they are not host-dereferenceable.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "nccl-internal.h"

struct cuda_api {
	CUresult (*init)(unsigned int);
	CUresult (*ctx_get_device)(CUdevice *);
	CUresult (*pci_bus_id)(char *, int, CUdevice);
	CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
				CUmemAllocationGranularity_flags);
	CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*address_free)(CUdeviceptr, size_t);
	CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
			   unsigned long long);
	CUresult (*release)(CUmemGenericAllocationHandle);
	CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
			unsigned long long);
	CUresult (*unmap)(CUdeviceptr, size_t);
	CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	void *(*translate)(CUdeviceptr, size_t);
	CUresult (*is_capturing)(CUstream, CUstreamCaptureStatus *);
	CUresult (*launch_host_func)(CUstream, CUhostFn, void *);
};

static struct cuda_api cuda;
static int cuda_error;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;

/* The driver ABI the pointers above are typed for: cuGetProcAddress returns the variant
 * current at this version. */
#define CUDA_ABI_VERSION 12000

typedef CUresult (*get_proc_address_fn)(const char *, void **, int, cuuint64_t,
					CUdriverProcAddressQueryResult *);

static int resolve(get_proc_address_fn gpa, const char *name, void **ret)
{
	CUdriverProcAddressQueryResult status;

	if (gpa(name, ret, CUDA_ABI_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status) !=
		    CUDA_SUCCESS ||
	    status != CU_GET_PROC_ADDRESS_SUCCESS || !*ret)
		return -ENOSYS;
	return 0;
}

static void cuda_load(void)
{
	get_proc_address_fn gpa;
	void *lib;
	int r = 0;

	/* Never closed: the driver stays loaded for the life of the process, as NCCL keeps it. */
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		nccl_set_last_error("dlopen(libcuda.so.1): %s", dlerror());
		cuda_error = -EIO;
		return;
	}
	gpa = (get_proc_address_fn)dlsym(lib, "cuGetProcAddress_v2");
	/* The emulator's own entry point: present only in the emulated driver. */
	cuda.translate = (void *(*)(CUdeviceptr, size_t))dlsym(lib, "belayer_emu_translate");
	if (!gpa || !cuda.translate) {
		nccl_set_last_error(
			"libcuda.so.1 lacks cuGetProcAddress_v2 or belayer_emu_translate");
		cuda_error = -EIO;
		return;
	}
	r = r ?: resolve(gpa, "cuInit", (void **)&cuda.init);
	r = r ?: resolve(gpa, "cuCtxGetDevice", (void **)&cuda.ctx_get_device);
	r = r ?: resolve(gpa, "cuDeviceGetPCIBusId", (void **)&cuda.pci_bus_id);
	r = r ?: resolve(gpa, "cuMemGetAllocationGranularity", (void **)&cuda.granularity);
	r = r ?: resolve(gpa, "cuMemAddressReserve", (void **)&cuda.reserve);
	r = r ?: resolve(gpa, "cuMemAddressFree", (void **)&cuda.address_free);
	r = r ?: resolve(gpa, "cuMemCreate", (void **)&cuda.create);
	r = r ?: resolve(gpa, "cuMemRelease", (void **)&cuda.release);
	r = r ?: resolve(gpa, "cuMemMap", (void **)&cuda.map);
	r = r ?: resolve(gpa, "cuMemUnmap", (void **)&cuda.unmap);
	r = r ?: resolve(gpa, "cuMemSetAccess", (void **)&cuda.set_access);
	r = r ?: resolve(gpa, "cuStreamIsCapturing", (void **)&cuda.is_capturing);
	r = r ?: resolve(gpa, "cuLaunchHostFunc", (void **)&cuda.launch_host_func);
	if (r < 0) {
		nccl_set_last_error("cuGetProcAddress_v2 failed to resolve a driver entry point");
		cuda_error = -EIO;
		return;
	}
	if (cuda.init(0) != CUDA_SUCCESS) {
		nccl_set_last_error("cuInit failed");
		cuda_error = -EIO;
	}
}

static int cuda_get(void)
{
	(void)pthread_once(&cuda_once, cuda_load);
	return cuda_error;
}

/* The device "set before calling ncclCommInitRank" (nccl.h): the current context's. Without
 * one, device 0, which is what cudaGetDevice reports before any cudaSetDevice. */
int nccl_cuda_current_device(int *ret_dev)
{
	CUdevice dev;
	int r = cuda_get();

	if (r < 0)
		return r;
	*ret_dev = cuda.ctx_get_device(&dev) == CUDA_SUCCESS ? (int)dev : 0;
	return 0;
}

int nccl_cuda_bus_id(int dev)
{
	unsigned domain, bus, device, function;
	char id[32];

	/* "[domain]:[bus]:[device].[function]" (cuDeviceGetPCIBusId); without it, the ordinal */
	if (cuda_get() < 0 || cuda.pci_bus_id(id, (int)sizeof(id), dev) != CUDA_SUCCESS ||
	    sscanf(id, "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4)
		return dev;
	return (int)((domain & 0xffff) << 16 | (bus & 0xff) << 8 | (device & 0x1f) << 3 |
		     (function & 7));
}

/* NCCL's cuMem allocation: POSIX-fd shareable, readable and writable from its device. */
int nccl_cuda_vmm_alloc(int dev, size_t size, struct nccl_vmm *ret)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
	};
	CUmemAccessDesc access = {
		.location = prop.location,
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};
	CUmemGenericAllocationHandle handle;
	CUdeviceptr va = 0;
	size_t gran = 0;
	int r = cuda_get();

	if (r < 0)
		return r;
	if (cuda.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
	    gran == 0)
		return -EIO;
	size = (size + gran - 1) / gran * gran;
	if (cuda.reserve(&va, size, gran, 0, 0) != CUDA_SUCCESS)
		return -EIO;
	if (cuda.create(&handle, size, &prop, 0) != CUDA_SUCCESS) {
		(void)cuda.address_free(va, size);
		return -EIO;
	}
	if (cuda.map(va, size, 0, handle, 0) != CUDA_SUCCESS) {
		(void)cuda.release(handle);
		(void)cuda.address_free(va, size);
		return -EIO;
	}
	if (cuda.set_access(va, size, &access, 1) != CUDA_SUCCESS) {
		(void)cuda.unmap(va, size);
		(void)cuda.release(handle);
		(void)cuda.address_free(va, size);
		return -EIO;
	}
	*ret = (struct nccl_vmm){.va = va, .size = size, .handle = handle};
	return 0;
}

void nccl_cuda_vmm_free(struct nccl_vmm *vmm)
{
	if (!vmm->va)
		return;
	(void)cuda.unmap(vmm->va, vmm->size);
	(void)cuda.release(vmm->handle);
	(void)cuda.address_free(vmm->va, vmm->size);
	*vmm = (struct nccl_vmm){};
}

void *nccl_cuda_translate(const void *ptr, size_t size)
{
	if (cuda_get() < 0 || !ptr)
		return NULL;
	return cuda.translate((CUdeviceptr)(uintptr_t)ptr, size);
}

bool nccl_cuda_capturing(cudaStream_t s)
{
	CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;

	if (cuda_get() < 0 || cuda.is_capturing((CUstream)s, &st) != CUDA_SUCCESS)
		return false;
	return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

int nccl_cuda_host_func(cudaStream_t s, void (*fn)(void *), void *arg)
{
	if (cuda_get() < 0)
		return -EIO;
	return cuda.launch_host_func((CUstream)s, fn, arg) == CUDA_SUCCESS ? 0 : -EIO;
}
