/* SPDX-License-Identifier: MIT */
/*
 * The real functions behind every hook, resolved lazily: the first hooked call resolves the
 * whole table once (pthread_once) from the driver the process already loaded. A program that
 * loaded the driver privately (dlopen without RTLD_GLOBAL) is found by soname with
 * RTLD_NOLOAD; a driver we cannot name at all is still learned from the pointers the program
 * itself got from dlsym or cuGetProcAddress. The shim never loads a driver on its own.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "shim-real.h"
#include "util.h"

__thread int shim_busy __attribute__((tls_model("initial-exec")));

/* The hooked names (the wrappers' own table is theirs, hooks.h). */
static const char *const cuda_names[_HOOK_CUDA_MAX] = {
#define X(sym, proc, version, ptds, pfn) [HOOK_##sym] = #sym,
	BELAYER_CUDA_HOOKS(X)
#undef X
};
static const char *const nccl_names[_NCCL_HOOK_MAX] = {
#define X(sym, ret, params, args) [NCCL_HOOK_##sym] = #sym,
	BELAYER_NCCL_HOOKS(X)
#undef X
};

static void *cuda_slots[_HOOK_CUDA_MAX];
static void *nccl_slots[_NCCL_HOOK_MAX];
static struct real_extra extra;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;

/* glibc's dlsym, found with dlvsym: ours is what the program's dlsym binds to. Read and
 * resolved by the dlsym entry point's assembly too (hooks-dl.c). */
void *glibc_dlsym_fn;

static __thread int resolving __attribute__((tls_model("initial-exec")));

void *dlsym_resolve_glibc(void)
{
	static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
	void *fn = __atomic_load_n(&glibc_dlsym_fn, __ATOMIC_ACQUIRE);

	/* dlvsym may allocate, and an allocator that resolves its own symbols with dlsym would
	 * come back here before we know where glibc's dlsym is: it gets NULL, not a loop. */
	if (fn || resolving)
		return fn;
	resolving++;
	for (size_t i = 0; i < ARRAY_SIZE(versions) && !fn; i++)
		fn = dlvsym(RTLD_NEXT, "dlsym", versions[i]);
	resolving--;
	if (fn)
		__atomic_store_n(&glibc_dlsym_fn, fn, __ATOMIC_RELEASE);
	return fn;
}

void *real_dlsym(void *handle, const char *name)
{
	void *(*fn)(void *, const char *) = dlsym_resolve_glibc();

	return fn ? fn(handle, name) : NULL;
}

bool real_dlsym_resolving(void)
{
	return resolving > 0;
}

/* Looks name up in the library with this soname if loaded, else after us in the global scope. */
static void *lookup(const char *soname, const char *name)
{
	void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
	void *fn = NULL;

	if (h) {
		fn = real_dlsym(h, name);
		(void)dlclose(h); /* drops the reference NOLOAD took */
	}
	if (!fn)
		fn = real_dlsym(RTLD_NEXT, name);
	return fn;
}

void *real_lookup(const char *soname, const char *name)
{
	return lookup(soname, name);
}

static void store_if_unset(void **slot, void *fn)
{
	void *expected = NULL;

	if (fn)
		(void)__atomic_compare_exchange_n(slot, &expected, fn, false, __ATOMIC_RELEASE,
						  __ATOMIC_RELAXED);
}

