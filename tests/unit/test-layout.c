/* SPDX-License-Identifier: MIT */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "layout.h"
#include "util.h"

/* FNV-1a 64 written out byte by byte, independent of layout.c's loop. */
static uint64_t reference(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

static void hash_is_fnv1a_over_class_and_le_size(void **state)
{
	const uint8_t bytes[] = {
		REGION_WEIGHTS, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, /* 1 GiB */
		REGION_KV,	0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, /* 2 MiB */
	};
	uint64_t h = LAYOUT_HASH_INIT;

	h = layout_hash_update(h, REGION_WEIGHTS, 1ull << 30);
	h = layout_hash_update(h, REGION_KV, 2ull << 20);
	assert_true(h == reference(bytes, sizeof(bytes)));
	/* The empty layout is the offset basis; FNV-1a of "a" is a published test vector. */
	assert_true(reference(NULL, 0) == LAYOUT_HASH_INIT);
	assert_true(reference((const uint8_t *)"a", 1) == 0xaf63dc4c8601ec8cull);
}

static void order_and_class_matter(void **state)
{
	uint64_t wk = layout_hash_update(layout_hash_update(LAYOUT_HASH_INIT, REGION_WEIGHTS, 4096),
					 REGION_KV, 8192);
	uint64_t kw = layout_hash_update(layout_hash_update(LAYOUT_HASH_INIT, REGION_KV, 8192),
					 REGION_WEIGHTS, 4096);
	uint64_t ww = layout_hash_update(layout_hash_update(LAYOUT_HASH_INIT, REGION_WEIGHTS, 4096),
					 REGION_WEIGHTS, 8192);

	assert_true(wk != kw);
	assert_true(wk != ww);
}

static void layout_hash_sorts_and_filters(void **state)
{
	/* As a supervisor sees announcements: any order, other/nccl regions mixed in. */
	struct layout_entry e[] = {
		{.order = 7, .cls = REGION_KV, .size = 8192},
		{.order = 1, .cls = REGION_OTHER, .size = 1 << 20},
		{.order = 3, .cls = REGION_WEIGHTS, .size = 4096},
		{.order = 5, .cls = REGION_NCCL, .size = 1 << 21},
		{.order = 4, .cls = REGION_WEIGHTS, .size = 12288},
	};
	uint64_t want = LAYOUT_HASH_INIT;
	uint32_t n = 99;

	want = layout_hash_update(want, REGION_WEIGHTS, 4096);
	want = layout_hash_update(want, REGION_WEIGHTS, 12288);
	want = layout_hash_update(want, REGION_KV, 8192);
	assert_true(layout_hash(e, ARRAY_SIZE(e), &n) == want);
	assert_int_equal(n, 3);
	assert_true(layout_hash(NULL, 0, &n) == LAYOUT_HASH_INIT);
	assert_int_equal(n, 0);
	assert_true(layout_class_counts(REGION_KV));
	assert_false(layout_class_counts(REGION_OTHER));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(hash_is_fnv1a_over_class_and_le_size),
		cmocka_unit_test(order_and_class_matter),
		cmocka_unit_test(layout_hash_sorts_and_filters),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
