/* SPDX-License-Identifier: MIT */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda.h>
#include <zlib.h>

#include "log.h"
#include "nvml-abi.h"
#include "supervisor-health.h"

static void result_set(struct health_result *r, enum health_check check, enum health_verdict v,
		       int32_t dev, uint32_t pid, const char *fmt, ...) _printf_(6, 7);

static void result_set(struct health_result *r, enum health_check check, enum health_verdict v,
		       int32_t dev, uint32_t pid, const char *fmt, ...)
{
	va_list ap;

	r->check = check;
	r->verdict = v;
	r->dev = dev;
	r->pid = pid;
	va_start(ap, fmt);
	(void)vsnprintf(r->message, sizeof(r->message), fmt, ap);
	va_end(ap);
}

/* Alive now? The pidfd turns readable when the process exits; without one, our records. */
static bool worker_alive(const struct sv_worker *w)
{
	struct pollfd p = {.fd = w->pidfd, .events = POLLIN};

	if (w->state == WORKER_DEAD)
		return false;
	if (w->pidfd < 0)
		return true; /* cannot prove it gone */
	return poll(&p, 1, 0) == 0;
}

int health_owner_check(struct supervisor *s, struct sv_worker *w, struct health_result *ret)
{
	if (worker_alive(w)) {
		result_set(ret, HEALTH_OWNER, VERDICT_FAILED, -1, (uint32_t)w->pid,
			   "owner pid %d is still alive", w->pid);
		return 0;
	}
	/* NCCL groups cannot be partially recovered: every primary rank must be gone. */
	for (struct sv_worker *o = s->reg.workers; o; o = o->next) {
		if (o == w || o->group != w->group || o->role != ROLE_PRIMARY || !worker_alive(o))
			continue;
		result_set(ret, HEALTH_OWNER, VERDICT_FAILED, -1, (uint32_t)w->pid,
			   "rank %d (pid %d) of engine \"%s\" is still alive", o->rank, o->pid,
			   worker_engine(w));
		return 0;
	}
	result_set(ret, HEALTH_OWNER, VERDICT_OK, -1, (uint32_t)w->pid,
		   "owner and every primary of engine \"%s\" are gone", worker_engine(w));
	return 0;
}

/* ---- GPU (NVML) ------------------------------------------------------------------------- */

#define GPU_MAX_DEVICES 64

struct health_gpu {
	void *lib;
	char why[PROTO_MAX_STR + 1]; /* why NVML is unusable; "" when it works */
	struct id_list fatal_xids;
	nvmlReturn_t (*init)(void);
	nvmlReturn_t (*shutdown)(void);
	const char *(*error_string)(nvmlReturn_t);
	nvmlReturn_t (*count)(unsigned int *);
	nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t *);
	nvmlReturn_t (*get_index)(nvmlDevice_t, unsigned int *);
	nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t *);
	nvmlReturn_t (*ecc)(nvmlDevice_t, nvmlMemoryErrorType_t, nvmlEccCounterType_t,
			    unsigned long long *);
	nvmlReturn_t (*set_create)(nvmlEventSet_t *);
	nvmlReturn_t (*register_events)(nvmlDevice_t, unsigned long long, nvmlEventSet_t);
	nvmlReturn_t (*set_wait)(nvmlEventSet_t, nvmlEventData_t *, unsigned int);
	nvmlReturn_t (*set_free)(nvmlEventSet_t);
	nvmlEventSet_t set;
	unsigned n_devices;
	/* Optional (health_gpu_process_memory): not every NVML has it. */
	nvmlReturn_t (*procs)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
	struct {
		bool events;		   /* XID events registered */
		unsigned long long ecc_ok; /* uncorrected ECC count at the last good check */
		unsigned fatal_xid;	   /* first fatal XID seen since the last good check */
	} dev[GPU_MAX_DEVICES];
};

static const char *nvml_error(struct health_gpu *g, nvmlReturn_t r)
{
	static char buf[32];

	if (g->error_string)
		return g->error_string(r);
	snprintf(buf, sizeof(buf), "NVML error %d", (int)r);
	return buf;
}

