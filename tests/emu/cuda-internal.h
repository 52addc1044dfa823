/* SPDX-License-Identifier: MIT */
/*
 * Shared between the files of the emulated libcuda.so.1; nothing here is exported. cuda.h is
 * included the way the real driver builds against it (__CUDA_API_VERSION_INTERNAL, set by
 * meson), which declares every versioned entry point (cuMemAlloc and cuMemAlloc_v2,
 * cuMemcpyHtoD_v2 and cuMemcpyHtoD_v2_ptds, ...) with its exact prototype.
 */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "belayer-emu.h"
#include "emu-state.h"
#include "util.h"

/* Every CUDA entry point is marked with CUAPI: default visibility, everything else hidden. */
#define CUAPI _public_
/* Another entry point with the same implementation: the _ptds/_ptsz per-thread-stream
 * variants, and v1 names whose prototype did not change. A function of its own (not an alias)
 * so that it has its own address, as in the real driver; type-checked against cuda.h's
 * declaration of name. */
#define EMU_VARIANT(name, target, params, args) \
	CUAPI CUresult name params              \
	{                                       \
		return target args;             \
	}

/* The granularity of cuMemCreate/cuMemMap (minimum and recommended), and of cuMemAlloc's
 * backing (a page: the driver promises 256-byte aligned pointers, a page is more). */
#define EMU_VMM_GRANULARITY (2ull << 20)
#define EMU_PAGE	    4096ull

/* Start of every entry point except those documented to work before cuInit: fails with
 * CUDA_ERROR_NOT_INITIALIZED before cuInit, then applies injected faults. */
CUresult emu_enter(const char *func);
#define EMU_ENTER()                                 \
	do {                                        \
		CUresult _er = emu_enter(__func__); \
		if (_er != CUDA_SUCCESS)            \
			return _er;                 \
	} while (0)
/* Only the fault check, for functions usable before cuInit. */
CUresult emu_fault_check(const char *func);

/* A kernel's illegal address (cuda-graph.c): while a host kernel runs, a failed
 * belayer_emu_translate marks the launch faulted; the launch then makes the process's CUDA
 * state sticky: every later entry point returns CUDA_ERROR_ILLEGAL_ADDRESS. */
extern __thread bool emu_in_kernel, emu_kernel_faulted;
void emu_set_sticky(CUresult r);

extern bool emu_host_access; /* BELAYER_EMU_HOST_ACCESS=1: device VAs are host memory */
bool emu_initialized(void);
int emu_ndevices(void);
/* CUDA_VISIBLE_DEVICES: a CUdevice is this process's ordinal; the run's device index (the
 * state file's, the memfd names', NVML's) is another number. -1 for a device not visible. */
int emu_dev_index(CUdevice ordinal);
CUdevice emu_dev_ordinal(int index);

/* Device of the calling thread's current context; CUDA_ERROR_INVALID_CONTEXT without one. */
CUresult emu_current_device(CUdevice *ret_dev);

/* ---- streams and events (cuda-stream.c) ---- */

/* CUDA_SUCCESS for a live stream of this process, the NULL stream, CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD; CUDA_ERROR_INVALID_HANDLE otherwise. */
CUresult emu_stream_check(CUstream s);

/* Flags the stream was created with (0 for the built-in streams). */
unsigned emu_stream_flags(CUstream s);

/* ---- stream capture and graphs (cuda-graph.c) ---- */

/* One piece of work for a stream: run now, or recorded by a capture and replayed by a graph. */
enum emu_op_kind {
	EMU_OP_KERNEL,
	EMU_OP_HTOD,
	EMU_OP_DTOH,
	EMU_OP_DTOD,
	EMU_OP_UNIFIED, /* cuMemcpy: either side device or host */
	EMU_OP_MEMSET,
	EMU_OP_HOST, /* cuLaunchHostFunc */
};

struct emu_op {
	enum emu_op_kind kind;
	/* copies and memsets */
	CUdeviceptr dst, src;
	void *hdst;
	const void *hsrc;
	size_t n;
	size_t width; /* memset element width */
	uint32_t value;
	/* kernels: the caller's params at submit time; args (sizes[i] bytes each, packed)
	 * once a graph holds the operation */
	belayer_emu_kernel_fn fn;
	struct belayer_emu_launch launch;
	void **params;
	void *args;
	size_t *sizes;
	size_t nparams;
	/* host functions */
	CUhostFn host_fn;
	void *user_data;
};

