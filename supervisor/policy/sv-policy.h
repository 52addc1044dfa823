/* SPDX-License-Identifier: MIT */
/*
 * The checkpoint policy's face (supervisor/policy/): what the other subsystems may use.
 *
 * The policy decides when an environment is checkpointed but knows no environment: the
 * environments subsystem implements struct traj_env_ops (a view of an environment at a step
 * end, a checkpoint run for the policy) and reports checkpoints a client asked for. The
 * gateway reports the requests it serves tagged with a trajectory (struct gateway_trajs). The
 * subsystem itself (its messages, its state's end) is policy_subsystem.
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "proto.h"

struct supervisor;
struct sv_subsystem;

extern const struct sv_subsystem policy_subsystem;

/* --- environments (implemented by supervisor/env/) --------------------------------------- */

/* What the daemon knows of an environment at a step end. */
struct traj_env_view {
	bool dirty;	      /* changed since its last checkpoint (dirty set or new processes) */
	uint64_t dirty_bytes; /* bytes of the dirty paths */
	uint64_t mem_bytes;   /* the process tree's memory (what CRIU dumps) */
};

/* How a policy checkpoint ended (loop thread). */
struct envs_ckpt_result {
	int r; /* 0, -ECANCELED (aborted), or the failure */
	/* The committed checkpoint (valid when committed: r == 0 and a manifest was written). */
	bool committed;
	char id[64]; /* the checkpoint's id (an environment id is at most 63 bytes) */
	uint64_t fs_bytes, criu_bytes, fs_us, dump_us;
	uint64_t run_us;  /* from the job's start to its end */
	uint64_t thaw_us; /* from the job's start to the thaw (0: never froze) */
};

/* A checkpoint the policy asked for: the caller's, alive until done() is called. */
struct envs_policy_ckpt {
	atomic_bool cancel;  /* set by the caller: stop at the next safe point (supervisor-env.h) */
	atomic_bool started; /* set by the offload thread as the job begins */
	atomic_bool thawed;  /* set by the offload thread once the environment runs again */
	atomic_bool dumping; /* set by the offload thread while CRIU dumps (not cancellable) */
	uint64_t thaw_us;    /* job start to thaw; valid once thawed reads true */
	/* Offload thread, right after thawed is set: wake the loop. */
	void (*on_thawed)(struct envs_policy_ckpt *pc);
	/* Loop thread, once, when the job is over (completed, aborted, failed). */
	void (*on_done)(struct supervisor *s, struct envs_policy_ckpt *pc,
			const struct envs_ckpt_result *res);
};

struct traj_env_ops {
	/* The view of environment id at a step end; < 0: not an environment the daemon manages. */
	int (*view)(struct supervisor *s, const char *id, struct traj_env_view *ret);
	/* Runs a checkpoint of environment id for trajectory, turn and the context's prefix (the
	 * step end's; 0, 0: none given); pc->on_done follows. */
	int (*checkpoint)(struct supervisor *s, const char *id, const char *trajectory,
			  uint64_t turn, uint64_t prefix_tokens, uint64_t prefix_hash,
			  struct envs_policy_ckpt *pc);
};

/* Sets the environments' side (the env subsystem's init); NULL or unset: no environments. */
void traj_ctl_set_env_ops(const struct traj_env_ops *ops);

/* A checkpoint a client asked for (`env checkpoint` naming a trajectory) completed: it
 * protects the trajectory and teaches the environment's cost predictor. */
void traj_ctl_env_checkpointed(struct supervisor *s, const char *env, const char *trajectory,
			       const struct envs_ckpt_result *res);

/* --- the gateway's tagged requests (supervisor-gateway-traj.c) ---------------------------- */

#define GATEWAY_TRAJ_HEADER "X-Belayer-Trajectory"
/* Trajectories remembered; past that the least recently active one is forgotten. */
#define GATEWAY_TRAJ_MAX 4096

/* 0 when v is a valid header value: 1..PROTO_MAX_STR bytes, each visible ASCII (0x21-0x7e);
 * -EINVAL otherwise. */
int gateway_traj_id_check(const char *v);

/* The table itself (the gateway owns one in s->gw_trajs while it runs). */
struct gateway_trajs;

/* A request's handle on its trajectory's entry; seq 0: untagged. */
struct gateway_traj_ticket {
	uint32_t slot;
	uint64_t seq;
};

struct gateway_trajs *gateway_trajs_new(uint32_t max);
void gateway_trajs_free(struct gateway_trajs *t);
/* A tagged request with prompt_tokens was accepted: it becomes its trajectory's pending one.
 * -EINVAL for an invalid id. */
int gateway_trajs_begin(struct gateway_trajs *t, const char *id, uint64_t prompt_tokens,
			uint64_t now_us, struct gateway_traj_ticket *ret);
/* An attempt (the first, or a resumed one) starts: the rate window restarts. */
void gateway_trajs_attempt(struct gateway_trajs *t, const struct gateway_traj_ticket *k);
/* The request has generated this many tokens in total by now_us. */
void gateway_trajs_progress(struct gateway_trajs *t, const struct gateway_traj_ticket *k,
			    uint64_t generated, uint64_t now_us);
/* The request ended; completed (a finish reason came) with generated tokens, or not. */
void gateway_trajs_end(struct gateway_trajs *t, struct gateway_traj_ticket *k, bool completed,
		       uint64_t generated, uint64_t now_us);
