/* SPDX-License-Identifier: MIT */
/* belayerctl: main and the subcommand table. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "belayerctl.h"
#include "log.h"
#include "util.h"

static const struct {
	const char *name;
	ctl_command_fn func;
	const char *help;
} commands[] = {
	{"status", cmd_status, "status                       workers, retained memory, metrics"},
	{"workers", cmd_workers, "workers                      every worker known"},
	{"regions", cmd_regions,
	 "regions [--pid PID]          regions held (owned, retained, pending)"},
	{"events", cmd_events, "events [--replay N] [--no-follow]  follow the event stream"},
	{"inject", cmd_inject,
	 "inject kill|hang|resume PID  signal a worker; inject gpu ARGS: emulated GPU (test-only)"},
	{"config", cmd_config, "config                       the effective configuration"},
	{"health", cmd_health, "health [--pid PID] [--dev N] run health checks now"},
	{"promote", cmd_promote,
	 "promote [--wait] ENGINE     fail ENGINE over to its shadow group now"},
	{"env", cmd_env,
	 "env create|adopt|checkpoint|restore|rebuild|list|destroy|watch|dirty|log ...  agent "
	 "environments"},
	{"bpf", cmd_bpf, "bpf [--no-run]               bpftool commands for the pinned tracer"},
	{"traj", cmd_traj,
	 "traj [TRAJECTORY]            checkpoint policy: trajectories, bubbles, environments' "
	 "costs"},
	{"step", cmd_step,
	 "step end|begin TRAJECTORY ENV [--turn N] ...  report an environment step, print the "
	 "checkpoint policy's decision"},
	{"image", cmd_image,
	 "image list|import REF [--name N]|rm IMAGE|gc  container images for env create --image"},
};

static void help(FILE *f)
{
	fprintf(f, "Usage: belayerctl [--socket PATH] [--json] [--timeout SEC] COMMAND [ARGS]\n\n"
		   "Commands:\n");
	for (size_t i = 0; i < ARRAY_SIZE(commands); i++)
		fprintf(f, "  %s\n", commands[i].help);
	fprintf(f,
		"\nThe socket defaults to $BELAYER_SOCKET, else /run/belayer/supervisor.sock.\n");
}

int main(int argc, char **argv)
{
	static const struct option options[] = {
		{"socket", required_argument, NULL, 's'},
		{"json", no_argument, NULL, 'j'},
		{"timeout", required_argument, NULL, 't'},
		{"help", no_argument, NULL, 'h'},
		{},
	};
	struct ctl_options o = {.timeout_ms = 10000};
	const char *env = getenv("BELAYER_SOCKET");
	int c, r;

	log_setup("belayerctl", LOG_LEVEL_WARNING);
	o.socket = env && *env ? env : "/run/belayer/supervisor.sock";
	/* "+": options after the command name belong to the command. */
	while ((c = getopt_long(argc, argv, "+s:jt:h", options, NULL)) >= 0) {
		switch (c) {
		case 's':
			o.socket = optarg;
			break;
		case 'j':
			o.json = true;
			break;
		case 't':
			o.timeout_ms = atoi(optarg) * 1000;
			break;
		case 'h':
			help(stdout);
			return EXIT_SUCCESS;
		default:
			help(stderr);
			return EXIT_FAILURE;
		}
	}
	if (optind >= argc) {
		help(stderr);
		return EXIT_FAILURE;
	}
	/* --json is accepted after the command too: "belayerctl regions --json". */
	for (int i = optind + 1; i < argc; i++)
		if (strcmp(argv[i], "--json") == 0) {
			o.json = true;
			memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof(*argv));
			argc--;
			i--;
		}
	for (size_t i = 0; i < ARRAY_SIZE(commands); i++) {
		if (strcmp(argv[optind], commands[i].name) != 0)
			continue;
		r = commands[i].func(&o, argc - optind, argv + optind);
		if (r == 2)
			return 2;
		return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
	}
	fprintf(stderr, "belayerctl: unknown command \"%s\"\n", argv[optind]);
	help(stderr);
	return EXIT_FAILURE;
}