#define RESOLVE(g, field, name)                                                      \
	do {                                                                         \
		*(void **)&(g)->field = dlsym((g)->lib, name);                       \
		if (!(g)->field) {                                                   \
			snprintf((g)->why, sizeof((g)->why), "NVML lacks %s", name); \
			return;                                                      \
		}                                                                    \
	} while (0)

static void gpu_load(struct health_gpu *g, const char *library)
{
	nvmlReturn_t r;

	g->lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
	if (!g->lib) {
		snprintf(g->why, sizeof(g->why), "NVML not available: %s", dlerror());
		return;
	}
	*(void **)&g->procs = dlsym(g->lib, "nvmlDeviceGetComputeRunningProcesses_v3");
	RESOLVE(g, init, "nvmlInit_v2");
	RESOLVE(g, shutdown, "nvmlShutdown");
	RESOLVE(g, error_string, "nvmlErrorString");
	RESOLVE(g, count, "nvmlDeviceGetCount_v2");
	RESOLVE(g, by_index, "nvmlDeviceGetHandleByIndex_v2");
	RESOLVE(g, get_index, "nvmlDeviceGetIndex");
	RESOLVE(g, memory, "nvmlDeviceGetMemoryInfo");
	RESOLVE(g, ecc, "nvmlDeviceGetTotalEccErrors");
	RESOLVE(g, set_create, "nvmlEventSetCreate");
	RESOLVE(g, register_events, "nvmlDeviceRegisterEvents");
	RESOLVE(g, set_wait, "nvmlEventSetWait_v2");
	RESOLVE(g, set_free, "nvmlEventSetFree");
	r = g->init();
	if (r != NVML_SUCCESS) {
		snprintf(g->why, sizeof(g->why), "nvmlInit failed: %s", nvml_error(g, r));
		g->init = NULL;
		return;
	}
	r = g->count(&g->n_devices);
	if (r != NVML_SUCCESS) {
		snprintf(g->why, sizeof(g->why), "nvmlDeviceGetCount failed: %s", nvml_error(g, r));
		return;
	}
	g->n_devices = MIN(g->n_devices, (unsigned)GPU_MAX_DEVICES);
	if (g->set_create(&g->set) != NVML_SUCCESS)
		g->set = NULL;
	for (unsigned i = 0; i < g->n_devices; i++) {
		nvmlDevice_t d;
		unsigned long long ecc = 0;

		if (g->by_index(i, &d) != NVML_SUCCESS)
			continue;
		/* XIDs are only delivered from registration on: register now, at startup. */
		if (g->set && g->register_events(d,
						 nvmlEventTypeXidCriticalError |
							 nvmlEventTypeDoubleBitEccError,
						 g->set) == NVML_SUCCESS)
			g->dev[i].events = true;
		else if (g->set && g->register_events(d, nvmlEventTypeXidCriticalError, g->set) ==
					   NVML_SUCCESS)
			g->dev[i].events = true;
		if (g->ecc(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &ecc) ==
		    NVML_SUCCESS)
			g->dev[i].ecc_ok = ecc;
	}
	log_info("NVML: %u devices.", g->n_devices);
}

struct health_gpu *health_gpu_new(const char *nvml_library, const struct id_list *fatal_xids)
{
	struct health_gpu *g = calloc(1, sizeof(*g));

	if (!g)
		return NULL;
	g->fatal_xids = *fatal_xids;
	gpu_load(g, nvml_library);
	if (g->why[0])
		log_warning("%s: GPU health verdicts will be \"unknown\".", g->why);
	return g;
}

void health_gpu_free(struct health_gpu *g)
{
	if (!g)
		return;
	if (g->set && g->set_free)
		(void)g->set_free(g->set);
	if (g->init && g->shutdown && !g->why[0])
		(void)g->shutdown();
	if (g->lib)
		(void)dlclose(g->lib);
	free(g);
}

/* Takes every pending event; fatal XIDs mark their device until a check reports them. */
static void gpu_drain_events(struct health_gpu *g)
{
	nvmlEventData_t e;

	if (!g->set)
		return;
	for (int n = 0; n < 4096 && g->set_wait(g->set, &e, 0) == NVML_SUCCESS; n++) {
		unsigned idx;

		if (g->get_index(e.device, &idx) != NVML_SUCCESS || idx >= g->n_devices)
			continue;
		if (e.eventType & nvmlEventTypeXidCriticalError) {
			if (id_list_contains(&g->fatal_xids, (uint32_t)e.eventData) &&
			    !g->dev[idx].fatal_xid)
				g->dev[idx].fatal_xid = (unsigned)e.eventData;
			log_info("GPU %u: XID %llu%s.", idx, e.eventData,
				 id_list_contains(&g->fatal_xids, (uint32_t)e.eventData)
					 ? " (fatal)"
					 : "");
		}
	}
}

