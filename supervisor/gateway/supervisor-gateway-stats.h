/* SPDX-License-Identifier: MIT */
/*
 * The gateway's counters (issue 18, item 8), one set per engine with a gateway, exposed as
 * belayer_gateway_* metrics (Prometheus and `belayerctl status`). Written only on the loop.
 */
#pragma once

#include <stdint.h>

/* The paths the gateway knows; every other one counts as GW_PATH_OTHER (bounded labels). */
enum gw_path {
	GW_PATH_GENERATE,	  /* /generate */
	GW_PATH_COMPLETIONS,	  /* /v1/completions */
	GW_PATH_CHAT_COMPLETIONS, /* /v1/chat/completions */
	GW_PATH_HEALTH,		  /* /health */
	GW_PATH_OTHER,
	_GW_PATH_MAX,
};

/* Why a client connection or request was refused or cut before it reached the engine. */
enum gw_reject {
	GW_REJECT_CONNECTIONS,	  /* over gateway_max_connections */
	GW_REJECT_REQUESTS,	  /* over gateway_max_requests */
	GW_REJECT_HEADER_SIZE,	  /* request line + headers over gateway_max_header */
	GW_REJECT_BODY_SIZE,	  /* body over gateway_max_body */
	GW_REJECT_HEADER_TIMEOUT, /* headers not complete within gateway_header_timeout */
	GW_REJECT_BODY_TIMEOUT,	  /* body not complete within gateway_body_timeout */
	GW_REJECT_MALFORMED,	  /* not HTTP/1.x the gateway accepts (framing, method) */
	_GW_REJECT_MAX,
};

/* Distinct status codes counted per path; a code past these counts under its class (2xx...). */
#define GW_STATS_CODES 16

/* Upper bounds (seconds) of the request-duration histogram's buckets; +Inf is implicit. */
#define GW_LATENCY_BUCKETS_US                                                                   \
	{                                                                                       \
		1000, 5000, 25000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000, \
			30000000, 60000000, 300000000                                           \
	}
#define GW_LATENCY_NBUCKETS 13

struct gw_code_count {
	uint16_t code; /* 0: unused slot */
	uint64_t n;
};

struct gw_stats {
	/* Client requests answered, by path and status (499: the client went away first). */
	struct gw_code_count replies[_GW_PATH_MAX][GW_STATS_CODES];
	uint64_t rejected[_GW_REJECT_MAX];
	uint64_t client_connections; /* accepted */
	uint64_t client_disconnects; /* clients gone while their request was in the gateway */
	uint64_t resumed;	     /* attempts that continued a journaled request mid-way */
	uint64_t resubmitted;	     /* attempts that sent a request again from its start */
	uint64_t upstream_retries;   /* connections refused or reset before the request was sent */
	uint64_t upstream_connections; /* engine connections opened */
	uint64_t upstream_requests;    /* requests sent upstream (minus connections: reuse) */
	/* Request duration, from its arrival to its reply's end, for every answered request. */
	uint64_t latency_buckets[GW_LATENCY_NBUCKETS]; /* non-cumulative here */
	uint64_t latency_count;
	uint64_t latency_sum_us;
};
