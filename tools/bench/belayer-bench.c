/* SPDX-License-Identifier: MIT */
/*
 * belayer-bench: Belayer's benchmarks. Each subcommand prints a table for people, or JSON
 * with --json, and measures what it compares side by side in one run.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "log.h"
#include "util.h"

struct subcommand {
	const char *name;
	int (*func)(const struct bench_args *a, int argc, char **argv);
	const char *help;
};

static const struct subcommand subcommands[] = {
	{"shim-overhead", bench_shim_overhead, "ns per driver call with and without libbelayer.so"},
	{"bpf-overhead", bench_bpf_overhead, "workload wall time with and without envtrace (BPF)"},
	{"recovery", bench_recovery, "time to ready after a worker dies: cold restart vs shadow"},
	{"resume", bench_resume,
	 "in-flight streams across a worker kill: gateway resume vs cold restart + retry"},
	{"gateway", bench_gateway,
	 "keep-alive clients under load: throughput and p50/p99, via the gateway vs direct"},
	{"hang", bench_hang,
	 "NCCL rank killed/stopped mid-run: detection and time to serving; counters' cost"},
	{"env-recovery", bench_env_recovery,
	 "environment recovery: full checkpoint/restore vs rebuild + replay"},
	{"policy", bench_policy,
	 "checkpoint policies never / every-turn / adaptive: slowdown, hidden, work lost"},
	{"sandbox", bench_sandbox,
	 "environments vs podman on one image: create, exec, checkpoint, restore, fork of 8"},
	{"env-scaling", bench_env_scaling,
	 "environment checkpoint/restore vs files in the upper layer (1k/10k/100k, +100k)"},
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: belayer-bench [--json] [--shim PATH] [--driver-dir DIR] COMMAND\n\n"
		"  --json            machine-readable output\n"
		"  --shim PATH       libbelayer.so to measure (default: %s)\n"
		"  --driver-dir DIR  directory of the libcuda.so.1 to use (default: %s)\n\n"
		"Commands:\n",
		BENCH_SHIM_PATH, BENCH_DRIVER_DIR[0] ? BENCH_DRIVER_DIR : "the system's");
	for (size_t i = 0; i < ARRAY_SIZE(subcommands); i++)
		fprintf(f, "  %-16s %s\n", subcommands[i].name, subcommands[i].help);
}

int main(int argc, char **argv)
{
	static const struct option options[] = {
		{"json", no_argument, NULL, 'j'},
		{"shim", required_argument, NULL, 's'},
		{"driver-dir", required_argument, NULL, 'd'},
		{"help", no_argument, NULL, 'h'},
		{},
	};
	struct bench_args a = {
		.shim = BENCH_SHIM_PATH,
		.driver = BENCH_DRIVER_DIR[0] ? BENCH_DRIVER_DIR : NULL,
		.self = "/proc/self/exe",
	};
	int c;

	log_setup("belayer-bench", LOG_LEVEL_INFO);
	/* Internal: the measuring child of a subcommand. */
	if (argc > 1 && strcmp(argv[1], "--child-shim-overhead") == 0)
		return bench_shim_overhead_child(argc - 1, argv + 1);

	while ((c = getopt_long(argc, argv, "+h", options, NULL)) >= 0) {
		switch (c) {
		case 'j':
			a.json = true;
			break;
		case 's':
			a.shim = optarg;
			break;
		case 'd':
			a.driver = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return 2;
	}
	for (size_t i = 0; i < ARRAY_SIZE(subcommands); i++) {
		if (strcmp(subcommands[i].name, argv[optind]) == 0) {
			/* Subcommand options (--json) may also follow the name. */
			for (int j = optind + 1; j < argc; j++)
				if (strcmp(argv[j], "--json") == 0)
					a.json = true;
			return subcommands[i].func(&a, argc - optind, argv + optind) < 0 ? 1 : 0;
		}
	}
	fprintf(stderr, "belayer-bench: unknown command '%s'\n", argv[optind]);
	usage(stderr);
	return 2;
}
