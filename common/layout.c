/* SPDX-License-Identifier: MIT */
#include <stdlib.h>

#include "layout.h"

#define FNV64_PRIME UINT64_C(0x100000001b3)

bool layout_class_counts(enum region_class cls)
{
	return cls == REGION_WEIGHTS || cls == REGION_KV;
}

static uint64_t fnv_byte(uint64_t h, uint8_t b)
{
	return (h ^ b) * FNV64_PRIME;
}

uint64_t layout_hash_update(uint64_t h, enum region_class cls, uint64_t size)
{
	h = fnv_byte(h, (uint8_t)cls);
	/* Little-endian by construction, whatever the host's byte order. */
	for (unsigned i = 0; i < 8; i++)
		h = fnv_byte(h, (uint8_t)(size >> (8 * i)));
	return h;
}

static int entry_cmp(const void *a, const void *b)
{
	const struct layout_entry *x = a, *y = b;

	return x->order < y->order ? -1 : x->order > y->order;
}

uint64_t layout_hash(struct layout_entry *entries, size_t n, uint32_t *ret_n)
{
	uint64_t h = LAYOUT_HASH_INIT;
	uint32_t counted = 0;

	if (n > 0)
		qsort(entries, n, sizeof(*entries), entry_cmp);
	for (size_t i = 0; i < n; i++) {
		if (!layout_class_counts(entries[i].cls))
			continue;
		h = layout_hash_update(h, entries[i].cls, entries[i].size);
		counted++;
	}
	if (ret_n)
		*ret_n = counted;
	return h;
}
