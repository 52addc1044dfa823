/* SPDX-License-Identifier: MIT */
/*
 * An interposer preloaded after libbelayer.so, as another LD_PRELOAD tool would be. Its
 * dlsym(RTLD_NEXT, ...) must search after *it*: for a name only it defines, that is NULL. Were
 * RTLD_NEXT taken relative to the shim (because the shim's dlsym called glibc's), it would find
 * itself, which for a real interposer means infinite recursion.
 */
#include <dlfcn.h>
#include <stddef.h>

__attribute__((visibility("default"))) void *next_probe_check(void);

void *next_probe_check(void)
{
	/* Not a tail call: glibc takes the caller of dlsym from its return address, which a
	 * sibling call would make our caller's. */
	void *volatile r = dlsym(RTLD_NEXT, "next_probe_check");

	return r;
}
