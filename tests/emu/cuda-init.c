/* SPDX-License-Identifier: MIT */
/* Initialization, version, devices, primary and created contexts, error strings. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>
#include <strings.h>

#include "cuda-errors.h"
#include "cuda-internal.h"

#define EMU_DRIVER_VERSION 13000
#define EMU_CTX_STACK	   32

bool emu_host_access;
static atomic_bool initialized;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static int ndevices;		     /* visible to this process */
static int visible[EMU_MAX_DEVICES]; /* ordinal -> the run's device index */

struct CUctx_st {
	struct CUctx_st *next; /* registry, to validate handles */
	CUdevice dev;
	unsigned flags;
	bool primary;
};

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static struct CUctx_st primary[EMU_MAX_DEVICES];
static unsigned primary_refs[EMU_MAX_DEVICES];
static unsigned primary_flags[EMU_MAX_DEVICES];
static struct CUctx_st *contexts;

/* The calling thread's context stack; the top is current. */
static __thread CUcontext ctx_stack[EMU_CTX_STACK];
static __thread unsigned ctx_depth;

bool emu_initialized(void)
{
	return atomic_load_explicit(&initialized, memory_order_acquire);
}

int emu_ndevices(void)
{
	return ndevices;
}

int emu_dev_index(CUdevice ordinal)
{
	return ordinal >= 0 && ordinal < ndevices ? visible[ordinal] : -1;
}

CUdevice emu_dev_ordinal(int index)
{
	for (int i = 0; i < ndevices; i++)
		if (visible[i] == index)
			return i;
	return -1;
}

/* One CUDA_VISIBLE_DEVICES entry: the run's device index, or -1 (invalid). CUDA C Programming
 * Guide, "CUDA Environment Variables": "GPU identifiers are given as integer indices or as
 * UUID strings. GPU UUID strings should follow the same format as given by nvidia-smi, such as
 * GPU-8932f937-d72c-4106-c12f-20bd9faed9f6. However, for convenience, abbreviated forms are
 * allowed; simply specify enough digits from the beginning of the GPU UUID to uniquely
 * identify that GPU in the target system." */
static int visible_entry(const char *tok, size_t len, int nphys)
{
	char uuid[64];
	int found = -1;

	if (len == 0 || len >= sizeof(uuid))
		return -1;
	if (strncmp(tok, "GPU-", 4) == 0) {
		for (int i = 0; i < nphys; i++)
			if (emu_state_uuid_string(i, uuid, sizeof(uuid)) == 0 &&
			    strncasecmp(uuid, tok, len) == 0) {
				if (found >= 0)
					return -1; /* not unique */
				found = i;
			}
		return found;
	}
	found = 0;
	for (size_t k = 0; k < len; k++) {
		if (tok[k] < '0' || tok[k] > '9' || found > EMU_MAX_DEVICES)
			return -1;
		found = found * 10 + (tok[k] - '0');
	}
	return found < nphys ? found : -1;
}

/* The devices this process sees, in the order CUDA_VISIBLE_DEVICES lists them (all when
 * unset): "Only the devices whose index is present in the sequence are visible to CUDA
 * applications and they are enumerated in the order of the sequence. If one of the indices
 * is invalid, only the devices whose index precedes the invalid index are visible" (same
 * section). A device listed twice ends the list too (not documented; NVIDIA's driver does
 * not enumerate one GPU twice). */
static int visible_devices(int nphys)
{
	const char *e = secure_getenv("CUDA_VISIBLE_DEVICES");
	int n = 0;

	if (!e) {
		for (int i = 0; i < nphys; i++)
			visible[i] = i;
		return nphys;
	}
	while (n < nphys) {
		size_t len = strcspn(e, ",");
		int d = visible_entry(e, len, nphys);

		for (int i = 0; d >= 0 && i < n; i++)
			if (visible[i] == d)
				d = -1;
		if (d < 0)
			break;
		visible[n++] = d;
		if (!e[len])
			break;
		e += len + 1;
	}
	return n;
}

