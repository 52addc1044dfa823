/* SPDX-License-Identifier: MIT */
/*
 * Counters the supervisor keeps, and the one list of every metric it exposes (counters and
 * gauges computed from the registry), read by `belayerctl status` and the Prometheus text.
 */
#pragma once

#include <stdint.h>
#include <stdio.h>

#include "proto.h"
#include "util.h"

enum reject_reason {
	REJECT_MAX_CONNECTIONS,
	REJECT_PEER_NOT_ALLOWED,
	REJECT_BAD_MESSAGE,
	REJECT_MESSAGE_SIZE,
	REJECT_NO_HELLO,
	REJECT_REGION_LIMIT,
	REJECT_FD_LIMIT,
	REJECT_UNAUTHORIZED,
	REJECT_NOT_FOUND,
	REJECT_SLOW_READER,
	REJECT_TOO_MANY_ERRORS,
	_REJECT_MAX,
};

enum recovery_outcome {
	RECOVERY_PROMOTED,
	RECOVERY_COLD_RESTART,
	RECOVERY_FAILED,
	_RECOVERY_MAX,
};

enum expire_reason {
	EXPIRE_TIMEOUT,
	EXPIRE_BUDGET,
	EXPIRE_RESYNC,
	_EXPIRE_MAX,
};

/* How a checkpoint the policy started ended (issue 11). */
enum policy_ckpt_outcome {
	POLICY_CKPT_COMPLETED,
	POLICY_CKPT_ABORTED, /* cancelled at a step-begin's delay bound */
	POLICY_CKPT_FAILED,
	_POLICY_CKPT_MAX,
};

struct sv_metrics {
	uint64_t connections_total;
	uint64_t rejected[_REJECT_MAX];
	uint64_t recoveries[_RECOVERY_MAX];
	uint64_t verdicts[_HEALTH_CHECK_MAX][_VERDICT_MAX];
	uint64_t regions_announced;
	uint64_t regions_released;
	uint64_t regions_fetched;
	uint64_t regions_expired[_EXPIRE_MAX];
	uint64_t regions_lost;
	uint64_t worker_exits;
	uint64_t events_total;
	uint64_t injections;
	uint64_t offload_jobs;
	uint64_t live_checksums; /* weights checksums recorded while their owner lived */
	/* The checkpoint policy (supervisor-traj-ctl.c). */
	uint64_t policy_ckpts_started;
	uint64_t policy_ckpts[_POLICY_CKPT_MAX];
	uint64_t policy_holds;		  /* step-begin replies held for a running checkpoint */
	uint64_t policy_held_us;	  /* their waits, in total */
	uint64_t policy_holds_past_bound; /* released past max_delay: a dump ran at the bound */
};

const char *reject_reason_to_string(enum reject_reason r);

struct supervisor;

/* What a subsystem's collect_metrics (supervisor-subsystem.h) adds its metrics to. */
struct metrics_collector;
void metrics_add(struct metrics_collector *col, const char *name, enum metric_kind kind,
		 uint64_t value, const char *help, const char *labels_fmt, ...) _printf_(6, 7);
/* A duration in microseconds, exposed in seconds (name ends in _seconds or _seconds_total). */
void metrics_add_us(struct metrics_collector *col, const char *name, enum metric_kind kind,
		    uint64_t us, const char *help, const char *labels_fmt, ...) _printf_(6, 7);

/* A histogram of durations in microseconds, exposed in seconds: n buckets with their upper
 * bounds and (non-cumulative) counts, +Inf, _sum and _count; labels without braces ("" for
 * none). */
void metrics_add_histogram_us(struct metrics_collector *col, const char *name, const char *help,
			      const char *labels, const uint64_t *bounds_us, const uint64_t *counts,
			      size_t n, uint64_t sum_us, uint64_t count);

/* Metric i (0, 1, ... until false) as a METRIC message, values as of now. */
bool metrics_get(struct supervisor *s, size_t i, struct proto_msg *ret);
/* Prometheus text exposition format 0.0.4 of every metric. */
void metrics_write_prometheus(struct supervisor *s, FILE *f);
