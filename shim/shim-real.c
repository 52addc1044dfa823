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

#include "shim.h"

static void *cuda_slots[_HOOK_CUDA_MAX];
static void *nccl_slots[_NCCL_HOOK_MAX];
static struct real_extra extra;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;

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
		store_if_unset(&cuda_slots[i], lookup("libcuda.so.1", cuda_hooks[i].name));

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
#undef G
	}
	shim_busy--;
}

static void resolve_nccl(void)
{
	shim_busy++;
	for (size_t i = 0; i < _NCCL_HOOK_MAX; i++)
		store_if_unset(&nccl_slots[i], lookup("libnccl.so.2", nccl_hooks[i].name));
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
		fn = lookup("libcuda.so.1", cuda_hooks[id].name);
		store_if_unset(&cuda_slots[id], fn);
	}
	return fn;
}

void *real_nccl(enum nccl_hook_id id)
{
	void *fn = __atomic_load_n(&nccl_slots[id], __ATOMIC_ACQUIRE);

	if (__builtin_expect(fn != NULL, 1))
		return fn;
	(void)pthread_once(&nccl_once, resolve_nccl);
	fn = __atomic_load_n(&nccl_slots[id], __ATOMIC_ACQUIRE);
	if (!fn) {
		fn = lookup("libnccl.so.2", nccl_hooks[id].name);
		store_if_unset(&nccl_slots[id], fn);
	}
	return fn;
}

void real_cuda_learn(enum hook_id id, void *fn)
{
	if (fn != cuda_hooks[id].wrapper)
		store_if_unset(&cuda_slots[id], fn);
}

void real_nccl_learn(enum nccl_hook_id id, void *fn)
{
	if (fn != nccl_hooks[id].wrapper)
		store_if_unset(&nccl_slots[id], fn);
}

const struct real_extra *real_extra(void)
{
	(void)pthread_once(&cuda_once, resolve_cuda);
	return &extra;
}
