/* SPDX-License-Identifier: MIT */
/* belayer-bench: one file per subcommand, dispatched from the table in belayer-bench.c. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct bench_args {
	bool json;
	const char *shim; /* libbelayer.so to preload */
	const char
		*driver; /* directory prepended to LD_LIBRARY_PATH (the emulated driver), or NULL */
	const char *self; /* this program, for re-executing itself */
};

int bench_shim_overhead(const struct bench_args *a, int argc, char **argv);
int bench_bpf_overhead(const struct bench_args *a, int argc, char **argv);
int bench_recovery(const struct bench_args *a, int argc, char **argv);
int bench_resume(const struct bench_args *a, int argc, char **argv);
int bench_gateway(const struct bench_args *a, int argc, char **argv);
int bench_env_recovery(const struct bench_args *a, int argc, char **argv);
int bench_hang(const struct bench_args *a, int argc, char **argv);
int bench_policy(const struct bench_args *a, int argc, char **argv);
int bench_sandbox(const struct bench_args *a, int argc, char **argv);
int bench_env_scaling(const struct bench_args *a, int argc, char **argv);
/* The measuring side of shim-overhead, run by the bench in a child process. */
int bench_shim_overhead_child(int argc, char **argv);
