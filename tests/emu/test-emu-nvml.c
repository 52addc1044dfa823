/* SPDX-License-Identifier: MIT */
/*
 * The emulated libnvidia-ml.so.1, used as the supervisor uses it: this process dlopens
 * libnvidia-ml.so.1 and never loads the driver; workers are other processes that load
 * libcuda.so.1 (dlopen + cuGetProcAddress_v2) and report what the driver says. Faults come
 * from another process too, through emu-ctl, as belayerctl will inject them.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "emu-state.h"
#include "nvml-abi.h"
#include "test-util.h"
#include "util.h"

#define NDEVICES   2
#define CAPACITY   (1ULL << 30)
#define TIMEOUT_MS 30000

static char *run_dir;

static struct {
	__typeof__(nvmlInit_v2) *Init;
	__typeof__(nvmlInitWithFlags) *InitWithFlags;
	__typeof__(nvmlShutdown) *Shutdown;
	__typeof__(nvmlErrorString) *ErrorString;
	__typeof__(nvmlDeviceGetCount_v2) *GetCount;
	__typeof__(nvmlDeviceGetHandleByIndex_v2) *GetHandleByIndex;
	__typeof__(nvmlDeviceGetHandleByUUID) *GetHandleByUUID;
	__typeof__(nvmlDeviceGetIndex) *GetIndex;
	__typeof__(nvmlDeviceGetUUID) *GetUUID;
	__typeof__(nvmlDeviceGetName) *GetName;
	__typeof__(nvmlDeviceGetMemoryInfo) *GetMemoryInfo;
	__typeof__(nvmlDeviceGetMemoryInfo_v2) *GetMemoryInfo_v2;
	__typeof__(nvmlDeviceGetTotalEccErrors) *GetTotalEccErrors;
	__typeof__(nvmlDeviceGetRetiredPages) *GetRetiredPages;
	__typeof__(nvmlDeviceGetRetiredPages_v2) *GetRetiredPages_v2;
	__typeof__(nvmlEventSetCreate) *EventSetCreate;
	__typeof__(nvmlDeviceRegisterEvents) *RegisterEvents;
	__typeof__(nvmlDeviceGetSupportedEventTypes) *GetSupportedEventTypes;
	__typeof__(nvmlEventSetWait_v2) *EventSetWait;
	__typeof__(nvmlEventSetFree) *EventSetFree;
	__typeof__(nvmlDeviceGetComputeRunningProcesses_v3) *GetComputeRunningProcesses;
} nvml;

#define NVML_SYM(lib, field, name)                                       \
	do {                                                             \
		nvml.field = (__typeof__(nvml.field))dlsym(lib, name);   \
		if (!nvml.field) {                                       \
			print_error("dlsym(%s): %s\n", name, dlerror()); \
			return -1;                                       \
		}                                                        \
	} while (0)

static int nvml_load(void)
{
	void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);

	if (!lib) {
		print_error("dlopen(libnvidia-ml.so.1): %s\n", dlerror());
		return -1;
	}
	NVML_SYM(lib, Init, "nvmlInit_v2");
	NVML_SYM(lib, InitWithFlags, "nvmlInitWithFlags");
	NVML_SYM(lib, Shutdown, "nvmlShutdown");
	NVML_SYM(lib, ErrorString, "nvmlErrorString");
	NVML_SYM(lib, GetCount, "nvmlDeviceGetCount_v2");
	NVML_SYM(lib, GetHandleByIndex, "nvmlDeviceGetHandleByIndex_v2");
	NVML_SYM(lib, GetHandleByUUID, "nvmlDeviceGetHandleByUUID");
	NVML_SYM(lib, GetIndex, "nvmlDeviceGetIndex");
	NVML_SYM(lib, GetUUID, "nvmlDeviceGetUUID");
	NVML_SYM(lib, GetName, "nvmlDeviceGetName");
	NVML_SYM(lib, GetMemoryInfo, "nvmlDeviceGetMemoryInfo");
	NVML_SYM(lib, GetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo_v2");
	NVML_SYM(lib, GetTotalEccErrors, "nvmlDeviceGetTotalEccErrors");
	NVML_SYM(lib, GetRetiredPages, "nvmlDeviceGetRetiredPages");
	NVML_SYM(lib, GetRetiredPages_v2, "nvmlDeviceGetRetiredPages_v2");
	NVML_SYM(lib, EventSetCreate, "nvmlEventSetCreate");
	NVML_SYM(lib, RegisterEvents, "nvmlDeviceRegisterEvents");
	NVML_SYM(lib, GetSupportedEventTypes, "nvmlDeviceGetSupportedEventTypes");
	NVML_SYM(lib, EventSetWait, "nvmlEventSetWait_v2");
	NVML_SYM(lib, EventSetFree, "nvmlEventSetFree");
	NVML_SYM(lib, GetComputeRunningProcesses, "nvmlDeviceGetComputeRunningProcesses_v3");
	return 0;
}

#define assert_nvml(call) assert_int_equal((call), NVML_SUCCESS)

static nvmlDevice_t handle(unsigned i)
{
	nvmlDevice_t d = NULL;

	assert_nvml(nvml.GetHandleByIndex(i, &d));
	return d;
}

static int setup_init(void **state)
{
	return nvml.Init() == NVML_SUCCESS ? 0 : -1;
}

static int teardown_shutdown(void **state)
{
	return nvml.Shutdown() == NVML_SUCCESS ? 0 : -1;
}

/* ---- a worker process: the driver's view ---- */

