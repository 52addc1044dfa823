/* SPDX-License-Identifier: MIT */
/*
 * Kernels by name. A module image is PTX text, as nvcc produces for a real GPU; the emulator
 * reads the names of its .entry functions and binds each to the host implementation
 * registered under that name (belayer_emu_register_kernel). A program therefore loads and
 * launches the same image on both. Libraries (cuLibrary*) are modules, kernels (CUkernel)
 * are functions, as cuLaunchKernel accepts a CUkernel cast to CUfunction.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-internal.h"

#define PTX_MAX	     (64u << 20) /* bound on the image text scanned for entries */
#define NAME_MAX_LEN 1024

struct kernel {
	struct kernel *next;
	char *name;
	belayer_emu_kernel_fn fn;
};

/* Sizes of an entry's parameters, from its PTX .param list: what cuLaunchKernel copies. */
struct params {
	size_t n;
	size_t *sizes;
};

struct CUfunc_st {
	struct CUfunc_st *next;
	struct CUmod_st *module;
	char *name;
	struct params params;
};

struct CUmod_st {
	struct CUmod_st *next;
	char **entries;
	struct params *params; /* per entry */
	size_t nentries;
	struct CUfunc_st *functions;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct kernel *kernels;
static struct CUmod_st *modules;

_public_ int belayer_emu_register_kernel(const char *name, belayer_emu_kernel_fn fn)
{
	struct kernel *k;
	int r = 0;

	if (!name || !*name || !fn)
		return -EINVAL;
	pthread_mutex_lock(&lock);
	for (k = kernels; k; k = k->next)
		if (strcmp(k->name, name) == 0)
			break;
	if (k)
		k->fn = fn;
	else {
		k = calloc(1, sizeof(*k));
		if (k)
			k->name = strdup(name);
		if (!k || !k->name) {
			free(k);
			r = -ENOMEM;
		} else {
			k->fn = fn;
			k->next = kernels;
			kernels = k;
		}
	}
	pthread_mutex_unlock(&lock);
	return r;
}

static belayer_emu_kernel_fn kernel_lookup(const char *name)
{
	belayer_emu_kernel_fn fn = NULL;

	pthread_mutex_lock(&lock);
	for (struct kernel *k = kernels; k; k = k->next)
		if (strcmp(k->name, name) == 0)
			fn = k->fn;
	pthread_mutex_unlock(&lock);
	return fn;
}

static void module_free(struct CUmod_st *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->nentries; i++) {
		free(m->entries[i]);
		free(m->params[i].sizes);
	}
	free(m->entries);
	free(m->params);
	while (m->functions) {
		struct CUfunc_st *f = m->functions;
		m->functions = f->next;
		free(f->name);
		free(f->params.sizes);
		free(f);
	}
	free(m);
}

static bool ident_char(char c, bool first)
{
	return isalpha((unsigned char)c) || c == '_' || c == '$' ||
	       (!first && isdigit((unsigned char)c));
}

/* Bytes of a PTX scalar type (.b8, .u32, .f64, ...); 0 for other directives. */
static size_t ptx_type_size(const char *t, size_t len)
{
	if (len < 3 || t[0] != '.' || !strchr("busf", t[1]))
		return 0;
	if (len == 3 && t[2] == '8')
		return 1;
	if (len == 4 && memcmp(t + 2, "16", 2) == 0)
		return 2;
	if (len == 4 && memcmp(t + 2, "32", 2) == 0)
		return 4;
	if (len == 4 && memcmp(t + 2, "64", 2) == 0)
		return 8;
	return 0;
}

#define PARAMS_MAX	1024
#define PARAM_BYTES_MAX 32764 /* the kernel parameter limit since CUDA 12.1 */

/* The parameter list "( .param .u64 a, .param .align 8 .b8 b[24] )" at p, into ret. */
static CUresult parse_params(const char **pp, const char *end, struct params *ret)
{
	const char *p = *pp;
	size_t total = 0;

	while (p < end && isspace((unsigned char)*p))
		p++;
	if (p == end || *p != '(') /* no parameters */
		return CUDA_SUCCESS;
	p++;
	for (;;) {
		size_t size = 0, count = 1;
		size_t *v;

		while (p < end && (isspace((unsigned char)*p) || *p == ','))
			p++;
		if (p == end)
			return CUDA_ERROR_INVALID_PTX;
		if (*p == ')')
			break;
		if (end - p < 6 || memcmp(p, ".param", 6) != 0)
			return CUDA_ERROR_INVALID_PTX;
		p += 6;
		/* Directives up to the name: .align N, .ptr, state spaces, then the type. */
		while (p < end && *p != ',' && *p != ')') {
			const char *t;

			while (p < end && isspace((unsigned char)*p))
				p++;
			t = p;
			while (p < end && !isspace((unsigned char)*p) && *p != ',' && *p != ')' &&
			       *p != '[')
				p++;
			if (t < p && *t == '.' && ptx_type_size(t, (size_t)(p - t)))
				size = ptx_type_size(t, (size_t)(p - t));
			if (p < end && *p == '[') {
				char *e;
				unsigned long c = strtoul(p + 1, &e, 10);

				if (e >= end || *e != ']' || c == 0 || c > PARAM_BYTES_MAX)
					return CUDA_ERROR_INVALID_PTX;
				count = c;
				p = e + 1;
			}
		}
		if (!size || ret->n == PARAMS_MAX || size * count > PARAM_BYTES_MAX - total)
			return CUDA_ERROR_INVALID_PTX;
		total += size * count;
		v = realloc(ret->sizes, (ret->n + 1) * sizeof(*v));
		if (!v)
			return CUDA_ERROR_OUT_OF_MEMORY;
		ret->sizes = v;
		ret->sizes[ret->n++] = size * count;
	}
	*pp = p + 1;
	return CUDA_SUCCESS;
}

