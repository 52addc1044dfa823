/* SPDX-License-Identifier: MIT */
/* The shim's configuration (shim-config.c), read once from the environment. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "proto.h"

enum alloc_policy {
	ALLOC_POLICY_VMM,
	ALLOC_POLICY_PASSTHROUGH,
};

struct shim_config {
	enum alloc_policy policy;
	uint64_t alloc_threshold; /* cuMemAlloc_v2 of at least this many bytes is converted */
	uint64_t kv_min;	  /* the phase heuristic's "large allocation" */
	uint32_t queue_max;
	char socket_path[108];
	char engine_id[PROTO_MAX_STR + 1];
	enum worker_role role; /* as started; shim_role() is the current one */
	int32_t rank;
	uint64_t park_quiet_ms; /* shadow: quiet time after the KV allocation before parking */
	uint64_t private_max;	/* shadow: converted weights/kv regions up to this get their own
				 * memory instead of scratch (index buffers live there) */
	uint64_t scratch_unit;	/* shadow: bytes of the scratch allocation, mapped that much at a
				 * time (0: one allocation granule) */
	bool classify_tags;	/* BELAYER_CLASSIFY=tags: only tagged allocations are weights/kv */
};
const struct shim_config *shim_config(void);
