/* SPDX-License-Identifier: MIT */
/* What every measurement of belayer-bench uses (bench-measure.c): the clock and sorting. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* CLOCK_MONOTONIC in ns. */
uint64_t bench_now_ns(void);
/* ms from a to b, two bench_now_ns() readings. */
double bench_ms_between(uint64_t a, uint64_t b);
/* qsort comparison of doubles, ascending. */
int bench_cmp_double(const void *a, const void *b);
/* The median of v[0..n) (sorts v in place); 0 when n is 0. */
uint64_t bench_median_u64(uint64_t *v, size_t n);