/* Collects the names after each ".entry" directive of a PTX text, and their parameters. */
static CUresult parse_ptx(const char *text, struct CUmod_st *m)
{
	size_t len = strnlen(text, PTX_MAX);
	const char *p = text, *end = text + len;

	if (len == PTX_MAX)
		return CUDA_ERROR_INVALID_IMAGE; /* unterminated, or absurdly large */
	if (len >= 4 && memcmp(text, "\177ELF", 4) == 0)
		return CUDA_ERROR_NO_BINARY_FOR_GPU; /* a cubin: machine code for a real GPU */
	if (!memmem(text, len, ".version", 8) || !memmem(text, len, ".target", 7))
		return CUDA_ERROR_INVALID_PTX;
	while ((p = memmem(p, (size_t)(end - p), ".entry", 6))) {
		const char *n;
		char **v;

		p += 6;
		if (p < end && !isspace((unsigned char)*p))
			continue; /* e.g. ".entryfoo" is not the directive */
		while (p < end && isspace((unsigned char)*p))
			p++;
		n = p;
		while (p < end && p - n < NAME_MAX_LEN && ident_char(*p, p == n))
			p++;
		if (p == n)
			return CUDA_ERROR_INVALID_PTX;
		v = realloc(m->entries, (m->nentries + 1) * sizeof(*v));
		if (!v)
			return CUDA_ERROR_OUT_OF_MEMORY;
		m->entries = v;
		{
			struct params *pv = realloc(m->params, (m->nentries + 1) * sizeof(*pv));

			if (!pv)
				return CUDA_ERROR_OUT_OF_MEMORY;
			m->params = pv;
			m->params[m->nentries] = (struct params){0};
		}
		m->entries[m->nentries] = strndup(n, (size_t)(p - n));
		if (!m->entries[m->nentries])
			return CUDA_ERROR_OUT_OF_MEMORY;
		m->nentries++;
		{
			CUresult r = parse_params(&p, end, &m->params[m->nentries - 1]);

			if (r != CUDA_SUCCESS)
				return r;
		}
	}
	return CUDA_SUCCESS;
}

static CUresult module_load(CUmodule *module, const void *image)
{
	struct CUmod_st *m;
	CUdevice dev;
	CUresult r;

	if (!module || !image)
		return CUDA_ERROR_INVALID_VALUE;
	r = emu_current_device(&dev);
	if (r != CUDA_SUCCESS)
		return r;
	m = calloc(1, sizeof(*m));
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = parse_ptx(image, m);
	if (r != CUDA_SUCCESS) {
		module_free(m);
		return r;
	}
	pthread_mutex_lock(&lock);
	m->next = modules;
	modules = m;
	pthread_mutex_unlock(&lock);
	*module = m;
	return CUDA_SUCCESS;
}

static CUresult module_unload(CUmodule hmod)
{
	CUresult r = CUDA_ERROR_INVALID_HANDLE;

	pthread_mutex_lock(&lock);
	for (struct CUmod_st **p = &modules; *p; p = &(*p)->next)
		if (*p == hmod) {
			*p = hmod->next;
			module_free(hmod);
			r = CUDA_SUCCESS;
			break;
		}
	pthread_mutex_unlock(&lock);
	return r;
}

