/* SPDX-License-Identifier: MIT */
/*
 * gpu-nvml: the NVML reads the supervisor's GPU health check makes (DESIGN §1.2 step 2),
 * through dlopen("libnvidia-ml.so.1") and the declarations of common/nvml-abi.h, on the real
 * device: init, device count, name and UUID (matched against cuDeviceGetUuid of every CUDA
 * device), memory info, volatile ECC counters, retired pages, and an XID event set.
 *
 * The event wait: with $EMU_CTL set (the emulated stack) the check raises XID 79 on device 0
 * through emu-ctl after registering and expects that event; otherwise it expects the wait to
 * time out (a real XID arriving is reported, and fails the check: the device is unhealthy).
 *
 * --watch-xid SECONDS (experiment E6, tests/gpu/README.md): only registers every device for
 * XID events, prints "watching", and prints each XID that arrives ("XID N on device I"),
 * until the first one or SECONDS; exit 0 either way (the events are the answer).
 *
 * Usage: gpu-nvml [--wait-ms N] | --watch-xid SECONDS
 */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "gpu-check.h"
#include "nvml-abi.h"

#define EMU_XID 79

extern char **environ;

#define NVML_FUNCS(X)                       \
	X(nvmlInit_v2)                      \
	X(nvmlShutdown)                     \
	X(nvmlErrorString)                  \
	X(nvmlDeviceGetCount_v2)            \
	X(nvmlDeviceGetHandleByIndex_v2)    \
	X(nvmlDeviceGetName)                \
	X(nvmlDeviceGetUUID)                \
	X(nvmlDeviceGetMemoryInfo)          \
	X(nvmlDeviceGetTotalEccErrors)      \
	X(nvmlDeviceGetRetiredPages)        \
	X(nvmlEventSetCreate)               \
	X(nvmlDeviceGetSupportedEventTypes) \
	X(nvmlDeviceRegisterEvents)         \
	X(nvmlEventSetWait_v2)              \
	X(nvmlEventSetFree)

#define NVML_FIELD(name) __typeof__(name) *name;
static struct {
	NVML_FUNCS(NVML_FIELD)
} nv;
#undef NVML_FIELD

static const char *nv_err(nvmlReturn_t r)
{
	return nv.nvmlErrorString ? nv.nvmlErrorString(r) : "?";
}

static int nvml_open(void)
{
	void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);

	if (!lib) {
		printf("summary: dlopen libnvidia-ml.so.1: %s\n", dlerror());
		return -1;
	}
