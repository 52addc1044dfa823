/* SPDX-License-Identifier: MIT */
/*
 * Initialization, error strings and device queries of the emulated libnvidia-ml.so.1, as the
 * NVML API Reference Guide documents them (see common/nvml-abi.h for the sections).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "nvml-internal.h"

/* cuDeviceGetName of the emulated driver reports the same name. */
#define DEVICE_NAME "Belayer Emulated GPU"

/* Page retirement: a GPU retires at most this many pages; one per double-bit error here. */
#define MAX_RETIRED_PAGES 64

struct nvmlDevice_st nvml_devices[EMU_MAX_DEVICES] = {
	{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7},
};

static _Atomic int init_count;
static _Atomic bool ever_initialized;
static pthread_once_t state_once = PTHREAD_ONCE_INIT;
static int state_error;

static void state_load(void)
{
	state_error = emu_state_open();
}

static int state_get(void)
{
	(void)pthread_once(&state_once, state_load);
	return state_error;
}

bool nvml_fault(const char *func, nvmlReturn_t *ret)
{
	int r;

	if (state_get() < 0 || !emu_fault_take(func, &r))
		return false;
	*ret = (nvmlReturn_t)r;
	return true;
}

nvmlReturn_t nvml_check_init(void)
{
	return atomic_load(&init_count) > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

int nvml_device_index(nvmlDevice_t device)
{
	uintptr_t p = (uintptr_t)device, base = (uintptr_t)nvml_devices;

	if (p < base || p >= base + sizeof(nvml_devices) || (p - base) % sizeof(*device) != 0)
		return -1;
	if (device->index >= emu_state_ndevices())
		return -1;
	return device->index;
}

/* "Initialization and Cleanup": "A reference count of the number of initializations is
 * maintained"; the emulator's "driver" is the run's shared state: without it,
 * NVML_ERROR_DRIVER_NOT_LOADED. */
static nvmlReturn_t init(const char *name)
{
	nvmlReturn_t r;

	if (nvml_fault(name, &r))
		return r;
	if (state_get() < 0)
		return NVML_ERROR_DRIVER_NOT_LOADED;
	atomic_fetch_add(&init_count, 1);
	atomic_store(&ever_initialized, true);
	return NVML_SUCCESS;
}

_public_ nvmlReturn_t nvmlInit_v2(void)
{
	return init("nvmlInit_v2");
}

_public_ nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
	if (flags & ~(unsigned)(NVML_INIT_FLAG_NO_GPUS | NVML_INIT_FLAG_NO_ATTACH))
		return NVML_ERROR_INVALID_ARGUMENT;
	return init("nvmlInitWithFlags");
}

/* nvmlShutdown: "A reference count of the number of initializations is maintained. Shutdown
 * only occurs when the reference count reaches zero. For backwards compatibility, no error is
 * reported if nvmlShutdown() is called more times than nvmlInit()"; before any init it is
 * NVML_ERROR_UNINITIALIZED ("if the library has not been successfully initialized"). */
_public_ nvmlReturn_t nvmlShutdown(void)
{
	nvmlReturn_t r;
	int n;

	if (nvml_fault("nvmlShutdown", &r))
		return r;
	if (!atomic_load(&ever_initialized))
		return NVML_ERROR_UNINITIALIZED;
	n = atomic_load(&init_count);
	do {
		if (n <= 0)
			return NVML_SUCCESS;
	} while (!atomic_compare_exchange_weak(&init_count, &n, n - 1));
	return NVML_SUCCESS;
}

_public_ const char *nvmlErrorString(nvmlReturn_t result)
{
	switch (result) {
	case NVML_SUCCESS:
		return "Success";
	case NVML_ERROR_UNINITIALIZED:
		return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT:
		return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED:
		return "Not Supported";
	case NVML_ERROR_NO_PERMISSION:
		return "Insufficient Permissions";
	case NVML_ERROR_ALREADY_INITIALIZED:
		return "Already Initialized";
	case NVML_ERROR_NOT_FOUND:
		return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE:
		return "Insufficient Size";
	case NVML_ERROR_DRIVER_NOT_LOADED:
		return "Driver Not Loaded";
	case NVML_ERROR_TIMEOUT:
		return "Timeout";
	case NVML_ERROR_GPU_IS_LOST:
		return "GPU is lost";
	case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
		return "Argument version mismatch";
	case NVML_ERROR_UNKNOWN:
		return "Unknown Error";
	default:
		return "Unknown Error";
	}
}

