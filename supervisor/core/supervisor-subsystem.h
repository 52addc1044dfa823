/* SPDX-License-Identifier: MIT */
/*
 * How a subsystem (recovery, environments, the checkpoint policy, the gateway) plugs into the
 * core: the messages and control commands it serves, and the points of the daemon's life it
 * acts at. The core walks supervisor.subsystems (main's list) and knows none of them by
 * name; every member may be NULL.
 */
#pragma once

#include <stdint.h>

#include "proto.h"

struct event_base;
struct journal_record;
struct metrics_collector;
struct supervisor;
struct sv_client;
struct sv_worker;

/* One message type a peer may send, and what serves it (takes ownership of the fds). */
struct sv_message_handler {
	enum proto_type type;
	int (*handle)(struct supervisor *s, struct sv_client *c, struct proto_msg *m);
};

/* One PROTO_CTL command and what serves it. */
struct sv_ctl_handler {
	enum ctl_cmd cmd;
	int (*handle)(struct supervisor *s, struct sv_client *c, const struct proto_ctl *ctl);
};

struct sv_subsystem {
	const char *name;
	/* Both ended by an entry whose handle is NULL. */
	const struct sv_message_handler *messages;
	const struct sv_ctl_handler *ctl;
	/* Once the state is zeroed and configured, before anything else (the fuzz target too). */
	void (*init)(struct supervisor *s);
	/* Journal replay at start: each record, then the end of the replay. */
	int (*journal_record)(struct supervisor *s, const struct journal_record *rec);
	void (*journal_replayed)(struct supervisor *s);
	/* The socket listens and the offload thread runs; base is the loop's. 0 or -errno. */
	int (*start)(struct supervisor *s, struct event_base *base);
	/* Every second, on the loop. */
	void (*tick)(struct supervisor *s);
	/* A worker's pidfd fired. */
	void (*worker_died)(struct supervisor *s, struct sv_worker *w);
	/* `belayerctl status`: its METRICs come through collect_metrics (after the core's, also
	 * for Prometheus), then status() may send events, counting them in *n. */
	void (*collect_metrics)(struct supervisor *s, struct metrics_collector *col);
	int (*status)(struct supervisor *s, struct sv_client *c, uint32_t *n);
	/* At exit: stop() while the offload thread still runs, finish() after it stopped and the
	 * connections closed (in the reverse order of the list). */
	void (*stop)(struct supervisor *s);
	void (*finish)(struct supervisor *s);
};

/* Sets the daemon's subsystems (a NULL-terminated list) and calls their init. */
void subsystems_init(struct supervisor *s, const struct sv_subsystem *const *list);

#define SUBSYSTEMS_FOREACH(s, it) \
	for (const struct sv_subsystem *const *it = (s)->subsystems; it && *it; it++)