#define RESOLVE(name)                                                    \
	nv.name = (__typeof__(name) *)dlsym(lib, #name);                 \
	if (!nv.name) {                                                  \
		printf("summary: libnvidia-ml.so.1 has no %s\n", #name); \
		return -1;                                               \
	}
	NVML_FUNCS(RESOLVE)
#undef RESOLVE
	return 0;
}

/* The value, or why there is none. */
static const char *count_str(nvmlReturn_t r, unsigned long long v, char buf[32])
{
	if (r != NVML_SUCCESS)
		return nv_err(r);
	snprintf(buf, 32, "%llu", v);
	return buf;
}

/* CUuuid as NVML prints it: "GPU-" and 8-4-4-4-12 hex digits. */
static void uuid_string(const CUuuid *u, char out[64])
{
	const unsigned char *b = (const unsigned char *)u->bytes;
	int n = snprintf(out, 64, "GPU-");

	for (int i = 0; i < 16; i++) {
		n += snprintf(out + n, 64 - (size_t)n, "%02x", b[i]);
		if (i == 3 || i == 5 || i == 7 || i == 9)
			n += snprintf(out + n, 64 - (size_t)n, "-");
	}
}

static int run_emu_ctl_xid(const char *emu_ctl)
{
	char code[16];
	char *args[] = {(char *)emu_ctl, (char *)"xid", (char *)"0", code, NULL};
	pid_t pid;
	int st;

	snprintf(code, sizeof(code), "%d", EMU_XID);
	if (posix_spawn(&pid, emu_ctl, NULL, NULL, args, environ) != 0)
		return -1;
	st = gpu_wait(pid, 10000);
	return st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* Every CUDA device's UUID must be one NVML lists (CUDA_VISIBLE_DEVICES may hide some of
 * NVML's). Returns the number of CUDA devices matched, or -1. */
static int match_cuda(char uuids[][NVML_DEVICE_UUID_V2_BUFFER_SIZE], unsigned n)
{
	int count = 0, matched = 0;
	CUresult r;

	if (gpu_cu_open(0) < 0)
		return -1;
	r = cu.cuDeviceGetCount(&count);
	if (r != CUDA_SUCCESS) {
		printf("cuDeviceGetCount: %s\n", gpu_cu_name(r));
		return -1;
	}
	for (int i = 0; i < count; i++) {
		CUdevice d;
		CUuuid u;
		char s[64];
		bool found = false;

		r = cu.cuDeviceGet(&d, i);
		if (r == CUDA_SUCCESS)
			r = cu.cuDeviceGetUuid(&u, d);
		if (r != CUDA_SUCCESS) {
			printf("cuDeviceGetUuid(%d): %s\n", i, gpu_cu_name(r));
			return -1;
		}
		uuid_string(&u, s);
		for (unsigned j = 0; j < n; j++)
			found |= strcmp(s, uuids[j]) == 0;
		printf("CUDA device %d: %s %s\n", i, s, found ? "= NVML's" : "NOT listed by NVML");
		matched += found;
	}
	return matched == count ? count : -1;
}

/* --watch-xid: the XIDs of every device within seconds, ending at the first. */
static int watch_xid(unsigned seconds)
{
	nvmlDevice_t devs[64];
	nvmlEventSet_t set = NULL;
	unsigned count = 0, registered = 0;
	double end = gpu_now() + seconds;
	nvmlReturn_t r;

	if (nvml_open() < 0)
		return 1;
	r = nv.nvmlInit_v2();
	if (r == NVML_SUCCESS)
		r = nv.nvmlDeviceGetCount_v2(&count);
	if (r == NVML_SUCCESS)
		r = nv.nvmlEventSetCreate(&set);
	if (r != NVML_SUCCESS) {
		printf("summary: NVML init/count/event set: %s\n", nv_err(r));
		return 1;
	}
	if (count > 64)
		count = 64;
	for (unsigned i = 0; i < count; i++) {
		unsigned long long supported = 0;

		if (nv.nvmlDeviceGetHandleByIndex_v2(i, &devs[i]) != NVML_SUCCESS) {
			devs[i] = NULL;
			continue;
		}
		if (nv.nvmlDeviceGetSupportedEventTypes(devs[i], &supported) == NVML_SUCCESS &&
		    (supported & nvmlEventTypeXidCriticalError) &&
		    nv.nvmlDeviceRegisterEvents(devs[i], nvmlEventTypeXidCriticalError, set) ==
			    NVML_SUCCESS)
			registered++;
	}
	printf("watching %u of %u devices for XID events for %u s\n", registered, count, seconds);
	for (;;) {
		nvmlEventData_t ev = {};
		double left = end - gpu_now();

		if (left <= 0) {
			printf("summary: no XID event in %u s\n", seconds);
			break;
		}
		r = nv.nvmlEventSetWait_v2(set, &ev, (unsigned)(left * 1000) + 1);
		if (r == NVML_SUCCESS) {
			unsigned idx = count;

			for (unsigned i = 0; i < count; i++)
				if (devs[i] == ev.device)
					idx = i;
			printf("summary: XID %llu on device %u\n", ev.eventData, idx);
			break;
		}
		if (r != NVML_ERROR_TIMEOUT) {
			printf("summary: nvmlEventSetWait_v2: %s\n", nv_err(r));
			break;
		}
	}
	(void)nv.nvmlEventSetFree(set);
	(void)nv.nvmlShutdown();
	return 0;
}

int main(int argc, char **argv)
{
	char uuids[64][NVML_DEVICE_UUID_V2_BUFFER_SIZE];
	const char *emu_ctl = getenv("EMU_CTL");
	unsigned wait_ms = 1000, count = 0;
	unsigned long long supported = 0;
	nvmlEventSet_t set = NULL;
	nvmlEventData_t ev = {};
	nvmlDevice_t dev0 = NULL;
	nvmlReturn_t r;
	int ncuda, ret = 1;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && strcmp(argv[1], "--wait-ms") == 0)
		wait_ms = (unsigned)strtoul(argv[2], NULL, 10);
	else if (argc == 3 && strcmp(argv[1], "--watch-xid") == 0)
		return watch_xid((unsigned)strtoul(argv[2], NULL, 10));
	else if (argc != 1) {
		fprintf(stderr, "usage: gpu-nvml [--wait-ms N] | --watch-xid SECONDS\n");
		return 2;
	}
	if (nvml_open() < 0)
		return 1;
	r = nv.nvmlInit_v2();
	if (r != NVML_SUCCESS) {
		printf("summary: nvmlInit_v2: %s\n", nv_err(r));
		return 1;
	}
	r = nv.nvmlDeviceGetCount_v2(&count);
	if (r != NVML_SUCCESS || !count) {
		printf("summary: nvmlDeviceGetCount_v2: %s, %u devices\n", nv_err(r), count);
		goto out;
	}
	if (count > 64)
		count = 64;
	for (unsigned i = 0; i < count; i++) {
		char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = "", b_c[32], b_u[32], b_p[32];
		unsigned long long ecc_c = 0, ecc_u = 0;
		nvmlReturn_t rc, ru, rp;
		unsigned retired = 0;
		nvmlMemory_t mem;
		nvmlDevice_t d;

		r = nv.nvmlDeviceGetHandleByIndex_v2(i, &d);
		if (r == NVML_SUCCESS)
			r = nv.nvmlDeviceGetName(d, name, sizeof(name));
		if (r == NVML_SUCCESS)
			r = nv.nvmlDeviceGetUUID(d, uuids[i], sizeof(uuids[i]));
		if (r == NVML_SUCCESS)
			r = nv.nvmlDeviceGetMemoryInfo(d, &mem);
		if (r != NVML_SUCCESS) {
			printf("summary: device %u: handle/name/UUID/memory: %s\n", i, nv_err(r));
			goto out;
		}
		if (i == 0)
			dev0 = d;
		rc = nv.nvmlDeviceGetTotalEccErrors(d, NVML_MEMORY_ERROR_TYPE_CORRECTED,
						    NVML_VOLATILE_ECC, &ecc_c);
		ru = nv.nvmlDeviceGetTotalEccErrors(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
						    NVML_VOLATILE_ECC, &ecc_u);
		rp = nv.nvmlDeviceGetRetiredPages(
			d, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, &retired, NULL);
		printf("NVML device %u: %s %s, memory total %llu used %llu free %llu\n", i, name,
		       uuids[i], mem.total, mem.used, mem.free);
		printf("  volatile ECC corrected: %s, uncorrected: %s, retired pages (DBE): %s\n",
		       count_str(rc, ecc_c, b_c), count_str(ru, ecc_u, b_u),
		       count_str(rp == NVML_ERROR_INSUFFICIENT_SIZE ? NVML_SUCCESS : rp, retired,
				 b_p));
		/* "Not supported" is an answer (ECC off); any other failure is not. */
		if ((rc != NVML_SUCCESS && rc != NVML_ERROR_NOT_SUPPORTED) ||
		    (ru != NVML_SUCCESS && ru != NVML_ERROR_NOT_SUPPORTED)) {
			printf("summary: device %u: ECC counters: %s\n", i,
			       nv_err(rc != NVML_SUCCESS ? rc : ru));
			goto out;
		}
	}

	ncuda = match_cuda(uuids, count);
	if (ncuda < 0) {
		printf("summary: CUDA device UUIDs do not match NVML's (or CUDA failed)\n");
		goto out;
	}

	r = nv.nvmlEventSetCreate(&set);
	if (r == NVML_SUCCESS)
		r = nv.nvmlDeviceGetSupportedEventTypes(dev0, &supported);
	if (r != NVML_SUCCESS) {
		printf("summary: event set / supported event types: %s\n", nv_err(r));
		goto out;
	}
	if (!(supported & nvmlEventTypeXidCriticalError)) {
		printf("summary: device 0 does not support XID events (supported 0x%llx)\n",
		       supported);
		goto out;
	}
	r = nv.nvmlDeviceRegisterEvents(dev0, nvmlEventTypeXidCriticalError, set);
	if (r != NVML_SUCCESS) {
		printf("summary: nvmlDeviceRegisterEvents(XID): %s\n", nv_err(r));
		goto out;
	}
	if (emu_ctl && run_emu_ctl_xid(emu_ctl) < 0) {
		printf("summary: emu-ctl xid failed\n");
		goto out;
	}
	r = nv.nvmlEventSetWait_v2(set, &ev, wait_ms);
	if (emu_ctl) {
		if (r != NVML_SUCCESS || ev.eventType != nvmlEventTypeXidCriticalError ||
		    ev.eventData != EMU_XID || ev.device != dev0) {
			printf("summary: injected XID %d not delivered: %s, type 0x%llx data "
			       "%llu\n",
			       EMU_XID, nv_err(r), ev.eventType, ev.eventData);
			goto out;
		}
		printf("XID events: registered on device 0; injected XID %d delivered\n", EMU_XID);
	} else if (r == NVML_SUCCESS) {
		printf("summary: a real XID %llu arrived on device 0 during the wait\n",
		       ev.eventData);
		goto out;
	} else if (r != NVML_ERROR_TIMEOUT) {
		printf("summary: nvmlEventSetWait_v2: %s (expected a timeout)\n", nv_err(r));
		goto out;
	} else
		printf("XID events: registered on device 0; no event in %u ms (timeout, as "
		       "expected)\n",
		       wait_ms);
	printf("summary: %u NVML device(s), %d CUDA device(s) matched by UUID, memory/ECC read, "
	       "XID events work\n",
	       count, ncuda);
	ret = 0;
out:
	if (set)
		(void)nv.nvmlEventSetFree(set);
	(void)nv.nvmlShutdown();
	return ret;
}
