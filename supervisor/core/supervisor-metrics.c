/* SPDX-License-Identifier: MIT */
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "supervisor-journal.h"
#include "supervisor-metrics.h"
#include "supervisor-subsystem.h"
#include "supervisor.h"

#define MAX_METRICS 1024

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

struct metrics_collector {
	struct proto_msg *out;
	size_t n, max;
};

static void _printf_(7, 0) metrics_vadd(struct metrics_collector *col, const char *name,
					enum metric_kind kind, uint64_t value, uint32_t scale,
					const char *help, const char *labels_fmt, va_list ap)
{
	struct proto_msg *m;

	if (col->n >= col->max)
		return;
	m = &col->out[col->n++];
	memset(m, 0, sizeof(*m));
	m->type = PROTO_METRIC;
	snprintf(m->metric.name, sizeof(m->metric.name), "%s", name);
	m->metric.kind = kind;
	m->metric.value = value;
	m->metric.scale = scale;
	snprintf(m->metric.help, sizeof(m->metric.help), "%s", help);
	(void)vsnprintf(m->metric.labels, sizeof(m->metric.labels), labels_fmt, ap);
}

void metrics_add(struct metrics_collector *col, const char *name, enum metric_kind kind,
		 uint64_t value, const char *help, const char *labels_fmt, ...)
{
	va_list ap;

	va_start(ap, labels_fmt);
	metrics_vadd(col, name, kind, value, 0, help, labels_fmt, ap);
	va_end(ap);
}

void metrics_add_us(struct metrics_collector *col, const char *name, enum metric_kind kind,
		    uint64_t us, const char *help, const char *labels_fmt, ...)
{
	va_list ap;

	va_start(ap, labels_fmt);
	metrics_vadd(col, name, kind, us, 1000000, help, labels_fmt, ap);
	va_end(ap);
}

void metrics_add_histogram_us(struct metrics_collector *col, const char *name, const char *help,
			      const char *labels, const uint64_t *bounds_us, const uint64_t *counts,
			      size_t n, uint64_t sum_us, uint64_t count)
{
	char series[96], lbl[96];
	uint64_t below = 0;

	snprintf(series, sizeof(series), "%s_bucket", name);
	for (size_t i = 0; i <= n; i++) {
		below += i < n ? counts[i] : 0;
		if (i < n)
			snprintf(lbl, sizeof(lbl), "%s%sle=\"%" PRIu64 ".%06" PRIu64 "\"", labels,
				 labels[0] ? "," : "", bounds_us[i] / 1000000,
				 bounds_us[i] % 1000000);
		else
			snprintf(lbl, sizeof(lbl), "%s%sle=\"+Inf\"", labels, labels[0] ? "," : "");
		metrics_add(col, series, METRIC_HISTOGRAM, i < n ? below : count, help, "%s", lbl);
	}
	snprintf(series, sizeof(series), "%s_sum", name);
	metrics_add_us(col, series, METRIC_HISTOGRAM, sum_us, help, "%s", labels);
	snprintf(series, sizeof(series), "%s_count", name);
	metrics_add(col, series, METRIC_HISTOGRAM, count, help, "%s", labels);
}

