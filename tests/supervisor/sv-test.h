/* SPDX-License-Identifier: MIT */
/*
 * Helpers of the supervisor tests: a real belayer-supervisor process on a private socket and
 * state directory, real workers (shim-workload under LD_PRELOAD=libbelayer.so on the emulated
 * GPU), and protocol clients. Every wait is bounded and polls a real condition.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto.h"

#define SV_WAIT_MS 15000
/* How long a supervisor or worker may take to exit once told (a signal, its pipes closed). */
#define SV_EXIT_MS 30000
/* How long run_tool lets a tool run (belayerctl promote --wait included). */
#define TOOL_WAIT_MS 120000

struct sv {
	pid_t pid;
	char *dir;
	char sock[108];
	char state[256];
	char emu_dir[256];
};

struct worker {
	pid_t pid;
	int in;		/* its stdin: closing it ends the worker */
	int out;	/* its stdout */
	char line[512]; /* the "ok ..." line it printed */
};

/* Test-wide setup: a fresh directory with the emulator's state in it. */
void sv_setup(struct sv *sv);
void sv_teardown(struct sv *sv);
/* Starts the supervisor with extra "-o SECTION.KEY=VALUE" settings (NULL-terminated) and
 * waits until it answers on its socket. */
void sv_start(struct sv *sv, const char *const *settings);
/* The same, passing fds as systemd passes its fd store (fds[i] as 3 + i, named names[i]). */
void sv_start_with_fds(struct sv *sv, const char *const *settings, const int *fds,
		       const char *const *names, size_t n_fds);
/* Sends sig and reaps it; returns the wait status. */
int sv_kill(struct sv *sv, int sig);
/* Number of fds the supervisor has open, sockets excepted (connections have a metric). */
int sv_count_fds(const struct sv *sv);
/* Waits until sv_count_fds() is want (an fd is closed once the loop gets to it). */
bool sv_wait_fds(const struct sv *sv, int want);

/* Starts shim-workload SCENARIO with LD_PRELOAD=libbelayer.so, engine id engine, and waits for
 * its "ok" line. */
void worker_start(struct worker *w, const struct sv *sv, const char *engine, const char *scenario);
/* Sends sig, reaps; returns the wait status. */
int worker_kill(struct worker *w, int sig);
void worker_end(struct worker *w);

int client_connect(const struct sv *sv);
/* Connects and says hello with engine (pid: the caller's). */
int client_hello(const struct sv *sv, const char *engine);
/* Receives one message within timeout_ms: 0, -ETIMEDOUT, or proto_recv's error. */
int client_recv(int fd, struct proto_msg *m, int timeout_ms);
/* A control query: collects replies up to END into ret[0..max); returns their number, or
 * -code of an ERROR reply. */
int ctl_collect(const struct sv *sv, enum ctl_cmd cmd, uint32_t pid, enum ctl_action act,
		int32_t dev, struct proto_msg *ret, size_t max);
/* Regions of owner pid (0: all) in state (-1: any). */
int count_regions(const struct sv *sv, pid_t pid, int state);
/* Value of metric name{labels} (labels "" for none). */
uint64_t metric(const struct sv *sv, const char *name, const char *labels);
/* Polls count_regions until it equals want, up to SV_WAIT_MS. Returns true if it did. */
bool wait_regions(const struct sv *sv, pid_t pid, int state, int want);

/* Runs argv (NULL-terminated) with the supervisor's socket in BELAYER_SOCKET; returns the exit
 * status and its stdout (malloc'ed, NUL-terminated) in *ret_out if not NULL. */
int run_tool(const struct sv *sv, const char *const *argv, char **ret_out);

uint64_t mono_ms(void);

/* A free TCP port on the loopback (the kernel's choice; free again once we close it). */
uint16_t sv_free_port(void);
