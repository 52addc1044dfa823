/* SPDX-License-Identifier: MIT */
/*
 * The real functions behind the hooks (shim-real.c), the bottom of the shim: every other file
 * reaches the driver, NCCL and glibc's dlsym through these. Nothing here is exported.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "hooks-table.h"

/* cuda.h renames cuGetProcAddress to its _v2; the shim exports both under their own names. */
#undef cuGetProcAddress

/* Every hooked driver symbol, declared with its cudaTypedefs.h type: a wrapper whose
 * definition disagrees with cuda.h fails to compile. */
#define X(sym, proc, version, ptds, pfn) \
	extern __typeof__(*(pfn)0) sym __attribute__((visibility("default")));
BELAYER_CUDA_HOOKS(X)
#undef X

/* Set while the shim itself is inside the driver, so a driver that calls its own exported
 * entry points (or a callback that re-enters us) passes straight through. initial-exec: the
 * shim is preloaded, and a dynamic TLS lookup would cost every hooked call. */
extern __thread int shim_busy __attribute__((tls_model("initial-exec")));

enum hook_id {
#define X(sym, proc, version, ptds, pfn) HOOK_##sym,
	BELAYER_CUDA_HOOKS(X)
#undef X
	_HOOK_CUDA_MAX,
};

enum nccl_hook_id {
#define X(sym, ret, params, args) NCCL_HOOK_##sym,
	BELAYER_NCCL_HOOKS(X)
#undef X
	_NCCL_HOOK_MAX,
};

/* Real function of a hooked symbol, resolved on first use; NULL when the driver lacks it. */
void *real_cuda(enum hook_id id);
void *real_nccl(enum nccl_hook_id id);
/* What the shim knows of a hooked symbol's real function, without looking it up again. */
void *real_cuda_known(enum hook_id id);
#define REAL(sym)      ((__typeof__(&sym))real_cuda(HOOK_##sym))
#define REAL_NCCL(sym) ((__typeof__(&sym))real_nccl(NCCL_HOOK_##sym))
/* Calls the real function, or reports the driver as not initialized when it has none. */
#define CALL_REAL(sym, ...) (REAL(sym) ? REAL(sym)(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)

/* Remembers where a hooked symbol really lives when a program found it through dlsym or
 * cuGetProcAddress, for drivers that are not reachable by name from the shim. fn is never
 * our own wrapper (the wrappers' layer checks). */
void real_cuda_learn(enum hook_id id, void *fn);
void real_nccl_learn(enum nccl_hook_id id, void *fn);

/* Unhooked driver functions the shim calls itself. Any of them may be NULL. */
struct real_extra {
	PFN_cuCtxGetDevice_v2000 cuCtxGetDevice;
	PFN_cuDeviceGetAttribute_v2000 cuDeviceGetAttribute;
	PFN_cuDeviceGetCount_v2000 cuDeviceGetCount;
	PFN_cuDeviceGet_v2000 cuDeviceGet;
	PFN_cuDeviceGetUuid_v11040 cuDeviceGetUuid_v2;
	PFN_cuDeviceCanAccessPeer_v4000 cuDeviceCanAccessPeer;
	PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity;
	PFN_cuStreamSynchronize_v2000 cuStreamSynchronize;
	PFN_cuStreamSynchronize_v7000_ptsz cuStreamSynchronize_ptsz;
	PFN_cuCtxSynchronize_v2000 cuCtxSynchronize;
	PFN_cuMemImportFromShareableHandle_v10020 cuMemImportFromShareableHandle;
	PFN_cuCtxSetCurrent_v4000 cuCtxSetCurrent;
	PFN_cuThreadExchangeStreamCaptureMode_v10010 cuThreadExchangeStreamCaptureMode;
};
const struct real_extra *real_extra(void);

/* A function of the library with this soname if it is loaded, else from the global scope
 * after us; never loads anything. */
void *real_lookup(const char *soname, const char *name);

/* glibc's dlsym, never ours. */
void *real_dlsym(void *handle, const char *name);
/* Whether this thread is inside the lookup of glibc's dlsym (a dlsym then is an allocator's,
 * answered without our wrappers). */
bool real_dlsym_resolving(void);
/* For the dlsym entry point's assembly (hooks-dl.c), which reads and resolves glibc's dlsym
 * by these names; not static for that reason (hidden by default). */
extern void *glibc_dlsym_fn;
void *dlsym_resolve_glibc(void);