#define CHECK(cond)                                                                            \
	do {                                                                                   \
		if (!(cond)) {                                                                 \
			fprintf(stderr, "worker %d: %s:%d: check failed: %s\n", (int)getpid(), \
				__FILE__, __LINE__, #cond);                                    \
			_exit(1);                                                              \
		}                                                                              \
	} while (0)

struct worker {
	pid_t pid;
	int from; /* what the worker reports */
	int to;	  /* one byte: exit */
};

struct worker_report {
	int count;
	unsigned char uuid[NDEVICES][16];
	char name[64];
};

static void *driver_sym(PFN_cuGetProcAddress_v12000 gpa, const char *name, int version)
{
	CUdriverProcAddressQueryResult status;
	void *p = NULL;

	CHECK(gpa(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS);
	CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS && p);
	return p;
}

/* Reports device count, UUIDs and name; when alloc_bytes, allocates them on device dev and
 * holds them until told to exit. */
static void worker_main(int dev, size_t alloc_bytes, int out, int in)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	PFN_cuGetProcAddress_v12000 gpa;
	PFN_cuInit_v2000 cu_init;
	PFN_cuDeviceGetCount_v2000 get_count;
	PFN_cuDeviceGet_v2000 device_get;
	PFN_cuDeviceGetUuid_v11040 get_uuid;
	PFN_cuDeviceGetName_v2000 get_name;
	PFN_cuDevicePrimaryCtxRetain_v7000 retain;
	PFN_cuCtxSetCurrent_v4000 set_current;
	PFN_cuMemAlloc_v3020 mem_alloc;
	struct worker_report rep = {0};
	CUcontext ctx;
	CUdeviceptr p;
	CUdevice d;
	char c;

	CHECK(lib);
	gpa = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
	CHECK(gpa);
	cu_init = driver_sym(gpa, "cuInit", 2000);
	get_count = driver_sym(gpa, "cuDeviceGetCount", 2000);
	device_get = driver_sym(gpa, "cuDeviceGet", 2000);
	get_uuid = driver_sym(gpa, "cuDeviceGetUuid", 11040);
	get_name = driver_sym(gpa, "cuDeviceGetName", 2000);
	retain = driver_sym(gpa, "cuDevicePrimaryCtxRetain", 7000);
	set_current = driver_sym(gpa, "cuCtxSetCurrent", 4000);
	mem_alloc = driver_sym(gpa, "cuMemAlloc", 3020);
	CHECK(cu_init(0) == CUDA_SUCCESS);
	CHECK(get_count(&rep.count) == CUDA_SUCCESS && rep.count == NDEVICES);
	for (int i = 0; i < rep.count; i++) {
		CUuuid u;

		CHECK(device_get(&d, i) == CUDA_SUCCESS);
		CHECK(get_uuid(&u, d) == CUDA_SUCCESS);
		memcpy(rep.uuid[i], u.bytes, 16);
	}
	CHECK(get_name(rep.name, sizeof(rep.name), 0) == CUDA_SUCCESS);
	if (alloc_bytes) {
		CHECK(device_get(&d, dev) == CUDA_SUCCESS);
		CHECK(retain(&ctx, d) == CUDA_SUCCESS);
		CHECK(set_current(ctx) == CUDA_SUCCESS);
		CHECK(mem_alloc(&p, alloc_bytes) == CUDA_SUCCESS);
	}
	CHECK(write(out, &rep, sizeof(rep)) == (ssize_t)sizeof(rep));
	CHECK(read(in, &c, 1) >= 0); /* EOF or a byte: time to go */
	_exit(0);
}

