/* SPDX-License-Identifier: MIT */
#include <string.h>

#include "supervisor-engines.h"
#include "supervisor-promote.h"

/* Configured engines: readiness and the last recovery's phases (the bench reads these). */
void engines_collect_metrics(struct supervisor *s, struct metrics_collector *col)
{
	static const char *const outcomes[] = {"none", "running", "promoted", "cold_restart",
					       "failed"};
	size_t n = s->engines ? s->engines->n : 0;

	for (size_t i = 0; i < n; i++)
		metrics_add(col, "belayer_engine_ready", METRIC_GAUGE,
			    s->engines->e[i].primary_ready,
			    "1 when the engine's primary answers its health URL.", "engine=\"%s\"",
			    s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++)
		metrics_add(
			col, "belayer_engine_promotable", METRIC_GAUGE,
			promote_armed(s, &s->engines->e[i]),
			"1 when a failure of the engine's primary now would be promoted (shadow "
			"group "
			"parked with the same layout, weights checksums recorded), as far as known "
			"before the GPU and content checks.",
			"engine=\"%s\"", s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++)
		metrics_add(col, "belayer_engine_adopted", METRIC_GAUGE,
			    engines_adopted(&s->engines->e[i]),
			    "Groups of the engine (primary, shadow) launched by a previous "
			    "supervisor and "
			    "adopted by this one, still running.",
			    "engine=\"%s\"", s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++)
		metrics_add(
			col, "belayer_engine_launches_total", METRIC_COUNTER,
			s->engines->e[i].n_launches,
			"Process groups of the engine this supervisor started (primaries, shadows, "
			"cold restarts).",
			"engine=\"%s\"", s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++)
		metrics_add(
			col, "belayer_engine_port", METRIC_GAUGE, s->engines->e[i].primary_port,
			"The port the engine's primary serves on (it changes at each promotion).",
			"engine=\"%s\"", s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++) {
		const struct sv_engine *e = &s->engines->e[i];
		uint64_t o = 0;

		for (size_t k = 0; k < ARRAY_SIZE(outcomes); k++)
			if (strcmp(promote_outcome(e), outcomes[k]) == 0)
				o = k;
		metrics_add(
			col, "belayer_recovery_last_outcome", METRIC_GAUGE, o,
			"Last recovery: 0 none, 1 running, 2 promoted, 3 cold restart, 4 failed.",
			"engine=\"%s\"", e->cfg->name);
	}
	for (size_t i = 0; i < n; i++)
		metrics_add(col, "belayer_recovery_last_seq", METRIC_GAUGE,
			    s->engines->e[i].last.seq,
			    "Number of the engine's last recovery (0: none).", "engine=\"%s\"",
			    s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++)
		for (int p = 0; p < _PHASE_MAX; p++)
			metrics_add_us(col, "belayer_recovery_last_phase_seconds", METRIC_GAUGE,
				       s->engines->e[i].last.phase_us[p],
				       "Duration of each phase of the engine's last recovery.",
				       "engine=\"%s\",phase=\"%s\"", s->engines->e[i].cfg->name,
				       rec_phase_to_string((enum rec_phase)p));
	for (size_t i = 0; i < n; i++)
		metrics_add_us(col, "belayer_recovery_last_total_seconds", METRIC_GAUGE,
			       s->engines->e[i].last.total_us,
			       "Failure (or detection) to serving, the engine's last recovery.",
			       "engine=\"%s\"", s->engines->e[i].cfg->name);
	canary_collect_metrics(s, col);
}