static void gpu_check_one(struct health_gpu *g, unsigned i, struct health_result *r, bool fast)
{
	unsigned long long ecc = 0;
	nvmlMemory_t mem;
	nvmlDevice_t d;
	nvmlReturn_t e;

	e = g->by_index(i, &d);
	/* fast: the ECC counter query below is what must answer (a lost GPU fails it). */
	if (e == NVML_SUCCESS && !fast)
		e = g->memory(d, &mem);
	if (e == NVML_SUCCESS && fast) {
		e = g->ecc(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &ecc);
		if (e == NVML_ERROR_NOT_SUPPORTED)
			e = NVML_SUCCESS; /* no ECC on this board: it answered */
	}
	if (e != NVML_SUCCESS) {
		result_set(r, HEALTH_GPU, VERDICT_FAILED, (int32_t)i, 0,
			   "device does not answer: %s", nvml_error(g, e));
		return;
	}
	if (g->dev[i].fatal_xid) {
		/* Sticky: the memory that lived through a fatal XID stays suspect. */
		result_set(r, HEALTH_GPU, VERDICT_FAILED, (int32_t)i, 0,
			   "fatal XID %u since the last good check", g->dev[i].fatal_xid);
		return;
	}
	e = g->ecc(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &ecc);
	if (e == NVML_SUCCESS && ecc > g->dev[i].ecc_ok) {
		result_set(r, HEALTH_GPU, VERDICT_FAILED, (int32_t)i, 0,
			   "%llu uncorrected ECC errors since the last good check",
			   ecc - g->dev[i].ecc_ok);
		return;
	}
	if (!g->dev[i].events) {
		result_set(r, HEALTH_GPU, VERDICT_UNKNOWN, (int32_t)i, 0,
			   "device answers, but XID events are not available");
		return;
	}
	result_set(r, HEALTH_GPU, VERDICT_OK, (int32_t)i, 0,
		   "device answers, no fatal XID, no new uncorrected ECC error");
}

static size_t gpu_check(struct health_gpu *g, int dev, struct health_result *ret, size_t max,
			bool fast)
{
	size_t n = 0;

	if (max == 0)
		return 0;
	if (!g || g->why[0]) {
		result_set(&ret[0], HEALTH_GPU, VERDICT_UNKNOWN, dev, 0, "%s",
			   g ? g->why : "out of memory");
		return 1;
	}
	gpu_drain_events(g);
	if (dev >= 0) {
		if ((unsigned)dev >= g->n_devices) {
			result_set(&ret[0], HEALTH_GPU, VERDICT_UNKNOWN, dev, 0,
				   "no device %d (NVML sees %u)", dev, g->n_devices);
			return 1;
		}
		gpu_check_one(g, (unsigned)dev, &ret[0], fast);
		return 1;
	}
	if (g->n_devices == 0) {
		result_set(&ret[0], HEALTH_GPU, VERDICT_UNKNOWN, -1, 0, "NVML sees no device");
		return 1;
	}
	for (unsigned i = 0; i < g->n_devices && n < max; i++)
		gpu_check_one(g, i, &ret[n++], fast);
	return n;
}

size_t health_gpu_check(struct health_gpu *g, int dev, struct health_result *ret, size_t max)
{
	return gpu_check(g, dev, ret, max, false);
}

size_t health_gpu_check_fast(struct health_gpu *g, int dev, struct health_result *ret, size_t max)
{
	return gpu_check(g, dev, ret, max, true);
}

/* ---- content ---------------------------------------------------------------------------- */

static uint64_t crc_block(uint64_t crc, const uint8_t *p, size_t len)
{
	while (len > 0) {
		uInt n = (uInt)MIN(len, (size_t)1 << 30);

		crc = crc32((uLong)crc, p, n);
		p += n;
		len -= n;
	}
	return crc;
}

