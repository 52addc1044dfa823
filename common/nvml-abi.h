/* SPDX-License-Identifier: MIT */
/*
 * The subset of the NVML C API that Belayer uses, declared from NVIDIA's public documentation
 * because no nvml.h ships with the toolkit or Debian on these machines: "NVML API Reference
 * Guide" (https://docs.nvidia.com/deploy/nvml-api/), sections "Device Enums" (nvmlReturn_t,
 * nvmlMemoryErrorType_t, nvmlEccCounterType_t, nvmlPageRetirementCause_t), "Device Structs"
 * (nvmlMemory_t, nvmlMemory_v2_t), "Initialization and Cleanup", "Device Queries", "Event
 * Handling Methods" and "Event Types". Only declarations: names, values and layouts are the
 * documented ones, so code built against this header runs unchanged on the real
 * libnvidia-ml.so.1. The supervisor resolves the functions with dlopen/dlsym (the versioned
 * names below are the exported symbols); the emulated library in tests/emu implements them.
 */
#pragma once

/* "Device Enums": nvmlReturn_t */
typedef enum nvmlReturn_enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_NO_PERMISSION = 4,
	NVML_ERROR_ALREADY_INITIALIZED = 5,
	NVML_ERROR_NOT_FOUND = 6,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_INSUFFICIENT_POWER = 8,
	NVML_ERROR_DRIVER_NOT_LOADED = 9,
	NVML_ERROR_TIMEOUT = 10,
	NVML_ERROR_IRQ_ISSUE = 11,
	NVML_ERROR_LIBRARY_NOT_FOUND = 12,
	NVML_ERROR_FUNCTION_NOT_FOUND = 13,
	NVML_ERROR_CORRUPTED_INFOROM = 14,
	NVML_ERROR_GPU_IS_LOST = 15,
	NVML_ERROR_RESET_REQUIRED = 16,
	NVML_ERROR_OPERATING_SYSTEM = 17,
	NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
	NVML_ERROR_IN_USE = 19,
	NVML_ERROR_MEMORY = 20,
	NVML_ERROR_NO_DATA = 21,
	NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
	NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
	NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
	NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
	NVML_ERROR_DEPRECATED = 26,
	NVML_ERROR_NOT_READY = 27,
	NVML_ERROR_GPU_NOT_FOUND = 28,
	NVML_ERROR_INVALID_STATE = 29,
	NVML_ERROR_UNKNOWN = 999,
} nvmlReturn_t;

/* Opaque handles ("Device Queries", "Event Handling Methods"). */
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;

/* "Constants": buffer sizes for string queries. */
#define NVML_DEVICE_UUID_BUFFER_SIZE	80
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_BUFFER_SIZE	64
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96

/* nvmlInitWithFlags: "NVML_INIT_FLAG_NO_GPUS" allows initialization without GPUs,
 * "NVML_INIT_FLAG_NO_ATTACH" skips attaching to GPUs. */
#define NVML_INIT_FLAG_NO_GPUS	 1
#define NVML_INIT_FLAG_NO_ATTACH 2

