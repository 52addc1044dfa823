/* SPDX-License-Identifier: MIT */
/*
 * A worker's memory layout as shadow promotion compares it (DESIGN §1.2): the ordered list of
 * (class, size) of its weights and kv regions, in creation order. A shadow can take over a
 * primary's memory only when both lists are equal, so both sides hash them the same way:
 * FNV-1a 64 over, per entry, the class as one byte then the size as 8 bytes little-endian.
 * The shim hashes its regions as it creates them; the supervisor hashes a primary's
 * REGION_ANNOUNCEs (weights + kv only, sorted by "ord") with layout_hash().
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"

#define LAYOUT_HASH_INIT UINT64_C(0xcbf29ce484222325) /* FNV-1a 64 offset basis: no entries */

struct layout_entry {
	uint64_t order;
	enum region_class cls;
	uint64_t size;
};

/* Whether regions of this class are part of the layout (weights and kv). */
bool layout_class_counts(enum region_class cls);

/* The hash after appending one entry to a layout whose hash was h. */
uint64_t layout_hash_update(uint64_t h, enum region_class cls, uint64_t size);

/* Sorts entries[] by order (in place) and hashes those whose class counts. *ret_n (may be
 * NULL) gets how many counted. */
uint64_t layout_hash(struct layout_entry *entries, size_t n, uint32_t *ret_n);
