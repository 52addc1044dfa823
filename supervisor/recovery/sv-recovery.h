/* SPDX-License-Identifier: MIT */
/*
 * Worker recovery's face (supervisor/recovery/): what the other subsystems may use. The
 * workers and their regions (the registry) are the core's; recovery watches them, checks
 * their health, runs the configured engines with their shadows and promotes a shadow when a
 * primary fails. The gateway in front of an engine sees only struct engine_upstream.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct supervisor;
struct sv_engine;
struct sv_engine_config;
struct sv_subsystem;

extern const struct sv_subsystem recovery_subsystem;

/* The configured engines: i < recovery_engines_n(s). */
size_t recovery_engines_n(struct supervisor *s);
struct sv_engine *recovery_engine(struct supervisor *s, size_t i);
const struct sv_engine_config *engine_config(const struct sv_engine *e);

/* What the gateway needs of its engine, as of now. */
struct engine_upstream {
	uint32_t port;	       /* the port the primary serves on now (it moves at a promotion) */
	bool ready;	       /* the primary's probe answered since it started */
	bool recovering;       /* a recovery is in progress */
	uint64_t n_recoveries; /* recoveries so far */
};
void engine_upstream(const struct sv_engine *e, struct engine_upstream *ret);
