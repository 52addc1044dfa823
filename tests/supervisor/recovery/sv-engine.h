/* SPDX-License-Identifier: MIT */
/*
 * Helpers of the supervisor tests that run the engine stand-in (test-promote, test-adopt):
 * engine "t", TP=2, launched by the supervisor as primary and shadow under libbelayer.so on the
 * emulated GPU, asked for its greedy tokens over HTTP. Every wait is bounded and polls a real
 * condition (a metric, a control reply, an HTTP answer).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto.h"
#include "sv-test.h"

#define ENGINE_READY_MS 60000
#define ENGINE_TOKENS	8

/* Test setup: the emulator's kernels and devices, a 24M weights file (seed 1) written to
 * weights (cap bytes) in the test's directory, and the greedy tokens of a failure-free engine on
 * it in baseline (computed once per process). */
void engine_setup(struct sv *sv, char *weights, size_t cap, uint32_t baseline[ENGINE_TOKENS]);
/* Stops the supervisor (it stops the engines it launched) and fails if any emulated GPU memory
 * is left: every allocation of the run died with its holders. Returns 0 (a cmocka teardown). */
int engine_teardown(struct sv *sv);
/* Starts the supervisor with engine t on weights: primary on port_a, shadow on port_b with
 * shadow_extra (NULL: "--kv-cache-bytes 16M") appended to its command line, then the
 * NULL-terminated settings more (may be NULL). */
void engine_start(struct sv *sv, const char *weights, uint16_t port_a, uint16_t port_b,
		  const char *shadow_extra, const char *const *more);
/* The same with both_extra (may be NULL) appended to the primary's and the shadow's command
 * lines. */
void engine_start_both(struct sv *sv, const char *weights, uint16_t port_a, uint16_t port_b,
		       const char *both_extra, const char *shadow_extra, const char *const *more);

/* A process (not the engine's) holding bytes of device dev of the run, as another job on a
 * shared GPU: its pid once it holds them. Kill it to free them. */
pid_t engine_occupy(int dev, size_t bytes);

/* POST /generate (greedy); 0 and the tokens, or -errno when nothing serves on port. */
int engine_generate(uint16_t port, uint32_t out[ENGINE_TOKENS]);
/* The same in two steps: the request sent (the connection, or -errno), then its reply read
 * (within timeout_ms per read) and the connection closed; 0 and the tokens, or -errno. */
int engine_generate_send(uint16_t port);
int engine_generate_read(int fd, int timeout_ms, uint32_t out[ENGINE_TOKENS]);
/* Greedy tokens of a failure-free engine (no shim, no supervisor) with weights file w. */
void engine_failure_free_tokens(const char *w, uint32_t out[ENGINE_TOKENS]);

/* The engine's metric (engine="t" plus more labels, NULL for none). */
uint64_t engine_metric(const struct sv *sv, const char *name, const char *more);
/* The alive worker of engine t with role and rank (rank -1 counts as 0); 0 if none. */
pid_t engine_worker_pid(const struct sv *sv, enum worker_role role, int rank);

/* Until the engine serves expected on the port the supervisor names. */
void engine_wait_serving(const struct sv *sv, const uint32_t expected[ENGINE_TOKENS]);
/* Until a failure now would be promoted (the supervisor's own verdict, a metric). */
void engine_wait_promotable(const struct sv *sv);
/* Waits for recovery seq to end; returns its outcome (2 promoted, 3 cold restart). */
uint64_t engine_wait_recovery(const struct sv *sv, uint64_t seq);