_public_ nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	NVML_ENTER("nvmlDeviceGetCount_v2");
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = (unsigned)emu_state_ndevices();
	return NVML_SUCCESS;
}

_public_ nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	NVML_ENTER("nvmlDeviceGetHandleByIndex_v2");
	if (!device || index >= (unsigned)emu_state_ndevices())
		return NVML_ERROR_INVALID_ARGUMENT;
	*device = &nvml_devices[index];
	return NVML_SUCCESS;
}

_public_ nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
	int i;

	NVML_ENTER("nvmlDeviceGetIndex");
	i = nvml_device_index(device);
	if (i < 0 || !index)
		return NVML_ERROR_INVALID_ARGUMENT;
	*index = (unsigned)i;
	return NVML_SUCCESS;
}

_public_ nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
	char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
	int dev;

	NVML_ENTER("nvmlDeviceGetUUID");
	dev = nvml_device_index(device);
	if (dev < 0 || !uuid)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (emu_state_uuid_string(dev, buf, sizeof(buf)) < 0)
		return NVML_ERROR_UNKNOWN;
	if (strlen(buf) + 1 > length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(uuid, buf, strlen(buf) + 1);
	return NVML_SUCCESS;
}

_public_ nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
	char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE];

	NVML_ENTER("nvmlDeviceGetHandleByUUID");
	if (!uuid || !device)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (int i = 0; i < emu_state_ndevices(); i++) {
		if (emu_state_uuid_string(i, buf, sizeof(buf)) == 0 && strcmp(buf, uuid) == 0) {
			*device = &nvml_devices[i];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

_public_ nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
	NVML_ENTER("nvmlDeviceGetName");
	if (nvml_device_index(device) < 0 || !name)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (sizeof(DEVICE_NAME) > length)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(name, DEVICE_NAME, sizeof(DEVICE_NAME));
	return NVML_SUCCESS;
}

/* total: the configured capacity; used: what live allocations of the run hold on the device,
 * whichever process holds them (emu_mem_used scans the kernel's view); nothing reserved. */
static void memory_of(int dev, unsigned long long *total, unsigned long long *used,
		      unsigned long long *free_bytes)
{
	*total = emu_state_capacity(dev);
	*used = MIN(emu_mem_used(dev), *total);
	*free_bytes = *total - *used;
}

_public_ nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
	int dev;

	NVML_ENTER("nvmlDeviceGetMemoryInfo");
	dev = nvml_device_index(device);
	if (dev < 0 || !memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	memory_of(dev, &memory->total, &memory->used, &memory->free);
	return NVML_SUCCESS;
}

/* nvmlMemory_v2_t: "version: Structure format version (must be 2)". */
_public_ nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
	int dev;

	NVML_ENTER("nvmlDeviceGetMemoryInfo_v2");
	dev = nvml_device_index(device);
	if (dev < 0 || !memory)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (memory->version != nvmlMemory_v2)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	memory->reserved = 0;
	memory_of(dev, &memory->total, &memory->used, &memory->free);
	return NVML_SUCCESS;
}

/* Volatile and aggregate counters agree: the emulated driver is never reloaded. */
_public_ nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device,
						  nvmlMemoryErrorType_t error_type,
						  nvmlEccCounterType_t counter_type,
						  unsigned long long *ecc_counts)
{
	int dev;

	NVML_ENTER("nvmlDeviceGetTotalEccErrors");
	dev = nvml_device_index(device);
	if (dev < 0 || !ecc_counts || (unsigned)error_type >= NVML_MEMORY_ERROR_TYPE_COUNT ||
	    (unsigned)counter_type >= NVML_ECC_COUNTER_TYPE_COUNT)
		return NVML_ERROR_INVALID_ARGUMENT;
	*ecc_counts = emu_ecc_count(dev, error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED);
	return NVML_SUCCESS;
}

