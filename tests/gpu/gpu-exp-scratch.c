/* SPDX-License-Identifier: MIT */
/*
 * gpu-exp-scratch (experiment E4 of the shim review, tests/gpu/README.md): what does it cost
 * to park a shadow's 80-96 GB of weights and KV on scratch, and to promote it, and does the
 * driver limit the number of mappings?
 *
 * For each scratch unit U: one handle of U bytes (cuMemCreate, no shareable type, like
 * shim-shadow-scratch.c) is mapped over a RESERVE-byte reservation at every multiple of U
 * (RESERVE/U cuMemMap calls: 49,152 for 96 GiB of 2 MiB), then one cuMemSetAccess over the
 * whole range (cuda.h: "The range must be a fully mapped address range containing all
 * allocations created by cuMemMap / cuMemCreate", so one call covers every mapping). Then the
 * promotion: the first half is unmapped unit by unit, a real handle of RESERVE/2 bytes is
 * mapped over it and given access. Each step is timed; the first call that fails ends the
 * unit with the driver's error and the index it failed at (a mapping limit shows there).
 * It only measures: PASS with the figures unless a call fails.
 *
 * Usage: gpu-exp-scratch [--reserve N[KMG]] [--units U[,U...]] [--device N]
 *        (defaults: 96G and 2M,64M,1G)
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu-check.h"

struct times {
	uint64_t maps;
	double map_s, access_s, unmap_s, real_create_s, real_map_s;
};

static CUmemAccessDesc access_desc(int dev)
{
	return (CUmemAccessDesc){
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};
}

/* One unit's run; 0, or -1 after printing the failing call. */
static int run_unit(int dev, uint64_t reserve, uint64_t unit, struct times *t)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
	};
	CUmemAccessDesc acc = access_desc(dev);
	CUmemGenericAllocationHandle scratch = 0, real = 0;
	uint64_t half = reserve / 2, n = reserve / unit, mapped = 0, i;
	bool real_mapped = false;
	CUdeviceptr va = 0;
	CUresult r;
	double t0;
	int ret = -1;

	*t = (struct times){0};
	r = cu.cuMemCreate(&scratch, unit, &prop, 0);
	if (r != CUDA_SUCCESS) {
		printf("  unit %" PRIu64 " MiB: cuMemCreate of the scratch unit: %s\n", unit >> 20,
		       gpu_cu_name(r));
		return -1;
	}
	r = cu.cuMemAddressReserve(&va, reserve, 0, 0, 0);
	if (r != CUDA_SUCCESS) {
		printf("  unit %" PRIu64 " MiB: cuMemAddressReserve(%" PRIu64 " GiB): %s\n",
		       unit >> 20, reserve >> 30, gpu_cu_name(r));
		goto out;
	}
	t0 = gpu_now();
	for (i = 0; i < n; i++) {
		r = cu.cuMemMap(va + i * unit, unit, 0, scratch, 0);
		if (r != CUDA_SUCCESS) {
			printf("  unit %" PRIu64 " MiB: cuMemMap #%" PRIu64 " of %" PRIu64
			       " failed: %s (a limit on mappings?)\n",
			       unit >> 20, i, n, gpu_cu_name(r));
			goto out;
		}
		mapped++;
	}
	t->maps = n;
	t->map_s = gpu_now() - t0;
	t0 = gpu_now();
	r = cu.cuMemSetAccess(va, reserve, &acc, 1);
	if (r != CUDA_SUCCESS) {
		printf("  unit %" PRIu64 " MiB: cuMemSetAccess over %" PRIu64 " mappings: %s\n",
		       unit >> 20, n, gpu_cu_name(r));
		goto out;
	}
	t->access_s = gpu_now() - t0;

	/* promotion: the first half goes from scratch to real memory */
	t0 = gpu_now();
	for (i = 0; i < half / unit; i++) {
		r = cu.cuMemUnmap(va + i * unit, unit);
		if (r != CUDA_SUCCESS) {
			printf("  unit %" PRIu64 " MiB: cuMemUnmap #%" PRIu64 ": %s\n", unit >> 20,
			       i, gpu_cu_name(r));
			goto out;
		}
	}
	t->unmap_s = gpu_now() - t0;
	t0 = gpu_now();
	r = cu.cuMemCreate(&real, half, &prop, 0);
	if (r != CUDA_SUCCESS) {
		printf("  unit %" PRIu64 " MiB: cuMemCreate of the real %" PRIu64 " MiB: %s\n",
		       unit >> 20, half >> 20, gpu_cu_name(r));
		real = 0;
		goto out;
	}
	t->real_create_s = gpu_now() - t0;
	t0 = gpu_now();
	r = cu.cuMemMap(va, half, 0, real, 0);
	if (r == CUDA_SUCCESS) {
		real_mapped = true;
		r = cu.cuMemSetAccess(va, half, &acc, 1);
	}
	if (r != CUDA_SUCCESS) {
		printf("  unit %" PRIu64 " MiB: mapping the real %" PRIu64 " MiB over the "
		       "unmapped half: %s\n",
		       unit >> 20, half >> 20, gpu_cu_name(r));
		goto out;
	}
	t->real_map_s = gpu_now() - t0;
	ret = 0;
