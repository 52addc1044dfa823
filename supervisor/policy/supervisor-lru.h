/* SPDX-License-Identifier: MIT */
/*
 * Fixed tables that forget the least recently seen entry when full (the trajectory tracker's
 * trajectories and environments, the gateway's trajectories): which slot a new entry takes.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The first free slot (its id's first byte NUL), else the least recently seen one, of n entries
 * of size stride at base whose id (a char array) and seen time (uint64_t) lie at id_off and
 * seen_off. n > 0. */
static inline size_t lru_slot(const void *base, size_t n, size_t stride, size_t id_off,
			      size_t seen_off)
{
	const char *p = base;
	size_t victim = 0;
	uint64_t oldest = UINT64_MAX;

	for (size_t i = 0; i < n; i++, p += stride) {
		uint64_t seen;

		if (!p[id_off])
			return i;
		memcpy(&seen, p + seen_off, sizeof(seen));
		if (seen < oldest) {
			oldest = seen;
			victim = i;
		}
	}
	return victim;
}

/* lru_slot() of an array of structs with fields id and seen. */
#define LRU_SLOT(arr, n, id, seen)                                             \
	lru_slot((arr), (n), sizeof(*(arr)), offsetof(__typeof__(*(arr)), id), \
		 offsetof(__typeof__(*(arr)), seen))
