/* SPDX-License-Identifier: MIT */
/*
 * The caching allocator (engine-alloc.c) on the emulated driver: which segments it asks the
 * driver for and where blocks land in them, against PyTorch's policy.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <stdlib.h>

#include "engine-alloc.h"
#include "engine-gpu.h"
#include "test-util.h"

#define MIB (1ull << 20)

static char *emu_dir;

/* The driver's used memory: what the allocator asked for in segments. */
static uint64_t driver_used(void)
{
	size_t free_b = 0, total_b = 0;

	assert_int_equal(gpu.cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
	return total_b - free_b;
}

/* Small requests share one 2 MiB segment, packed at 512-byte granularity; a freed block is
 * reused by the next request that fits. */
static void small_pool_packs_and_reuses(void **state)
{
	uint64_t used = driver_used();
	CUdeviceptr a, b, c, d;

	assert_int_equal(dev_alloc(DEV_POOL_DEFAULT, &a, 100), 0);
	assert_int_equal(driver_used() - used, 2 * MIB);
	assert_int_equal(dev_alloc(DEV_POOL_DEFAULT, &b, 600), 0);
	assert_true(b == a + 512);
	assert_int_equal(dev_alloc(DEV_POOL_DEFAULT, &c, 1 * MIB), 0);
	assert_true(c == b + 1024);
	assert_int_equal(driver_used() - used, 2 * MIB);
	assert_int_equal(dev_free(a), 0);
	assert_int_equal(dev_alloc(DEV_POOL_DEFAULT, &d, 512), 0);
	assert_true(d == a);
	/* the rest of the segment is under 1 MiB: a new one */
	assert_int_equal(dev_alloc(DEV_POOL_DEFAULT, &a, 1 * MIB), 0);
	assert_int_equal(driver_used() - used, 4 * MIB);
	assert_int_equal(dev_free(d), 0);
	assert_int_equal(dev_free(d), -EINVAL);
	assert_int_equal(dev_free(b + 8), -EINVAL);
}

/* Over 1 MiB and under 10 MiB: a 20 MiB segment, split; freed neighbours merge back into
 * one block that a 20 MiB request (>= 10 MiB, already a 2 MiB multiple) takes whole. */
static void large_pool_splits_and_merges(void **state)
{
	uint64_t used = driver_used();
	CUdeviceptr a, b, c, k;

	assert_int_equal(dev_alloc(DEV_POOL_WEIGHTS, &a, 3 * MIB), 0);
	assert_int_equal(driver_used() - used, 20 * MIB);
	assert_int_equal(dev_alloc(DEV_POOL_WEIGHTS, &b, 3 * MIB + 1), 0);
	assert_true(b == a + 3 * MIB);
	assert_int_equal(driver_used() - used, 20 * MIB);
	/* >= 10 MiB: rounded up to 2 MiB, a segment of its own (14 MiB - 512 do not fit) */
	assert_int_equal(dev_alloc(DEV_POOL_WEIGHTS, &c, 15 * MIB), 0);
	assert_int_equal(driver_used() - used, 36 * MIB);
	assert_int_equal(dev_free(a), 0);
	assert_int_equal(dev_free(b), 0);
	assert_int_equal(dev_alloc(DEV_POOL_WEIGHTS, &a, 20 * MIB), 0);
	assert_true(a == b - 3 * MIB);
	assert_int_equal(driver_used() - used, 36 * MIB);
	/* another pool never carves from these segments */
	assert_int_equal(dev_free(c), 0);
	assert_int_equal(dev_alloc(DEV_POOL_KV, &k, 2 * MIB), 0);
	assert_int_equal(driver_used() - used, 56 * MIB);
}

static int group_setup(void **state)
{
	emu_dir = test_mkdtemp("belayer-engine-alloc");
	if (!emu_dir)
		return -1;
	setenv("BELAYER_EMU_DIR", emu_dir, 1);
	return gpu_cuda_init(0) == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
	test_rmtree(emu_dir);
	free(emu_dir);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(small_pool_packs_and_reuses),
		cmocka_unit_test(large_pool_splits_and_merges),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