out:
	if (real_mapped)
		(void)cu.cuMemUnmap(va, half);
	/* what is still scratch-mapped (all of it if the promotion did not start) */
	for (i = real_mapped || t->unmap_s > 0 ? half / unit : 0; i < mapped; i++)
		(void)cu.cuMemUnmap(va + i * unit, unit);
	if (va)
		(void)cu.cuMemAddressFree(va, reserve);
	if (real)
		(void)cu.cuMemRelease(real);
	(void)cu.cuMemRelease(scratch);
	return ret;
}

static int parse_units(char *s, uint64_t *units, int max)
{
	int n = 0;

	for (char *save = NULL, *tok = strtok_r(s, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (n == max || gpu_parse_size(tok, &units[n]) < 0 || !units[n])
			return -EINVAL;
		n++;
	}
	return n;
}

int main(int argc, char **argv)
{
	char defaults[] = "2M,64M,1G";
	uint64_t reserve = 96ull << 30, units[8];
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE},
	};
	char *unit_arg = defaults;
	int n, dev = 0, failed = 0;
	size_t gran = 0;
	char summary[512];
	size_t used = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int a = 1; a < argc; a += 2) {
		if (a + 1 >= argc)
			goto usage;
		if (strcmp(argv[a], "--reserve") == 0) {
			if (gpu_parse_size(argv[a + 1], &reserve) < 0)
				goto usage;
		} else if (strcmp(argv[a], "--units") == 0)
			unit_arg = argv[a + 1];
		else if (strcmp(argv[a], "--device") == 0)
			dev = atoi(argv[a + 1]);
		else
			goto usage;
	}
	n = parse_units(unit_arg, units, 8);
	if (n <= 0)
		goto usage;
	if (gpu_cu_open(dev) < 0)
		return 1;
	prop.location.id = dev;
	(void)cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	printf("reserve %" PRIu64 " MiB, granularity %zu; per unit: scratch maps + one "
	       "cuMemSetAccess, then half unmapped unit by unit and a real handle mapped over it\n",
	       reserve >> 20, gran);
	for (int i = 0; i < n; i++) {
		struct times t;

		if (!gran || units[i] % gran || reserve % (2 * units[i])) {
			printf("  unit %" PRIu64 " MiB: not a multiple of the granularity, or half "
			       "the reservation is not a multiple of it: skipped\n",
			       units[i] >> 20);
			failed++;
			continue;
		}
		if (run_unit(dev, reserve, units[i], &t) < 0) {
			failed++;
			continue;
		}
		printf("  unit %" PRIu64 " MiB: %" PRIu64 " cuMemMap %.3f s (%.1f us each), "
		       "cuMemSetAccess %.3f s; promote half: %" PRIu64 " cuMemUnmap %.3f s, "
		       "cuMemCreate %" PRIu64 " MiB %.3f s, map + access %.3f s\n",
		       units[i] >> 20, t.maps, t.map_s, t.map_s * 1e6 / (double)t.maps, t.access_s,
		       reserve / 2 / units[i], t.unmap_s, reserve >> 21, t.real_create_s,
		       t.real_map_s);
		used += (size_t)snprintf(summary + used, sizeof(summary) - used,
					 "%s%" PRIu64 " MiB: %" PRIu64
					 " maps %.1f ms + access %.1f ms, "
					 "unmap half %.1f ms",
					 used ? "; " : "", units[i] >> 20, t.maps, t.map_s * 1e3,
					 t.access_s * 1e3, t.unmap_s * 1e3);
		if (used >= sizeof(summary))
			used = sizeof(summary) - 1;
	}
	if (failed)
		printf("summary: %d of %d scratch units failed (above)\n", failed, n);
	else
		printf("summary: %" PRIu64 " MiB reserved; %s\n", reserve >> 20, summary);
	return failed ? 1 : 0;
usage:
	fprintf(stderr, "usage: gpu-exp-scratch [--reserve N[KMG]] [--units U[,U...]] "
			"[--device N]\n");
	return 2;
}