/* Calls of FUNC match rules for FUNC and for its unversioned name ("cuMemAlloc" matches
 * cuMemAlloc_v2 and cuMemcpyHtoDAsync matches cuMemcpyHtoDAsync_v2_ptsz). */
CUresult emu_fault_check(const char *func)
{
	char base[EMU_FUNC_NAME_MAX];
	size_t n;
	int result;

	if (!emu_fault_armed())
		return CUDA_SUCCESS;
	if (emu_fault_take(func, &result))
		return (CUresult)result;
	snprintf(base, sizeof(base), "%s", func);
	for (;;) {
		n = strlen(base);
		if (n > 5 &&
		    (strcmp(base + n - 5, "_ptds") == 0 || strcmp(base + n - 5, "_ptsz") == 0))
			base[n - 5] = '\0';
		else if (n > 3 && base[n - 3] == '_' && base[n - 2] == 'v' && base[n - 1] >= '2' &&
			 base[n - 1] <= '9')
			base[n - 3] = '\0';
		else
			break;
	}
	if (strcmp(base, func) != 0 && emu_fault_take(base, &result))
		return (CUresult)result;
	return CUDA_SUCCESS;
}

/* cuda.h, CUDA_ERROR_ILLEGAL_ADDRESS: "While executing a kernel, the device encountered a load
 * or store instruction on an invalid memory address. This leaves the process in an
 * inconsistent state and any further CUDA work will return the same error. To continue using
 * CUDA, the process must be terminated and relaunched." */
static CUresult sticky = CUDA_SUCCESS;

void emu_set_sticky(CUresult r)
{
	__atomic_store_n(&sticky, r, __ATOMIC_RELEASE);
}

CUresult emu_enter(const char *func)
{
	CUresult r;

	if (!emu_initialized())
		return CUDA_ERROR_NOT_INITIALIZED;
	r = __atomic_load_n(&sticky, __ATOMIC_ACQUIRE);
	if (r != CUDA_SUCCESS)
		return r;
	return emu_fault_check(func);
}

/* Host kernel libraries register their kernels from their constructors (belayer-emu.h). */
static void load_kernel_libraries(void)
{
	const char *e = secure_getenv("BELAYER_EMU_KERNELS");
	char *list, *save = NULL;

	if (!e || !*e)
		return;
	list = strdup(e);
	if (!list)
		return;
	for (char *p = strtok_r(list, ":", &save); p; p = strtok_r(NULL, ":", &save))
		/* RTLD_LOCAL: the library reaches us through its own DT_NEEDED on
		 * libcuda.so.1, and RTLD_GLOBAL breaks inside a dlmopen() namespace. */
		if (!dlopen(p, RTLD_NOW | RTLD_LOCAL))
			fprintf(stderr,
				"libcuda (belayer emulator): cannot load kernel library %s: %s, "
				"ignoring.\n",
				p, dlerror());
	free(list);
}