/* Copies and memsets (cuda-mem.c). */
CUresult emu_mem_op_run(const struct emu_op *op);
/* Work enqueued on stream s: executed now, or captured when s is capturing; on the legacy
 * stream while a blocking stream captures, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT. */
CUresult emu_stream_submit(CUstream s, const struct emu_op *op);
/* A synchronous call's use of the legacy stream. */
CUresult emu_legacy_use(void);
/* A potentially unsafe call (cuThreadExchangeStreamCaptureMode): CUDA_SUCCESS, or
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED after invalidating the captures that prohibit it. */
CUresult emu_capture_unsafe(void);
/* Synchronising or querying stream s. */
CUresult emu_capture_sync_stream(CUstream s);
void emu_capture_stream_destroyed(CUstream s);

/* ---- physical allocations and the process's virtual address space (cuda-va.c) ---- */

struct emu_alloc {
	struct emu_alloc *next; /* registry of live handles, to validate handle values */
	int fd;			/* the memfd */
	uint64_t id;		/* run-wide allocation id (in the memfd's name) */
	int dev;
	size_t size;
	CUmemAllocationProp prop;
	unsigned handle_refs; /* cuMemCreate/Import/RetainAllocationHandle minus cuMemRelease */
	unsigned map_refs;    /* mappings of it in this process */
};

struct emu_mapping {
	size_t offset; /* within the reservation */
	size_t size;
	struct emu_alloc *alloc;
	uint8_t access[EMU_MAX_DEVICES]; /* CUmemAccess_flags per device */
};

enum emu_res_kind {
	EMU_RES_VMM,	  /* cuMemAddressReserve */
	EMU_RES_MEMALLOC, /* cuMemAlloc / cuMemAllocAsync: one mapping, freed by cuMemFree */
	EMU_RES_IPC,	  /* cuIpcOpenMemHandle: one mapping, freed by cuIpcCloseMemHandle */
};

struct emu_reservation {
	CUdeviceptr base;
	size_t size;
	uint8_t *host; /* host view of [base, base + size); == base with emu_host_access */
	enum emu_res_kind kind;
	size_t user_size;	  /* cuMemAlloc's bytesize (the range it reports) */
	unsigned ipc_refs;	  /* EMU_RES_IPC: cuIpcOpenMemHandle calls not yet closed */
	struct emu_mapping *maps; /* sorted by offset, non-overlapping */
	size_t nmaps, cap;
};

/* One lock for the whole address-space model of this process. */
extern pthread_mutex_t emu_va_lock;

/* Once, from cuInit: fork handling. */
void emu_va_init(void);

/* All below: caller holds emu_va_lock unless said otherwise. */
int emu_alloc_create(int dev, size_t size, const CUmemAllocationProp *prop, struct emu_alloc **ret);
int emu_alloc_import(int fd, struct emu_alloc **ret); /* dups fd */
struct emu_alloc *emu_alloc_lookup(CUmemGenericAllocationHandle h);
void emu_alloc_unref(struct emu_alloc *a); /* frees when no handle or mapping is left */

int emu_va_reserve(size_t size, size_t align, CUdeviceptr hint, enum emu_res_kind kind,
		   struct emu_reservation **ret);
void emu_va_release(struct emu_reservation *r); /* unmaps what is still mapped */
struct emu_reservation *emu_va_find(CUdeviceptr p);
/* The EMU_RES_IPC reservation mapping allocation id, if this process opened it already. */
struct emu_reservation *emu_va_find_ipc(uint64_t id);
/* Maps [off, off + a->size) of r onto a (takes a map reference). -EBUSY if overlapping. */
int emu_va_map(struct emu_reservation *r, size_t off, size_t size, struct emu_alloc *a);
int emu_va_unmap(struct emu_reservation *r, size_t off, size_t size);
struct emu_mapping *emu_va_mapping(struct emu_reservation *r, size_t off);
/* Host pointer for [p, p + len) if every byte is mapped and accessible (read, or write too
 * when write); NULL otherwise. */
void *emu_va_translate(CUdeviceptr p, size_t len, bool write);

/* Convenience wrappers that take the lock. */
void *emu_translate(CUdeviceptr p, size_t len, bool write);
