/* SPDX-License-Identifier: MIT */
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "supervisor-engines.h"
#include "supervisor-journal.h"
#include "supervisor-promote.h"
#include "supervisor-metrics.h"
#include "supervisor.h"

#define MAX_METRICS 256

static const char *const reject_names[_REJECT_MAX] = {
	[REJECT_MAX_CONNECTIONS] = "max_connections",
	[REJECT_PEER_NOT_ALLOWED] = "peer_not_allowed",
	[REJECT_BAD_MESSAGE] = "bad_message",
	[REJECT_MESSAGE_SIZE] = "message_size",
	[REJECT_NO_HELLO] = "no_hello",
	[REJECT_REGION_LIMIT] = "region_limit",
	[REJECT_FD_LIMIT] = "fd_limit",
	[REJECT_UNAUTHORIZED] = "unauthorized",
	[REJECT_NOT_FOUND] = "not_found",
	[REJECT_SLOW_READER] = "slow_reader",
	[REJECT_TOO_MANY_ERRORS] = "too_many_errors",
};

static const char *const recovery_names[_RECOVERY_MAX] = {
	[RECOVERY_PROMOTED] = "promoted",
	[RECOVERY_COLD_RESTART] = "cold_restart",
	[RECOVERY_FAILED] = "failed",
};

static const char *const policy_ckpt_names[_POLICY_CKPT_MAX] = {
	[POLICY_CKPT_COMPLETED] = "completed",
	[POLICY_CKPT_ABORTED] = "aborted",
	[POLICY_CKPT_FAILED] = "failed",
};

static const char *const expire_names[_EXPIRE_MAX] = {
	[EXPIRE_TIMEOUT] = "timeout",
	[EXPIRE_BUDGET] = "budget",
	[EXPIRE_RESYNC] = "resync",
};

const char *reject_reason_to_string(enum reject_reason r)
{
	return (unsigned)r < _REJECT_MAX ? reject_names[r] : NULL;
}

struct collector {
	struct proto_msg *out;
	size_t n, max;
};

static void add(struct collector *col, const char *name, enum metric_kind kind, uint64_t value,
		const char *help, const char *labels_fmt, ...) _printf_(6, 7);

static void add(struct collector *col, const char *name, enum metric_kind kind, uint64_t value,
		const char *help, const char *labels_fmt, ...)
{
	struct proto_msg *m;
	va_list ap;

	if (col->n >= col->max)
		return;
	m = &col->out[col->n++];
	memset(m, 0, sizeof(*m));
	m->type = PROTO_METRIC;
	snprintf(m->metric.name, sizeof(m->metric.name), "%s", name);
	m->metric.kind = kind;
	m->metric.value = value;
	snprintf(m->metric.help, sizeof(m->metric.help), "%s", help);
	va_start(ap, labels_fmt);
	(void)vsnprintf(m->metric.labels, sizeof(m->metric.labels), labels_fmt, ap);
	va_end(ap);
}

