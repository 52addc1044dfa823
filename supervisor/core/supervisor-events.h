/* SPDX-License-Identifier: MIT */
/*
 * The event stream: what happened to workers and regions, refusals, health verdicts. Each
 * event is logged, kept in a ring of the last [events] history, and sent to every subscribed
 * connection (`belayerctl events`); a subscriber that cannot keep up is disconnected, never
 * waited for.
 */
#pragma once

#include "util.h"
#include "supervisor.h"

int events_init(struct supervisor *s, size_t history);
void events_finish(struct supervisor *s);
void supervisor_emit(struct supervisor *s, enum event_kind kind, uint32_t pid, uint64_t id,
		     const char *fmt, ...) _printf_(5, 6);
/* Sends the last n events of the history to c. Returns how many were sent. */
size_t events_replay(struct supervisor *s, struct sv_client *c, size_t n);
