/* SPDX-License-Identifier: MIT */
/*
 * Test-side interface of the emulated libcuda.so.1: what a test, a host kernel library or the
 * other emulated libraries (libnccl.so.2) may call besides the CUDA Driver API. Every function
 * here is exported by libcuda.so.1 under this exact name; programs that dlopen the driver
 * resolve them with dlsym. Test-only, like the whole emulator.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

/* One kernel launch as the host implementation sees it. The emulator runs the whole grid in
 * one call, synchronously, on the calling thread; the kernel loops over blocks and threads
 * itself if it cares about them. */
struct belayer_emu_launch {
	const char *name;    /* the PTX .entry name */
	unsigned grid[3];    /* gridDimX/Y/Z */
	unsigned block[3];   /* blockDimX/Y/Z */
	unsigned shared_mem; /* sharedMemBytes */
	CUstream stream;
	CUdevice device; /* device of the current context */
};

/* kernelParams exactly as passed to cuLaunchKernel: params[i] points at argument i. Device
 * pointers among the arguments must go through belayer_emu_translate before any access. */
typedef void (*belayer_emu_kernel_fn)(const struct belayer_emu_launch *l, void **params);

/* Registers the host implementation of the kernel named name (a PTX .entry name); later
 * registrations of the same name replace earlier ones. Host kernel libraries call it from
 * their constructors; libraries listed in BELAYER_EMU_KERNELS (colon-separated paths) are
 * dlopen()ed by cuInit. Returns 0 or -errno. */
int belayer_emu_register_kernel(const char *name, belayer_emu_kernel_fn fn);

/* Host pointer to the emulator's own view of device memory [p, p + len), or NULL with errno
 * EFAULT when that range is not mapped with access (cuMemSetAccess) in this process. The view
 * is contiguous across adjacent mappings of one reservation. Device pointers themselves are
 * not host-dereferenceable (unless BELAYER_EMU_HOST_ACCESS=1). */
void *belayer_emu_translate(CUdeviceptr p, size_t len);

/* Number of allocations of device dev (-1: every device) of this run that any process still
 * references (handle, mapping, exported fd), and their bytes into *ret_bytes (may be NULL).
 * Scans /proc: the kernel's view, exact across processes. Returns the count or -errno. */
int64_t belayer_emu_live_allocations(int dev, uint64_t *ret_bytes);

/* The run-wide allocation id of the physical memory mapped at p, and p's offset in it (for
 * "emu-ctl flip ID OFFSET MASK"). Returns 0, or -EFAULT when nothing is mapped at p. */
int belayer_emu_alloc_id(CUdeviceptr p, uint64_t *ret_id, uint64_t *ret_offset);
