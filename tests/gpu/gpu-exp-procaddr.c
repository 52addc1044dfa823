/* SPDX-License-Identifier: MIT */
/*
 * gpu-exp-procaddr (experiment E1 of the shim review, tests/gpu/README.md): does the shim's
 * table of hooked variants (shim/hooks-table.h) agree with what the driver's
 * cuGetProcAddress_v2 returns?
 *
 * For every base name the shim hooks, at each CUDA version of its table entries and at 11040,
 * 12000, 12050, 12090 and 13000 (those above the driver's version are skipped: cuda.h,
 * cuGetProcAddress: "If the specified CUDA version is greater than the driver version, the
 * API will return CUDA_ERROR_INVALID_VALUE"), with CU_GET_PROC_ADDRESS_DEFAULT and
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, it asks the driver for the base name and
 * names the answer by comparing it with dlsym(libcuda, VARIANT) of every variant the table
 * lists for that name. Then it compares with the variant the table would choose (the shim's
 * fallback when it cannot resolve the variants by name: hooks-cuda.c proc_address):
 *   mismatch  the driver answered a hooked variant, the table picks another one;
 *   bypass    the driver answered a pointer that is none of the hooked variants (dlsym) while
 *             the table expects one: the shim would pass it through unwrapped;
 *   missing   the table expects a variant, the driver answers NULL (or an error).
 * Every such row is a detail line; the verdict is PASS when there is none.
 *
 * Usage: gpu-exp-procaddr [--device N]
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu-check.h"
#include "hooks-table.h"

struct variant {
	const char *sym;
	const char *proc;
	int version;
	int ptds;
	void *dl; /* dlsym(libcuda, sym) */
};

static struct variant variants[] = {
#define X(sym, proc, version, ptds, pfn) {#sym, proc, version, ptds, NULL},
	BELAYER_CUDA_HOOKS(X)
#undef X
};

#define NVARIANTS (sizeof(variants) / sizeof(variants[0]))

static const int audit_versions[] = {11040, 12000, 12050, 12090, 13000};

/* The shim's fallback choice (hooks-cuda.c): the per-thread variant when asked for, else the
 * newest version allowed; -1 when none. */
static int table_pick(const char *proc, int version, int want_ptds)
{
	int best = -1, best_score = -1;

	for (size_t i = 0; i < NVARIANTS; i++) {
		int score;

		if (variants[i].version > version || strcmp(variants[i].proc, proc) != 0)
			continue;
		if (variants[i].ptds && !want_ptds)
			continue;
		score = (variants[i].ptds ? 1000000 : 0) + variants[i].version;
		if (score > best_score) {
			best = (int)i;
			best_score = score;
		}
	}
	return best;
}

/* The hooked variant of proc whose dlsym pointer is fn, or -1. */
static int identify(const char *proc, void *fn)
{
	for (size_t i = 0; i < NVARIANTS; i++)
		if (fn && variants[i].dl == fn && strcmp(variants[i].proc, proc) == 0)
			return (int)i;
	return -1;
}

static bool seen_proc(size_t upto, const char *proc)
{
	for (size_t i = 0; i < upto; i++)
		if (strcmp(variants[i].proc, proc) == 0)
			return true;
	return false;
}

int main(int argc, char **argv)
{
	PFN_cuGetProcAddress_v12000 get_proc;
	int dev = 0, driver = 0, queries = 0, bad = 0, procs = 0, undl = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && strcmp(argv[1], "--device") == 0)
		dev = atoi(argv[2]);
	else if (argc != 1) {
		fprintf(stderr, "usage: gpu-exp-procaddr [--device N]\n");
		return 2;
	}
	if (gpu_cu_open(dev) < 0)
		return 1;
	(void)cu.cuDriverGetVersion(&driver);
	get_proc = (PFN_cuGetProcAddress_v12000)dlsym(cu.lib, "cuGetProcAddress_v2");
	for (size_t i = 0; i < NVARIANTS; i++) {
		variants[i].dl = dlsym(cu.lib, variants[i].sym);
		if (!variants[i].dl && variants[i].version <= driver) {
			printf("not exported by libcuda: %s (the table resolves %s to it from "
			       "%d)\n",
			       variants[i].sym, variants[i].proc, variants[i].version);
			undl++;
		}
	}
	printf("driver version %d; %zu hooked variants in shim/hooks-table.h\n", driver, NVARIANTS);

	for (size_t p = 0; p < NVARIANTS; p++) {
		const char *proc = variants[p].proc;
		int versions[16], nv = 0;

		if (seen_proc(p, proc))
			continue;
		procs++;
		/* the versions of this name's entries, then the audit's fixed ones */
		for (size_t i = p; i < NVARIANTS && nv < 10; i++)
			if (strcmp(variants[i].proc, proc) == 0 && variants[i].version < 100000)
				versions[nv++] = variants[i].version;
		for (size_t k = 0; k < sizeof(audit_versions) / sizeof(int); k++)
			versions[nv++] = audit_versions[k];

		for (int k = 0; k < nv; k++) {
			for (int ptds = 0; ptds <= 1; ptds++) {
				cuuint64_t flags =
					ptds ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
					     : CU_GET_PROC_ADDRESS_DEFAULT;
				CUdriverProcAddressQueryResult q = 0;
				int v = versions[k], got, want;
				void *fn = NULL;
				CUresult r;

				if (v > driver)
					continue;
				queries++;
				r = get_proc(proc, &fn, v, flags, &q);
				want = table_pick(proc, v, ptds);
				got = r == CUDA_SUCCESS ? identify(proc, fn) : -1;
				if (want < 0 || got == want)
					continue;
				bad++;
				if (r != CUDA_SUCCESS || !fn)
					printf("missing  %s @%d %s: driver %s (query result %d), "
					       "table "
					       "picks %s\n",
					       proc, v, ptds ? "PER_THREAD" : "DEFAULT",
					       gpu_cu_name(r), (int)q, variants[want].sym);
				else if (got < 0)
					printf("bypass   %s @%d %s: driver returned %p, none of "
					       "the "
					       "hooked variants' dlsym pointers; table picks %s "
					       "(%p)\n",
					       proc, v, ptds ? "PER_THREAD" : "DEFAULT", fn,
					       variants[want].sym, variants[want].dl);
				else
					printf("mismatch %s @%d %s: driver returned %s, table "
					       "picks %s\n",
					       proc, v, ptds ? "PER_THREAD" : "DEFAULT",
					       variants[got].sym, variants[want].sym);
			}
		}
	}
	printf("summary: %d base names, %d queries (versions up to the driver's %d x DEFAULT, "
	       "PER_THREAD): %d disagree with the shim's table%s\n",
	       procs, queries, driver, bad, undl ? ", some variants not exported (above)" : "");
	return bad || undl ? 1 : 0;
}
