/* SPDX-License-Identifier: MIT */
/*
 * The supervisor's environments (issue 9 item 3, issue 10): PROTO_ENV_REQUEST from belayerctl
 * or an RL framework, the environment registry, and the eBPF tracer on the event loop.
 *
 * Create, adopt, checkpoint, restore, rebuild and destroy change what runs on the node: only
 * root (or the supervisor's own user) may ask. They run on the offload lane OFFLOAD_ENV ([env]
 * workers threads), one at a time per environment (a second request meanwhile: -EBUSY),
 * different environments side by side; the reply (PROTO_ENV_INFO + END) goes
 * out when the job is done. List, dirty and log are answered at once. A checkpoint naming a
 * trajectory that completes is reported to the checkpoint policy's tracker
 * (sv-policy.h), and the policy runs its own checkpoints as the same jobs (below).
 *
 * Tracing: envtrace is loaded when [env] trace=yes (see envs_start); when BPF is unavailable one line
 * says so and environments work without it (every checkpoint then compares the upper layer
 * by metadata alone, as it always does; the dirty set only adds paths to copy regardless).
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "supervisor.h"
#include "sv-policy.h"

struct sv_envs;
struct env_manifest;

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
/* PROTO_IMAGE_REQUEST (supervisor-env-image-ctl.c): answered from the offload thread's result. */
int images_dispatch(struct supervisor *s, struct sv_client *c, const struct proto_image_request *q);

/* --- the checkpoint policy's side (issue 11): struct traj_env_ops of sv-policy.h ---------- */

/* The policy's view of environment id at a step end: dirty (its dirty set is not empty, or it
 * was never checkpointed, or it is not traced), the bytes of its dirty paths in the upper
 * layer, and its memory (what CRIU dumps: anon + shmem, from the cgroup's memory.stat, or
 * its processes' RssAnon + RssShmem where the memory controller is not on cgroup v2). Drains
 * the tracer first. -ENOENT: not an environment the
 * supervisor manages (unknown, or a watch only). */
int envs_view(struct supervisor *s, const char *id, struct traj_env_view *ret);

/* Runs a checkpoint of environment id for trajectory, turn as the environment's job (the same
 * job a framework's `env checkpoint` runs, with the dirty set snapshot), cancellable through
 * pc. -ENOENT (not managed), -EBUSY (another job of that environment runs), -ENOMEM. */
int envs_policy_checkpoint(struct supervisor *s, const char *id, const char *trajectory,
			   uint64_t turn, struct envs_policy_ckpt *pc);