/* Configured engines: readiness and the last recovery's phases (the bench reads these). */
static void collect_engines(struct supervisor *s, struct collector *col)
{
	static const char *const outcomes[] = {"none", "running", "promoted", "cold_restart",
					       "failed"};
	size_t n = s->engines ? s->engines->n : 0;

	for (size_t i = 0; i < n; i++)
		add(col, "belayer_engine_ready", METRIC_GAUGE, s->engines->e[i].primary_ready,
		    "1 when the engine's primary answers its health URL.", "engine=\"%s\"",
		    s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++)
		add(col, "belayer_engine_promotable", METRIC_GAUGE,
		    promote_armed(s, &s->engines->e[i]),
		    "1 when a failure of the engine's primary now would be promoted (shadow group "
		    "parked with the same layout, weights checksums recorded), as far as known "
		    "before the GPU and content checks.",
		    "engine=\"%s\"", s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++)
		add(col, "belayer_engine_adopted", METRIC_GAUGE, engines_adopted(&s->engines->e[i]),
		    "Groups of the engine (primary, shadow) launched by a previous supervisor and "
		    "adopted by this one, still running.",
		    "engine=\"%s\"", s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++)
		add(col, "belayer_engine_launches_total", METRIC_COUNTER,
		    s->engines->e[i].n_launches,
		    "Process groups of the engine this supervisor started (primaries, shadows, "
		    "cold restarts).",
		    "engine=\"%s\"", s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++)
		add(col, "belayer_engine_port", METRIC_GAUGE, s->engines->e[i].primary_port,
		    "The port the engine's primary serves on (it changes at each promotion).",
		    "engine=\"%s\"", s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++) {
		const struct sv_engine *e = &s->engines->e[i];
		uint64_t o = 0;

		for (size_t k = 0; k < ARRAY_SIZE(outcomes); k++)
			if (strcmp(promote_outcome(e), outcomes[k]) == 0)
				o = k;
		add(col, "belayer_recovery_last_outcome", METRIC_GAUGE, o,
		    "Last recovery: 0 none, 1 running, 2 promoted, 3 cold restart, 4 failed.",
		    "engine=\"%s\"", e->cfg->name);
	}
	for (size_t i = 0; i < n; i++)
		add(col, "belayer_recovery_last_seq", METRIC_GAUGE, s->engines->e[i].last.seq,
		    "Number of the engine's last recovery (0: none).", "engine=\"%s\"",
		    s->engines->e[i].cfg->name);
	for (size_t i = 0; i < n; i++)
		for (int p = 0; p < _PHASE_MAX; p++)
			add(col, "belayer_recovery_last_phase_microseconds", METRIC_GAUGE,
			    s->engines->e[i].last.phase_us[p],
			    "Duration of each phase of the engine's last recovery.",
			    "engine=\"%s\",phase=\"%s\"", s->engines->e[i].cfg->name,
			    rec_phase_to_string((enum rec_phase)p));
	for (size_t i = 0; i < n; i++)
		add(col, "belayer_recovery_last_total_microseconds", METRIC_GAUGE,
		    s->engines->e[i].last.total_us,
		    "Failure (or detection) to serving, the engine's last recovery.",
		    "engine=\"%s\"", s->engines->e[i].cfg->name);
}

