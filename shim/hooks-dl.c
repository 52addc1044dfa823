/* SPDX-License-Identifier: MIT */
/*
 * The dlsym hook. vLLM opens NCCL with ctypes and the CUDA runtime finds the driver's
 * cuGetProcAddress with dlsym on its own handle, so neither ever binds to our exported
 * symbols by name: dlsym of a hooked name, from any handle, returns our wrapper instead (and
 * the shim remembers the real function the handle gave).
 *
 * dlsym(RTLD_NEXT, ...) depends on who calls it: glibc takes the caller from its return
 * address. A wrapper that called glibc would make every RTLD_NEXT lookup relative to
 * libbelayer.so, which sends another preloaded interposer back to itself. So the exported
 * entry point is a few instructions of assembly that tail-jump into glibc for RTLD_NEXT, with
 * the original return address in place, and only other handles reach the C code.
 */
#include <dlfcn.h>
#include <string.h>

#include "hooks.h"
#include "log.h"
#include "shim-classify.h"
#include "shim-real.h"

/* Referenced by name from the assembly below, hence not static (hidden by default). */
void *dlsym_slow(void *handle, const char *name);

/*
 * fn, a hooked name's function in a library other than the one the wrappers call: a second
 * libnccl.so.2 loaded by path (vLLM's VLLM_NCCL_SO_PATH beside PyTorch's NCCL), a second
 * libcuda (a stub, dlmopen). A wrapper would hand that library's handles to the first one,
 * another version with another struct layout: the program gets the function itself, its
 * calls untracked, and one log line per kind says so.
 */
static void *other_library(const char *name, void *fn, bool *logged)
{
	Dl_info info;

	if (!__atomic_exchange_n(logged, true, __ATOMIC_RELAXED))
		log_warning("%s from %s, a second copy of a library the shim already uses: calls "
			    "through that copy pass through untracked.",
			    name, dladdr(fn, &info) && info.dli_fname ? info.dli_fname : "?");
	return fn;
}

/* Our wrapper when name is hooked (learning fn, the real function), else fn. */
static void *dlsym_result(const char *name, void *fn)
{
	static bool cuda_logged, nccl_logged;

	if (name[0] == 'c' && name[1] == 'u') {
		for (int i = 0; i < _HOOK_CUDA_MAX; i++)
			if (strcmp(cuda_hooks[i].name, name) == 0) {
				void *real;

				if (fn == cuda_hooks[i].wrapper)
					return fn;
				real = real_cuda((enum hook_id)i);
				if (real && real != fn)
					return other_library(name, fn, &cuda_logged);
				real_cuda_learn((enum hook_id)i, fn);
				return cuda_hooks[i].wrapper;
			}
	} else if (strncmp(name, "nccl", 4) == 0) {
		for (int i = 0; i < _NCCL_HOOK_MAX; i++)
			if (strcmp(nccl_hooks[i].name, name) == 0) {
				void *real;

				if (fn == nccl_hooks[i].wrapper)
					return fn;
				real = real_nccl((enum nccl_hook_id)i);
				if (real && real != fn)
					return other_library(name, fn, &nccl_logged);
				real_nccl_learn((enum nccl_hook_id)i, fn);
				return nccl_hooks[i].wrapper;
			}
	} else if (strncmp(name, "tms_", 4) == 0)
		return tms_hook_for(name, fn);
	return fn;
}

void *dlsym_slow(void *handle, const char *name)
{
	void *fn = real_dlsym(handle, name);

	/* shim_busy: the shim itself (or a driver it is inside) looks a name up, possibly while
	 * the real table is being resolved, which dlsym_result would wait for. */
	if (!fn || !name || real_dlsym_resolving() || shim_busy)
		return fn;
	return dlsym_result(name, fn);
}

#if defined(__x86_64__)
__asm__(".text\n"
	".globl dlsym\n"
	".type dlsym, @function\n"
	".p2align 4\n"
	"dlsym:\n"
	"	endbr64\n"
	"	cmpq $-1, %rdi\n" /* RTLD_NEXT */
	"	je 1f\n"
	"	jmp dlsym_slow\n"
	"1:	movq glibc_dlsym_fn(%rip), %rax\n"
	"	testq %rax, %rax\n"
	"	jz 2f\n"
	"	jmp *%rax\n"
	"2:	pushq %rdi\n"
	"	pushq %rsi\n"
	"	subq $8, %rsp\n" /* 16-byte alignment at the call */
	"	call dlsym_resolve_glibc\n"
	"	addq $8, %rsp\n"
	"	popq %rsi\n"
	"	popq %rdi\n"
	"	testq %rax, %rax\n"
	"	jz 3f\n"
	"	jmp *%rax\n"
	"3:	ret\n"
	".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(".text\n"
	".globl dlsym\n"
	".type dlsym, %function\n"
	".p2align 4\n"
	"dlsym:\n"
	"	hint #34\n"   /* bti c */
	"	cmn x0, #1\n" /* RTLD_NEXT */
	"	b.eq 1f\n"
	"	b dlsym_slow\n"
	"1:	adrp x16, glibc_dlsym_fn\n"
	"	ldr x16, [x16, :lo12:glibc_dlsym_fn]\n"
	"	cbz x16, 2f\n"
	"	br x16\n"
	"2:	stp x29, x30, [sp, #-32]!\n"
	"	mov x29, sp\n"
	"	stp x0, x1, [sp, #16]\n"
	"	bl dlsym_resolve_glibc\n"
	"	mov x16, x0\n"
	"	ldp x0, x1, [sp, #16]\n"
	"	ldp x29, x30, [sp], #32\n"
	"	cbz x16, 3f\n"
	"	br x16\n"
	"3:	mov x0, #0\n"
	"	ret\n"
	".size dlsym, .-dlsym\n");
#else
/* Elsewhere RTLD_NEXT lookups are made relative to libbelayer.so, which is right for every
 * caller loaded before it (the program itself). */
_public_ void *dlsym(void *handle, const char *name)
{
	if (handle == RTLD_NEXT)
		return real_dlsym(handle, name);
	return dlsym_slow(handle, name);
}
#endif