/*
 * Every double-bit error retires one page (up to MAX_RETIRED_PAGES), at a synthetic address;
 * no page is retired for single-bit errors. "pageCount: Reference in which to provide the
 * addresses buffer size, and to return the number of retired pages that match cause. Set to 0
 * to query the size"; a short buffer gets NVML_ERROR_INSUFFICIENT_SIZE and the size needed.
 */
static nvmlReturn_t retired_pages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
				  unsigned int *page_count, unsigned long long *addresses,
				  unsigned long long *timestamps)
{
	unsigned int n;
	int dev = nvml_device_index(device);

	if (dev < 0 || !page_count || (unsigned)cause >= NVML_PAGE_RETIREMENT_CAUSE_COUNT)
		return NVML_ERROR_INVALID_ARGUMENT;
	n = cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
		    ? (unsigned)MIN(emu_ecc_count(dev, true), (uint64_t)MAX_RETIRED_PAGES)
		    : 0;
	if (*page_count < n) {
		*page_count = n;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	if (n > 0 && !addresses)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (unsigned int i = 0; i < n; i++) {
		addresses[i] = 0x10000000ULL + (unsigned long long)i * 0x200000ULL;
		if (timestamps)
			timestamps[i] = 0; /* the emulator does not record when */
	}
	*page_count = n;
	return NVML_SUCCESS;
}

_public_ nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device,
						nvmlPageRetirementCause_t cause,
						unsigned int *page_count,
						unsigned long long *addresses)
{
	NVML_ENTER("nvmlDeviceGetRetiredPages");
	return retired_pages(device, cause, page_count, addresses, NULL);
}

_public_ nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device,
						   nvmlPageRetirementCause_t cause,
						   unsigned int *page_count,
						   unsigned long long *addresses,
						   unsigned long long *timestamps)
{
	NVML_ENTER("nvmlDeviceGetRetiredPages_v2");
	return retired_pages(device, cause, page_count, addresses, timestamps);
}

/* The unversioned names the library also exports (nvml.h maps them to the versions above
 * unless NVML_NO_UNVERSIONED_FUNC_DEFS): same behavior here. */
#define NVML_ALIAS(other, name) \
	extern __typeof__(name) other __attribute__((alias(#name), visibility("default")))
NVML_ALIAS(nvmlInit, nvmlInit_v2);
NVML_ALIAS(nvmlDeviceGetCount, nvmlDeviceGetCount_v2);
NVML_ALIAS(nvmlDeviceGetHandleByIndex, nvmlDeviceGetHandleByIndex_v2);

struct procs_ctx {
	nvmlProcessInfo_t *infos;
	unsigned cap, n;
};

static int proc_add(int pid, uint64_t bytes, void *userdata)
{
	struct procs_ctx *c = userdata;

	if (c->n < c->cap)
		c->infos[c->n] = (nvmlProcessInfo_t){.pid = (unsigned)pid,
						     .usedGpuMemory = bytes,
						     .gpuInstanceId = 0xffffffffu,
						     .computeInstanceId = 0xffffffffu};
	c->n++;
	return 0;
}

/* The processes using the device and the device memory each maps (emu_mem_for_each_process):
 * an emulated process has no context of its own to charge, so what it maps is its use. The
 * instance ids are those of a GPU without MIG (0xFFFFFFFF). */
_public_ nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
							      unsigned int *infoCount,
							      nvmlProcessInfo_t *infos)
{
	struct procs_ctx c;
	int dev;

	NVML_ENTER("nvmlDeviceGetComputeRunningProcesses_v3");
	dev = nvml_device_index(device);
	if (dev < 0 || !infoCount || (*infoCount && !infos))
		return NVML_ERROR_INVALID_ARGUMENT;
	c = (struct procs_ctx){.infos = infos, .cap = *infoCount};
	if (emu_mem_for_each_process(dev, proc_add, &c) < 0)
		return NVML_ERROR_UNKNOWN;
	*infoCount = c.n;
	return c.n > c.cap ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}
