/* SPDX-License-Identifier: MIT */
/*
 * The supervisor's state, shared by its modules. The event loop (supervisor-server.c) is the
 * only thread that touches it; blocking work runs on the offload thread with copies of what it
 * needs (supervisor-offload.c).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "proto.h"
#include "util.h"
#include "supervisor-config.h"
#include "supervisor-metrics.h"
#include "supervisor-registry.h"

struct sv_journal;
struct sv_offload;
struct sv_subsystem;
/* The subsystems' state: opaque here, each defined and owned by its subsystem. */
struct health_gpu;
struct sv_engines;
struct sv_envs;
struct traj_tracker;
struct sv_traj_ctl;
struct gateway_trajs;

struct sv_packet {
	struct sv_packet *next;
	size_t len;
	int fd;
	uint8_t data[];
};

struct sv_client {
	struct sv_client *next, *prev;
	uint64_t serial;
	int fd;
	struct ucred cred;
	struct sv_worker *worker; /* after hello */
	bool subscribed;	  /* receives the event stream */
	bool closing;		  /* to be closed by the loop once the current callback returns */
	unsigned errors;
	struct sv_packet *outq, **outq_tail;
	uint64_t outq_bytes;
	void *ev; /* the loop's watch */
};

/* What the loop provides to the loop-free modules; every hook may be NULL (tests, fuzzing). */
struct sv_hooks {
	/* A client has queued output: watch it for writability. */
	void (*want_write)(struct supervisor *s, struct sv_client *c);
	/* Watch w->pidfd; call the subsystems' worker_died when it fires. */
	int (*watch_worker)(struct supervisor *s, struct sv_worker *w);
	void (*unwatch_worker)(struct supervisor *s, struct sv_worker *w);
	/* Call cb(s) on the loop whenever fd is readable (cb reads it), until the loop ends; the
	 * module closes fd after that (supervisor-traj-ctl.c: wakeups from the offload thread, a
	 * timerfd). */
	int (*watch_fd)(struct supervisor *s, int fd, void (*cb)(struct supervisor *s));
	/* Call cb(s) on the loop every interval_us, until the loop ends. */
	int (*every)(struct supervisor *s, uint64_t interval_us, void (*cb)(struct supervisor *s));
};

struct sv_event_ring {
	struct proto_event *events;
	size_t cap, head, count;
};

struct supervisor {
	struct sv_config config;
	struct sv_registry reg;
	struct sv_metrics metrics;
	struct sv_event_ring history;
	struct sv_journal *journal;
	struct sv_offload *offload;
	const struct sv_hooks *hooks;
	/* main's list, NULL-terminated (supervisor-subsystem.h); NULL: none */
	const struct sv_subsystem *const *subsystems;
	struct sv_client *clients;
	uint32_t n_clients;
	uint64_t next_serial;
	uint64_t start_ms;
	uid_t uid;		/* the supervisor's own */
	struct health_gpu *gpu; /* the offload thread's alone */
	/* The latest periodic GPU verdict (the worst device's). */
	enum health_verdict gpu_verdict;
	char gpu_message[PROTO_MAX_STR + 1];
	struct sv_engines *engines;   /* configured engines (supervisor-engines.h); NULL: none */
	struct sv_envs *envs;	      /* agent environments (supervisor-env-ctl.h); NULL: none */
	struct traj_tracker *trajs;   /* step events (supervisor-traj-ctl.h); NULL: none yet */
	struct sv_traj_ctl *traj_ctl; /* the policy's checkpoints, held replies; NULL: none yet */
	/* tagged requests (supervisor-gateway-traj.h); NULL: no gateway */
	struct gateway_trajs *gw_trajs;
};

uint64_t now_ms(void);
uint64_t now_realtime_us(void);