static void worker_start(struct worker *w, int dev, size_t alloc_bytes,
			 struct worker_report *ret_report)
{
	int up[2], down[2];
	struct pollfd pfd;

	assert_int_equal(pipe2(up, O_CLOEXEC), 0);
	assert_int_equal(pipe2(down, O_CLOEXEC), 0);
	w->pid = fork();
	assert_true(w->pid >= 0);
	if (w->pid == 0) {
		(void)prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(up[0]);
		close(down[1]);
		worker_main(dev, alloc_bytes, up[1], down[0]);
	}
	close(up[1]);
	close(down[0]);
	w->from = up[0];
	w->to = down[1];
	pfd = (struct pollfd){.fd = w->from, .events = POLLIN};
	assert_int_equal(poll(&pfd, 1, TIMEOUT_MS), 1);
	assert_int_equal(read(w->from, ret_report, sizeof(*ret_report)), sizeof(*ret_report));
}

static void worker_stop(struct worker *w)
{
	int status;

	close(w->to);
	assert_int_equal(waitpid(w->pid, &status, 0), w->pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	close(w->from);
}

/* ---- emu-ctl, another process, as belayerctl injects ---- */

static void emu_ctl(const char *a1, const char *a2, const char *a3, const char *a4)
{
	const char *ctl = getenv("EMU_CTL");
	pid_t pid;
	int status;

	assert_non_null(ctl);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		execl(ctl, "emu-ctl", a1, a2, a3, a4, (char *)NULL);
		_exit(127);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- tests ---- */

/* "A reference count of the number of initializations is maintained": each init needs its
 * shutdown; outside, calls fail with NVML_ERROR_UNINITIALIZED. */
static void test_init_shutdown_refcount(void **state)
{
	unsigned n;

	assert_int_equal(nvml.GetCount(&n), NVML_ERROR_UNINITIALIZED);
	assert_int_equal(nvml.Shutdown(), NVML_ERROR_UNINITIALIZED);
	assert_nvml(nvml.Init());
	assert_nvml(nvml.InitWithFlags(NVML_INIT_FLAG_NO_GPUS));
	assert_nvml(nvml.Shutdown());
	assert_nvml(nvml.GetCount(&n));
	assert_int_equal(n, NDEVICES);
	assert_nvml(nvml.Shutdown());
	assert_int_equal(nvml.GetCount(&n), NVML_ERROR_UNINITIALIZED);
	/* "no error is reported if nvmlShutdown() is called more times than nvmlInit()" */
	assert_nvml(nvml.Shutdown());
	assert_int_equal(nvml.GetCount(&n), NVML_ERROR_UNINITIALIZED);
	assert_string_equal(nvml.ErrorString(NVML_ERROR_TIMEOUT), "Timeout");
}

static void uuid_string(const unsigned char u[16], char *buf, size_t len)
{
	snprintf(buf, len,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
		 u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
		 u[14], u[15]);
}

/* The supervisor matches NVML devices to the workers' CUDA devices by UUID. */
static void test_devices_match_the_driver(void **state)
{
	struct worker_report rep;
	struct worker w;
	char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE], want[64], name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
	unsigned n, idx;
	nvmlDevice_t d;

	worker_start(&w, 0, 0, &rep);
	worker_stop(&w);
	assert_nvml(nvml.GetCount(&n));
	assert_int_equal(n, (unsigned)rep.count);
	for (unsigned i = 0; i < n; i++) {
		nvmlDevice_t h = handle(i);

		assert_nvml(nvml.GetIndex(h, &idx));
		assert_int_equal(idx, i);
		assert_nvml(nvml.GetUUID(h, uuid, NVML_DEVICE_UUID_BUFFER_SIZE));
		uuid_string(rep.uuid[i], want, sizeof(want));
		assert_string_equal(uuid, want);
		assert_nvml(nvml.GetHandleByUUID(uuid, &d));
		assert_ptr_equal(d, h);
		assert_nvml(nvml.GetName(h, name, sizeof(name)));
		assert_string_equal(name, rep.name);
		assert_int_equal(nvml.GetUUID(h, uuid, (unsigned)strlen(want)),
				 NVML_ERROR_INSUFFICIENT_SIZE);
	}
	assert_int_equal(nvml.GetHandleByUUID("GPU-00000000-0000-4000-8000-000000000000", &d),
			 NVML_ERROR_NOT_FOUND);
	assert_int_equal(nvml.GetHandleByIndex(n, &d), NVML_ERROR_INVALID_ARGUMENT);
	assert_int_equal(nvml.GetIndex((nvmlDevice_t)&d, &idx), NVML_ERROR_INVALID_ARGUMENT);
}

/* Memory another process allocates shows as used on its device, and is free again once that
 * process is gone. */
static void test_memory_info_tracks_other_processes(void **state)
{
	const size_t bytes = 96ULL << 20;
	nvmlMemory_t before, during, after, other;
	nvmlMemory_v2_t v2 = {.version = nvmlMemory_v2}, bad = {.version = 1};
	struct worker_report rep;
	struct worker w;

	assert_nvml(nvml.GetMemoryInfo(handle(1), &before));
	assert_int_equal(before.total, CAPACITY);
	assert_int_equal(before.used + before.free, before.total);
	worker_start(&w, 1, bytes, &rep);
	assert_nvml(nvml.GetMemoryInfo(handle(1), &during));
	assert_nvml(nvml.GetMemoryInfo(handle(0), &other));
	assert_nvml(nvml.GetMemoryInfo_v2(handle(1), &v2));
	assert_true(during.used >= before.used + bytes);
	assert_int_equal(during.used + during.free, during.total);
	assert_int_equal(v2.total, CAPACITY);
	assert_int_equal(v2.used, during.used);
	assert_int_equal(v2.reserved, 0);
	assert_int_equal(other.used, 0);
	assert_int_equal(nvml.GetMemoryInfo_v2(handle(1), &bad),
			 NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
	worker_stop(&w);
	assert_nvml(nvml.GetMemoryInfo(handle(1), &after));
	assert_int_equal(after.used, before.used);
}

/* The device memory a process uses, as the supervisor reads a parked shadow's (issue 22
 * item 4): listed on its device only, with what it allocated; the array-size protocol as NVML
 * documents it; gone with the process. */
static unsigned long long used_by(unsigned dev, pid_t pid, unsigned *ret_count)
{
	nvmlProcessInfo_t infos[64];
	unsigned count = 0;
	unsigned long long used = 0;
	nvmlReturn_t r = nvml.GetComputeRunningProcesses(handle(dev), &count, NULL);

	assert_int_equal(r, count ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS);
	*ret_count = count;
	count = ARRAY_SIZE(infos);
	assert_nvml(nvml.GetComputeRunningProcesses(handle(dev), &count, infos));
	assert_int_equal(count, *ret_count);
	for (unsigned i = 0; i < count; i++)
		if (infos[i].pid == (unsigned)pid)
			used += infos[i].usedGpuMemory;
	return used;
}

static void test_running_processes(void **state)
{
	const size_t bytes = 96ULL << 20;
	struct worker_report rep;
	struct worker w;
	unsigned n;

	worker_start(&w, 1, bytes, &rep);
	assert_int_equal(used_by(1, w.pid, &n), bytes);
	assert_true(n >= 1);
	assert_int_equal(used_by(0, w.pid, &n), 0);
	assert_int_equal(nvml.GetComputeRunningProcesses(handle(1), NULL, NULL),
			 NVML_ERROR_INVALID_ARGUMENT);
	worker_stop(&w);
	assert_int_equal(used_by(1, w.pid, &n), 0);
}

/* XID 79 ("GPU has fallen off the bus") raised by another process reaches a waiting event
 * set with the right device and the XID as eventData; nothing is delivered twice, nothing
 * from an unregistered device, nothing from before registration. */
static void test_xid_event_delivered(void **state)
{
	nvmlEventSet_t set;
	nvmlEventData_t ev = {0};
	unsigned long long supported = 0;
	uint64_t t0;

	assert_nvml(nvml.GetSupportedEventTypes(handle(1), &supported));
	assert_true(supported & nvmlEventTypeXidCriticalError);
	emu_ctl("xid", "1", "13", NULL); /* before registration: never delivered */
	assert_nvml(nvml.EventSetCreate(&set));
	assert_nvml(nvml.RegisterEvents(handle(1), nvmlEventTypeXidCriticalError, set));
	assert_int_equal(nvml.EventSetWait(set, &ev, 0), NVML_ERROR_TIMEOUT);
	t0 = now_ms();
	assert_int_equal(nvml.EventSetWait(set, &ev, 200), NVML_ERROR_TIMEOUT);
	assert_true(now_ms() - t0 >= 190); /* it did wait for the timeout */

	emu_ctl("xid", "0", "48", NULL); /* device 0 is not registered */
	emu_ctl("xid", "1", "79", NULL);
	assert_nvml(nvml.EventSetWait(set, &ev, TIMEOUT_MS));
	assert_ptr_equal(ev.device, handle(1));
	assert_int_equal(ev.eventType, nvmlEventTypeXidCriticalError);
	assert_int_equal(ev.eventData, 79);
	assert_int_equal(ev.gpuInstanceId, 0xFFFFFFFFu);
	assert_int_equal(ev.computeInstanceId, 0xFFFFFFFFu);
	assert_int_equal(nvml.EventSetWait(set, &ev, 0), NVML_ERROR_TIMEOUT);
	assert_nvml(nvml.EventSetFree(set));
}

/* A wait that is already sleeping returns when the event arrives, well before its timeout. */
static void test_wait_returns_on_event(void **state)
{
	nvmlEventSet_t set;
	nvmlEventData_t ev = {0};
	uint64_t t0;
	pid_t pid;
	int status;

	assert_nvml(nvml.EventSetCreate(&set));
	assert_nvml(nvml.RegisterEvents(handle(0), nvmlEventTypeXidCriticalError, set));
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(emu_xid_raise(0, 31) == 0 ? 0 : 1);
	t0 = now_ms();
	assert_nvml(nvml.EventSetWait(set, &ev, TIMEOUT_MS));
	assert_true(now_ms() - t0 < TIMEOUT_MS);
	assert_int_equal(ev.eventData, 31);
	assert_ptr_equal(ev.device, handle(0));
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_int_equal(status, 0);
	assert_nvml(nvml.EventSetFree(set));
}

static void test_ecc_counters_events_retired_pages(void **state)
{
	unsigned long long sbe0, dbe0, v, addrs[8], ts[8];
	nvmlEventSet_t set;
	nvmlEventData_t ev;
	unsigned n;
	nvmlDevice_t d = handle(0);

	assert_nvml(nvml.GetTotalEccErrors(d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC,
					   &sbe0));
	assert_nvml(nvml.GetTotalEccErrors(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
					   NVML_AGGREGATE_ECC, &dbe0));
	assert_nvml(nvml.EventSetCreate(&set));
	assert_nvml(nvml.RegisterEvents(
		d, nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError, set));

	emu_ctl("ecc", "0", "--uncorrected", "2");
	assert_nvml(nvml.GetTotalEccErrors(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC,
					   &v));
	assert_int_equal(v, dbe0 + 2);
	assert_nvml(nvml.GetTotalEccErrors(d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC,
					   &v));
	assert_int_equal(v, sbe0);
	assert_nvml(nvml.EventSetWait(set, &ev, TIMEOUT_MS));
	assert_int_equal(ev.eventType, nvmlEventTypeDoubleBitEccError);
	assert_ptr_equal(ev.device, d);

	emu_ctl("ecc", "0", "3", NULL);
	assert_nvml(nvml.EventSetWait(set, &ev, TIMEOUT_MS));
	assert_int_equal(ev.eventType, nvmlEventTypeSingleBitEccError);
	assert_int_equal(nvml.EventSetWait(set, &ev, 0), NVML_ERROR_TIMEOUT);

	/* One retired page per double-bit error; size query first, as documented. */
	n = 0;
	assert_int_equal(
		nvml.GetRetiredPages(d, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, &n, NULL),
		NVML_ERROR_INSUFFICIENT_SIZE);
	assert_int_equal(n, dbe0 + 2);
	n = ARRAY_SIZE(addrs);
	assert_nvml(nvml.GetRetiredPages_v2(d, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, &n,
					    addrs, ts));
	assert_int_equal(n, dbe0 + 2);
	assert_true(addrs[0] != addrs[1]);
	n = ARRAY_SIZE(addrs);
	assert_nvml(nvml.GetRetiredPages(
		d, NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, &n, addrs));
	assert_int_equal(n, 0);
	assert_nvml(nvml.EventSetFree(set));
}

static void test_unsupported_event_types(void **state)
{
	nvmlEventSet_t set;

	assert_nvml(nvml.EventSetCreate(&set));
	assert_int_equal(nvml.RegisterEvents(handle(0), nvmlEventTypePState, set),
			 NVML_ERROR_NOT_SUPPORTED);
	assert_int_equal(nvml.RegisterEvents(handle(0), nvmlEventTypeXidCriticalError, NULL),
			 NVML_ERROR_INVALID_ARGUMENT);
	assert_nvml(nvml.EventSetFree(set));
}

static void test_fault_injection(void **state)
{
	unsigned n;
	nvmlMemory_t m;

	assert_int_equal(emu_fault_add("nvmlDeviceGetCount_v2", 1, NVML_ERROR_UNKNOWN), 0);
	emu_ctl("fail", "nvmlDeviceGetMemoryInfo", "2", "15"); /* NVML_ERROR_GPU_IS_LOST */
	assert_int_equal(nvml.GetCount(&n), NVML_ERROR_UNKNOWN);
	assert_nvml(nvml.GetCount(&n));
	assert_int_equal(nvml.GetMemoryInfo(handle(0), &m), NVML_ERROR_GPU_IS_LOST);
	assert_int_equal(nvml.GetMemoryInfo(handle(0), &m), NVML_ERROR_GPU_IS_LOST);
	assert_nvml(nvml.GetMemoryInfo(handle(0), &m));
}

static int group_setup(void **state)
{
	run_dir = test_mkdtemp("belayer-emu-nvml");
	if (!run_dir)
		return -1;
	/* The run's configuration: first process wins, so set before anything opens it. */
	setenv("BELAYER_EMU_DIR", run_dir, 1);
	setenv("BELAYER_EMU_DEVICES", "2", 1);
	setenv("BELAYER_EMU_MEM", "1G", 1);
	if (emu_state_open() < 0)
		return -1;
	return nvml_load();
}

static int group_teardown(void **state)
{
	if (run_dir)
		(void)test_rmtree(run_dir);
	free(run_dir);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_init_shutdown_refcount),
		cmocka_unit_test_setup_teardown(test_devices_match_the_driver, setup_init,
						teardown_shutdown),
		cmocka_unit_test_setup_teardown(test_memory_info_tracks_other_processes, setup_init,
						teardown_shutdown),
		cmocka_unit_test_setup_teardown(test_running_processes, setup_init,
						teardown_shutdown),
		cmocka_unit_test_setup_teardown(test_xid_event_delivered, setup_init,
						teardown_shutdown),
		cmocka_unit_test_setup_teardown(test_wait_returns_on_event, setup_init,
						teardown_shutdown),
		cmocka_unit_test_setup_teardown(test_ecc_counters_events_retired_pages, setup_init,
						teardown_shutdown),
		cmocka_unit_test_setup_teardown(test_unsupported_event_types, setup_init,
						teardown_shutdown),
		cmocka_unit_test_setup_teardown(test_fault_injection, setup_init,
						teardown_shutdown),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
