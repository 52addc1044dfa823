/* SPDX-License-Identifier: MIT */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "workload-driver.h"

struct wl_driver wl;

void wl_die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "%s: ", program_invocation_short_name);
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

void *wl_resolve(const char *name, int version)
{
	CUdriverProcAddressQueryResult status;
	void *fn = NULL;

	if (wl.gpa(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
	    status != CU_GET_PROC_ADDRESS_SUCCESS || !fn)
		wl_die("cannot resolve %s at %d", name, version);
	return fn;
}

void wl_driver_open(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	if (!lib)
		wl_die("dlopen libcuda.so.1: %s", dlerror());
	wl.gpa = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
	if (!wl.gpa)
		wl_die("no cuGetProcAddress_v2");
	wl.init = wl_resolve("cuInit", 2000);
	wl.device_get = wl_resolve("cuDeviceGet", 2000);
	wl.primary_retain = wl_resolve("cuDevicePrimaryCtxRetain", 7000);
	wl.ctx_set = wl_resolve("cuCtxSetCurrent", 4000);
}

CUcontext wl_ctx_init(void)
{
	CUcontext ctx;
	CUdevice dev;

	CHECK(wl.init(0));
	CHECK(wl.device_get(&dev, 0));
	CHECK(wl.primary_retain(&ctx, dev));
	CHECK(wl.ctx_set(ctx));
	return ctx;
}
