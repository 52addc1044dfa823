/* SPDX-License-Identifier: MIT */
/* belayer-bench policy: shared between the rollout (bench-policy-traj.c) and the figures
 * (bench-policy.c). */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "proto.h"

#define POL_MAX_TRAJS 32
#define POL_MAX_TURNS 32

enum pol_mode {
	POL_NEVER,
	POL_EVERY_TURN,
	POL_ADAPTIVE,
	POL_COUNT
};

/* What an action does to the environment (drawn per turn, the same for every policy). */
enum pol_action {
	ACT_READ,  /* read-only: the environment stays clean */
	ACT_EDIT,  /* edits a text file (a few KiB) */
	ACT_WRITE, /* writes a data file (drawn size) */
};

/* One turn t of a trajectory: step-end (turn t-1) -> generation -> step-begin (turn t) ->
 * action t (none for the last generation, the final answer). Times in µs since the rollout's
 * start. */
struct pol_turn {
	uint64_t t_end;	  /* step-end sent: the observation of action t-1 went back */
	uint64_t t_gen0;  /* generation request sent */
	uint64_t t_gen1;  /* its last token */
	uint64_t t_begin; /* step-begin answered (after any hold) */
	uint64_t t_act1;  /* action t done */
	uint64_t tokens;  /* tokens streamed */
	bool end_ok;	  /* a decision came back for the step-end */
	enum traj_action end_act;
	char end_why[32];
	uint64_t bub_us, cost_us; /* step-end: the predicted bubble and checkpoint cost */
	uint32_t bub_err, cost_err;
	uint64_t held_us; /* step-begin: "held" */
	uint64_t ckpt_us; /* step-begin: "ckus" */
	bool aborted;	  /* step-begin: "abrt" */
	char ckpt[64];	  /* step-begin: "ckpt" (the checkpoint of the state after action t-1) */
};

/* A real failure injected into a trajectory (the failure rollout). */
struct pol_failure {
	uint64_t at_us;		/* when the environment was killed */
	unsigned computed_turn; /* the last protected turn per the decisions */
	uint64_t computed_lost_us;
	unsigned restored_turn; /* the turn of what came back (manifest; 0: rebuilt) */
	uint64_t real_lost_us;	/* at_us - end of that turn's action */
	unsigned file_turn;	/* what the restored environment's /work/turn holds */
	bool server_ok;		/* its in-memory server answers with that turn's state */
	bool rebuilt;		/* no checkpoint: rebuilt from the base */
	uint64_t recover_us;	/* restore (or rebuild) time */
	bool done;
};

struct pol_traj {
	/* set before the rollout */
	int idx;
	char id[32], env[32];
	unsigned out_tokens[POL_MAX_TURNS + 1]; /* per generation 1..turns+1 */
	enum pol_action act[POL_MAX_TURNS + 1]; /* per action 1..turns */
	uint32_t act_bytes[POL_MAX_TURNS + 1];
	uint16_t srv_port; /* the environment's server */
	char root[4096], cgroup[4096];
	uint32_t pid;
	/* A real failure: fail_delay_us into turn fail_turn (its step-end; 0: none). */
	unsigned fail_turn;
	uint64_t fail_delay_us;
	atomic_uint at_turn; /* the turn under way */
	atomic_bool finished;
	/* results */
	struct pol_turn turn[POL_MAX_TURNS + 2];
	uint64_t t_start, t_done;	     /* µs since the rollout's start */
	uint64_t act_end[POL_MAX_TURNS + 1]; /* end of action k (0: the start) */
	/* When the checkpoint of the state after action k was committed (its directory's
	 * rename, µs since the rollout's start; 0: none), from the environment's list. */
	uint64_t ck_done_us[POL_MAX_TURNS + 1];
	unsigned ck_listed;
	struct pol_failure fail;
	atomic_bool killed;
	int err;
};

struct pol_rollout {
	const char *socket; /* the supervisor's */
	const char *base;   /* the environments' base */
	uint16_t gateway;
	unsigned turns, prompt;
	uint64_t t0_ns;
	uint64_t t0_real_ns; /* CLOCK_REALTIME at t0 (checkpoint directories' ctime) */
	struct pol_traj *traj;
	unsigned ntraj;
};

/* The supervisor's socket: one connection. */
int pol_connect(const char *socket);
/* One environment request; *ret (may be NULL): the first PROTO_ENV_INFO. */
int pol_env_request(int fd, const struct proto_env_request *q, struct proto_env_info *ret);
/* Creates t's environment from base (its server on t->srv_port) and waits for its server. */
int pol_env_create(int fd, const char *base, struct pol_traj *t);
/* Refreshes the environment's pid, root and cgroup (after a create or restore). */
int pol_env_refresh(int fd, struct pol_traj *t);
/* Reads the environment's checkpoints (turn, commit time) into t->ck_done_us. */
int pol_env_checkpoints(int fd, const struct pol_rollout *ro, struct pol_traj *t);
/* The last turn protected at at_us (0: none, the start) by a committed checkpoint. */
unsigned pol_protected_turn(const struct pol_traj *t, unsigned turns, uint64_t at_us);
/* Runs every trajectory of ro concurrently until all are done (or one failed). */
int pol_rollout_run(struct pol_rollout *ro);
uint64_t pol_now_us(const struct pol_rollout *ro);
/* Waits that lasted 30 s or more, so far (a loaded machine: reported, never a failure). */
unsigned pol_slow_waits(void);
