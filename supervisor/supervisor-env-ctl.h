/* SPDX-License-Identifier: MIT */
/*
 * The supervisor's environments (issue 9 item 3, issue 10): PROTO_ENV_REQUEST from belayerctl
 * or an RL framework, the environment registry, and the eBPF tracer on the event loop.
 *
 * Create, adopt, checkpoint, restore, rebuild and destroy change what runs on the node: only
 * root (or the supervisor's own user) may ask. They run on the offload thread, one at a time
 * per environment (a second request meanwhile: -EBUSY); the reply (PROTO_ENV_INFO + END) goes
 * out when the job is done. List, dirty and log are answered at once.
 *
 * Tracing: envtrace is loaded when [env] trace=yes (see envs_start); when BPF is unavailable one line
 * says so and environments work without it (every checkpoint then compares the upper layer
 * by metadata alone, as it always does; the dirty set only adds paths to copy regardless).
 */
#pragma once

#include "supervisor.h"

struct sv_envs;

/* At start, on the loop thread: takes back the environments of an earlier run. The tracer is
 * loaded ([env] trace) at start with [env] trace_preload, else at the first environment:
 * loading and attaching costs about a second, which a supervisor without environments never
 * pays. watch_fd puts its ring-buffer fd on the loop (drain with envs_drain on readability and
 * every ENVTRACE_DRAIN_INTERVAL_MS). */
int envs_start(struct supervisor *s, int (*watch_fd)(struct supervisor *s, int fd));
void envs_drain(struct supervisor *s);
/* Kills nothing: environments outlive a supervisor restart; only the tracer is unloaded. */
void envs_stop(struct supervisor *s);

int envs_dispatch(struct supervisor *s, struct sv_client *c, const struct proto_env_request *q);
