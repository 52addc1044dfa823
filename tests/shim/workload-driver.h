/* SPDX-License-Identifier: MIT */
/*
 * What shim-workload and shadow-workload share: the driver reached the way the CUDA runtime
 * reaches it (dlopen("libcuda.so.1"), dlsym of cuGetProcAddress_v2, every entry point resolved
 * by name at a CUDA version), and exit 1 with a message on any unexpected result.
 */
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

/* cuGetProcAddress_v2 and what making the primary context current takes. */
struct wl_driver {
	PFN_cuGetProcAddress_v12000 gpa;
	CUresult (*init)(unsigned);
	CUresult (*device_get)(CUdevice *, int);
	CUresult (*primary_retain)(CUcontext *, CUdevice);
	CUresult (*ctx_set)(CUcontext);
};

extern struct wl_driver wl;

/* Prints "PROGRAM: MESSAGE" on stderr and exits 1. */
void wl_die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

#define CHECK(call)                                                                  \
	do {                                                                         \
		CUresult r_ = (call);                                                \
		if (r_ != CUDA_SUCCESS)                                              \
			wl_die("%s failed: %d (line %d)", #call, (int)r_, __LINE__); \
	} while (0)

/* name at version through cuGetProcAddress_v2; dies if the driver has none. */
void *wl_resolve(const char *name, int version);
/* dlopens the driver and fills wl; no driver call made yet. */
void wl_driver_open(void);
/* cuInit, then device 0's primary context made current; returns it. */
CUcontext wl_ctx_init(void);