CUAPI CUresult cuInit(unsigned int Flags)
{
	CUresult r = emu_fault_check(__func__);
	const char *e;

	if (r != CUDA_SUCCESS)
		return r;
	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE; /* "Flags parameter must be 0" */
	if (emu_initialized())
		return CUDA_SUCCESS;
	pthread_mutex_lock(&init_lock);
	if (!emu_initialized()) {
		if (emu_state_open() < 0) {
			pthread_mutex_unlock(&init_lock);
			return CUDA_ERROR_NO_DEVICE;
		}
		e = secure_getenv("BELAYER_EMU_HOST_ACCESS");
		emu_host_access = e && strcmp(e, "1") == 0;
		ndevices = visible_devices(emu_state_ndevices());
		if (ndevices == 0) {
			/* cuInit: CUDA_ERROR_NO_DEVICE, "no CUDA-capable devices were detected" */
			pthread_mutex_unlock(&init_lock);
			return CUDA_ERROR_NO_DEVICE;
		}
		emu_va_init();
		for (int i = 0; i < ndevices; i++)
			primary[i] = (struct CUctx_st){.dev = i, .primary = true};
		atomic_store_explicit(&initialized, true, memory_order_release);
		load_kernel_libraries();
	}
	pthread_mutex_unlock(&init_lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDriverGetVersion(int *driverVersion)
{
	CUresult r = emu_fault_check(__func__);

	if (r != CUDA_SUCCESS)
		return r;
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = EMU_DRIVER_VERSION;
	return CUDA_SUCCESS;
}

/* ---- devices ---- */

static CUresult check_device(CUdevice dev)
{
	return dev >= 0 && dev < ndevices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUAPI CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	EMU_ENTER();
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (ordinal < 0 || ordinal >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDeviceGetCount(int *count)
{
	EMU_ENTER();
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = ndevices;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	EMU_ENTER();
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (check_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, (size_t)len, "Belayer Emulated GPU");
	return CUDA_SUCCESS;
}

static CUresult get_uuid(CUuuid *uuid, CUdevice dev)
{
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	if (check_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	(void)emu_state_uuid(emu_dev_index(dev), (unsigned char *)uuid->bytes);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	EMU_ENTER();
	return get_uuid(uuid, dev);
}

CUAPI CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	EMU_ENTER();
	return get_uuid(uuid, dev);
}

CUAPI CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	EMU_ENTER();
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	if (check_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = emu_state_capacity(emu_dev_index(dev));
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
	size_t b;
	CUresult r;

	/* cuDeviceTotalMem_v2 does the entry checks (once per call, for fault rules too). */
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	r = cuDeviceTotalMem_v2(&b, dev);
	if (r == CUDA_SUCCESS)
		*bytes = b > UINT32_MAX ? UINT32_MAX : (unsigned int)b;
	return r;
}

CUAPI CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
	EMU_ENTER();
	if (!pciBusId || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (check_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	(void)emu_state_pci_bus_id(emu_dev_index(dev), pciBusId, (size_t)len);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
	char id[32];

	EMU_ENTER();
	if (!dev || !pciBusId)
		return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < ndevices; i++) {
		(void)emu_state_pci_bus_id(emu_dev_index(i), id, sizeof(id));
		if (strcasecmp(id, pciBusId) == 0 ||
		    (strlen(pciBusId) == 7 && strcasecmp(id + 5, pciBusId) == 0)) {
			*dev = i;
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_DEVICE;
}

static int attribute(CUdevice_attribute a, CUdevice dev)
{
	switch (a) {
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
		return 1024;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
		return 64;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
		return 2147483647;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
		return 65535;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
		return 49152;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
		return 232448;
	case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
		return 32;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
		return 132;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
		return 9;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
		return 0;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
		return 0x18 + emu_dev_index(dev);
	case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
	case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
		return 0;
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
	case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
	case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
	/* An H100/H200 with the peer-memory or dma-buf stack: GPUDirect RDMA, also of VMM memory
	 * created with allocFlags.gpuDirectRDMACapable. */
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
		return 1;
	case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
		return 2;
	case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
		return 5120;
	case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
		return 50331648;
	case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
		return 1980000;
	case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
		return 2619000;
	case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
		return CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	/* no NVLink switch: cuMulticast* answer CUDA_ERROR_NOT_SUPPORTED (cuda-multicast.c) */
	case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED:
		return 0;
	default:
		return 0; /* a valid attribute this emulator does not model */
	}
}

CUAPI CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	EMU_ENTER();
	if (!pi || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	if (check_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	*pi = attribute(attrib, dev);
	return CUDA_SUCCESS;
}

/* ---- contexts ---- */

static CUcontext current(void)
{
	return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
}

CUresult emu_current_device(CUdevice *ret_dev)
{
	CUcontext c = current();

	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	*ret_dev = c->dev;
	return CUDA_SUCCESS;
}

static bool ctx_valid(CUcontext c)
{
	bool ok = false;

	if (!c)
		return false;
	if (c >= primary && c < primary + EMU_MAX_DEVICES)
		return true;
	pthread_mutex_lock(&ctx_lock);
	for (struct CUctx_st *p = contexts; p; p = p->next)
		if (p == c)
			ok = true;
	pthread_mutex_unlock(&ctx_lock);
	return ok;
}

static CUresult push(CUcontext c)
{
	if (ctx_depth == EMU_CTX_STACK)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx_stack[ctx_depth++] = c;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	EMU_ENTER();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (check_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&ctx_lock);
	primary_refs[dev]++;
	primary[dev].flags = primary_flags[dev];
	pthread_mutex_unlock(&ctx_lock);
	*pctx = &primary[dev];
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	CUresult r = CUDA_SUCCESS;

	EMU_ENTER();
	if (check_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&ctx_lock);
	if (primary_refs[dev] == 0)
		r = CUDA_ERROR_INVALID_CONTEXT;
	else
		primary_refs[dev]--;
	pthread_mutex_unlock(&ctx_lock);
	return r;
}

CUAPI CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
	return cuDevicePrimaryCtxRelease_v2(dev);
}

CUAPI CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	EMU_ENTER();
	if (check_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&ctx_lock);
	primary_refs[dev] = 0;
	pthread_mutex_unlock(&ctx_lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
	return cuDevicePrimaryCtxReset_v2(dev);
}

CUAPI CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	EMU_ENTER();
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	if (check_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&ctx_lock);
	*flags = primary_flags[dev];
	*active = primary_refs[dev] > 0;
	pthread_mutex_unlock(&ctx_lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
	EMU_ENTER();
	if (check_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&ctx_lock);
	primary_flags[dev] = flags;
	pthread_mutex_unlock(&ctx_lock);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
	return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	struct CUctx_st *c;
	CUresult r;

	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (check_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	c = calloc(1, sizeof(*c));
	if (!c)
		return CUDA_ERROR_OUT_OF_MEMORY;
	c->dev = dev;
	c->flags = flags;
	r = push(c);
	if (r != CUDA_SUCCESS) {
		free(c);
		return r;
	}
	pthread_mutex_lock(&ctx_lock);
	c->next = contexts;
	contexts = c;
	pthread_mutex_unlock(&ctx_lock);
	*pctx = c;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	EMU_ENTER();
	return ctx_create(pctx, flags, dev);
}

CUAPI CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	EMU_ENTER();
	return ctx_create(pctx, flags, dev);
}

CUAPI CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
			      unsigned int flags, CUdevice dev)
{
	EMU_ENTER();
	/* Execution affinity (SM partitioning) is not emulated; the context is created as if
	 * the device granted the whole of it. */
	if (numParams < 0 || (numParams > 0 && !paramsArray))
		return CUDA_ERROR_INVALID_VALUE;
	return ctx_create(pctx, flags, dev);
}

CUAPI CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
			      unsigned int flags, CUdevice dev)
{
	EMU_ENTER();
	if (ctxCreateParams && ctxCreateParams->numExecAffinityParams < 0)
		return CUDA_ERROR_INVALID_VALUE;
	return ctx_create(pctx, flags, dev);
}

static CUresult ctx_destroy(CUcontext ctx)
{
	struct CUctx_st **p;
	bool found = false;

	if (!ctx || (ctx >= primary && ctx < primary + EMU_MAX_DEVICES))
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&ctx_lock);
	for (p = &contexts; *p; p = &(*p)->next)
		if (*p == ctx) {
			*p = ctx->next;
			found = true;
			break;
		}
	pthread_mutex_unlock(&ctx_lock);
	if (!found)
		return CUDA_ERROR_INVALID_CONTEXT;
	/* "If the context is current to the calling thread then the context will also be
	 * popped from the current thread's context stack." */
	if (current() == ctx)
		ctx_depth--;
	free(ctx);
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	EMU_ENTER();
	return ctx_destroy(ctx);
}

CUAPI CUresult cuCtxDestroy(CUcontext ctx)
{
	EMU_ENTER();
	return ctx_destroy(ctx);
}

CUAPI CUresult cuCtxSetCurrent(CUcontext ctx)
{
	EMU_ENTER();
	if (!ctx) {
		/* "If ctx is NULL then the CUDA context previously bound to the calling CPU
		 * thread is unbound" */
		if (ctx_depth)
			ctx_depth--;
		return CUDA_SUCCESS;
	}
	if (!ctx_valid(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_depth)
		ctx_stack[ctx_depth - 1] = ctx;
	else
		ctx_stack[ctx_depth++] = ctx;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	EMU_ENTER();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = current();
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	EMU_ENTER();
	if (!ctx_valid(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	return push(ctx);
}

CUAPI CUresult cuCtxPushCurrent(CUcontext ctx)
{
	return cuCtxPushCurrent_v2(ctx);
}

CUAPI CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	EMU_ENTER();
	if (!ctx_depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	ctx_depth--;
	if (pctx)
		*pctx = ctx_stack[ctx_depth];
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxPopCurrent(CUcontext *pctx)
{
	return cuCtxPopCurrent_v2(pctx);
}

CUAPI CUresult cuCtxGetDevice(CUdevice *device)
{
	EMU_ENTER();
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	return emu_current_device(device);
}

CUAPI CUresult cuCtxGetFlags(unsigned int *flags)
{
	CUcontext c;

	EMU_ENTER();
	if (!flags)
		return CUDA_ERROR_INVALID_VALUE;
	c = current();
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	*flags = c->flags;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
	EMU_ENTER();
	if (!version)
		return CUDA_ERROR_INVALID_VALUE;
	if (!ctx)
		ctx = current();
	if (!ctx_valid(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	*version = 12010;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxSynchronize(void)
{
	CUresult r;

	EMU_ENTER();
	/* Synchronising the device waits for capturing streams too: prohibited during capture. */
	r = emu_capture_unsafe();
	if (r != CUDA_SUCCESS)
		return r;
	/* Everything executes synchronously, at the call. */
	return current() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* ---- errors ---- */

static const struct {
	CUresult value;
	const char *text;
} texts[] = {
	{CUDA_SUCCESS, "no error"},
	{CUDA_ERROR_INVALID_VALUE, "invalid argument"},
	{CUDA_ERROR_OUT_OF_MEMORY, "out of memory"},
	{CUDA_ERROR_NOT_INITIALIZED, "initialization error"},
	{CUDA_ERROR_DEINITIALIZED, "driver shutting down"},
	{CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"},
	{CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"},
	{CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"},
	{CUDA_ERROR_INVALID_CONTEXT, "invalid device context"},
	{CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered"},
	{CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"},
	{CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"},
	{CUDA_ERROR_NOT_FOUND, "named symbol not found"},
	{CUDA_ERROR_NOT_READY, "device not ready"},
	{CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"},
	{CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"},
	{CUDA_ERROR_NOT_PERMITTED, "operation not permitted"},
	{CUDA_ERROR_NOT_SUPPORTED, "operation not supported"},
	{CUDA_ERROR_UNKNOWN, "unknown error"},
};

CUAPI CUresult cuGetErrorName(CUresult error, const char **pStr)
{
	const char *n = emu_cuda_error_name(error);
	CUresult r = emu_fault_check(__func__);

	if (r != CUDA_SUCCESS)
		return r;
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	/* "If the error code is not recognized, CUDA_ERROR_INVALID_VALUE will be returned
	 * and *pStr will be set to the NULL value." */
	*pStr = n;
	return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUAPI CUresult cuGetErrorString(CUresult error, const char **pStr)
{
	CUresult r = emu_fault_check(__func__);

	if (r != CUDA_SUCCESS)
		return r;
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < ARRAY_SIZE(texts); i++)
		if (texts[i].value == error) {
			*pStr = texts[i].text;
			return CUDA_SUCCESS;
		}
	/* Codes without their own text read as their name. */
	*pStr = emu_cuda_error_name(error);
	return *pStr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUAPI CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
	EMU_ENTER();
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (!ctx)
		return emu_current_device(device);
	if (!ctx_valid(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	*device = ctx->dev;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
	CUresult r;

	EMU_ENTER();
	r = emu_capture_unsafe();
	if (r != CUDA_SUCCESS)
		return r;
	if (!ctx)
		return current() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
	return ctx_valid(ctx) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
