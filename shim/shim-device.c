/* SPDX-License-Identifier: MIT */
/*
 * The devices as the shim needs them: whether a device exports POSIX fds, its allocation
 * granularity and UUID (probed once per device, through the real driver), and the access a
 * mapping gets.
 */

#include <pthread.h>
#include <string.h>

#include "shim-device.h"
#include "shim-real.h"

static struct dev_info devs[MAX_DEVS];
static pthread_mutex_t devs_lock = PTHREAD_MUTEX_INITIALIZER;

const struct dev_info *shim_device_info(CUdevice dev)
{
	const struct real_extra *x = real_extra();
	struct dev_info *d;

	if (dev < 0 || dev >= MAX_DEVS)
		return NULL;
	d = &devs[dev];
	if (__atomic_load_n(&d->probed, __ATOMIC_ACQUIRE))
		return d;

	pthread_mutex_lock(&devs_lock);
	if (!d->probed) {
		int v = 0;
		CUmemAllocationProp prop = {
			.type = CU_MEM_ALLOCATION_TYPE_PINNED,
			.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
		};

		d->posix_fd =
			x->cuDeviceGetAttribute &&
			x->cuDeviceGetAttribute(
				&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
				dev) == CUDA_SUCCESS &&
			v;
		if (!x->cuMemGetAllocationGranularity ||
		    x->cuMemGetAllocationGranularity(&d->granularity, &prop,
						     CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
			    CUDA_SUCCESS)
			d->granularity = 0;
		v = 0;
		d->rdma_vmm =
			x->cuDeviceGetAttribute &&
			x->cuDeviceGetAttribute(
				&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
				dev) == CUDA_SUCCESS &&
			v;
		d->uuid_ok = x->cuDeviceGetUuid_v2 &&
			     x->cuDeviceGetUuid_v2((CUuuid *)d->uuid, dev) == CUDA_SUCCESS;
		__atomic_store_n(&d->probed, true, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&devs_lock);
	return d;
}

void shim_device_uuid(CUdevice dev, uint8_t uuid[PROTO_UUID_LEN])
{
	const struct dev_info *d;

	shim_busy++;
	d = shim_device_info(dev);
	shim_busy--;
	if (d && d->uuid_ok)
		memcpy(uuid, d->uuid, PROTO_UUID_LEN);
	else
		memset(uuid, 0, PROTO_UUID_LEN);
}

/* Access for the owning device and for every device that can reach it as a peer, which is
 * what cudaMalloc memory offers once peer access is enabled. */
CUresult shim_set_access(CUdeviceptr va, size_t size, CUdevice dev)
{
	const struct real_extra *x = real_extra();
	CUmemAccessDesc desc[MAX_DEVS];
	size_t n = 0;
	int count = 0;
	CUresult r;

	desc[n++] = (CUmemAccessDesc){
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};
	if (x->cuDeviceGetCount && x->cuDeviceCanAccessPeer &&
	    x->cuDeviceGetCount(&count) == CUDA_SUCCESS) {
		for (int i = 0; i < count && i < MAX_DEVS && n < MAX_DEVS; i++) {
			int can = 0;

			if (i == dev || x->cuDeviceCanAccessPeer(&can, i, dev) != CUDA_SUCCESS ||
			    !can)
				continue;
			desc[n++] = (CUmemAccessDesc){
				.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = i},
				.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
			};
		}
	}
	r = CALL_REAL(cuMemSetAccess, va, size, desc, n);
	if (r != CUDA_SUCCESS && n > 1)
		r = CALL_REAL(cuMemSetAccess, va, size, desc, 1);
	return r;
}
