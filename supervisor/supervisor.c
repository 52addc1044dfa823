/* SPDX-License-Identifier: MIT */
/*
 * belayer-supervisor: main only (arguments, configuration, the list of subsystems). The core
 * (core/) runs the loop and dispatches to the subsystems (recovery/, env/, policy/,
 * gateway/), which register what they serve through struct sv_subsystem.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "log.h"
#include "supervisor-config.h"
#include "supervisor-events.h"
#include "supervisor-server.h"
#include "supervisor-subsystem.h"
#include "supervisor.h"
#include "sv-env.h"
#include "sv-gateway.h"
#include "sv-policy.h"
#include "sv-recovery.h"

/* Started in this order, finished in the reverse: environments are taken back before the
 * engines launch, and the gateways front the engines once they run. */
static const struct sv_subsystem *const subsystems[] = {
	&env_subsystem, &recovery_subsystem, &policy_subsystem, &gateway_subsystem, NULL,
};

static void help(void)
{
	printf("Usage: belayer-supervisor [OPTIONS]\n\n"
	       "The Belayer per-node daemon: retains GPU memory of failed rollout workers.\n\n"
	       "  -c, --config=PATH     configuration file (default " CONFIG_DEFAULT_PATH ")\n"
	       "  -s, --socket=PATH     listen here instead of [supervisor] socket\n"
	       "      --state-dir=DIR   journal directory instead of [supervisor] state_dir\n"
	       "  -o, --set=SEC.KEY=VAL set one configuration key (after the file)\n"
	       "      --dump-config     print the effective configuration and exit\n"
	       "  -h, --help            this help\n"
	       "      --version         print the version\n");
}

/* Every connection and every retained region is an fd: use what the hard limit allows. A
 * gateway's client connection has its upstream one too. */
static void raise_nofile(const struct sv_config *c)
{
	struct rlimit rl;
	uint64_t need = (uint64_t)c->max_connections + c->max_fds + 64;

	for (uint32_t i = 0; i < c->n_engines; i++)
		if (c->engines[i].gateway_listen[0])
			need += 2 * (uint64_t)c->engines[i].gateway_max_connections;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	rl.rlim_cur = rl.rlim_max;
	(void)setrlimit(RLIMIT_NOFILE, &rl);
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
		log_warning("RLIMIT_NOFILE is %llu, below max_connections + max_fds + 64 (+ 2 per "
			    "gateway connection) = %llu: "
			    "limits will be hit as fd exhaustion first.",
			    (unsigned long long)rl.rlim_cur, (unsigned long long)need);
}

int main(int argc, char **argv)
{
	enum {
		OPT_STATE_DIR = 256,
		OPT_DUMP,
		OPT_VERSION
	};
	static const struct option options[] = {
		{"config", required_argument, NULL, 'c'},
		{"socket", required_argument, NULL, 's'},
		{"state-dir", required_argument, NULL, OPT_STATE_DIR},
		{"set", required_argument, NULL, 'o'},
		{"dump-config", no_argument, NULL, OPT_DUMP},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, OPT_VERSION},
		{},
	};
	static struct supervisor s;
	const char *config_path = NULL, *socket_path = NULL, *state_dir = NULL;
	const char *sets[64];
	size_t n_sets = 0;
	bool dump = false;
	enum log_level level;
	int c, r;

	log_setup("belayer-supervisor", LOG_LEVEL_INFO);
	while ((c = getopt_long(argc, argv, "c:s:o:h", options, NULL)) >= 0) {
		switch (c) {
		case 'c':
			config_path = optarg;
			break;
		case 's':
			socket_path = optarg;
			break;
		case OPT_STATE_DIR:
			state_dir = optarg;
			break;
		case 'o':
			if (n_sets == ARRAY_SIZE(sets)) {
				log_error("Too many --set options.");
				return EXIT_FAILURE;
			}
			sets[n_sets++] = optarg;
			break;
		case OPT_DUMP:
			dump = true;
			break;
		case 'h':
			help();
			return EXIT_SUCCESS;
		case OPT_VERSION:
			printf("belayer-supervisor %s\n", BELAYER_VERSION);
			return EXIT_SUCCESS;
		default:
			return EXIT_FAILURE;
		}
	}
	if (optind < argc) {
		log_error("Unexpected argument: %s", argv[optind]);
		return EXIT_FAILURE;
	}

	config_init_defaults(&s.config);
	/* The default path may be absent (defaults apply); an explicit one must exist. */
	r = config_load(&s.config, config_path ? config_path : CONFIG_DEFAULT_PATH, !config_path);
	if (r < 0)
		return EXIT_FAILURE;
	for (size_t i = 0; i < n_sets; i++) {
		char key[128];
		const char *eq = strchr(sets[i], '=');

		if (!eq || (size_t)(eq - sets[i]) >= sizeof(key)) {
			log_error("--set wants SECTION.KEY=VALUE, got \"%s\".", sets[i]);
			return EXIT_FAILURE;
		}
		memcpy(key, sets[i], (size_t)(eq - sets[i]));
		key[eq - sets[i]] = '\0';
		r = config_set(&s.config, NULL, key, eq + 1);
		if (r < 0) {
			log_error_errno(r, "--set %s: %m", sets[i]);
			return EXIT_FAILURE;
		}
	}
	if (socket_path && config_set(&s.config, "supervisor", "socket", socket_path) < 0) {
		log_error("Socket path too long: %s", socket_path);
		return EXIT_FAILURE;
	}
	if (state_dir && config_set(&s.config, "supervisor", "state_dir", state_dir) < 0) {
		log_error("State directory path too long: %s", state_dir);
		return EXIT_FAILURE;
	}
	if (dump) {
		config_dump(&s.config, stdout);
		return EXIT_SUCCESS;
	}
	if (!getenv("BELAYER_LOG_LEVEL") && log_level_from_string(s.config.log_level, &level) == 0)
		log_set_level(level);

	subsystems_init(&s, subsystems);
	env_process_setup(&s);
	raise_nofile(&s.config);
	s.uid = getuid();
	s.start_ms = now_ms();
	s.gpu_verdict = VERDICT_UNKNOWN;
	if (events_init(&s, s.config.event_history) < 0)
		return EXIT_FAILURE;
	r = server_run(&s);
	events_finish(&s);
	return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