/* Versioned structs carry their size and version in one word. */
#define NVML_STRUCT_VERSION(data, ver) \
	(unsigned int)(sizeof(nvml##data##_v##ver##_t) | ((unsigned int)(ver) << 24U))

/* "Device Structs": nvmlMemory_t ("used" is reserved plus allocated memory). */
typedef struct nvmlMemory_st {
	unsigned long long total;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_t;

/* nvmlMemory_v2_t: "version: Structure format version (must be 2)". */
typedef struct nvmlMemory_v2_st {
	unsigned int version;
	unsigned long long total;
	unsigned long long reserved;
	unsigned long long free;
	unsigned long long used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 NVML_STRUCT_VERSION(Memory, 2)

/* "Device Enums" */
typedef enum nvmlMemoryErrorType_enum {
	NVML_MEMORY_ERROR_TYPE_CORRECTED = 0,	/* single-bit ECC errors */
	NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1, /* double-bit ECC errors */
	NVML_MEMORY_ERROR_TYPE_COUNT,
} nvmlMemoryErrorType_t;

typedef enum nvmlEccCounterType_enum {
	NVML_VOLATILE_ECC = 0,	/* reset on driver reload */
	NVML_AGGREGATE_ECC = 1, /* persistent */
	NVML_ECC_COUNTER_TYPE_COUNT,
} nvmlEccCounterType_t;

typedef enum nvmlPageRetirementCause_enum {
	NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0,
	NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1,
	NVML_PAGE_RETIREMENT_CAUSE_COUNT,
} nvmlPageRetirementCause_t;

/* "Event Types": bits of the unsigned long long masks given to nvmlDeviceRegisterEvents. */
#define nvmlEventTypeSingleBitEccError	    0x0000000000000001LL
#define nvmlEventTypeDoubleBitEccError	    0x0000000000000002LL
#define nvmlEventTypePState		    0x0000000000000004LL
#define nvmlEventTypeXidCriticalError	    0x0000000000000008LL
#define nvmlEventTypeClock		    0x0000000000000010LL
#define nvmlEventTypePowerSourceChange	    0x0000000000000080LL
#define nvmlEventMigConfigChange	    0x0000000000000100LL
#define nvmlEventTypeSingleBitEccErrorStorm 0x0000000000000200LL
#define nvmlEventTypeDramRetirementEvent    0x0000000000000400LL
#define nvmlEventTypeDramRetirementFailure  0x0000000000000800LL
#define nvmlEventTypeNonFatalPoisonError    0x0000000000001000LL
#define nvmlEventTypeFatalPoisonError	    0x0000000000002000LL
#define nvmlEventTypeGpuUnavailableError    0x0000000000004000LL
#define nvmlEventTypeGpuRecoveryAction	    0x0000000000008000LL
#define nvmlEventTypeNone		    0x0000000000000000LL

/* "nvmlEventData_t: Information about occurred event". eventData "Stores Xid error for the
 * device in the event of nvmlEventTypeXidCriticalError"; the instance ids are 0xFFFFFFFF
 * unless MIG attributes the event to an instance. */
typedef struct nvmlEventData_st {
	nvmlDevice_t device;
	unsigned long long eventType;
	unsigned long long eventData;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nvmlEventData_t;

/* "Initialization and Cleanup" (reference counted: each init needs one shutdown) */
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
nvmlReturn_t nvmlShutdown(void);
/* "Error reporting" */
const char *nvmlErrorString(nvmlReturn_t result);

/* "Device Structs": nvmlProcessInfo_t (nvmlProcessInfo_v2_t), what
 * nvmlDeviceGetComputeRunningProcesses_v3 returns per process: "usedGpuMemory: Amount of used
 * GPU memory in bytes" (NVML_VALUE_NOT_AVAILABLE where it cannot be known, e.g. under WDDM). */
#define NVML_VALUE_NOT_AVAILABLE (0xffffffffffffffffULL)
typedef struct nvmlProcessInfo_st {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/* "Device Queries" */
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
/* "infoCount: Reference in which to provide the infos array size, and to return the number of
 * returned elements"; NVML_ERROR_INSUFFICIENT_SIZE, with *infoCount the number needed, when
 * it is too small (infos may be NULL with *infoCount 0 to ask). */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
						     nvmlProcessInfo_t *infos);
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
					 nvmlEccCounterType_t counterType,
					 unsigned long long *eccCounts);
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
				       unsigned int *pageCount, unsigned long long *addresses);
nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
					  unsigned int *pageCount, unsigned long long *addresses,
					  unsigned long long *timestamps);

/* "Event Handling Methods" */
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set);
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
				      nvmlEventSet_t set);
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes);
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms);
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set);