/* Reads the fd as a file (a memfd on the emulator). pread, not mmap: the fd comes from a peer,
 * which may shrink the file while we read, and a mapping would answer that with SIGBUS. */
static int checksum_file(int fd, uint64_t size, uint64_t *ret)
{
	const size_t chunk = 8u << 20;
	_cleanup_free_ uint8_t *buf = NULL;
	uint64_t crc = crc32(0, NULL, 0);
	struct stat st;

	if (fstat(fd, &st) < 0)
		return negative_errno();
	if (!S_ISREG(st.st_mode))
		return -EOPNOTSUPP;
	if ((uint64_t)st.st_size < size)
		return -ERANGE;
	buf = malloc(chunk);
	if (!buf)
		return -ENOMEM;
	for (uint64_t off = 0; off < size;) {
		ssize_t n = pread(fd, buf, (size_t)MIN((uint64_t)chunk, size - off), (off_t)off);

		if (n < 0)
			return negative_errno();
		if (n == 0)
			return -ERANGE; /* shrunk while we read */
		crc = crc_block(crc, buf, (size_t)n);
		off += (uint64_t)n;
	}
	*ret = crc;
	return 0;
}

/* The driver path: the only way to read device memory on a real GPU. Loaded on first use,
 * because a CUDA context costs device memory on every device it touches. Only the offload
 * thread calls it. */
static struct {
	bool tried;
	int error;
	CUresult (*init)(unsigned);
	CUresult (*device_count)(int *);
	CUresult (*device_get)(CUdevice *, int);
	CUresult (*device_uuid)(CUuuid *, CUdevice);
	CUresult (*ctx_retain)(CUcontext *, CUdevice);
	CUresult (*ctx_set)(CUcontext);
	CUresult (*import)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
	CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*addr_free)(CUdeviceptr, size_t);
	CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
			unsigned long long);
	CUresult (*unmap)(CUdeviceptr, size_t);
	CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*release)(CUmemGenericAllocationHandle);
	CUresult (*dtoh)(void *, CUdeviceptr, size_t);
} cu;

static int cuda_load(const char *library)
{
	static const struct {
		size_t offset;
		const char *name;
	} syms[] = {
#define SYM(f, n) {offsetof(__typeof__(cu), f), n}
		SYM(init, "cuInit"),
		SYM(device_count, "cuDeviceGetCount"),
		SYM(device_get, "cuDeviceGet"),
		SYM(device_uuid, "cuDeviceGetUuid"),
		SYM(ctx_retain, "cuDevicePrimaryCtxRetain"),
		SYM(ctx_set, "cuCtxSetCurrent"),
		SYM(import, "cuMemImportFromShareableHandle"),
		SYM(reserve, "cuMemAddressReserve"),
		SYM(addr_free, "cuMemAddressFree"),
		SYM(map, "cuMemMap"),
		SYM(unmap, "cuMemUnmap"),
		SYM(set_access, "cuMemSetAccess"),
		SYM(release, "cuMemRelease"),
		SYM(dtoh, "cuMemcpyDtoH_v2"),
#undef SYM
	};
	void *lib;

	if (cu.tried)
		return cu.error;
	cu.tried = true;
	lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		log_warning("Cannot load %s (%s): content checks through the driver are off.",
			    library, dlerror());
		return cu.error = -EOPNOTSUPP;
	}
	for (size_t i = 0; i < ARRAY_SIZE(syms); i++) {
		void *f = dlsym(lib, syms[i].name);

		if (!f) {
			log_warning("%s lacks %s, content checks through the driver are off.",
				    library, syms[i].name);
			return cu.error = -EOPNOTSUPP;
		}
		*(void **)((char *)&cu + syms[i].offset) = f;
	}
	if (cu.init(0) != CUDA_SUCCESS)
		return cu.error = -ENODEV;
	return cu.error = 0;
}

static int cuda_device_for(const uint8_t uuid[PROTO_UUID_LEN], CUdevice *ret)
{
	int n = 0;

	if (cu.device_count(&n) != CUDA_SUCCESS)
		return -ENODEV;
	for (int i = 0; i < n; i++) {
		CUdevice d;
		CUuuid u;

		if (cu.device_get(&d, i) == CUDA_SUCCESS && cu.device_uuid(&u, d) == CUDA_SUCCESS &&
		    memcmp(u.bytes, uuid, PROTO_UUID_LEN) == 0) {
			*ret = d;
			return 0;
		}
	}
	return -ENODEV;
}

