/* SPDX-License-Identifier: MIT */
/*
 * Configuration, read once from the environment with secure_getenv (a setuid program gets
 * the defaults). Invalid values are ignored with a debug line: the shim never refuses to run
 * the host program because of its own configuration.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "shim-config.h"

#define MIB (UINT64_C(1) << 20)

static struct shim_config config;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

/* "2M", "64k", "1G" or plain bytes. */
static int parse_size(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;
	uint64_t mult = 1;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (toupper((unsigned char)*end)) {
	case 'K':
		mult = UINT64_C(1) << 10;
		end++;
		break;
	case 'M':
		mult = MIB;
		end++;
		break;
	case 'G':
		mult = UINT64_C(1) << 30;
		end++;
		break;
	default:
		break;
	}
	if (*end == 'i' || *end == 'I')
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end != '\0' || (v && mult > UINT64_MAX / v))
		return -EINVAL;
	*ret = v * mult;
	return 0;
}

static void env_size(const char *name, uint64_t *val)
{
	const char *s = secure_getenv(name);
	uint64_t v;

	if (!s)
		return;
	if (parse_size(s, &v) < 0) {
		log_debug("Invalid %s=%s, ignoring.", name, s);
		return;
	}
	*val = v;
}

static void env_rank(int32_t *rank)
{
	static const char *const names[] = {"BELAYER_RANK", "RANK", "LOCAL_RANK"};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		const char *s = secure_getenv(names[i]);
		char *end;
		long v;

		if (!s)
			continue;
		errno = 0;
		v = strtol(s, &end, 10);
		if (errno || end == s || *end || v < 0 || v > INT32_MAX) {
			log_debug("Invalid %s=%s, ignoring.", names[i], s);
			continue;
		}
		*rank = (int32_t)v;
		return;
	}
}

static void config_load(void)
{
	const char *s;
	uint64_t queue_max = 4096;

	log_setup("libbelayer", LOG_LEVEL_WARNING);

	/*
	 * 2 MiB: PyTorch's caching allocator asks cudaMalloc for 2 MiB segments (small blocks,
	 * where small parameters such as norms and biases live) and for 20 MiB or larger ones
	 * (everything above 1 MiB), so every segment that can hold weights or KV blocks is
	 * converted, while the driver's and libraries' small internal buffers pass through.
	 */
	config.alloc_threshold = 2 * MIB;
	/* Larger than a small-pool segment: the KV arena is allocated in large segments. */
	config.kv_min = 4 * MIB;
	config.policy = ALLOC_POLICY_VMM;
	config.role = ROLE_PRIMARY;
	config.rank = -1;
	snprintf(config.socket_path, sizeof(config.socket_path), "%s",
		 "/run/belayer/supervisor.sock");

	env_size("BELAYER_ALLOC_THRESHOLD", &config.alloc_threshold);
	env_size("BELAYER_KV_MIN", &config.kv_min);
	env_size("BELAYER_QUEUE_MAX", &queue_max);
	config.park_quiet_ms = 1000;
	env_size("BELAYER_PARK_QUIET_MS", &config.park_quiet_ms);
	config.private_max = 2 * MIB;
	env_size("BELAYER_SHADOW_PRIVATE_MAX", &config.private_max);
	config.scratch_unit = 0;
	env_size("BELAYER_SHADOW_SCRATCH_UNIT", &config.scratch_unit);
	config.queue_max = (uint32_t)(queue_max < 16	       ? 16
				      : queue_max > (1u << 20) ? (1u << 20)
							       : queue_max);

	s = secure_getenv("BELAYER_ALLOC_POLICY");
	if (s) {
		if (strcmp(s, "vmm") == 0)
			config.policy = ALLOC_POLICY_VMM;
		else if (strcmp(s, "passthrough") == 0)
			config.policy = ALLOC_POLICY_PASSTHROUGH;
		else
			log_debug("Invalid BELAYER_ALLOC_POLICY=%s, ignoring.", s);
	}

	s = secure_getenv("BELAYER_SOCKET");
	if (s && *s) {
		if (strlen(s) < sizeof(config.socket_path))
			snprintf(config.socket_path, sizeof(config.socket_path), "%s", s);
		else
			log_debug("BELAYER_SOCKET too long, ignoring.");
	}

	s = secure_getenv("BELAYER_ENGINE_ID");
	if (s)
		snprintf(config.engine_id, sizeof(config.engine_id), "%s", s);

	s = secure_getenv("BELAYER_ROLE");
	if (s && worker_role_from_string(s, &config.role) < 0) {
		log_debug("Invalid BELAYER_ROLE=%s, ignoring.", s);
		config.role = ROLE_PRIMARY;
	}

	/* "auto": the phase heuristic until the process tags something (shim-classify.c). */
	s = secure_getenv("BELAYER_CLASSIFY");
	if (s && strcmp(s, "tags") == 0)
		config.classify_tags = true;
	else if (s && strcmp(s, "auto") != 0)
		log_debug("Invalid BELAYER_CLASSIFY=%s, ignoring.", s);

	env_rank(&config.rank);
}

const struct shim_config *shim_config(void)
{
	(void)pthread_once(&config_once, config_load);
	return &config;
}