static size_t collect(struct supervisor *s, struct proto_msg *out, size_t max)
{
	struct metrics_collector col = {.out = out, .max = max};
	const struct sv_metrics *m = &s->metrics;
	uint64_t per_state[_WORKER_STATE_MAX] = {0};

	for (const struct sv_worker *w = s->reg.workers; w; w = w->next)
		per_state[w->state]++;
	for (int st = 0; st < _WORKER_STATE_MAX; st++)
		metrics_add(&col, "belayer_workers", METRIC_GAUGE, per_state[st],
			    "Workers known, by state.", "state=\"%s\"", worker_state_to_string(st));
	/* Each family's samples stay together, as the exposition format requires. */
	for (int st = 0; st < _REGION_STATE_MAX; st++) {
		uint64_t n;

		registry_totals(&s->reg, st, &n, NULL);
		metrics_add(&col, "belayer_regions", METRIC_GAUGE, n, "Regions known, by state.",
			    "state=\"%s\"", region_state_to_string(st));
	}
	for (int st = 0; st < _REGION_STATE_MAX; st++) {
		uint64_t bytes;

		registry_totals(&s->reg, st, NULL, &bytes);
		metrics_add(&col, "belayer_region_bytes", METRIC_GAUGE, bytes,
			    "Bytes of the regions known, by state (retained: kept alive by the "
			    "supervisor "
			    "alone).",
			    "state=\"%s\"", region_state_to_string(st));
	}
	metrics_add(&col, "belayer_fds_held", METRIC_GAUGE, s->reg.n_fds,
		    "Region fds the supervisor holds.", "%s", "");
	metrics_add(&col, "belayer_connections", METRIC_GAUGE, s->n_clients, "Open connections.",
		    "%s", "");
	metrics_add(&col, "belayer_connections_total", METRIC_COUNTER, m->connections_total,
		    "Connections accepted.", "%s", "");
	for (int r = 0; r < _REJECT_MAX; r++)
		metrics_add(&col, "belayer_rejected_total", METRIC_COUNTER, m->rejected[r],
			    "Connections and messages refused, by reason.", "reason=\"%s\"",
			    reject_names[r]);
	for (int r = 0; r < _RECOVERY_MAX; r++)
		metrics_add(&col, "belayer_recoveries_total", METRIC_COUNTER, m->recoveries[r],
			    "Worker recoveries, by outcome.", "outcome=\"%s\"", recovery_names[r]);
	for (int c = 0; c < _HEALTH_CHECK_MAX; c++)
		for (int v = 0; v < _VERDICT_MAX; v++)
			metrics_add(&col, "belayer_health_verdicts_total", METRIC_COUNTER,
				    m->verdicts[c][v],
				    "Health-check verdicts, by check and verdict.",
				    "check=\"%s\",verdict=\"%s\"", health_check_to_string(c),
				    health_verdict_to_string(v));
	metrics_add(&col, "belayer_gpu_health", METRIC_GAUGE, (uint64_t)s->gpu_verdict,
		    "Latest periodic GPU verdict: 0 ok, 1 failed, 2 unknown.", "%s", "");
	metrics_add(&col, "belayer_regions_announced_total", METRIC_COUNTER, m->regions_announced,
		    "Region announcements accepted (updates included).", "%s", "");
	metrics_add(&col, "belayer_regions_released_total", METRIC_COUNTER, m->regions_released,
		    "Regions released by their owner.", "%s", "");
	metrics_add(&col, "belayer_regions_fetched_total", METRIC_COUNTER, m->regions_fetched,
		    "Region fds handed to permitted peers.", "%s", "");
	for (int e = 0; e < _EXPIRE_MAX; e++)
		metrics_add(&col, "belayer_regions_expired_total", METRIC_COUNTER,
			    m->regions_expired[e], "Regions released by the supervisor, by reason.",
			    "reason=\"%s\"", expire_names[e]);
	metrics_add(&col, "belayer_regions_lost_total", METRIC_COUNTER, m->regions_lost,
		    "Journaled regions whose memory was gone when the supervisor restarted.", "%s",
		    "");
	metrics_add(&col, "belayer_worker_exits_total", METRIC_COUNTER, m->worker_exits,
		    "Worker deaths seen through pidfds.", "%s", "");
	metrics_add(&col, "belayer_injections_total", METRIC_COUNTER, m->injections,
		    "Faults injected through belayerctl inject.", "%s", "");
	metrics_add(&col, "belayer_events_total", METRIC_COUNTER, m->events_total,
		    "Events emitted.", "%s", "");
	metrics_add(&col, "belayer_offload_jobs_total", METRIC_COUNTER, m->offload_jobs,
		    "Jobs run off the event loop.", "%s", "");
	metrics_add(&col, "belayer_weights_checksums_total", METRIC_COUNTER, m->live_checksums,
		    "Weights checksums recorded while their owner lived (what promotion compares).",
		    "%s", "");
	metrics_add(&col, "belayer_policy_checkpoints_started_total", METRIC_COUNTER,
		    m->policy_ckpts_started,
		    "Environment checkpoints the policy started at step ends.", "%s", "");
	for (int o = 0; o < _POLICY_CKPT_MAX; o++)
		metrics_add(&col, "belayer_policy_checkpoints_total", METRIC_COUNTER,
			    m->policy_ckpts[o],
			    "Environment checkpoints the policy started, by outcome.",
			    "outcome=\"%s\"", policy_ckpt_names[o]);
	metrics_add(&col, "belayer_policy_holds_total", METRIC_COUNTER, m->policy_holds,
		    "Step-begin replies held while the environment's checkpoint ran.", "%s", "");
	metrics_add_us(&col, "belayer_policy_held_seconds_total", METRIC_COUNTER, m->policy_held_us,
		       "Time step-begin replies were held, in total.", "%s", "");
	metrics_add(&col, "belayer_policy_holds_past_bound_total", METRIC_COUNTER,
		    m->policy_holds_past_bound,
		    "Held replies released past [policy] max_delay because a CRIU dump was "
		    "running at the bound (it is not interrupted).",
		    "%s", "");
	metrics_add(&col, "belayer_journal_bytes", METRIC_GAUGE, journal_size(s->journal),
		    "Size of the journal.", "%s", "");
	metrics_add(&col, "belayer_uptime_seconds", METRIC_GAUGE, (now_ms() - s->start_ms) / 1000,
		    "Seconds since the supervisor started.", "%s", "");
	SUBSYSTEMS_FOREACH (s, it)
		if ((*it)->collect_metrics)
			(*it)->collect_metrics(s, &col);
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

/* Digits after the point of 1/scale (scale a power of ten: metrics_add_us's 10^6). */
static int scale_digits(uint32_t scale)
{
	int d = 0;

	for (; scale > 1; scale /= 10)
		d++;
	return d;
}

/* The family a series belongs to: its name, less _bucket/_sum/_count for a histogram's. */
static size_t family_len(const struct proto_metric *m)
{
	static const char *const suffix[] = {"_bucket", "_sum", "_count"};
	size_t n = strlen(m->name);

	if (m->kind != METRIC_HISTOGRAM)
		return n;
	for (size_t i = 0; i < ARRAY_SIZE(suffix); i++) {
		size_t k = strlen(suffix[i]);

		if (n > k && strcmp(m->name + n - k, suffix[i]) == 0)
			return n - k;
	}
	return n;
}

void metrics_write_prometheus(struct supervisor *s, FILE *f)
{
	static struct proto_msg all[MAX_METRICS];
	size_t n = collect(s, all, MAX_METRICS);

	for (size_t i = 0; i < n; i++) {
		const struct proto_metric *m = &all[i].metric,
					  *prev = i ? &all[i - 1].metric : NULL;
		int fam = (int)family_len(m);

		if (!prev || (int)family_len(prev) != fam || strncmp(prev->name, m->name, fam) != 0)
			fprintf(f, "# HELP %.*s %s\n# TYPE %.*s %s\n", fam, m->name, m->help, fam,
				m->name, metric_kind_to_string(m->kind));
		fprintf(f, "%s%s%s%s ", m->name, m->labels[0] ? "{" : "", m->labels,
			m->labels[0] ? "}" : "");
		if (m->scale > 1)
			/* exact: value / scale as a decimal, not through a double */
			fprintf(f, "%" PRIu64 ".%0*" PRIu64 "\n", m->value / m->scale,
				scale_digits(m->scale), m->value % m->scale);
		else
			fprintf(f, "%" PRIu64 "\n", m->value);
	}
}