static int checksum_driver(const char *library, int fd, uint64_t size,
			   const uint8_t uuid[PROTO_UUID_LEN], uint64_t *ret)
{
	const size_t chunk = 8u << 20;
	CUmemGenericAllocationHandle h;
	CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE},
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READ};
	_cleanup_free_ uint8_t *buf = NULL;
	CUdeviceptr va = 0;
	CUcontext ctx;
	CUdevice dev;
	uint64_t crc = crc32(0, NULL, 0);
	int r;

	r = cuda_load(library);
	if (r < 0)
		return r;
	r = cuda_device_for(uuid, &dev);
	if (r < 0)
		return r;
	if (cu.ctx_retain(&ctx, dev) != CUDA_SUCCESS || cu.ctx_set(ctx) != CUDA_SUCCESS)
		return -ENODEV;
	buf = malloc(chunk);
	if (!buf)
		return -ENOMEM;
	if (cu.import(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
	    CUDA_SUCCESS)
		return -EBADF;
	r = -EIO;
	if (cu.reserve(&va, (size_t)size, 0, 0, 0) != CUDA_SUCCESS)
		goto out_release;
	if (cu.map(va, (size_t)size, 0, h, 0) != CUDA_SUCCESS)
		goto out_free;
	acc.location.id = dev;
	if (cu.set_access(va, (size_t)size, &acc, 1) != CUDA_SUCCESS)
		goto out_unmap;
	for (uint64_t off = 0; off < size; off += chunk) {
		size_t n = (size_t)MIN((uint64_t)chunk, size - off);

		if (cu.dtoh(buf, va + off, n) != CUDA_SUCCESS)
			goto out_unmap;
		crc = crc_block(crc, buf, n);
	}
	*ret = crc;
	r = 0;
out_unmap:
	(void)cu.unmap(va, (size_t)size);
out_free:
	(void)cu.addr_free(va, (size_t)size);
out_release:
	(void)cu.release(h);
	return r;
}

int health_content_checksum(enum content_method method, const char *cuda_library, int fd,
			    uint64_t size, const uint8_t dev_uuid[PROTO_UUID_LEN],
			    uint64_t *ret_sum)
{
	int r;

	if (method != CONTENT_DRIVER) {
		r = checksum_file(fd, size, ret_sum);
		if (r != -EOPNOTSUPP || method == CONTENT_FILE)
			return r;
	}
	return checksum_driver(cuda_library, fd, size, dev_uuid, ret_sum);
}

int health_gpu_process_memory(struct health_gpu *g, const pid_t *pids, size_t n,
			      uint64_t *ret_bytes)
{
	static nvmlProcessInfo_t infos[1024]; /* the offload thread's alone, as g is */
	bool any = false;

	for (size_t i = 0; i < n; i++)
		ret_bytes[i] = UINT64_MAX;
	if (!g || g->why[0] || !g->procs)
		return -EOPNOTSUPP;
	for (unsigned d = 0; d < g->n_devices; d++) {
		unsigned int count = ARRAY_SIZE(infos);
		nvmlDevice_t dev;
		nvmlReturn_t r;

		if (g->by_index(d, &dev) != NVML_SUCCESS)
			continue;
		r = g->procs(dev, &count, infos);
		/* More processes than 1024 (INSUFFICIENT_SIZE): what NVML left in infos is not
		 * documented, so the device says nothing. */
		if (r != NVML_SUCCESS)
			continue;
		any = true;
		for (unsigned k = 0; k < MIN(count, (unsigned)ARRAY_SIZE(infos)); k++)
			for (size_t i = 0; i < n; i++)
				if (infos[k].pid == (unsigned)pids[i] &&
				    infos[k].usedGpuMemory != NVML_VALUE_NOT_AVAILABLE)
					ret_bytes[i] =
						(ret_bytes[i] == UINT64_MAX ? 0 : ret_bytes[i]) +
						infos[k].usedGpuMemory;
	}
	return any ? 0 : -EIO;
}