static CUresult get_function(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	struct CUmod_st *m = NULL;
	struct CUfunc_st *f = NULL;
	CUresult r = CUDA_ERROR_NOT_FOUND;
	bool in_image = false;
	size_t entry = 0;

	if (!hfunc || !name)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	for (m = modules; m && m != hmod; m = m->next)
		;
	if (!m) {
		r = CUDA_ERROR_INVALID_HANDLE;
		goto out;
	}
	for (f = m->functions; f; f = f->next)
		if (strcmp(f->name, name) == 0) {
			*hfunc = f;
			r = CUDA_SUCCESS;
			goto out;
		}
	for (size_t i = 0; i < m->nentries; i++)
		if (strcmp(m->entries[i], name) == 0) {
			in_image = true;
			entry = i;
		}
	/* "CUDA_ERROR_NOT_FOUND" when the module has no such function; here also when the
	 * test has not registered a host implementation for it. */
	if (!in_image)
		goto out;
	f = calloc(1, sizeof(*f));
	if (f) {
		f->name = strdup(name);
		f->params.n = m->params[entry].n;
		if (f->params.n) {
			f->params.sizes = malloc(f->params.n * sizeof(size_t));
			if (f->params.sizes)
				memcpy(f->params.sizes, m->params[entry].sizes,
				       f->params.n * sizeof(size_t));
		}
	}
	if (!f || !f->name || (f->params.n && !f->params.sizes)) {
		if (f)
			free(f->name);
		free(f);
		r = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	f->module = m;
	f->next = m->functions;
	m->functions = f;
	*hfunc = f;
	r = CUDA_SUCCESS;
out:
	pthread_mutex_unlock(&lock);
	if (r == CUDA_SUCCESS && !kernel_lookup(name)) {
		fprintf(stderr,
			"libcuda (belayer emulator): no host implementation registered for kernel "
			"%s\n",
			name);
		r = CUDA_ERROR_NOT_FOUND;
	}
	return r;
}

static bool function_valid(CUfunction f)
{
	bool ok = false;

	pthread_mutex_lock(&lock);
	for (struct CUmod_st *m = modules; m && !ok; m = m->next)
		for (struct CUfunc_st *x = m->functions; x && !ok; x = x->next)
			ok = x == f;
	pthread_mutex_unlock(&lock);
	return ok;
}

CUAPI CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	EMU_ENTER();
	return module_load(module, image);
}

CUAPI CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
				  CUjit_option *options, void **optionValues)
{
	EMU_ENTER();
	/* JIT options tune a compiler this emulator does not have: accepted and ignored. */
	if (numOptions && (!options || !optionValues))
		return CUDA_ERROR_INVALID_VALUE;
	return module_load(module, image);
}

CUAPI CUresult cuModuleUnload(CUmodule hmod)
{
	EMU_ENTER();
	return module_unload(hmod);
}

CUAPI CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	EMU_ENTER();
	return get_function(hfunc, hmod, name);
}

CUAPI CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
				 void **jitOptionsValues, unsigned int numJitOptions,
				 CUlibraryOption *libraryOptions, void **libraryOptionValues,
				 unsigned int numLibraryOptions)
{
	EMU_ENTER();
	return module_load((CUmodule *)library, code);
}

CUAPI CUresult cuLibraryUnload(CUlibrary library)
{
	EMU_ENTER();
	return module_unload((CUmodule)(void *)library);
}

CUAPI CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
	EMU_ENTER();
	return get_function((CUfunction *)pKernel, (CUmodule)(void *)library, name);
}

CUAPI CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
	EMU_ENTER();
	if (!pFunc)
		return CUDA_ERROR_INVALID_VALUE;
	if (!function_valid((CUfunction)(void *)kernel))
		return CUDA_ERROR_INVALID_HANDLE;
	*pFunc = (CUfunction)(void *)kernel;
	return CUDA_SUCCESS;
}

CUAPI CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
	EMU_ENTER();
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	if (!function_valid(hfunc))
		return CUDA_ERROR_INVALID_HANDLE;
	switch (attrib) {
	case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
		*pi = 1024;
		break;
	case CU_FUNC_ATTRIBUTE_NUM_REGS:
		*pi = 32;
		break;
	case CU_FUNC_ATTRIBUTE_PTX_VERSION:
	case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
		*pi = 90;
		break;
	default:
		*pi = 0;
		break;
	}
	return CUDA_SUCCESS;
}

CUAPI CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
			      unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
			      unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
			      void **kernelParams, void **extra)
{
	struct belayer_emu_launch l = {
		.grid = {gridDimX, gridDimY, gridDimZ},
		.block = {blockDimX, blockDimY, blockDimZ},
		.shared_mem = sharedMemBytes,
		.stream = hStream,
	};
	belayer_emu_kernel_fn fn;
	CUresult r;

	EMU_ENTER();
	if (!function_valid(f))
		return CUDA_ERROR_INVALID_HANDLE;
	r = emu_current_device(&l.device);
	if (r != CUDA_SUCCESS)
		return r;
	if (!gridDimX || !gridDimY || !gridDimZ || !blockDimX || !blockDimY || !blockDimZ ||
	    (uint64_t)blockDimX * blockDimY * blockDimZ > 1024 || blockDimZ > 64)
		return CUDA_ERROR_INVALID_VALUE;
	/* Arguments packed into one buffer (extra) are not emulated: kernels get kernelParams. */
	if (extra)
		return CUDA_ERROR_NOT_SUPPORTED;
	l.name = f->name;
	fn = kernel_lookup(f->name);
	if (!fn)
		return CUDA_ERROR_NOT_FOUND;
	if (f->params.n && !kernelParams)
		return CUDA_ERROR_INVALID_VALUE;
	/* Run now, or captured with its arguments copied (the sizes come from the PTX). */
	return emu_stream_submit(hStream, &(struct emu_op){.kind = EMU_OP_KERNEL,
							   .fn = fn,
							   .launch = l,
							   .params = kernelParams,
							   .sizes = f->params.sizes,
							   .nparams = f->params.n});
}
EMU_VARIANT(cuLaunchKernel_ptsz, cuLaunchKernel,
	    (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
	     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
	     unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra),
	    (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
	     hStream, kernelParams, extra));