static size_t collect(struct supervisor *s, struct proto_msg *out, size_t max)
{
	struct collector col = {.out = out, .max = max};
	const struct sv_metrics *m = &s->metrics;
	uint64_t per_state[_WORKER_STATE_MAX] = {0};

	for (const struct sv_worker *w = s->reg.workers; w; w = w->next)
		per_state[w->state]++;
	for (int st = 0; st < _WORKER_STATE_MAX; st++)
		add(&col, "belayer_workers", METRIC_GAUGE, per_state[st],
		    "Workers known, by state.", "state=\"%s\"", worker_state_to_string(st));
	/* Each family's samples stay together, as the exposition format requires. */
	for (int st = 0; st < _REGION_STATE_MAX; st++) {
		uint64_t n;

		registry_totals(&s->reg, st, &n, NULL);
		add(&col, "belayer_regions", METRIC_GAUGE, n, "Regions known, by state.",
		    "state=\"%s\"", region_state_to_string(st));
	}
	for (int st = 0; st < _REGION_STATE_MAX; st++) {
		uint64_t bytes;

		registry_totals(&s->reg, st, NULL, &bytes);
		add(&col, "belayer_region_bytes", METRIC_GAUGE, bytes,
		    "Bytes of the regions known, by state (retained: kept alive by the supervisor "
		    "alone).",
		    "state=\"%s\"", region_state_to_string(st));
	}
	add(&col, "belayer_fds_held", METRIC_GAUGE, s->reg.n_fds,
	    "Region fds the supervisor holds.", "%s", "");
	add(&col, "belayer_connections", METRIC_GAUGE, s->n_clients, "Open connections.", "%s", "");
	add(&col, "belayer_connections_total", METRIC_COUNTER, m->connections_total,
	    "Connections accepted.", "%s", "");
	for (int r = 0; r < _REJECT_MAX; r++)
		add(&col, "belayer_rejected_total", METRIC_COUNTER, m->rejected[r],
		    "Connections and messages refused, by reason.", "reason=\"%s\"",
		    reject_names[r]);
	for (int r = 0; r < _RECOVERY_MAX; r++)
		add(&col, "belayer_recoveries_total", METRIC_COUNTER, m->recoveries[r],
		    "Worker recoveries, by outcome.", "outcome=\"%s\"", recovery_names[r]);
	for (int c = 0; c < _HEALTH_CHECK_MAX; c++)
		for (int v = 0; v < _VERDICT_MAX; v++)
			add(&col, "belayer_health_verdicts_total", METRIC_COUNTER,
			    m->verdicts[c][v], "Health-check verdicts, by check and verdict.",
			    "check=\"%s\",verdict=\"%s\"", health_check_to_string(c),
			    health_verdict_to_string(v));
	add(&col, "belayer_gpu_health", METRIC_GAUGE, (uint64_t)s->gpu_verdict,
	    "Latest periodic GPU verdict: 0 ok, 1 failed, 2 unknown.", "%s", "");
	add(&col, "belayer_regions_announced_total", METRIC_COUNTER, m->regions_announced,
	    "Region announcements accepted (updates included).", "%s", "");
	add(&col, "belayer_regions_released_total", METRIC_COUNTER, m->regions_released,
	    "Regions released by their owner.", "%s", "");
	add(&col, "belayer_regions_fetched_total", METRIC_COUNTER, m->regions_fetched,
	    "Region fds handed to permitted peers.", "%s", "");
	for (int e = 0; e < _EXPIRE_MAX; e++)
		add(&col, "belayer_regions_expired_total", METRIC_COUNTER, m->regions_expired[e],
		    "Regions released by the supervisor, by reason.", "reason=\"%s\"",
		    expire_names[e]);
	add(&col, "belayer_regions_lost_total", METRIC_COUNTER, m->regions_lost,
	    "Journaled regions whose memory was gone when the supervisor restarted.", "%s", "");
	add(&col, "belayer_worker_exits_total", METRIC_COUNTER, m->worker_exits,
	    "Worker deaths seen through pidfds.", "%s", "");
	add(&col, "belayer_injections_total", METRIC_COUNTER, m->injections,
	    "Faults injected through belayerctl inject.", "%s", "");
	add(&col, "belayer_events_total", METRIC_COUNTER, m->events_total, "Events emitted.", "%s",
	    "");
	add(&col, "belayer_offload_jobs_total", METRIC_COUNTER, m->offload_jobs,
	    "Jobs run off the event loop.", "%s", "");
	add(&col, "belayer_weights_checksums_total", METRIC_COUNTER, m->live_checksums,
	    "Weights checksums recorded while their owner lived (what promotion compares).", "%s",
	    "");
	add(&col, "belayer_policy_checkpoints_started_total", METRIC_COUNTER,
	    m->policy_ckpts_started, "Environment checkpoints the policy started at step ends.",
	    "%s", "");
	for (int o = 0; o < _POLICY_CKPT_MAX; o++)
		add(&col, "belayer_policy_checkpoints_total", METRIC_COUNTER, m->policy_ckpts[o],
		    "Environment checkpoints the policy started, by outcome.", "outcome=\"%s\"",
		    policy_ckpt_names[o]);
	add(&col, "belayer_policy_holds_total", METRIC_COUNTER, m->policy_holds,
	    "Step-begin replies held while the environment's checkpoint ran.", "%s", "");
	add(&col, "belayer_policy_held_microseconds_total", METRIC_COUNTER, m->policy_held_us,
	    "Time step-begin replies were held, in total.", "%s", "");
	add(&col, "belayer_policy_holds_past_bound_total", METRIC_COUNTER,
	    m->policy_holds_past_bound,
	    "Held replies released more than 10 ms past [policy] max_delay (a CRIU dump running "
	    "at the bound is not interrupted).",
	    "%s", "");
	add(&col, "belayer_journal_bytes", METRIC_GAUGE, journal_size(s->journal),
	    "Size of the journal.", "%s", "");
	add(&col, "belayer_uptime_seconds", METRIC_GAUGE, (now_ms() - s->start_ms) / 1000,
	    "Seconds since the supervisor started.", "%s", "");
	collect_engines(s, &col);
	return col.n;
}

bool metrics_get(struct supervisor *s, size_t i, struct proto_msg *ret)
{
	static struct proto_msg all[MAX_METRICS];
	static size_t n;

	/* Collected once per walk (at i == 0), so one listing is one consistent snapshot. */
	if (i == 0)
		n = collect(s, all, MAX_METRICS);
	if (i >= n)
		return false;
	*ret = all[i];
	return true;
}

void metrics_write_prometheus(struct supervisor *s, FILE *f)
{
	static struct proto_msg all[MAX_METRICS];
	size_t n = collect(s, all, MAX_METRICS);

	for (size_t i = 0; i < n; i++) {
		const struct proto_metric *m = &all[i].metric;

		if (i == 0 || strcmp(all[i - 1].metric.name, m->name) != 0)
			fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", m->name, m->help, m->name,
				metric_kind_to_string(m->kind));
		fprintf(f, "%s%s%s%s %" PRIu64 "\n", m->name, m->labels[0] ? "{" : "", m->labels,
			m->labels[0] ? "}" : "", m->value);
	}
}