static void resolve_cuda(void)
{
	shim_busy++;
	for (size_t i = 0; i < _HOOK_CUDA_MAX; i++)
		store_if_unset(&cuda_slots[i], lookup("libcuda.so.1", cuda_names[i]));

#define E(field, name) extra.field = (__typeof__(extra.field))lookup("libcuda.so.1", name)
	E(cuCtxGetDevice, "cuCtxGetDevice");
	E(cuDeviceGetAttribute, "cuDeviceGetAttribute");
	E(cuDeviceGetCount, "cuDeviceGetCount");
	E(cuDeviceGet, "cuDeviceGet");
	E(cuDeviceGetUuid_v2, "cuDeviceGetUuid_v2");
	E(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer");
	E(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
	E(cuStreamSynchronize, "cuStreamSynchronize");
	E(cuStreamSynchronize_ptsz, "cuStreamSynchronize_ptsz");
	E(cuCtxSynchronize, "cuCtxSynchronize");
	E(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle");
	E(cuCtxSetCurrent, "cuCtxSetCurrent");
	E(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
#undef E
	/* A driver reachable only through cuGetProcAddress: ask it for what names did not give. */
	PFN_cuGetProcAddress_v12000 gpa =
		__atomic_load_n(&cuda_slots[HOOK_cuGetProcAddress_v2], __ATOMIC_ACQUIRE);
	if (gpa) {
#define G(field, name, ver)                                                                 \
	if (!extra.field) {                                                                 \
		void *fn = NULL;                                                            \
		if (gpa(name, &fn, ver, CU_GET_PROC_ADDRESS_DEFAULT, NULL) == CUDA_SUCCESS) \
			extra.field = (__typeof__(extra.field))fn;                          \
	}
		G(cuCtxGetDevice, "cuCtxGetDevice", 2000);
		G(cuDeviceGetAttribute, "cuDeviceGetAttribute", 2000);
		G(cuDeviceGetCount, "cuDeviceGetCount", 2000);
		G(cuDeviceGet, "cuDeviceGet", 2000);
		G(cuDeviceGetUuid_v2, "cuDeviceGetUuid", 11040);
		G(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", 4000);
		G(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", 10020);
		G(cuStreamSynchronize, "cuStreamSynchronize", 2000);
		G(cuCtxSynchronize, "cuCtxSynchronize", 2000);
		G(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020);
		G(cuCtxSetCurrent, "cuCtxSetCurrent", 4000);
		G(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", 10010);
#undef G
	}
	shim_busy--;
}

static void resolve_nccl(void)
{
	shim_busy++;
	for (size_t i = 0; i < _NCCL_HOOK_MAX; i++)
		store_if_unset(&nccl_slots[i], lookup("libnccl.so.2", nccl_names[i]));
	shim_busy--;
}

void *real_cuda(enum hook_id id)
{
	void *fn = __atomic_load_n(&cuda_slots[id], __ATOMIC_ACQUIRE);

	if (__builtin_expect(fn != NULL, 1))
		return fn;
	(void)pthread_once(&cuda_once, resolve_cuda);
	fn = __atomic_load_n(&cuda_slots[id], __ATOMIC_ACQUIRE);
	if (!fn) {
		/* The driver may have been loaded after the table was resolved. */
		fn = lookup("libcuda.so.1", cuda_names[id]);
		store_if_unset(&cuda_slots[id], fn);
	}
	return fn;
}

void *real_cuda_known(enum hook_id id)
{
	(void)pthread_once(&cuda_once, resolve_cuda);
	return __atomic_load_n(&cuda_slots[id], __ATOMIC_ACQUIRE);
}

void *real_nccl(enum nccl_hook_id id)
{
	void *fn = __atomic_load_n(&nccl_slots[id], __ATOMIC_ACQUIRE);

	if (__builtin_expect(fn != NULL, 1))
		return fn;
	(void)pthread_once(&nccl_once, resolve_nccl);
	fn = __atomic_load_n(&nccl_slots[id], __ATOMIC_ACQUIRE);
	if (!fn) {
		fn = lookup("libnccl.so.2", nccl_names[id]);
		store_if_unset(&nccl_slots[id], fn);
	}
	return fn;
}

void real_cuda_learn(enum hook_id id, void *fn)
{
	store_if_unset(&cuda_slots[id], fn);
}

void real_nccl_learn(enum nccl_hook_id id, void *fn)
{
	store_if_unset(&nccl_slots[id], fn);
}

const struct real_extra *real_extra(void)
{
	(void)pthread_once(&cuda_once, resolve_cuda);
	return &extra;
}
