/* SPDX-License-Identifier: MIT */
/* What every measurement of belayer-bench uses (bench-measure.c): the clock and sorting. */
#pragma once

#include <stdint.h>

/* CLOCK_MONOTONIC in ns. */
uint64_t bench_now_ns(void);
/* ms from a to b, two bench_now_ns() readings. */
double bench_ms_between(uint64_t a, uint64_t b);
/* qsort comparison of doubles, ascending. */
int bench_cmp_double(const void *a, const void *b);
