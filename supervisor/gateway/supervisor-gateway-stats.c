/* SPDX-License-Identifier: MIT */
#include <string.h>

#include "supervisor-gateway-stats.h"
#include "supervisor-gateway.h"
#include "supervisor-metrics.h"
#include "util.h"

static const char *const path_names[_GW_PATH_MAX] = {
	[GW_PATH_GENERATE] = "/generate",
	[GW_PATH_COMPLETIONS] = "/v1/completions",
	[GW_PATH_CHAT_COMPLETIONS] = "/v1/chat/completions",
	[GW_PATH_HEALTH] = "/health",
	[GW_PATH_OTHER] = "other",
};

static const char *const reject_names[_GW_REJECT_MAX] = {
	[GW_REJECT_CONNECTIONS] = "max_connections",   [GW_REJECT_REQUESTS] = "max_requests",
	[GW_REJECT_HEADER_SIZE] = "header_size",       [GW_REJECT_BODY_SIZE] = "body_size",
	[GW_REJECT_HEADER_TIMEOUT] = "header_timeout", [GW_REJECT_BODY_TIMEOUT] = "body_timeout",
	[GW_REJECT_MALFORMED] = "malformed",
};

static const uint64_t latency_bounds_us[GW_LATENCY_NBUCKETS] = GW_LATENCY_BUCKETS_US;

enum gw_path gw_path_of(const char *path)
{
	for (int p = 0; path && p < GW_PATH_OTHER; p++)
		if (strcmp(path, path_names[p]) == 0)
			return p;
	return GW_PATH_OTHER;
}

void gw_stats_reply(struct gw_stats *st, enum gw_path path, uint16_t status, uint64_t us)
{
	struct gw_code_count *c = st->replies[path];
	size_t i, b;

	for (i = 0; i < GW_STATS_CODES && c[i].code && c[i].code != status; i++)
		;
	if (i < GW_STATS_CODES) {
		c[i].code = status;
		c[i].n++;
	} else {
		st->replies_other[path]++;
	}
	for (b = 0; b < GW_LATENCY_NBUCKETS && us > latency_bounds_us[b]; b++)
		;
	if (b < GW_LATENCY_NBUCKETS)
		st->latency_buckets[b]++;
	st->latency_count++;
	st->latency_sum_us += us;
}

void gateway_collect_metrics(struct supervisor *s, struct metrics_collector *col)
{
	const struct gw_stats *st;
	const char *name;
	uint32_t in_flight, waiting;
	char lbl[96];

	(void)s;
	/* Each family's samples together, as the exposition format requires. */
	for (size_t i = 0; (st = gateway_stats(i, &name, &in_flight, &waiting)); i++)
		for (int p = 0; p < _GW_PATH_MAX; p++)
			for (size_t k = 0; k < GW_STATS_CODES && st->replies[p][k].code; k++)
				metrics_add(
					col, "belayer_gateway_requests_total", METRIC_COUNTER,
					st->replies[p][k].n,
					"Client requests answered, by path and status (499: the "
					"client went away first; a reply that failed after it "
					"began counts under the failure's status).",
					"engine=\"%s\",path=\"%s\",code=\"%u\"", name,
					path_names[p], st->replies[p][k].code);
	for (size_t i = 0; (st = gateway_stats(i, &name, &in_flight, &waiting)); i++)
		for (int p = 0; p < _GW_PATH_MAX; p++)
			if (st->replies_other[p])
				metrics_add(col, "belayer_gateway_requests_total", METRIC_COUNTER,
					    st->replies_other[p], "",
					    "engine=\"%s\",path=\"%s\",code=\"other\"", name,
					    path_names[p]);
	for (size_t i = 0; (st = gateway_stats(i, &name, &in_flight, &waiting)); i++)
		metrics_add(col, "belayer_gateway_requests_in_flight", METRIC_GAUGE, in_flight,
			    "Client requests in the gateway now.", "engine=\"%s\"", name);
	for (size_t i = 0; (st = gateway_stats(i, &name, &in_flight, &waiting)); i++)
		metrics_add(col, "belayer_gateway_requests_waiting", METRIC_GAUGE, waiting,
			    "Client requests waiting for the engine's recovery now.",
			    "engine=\"%s\"", name);
	for (size_t i = 0; (st = gateway_stats(i, &name, &in_flight, &waiting)); i++)
		for (int k = 0; k < _GW_REJECT_MAX; k++)
			metrics_add(col, "belayer_gateway_rejected_total", METRIC_COUNTER,
				    st->rejected[k],
				    "Client connections or requests refused or cut before they "
				    "reached the engine, by reason.",
				    "engine=\"%s\",reason=\"%s\"", name, reject_names[k]);
#define GW_COUNTER(field, metric, help)                                               \
	for (size_t i = 0; (st = gateway_stats(i, &name, &in_flight, &waiting)); i++) \
	metrics_add(col, metric, METRIC_COUNTER, st->field, help, "engine=\"%s\"", name)
	GW_COUNTER(client_connections, "belayer_gateway_client_connections_total",
		   "Client connections accepted.");
	GW_COUNTER(client_disconnects, "belayer_gateway_client_disconnects_total",
		   "Clients that went away while their request was in the gateway (cancelled "
		   "upstream).");
	GW_COUNTER(resumed, "belayer_gateway_resumed_total",
		   "Upstream attempts that continued a journaled request from its tokens so far.");
	GW_COUNTER(resubmitted, "belayer_gateway_resubmitted_total",
		   "Upstream attempts that sent a request again from its start.");
	GW_COUNTER(upstream_retries, "belayer_gateway_upstream_retries_total",
		   "Engine connections refused or reset before the request was sent, retried.");
	GW_COUNTER(upstream_connections, "belayer_gateway_upstream_connections_total",
		   "Engine connections opened.");
	GW_COUNTER(upstream_requests, "belayer_gateway_upstream_requests_total",
		   "Requests sent to the engine (those beyond the connections opened reused a "
		   "kept-alive connection).");
#undef GW_COUNTER
	for (size_t i = 0; (st = gateway_stats(i, &name, &in_flight, &waiting)); i++) {
		snprintf(lbl, sizeof(lbl), "engine=\"%s\"", name);
		metrics_add_histogram_us(col, "belayer_gateway_request_duration_seconds",
					 "Client requests from arrival to the end of their reply.",
					 lbl, latency_bounds_us, st->latency_buckets,
					 GW_LATENCY_NBUCKETS, st->latency_sum_us,
					 st->latency_count);
	}
}
