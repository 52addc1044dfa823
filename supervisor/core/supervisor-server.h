/* SPDX-License-Identifier: MIT */
/*
 * The event loop (libevent): the listening socket and its connections, worker pidfds, the
 * offload thread's completions, signals, the periodic timers (retention, GPU check, systemd
 * watchdog), and the optional Prometheus listener. Tells systemd READY=1 once the socket
 * listens (Type=notify).
 */
#pragma once

#include "supervisor.h"

/* Runs until SIGTERM/SIGINT. Returns 0 or -errno (setup failed). */
int server_run(struct supervisor *s);
